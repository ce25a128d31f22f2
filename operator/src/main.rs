//! `coxswain`: one binary, several roles. See `coxswain --help`.

use clap::Parser;
use coxswain_operator::cli::{Cli, Command, ProxyMode, ServeRole};
use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    // One process-wide crypto provider (ring), so no rustls user has to pick one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    coxswain_operator::telemetry::init(&cli.log);
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            // `{:#}` prints the whole context chain on one line.
            eprintln!("coxswain: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Crd(args) => {
            let out = coxswain_operator::manifests::crds(&args)?;
            if let Some(out) = out {
                std::io::stdout().lock().write_all(out.as_bytes())?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Snapshot(args) => {
            let skipped = coxswain_operator::snapshot_cmd::run(&args.command)?;
            if skipped > 0 {
                eprintln!("coxswain: {skipped} object(s) could not be read; the rest was compiled");
                return Ok(ExitCode::FAILURE);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve(serve) => match serve.role {
            ServeRole::Controller(_) => not_yet("serve controller", 7),
            ServeRole::Proxy(proxy) => match proxy.mode() {
                ProxyMode::Shared => not_yet("serve proxy --shared", 6),
                ProxyMode::Dedicated { .. } => not_yet("serve proxy --dedicated", 6),
                ProxyMode::Standalone(path) => {
                    coxswain_proxy::standalone::run(
                        coxswain_proxy::standalone::StandaloneConfig {
                            snapshot_file: path,
                            bind_ip: proxy.bind_address,
                            admin_addr: proxy.admin.health_addr,
                            poll: std::time::Duration::from_millis(200),
                            drain: std::time::Duration::from_secs(proxy.drain_seconds),
                            threads: proxy.threads.unwrap_or_else(|| {
                                std::thread::available_parallelism().map_or(1, |n| n.get())
                            }),
                        },
                    )?;
                    Ok(ExitCode::SUCCESS)
                }
            },
        },
    }
}

/// Roles whose implementation has not landed yet say so plainly instead of pretending to run.
fn not_yet(role: &str, issue: u32) -> anyhow::Result<ExitCode> {
    eprintln!(
        "coxswain: `{role}` is not implemented in this build yet (tracked in issue #{issue})"
    );
    Ok(ExitCode::from(3))
}
