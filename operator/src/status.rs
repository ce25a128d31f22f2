//! The status writer: turns the compiler's decisions into server-side applies of `status` on
//! GatewayClasses, Gateways, HTTPRoutes, GRPCRoutes, TLSRoutes, TCPRoutes, UDPRoutes,
//! BackendTLSPolicies,
//! CoxswainBackendPolicies and Ingresses (their addresses: the proxy Service's load balancer). It keeps lastTransitionTime
//! when a condition's status did not change, writes only this controller's `status.parents`
//! entries of a route and `status.ancestors` entries of a policy (other controllers' entries
//! are kept), skips writes that would change nothing, so its own writes do not make it loop,
//! and turns condition transitions into Events.

use crate::admin;
use crate::compile::ScopeKey;
use crate::compile::proxies::{self, ProxyNames};
use crate::compile::status::{
    Condition, ConditionStatus, ObjectKey, PolicyAncestorStatus, RouteParentStatus,
    StatusDecisions, reason,
};
use crate::compile::{Compiled, Store};
use crate::discovery::Hub;
use coxswain_api::{CoxswainAccessPolicy, CoxswainBackendPolicy};
use gateway_api::apis::experimental::httproutes::HttpRoute;
use gateway_api::apis::experimental::tcproutes::TcpRoute;
use gateway_api::apis::experimental::udproutes::UdpRoute;
use gateway_api::apis::standard::backendtlspolicies::BackendTlsPolicy;
use gateway_api::apis::standard::gatewayclasses::GatewayClass;
use gateway_api::apis::standard::gateways::Gateway;
use gateway_api::apis::standard::grpcroutes::GrpcRoute;
use gateway_api::apis::standard::listenersets::ListenerSet;
use gateway_api::apis::standard::tlsroutes::TlsRoute;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::mpsc;

/// `GatewayClass.status.supportedFeatures`: only features whose Gateway API conformance tests
/// pass against this build (`make conformance`, test/conformance/reports/); the suite reads
/// this list to decide what to run. operator/tests/supported_features.rs holds it to exactly
/// what the newest committed report shows passing.
pub const SUPPORTED_FEATURES: &[&str] = &[
    "Gateway",
    "HTTPRoute",
    "GRPCRoute",
    "TLSRoute",
    "ReferenceGrant",
    "BackendTLSPolicy",
    "BackendTLSPolicySANValidation",
    "GatewayAddressEmpty",
    "GatewayBackendClientCertificate",
    "GatewayFrontendClientCertificateValidation",
    "GatewayFrontendClientCertificateValidationInsecureFallback",
    "GatewayHTTPListenerIsolation",
    "GatewayHTTPSListenerDetectMisdirectedRequests",
    "GatewayInfrastructure",
    "GatewayPort8080",
    "GatewayStaticAddresses",
    "GRPCRouteNamedRouteRule",
    "HTTPRoute303RedirectStatusCode",
    "HTTPRoute307RedirectStatusCode",
    "HTTPRoute308RedirectStatusCode",
    "HTTPRouteBackendProtocolH2C",
    "HTTPRouteBackendProtocolWebSocket",
    "HTTPRouteBackendRequestHeaderModification",
    "HTTPRouteBackendTimeout",
    "HTTPRouteCORS",
    "HTTPRouteDestinationPortMatching",
    "HTTPRouteHostRewrite",
    "HTTPRouteMethodMatching",
    "HTTPRouteNamedRouteRule",
    "HTTPRouteParentRefPort",
    "HTTPRoutePathRedirect",
    "HTTPRoutePathRewrite",
    "HTTPRoutePortRedirect",
    "HTTPRouteQueryParamMatching",
    "HTTPRouteRequestMirror",
    "HTTPRouteRequestMultipleMirrors",
    "HTTPRouteRequestPercentageMirror",
    "HTTPRouteRequestTimeout",
    "HTTPRouteResponseHeaderModification",
    "HTTPRouteRetry",
    "HTTPRouteRetryBackendTimeout",
    "HTTPRouteRetryConnectionError",
    "HTTPRouteSchemeRedirect",
    "ListenerSet",
    "TLSRouteModeMixed",
    "TLSRouteModeTerminate",
];

/// Features a Gateway has only with a proxy of its own: generated resources in its own
/// namespace carrying its infrastructure labels (a shared Gateway's Service lives in the
/// controller's namespace, beside the Pods it selects).
pub const DEDICATED_ONLY_FEATURES: &[&str] = &["GatewayInfrastructure"];

/// Features a shared Gateway has only with ports and an address of its own
/// (`--shared-gateway-ports`, the default): without, the pool's Service carries 80 and 443
/// for everyone.
pub const OWN_PORTS_FEATURES: &[&str] = &[
    "GatewayFrontendClientCertificateValidation",
    "GatewayFrontendClientCertificateValidationInsecureFallback",
    "GatewayPort8080",
    "GatewayStaticAddresses",
];

/// `supportedFeatures` of a GatewayClass: everything for a class whose Gateways get dedicated
/// proxies (a parametersRef); less for one whose Gateways share the pool, so the conformance
/// suite, which runs what a class claims, proves the claim for each kind of class.
pub fn class_features(dedicated: bool, shared_gateway_ports: bool) -> Vec<&'static str> {
    SUPPORTED_FEATURES
        .iter()
        .copied()
        .filter(|f| {
            dedicated
                || !(DEDICATED_ONLY_FEATURES.contains(f)
                    || (!shared_gateway_ports && OWN_PORTS_FEATURES.contains(f)))
        })
        .collect()
}

/// What `conditions` look like on the object now, for transition times and no-op detection.
pub(crate) fn existing_conditions(status: Option<Value>) -> Vec<Value> {
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
pub(crate) fn render_conditions(
    conditions: &[Condition],
    existing: &[Value],
    now: &str,
) -> Vec<Value> {
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

/// A Gateway that cannot have its requested address is not Programmed, whatever its proxy
/// does (Gateway API: Programmed=False, AddressNotAssigned or AddressNotUsable). A Gateway
/// already refused for another reason keeps that reason.
fn not_programmed(conditions: &mut [Condition], why: &'static str, message: String) {
    for c in conditions.iter_mut() {
        if c.type_ == reason::PROGRAMMED && (c.reason == reason::PENDING || c.is_true()) {
            c.status = ConditionStatus::False;
            c.reason = why;
            c.message = message.clone();
        }
    }
}

/// Whether the proxy's Service holds the addresses the Gateway asks for: None when it does
/// (or nothing is asked), else the Programmed=False reason and what to do about it. The
/// provisioner asks a LoadBalancer Service for one address (`spec.loadBalancerIP`); the load
/// balancer provider assigns it or not, and its `status.loadBalancer.ingress` says which.
/// The port the proxies listen on for a listener port: the Gateway's internal port when it
/// has a Service of its own on the shared pool (None: the port has none), else the port.
fn bound_port(
    own: Option<&crate::compile::gateway_services::GatewayService>,
    port: u32,
    protocol: &str,
) -> Option<u32> {
    match own {
        Some(service) => service.internal_of(port, protocol),
        None => Some(port),
    }
}

fn address_problem(
    requested: &[std::net::IpAddr],
    service: Option<&k8s_openapi::api::core::v1::Service>,
    svc_ns: &str,
    svc_name: &str,
) -> Option<(&'static str, String)> {
    let first = requested.first()?;
    let list = requested
        .iter()
        .map(|ip| ip.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let Some(service) = service else {
        return Some((
            reason::ADDRESS_NOT_ASSIGNED,
            format!("waiting for the proxy's Service {svc_ns}/{svc_name} to ask for {list}"),
        ));
    };
    let type_ = service
        .spec
        .as_ref()
        .and_then(|s| s.type_.as_deref())
        .unwrap_or("ClusterIP");
    if type_ != "LoadBalancer" {
        return Some((
            reason::ADDRESS_NOT_USABLE,
            format!(
                "spec.addresses needs a LoadBalancer Service; the proxy's Service {svc_ns}/{svc_name} \
                 is {type_} (CoxswainGatewayParameters serviceType)"
            ),
        ));
    }
    if requested.len() > 1 {
        return Some((
            reason::ADDRESS_NOT_USABLE,
            format!(
                "a LoadBalancer Service is asked for one address (spec.loadBalancerIP); this Gateway \
                 asks for {} ({list}): keep one",
                requested.len()
            ),
        ));
    }
    let assigned: Vec<std::net::IpAddr> = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_deref()?.parse().ok())
        .collect();
    if assigned.contains(first) {
        return None;
    }
    let has = if assigned.is_empty() {
        "no address yet".to_owned()
    } else {
        assigned
            .iter()
            .map(|ip| ip.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    Some((
        reason::ADDRESS_NOT_ASSIGNED,
        format!(
            "the load balancer has not assigned {first} to Service {svc_ns}/{svc_name} \
             (status.loadBalancer.ingress: {has}); the address must be free and in the \
             provider's pool"
        ),
    ))
}

/// Events are best effort: when the publisher falls this far behind, new ones are dropped.
const EVENT_BACKLOG: usize = 1024;
/// The Events API's limit on a note.
const MAX_NOTE: usize = 1024;

/// Reason of the Warning Event an Ingress gets for each problem, and of the Normal one when
/// its problems are gone.
pub const INGRESS_PROBLEM: &str = "InvalidConfiguration";
pub const INGRESS_RESOLVED: &str = "ConfigurationResolved";
/// Reasons of an Ingress's annotation Warnings: a snippet (never executed), an access
/// annotation that made its paths deny (fail closed), any other annotation left out.
pub const SNIPPET_IGNORED: &str = "SnippetIgnored";
pub const ANNOTATION_FAILED_CLOSED: &str = "AnnotationFailedClosed";
pub const ANNOTATION_IGNORED: &str = "AnnotationIgnored";
/// Reason of the Warning on an IngressClass whose parameters reference is not used.
pub const INVALID_PARAMETERS_REF: &str = "InvalidParameters";

/// What an Ingress is told: (Event reason, note) per problem and per annotation warning.
fn ingress_findings(status: &crate::compile::status::IngressStatus) -> Vec<(&'static str, String)> {
    let problems = status.problems.iter().map(|p| (INGRESS_PROBLEM, p.clone()));
    let warnings = status.warnings.iter().map(|w| {
        let reason = if w.annotation.ends_with("-snippet") {
            SNIPPET_IGNORED
        } else if w.fail_closed {
            ANNOTATION_FAILED_CLOSED
        } else {
            ANNOTATION_IGNORED
        };
        (reason, format!("{}: {}", w.annotation, w.reason))
    });
    problems.chain(warnings).collect()
}

/// Writes statuses by server-side apply (field manager `coxswain-controller`), and publishes
/// an Event for each condition transition a person should see.
/// (status, reason) per object condition, by [`condition_key`].
type Reported = HashMap<u64, (ConditionStatus, &'static str)>;

/// A condition's key in [`Reported`]: a hash of its object, subject and type, not the text
/// ("HTTPRoute/ns/name|Gateway ns/gw|Accepted"). One is kept per condition of every route:
/// at 20,000 routes the map took 6.8 MiB with the text, and the text was built anew on every
/// write. Two of 40,000 keys collide with odds of about one in 10^10, and a collision costs
/// no more than one Event too many or too few.
fn condition_key(scope: &str, subject: &str, type_: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    // Fixed keys: the same condition has the same key for the life of the process.
    let mut h = std::hash::DefaultHasher::new();
    (scope, subject, type_).hash(&mut h);
    h.finish()
}

pub struct StatusWriter {
    client: Client,
    controller_name: String,
    controller_namespace: String,
    leader: Arc<AtomicBool>,
    admin: Arc<admin::State>,
    events: mpsc::Sender<(ObjectReference, Event)>,
    /// The (status, reason) last reported per object condition, so a transition is reported
    /// once even while the cache still shows the status from before our own write.
    reported: Reported,
    /// The findings last reported per Ingress, and per IngressClass.
    ingress_findings: HashMap<ObjectKey, Vec<(&'static str, String)>>,
    class_findings: HashMap<String, String>,
    /// Shared Gateways have Services and ports of their own (`--shared-gateway-ports`): what
    /// a shared-pool class claims depends on it.
    shared_gateway_ports: bool,
}

/// A condition change worth an Event: a problem appearing (Warning), or a good state being
/// reached (Normal).
fn event_for(c: &Condition, first_report: bool, announce_true: bool) -> Option<EventType> {
    // Conflicted (and our proxy-name variant of it) are where True is bad.
    let true_is_bad = c.type_ == reason::CONFLICTED || c.type_ == proxies::NAME_CONFLICTED;
    let bad = if true_is_bad {
        c.status == ConditionStatus::True
    } else {
        c.status == ConditionStatus::False && c.reason != reason::PENDING
    };
    let good = if true_is_bad {
        c.status == ConditionStatus::False
    } else {
        c.status == ConditionStatus::True
    };
    if bad {
        Some(EventType::Warning)
    } else if good && (!first_report || announce_true) {
        Some(EventType::Normal)
    } else {
        None
    }
}

fn truncate(mut note: String) -> String {
    if note.len() > MAX_NOTE {
        let mut cut = MAX_NOTE - 3;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
        note.push_str("...");
    }
    note
}

/// Route status writes in flight at once.
const ROUTE_WRITES_IN_FLIGHT: usize = 16;

impl StatusWriter {
    pub fn new(
        client: Client,
        controller_name: String,
        controller_namespace: String,
        leader: Arc<AtomicBool>,
        admin: Arc<admin::State>,
        instance: Option<String>,
    ) -> Self {
        let (events, mut pending) = mpsc::channel::<(ObjectReference, Event)>(EVENT_BACKLOG);
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: coxswain_api::names::FIELD_MANAGER.to_owned(),
                instance,
            },
        );
        let counts = admin.clone();
        // Publishing is slow next to compiling; it must never hold up status or snapshots.
        tokio::spawn(async move {
            while let Some((object, event)) = pending.recv().await {
                let type_ = match event.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                };
                match recorder.publish(&event, &object).await {
                    Ok(()) => counts.event(type_),
                    Err(e) => {
                        tracing::debug!(error = %e, reason = %event.reason, "event not published")
                    }
                }
            }
        });
        Self {
            client,
            controller_name,
            controller_namespace,
            leader,
            admin,
            events,
            reported: HashMap::new(),
            ingress_findings: HashMap::new(),
            class_findings: HashMap::new(),
            shared_gateway_ports: true,
        }
    }

    /// Whether shared Gateways get Services and ports of their own (default: they do).
    pub fn with_shared_gateway_ports(mut self, on: bool) -> Self {
        self.shared_gateway_ports = on;
        self
    }

    fn leading(&self) -> bool {
        self.leader.load(Ordering::Acquire)
    }

    fn emit(&self, object: &ObjectReference, type_: EventType, reason: &str, note: String) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(truncate(note)),
            action: "Reconcile".to_owned(),
            secondary: None,
        };
        if self.events.try_send((object.clone(), event)).is_err() {
            tracing::debug!(%reason, "event backlog full; event dropped");
        }
    }

    /// Events for the conditions of one object (or one of its listeners or parents) whose
    /// status or reason changed since last reported; `existing` is what the object carries,
    /// used the first time a condition is seen.
    #[allow(clippy::too_many_arguments)]
    fn transitions(
        &self,
        next: &mut Reported,
        object: &ObjectReference,
        scope: &str,
        subject: &str,
        conditions: &[Condition],
        existing: &[Value],
        announce_true: bool,
    ) {
        for c in conditions {
            let key = condition_key(scope, subject, c.type_);
            let now = (c.status, c.reason);
            let before = self.reported.get(&key);
            let changed = match before {
                Some(before) => *before != now,
                None => !existing.iter().any(|e| {
                    e["type"] == c.type_
                        && e["status"] == status_str(c.status)
                        && e["reason"] == c.reason
                }),
            };
            let first = before.is_none() && !existing.iter().any(|e| e["type"] == c.type_);
            next.insert(key, now);
            if !changed {
                continue;
            }
            if let Some(type_) = event_for(c, first, announce_true) {
                let mut note = format!("{subject}{}={}", c.type_, status_str(c.status));
                if !c.message.is_empty() {
                    note.push_str(": ");
                    note.push_str(&c.message);
                }
                self.emit(object, type_, c.reason, note);
            }
        }
    }

    async fn apply<K>(&self, api: Api<K>, kind: &'static str, name: &str, body: Value) -> bool
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        // Right before the write: a replica that lost the Lease stops within one request.
        if !self.leading() {
            return false;
        }
        let params = PatchParams::apply(coxswain_api::names::FIELD_MANAGER).force();
        match api.patch_status(name, &params, &Patch::Apply(&body)).await {
            Ok(_) => {
                self.admin.status_write(kind, true);
                true
            }
            // Someone else changed the object since our cache saw it; its watch event brings
            // the new version and another pass.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                self.admin.status_conflict(kind);
                tracing::debug!(%kind, %name, "status conflict; retrying on the next pass");
                false
            }
            Err(e) => {
                self.admin.status_write(kind, false);
                tracing::warn!(%kind, %name, error = %e, "status not written");
                false
            }
        }
    }

    /// ListenerSets: their conditions and listeners, Programmed as their Gateway's listeners
    /// are (the proxy serving the Gateway has bound the port and acknowledged the snapshot).
    async fn listener_sets(
        &self,
        next: &mut Reported,
        store: &Store,
        compiled: &Compiled,
        hub: &Hub,
        now: &str,
    ) {
        for ls in &store.listener_sets {
            let key = crate::compile::gateway::listener_set_key(ls);
            let Some(decision) = compiled.status.listener_sets.get(&key) else {
                continue;
            };
            let version = compiled
                .versions
                .get(&decision.scope)
                .cloned()
                .unwrap_or_default();
            let current = ls
                .status
                .as_ref()
                .and_then(|s| serde_json::to_value(s).ok());
            let object = ls.object_ref(&());
            let event_scope = format!("ListenerSet/{key}");
            let mut all_serving = true;
            let mut listeners = Vec::new();
            let own = compiled.gateway_services.services.get(&decision.gateway);
            for l in &decision.listeners {
                let spec = ls.spec.listeners.iter().find(|x| x.name == l.name);
                let port = spec.map(|x| x.port).unwrap_or(0);
                let protocol = spec.map(|x| x.protocol.as_str()).unwrap_or_default();
                let serving = u32::try_from(port)
                    .ok()
                    .and_then(|p| bound_port(own, p, protocol))
                    .is_some_and(|p| hub.serving(&decision.scope, &version, p));
                let mut conditions = l.conditions.clone();
                programmed(&mut conditions, serving);
                // Listeners refused for their own reasons do not hold the set back.
                all_serving &= serving
                    || conditions.iter().any(|c| {
                        c.type_ == reason::PROGRAMMED && !c.is_true() && c.reason != reason::PENDING
                    });
                let existing = current
                    .as_ref()
                    .and_then(|s| s["listeners"].as_array().cloned())
                    .and_then(|ls| ls.into_iter().find(|x| x["name"] == l.name.as_str()))
                    .map(|x| existing_conditions(Some(x)))
                    .unwrap_or_default();
                self.transitions(
                    next,
                    &object,
                    &event_scope,
                    &format!("listener {}: ", l.name),
                    &conditions,
                    &existing,
                    false,
                );
                listeners.push(json!({
                    "name": l.name,
                    "supportedKinds": l.supported_kinds,
                    "attachedRoutes": l.attached_routes,
                    "conditions": render_conditions(&conditions, &existing, now),
                }));
            }
            let mut conditions = decision.conditions.clone();
            programmed(
                &mut conditions,
                all_serving && !decision.listeners.is_empty(),
            );
            let existing = existing_conditions(current.clone());
            self.transitions(
                next,
                &object,
                &event_scope,
                "",
                &conditions,
                &existing,
                true,
            );
            let rendered = render_conditions(&conditions, &existing, now);
            let unchanged = same_conditions(&rendered, &existing)
                && current
                    .as_ref()
                    .is_some_and(|c| same_listeners(&listeners, &c["listeners"]));
            if unchanged {
                continue;
            }
            let body = json!({
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "ListenerSet",
                "metadata": {"name": key.name, "namespace": key.namespace},
                "status": {"conditions": rendered, "listeners": listeners},
            });
            let api: Api<ListenerSet> = Api::namespaced(self.client.clone(), &key.namespace);
            self.apply(api, "ListenerSet", &key.name, body).await;
        }
    }

    /// `status.parents` of routes (`status.ancestors` of policies): our entries as decided,
    /// other controllers' entries as they are. An object we have nothing to say about any
    /// more (its parentRefs no longer name a Gateway of ours) loses the entries we wrote.
    async fn route_parents<K: SharedStatus, D: ParentDecision, V: AsRef<[D]> + Clone>(
        &self,
        next: &mut Reported,
        routes: &crate::compile::store::Objects<K>,
        decisions: &impl DecisionsByKey<V>,
        now: &str,
    ) {
        let (kind, (list, reference)) = (K::KIND, K::FIELDS);
        let controller_name = self.controller_name.as_str();
        let mut writes = Vec::new();
        for route in routes {
            let meta = route.meta();
            let (Some(ns), Some(name)) = (meta.namespace.as_deref(), meta.name.as_deref()) else {
                continue;
            };
            let current_parents = route.entries();
            let ours = match decisions.decision(&ObjectKey::new(ns, name)) {
                Some(ours) => ours.as_ref(),
                None if current_parents
                    .iter()
                    .any(|p| p["controllerName"] == controller_name) =>
                {
                    &[]
                }
                None => continue,
            };
            let object = route.object_ref(&());
            let event_scope = format!("{kind}/{ns}/{name}");
            // Other controllers' entries stay as they are.
            let mut parents: Vec<Value> = current_parents
                .iter()
                .filter(|p| p["controllerName"] != controller_name)
                .cloned()
                .collect();
            for p in ours {
                let parent_ref = p.reference();
                let existing = current_parents
                    .iter()
                    .find(|e| {
                        e["controllerName"] == controller_name
                            && same_parent_ref(&e[reference], &parent_ref)
                    })
                    .map(|e| existing_conditions(Some(e.clone())))
                    .unwrap_or_default();
                let subject = p.subject();
                // Routes are many: only problems and recoveries are worth an Event.
                self.transitions(
                    next,
                    &object,
                    &event_scope,
                    &subject,
                    p.conditions(),
                    &existing,
                    false,
                );
                let mut entry = json!({
                    "controllerName": p.controller_name(),
                    "conditions": render_conditions(p.conditions(), &existing, now),
                });
                entry[reference] = parent_ref;
                parents.push(entry);
            }
            if same_parents(&parents, &current_parents) {
                continue;
            }
            // status.parents is an atomic list shared with other controllers: the apply
            // carries the resourceVersion it was computed from, so it fails (and is redone)
            // instead of dropping an entry another controller wrote in between.
            let mut status = json!({});
            status[list] = Value::Array(parents);
            let body = json!({
                "apiVersion": K::API_VERSION,
                "kind": kind,
                "metadata": {
                    "name": name,
                    "namespace": ns,
                    "resourceVersion": meta.resource_version,
                },
                "status": status,
            });
            writes.push((Api::<K>::namespaced(self.client.clone(), ns), name, body));
        }
        // Routes are the many objects: their writes go out a few at a time, not one round
        // trip after another (1,000 routes created at once waited seconds for status).
        use futures::StreamExt;
        futures::stream::iter(writes)
            .for_each_concurrent(ROUTE_WRITES_IN_FLIGHT, |(api, name, body)| async move {
                self.apply(api, kind, name, body).await;
            })
            .await;
    }

    /// Writes every status that differs from what the objects carry.
    /// `names`: the dedicated proxies' names, for their Services' addresses and the
    /// name-conflict condition.
    pub async fn write(
        &mut self,
        store: &Store,
        compiled: &Compiled,
        hub: &Hub,
        names: &ProxyNames,
    ) {
        if !self.leading() {
            // A standby reports nothing; when it takes over it compares with the objects.
            self.reported.clear();
            self.ingress_findings.clear();
            self.class_findings.clear();
            return;
        }
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let decisions: &StatusDecisions = &compiled.status;
        let mut next = HashMap::new();

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
            let object = class.object_ref(&());
            self.transitions(
                &mut next,
                &object,
                &format!("GatewayClass/{name}"),
                "",
                conditions,
                &existing,
                true,
            );
            let rendered = render_conditions(conditions, &existing, &now);
            let dedicated = class.spec.parameters_ref.as_ref().is_some_and(|p| {
                p.group == coxswain_api::names::GATEWAY_GROUP
                    && p.kind == "CoxswainGatewayParameters"
            });
            let features: Vec<Value> = class_features(dedicated, self.shared_gateway_ports)
                .into_iter()
                .map(|name| json!({"name": name}))
                .collect();
            let current_features = class
                .status
                .as_ref()
                .and_then(|s| serde_json::to_value(&s.supported_features).ok())
                .and_then(|v| v.as_array().cloned())
                .unwrap_or_default();
            if same_conditions(&rendered, &existing) && current_features == features {
                continue;
            }
            let body = json!({
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "GatewayClass",
                "metadata": {"name": name},
                "status": {"conditions": rendered, "supportedFeatures": features},
            });
            let api: Api<GatewayClass> = Api::all(self.client.clone());
            self.apply(api, "GatewayClass", name, body).await;
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
            let version = compiled.versions.get(&scope).cloned().unwrap_or_default();
            let current = gw
                .status
                .as_ref()
                .and_then(|s| serde_json::to_value(s).ok());
            let object = gw.object_ref(&());
            let event_scope = format!("Gateway/{key}");
            let mut all_serving = true;
            let mut listeners = Vec::new();
            // A shared Gateway's own Service, and the internal ports its listeners are on.
            let own = compiled.gateway_services.services.get(&key);
            for l in &decision.listeners {
                let spec = gw.spec.listeners.iter().find(|x| x.name == l.name);
                let port = spec.map(|x| x.port).unwrap_or(0);
                let protocol = spec.map(|x| x.protocol.as_str()).unwrap_or_default();
                let serving = u32::try_from(port)
                    .ok()
                    .and_then(|p| bound_port(own, p, protocol))
                    .is_some_and(|p| hub.serving(&scope, &version, p));
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
                // Listener-level good news is in the Gateway's own Programmed Event.
                self.transitions(
                    &mut next,
                    &object,
                    &event_scope,
                    &format!("listener {}: ", l.name),
                    &conditions,
                    &existing,
                    false,
                );
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
            let proxy = decision.dedicated.then(|| names.get(ns, name)).flatten();
            // The address clients use: the dedicated proxy's Service, the shared Gateway's own,
            // or the shared pool's.
            let (svc_ns, svc_name) = if decision.dedicated {
                (
                    ns,
                    proxy.map(|p| p.name.clone()).unwrap_or_else(|| {
                        coxswain_api::names::dedicated_proxy_name(name, &gw.spec.gateway_class_name)
                    }),
                )
            } else if let Some(own) = own {
                (self.controller_namespace.as_str(), own.name.clone())
            } else {
                (
                    self.controller_namespace.as_str(),
                    coxswain_api::names::SHARED_PROXY_SERVICE.to_owned(),
                )
            };
            let service = store
                .services
                .iter()
                .find(|s| {
                    s.metadata.namespace.as_deref() == Some(svc_ns)
                        && s.metadata.name.as_deref() == Some(svc_name.as_str())
                })
                .map(|s| &**s);
            let address_issue = match compiled.gateway_services.unassigned.get(&key) {
                Some(why) => Some((reason::ADDRESS_NOT_ASSIGNED, why.clone())),
                None => address_problem(&decision.requested_addresses, service, svc_ns, &svc_name),
            };
            if let Some((why, message)) = &address_issue {
                not_programmed(&mut conditions, why, message.clone());
            }
            if let Some(message) = proxy.and_then(|p| p.conflict_message()) {
                conditions.push(Condition::new(
                    proxies::NAME_CONFLICTED,
                    true,
                    proxies::NAME_TAKEN,
                    message,
                    gw.metadata.generation.unwrap_or(0),
                ));
            }
            let existing = existing_conditions(current.clone());
            self.transitions(
                &mut next,
                &object,
                &event_scope,
                "",
                &conditions,
                &existing,
                true,
            );
            let rendered = render_conditions(&conditions, &existing, &now);
            let addresses = match &address_issue {
                // The address the Gateway is being given, from the moment it asks: the load
                // balancer's previous one is on its way out, and Programmed=False says the
                // new one is not there yet.
                Some((reason::ADDRESS_NOT_ASSIGNED, _)) => decision
                    .requested_addresses
                    .iter()
                    .map(|ip| json!({"type": "IPAddress", "value": ip.to_string()}))
                    .collect(),
                _ => gateway_addresses(store, svc_ns, &svc_name),
            };
            // Left out when 0, so a cluster whose CRD predates ListenerSets never sees it.
            let attached_sets =
                (decision.attached_listener_sets > 0).then_some(decision.attached_listener_sets);
            let unchanged = same_conditions(&rendered, &existing)
                && current.as_ref().is_some_and(|c| {
                    same_listeners(&listeners, &c["listeners"])
                        && c["addresses"].as_array().cloned().unwrap_or_default() == addresses
                        && c["attachedListenerSets"].as_i64().filter(|n| *n > 0)
                            == attached_sets.map(i64::from)
                });
            if unchanged {
                continue;
            }
            let mut status =
                json!({"conditions": rendered, "listeners": listeners, "addresses": addresses});
            if let Some(n) = attached_sets {
                status["attachedListenerSets"] = json!(n);
            }
            let body = json!({
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "Gateway",
                "metadata": {"name": name, "namespace": ns},
                "status": status,
            });
            let api: Api<Gateway> = Api::namespaced(self.client.clone(), ns);
            self.apply(api, "Gateway", name, body).await;
        }

        self.listener_sets(&mut next, store, compiled, hub, &now)
            .await;
        self.route_parents(&mut next, &store.http_routes, &decisions.http_routes, &now)
            .await;
        self.route_parents(&mut next, &store.grpc_routes, &decisions.grpc_routes, &now)
            .await;
        self.route_parents(&mut next, &store.tls_routes, &decisions.tls_routes, &now)
            .await;
        self.route_parents(&mut next, &store.tcp_routes, &decisions.tcp_routes, &now)
            .await;
        self.route_parents(&mut next, &store.udp_routes, &decisions.udp_routes, &now)
            .await;
        self.route_parents(
            &mut next,
            &store.backend_tls_policies,
            &decisions.backend_tls_policies,
            &now,
        )
        .await;
        self.route_parents(
            &mut next,
            &store.backend_policies,
            &decisions.backend_policies,
            &now,
        )
        .await;
        self.route_parents(
            &mut next,
            &store.access_policies,
            &decisions.access_policies,
            &now,
        )
        .await;

        // Ingresses of our classes are served by the shared pool: its address is theirs.
        let shared = load_balancer_ingress(
            store,
            &self.controller_namespace,
            coxswain_api::names::SHARED_PROXY_SERVICE,
        );
        let mut findings_now = HashMap::new();
        for ingress in &store.ingresses {
            let (Some(ns), Some(name)) = (
                ingress.metadata.namespace.as_deref(),
                ingress.metadata.name.as_deref(),
            ) else {
                continue;
            };
            let key = ObjectKey::new(ns, name);
            let Some(decision) = decisions.ingresses.get(&key) else {
                continue;
            };
            let findings = ingress_findings(decision);
            let before = self.ingress_findings.get(&key);
            if before != Some(&findings) {
                let object = ingress.object_ref(&());
                let known = before.map(Vec::as_slice).unwrap_or_default();
                for (reason, note) in findings.iter().filter(|f| !known.contains(f)) {
                    self.emit(&object, EventType::Warning, reason, note.clone());
                }
                if findings.is_empty() && !known.is_empty() {
                    self.emit(
                        &object,
                        EventType::Normal,
                        INGRESS_RESOLVED,
                        "every rule and annotation is applied".to_owned(),
                    );
                }
            }
            findings_now.insert(key, findings);
            let current = ingress
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| serde_json::to_value(lb.ingress.clone().unwrap_or_default()).ok())
                .and_then(|v| v.as_array().cloned())
                .unwrap_or_default();
            if current == shared {
                continue;
            }
            let body = json!({
                "apiVersion": "networking.k8s.io/v1",
                "kind": "Ingress",
                "metadata": {"name": name, "namespace": ns},
                "status": {"loadBalancer": {"ingress": shared}},
            });
            let api: Api<Ingress> = Api::namespaced(self.client.clone(), ns);
            self.apply(api, "Ingress", name, body).await;
        }
        self.reported = next;
        self.ingress_findings = findings_now;

        // IngressClasses whose parameters reference is not used: said once per change.
        for class in &store.ingress_classes {
            let Some(name) = class.metadata.name.as_deref() else {
                continue;
            };
            let Some(why) = decisions.ingress_classes.get(name) else {
                continue;
            };
            if self.class_findings.get(name) != Some(why) {
                self.emit(
                    &class.object_ref(&()),
                    EventType::Warning,
                    INVALID_PARAMETERS_REF,
                    why.clone(),
                );
            }
        }
        self.class_findings = decisions.ingress_classes.clone().into_iter().collect();
    }
}

/// Kinds whose status is a list of per-Gateway entries that several controllers share.
trait SharedStatus:
    kube::Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
{
    const KIND: &'static str;
    const API_VERSION: &'static str = "gateway.networking.k8s.io/v1";
    /// The list and the reference field of its entries.
    const FIELDS: (&'static str, &'static str);
    /// The entries as the object carries them.
    fn entries(&self) -> Vec<Value>;
}

fn as_values<T: serde::Serialize>(list: Option<&Vec<T>>) -> Vec<Value> {
    list.and_then(|l| serde_json::to_value(l).ok())
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
}

impl SharedStatus for HttpRoute {
    const KIND: &'static str = "HTTPRoute";
    const FIELDS: (&'static str, &'static str) = ("parents", "parentRef");
    fn entries(&self) -> Vec<Value> {
        as_values(self.status.as_ref().map(|s| &s.parents))
    }
}

impl SharedStatus for GrpcRoute {
    const KIND: &'static str = "GRPCRoute";
    const FIELDS: (&'static str, &'static str) = ("parents", "parentRef");
    fn entries(&self) -> Vec<Value> {
        as_values(self.status.as_ref().map(|s| &s.parents))
    }
}

impl SharedStatus for TlsRoute {
    const KIND: &'static str = "TLSRoute";
    const FIELDS: (&'static str, &'static str) = ("parents", "parentRef");
    fn entries(&self) -> Vec<Value> {
        as_values(self.status.as_ref().map(|s| &s.parents))
    }
}

impl SharedStatus for TcpRoute {
    const KIND: &'static str = "TCPRoute";
    const API_VERSION: &'static str = "gateway.networking.k8s.io/v1alpha2";
    const FIELDS: (&'static str, &'static str) = ("parents", "parentRef");
    fn entries(&self) -> Vec<Value> {
        as_values(self.status.as_ref().map(|s| &s.parents))
    }
}

impl SharedStatus for UdpRoute {
    const KIND: &'static str = "UDPRoute";
    const API_VERSION: &'static str = "gateway.networking.k8s.io/v1alpha2";
    const FIELDS: (&'static str, &'static str) = ("parents", "parentRef");
    fn entries(&self) -> Vec<Value> {
        as_values(self.status.as_ref().map(|s| &s.parents))
    }
}

impl SharedStatus for BackendTlsPolicy {
    const KIND: &'static str = "BackendTLSPolicy";
    const FIELDS: (&'static str, &'static str) = ("ancestors", "ancestorRef");
    fn entries(&self) -> Vec<Value> {
        as_values(self.status.as_ref().map(|s| &s.ancestors))
    }
}

impl SharedStatus for CoxswainAccessPolicy {
    const KIND: &'static str = "CoxswainAccessPolicy";
    const API_VERSION: &'static str = "gateway.coxswain-labs.dev/v1alpha1";
    const FIELDS: (&'static str, &'static str) = ("ancestors", "ancestorRef");
    fn entries(&self) -> Vec<Value> {
        as_values(self.status.as_ref().map(|s| &s.ancestors))
    }
}

impl SharedStatus for CoxswainBackendPolicy {
    const KIND: &'static str = "CoxswainBackendPolicy";
    const API_VERSION: &'static str = "gateway.coxswain-labs.dev/v1alpha1";
    const FIELDS: (&'static str, &'static str) = ("ancestors", "ancestorRef");
    fn entries(&self) -> Vec<Value> {
        as_values(self.status.as_ref().map(|s| &s.ancestors))
    }
}

/// One entry of a shared status list as decided: a route's parent or a policy's ancestor.
trait ParentDecision {
    /// The entry's parentRef / ancestorRef.
    fn reference(&self) -> Value;
    /// Prefix of Event notes about this entry.
    fn subject(&self) -> String;
    fn controller_name(&self) -> &str;
    fn conditions(&self) -> &[Condition];
}

impl ParentDecision for RouteParentStatus {
    fn reference(&self) -> Value {
        serde_json::to_value(&self.parent_ref).unwrap_or(Value::Null)
    }
    fn subject(&self) -> String {
        let mut subject = format!(
            "parent {}/{}",
            self.parent_ref.namespace, self.parent_ref.name
        );
        if let Some(section) = &self.parent_ref.section_name {
            subject.push('/');
            subject.push_str(section);
        }
        subject.push_str(": ");
        subject
    }
    fn controller_name(&self) -> &str {
        &self.controller_name
    }
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
}

impl ParentDecision for PolicyAncestorStatus {
    fn reference(&self) -> Value {
        serde_json::to_value(&self.ancestor_ref).unwrap_or(Value::Null)
    }
    fn subject(&self) -> String {
        let r = &self.ancestor_ref;
        match &r.namespace {
            Some(ns) => format!("{} {ns}/{}: ", r.kind, r.name),
            None => format!("{} {}: ", r.kind, r.name),
        }
    }
    fn controller_name(&self) -> &str {
        &self.controller_name
    }
    fn conditions(&self) -> &[Condition] {
        &self.conditions
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

/// The same parent: kind, name, namespace, section and port. A route's parents are Gateways
/// or ListenerSets; a policy's ancestors may also be IngressClasses or Services.
fn same_parent_ref(a: &Value, b: &Value) -> bool {
    ["kind", "name", "namespace", "sectionName", "port"]
        .iter()
        .all(|k| a.get(k) == b.get(k))
}

/// A pass's decisions by object: the compiler's persistent maps for routes, plain maps for
/// policies.
trait DecisionsByKey<V> {
    fn decision(&self, key: &ObjectKey) -> Option<&V>;
}

impl<V> DecisionsByKey<V> for BTreeMap<ObjectKey, V> {
    fn decision(&self, key: &ObjectKey) -> Option<&V> {
        self.get(key)
    }
}

impl<V: Clone> DecisionsByKey<V> for imbl::OrdMap<Arc<ObjectKey>, V> {
    fn decision(&self, key: &ObjectKey) -> Option<&V> {
        self.get(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(type_: &'static str, ok: bool, reason: &'static str) -> Condition {
        Condition::new(type_, ok, reason, "", 1)
    }

    #[test]
    fn a_shared_pool_class_claims_what_a_shared_gateway_can_do() {
        let dedicated = class_features(true, true);
        assert_eq!(dedicated, SUPPORTED_FEATURES);
        let shared = class_features(false, true);
        for f in DEDICATED_ONLY_FEATURES {
            assert!(!shared.contains(f), "{f}");
        }
        assert!(shared.contains(&"GatewayStaticAddresses"));
        assert!(shared.contains(&"HTTPRoute"));
        let without_ports = class_features(false, false);
        for f in OWN_PORTS_FEATURES.iter().chain(DEDICATED_ONLY_FEATURES) {
            assert!(!without_ports.contains(f), "{f}");
        }
        // Every feature named here is one the controller claims somewhere.
        for f in OWN_PORTS_FEATURES.iter().chain(DEDICATED_ONLY_FEATURES) {
            assert!(SUPPORTED_FEATURES.contains(f), "{f}");
        }
    }

    #[test]
    fn problems_warn_and_good_news_is_announced_only_where_asked() {
        let warn = Some(EventType::Warning);
        let normal = Some(EventType::Normal);
        let missing = cond(reason::RESOLVED_REFS, false, reason::BACKEND_NOT_FOUND);
        assert_eq!(event_for(&missing, true, false), warn);
        // Waiting for the data plane is not a problem.
        let pending = cond(reason::PROGRAMMED, false, reason::PENDING);
        assert_eq!(event_for(&pending, true, true), None);
        // Conflicted is the condition where True is bad.
        let conflicted = cond(reason::CONFLICTED, true, reason::HOSTNAME_CONFLICT);
        assert_eq!(event_for(&conflicted, false, true), warn);
        let resolved = cond(reason::CONFLICTED, false, reason::NO_CONFLICTS);
        assert_eq!(event_for(&resolved, false, false), normal);
        assert_eq!(event_for(&resolved, true, false), None);
        let accepted = cond(reason::ACCEPTED, true, reason::ACCEPTED);
        // A route accepted at once: nothing to say. A recovery, or a Gateway: an Event.
        assert_eq!(event_for(&accepted, true, false), None);
        assert_eq!(event_for(&accepted, false, false), normal);
        assert_eq!(event_for(&accepted, true, true), normal);
    }

    fn lb_service(type_: &str, assigned: &[&str]) -> k8s_openapi::api::core::v1::Service {
        let ingress: Vec<Value> = assigned.iter().map(|ip| json!({"ip": ip})).collect();
        serde_json::from_value(json!({
            "metadata": {"name": "gw-dedicated", "namespace": "web"},
            "spec": {"type": type_},
            "status": {"loadBalancer": {"ingress": ingress}},
        }))
        .expect("service")
    }

    fn problem(
        requested: &[&str],
        svc: Option<&k8s_openapi::api::core::v1::Service>,
    ) -> Option<&'static str> {
        let requested: Vec<std::net::IpAddr> =
            requested.iter().map(|ip| ip.parse().expect("ip")).collect();
        address_problem(&requested, svc, "web", "gw-dedicated").map(|(why, _)| why)
    }

    // Gateway API, GatewayStatus.addresses and the Programmed condition: a requested address
    // the Gateway does not get is AddressNotAssigned; one it cannot get, AddressNotUsable.
    #[test]
    fn requested_addresses_hold_programmed_until_the_load_balancer_assigns_them() {
        assert_eq!(problem(&[], None), None);
        assert_eq!(
            problem(&["10.97.3.250"], None),
            Some(reason::ADDRESS_NOT_ASSIGNED)
        );
        let pending = lb_service("LoadBalancer", &[]);
        assert_eq!(
            problem(&["10.97.3.250"], Some(&pending)),
            Some(reason::ADDRESS_NOT_ASSIGNED)
        );
        let other = lb_service("LoadBalancer", &["10.97.3.2"]);
        assert_eq!(
            problem(&["10.97.3.250"], Some(&other)),
            Some(reason::ADDRESS_NOT_ASSIGNED)
        );
        let assigned = lb_service("LoadBalancer", &["10.97.3.250"]);
        assert_eq!(problem(&["10.97.3.250"], Some(&assigned)), None);
        assert_eq!(
            problem(&["10.97.3.250", "10.97.3.251"], Some(&assigned)),
            Some(reason::ADDRESS_NOT_USABLE)
        );
        let cluster_ip = lb_service("ClusterIP", &[]);
        assert_eq!(
            problem(&["10.97.3.250"], Some(&cluster_ip)),
            Some(reason::ADDRESS_NOT_USABLE)
        );
    }

    #[test]
    fn an_address_problem_replaces_pending_or_programmed_but_not_invalid() {
        for (before, ok) in [(reason::PENDING, false), (reason::PROGRAMMED, true)] {
            let mut conditions = vec![cond(reason::PROGRAMMED, ok, before)];
            not_programmed(&mut conditions, reason::ADDRESS_NOT_USABLE, "why".into());
            assert_eq!(conditions[0].status, ConditionStatus::False);
            assert_eq!(conditions[0].reason, reason::ADDRESS_NOT_USABLE);
        }
        let mut invalid = vec![cond(reason::PROGRAMMED, false, reason::INVALID)];
        not_programmed(&mut invalid, reason::ADDRESS_NOT_USABLE, "why".into());
        assert_eq!(invalid[0].reason, reason::INVALID);
    }

    #[test]
    fn notes_are_cut_to_the_events_api_limit_on_a_char_boundary() {
        let long = "é".repeat(MAX_NOTE);
        let cut = truncate(long);
        assert!(cut.len() <= MAX_NOTE, "{}", cut.len());
        assert!(cut.ends_with("..."));
        assert_eq!(truncate("short".into()), "short");
    }
}
