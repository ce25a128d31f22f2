//! `make bench-memory`: the resident memory of `coxswain serve proxy --snapshot-file` holding
//! 1,000, 5,000 and 20,000 HTTPRoutes, and after 100 snapshot swaps.
//!
//! Usage: `memory COXSWAIN_BINARY [ROUTES ...]` (default 1000 5000 20000);
//! `COXSWAIN_BENCH_SWAPS` (default 100), `COXSWAIN_BENCH_THREADS` (default: the proxy's own,
//! one worker per CPU).
//!
//! The snapshot is what the compiler makes of one Gateway (an HTTP and an HTTPS listener) and
//! N HTTPRoutes, each one rule with one path prefix and two weighted backends:
//! - N/5 hostnames `app{h}.bench.example`, 5 routes each (`/api{p}/`), as an application
//!   exposes a few paths under its own host;
//! - every host has two Services, `app{h}-stable` (weight 90) and `app{h}-canary` (weight 10),
//!   shared by its 5 routes: 2N/5 clusters with 2 ready endpoints each;
//! - every tenth host has a TLS certificate (rcgen, ECDSA P-256) on the HTTPS listener, whose
//!   virtual hosts are those hosts' (the same routes again, as a route attached to both
//!   listeners compiles).
//!
//! Each size gets a fresh proxy. It starts on an empty snapshot (the fixed cost: runtime,
//! worker threads, admin), then loads the N routes; RSS (VmRSS of /proc/PID/status) is read
//! once the admin's /metrics reports the version. Then each swap rewrites the file atomically
//! with one route's path changed, and waits until that version is served. Growth is RSS after
//! the swaps over RSS after load.
#![allow(clippy::unwrap_used)] // a measurement program: a failed step ends it

use coxswain_api::snapshot::{self as snap, Snapshot};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const PATHS_PER_HOST: usize = 5;
/// One host in this many has a certificate.
const TLS_EVERY: usize = 10;

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn host(h: usize) -> String {
    format!("app{h}.bench.example")
}

fn cluster(h: usize, track: &str) -> String {
    format!("bench/app{h}-{track}:8080")
}

fn route(h: usize, p: usize) -> snap::Route {
    snap::Route {
        source: Some(snap::RouteSource {
            kind: "HTTPRoute".into(),
            namespace: "bench".into(),
            name: format!("app{h}-{p}"),
            rule: 0,
            rule_name: String::new(),
        }),
        r#match: Some(snap::RouteMatch {
            path: Some(snap::PathMatch {
                kind: snap::path_match::Kind::Prefix as i32,
                value: format!("/api{p}/"),
            }),
            ..Default::default()
        }),
        backends: vec![
            snap::WeightedBackend {
                cluster: cluster(h, "stable"),
                weight: 90,
                ..Default::default()
            },
            snap::WeightedBackend {
                cluster: cluster(h, "canary"),
                weight: 10,
                ..Default::default()
            },
        ],
        ..Default::default()
    }
}

fn virtual_host(h: usize) -> snap::VirtualHost {
    snap::VirtualHost {
        hostname: host(h),
        routes: (0..PATHS_PER_HOST).map(|p| route(h, p)).collect(),
        single_label: false,
        terminate_tls: false,
    }
}

/// The unsealed snapshot of `routes` HTTPRoutes on `http` and `https`.
fn snapshot(routes: usize, http: u16, https: u16) -> Snapshot {
    let hosts = routes.div_ceil(PATHS_PER_HOST);
    let tls_hosts: Vec<usize> = (0..hosts).filter(|h| h % TLS_EVERY == 0).collect();
    let mut plain: Vec<_> = (0..hosts).map(virtual_host).collect();
    plain.sort_by(|a, b| a.hostname.cmp(&b.hostname));
    let mut secure: Vec<_> = tls_hosts.iter().map(|&h| virtual_host(h)).collect();
    secure.sort_by(|a, b| a.hostname.cmp(&b.hostname));
    let mut certificates: Vec<_> = tls_hosts
        .iter()
        .map(|&h| {
            let c = rcgen::generate_simple_self_signed(vec![host(h)]).unwrap();
            snap::Certificate {
                name: format!("bench/tls-app{h}"),
                cert_chain_pem: c.cert.pem(),
                private_key_pem: c.signing_key.serialize_pem(),
            }
        })
        .collect();
    certificates.sort_by(|a, b| a.name.cmp(&b.name));
    let mut sni: Vec<_> = tls_hosts
        .iter()
        .map(|&h| snap::SniCertificate {
            sni: host(h),
            certificate: format!("bench/tls-app{h}"),
        })
        .collect();
    sni.sort_by(|a, b| a.sni.cmp(&b.sni));
    let mut clusters: Vec<_> = (0..hosts)
        .flat_map(|h| {
            ["stable", "canary"].map(|track| snap::Cluster {
                name: cluster(h, track),
                endpoints: (1..=2)
                    .map(|e| snap::Endpoint {
                        address: format!("10.{}.{}.{e}", h / 250, h % 250),
                        port: 8080,
                        ready: true,
                        serving: true,
                        terminating: false,
                    })
                    .collect(),
                ..Default::default()
            })
        })
        .collect();
    clusters.sort_by(|a, b| a.name.cmp(&b.name));
    let mut listeners = vec![
        snap::Listener {
            port: u32::from(http),
            protocol: snap::Protocol::Http as i32,
            sources: vec!["Gateway/bench/edge/http".into()],
            virtual_hosts: plain,
            ..Default::default()
        },
        snap::Listener {
            port: u32::from(https),
            protocol: snap::Protocol::Https as i32,
            sources: vec!["Gateway/bench/edge/https".into()],
            virtual_hosts: secure,
            certificates: sni,
            ..Default::default()
        },
    ];
    listeners.sort_by_key(|l| l.port);
    Snapshot {
        scope: Some(snap::Scope {
            kind: Some(snap::scope::Kind::SharedPool(snap::SharedPool {})),
        }),
        listeners,
        clusters,
        certificates,
        ..Default::default()
    }
}

/// Seals `snapshot`, replaces `file` with it atomically (the proxy may read at any moment),
/// and returns its version and size in bytes.
fn write(file: &Path, snapshot: Snapshot) -> (String, usize) {
    let sealed = snapshot.seal().into_snapshot();
    let bytes = serde_json::to_vec(&sealed).unwrap();
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, &bytes).unwrap();
    std::fs::rename(&tmp, file).unwrap();
    (sealed.version, bytes.len())
}

/// The body of GET /metrics, or None while the admin is not up.
fn metrics(admin: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", admin)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

/// Waits until the proxy reports `version` as applied.
fn wait_served(proxy: &mut Child, admin: u16, version: &str) {
    let wanted = format!("version=\"{version}\"");
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if let Some(status) = proxy.try_wait().unwrap() {
            panic!("the proxy exited: {status}");
        }
        if metrics(admin).is_some_and(|m| m.contains(&wanted)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the proxy did not serve snapshot {version}");
}

/// VmRSS once freed memory has gone back: the allocator returns freed pages within about a
/// second (operator/src/main.rs), so this reads every 250 ms until no reading in the last
/// 2 s was more than 0.2 % below the one before it (at most 10 s). Load and swaps are read
/// the same way.
fn settled_rss(pid: u32) -> u64 {
    let start = Instant::now();
    let mut last = status_field(pid, "VmRSS");
    let mut steady_since = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(250));
        let now = status_field(pid, "VmRSS");
        if last.saturating_sub(now) * 500 > last {
            steady_since = Instant::now();
        }
        last = now;
        if steady_since.elapsed() >= Duration::from_secs(2)
            || start.elapsed() >= Duration::from_secs(10)
        {
            return last;
        }
    }
}

/// A field of /proc/PID/status in kB (VmRSS, VmHWM) or as a count (Threads).
fn status_field(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

struct Row {
    routes: usize,
    json_bytes: usize,
    empty_kb: u64,
    load_kb: u64,
    swapped_kb: u64,
    peak_kb: u64,
    threads: u64,
    swap_ms: f64,
}

fn measure(binary: &Path, dir: &Path, routes: usize, swaps: usize) -> Row {
    let (http, https, admin) = (free_port(), free_port(), free_port());
    let file = dir.join(format!("snapshot-{routes}.json"));
    let (empty_version, _) = write(&file, Snapshot::default());
    let mut command = Command::new(binary);
    command
        .args(["serve", "proxy", "--snapshot-file"])
        .arg(&file)
        .args(["--bind-address", "127.0.0.1", "--health-addr"])
        .arg(format!("127.0.0.1:{admin}"))
        .env("COXSWAIN_LOG", "warn");
    if let Ok(threads) = std::env::var("COXSWAIN_BENCH_THREADS") {
        command.args(["--threads", &threads]);
    }
    let mut proxy = command.spawn().unwrap();
    let pid = proxy.id();
    wait_served(&mut proxy, admin, &empty_version);
    let empty_kb = status_field(pid, "VmRSS");

    let base = snapshot(routes, http, https);
    let (version, json_bytes) = write(&file, base.clone());
    wait_served(&mut proxy, admin, &version);
    let load_kb = settled_rss(pid);

    let start = Instant::now();
    for k in 1..=swaps {
        let mut next = base.clone();
        let path = next.listeners[0].virtual_hosts[0].routes[0]
            .r#match
            .as_mut()
            .and_then(|m| m.path.as_mut())
            .unwrap();
        path.value = format!("/swap{k}/");
        let (version, _) = write(&file, next);
        wait_served(&mut proxy, admin, &version);
    }
    let swap_ms = start.elapsed().as_secs_f64() * 1e3 / swaps.max(1) as f64;
    let swapped_kb = settled_rss(pid);
    let peak_kb = status_field(pid, "VmHWM");
    let threads = status_field(pid, "Threads");
    proxy.kill().unwrap();
    proxy.wait().unwrap();
    Row {
        routes,
        json_bytes,
        empty_kb,
        load_kb,
        swapped_kb,
        peak_kb,
        threads,
        swap_ms,
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let binary = args
        .next()
        .expect("usage: memory COXSWAIN_BINARY [ROUTES ...]");
    let sizes: Vec<usize> = args.map(|a| a.parse().unwrap()).collect();
    let sizes = if sizes.is_empty() {
        vec![1_000, 5_000, 20_000]
    } else {
        sizes
    };
    let swaps = env_count("COXSWAIN_BENCH_SWAPS", 100);
    let dir = tempfile::tempdir().unwrap();
    let rows: Vec<Row> = sizes
        .iter()
        .map(|&n| measure(Path::new(&binary), dir.path(), n, swaps))
        .collect();

    println!(
        "{:>7} {:>6} {:>5} {:>9} {:>10} {:>10} {:>12} {:>7} {:>9} {:>7} {:>8}",
        "routes",
        "hosts",
        "certs",
        "JSON MB",
        "empty MB",
        "load MB",
        format!("{swaps} swaps MB"),
        "growth",
        "peak MB",
        "threads",
        "ms/swap"
    );
    for r in &rows {
        let hosts = r.routes.div_ceil(PATHS_PER_HOST);
        println!(
            "{:>7} {:>6} {:>5} {:>9.1} {:>10.1} {:>10.1} {:>12.1} {:>6.1}% {:>9.1} {:>7} {:>8.0}",
            r.routes,
            hosts,
            hosts.div_ceil(TLS_EVERY),
            r.json_bytes as f64 / 1e6,
            mb(r.empty_kb),
            mb(r.load_kb),
            mb(r.swapped_kb),
            (r.swapped_kb as f64 / r.load_kb as f64 - 1.0) * 100.0,
            mb(r.peak_kb),
            r.threads,
            r.swap_ms
        );
    }
}
