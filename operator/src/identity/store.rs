//! Where the CA lives: the Secret `coxswain-discovery-ca` in the controller's namespace, shared
//! by every replica; and the trust bundle ConfigMap proxies mount.

use super::{Ca, CaError};
use coxswain_api::names::{CA_SECRET, FIELD_MANAGER, TRUST_BUNDLE_CONFIGMAP};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};

/// Who provides the CA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CaMode {
    /// Create the CA Secret when it is absent.
    Auto,
    /// Someone else (cert-manager, an operator's own PKI) provides it; fail closed without it.
    External,
}

#[derive(Debug, thiserror::Error)]
pub enum CaStoreError {
    #[error("Secret {namespace}/{CA_SECRET} does not exist and --ca-mode is external")]
    Missing { namespace: String },
    #[error("Secret {namespace}/{CA_SECRET} has no {key}")]
    Incomplete {
        namespace: String,
        key: &'static str,
    },
    #[error("Secret {namespace}/{CA_SECRET}: {source}")]
    Invalid {
        namespace: String,
        #[source]
        source: CaError,
    },
    #[error("generating the CA: {0}")]
    Generate(#[source] CaError),
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
}

/// Loads the CA from its Secret, creating it first in `auto` mode. Replicas racing to create it
/// converge on whichever Secret the API server stored first.
pub async fn load_or_create(
    client: &Client,
    namespace: &str,
    trust_domain: &str,
    mode: CaMode,
) -> Result<Ca, CaStoreError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    if let Some(secret) = secrets.get_opt(CA_SECRET).await? {
        return from_secret(namespace, &secret);
    }
    if mode == CaMode::External {
        return Err(CaStoreError::Missing {
            namespace: namespace.to_owned(),
        });
    }
    let ca = Ca::generate(trust_domain, time::OffsetDateTime::now_utc())
        .map_err(CaStoreError::Generate)?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(CA_SECRET.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(
                [(
                    coxswain_api::names::labels::MANAGED_BY.to_owned(),
                    coxswain_api::names::labels::MANAGED_BY_VALUE.to_owned(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        data: Some(
            [
                (
                    "tls.crt".to_owned(),
                    ByteString(ca.cert_pem().as_bytes().to_vec()),
                ),
                (
                    "tls.key".to_owned(),
                    ByteString(ca.key_pem().as_bytes().to_vec()),
                ),
            ]
            .into(),
        ),
        ..Default::default()
    };
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => {
            tracing::info!(namespace, secret = CA_SECRET, "discovery CA created");
            Ok(ca)
        }
        // Another replica won the race: use its CA.
        Err(kube::Error::Api(e)) if e.code == 409 => {
            from_secret(namespace, &secrets.get(CA_SECRET).await?)
        }
        Err(e) => Err(e.into()),
    }
}

fn from_secret(namespace: &str, secret: &Secret) -> Result<Ca, CaStoreError> {
    let field = |key: &'static str| -> Result<String, CaStoreError> {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .ok_or_else(|| CaStoreError::Incomplete {
                namespace: namespace.to_owned(),
                key,
            })
    };
    Ca::from_pem(&field("tls.crt")?, &field("tls.key")?).map_err(|source| CaStoreError::Invalid {
        namespace: namespace.to_owned(),
        source,
    })
}

/// Publishes the CA certificate (never the key) for proxies to mount as their trust bundle.
pub async fn publish_trust_bundle(
    client: &Client,
    namespace: &str,
    ca: &Ca,
) -> Result<(), CaStoreError> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(TRUST_BUNDLE_CONFIGMAP.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..Default::default()
        },
        data: Some([("ca.crt".to_owned(), ca.cert_pem().to_owned())].into()),
        ..Default::default()
    };
    maps.patch(
        TRUST_BUNDLE_CONFIGMAP,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&cm),
    )
    .await?;
    Ok(())
}
