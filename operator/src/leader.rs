//! Leader election on a coordination.k8s.io Lease. One replica holds it and renews it; the
//! others watch it expire and take it over. Writes use the Lease's resourceVersion, so two
//! replicas cannot both believe they took it: the API server accepts one update and refuses
//! the other with a conflict.

use coxswain_api::names::{LEADER_LABEL, LEADER_LABEL_VALUE};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ListParams, Patch, PatchParams};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// This replica's identity (its pod name).
    pub identity: String,
    /// How long a lease holds without renewal.
    pub duration: Duration,
    /// How often the holder renews (and others check).
    pub renew_every: Duration,
    /// This replica's Pod in `namespace`: the leader labels it
    /// `discovery.coxswain-labs.dev/leader=true` (and no other Pod), so the discovery Service
    /// routes to the leader. None outside a Pod.
    pub pod: Option<String>,
}

/// How long after the start of its last successful renewal a leader that cannot renew keeps
/// leading: one renew period short of the Lease's duration, so that it has stopped writing
/// status and ended its discovery streams before a standby may take the Lease. One slow or
/// failed call within that time changes nothing.
fn renew_deadline(c: &LeaseConfig) -> Duration {
    c.duration.saturating_sub(c.renew_every).max(c.renew_every)
}

/// While renewals fail, how soon a leader tries again.
fn retry_every(c: &LeaseConfig) -> Duration {
    c.renew_every.min(Duration::from_secs(1))
}

/// Runs the election until `stop`; `leader` says whether this replica holds the lease right
/// now. On stop a holder releases the lease so a standby can take over at once.
pub async fn run(
    client: Client,
    config: LeaseConfig,
    leader: Arc<AtomicBool>,
    stop: impl std::future::Future<Output = ()>,
) {
    let api: Api<Lease> = Api::namespaced(client.clone(), &config.namespace);
    let pods: Api<Pod> = Api::namespaced(client, &config.namespace);
    tokio::pin!(stop);
    // While leading: when the last renewal that succeeded started. The API server stamped
    // the Lease no earlier, so it lapses no earlier than this plus its duration.
    let mut renewed: Option<Instant> = None;
    loop {
        let started = Instant::now();
        // kube's client has no read timeout: a call to an API server that stopped answering
        // would hang for good, with this replica still believing it leads.
        let budget = match renewed {
            Some(at) => (at + renew_deadline(&config)).saturating_duration_since(started),
            None => config.renew_every,
        };
        let outcome = match tokio::time::timeout(budget, try_acquire_or_renew(&api, &config)).await
        {
            Ok(Ok(held)) => Ok(held),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {} ms", budget.as_millis())),
        };
        let (held, failed) = match outcome {
            Ok(true) => {
                renewed = Some(started);
                (true, false)
            }
            Ok(false) => {
                renewed = None;
                (false, false)
            }
            Err(error) => match renewed {
                Some(at) if Instant::now() < at + renew_deadline(&config) => {
                    tracing::warn!(%error, "lease not renewed; still leading, retrying");
                    (true, true)
                }
                Some(_) => {
                    tracing::warn!(%error, "lease not renewed in time; stepping down");
                    renewed = None;
                    (false, true)
                }
                None => {
                    tracing::warn!(%error, "lease not reachable");
                    (false, true)
                }
            },
        };
        if leader.swap(held, Ordering::AcqRel) != held {
            tracing::info!(identity = %config.identity, leader = held, "leadership changed");
        }
        if let Some(pod) = &config.pod {
            label_bounded(&pods, pod, held, config.renew_every).await;
        }
        let next = started
            + if failed && held {
                retry_every(&config)
            } else {
                config.renew_every
            };
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = &mut stop => break,
        }
    }
    if leader.swap(false, Ordering::AcqRel) {
        // Bounded too: an API server that does not answer must not hold up the shutdown.
        if let Some(pod) = &config.pod {
            label_bounded(&pods, pod, false, config.renew_every).await;
        }
        match tokio::time::timeout(config.renew_every, release(&api, &config)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "lease not released; it lapses instead"),
            Err(_) => tracing::warn!("lease not released in time; it lapses instead"),
        }
    }
}

/// [`label_pods`] within `within`.
async fn label_bounded(pods: &Api<Pod>, pod: &str, leading: bool, within: Duration) {
    match tokio::time::timeout(within, label_pods(pods, pod, leading)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(pod, error = %e, "leader label not updated"),
        Err(_) => tracing::warn!(
            pod,
            "leader label not updated: the API server did not answer"
        ),
    }
}

/// The leader's Pod carries the leader label and no other Pod does; a standby removes it from
/// its own Pod. Patches only what differs.
async fn label_pods(pods: &Api<Pod>, me: &str, leading: bool) -> Result<(), kube::Error> {
    let set = |value: Option<&str>| json!({"metadata": {"labels": {LEADER_LABEL: value}}});
    let labelled = pods
        .list(&ListParams::default().labels(&format!("{LEADER_LABEL}={LEADER_LABEL_VALUE}")))
        .await?;
    for pod in &labelled.items {
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        // The leader clears every other Pod; a standby only its own, or it would strip the
        // label from the live leader between that leader's renewals.
        let stale = if leading { name != me } else { name == me };
        if stale {
            // A null value removes the label in a merge patch.
            pods.patch(name, &PatchParams::default(), &Patch::Merge(&set(None)))
                .await?;
        }
    }
    let mine_labelled = labelled
        .items
        .iter()
        .any(|p| p.metadata.name.as_deref() == Some(me));
    if leading && !mine_labelled {
        pods.patch(
            me,
            &PatchParams::default(),
            &Patch::Merge(&set(Some(LEADER_LABEL_VALUE))),
        )
        .await?;
    }
    Ok(())
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

async fn try_acquire_or_renew(api: &Api<Lease>, c: &LeaseConfig) -> Result<bool, kube::Error> {
    let secs = i32::try_from(c.duration.as_secs())
        .unwrap_or(i32::MAX)
        .max(1);
    let Some(mut lease) = api.get_opt(&c.name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(c.name.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(c.identity.clone()),
                lease_duration_seconds: Some(secs),
                acquire_time: Some(now()),
                renew_time: Some(now()),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
        (Some(renewed), Some(d)) => {
            let until = renewed.0 + std::time::Duration::from_secs(u64::try_from(d).unwrap_or(0));
            until < k8s_openapi::jiff::Timestamp::now()
        }
        _ => true,
    };
    if holder != c.identity && !holder.is_empty() && !expired {
        return Ok(false);
    }
    if holder != c.identity {
        spec.acquire_time = Some(now());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        spec.holder_identity = Some(c.identity.clone());
    }
    spec.renew_time = Some(now());
    spec.lease_duration_seconds = Some(secs);
    // replace carries metadata.resourceVersion: a concurrent writer makes this a 409.
    match api.replace(&c.name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

async fn release(api: &Api<Lease>, c: &LeaseConfig) -> Result<(), kube::Error> {
    if let Some(mut lease) = api.get_opt(&c.name).await?
        && let Some(spec) = lease.spec.as_mut()
        && spec.holder_identity.as_deref() == Some(c.identity.as_str())
    {
        spec.holder_identity = None;
        spec.renew_time = None;
        api.replace(&c.name, &PostParams::default(), &lease).await?;
    }
    Ok(())
}
