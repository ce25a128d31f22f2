//! Access-control annotations the proxy enforces itself: Basic authentication from an htpasswd
//! Secret, and local rate limits. The names follow ingress-nginx (`auth-type`, `auth-secret`,
//! `limit-rps`, ...) so an Ingress written for it keeps its meaning under compatibility.

use super::{Access, Cidr, Reader, parse_cidrs, parse_header_name};

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
