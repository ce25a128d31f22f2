//! `CoxswainBackendPolicy`: how the proxy spreads requests over a Service's endpoints.
//!
//! A policy attached by `targetRefs` (GEP-713) to Services in its own namespace, for behaviour
//! the Gateway API has no field for. It applies wherever the Service is a backend: HTTPRoutes,
//! GRPCRoutes and Ingresses alike.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Backend behaviour for the Services (or Service ports) it targets.
///
/// Of two policies on the same Service port the older holds it (creationTimestamp, then
/// namespace/name); the other is `Accepted=False` with reason `Conflicted`. A policy naming a
/// port (`sectionName`) outranks one naming the whole Service for that port.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "gateway.coxswain-labs.dev",
    version = "v1alpha1",
    kind = "CoxswainBackendPolicy",
    plural = "coxswainbackendpolicies",
    singular = "coxswainbackendpolicy",
    shortname = "cxbp",
    category = "coxswain",
    namespaced,
    status = "CoxswainBackendPolicyStatus",
    doc = "Load-balancing choices for Services, attached by targetRefs.",
    printcolumn(
        name = "Load Balancer",
        type_ = "string",
        json_path = ".spec.loadBalancer.type"
    ),
    printcolumn(
        name = "Accepted",
        type_ = "string",
        json_path = ".status.ancestors[0].conditions[?(@.type==\"Accepted\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct CoxswainBackendPolicySpec {
    /// The Services this policy applies to, in the policy's own namespace.
    #[schemars(length(min = 1, max = 16))]
    pub target_refs: Vec<BackendPolicyTargetRef>,

    /// How an endpoint is chosen for each request. Without it, round robin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancer>,
}

/// A Service in the policy's namespace, or one named port of it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.group == '' && self.kind == 'Service'")
    .message("only Services can be targeted: group \"\" and kind Service"))]
pub struct BackendPolicyTargetRef {
    /// API group of the target: "" (core).
    #[serde(default)]
    #[schemars(length(max = 253))]
    pub group: String,

    /// Kind of the target: Service.
    #[schemars(length(min = 1, max = 63))]
    pub kind: String,

    /// Name of the Service.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,

    /// The name of one port of the Service; without it, every port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub section_name: Option<String>,
}

/// The load-balancing algorithm and, for a consistent hash, its key.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "self.type == 'ConsistentHash' ? has(self.consistentHash) : !has(self.consistentHash)"
).message("consistentHash is required with type ConsistentHash and allowed only with it"))]
pub struct LoadBalancer {
    /// RoundRobin: each endpoint in turn. LeastRequest: the less busy of two endpoints drawn
    /// at random. ConsistentHash: a hash ring keyed by `consistentHash`, so requests with the
    /// same key keep their endpoint while the endpoints change.
    #[serde(rename = "type")]
    pub type_: LoadBalancerType,

    /// The key of a ConsistentHash: exactly one of header, cookie or sourceIP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistent_hash: Option<ConsistentHash>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum LoadBalancerType {
    #[default]
    RoundRobin,
    LeastRequest,
    ConsistentHash,
}

impl LoadBalancerType {
    /// The value as written in `spec.loadBalancer.type`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RoundRobin => "RoundRobin",
            Self::LeastRequest => "LeastRequest",
            Self::ConsistentHash => "ConsistentHash",
        }
    }
}

/// What a consistent hash is keyed by. A request without the key is balanced round robin.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "[has(self.header), has(self.cookie), has(self.sourceIP)].filter(x, x).size() == 1"
).message("consistentHash needs exactly one of header, cookie or sourceIP"))]
pub struct ConsistentHash {
    /// The value of this request header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<HashName>,

    /// The value of this cookie.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<HashName>,

    /// The client's address (behind trusted proxies, the client they name). Written `{}`.
    #[serde(default, rename = "sourceIP", skip_serializing_if = "Option::is_none")]
    pub source_ip: Option<SourceIp>,
}

/// A header or cookie name.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct HashName {
    /// An HTTP token: letters, digits and !#$%&'*+-.^_`|~.
    #[schemars(
        length(min = 1, max = 256),
        regex(pattern = r"^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$")
    )]
    pub name: String,
}

/// Marks the client address as the hash key; it has no fields.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct SourceIp {}

/// Observed state, written by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CoxswainBackendPolicyStatus {
    /// One entry per object the policy takes effect under (GEP-713 PolicyAncestorStatus): each
    /// Gateway whose routes send to a targeted Service, each IngressClass whose Ingresses do;
    /// while none does, the first targeted Service itself, so problems are still reported.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub ancestors: Vec<PolicyAncestorStatus>,
}

/// The policy's conditions under one ancestor.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyAncestorStatus {
    pub ancestor_ref: AncestorRef,

    /// The controller that wrote this entry.
    #[schemars(length(min = 1, max = 253))]
    pub controller_name: String,

    /// `Accepted`: whether the policy is in effect; when not, the reason says why (Invalid,
    /// Conflicted, TargetNotFound). Each condition carries the observedGeneration it was
    /// computed from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::schema::conditions")]
    pub conditions: Vec<Condition>,
}

/// The object an ancestor entry is about (the Gateway API ParentReference shape).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AncestorRef {
    /// gateway.networking.k8s.io for a Gateway, networking.k8s.io for an IngressClass, "" for
    /// a Service.
    #[schemars(length(max = 253))]
    pub group: String,

    #[schemars(length(min = 1, max = 63))]
    pub kind: String,

    /// Absent for cluster-scoped ancestors (IngressClass).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,

    #[schemars(length(min = 1, max = 253))]
    pub name: String,

    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub section_name: Option<String>,
}
