//! The routing snapshot: the compiler's output and the discovery stream's payload.
//!
//! Generated from `proto/coxswain/snapshot/v1/snapshot.proto`; this module adds the content
//! version (a SHA-256 of the deterministic encoding) and readable JSON/YAML for enum fields.

#![allow(clippy::large_enum_variant, clippy::doc_lazy_continuation)]

include!(concat!(env!("OUT_DIR"), "/coxswain.snapshot.v1.rs"));

pub mod outline;

use prost::Message;

impl Snapshot {
    /// The content version: hex SHA-256 of the encoding with `version` empty.
    pub fn content_version(&self) -> String {
        // Only tests and checks off the data path ask this of a decoded snapshot: one way to
        // hash (`Sealed::new`'s), at the cost of a copy.
        Sealed::new(self.clone()).version
    }

    /// Sets `version` to the content version.
    pub fn seal(self) -> Sealed {
        Sealed::new(self)
    }

    /// Whether `version` matches the content. Receivers check the bytes instead
    /// ([`Sealed::decode`]).
    pub fn is_sealed(&self) -> bool {
        !self.version.is_empty() && self.version == self.content_version()
    }
}

fn hex_digest(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = String::with_capacity(2 * digest.as_ref().len());
    for b in digest.as_ref() {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Bytes before the rest of a sealed encoding: the tag of field 1 (`version`, length-delimited),
/// its length, 64, and the 64 hex digits.
const VERSION_FIELD: usize = 2 + 64;

/// The first of `requires` that is not in `known`, if any.
fn unknown_requirement<'a>(requires: &'a [String], known: &[&str]) -> Option<&'a str> {
    requires
        .iter()
        .map(String::as_str)
        .find(|r| !known.contains(r))
}

/// The version a sealed encoding claims in front, if it starts as `Sealed::new` writes.
fn claimed_version(encoded: &[u8]) -> Option<&str> {
    match encoded.get(..VERSION_FIELD) {
        Some([0x0a, 64, hex @ ..]) => std::str::from_utf8(hex).ok(),
        _ => None,
    }
}

/// Whether the bytes after the version field hash to `claimed`.
fn check_hash(encoded: &[u8], claimed: &str) -> Result<(), SealError> {
    match encoded.get(VERSION_FIELD..) {
        Some(rest) if hex_digest(rest) == claimed => Ok(()),
        _ => Err(SealError::Mismatch(claimed.to_owned())),
    }
}

/// A snapshot whose `version` is known to be its content hash, with the encoding that hash was
/// taken over. Routing tables are built only from one: the sender seals once
/// ([`Sealed::new`]) and sends these bytes; the receiver checks them as they came
/// ([`Sealed::decode`]). Neither side encodes the snapshot a second time to hash it, which at
/// 20,000 routes was a third of a proxy's table build.
#[derive(Debug, Clone)]
pub struct Sealed {
    version: String,
    /// Decoded on first use when the snapshot was sealed from its encoding
    /// ([`Sealed::from_encoding`]): the controller writes the bytes directly and never reads
    /// them back, while tests and the snapshot command do.
    snapshot: std::sync::OnceLock<Snapshot>,
    encoded: bytes::Bytes,
}

/// Why bytes or a snapshot are not a sealed snapshot.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("not a snapshot: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("the snapshot has no content version")]
    Unversioned,
    #[error("the snapshot's version {0:?} does not match its content")]
    Mismatch(String),
}

impl Sealed {
    /// Seals `snapshot` (any `version` it has is replaced), encoding it once.
    pub fn new(mut snapshot: Snapshot) -> Self {
        snapshot.version.clear();
        // Room for the version field in front, so the hashed bytes are not copied behind it.
        let mut buf = Vec::with_capacity(VERSION_FIELD + snapshot.encoded_len());
        buf.resize(VERSION_FIELD, 0);
        snapshot.encode_raw(&mut buf);
        let version = hex_digest(&buf[VERSION_FIELD..]);
        buf[0] = 0x0a; // field 1, wire type 2
        buf[1] = 64; // one varint byte
        buf[2..VERSION_FIELD].copy_from_slice(version.as_bytes());
        snapshot.version = version.clone();
        Self {
            version,
            snapshot: snapshot.into(),
            encoded: buf.into(),
        }
    }

    /// The encoding of a snapshot with no version field in front of it (`VERSION_FIELD`
    /// bytes of room instead, see [`Sealed::ROOM`]), sealed. The caller wrote the encoding
    /// itself; it is decoded only if someone reads the snapshot.
    pub fn from_encoding(mut buf: Vec<u8>) -> Self {
        debug_assert!(buf.len() >= VERSION_FIELD);
        let version = hex_digest(&buf[VERSION_FIELD..]);
        buf[0] = 0x0a; // field 1, wire type 2
        buf[1] = 64;
        buf[2..VERSION_FIELD].copy_from_slice(version.as_bytes());
        Self {
            version,
            snapshot: std::sync::OnceLock::new(),
            encoded: buf.into(),
        }
    }

    /// How many bytes [`Sealed::from_encoding`] expects in front of the encoding.
    pub const ROOM: usize = VERSION_FIELD;

    /// The content version (the same as the snapshot's `version`, without decoding it).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Decodes bytes a sender sealed, checking the hash over the bytes as received: a field
    /// changed, dropped or added anywhere after the version fails the check.
    pub fn decode(encoded: bytes::Bytes) -> Result<Self, SealError> {
        let Some(claimed) = claimed_version(&encoded) else {
            // Not written by `Sealed::new`; an older sender's encoding is checked the slow way.
            return Self::check(Snapshot::decode(encoded.as_ref())?);
        };
        check_hash(&encoded, claimed)?;
        let snapshot = Snapshot::decode(encoded.as_ref())?;
        // The field could come again further on, and the last one is what decodes.
        if snapshot.version != claimed {
            return Err(SealError::Mismatch(snapshot.version));
        }
        Ok(Self {
            version: snapshot.version.clone(),
            snapshot: snapshot.into(),
            encoded,
        })
    }

    /// Checks a snapshot that came without its encoding (a file written as JSON or YAML).
    pub fn check(snapshot: Snapshot) -> Result<Self, SealError> {
        if snapshot.version.is_empty() {
            return Err(SealError::Unversioned);
        }
        let claimed = snapshot.version.clone();
        let sealed = Self::new(snapshot);
        if sealed.version != claimed {
            return Err(SealError::Mismatch(claimed));
        }
        Ok(sealed)
    }

    pub fn snapshot(&self) -> &Snapshot {
        self.snapshot.get_or_init(|| {
            // Only `from_encoding` leaves the cell empty, with bytes its caller encoded from a
            // snapshot: they decode unless that writer is wrong, which tests would show.
            Snapshot::decode(&self.encoded[..]).expect("a snapshot sealed from its own encoding")
        })
    }

    /// The sealed encoding: what goes on the wire and into a proxy's cache file.
    pub fn encoded(&self) -> &bytes::Bytes {
        &self.encoded
    }

    pub fn into_snapshot(self) -> Snapshot {
        self.snapshot();
        self.snapshot.into_inner().unwrap_or_default()
    }

    /// The decoded snapshot when there is one, and the encoding.
    pub fn into_parts(self) -> (Option<Snapshot>, bytes::Bytes) {
        (self.snapshot.into_inner(), self.encoded)
    }
}

impl std::ops::Deref for Sealed {
    type Target = Snapshot;
    fn deref(&self) -> &Snapshot {
        self.snapshot()
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
        unknown_requirement(&self.requires, known)
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
        assert_eq!(a.version, a.content_version());
        let mut changed = a.clone().into_snapshot();
        changed.listeners[0].port = 8080;
        assert!(!changed.is_sealed());
        assert!(matches!(
            Sealed::check(changed),
            Err(SealError::Mismatch(v)) if v == a.version
        ));
        assert!(matches!(
            Sealed::check(sample()),
            Err(SealError::Unversioned)
        ));
    }

    #[test]
    fn a_sealed_encoding_is_the_snapshot_encoded_and_decodes_back() {
        let sealed = sample().seal();
        assert_eq!(sealed.encoded().as_ref(), sealed.snapshot().encode_to_vec());
        let back = Sealed::decode(sealed.encoded().clone()).unwrap();
        assert_eq!(back.snapshot(), sealed.snapshot());
        // Sealing again gives the same version whatever version the snapshot had.
        let mut other = sealed.clone().into_snapshot();
        other.version = "x".repeat(300);
        assert_eq!(other.seal().version, sealed.version);
    }

    #[test]
    fn bytes_changed_after_sealing_do_not_decode_as_sealed() {
        let sealed = sample().seal();
        let good = sealed.encoded().to_vec();
        // Every single byte of the content flipped: the hash no longer matches (or the bytes
        // no longer decode).
        for i in VERSION_FIELD..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x01;
            assert!(Sealed::decode(bad.into()).is_err(), "byte {i} flipped");
        }
        // A field appended after the content, even one the hash cannot see a reason to refuse.
        let mut appended = good.clone();
        prost::encoding::uint32::encode(99, &7, &mut appended);
        assert!(matches!(
            Sealed::decode(appended.into()),
            Err(SealError::Mismatch(_))
        ));
        // A second version field at the end, naming another content: the one that decodes is
        // the last, which is not what was hashed.
        let mut twice = good.clone();
        prost::encoding::string::encode(1, &"0".repeat(64), &mut twice);
        assert!(matches!(
            Sealed::decode(twice.into()),
            Err(SealError::Mismatch(_))
        ));
        // A version digit changed.
        let mut claimed = good.clone();
        claimed[2] = if claimed[2] == b'0' { b'1' } else { b'0' };
        assert!(matches!(
            Sealed::decode(claimed.into()),
            Err(SealError::Mismatch(_))
        ));
        // No version at all.
        assert!(matches!(
            Sealed::decode(sample().encode_to_vec().into()),
            Err(SealError::Unversioned)
        ));
        // Not a snapshot.
        assert!(matches!(
            Sealed::decode(bytes::Bytes::from_static(&[0xff, 0xff, 0xff])),
            Err(SealError::Decode(_))
        ));
    }

    #[test]
    fn an_encoding_not_made_by_sealed_is_checked_by_its_content() {
        // A sender that wrote fields in another order: the version field is not first.
        let sealed = sample().seal();
        let mut unversioned = sealed.snapshot().clone();
        unversioned.version.clear();
        let mut reordered = unversioned.encode_to_vec();
        prost::encoding::string::encode(1, &sealed.version, &mut reordered);
        let back = Sealed::decode(reordered.into()).unwrap();
        assert_eq!(back.version, sealed.version);
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
        let json = serde_json::to_string(s.snapshot()).unwrap();
        assert!(json.contains("\"PROTOCOL_HTTP\""), "{json}");
        assert!(json.contains("\"sharedPool\""), "{json}");
        let back: Snapshot = serde_json::from_str(&json).unwrap();
        assert_eq!(&back, s.snapshot());
        let yaml = to_yaml(s.snapshot()).unwrap();
        assert!(yaml.contains("sharedPool: {}"), "{yaml}");
        assert_eq!(&Snapshot::from_yaml(&yaml).unwrap(), s.snapshot());
        assert_eq!(
            &Snapshot::from_yaml(&json).unwrap(),
            s.snapshot(),
            "JSON is YAML"
        );
    }
}
