//! Assembling the ClusterServiceVersion from its base, the objects of `config/default`, the
//! samples and the Rust CRD types.

use super::BundleError;
use super::config::ConfigObject;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet};

/// What the CSV is assembled from.
pub struct Inputs<'a> {
    pub base: &'a ConfigObject,
    pub package: &'a str,
    pub version: &'a str,
    pub icon_svg: &'a [u8],
    pub crds: &'a [CustomResourceDefinition],
    pub samples: &'a [ConfigObject],
    /// The install strategy's Deployments, in config order.
    pub deployments: &'a [ConfigObject],
    pub permissions: &'a [Permission],
    pub cluster_permissions: &'a [Permission],
}

/// One `permissions` / `clusterPermissions` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Permission {
    pub service_account: String,
    pub rules: Vec<Value>,
}

impl Permission {
    fn to_json(&self) -> Value {
        json!({"serviceAccountName": self.service_account, "rules": self.rules})
    }
}

/// The finished CSV.
pub fn assemble(inputs: &Inputs<'_>) -> Result<Value, BundleError> {
    let mut csv = inputs.base.value.clone();
    let source = &inputs.base.source;
    let invalid = |reason: String| BundleError::Invalid {
        path: source.clone(),
        reason,
    };
    let images = related_images(inputs.deployments);
    let container_image = controller_image(inputs.deployments)
        .ok_or_else(|| invalid("no Deployment in config/ has a container image".into()))?;
    let examples = alm_examples(inputs.samples)?;

    let meta = csv["metadata"]
        .as_object_mut()
        .ok_or_else(|| invalid("metadata must be a mapping".into()))?;
    meta.insert(
        "name".into(),
        format!("{}.v{}", inputs.package, inputs.version).into(),
    );
    meta.remove("namespace");
    let annotations = meta
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or_else(|| invalid("metadata.annotations must be a mapping".into()))?;
    annotations.insert("alm-examples".into(), examples.into());
    annotations.insert("containerImage".into(), container_image.into());

    let owned = owned_crds(inputs)?;
    let spec = csv["spec"]
        .as_object_mut()
        .ok_or_else(|| invalid("spec must be a mapping".into()))?;
    spec.insert("version".into(), inputs.version.into());
    spec.insert(
        "icon".into(),
        json!([{"base64data": base64(inputs.icon_svg), "mediatype": "image/svg+xml"}]),
    );
    spec.insert(
        "install".into(),
        json!({
            "strategy": "deployment",
            "spec": {
                "deployments": inputs.deployments.iter().map(install_deployment).collect::<Vec<_>>(),
                "permissions": inputs.permissions.iter().map(Permission::to_json).collect::<Vec<_>>(),
                "clusterPermissions": inputs.cluster_permissions.iter().map(Permission::to_json).collect::<Vec<_>>(),
            }
        }),
    );
    spec.insert(
        "relatedImages".into(),
        Value::Array(
            images
                .iter()
                .map(|(name, image)| json!({"name": name, "image": image}))
                .collect(),
        ),
    );
    let crds = spec
        .entry("customresourcedefinitions")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or_else(|| invalid("spec.customresourcedefinitions must be a mapping".into()))?;
    crds.insert("owned".into(), Value::Array(owned));
    Ok(csv)
}

/// An install-strategy entry: the Deployment's name, labels and spec.
fn install_deployment(deployment: &ConfigObject) -> Value {
    let mut entry = json!({
        "name": deployment.name(),
        "spec": deployment.value["spec"],
    });
    if let Some(labels) = deployment.value["metadata"].get("labels") {
        entry["label"] = labels.clone();
    }
    entry
}

/// Every image the Deployments run or hand on (`*_IMAGE` environment variables), named by
/// the last segment of their repository.
pub fn related_images(deployments: &[ConfigObject]) -> BTreeMap<String, String> {
    let mut images = BTreeSet::new();
    for d in deployments {
        for container in containers(d) {
            if let Some(image) = container["image"].as_str() {
                images.insert(image.to_owned());
            }
            for env in container["env"].as_array().into_iter().flatten() {
                let name = env["name"].as_str().unwrap_or_default();
                if name.ends_with("_IMAGE")
                    && let Some(value) = env["value"].as_str()
                {
                    images.insert(value.to_owned());
                }
            }
        }
    }
    let mut named = BTreeMap::new();
    for image in images {
        let base = image_name(&image).to_owned();
        let mut name = base.clone();
        let mut n = 2;
        while named.contains_key(&name) {
            name = format!("{base}-{n}");
            n += 1;
        }
        named.insert(name, image);
    }
    named
}

/// `ghcr.io/org/coxswain:v1` -> `coxswain`.
pub fn image_name(image: &str) -> &str {
    let without_digest = image.split('@').next().unwrap_or(image);
    let last = without_digest.rsplit('/').next().unwrap_or(without_digest);
    last.split(':').next().unwrap_or(last)
}

/// Tag of an image reference, if it has one.
pub fn image_tag(image: &str) -> Option<&str> {
    let without_digest = image.split('@').next().unwrap_or(image);
    let last = without_digest.rsplit('/').next().unwrap_or(without_digest);
    last.split_once(':').map(|(_, tag)| tag)
}

/// The image reference with its tag replaced by (or set to) `tag`; `None` for a reference
/// pinned by digest, whose content a tag cannot change.
pub fn with_tag(image: &str, tag: &str) -> Option<String> {
    if image.contains('@') {
        return None;
    }
    let name_start = image.rfind('/').map_or(0, |i| i + 1);
    let name_end = image[name_start..]
        .find(':')
        .map_or(image.len(), |i| name_start + i);
    Some(format!("{}:{tag}", &image[..name_end]))
}

pub fn containers(deployment: &ConfigObject) -> impl Iterator<Item = &Value> {
    deployment.value["spec"]["template"]["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
}

/// The controller's image: the `containerImage` annotation OperatorHub shows.
fn controller_image(deployments: &[ConfigObject]) -> Option<String> {
    use coxswain_api::names::labels;
    let is_controller = |d: &&ConfigObject| {
        d.value["metadata"]["labels"][labels::COMPONENT].as_str()
            == Some(labels::COMPONENT_CONTROLLER)
    };
    deployments
        .iter()
        .find(is_controller)
        .or(deployments.first())
        .and_then(|d| containers(d).next())
        .and_then(|c| c["image"].as_str())
        .map(str::to_owned)
}

/// The samples as the `alm-examples` JSON array. Their namespaces are dropped: the console
/// creates an example in the namespace the user is looking at.
fn alm_examples(samples: &[ConfigObject]) -> Result<String, BundleError> {
    let examples: Vec<Value> = samples
        .iter()
        .map(|s| {
            let mut v = s.value.clone();
            if let Some(meta) = v["metadata"].as_object_mut() {
                meta.remove("namespace");
            }
            v
        })
        .collect();
    serde_json::to_string_pretty(&examples).map_err(BundleError::Json)
}

/// `spec.customresourcedefinitions.owned`: name, version, kind and description from the CRD
/// types; display name, resources and descriptors from the base, each descriptor's
/// description from the schema when the base gives none. Fails when a field has no descriptor
/// or a descriptor names no field.
fn owned_crds(inputs: &Inputs<'_>) -> Result<Vec<Value>, BundleError> {
    let source = &inputs.base.source;
    let base_owned = inputs.base.value["spec"]["customresourcedefinitions"]["owned"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut problems = Vec::new();
    let mut owned = Vec::new();
    for crd in inputs.crds {
        let kind = &crd.spec.names.kind;
        let Some(base) = base_owned.iter().find(|o| o["kind"] == kind.as_str()) else {
            problems.push(format!(
                "customresourcedefinitions.owned has no entry for {kind}"
            ));
            continue;
        };
        for version in &crd.spec.versions {
            let schema = version
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .map(serde_json::to_value)
                .transpose()
                .map_err(BundleError::Json)?
                .unwrap_or(Value::Null);
            let mut entry = base.clone();
            entry["name"] = crd.metadata.name.clone().unwrap_or_default().into();
            entry["version"] = version.name.clone().into();
            entry["kind"] = kind.clone().into();
            let description = schema["description"].as_str().unwrap_or_default();
            if entry.get("description").is_none() {
                entry["description"] = description.into();
            }
            for (list, section) in [("specDescriptors", "spec"), ("statusDescriptors", "status")] {
                let section_schema = &schema["properties"][section];
                let descriptors =
                    fill_descriptors(kind, list, entry.get(list), section_schema, &mut problems);
                if descriptors.is_empty() {
                    if let Some(map) = entry.as_object_mut() {
                        map.remove(list);
                    }
                } else {
                    entry[list] = Value::Array(descriptors);
                }
                // Every field of the schema's top level needs a descriptor.
                let described: BTreeSet<String> = entry
                    .get(list)
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|d| d["path"].as_str().map(str::to_owned))
                    .collect();
                for field in section_schema["properties"]
                    .as_object()
                    .into_iter()
                    .flat_map(|m| m.keys())
                {
                    if !described.contains(field) {
                        problems.push(format!("{kind}: {section}.{field} has no {list} entry"));
                    }
                }
                // So does every field the samples set (a descriptor covers what is below it).
                for sample in inputs.samples.iter().filter(|s| s.kind() == kind.as_str()) {
                    let mut paths = Vec::new();
                    field_paths(&sample.value[section], "", &mut paths);
                    for path in paths {
                        let covered = described
                            .iter()
                            .any(|d| path == *d || path.starts_with(&format!("{d}.")));
                        if !covered {
                            problems.push(format!(
                                "{kind}: {section}.{path} (set in {}) has no {list} entry",
                                sample.source.display()
                            ));
                        }
                    }
                }
            }
            owned.push(entry);
        }
    }
    if !problems.is_empty() {
        return Err(BundleError::Invalid {
            path: source.clone(),
            reason: problems.join("; "),
        });
    }
    Ok(owned)
}

/// The base's descriptors with descriptions from the schema; a path the schema does not have
/// is a problem.
fn fill_descriptors(
    kind: &str,
    list: &str,
    base: Option<&Value>,
    schema: &Value,
    problems: &mut Vec<String>,
) -> Vec<Value> {
    let mut out = Vec::new();
    for descriptor in base.and_then(Value::as_array).into_iter().flatten() {
        let path = descriptor["path"].as_str().unwrap_or_default();
        let Some(field) = schema_at(schema, path) else {
            problems.push(format!(
                "{kind}: {list} path {path:?} is not a field of the CRD"
            ));
            continue;
        };
        let mut d = descriptor.clone();
        if d.get("description").is_none()
            && let Some(text) = field["description"].as_str()
        {
            d["description"] = text.into();
        }
        out.push(d);
    }
    out
}

/// The schema of a dotted field path below `schema`.
fn schema_at<'a>(schema: &'a Value, path: &str) -> Option<&'a Value> {
    if path.is_empty() {
        return None;
    }
    path.split('.')
        .try_fold(schema, |node, field| node["properties"].get(field))
}

/// Dotted paths of every field in `value` (objects only; list items are part of their list).
fn field_paths(value: &Value, prefix: &str, out: &mut Vec<String>) {
    let Some(map) = value.as_object() else {
        return;
    };
    for (key, child) in map {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        out.push(path.clone());
        field_paths(child, &path, out);
    }
}

/// Standard base64 with padding (for the icon).
pub fn base64(bytes: &[u8]) -> String {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(TABLE[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_rfc_vectors() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
    }

    #[test]
    fn image_names_and_tags() {
        assert_eq!(image_name("ghcr.io/a/coxswain:v1"), "coxswain");
        assert_eq!(image_name("localhost:5000/coxswain"), "coxswain");
        assert_eq!(image_name("ghcr.io/a/coxswain@sha256:00"), "coxswain");
        assert_eq!(image_tag("localhost:5000/coxswain"), None);
        assert_eq!(image_tag("ghcr.io/a/coxswain:v1"), Some("v1"));
    }

    #[test]
    fn re_tagging_keeps_the_repository_and_refuses_digests() {
        assert_eq!(
            with_tag("ghcr.io/a/coxswain:v0.1.0", "v0.1.1").as_deref(),
            Some("ghcr.io/a/coxswain:v0.1.1")
        );
        assert_eq!(
            with_tag("localhost:5000/coxswain", "v2").as_deref(),
            Some("localhost:5000/coxswain:v2")
        );
        assert_eq!(with_tag("ghcr.io/a/coxswain@sha256:00", "v2"), None);
    }

    #[test]
    fn field_paths_cover_nested_objects() {
        let mut out = Vec::new();
        field_paths(
            &json!({"a": 1, "b": {"c": [1], "d": {"e": true}}}),
            "",
            &mut out,
        );
        assert_eq!(out, ["a", "b", "b.c", "b.d", "b.d.e"]);
    }
}
