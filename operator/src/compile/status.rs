//! Status decisions: what the compiler says every object's status should be. Pure data with
//! no timestamps; the status writer adds lastTransitionTime and skips no-op patches.

use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Hash)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: &'static str,
    pub status: ConditionStatus,
    pub reason: &'static str,
    pub message: String,
    pub observed_generation: i64,
}

impl Condition {
    pub fn new(
        type_: &'static str,
        ok: bool,
        reason: &'static str,
        message: impl Into<String>,
        generation: i64,
    ) -> Self {
        Self {
            type_,
            status: if ok {
                ConditionStatus::True
            } else {
                ConditionStatus::False
            },
            reason,
            message: message.into(),
            observed_generation: generation,
        }
    }

    pub fn is_true(&self) -> bool {
        self.status == ConditionStatus::True
    }
}

/// Which proxies serve a Gateway: the unit a snapshot is compiled for. Beside ObjectKey, so
/// every compiler module can name a scope without importing the Gateway compiler.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ScopeKey {
    SharedPool,
    Gateway(ObjectKey),
}

/// Why an object, or part of it, cannot be accepted or resolved as written: the condition
/// reason and the message for the object's owner, which status carries as they are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct Problem {
    pub reason: &'static str,
    pub message: String,
}

impl Problem {
    pub fn new(reason: &'static str, message: String) -> Self {
        Self { reason, message }
    }

    /// The condition of `type_` this problem sets False.
    pub fn condition(&self, type_: &'static str, generation: i64) -> Condition {
        Condition::new(type_, false, self.reason, self.message.clone(), generation)
    }
}

/// A condition's outcome before it has a type and a generation: whether it holds, its reason
/// and the message for the object's owner. A Problem is a verdict that does not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub holds: bool,
    pub reason: &'static str,
    pub message: String,
}

impl Verdict {
    pub fn holds(reason: &'static str, message: String) -> Self {
        Self {
            holds: true,
            reason,
            message,
        }
    }

    /// The condition of `type_` this verdict sets.
    pub fn condition(&self, type_: &'static str, generation: i64) -> Condition {
        Condition::new(
            type_,
            self.holds,
            self.reason,
            self.message.clone(),
            generation,
        )
    }
}

impl From<Problem> for Verdict {
    fn from(p: Problem) -> Self {
        Self {
            holds: false,
            reason: p.reason,
            message: p.message,
        }
    }
}

/// Namespace and name of an object. Serializes as "namespace/name" so it can key a map.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl Serialize for ObjectKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteGroupKind {
    pub group: String,
    pub kind: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerStatus {
    pub name: String,
    pub supported_kinds: Vec<RouteGroupKind>,
    pub attached_routes: i32,
    pub conditions: Vec<Condition>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayStatus {
    pub conditions: Vec<Condition>,
    pub listeners: Vec<ListenerStatus>,
    /// Whether a dedicated proxy serves this Gateway (it or its class has a parametersRef).
    pub dedicated: bool,
    /// The IP addresses `spec.addresses` asks for, validated and normalised; the status
    /// writer holds Programmed back until the proxy's Service has them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub requested_addresses: Vec<std::net::IpAddr>,
    /// `status.attachedListenerSets`: the ListenerSets accepted onto this Gateway.
    #[serde(skip_serializing_if = "is_zero")]
    pub attached_listener_sets: i32,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

/// A ListenerSet's status: its own Accepted/Programmed and one entry per listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerSetStatus {
    pub conditions: Vec<Condition>,
    pub listeners: Vec<ListenerStatus>,
    /// The parent Gateway, and which proxies serve it (for Programmed).
    pub gateway: ObjectKey,
    #[serde(skip)]
    pub scope: ScopeKey,
}

/// A parentRef as written in `status.parents[].parentRef`, defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Hash)]
#[serde(rename_all = "camelCase")]
pub struct ParentRef {
    pub group: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Hash)]
#[serde(rename_all = "camelCase")]
pub struct RouteParentStatus {
    pub parent_ref: ParentRef,
    pub controller_name: String,
    pub conditions: Vec<Condition>,
}

/// The object a policy's `status.ancestors` entry is about. Unlike a route's parentRef it may
/// be cluster-scoped (an IngressClass) or of the core group (a Service).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AncestorRef {
    pub group: String,
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyAncestorStatus {
    pub ancestor_ref: AncestorRef,
    pub controller_name: String,
    pub conditions: Vec<Condition>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IngressStatus {
    /// Why the Ingress is not served, when it is ours but cannot be.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    /// Annotations refused or ignored, one Warning Event each. The Ingress is still served
    /// (fail-closed ones make its paths answer 403).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<AnnotationWarning>,
}

/// An annotation the compiler did not apply as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AnnotationWarning {
    /// The full key, e.g. "ingress.coxswain-labs.dev/read-timeout".
    pub annotation: String,
    /// Why, and what happens instead; written for the Ingress's owner.
    pub reason: String,
    /// True when the annotation guards access and the Ingress denies requests because of it.
    pub fail_closed: bool,
}

/// A route's `status.parents` entries this controller owns, shared between a pass's decisions
/// and the incremental compiler's memo of the route.
pub type Parents = std::sync::Arc<[RouteParentStatus]>;

/// A route kind's status decisions: a persistent map, so a pass hands the status writer its
/// own copy in constant time while the compiler changes its copy for the next pass
/// ([`super::totals`]).
pub type StatusMap = imbl::OrdMap<std::sync::Arc<ObjectKey>, Parents>;

/// Every status the controller should write, keyed by object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusDecisions {
    pub gateway_classes: BTreeMap<String, Vec<Condition>>,
    pub gateways: BTreeMap<ObjectKey, GatewayStatus>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub listener_sets: BTreeMap<ObjectKey, ListenerSetStatus>,
    /// Only the parents this controller is responsible for.
    pub http_routes: StatusMap,
    #[serde(skip_serializing_if = "StatusMap::is_empty")]
    pub grpc_routes: StatusMap,
    #[serde(skip_serializing_if = "StatusMap::is_empty")]
    pub tls_routes: StatusMap,
    #[serde(skip_serializing_if = "StatusMap::is_empty")]
    pub tcp_routes: StatusMap,
    #[serde(skip_serializing_if = "StatusMap::is_empty")]
    pub udp_routes: StatusMap,
    /// BackendTLSPolicy -> one entry per Gateway whose routes use a Service it targets
    /// (`status.ancestors`; the entry's parent_ref is the ancestorRef).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub backend_tls_policies: BTreeMap<ObjectKey, Vec<RouteParentStatus>>,
    /// CoxswainBackendPolicy -> `status.ancestors`: each Gateway and IngressClass whose routes
    /// send to a Service it targets, or the first targeted Service while there is none.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub backend_policies: BTreeMap<ObjectKey, Vec<PolicyAncestorStatus>>,
    /// CoxswainAccessPolicy -> its ancestors: the Gateways whose rules it applies to, or its
    /// first target while there is none.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub access_policies: BTreeMap<ObjectKey, Vec<PolicyAncestorStatus>>,
    pub ingresses: BTreeMap<ObjectKey, IngressStatus>,
    /// IngressClass name -> why its `spec.parameters` is not used (one Warning Event on the
    /// IngressClass); its Ingresses are served without class defaults.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub ingress_classes: BTreeMap<String, String>,
}

/// Condition types and reasons, spelled as the Gateway API spells them.
pub mod reason {
    pub const ACCEPTED: &str = "Accepted";
    pub const RESOLVED_REFS: &str = "ResolvedRefs";
    pub const PROGRAMMED: &str = "Programmed";
    pub const CONFLICTED: &str = "Conflicted";
    pub const PENDING: &str = "Pending";
    pub const INVALID: &str = "Invalid";
    pub const INVALID_PARAMETERS: &str = "InvalidParameters";
    pub const SUPPORTED_VERSION: &str = "SupportedVersion";
    pub const UNSUPPORTED_VERSION: &str = "UnsupportedVersion";
    pub const LISTENERS_NOT_VALID: &str = "ListenersNotValid";
    pub const UNSUPPORTED_ADDRESS: &str = "UnsupportedAddress";
    pub const ADDRESS_NOT_ASSIGNED: &str = "AddressNotAssigned";
    pub const ADDRESS_NOT_USABLE: &str = "AddressNotUsable";
    pub const NOT_ALLOWED: &str = "NotAllowed";
    pub const PARENT_NOT_ACCEPTED: &str = "ParentNotAccepted";
    pub const NO_CONFLICTS: &str = "NoConflicts";
    pub const HOSTNAME_CONFLICT: &str = "HostnameConflict";
    pub const PROTOCOL_CONFLICT: &str = "ProtocolConflict";
    pub const UNSUPPORTED_PROTOCOL: &str = "UnsupportedProtocol";
    pub const INVALID_CERTIFICATE_REF: &str = "InvalidCertificateRef";
    pub const INVALID_ROUTE_KINDS: &str = "InvalidRouteKinds";
    pub const REF_NOT_PERMITTED: &str = "RefNotPermitted";
    pub const NOT_ALLOWED_BY_LISTENERS: &str = "NotAllowedByListeners";
    pub const NO_MATCHING_LISTENER_HOSTNAME: &str = "NoMatchingListenerHostname";
    pub const NO_MATCHING_PARENT: &str = "NoMatchingParent";
    pub const UNSUPPORTED_VALUE: &str = "UnsupportedValue";
    pub const INVALID_KIND: &str = "InvalidKind";
    pub const BACKEND_NOT_FOUND: &str = "BackendNotFound";
    pub const NO_VALID_CA_CERTIFICATE: &str = "NoValidCACertificate";
    pub const INVALID_CA_CERTIFICATE_REF: &str = "InvalidCACertificateRef";
    pub const TARGET_NOT_FOUND: &str = "TargetNotFound";
    pub const INVALID_CA_CERTIFICATE_KIND: &str = "InvalidCACertificateKind";
    pub const INVALID_CLIENT_CERTIFICATE_REF: &str = "InvalidClientCertificateRef";
    pub const INSECURE_FRONTEND_VALIDATION_MODE: &str = "InsecureFrontendValidationMode";
    pub const CONFIGURATION_CHANGED: &str = "ConfigurationChanged";
}
