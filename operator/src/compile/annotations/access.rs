//! Access-control annotations the proxy enforces itself: Basic authentication from an htpasswd
//! Secret, an external authorization service (auth-url), and local rate limits. The names
//! follow ingress-nginx (`auth-type`, `auth-secret`, `auth-url`, `limit-rps`, ...) so an
//! Ingress written for it keeps its meaning under compatibility.

use super::{
    Access, Cidr, Reader, is_token, no_spaces_or_controls, parse_cidrs, parse_header_name,
    parse_header_names,
};

/// ingress-nginx multiplies the rate by this to get the burst.
pub const DEFAULT_BURST_MULTIPLIER: u32 = 5;
pub const DEFAULT_REALM: &str = "Authentication Required";
/// Largest rate or bound accepted: more is a typo, not a limit.
const MAX_COUNT: u32 = 1_000_000;

/// auth-type: basic, with its Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BasicAuth {
    pub secret: SecretRef,
    pub format: SecretFormat,
    pub realm: String,
}

/// A Secret named by an annotation: "name" or "namespace/name".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRef {
    pub namespace: Option<String>,
    pub name: String,
}

/// How the htpasswd Secret holds its users (ingress-nginx's auth-secret-type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretFormat {
    /// The key `auth` holds an htpasswd file.
    AuthFile,
    /// Every key is a user, its value the hash.
    AuthMap,
}

/// limit-rps, limit-rpm and limit-connections, with what they share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimits {
    /// 0: none (an Ingress can turn off its class's default this way).
    pub per_second: u32,
    pub per_minute: u32,
    /// Requests in progress per key at once; 0: no bound.
    pub connections: u32,
    /// Requests above the rate let through at once; None: the rate times the multiplier.
    pub burst: Option<u32>,
    pub burst_multiplier: u32,
    pub key: RateKey,
    /// Clients never limited (limit-whitelist).
    pub exempt: Vec<Cidr>,
}

impl RateLimits {
    /// The burst for one rate.
    pub fn burst_for(&self, rate: u32) -> u32 {
        self.burst
            .unwrap_or_else(|| rate.saturating_mul(self.burst_multiplier))
    }
}

/// auth-url and its companions: ingress-nginx's external authentication, where a request is
/// first put to an HTTP service and forwarded only on a 2xx.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalAuth {
    pub url: AuthUrl,
    /// The auth request's method (auth-method); None: GET, as nginx's subrequest.
    pub method: Option<String>,
    /// Where a 401 sends the client (auth-signin), with ingress-nginx's variables.
    pub signin: Option<String>,
    /// Fields of the service's answer copied into the request (auth-response-headers).
    pub response_headers: Vec<String>,
}

/// An auth-url: http or https, a host (a name, an address, or `$host` for the request's own)
/// with its port, and the path and query to ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthUrl {
    pub tls: bool,
    /// As written, without brackets for an IPv6 address.
    pub host: String,
    pub port: u16,
    /// Whether the URL named the port (then Host carries it, as nginx sends it).
    pub explicit_port: bool,
    pub path_and_query: String,
}

impl AuthUrl {
    /// The Host field of the auth request, as nginx sends the URL's authority.
    pub fn authority(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if self.explicit_port {
            format!("{host}:{}", self.port)
        } else {
            host
        }
    }

    /// "host:port" for connecting.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The Service an in-cluster name (`svc.ns.svc` or `svc.ns.svc.cluster.local`) points at.
    pub fn service(&self) -> Option<(&str, &str)> {
        let rest = self
            .host
            .strip_suffix(".svc.cluster.local")
            .or_else(|| self.host.strip_suffix(".svc"))?;
        let (name, namespace) = rest.split_once('.')?;
        (!name.is_empty() && !namespace.is_empty() && !namespace.contains('.'))
            .then_some((namespace, name))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RateKey {
    ClientAddress,
    /// A lower-case header name.
    Header(String),
    Route,
}

/// auth-type and its companions. Access control: a bad value, or basic without a Secret,
/// denies every path rather than serve without authentication.
pub(super) fn basic_auth(r: &mut Reader<'_>) -> Access<BasicAuth> {
    match r.get_or_deny("auth-type", parse_auth_type) {
        Access::Unset => {
            for name in ["auth-secret", "auth-secret-type", "auth-realm"] {
                r.note(name, "has no effect without auth-type: basic");
            }
            Access::Unset
        }
        Access::Deny => Access::Deny,
        Access::Allow(()) => {
            let secret = match r.get_or_deny("auth-secret", parse_secret_ref) {
                Access::Allow(s) => s,
                Access::Deny => return Access::Deny,
                Access::Unset => {
                    r.deny(
                        "auth-type",
                        "auth-type: basic needs auth-secret naming the htpasswd Secret; every \
                         path of the Ingress answers 403 until it is set",
                    );
                    return Access::Deny;
                }
            };
            let format = match r.get_or_deny("auth-secret-type", parse_secret_format) {
                Access::Allow(f) => f,
                Access::Unset => SecretFormat::AuthFile,
                Access::Deny => return Access::Deny,
            };
            let realm = r
                .get("auth-realm", parse_realm)
                .unwrap_or_else(|| DEFAULT_REALM.to_owned());
            Access::Allow(BasicAuth {
                secret,
                format,
                realm,
            })
        }
    }
}

/// auth-url and its companions. Access control: a bad value denies every path rather than
/// serve without asking.
pub(super) fn external_auth(r: &mut Reader<'_>) -> Access<ExternalAuth> {
    let url = match r.get_or_deny("auth-url", parse_auth_url) {
        Access::Unset => {
            for name in ["auth-method", "auth-signin", "auth-response-headers"] {
                r.note(name, "has no effect without auth-url");
            }
            return Access::Unset;
        }
        Access::Deny => return Access::Deny,
        Access::Allow(url) => url,
    };
    let method = match r.get_or_deny("auth-method", parse_auth_method) {
        Access::Allow(m) => Some(m),
        Access::Unset => None,
        Access::Deny => return Access::Deny,
    };
    let signin = match r.get_or_deny("auth-signin", parse_signin) {
        Access::Allow(s) => Some(s),
        Access::Unset => None,
        Access::Deny => return Access::Deny,
    };
    let response_headers = match r.get_or_deny("auth-response-headers", parse_header_names) {
        Access::Allow(h) => h,
        Access::Unset => Vec::new(),
        Access::Deny => return Access::Deny,
    };
    Access::Allow(ExternalAuth {
        url,
        method,
        signin,
        response_headers,
    })
}

/// The rate-limit annotations; None when no limit is set (or every limit is 0).
pub(super) fn rate_limits(r: &mut Reader<'_>) -> Option<RateLimits> {
    let per_second = r.get("rate-limit-rps", parse_count);
    let per_minute = r.get("rate-limit-rpm", parse_count);
    let connections = r.get("rate-limit-connections", parse_count);
    let shared = [
        "rate-limit-burst",
        "rate-limit-burst-multiplier",
        "rate-limit-key",
        "rate-limit-allowlist",
    ];
    if [per_second, per_minute, connections]
        .iter()
        .all(|v| v.unwrap_or(0) == 0)
    {
        for name in shared {
            r.note(
                name,
                "has no effect without rate-limit-rps, -rpm or -connections (limit-rps, \
                 limit-rpm, limit-connections)",
            );
        }
        return None;
    }
    Some(RateLimits {
        per_second: per_second.unwrap_or(0),
        per_minute: per_minute.unwrap_or(0),
        connections: connections.unwrap_or(0),
        burst: r.get("rate-limit-burst", parse_burst),
        burst_multiplier: r
            .get("rate-limit-burst-multiplier", parse_multiplier)
            .unwrap_or(DEFAULT_BURST_MULTIPLIER),
        key: r
            .get("rate-limit-key", parse_rate_key)
            .unwrap_or(RateKey::ClientAddress),
        exempt: r
            .get("rate-limit-allowlist", parse_cidrs)
            .unwrap_or_default(),
    })
}

fn parse_auth_type(v: &str) -> Result<(), String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "basic" => Ok(()),
        "digest" => Err("digest authentication is not supported; use basic over HTTPS".into()),
        _ => Err("the only type is basic".into()),
    }
}

fn parse_secret_ref(v: &str) -> Result<SecretRef, String> {
    let v = v.trim();
    let (namespace, name) = match v.split_once('/') {
        Some((ns, name)) => (Some(ns), name),
        None => (None, v),
    };
    let dns = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    if !dns(name) || namespace.is_some_and(|ns| !dns(ns)) {
        return Err("not a Secret name (\"name\" or \"namespace/name\")".into());
    }
    Ok(SecretRef {
        namespace: namespace.map(str::to_owned),
        name: name.to_owned(),
    })
}

fn parse_secret_format(v: &str) -> Result<SecretFormat, String> {
    match v.trim() {
        "auth-file" => Ok(SecretFormat::AuthFile),
        "auth-map" => Ok(SecretFormat::AuthMap),
        _ => Err("use auth-file (the key \"auth\" holds an htpasswd file) or auth-map".into()),
    }
}

fn parse_auth_url(v: &str) -> Result<AuthUrl, String> {
    let v = v.trim();
    let lower = v.to_ascii_lowercase();
    let (tls, rest) = if lower.starts_with("https://") {
        (true, &v[8..])
    } else if lower.starts_with("http://") {
        (false, &v[7..])
    } else {
        return Err("auth-url must be an http:// or https:// URL".into());
    };
    if !no_spaces_or_controls(rest) {
        return Err("auth-url may not hold spaces or control characters".into());
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let path = path.split('#').next().unwrap_or_default();
    if authority.contains('@') {
        return Err("auth-url may not carry user information".into());
    }
    if path.contains('$') {
        return Err("auth-url's path may not use nginx variables (only $host, as the host)".into());
    }
    let (host, port) = if let Some(inside) = authority.strip_prefix('[') {
        let (addr, after) = inside
            .split_once(']')
            .ok_or("auth-url has an unclosed [ in its host")?;
        (addr, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let host_ok = host == "$host"
        || host.parse::<std::net::IpAddr>().is_ok()
        || (!host.is_empty()
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.'));
    if !host_ok {
        return Err(format!(
            "auth-url's host {host:?} is not a name, an address or $host"
        ));
    }
    let default_port = if tls { 443 } else { 80 };
    let port_number = match port {
        None => default_port,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("auth-url's port {p:?} is not a port number"))?,
    };
    let path_and_query = match path.chars().next() {
        None => "/".to_owned(),
        Some('?') => format!("/{path}"),
        Some(_) => path.to_owned(),
    };
    Ok(AuthUrl {
        tls,
        host: host.to_ascii_lowercase(),
        port: port_number,
        explicit_port: port.is_some(),
        path_and_query,
    })
}

fn parse_auth_method(v: &str) -> Result<String, String> {
    let m = v.trim().to_ascii_uppercase();
    if m.is_empty() || !is_token(&m) {
        return Err("auth-method must be an HTTP method such as GET or POST".into());
    }
    Ok(m)
}

/// An auth-signin URL; the variables the proxy fills in are the only `$` names allowed.
fn parse_signin(v: &str) -> Result<String, String> {
    let v = v.trim();
    let lower = v.to_ascii_lowercase();
    if !(lower.starts_with("https://") || lower.starts_with("http://") || v.starts_with('/')) {
        return Err("auth-signin must be an http:// or https:// URL or a path".into());
    }
    if !no_spaces_or_controls(v) {
        return Err("auth-signin may not hold spaces or control characters".into());
    }
    const VARIABLES: [&str; 5] = [
        "$escaped_request_uri",
        "$request_uri",
        "$http_host",
        "$scheme",
        "$host",
    ];
    let mut rest = v;
    while let Some(i) = rest.find('$') {
        let tail = &rest[i..];
        let Some(known) = VARIABLES.iter().find(|name| tail.starts_with(**name)) else {
            return Err(format!(
                "auth-signin uses a variable Coxswain does not fill in; the known ones are {}",
                VARIABLES.join(", ")
            ));
        };
        rest = &tail[known.len()..];
    }
    Ok(v.to_owned())
}

fn parse_realm(v: &str) -> Result<String, String> {
    if v.chars().any(|c| c.is_control() || c == '"' || c == '\\') {
        return Err("the realm may not hold quotes, backslashes or control characters".into());
    }
    Ok(v.trim().to_owned())
}

fn parse_count(v: &str) -> Result<u32, String> {
    v.trim()
        .parse::<u32>()
        .ok()
        .filter(|n| *n <= MAX_COUNT)
        .ok_or_else(|| format!("not a whole number from 0 (no limit) to {MAX_COUNT}"))
}

fn parse_burst(v: &str) -> Result<u32, String> {
    parse_count(v).map_err(|_| format!("not a whole number from 0 to {MAX_COUNT}"))
}

fn parse_multiplier(v: &str) -> Result<u32, String> {
    v.trim()
        .parse::<u32>()
        .ok()
        .filter(|n| (1..=1000).contains(n))
        .ok_or_else(|| "not a whole number from 1 to 1000".into())
}

fn parse_rate_key(v: &str) -> Result<RateKey, String> {
    let v = v.trim();
    match v {
        "client" | "$remote_addr" | "$binary_remote_addr" => Ok(RateKey::ClientAddress),
        "route" => Ok(RateKey::Route),
        _ => match v.strip_prefix("header:") {
            Some(name) => Ok(RateKey::Header(parse_header_name(name)?)),
            None => Err("use client, route or header:<name>".into()),
        },
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn auth_urls_parse_or_say_why_not() {
        use super::{AuthUrl, parse_auth_url, parse_signin};
        let url = parse_auth_url("https://httpbin.org/basic-auth/user/passwd").unwrap();
        assert_eq!(
            url,
            AuthUrl {
                tls: true,
                host: "httpbin.org".into(),
                port: 443,
                explicit_port: false,
                path_and_query: "/basic-auth/user/passwd".into(),
            }
        );
        assert_eq!(url.address(), "httpbin.org:443");
        let svc = parse_auth_url("http://Auth.Security.svc.cluster.local:8080?x=1").unwrap();
        assert_eq!(svc.service(), Some(("security", "auth")));
        assert_eq!(svc.authority(), "auth.security.svc.cluster.local:8080");
        assert_eq!(svc.path_and_query, "/?x=1");
        assert_eq!(
            parse_auth_url("http://auth.security.svc/")
                .unwrap()
                .service(),
            Some(("security", "auth"))
        );
        assert_eq!(
            parse_auth_url("http://auth.example.com/")
                .unwrap()
                .service(),
            None
        );
        let v6 = parse_auth_url("http://[::1]:9000/check").unwrap();
        assert_eq!(
            (v6.address().as_str(), v6.authority().as_str()),
            ("[::1]:9000", "[::1]:9000")
        );
        assert_eq!(
            parse_auth_url("https://$host/oauth2/auth").unwrap().host,
            "$host"
        );
        for bad in [
            "auth.example.com/check",
            "ftp://auth.example.com/",
            "http://user:pw@auth.example.com/",
            "http://auth.example.com:99999/",
            "http://$host/oauth2/auth?rd=$request_uri",
            "http://auth example.com/",
            "http://exa_mple$/",
        ] {
            assert!(parse_auth_url(bad).is_err(), "{bad} accepted");
        }
        assert!(parse_signin("https://$host/oauth2/start?rd=$escaped_request_uri").is_ok());
        assert!(parse_signin("https://login.example.com/?next=$arg_next").is_err());
        assert!(parse_signin("javascript:alert(1)").is_err());
    }

    use super::*;

    #[test]
    fn secret_refs_and_keys_parse_or_say_why_not() {
        assert_eq!(
            parse_secret_ref("ns/basic-auth"),
            Ok(SecretRef {
                namespace: Some("ns".into()),
                name: "basic-auth".into()
            })
        );
        assert!(parse_secret_ref("Basic_Auth").is_err());
        assert!(parse_secret_ref("a/b/c").is_err());
        assert_eq!(
            parse_rate_key("header:X-Api-Key"),
            Ok(RateKey::Header("x-api-key".into()))
        );
        assert_eq!(
            parse_rate_key("$binary_remote_addr"),
            Ok(RateKey::ClientAddress)
        );
        assert!(parse_rate_key("cookie:x").is_err());
        assert!(parse_count("-1").is_err());
        assert!(parse_count("1000001").is_err());
        assert_eq!(parse_count(" 0 "), Ok(0));
        assert!(parse_realm("a\"b").is_err());
        assert!(
            parse_auth_type("digest")
                .unwrap_err()
                .contains("not supported")
        );
    }
}
