//! Incremental compile: a [`Compiler`] the controller keeps across passes compiles again only
//! the routes whose input changed, and gives the same output as [`super::compile`], byte for
//! byte (tested on random change sequences, `tests/incremental.rs`).
//!
//! A route's part of a pass depends on the route, the Gateways it can attach to, the listeners
//! a route of the other kind took from it, and what resolving its backendRefs read:
//! ReferenceGrants, the Service, its EndpointSlices and the BackendTLSPolicy of the port. The
//! first three are compared directly; the reads are recorded while the route compiles
//! ([`Read`]) and looked up again. Objects are compared by identity: the store shares the
//! reflector's `Arc`s, and an object that changed is a new `Arc`; the memo holds them weakly.
//!
//! What a route keeps is small: its entries hold their routes encoded ([`super::encode`]), so
//! the memo costs about what the published snapshot does, not a second decoded copy of it.
//! Everything else (Gateways, Ingresses, policies, assembling the snapshots) is compiled in
//! full each pass; a change to the Gateways or the configuration drops every kept route.

use super::gateway::ServedGateway;
use super::httproute::RouteMemo;
use super::refs::{self, GATEWAY_GROUP, Index};
use super::route::RouteKind;
use super::status::ObjectKey;
use super::store::Store;
use super::{Compiled, Config};
use coxswain_api::snapshot as snap;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

/// Compiles like [`super::compile`], keeping each route's part for the next pass.
#[derive(Debug, Default)]
pub struct Compiler {
    routes: RouteMemo,
    /// The Gateways (as routes see them) and configuration the kept routes compiled against.
    against: Option<(BTreeMap<ObjectKey, ServedGateway>, Config)>,
}

/// Routes compiled and reused, over a compiler's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reuse {
    pub compiled: u64,
    pub reused: u64,
}

impl Compiler {
    pub fn compile(&mut self, store: &Store, config: &Config) -> Compiled {
        let before = self.reuse();
        let compiled = super::compile_with(store, config, Some(self));
        let after = self.reuse();
        tracing::debug!(
            routes_compiled = after.compiled - before.compiled,
            routes_reused = after.reused - before.reused,
            "incremental compile"
        );
        compiled
    }

    pub fn reuse(&self) -> Reuse {
        Reuse {
            compiled: self.routes.compiled,
            reused: self.routes.reused,
        }
    }

    /// Routes whose last part is kept.
    pub fn kept_routes(&self) -> usize {
        self.routes.len()
    }

    /// The kept routes, valid for `served` and `config`: dropped when those changed.
    pub(super) fn routes_for(
        &mut self,
        served: &BTreeMap<ObjectKey, ServedGateway>,
        config: &Config,
    ) -> &mut RouteMemo {
        let same = self
            .against
            .as_ref()
            .is_some_and(|(s, c)| s == served && c == config);
        if !same {
            self.routes.clear();
            self.against = Some((served.clone(), config.clone()));
        }
        &mut self.routes
    }
}

/// Something a route's compilation read besides the route and the Gateways.
#[derive(Debug, Clone)]
pub enum Read {
    /// Whether a ReferenceGrant let the route use a Service in another namespace.
    Grant {
        to_namespace: String,
        to_name: String,
        permitted: bool,
    },
    /// A Service port a backendRef resolved to: the objects its cluster is built from.
    Service {
        namespace: String,
        name: String,
        port: i32,
        /// Weak, as [`super::route::Stored`]: identity without keeping replaced objects.
        service: Option<Weak<Service>>,
        slices: Vec<Weak<EndpointSlice>>,
        tls: Option<snap::BackendTls>,
    },
}

/// Reads are equal when they read the same objects (by identity) and got the same answers: the
/// memo keeps one copy of a route's reads for every route that read the same.
impl PartialEq for Read {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (
                Self::Grant {
                    to_namespace: a_ns,
                    to_name: a_name,
                    permitted: a,
                },
                Self::Grant {
                    to_namespace: b_ns,
                    to_name: b_name,
                    permitted: b,
                },
            ) => a_ns == b_ns && a_name == b_name && a == b,
            (
                Self::Service {
                    namespace: a_ns,
                    name: a_name,
                    port: a_port,
                    service: a_service,
                    slices: a_slices,
                    tls: a_tls,
                },
                Self::Service {
                    namespace: b_ns,
                    name: b_name,
                    port: b_port,
                    service: b_service,
                    slices: b_slices,
                    tls: b_tls,
                },
            ) => {
                a_ns == b_ns
                    && a_name == b_name
                    && a_port == b_port
                    && a_service.as_ref().map(Weak::as_ptr) == b_service.as_ref().map(Weak::as_ptr)
                    && a_slices.len() == b_slices.len()
                    && a_slices
                        .iter()
                        .zip(b_slices)
                        .all(|(a, b)| std::ptr::eq(a.as_ptr(), b.as_ptr()))
                    && a_tls == b_tls
            }
            _ => false,
        }
    }
}

impl Eq for Read {}

impl std::hash::Hash for Read {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        match self {
            Self::Grant {
                to_namespace,
                to_name,
                permitted,
            } => (0u8, to_namespace, to_name, permitted).hash(state),
            Self::Service {
                namespace,
                name,
                port,
                service,
                ..
            } => (
                1u8,
                namespace,
                name,
                port,
                service.as_ref().map(Weak::as_ptr),
            )
                .hash(state),
        }
    }
}

/// One shared copy of equal values: what many kept routes hold alike (the listener they
/// attached to, the Service they read) is kept once.
#[derive(Debug)]
pub struct Pool<T>(std::collections::HashSet<Arc<T>>);

impl<T> Default for Pool<T> {
    fn default() -> Self {
        Self(std::collections::HashSet::new())
    }
}

impl<T: std::hash::Hash + Eq> Pool<T> {
    pub fn share(&mut self, value: T) -> Arc<T> {
        if let Some(kept) = self.0.get(&value) {
            return Arc::clone(kept);
        }
        let value = Arc::new(value);
        self.0.insert(Arc::clone(&value));
        value
    }

    /// Drops the values only the pool holds.
    pub fn tidy(&mut self) {
        self.0.retain(|v| Arc::strong_count(v) > 1);
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }
}

impl Read {
    pub fn service(index: &Index<'_>, namespace: &str, name: &str, port: i32) -> Self {
        let (service, slices) = index.service_objects(namespace, name);
        Self::Service {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            port,
            service: service.map(Arc::downgrade),
            slices: slices.iter().map(|s| Arc::downgrade(s)).collect(),
            tls: index.port_tls(namespace, name, port).cloned(),
        }
    }

    /// Whether reading again now, for a route of `kind` in `route_namespace`, gives the same.
    pub fn unchanged(
        &self,
        store: &Store,
        index: &Index<'_>,
        kind: RouteKind,
        route_namespace: &str,
    ) -> bool {
        match self {
            Self::Grant {
                to_namespace,
                to_name,
                permitted,
            } => {
                refs::permitted(
                    store,
                    GATEWAY_GROUP,
                    kind.name(),
                    route_namespace,
                    "",
                    "Service",
                    to_namespace,
                    to_name,
                ) == *permitted
            }
            Self::Service {
                namespace,
                name,
                port,
                service,
                slices,
                tls,
            } => {
                let (now, now_slices) = index.service_objects(namespace, name);
                let same_service = match (service, now) {
                    (Some(a), Some(b)) => std::ptr::eq(a.as_ptr(), Arc::as_ptr(b)),
                    (None, None) => true,
                    _ => false,
                };
                same_service
                    && slices.len() == now_slices.len()
                    && slices
                        .iter()
                        .zip(now_slices)
                        .all(|(a, b)| std::ptr::eq(a.as_ptr(), Arc::as_ptr(b)))
                    && index.port_tls(namespace, name, *port) == tls.as_ref()
            }
        }
    }
}
