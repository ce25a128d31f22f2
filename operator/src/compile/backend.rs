//! backendRefs to Services: the typed view every backendRef shape reads as, and its resolution
//! to a cluster.

use super::memo::Read;
use super::refs::{self, GATEWAY_GROUP, Index};
use super::route::RouteKind;
use super::status::{ObjectKey, Problem, reason};
use super::store::Store;
use coxswain_api::snapshot as snap;
use gateway_api::apis::experimental::httproutes::{
    HttpRouteRulesBackendRefs, HttpRouteRulesFiltersExternalAuthBackendRef,
    HttpRouteRulesFiltersRequestMirrorBackendRef,
};
use std::cell::RefCell;

/// A backendRef as resolution reads it, whichever generated type it came from: a rule's
/// backendRef or a request mirror's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendRef<'a> {
    pub group: Option<&'a str>,
    pub kind: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub name: &'a str,
    pub port: Option<i32>,
}

impl<'a> From<&'a HttpRouteRulesBackendRefs> for BackendRef<'a> {
    fn from(b: &'a HttpRouteRulesBackendRefs) -> Self {
        Self {
            group: b.group.as_deref(),
            kind: b.kind.as_deref(),
            namespace: b.namespace.as_deref(),
            name: &b.name,
            port: b.port,
        }
    }
}

impl<'a> From<&'a HttpRouteRulesFiltersRequestMirrorBackendRef> for BackendRef<'a> {
    fn from(b: &'a HttpRouteRulesFiltersRequestMirrorBackendRef) -> Self {
        Self {
            group: b.group.as_deref(),
            kind: b.kind.as_deref(),
            namespace: b.namespace.as_deref(),
            name: &b.name,
            port: b.port,
        }
    }
}

impl<'a> From<&'a HttpRouteRulesFiltersExternalAuthBackendRef> for BackendRef<'a> {
    fn from(b: &'a HttpRouteRulesFiltersExternalAuthBackendRef) -> Self {
        Self {
            group: b.group.as_deref(),
            kind: b.kind.as_deref(),
            namespace: b.namespace.as_deref(),
            name: &b.name,
            port: b.port,
        }
    }
}

/// The route whose references are resolved: what ReferenceGrants and the backends' protocol
/// depend on, and the objects they resolve against.
#[derive(Clone, Copy)]
pub struct Referrer<'a> {
    pub store: &'a Store,
    pub index: &'a Index<'a>,
    pub kind: RouteKind,
    pub route: &'a ObjectKey,
    /// Where resolution records what it read, to tell at the next pass whether the route's
    /// output still holds.
    pub reads: &'a RefCell<Vec<Read>>,
}

impl Referrer<'_> {
    /// Resolves a backendRef (or mirror backendRef) to a cluster name, adding the cluster.
    pub fn resolve(
        &self,
        backend: BackendRef<'_>,
        clusters: &mut Vec<snap::Cluster>,
    ) -> Result<String, Problem> {
        let BackendRef {
            group,
            kind,
            namespace,
            name,
            port,
        } = backend;
        let Referrer {
            store,
            index,
            kind: route_kind,
            route,
            reads,
        } = *self;
        let group = group.unwrap_or("");
        let kind = kind.unwrap_or("Service");
        if !group.is_empty() || kind != "Service" {
            return Err(Problem::new(
                reason::INVALID_KIND,
                format!("backendRef {group}/{kind} {name} is not a Service"),
            ));
        }
        let ns = namespace.unwrap_or(&route.namespace);
        let permitted = refs::permitted(
            store,
            GATEWAY_GROUP,
            route_kind.name(),
            &route.namespace,
            "",
            "Service",
            ns,
            name,
        );
        if ns != route.namespace {
            reads.borrow_mut().push(Read::Grant {
                to_namespace: ns.to_owned(),
                to_name: name.to_owned(),
                permitted,
            });
        }
        if !permitted {
            return Err(Problem::new(
                reason::REF_NOT_PERMITTED,
                format!(
                    "no ReferenceGrant in {ns} allows {}s in {} to use Service {name}",
                    route_kind.name(),
                    route.namespace
                ),
            ));
        }
        let Some(port) = port else {
            return Err(Problem::new(
                reason::UNSUPPORTED_VALUE,
                format!("backendRef to Service {ns}/{name} needs a port"),
            ));
        };
        reads
            .borrow_mut()
            .push(Read::service(index, ns, name, port));
        if index.service(ns, name).is_none() {
            return Err(Problem::new(
                reason::BACKEND_NOT_FOUND,
                format!("Service {ns}/{name} not found"),
            ));
        }
        let Some(mut cluster) = index.cluster(ns, name, port) else {
            return Err(Problem::new(
                reason::BACKEND_NOT_FOUND,
                format!("Service {ns}/{name} has no port {port}"),
            ));
        };
        // gRPC is HTTP/2: a GRPCRoute's backends get cleartext HTTP/2 whatever the Service port's
        // appProtocol says, under a name of their own so an HTTPRoute to the same port keeps its
        // protocol.
        if route_kind == RouteKind::Grpc && cluster.app_protocol != snap::AppProtocol::H2c as i32 {
            cluster.app_protocol = snap::AppProtocol::H2c as i32;
            cluster.name.push_str(super::clusters::H2C_CLUSTER_SUFFIX);
        }
        let name = cluster.name.clone();
        clusters.push(cluster);
        Ok(name)
    }
}
