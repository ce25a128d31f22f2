//! The provisioning operator: a kube-runtime Controller over Gateways of our classes. A Gateway
//! whose class or own `spec.infrastructure.parametersRef` names CoxswainGatewayParameters gets a
//! dedicated proxy in its namespace: ServiceAccount (no RBAC), trust-bundle ConfigMap,
//! Deployment, Service, and an HPA / PDB when asked for, all owned by the Gateway (garbage
//! collection removes them with it) and server-side applied by field manager
//! `coxswain-controller`. Leaving dedicated mode deletes them. Only the leader writes.
//!
//! Invalid references are reported on the Gateway/GatewayClass status by the compiler
//! (`Accepted=False`, `InvalidParameters`); here they only stop the rollout of a change, so a
//! typo never tears down a running proxy.
//!
//! The objects' name comes from [`crate::compile::proxies`]: the compiler assigns them over
//! every dedicated Gateway at once (two Gateways can want the same GEP-1762 name), and the
//! controller loop publishes them here.

pub mod addresses;
pub mod gateway_services;
pub mod render;

use coxswain_api::crd::gateway::CoxswainGatewayParameters;
use coxswain_api::names::{self, labels};
use futures::StreamExt;
use gateway_api::apis::standard::gatewayclasses::GatewayClass;
use gateway_api::apis::standard::gateways::Gateway;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

pub use crate::compile::proxies::{ProxyName, ProxyNames};
pub use render::{Inputs, RenderError, Rendered};

/// How long a reconcile waits for the controller loop to name a new dedicated Gateway's proxy.
const NAME_WAIT: Duration = Duration::from_secs(10);

/// What the reconciler needs beyond the Gateway.
pub struct Context {
    pub client: Client,
    pub controller_name: String,
    pub controller_namespace: String,
    pub default_image: String,
    pub trust_bundle_pem: String,
    pub leader: Arc<AtomicBool>,
    pub recorder: Recorder,
    /// The proxies' names, assigned by the controller loop (see [`crate::compile::proxies`]).
    pub names: watch::Receiver<Arc<ProxyNames>>,
    /// Last override notes per Gateway, so each becomes one Event, not one per reconcile.
    reported: Mutex<HashMap<(String, String), Vec<String>>>,
}

impl Context {
    pub fn new(
        client: Client,
        controller_name: String,
        controller_namespace: String,
        default_image: String,
        trust_bundle_pem: String,
        leader: Arc<AtomicBool>,
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
            controller_namespace,
            default_image,
            trust_bundle_pem,
            leader,
            recorder,
            // Until `with_proxy_names`: nothing is ever named, so nothing is provisioned.
            names: watch::channel(Arc::new(ProxyNames::default())).1,
            reported: Mutex::new(HashMap::new()),
        }
    }

    /// Where the controller loop publishes the proxies' names.
    pub fn with_proxy_names(mut self, names: watch::Receiver<Arc<ProxyNames>>) -> Self {
        self.names = names;
        self
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Render(#[from] RenderError),
}

/// Runs the Controller until `stop`.
pub async fn run(
    ctx: Arc<Context>,
    stop: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let owned = watcher::Config::default().labels(&format!(
        "{}={}",
        labels::COMPONENT,
        labels::COMPONENT_DEDICATED_PROXY
    ));
    let controller = Controller::new(
        Api::<Gateway>::all(client.clone()),
        watcher::Config::default(),
    );
    let gateways = controller.store();
    let by_params = gateways.clone();
    let by_class = gateways.clone();
    // A Gateway's proxy is renamed when a name conflict appears or ends: re-render them all
    // (rare; a reconcile that changes nothing is one no-op apply per object).
    let renames = {
        let mut names = ctx.names.clone();
        let seen = names.borrow_and_update().clone();
        futures::stream::unfold((names, seen), |(mut names, mut seen)| async move {
            loop {
                names.changed().await.ok()?;
                let next = names.borrow_and_update().clone();
                let renamed = seen.renamed_in(&next);
                seen = next;
                if renamed {
                    return Some(((), (names, seen)));
                }
            }
        })
    };
    controller
        .owns(Api::<Deployment>::all(client.clone()), owned.clone())
        .owns(Api::<Service>::all(client.clone()), owned.clone())
        .owns(Api::<ServiceAccount>::all(client.clone()), owned.clone())
        // A change of parameters re-renders every Gateway: which ones use them depends on
        // their classes too, and an idempotent reconcile of the others costs one no-op apply.
        .watches(
            Api::<CoxswainGatewayParameters>::all(client.clone()),
            watcher::Config::default(),
            move |_params| {
                by_params
                    .state()
                    .iter()
                    .map(|gw| ObjectRef::from_obj(gw.as_ref()))
                    .collect::<Vec<_>>()
            },
        )
        .watches(
            Api::<GatewayClass>::all(client.clone()),
            watcher::Config::default(),
            move |class| {
                let class = class.name_any();
                by_class
                    .state()
                    .iter()
                    .filter(|gw| gw.spec.gateway_class_name == class)
                    .map(|gw| ObjectRef::from_obj(gw.as_ref()))
                    .collect::<Vec<_>>()
            },
        )
        .reconcile_all_on(renames)
        .graceful_shutdown_on(stop)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "provisioning reconcile failed");
            }
        })
        .await;
}

fn error_policy(gw: Arc<Gateway>, error: &ProvisionError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(gateway = %gw.name_any(), namespace = ?gw.namespace(), %error, "provisioning failed; retrying");
    Action::requeue(Duration::from_secs(10))
}

fn is_ours(group: &str, kind: &str) -> bool {
    group == names::GATEWAY_GROUP && kind == "CoxswainGatewayParameters"
}

async fn reconcile(gw: Arc<Gateway>, ctx: Arc<Context>) -> Result<Action, ProvisionError> {
    if !ctx.leader.load(Ordering::Acquire) {
        // A standby re-checks soon: it may be the leader by then.
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    let (Some(ns), Some(gw_name)) = (gw.namespace(), gw.metadata.name.clone()) else {
        return Ok(Action::await_change());
    };
    if gw.metadata.deletion_timestamp.is_some() {
        // Garbage collection removes the owned objects.
        return Ok(Action::await_change());
    }
    let classes: Api<GatewayClass> = Api::all(ctx.client.clone());
    let class = classes.get_opt(&gw.spec.gateway_class_name).await?;
    let Some(class) = class.filter(|c| c.spec.controller_name == ctx.controller_name) else {
        cleanup(&ctx, &ns, &gw_name, None).await?;
        return Ok(Action::await_change());
    };
    let class_ref = class
        .spec
        .parameters_ref
        .as_ref()
        .filter(|p| is_ours(&p.group, &p.kind));
    let gw_ref = gw
        .spec
        .infrastructure
        .as_ref()
        .and_then(|i| i.parameters_ref.as_ref())
        .filter(|p| is_ours(&p.group, &p.kind));
    if class_ref.is_none() && gw_ref.is_none() {
        cleanup(&ctx, &ns, &gw_name, None).await?;
        return Ok(Action::await_change());
    }
    let get_params = |ns: String, name: String| {
        let client = ctx.client.clone();
        async move {
            let api: Api<CoxswainGatewayParameters> = Api::namespaced(client, &ns);
            api.get_opt(&name).await
        }
    };
    let class_params = match class_ref {
        Some(p) => match p.namespace.clone() {
            Some(pns) => match get_params(pns, p.name.clone()).await? {
                Some(params) => Some(params),
                // Reported as InvalidParameters by the status writer; keep what runs.
                None => return Ok(Action::requeue(Duration::from_secs(30))),
            },
            None => return Ok(Action::requeue(Duration::from_secs(30))),
        },
        None => None,
    };
    let gateway_params = match gw_ref {
        Some(p) => match get_params(ns.clone(), p.name.clone()).await? {
            Some(params) => Some(params),
            None => return Ok(Action::requeue(Duration::from_secs(30))),
        },
        None => None,
    };
    let describe = |p: &Option<CoxswainGatewayParameters>| {
        p.as_ref()
            .map(|p| {
                format!(
                    "CoxswainGatewayParameters {}/{}",
                    p.namespace().unwrap_or_default(),
                    p.name_any()
                )
            })
            .unwrap_or_default()
    };
    let (class_name, gateway_name) = (describe(&class_params), describe(&gateway_params));
    let Some(proxy) = proxy_name(&ctx, &ns, &gw_name).await else {
        tracing::debug!(namespace = %ns, gateway = %gw_name, "no proxy name assigned yet");
        return Ok(Action::requeue(NAME_WAIT));
    };
    let inputs = Inputs {
        gateway: &gw,
        class_params: class_params.as_ref().map(|p| &p.spec),
        gateway_params: gateway_params.as_ref().map(|p| &p.spec),
        class_params_name: &class_name,
        gateway_params_name: &gateway_name,
        controller_namespace: &ctx.controller_namespace,
        controller_name: &ctx.controller_name,
        default_image: &ctx.default_image,
        trust_bundle_pem: &ctx.trust_bundle_pem,
        proxy_name: &proxy.name,
    };
    let mut rendered = match render::render(&inputs) {
        Ok(r) => r,
        Err(e) => {
            publish(
                &ctx,
                &gw,
                EventType::Warning,
                "InvalidParameters",
                &e.to_string(),
            )
            .await;
            return Err(e.into());
        }
    };
    addresses::request(&mut rendered.service, &gw);
    if !ctx.leader.load(Ordering::Acquire) {
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    apply(&ctx.client, &ns, &rendered.service_account).await?;
    apply(&ctx.client, &ns, &rendered.trust_bundle).await?;
    apply(&ctx.client, &ns, &rendered.deployment).await?;
    apply(&ctx.client, &ns, &rendered.service).await?;
    match &rendered.autoscaler {
        Some(hpa) => apply(&ctx.client, &ns, hpa).await?,
        None => {
            delete_if_present::<HorizontalPodAutoscaler>(&ctx.client, &ns, &rendered.name).await?
        }
    }
    match &rendered.disruption_budget {
        Some(pdb) => apply(&ctx.client, &ns, pdb).await?,
        None => delete_if_present::<PodDisruptionBudget>(&ctx.client, &ns, &rendered.name).await?,
    }
    // Objects of an earlier name (the Gateway moved to another class) go.
    cleanup(&ctx, &ns, &gw_name, Some(&rendered.name)).await?;

    let key = (ns.clone(), gw_name.clone());
    let new_overrides = {
        let mut reported = ctx.reported.lock().unwrap_or_else(|p| p.into_inner());
        let previous = reported.insert(key, rendered.overrides.clone());
        previous.as_ref() != Some(&rendered.overrides)
    };
    if new_overrides {
        for note in &rendered.overrides {
            publish(
                &ctx,
                &gw,
                EventType::Warning,
                "SecurityOverrideIgnored",
                note,
            )
            .await;
        }
    }
    tracing::debug!(namespace = %ns, gateway = %gw_name, proxy = %rendered.name, "dedicated proxy applied");
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// The name the controller loop assigned to this Gateway's proxy; a Gateway that just became
/// dedicated is named within one compile, so wait for it a little rather than requeue.
async fn proxy_name(ctx: &Context, namespace: &str, gateway: &str) -> Option<ProxyName> {
    let mut names = ctx.names.clone();
    tokio::time::timeout(
        NAME_WAIT,
        names.wait_for(|n| n.get(namespace, gateway).is_some()),
    )
    .await
    .ok()?
    .ok()?
    .get(namespace, gateway)
    .cloned()
}

async fn publish(ctx: &Context, gw: &Gateway, type_: EventType, reason: &str, note: &str) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note.to_owned()),
        action: "Provision".to_owned(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &gw.object_ref(&())).await {
        tracing::debug!(error = %e, "publishing an event failed");
    }
}

async fn apply<K>(client: &Client, ns: &str, obj: &K) -> Result<(), kube::Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Serialize
        + DeserializeOwned
        + Clone
        + Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    let mut obj = obj.clone();
    // Server-side apply needs apiVersion and kind in the body.
    let mut value = serde_json::to_value(&obj).map_err(kube::Error::SerdeError)?;
    value["apiVersion"] = K::api_version(&()).into();
    value["kind"] = K::kind(&()).into();
    obj.meta_mut().managed_fields = None;
    let name = obj.meta().name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply(names::FIELD_MANAGER).force(),
        &Patch::Apply(&value),
    )
    .await?;
    Ok(())
}

async fn delete_if_present<K>(client: &Client, ns: &str, name: &str) -> Result<(), kube::Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + DeserializeOwned
        + Clone
        + Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Deletes the Gateway's dedicated objects that this controller made, except those named
/// `keep`.
async fn cleanup(
    ctx: &Context,
    ns: &str,
    gateway: &str,
    keep: Option<&str>,
) -> Result<(), kube::Error> {
    let selector = format!(
        "{}={},{}={},{}={}",
        labels::COMPONENT,
        labels::COMPONENT_DEDICATED_PROXY,
        labels::GATEWAY_NAME,
        gateway,
        labels::MANAGED_BY,
        labels::MANAGED_BY_VALUE
    );
    let keep_trust = keep.map(|k| format!("{k}-trust"));
    let keep = |name: &str| keep == Some(name) || keep_trust.as_deref() == Some(name);
    let lp = ListParams::default().labels(&selector);
    let client = &ctx.client;
    macro_rules! sweep {
        ($kind:ty, $label:literal) => {{
            let api: Api<$kind> = Api::namespaced(client.clone(), ns);
            for obj in api.list(&lp).await? {
                let name = obj.name_any();
                let ours = obj.annotations().get(render::CONTROLLER_ANNOTATION)
                    == Some(&ctx.controller_name);
                if ours && !keep(&name) {
                    delete_if_present::<$kind>(client, ns, &name).await?;
                    tracing::info!(namespace = ns, gateway, kind = $label, %name, "dedicated proxy object removed");
                }
            }
        }};
    }
    sweep!(Deployment, "Deployment");
    sweep!(Service, "Service");
    sweep!(ServiceAccount, "ServiceAccount");
    sweep!(ConfigMap, "ConfigMap");
    sweep!(HorizontalPodAutoscaler, "HorizontalPodAutoscaler");
    sweep!(PodDisruptionBudget, "PodDisruptionBudget");
    Ok(())
}
