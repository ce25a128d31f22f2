//! Standalone mode: serve a snapshot file (written by `coxswain snapshot compile -o json`) and
//! swap in a new one whenever the file changes. For local use, debugging and benchmarks; the
//! discovery stream replaces the file in a cluster.

use crate::admin;
use crate::listeners::Listeners;
use crate::table::{SharedTable, Table};
use crate::workers::Workers;
use coxswain_api::snapshot::outline::Outline;
use coxswain_api::snapshot::{Sealed, Snapshot};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use tokio::sync::watch;

#[derive(Debug, Clone)]
pub struct StandaloneConfig {
    pub snapshot_file: PathBuf,
    /// Address the snapshot's listener ports are bound on.
    pub bind_ip: IpAddr,
    /// /healthz, /readyz and /metrics.
    pub admin_addr: SocketAddr,
    /// How often the file is checked for changes.
    pub poll: Duration,
    /// After SIGTERM: how long in-flight connections may take before the process exits.
    pub drain: Duration,
    /// Connection worker threads (see `workers`); 0 serves connections on the caller's runtime.
    pub threads: usize,
    /// Deadlines and caps on client connections.
    pub limits: crate::limits::Limits,
}

#[derive(Debug, thiserror::Error)]
pub enum StandaloneError {
    #[error("starting the runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("starting connection workers: {0}")]
    Workers(#[source] std::io::Error),
    #[error(transparent)]
    Admin(#[from] admin::AdminError),
}

/// Runs until SIGTERM or SIGINT, then drains.
pub fn run(config: StandaloneConfig) -> Result<(), StandaloneError> {
    // Connections run on the workers; this runtime only accepts them, watches the file and
    // answers the admin endpoints.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(StandaloneError::Runtime)?;
    runtime.block_on(async {
        let mut terminate = signal(tokio::signal::unix::SignalKind::terminate());
        let mut interrupt = signal(tokio::signal::unix::SignalKind::interrupt());
        let stop = async {
            tokio::select! {
                _ = recv(&mut terminate) => {}
                _ = recv(&mut interrupt) => {}
            }
        };
        serve(config, stop).await
    })
}

/// Serves until `stop` completes, then drains. For embedding (tests); `run` is the process.
pub async fn serve(
    config: StandaloneConfig,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), StandaloneError> {
    let table = SharedTable::default();
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let mut listeners = Listeners::new(table.clone(), config.bind_ip, shutdown_rx)
        .with_limits(config.limits.clone());
    if config.threads > 0 {
        let workers = Workers::start(config.threads).map_err(StandaloneError::Workers)?;
        listeners = listeners.with_workers(workers);
    }
    let admin = admin::serve(config.admin_addr, table.clone()).await?;
    tracing::info!(addr = %admin, "admin endpoints listening");

    let mut watcher = FileWatch::new(&config.snapshot_file);
    let mut tick = tokio::time::interval(config.poll);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if let Some(result) = watcher.poll() {
                    // A file that does not check is a refused snapshot, as one that does not
                    // build is (counted by the table); a missing one is not a snapshot.
                    let result = match result {
                        Polled::Read(sealed) => build(&table, &sealed),
                        Polled::Refused(e) => {
                            crate::metrics::Metrics::count(&table.metrics().snapshots_rejected);
                            Err(e)
                        }
                        Polled::Missing(e) => Err(e),
                    };
                    match result {
                        Ok((version, t)) => {
                            table.store(t);
                            for e in listeners.sync().await {
                                tracing::error!(error = %e, "listener not bound");
                            }
                            table.mark_applied();
                            table.forget_unused();
                            tracing::info!(%version, ports = ?listeners.ports(), "snapshot loaded");
                        }
                        Err(e) => tracing::error!(
                            file = %config.snapshot_file.display(),
                            error = %e,
                            "snapshot not loaded; still serving the previous one"
                        ),
                    }
                } else if listeners.unbound() > 0 {
                    // A port in use when the snapshot came (a process before this one still
                    // draining it) is served as soon as it is free; the failure was logged.
                    for e in listeners.sync().await {
                        tracing::debug!(error = %e, "listener still not bound");
                    }
                }
            }
            () = &mut stop => break,
        }
    }
    listeners.drain(&shutdown_tx, config.drain).await;
    Ok(())
}

/// The table for a snapshot read from the file, with its version.
fn build(table: &SharedTable, snapshot: &Sealed) -> Result<(String, Table), String> {
    let outline = Outline::of(snapshot).map_err(|e| e.to_string())?;
    let built = table.build(&outline).map_err(|e| e.to_string())?;
    Ok((outline.version, built))
}

fn signal(kind: tokio::signal::unix::SignalKind) -> Option<tokio::signal::unix::Signal> {
    tokio::signal::unix::signal(kind).ok()
}

async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
    match s {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// What identifies a version of a file without reading it. The inode changes when a writer
/// renames a new file into place (the atomic way); times and size catch in-place rewrites.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    inode: u64,
    modified: SystemTime,
    changed: (i64, i64),
    len: u64,
}

impl FileStamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            inode: meta.ino(),
            modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            changed: (meta.ctime(), meta.ctime_nsec()),
            len: meta.len(),
        }
    }
}

/// Notices changes of a file from its metadata. A file that does not read or check is read
/// once more at the next poll (a writer may have been half-way through) and only then
/// reported, once: a bad file is one error, not one per poll.
struct FileWatch {
    path: PathBuf,
    seen: Option<FileStamp>,
    /// The file as `seen` failed once; the next poll reads it again.
    retry: bool,
    /// The file is missing, and that was reported.
    missing: bool,
}

impl FileWatch {
    fn new(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
            seen: None,
            retry: false,
            missing: false,
        }
    }

    /// Some when there is something new to load, or a new failure.
    fn poll(&mut self) -> Option<Polled> {
        let meta = match std::fs::metadata(&self.path) {
            Ok(m) => m,
            Err(e) => {
                if !self.missing {
                    self.missing = true;
                    self.seen = None;
                    return Some(Polled::Missing(e.to_string()));
                }
                return None;
            }
        };
        self.missing = false;
        let stamp = FileStamp::of(&meta);
        if self.seen == Some(stamp) && !self.retry {
            return None;
        }
        let retried = self.seen == Some(stamp) && self.retry;
        self.seen = Some(stamp);
        let result = std::fs::read_to_string(&self.path)
            .map_err(|e| e.to_string())
            .and_then(|text| parse(&text))
            .and_then(|s| Sealed::check(s).map_err(|e| e.to_string()));
        self.retry = result.is_err() && !retried;
        if self.retry {
            return None;
        }
        Some(match result {
            Ok(sealed) => Polled::Read(Box::new(sealed)),
            Err(e) => Polled::Refused(e),
        })
    }
}

/// What a poll of the snapshot file found.
enum Polled {
    Read(Box<Sealed>),
    /// It does not read, parse or check (read twice, a poll apart).
    Refused(String),
    /// It is not there.
    Missing(String),
}

/// A snapshot file's text. JSON (what `snapshot compile -o json` writes) is read with
/// serde_json: serde_yaml holds every event of the document at once, about 25 times the file's
/// size (100 MB for a 4 MB snapshot of 5,000 routes), and the allocator keeps most of that
/// peak resident after it is freed. Anything else, or JSON serde_json refuses, is read as YAML
/// as before, so errors and accepted files are unchanged.
fn parse(text: &str) -> Result<Snapshot, String> {
    if text.trim_start().starts_with('{')
        && let Ok(snapshot) = serde_json::from_str::<Snapshot>(text)
    {
        return Ok(snapshot);
    }
    Snapshot::from_yaml(text).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use coxswain_api::snapshot as snap;

    #[test]
    fn json_reads_as_yaml_did() {
        let snapshot = Snapshot {
            scope: Some(snap::Scope {
                kind: Some(snap::scope::Kind::SharedPool(snap::SharedPool {})),
            }),
            listeners: vec![snap::Listener {
                port: 80,
                protocol: snap::Protocol::Https as i32,
                virtual_hosts: vec![snap::VirtualHost {
                    hostname: "a.example".into(),
                    routes: vec![snap::Route {
                        r#match: Some(snap::RouteMatch {
                            path: Some(snap::PathMatch {
                                kind: snap::path_match::Kind::Regex as i32,
                                value: "/v[0-9]+".into(),
                            }),
                            ..Default::default()
                        }),
                        filters: vec![snap::Filter {
                            kind: Some(snap::filter::Kind::RequestRedirect(
                                snap::RequestRedirect {
                                    status_code: 301,
                                    ..Default::default()
                                },
                            )),
                        }],
                        ..Default::default()
                    }],
                    single_label: false,
                    terminate_tls: false,
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
        .seal()
        .into_snapshot();
        let json = serde_json::to_string_pretty(&snapshot).expect("serializable");
        let parsed = parse(&json).expect("valid JSON");
        assert_eq!(parsed, snapshot);
        assert_eq!(parsed, Snapshot::from_yaml(&json).expect("valid YAML"));
        assert!(parse("{ not json, not: yaml").is_err());
    }

    #[test]
    fn a_bad_file_is_read_again_once_and_reported_once() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("snapshot.json");
        let mut watch = FileWatch::new(&path);
        assert!(matches!(watch.poll(), Some(Polled::Missing(_))));
        assert!(watch.poll().is_none(), "a missing file is reported once");
        std::fs::write(&path, "{ not a snapshot").expect("writable");
        // The first failure may be a writer half-way through: read again at the next poll,
        // and only then reported.
        assert!(watch.poll().is_none());
        assert!(matches!(watch.poll(), Some(Polled::Refused(_))));
        for _ in 0..10 {
            assert!(watch.poll().is_none(), "a bad file is reported once");
        }
        let good = Snapshot::default().seal().into_snapshot();
        let json = serde_json::to_string(&good).expect("serializable");
        std::fs::write(&path, json).expect("writable");
        assert!(matches!(watch.poll(), Some(Polled::Read(_))));
        assert!(watch.poll().is_none());
    }
}
