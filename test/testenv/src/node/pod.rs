//! One Pod's life on the test node: sandbox (network namespace, /etc/hosts, volumes), init
//! containers in order, containers as process groups restarted per restartPolicy with backoff,
//! probes, status as a kubelet reports it, and graceful deletion.

use super::Shared;
use super::probe;
use super::volumes::{self, Volumes};
use k8s_openapi::api::core::v1::{Container, Pod, Probe};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

const MAX_BACKOFF: Duration = Duration::from_secs(20);
const VOLUME_SYNC: Duration = Duration::from_secs(10);

/// Mounts the volumes, changes directory, then becomes the container's command. Runs inside the
/// Pod's mount namespace (made by `ip netns exec` or `unshare`), so the mounts stay private.
/// Every source is first bound under a private tmpfs, then onto its target: a target covering
/// a source's path (a volume at /root while the node's state is under /root/.cache) cannot
/// hide the sources mounted after it, nor the executable. Arguments: workdir, the executable,
/// the mount count N, N sources, N (target, mode) pairs, `--`, the arguments.
const LAUNCH: &str = r#"set -e
workdir=$1; exe=$2; count=$3; shift 3
stage=/run/coxswain-node-stage
/bin/mkdir -p "$stage"
/bin/mount -t tmpfs -o mode=0700 coxswain-stage "$stage"
: > "$stage/exe"
/bin/mount --bind "$exe" "$stage/exe"
n=0
while [ "$n" -lt "$count" ]; do
  n=$((n + 1))
  if [ -d "$1" ]; then /bin/mkdir -p "$stage/$n"; else : > "$stage/$n"; fi
  /bin/mount --bind "$1" "$stage/$n"
  shift
done
n=0
while [ "$1" != "--" ]; do
  n=$((n + 1))
  dst=$1; mode=$2; shift 2
  if [ -d "$stage/$n" ]; then /bin/mkdir -p "$dst"
  else /bin/mkdir -p "$(/usr/bin/dirname "$dst")"; [ -e "$dst" ] || : > "$dst"; fi
  /bin/mount --bind "$stage/$n" "$dst"
  if [ "$mode" = ro ]; then /bin/mount -o remount,bind,ro "$dst"; fi
done
shift
cd "$workdir"
exec "$stage/exe" "$@"
"#;

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

#[derive(Debug, Clone)]
struct Terminated {
    exit_code: i32,
    signal: Option<i32>,
    reason: String,
    started_at: String,
    finished_at: String,
}

#[derive(Debug, Clone)]
enum State {
    Waiting { reason: String, message: String },
    Running { started_at: String },
    Terminated(Terminated),
}

#[derive(Debug, Default, Clone, Copy)]
struct ProbeState {
    next_at: Option<Instant>,
    successes: i32,
    failures: i32,
    in_flight: bool,
}

const STARTUP: usize = 0;
const LIVENESS: usize = 1;
const READINESS: usize = 2;

struct Ctr {
    spec: Container,
    init: bool,
    restarts: i32,
    state: State,
    last: Option<Terminated>,
    pid: Option<u32>,
    generation: u64,
    ready: bool,
    started: bool,
    /// When a stopped container may start (again); None: it never will.
    start_at: Option<Instant>,
    running_since: Option<Instant>,
    backoff: Duration,
    kill_at: Option<Instant>,
    probes: [ProbeState; 3],
}

impl Ctr {
    fn new(spec: Container, init: bool) -> Self {
        Self {
            spec,
            init,
            restarts: 0,
            state: State::Waiting {
                reason: "ContainerCreating".into(),
                message: String::new(),
            },
            last: None,
            pid: None,
            generation: 0,
            ready: false,
            started: false,
            start_at: Some(Instant::now()),
            running_since: None,
            backoff: Duration::from_secs(1),
            kill_at: None,
            probes: [ProbeState::default(); 3],
        }
    }

    fn probe(&self, kind: usize) -> Option<&Probe> {
        match kind {
            STARTUP => self.spec.startup_probe.as_ref(),
            LIVENESS => self.spec.liveness_probe.as_ref(),
            _ => self.spec.readiness_probe.as_ref(),
        }
    }

    fn running(&self) -> bool {
        matches!(self.state, State::Running { .. })
    }

    fn succeeded(&self) -> bool {
        matches!(&self.state, State::Terminated(t) if t.exit_code == 0)
    }
}

enum Event {
    Exited {
        init: bool,
        idx: usize,
        generation: u64,
        code: Option<i32>,
        signal: Option<i32>,
    },
    Probe {
        idx: usize,
        kind: usize,
        generation: u64,
        ok: bool,
    },
}

struct Supervisor {
    shared: Arc<Shared>,
    uid: String,
    ns: String,
    name: String,
    pod: Pod,
    host_network: bool,
    netns: Option<String>,
    ip_host: Option<u8>,
    pod_ip: Ipv4Addr,
    dir: PathBuf,
    volumes: Volumes,
    sandbox_ready: bool,
    sandbox_error: Option<String>,
    next_setup: Instant,
    next_volume_sync: Instant,
    init: Vec<Ctr>,
    main: Vec<Ctr>,
    events_tx: mpsc::UnboundedSender<Event>,
    start_time: String,
    last_status: Option<serde_json::Value>,
    transitions: HashMap<String, (bool, String)>,
}

pub(crate) async fn supervise(
    shared: Arc<Shared>,
    uid: String,
    mut rx: watch::Receiver<Option<Pod>>,
) {
    let Some(pod) = rx.borrow_and_update().clone() else {
        return;
    };
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let spec = pod.spec.clone().unwrap_or_default();
    let short: String = uid.chars().take(8).collect();
    let dir = shared
        .config
        .state_dir()
        .join("pods")
        .join(format!("{ns}_{name}_{short}"));
    let (events_tx, mut events_rx) = mpsc::unbounded_channel();
    let mut hosts = shared.hosts.clone();
    let mut sup = Supervisor {
        host_network: spec.host_network.unwrap_or(false),
        netns: None,
        ip_host: None,
        pod_ip: Ipv4Addr::UNSPECIFIED,
        volumes: Volumes::new(dir.join("volumes")),
        dir,
        sandbox_ready: false,
        sandbox_error: None,
        next_setup: Instant::now(),
        next_volume_sync: Instant::now() + VOLUME_SYNC,
        init: spec
            .init_containers
            .unwrap_or_default()
            .into_iter()
            .map(|c| Ctr::new(c, true))
            .collect(),
        main: spec
            .containers
            .into_iter()
            .map(|c| Ctr::new(c, false))
            .collect(),
        events_tx,
        start_time: now(),
        last_status: None,
        transitions: HashMap::new(),
        shared,
        uid,
        ns,
        name,
        pod,
    };
    tracing::info!(namespace = %sup.ns, pod = %sup.name, "starting pod");
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut gone = false;
    loop {
        if gone || sup.pod.metadata.deletion_timestamp.is_some() {
            break;
        }
        sup.step().await;
        sup.publish_status().await;
        tokio::select! {
            changed = rx.changed() => {
                match changed.ok().and_then(|()| rx.borrow_and_update().clone()) {
                    Some(pod) => sup.pod = pod,
                    None => gone = true,
                }
            }
            Some(event) = events_rx.recv() => sup.handle(event),
            Ok(()) = hosts.changed() => sup.write_etc(),
            _ = tick.tick() => {}
        }
    }
    let grace = if gone {
        Duration::from_secs(2)
    } else {
        let seconds = sup
            .pod
            .metadata
            .deletion_grace_period_seconds
            .or_else(|| {
                sup.pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
            })
            .unwrap_or(30);
        Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
    };
    sup.terminate(grace, &mut events_rx).await;
    if !gone {
        sup.publish_status().await;
        sup.delete_pod().await;
    }
    tracing::info!(namespace = %sup.ns, pod = %sup.name, "pod stopped");
}

impl Supervisor {
    async fn step(&mut self) {
        if !self.sandbox_ready {
            if Instant::now() < self.next_setup {
                return;
            }
            match self.setup_sandbox().await {
                Ok(()) => {
                    self.sandbox_ready = true;
                    self.sandbox_error = None;
                }
                Err(message) => {
                    tracing::warn!(namespace = %self.ns, pod = %self.name, %message, "pod sandbox not ready");
                    self.sandbox_error = Some(message);
                    self.next_setup = Instant::now() + Duration::from_secs(2);
                    return;
                }
            }
        }
        if Instant::now() >= self.next_volume_sync {
            self.next_volume_sync = Instant::now() + VOLUME_SYNC;
            let ip = self.pod_ip.to_string();
            if let Err(message) = self.volumes.sync(&self.shared, &self.pod, &ip).await {
                tracing::warn!(namespace = %self.ns, pod = %self.name, %message, "volume sync failed");
            }
        }
        // Init containers, one at a time, each to success before the next.
        if let Some(idx) = self.init.iter().position(|c| !c.succeeded()) {
            let due = {
                let c = &self.init[idx];
                !c.running() && c.start_at.is_some_and(|at| Instant::now() >= at)
            };
            if due {
                self.start(true, idx).await;
            }
        } else {
            for idx in 0..self.main.len() {
                let c = &self.main[idx];
                if !c.running() && c.start_at.is_some_and(|at| Instant::now() >= at) {
                    self.start(false, idx).await;
                }
            }
        }
        for c in self.init.iter_mut().chain(self.main.iter_mut()) {
            if let (Some(at), Some(pid)) = (c.kill_at, c.pid)
                && Instant::now() >= at
            {
                signal(pid, Signal::SIGKILL);
                c.kill_at = None;
            }
        }
        self.run_probes();
    }

    async fn setup_sandbox(&mut self) -> Result<(), String> {
        std::fs::create_dir_all(&self.dir).map_err(|e| format!("{}: {e}", self.dir.display()))?;
        if self.host_network {
            self.pod_ip = self.shared.network.gateway();
        } else {
            let host = match self.ip_host {
                Some(h) => h,
                None => {
                    let h = self
                        .shared
                        .allocate_ip()
                        .ok_or("no free Pod address in the node's range")?;
                    self.ip_host = Some(h);
                    h
                }
            };
            self.pod_ip = self.shared.network.pod_ip(host);
            let netns = self.shared.network.namespace_of(&self.uid);
            self.shared
                .network
                .create_pod_network(&self.uid, &netns, self.pod_ip)
                .await
                .map_err(|e| e.to_string())?;
            self.netns = Some(netns);
            self.write_etc();
        }
        let ip = self.pod_ip.to_string();
        self.volumes.sync(&self.shared, &self.pod, &ip).await?;
        Ok(())
    }

    /// /etc/hosts and /etc/resolv.conf of the Pod's namespace (bind-mounted by `ip netns exec`).
    /// Rewritten in place, so running containers see Services created after they started.
    fn write_etc(&self) {
        let Some(netns) = &self.netns else {
            return;
        };
        let etc = self.shared.network.etc_dir(netns);
        let hostname = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.hostname.clone())
            .unwrap_or_else(|| self.name.clone());
        let hosts = self
            .shared
            .hosts
            .borrow()
            .render(&self.ns, &hostname, self.pod_ip);
        // No cluster DNS: every name a Pod resolves is in its hosts file.
        let resolv = format!(
            "search {ns}.svc.cluster.local svc.cluster.local cluster.local\nnameserver 127.0.0.1\noptions ndots:5 timeout:1 attempts:1\n",
            ns = self.ns
        );
        let result = std::fs::create_dir_all(&etc)
            .and_then(|()| std::fs::write(etc.join("hosts"), hosts))
            .and_then(|()| std::fs::write(etc.join("resolv.conf"), resolv))
            .and_then(|()| std::fs::write(etc.join("hostname"), format!("{hostname}\n")));
        if let Err(e) = result {
            tracing::warn!(netns, error = %e, "writing the pod's /etc files failed");
        }
    }

    fn ctr(&mut self, init: bool, idx: usize) -> &mut Ctr {
        if init {
            &mut self.init[idx]
        } else {
            &mut self.main[idx]
        }
    }

    async fn start(&mut self, init: bool, idx: usize) {
        let launch = self.launch_command(init, idx).await;
        let c = self.ctr(init, idx);
        let mut command = match launch {
            Ok(cmd) => cmd,
            Err((reason, message)) => {
                if !matches!(&c.state, State::Waiting { reason: r, message: m } if *r == reason && *m == message)
                {
                    tracing::warn!(container = %c.spec.name, %reason, %message, "container cannot start");
                }
                c.state = State::Waiting { reason, message };
                // Configuration can be fixed (a ConfigMap created): try again shortly.
                c.start_at = Some(Instant::now() + Duration::from_secs(2));
                return;
            }
        };
        match command.spawn() {
            Ok(mut child) => {
                c.generation += 1;
                let generation = c.generation;
                c.pid = child.id();
                c.state = State::Running { started_at: now() };
                c.running_since = Some(Instant::now());
                c.start_at = None;
                c.ready = false;
                c.started = c.spec.startup_probe.is_none();
                c.kill_at = None;
                let delays = [
                    c.spec.startup_probe.as_ref(),
                    c.spec.liveness_probe.as_ref(),
                    c.spec.readiness_probe.as_ref(),
                ]
                .map(|p| p.and_then(|p| p.initial_delay_seconds).unwrap_or(0));
                for (state, delay) in c.probes.iter_mut().zip(delays) {
                    *state = ProbeState {
                        next_at: Some(
                            Instant::now() + Duration::from_secs(u64::try_from(delay).unwrap_or(0)),
                        ),
                        ..Default::default()
                    };
                }
                let name = c.spec.name.clone();
                if let Some(pid) = c.pid {
                    let _ = std::fs::write(
                        self.shared
                            .config
                            .state_dir()
                            .join("pids")
                            .join(format!("{}-{name}", self.uid)),
                        pid.to_string(),
                    );
                }
                tracing::info!(namespace = %self.ns, pod = %self.name, container = %name, pid = ?child.id(), "container started");
                let tx = self.events_tx.clone();
                tokio::spawn(async move {
                    let status = child.wait().await;
                    use std::os::unix::process::ExitStatusExt;
                    let (code, signal) = match status {
                        Ok(s) => (s.code(), s.signal()),
                        Err(_) => (None, None),
                    };
                    let _ = tx.send(Event::Exited {
                        init,
                        idx,
                        generation,
                        code,
                        signal,
                    });
                });
            }
            Err(e) => {
                c.state = State::Waiting {
                    reason: "RunContainerError".into(),
                    message: e.to_string(),
                };
                c.start_at = Some(Instant::now() + Duration::from_secs(2));
            }
        }
    }

    /// The command that runs a container: the image's binary, argv per Kubernetes' command/args
    /// rules, the environment, volume mounts, working directory and log file.
    async fn launch_command(
        &self,
        init: bool,
        idx: usize,
    ) -> Result<tokio::process::Command, (String, String)> {
        let c = if init {
            &self.init[idx]
        } else {
            &self.main[idx]
        };
        let spec = &c.spec;
        let image = spec.image.clone().unwrap_or_default();
        let binary = self.shared.binary_for(&image).ok_or_else(|| {
            let mut known: Vec<&String> = self.shared.config.images.keys().collect();
            known.sort();
            (
                "ErrImagePull".to_owned(),
                format!(
                    "image {image:?} cannot run on the coxswain test node: it runs processes, not \
                     images, and has a local binary only for {known:?}"
                ),
            )
        })?;
        let env = self
            .environment(spec)
            .await
            .map_err(|m| ("CreateContainerConfigError".to_owned(), m))?;
        let expand = |s: &String| expand_vars(s, &env);
        let mut argv: Vec<String> = vec![binary.display().to_string()];
        // The image's entrypoint is its one binary; a command names it by some path.
        if let Some([_, rest @ ..]) = spec.command.as_deref() {
            argv.extend(rest.iter().map(expand));
        }
        argv.extend(spec.args.iter().flatten().map(expand));

        // Parents before children, so a nested mount lands on top of its parent's.
        let mut volume_mounts: Vec<_> = spec.volume_mounts.iter().flatten().collect();
        volume_mounts.sort_by_key(|m| m.mount_path.trim_end_matches('/').matches('/').count());
        let mut sources: Vec<String> = Vec::new();
        let mut targets: Vec<String> = Vec::new();
        for m in volume_mounts {
            let Some(src) = self.volumes.host_path(&m.name) else {
                return Err((
                    "CreateContainerConfigError".into(),
                    format!(
                        "volume mount {}: no volume named {:?}",
                        m.mount_path, m.name
                    ),
                ));
            };
            let src = match m.sub_path.as_deref() {
                Some(sub) if !sub.is_empty() => src.join(sub),
                _ => src.to_owned(),
            };
            sources.push(src.display().to_string());
            targets.push(m.mount_path.clone());
            let mode = if m.read_only.unwrap_or(false) {
                "ro"
            } else {
                "rw"
            };
            targets.push(mode.into());
        }
        let log = self.dir.join(format!("{}.log", spec.name));
        let open = |p: &PathBuf| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(|e| {
                    (
                        "RunContainerError".to_owned(),
                        format!("{}: {e}", p.display()),
                    )
                })
        };
        let (stdout, stderr) = (open(&log)?, open(&log)?);

        let mut command = match &self.netns {
            Some(netns) => {
                let mut cmd = tokio::process::Command::new("ip");
                cmd.args(["netns", "exec", netns]);
                cmd
            }
            None => {
                let mut cmd = tokio::process::Command::new("unshare");
                cmd.args(["--mount", "--propagation", "private"]);
                cmd
            }
        };
        command
            .args(["/bin/sh", "-c", LAUNCH, "coxswain-node-launch"])
            .arg(spec.working_dir.as_deref().unwrap_or("/"))
            .arg(&argv[0])
            .arg(sources.len().to_string())
            .args(&sources)
            .args(&targets)
            .arg("--")
            .args(&argv[1..])
            .env_clear()
            .envs(env)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .process_group(0)
            .kill_on_drop(false);
        Ok(command)
    }

    /// The container's environment in Kubernetes' order: defaults, envFrom, then env (with
    /// `$(VAR)` references to earlier entries expanded).
    async fn environment(&self, spec: &Container) -> Result<Vec<(String, String)>, String> {
        let shared = &self.shared;
        let mut env: Vec<(String, String)> = vec![
            (
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            ),
            ("HOSTNAME".into(), self.name.clone()),
            (
                "KUBERNETES_SERVICE_HOST".into(),
                shared.kubernetes_service_ip().to_string(),
            ),
            ("KUBERNETES_SERVICE_PORT".into(), "443".into()),
            ("KUBERNETES_SERVICE_PORT_HTTPS".into(), "443".into()),
        ];
        let set = |env: &mut Vec<(String, String)>, k: String, v: String| {
            env.retain(|(name, _)| *name != k);
            env.push((k, v));
        };
        for from in spec.env_from.iter().flatten() {
            let prefix = from.prefix.clone().unwrap_or_default();
            let data = if let Some(cm) = &from.config_map_ref {
                volumes::config_map_data(shared, &self.ns, &cm.name, cm.optional.unwrap_or(false))
                    .await?
            } else if let Some(secret) = &from.secret_ref {
                volumes::secret_data(
                    shared,
                    &self.ns,
                    &secret.name,
                    secret.optional.unwrap_or(false),
                )
                .await?
            } else {
                continue;
            };
            for (k, v) in data {
                set(
                    &mut env,
                    format!("{prefix}{k}"),
                    String::from_utf8_lossy(&v).into_owned(),
                );
            }
        }
        let ip = self.pod_ip.to_string();
        for var in spec.env.iter().flatten() {
            let value = match &var.value_from {
                None => expand_vars(var.value.as_deref().unwrap_or_default(), &env),
                Some(from) => {
                    if let Some(field) = &from.field_ref {
                        if field.field_path == "status.hostIP"
                            || field.field_path == "status.hostIPs"
                        {
                            shared.network.gateway().to_string()
                        } else {
                            volumes::field_value(&self.pod, &field.field_path, &ip)?
                        }
                    } else if let Some(key) = &from.config_map_key_ref {
                        let optional = key.optional.unwrap_or(false);
                        let data =
                            volumes::config_map_data(shared, &self.ns, &key.name, optional).await?;
                        match data.get(&key.key) {
                            Some(v) => String::from_utf8_lossy(v).into_owned(),
                            None if optional => continue,
                            None => {
                                return Err(format!(
                                    "couldn't find key {} in ConfigMap {}/{}",
                                    key.key, self.ns, key.name
                                ));
                            }
                        }
                    } else if let Some(key) = &from.secret_key_ref {
                        let optional = key.optional.unwrap_or(false);
                        let data =
                            volumes::secret_data(shared, &self.ns, &key.name, optional).await?;
                        match data.get(&key.key) {
                            Some(v) => String::from_utf8_lossy(v).into_owned(),
                            None if optional => continue,
                            None => {
                                return Err(format!(
                                    "couldn't find key {} in Secret {}/{}",
                                    key.key, self.ns, key.name
                                ));
                            }
                        }
                    } else if let Some(resource) = &from.resource_field_ref {
                        // No cgroups here: limits are the node's capacity, as the kubelet reports
                        // for a container without limits.
                        match resource.resource.as_str() {
                            "limits.cpu" | "requests.cpu" => std::thread::available_parallelism()
                                .map_or(1, |n| n.get())
                                .to_string(),
                            "limits.memory" | "requests.memory" => (16u64 << 30).to_string(),
                            other => {
                                return Err(format!(
                                    "resourceFieldRef {other} is not supported by the test node"
                                ));
                            }
                        }
                    } else {
                        return Err(format!("env {}: unsupported valueFrom", var.name));
                    }
                }
            };
            set(&mut env, var.name.clone(), value);
        }
        Ok(env)
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Exited {
                init,
                idx,
                generation,
                code,
                signal,
            } => {
                let policy = self
                    .pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.restart_policy.clone())
                    .unwrap_or_else(|| "Always".into());
                let deleting = self.pod.metadata.deletion_timestamp.is_some();
                let (ns, pod) = (self.ns.clone(), self.name.clone());
                let c = self.ctr(init, idx);
                if generation != c.generation {
                    return;
                }
                let started_at = match &c.state {
                    State::Running { started_at } => started_at.clone(),
                    _ => now(),
                };
                let exit_code = code.unwrap_or_else(|| 128 + signal.unwrap_or(9));
                let reason = if exit_code == 0 { "Completed" } else { "Error" };
                let terminated = Terminated {
                    exit_code,
                    signal,
                    reason: reason.into(),
                    started_at,
                    finished_at: now(),
                };
                tracing::info!(namespace = %ns, pod = %pod, container = %c.spec.name, exit_code, "container exited");
                c.pid = None;
                c.ready = false;
                c.kill_at = None;
                let restart = !deleting
                    && match policy.as_str() {
                        "Never" => false,
                        "OnFailure" => exit_code != 0,
                        // Init containers of an Always Pod restart only on failure.
                        _ => !(c.init && exit_code == 0),
                    };
                // A container that ran a while starts its backoff over.
                if c.running_since
                    .is_some_and(|s| s.elapsed() > Duration::from_secs(60))
                {
                    c.backoff = Duration::from_secs(1);
                }
                c.running_since = None;
                if restart {
                    c.restarts += 1;
                    c.last = Some(terminated);
                    c.state = State::Waiting {
                        reason: "CrashLoopBackOff".into(),
                        message: format!(
                            "back-off {}s restarting failed container={}",
                            c.backoff.as_secs(),
                            c.spec.name
                        ),
                    };
                    c.start_at = Some(Instant::now() + c.backoff);
                    c.backoff = (c.backoff * 2).min(MAX_BACKOFF);
                } else {
                    c.state = State::Terminated(terminated);
                    c.start_at = None;
                }
            }
            Event::Probe {
                idx,
                kind,
                generation,
                ok,
            } => {
                let c = &mut self.main[idx];
                if generation != c.generation || !c.running() {
                    return;
                }
                let Some(probe) = c.probe(kind).cloned() else {
                    return;
                };
                let state = &mut c.probes[kind];
                state.in_flight = false;
                if ok {
                    state.successes += 1;
                    state.failures = 0;
                } else {
                    state.failures += 1;
                    state.successes = 0;
                }
                let success_threshold = probe.success_threshold.unwrap_or(1).max(1);
                let failure_threshold = probe.failure_threshold.unwrap_or(3).max(1);
                let (successes, failures) = (state.successes, state.failures);
                match kind {
                    STARTUP => {
                        if successes >= 1 {
                            c.started = true;
                        } else if failures >= failure_threshold {
                            self.kill_for_probe(idx, "startup");
                        }
                    }
                    LIVENESS => {
                        if failures >= failure_threshold {
                            self.kill_for_probe(idx, "liveness");
                        }
                    }
                    _ => {
                        if successes >= success_threshold {
                            c.ready = true;
                        } else if failures >= failure_threshold {
                            c.ready = false;
                        }
                    }
                }
            }
        }
    }

    fn kill_for_probe(&mut self, idx: usize, which: &str) {
        let grace = self.grace_seconds();
        let c = &mut self.main[idx];
        if let Some(pid) = c.pid {
            tracing::info!(container = %c.spec.name, which, "probe failed; restarting container");
            signal(pid, Signal::SIGTERM);
            c.kill_at = Some(Instant::now() + Duration::from_secs(grace));
            c.probes = [ProbeState::default(); 3];
        }
    }

    fn grace_seconds(&self) -> u64 {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .and_then(|g| u64::try_from(g).ok())
            .unwrap_or(30)
    }

    fn run_probes(&mut self) {
        let pod_ip = self.pod_ip;
        for (idx, c) in self.main.iter_mut().enumerate() {
            if !c.running() {
                continue;
            }
            for kind in [STARTUP, LIVENESS, READINESS] {
                // Liveness and readiness wait for the startup probe.
                if kind != STARTUP && !c.started {
                    continue;
                }
                if kind == STARTUP && c.started {
                    continue;
                }
                let Some(probe) = c.probe(kind).cloned() else {
                    if kind == READINESS {
                        c.ready = c.started;
                    }
                    continue;
                };
                let state = &mut c.probes[kind];
                if state.in_flight || state.next_at.is_none_or(|at| Instant::now() < at) {
                    continue;
                }
                state.in_flight = true;
                let period = u64::try_from(probe.period_seconds.unwrap_or(10))
                    .unwrap_or(10)
                    .max(1);
                state.next_at = Some(Instant::now() + Duration::from_secs(period));
                let (spec, pid, generation, tx) =
                    (c.spec.clone(), c.pid, c.generation, self.events_tx.clone());
                tokio::spawn(async move {
                    let ok = probe::check(&probe, &spec, pod_ip, pid).await;
                    let _ = tx.send(Event::Probe {
                        idx,
                        kind,
                        generation,
                        ok,
                    });
                });
            }
        }
    }

    /// SIGTERM to every running container, SIGKILL to what still runs after `grace`, then the
    /// sandbox goes.
    async fn terminate(&mut self, grace: Duration, events: &mut mpsc::UnboundedReceiver<Event>) {
        for c in self.init.iter_mut().chain(self.main.iter_mut()) {
            c.start_at = None;
            if let Some(pid) = c.pid {
                signal(pid, Signal::SIGTERM);
            }
        }
        let deadline = Instant::now() + grace;
        let mut killed = false;
        loop {
            let running = self
                .init
                .iter()
                .chain(self.main.iter())
                .any(|c| c.pid.is_some());
            if !running {
                break;
            }
            if Instant::now() >= deadline {
                if killed {
                    break;
                }
                for c in self.init.iter().chain(self.main.iter()) {
                    if let Some(pid) = c.pid {
                        signal(pid, Signal::SIGKILL);
                    }
                }
                killed = true;
            }
            let wait_until = if killed {
                Instant::now() + Duration::from_secs(3)
            } else {
                deadline
            };
            match tokio::time::timeout_at(wait_until.into(), events.recv()).await {
                Ok(Some(event)) => self.handle(event),
                Ok(None) => break,
                Err(_) if killed => break,
                Err(_) => {}
            }
        }
        for c in self.init.iter_mut().chain(self.main.iter_mut()) {
            let _ = std::fs::remove_file(
                self.shared
                    .config
                    .state_dir()
                    .join("pids")
                    .join(format!("{}-{}", self.uid, c.spec.name)),
            );
        }
        if let Some(netns) = self.netns.take() {
            self.shared.network.delete_pod_network(&netns).await;
        }
        if let Some(host) = self.ip_host.take() {
            self.shared.release_ip(host);
        }
        let _ = std::fs::remove_dir_all(self.dir.join("volumes"));
    }

    /// The kubelet's last word on a Pod: delete it for good, guarded by its UID.
    async fn delete_pod(&self) {
        let api: Api<Pod> = Api::namespaced(self.shared.client.clone(), &self.ns);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(self.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&self.name, &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => {
                tracing::warn!(namespace = %self.ns, pod = %self.name, error = %e, "final pod delete failed")
            }
        }
    }

    fn container_status(&self, c: &Ctr) -> serde_json::Value {
        let state = |s: &State| match s {
            State::Waiting { reason, message } => serde_json::json!({
                "waiting": {"reason": reason, "message": message}
            }),
            State::Running { started_at } => serde_json::json!({
                "running": {"startedAt": started_at}
            }),
            State::Terminated(t) => terminated_json(t),
        };
        let mut status = serde_json::json!({
            "name": c.spec.name,
            "image": c.spec.image.clone().unwrap_or_default(),
            "imageID": self.shared.binary_for(c.spec.image.as_deref().unwrap_or_default())
                .map(|b| format!("process://{}", b.display())).unwrap_or_default(),
            "ready": c.ready && c.running(),
            "started": c.running() && c.started,
            "restartCount": c.restarts,
            "state": state(&c.state),
            "lastState": c.last.as_ref().map(terminated_json).unwrap_or_else(|| serde_json::json!({})),
        });
        if let Some(pid) = c.pid {
            status["containerID"] = format!("process://{pid}").into();
        }
        status
    }

    fn phase(&self) -> &'static str {
        let policy = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.as_deref())
            .unwrap_or("Always");
        let init_failed = self
            .init
            .iter()
            .any(|c| matches!(&c.state, State::Terminated(t) if t.exit_code != 0));
        if init_failed {
            return "Failed";
        }
        if !self.sandbox_ready || self.init.iter().any(|c| !c.succeeded()) {
            return "Pending";
        }
        let all_done = self
            .main
            .iter()
            .all(|c| matches!(c.state, State::Terminated(_)) && c.start_at.is_none());
        if all_done && policy != "Always" {
            return if self.main.iter().all(Ctr::succeeded) {
                "Succeeded"
            } else {
                "Failed"
            };
        }
        let ever_started = self
            .main
            .iter()
            .all(|c| c.running() || c.restarts > 0 || matches!(c.state, State::Terminated(_)));
        if ever_started { "Running" } else { "Pending" }
    }

    fn condition(&mut self, type_: &str, ok: bool, reason: Option<&str>) -> serde_json::Value {
        let entry = self
            .transitions
            .entry(type_.to_owned())
            .or_insert_with(|| (ok, now()));
        if entry.0 != ok {
            *entry = (ok, now());
        }
        let mut c = serde_json::json!({
            "type": type_,
            "status": if ok { "True" } else { "False" },
            "lastProbeTime": null,
            "lastTransitionTime": entry.1,
        });
        if let (false, Some(reason)) = (ok, reason) {
            c["reason"] = reason.into();
        }
        c
    }

    async fn publish_status(&mut self) {
        let phase = self.phase();
        let initialized = self.sandbox_ready && self.init.iter().all(Ctr::succeeded);
        let containers_ready = initialized && self.main.iter().all(|c| c.ready && c.running());
        let mut conditions = vec![
            self.condition("PodReadyToStartContainers", self.sandbox_ready, None),
            self.condition("Initialized", initialized, Some("ContainersNotInitialized")),
            self.condition("Ready", containers_ready, Some("ContainersNotReady")),
            self.condition(
                "ContainersReady",
                containers_ready,
                Some("ContainersNotReady"),
            ),
            self.condition("PodScheduled", true, None),
        ];
        if let Some(message) = &self.sandbox_error {
            conditions[0]["message"] = message.clone().into();
        }
        let init_statuses: Vec<_> = self.init.iter().map(|c| self.container_status(c)).collect();
        let statuses: Vec<_> = self.main.iter().map(|c| self.container_status(c)).collect();
        let mut status = serde_json::json!({
            "phase": phase,
            "conditions": conditions,
            "hostIP": self.shared.network.gateway().to_string(),
            "hostIPs": [{"ip": self.shared.network.gateway().to_string()}],
            "startTime": self.start_time,
            "containerStatuses": statuses,
        });
        if !init_statuses.is_empty() {
            status["initContainerStatuses"] = init_statuses.into();
        }
        if self.sandbox_ready {
            status["podIP"] = self.pod_ip.to_string().into();
            status["podIPs"] = serde_json::json!([{"ip": self.pod_ip.to_string()}]);
        }
        if let Some(message) = &self.sandbox_error {
            status["message"] = message.clone().into();
        }
        if self.last_status.as_ref() == Some(&status) {
            return;
        }
        let api: Api<Pod> = Api::namespaced(self.shared.client.clone(), &self.ns);
        let patch = serde_json::json!({"status": status});
        match api
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => self.last_status = Some(status),
            Err(kube::Error::Api(s)) if s.code == 404 => self.last_status = Some(status),
            Err(e) => {
                tracing::warn!(namespace = %self.ns, pod = %self.name, error = %e, "pod status update failed")
            }
        }
    }
}

fn terminated_json(t: &Terminated) -> serde_json::Value {
    let mut v = serde_json::json!({
        "terminated": {
            "exitCode": t.exit_code,
            "reason": t.reason,
            "startedAt": t.started_at,
            "finishedAt": t.finished_at,
        }
    });
    if let Some(signal) = t.signal {
        v["terminated"]["signal"] = signal.into();
    }
    v
}

/// Signals a container's whole process group (it was started as its own group).
fn signal(pid: u32, signal: Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = killpg(Pid::from_raw(pid), signal);
    }
}

/// Kubernetes' `$(VAR)` expansion: defined names are replaced, `$$` escapes, anything else
/// stays as written.
pub(crate) fn expand_vars(input: &str, env: &[(String, String)]) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            out.push('$');
            rest = stripped;
        } else if let Some(body) = after.strip_prefix('(') {
            match body.find(')') {
                Some(end) => {
                    let name = &body[..end];
                    match env.iter().rev().find(|(k, _)| k == name) {
                        Some((_, v)) => out.push_str(v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &body[end + 1..];
                }
                None => {
                    out.push('$');
                    rest = after;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::expand_vars;

    #[test]
    fn expands_like_kubernetes() {
        let env = vec![
            ("A".to_owned(), "x".to_owned()),
            ("B".to_owned(), "y".to_owned()),
        ];
        assert_eq!(expand_vars("$(A)-$(B)", &env), "x-y");
        assert_eq!(expand_vars("$$(A)", &env), "$(A)");
        assert_eq!(expand_vars("$(MISSING) $A $", &env), "$(MISSING) $A $");
        assert_eq!(expand_vars("pre$(A", &env), "pre$(A");
    }
}
