//! Leader election on a coordination.k8s.io Lease. One replica holds it and renews it; the
//! others watch it expire and take it over. Writes use the Lease's resourceVersion, so two
//! replicas cannot both believe they took it: the API server accepts one update and refuses
//! the other with a conflict.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

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
}

/// Runs the election until `stop`; `leader` says whether this replica holds the lease right
/// now. On stop a holder releases the lease so a standby can take over at once.
pub async fn run(
    client: Client,
    config: LeaseConfig,
    leader: Arc<AtomicBool>,
    stop: impl std::future::Future<Output = ()>,
) {
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    tokio::pin!(stop);
    loop {
        let held = match try_acquire_or_renew(&api, &config).await {
            Ok(held) => held,
            Err(e) => {
                tracing::warn!(error = %e, "lease not reachable; stepping down until it is");
                false
            }
        };
        if leader.swap(held, Ordering::AcqRel) != held {
            tracing::info!(identity = %config.identity, leader = held, "leadership changed");
        }
        tokio::select! {
            () = tokio::time::sleep(config.renew_every) => {}
            () = &mut stop => break,
        }
    }
    if leader.swap(false, Ordering::AcqRel) {
        let _ = release(&api, &config).await;
    }
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
