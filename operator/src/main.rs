//! `coxswain`: one binary, several roles. See `coxswain --help`.

use clap::Parser;
use coxswain_operator::cli::{Cli, Command, ProxyMode, ServeRole};
use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
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
                ProxyMode::Shared => not_yet("serve proxy --shared", 5),
                ProxyMode::Dedicated { .. } => not_yet("serve proxy --dedicated", 5),
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
