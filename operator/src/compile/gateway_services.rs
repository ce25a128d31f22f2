//! Per-Gateway addresses on the shared pool (docs/shared-pool-addresses.md): each Gateway the
//! shared proxies serve gets a Service of its own in the controller's namespace, which maps
//! each of its listener ports to an **internal port** the shared proxies listen on for that
//! Gateway alone. A connection's Gateway is then known from the port it arrives on, so two
//! shared Gateways on port 80 never share a routing table, and each has its own address.
//!
//! The allocation is kept in the Services themselves (their `targetPort`s): a pair that still
//! has its Gateway and port keeps its internal port across compiles, restarts and leader
//! changes; a new pair takes the lowest free port of the range; a port stays taken while any
//! Service still holds it (a deleted Gateway's Service is deleted first).

use super::gateway::ServedGateway;
use super::status::ObjectKey;
use super::store::Store;
use coxswain_api::names::{self, labels};
use coxswain_api::snapshot as snap;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// Annotation on a Gateway's Service naming the Gateway (`namespace/name`): Gateway names can
/// be longer than a label value may be.
pub const GATEWAY_ANNOTATION: &str = "gateway.coxswain-labs.dev/gateway";

/// The internal ports the shared proxies may listen on for Gateways (`--shared-gateway-ports`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    pub const DEFAULT: Self = Self {
        first: 20000,
        last: 29999,
    };

    fn contains(&self, port: u32) -> bool {
        (u32::from(self.first)..=u32::from(self.last)).contains(&port)
    }
}

impl std::fmt::Display for PortRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortRangeError {
    #[error("{0:?} is not a port range FIRST-LAST (e.g. 20000-29999) or \"off\"")]
    Shape(String),
    #[error("port range {0:?}: the first port must be at least 1024 and not after the last")]
    Bounds(String),
}

impl std::str::FromStr for PortRange {
    type Err = PortRangeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (first, last) = s
            .split_once('-')
            .and_then(|(a, b)| Some((a.trim().parse::<u16>().ok()?, b.trim().parse::<u16>().ok()?)))
            .ok_or_else(|| PortRangeError::Shape(s.to_owned()))?;
        // Below 1024 a proxy would need a capability to bind, and the Ingress ports live there.
        if first < 1024 || first > last {
            return Err(PortRangeError::Bounds(s.to_owned()));
        }
        Ok(Self { first, last })
    }
}

/// How a Service port carries its traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Transport {
    Tcp,
    Udp,
}

impl Transport {
    fn of(protocol: snap::Protocol) -> Self {
        if protocol == snap::Protocol::Udp {
            Self::Udp
        } else {
            Self::Tcp
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
        }
    }
}

/// One port of a Gateway's Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    /// The listener port clients use.
    pub port: u32,
    pub transport: Transport,
    /// The port the shared proxies listen on for it.
    pub internal: u32,
}

/// The Service a shared Gateway is reached through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayService {
    /// Its name, in the controller's namespace.
    pub name: String,
    pub ports: Vec<ServicePort>,
    /// `spec.addresses`, validated: asked of the Service's load balancer.
    pub addresses: Vec<IpAddr>,
    /// `spec.infrastructure` labels and annotations (GEP-1867).
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

impl GatewayService {
    /// The internal port of a listener port, if it has one.
    pub fn internal(&self, port: u32, protocol: snap::Protocol) -> Option<u32> {
        self.internal_for(port, Transport::of(protocol))
    }

    /// The internal port of a listener port of a Gateway API protocol name ("UDP", "HTTP"…).
    pub fn internal_of(&self, port: u32, protocol: &str) -> Option<u32> {
        let transport = if protocol.eq_ignore_ascii_case("UDP") {
            Transport::Udp
        } else {
            Transport::Tcp
        };
        self.internal_for(port, transport)
    }

    fn internal_for(&self, port: u32, transport: Transport) -> Option<u32> {
        self.ports
            .iter()
            .find(|p| p.port == port && p.transport == transport)
            .map(|p| p.internal)
    }
}

/// What the allocation decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allocation {
    pub services: BTreeMap<ObjectKey, GatewayService>,
    /// Gateways with a listener port that got no internal port (the range is full), and why.
    pub unassigned: BTreeMap<ObjectKey, String>,
}

/// The name of a shared Gateway's Service: `{name}-{namespace}` cut to a DNS label, with a hash
/// of both so that `a-b/c` and `a/b-c` differ.
pub fn service_name(gateway: &ObjectKey) -> String {
    names::shared_gateway_service_name(&gateway.namespace, &gateway.name)
}

/// Allocates internal ports for the shared Gateways in `served`, keeping what the existing
/// Services in `namespace` hold.
pub fn allocate(
    store: &Store,
    namespace: &str,
    range: PortRange,
    reserved: &[u32],
    served: &BTreeMap<ObjectKey, ServedGateway>,
    requested: impl Fn(&ObjectKey) -> Vec<IpAddr>,
) -> Allocation {
    // (Gateway, port, transport) -> internal port, as the Services hold them; and every
    // internal port any of our Services holds, whether its Gateway still exists or not.
    let mut kept: BTreeMap<(ObjectKey, u32, Transport), u32> = BTreeMap::new();
    // The Ingress ports are the shared proxies' own, even inside the range.
    let mut taken: BTreeSet<u32> = reserved.iter().copied().collect();
    for svc in &store.services {
        let meta = &svc.metadata;
        if meta.namespace.as_deref() != Some(namespace)
            || meta.labels.as_ref().and_then(|l| l.get(labels::COMPONENT))
                != Some(&labels::COMPONENT_GATEWAY_SERVICE.to_owned())
        {
            continue;
        }
        let gateway = meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(GATEWAY_ANNOTATION))
            .and_then(|g| g.split_once('/'))
            .map(|(ns, name)| ObjectKey::new(ns, name));
        for p in svc.spec.iter().flat_map(|s| s.ports.iter().flatten()) {
            let internal = match &p.target_port {
                Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n)) => {
                    u32::try_from(*n).ok()
                }
                _ => None,
            };
            let (Some(internal), Ok(port)) = (internal, u32::try_from(p.port)) else {
                continue;
            };
            taken.insert(internal);
            let transport = match p.protocol.as_deref() {
                Some("UDP") => Transport::Udp,
                _ => Transport::Tcp,
            };
            if let Some(gw) = &gateway
                && range.contains(internal)
            {
                kept.insert((gw.clone(), port, transport), internal);
            }
        }
    }

    let mut out = Allocation::default();
    let mut wanted: Vec<(ObjectKey, u32, Transport)> = Vec::new();
    for gw in served
        .values()
        .filter(|g| g.scope == super::ScopeKey::SharedPool)
    {
        let mut ports: Vec<(u32, Transport)> = gw
            .listeners
            .iter()
            .map(|l| (l.port, Transport::of(l.protocol)))
            .collect();
        ports.sort_unstable();
        ports.dedup();
        wanted.extend(ports.into_iter().map(|(p, t)| (gw.key.clone(), p, t)));
    }
    // Pairs that keep their port first, so a new pair never takes one of theirs. Two Services
    // can claim one port (one was applied before the other's watch event arrived): the first
    // pair in key order keeps it and the other is moved, or both would stay unserved.
    let mut assigned: BTreeMap<(ObjectKey, u32, Transport), u32> = BTreeMap::new();
    let mut claimed: BTreeSet<u32> = BTreeSet::new();
    for pair in &wanted {
        if let Some(internal) = kept.get(pair)
            && claimed.insert(*internal)
        {
            assigned.insert(pair.clone(), *internal);
        }
    }
    let mut next = u32::from(range.first);
    for pair in &wanted {
        if assigned.contains_key(pair) {
            continue;
        }
        while taken.contains(&next) && next <= u32::from(range.last) {
            next += 1;
        }
        if next > u32::from(range.last) {
            out.unassigned.entry(pair.0.clone()).or_insert_with(|| {
                format!(
                    "no internal port is free for listener port {} on the shared pool: the \
                     range {range} (--shared-gateway-ports) is used up; widen it, or give this \
                     Gateway a dedicated proxy (CoxswainGatewayParameters)",
                    pair.1
                )
            });
            continue;
        }
        taken.insert(next);
        assigned.insert(pair.clone(), next);
    }

    for gw in served
        .values()
        .filter(|g| g.scope == super::ScopeKey::SharedPool)
    {
        let ports: Vec<ServicePort> = assigned
            .range((gw.key.clone(), 0, Transport::Tcp)..)
            .take_while(|((k, _, _), _)| *k == gw.key)
            .map(|((_, port, transport), internal)| ServicePort {
                port: *port,
                transport: *transport,
                internal: *internal,
            })
            .collect();
        if ports.is_empty() {
            continue;
        }
        let gateway = store.gateways.iter().find(|g| {
            g.metadata.namespace.as_deref() == Some(gw.key.namespace.as_str())
                && g.metadata.name.as_deref() == Some(gw.key.name.as_str())
        });
        let infra = gateway.and_then(|g| g.spec.infrastructure.as_ref());
        out.services.insert(
            gw.key.clone(),
            GatewayService {
                name: service_name(&gw.key),
                ports,
                addresses: requested(&gw.key),
                labels: infra.and_then(|i| i.labels.clone()).unwrap_or_default(),
                annotations: infra
                    .and_then(|i| i.annotations.clone())
                    .unwrap_or_default(),
            },
        );
    }
    out
}
