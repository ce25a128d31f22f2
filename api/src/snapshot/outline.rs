//! A snapshot's outline: its encoding read down to the virtual hosts and clusters, whose own
//! bytes are kept undecoded (slices of the received buffer, no copy).
//!
//! A proxy holding 20,000 routes that receives a snapshot changing one of them compares each
//! host's and cluster's bytes with what its table was built from, and decodes only the ones
//! that differ. Decoding the whole snapshot was half of applying such a change.
//!
//! These messages read the same wire format as [`Snapshot`], [`Listener`] and
//! [`VirtualHost`], with a nested message taken as its bytes where the proxy compares before
//! it decodes. Every field of those three messages has its place here: a field the outline
//! did not know would be dropped without a word (`tests` check the numbers against the
//! .proto and that an outline encodes back to the bytes it came from).

use super::{Certificate, ClientValidation, Scope, SealError, Sealed, SniCertificate};
use bytes::Bytes;
use prost::Message;

/// [`super::Snapshot`], with clusters as their encodings.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Outline {
    #[prost(string, tag = "1")]
    pub version: String,
    #[prost(message, optional, tag = "2")]
    pub scope: Option<Scope>,
    #[prost(message, repeated, tag = "3")]
    pub listeners: Vec<ListenerOutline>,
    /// Each a [`super::Cluster`] encoded.
    #[prost(bytes = "bytes", repeated, tag = "4")]
    pub clusters: Vec<Bytes>,
    #[prost(message, repeated, tag = "5")]
    pub certificates: Vec<Certificate>,
    #[prost(string, repeated, tag = "6")]
    pub requires: Vec<String>,
}

/// [`super::Listener`], with virtual hosts as their encodings ([`HostOutline::decode`]).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListenerOutline {
    #[prost(uint32, tag = "1")]
    pub port: u32,
    #[prost(enumeration = "super::Protocol", tag = "2")]
    pub protocol: i32,
    #[prost(string, repeated, tag = "3")]
    pub sources: Vec<String>,
    #[prost(bytes = "bytes", repeated, tag = "4")]
    pub virtual_hosts: Vec<Bytes>,
    #[prost(message, repeated, tag = "5")]
    pub certificates: Vec<SniCertificate>,
    #[prost(string, repeated, tag = "6")]
    pub listener_hostnames: Vec<String>,
    #[prost(message, optional, tag = "7")]
    pub client_validation: Option<ClientValidation>,
    #[prost(uint32, tag = "8")]
    pub public_port: u32,
}

/// [`super::VirtualHost`], with routes as their encodings.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HostOutline {
    #[prost(string, tag = "1")]
    pub hostname: String,
    /// Each a [`super::Route`] encoded.
    #[prost(bytes = "bytes", repeated, tag = "2")]
    pub routes: Vec<Bytes>,
    #[prost(bool, tag = "3")]
    pub single_label: bool,
    #[prost(bool, tag = "4")]
    pub terminate_tls: bool,
}

/// What a table files a [`super::VirtualHost`] by: its name and kind, not its routes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HostName {
    #[prost(string, tag = "1")]
    pub hostname: String,
    #[prost(bool, tag = "3")]
    pub single_label: bool,
}

/// The one field of a [`super::Cluster`] a table files it by.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ClusterName {
    #[prost(string, tag = "1")]
    pub name: String,
}

/// The field numbers each outline message reads, by the .proto message they stand for.
pub const FIELDS: &[(&str, &[u32])] = &[
    ("Snapshot", &[1, 2, 3, 4, 5, 6]),
    ("Listener", &[1, 2, 3, 4, 5, 6, 7, 8]),
    ("VirtualHost", &[1, 2, 3, 4]),
];

impl Outline {
    /// The outline of bytes known to be a sealed snapshot's.
    pub fn of(sealed: &Sealed) -> Result<Self, prost::DecodeError> {
        Self::decode(sealed.encoded().clone())
    }

    /// Checks received bytes as [`Sealed::decode`] does (the hash over the bytes as they came,
    /// and that the version field holds it), decoding only the outline. What the outline
    /// leaves encoded is decoded, and may fail, when it is used.
    pub fn verify(encoded: Bytes) -> Result<Self, SealError> {
        let Some(claimed) = super::claimed_version(&encoded) else {
            // Not written by `Sealed::new`: checked by its content, the slow way.
            return Ok(Self::of(&Sealed::decode(encoded)?)?);
        };
        super::check_hash(&encoded, claimed)?;
        let outline = Self::decode(encoded.clone())?;
        // The field could come again further on, and the last one is what decodes.
        if outline.version != claimed {
            return Err(SealError::Mismatch(outline.version));
        }
        Ok(outline)
    }

    /// `Snapshot.requires`' first feature that is not in `known`, if any.
    pub fn unknown_requirement(&self, known: &[&str]) -> Option<&str> {
        super::unknown_requirement(&self.requires, known)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion
    use super::*;
    use crate::snapshot::{self as snap, Snapshot};

    /// A snapshot with every field of Snapshot, Listener and VirtualHost set.
    fn full() -> Snapshot {
        let route = |name: &str| snap::Route {
            source: Some(snap::RouteSource {
                kind: "HTTPRoute".into(),
                namespace: "web".into(),
                name: name.into(),
                ..Default::default()
            }),
            backends: vec![snap::WeightedBackend {
                cluster: format!("web/{name}:80"),
                weight: 1,
                ..Default::default()
            }],
            ..Default::default()
        };
        Snapshot {
            version: String::new(),
            scope: Some(snap::Scope {
                kind: Some(snap::scope::Kind::SharedPool(snap::SharedPool {})),
            }),
            listeners: vec![snap::Listener {
                port: 8443,
                protocol: snap::Protocol::Https as i32,
                sources: vec!["Gateway/web/gw/https".into()],
                virtual_hosts: vec![
                    snap::VirtualHost {
                        hostname: "*.example.com".into(),
                        routes: vec![route("a"), route("b")],
                        single_label: true,
                        terminate_tls: true,
                    },
                    snap::VirtualHost {
                        hostname: String::new(),
                        routes: vec![route("c")],
                        single_label: false,
                        terminate_tls: false,
                    },
                ],
                certificates: vec![snap::SniCertificate {
                    sni: "*.example.com".into(),
                    certificate: "web/cert".into(),
                }],
                listener_hostnames: vec!["*.example.com".into()],
                client_validation: Some(snap::ClientValidation {
                    ca_pem: "CA".into(),
                    allow_insecure_fallback: true,
                }),
                public_port: 443,
            }],
            clusters: vec![snap::Cluster {
                name: "web/a:80".into(),
                endpoints: vec![snap::Endpoint {
                    address: "10.0.0.1".into(),
                    port: 80,
                    ready: true,
                    serving: true,
                    terminating: false,
                }],
                ..Default::default()
            }],
            certificates: vec![snap::Certificate {
                name: "web/cert".into(),
                cert_chain_pem: "CHAIN".into(),
                private_key_pem: "KEY".into(),
            }],
            requires: vec![snap::feature::PUBLIC_PORT.into()],
        }
    }

    #[test]
    fn an_outline_encodes_back_to_the_bytes_it_was_read_from() {
        let sealed = full().seal();
        let outline = Outline::verify(sealed.encoded().clone()).unwrap();
        assert_eq!(outline.version, sealed.version());
        assert_eq!(outline.encode_to_vec(), sealed.encoded()[..]);
        for (l, full) in outline.listeners.iter().zip(&sealed.listeners) {
            for (raw, host) in l.virtual_hosts.iter().zip(&full.virtual_hosts) {
                let h = HostOutline::decode(raw.clone()).unwrap();
                assert_eq!(h.encode_to_vec(), raw[..]);
                assert_eq!(h.hostname, host.hostname);
                let name = HostName::decode(raw.clone()).unwrap();
                assert_eq!(
                    (name.hostname, name.single_label),
                    (host.hostname.clone(), host.single_label)
                );
                let routes: Vec<snap::Route> = h
                    .routes
                    .iter()
                    .map(|r| snap::Route::decode(r.clone()).unwrap())
                    .collect();
                assert_eq!(routes, host.routes);
            }
        }
        let cluster = ClusterName::decode(outline.clusters[0].clone()).unwrap();
        assert_eq!(cluster.name, "web/a:80");
        assert_eq!(
            snap::Cluster::decode(outline.clusters[0].clone()).unwrap(),
            sealed.clusters[0]
        );
    }

    #[test]
    fn an_outline_keeps_slices_of_the_received_buffer() {
        let sealed = full().seal();
        let outline = Outline::of(&sealed).unwrap();
        let buffer = sealed.encoded().as_ptr_range();
        let inside = |b: &Bytes| buffer.contains(&b.as_ptr());
        assert!(outline.clusters.iter().all(inside));
        assert!(outline.listeners[0].virtual_hosts.iter().all(inside));
    }

    #[test]
    fn the_outline_reads_every_field_the_proto_declares() {
        let proto = include_str!("../../proto/coxswain/snapshot/v1/snapshot.proto");
        for (message, numbers) in FIELDS {
            let body = proto
                .split(&format!("\nmessage {message} {{"))
                .nth(1)
                .and_then(|rest| rest.split("\n}").next())
                .unwrap_or_else(|| panic!("message {message} not in the .proto"));
            let mut declared: Vec<u32> = body
                .lines()
                .map(|l| l.split("//").next().unwrap_or_default().trim())
                .filter_map(|l| l.strip_suffix(';')?.rsplit_once('='))
                .map(|(_, n)| n.trim().parse().unwrap())
                .collect();
            declared.sort_unstable();
            assert_eq!(&declared, numbers, "{message}: the outline is out of date");
        }
    }

    #[test]
    fn changed_bytes_do_not_verify() {
        let sealed = full().seal();
        let mut bytes = sealed.encoded().to_vec();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        assert!(matches!(
            Outline::verify(bytes.into()),
            Err(SealError::Mismatch(_))
        ));
    }

    #[test]
    fn a_route_that_does_not_decode_fails_where_it_is_read_not_when_verified() {
        // A sender that hashed garbage: the outline verifies, the host's route does not decode.
        let mut host = Vec::new();
        prost::encoding::string::encode(1, &"a.example".to_owned(), &mut host);
        prost::encoding::bytes::encode(2, &vec![0xff, 0xff, 0xff], &mut host);
        let mut listener = Vec::new();
        prost::encoding::uint32::encode(1, &80, &mut listener);
        prost::encoding::bytes::encode(4, &host, &mut listener);
        let mut body = vec![0; Sealed::ROOM];
        prost::encoding::bytes::encode(3, &listener, &mut body);
        let sealed = Sealed::from_encoding(body);
        let outline = Outline::verify(sealed.encoded().clone()).unwrap();
        let h = HostOutline::decode(outline.listeners[0].virtual_hosts[0].clone()).unwrap();
        assert!(snap::Route::decode(h.routes[0].clone()).is_err());
        assert!(Sealed::decode(sealed.encoded().clone()).is_err());
    }
}
