//! Pod volumes as host directories: emptyDir, hostPath, configMap, secret, downwardAPI and
//! projected (serviceAccountToken through TokenRequest, refreshed before it expires, plus
//! configMap, secret and downwardAPI sources). Containers get them by bind mount.

use super::Shared;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{
    ConfigMap, DownwardAPIVolumeFile, KeyToPath, Pod, Secret, ServiceAccount, Volume,
};
use kube::Api;
use kube::api::PostParams;
use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const DEFAULT_MODE: u32 = 0o644;

pub(crate) struct Volumes {
    root: PathBuf,
    /// Volume name → host path (a directory under `root`, or the hostPath itself).
    paths: HashMap<String, PathBuf>,
    /// Token file → when to request a fresh one.
    token_refresh: HashMap<PathBuf, Instant>,
}

impl Volumes {
    pub fn new(root: PathBuf) -> Self {
        Self {
            root,
            paths: HashMap::new(),
            token_refresh: HashMap::new(),
        }
    }

    pub fn host_path(&self, volume: &str) -> Option<&Path> {
        self.paths.get(volume).map(PathBuf::as_path)
    }

    /// Writes every volume's current content. Called before the first container starts and
    /// then periodically, as a kubelet syncs ConfigMaps, Secrets and tokens. The error is the
    /// message a person sees in the container's waiting state.
    pub async fn sync(&mut self, shared: &Shared, pod: &Pod, pod_ip: &str) -> Result<(), String> {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            let path = self.sync_one(shared, pod, &ns, pod_ip, volume).await?;
            self.paths.insert(volume.name.clone(), path);
        }
        Ok(())
    }

    async fn sync_one(
        &mut self,
        shared: &Shared,
        pod: &Pod,
        ns: &str,
        pod_ip: &str,
        volume: &Volume,
    ) -> Result<PathBuf, String> {
        let dir = self.root.join(&volume.name);
        let io = |e: std::io::Error| format!("volume {}: {e}", volume.name);
        if let Some(host) = &volume.host_path {
            let path = PathBuf::from(&host.path);
            if matches!(host.type_.as_deref(), Some("DirectoryOrCreate")) {
                std::fs::create_dir_all(&path).map_err(io)?;
            }
            return Ok(path);
        }
        std::fs::create_dir_all(&dir).map_err(io)?;
        if volume.empty_dir.is_some() {
            return Ok(dir);
        }
        if let Some(cm) = &volume.config_map {
            let mode = cm.default_mode.map_or(DEFAULT_MODE, |m| m as u32);
            let data = config_map(shared, ns, &cm.name, cm.optional.unwrap_or(false)).await?;
            write_keys(&dir, &data, cm.items.as_deref(), mode).map_err(io)?;
            return Ok(dir);
        }
        if let Some(secret) = &volume.secret {
            let mode = secret.default_mode.map_or(DEFAULT_MODE, |m| m as u32);
            let name = secret.secret_name.clone().unwrap_or_default();
            let data = secret_data(shared, ns, &name, secret.optional.unwrap_or(false)).await?;
            write_keys(&dir, &data, secret.items.as_deref(), mode).map_err(io)?;
            return Ok(dir);
        }
        if let Some(downward) = &volume.downward_api {
            let mode = downward.default_mode.map_or(DEFAULT_MODE, |m| m as u32);
            write_downward(&dir, pod, pod_ip, downward.items.as_deref(), mode)?;
            return Ok(dir);
        }
        if let Some(projected) = &volume.projected {
            let mode = projected.default_mode.map_or(DEFAULT_MODE, |m| m as u32);
            for source in projected.sources.iter().flatten() {
                if let Some(token) = &source.service_account_token {
                    let file = dir.join(&token.path);
                    self.sync_token(
                        shared,
                        pod,
                        ns,
                        &file,
                        token.audience.as_deref(),
                        token.expiration_seconds.unwrap_or(3600),
                        mode,
                    )
                    .await?;
                } else if let Some(cm) = &source.config_map {
                    let data =
                        config_map(shared, ns, &cm.name, cm.optional.unwrap_or(false)).await?;
                    write_keys(&dir, &data, cm.items.as_deref(), mode).map_err(io)?;
                } else if let Some(secret) = &source.secret {
                    let data =
                        secret_data(shared, ns, &secret.name, secret.optional.unwrap_or(false))
                            .await?;
                    write_keys(&dir, &data, secret.items.as_deref(), mode).map_err(io)?;
                } else if let Some(downward) = &source.downward_api {
                    write_downward(&dir, pod, pod_ip, downward.items.as_deref(), mode)?;
                } else {
                    return Err(format!(
                        "volume {}: this projected source is not supported by the test node",
                        volume.name
                    ));
                }
            }
            return Ok(dir);
        }
        Err(format!(
            "volume {}: only emptyDir, hostPath, configMap, secret, downwardAPI and projected \
             volumes are supported by the test node",
            volume.name
        ))
    }

    #[allow(clippy::too_many_arguments)]
    async fn sync_token(
        &mut self,
        shared: &Shared,
        pod: &Pod,
        ns: &str,
        file: &Path,
        audience: Option<&str>,
        expiration_seconds: i64,
        mode: u32,
    ) -> Result<(), String> {
        if file.exists()
            && self
                .token_refresh
                .get(file)
                .is_some_and(|at| Instant::now() < *at)
        {
            return Ok(());
        }
        let sa = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".to_owned());
        let request = serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": audience.map(|a| vec![a]).unwrap_or_default(),
                "expirationSeconds": expiration_seconds,
                "boundObjectRef": {
                    "apiVersion": "v1", "kind": "Pod",
                    "name": pod.metadata.name, "uid": pod.metadata.uid,
                },
            },
        });
        let api: Api<ServiceAccount> = Api::namespaced(shared.client.clone(), ns);
        let response: TokenRequest = api
            .create_subresource("token", &sa, &PostParams::default(), &request)
            .await
            .map_err(|e| format!("TokenRequest for ServiceAccount {ns}/{sa}: {e}"))?;
        let token = response
            .status
            .map(|s| s.token)
            .unwrap_or_default()
            .unwrap_or_default();
        write_file(file, token.as_bytes(), mode).map_err(|e| format!("{}: {e}", file.display()))?;
        // Refresh at 80% of the lifetime, as the kubelet does.
        let ttl = u64::try_from(expiration_seconds).unwrap_or(3600);
        self.token_refresh.insert(
            file.to_owned(),
            Instant::now() + Duration::from_secs(ttl * 8 / 10),
        );
        Ok(())
    }
}

async fn config_map(
    shared: &Shared,
    ns: &str,
    name: &str,
    optional: bool,
) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let api: Api<ConfigMap> = Api::namespaced(shared.client.clone(), ns);
    match api.get_opt(name).await {
        Ok(Some(cm)) => {
            let mut out: BTreeMap<String, Vec<u8>> = cm
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes()))
                .collect();
            for (k, v) in cm.binary_data.unwrap_or_default() {
                out.insert(k, v.0);
            }
            Ok(out)
        }
        Ok(None) if optional => Ok(BTreeMap::new()),
        Ok(None) => Err(format!("configmap \"{name}\" not found")),
        Err(e) => Err(format!("reading configmap \"{name}\": {e}")),
    }
}

pub(crate) async fn secret_data(
    shared: &Shared,
    ns: &str,
    name: &str,
    optional: bool,
) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let api: Api<Secret> = Api::namespaced(shared.client.clone(), ns);
    match api.get_opt(name).await {
        Ok(Some(secret)) => {
            let mut out: BTreeMap<String, Vec<u8>> = secret
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect();
            for (k, v) in secret.string_data.unwrap_or_default() {
                out.insert(k, v.into_bytes());
            }
            Ok(out)
        }
        Ok(None) if optional => Ok(BTreeMap::new()),
        Ok(None) => Err(format!("secret \"{name}\" not found")),
        Err(e) => Err(format!("reading secret \"{name}\": {e}")),
    }
}

pub(crate) async fn config_map_data(
    shared: &Shared,
    ns: &str,
    name: &str,
    optional: bool,
) -> Result<BTreeMap<String, Vec<u8>>, String> {
    config_map(shared, ns, name, optional).await
}

fn write_keys(
    dir: &Path,
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    mode: u32,
) -> std::io::Result<()> {
    match items {
        Some(items) => {
            for item in items {
                if let Some(value) = data.get(&item.key) {
                    let mode = item.mode.map_or(mode, |m| m as u32);
                    write_file(&dir.join(&item.path), value, mode)?;
                }
            }
        }
        None => {
            for (key, value) in data {
                write_file(&dir.join(key), value, mode)?;
            }
        }
    }
    Ok(())
}

fn write_downward(
    dir: &Path,
    pod: &Pod,
    pod_ip: &str,
    items: Option<&[DownwardAPIVolumeFile]>,
    mode: u32,
) -> Result<(), String> {
    for item in items.unwrap_or_default() {
        let Some(field) = &item.field_ref else {
            return Err(format!(
                "downwardAPI {}: only fieldRef is supported by the test node",
                item.path
            ));
        };
        let value = field_value(pod, &field.field_path, pod_ip)?;
        let mode = item.mode.map_or(mode, |m| m as u32);
        write_file(&dir.join(&item.path), value.as_bytes(), mode)
            .map_err(|e| format!("{}: {e}", item.path))?;
    }
    Ok(())
}

/// A downward-API field of the Pod, as the kubelet renders it.
pub(crate) fn field_value(pod: &Pod, path: &str, pod_ip: &str) -> Result<String, String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let render_map = |m: Option<&BTreeMap<String, String>>| {
        m.map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}=\"{v}\""))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
    };
    let keyed = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix("']"))
            .map(str::to_owned)
    };
    Ok(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" => render_map(meta.labels.as_ref()),
        "metadata.annotations" => render_map(meta.annotations.as_ref()),
        "spec.nodeName" => super::NODE_NAME.to_owned(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".to_owned()),
        "status.podIP" | "status.podIPs" => pod_ip.to_owned(),
        "status.hostIP" | "status.hostIPs" => String::new(),
        _ => {
            if let Some(key) = keyed("metadata.labels['") {
                meta.labels
                    .as_ref()
                    .and_then(|l| l.get(&key).cloned())
                    .unwrap_or_default()
            } else if let Some(key) = keyed("metadata.annotations['") {
                meta.annotations
                    .as_ref()
                    .and_then(|a| a.get(&key).cloned())
                    .unwrap_or_default()
            } else {
                return Err(format!("field {path} is not supported by the test node"));
            }
        }
    })
}

/// Writes only when the content changed, so readers see no needless churn.
fn write_file(path: &Path, content: &[u8], mode: u32) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    if std::fs::read(path).is_ok_and(|old| old == content) {
        return Ok(());
    }
    std::fs::write(path, content)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}
