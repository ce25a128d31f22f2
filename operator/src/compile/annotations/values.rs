//! The value parsers of the Ingress annotations: each turns one annotation's text into a typed
//! value, or says in words a person can act on why it cannot.

use super::*;

pub fn parse_bool(v: &str) -> Result<bool, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err("expected true or false".into()),
    }
}

/// "500ms", "30s", "5m", "1h", or a bare number of seconds ("60").
pub fn parse_duration(v: &str) -> Result<Duration, String> {
    let v = v.trim();
    let digits = v.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = v.split_at(digits);
    if number.is_empty() {
        return Err("expected a number with an optional unit (ms, s, m, h)".into());
    }
    let n: u64 = number.parse().map_err(|_| "number too large".to_owned())?;
    let ms_per_unit: u64 = match unit {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        other => return Err(format!("unknown unit {other:?}; use ms, s, m or h")),
    };
    n.checked_mul(ms_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| "number too large".to_owned())
}

pub(super) fn parse_timeout(v: &str) -> Result<Duration, String> {
    let d = parse_duration(v)?;
    if d.is_zero() {
        return Err("a timeout must be longer than 0".into());
    }
    if d > MAX_TIMEOUT {
        return Err("longer than the 24h maximum".into());
    }
    Ok(d)
}

pub(super) fn parse_max_age(v: &str) -> Result<Duration, String> {
    let d = parse_duration(v)?;
    if d.subsec_millis() != 0 {
        return Err("max-age is whole seconds".into());
    }
    Ok(d)
}

/// "10485760", "512k", "1m", "2g" (binary multiples, as NGINX reads them); "0" is no limit.
pub fn parse_size(v: &str) -> Result<u64, String> {
    let v = v.trim();
    let digits = v.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = v.split_at(digits);
    if number.is_empty() {
        return Err("expected a number of bytes with an optional k, m or g".into());
    }
    let n: u64 = number.parse().map_err(|_| "number too large".to_owned())?;
    let multiple: u64 = match unit {
        "" => 1,
        "k" | "K" => 1 << 10,
        "m" | "M" => 1 << 20,
        "g" | "G" => 1 << 30,
        other => return Err(format!("unknown unit {other:?}; use k, m or g")),
    };
    n.checked_mul(multiple)
        .ok_or_else(|| "number too large".to_owned())
}

/// Comma-separated CIDRs, IPv4 and IPv6; a bare address is a single host.
pub fn parse_cidrs(v: &str) -> Result<Vec<Cidr>, String> {
    let mut out = Vec::new();
    for item in v.split(',').map(str::trim) {
        if item.is_empty() {
            continue;
        }
        out.push(parse_cidr(item)?);
    }
    if out.is_empty() {
        return Err("no address ranges listed".into());
    }
    out.sort();
    out.dedup();
    Ok(out)
}

pub fn parse_cidr(item: &str) -> Result<Cidr, String> {
    let (addr, len) = match item.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (item, None),
    };
    let addr: IpAddr = addr
        .parse()
        .map_err(|_| format!("{item:?} is not an IP address or CIDR"))?;
    let max: u8 = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = match len {
        None => max,
        Some(l) => l
            .parse::<u8>()
            .ok()
            .filter(|p| *p <= max)
            .ok_or_else(|| format!("{item:?}: prefix length must be 0 to {max}"))?,
    };
    Ok(Cidr {
        addr: mask(addr, prefix),
        prefix,
    })
}

pub(super) fn mask(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let bits = u32::from(a);
            let m = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4((bits & m).into())
        }
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            let m = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6((bits & m).into())
        }
    }
}

/// Header names are RFC 9110 tokens.
pub(super) fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Headers that frame the message or the connection: editing them breaks HTTP, not routing.
pub(super) const RESERVED_HEADERS: &[&str] = &[
    "connection",
    "content-length",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

pub fn parse_header_name(v: &str) -> Result<String, String> {
    let name = v.trim();
    if !is_token(name) {
        return Err(format!("{name:?} is not a valid header name"));
    }
    let lower = name.to_ascii_lowercase();
    if RESERVED_HEADERS.contains(&lower.as_str()) {
        return Err(format!(
            "{name} frames the HTTP message and cannot be edited"
        ));
    }
    Ok(lower)
}

/// Visible ASCII, spaces and tabs: nothing that could end a header line.
pub fn parse_header_value(v: &str) -> Result<String, String> {
    let v = v.trim();
    if v.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b)) {
        Ok(v.to_owned())
    } else {
        Err("header values must be printable ASCII".into())
    }
}

/// One "Name: value" per line.
pub(super) fn parse_header_lines(v: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for line in v.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| format!("{line:?} is not \"Name: value\""))?;
        out.push((parse_header_name(name)?, parse_header_value(value)?));
    }
    if out.is_empty() {
        return Err("no headers listed".into());
    }
    Ok(out)
}

/// Names separated by commas or whitespace.
pub(super) fn parse_header_names(v: &str) -> Result<Vec<String>, String> {
    let names = v
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(parse_header_name)
        .collect::<Result<Vec<_>, _>>()?;
    if names.is_empty() {
        return Err("no header names listed".into());
    }
    Ok(names)
}

pub(super) fn no_spaces_or_controls(v: &str) -> bool {
    v.bytes().all(|b| (b'!'..=b'~').contains(&b))
}

pub(super) fn parse_rewrite_target(v: &str) -> Result<RewriteTarget, String> {
    let v = v.trim();
    if !(v.starts_with('/') || v.starts_with('$')) {
        return Err("must start with / or a capture group such as $1".into());
    }
    if !no_spaces_or_controls(v) {
        return Err("must not contain spaces or control characters".into());
    }
    Ok(RewriteTarget(v.to_owned()))
}

pub(super) fn parse_location(v: &str) -> Result<String, String> {
    let v = v.trim();
    let rest = v
        .strip_prefix("https://")
        .or_else(|| v.strip_prefix("http://"));
    let ok = match rest {
        Some(r) => !r.is_empty() && !r.starts_with('/'),
        None => v.starts_with('/'),
    };
    if !ok {
        return Err("expected an http(s):// URL or an absolute path".into());
    }
    if !no_spaces_or_controls(v) {
        return Err("must not contain spaces or control characters".into());
    }
    Ok(v.to_owned())
}

pub(super) fn parse_redirect_code(v: &str) -> Result<u16, String> {
    match v.trim().parse::<u16>() {
        Ok(c @ (301 | 302 | 303 | 307 | 308)) => Ok(c),
        _ => Err("expected 301, 302, 303, 307 or 308".into()),
    }
}

pub(super) fn parse_backend_protocol(v: &str) -> Result<BackendProtocol, String> {
    match v.trim().to_ascii_uppercase().as_str() {
        "HTTP" => Ok(BackendProtocol::Http),
        "HTTPS" => Ok(BackendProtocol::Https),
        "H2C" => Ok(BackendProtocol::H2c),
        "GRPC" => Ok(BackendProtocol::Grpc),
        "GRPCS" => Ok(BackendProtocol::Grpcs),
        _ => Err("expected HTTP, HTTPS, H2C, GRPC or GRPCS".into()),
    }
}

/// "*", or origins: scheme://host[:port], where host may start with "*." (any subdomain).
pub(super) fn parse_origins(v: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if item == "*" {
            out.push(item.to_owned());
            continue;
        }
        let rest = item
            .strip_prefix("https://")
            .or_else(|| item.strip_prefix("http://"))
            .ok_or_else(|| format!("{item:?}: an origin is scheme://host[:port] or *"))?;
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (rest, None),
        };
        let host = host.strip_prefix("*.").unwrap_or(host);
        let host_ok = !host.is_empty()
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
        let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p > 0));
        if !host_ok || !port_ok {
            return Err(format!("{item:?}: an origin is scheme://host[:port] or *"));
        }
        out.push(item.to_ascii_lowercase());
    }
    if out.is_empty() {
        return Err("no origins listed".into());
    }
    Ok(out)
}

pub(super) fn comma_tokens(v: &str, what: &str) -> Result<Vec<String>, String> {
    let items: Vec<String> = v
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    if items.is_empty() {
        return Err(format!("no {what} listed"));
    }
    if let Some(bad) = items.iter().find(|i| !is_token(i)) {
        return Err(format!("{bad:?} is not a valid {what}"));
    }
    Ok(items)
}

pub(super) fn parse_methods(v: &str) -> Result<Vec<String>, String> {
    comma_tokens(v, "method")
}

/// Header names, or "*".
pub(super) fn parse_cors_headers(v: &str) -> Result<Vec<String>, String> {
    comma_tokens(v, "header name")
}

pub(super) fn parse_canary_total(v: &str) -> Result<u32, String> {
    match v.trim().parse::<u32>() {
        Ok(t) if (1..=1_000_000).contains(&t) => Ok(t),
        _ => Err("expected a whole number from 1 to 1000000".into()),
    }
}

pub(super) fn parse_canary_weight(v: &str, total: u32) -> Result<u32, String> {
    match v.trim().parse::<u32>() {
        Ok(w) if w <= total => Ok(w),
        _ => Err(format!("expected a whole number from 0 to {total}")),
    }
}

/// ingress-nginx's proxy-next-upstream: space-separated conditions. `error` and `timeout`
/// (connections that cannot be opened) are always retried, so they add nothing; `off` lists
/// nothing; `http_NNN` and `non_idempotent` are what a route's retry policy holds.
pub(super) fn parse_retry_on(v: &str) -> Result<(Vec<u16>, bool), String> {
    let mut codes = Vec::new();
    let mut non_idempotent = false;
    let words: Vec<&str> = v.split_whitespace().collect();
    if words.is_empty() {
        return Err("empty; list conditions such as \"error timeout http_503\"".into());
    }
    for w in &words {
        match *w {
            "error" | "timeout" => {}
            "off" if words.len() == 1 => {}
            "non_idempotent" => non_idempotent = true,
            "invalid_header" => {
                return Err("invalid_header is not supported (a malformed answer is a 502)".into());
            }
            other => match other
                .strip_prefix("http_")
                .and_then(|c| c.parse::<u16>().ok())
            {
                Some(c @ (403 | 404 | 429 | 500 | 502 | 503 | 504)) => codes.push(c),
                _ => {
                    return Err(format!(
                        "{other:?} is not one of error, timeout, http_403, http_404, http_429, \
                         http_500, http_502, http_503, http_504, non_idempotent, off"
                    ));
                }
            },
        }
    }
    codes.sort_unstable();
    codes.dedup();
    Ok((codes, non_idempotent))
}

/// ingress-nginx's proxy-next-upstream-timeout: 0 means no bound.
pub(super) fn parse_retry_timeout(v: &str) -> Result<Option<Duration>, String> {
    let d = parse_duration(v)?;
    if d > MAX_TIMEOUT {
        return Err("longer than the 24h maximum".into());
    }
    Ok((!d.is_zero()).then_some(d))
}

pub(super) fn parse_retry_tries(v: &str) -> Result<u32, String> {
    match v.trim().parse::<u32>() {
        Ok(0) => Ok(MAX_RETRY_TRIES),
        Ok(n) if n <= MAX_RETRY_TRIES => Ok(n),
        _ => Err(format!(
            "a number of tries from 1 to {MAX_RETRY_TRIES} (0: {MAX_RETRY_TRIES})"
        )),
    }
}

/// ingress-nginx's `load-balance`: `round_robin` or `ewma`; ours also says `least_request`.
pub(super) fn parse_load_balance(v: &str) -> Result<LoadBalance, String> {
    match v.trim() {
        "round_robin" => Ok(LoadBalance::RoundRobin),
        "ewma" | "least_request" => Ok(LoadBalance::LeastRequest),
        other => Err(format!(
            "{other:?} is not a load-balancing algorithm; use round_robin, least_request or ewma"
        )),
    }
}

/// ingress-nginx's `upstream-hash-by` takes an NGINX variable. The ones that name a key the
/// proxy can hash on are accepted; anything else (other variables, text around one, several)
/// would mean a different key than the one written, so it is refused.
pub(super) fn parse_hash_by(v: &str) -> Result<HashKey, String> {
    let v = v.trim();
    let refused = || {
        format!(
            "{v:?} cannot be hashed on; use $remote_addr (or $binary_remote_addr), \
             $http_<header> or $cookie_<name>"
        )
    };
    let var = v.strip_prefix('$').ok_or_else(refused)?;
    let var = var
        .strip_prefix('{')
        .and_then(|s| s.strip_suffix('}'))
        .unwrap_or(var);
    let word = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    if var == "remote_addr" || var == "binary_remote_addr" {
        return Ok(HashKey::ClientAddress);
    }
    if let Some(header) = var.strip_prefix("http_").filter(|h| word(h)) {
        // NGINX spells a header's dashes as underscores in $http_ variables.
        return Ok(HashKey::Header(
            header.replace('_', "-").to_ascii_lowercase(),
        ));
    }
    if let Some(cookie) = var.strip_prefix("cookie_").filter(|c| word(c)) {
        return Ok(HashKey::Cookie(cookie.to_owned()));
    }
    Err(refused())
}

/// ingress-nginx knows one affinity, `cookie`.
pub(super) fn parse_affinity(v: &str) -> Result<(), String> {
    match v.trim() {
        "cookie" => Ok(()),
        other => Err(format!("affinity {other:?} is not supported; use cookie")),
    }
}

/// A cookie name is an HTTP token.
pub(super) fn parse_cookie_name(v: &str) -> Result<String, String> {
    let name = v.trim();
    if is_token(name) {
        Ok(name.to_owned())
    } else {
        Err(format!("{name:?} is not a valid cookie name"))
    }
}

/// Seconds, as ingress-nginx writes them (a duration with a unit is accepted too).
pub(super) fn parse_cookie_max_age(v: &str) -> Result<u64, String> {
    let d = parse_duration(v)?;
    if d.is_zero() || d.subsec_nanos() != 0 {
        return Err("expected a whole number of seconds, more than 0".into());
    }
    Ok(d.as_secs())
}

/// The cookie's Path attribute: an absolute path with nothing that would end the attribute.
pub(super) fn parse_cookie_path(v: &str) -> Result<String, String> {
    let path = v.trim();
    if !path.starts_with('/') {
        return Err("the cookie path must start with /".into());
    }
    if !no_spaces_or_controls(path) || path.contains(';') {
        return Err("the cookie path may not hold spaces, controls or ;".into());
    }
    Ok(path.to_owned())
}

pub(super) fn parse_access_log(v: &str) -> Result<bool, String> {
    if v.trim().eq_ignore_ascii_case("off") {
        Ok(false)
    } else {
        Err("only \"off\" is accepted; remove the annotation to keep the access log".into())
    }
}
