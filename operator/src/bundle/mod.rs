//! `coxswain bundle`: the OLM bundle (registry+v1) generated from `config/` and the Rust CRD
//! types.
//!
//! Inputs, never restated here:
//! - `config/manifests/` (a kustomization): the CSV base, everything `config/default` installs,
//!   the samples and the scorecard configuration;
//! - the CRD types in `coxswain-api` (and `config/crd/bases` must equal them);
//! - `PROJECT` for the package name, the workspace version for the CSV's version.
//!
//! Mapping: Deployments become the CSV's install strategy; Roles and ClusterRoles bound to a
//! Deployment's ServiceAccount become its `permissions` / `clusterPermissions` (the bindings
//! and those ServiceAccounts are left to OLM, which creates them); a Deployment whose
//! ServiceAccount has no rights at all still gets a `permissions` entry with no rules,
//! because OLM creates only the ServiceAccounts its permissions name. Services, the
//! disruption budget and other kinds OLM accepts go to `bundle/manifests` as they are.
//!
//! Output is deterministic (sorted keys, no timestamps but the base's `createdAt`), so a test
//! can demand that the committed `bundle/` equals a fresh generation.

pub mod config;
pub mod csv;

use config::ConfigObject;
use coxswain_api::crd;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Channels the bundle is published to; the first is the default. `candidate` while the
/// operator's maturity is alpha.
pub const CHANNELS: &[&str] = &["candidate"];

/// Kinds OLM accepts in `bundle/manifests` besides the CSV and CRDs.
const EXTRA_KINDS: &[&str] = &[
    "Secret",
    "ConfigMap",
    "Service",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "ClusterRole",
    "ClusterRoleBinding",
    "PrometheusRule",
    "ServiceMonitor",
    "PodMonitor",
    "PodDisruptionBudget",
    "PriorityClass",
    "VerticalPodAutoscaler",
    "NetworkPolicy",
];

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing {path}: {source}")]
    Yaml {
        path: PathBuf,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("rendering YAML: {0}")]
    Render(#[source] serde_yaml::Error),
    #[error("rendering JSON: {0}")]
    Json(#[source] serde_json::Error),
    #[error(transparent)]
    Crd(#[from] crd::RenderError),
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("bundle is out of date with config/ and the Rust types (run `make bundle`):\n{0}")]
    Drift(String),
}

/// Where the generator reads and writes, relative to the repository root.
#[derive(Debug, Clone)]
pub struct Layout {
    pub root: PathBuf,
}

impl Layout {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }
    fn config(&self) -> PathBuf {
        self.root.join("config")
    }
}

/// Every generated file: path relative to the repository root -> content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    pub files: BTreeMap<PathBuf, String>,
}

/// Directories the generator owns entirely (stale files there are removed on write).
const OWNED_DIRS: &[&str] = &["bundle"];
const DOCKERFILE: &str = "bundle.Dockerfile";

/// Generates the bundle of the workspace version.
pub fn generate(layout: &Layout) -> Result<Bundle, BundleError> {
    generate_version(layout, env!("CARGO_PKG_VERSION"))
}

/// Generates the bundle for `version` (the CSV's semver, without a leading `v`).
pub fn generate_version(layout: &Layout, version: &str) -> Result<Bundle, BundleError> {
    generate_with(layout, version, None)
}

/// The workspace's build published once more under another version, so an upgrade can be
/// rehearsed through a real catalog (`coxswain bundle --as-version 0.1.1 --replaces
/// coxswain.v0.1.0`): every image keeps its repository and is tagged `v<version>` (one build
/// under two tags, as a registry would hold a re-tag), and the CSV replaces `replaces`.
#[derive(Debug, Clone, Copy)]
pub struct Rehearsal<'a> {
    pub version: &'a str,
    pub replaces: &'a str,
}

/// Generates the bundle of a [`Rehearsal`].
pub fn generate_rehearsal(
    layout: &Layout,
    rehearsal: Rehearsal<'_>,
) -> Result<Bundle, BundleError> {
    let invalid = |reason: String| BundleError::Invalid {
        path: layout.root.clone(),
        reason,
    };
    let is_semver = |v: &str| {
        let parts: Vec<&str> = v.split('.').collect();
        parts.len() == 3
            && parts
                .iter()
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    };
    if !is_semver(rehearsal.version) {
        return Err(invalid(format!(
            "--as-version {:?} must be MAJOR.MINOR.PATCH",
            rehearsal.version
        )));
    }
    if !coxswain_api::names::is_dns_subdomain(rehearsal.replaces) {
        return Err(invalid(format!(
            "--replaces {:?} must be a CSV name (a DNS subdomain such as coxswain.v0.1.0)",
            rehearsal.replaces
        )));
    }
    generate_with(layout, rehearsal.version, Some(rehearsal))
}

fn generate_with(
    layout: &Layout,
    version: &str,
    rehearsal: Option<Rehearsal<'_>>,
) -> Result<Bundle, BundleError> {
    let package = package_name(&layout.root.join("PROJECT"))?;
    let manifests_dir = layout.config().join("manifests");
    let objects = config::build(&manifests_dir)?;
    let crds = crd::all();

    let mut bases = Vec::new();
    let mut scorecards = Vec::new();
    let mut samples = Vec::new();
    let mut config_crds = Vec::new();
    let mut deployments = Vec::new();
    let mut rbac = Vec::new();
    let mut extras = Vec::new();
    for obj in objects {
        let owned = crds
            .iter()
            .any(|c| c.spec.names.kind == obj.kind() && c.spec.group == obj.group());
        match obj.kind() {
            "ClusterServiceVersion" => bases.push(obj),
            "Configuration" if obj.group() == "scorecard.operatorframework.io" => {
                scorecards.push(obj)
            }
            "CustomResourceDefinition" => config_crds.push(obj),
            "Namespace" => {}
            "Deployment" if obj.group() == "apps" => match rehearsal {
                Some(r) => deployments.push(retag_deployment(obj, &format!("v{}", r.version))?),
                None => deployments.push(obj),
            },
            "ServiceAccount" | "Role" | "ClusterRole" | "RoleBinding" | "ClusterRoleBinding" => {
                rbac.push(obj)
            }
            _ if owned => samples.push(obj),
            kind if EXTRA_KINDS.contains(&kind) => extras.push(obj),
            _ => {
                return Err(BundleError::Invalid {
                    path: obj.source.clone(),
                    reason: format!(
                        "{} cannot be part of an OLM bundle (allowed besides the CSV and CRDs: {})",
                        obj.describe(),
                        EXTRA_KINDS.join(", ")
                    ),
                });
            }
        }
    }
    let base = exactly_one(bases, &manifests_dir, "ClusterServiceVersion base")?;
    let scorecard = exactly_one(scorecards, &manifests_dir, "scorecard Configuration")?;
    check_config_crds(&config_crds, &manifests_dir)?;
    check_images(&deployments, version)?;
    let (permissions, cluster_permissions, leftover_rbac) = permissions(&deployments, rbac)?;
    extras.extend(leftover_rbac);

    let icon_path = manifests_dir.join("bases/coxswain.svg");
    let icon = std::fs::read(&icon_path).map_err(|source| BundleError::Read {
        path: icon_path,
        source,
    })?;
    let mut csv = csv::assemble(&csv::Inputs {
        base: &base,
        package: &package,
        version,
        icon_svg: &icon,
        crds: &crds,
        samples: &samples,
        deployments: &deployments,
        permissions: &permissions,
        cluster_permissions: &cluster_permissions,
    })?;
    if let (Some(r), Some(spec)) = (rehearsal, csv["spec"].as_object_mut()) {
        spec.insert("replaces".into(), r.replaces.into());
    }

    let mut files = BTreeMap::new();
    let manifests = PathBuf::from("bundle/manifests");
    files.insert(
        manifests.join(format!("{package}.clusterserviceversion.yaml")),
        yaml(&csv)?,
    );
    for rendered in crd::render()? {
        files.insert(manifests.join(&rendered.file_name), rendered.yaml);
    }
    for obj in &extras {
        let mut value = obj.value.clone();
        if let Some(meta) = value["metadata"].as_object_mut() {
            meta.remove("namespace");
        }
        let file = format!(
            "{}_{}_{}.yaml",
            obj.name(),
            obj.api_version().replace('/', "_"),
            obj.kind().to_ascii_lowercase()
        );
        if files.insert(manifests.join(&file), yaml(&value)?).is_some() {
            return Err(BundleError::Invalid {
                path: obj.source.clone(),
                reason: format!("two objects would be written to bundle/manifests/{file}"),
            });
        }
    }
    let annotations = annotations(&package);
    let mut annotations_yaml = String::from("annotations:\n");
    for (key, value) in &annotations {
        annotations_yaml.push_str(&format!("  {key}: {value}\n"));
    }
    files.insert(
        PathBuf::from("bundle/metadata/annotations.yaml"),
        annotations_yaml,
    );
    files.insert(
        PathBuf::from("bundle/tests/scorecard/config.yaml"),
        yaml(&scorecard.value)?,
    );
    files.insert(PathBuf::from(DOCKERFILE), dockerfile(&annotations));
    Ok(Bundle { files })
}

fn yaml(value: &Value) -> Result<String, BundleError> {
    serde_yaml::to_string(value).map_err(BundleError::Render)
}

fn exactly_one(
    mut found: Vec<ConfigObject>,
    dir: &Path,
    what: &str,
) -> Result<ConfigObject, BundleError> {
    match (found.pop(), found.is_empty()) {
        (Some(one), true) => Ok(one),
        (None, _) => Err(BundleError::Invalid {
            path: dir.to_owned(),
            reason: format!("no {what} found"),
        }),
        (Some(_), false) => Err(BundleError::Invalid {
            path: dir.to_owned(),
            reason: format!("more than one {what} found"),
        }),
    }
}

/// `projectName` of the operator-sdk PROJECT file: the OLM package name.
fn package_name(project: &Path) -> Result<String, BundleError> {
    let text = config::read(project)?;
    let doc: Value = serde_yaml::from_str(&text).map_err(|source| BundleError::Yaml {
        path: project.to_owned(),
        source,
    })?;
    doc["projectName"]
        .as_str()
        .filter(|n| coxswain_api::names::is_dns_label(n))
        .map(str::to_owned)
        .ok_or_else(|| BundleError::Invalid {
            path: project.to_owned(),
            reason: "projectName must be set to a DNS label".into(),
        })
}

/// `config/crd/bases` (which config/default installs) must be what the Rust types generate.
fn check_config_crds(found: &[ConfigObject], dir: &Path) -> Result<(), BundleError> {
    let mut expected = BTreeMap::new();
    for c in crd::all() {
        let value = serde_json::to_value(&c).map_err(BundleError::Json)?;
        expected.insert(c.metadata.name.clone().unwrap_or_default(), value);
    }
    let actual: BTreeMap<String, Value> = found
        .iter()
        .map(|o| (o.name().to_owned(), o.value.clone()))
        .collect();
    if actual != expected {
        return Err(BundleError::Invalid {
            path: dir.to_owned(),
            reason: "the CRDs under config/ differ from the Rust types; run `make manifests`"
                .into(),
        });
    }
    Ok(())
}

/// Every image the Deployments name must be tagged with the version being bundled, so a
/// version bump cannot ship last release's images.
fn check_images(deployments: &[ConfigObject], version: &str) -> Result<(), BundleError> {
    let want = format!("v{version}");
    for d in deployments {
        for image in csv::related_images(std::slice::from_ref(d)).values() {
            if csv::image_tag(image) != Some(want.as_str()) {
                return Err(BundleError::Invalid {
                    path: d.source.clone(),
                    reason: format!(
                        "image {image} in {} is not tagged {want} (the workspace version)",
                        d.describe()
                    ),
                });
            }
        }
    }
    Ok(())
}

/// The Deployment with every image it runs or hands on (`*_IMAGE` variables) tagged `tag`.
fn retag_deployment(mut deployment: ConfigObject, tag: &str) -> Result<ConfigObject, BundleError> {
    let source = deployment.source.clone();
    let retag = |value: &mut Value| -> Result<(), BundleError> {
        let Some(image) = value.as_str() else {
            return Ok(());
        };
        let retagged = csv::with_tag(image, tag).ok_or_else(|| BundleError::Invalid {
            path: source.clone(),
            reason: format!("image {image} is pinned by digest and cannot be re-tagged {tag}"),
        })?;
        *value = retagged.into();
        Ok(())
    };
    // `get_mut`, never `value[key]` on a `&mut`: indexing would insert the missing keys.
    for list in ["initContainers", "containers"] {
        let containers = deployment
            .value
            .pointer_mut(&format!("/spec/template/spec/{list}"))
            .and_then(Value::as_array_mut);
        for container in containers.into_iter().flatten() {
            if let Some(image) = container.get_mut("image") {
                retag(image)?;
            }
            let env = container.get_mut("env").and_then(Value::as_array_mut);
            for var in env.into_iter().flatten() {
                if var["name"].as_str().is_some_and(|n| n.ends_with("_IMAGE"))
                    && let Some(value) = var.get_mut("value")
                {
                    retag(value)?;
                }
            }
        }
    }
    Ok(deployment)
}

type Permissions = (
    Vec<csv::Permission>,
    Vec<csv::Permission>,
    Vec<ConfigObject>,
);

/// Folds the RBAC objects into the CSV's permissions. Returns the namespaced and cluster-wide
/// permissions, and the RBAC objects that are not about a Deployment's ServiceAccount (they go
/// to bundle/manifests as they are).
fn permissions(
    deployments: &[ConfigObject],
    rbac: Vec<ConfigObject>,
) -> Result<Permissions, BundleError> {
    let mut accounts: Vec<String> = deployments
        .iter()
        .map(|d| {
            d.value["spec"]["template"]["spec"]["serviceAccountName"]
                .as_str()
                .unwrap_or("default")
                .to_owned()
        })
        .collect();
    accounts.sort();
    accounts.dedup();
    let find_role = |kind: &str, name: &str| {
        rbac.iter()
            .find(|o| o.kind() == kind && o.name() == name)
            .cloned()
    };
    let mut namespaced: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut cluster: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut used = Vec::new();
    for binding in rbac
        .iter()
        .filter(|o| matches!(o.kind(), "RoleBinding" | "ClusterRoleBinding"))
    {
        let subjects: Vec<&str> = binding.value["subjects"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["kind"] == "ServiceAccount")
            .filter_map(|s| s["name"].as_str())
            .collect();
        let ours: Vec<&str> = subjects
            .iter()
            .copied()
            .filter(|s| accounts.iter().any(|a| a == s))
            .collect();
        if ours.is_empty() {
            continue;
        }
        if ours.len() != subjects.len() || subjects.len() != 1 {
            return Err(BundleError::Invalid {
                path: binding.source.clone(),
                reason: format!(
                    "{} must bind exactly one Deployment ServiceAccount and nothing else",
                    binding.describe()
                ),
            });
        }
        let role_kind = binding.value["roleRef"]["kind"]
            .as_str()
            .unwrap_or_default();
        let role_name = binding.value["roleRef"]["name"]
            .as_str()
            .unwrap_or_default();
        let role = find_role(role_kind, role_name).ok_or_else(|| BundleError::Invalid {
            path: binding.source.clone(),
            reason: format!(
                "{} refers to a missing {role_kind} {role_name}",
                binding.describe()
            ),
        })?;
        let rules = role.value["rules"].as_array().cloned().unwrap_or_default();
        let target = if binding.kind() == "ClusterRoleBinding" {
            &mut cluster
        } else {
            &mut namespaced
        };
        target.entry(ours[0].to_owned()).or_default().extend(rules);
        used.push((binding.kind().to_owned(), binding.name().to_owned()));
        used.push((role_kind.to_owned(), role_name.to_owned()));
    }
    // OLM creates the ServiceAccounts named in permissions and nothing else: a Deployment's
    // ServiceAccount without rights gets an entry without rules.
    for account in &accounts {
        if !namespaced.contains_key(account) && !cluster.contains_key(account) {
            namespaced.insert(account.clone(), Vec::new());
        }
    }
    let leftover = rbac
        .into_iter()
        .filter(|o| {
            let consumed = used
                .iter()
                .any(|(kind, name)| kind == o.kind() && name == o.name());
            let deployment_account =
                o.kind() == "ServiceAccount" && accounts.iter().any(|a| a == o.name());
            !consumed && !deployment_account
        })
        .collect();
    let to_list = |m: BTreeMap<String, Vec<Value>>| {
        m.into_iter()
            .map(|(service_account, rules)| csv::Permission {
                service_account,
                rules,
            })
            .collect()
    };
    Ok((to_list(namespaced), to_list(cluster), leftover))
}

/// `metadata/annotations.yaml`, in the order OLM documents them.
fn annotations(package: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "operators.operatorframework.io.bundle.mediatype.v1",
            "registry+v1".into(),
        ),
        (
            "operators.operatorframework.io.bundle.manifests.v1",
            "manifests/".into(),
        ),
        (
            "operators.operatorframework.io.bundle.metadata.v1",
            "metadata/".into(),
        ),
        (
            "operators.operatorframework.io.bundle.package.v1",
            package.into(),
        ),
        (
            "operators.operatorframework.io.bundle.channels.v1",
            CHANNELS.join(","),
        ),
        (
            "operators.operatorframework.io.bundle.channel.default.v1",
            CHANNELS.first().copied().unwrap_or_default().into(),
        ),
        (
            "operators.operatorframework.io.test.mediatype.v1",
            "scorecard+v1".into(),
        ),
        (
            "operators.operatorframework.io.test.config.v1",
            "tests/scorecard/".into(),
        ),
    ]
}

fn dockerfile(annotations: &[(&str, String)]) -> String {
    let mut out = String::from(
        "# Generated by `make bundle` (coxswain bundle) from config/; do not edit.\n\
         # The bundle image: build it from the repository root.\nFROM scratch\n\n",
    );
    for (key, value) in annotations {
        out.push_str(&format!("LABEL {key}={value}\n"));
    }
    out.push_str(
        "\nCOPY bundle/manifests /manifests/\n\
         COPY bundle/metadata /metadata/\n\
         COPY bundle/tests/scorecard /tests/scorecard/\n",
    );
    out
}

/// Files on disk under the generated paths, relative to the root.
fn files_on_disk(root: &Path) -> Result<BTreeMap<PathBuf, String>, BundleError> {
    fn walk(
        root: &Path,
        dir: &Path,
        out: &mut BTreeMap<PathBuf, String>,
    ) -> Result<(), BundleError> {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => {
                return Err(BundleError::Read {
                    path: dir.to_owned(),
                    source,
                });
            }
        };
        for entry in entries {
            let path = entry
                .map_err(|source| BundleError::Read {
                    path: dir.to_owned(),
                    source,
                })?
                .path();
            if path.is_dir() {
                walk(root, &path, out)?;
            } else {
                let text = config::read(&path)?;
                let rel = path.strip_prefix(root).unwrap_or(&path).to_owned();
                out.insert(rel, text);
            }
        }
        Ok(())
    }
    let mut out = BTreeMap::new();
    for dir in OWNED_DIRS {
        walk(root, &root.join(dir), &mut out)?;
    }
    let dockerfile = root.join(DOCKERFILE);
    if dockerfile.exists() {
        out.insert(PathBuf::from(DOCKERFILE), config::read(&dockerfile)?);
    }
    Ok(out)
}

impl Bundle {
    /// How the files on disk differ from this bundle, one line per file; empty when equal.
    pub fn drift(&self, root: &Path) -> Result<Vec<String>, BundleError> {
        let disk = files_on_disk(root)?;
        let mut out = Vec::new();
        for (path, text) in &self.files {
            match disk.get(path) {
                None => out.push(format!("missing: {}", path.display())),
                Some(t) if t != text => out.push(format!("differs: {}", path.display())),
                Some(_) => {}
            }
        }
        for path in disk.keys().filter(|p| !self.files.contains_key(*p)) {
            out.push(format!("not generated (stale): {}", path.display()));
        }
        Ok(out)
    }

    /// Fails with the list of differences when the files on disk are not this bundle.
    pub fn check(&self, root: &Path) -> Result<(), BundleError> {
        let drift = self.drift(root)?;
        if drift.is_empty() {
            Ok(())
        } else {
            Err(BundleError::Drift(drift.join("\n")))
        }
    }

    /// Writes the bundle under `root`, removing stale files in the directories it owns.
    pub fn write(&self, root: &Path) -> Result<(), BundleError> {
        for stale in files_on_disk(root)?
            .keys()
            .filter(|p| !self.files.contains_key(*p))
        {
            let path = root.join(stale);
            std::fs::remove_file(&path).map_err(|source| BundleError::Write { path, source })?;
        }
        for (rel, text) in &self.files {
            let path = root.join(rel);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|source| BundleError::Write {
                    path: parent.to_owned(),
                    source,
                })?;
            }
            std::fs::write(&path, text).map_err(|source| BundleError::Write { path, source })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
