//! Lease election between replicas on a real API server.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

use coxswain_operator::leader::{self, LeaseConfig};
use coxswain_testenv::{TestEnv, eventually};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

#[path = "support/silence.rs"]
#[allow(dead_code)]
mod silence;

type Replica = (
    Arc<AtomicBool>,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
);

fn replica(env: &TestEnv, identity: &str) -> Replica {
    replica_in_pod(env, identity, None)
}

fn replica_in_pod(env: &TestEnv, identity: &str, pod: Option<&str>) -> Replica {
    replica_with_client(env, env.client.clone(), identity, pod)
}

fn replica_with_client(
    env: &TestEnv,
    client: kube::Client,
    identity: &str,
    pod: Option<&str>,
) -> Replica {
    let config = LeaseConfig {
        namespace: env.namespace.clone(),
        name: "coxswain-leader".into(),
        identity: identity.into(),
        duration: Duration::from_secs(2),
        renew_every: Duration::from_millis(200),
        pod: pod.map(str::to_owned),
    };
    let leader = Arc::new(AtomicBool::new(false));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(leader::run(client, config, leader.clone(), async {
        let _ = rx.await;
    }));
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

async fn leader_labelled(env: &TestEnv) -> Vec<String> {
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = env.api();
    let lp = kube::api::ListParams::default().labels("discovery.coxswain-labs.dev/leader=true");
    let mut names: Vec<String> = pods
        .list(&lp)
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_labels_its_own_pod_and_only_it() {
    let env = TestEnv::new().await;
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = env.api();
    for (name, stale_label) in [("ctl-a", false), ("ctl-b", true)] {
        let mut pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "controller", "image": "coxswain"}]}
        }))
        .unwrap();
        if stale_label {
            // Left over from an earlier leader: must be taken away.
            pod.metadata.labels = Some(
                [(
                    "discovery.coxswain-labs.dev/leader".to_owned(),
                    "true".to_owned(),
                )]
                .into(),
            );
        }
        pods.create(&kube::api::PostParams::default(), &pod)
            .await
            .unwrap();
    }
    let (a, stop_a, task_a) = replica_in_pod(&env, "ctl-a", Some("ctl-a"));
    eventually("only ctl-a labelled", Duration::from_secs(10), || {
        let env = &env;
        let a = a.clone();
        async move {
            (a.load(Ordering::Acquire) && leader_labelled(env).await == ["ctl-a"]).then_some(())
        }
    })
    .await;

    // A standby beside it never takes the label away from the leader: sampled over ten of
    // their renew periods, it stays on ctl-a alone.
    let (b, _stop_b, _task_b) = replica_in_pod(&env, "ctl-b", Some("ctl-b"));
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(leader_labelled(&env).await, ["ctl-a"], "the label flapped");
    }

    // Handing over moves the label.
    let _ = stop_a.send(());
    task_a.await.unwrap();
    eventually("only ctl-b labelled", Duration::from_secs(10), || {
        let env = &env;
        let b = b.clone();
        async move {
            (b.load(Ordering::Acquire) && leader_labelled(env).await == ["ctl-b"]).then_some(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_api_server_steps_down_before_a_standby_takes_over() {
    let env = TestEnv::new().await;
    // Replica a reaches the API server through a relay that will stop answering without
    // closing anything; the client sets no read timeout, so its renewal would hang for good.
    let kubeconfig = kube::config::Kubeconfig::read_from(env.cluster().kubeconfig()).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let api_port = config.cluster_url.port_u16().unwrap();
    let relay = silence::SilenceRelay::start(api_port).await;
    let host = config.cluster_url.host().unwrap().to_owned();
    config.cluster_url = format!("https://{host}:{}", relay.port).parse().unwrap();
    let (a, _stop_a, _task_a) = replica_with_client(
        &env,
        kube::Client::try_from(config).unwrap(),
        "replica-a",
        None,
    );
    eventually("a to lead", Duration::from_secs(10), || {
        let a = a.clone();
        async move { a.load(Ordering::Acquire).then_some(()) }
    })
    .await;
    let (b, _stop_b, _task_b) = replica(&env, "replica-b");

    // Cut off, a must stop leading on its own before its Lease lapses and b takes it: the
    // two are never seen leading together (a leader cut off for good would be seen, for as
    // long as this waits).
    relay.cut();
    let mut stepped_down = false;
    for _ in 0..1_000 {
        let (a, b) = (a.load(Ordering::Acquire), b.load(Ordering::Acquire));
        assert!(!(a && b), "two leaders");
        stepped_down |= !a;
        if b {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(stepped_down, "a never stepped down");
    assert!(b.load(Ordering::Acquire), "b never took over");
}
