//! Where each JWT provider's JWKS document comes from: a ConfigMap or Secret in the policy's
//! namespace, or a URL. The controller fetches URLs (`crate::jwks`, outside the compiler) and
//! hands the results in as plain data (`Store::remote_jwks`); the compiler never does I/O, so
//! a remote provider compiles exactly like a ConfigMap one once its document is there.

use super::backendtls::ca_bundle;
use super::store::{JwksSource, Store};
use coxswain_api::crd::accesspolicy::{JwksRef, RemoteJwks};
use std::collections::BTreeMap;
use std::time::Duration;

/// The key of the JWKS document when a provider's jwks names none.
pub const DEFAULT_JWKS_KEY: &str = "jwks.json";
/// The key of a remote JWKS's CA bundle when its caBundle names none.
pub const DEFAULT_CA_KEY: &str = "ca.crt";
/// How often a remote JWKS is fetched when its policy does not say.
pub const DEFAULT_REFRESH_SECONDS: u32 = 300;
/// The CRD's floor for refreshSeconds, applied to policies read from files too.
pub const MIN_REFRESH_SECONDS: u32 = 30;

/// How a provider's JWKS is named in messages, and its document or why there is none.
pub fn document(store: &Store, ns: &str, jwks: &JwksRef) -> (String, Result<String, String>) {
    match (&jwks.remote, &jwks.name) {
        (Some(remote), _) => {
            let found = source(store, ns, remote).and_then(|s| match store.remote_jwks.get(&s) {
                Some(Ok(document)) => Ok(document.clone()),
                Some(Err(why)) => Err(format!("fetching it failed: {why}")),
                None => Err("not fetched yet".to_owned()),
            });
            (remote.uri.clone(), found)
        }
        (None, Some(name)) => {
            let key = jwks.key.as_deref().unwrap_or(DEFAULT_JWKS_KEY);
            let kind = jwks.kind.as_deref().unwrap_or("ConfigMap");
            (
                format!("{kind} {ns}/{name} key {key:?}"),
                stored_document(store, ns, kind, name, key),
            )
        }
        (None, None) => (
            "jwks".to_owned(),
            Err("names neither a ConfigMap or Secret nor a remote URL".to_owned()),
        ),
    }
}

/// What to fetch for a remote JWKS of a policy in `ns`: its URL checked, its CA bundle read.
pub fn source(store: &Store, ns: &str, remote: &RemoteJwks) -> Result<JwksSource, String> {
    check_uri(&remote.uri)?;
    let ca_pem = match &remote.ca_bundle {
        None => None,
        Some(ca) => Some(ca_bundle(
            store,
            ns,
            &ca.name,
            ca.key.as_deref().unwrap_or(DEFAULT_CA_KEY),
        )?),
    };
    Ok(JwksSource {
        uri: remote.uri.clone(),
        ca_pem,
    })
}

/// Every remote JWKS some policy names and can be fetched, with how often: the shortest
/// refresh any of those policies asks for.
pub fn sources(store: &Store) -> BTreeMap<JwksSource, Duration> {
    let mut out: BTreeMap<JwksSource, Duration> = BTreeMap::new();
    for policy in &store.access_policies {
        let ns = policy.metadata.namespace.as_deref().unwrap_or_default();
        let providers = policy.spec.jwt.iter().flat_map(|j| &j.providers);
        for remote in providers.filter_map(|p| p.jwks.remote.as_ref()) {
            // A source that cannot be fetched is reported by the policy's compile instead.
            let Ok(source) = source(store, ns, remote) else {
                continue;
            };
            let seconds = remote
                .refresh_seconds
                .unwrap_or(DEFAULT_REFRESH_SECONDS)
                .max(MIN_REFRESH_SECONDS);
            let every = Duration::from_secs(seconds.into());
            out.entry(source)
                .and_modify(|d| *d = (*d).min(every))
                .or_insert(every);
        }
    }
    out
}

/// The CRD's pattern, checked again for policies read from files: https, a host, no user
/// information (credentials would end up in logs and status messages).
fn check_uri(uri: &str) -> Result<(), String> {
    let parsed: hyper::Uri = uri.parse().map_err(|e| format!("{uri:?}: {e}"))?;
    if parsed.scheme_str() != Some("https") {
        return Err(format!("{uri:?} is not an https URL"));
    }
    match parsed.authority() {
        Some(a) if a.as_str().contains('@') => {
            Err(format!("{uri:?}: user information is not allowed"))
        }
        Some(a) if !a.host().is_empty() => Ok(()),
        _ => Err(format!("{uri:?} has no host")),
    }
}

/// The text of `key` in a ConfigMap or Secret of `ns`.
fn stored_document(
    store: &Store,
    ns: &str,
    kind: &str,
    name: &str,
    key: &str,
) -> Result<String, String> {
    let here = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        m.namespace.as_deref() == Some(ns) && m.name.as_deref() == Some(name)
    };
    let text = if kind == "Secret" {
        let secret = store
            .secrets
            .iter()
            .find(|s| here(&s.metadata))
            .ok_or("not found")?;
        secret
            .string_data
            .as_ref()
            .and_then(|d| d.get(key).cloned())
            .or_else(|| {
                secret
                    .data
                    .as_ref()
                    .and_then(|d| d.get(key))
                    .and_then(|v| String::from_utf8(v.0.clone()).ok())
            })
    } else {
        let cm = store
            .config_maps
            .iter()
            .find(|c| here(&c.metadata))
            .ok_or("not found")?;
        cm.data.as_ref().and_then(|d| d.get(key).cloned())
    };
    text.ok_or_else(|| "has no such text key".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_https_urls_with_a_host_and_no_credentials_are_fetched() {
        assert_eq!(check_uri("https://idp.example/keys"), Ok(()));
        assert_eq!(check_uri("https://10.0.0.1:8443/jwks?v=1"), Ok(()));
        for bad in [
            "http://idp.example/keys",
            "https://user:pw@idp.example/keys",
            "idp.example/keys",
            "https:///keys",
        ] {
            assert!(check_uri(bad).is_err(), "{bad}");
        }
    }
}
