//! `coxswain snapshot compile|status|match`: the compiler and the router, offline.

use crate::cli::{CompileSettings, MatchArgs, OutputFormat, SnapshotCommand};
use crate::compile::{self, ScopeKey, Store, status::ObjectKey};
use coxswain_api::snapshot::{Sealed, Snapshot};
use coxswain_proxy::router::{Request, Router};
use std::io::Write;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotCmdError {
    #[error("--scope {0:?}: expected `shared` or `gateway/NAMESPACE/NAME`")]
    Scope(String),
    #[error(
        "no snapshot for scope {0}: no accepted Gateway of ours with a dedicated proxy has that name"
    )]
    NoSuchScope(String),
    #[error("reading snapshot {path}: {message}")]
    ReadSnapshot { path: String, message: String },
    #[error("--header {0:?}: expected NAME:VALUE")]
    Header(String),
    #[error("encoding output: {0}")]
    Encode(String),
    #[error("writing output: {0}")]
    Io(#[from] std::io::Error),
}

/// Runs the command; returns how many input objects could not be loaded (reported on stderr).
pub fn run(command: &SnapshotCommand) -> Result<usize, SnapshotCmdError> {
    let (text, skipped) = match command {
        SnapshotCommand::Compile(args) => {
            let (compiled, skipped) = load_and_compile(&args.files, &args.compile);
            let snapshot = scope_snapshot(compiled, &args.compile.scope)?;
            (encode(snapshot.snapshot(), args.output)?, skipped)
        }
        SnapshotCommand::Status(args) => {
            let (compiled, skipped) = load_and_compile(&args.files, &args.compile);
            (encode(&compiled.status, args.output)?, skipped)
        }
        SnapshotCommand::Match(args) => match &args.snapshot {
            Some(path) => {
                let read_err = |message: String| SnapshotCmdError::ReadSnapshot {
                    path: path.display().to_string(),
                    message,
                };
                let text = std::fs::read_to_string(path).map_err(|e| read_err(e.to_string()))?;
                let snapshot = Snapshot::from_yaml(&text).map_err(|e| read_err(e.to_string()))?;
                let snapshot = Sealed::check(snapshot).map_err(|e| read_err(e.to_string()))?;
                (match_request(args, &snapshot)?, 0)
            }
            None => {
                let (compiled, skipped) = load_and_compile(&args.files, &args.compile);
                let snapshot = scope_snapshot(compiled, &args.compile.scope)?;
                (match_request(args, &snapshot)?, skipped)
            }
        },
    };
    std::io::stdout().lock().write_all(text.as_bytes())?;
    Ok(skipped)
}

/// The snapshot of `--scope`.
fn scope_snapshot(
    mut compiled: compile::Compiled,
    scope: &str,
) -> Result<Sealed, SnapshotCmdError> {
    compiled
        .snapshots
        .remove(&parse_scope(scope)?)
        .ok_or_else(|| SnapshotCmdError::NoSuchScope(scope.to_owned()))
}

/// Loads the files (reporting what cannot be read on stderr) and compiles them.
fn load_and_compile(
    files: &[std::path::PathBuf],
    args: &CompileSettings,
) -> (compile::Compiled, usize) {
    let (store, errors) = Store::load_paths(files);
    for e in &errors {
        eprintln!("coxswain: skipped: {e}");
    }
    let config = compile::Config {
        controller_name: args.controller_name.clone(),
        ingress_nginx_compat: args.ingress_nginx_compat,
        ingress_http_port: u32::from(args.ingress_http_port),
        ingress_https_port: u32::from(args.ingress_https_port),
        shared_gateway_ports: args.shared_gateway_ports.0,
        ..Default::default()
    };
    (compile::compile(&store, &config), errors.len())
}

/// `snapshot match`: the proxy's routing decision for one request, from the same router code,
/// with the access checks the route asks of it.
fn match_request(args: &MatchArgs, snapshot: &Sealed) -> Result<String, SnapshotCmdError> {
    let read_err = |message: String| SnapshotCmdError::ReadSnapshot {
        path: args
            .snapshot
            .as_ref()
            .map_or_else(|| "(compiled)".to_owned(), |p| p.display().to_string()),
        message,
    };
    let router = Router::build(snapshot).map_err(|e| read_err(e.to_string()))?;
    let headers = args
        .headers
        .iter()
        .map(|h| {
            h.split_once(':')
                .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
                .ok_or_else(|| SnapshotCmdError::Header(h.clone()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let req = Request {
        host: &args.host,
        path_and_query: &args.path,
        method: &args.method,
        headers: headers.as_slice(),
    };
    let route = router.route(args.port, &req);
    let outcome = router.outcome(route);
    let source = route.and_then(|r| r.route.source.as_ref());
    let backends: Vec<serde_json::Value> = route
        .map(|r| r.route.backends.as_slice())
        .unwrap_or_default()
        .iter()
        .filter_map(|b| {
            // Cluster names are "<namespace>/<service>:<port>".
            let (service, port) = b.cluster.rsplit_once(':')?;
            Some(serde_json::json!({
                "service": service,
                "port": port.parse::<u32>().ok()?,
                "weight": b.weight,
            }))
        })
        .collect();
    let mut answer = serde_json::json!({
        "status": outcome.status(),
        "route": source.map(|s| format!("{}/{}/{}", s.kind, s.namespace, s.name)),
        "rule": source.map(|s| s.rule),
        "backends": backends,
    });
    if let Some(access) = route.and_then(|r| access_checks(&r.route)) {
        answer["access"] = access;
    }
    encode(&answer, args.output)
}

/// What a request must pass on this route before it is forwarded, in the order the proxy
/// checks it (None when nothing).
fn access_checks(r: &coxswain_api::snapshot::Route) -> Option<serde_json::Value> {
    use coxswain_api::snapshot::external_auth::Protocol;
    let mut checks = serde_json::Map::new();
    if !r.rate_limits.is_empty() {
        checks.insert(
            "rateLimits".into(),
            r.rate_limits.iter().map(|l| l.id.clone()).collect(),
        );
    }
    if let Some(list) = &r.client_allowlist {
        checks.insert("clientAllowlist".into(), list.cidrs.len().into());
    }
    if let Some(b) = &r.basic_auth {
        checks.insert(
            "basicAuth".into(),
            serde_json::json!({"realm": b.realm, "users": b.users.len()}),
        );
    }
    if let Some(j) = &r.jwt {
        checks.insert(
            "jwt".into(),
            j.providers.iter().map(|p| p.name.clone()).collect(),
        );
    }
    if let Some(e) = &r.external_auth {
        let service = if e.cluster.is_empty() {
            &e.address
        } else {
            &e.cluster
        };
        let protocol = if e.protocol == Protocol::Grpc as i32 {
            "gRPC"
        } else {
            "HTTP"
        };
        checks.insert(
            "externalAuth".into(),
            serde_json::json!({"protocol": protocol, "service": service, "failureStatus": e.failure_status}),
        );
    }
    (!checks.is_empty()).then_some(serde_json::Value::Object(checks))
}

fn encode<T: serde::Serialize>(
    value: &T,
    output: OutputFormat,
) -> Result<String, SnapshotCmdError> {
    match output {
        OutputFormat::Json => serde_json::to_string_pretty(value)
            .map(|s| s + "\n")
            .map_err(|e| SnapshotCmdError::Encode(e.to_string())),
        OutputFormat::Yaml => coxswain_api::snapshot::to_yaml(value)
            .map_err(|e| SnapshotCmdError::Encode(e.to_string())),
    }
}

pub fn parse_scope(s: &str) -> Result<ScopeKey, SnapshotCmdError> {
    if s == "shared" {
        return Ok(ScopeKey::SharedPool);
    }
    match s.split('/').collect::<Vec<_>>().as_slice() {
        ["gateway", ns, name] if !ns.is_empty() && !name.is_empty() => {
            Ok(ScopeKey::Gateway(ObjectKey::new(*ns, *name)))
        }
        _ => Err(SnapshotCmdError::Scope(s.to_owned())),
    }
}
