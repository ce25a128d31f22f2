//! Reading `config/` the way `kubectl apply -k` does, for the subset of kustomize Coxswain's
//! bases use: a `kustomization.yaml` lists `resources` (files, or directories with their own
//! kustomization) and may set `namespace`. Anything else in a kustomization is refused rather
//! than ignored, so the bundle can never silently differ from what kustomize would build (a
//! test compares the two on the real `config/`).

use super::BundleError;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// One object read from a config file.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigObject {
    /// The file it came from, for error messages.
    pub source: PathBuf,
    pub value: Value,
}

impl ConfigObject {
    pub fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or_default()
    }

    pub fn api_version(&self) -> &str {
        self.value["apiVersion"].as_str().unwrap_or_default()
    }

    /// The API group (empty for the core group).
    pub fn group(&self) -> &str {
        self.api_version()
            .rsplit_once('/')
            .map_or("", |(group, _)| group)
    }

    pub fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or_default()
    }

    pub fn describe(&self) -> String {
        format!(
            "{} {} ({})",
            self.kind(),
            self.name(),
            self.source.display()
        )
    }
}

const KUSTOMIZATION: &str = "kustomization.yaml";
/// Kustomization keys this reader understands.
const SUPPORTED_KEYS: &[&str] = &["apiVersion", "kind", "resources", "namespace"];
/// Kinds kustomize's namespace transformer leaves alone because they are cluster-scoped.
const CLUSTER_SCOPED: &[&str] = &[
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PriorityClass",
    "StorageClass",
    "PersistentVolume",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    "APIService",
];

/// Every object the kustomization in `dir` builds, in kustomize's resource order.
pub fn build(dir: &Path) -> Result<Vec<ConfigObject>, BundleError> {
    let path = dir.join(KUSTOMIZATION);
    let text = read(&path)?;
    let doc: Value = serde_yaml::from_str(&text).map_err(|source| BundleError::Yaml {
        path: path.clone(),
        source,
    })?;
    let Some(map) = doc.as_object() else {
        return Err(BundleError::Invalid {
            path,
            reason: "a kustomization must be a mapping".into(),
        });
    };
    if let Some(key) = map.keys().find(|k| !SUPPORTED_KEYS.contains(&k.as_str())) {
        return Err(BundleError::Invalid {
            path,
            reason: format!(
                "kustomization key {key:?} is not supported by `coxswain bundle` (it reads {})",
                SUPPORTED_KEYS.join(", ")
            ),
        });
    }
    let mut objects = Vec::new();
    let resources = match map.get("resources") {
        None => Vec::new(),
        Some(Value::Array(items)) => items.clone(),
        Some(_) => {
            return Err(BundleError::Invalid {
                path,
                reason: "resources must be a list".into(),
            });
        }
    };
    for resource in resources {
        let Some(name) = resource.as_str() else {
            return Err(BundleError::Invalid {
                path,
                reason: format!("resource entry {resource} is not a path"),
            });
        };
        let target = dir.join(name);
        if target.is_dir() {
            objects.extend(build(&target)?);
        } else {
            objects.extend(read_objects(&target)?);
        }
    }
    if let Some(ns) = map.get("namespace") {
        let Some(ns) = ns.as_str() else {
            return Err(BundleError::Invalid {
                path,
                reason: "namespace must be a string".into(),
            });
        };
        for obj in &mut objects {
            if !CLUSTER_SCOPED.contains(&obj.kind())
                && let Some(meta) = obj.value["metadata"].as_object_mut()
            {
                meta.insert("namespace".into(), Value::String(ns.to_owned()));
            }
        }
    }
    Ok(objects)
}

/// The objects of one (possibly multi-document) YAML file. Empty documents are skipped.
pub fn read_objects(path: &Path) -> Result<Vec<ConfigObject>, BundleError> {
    let text = read(path)?;
    let mut objects = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value: Value =
            serde::Deserialize::deserialize(doc).map_err(|source| BundleError::Yaml {
                path: path.to_owned(),
                source,
            })?;
        if value.is_null() {
            continue;
        }
        let obj = ConfigObject {
            source: path.to_owned(),
            value,
        };
        if obj.api_version().is_empty() || obj.kind().is_empty() || obj.name().is_empty() {
            return Err(BundleError::Invalid {
                path: path.to_owned(),
                reason: "every object needs apiVersion, kind and metadata.name".into(),
            });
        }
        objects.push(obj);
    }
    Ok(objects)
}

pub fn read(path: &Path) -> Result<String, BundleError> {
    std::fs::read_to_string(path).map_err(|source| BundleError::Read {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn follows_resources_and_sets_the_namespace_on_namespaced_kinds() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(
            root,
            "top/kustomization.yaml",
            "namespace: ns\nresources: [../sub, role.yaml]\n",
        );
        write(
            root,
            "top/role.yaml",
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: r}\n",
        );
        write(root, "sub/kustomization.yaml", "resources: [two.yaml]\n");
        write(
            root,
            "sub/two.yaml",
            "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: b, namespace: other}\n",
        );
        let objects = build(&root.join("top")).unwrap();
        let names: Vec<_> = objects
            .iter()
            .map(|o| {
                (
                    o.kind(),
                    o.name(),
                    o.value["metadata"]["namespace"].as_str(),
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                ("Service", "a", Some("ns")),
                ("ConfigMap", "b", Some("ns")),
                ("ClusterRole", "r", None)
            ]
        );
    }

    #[test]
    fn refuses_kustomize_features_it_would_ignore() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "kustomization.yaml",
            "resources: []\nnamePrefix: x-\n",
        );
        let err = build(dir.path()).unwrap_err().to_string();
        assert!(err.contains("namePrefix"), "{err}");
    }

    #[test]
    fn objects_need_kind_and_name() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a.yaml", "apiVersion: v1\nkind: Service\n");
        assert!(read_objects(&dir.path().join("a.yaml")).is_err());
    }
}
