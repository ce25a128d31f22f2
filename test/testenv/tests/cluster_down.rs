//! `make cluster-up` with the test node as a process, then `make cluster-down`: everything the
//! node created (Pod namespaces and their processes, the bridge, mounts, the network-index
//! claim) is gone afterwards.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn free_ports() -> Vec<u16> {
    (0..4)
        .map(|_| coxswain_testenv::ports::free_port())
        .collect()
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.stdin(Stdio::null()).output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn netns_with_prefix(prefix: &str) -> Vec<String> {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.split_whitespace().nth(2) != Some("Z"))
}

#[test]
fn cluster_down_removes_everything_the_test_node_created() {
    let ports = free_ports();
    let home = std::env::var("HOME").unwrap_or_else(|_| "/tmp".into());
    let cache =
        std::env::var("COXSWAIN_CACHE").unwrap_or_else(|_| format!("{home}/.cache/coxswain"));
    let dir = PathBuf::from(cache).join(format!("clusters/down-{}", std::process::id()));
    let env = |cmd: &mut Command| {
        cmd.env("COXSWAIN_CLUSTER_DIR", &dir)
            .env("COXSWAIN_ETCD_PORT", ports[0].to_string())
            .env("COXSWAIN_ETCD_PEER_PORT", ports[1].to_string())
            .env("COXSWAIN_APISERVER_PORT", ports[2].to_string())
            .env("COXSWAIN_KCM_PORT", ports[3].to_string())
            .env("COXSWAIN_CLUSTER_OWNER_PID", std::process::id().to_string())
            .env("COXSWAIN_NODE_BIN", env!("CARGO_BIN_EXE_coxswain-node"))
            .env("COXSWAIN_NODE_IMAGES", "shell=/bin/sh");
    };
    let mut up = Command::new("bash");
    up.arg(repo().join("hack/cluster/up.sh"));
    env(&mut up);
    let kubeconfig = run(&mut up).lines().last().unwrap_or_default().to_owned();
    let index = std::fs::read_to_string(dir.join("run/net-index")).expect("net index");
    let index = index.trim().to_owned();
    let kubectl = || {
        let bin = run(Command::new("bash")
            .arg("-c")
            .arg("source \"$0\" && echo \"$K8S_BIN\"")
            .arg(repo().join("hack/cluster/env.sh")));
        let mut cmd = Command::new(Path::new(bin.trim()).join("kubectl"));
        cmd.arg("--kubeconfig").arg(&kubeconfig);
        cmd
    };
    // Pods need the namespace's default ServiceAccount, which the controller-manager creates.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !kubectl()
        .args(["get", "serviceaccount", "default"])
        .output()
        .expect("kubectl")
        .status
        .success()
    {
        assert!(
            Instant::now() < deadline,
            "no default ServiceAccount after 60s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let pod = r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sleeper"},
      "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "main", "image": "shell",
        "command": ["/bin/sh", "-c", "sleep 1000"]}]}}"#;
    let mut apply = kubectl();
    apply
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut child = apply.spawn().expect("kubectl apply");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(pod.as_bytes()).expect("write");
    }
    assert!(child.wait().expect("wait").success(), "kubectl apply");
    run(kubectl().args([
        "wait",
        "--for=condition=Ready",
        "--timeout=60s",
        "pod/sleeper",
    ]));

    let prefix = format!("cx{index}-");
    let namespaces = netns_with_prefix(&prefix);
    assert_eq!(namespaces.len(), 1, "the Pod's namespace: {namespaces:?}");
    let pids: Vec<u32> = run(Command::new("ip").args(["netns", "pids", &namespaces[0]]))
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    assert!(
        !pids.is_empty(),
        "the container runs in the Pod's namespace"
    );
    let node_pid: u32 = std::fs::read_to_string(dir.join("run/node.pid"))
        .expect("node pid")
        .trim()
        .parse()
        .expect("pid");
    let bridge = format!("cxbr{index}");
    assert!(
        Command::new("ip")
            .args(["link", "show", &bridge])
            .output()
            .expect("ip")
            .status
            .success()
    );

    let mut down = Command::new("bash");
    down.arg(repo().join("hack/cluster/down.sh"));
    env(&mut down);
    run(&mut down);

    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!alive(node_pid), "the node agent stopped");
    for pid in &pids {
        assert!(!alive(*pid), "container process {pid} stopped");
    }
    assert_eq!(
        netns_with_prefix(&prefix),
        Vec::<String>::new(),
        "no Pod namespace left"
    );
    assert!(
        !Command::new("ip")
            .args(["link", "show", &bridge])
            .output()
            .expect("ip")
            .status
            .success(),
        "bridge {bridge} removed"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    assert!(
        !mounts.contains(&format!("/run/netns/{prefix}")),
        "no namespace mount left"
    );
    assert!(
        !mounts.contains(&dir.display().to_string()),
        "no mount under the cluster directory"
    );
    assert!(
        !Path::new(&format!("/etc/netns/{}", namespaces[0])).exists(),
        "no /etc/netns files left"
    );
    assert!(!dir.exists(), "cluster directory removed");
    assert!(
        !Path::new(&format!("/run/coxswain/net/{index}")).exists(),
        "network index released"
    );
}
