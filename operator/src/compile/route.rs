//! The shared route form: HTTPRoutes, GRPCRoutes and the relayed kinds (TLS, TCP, UDP) as the one shape the
//! route compiler reads. A route of another kind becomes the HTTPRoute it is equivalent to
//! ([`super::grpcroute`] and [`super::l4route`] convert them, [`RouteForm::equivalent`] puts
//! the parts together), and its kind stays beside it: attachment, ReferenceGrants, the
//! backends' protocol and status still tell the kinds apart.
//!
//! A leaf below every route module, so none of them imports another that imports it back.

use super::status::{ObjectKey, Problem};
use gateway_api::apis::experimental::httproutes::{HttpRoute, HttpRouteSpec};
use gateway_api::apis::experimental::tcproutes::TcpRoute;
use gateway_api::apis::experimental::udproutes::UdpRoute;
use gateway_api::apis::standard::grpcroutes::GrpcRoute;
use gateway_api::apis::standard::tlsroutes::TlsRoute;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::any::Any;
use std::borrow::Cow;
use std::sync::{Arc, Weak};

/// Which stored object, in which version, a route form was read from: what tells at the next
/// pass whether the route changed.
#[derive(Clone)]
pub enum Stored {
    /// An object the API server keeps: its uid and generation. The generation changes with
    /// the spec (the Gateway API kinds have a status subresource), not with status writes:
    /// the controller writes a route's status after compiling it, which must not make the
    /// next pass compile the route again. The compiler reads no label or annotation of a
    /// route (the reflector drops them).
    Version { uid: Box<str>, generation: i64 },
    /// An object without both (read from files): by identity. The store shares the
    /// reflector's `Arc`s and a changed object is a new `Arc`. Held weakly: the allocation
    /// stays reserved, so no other object takes its address, and its contents are freed with
    /// the last strong reference.
    Object(Weak<dyn Any + Send + Sync>),
}

/// [`Stored`] as a pass reads it, borrowing the uid from the object: every route is looked up
/// in the memo every pass, and only a route compiled again keeps a copy ([`StoredRef::keep`]).
#[derive(Clone)]
pub enum StoredRef<'a> {
    Version { uid: &'a str, generation: i64 },
    Object(Weak<dyn Any + Send + Sync>),
}

impl<'a> StoredRef<'a> {
    pub fn new<T: Any + Send + Sync>(metadata: &'a ObjectMeta, object: &Arc<T>) -> Self {
        if let (Some(uid), Some(generation)) = (&metadata.uid, metadata.generation) {
            return Self::Version { uid, generation };
        }
        let object: Arc<dyn Any + Send + Sync> = object.clone();
        Self::Object(Arc::downgrade(&object))
    }

    /// Whether this is the object, in the version, a route was kept from.
    pub fn same(&self, kept: &Stored) -> bool {
        match (self, kept) {
            (
                Self::Version { uid, generation },
                Stored::Version {
                    uid: kept_uid,
                    generation: kept_generation,
                },
            ) => *uid == &**kept_uid && generation == kept_generation,
            (Self::Object(a), Stored::Object(b)) => std::ptr::addr_eq(a.as_ptr(), b.as_ptr()),
            _ => false,
        }
    }

    pub fn keep(&self) -> Stored {
        match self {
            Self::Version { uid, generation } => Stored::Version {
                uid: (*uid).into(),
                generation: *generation,
            },
            Self::Object(o) => Stored::Object(o.clone()),
        }
    }
}

impl std::fmt::Debug for StoredRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.keep().fmt(f)
    }
}

impl std::fmt::Debug for Stored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Version { uid, generation } => write!(f, "Stored({uid}, {generation})"),
            Self::Object(o) => write!(f, "Stored({:p})", o.as_ptr()),
        }
    }
}

/// A route as the store holds it, read into the shared form only when a pass must compile it
/// (the root converts it: [`super::route_forms`]).
#[derive(Clone, Copy)]
pub enum StoredRoute<'a> {
    Http(&'a Arc<HttpRoute>),
    Grpc(&'a Arc<GrpcRoute>),
    Tls(&'a Arc<TlsRoute>),
    Tcp(&'a Arc<TcpRoute>),
    Udp(&'a Arc<UdpRoute>),
}

impl StoredRoute<'_> {
    pub fn kind(self) -> RouteKind {
        match self {
            Self::Http(_) => RouteKind::Http,
            Self::Grpc(_) => RouteKind::Grpc,
            Self::Tls(_) => RouteKind::Tls,
            Self::Tcp(_) => RouteKind::Tcp,
            Self::Udp(_) => RouteKind::Udp,
        }
    }

    /// The object's address: the same object at the next pass is the same route, unchanged.
    pub fn address(self) -> usize {
        match self {
            Self::Http(r) => Arc::as_ptr(r).addr(),
            Self::Grpc(r) => Arc::as_ptr(r).addr(),
            Self::Tls(r) => Arc::as_ptr(r).addr(),
            Self::Tcp(r) => Arc::as_ptr(r).addr(),
            Self::Udp(r) => Arc::as_ptr(r).addr(),
        }
    }

    /// A weak reference to the object, which keeps its address from being reused while held.
    pub fn pin(self) -> Weak<dyn Any + Send + Sync> {
        fn weak<T: Any + Send + Sync>(r: &Arc<T>) -> Weak<dyn Any + Send + Sync> {
            let any: Arc<dyn Any + Send + Sync> = r.clone();
            Arc::downgrade(&any)
        }
        match self {
            Self::Http(r) => weak(r),
            Self::Grpc(r) => weak(r),
            Self::Tls(r) => weak(r),
            Self::Tcp(r) => weak(r),
            Self::Udp(r) => weak(r),
        }
    }
}

/// The route kinds compiled here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RouteKind {
    Http,
    Grpc,
    Tls,
    Tcp,
    Udp,
}

impl RouteKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Http => "HTTPRoute",
            Self::Grpc => "GRPCRoute",
            Self::Tls => "TLSRoute",
            Self::Tcp => "TCPRoute",
            Self::Udp => "UDPRoute",
        }
    }

    pub fn from_name(kind: &str) -> Option<Self> {
        match kind {
            "HTTPRoute" => Some(Self::Http),
            "GRPCRoute" => Some(Self::Grpc),
            "TLSRoute" => Some(Self::Tls),
            "TCPRoute" => Some(Self::Tcp),
            "UDPRoute" => Some(Self::Udp),
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
    /// The object this form was read from, when it came from a store (see [`Stored`]).
    pub stored: Option<StoredRef<'a>>,
}

impl<'a> RouteForm<'a> {
    pub fn http(route: &'a HttpRoute) -> Self {
        Self {
            kind: RouteKind::Http,
            route: Cow::Borrowed(route),
            problem: None,
            stored: None,
        }
    }

    /// This form, read from `object` (the metadata is the object's: a converted form copies
    /// it).
    pub fn read_from<T: Any + Send + Sync + kube::Resource>(self, object: &'a Arc<T>) -> Self {
        let stored = StoredRef::new(object.meta(), object);
        Self {
            stored: Some(stored),
            ..self
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
            stored: None,
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

/// One generated header modifier type as another, the target types named without their module
/// (gateway_api's experimental httproutes). The Gateway API types repeat the shape
/// `{add, set: [{name, value}], remove}` under a type name per route kind, filter and place
/// (rule or backendRef); converting between them is copying it field for field.
macro_rules! header_modifier_as {
    ($m:expr => $modifier:ident { add: $add:ident, set: $set:ident $(,)? }) => {{
        use gateway_api::apis::experimental::httproutes as generated;
        let m = $m;
        generated::$modifier {
            add: m.add.as_ref().map(|list| {
                list.iter()
                    .map(|h| generated::$add {
                        name: h.name.clone(),
                        value: h.value.clone(),
                    })
                    .collect()
            }),
            remove: m.remove.clone(),
            set: m.set.as_ref().map(|list| {
                list.iter()
                    .map(|h| generated::$set {
                        name: h.name.clone(),
                        value: h.value.clone(),
                    })
                    .collect()
            }),
        }
    }};
}
pub(super) use header_modifier_as;

/// One generated RequestMirror type as another, as [`header_modifier_as`] does header
/// modifiers.
macro_rules! request_mirror_as {
    (
        $m:expr => $mirror:ident { backend_ref: $backend_ref:ident, fraction: $fraction:ident $(,)? }
    ) => {{
        use gateway_api::apis::experimental::httproutes as generated;
        let m = $m;
        generated::$mirror {
            backend_ref: generated::$backend_ref {
                group: m.backend_ref.group.clone(),
                kind: m.backend_ref.kind.clone(),
                name: m.backend_ref.name.clone(),
                namespace: m.backend_ref.namespace.clone(),
                port: m.backend_ref.port,
            },
            fraction: m.fraction.as_ref().map(|f| generated::$fraction {
                numerator: f.numerator,
                denominator: f.denominator,
            }),
            percent: m.percent,
        }
    }};
}
pub(super) use request_mirror_as;
