//! `CoxswainIngressClassParameters`: class-level defaults for Ingress routes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Class-level defaults for every Ingress of an IngressClass.
///
/// Referenced from an IngressClass's `spec.parameters` (scope `Namespace`).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "ingress.coxswain-labs.dev",
    version = "v1alpha1",
    kind = "CoxswainIngressClassParameters",
    plural = "coxswainingressclassparameters",
    singular = "coxswainingressclassparameters",
    shortname = "cxicp",
    category = "coxswain",
    namespaced,
    status = "CoxswainIngressClassParametersStatus",
    doc = "Class-level defaults for Ingresses handled by Coxswain.",
    printcolumn(name = "Access Log", type_ = "boolean", json_path = ".spec.accessLog"),
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
pub struct CoxswainIngressClassParametersSpec {
    /// Annotation defaults for every Ingress of the class. An Ingress's own annotation with the
    /// same key wins over the default.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub default_annotations: BTreeMap<String, String>,

    /// `false` switches access logging off for the class. It never switches logging on when the
    /// proxy itself has it off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_log: Option<bool>,
}

/// Observed state, written by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CoxswainIngressClassParametersStatus {
    /// Standard conditions. `Accepted` says whether every default annotation is applied; its
    /// message names the ones that are not, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::schema::conditions")]
    pub conditions: Vec<Condition>,

    /// The `metadata.generation` these conditions were computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Coxswain IngressClasses whose `spec.parameters` names these parameters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub ingress_classes: Vec<String>,
}
