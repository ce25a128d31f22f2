//! `coxswain snapshot compile|status`: the compiler, offline.

use crate::cli::{CompileArgs, OutputFormat, SnapshotCommand};
use crate::compile::{self, ScopeKey, Store, status::ObjectKey};
use std::io::Write;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotCmdError {
    #[error("--scope {0:?}: expected `shared` or `gateway/NAMESPACE/NAME`")]
    Scope(String),
    #[error(
        "no snapshot for scope {0}: no accepted Gateway of ours with a dedicated proxy has that name"
    )]
    NoSuchScope(String),
    #[error("encoding output: {0}")]
    Encode(String),
    #[error("writing output: {0}")]
    Io(#[from] std::io::Error),
}

/// Runs the command; returns how many input objects could not be loaded (reported on stderr).
pub fn run(command: &SnapshotCommand) -> Result<usize, SnapshotCmdError> {
    let (SnapshotCommand::Compile(args) | SnapshotCommand::Status(args)) = command;
    let (store, errors) = Store::load_paths(&args.files);
    for e in &errors {
        eprintln!("coxswain: skipped: {e}");
    }
    let config = compile::Config {
        controller_name: args.controller_name.clone(),
        ..Default::default()
    };
    let compiled = compile::compile(&store, &config);
    let text = match command {
        SnapshotCommand::Compile(_) => {
            let scope = parse_scope(&args.scope)?;
            let snapshot = compiled
                .snapshots
                .get(&scope)
                .ok_or_else(|| SnapshotCmdError::NoSuchScope(args.scope.clone()))?;
            encode(snapshot, args)?
        }
        SnapshotCommand::Status(_) => encode(&compiled.status, args)?,
    };
    std::io::stdout().lock().write_all(text.as_bytes())?;
    Ok(errors.len())
}

fn encode<T: serde::Serialize>(value: &T, args: &CompileArgs) -> Result<String, SnapshotCmdError> {
    match args.output {
        OutputFormat::Json => serde_json::to_string_pretty(value)
            .map(|s| s + "\n")
            .map_err(|e| SnapshotCmdError::Encode(e.to_string())),
        OutputFormat::Yaml => {
            serde_yaml::to_string(value).map_err(|e| SnapshotCmdError::Encode(e.to_string()))
        }
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
