//! The shared route form: HTTPRoutes, GRPCRoutes and TLSRoutes as the one shape the route
//! compiler reads. A GRPCRoute or TLSRoute becomes the HTTPRoute it is equivalent to
//! ([`super::grpcroute`] and [`super::tlsroute`] convert them, [`RouteForm::equivalent`] puts
//! the parts together), and its kind stays beside it: attachment, ReferenceGrants, the
//! backends' protocol and status still tell the kinds apart.
//!
//! A leaf below every route module, so none of them imports another that imports it back.

use super::status::{ObjectKey, Problem};
use gateway_api::apis::experimental::httproutes::{HttpRoute, HttpRouteSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::borrow::Cow;

/// The route kinds compiled here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RouteKind {
    Http,
    Grpc,
    Tls,
}

impl RouteKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Http => "HTTPRoute",
            Self::Grpc => "GRPCRoute",
            Self::Tls => "TLSRoute",
        }
    }

    pub fn from_name(kind: &str) -> Option<Self> {
        match kind {
            "HTTPRoute" => Some(Self::Http),
            "GRPCRoute" => Some(Self::Grpc),
            "TLSRoute" => Some(Self::Tls),
            _ => None,
        }
    }
}

/// One route of any kind, in the shared form.
#[derive(Debug, Clone)]
pub struct RouteForm<'a> {
    pub kind: RouteKind,
    /// HTTPRoutes are read where they are stored; routes of other kinds are converted.
    pub route: Cow<'a, HttpRoute>,
    /// Why the route cannot be accepted, found while converting it (a GRPCRoute method match
    /// with no HTTPRoute equivalent). The route keeps what did convert, so it still gets
    /// status.
    pub problem: Option<Problem>,
}

impl<'a> RouteForm<'a> {
    pub fn http(route: &'a HttpRoute) -> Self {
        Self {
            kind: RouteKind::Http,
            route: Cow::Borrowed(route),
            problem: None,
        }
    }

    /// A route of `kind` read as the HTTPRoute with its metadata and `spec`, the parentRefs,
    /// hostnames and rules already converted.
    pub fn equivalent(
        kind: RouteKind,
        metadata: &ObjectMeta,
        spec: HttpRouteSpec,
        problem: Option<Problem>,
    ) -> Self {
        Self {
            kind,
            route: Cow::Owned(HttpRoute {
                metadata: metadata.clone(),
                spec,
                status: None,
            }),
            problem,
        }
    }

    /// namespace/name, the namespace defaulted as the API server would.
    pub fn key(&self) -> ObjectKey {
        let m = &self.route.metadata;
        ObjectKey::new(
            m.namespace.as_deref().unwrap_or("default"),
            m.name.as_deref().unwrap_or_default(),
        )
    }
}
