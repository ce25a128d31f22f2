//! Writes a scope's snapshot encoding from the assembled parts. Each route is encoded once
//! ([`EncodedRoute`]) and its bytes are copied into every virtual host that lists it; the
//! snapshot is never built as a message tree and encoded again. The output is the encoding
//! prost gives the same snapshot, byte for byte (fields in number order, proto3 defaults
//! left out): `tests/encode.rs` decodes it, encodes it again and compares.

use coxswain_api::snapshot::{self as snap, Sealed};
use prost::Message;
use prost::encoding::{self, WireType, encode_key, encode_varint, encoded_len_varint, key_len};

/// A route's encoding and what the assembler needs to know of it without decoding it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedRoute {
    pub bytes: Vec<u8>,
    /// Every cluster the route sends to: backends, mirrors, its authorization and global rate
    /// limit services.
    pub clusters: Vec<String>,
    pub features: Features,
}

/// The protecting features a route uses (they become `Snapshot.requires`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Features {
    pub basic_auth: bool,
    pub rate_limit: bool,
    pub external_auth: bool,
    pub jwt: bool,
    pub global_rate_limit: bool,
}

impl Features {
    pub fn union(self, other: Self) -> Self {
        Self {
            basic_auth: self.basic_auth || other.basic_auth,
            rate_limit: self.rate_limit || other.rate_limit,
            external_auth: self.external_auth || other.external_auth,
            jwt: self.jwt || other.jwt,
            global_rate_limit: self.global_rate_limit || other.global_rate_limit,
        }
    }
}

impl EncodedRoute {
    pub fn new(route: &snap::Route) -> Self {
        let mut clusters: Vec<String> = route.backends.iter().map(|b| b.cluster.clone()).collect();
        let mirrors = route
            .filters
            .iter()
            .chain(route.backends.iter().flat_map(|b| &b.filters));
        for f in mirrors {
            if let Some(snap::filter::Kind::RequestMirror(m)) = &f.kind {
                clusters.push(m.cluster.clone());
            }
        }
        if let Some(auth) = &route.external_auth
            && !auth.cluster.is_empty()
        {
            clusters.push(auth.cluster.clone());
        }
        if let Some(global) = &route.global_rate_limit
            && !global.cluster.is_empty()
        {
            clusters.push(global.cluster.clone());
        }
        clusters.sort();
        clusters.dedup();
        Self {
            bytes: route.encode_to_vec(),
            clusters,
            features: Features {
                basic_auth: route.basic_auth.is_some(),
                rate_limit: !route.rate_limits.is_empty(),
                external_auth: route.external_auth.is_some(),
                jwt: route.jwt.is_some(),
                global_rate_limit: route.global_rate_limit.is_some(),
            },
        }
    }
}

impl EncodedRoute {
    /// The route again, for the passes that change a compiled route (access policies, a
    /// Gateway's own backend clusters).
    pub fn decode(&self) -> snap::Route {
        // Bytes `new` encoded from a route in this process.
        snap::Route::decode(&self.bytes[..]).expect("an encoded route decodes")
    }
}

/// A virtual host, encoded once when it is made ([`virtual_host`]): a pass writes the bytes
/// of every host into the snapshot without walking their routes again.
#[derive(Debug)]
pub struct VirtualHost<'a> {
    /// The `snap::VirtualHost` message, without its tag and length.
    pub encoded: &'a [u8],
    pub terminate_tls: bool,
}

/// `snap::Listener` with its virtual hosts as [`VirtualHost`]s.
#[derive(Debug)]
pub struct Listener<'a> {
    pub port: u32,
    pub protocol: snap::Protocol,
    pub sources: Vec<String>,
    pub virtual_hosts: Vec<VirtualHost<'a>>,
    pub certificates: Vec<snap::SniCertificate>,
    pub listener_hostnames: Vec<String>,
    pub client_validation: Option<snap::ClientValidation>,
    pub public_port: u32,
}

/// What a virtual host's routes are kept as: anything holding an encoded route.
pub trait HasRoute {
    fn route(&self) -> &EncodedRoute;
}

/// Everything in a scope's snapshot but its version.
pub struct Parts<'a> {
    pub scope: snap::Scope,
    pub listeners: Vec<Listener<'a>>,
    /// Each `snap::Cluster` message, encoded, without its tag and length.
    pub clusters: Vec<&'a [u8]>,
    pub certificates: Vec<snap::Certificate>,
    pub requires: Vec<String>,
}

/// The `snap::VirtualHost` message of `hostname` with `routes` (their encodings copied in
/// order), as [`VirtualHost::encoded`] holds it.
pub fn virtual_host<E: HasRoute>(
    hostname: &str,
    routes: &[std::sync::Arc<E>],
    single_label: bool,
    terminate_tls: bool,
) -> Vec<u8> {
    let mut len = 0;
    if !hostname.is_empty() {
        len += delimited_len(1, hostname.len());
    }
    len += routes
        .iter()
        .map(|r| delimited_len(2, r.route().bytes.len()))
        .sum::<usize>();
    if single_label {
        len += encoding::bool::encoded_len(3, &true);
    }
    if terminate_tls {
        len += encoding::bool::encoded_len(4, &true);
    }
    let mut buf = Vec::with_capacity(len);
    if !hostname.is_empty() {
        write_delimited_header(1, hostname.len(), &mut buf);
        buf.extend_from_slice(hostname.as_bytes());
    }
    for r in routes {
        let route = &r.route().bytes;
        write_delimited_header(2, route.len(), &mut buf);
        buf.extend_from_slice(route);
    }
    if single_label {
        encoding::bool::encode(3, &true, &mut buf);
    }
    if terminate_tls {
        encoding::bool::encode(4, &true, &mut buf);
    }
    debug_assert_eq!(buf.len(), len);
    buf
}

fn delimited_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

fn write_delimited_header(tag: u32, len: usize, buf: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(len as u64, buf);
}

impl Parts<'_> {
    fn listener_len(l: &Listener<'_>) -> usize {
        let mut n = 0;
        if l.port != 0 {
            n += encoding::uint32::encoded_len(1, &l.port);
        }
        if l.protocol as i32 != 0 {
            n += encoding::int32::encoded_len(2, &(l.protocol as i32));
        }
        n += encoding::string::encoded_len_repeated(3, &l.sources);
        n += l
            .virtual_hosts
            .iter()
            .map(|v| delimited_len(4, v.encoded.len()))
            .sum::<usize>();
        n += encoding::message::encoded_len_repeated(5, &l.certificates);
        n += encoding::string::encoded_len_repeated(6, &l.listener_hostnames);
        if let Some(cv) = &l.client_validation {
            n += encoding::message::encoded_len(7, cv);
        }
        if l.public_port != 0 {
            n += encoding::uint32::encoded_len(8, &l.public_port);
        }
        n
    }

    /// The snapshot, encoded and sealed.
    pub fn seal(self) -> Sealed {
        let listener_lens: Vec<usize> = self.listeners.iter().map(Self::listener_len).collect();
        let len = Sealed::ROOM
            + encoding::message::encoded_len(2, &self.scope)
            + listener_lens
                .iter()
                .map(|&n| delimited_len(3, n))
                .sum::<usize>()
            + self
                .clusters
                .iter()
                .map(|c| delimited_len(4, c.len()))
                .sum::<usize>()
            + encoding::message::encoded_len_repeated(5, &self.certificates)
            + encoding::string::encoded_len_repeated(6, &self.requires);
        let mut buf = Vec::with_capacity(len);
        buf.resize(Sealed::ROOM, 0);
        encoding::message::encode(2, &self.scope, &mut buf);
        for (l, &l_len) in self.listeners.iter().zip(&listener_lens) {
            write_delimited_header(3, l_len, &mut buf);
            if l.port != 0 {
                encoding::uint32::encode(1, &l.port, &mut buf);
            }
            if l.protocol as i32 != 0 {
                encoding::int32::encode(2, &(l.protocol as i32), &mut buf);
            }
            encoding::string::encode_repeated(3, &l.sources, &mut buf);
            for v in &l.virtual_hosts {
                write_delimited_header(4, v.encoded.len(), &mut buf);
                buf.extend_from_slice(v.encoded);
            }
            for c in &l.certificates {
                encoding::message::encode(5, c, &mut buf);
            }
            encoding::string::encode_repeated(6, &l.listener_hostnames, &mut buf);
            if let Some(cv) = &l.client_validation {
                encoding::message::encode(7, cv, &mut buf);
            }
            if l.public_port != 0 {
                encoding::uint32::encode(8, &l.public_port, &mut buf);
            }
        }
        for c in &self.clusters {
            write_delimited_header(4, c.len(), &mut buf);
            buf.extend_from_slice(c);
        }
        for c in &self.certificates {
            encoding::message::encode(5, c, &mut buf);
        }
        encoding::string::encode_repeated(6, &self.requires, &mut buf);
        debug_assert_eq!(buf.len(), len);
        Sealed::from_encoding(buf)
    }
}
