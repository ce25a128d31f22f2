//! JSON Web Token validation (RFC 7519, JWS compact form, RFC 7515) against the public keys
//! the controller put in the snapshot: no request ever waits on a key fetch.
//!
//! A token passes when one provider accepts it: the signature verifies with one of its keys
//! (matched by `kid` when the token names one), `iss` and `aud` are the provider's, and the
//! time is within `nbf` and `exp` (with the provider's leeway). `alg: none` and shared-secret
//! algorithms (HS*) are always refused: a key in a JWKS is public, so an HMAC "signed" with it
//! proves nothing. Keys are parsed once, when the snapshot arrives.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use coxswain_api::snapshot as snap;
use ring::signature::{self, UnparsedPublicKey};
use serde_json::Value;

/// A token longer than this is refused without being decoded.
const MAX_TOKEN: usize = 16 * 1024;

/// Why a token is refused (logged at debug; the client gets 401 either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("no bearer token")]
    Missing,
    #[error("the token is not a signed JWT")]
    Malformed,
    #[error("the token's algorithm is not accepted")]
    Algorithm,
    #[error("no key of the provider verifies the signature")]
    Signature,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet")]
    NotYetValid,
    #[error("no provider has the token's issuer")]
    Issuer,
    #[error("the token is not for this audience")]
    Audience,
}

/// A route's JWT requirement, compiled once per snapshot.
#[derive(Debug)]
pub struct JwtAuth {
    providers: Vec<Provider>,
    /// The `WWW-Authenticate` challenge of a refusal (RFC 6750).
    pub challenge: Box<str>,
}

#[derive(Debug)]
struct Provider {
    issuer: Option<Box<str>>,
    audiences: Vec<Box<str>>,
    keys: Vec<Key>,
    claims_to_headers: Vec<(Box<str>, Box<str>)>,
    skew: u64,
}

#[derive(Debug)]
struct Key {
    kid: Option<Box<str>>,
    /// The key's own `alg`, when it names one: the token's must then be the same.
    alg: Option<Box<str>>,
    material: Material,
}

#[derive(Debug)]
enum Material {
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// Uncompressed point (0x04 || x || y).
    P256(Vec<u8>),
    P384(Vec<u8>),
    Ed25519(Vec<u8>),
}

impl JwtAuth {
    pub fn new(j: &snap::JwtAuth) -> Self {
        let providers = j
            .providers
            .iter()
            .map(|p| {
                let keys = parse_jwks(&p.jwks);
                if keys.is_empty() {
                    tracing::warn!(provider = %p.name, "JWT provider has no usable key: its tokens are refused");
                }
                Provider {
                    issuer: (!p.issuer.is_empty()).then(|| p.issuer.as_str().into()),
                    audiences: p.audiences.iter().map(|a| a.as_str().into()).collect(),
                    keys,
                    claims_to_headers: p
                        .claims_to_headers
                        .iter()
                        .map(|c| (c.claim.as_str().into(), c.header.to_ascii_lowercase().into()))
                        .collect(),
                    skew: u64::from(p.clock_skew_seconds),
                }
            })
            .collect();
        Self {
            providers,
            challenge: "Bearer error=\"invalid_token\"".into(),
        }
    }

    /// Whether an accepted token sets request fields (then the request is not forwarded as
    /// it came).
    pub fn sets_fields(&self) -> bool {
        self.providers
            .iter()
            .any(|p| !p.claims_to_headers.is_empty())
    }

    /// Checks the request's `Authorization` value at `now` (Unix seconds). Ok: the fields the
    /// accepting provider sets from the token's claims.
    pub fn verify(
        &self,
        authorization: Option<&str>,
        now: u64,
    ) -> Result<Vec<(String, String)>, Refused> {
        let token = authorization
            .and_then(|v| {
                let (scheme, token) = v.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .filter(|t| !t.is_empty())
            .ok_or(Refused::Missing)?;
        if token.len() > MAX_TOKEN {
            return Err(Refused::Malformed);
        }
        let mut parts = token.split('.');
        let (Some(h64), Some(p64), Some(s64), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(Refused::Malformed);
        };
        let decode = |s: &str| URL_SAFE_NO_PAD.decode(s).map_err(|_| Refused::Malformed);
        let header: Value =
            serde_json::from_slice(&decode(h64)?).map_err(|_| Refused::Malformed)?;
        let claims: Value =
            serde_json::from_slice(&decode(p64)?).map_err(|_| Refused::Malformed)?;
        let signature = decode(s64)?;
        let alg = header
            .get("alg")
            .and_then(Value::as_str)
            .ok_or(Refused::Malformed)?;
        // An extension the token says must be understood, and is not: refused (RFC 7515 4.1.11).
        if header.get("crit").is_some() {
            return Err(Refused::Malformed);
        }
        let algorithm = Algorithm::of(alg).ok_or(Refused::Algorithm)?;
        let kid = header.get("kid").and_then(Value::as_str);
        let signed = &token.as_bytes()[..h64.len() + 1 + p64.len()];
        let issuer = claims.get("iss").and_then(Value::as_str);
        // The most telling reason wins when no provider accepts.
        let mut refusal = Refused::Issuer;
        for p in &self.providers {
            if p.issuer.as_deref().is_some_and(|i| Some(i) != issuer) {
                continue;
            }
            let verified = p
                .keys
                .iter()
                .filter(|k| kid.is_none_or(|kid| k.kid.as_deref() == Some(kid)))
                .filter(|k| k.alg.as_deref().is_none_or(|a| a == alg))
                .any(|k| algorithm.verify(&k.material, signed, &signature));
            if !verified {
                refusal = Refused::Signature;
                continue;
            }
            if let Err(r) = p.check_claims(&claims, now) {
                refusal = r;
                continue;
            }
            return Ok(p.headers(&claims));
        }
        Err(refusal)
    }
}

impl Provider {
    fn check_claims(&self, claims: &Value, now: u64) -> Result<(), Refused> {
        let time = |name: &str| {
            claims
                .get(name)
                .map(|v| v.as_f64().map(|f| f.max(0.0) as u64))
        };
        match time("exp") {
            Some(None) => return Err(Refused::Malformed),
            Some(Some(exp)) if now > exp.saturating_add(self.skew) => return Err(Refused::Expired),
            _ => {}
        }
        match time("nbf") {
            Some(None) => return Err(Refused::Malformed),
            Some(Some(nbf)) if now.saturating_add(self.skew) < nbf => {
                return Err(Refused::NotYetValid);
            }
            _ => {}
        }
        if !self.audiences.is_empty() {
            let named = |a: &str| self.audiences.iter().any(|x| **x == *a);
            let ok = match claims.get("aud") {
                Some(Value::String(a)) => named(a),
                Some(Value::Array(list)) => list.iter().filter_map(Value::as_str).any(named),
                _ => false,
            };
            if !ok {
                return Err(Refused::Audience);
            }
        }
        Ok(())
    }

    fn headers(&self, claims: &Value) -> Vec<(String, String)> {
        self.claims_to_headers
            .iter()
            .filter_map(|(claim, header)| {
                let value = match claims.get(&**claim)? {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.to_string(),
                    Value::Bool(b) => b.to_string(),
                    _ => return None,
                };
                // A claim that would break the field line is not copied.
                value
                    .bytes()
                    .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
                    .then(|| (header.to_string(), value))
            })
            .collect()
    }
}

#[derive(Clone, Copy)]
enum Algorithm {
    Rsa(&'static signature::RsaParameters),
    P256,
    P384,
    EdDsa,
}

impl Algorithm {
    fn of(alg: &str) -> Option<Self> {
        Some(match alg {
            "RS256" => Self::Rsa(&signature::RSA_PKCS1_2048_8192_SHA256),
            "RS384" => Self::Rsa(&signature::RSA_PKCS1_2048_8192_SHA384),
            "RS512" => Self::Rsa(&signature::RSA_PKCS1_2048_8192_SHA512),
            "PS256" => Self::Rsa(&signature::RSA_PSS_2048_8192_SHA256),
            "PS384" => Self::Rsa(&signature::RSA_PSS_2048_8192_SHA384),
            "PS512" => Self::Rsa(&signature::RSA_PSS_2048_8192_SHA512),
            "ES256" => Self::P256,
            "ES384" => Self::P384,
            "EdDSA" => Self::EdDsa,
            _ => return None,
        })
    }

    fn verify(self, key: &Material, message: &[u8], sig: &[u8]) -> bool {
        match (self, key) {
            (Self::Rsa(params), Material::Rsa { n, e }) => {
                signature::RsaPublicKeyComponents { n, e }
                    .verify(params, message, sig)
                    .is_ok()
            }
            (Self::P256, Material::P256(point)) => {
                UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                    .verify(message, sig)
                    .is_ok()
            }
            (Self::P384, Material::P384(point)) => {
                UnparsedPublicKey::new(&signature::ECDSA_P384_SHA384_FIXED, point)
                    .verify(message, sig)
                    .is_ok()
            }
            (Self::EdDsa, Material::Ed25519(x)) => UnparsedPublicKey::new(&signature::ED25519, x)
                .verify(message, sig)
                .is_ok(),
            _ => false,
        }
    }
}

/// The signing keys of a JWKS document; keys of other kinds or for encryption are skipped.
fn parse_jwks(jwks: &str) -> Vec<Key> {
    let Ok(doc) = serde_json::from_str::<Value>(jwks) else {
        return Vec::new();
    };
    doc.get("keys")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(parse_jwk)
        .collect()
}

/// Now, in Unix seconds.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// How many signing keys a JWKS document holds (the controller reports a document with none).
pub fn usable_keys(jwks: &str) -> usize {
    parse_jwks(jwks).len()
}

fn parse_jwk(k: &Value) -> Option<Key> {
    let field = |name: &str| k.get(name).and_then(Value::as_str);
    let bytes = |name: &str| field(name).and_then(|v| URL_SAFE_NO_PAD.decode(v).ok());
    if field("use").is_some_and(|u| u != "sig") {
        return None;
    }
    let material = match (field("kty")?, field("crv")) {
        ("RSA", _) => Material::Rsa {
            n: bytes("n")?,
            e: bytes("e")?,
        },
        ("EC", Some(crv @ ("P-256" | "P-384"))) => {
            let (x, y) = (bytes("x")?, bytes("y")?);
            let size = if crv == "P-256" { 32 } else { 48 };
            if x.len() != size || y.len() != size {
                return None;
            }
            let mut point = Vec::with_capacity(1 + 2 * size);
            point.push(4);
            point.extend_from_slice(&x);
            point.extend_from_slice(&y);
            if crv == "P-256" {
                Material::P256(point)
            } else {
                Material::P384(point)
            }
        }
        ("OKP", Some("Ed25519")) => Material::Ed25519(bytes("x")?),
        _ => return None,
    };
    Some(Key {
        kid: field("kid").map(Into::into),
        alg: field("alg").map(Into::into),
        material,
    })
}

#[cfg(test)]
#[path = "../../test/jwt.rs"]
mod mint;
#[cfg(test)]
mod tests;
