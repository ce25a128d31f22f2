//! Status of Coxswain's own kinds: whether a CoxswainGatewayParameters or
//! CoxswainIngressClassParameters is usable as written (`Accepted`, with a reason and a message
//! a person can act on), the generation that was judged, and which classes and Gateways use it.
//!
//! Decided from the same cached objects the compiler reads, outside the compiler: the
//! parameters shape provisioning and Ingress defaults, not routing snapshots. The rules are the
//! ones those consumers apply (`provision::render` for podTemplate and autoscaling,
//! `compile::annotations` for default annotations, `compile::ingress::class_parameters` for
//! IngressClass references), called rather than restated.
//!
//! Parameters that only another controller's classes use are left to that controller; unused
//! ones are judged too, so `kubectl get` shows whether they would be accepted.

use crate::compile::Store;
use crate::compile::status::{Condition, ConditionStatus, ObjectKey};
use crate::provision::render;
use crate::status::{existing_conditions, render_conditions};
use coxswain_api::{
    CoxswainGatewayParameters, CoxswainGatewayParametersSpec, CoxswainIngressClassParameters,
    NamespacedName, names,
};
use gateway_api::apis::standard::gatewayclasses::GatewayClass;
use gateway_api::apis::standard::gateways::Gateway;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

pub const ACCEPTED: &str = "Accepted";
/// Reasons of `Accepted`.
pub mod reason {
    pub const ACCEPTED: &str = "Accepted";
    pub const INVALID_POD_TEMPLATE: &str = "InvalidPodTemplate";
    pub const AUTOSCALING_WITHOUT_MAX: &str = "AutoscalingWithoutMax";
    pub const INVALID_CLIENT_ADDRESS: &str = "InvalidClientAddress";
    pub const INVALID_TRACING: &str = "InvalidTracing";
    pub const INVALID_DEFAULT_ANNOTATIONS: &str = "InvalidDefaultAnnotations";
}
/// Longest list of users in a status (the CRD schema's `maxItems`).
pub const MAX_USERS: usize = 64;

/// What one CoxswainGatewayParameters is told.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayParametersStatus {
    pub accepted: Condition,
    pub generation: i64,
    pub gateway_classes: Vec<String>,
    pub gateways: Vec<NamespacedName>,
}

/// What one CoxswainIngressClassParameters is told.
#[derive(Debug, Clone, PartialEq)]
pub struct IngressClassParametersStatus {
    pub accepted: Condition,
    pub generation: i64,
    pub ingress_classes: Vec<String>,
}

/// Statuses of every parameters object in the store.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParametersStatuses {
    pub gateway: BTreeMap<ObjectKey, GatewayParametersStatus>,
    pub ingress_class: BTreeMap<ObjectKey, IngressClassParametersStatus>,
}

fn is_ours(group: &str, kind: &str) -> bool {
    group == names::GATEWAY_GROUP && kind == "CoxswainGatewayParameters"
}

/// The CoxswainGatewayParameters a GatewayClass of ours refers to, if it names one.
fn class_ref(class: &GatewayClass) -> Option<ObjectKey> {
    let p = class.spec.parameters_ref.as_ref()?;
    if !is_ours(&p.group, &p.kind) {
        return None;
    }
    Some(ObjectKey::new(p.namespace.as_deref()?, p.name.as_str()))
}

/// The CoxswainGatewayParameters a Gateway refers to itself (always in its own namespace).
fn gateway_ref(gateway: &Gateway) -> Option<ObjectKey> {
    let p = gateway
        .spec
        .infrastructure
        .as_ref()?
        .parameters_ref
        .as_ref()?;
    if !is_ours(&p.group, &p.kind) {
        return None;
    }
    Some(ObjectKey::new(
        gateway.metadata.namespace.as_deref()?,
        p.name.as_str(),
    ))
}

fn key_of(meta: &kube::api::ObjectMeta) -> Option<ObjectKey> {
    Some(ObjectKey::new(
        meta.namespace.as_deref()?,
        meta.name.as_deref()?,
    ))
}

/// Decides the status of every parameters object. `controller_name` picks the classes that are
/// ours; `ingress_nginx_compat` reads default annotations the way the compiler does.
pub fn decide(
    store: &Store,
    controller_name: &str,
    ingress_nginx_compat: bool,
) -> ParametersStatuses {
    let gateway_params: BTreeMap<ObjectKey, &CoxswainGatewayParameters> = store
        .gateway_parameters
        .iter()
        .filter_map(|p| Some((key_of(&p.metadata)?, &**p)))
        .collect();
    // Parameters that only another controller's classes use are that controller's to judge.
    let foreign_classes: BTreeSet<&str> = store
        .gateway_classes
        .iter()
        .filter(|c| c.spec.controller_name != controller_name)
        .filter_map(|c| c.metadata.name.as_deref())
        .collect();
    let mut foreign: BTreeSet<ObjectKey> = store
        .gateway_classes
        .iter()
        .filter(|c| c.spec.controller_name != controller_name)
        .filter_map(|c| class_ref(c))
        .collect();
    foreign.extend(
        store
            .gateways
            .iter()
            .filter(|g| foreign_classes.contains(g.spec.gateway_class_name.as_str()))
            .filter_map(|g| gateway_ref(g)),
    );
    // Our classes and the parameters each names.
    let classes: BTreeMap<&str, Option<ObjectKey>> = store
        .gateway_classes
        .iter()
        .filter(|c| c.spec.controller_name == controller_name)
        .filter_map(|c| Some((c.metadata.name.as_deref()?, class_ref(c))))
        .collect();
    let mut class_users: BTreeMap<ObjectKey, BTreeSet<String>> = BTreeMap::new();
    for (name, key) in &classes {
        if let Some(key) = key {
            class_users
                .entry(key.clone())
                .or_default()
                .insert((*name).to_owned());
        }
    }
    // Every Gateway of ours that uses parameters, with both layers as provisioning merges them.
    let mut gateway_users: BTreeMap<ObjectKey, BTreeSet<ObjectKey>> = BTreeMap::new();
    let mut autoscaling_without_max: BTreeMap<ObjectKey, Vec<ObjectKey>> = BTreeMap::new();
    for gw in store.gateways.iter() {
        let Some(class_params) = classes.get(gw.spec.gateway_class_name.as_str()) else {
            continue;
        };
        let Some(gw_key) = key_of(&gw.metadata) else {
            continue;
        };
        let own = gateway_ref(gw);
        let layers = [class_params.clone(), own];
        let specs: Vec<Option<&CoxswainGatewayParametersSpec>> = layers
            .iter()
            .map(|k| {
                k.as_ref()
                    .and_then(|k| gateway_params.get(k))
                    .map(|p| &p.spec)
            })
            .collect();
        let effective = render::effective(specs[0], specs[1]);
        let without_max = effective
            .autoscaling
            .as_ref()
            .is_some_and(|a| a.enabled == Some(true) && a.max_replicas.is_none());
        for key in layers.into_iter().flatten() {
            gateway_users
                .entry(key.clone())
                .or_default()
                .insert(gw_key.clone());
            if without_max {
                autoscaling_without_max
                    .entry(key)
                    .or_default()
                    .push(gw_key.clone());
            }
        }
    }

    let mut out = ParametersStatuses::default();
    for (key, params) in &gateway_params {
        let users = gateway_users.get(key);
        if users.is_none() && !class_users.contains_key(key) && foreign.contains(key) {
            continue;
        }
        let generation = params.metadata.generation.unwrap_or(0);
        let gateway_classes: Vec<String> = class_users
            .get(key)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        let gateways: Vec<NamespacedName> = users
            .into_iter()
            .flatten()
            .take(MAX_USERS)
            .map(|k| NamespacedName {
                namespace: k.namespace.clone(),
                name: k.name.clone(),
            })
            .collect();
        let in_use = describe_users(&gateway_classes, users.map_or(0, BTreeSet::len));
        let layer = format!("CoxswainGatewayParameters {key}");
        let accepted = if let Err(e) = render::merge_pod_templates(
            Default::default(),
            &[(layer.as_str(), Some(&params.spec))],
            false,
            "coxswain-proxy",
        ) {
            Condition::new(
                ACCEPTED,
                false,
                reason::INVALID_POD_TEMPLATE,
                format!(
                    "{e}; fix spec.podTemplate: until then the dedicated proxies of the \
                     Gateways that use these parameters are not updated ({in_use})"
                ),
                generation,
            )
        } else if let Err(e) = render::check_client_address(&[(layer.as_str(), Some(&params.spec))])
        {
            Condition::new(
                ACCEPTED,
                false,
                reason::INVALID_CLIENT_ADDRESS,
                format!(
                    "{e}; fix spec.clientAddress.trustedProxies: until then the dedicated proxies \
                     of the Gateways that use these parameters are not updated ({in_use})"
                ),
                generation,
            )
        } else if let Err(e) = render::check_tracing(&[(layer.as_str(), Some(&params.spec))]) {
            Condition::new(
                ACCEPTED,
                false,
                reason::INVALID_TRACING,
                format!(
                    "{e}; fix spec.tracing: until then the dedicated proxies of the Gateways \
                     that use these parameters are not updated ({in_use})"
                ),
                generation,
            )
        } else if let Some(gws) = autoscaling_without_max.get(key) {
            Condition::new(
                ACCEPTED,
                false,
                reason::AUTOSCALING_WITHOUT_MAX,
                format!(
                    "autoscaling is enabled but neither these parameters nor the other layer \
                     set maxReplicas for Gateway {}; set spec.autoscaling.maxReplicas",
                    list(gws.iter().map(ToString::to_string))
                ),
                generation,
            )
        } else {
            Condition::new(ACCEPTED, true, reason::ACCEPTED, in_use, generation)
        };
        out.gateway.insert(
            key.clone(),
            GatewayParametersStatus {
                accepted,
                generation,
                gateway_classes: gateway_classes.into_iter().take(MAX_USERS).collect(),
                gateways,
            },
        );
    }

    // IngressClasses of ours and the parameters each resolves to, as the compiler resolves
    // them (a wrong or dangling reference is reported on the IngressClass).
    let mut ingress_users: BTreeMap<ObjectKey, BTreeSet<String>> = BTreeMap::new();
    let mut foreign_ingress: BTreeSet<ObjectKey> = BTreeSet::new();
    for class in store.ingress_classes.iter() {
        let Some(name) = class.metadata.name.as_deref() else {
            continue;
        };
        let Ok(Some(params)) = crate::compile::ingress::class_parameters(store, class) else {
            continue;
        };
        let Some(key) = key_of(&params.metadata) else {
            continue;
        };
        let ours =
            class.spec.as_ref().and_then(|s| s.controller.as_deref()) == Some(controller_name);
        if ours {
            ingress_users
                .entry(key)
                .or_default()
                .insert(name.to_owned());
        } else {
            foreign_ingress.insert(key);
        }
    }
    for params in store.ingress_class_parameters.iter() {
        let Some(key) = key_of(&params.metadata) else {
            continue;
        };
        if !ingress_users.contains_key(&key) && foreign_ingress.contains(&key) {
            continue;
        }
        let generation = params.metadata.generation.unwrap_or(0);
        let classes: Vec<String> = ingress_users
            .get(&key)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        let (_, warnings) = crate::compile::annotations::parse(
            &BTreeMap::new(),
            &params.spec.default_annotations,
            ingress_nginx_compat,
        );
        let accepted = if warnings.is_empty() {
            let message = if classes.is_empty() {
                "valid; no IngressClass of Coxswain refers to these parameters".to_owned()
            } else {
                format!("in use by IngressClass {}", list(classes.iter().cloned()))
            };
            Condition::new(ACCEPTED, true, reason::ACCEPTED, message, generation)
        } else {
            let problems = list(
                warnings
                    .iter()
                    .map(|w| format!("{}: {}", w.annotation, w.reason)),
            );
            Condition::new(
                ACCEPTED,
                false,
                reason::INVALID_DEFAULT_ANNOTATIONS,
                format!(
                    "spec.defaultAnnotations not applied as written: {problems}; fix or remove \
                     them (the other defaults apply)"
                ),
                generation,
            )
        };
        out.ingress_class.insert(
            key,
            IngressClassParametersStatus {
                accepted,
                generation,
                ingress_classes: classes.into_iter().take(MAX_USERS).collect(),
            },
        );
    }
    out
}

/// Writes the decided statuses by server-side apply (field manager `coxswain-controller`),
/// leader only, skipping objects that already carry them; each condition change a person
/// should see (a problem, or its fix) becomes an Event on the object.
pub struct ParametersStatusWriter {
    client: kube::Client,
    controller_name: String,
    ingress_nginx_compat: bool,
    leader: Arc<AtomicBool>,
    admin: Arc<crate::admin::State>,
    recorder: Recorder,
    /// (status, reason, used) last reported per object, so each transition is told once.
    reported: HashMap<String, Told>,
}

/// What an object's Accepted condition was when last written, and whether a class or Gateway
/// of ours used it then.
type Told = (ConditionStatus, &'static str, bool);

impl ParametersStatusWriter {
    pub fn new(
        client: kube::Client,
        controller_name: String,
        ingress_nginx_compat: bool,
        leader: Arc<AtomicBool>,
        admin: Arc<crate::admin::State>,
        instance: Option<String>,
    ) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: names::FIELD_MANAGER.to_owned(),
                instance,
            },
        );
        Self {
            client,
            controller_name,
            ingress_nginx_compat,
            leader,
            admin,
            recorder,
            reported: HashMap::new(),
        }
    }

    fn leading(&self) -> bool {
        self.leader.load(Ordering::Acquire)
    }

    pub async fn write(&mut self, store: &Store) {
        if !self.leading() {
            // A standby tells nothing; when it takes over it compares with the objects.
            self.reported.clear();
            return;
        }
        let decided = decide(store, &self.controller_name, self.ingress_nginx_compat);
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let mut reported = HashMap::new();
        for params in store.gateway_parameters.iter() {
            let Some(d) = key_of(&params.metadata).and_then(|k| decided.gateway.get(&k)) else {
                continue;
            };
            let lists = json!({"gatewayClasses": d.gateway_classes, "gateways": d.gateways});
            let current = params
                .status
                .as_ref()
                .and_then(|s| serde_json::to_value(s).ok());
            let decision = (&d.accepted, d.generation, lists);
            self.write_one::<CoxswainGatewayParameters>(
                &mut reported,
                params,
                current,
                decision,
                &now,
            )
            .await;
        }
        for params in store.ingress_class_parameters.iter() {
            let Some(d) = key_of(&params.metadata).and_then(|k| decided.ingress_class.get(&k))
            else {
                continue;
            };
            let lists = json!({"ingressClasses": d.ingress_classes});
            let current = params
                .status
                .as_ref()
                .and_then(|s| serde_json::to_value(s).ok());
            let decision = (&d.accepted, d.generation, lists);
            self.write_one::<CoxswainIngressClassParameters>(
                &mut reported,
                params,
                current,
                decision,
                &now,
            )
            .await;
        }
        self.reported = reported;
    }

    /// One object: an Event when Accepted changed since last told, then the status apply
    /// unless the object already carries it. `lists`: the kind's users (empty ones are left
    /// out, as the API server would prune them).
    async fn write_one<K>(
        &self,
        reported: &mut HashMap<String, Told>,
        object: &K,
        current: Option<Value>,
        (accepted, generation, lists): (&Condition, i64, Value),
        now: &str,
    ) where
        K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + ParametersKind
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let meta = object.meta();
        let (Some(ns), Some(name)) = (meta.namespace.as_deref(), meta.name.as_deref()) else {
            return;
        };
        // 'static for the metrics' label.
        let kind: &'static str = K::KIND;
        let existing = existing_conditions(current.clone());
        let key = format!("{kind}/{ns}/{name}");
        // Events only for objects a class or Gateway of ours uses. An object nothing uses yet
        // may be another controller's whose class has not reached our cache (both arrive by
        // separate watches): telling about it would put a second, foreign Event on it. When a
        // class of ours starts using it, that is a change, and its state is told then.
        let used = lists.as_object().is_some_and(|m| {
            m.values()
                .any(|l| l.as_array().is_some_and(|a| !a.is_empty()))
        });
        let told = (accepted.status, accepted.reason, used);
        // Whether the status the object carries was written while something of ours used it,
        // i.e. when its condition was also told.
        let carried_used = current.as_ref().is_some_and(|c| {
            lists.as_object().is_some_and(|m| {
                m.keys()
                    .any(|field| c[field.as_str()].as_array().is_some_and(|a| !a.is_empty()))
            })
        });
        let changed = match self.reported.get(&key) {
            Some(before) => *before != told,
            // First sight (a start, or a new leader): what the object carries is what was told,
            // unless it was written while nothing used the object (then nothing was told).
            None => {
                !carried_used
                    || !existing.iter().any(|e| {
                        e["type"] == ACCEPTED
                            && e["reason"] == accepted.reason
                            && e["status"] == condition_status(accepted.status)
                    })
            }
        };
        reported.insert(key, told);
        if changed && used {
            self.announce(object.object_ref(&()), accepted, &existing);
        }
        let mut status = json!({
            "conditions": render_conditions(std::slice::from_ref(accepted), &existing, now),
            "observedGeneration": generation,
        });
        if let (Some(out), Some(lists)) = (status.as_object_mut(), lists.as_object()) {
            for (field, list) in lists {
                if list.as_array().is_some_and(|l| !l.is_empty()) {
                    out.insert(field.clone(), list.clone());
                }
            }
        }
        if current.as_ref() == Some(&status) {
            return;
        }
        let body = json!({
            "apiVersion": K::api_version(&()),
            "kind": kind,
            "metadata": {"name": name, "namespace": ns},
            "status": status,
        });
        // Right before the write: a replica that lost the Lease stops within one request.
        if !self.leading() {
            return;
        }
        let api: Api<K> = Api::namespaced(self.client.clone(), ns);
        let params = PatchParams::apply(names::FIELD_MANAGER).force();
        match api.patch_status(name, &params, &Patch::Apply(&body)).await {
            Ok(_) => self.admin.status_write(kind, true),
            // A newer version is on its way through the watch; the next pass redoes this.
            Err(kube::Error::Api(s)) if s.code == 409 => self.admin.status_conflict(kind),
            Err(e) => {
                self.admin.status_write(kind, false);
                tracing::warn!(%kind, %ns, %name, error = %e, "parameters status not written");
            }
        }
    }

    /// A Warning for a problem, a Normal Event when one is fixed (not for a first Accepted).
    fn announce(&self, object: ObjectReference, accepted: &Condition, existing: &[Value]) {
        let was_false = existing
            .iter()
            .any(|e| e["type"] == ACCEPTED && e["status"] == "False");
        let type_ = match accepted.status {
            ConditionStatus::False => EventType::Warning,
            ConditionStatus::True if was_false => EventType::Normal,
            _ => return,
        };
        let mut note = format!("Accepted={}", condition_status(accepted.status));
        if !accepted.message.is_empty() {
            note.push_str(": ");
            note.push_str(&accepted.message);
        }
        // The Events API's limit on a note.
        if note.len() > 1024 {
            let mut cut = 1021;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
            note.push_str("...");
        }
        let event = Event {
            type_,
            reason: accepted.reason.to_owned(),
            note: Some(note),
            action: "Reconcile".to_owned(),
            secondary: None,
        };
        // Publishing must not hold up the compile loop; transitions are rare.
        let recorder = self.recorder.clone();
        let admin = self.admin.clone();
        tokio::spawn(async move {
            match recorder.publish(&event, &object).await {
                Ok(()) => admin.event(if type_ == EventType::Warning {
                    "Warning"
                } else {
                    "Normal"
                }),
                Err(e) => {
                    tracing::debug!(error = %e, reason = %event.reason, "event not published")
                }
            }
        });
    }
}

/// Coxswain's parameters kinds, by name.
pub trait ParametersKind {
    const KIND: &'static str;
}

impl ParametersKind for CoxswainGatewayParameters {
    const KIND: &'static str = "CoxswainGatewayParameters";
}

impl ParametersKind for CoxswainIngressClassParameters {
    const KIND: &'static str = "CoxswainIngressClassParameters";
}

fn condition_status(s: ConditionStatus) -> &'static str {
    match s {
        ConditionStatus::True => "True",
        ConditionStatus::False => "False",
        ConditionStatus::Unknown => "Unknown",
    }
}

fn describe_users(classes: &[String], gateways: usize) -> String {
    match (classes.is_empty(), gateways) {
        (true, 0) => {
            "valid; no GatewayClass or Gateway of Coxswain refers to these parameters".to_owned()
        }
        (true, n) => format!("in use by {n} Gateway(s)"),
        (false, n) => format!(
            "in use by GatewayClass {} and {n} Gateway(s)",
            list(classes.iter().cloned())
        ),
    }
}

/// "a, b, c" with at most a handful spelled out.
fn list(items: impl Iterator<Item = String>) -> String {
    const SHOWN: usize = 5;
    let items: Vec<String> = items.collect();
    let mut out = items[..items.len().min(SHOWN)].join(", ");
    if items.len() > SHOWN {
        out.push_str(&format!(" and {} more", items.len() - SHOWN));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(yaml: &str) -> Store {
        let mut store = Store::default();
        load(&mut store, yaml);
        store
    }

    fn load(store: &mut Store, yaml: &str) {
        let mut errors = Vec::new();
        store.load_yaml(std::path::Path::new("test.yaml"), yaml, &mut errors);
        assert!(errors.is_empty(), "{errors:?}");
    }

    const CONTROLLER: &str = names::CONTROLLER_NAME;

    #[test]
    fn gateway_parameters_list_their_classes_and_gateways() {
        let s = store(&format!(
            r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: edge}}
spec:
  controllerName: {CONTROLLER}
  parametersRef: {{group: gateway.coxswain-labs.dev, kind: CoxswainGatewayParameters, name: class-params, namespace: infra}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: theirs}}
spec:
  controllerName: example.com/other
  parametersRef: {{group: gateway.coxswain-labs.dev, kind: CoxswainGatewayParameters, name: class-params, namespace: infra}}
---
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainGatewayParameters
metadata: {{name: class-params, namespace: infra, generation: 3}}
spec: {{replicas: 2}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: theirs-only}}
spec:
  controllerName: example.com/other
  parametersRef: {{group: gateway.coxswain-labs.dev, kind: CoxswainGatewayParameters, name: theirs-only, namespace: infra}}
---
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainGatewayParameters
metadata: {{name: theirs-only, namespace: infra}}
spec: {{}}
---
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainGatewayParameters
metadata: {{name: own, namespace: web, generation: 1}}
spec: {{replicas: 1}}
---
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainGatewayParameters
metadata: {{name: unused, namespace: web, generation: 1}}
spec: {{}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: a, namespace: web}}
spec:
  gatewayClassName: edge
  infrastructure:
    parametersRef: {{group: gateway.coxswain-labs.dev, kind: CoxswainGatewayParameters, name: own}}
  listeners: [{{name: http, port: 80, protocol: HTTP}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: b, namespace: other}}
spec:
  gatewayClassName: edge
  listeners: [{{name: http, port: 80, protocol: HTTP}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: c, namespace: other}}
spec:
  gatewayClassName: theirs
  listeners: [{{name: http, port: 80, protocol: HTTP}}]
"#
        ));
        let out = decide(&s, CONTROLLER, false);
        let class = &out.gateway[&ObjectKey::new("infra", "class-params")];
        assert_eq!(class.gateway_classes, ["edge"]);
        let gws: Vec<String> = class
            .gateways
            .iter()
            .map(|g| format!("{}/{}", g.namespace, g.name))
            .collect();
        assert_eq!(gws, ["other/b", "web/a"]);
        assert_eq!(class.generation, 3);
        assert_eq!(class.accepted.status, ConditionStatus::True);
        assert_eq!(class.accepted.observed_generation, 3);
        assert!(
            class
                .accepted
                .message
                .contains("GatewayClass edge and 2 Gateway(s)"),
            "{}",
            class.accepted.message
        );
        // Used only by another controller's class: not ours to judge.
        assert!(
            !out.gateway
                .contains_key(&ObjectKey::new("infra", "theirs-only"))
        );
        let own = &out.gateway[&ObjectKey::new("web", "own")];
        assert!(own.gateway_classes.is_empty());
        assert_eq!(own.gateways.len(), 1);
        let unused = &out.gateway[&ObjectKey::new("web", "unused")];
        assert_eq!(unused.accepted.status, ConditionStatus::True);
        assert!(
            unused
                .accepted
                .message
                .contains("no GatewayClass or Gateway")
        );
        assert!(unused.gateways.is_empty());
    }

    #[test]
    fn a_pod_template_that_is_not_a_pod_template_is_not_accepted() {
        let s = store(
            r#"
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainGatewayParameters
metadata: {name: p, namespace: web, generation: 2}
spec:
  podTemplate: {spec: {containers: [{image: x}]}}
"#,
        );
        let st = &decide(&s, CONTROLLER, false).gateway[&ObjectKey::new("web", "p")];
        assert_eq!(st.accepted.status, ConditionStatus::False);
        assert_eq!(st.accepted.reason, reason::INVALID_POD_TEMPLATE);
        assert!(
            st.accepted
                .message
                .contains("spec.containers[0] has no name"),
            "{}",
            st.accepted.message
        );
        assert_eq!(st.accepted.observed_generation, 2);
    }

    #[test]
    fn trusted_proxies_that_are_not_address_blocks_are_not_accepted() {
        let s = store(
            r#"
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainGatewayParameters
metadata: {name: p, namespace: web, generation: 3}
spec:
  clientAddress: {trustedProxies: [10.0.0.0/8, 10.0.0.0/33]}
"#,
        );
        let st = &decide(&s, CONTROLLER, false).gateway[&ObjectKey::new("web", "p")];
        assert_eq!(st.accepted.status, ConditionStatus::False);
        assert_eq!(st.accepted.reason, reason::INVALID_CLIENT_ADDRESS);
        assert!(
            st.accepted.message.contains("\"10.0.0.0/33\""),
            "{}",
            st.accepted.message
        );
        let ok = store(
            r#"
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainGatewayParameters
metadata: {name: p, namespace: web, generation: 3}
spec:
  clientAddress: {trustedProxies: [10.0.0.0/8, "2001:db8::1"], proxyProtocol: true}
"#,
        );
        let st = &decide(&ok, CONTROLLER, false).gateway[&ObjectKey::new("web", "p")];
        assert_eq!(st.accepted.status, ConditionStatus::True, "{st:?}");
    }

    #[test]
    fn tracing_the_proxy_would_refuse_is_not_accepted() {
        let s = store(
            r#"
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainGatewayParameters
metadata: {name: p, namespace: web, generation: 4}
spec:
  tracing: {endpoint: "otel-collector:4317", samplingRatio: 0.5}
"#,
        );
        let st = &decide(&s, CONTROLLER, false).gateway[&ObjectKey::new("web", "p")];
        assert_eq!(st.accepted.status, ConditionStatus::False);
        assert_eq!(st.accepted.reason, reason::INVALID_TRACING);
        for says in ["\"otel-collector:4317\"", "http://", "fix spec.tracing"] {
            assert!(
                st.accepted.message.contains(says),
                "{says}: {}",
                st.accepted.message
            );
        }
        assert_eq!(st.accepted.observed_generation, 4);
        let ok = store(
            r#"
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainGatewayParameters
metadata: {name: p, namespace: web, generation: 4}
spec:
  tracing: {endpoint: "http://otel-collector.observability:4317", samplingRatio: 0.5}
"#,
        );
        let st = &decide(&ok, CONTROLLER, false).gateway[&ObjectKey::new("web", "p")];
        assert_eq!(st.accepted.status, ConditionStatus::True, "{st:?}");
    }

    #[test]
    fn autoscaling_without_a_maximum_in_either_layer_is_not_accepted() {
        let s = store(&format!(
            r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: edge}}
spec:
  controllerName: {CONTROLLER}
  parametersRef: {{group: gateway.coxswain-labs.dev, kind: CoxswainGatewayParameters, name: scale, namespace: infra}}
---
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainGatewayParameters
metadata: {{name: scale, namespace: infra}}
spec: {{autoscaling: {{enabled: true}}}}
---
apiVersion: gateway.coxswain-labs.dev/v1alpha1
kind: CoxswainGatewayParameters
metadata: {{name: max, namespace: web}}
spec: {{autoscaling: {{maxReplicas: 4}}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: fixed, namespace: web}}
spec:
  gatewayClassName: edge
  infrastructure:
    parametersRef: {{group: gateway.coxswain-labs.dev, kind: CoxswainGatewayParameters, name: max}}
  listeners: [{{name: http, port: 80, protocol: HTTP}}]
"#
        ));
        // The Gateway's own layer supplies the maximum: fine.
        let out = decide(&s, CONTROLLER, false);
        assert_eq!(
            out.gateway[&ObjectKey::new("infra", "scale")]
                .accepted
                .status,
            ConditionStatus::True
        );
        // A Gateway of the class without one: the class's parameters say what to fix.
        let mut s = s;
        load(
            &mut s,
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: bare, namespace: web}\nspec: {gatewayClassName: edge, listeners: [{name: http, port: 80, protocol: HTTP}]}\n",
        );
        let st = &decide(&s, CONTROLLER, false).gateway[&ObjectKey::new("infra", "scale")];
        assert_eq!(st.accepted.status, ConditionStatus::False);
        assert_eq!(st.accepted.reason, reason::AUTOSCALING_WITHOUT_MAX);
        assert!(
            st.accepted.message.contains("web/bare"),
            "{}",
            st.accepted.message
        );
        assert!(
            !st.accepted.message.contains("web/fixed"),
            "{}",
            st.accepted.message
        );
    }

    #[test]
    fn ingress_class_parameters_list_their_classes_and_judge_default_annotations() {
        let s = store(&format!(
            r#"
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {{name: coxswain}}
spec:
  controller: {CONTROLLER}
  parameters: {{apiGroup: ingress.coxswain-labs.dev, kind: CoxswainIngressClassParameters, name: defaults, namespace: web, scope: Namespace}}
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {{name: nginx}}
spec:
  controller: k8s.io/ingress-nginx
  parameters: {{apiGroup: ingress.coxswain-labs.dev, kind: CoxswainIngressClassParameters, name: defaults, namespace: web, scope: Namespace}}
---
apiVersion: ingress.coxswain-labs.dev/v1alpha1
kind: CoxswainIngressClassParameters
metadata: {{name: defaults, namespace: web, generation: 4}}
spec:
  defaultAnnotations: {{ingress.coxswain-labs.dev/read-timeout: 30s}}
---
apiVersion: ingress.coxswain-labs.dev/v1alpha1
kind: CoxswainIngressClassParameters
metadata: {{name: typo, namespace: web, generation: 1}}
spec:
  defaultAnnotations: {{ingress.coxswain-labs.dev/read-timout: 30s}}
"#
        ));
        let out = decide(&s, CONTROLLER, false);
        let good = &out.ingress_class[&ObjectKey::new("web", "defaults")];
        assert_eq!(good.ingress_classes, ["coxswain"]);
        assert_eq!(good.accepted.status, ConditionStatus::True);
        assert_eq!(good.accepted.observed_generation, 4);
        let bad = &out.ingress_class[&ObjectKey::new("web", "typo")];
        assert_eq!(bad.accepted.status, ConditionStatus::False);
        assert_eq!(bad.accepted.reason, reason::INVALID_DEFAULT_ANNOTATIONS);
        assert!(
            bad.accepted
                .message
                .contains("ingress.coxswain-labs.dev/read-timout"),
            "{}",
            bad.accepted.message
        );
        assert!(bad.ingress_classes.is_empty());
    }
}
