//! The routing snapshot: the compiler's output and the discovery stream's payload.
//!
//! Generated from `proto/coxswain/snapshot/v1/snapshot.proto`; this module adds the content
//! version (a SHA-256 of the deterministic encoding) and readable JSON/YAML for enum fields.

#![allow(clippy::large_enum_variant, clippy::doc_lazy_continuation)]

include!(concat!(env!("OUT_DIR"), "/coxswain.snapshot.v1.rs"));

use prost::Message;

impl Snapshot {
    /// The content version: hex SHA-256 of the encoding with `version` empty.
    pub fn content_version(&self) -> String {
        let encoded = self.encode_to_vec();
        // `version` is field 1, which prost writes first, and an empty string is not written
        // at all: the encoding with `version` empty is what follows the field. Hashing from
        // there spares a copy of the whole snapshot, whose many small allocations, freed while
        // the proxy built its routing table, left the allocator's pages part-used after every
        // swap. Should the field ever stop coming first, the copy is made after all.
        let mut field = Vec::new();
        if !self.version.is_empty() {
            prost::encoding::string::encode(1, &self.version, &mut field);
        }
        let unsealed = match encoded.strip_prefix(field.as_slice()) {
            Some(rest) => ring::digest::digest(&ring::digest::SHA256, rest),
            None => {
                let mut copy = self.clone();
                copy.version.clear();
                ring::digest::digest(&ring::digest::SHA256, &copy.encode_to_vec())
            }
        };
        unsealed
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Stamps the content version.
    pub fn seal(mut self) -> Self {
        self.version = self.content_version();
        self
    }

    /// Whether `version` matches the content: a receiver checks this before swapping in.
    pub fn is_sealed(&self) -> bool {
        !self.version.is_empty() && self.version == self.content_version()
    }
}

/// Names in `Snapshot.requires`: features a proxy must implement to serve a snapshot.
pub mod feature {
    pub const BASIC_AUTH: &str = "basic-auth";
    pub const RATE_LIMIT: &str = "rate-limit";
    pub const EXTERNAL_AUTH: &str = "external-auth";
    pub const JWT: &str = "jwt";
    pub const GLOBAL_RATE_LIMIT: &str = "global-rate-limit";
    /// `Listener.client_validation`: clients must present a certificate the port's CAs issued.
    pub const FRONTEND_CLIENT_VALIDATION: &str = "frontend-client-validation";
    /// `VirtualHost.terminate_tls`: TLS ends at the proxy for that host of a TLS port.
    pub const TLS_TERMINATE: &str = "tls-terminate";
    /// `Listener.public_port`: the proxy listens on an internal port for a port clients know
    /// by another number (a shared-pool Gateway's own Service).
    pub const PUBLIC_PORT: &str = "public-port";
}

impl Snapshot {
    /// The first feature `requires` names that is not in `known`, if any.
    pub fn unknown_requirement(&self, known: &[&str]) -> Option<&str> {
        self.requires
            .iter()
            .map(String::as_str)
            .find(|r| !known.contains(r))
    }

    /// Parses a snapshot written as JSON or YAML (`coxswain snapshot compile -o json|yaml`).
    /// oneof fields are single-key maps in both (`{requestRedirect: {...}}`), not YAML tags.
    pub fn from_yaml(text: &str) -> Result<Self, serde_yaml::Error> {
        serde_yaml::with::singleton_map_recursive::deserialize(serde_yaml::Deserializer::from_str(
            text,
        ))
    }
}

/// YAML with enums as single-key maps, the same shape as JSON.
pub fn to_yaml<T: serde::Serialize>(value: &T) -> Result<String, serde_yaml::Error> {
    let mut out = Vec::new();
    let mut ser = serde_yaml::Serializer::new(&mut out);
    serde_yaml::with::singleton_map_recursive::serialize(value, &mut ser)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// serde adapters printing prost's i32 enum fields by their proto names.
pub(crate) mod serde_enum {
    macro_rules! by_name {
        ($module:ident, $enum:ty) => {
            pub mod $module {
                use serde::{Deserialize, Deserializer, Serializer, de::Error};

                pub fn serialize<S: Serializer>(v: &i32, s: S) -> Result<S::Ok, S::Error> {
                    match <$enum>::try_from(*v) {
                        Ok(e) => s.serialize_str(e.as_str_name()),
                        Err(_) => s.serialize_i32(*v),
                    }
                }

                pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
                    let name = String::deserialize(d)?;
                    <$enum>::from_str_name(&name)
                        .map(|e| e as i32)
                        .ok_or_else(|| D::Error::custom(format!("unknown value {name:?}")))
                }
            }
        };
    }
    by_name!(protocol, super::super::Protocol);
    by_name!(path_kind, super::super::path_match::Kind);
    by_name!(header_kind, super::super::header_match::Kind);
    by_name!(query_kind, super::super::query_param_match::Kind);
    by_name!(app_protocol, super::super::AppProtocol);
    by_name!(upstream_protocol, super::super::UpstreamProtocol);
    by_name!(lb_algorithm, super::super::load_balancer::Algorithm);
    by_name!(session_kind, super::super::session_persistence::Kind);
    by_name!(rate_limit_key, super::super::rate_limit::Key);
    by_name!(
        external_auth_protocol,
        super::super::external_auth::Protocol
    );
    by_name!(
        descriptor_source,
        super::super::rate_limit_descriptor::entry::Source
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Snapshot {
        Snapshot {
            scope: Some(Scope {
                kind: Some(scope::Kind::SharedPool(SharedPool {})),
            }),
            listeners: vec![Listener {
                port: 80,
                protocol: Protocol::Http as i32,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn sealing_is_deterministic_and_detects_changes() {
        let a = sample().seal();
        let b = sample().seal();
        assert_eq!(a.version, b.version);
        assert_eq!(a.version.len(), 64);
        assert!(a.is_sealed());
        let mut changed = a.clone();
        changed.listeners[0].port = 8080;
        assert!(!changed.is_sealed());
    }

    #[test]
    fn the_version_hashes_the_encoding_without_the_version() {
        // Any version, long enough that its length takes two varint bytes: the hash must not
        // depend on it.
        for version in ["", "x", &"v".repeat(300)] {
            let mut s = sample();
            s.version = version.to_owned();
            let mut unversioned = s.clone();
            unversioned.version.clear();
            let digest = ring::digest::digest(&ring::digest::SHA256, &unversioned.encode_to_vec());
            let expected: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(s.content_version(), expected, "version {version:?}");
        }
    }

    #[test]
    fn json_names_enums_and_round_trips() {
        let s = sample().seal();
        let json = serde_json::to_string(&s).unwrap();
        assert!(json.contains("\"PROTOCOL_HTTP\""), "{json}");
        assert!(json.contains("\"sharedPool\""), "{json}");
        let back: Snapshot = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
        let yaml = to_yaml(&s).unwrap();
        assert!(yaml.contains("sharedPool: {}"), "{yaml}");
        assert_eq!(Snapshot::from_yaml(&yaml).unwrap(), s);
        assert_eq!(Snapshot::from_yaml(&json).unwrap(), s, "JSON is YAML");
    }
}
