//! The status writer: turns the compiler's decisions into `status` patches on GatewayClasses,
//! Gateways, HTTPRoutes and Ingresses (their addresses: the proxy Service's load balancer). It keeps lastTransitionTime when a condition's status did not
//! change, writes only this controller's `status.parents` entries of a route (other
//! controllers' entries are kept), and skips patches that would change nothing, so its own
//! writes do not make it loop.

use crate::compile::ScopeKey;
use crate::compile::status::{Condition, ConditionStatus, ObjectKey, StatusDecisions, reason};
use crate::compile::{Compiled, Store};
use crate::discovery::Hub;
use gateway_api::apis::standard::gatewayclasses::GatewayClass;
use gateway_api::apis::standard::gateways::Gateway;
use gateway_api::apis::standard::httproutes::HttpRoute;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

/// `GatewayClass.status.supportedFeatures`: only features whose Gateway API conformance tests
/// pass against this build (`make conformance`, test/conformance/reports/); the suite reads
/// this list to decide what to run.
pub const SUPPORTED_FEATURES: &[&str] = &[
    "Gateway",
    "HTTPRoute",
    "ReferenceGrant",
    "GatewayAddressEmpty",
    "GatewayHTTPListenerIsolation",
    "GatewayInfrastructurePropagation",
    "GatewayPort8080",
    "HTTPRoute303RedirectStatusCode",
    "HTTPRoute307RedirectStatusCode",
    "HTTPRoute308RedirectStatusCode",
    "HTTPRouteBackendProtocolH2C",
    "HTTPRouteBackendProtocolWebSocket",
    "HTTPRouteBackendRequestHeaderModification",
    "HTTPRouteDestinationPortMatching",
    "HTTPRouteHostRewrite",
    "HTTPRouteMethodMatching",
    "HTTPRouteNamedRouteRule",
    "HTTPRouteParentRefPort",
    "HTTPRoutePathRedirect",
    "HTTPRoutePathRewrite",
    "HTTPRoutePortRedirect",
    "HTTPRouteQueryParamMatching",
    "HTTPRouteResponseHeaderModification",
    "HTTPRouteSchemeRedirect",
];

/// What `conditions` look like on the object now, for transition times and no-op detection.
fn existing_conditions(status: Option<Value>) -> Vec<Value> {
    status
        .and_then(|s| s.get("conditions").cloned())
        .and_then(|c| c.as_array().cloned())
        .unwrap_or_default()
}

fn status_str(s: ConditionStatus) -> &'static str {
    match s {
        ConditionStatus::True => "True",
        ConditionStatus::False => "False",
        ConditionStatus::Unknown => "Unknown",
    }
}

/// Conditions as the API wants them, reusing lastTransitionTime where the status is unchanged.
fn render_conditions(conditions: &[Condition], existing: &[Value], now: &str) -> Vec<Value> {
    conditions
        .iter()
        .map(|c| {
            let status = status_str(c.status);
            let previous = existing.iter().find(|e| e["type"] == c.type_);
            let since = match previous {
                Some(p) if p["status"] == status => {
                    p["lastTransitionTime"].as_str().unwrap_or(now).to_owned()
                }
                _ => now.to_owned(),
            };
            json!({
                "type": c.type_,
                "status": status,
                "reason": c.reason,
                "message": c.message,
                "observedGeneration": c.observed_generation,
                "lastTransitionTime": since,
            })
        })
        .collect()
}

/// Programmed=True once every proxy of the Gateway's scope has acked the current snapshot and
/// bound the listener's port: a claim about the data plane, not about compilation.
fn programmed(conditions: &mut [Condition], serving: bool) {
    for c in conditions.iter_mut() {
        if c.type_ == reason::PROGRAMMED && c.reason == reason::PENDING && serving {
            c.status = ConditionStatus::True;
            c.reason = reason::PROGRAMMED;
            c.message = String::new();
        }
    }
}

/// Writes every status that differs from what the objects carry.
///
/// Only while `leader` holds; it is re-checked right before each patch, so a replica that lost
/// the Lease stops writing within one request.
pub async fn write(
    client: &Client,
    store: &Store,
    compiled: &Compiled,
    hub: &Hub,
    controller_name: &str,
    controller_namespace: &str,
    leader: &std::sync::atomic::AtomicBool,
) {
    let leading = || leader.load(std::sync::atomic::Ordering::Acquire);
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let decisions: &StatusDecisions = &compiled.status;
    let params = PatchParams::default();

    for class in &store.gateway_classes {
        let Some(name) = class.metadata.name.as_deref() else {
            continue;
        };
        let Some(conditions) = decisions.gateway_classes.get(name) else {
            continue;
        };
        let existing = existing_conditions(
            class
                .status
                .as_ref()
                .and_then(|s| serde_json::to_value(s).ok()),
        );
        let rendered = render_conditions(conditions, &existing, &now);
        let features: Vec<Value> = SUPPORTED_FEATURES
            .iter()
            .map(|name| json!({"name": name}))
            .collect();
        let current_features = class
            .status
            .as_ref()
            .and_then(|s| serde_json::to_value(&s.supported_features).ok())
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default();
        if (same_conditions(&rendered, &existing) && current_features == features) || !leading() {
            continue;
        }
        let api: Api<GatewayClass> = Api::all(client.clone());
        let patch = json!({"status": {"conditions": rendered, "supportedFeatures": features}});
        if let Err(e) = api.patch_status(name, &params, &Patch::Merge(&patch)).await {
            tracing::warn!(gatewayclass = name, error = %e, "status not written");
        }
    }

    for gw in &store.gateways {
        let (Some(ns), Some(name)) = (
            gw.metadata.namespace.as_deref(),
            gw.metadata.name.as_deref(),
        ) else {
            continue;
        };
        let key = ObjectKey::new(ns, name);
        let Some(decision) = decisions.gateways.get(&key) else {
            continue;
        };
        let scope = if decision.dedicated {
            ScopeKey::Gateway(key.clone())
        } else {
            ScopeKey::SharedPool
        };
        let version = compiled
            .snapshots
            .get(&scope)
            .map(|s| s.version.clone())
            .unwrap_or_default();
        let current = gw
            .status
            .as_ref()
            .and_then(|s| serde_json::to_value(s).ok());
        let mut all_serving = true;
        let mut listeners = Vec::new();
        for l in &decision.listeners {
            let port = gw
                .spec
                .listeners
                .iter()
                .find(|x| x.name == l.name)
                .map(|x| x.port)
                .unwrap_or(0);
            let serving = u32::try_from(port).is_ok_and(|p| hub.serving(&scope, &version, p));
            let mut conditions = l.conditions.clone();
            programmed(&mut conditions, serving);
            all_serving &= serving
                || conditions
                    .iter()
                    .any(|c| c.type_ == reason::PROGRAMMED && c.reason == reason::INVALID);
            let existing = current
                .as_ref()
                .and_then(|s| s["listeners"].as_array().cloned())
                .and_then(|ls| ls.into_iter().find(|x| x["name"] == l.name.as_str()))
                .map(|x| existing_conditions(Some(x)))
                .unwrap_or_default();
            listeners.push(json!({
                "name": l.name,
                "supportedKinds": l.supported_kinds,
                "attachedRoutes": l.attached_routes,
                "conditions": render_conditions(&conditions, &existing, &now),
            }));
        }
        let mut conditions = decision.conditions.clone();
        programmed(
            &mut conditions,
            all_serving && !decision.listeners.is_empty(),
        );
        let existing = existing_conditions(current.clone());
        let rendered = render_conditions(&conditions, &existing, &now);
        // The address clients use: the dedicated proxy's Service, or the shared pool's.
        let (svc_ns, svc_name) = if decision.dedicated {
            (
                ns,
                coxswain_api::names::dedicated_proxy_name(name, &gw.spec.gateway_class_name),
            )
        } else {
            (
                controller_namespace,
                coxswain_api::names::SHARED_PROXY_SERVICE.to_owned(),
            )
        };
        let addresses = gateway_addresses(store, svc_ns, &svc_name);
        let unchanged = same_conditions(&rendered, &existing)
            && current.as_ref().is_some_and(|c| {
                same_listeners(&listeners, &c["listeners"])
                    && c["addresses"].as_array().cloned().unwrap_or_default() == addresses
            });
        if unchanged || !leading() {
            continue;
        }
        let api: Api<Gateway> = Api::namespaced(client.clone(), ns);
        let patch = json!({"status": {"conditions": rendered, "listeners": listeners, "addresses": addresses}});
        if let Err(e) = api.patch_status(name, &params, &Patch::Merge(&patch)).await {
            tracing::warn!(gateway = %key, error = %e, "status not written");
        }
    }

    for route in &store.http_routes {
        let (Some(ns), Some(name)) = (
            route.metadata.namespace.as_deref(),
            route.metadata.name.as_deref(),
        ) else {
            continue;
        };
        let Some(ours) = decisions.http_routes.get(&ObjectKey::new(ns, name)) else {
            continue;
        };
        let current = route
            .status
            .as_ref()
            .and_then(|s| serde_json::to_value(s).ok());
        let current_parents = current
            .as_ref()
            .and_then(|c| c["parents"].as_array().cloned())
            .unwrap_or_default();
        // Other controllers' entries stay as they are.
        let mut parents: Vec<Value> = current_parents
            .iter()
            .filter(|p| p["controllerName"] != controller_name)
            .cloned()
            .collect();
        for p in ours {
            let parent_ref = serde_json::to_value(&p.parent_ref).unwrap_or(Value::Null);
            let existing = current_parents
                .iter()
                .find(|e| {
                    e["controllerName"] == controller_name
                        && same_parent_ref(&e["parentRef"], &parent_ref)
                })
                .map(|e| existing_conditions(Some(e.clone())))
                .unwrap_or_default();
            parents.push(json!({
                "parentRef": parent_ref,
                "controllerName": p.controller_name,
                "conditions": render_conditions(&p.conditions, &existing, &now),
            }));
        }
        if same_parents(&parents, &current_parents) || !leading() {
            continue;
        }
        let api: Api<HttpRoute> = Api::namespaced(client.clone(), ns);
        let patch = json!({"status": {"parents": parents}});
        if let Err(e) = api.patch_status(name, &params, &Patch::Merge(&patch)).await {
            tracing::warn!(httproute = %format!("{ns}/{name}"), error = %e, "status not written");
        }
    }

    // Ingresses of our classes are served by the shared pool: its address is theirs.
    let shared = load_balancer_ingress(
        store,
        controller_namespace,
        coxswain_api::names::SHARED_PROXY_SERVICE,
    );
    for ingress in &store.ingresses {
        let (Some(ns), Some(name)) = (
            ingress.metadata.namespace.as_deref(),
            ingress.metadata.name.as_deref(),
        ) else {
            continue;
        };
        if !decisions.ingresses.contains_key(&ObjectKey::new(ns, name)) {
            continue;
        }
        let current = ingress
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| serde_json::to_value(lb.ingress.clone().unwrap_or_default()).ok())
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default();
        if current == shared || !leading() {
            continue;
        }
        let api: Api<Ingress> = Api::namespaced(client.clone(), ns);
        let patch = json!({"status": {"loadBalancer": {"ingress": shared}}});
        if let Err(e) = api.patch_status(name, &params, &Patch::Merge(&patch)).await {
            tracing::warn!(ingress = %format!("{ns}/{name}"), error = %e, "status not written");
        }
    }
}

/// The Service's load-balancer entries (`{ip}` / `{hostname}`); for a Service without a load
/// balancer, its cluster IP, so in-cluster clients still learn where to connect.
fn load_balancer_ingress(store: &Store, ns: &str, name: &str) -> Vec<Value> {
    let Some(svc) = store.services.iter().find(|s| {
        s.metadata.namespace.as_deref() == Some(ns) && s.metadata.name.as_deref() == Some(name)
    }) else {
        return Vec::new();
    };
    let lb: Vec<Value> = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| match (&i.ip, &i.hostname) {
            (Some(ip), _) => Some(json!({"ip": ip})),
            (None, Some(host)) => Some(json!({"hostname": host})),
            _ => None,
        })
        .collect();
    if !lb.is_empty() {
        return lb;
    }
    svc.spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .filter(|ip| !ip.is_empty() && *ip != "None")
        .map(|ip| vec![json!({"ip": ip})])
        .unwrap_or_default()
}

/// Gateway `status.addresses` from the same Service.
fn gateway_addresses(store: &Store, ns: &str, name: &str) -> Vec<Value> {
    load_balancer_ingress(store, ns, name)
        .into_iter()
        .filter_map(|entry| {
            if let Some(ip) = entry["ip"].as_str() {
                Some(json!({"type": "IPAddress", "value": ip}))
            } else {
                entry["hostname"]
                    .as_str()
                    .map(|h| json!({"type": "Hostname", "value": h}))
            }
        })
        .collect()
}

/// Equal but for lastTransitionTime, which `render_conditions` already carried over.
fn same_conditions(a: &[Value], b: &[Value]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

fn same_listeners(a: &[Value], b: &Value) -> bool {
    b.as_array()
        .is_some_and(|b| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y))
}

fn same_parents(a: &[Value], b: &[Value]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

/// The same parent: name, namespace, section and port (group and kind are always Gateway's).
fn same_parent_ref(a: &Value, b: &Value) -> bool {
    ["name", "namespace", "sectionName", "port"]
        .iter()
        .all(|k| a.get(k) == b.get(k))
}
