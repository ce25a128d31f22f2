//! Custom resources and their CRD manifests.
//!
//! `config/crd/bases/` holds the rendered manifests; [`render`] is their only source and a test
//! fails when the committed copy drifts.

pub mod accesspolicy;
pub mod backendpolicy;
pub mod gateway;
pub mod ingress;
mod schema;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// Errors while rendering CRD manifests.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("serializing CRD {name} to YAML: {source}")]
    Yaml {
        name: String,
        #[source]
        source: serde_yaml::Error,
    },
}

/// Every Coxswain CRD, in the order of their file names (`<group>_<plural>.yaml`), so the
/// stream `coxswain crd` prints is the files of `config/crd/bases` concatenated.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![
        accesspolicy::CoxswainAccessPolicy::crd(),
        backendpolicy::CoxswainBackendPolicy::crd(),
        gateway::CoxswainGatewayParameters::crd(),
        ingress::CoxswainIngressClassParameters::crd(),
    ]
}

/// One rendered CRD manifest and the file name it has under `config/crd/bases/`
/// (`<group>_<plural>.yaml`, the kubebuilder convention).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedCrd {
    pub file_name: String,
    pub yaml: String,
}

/// Renders every CRD as YAML.
pub fn render() -> Result<Vec<RenderedCrd>, RenderError> {
    all()
        .into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let yaml = serde_yaml::to_string(&crd).map_err(|source| RenderError::Yaml {
                name: name.clone(),
                source,
            })?;
            let file_name = format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural);
            Ok(RenderedCrd { file_name, yaml })
        })
        .collect()
}

/// Every CRD as one multi-document YAML stream, as `coxswain crd` prints it.
pub fn render_stream() -> Result<String, RenderError> {
    Ok(render()?
        .into_iter()
        .map(|crd| format!("---\n{}", crd.yaml))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::path::PathBuf;

    fn bases_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/crd/bases")
    }

    #[test]
    fn committed_manifests_match_the_types() {
        let rendered = render().unwrap();
        for crd in &rendered {
            let path = bases_dir().join(&crd.file_name);
            let committed = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}; run `make manifests`", path.display()));
            assert!(
                committed == crd.yaml,
                "{} differs from what the Rust types generate; run `make manifests` and commit",
                path.display()
            );
        }
        let mut on_disk: Vec<String> = std::fs::read_dir(bases_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".yaml"))
            .collect();
        on_disk.sort();
        let mut expected: Vec<String> = rendered.into_iter().map(|c| c.file_name).collect();
        expected.sort();
        assert_eq!(on_disk, expected, "stale CRD files in config/crd/bases");
    }

    /// Walks a schema and returns the paths of nodes that break the structural rules we rely
    /// on: every node has a type, unless it is int-or-string or preserves unknown fields.
    fn untyped_nodes(schema: &Value, path: &str, out: &mut Vec<String>) {
        let Some(obj) = schema.as_object() else {
            out.push(format!("{path}: not an object"));
            return;
        };
        let int_or_string = obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
        if obj.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
            out.push(format!("{path}: preserve-unknown-fields"));
        }
        if !obj.contains_key("type") && !int_or_string {
            out.push(format!("{path}: no type"));
        }
        for key in ["anyOf", "oneOf", "allOf", "not"] {
            if let Some(Value::Array(alts)) = obj.get(key) {
                for alt in alts {
                    // Structural schemas forbid types and descriptions inside logical junctors.
                    if alt.get("type").is_some() || alt.get("description").is_some() {
                        out.push(format!("{path}.{key}: typed alternative"));
                    }
                }
            }
        }
        if let Some(Value::Object(props)) = obj.get("properties") {
            for (name, prop) in props {
                untyped_nodes(prop, &format!("{path}.{name}"), out);
            }
        }
        if let Some(items) = obj.get("items") {
            untyped_nodes(items, &format!("{path}[]"), out);
        }
        if let Some(extra @ Value::Object(_)) = obj.get("additionalProperties") {
            untyped_nodes(extra, &format!("{path}{{}}"), out);
        }
    }

    #[test]
    fn schemas_are_structural_with_free_form_only_at_pod_template() {
        for crd in all() {
            let name = crd.metadata.name.clone().unwrap();
            for version in &crd.spec.versions {
                let schema = version
                    .schema
                    .as_ref()
                    .and_then(|s| s.open_api_v3_schema.as_ref())
                    .unwrap();
                let mut findings = Vec::new();
                untyped_nodes(&serde_json::to_value(schema).unwrap(), "", &mut findings);
                let allowed: &[&str] = if name.starts_with("coxswaingatewayparameters") {
                    &[".spec.podTemplate: preserve-unknown-fields"]
                } else {
                    &[]
                };
                let unexpected: Vec<_> = findings
                    .iter()
                    .filter(|f| !allowed.contains(&f.as_str()))
                    .collect();
                assert!(unexpected.is_empty(), "{name}: {unexpected:#?}");
                for want in allowed {
                    assert!(findings.iter().any(|f| f == want), "{name}: missing {want}");
                }
            }
        }
    }

    #[test]
    fn stream_is_every_crd_in_order() {
        let stream = render_stream().unwrap();
        let docs: Vec<&str> = stream.split("---\n").filter(|d| !d.is_empty()).collect();
        assert_eq!(docs.len(), all().len());
        assert!(docs[0].contains("name: coxswainaccesspolicies.gateway.coxswain-labs.dev"));
        assert!(docs[1].contains("name: coxswainbackendpolicies.gateway.coxswain-labs.dev"));
        assert!(docs[2].contains("name: coxswaingatewayparameters.gateway.coxswain-labs.dev"));
        assert!(docs[3].contains("name: coxswainingressclassparameters.ingress.coxswain-labs.dev"));
    }
}
