//! Assembling: route entries grouped into virtual hosts in precedence order per port and
//! scope, and each scope's snapshot sealed with its content hash.
//!
//! [`Assembly`] keeps every port's virtual hosts between passes. A pass compares its entries
//! with the last pass's by identity (an entry is an immutable `Arc`, and a changed one is a new
//! one) and makes again only the virtual hosts a changed entry is in or covers: its own, and
//! for a wildcard or catch-all, every host under it. A port whose listeners changed is made
//! afresh. [`super::compile`] assembles into an empty `Assembly`, so a full compile and an
//! incremental one run the same code on different histories, and the incremental compile's
//! test compares them.

use super::encode::{self, Features};
use super::entries::Entry;
use super::memo::ByAddress;
use super::status::ObjectKey;
use super::{ScopeKey, Slot, gateway, hostname};
use coxswain_api::snapshot::{self as snap, Sealed};
use prost::Message;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// What the assembler keeps between passes.
#[derive(Debug, Default)]
pub struct Assembly {
    /// Every entry of the last pass when it listed them all ([`Entries::Full`]): held, so an
    /// address stays its entry's while compared.
    entries: Option<Vec<Arc<Entry>>>,
    /// The last pass's entries that did not come from routes (Ingresses').
    others: Vec<Arc<Entry>>,
    /// Whether the last pass assembled the routes' entries as the route compiler kept them
    /// (no policy rewrote them): then the next pass may give only what changed.
    routes_as_kept: bool,
    ports: BTreeMap<(ScopeKey, u32), Port>,
    /// The last pass's clusters, encoded.
    cluster_encodings: ClusterEncodings,
}

/// A pass's entries.
pub(super) enum Entries<'a> {
    /// Every entry; the first `routes` came from routes, the rest from Ingresses.
    Full { all: Vec<Arc<Entry>>, routes: usize },
    /// The routes' entries gone and new since the last pass, which assembled them as kept
    /// ([`Assembly::takes_changes`]), and every other entry. `all` lists every entry, for a
    /// port made afresh.
    Changes {
        removed: Vec<Arc<Entry>>,
        added: Vec<Arc<Entry>>,
        others: Vec<Arc<Entry>>,
        all: &'a dyn Fn() -> Vec<Arc<Entry>>,
    },
}

/// A port's virtual hosts.
#[derive(Debug, PartialEq)]
struct Listeners {
    protocol: snap::Protocol,
    /// The listener hostnames ("" for none): which listener owns a host.
    hosts: BTreeSet<String>,
    /// On a TLS port, the listener hostnames whose hosts end TLS here.
    terminating: BTreeSet<String>,
}

#[derive(Debug)]
struct Port {
    /// What the hosts were made for: another port's listeners make it afresh.
    listeners: Listeners,
    /// By name: every entry's host and every listener's hostname.
    hosts: BTreeMap<String, Host>,
    /// Over `made`: routes listed, clusters they send to (by how many), features they use.
    routes: usize,
    clusters: BTreeMap<String, usize>,
    features: [usize; 5],
}

#[derive(Debug, Default)]
struct Host {
    /// The entries whose host this is, whatever listener they came through.
    own: Vec<Arc<Entry>>,
    /// The virtual hosts made of it: none when no listener covers it, two for a wildcard
    /// with single-label (Ingress) entries and others.
    made: Vec<Made>,
}

#[derive(Debug)]
struct Made {
    terminate_tls: bool,
    routes: Vec<Arc<Entry>>,
    /// The virtual host as the snapshot lists it ([`encode::virtual_host`]).
    encoded: Box<[u8]>,
}

/// The sealed snapshots and how many routes they list in all.
#[derive(Default)]
pub(super) struct Assembled {
    pub snapshots: BTreeMap<ScopeKey, Sealed>,
    pub routes: usize,
}

/// What the assembler reads besides the entries.
pub(super) struct Inputs<'a> {
    pub slots: Vec<Slot>,
    pub clusters: Vec<Arc<snap::Cluster>>,
    pub certificates: &'a BTreeMap<String, (String, String)>,
    pub served: &'a BTreeMap<ObjectKey, gateway::ServedGateway>,
    pub backend_clients: &'a BTreeMap<ScopeKey, String>,
}

impl Assembly {
    /// Whether the next pass may give its routes' entries as changes ([`Entries::Changes`]).
    pub(super) fn takes_changes(&self) -> bool {
        self.routes_as_kept
    }

    /// Assembles a pass; `routes_as_kept` says whether its routes' entries are the route
    /// compiler's, not rewritten by a policy.
    pub(super) fn assemble(
        &mut self,
        entries: Entries<'_>,
        routes_as_kept: bool,
        inputs: Inputs<'_>,
    ) -> Assembled {
        let Inputs {
            slots,
            clusters,
            certificates,
            served,
            backend_clients,
        } = inputs;
        self.routes_as_kept = routes_as_kept;
        let mut changes = Changes::new();
        let mut listed: Option<Vec<Arc<Entry>>> = None;
        // Every entry of the pass, listed when a port is made afresh after a changes pass.
        let all: Option<&dyn Fn() -> Vec<Arc<Entry>>> = match entries {
            Entries::Full { all, routes } => {
                // A port's hosts can be compared with a full list only if the last pass gave
                // one: otherwise each is made afresh.
                let before = match self.entries.take() {
                    Some(before) => before,
                    None => {
                        self.ports.clear();
                        Vec::new()
                    }
                };
                diff(&before, &all, &mut changes);
                self.others = all.get(routes..).unwrap_or_default().to_vec();
                self.entries = Some(all);
                None
            }
            Entries::Changes {
                removed,
                added,
                others,
                all,
            } => {
                for (list, new) in [(removed, false), (added, true)] {
                    for e in list {
                        note(&mut changes, e, new);
                    }
                }
                diff(&self.others, &others, &mut changes);
                self.others = others;
                self.entries = None;
                Some(all)
            }
        };
        let mut scopes: BTreeSet<ScopeKey> = served.values().map(|g| g.scope.clone()).collect();
        scopes.insert(ScopeKey::SharedPool);

        // First every port's hosts, then the snapshots, which borrow them.
        let mut ports: BTreeMap<(ScopeKey, u32), Vec<&Slot>> = BTreeMap::new();
        for s in slots.iter().filter(|s| scopes.contains(&s.scope)) {
            ports.entry((s.scope.clone(), s.port)).or_default().push(s);
        }
        self.ports.retain(|key, _| ports.contains_key(key));
        for (key, port_slots) in &mut ports {
            // Slots on one port agree on protocol within a Gateway (conflicts were rejected);
            // across Gateways of the shared pool the first, in key order, decides.
            let protocol = port_slots[0].protocol;
            port_slots.retain(|s| s.protocol == protocol);
            let listeners = Listeners {
                protocol,
                hosts: port_slots
                    .iter()
                    .map(|s| s.hostname.clone().unwrap_or_default())
                    .collect(),
                terminating: port_slots
                    .iter()
                    .filter(|s| s.terminate_tls)
                    .map(|s| s.hostname.clone().unwrap_or_default())
                    .collect(),
            };
            let fresh = self.ports.get(key).is_none_or(|p| p.listeners != listeners);
            if fresh {
                let every = match (&self.entries, all) {
                    (Some(list), _) => list,
                    (None, Some(all)) => listed.get_or_insert_with(all),
                    (None, None) => &Vec::new(),
                };
                let own = every
                    .iter()
                    .filter(|e| (&e.scope, e.port) == (&key.0, key.1));
                let port = Port::new(listeners, own);
                self.ports.insert(key.clone(), port);
            } else if let (Some(port), Some((removed, added))) =
                (self.ports.get_mut(key), changes.get(key))
            {
                port.update(removed, added);
            }
        }

        // A later cluster of a name replaces an earlier one.
        let cluster_by_name: BTreeMap<&str, &Arc<snap::Cluster>> =
            clusters.iter().map(|c| (c.name.as_str(), c)).collect();
        let mut encoded_now = ClusterEncodings::default();
        let mut out = Assembled::default();
        for scope in scopes {
            let mut listeners = Vec::new();
            let mut used_clusters: BTreeSet<&str> = BTreeSet::new();
            let mut used_certs = BTreeSet::new();
            let mut features = [0; 5];
            for ((_, port), port_slots) in
                ports.range((scope.clone(), 0)..=(scope.clone(), u32::MAX))
            {
                let Some(kept) = self.ports.get(&(scope.clone(), *port)) else {
                    continue;
                };
                out.routes += kept.routes;
                used_clusters.extend(kept.clusters.keys().map(String::as_str));
                for (total, n) in features.iter_mut().zip(kept.features) {
                    *total += n;
                }
                listeners.push(listener(*port, kept, port_slots, &mut used_certs));
            }
            let requires = requirements(&listeners, features_of(features));
            // The Gateway's client certificate goes to every TLS backend of its scope: its
            // proxy serves no other Gateway's routes.
            let backend_client = backend_clients.get(&scope);
            let clusters: Vec<Arc<snap::Cluster>> = used_clusters
                .iter()
                .filter_map(|c| cluster_by_name.get(*c))
                .map(|c| {
                    let mut c = Arc::clone(c);
                    if let (Some(tls), Some(name)) = (&c.tls, backend_client)
                        && tls.client_certificate != *name
                        && let Some(tls) = Arc::make_mut(&mut c).tls.as_mut()
                    {
                        tls.client_certificate = name.clone();
                    }
                    c
                })
                .collect();
            // Each cluster encoded once while it stays the same `Arc`.
            for c in &clusters {
                let address = Arc::as_ptr(c).addr();
                let kept = self.cluster_encodings.remove(&address);
                encoded_now.entry(address).or_insert_with(|| {
                    kept.unwrap_or_else(|| (Arc::clone(c), c.encode_to_vec().into()))
                });
            }
            let encoded_clusters: Vec<&[u8]> = clusters
                .iter()
                .filter_map(|c| encoded_now.get(&Arc::as_ptr(c).addr()))
                .map(|(_, bytes)| &bytes[..])
                .collect();
            // The certificates clusters present: the dedicated Gateway's on all of its TLS
            // clusters, a shared Gateway's on its own (`backend_clients`).
            used_certs.extend(
                clusters
                    .iter()
                    .filter_map(|c| c.tls.as_ref())
                    .filter(|t| !t.client_certificate.is_empty())
                    .map(|t| t.client_certificate.clone()),
            );
            let sealed = encode::Parts {
                scope: snap::Scope {
                    kind: Some(match &scope {
                        ScopeKey::SharedPool => snap::scope::Kind::SharedPool(snap::SharedPool {}),
                        ScopeKey::Gateway(k) => snap::scope::Kind::Gateway(snap::ObjectRef {
                            namespace: k.namespace.clone(),
                            name: k.name.clone(),
                        }),
                    }),
                },
                listeners,
                clusters: encoded_clusters,
                certificates: used_certs
                    .iter()
                    .filter_map(|name| {
                        certificates
                            .get(name)
                            .map(|(chain, key)| snap::Certificate {
                                name: name.clone(),
                                cert_chain_pem: chain.clone(),
                                private_key_pem: key.clone(),
                            })
                    })
                    .collect(),
                requires,
            }
            .seal();
            out.snapshots.insert(scope, sealed);
        }
        // Encodings of clusters no snapshot lists any more are dropped with their `Arc`s.
        self.cluster_encodings = encoded_now;
        out
    }
}

/// Clusters' encodings by the address of the `Arc` they were encoded from (held beside).
type ClusterEncodings = HashMap<usize, (Arc<snap::Cluster>, Box<[u8]>), BuildByAddress>;
type BuildByAddress = std::hash::BuildHasherDefault<super::memo::AddressHasher>;

/// `now` against `before`, by identity, per (scope, port), into `out`: the entries gone and
/// those new (counted, so an entry listed twice is compared as twice).
fn diff(before: &[Arc<Entry>], now: &[Arc<Entry>], out: &mut Changes) {
    let address = |e: &Arc<Entry>| Arc::as_ptr(e).addr();
    let count = |list: &[Arc<Entry>]| {
        let mut n = ByAddress::with_capacity_and_hasher(list.len(), Default::default());
        for e in list {
            *n.entry(address(e)).or_default() += 1;
        }
        n
    };
    let (mut in_before, mut in_now) = (count(before), count(now));
    // Each entry of one list not matched by one of the other's: gone, or new.
    for (list, other, new) in [(before, &mut in_now, false), (now, &mut in_before, true)] {
        for e in list {
            match other.get_mut(&address(e)) {
                Some(n) if *n > 0 => *n -= 1,
                _ => note(out, Arc::clone(e), new),
            }
        }
    }
}

/// Files `e` under its (scope, port) as gone, or as new.
fn note(changes: &mut Changes, e: Arc<Entry>, new: bool) {
    let (gone, added) = changes.entry((e.scope.clone(), e.port)).or_default();
    if new { added } else { gone }.push(e);
}

/// Per (scope, port): entries gone and entries new.
type Changes = HashMap<(ScopeKey, u32), (Vec<Arc<Entry>>, Vec<Arc<Entry>>)>;

impl Port {
    /// The port's virtual hosts made of `own`, the entries on it.
    fn new<'e>(listeners: Listeners, own: impl Iterator<Item = &'e Arc<Entry>>) -> Self {
        let hosts = listeners
            .hosts
            .iter()
            .map(|h| (h.clone(), Host::default()))
            .collect();
        let mut port = Self {
            listeners,
            hosts,
            routes: 0,
            clusters: BTreeMap::new(),
            features: [0; 5],
        };
        for e in own.filter(|e| e.protocol == port.listeners.protocol) {
            port.hosts
                .entry(e.vhost.clone())
                .or_default()
                .own
                .push(Arc::clone(e));
        }
        let every: Vec<String> = port.hosts.keys().cloned().collect();
        port.remake(every);
        port
    }

    /// Takes `removed` out and `added` in, and makes again the virtual hosts they are in or
    /// cover.
    fn update(&mut self, removed: &[Arc<Entry>], added: &[Arc<Entry>]) {
        let protocol = self.listeners.protocol;
        let mut dirty: BTreeSet<String> = BTreeSet::new();
        for e in removed.iter().filter(|e| e.protocol == protocol) {
            if let Some(host) = self.hosts.get_mut(&e.vhost)
                && let Some(i) = host.own.iter().position(|o| Arc::ptr_eq(o, e))
            {
                host.own.remove(i);
                dirty.insert(e.vhost.clone());
            }
        }
        for e in added.iter().filter(|e| e.protocol == protocol) {
            self.hosts
                .entry(e.vhost.clone())
                .or_default()
                .own
                .push(Arc::clone(e));
            dirty.insert(e.vhost.clone());
        }
        // A host lives while an entry or a listener names it.
        for name in &dirty {
            if self.hosts.get(name).is_some_and(|h| h.own.is_empty())
                && !self.listeners.hosts.contains(name)
                && let Some(gone) = self.hosts.remove(name)
            {
                for m in &gone.made {
                    self.count(m, false);
                }
            }
        }
        let mut names: BTreeSet<&String> = BTreeSet::new();
        for d in &dirty {
            if d.is_empty() || d.starts_with("*.") {
                // What a wildcard or the catch-all covers changed: every host under it.
                names.extend(
                    self.hosts
                        .keys()
                        .filter(|n| covering_names(n).iter().any(|c| c == d)),
                );
            } else if let Some((name, _)) = self.hosts.get_key_value(d) {
                names.insert(name);
            }
        }
        let names = names.into_iter().cloned().collect();
        self.remake(names);
    }

    /// Makes the virtual hosts of `names` again, and counts them instead of what they were.
    fn remake(&mut self, names: Vec<String>) {
        for name in names {
            let made = self.make(&name);
            if let Some(host) = self.hosts.get_mut(&name) {
                // Kept until the host changes again: exactly sized.
                host.own.shrink_to_fit();
                let old = std::mem::replace(&mut host.made, made);
                for m in &old {
                    self.count(m, false);
                }
            }
            self.count_host(&name);
        }
    }

    /// Adds (or takes out) a made virtual host's routes, clusters and features.
    fn count(&mut self, m: &Made, add: bool) {
        count_into(
            &mut self.routes,
            &mut self.clusters,
            &mut self.features,
            m,
            add,
        );
    }

    fn count_host(&mut self, name: &str) {
        if let Some(host) = self.hosts.get(name) {
            for m in &host.made {
                count_into(
                    &mut self.routes,
                    &mut self.clusters,
                    &mut self.features,
                    m,
                    true,
                );
            }
        }
    }

    /// The virtual hosts of `vhost`: its entries and those of the names covering it, through
    /// the listener that owns it, in precedence order.
    fn make(&self, vhost: &str) -> Vec<Made> {
        // The most specific listener hostname covering this host owns it.
        let Some(owner) = self
            .listeners
            .hosts
            .iter()
            .filter(|h| {
                hostname::listener_covers(Some(h.as_str()).filter(|h| !h.is_empty()), vhost)
            })
            .min_by(|a, b| hostname::specificity(a, b))
        else {
            return Vec::new();
        };
        let through = |name: &str| {
            self.hosts.get(name).into_iter().flat_map(move |h| {
                h.own
                    .iter()
                    .filter(move |e| e.listener_hostname.as_deref().unwrap_or_default() == owner)
            })
        };
        let is_wildcard = vhost.starts_with("*.");
        let (mut single, mut multi) = (false, false);
        for e in through(vhost) {
            single |= e.single_label;
            multi |= !e.single_label;
        }
        // A wildcard with single-label (Ingress) entries of its own becomes two virtual hosts:
        // the multi-label one for deeper hosts, when it has entries of its own (without,
        // deeper hosts fall through to what covers them), then the single-label one for hosts
        // one label above the suffix.
        let variants: &[bool] = match (is_wildcard && single, multi) {
            (true, true) => &[false, true],
            (true, false) => &[true],
            (false, _) => &[false],
        };
        let terminate_tls = self.listeners.protocol == snap::Protocol::Tls
            && self.listeners.terminating.contains(owner);
        let covering = covering_names(vhost);
        variants
            .iter()
            .map(|&single_label| {
                let mut routes: Vec<Arc<Entry>> = Vec::new();
                for (i, name) in covering.iter().enumerate() {
                    // A single-label entry on "*.P" covers only hosts one label above P: an
                    // exact host's first covering wildcard, or a single-label virtual host's
                    // own name; never a multi-label one.
                    let one_label_above = if is_wildcard {
                        single_label && i == 0
                    } else {
                        i == 1
                    };
                    routes.extend(
                        through(name)
                            .filter(|e| !e.single_label || one_label_above)
                            .cloned(),
                    );
                }
                // Equal keys (an Ingress's canary routes) keep the order a full compile lists
                // them in, whichever pass added them here.
                routes.sort_by(|a, b| a.precedence(b).then_with(|| a.place().cmp(&b.place())));
                routes.shrink_to_fit();
                let encoded =
                    encode::virtual_host(vhost, &routes, single_label, terminate_tls).into();
                Made {
                    terminate_tls,
                    routes,
                    encoded,
                }
            })
            .collect()
    }
}

fn count_into(
    routes: &mut usize,
    clusters: &mut BTreeMap<String, usize>,
    features: &mut [usize; 5],
    m: &Made,
    add: bool,
) {
    let step = |n: &mut usize| {
        if add {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
        }
    };
    for e in &m.routes {
        step(routes);
        for c in &e.route.clusters {
            match clusters.get_mut(c) {
                Some(n) => {
                    step(n);
                    if *n == 0 {
                        clusters.remove(c);
                    }
                }
                None if add => {
                    clusters.insert(c.clone(), 1);
                }
                None => {}
            }
        }
        let f = e.route.features;
        for (n, used) in features.iter_mut().zip([
            f.basic_auth,
            f.rate_limit,
            f.external_auth,
            f.jwt,
            f.global_rate_limit,
        ]) {
            if used {
                step(n);
            }
        }
    }
}

fn features_of(counts: [usize; 5]) -> Features {
    Features {
        basic_auth: counts[0] > 0,
        rate_limit: counts[1] > 0,
        external_auth: counts[2] > 0,
        jwt: counts[3] > 0,
        global_rate_limit: counts[4] > 0,
    }
}

/// A port's listener in the snapshot: its virtual hosts as the port keeps them, the rest from
/// its slots.
fn listener<'a>(
    port: u32,
    kept: &'a Port,
    port_slots: &[&Slot],
    used_certs: &mut BTreeSet<String>,
) -> encode::Listener<'a> {
    let protocol = kept.listeners.protocol;
    let virtual_hosts = kept
        .hosts
        .values()
        .flat_map(|host| {
            host.made.iter().map(|m| encode::VirtualHost {
                encoded: &m.encoded,
                terminate_tls: m.terminate_tls,
            })
        })
        .collect();
    let terminates = matches!(protocol, snap::Protocol::Https | snap::Protocol::Tls);
    let mut sni: Vec<snap::SniCertificate> = Vec::new();
    if terminates {
        for s in port_slots {
            if let Some((name, cert)) = &s.certificate
                && !sni.iter().any(|c| &c.sni == name)
            {
                sni.push(snap::SniCertificate {
                    sni: name.clone(),
                    certificate: cert.clone(),
                });
                used_certs.insert(cert.clone());
            }
        }
        sni.sort_by(|a, b| a.sni.cmp(&b.sni));
    }
    // Gateway listeners only: Ingress hosts are not listeners, and browsers coalesce
    // connections across them as ingress-nginx lets them.
    let mut listener_hostnames: Vec<String> = if protocol == snap::Protocol::Https {
        port_slots
            .iter()
            .filter(|s| s.source != "Ingress")
            .map(|s| s.hostname.clone().unwrap_or_default())
            .collect()
    } else {
        Vec::new()
    };
    listener_hostnames.sort();
    listener_hostnames.dedup();
    let mut sources: Vec<String> = port_slots.iter().map(|s| s.source.clone()).collect();
    sources.sort();
    sources.dedup();
    // Only dedicated Gateways' ports verify clients, and all slots of such a port are that
    // Gateway's, with its one setting for the port.
    let client_validation = if terminates {
        port_slots.iter().find_map(|s| s.client_validation.clone())
    } else {
        None
    };
    encode::Listener {
        port,
        protocol,
        sources,
        virtual_hosts,
        certificates: sni,
        listener_hostnames,
        client_validation,
        // An internal port belongs to one Gateway's one listener port.
        public_port: port_slots.first().map_or(0, |s| s.public_port),
    }
}

/// The names whose entries can serve `host`: itself, every wildcard above it, and "".
/// "a.b.c" -> ["a.b.c", "*.b.c", "*.c", ""]; "*.b.c" -> ["*.b.c", "*.c", ""].
fn covering_names(host: &str) -> Vec<String> {
    let mut names = vec![host.to_owned()];
    if !host.is_empty() {
        let bare = host.strip_prefix("*.").unwrap_or(host);
        let mut rest = bare;
        while let Some((_, parent)) = rest.split_once('.') {
            names.push(format!("*.{parent}"));
            rest = parent;
        }
        names.push(String::new());
    }
    names.dedup();
    names
}

/// What a proxy must implement to serve these listeners safely: a proxy that does not know a
/// protecting field refuses the snapshot instead of serving without it.
fn requirements(listeners: &[encode::Listener<'_>], routes: Features) -> Vec<String> {
    let mut out = Vec::new();
    if routes.basic_auth {
        out.push(snap::feature::BASIC_AUTH.to_owned());
    }
    if routes.rate_limit {
        out.push(snap::feature::RATE_LIMIT.to_owned());
    }
    if routes.external_auth {
        out.push(snap::feature::EXTERNAL_AUTH.to_owned());
    }
    if routes.jwt {
        out.push(snap::feature::JWT.to_owned());
    }
    if routes.global_rate_limit {
        out.push(snap::feature::GLOBAL_RATE_LIMIT.to_owned());
    }
    if listeners.iter().any(|l| l.client_validation.is_some()) {
        out.push(snap::feature::FRONTEND_CLIENT_VALIDATION.to_owned());
    }
    if listeners
        .iter()
        .flat_map(|l| &l.virtual_hosts)
        .any(|v| v.terminate_tls)
    {
        out.push(snap::feature::TLS_TERMINATE.to_owned());
    }
    if listeners.iter().any(|l| l.public_port != 0) {
        out.push(snap::feature::PUBLIC_PORT.to_owned());
    }
    out.sort();
    out
}
