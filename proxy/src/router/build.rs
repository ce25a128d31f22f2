//! Building a routing table from a snapshot's outline, sharing with the table it replaces
//! whatever the snapshot did not change. What is shared is told by bytes, before anything is
//! decoded: a snapshot that changes one route of 20,000 decodes and compiles one host.

use super::compile::{compile_route, reusable, unchanged};
use super::{BuildError, HostIndex, ListenerNames, PortRouter, Router};
use crate::upstream::ClusterState;
use bytes::Bytes;
use coxswain_api::snapshot::outline::{ClusterName, HostName, HostOutline, Outline};
use coxswain_api::snapshot::{self as snap};
use prost::Message;
use std::collections::HashMap;
use std::sync::Arc;

/// A table's cluster states by name.
type Clusters = HashMap<Box<str>, Arc<ClusterState>>;

impl Router {
    /// Builds the table that replaces `previous`, sharing what has not changed:
    /// - a cluster whose encoding is the same (its state, rotation included);
    /// - a host whose encoding is the same and whose routes send to shared clusters: the
    ///   whole compiled host;
    /// - in a host that changed, a route at the same place (position give or take one) with
    ///   the same content: its copy of the route, counters and policy;
    /// - a port's index of host names, while its hosts keep their names and places.
    ///
    /// Hosts are compared in order with the previous table's (a snapshot lists them sorted,
    /// so a host added or removed shifts the rest by one), and by name where that fails.
    ///
    /// A snapshot usually changes a few routes of many. Decoding the whole of it was half
    /// the time of applying a change at 20,000 routes. And the copies were most of a table's
    /// memory (a `snap::Route` takes a 1 KiB allocation); made while the old table still
    /// held its own and freed with it one swap later, they left the allocator's pages
    /// part-used, and the proxy's resident size grew with every swap.
    ///
    /// Counters of routes no table holds any more are dropped by
    /// [`crate::metrics::Metrics::forget_unused`], which the caller runs off the path of the
    /// change (after the swap and the ack).
    pub fn build_after(
        outline: &Outline,
        metrics: &crate::metrics::Metrics,
        previous: &Self,
    ) -> Result<Self, BuildError> {
        let (clusters, clusters_same) = build_clusters(outline, metrics, previous)?;
        let mut ports = HashMap::new();
        for l in &outline.listeners {
            let port = u16::try_from(l.port).map_err(|_| BuildError::Port(l.port))?;
            let public_port = match l.public_port {
                0 => port,
                p => u16::try_from(p).map_err(|_| BuildError::Port(p))?,
            };
            let before = previous.ports.get(&port);
            let hosts = Hosts {
                port,
                clusters: &clusters,
                clusters_same,
                metrics,
            }
            .build(&l.virtual_hosts, before)?;
            ports.insert(
                port,
                PortRouter {
                    index: hosts.index,
                    hosts: hosts.hosts,
                    encoded: hosts.encoded,
                    terminates_tls: hosts.terminates_tls,
                    protocol: snap::Protocol::try_from(l.protocol).unwrap_or(snap::Protocol::Http),
                    public_port,
                    listeners: ListenerNames::new(&l.listener_hostnames),
                },
            );
        }
        Ok(Self {
            ports,
            clusters,
            version: outline.version.clone(),
        })
    }
}

/// Building one port's hosts.
struct Hosts<'a> {
    port: u16,
    clusters: &'a Clusters,
    /// Every cluster state is the previous table's, and no cluster came or went.
    clusters_same: bool,
    metrics: &'a crate::metrics::Metrics,
}

/// A port's hosts, built.
struct Built {
    index: Arc<HostIndex>,
    hosts: Vec<Arc<[super::CompiledRoute]>>,
    encoded: Vec<Bytes>,
    terminates_tls: Vec<bool>,
}

impl Hosts<'_> {
    fn build(&self, encoded: &[Bytes], before: Option<&PortRouter>) -> Result<Built, BuildError> {
        let n = encoded.len();
        let mut out = Built {
            index: Arc::default(),
            hosts: Vec::with_capacity(n),
            encoded: Vec::with_capacity(n),
            terminates_tls: Vec::with_capacity(n),
        };
        // How the hosts moved: each previous host's place now (None: gone), and the names new
        // here. Every host in its previous place keeps the index; otherwise it is moved.
        let mut moves = Moves {
            to: vec![None; before.map_or(0, |b| b.hosts.len())],
            added: Vec::new(),
            clash: false,
        };
        // The previous table's first host not matched yet.
        let mut next = 0;
        for (i, bytes) in encoded.iter().enumerate() {
            if let Some(b) = before {
                // The same bytes as the previous table's next host, or the one after it.
                let same = (next..b.hosts.len().min(next + 2)).find(|&k| {
                    b.encoded.get(k) == Some(bytes)
                        && unchanged(&b.hosts[k], self.clusters, self.clusters_same)
                });
                if let Some(k) = same {
                    moves.claim(k, i);
                    out.hosts.push(Arc::clone(&b.hosts[k]));
                    out.encoded.push(bytes.clone());
                    out.terminates_tls
                        .push(b.terminates_tls.get(k).copied().unwrap_or(false));
                    next = k + 1;
                    continue;
                }
            }
            let host = HostOutline::decode(bytes.clone()).map_err(|source| BuildError::Decode {
                what: format!("a virtual host of port {}", self.port),
                source,
            })?;
            let name = host.hostname.to_ascii_lowercase();
            let kept_at = before.and_then(|b| b.named_host(&name, host.single_label));
            match kept_at {
                Some(k) => {
                    next = next.max(k + 1);
                    moves.claim(k, i);
                }
                None => moves.added.push((name.clone(), host.single_label, i)),
            }
            let kept = before.zip(kept_at).and_then(|(b, k)| b.hosts.get(k));
            let mut earlier = kept.map(|k| &k[..]).unwrap_or_default();
            let mut routes = Vec::with_capacity(host.routes.len());
            for r in &host.routes {
                let r = snap::Route::decode(r.clone()).map_err(|source| BuildError::Decode {
                    what: format!("a route of host {name:?} on port {}", self.port),
                    source,
                })?;
                let same = reusable(&mut earlier, &r);
                routes.push(compile_route(&r, same, self.clusters, self.metrics)?);
            }
            out.hosts.push(Arc::from(routes));
            out.encoded.push(bytes.clone());
            out.terminates_tls.push(host.terminate_tls);
        }
        out.index = match before {
            Some(b) if moves.in_place(n) => Arc::clone(&b.index),
            Some(b) => match b.index.moved(moves) {
                Some(index) => Arc::new(index),
                None => Arc::new(HostIndex::of(&out.encoded, self.port)?),
            },
            None => Arc::new(HostIndex::of(&out.encoded, self.port)?),
        };
        Ok(out)
    }
}

/// How a port's hosts moved from the previous table to this one.
struct Moves {
    /// By previous place: where that host is now.
    to: Vec<Option<usize>>,
    /// Hosts whose names the previous table did not have: (name, single-label, place).
    added: Vec<(String, bool, usize)>,
    /// Two hosts took one previous host's place: the index is built afresh.
    clash: bool,
}

impl Moves {
    /// Whether `n` hosts are the previous `n`, each in its place.
    fn in_place(&self, n: usize) -> bool {
        !self.clash
            && self.added.is_empty()
            && self.to.len() == n
            && self.to.iter().enumerate().all(|(k, to)| *to == Some(k))
    }

    fn claim(&mut self, previous: usize, now: usize) {
        match self.to.get_mut(previous) {
            Some(slot @ None) => *slot = Some(now),
            _ => self.clash = true,
        }
    }
}

impl HostIndex {
    /// This index with its hosts moved: a copy of the names (shared), their places moved,
    /// those gone dropped and the new ones added. None when building afresh is as cheap (many
    /// new names) or when the moves are not a plain one-to-one (two hosts of one name), which
    /// [`Self::of`] settles as it always has.
    fn moved(&self, moves: Moves) -> Option<Self> {
        if moves.clash || moves.added.len() > (moves.to.len() / 8).max(1) {
            return None;
        }
        let mut index = self.clone();
        let to = |i: &mut usize| match moves.to.get(*i).copied().flatten() {
            Some(now) => {
                *i = now;
                true
            }
            None => false,
        };
        for names in [
            &mut index.exact,
            &mut index.wildcard,
            &mut index.single_label,
        ] {
            names.retain(|_, i| to(i));
        }
        index.any = index.any.and_then(|mut i| to(&mut i).then_some(i));
        for (name, single_label, i) in moves.added {
            let (names, key) = if name.is_empty() {
                if index.any.replace(i).is_some() {
                    return None;
                }
                continue;
            } else if let Some(suffix) = name.strip_prefix("*.") {
                let names = if single_label {
                    &mut index.single_label
                } else {
                    &mut index.wildcard
                };
                (names, suffix)
            } else {
                (&mut index.exact, name.as_str())
            };
            if names.insert(key.into(), i).is_some() {
                return None;
            }
        }
        Some(index)
    }

    /// The index of hosts encoded as `hosts` are: a later host of a name replaces an
    /// earlier one.
    fn of(hosts: &[Bytes], port: u16) -> Result<Self, BuildError> {
        let mut index = Self::default();
        index.exact.reserve(hosts.len());
        for (i, bytes) in hosts.iter().enumerate() {
            let host = HostName::decode(&bytes[..]).map_err(|source| BuildError::Decode {
                what: format!("a virtual host of port {port}"),
                source,
            })?;
            let mut name = host.hostname;
            name.make_ascii_lowercase();
            if name.is_empty() {
                index.any = Some(i);
            } else if let Some(suffix) = name.strip_prefix("*.") {
                if host.single_label {
                    index.single_label.insert(suffix.into(), i);
                } else {
                    index.wildcard.insert(suffix.into(), i);
                }
            } else {
                index.exact.insert(name.into(), i);
            }
        }
        Ok(index)
    }
}

/// The snapshot's cluster states: the previous table's where the cluster's encoding is the
/// same, new ones (decoded) for the rest; and whether they are all the previous table's,
/// with none added or removed.
fn build_clusters(
    outline: &Outline,
    metrics: &crate::metrics::Metrics,
    previous: &Router,
) -> Result<(Clusters, bool), BuildError> {
    let decode_err = |source| BuildError::Decode {
        what: "a cluster".into(),
        source,
    };
    // In the snapshot's order, so a later cluster of a name replaces an earlier one as it
    // always has: the previous state, or the index of a decoded one.
    let mut order: Vec<(String, Result<Arc<ClusterState>, usize>)> =
        Vec::with_capacity(outline.clusters.len());
    let mut fresh: Vec<snap::Cluster> = Vec::new();
    let mut fresh_encoded: Vec<&[u8]> = Vec::new();
    for encoded in &outline.clusters {
        let name = ClusterName::decode(&encoded[..]).map_err(decode_err)?.name;
        let slot = match previous.clusters.get(name.as_str()) {
            Some(kept) if kept.serves(encoded) => Ok(Arc::clone(kept)),
            _ => {
                fresh.push(snap::Cluster::decode(encoded.clone()).map_err(decode_err)?);
                fresh_encoded.push(encoded);
                Err(fresh.len() - 1)
            }
        };
        order.push((name, slot));
    }
    let client_certs = crate::upstream::client_certs(&fresh, &outline.certificates);
    let mut built: Vec<Option<ClusterState>> = fresh
        .iter()
        .zip(fresh_encoded)
        .map(|(c, encoded)| {
            Some(ClusterState::new(
                c,
                encoded,
                &metrics.outliers,
                &client_certs,
            ))
        })
        .collect();
    let mut out = HashMap::with_capacity(order.len());
    for (name, slot) in order {
        let state = match slot {
            Ok(kept) => kept,
            Err(i) => match built.get_mut(i).and_then(Option::take) {
                Some(state) => Arc::new(state),
                None => continue,
            },
        };
        out.insert(name.into_boxed_str(), state);
    }
    // Every state kept by name and as many as before: the same set.
    let same = fresh.is_empty() && out.len() == previous.clusters.len();
    Ok((out, same))
}
