//! Schema fragments that derive macros cannot express on their own.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::{Schema, SchemaGenerator, json_schema};

/// Standard `metav1.Condition` list, merged by `type` so server-side apply and `kubectl` treat
/// each condition as its own entry.
pub fn conditions(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = generator.subschema_for::<Vec<Condition>>();
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["type"]),
    );
    schema
}

/// A partial PodTemplateSpec, kept free-form: it is strategic-merged onto the rendered proxy
/// Deployment, and pruning would drop fields the API server knows but this schema does not.
pub fn free_form_pod_template(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}
