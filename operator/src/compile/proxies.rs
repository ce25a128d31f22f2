//! Dedicated proxies: the names of their objects (ServiceAccount, Deployment, Service, ...),
//! and which ServiceAccount's proxies may serve each scope ([`ProxyAccounts`]). Both are pure
//! functions of the objects and the compiled Gateways, so the compiler decides them; the
//! controller loop hands them to provisioning, discovery and the bootstrap allowlist.
//!
//! GEP-1762 names them `{gateway}-{gatewayclass}`, which is ambiguous: Gateway `a-b` of class
//! `c` and Gateway `a` of class `b-c` both give `a-b-c`. Two Gateways sharing objects would
//! overwrite each other's proxy, and share one SPIFFE identity. So the names are assigned per
//! namespace, over every dedicated Gateway at once:
//!
//! - a Gateway whose proxy Service already carries the plain name keeps it (a running proxy is
//!   never renamed because another Gateway appeared or became dedicated);
//! - otherwise the oldest Gateway (creationTimestamp, then name) gets it;
//! - every other Gateway wanting that name gets [`names::disambiguated_proxy_name`] (the plain
//!   name, cut to fit a DNS label, plus a hash of its own Gateway and class names) and a status
//!   condition naming the Gateway that holds the plain name.
//!
//! When the conflict goes away the renamed Gateway gets its plain name back (and loses the
//! condition).

use super::status::{ObjectKey, ScopeKey};
use super::store::Store;
use coxswain_api::names::{self, labels};
use gateway_api::apis::standard::gateways::Gateway;
use std::collections::{BTreeMap, BTreeSet};

/// Condition type on a Gateway whose proxy objects could not take their GEP-1762 name. Like
/// Gateway API's `Conflicted`, True is the bad state; it is absent when there is no conflict.
pub const NAME_CONFLICTED: &str = "gateway.coxswain-labs.dev/ProxyNameConflicted";
/// Reason of [`NAME_CONFLICTED`].
pub const NAME_TAKEN: &str = "NameTaken";

/// The objects' name of one dedicated Gateway's proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyName {
    pub name: String,
    /// Set when the GEP-1762 name was taken and `name` is a disambiguated one.
    pub conflict: Option<NameConflict>,
}

/// Who holds the GEP-1762 name a Gateway wanted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameConflict {
    /// The GEP-1762 name.
    pub wanted: String,
    /// The Gateway (same namespace) whose proxy holds it.
    pub holder: String,
    pub holder_class: String,
}

impl ProxyName {
    /// The [`NAME_CONFLICTED`] condition's message, when there is a conflict: what happened
    /// and what a person can do about it.
    pub fn conflict_message(&self) -> Option<String> {
        let c = self.conflict.as_ref()?;
        Some(format!(
            "the proxy objects' GEP-1762 name {wanted} (ServiceAccount, Deployment, Service) \
             is already used by Gateway {holder} of GatewayClass {class}, so this Gateway's are \
             named {name}; rename one of the two Gateways to give both their plain names",
            wanted = c.wanted,
            holder = c.holder,
            class = c.holder_class,
            name = self.name,
        ))
    }
}

/// The names of every dedicated Gateway's proxy, by Gateway.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyNames {
    by_gateway: BTreeMap<ObjectKey, ProxyName>,
}

impl ProxyNames {
    pub fn get(&self, namespace: &str, gateway: &str) -> Option<&ProxyName> {
        self.by_gateway.get(&ObjectKey::new(namespace, gateway))
    }

    pub fn iter(&self) -> impl Iterator<Item = (&ObjectKey, &ProxyName)> {
        self.by_gateway.iter()
    }

    /// Whether a Gateway named in both has another name in `next`: its objects must be
    /// re-rendered (new Gateways are picked up by their own reconcile).
    pub fn renamed_in(&self, next: &Self) -> bool {
        self.by_gateway.iter().any(|(key, old)| {
            next.by_gateway
                .get(key)
                .is_some_and(|new| new.name != old.name)
        })
    }
}

/// Assigns names to the Gateways of `store` for which `dedicated` holds.
pub fn assign(store: &Store, dedicated: impl Fn(&ObjectKey) -> bool) -> ProxyNames {
    // Which Gateway's proxy Service holds each name now, per namespace.
    let holders: BTreeMap<(&str, &str), &str> = store
        .services
        .iter()
        .filter_map(|svc| {
            let labels = svc.metadata.labels.as_ref()?;
            if labels.get(labels::COMPONENT).map(String::as_str)
                != Some(labels::COMPONENT_DEDICATED_PROXY)
            {
                return None;
            }
            Some((
                (
                    svc.metadata.namespace.as_deref()?,
                    svc.metadata.name.as_deref()?,
                ),
                labels.get(labels::GATEWAY_NAME)?.as_str(),
            ))
        })
        .collect();
    let mut by_namespace: BTreeMap<&str, Vec<&Gateway>> = BTreeMap::new();
    for gw in &store.gateways {
        let (Some(ns), Some(name)) = (
            gw.metadata.namespace.as_deref(),
            gw.metadata.name.as_deref(),
        ) else {
            continue;
        };
        if dedicated(&ObjectKey::new(ns, name)) {
            by_namespace.entry(ns).or_default().push(gw);
        }
    }
    let mut out = ProxyNames::default();
    for (ns, mut gateways) in by_namespace {
        let plain = |gw: &Gateway| {
            names::dedicated_proxy_name(
                gw.metadata.name.as_deref().unwrap_or_default(),
                &gw.spec.gateway_class_name,
            )
        };
        let holds = |gw: &Gateway| {
            holders.get(&(ns, plain(gw).as_str())).copied() == gw.metadata.name.as_deref()
        };
        gateways.sort_by(|a, b| {
            holds(b)
                .cmp(&holds(a))
                .then_with(|| super::store::oldest_first(&a.metadata, &b.metadata))
                .then_with(|| a.metadata.name.cmp(&b.metadata.name))
        });
        let mut taken: BTreeMap<String, &Gateway> = BTreeMap::new();
        // A plain name is reserved for whoever wants it first in this order, even when an
        // earlier Gateway's disambiguated name happens to equal it.
        let mut wanted: BTreeSet<String> = BTreeSet::new();
        for gw in &gateways {
            wanted.insert(plain(gw));
        }
        for gw in gateways {
            let gw_name = gw.metadata.name.as_deref().unwrap_or_default();
            let class = gw.spec.gateway_class_name.as_str();
            let want = plain(gw);
            let proxy = match taken.get(&want) {
                None => ProxyName {
                    name: want.clone(),
                    conflict: None,
                },
                Some(holder) => {
                    let name = (0..)
                        .map(|attempt| names::disambiguated_proxy_name(gw_name, class, attempt))
                        .find(|n| !taken.contains_key(n) && !wanted.contains(n))
                        .unwrap_or_default();
                    ProxyName {
                        name,
                        conflict: Some(NameConflict {
                            wanted: want.clone(),
                            holder: holder.metadata.name.clone().unwrap_or_default(),
                            holder_class: holder.spec.gateway_class_name.clone(),
                        }),
                    }
                }
            };
            taken.insert(proxy.name.clone(), gw);
            out.by_gateway.insert(ObjectKey::new(ns, gw_name), proxy);
        }
    }
    out
}

/// The ServiceAccount (namespace/name) whose proxies may serve each scope: the shared pool's,
/// and each dedicated Gateway's, named as its proxy objects are. Only these identities get
/// SVIDs, and each only its own scope's snapshots.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyAccounts {
    by_scope: BTreeMap<ScopeKey, ObjectKey>,
}

impl ProxyAccounts {
    pub fn new(shared_pool: ObjectKey, names: &ProxyNames) -> Self {
        let mut by_scope = BTreeMap::new();
        by_scope.insert(ScopeKey::SharedPool, shared_pool);
        for (gateway, proxy) in names.iter() {
            by_scope.insert(
                ScopeKey::Gateway(gateway.clone()),
                ObjectKey::new(&gateway.namespace, &proxy.name),
            );
        }
        Self { by_scope }
    }

    pub fn get(&self, scope: &ScopeKey) -> Option<&ObjectKey> {
        self.by_scope.get(scope)
    }

    /// Every scope with its ServiceAccount.
    pub fn iter(&self) -> impl Iterator<Item = (&ScopeKey, &ObjectKey)> {
        self.by_scope.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use std::sync::Arc;

    fn gateway(ns: &str, name: &str, class: &str, created_secs: i64) -> Arc<Gateway> {
        let mut gw: Gateway = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"gatewayClassName": class, "listeners": []},
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        gw.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(created_secs)
                .unwrap_or_else(|e| panic!("{e}")),
        ));
        Arc::new(gw)
    }

    fn proxy_service(ns: &str, name: &str, gateway: &str) -> Arc<Service> {
        Arc::new(Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                labels: Some(
                    [
                        (
                            labels::COMPONENT.to_owned(),
                            labels::COMPONENT_DEDICATED_PROXY.to_owned(),
                        ),
                        (labels::GATEWAY_NAME.to_owned(), gateway.to_owned()),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    fn all(_: &ObjectKey) -> bool {
        true
    }

    #[test]
    fn distinct_gateways_keep_their_gep_1762_names() {
        let store = Store {
            gateways: vec![
                gateway("web", "edge", "coxswain", 1),
                gateway("web", "api", "coxswain", 2),
                // The same plain name in another namespace is no conflict.
                gateway("other", "edge", "coxswain", 0),
            ]
            .into(),
            ..Default::default()
        };
        let names = assign(&store, all);
        for (ns, gw) in [("web", "edge"), ("web", "api"), ("other", "edge")] {
            let n = names.get(ns, gw).unwrap_or_else(|| panic!("{ns}/{gw}"));
            assert_eq!(n.name, format!("{gw}-coxswain"));
            assert_eq!(n.conflict, None);
        }
    }

    #[test]
    fn colliding_gateways_get_distinct_names_and_the_newer_one_is_told() {
        let store = Store {
            gateways: vec![
                gateway("web", "a", "b-c", 20),
                gateway("web", "a-b", "c", 10),
            ]
            .into(),
            ..Default::default()
        };
        let names = assign(&store, all);
        let older = names.get("web", "a-b").unwrap_or_else(|| panic!());
        let newer = names.get("web", "a").unwrap_or_else(|| panic!());
        assert_eq!(older.name, "a-b-c");
        assert_eq!(older.conflict, None);
        assert_eq!(newer.name, names::disambiguated_proxy_name("a", "b-c", 0));
        assert_ne!(newer.name, older.name);
        let message = newer.conflict_message().unwrap_or_default();
        assert!(
            message.contains("a-b-c") && message.contains("Gateway a-b of GatewayClass c"),
            "{message}"
        );
        assert!(message.contains(&newer.name), "{message}");
    }

    #[test]
    fn the_gateway_whose_proxy_holds_the_name_keeps_it() {
        // `a` is older but became dedicated after `a-b`'s proxy was created: `a-b` keeps it.
        let store = Store {
            gateways: [
                gateway("web", "a", "b-c", 10),
                gateway("web", "a-b", "c", 20),
            ]
            .into(),
            services: vec![proxy_service("web", "a-b-c", "a-b")].into(),
            ..Default::default()
        };
        let names = assign(&store, all);
        assert_eq!(
            names.get("web", "a-b").map(|n| n.name.as_str()),
            Some("a-b-c")
        );
        assert!(names.get("web", "a").is_some_and(|n| n.conflict.is_some()));
    }

    #[test]
    fn only_dedicated_gateways_take_names_and_renames_are_detected() {
        let store = Store {
            gateways: vec![
                gateway("web", "a-b", "c", 10),
                gateway("web", "a", "b-c", 20),
            ]
            .into(),
            ..Default::default()
        };
        let both = assign(&store, all);
        let only_newer = assign(&store, |k: &ObjectKey| k.name == "a");
        assert_eq!(only_newer.get("web", "a-b"), None);
        assert_eq!(
            only_newer.get("web", "a").map(|n| n.name.as_str()),
            Some("a-b-c"),
            "no conflict once the other Gateway is not dedicated"
        );
        assert!(both.renamed_in(&only_newer));
        assert!(!both.renamed_in(&both));
        assert!(
            !ProxyNames::default().renamed_in(&both),
            "new ones are not renames"
        );
    }

    #[test]
    fn every_scope_gets_the_service_account_of_its_proxies() {
        let store = Store {
            gateways: vec![
                gateway("web", "a-b", "c", 10),
                gateway("web", "a", "b-c", 20),
            ]
            .into(),
            ..Default::default()
        };
        let names = assign(&store, all);
        let shared = ObjectKey::new("coxswain-system", "coxswain-proxy");
        let accounts = ProxyAccounts::new(shared.clone(), &names);
        let gateway_scope = |name: &str| ScopeKey::Gateway(ObjectKey::new("web", name));
        assert_eq!(accounts.get(&ScopeKey::SharedPool), Some(&shared));
        assert_eq!(
            accounts.get(&gateway_scope("a-b")),
            Some(&ObjectKey::new("web", "a-b-c"))
        );
        // The renamed proxy's ServiceAccount carries its disambiguated name.
        let renamed = names.get("web", "a").map(|n| n.name.clone());
        assert_eq!(
            accounts.get(&gateway_scope("a")).map(|a| a.name.clone()),
            renamed
        );
        assert_eq!(accounts.iter().count(), 3);
    }
}
