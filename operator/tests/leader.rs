//! Lease election between replicas on a real API server.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

use coxswain_operator::leader::{self, LeaseConfig};
use coxswain_testenv::{TestEnv, eventually};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

fn replica(
    env: &TestEnv,
    identity: &str,
) -> (
    Arc<AtomicBool>,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let config = LeaseConfig {
        namespace: env.namespace.clone(),
        name: "coxswain-leader".into(),
        identity: identity.into(),
        duration: Duration::from_secs(2),
        renew_every: Duration::from_millis(200),
    };
    let leader = Arc::new(AtomicBool::new(false));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(leader::run(
        env.client.clone(),
        config,
        leader.clone(),
        async {
            let _ = rx.await;
        },
    ));
    (leader, tx, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_leads_and_a_standby_takes_over() {
    let env = TestEnv::new().await;
    let (a, stop_a, task_a) = replica(&env, "replica-a");
    let (b, stop_b, task_b) = replica(&env, "replica-b");
    let both =
        |a: &AtomicBool, b: &AtomicBool| (a.load(Ordering::Acquire), b.load(Ordering::Acquire));

    let first = eventually("a leader", Duration::from_secs(10), || {
        let (a, b) = (a.clone(), b.clone());
        async move {
            match both(&a, &b) {
                (true, false) => Some("a"),
                (false, true) => Some("b"),
                _ => None,
            }
        }
    })
    .await;
    // It stays exactly one for a while (renewals do not flap).
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_ne!(both(&a, &b), (true, true), "two leaders");
    }

    // A leader that stops releases the Lease; the standby takes over at its next check.
    let (leader_stop, leader_task, standby, standby_task) = if first == "a" {
        (stop_a, task_a, b.clone(), task_b)
    } else {
        (stop_b, task_b, a.clone(), task_a)
    };
    let _ = leader_stop.send(());
    leader_task.await.unwrap();
    eventually("the standby to take over", Duration::from_secs(5), || {
        let s = standby.clone();
        async move { s.load(Ordering::Acquire).then_some(()) }
    })
    .await;

    // A leader that vanishes without releasing (a crash): a new replica must wait the lease out.
    let (c, _stop_c, _task_c) = replica(&env, "replica-c");
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        !c.load(Ordering::Acquire),
        "took a lease that is still being renewed"
    );
    standby_task.abort();
    eventually(
        "a new leader after the lease expired",
        Duration::from_secs(8),
        || {
            let c = c.clone();
            async move { c.load(Ordering::Acquire).then_some(()) }
        },
    )
    .await;
}
