//! Admin endpoints: `/healthz` (the process runs), `/readyz` (a snapshot is loaded and the
//! process is not terminating), and `/metrics` (Prometheus text). A deliberately small HTTP/1.1 responder: these endpoints are
//! read by kubelets and Prometheus, not by users.

use crate::table::SharedTable;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("binding admin endpoints on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Set once the process is told to stop. From then on `/readyz` fails, so the Pod leaves its
/// Service's endpoints while the proxy still accepts during its shutdown delay.
#[derive(Debug, Clone, Default)]
pub struct Terminating(Arc<AtomicBool>);

impl Terminating {
    pub fn set(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Binds and serves in the background; returns the bound address.
pub async fn serve(addr: SocketAddr, table: SharedTable) -> Result<SocketAddr, AdminError> {
    serve_with(addr, table, Terminating::default()).await
}

/// [`serve`], with readiness failing once `terminating` is set.
pub async fn serve_with(
    addr: SocketAddr,
    table: SharedTable,
    terminating: Terminating,
) -> Result<SocketAddr, AdminError> {
    serve_fn(addr, move |path| answer(path, &table, &terminating)).await
}

/// The responder under `serve`, for any role's admin endpoints: `answer` maps a request path
/// to a status line and a plain-text body. Only the request line is read; one response per
/// connection.
pub async fn serve_fn<F>(addr: SocketAddr, answer: F) -> Result<SocketAddr, AdminError>
where
    F: Fn(&str) -> (&'static str, String) + Send + Sync + 'static,
{
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| AdminError::Bind { addr, source })?;
    let bound = listener.local_addr().unwrap_or(addr);
    let answer = std::sync::Arc::new(answer);
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                continue;
            };
            let answer = answer.clone();
            tokio::spawn(async move {
                // The whole head before answering: closing with unread bytes resets the
                // connection, and a client still writing would lose the response.
                let mut buf = [0u8; 4096];
                let mut n = 0;
                while n < buf.len() && !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf[n..]).await {
                        Ok(0) | Err(_) => break,
                        Ok(read) => n += read,
                    }
                }
                let request = String::from_utf8_lossy(&buf[..n]);
                let path = request.split_whitespace().nth(1).unwrap_or("/");
                let (status, body) = answer(path);
                let response = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(response.as_bytes()).await;
            });
        }
    });
    Ok(bound)
}

fn answer(path: &str, table: &SharedTable, terminating: &Terminating) -> (&'static str, String) {
    match path {
        "/healthz" => ("200 OK", "ok\n".into()),
        "/readyz" if terminating.is_set() => ("503 Service Unavailable", "terminating\n".into()),
        "/readyz" if table.is_loaded() => ("200 OK", "ok\n".into()),
        "/readyz" => ("503 Service Unavailable", "no snapshot loaded yet\n".into()),
        "/metrics" => ("200 OK", metrics(table)),
        _ => ("404 Not Found", "not found\n".into()),
    }
}

fn metrics(table: &SharedTable) -> String {
    let version = table.applied_version();
    let mut out = format!(
        "# HELP coxswain_proxy_snapshot_swaps_total Snapshots swapped in since start.\n\
         # TYPE coxswain_proxy_snapshot_swaps_total counter\n\
         coxswain_proxy_snapshot_swaps_total {}\n\
         # HELP coxswain_proxy_snapshot_info The snapshot being served.\n\
         # TYPE coxswain_proxy_snapshot_info gauge\n\
         coxswain_proxy_snapshot_info{{version=\"{version}\"}} 1\n\
         # HELP coxswain_proxy_ready Whether a snapshot is loaded.\n\
         # TYPE coxswain_proxy_ready gauge\n\
         coxswain_proxy_ready {}\n",
        table.swaps(),
        u8::from(table.is_loaded()),
    );
    table.metrics().render(&mut out);
    out
}
