//! `CoxswainGatewayParameters`: how Coxswain provisions a Gateway's dedicated proxy.

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Parameters for the dedicated proxy of a Gateway.
///
/// Referenced from a GatewayClass's `spec.parametersRef` or a Gateway's
/// `spec.infrastructure.parametersRef`; a reference is what opts a Gateway into a dedicated proxy.
/// Every field is optional. When both layers set a field the Gateway's value wins, field by
/// field; `podTemplate` is strategic-merged across both.
// clippy reads repeated `type_ = "string"` across printcolumns as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "gateway.coxswain-labs.dev",
    version = "v1alpha1",
    kind = "CoxswainGatewayParameters",
    plural = "coxswaingatewayparameters",
    singular = "coxswaingatewayparameters",
    shortname = "cxgwp",
    category = "coxswain",
    namespaced,
    status = "CoxswainGatewayParametersStatus",
    doc = "Provisioning parameters for Coxswain's dedicated Gateway proxies.",
    printcolumn(
        name = "Service Type",
        type_ = "string",
        json_path = ".spec.serviceType"
    ),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(
        name = "Autoscaling",
        type_ = "boolean",
        json_path = ".spec.autoscaling.enabled"
    ),
    printcolumn(
        name = "Accepted",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Accepted\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct CoxswainGatewayParametersSpec {
    /// Number of proxy replicas. Ignored while autoscaling is enabled. Defaults to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replicas: Option<i32>,

    /// Container image of the proxy. Defaults to the controller's own image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub image: Option<String>,

    /// Compute resources of the proxy container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Type of the Service that exposes the proxy. Defaults to LoadBalancer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_type: Option<ServiceType>,

    /// A partial PodTemplateSpec merged onto the rendered proxy Deployment with `kubectl apply`
    /// strategic-merge semantics (containers, env and volumes by name; tolerations by key and
    /// operator). Security-relevant fields the controller sets are restored after the merge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::schema::free_form_pod_template")]
    pub pod_template: Option<serde_json::Value>,

    /// Horizontal autoscaling of the proxy Deployment on CPU utilisation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<Autoscaling>,

    /// How the proxy learns the client's address when it sits behind load balancers or other
    /// proxies. Without it, the connection's peer is the client and any X-Forwarded-* fields
    /// a client sends are replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_address: Option<ClientAddress>,

    /// OpenTelemetry tracing of the proxy's requests: a span per request exported over
    /// OTLP/gRPC, and a W3C `traceparent` sent to backends. Off without an endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracing: Option<Tracing>,
}

/// Where the proxy exports its spans, and how many requests it records.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Tracing {
    /// The collector's OTLP/gRPC endpoint, `http://host:port` (e.g.
    /// `http://otel-collector.observability:4317`). Without it the proxy records no spans
    /// and passes a request's `traceparent` on as it came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub endpoint: Option<String>,

    /// Share of new traces recorded, from 0 to 1. A request whose `traceparent` continues a
    /// trace follows that trace's sampled flag instead. Defaults to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1))]
    pub sampling_ratio: Option<f64>,
}

/// Who the proxy believes about the client's address.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientAddress {
    /// Address blocks ("10.0.0.0/8", "2001:db8::/32") or single addresses of the load
    /// balancers and proxies in front of this one. Their X-Forwarded-For is appended to and
    /// their X-Forwarded-Proto, -Host and -Port are passed on; the client is the right-most
    /// X-Forwarded-For address outside these blocks (as ingress-nginx's
    /// `proxy-real-ip-cidr` with `use-forwarded-headers`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 64)))]
    pub trusted_proxies: Vec<String>,

    /// Every connection starts with a PROXY protocol v1 or v2 header naming the client (an
    /// L4 load balancer in front sends it); connections without a valid one are closed.
    /// Defaults to false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_protocol: Option<bool>,
}

/// How the proxy is exposed.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum ServiceType {
    #[default]
    LoadBalancer,
    NodePort,
    #[serde(rename = "ClusterIP")]
    ClusterIp,
}

impl ServiceType {
    /// The Service `spec.type` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LoadBalancer => "LoadBalancer",
            Self::NodePort => "NodePort",
            Self::ClusterIp => "ClusterIP",
        }
    }
}

/// Horizontal Pod Autoscaler settings for the proxy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas"
).message("minReplicas must not exceed maxReplicas"))]
pub struct Autoscaling {
    /// Creates a HorizontalPodAutoscaler and leaves the Deployment's replica count to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,

    /// Lower bound of replicas. Defaults to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub min_replicas: Option<i32>,

    /// Upper bound of replicas. Required when autoscaling is enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_replicas: Option<i32>,

    /// Average CPU utilisation, in percent of the requested CPU, that the autoscaler targets.
    /// Defaults to 80.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(rename = "targetCPUUtilizationPercentage")]
    #[schemars(range(min = 1, max = 100))]
    pub target_cpu_utilization_percentage: Option<i32>,
}

/// Observed state, written by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CoxswainGatewayParametersStatus {
    /// Standard conditions. `Accepted` says whether the parameters are valid and in use.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::schema::conditions")]
    pub conditions: Vec<Condition>,

    /// The `metadata.generation` these conditions were computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Coxswain GatewayClasses whose `spec.parametersRef` names these parameters (the class
    /// layer of every Gateway of those classes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub gateway_classes: Vec<String>,

    /// Gateways whose dedicated proxy these parameters shape, through the Gateway's
    /// `spec.infrastructure.parametersRef` or its class's `spec.parametersRef` (the first 64,
    /// by namespace and name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub gateways: Vec<NamespacedName>,
}

/// An object in some namespace.
#[derive(
    Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
pub struct NamespacedName {
    pub namespace: String,
    pub name: String,
}
