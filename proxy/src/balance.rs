//! How a cluster chooses an endpoint for a request, beyond round robin: least request (the
//! less busy of two endpoints drawn at random) and consistent hashing (a hash ring, so that a
//! key keeps its endpoint while others come and go). Also the stable endpoint names session
//! persistence hands to clients.
//!
//! Everything here is built when a snapshot arrives; a pick is a hash and a binary search, or
//! two atomic loads, never an allocation or a lock.

use coxswain_api::snapshot as snap;
use std::cell::Cell;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::AtomicU32;

/// Points each endpoint puts on the ring. More points spread keys more evenly (the share of
/// an endpoint deviates by about 1/sqrt(points)): 160 keeps a newcomer's take near 1/n.
const POINTS_PER_ENDPOINT: u64 = 160;

/// Where a consistent-hash key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashSource {
    /// A request header, by lowercase name.
    Header(Box<str>),
    Cookie(Box<str>),
    ClientAddress,
}

/// A cluster's algorithm, with what it needs prepared.
#[derive(Debug)]
pub enum Balance {
    RoundRobin,
    /// Requests in flight, per endpoint index.
    LeastRequest(Box<[AtomicU32]>),
    ConsistentHash {
        source: HashSource,
        ring: Ring,
    },
}

impl Balance {
    /// `pool`: the endpoint indices requests go to (ready ones, else serving ones), `endpoints`
    /// their addresses by index. An unusable choice (a hash without a key) is round robin.
    pub fn new(lb: Option<&snap::LoadBalancer>, endpoints: &[SocketAddr], pool: &[usize]) -> Self {
        let Some(lb) = lb else {
            return Self::RoundRobin;
        };
        match snap::load_balancer::Algorithm::try_from(lb.algorithm) {
            Ok(snap::load_balancer::Algorithm::LeastRequest) => {
                Self::LeastRequest(endpoints.iter().map(|_| AtomicU32::new(0)).collect())
            }
            Ok(snap::load_balancer::Algorithm::ConsistentHash) => {
                let source = match lb.hash.as_ref().and_then(|h| h.source.as_ref()) {
                    Some(snap::hash_key::Source::Header(h)) if !h.is_empty() => {
                        HashSource::Header(h.to_ascii_lowercase().into())
                    }
                    Some(snap::hash_key::Source::Cookie(c)) if !c.is_empty() => {
                        HashSource::Cookie(c.as_str().into())
                    }
                    Some(snap::hash_key::Source::ClientAddress(true)) => HashSource::ClientAddress,
                    _ => return Self::RoundRobin,
                };
                Self::ConsistentHash {
                    source,
                    ring: Ring::new(endpoints, pool),
                }
            }
            _ => Self::RoundRobin,
        }
    }
}

/// A hash ring over a cluster's endpoints: each endpoint's points are hashes of its address,
/// so an endpoint lands on the same points in every snapshot and in every replica.
#[derive(Debug, Default)]
pub struct Ring {
    /// (point, endpoint index), by point.
    points: Vec<(u64, u32)>,
}

impl Ring {
    pub fn new(endpoints: &[SocketAddr], pool: &[usize]) -> Self {
        let mut points = Vec::with_capacity(pool.len() * POINTS_PER_ENDPOINT as usize);
        for &i in pool {
            let Ok(index) = u32::try_from(i) else {
                continue;
            };
            let base = endpoint_id(endpoints[i]);
            for n in 0..POINTS_PER_ENDPOINT {
                points.push((mix(base ^ mix(n.wrapping_add(1))), index));
            }
        }
        points.sort_unstable();
        Self { points }
    }

    /// Endpoints in ring order from where `key` falls: the first one `usable` accepts wins
    /// (an ejected endpoint passes its keys to the next on the ring, not to a random one).
    pub fn find(&self, key: u64, mut usable: impl FnMut(usize) -> bool) -> Option<usize> {
        if self.points.is_empty() {
            return None;
        }
        let start = self.points.partition_point(|&(p, _)| p < key);
        let n = self.points.len();
        let mut first = None;
        for k in 0..n {
            let endpoint = self.points[(start + k) % n].1 as usize;
            if first.is_none() {
                first = Some(endpoint);
            } else if first == Some(endpoint) {
                continue;
            }
            if usable(endpoint) {
                return Some(endpoint);
            }
        }
        // Nothing usable: the key's own endpoint, as round robin serves an ejected one then.
        first
    }
}

/// A stable 64-bit name for an endpoint: the same address gives the same name in every
/// snapshot and every proxy, so a session cookie survives swaps and replica changes.
pub fn endpoint_id(addr: SocketAddr) -> u64 {
    let mut h = Fnv::default();
    match addr.ip() {
        IpAddr::V4(v4) => h.write(&v4.octets()),
        IpAddr::V6(v6) => h.write(&v6.octets()),
    }
    h.write(&addr.port().to_be_bytes());
    mix(h.0)
}

/// The hash of a key's bytes, for the ring.
pub fn key_hash(bytes: &[u8]) -> u64 {
    let mut h = Fnv::default();
    h.write(bytes);
    mix(h.0)
}

/// A client address's hash, for the ring.
pub fn address_hash(ip: IpAddr) -> u64 {
    match ip {
        IpAddr::V4(v4) => key_hash(&v4.octets()),
        IpAddr::V6(v6) => key_hash(&v6.octets()),
    }
}

/// FNV-1a: small and stable across builds and platforms (std's hasher promises neither).
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// SplitMix64's finaliser: FNV's low bits are weak, the ring needs all 64 spread.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Two distinct positions in `0..len` (len >= 2), drawn from a per-thread generator: no
/// shared counter, so workers do not contend on it.
pub fn two_choices(len: usize) -> (usize, usize) {
    thread_local! {
        static STATE: Cell<u64> = Cell::new(mix(std::process::id().into()) | 1);
    }
    let r = STATE.with(|s| {
        // xorshift64
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        x
    });
    let len = len as u64;
    let a = r % len;
    let b = (a + 1 + (r >> 32) % (len - 1)) % len;
    (a as usize, b as usize)
}

/// The value of cookie `name` in a Cookie header's value (`a=1; b=2`).
pub fn cookie_value<'v>(header: &'v [u8], name: &str) -> Option<&'v [u8]> {
    header.split(|&b| b == b';').find_map(|pair| {
        let pair = pair.trim_ascii();
        let eq = pair.iter().position(|&b| b == b'=')?;
        (pair[..eq].trim_ascii() == name.as_bytes()).then(|| pair[eq + 1..].trim_ascii())
    })
}

#[cfg(test)]
mod tests;
