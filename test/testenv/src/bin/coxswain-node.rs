//! `coxswain-node`: the test node as a process, for `make cluster-up` and `make demo` (the Rust
//! test harness runs the same agent in-process). See `coxswain_testenv::node`.

use clap::Parser;
use coxswain_testenv::node::{self, NodeConfig};
use kube::config::{KubeConfigOptions, Kubeconfig};
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(about = "Runs Pods of a local hack/cluster instance as processes in network namespaces")]
struct Args {
    /// Admin kubeconfig of the instance.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The instance's directory (COXSWAIN_CLUSTER_DIR): network index, state and logs.
    #[arg(long)]
    cluster_dir: PathBuf,
    /// IMAGE=BINARY: run containers of this image (the repository's last path segment, e.g.
    /// `coxswain` or `echo-basic`) as this local binary. Repeatable.
    #[arg(long = "image", value_parser = parse_image)]
    images: Vec<(String, PathBuf)>,
}

fn parse_image(s: &str) -> Result<(String, PathBuf), String> {
    let (name, path) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected IMAGE=BINARY"))?;
    let path = PathBuf::from(path);
    if !path.is_file() {
        return Err(format!("{}: no such binary", path.display()));
    }
    Ok((name.to_owned(), path))
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .init();
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("coxswain-node: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let images: HashMap<String, PathBuf> = args.images.into_iter().collect();
    let config = NodeConfig::for_cluster(&args.cluster_dir, images)?;
    let kubeconfig = Kubeconfig::read_from(&args.kubeconfig)?;
    let client_config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let client = kube::Client::try_from(client_config)?;
    let shutdown = async {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("stopping: every Pod's processes and the node's network go");
    };
    node::run(client, config, shutdown).await?;
    Ok(())
}
