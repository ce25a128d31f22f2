//! Container logs as a kubelet serves them to the API server (the pods/log subresource behind
//! `kubectl logs`): `GET /containerLogs/{namespace}/{pod}/{container}` over HTTPS on the node's
//! address, port [`KUBELET_PORT`].
//!
//! Containers write straight to their log files, which carry no timestamps. So a watcher notes
//! each file's size every [`TICK`]; `sinceTime` and `sinceSeconds` start at the size the file
//! had at the last tick before that time (up to one tick early, never late). `tailLines` and
//! `limitBytes` are honoured; `follow`, `previous` and `timestamps` are not. Requests are not
//! authenticated: the port listens on the node's bridge address of a test cluster only.

use super::Error;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The kubelet's well-known port, published in the Node's `daemonEndpoints`.
pub const KUBELET_PORT: u16 = 10250;
/// How often log file sizes are noted.
const TICK: Duration = Duration::from_millis(100);

/// Per log file: (when, size) each time the size was seen to change.
type Sizes = Arc<Mutex<HashMap<PathBuf, Vec<(SystemTime, u64)>>>>;

/// Serves container logs from `pods_dir` (`<ns>_<pod>_<uid>/<container>.log`) on `ip`.
pub async fn serve(pods_dir: PathBuf, ip: IpAddr) -> Result<(), Error> {
    let addr = SocketAddr::new(ip, KUBELET_PORT);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(Error::io(format!("binding the log endpoint {addr}")))?;
    let acceptor = tls_acceptor(ip)?;
    let sizes: Sizes = Arc::default();
    // One future for both, so stopping the endpoint stops the watcher too.
    tokio::select! {
        () = watch_sizes(pods_dir.clone(), sizes.clone()) => Ok(()),
        () = accept_loop(listener, acceptor, pods_dir, sizes) => Ok(()),
    }
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    pods_dir: PathBuf,
    sizes: Sizes,
) {
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "log endpoint accept failed");
                tokio::time::sleep(TICK).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let (pods_dir, sizes) = (pods_dir.clone(), sizes.clone());
        tokio::spawn(async move {
            let Ok(mut tls) = acceptor.accept(tcp).await else {
                return;
            };
            let reply = match read_target(&mut tls).await {
                Some(target) => answer(&pods_dir, &sizes, &target),
                None => reply(400, b"bad request".to_vec()),
            };
            let _ = tls.write_all(&reply).await;
            let _ = tls.shutdown().await;
        });
    }
}

/// A self-signed serving certificate: the API server does not verify kubelets unless told to.
fn tls_acceptor(ip: IpAddr) -> Result<tokio_rustls::TlsAcceptor, Error> {
    let cert = rcgen::generate_simple_self_signed(vec![ip.to_string(), super::NODE_NAME.into()])
        .map_err(|e| Error::Config(format!("log endpoint certificate: {e}")))?;
    let key = rustls_pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .and_then(|b| {
        b.with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key)
    })
    .map_err(|e| Error::Config(format!("log endpoint TLS: {e}")))?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// The request target of a GET, once the head has arrived.
async fn read_target(s: &mut (impl AsyncReadExt + Unpin)) -> Option<String> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .ok()?
            .ok()?;
        if n == 0 || head.len() > 16 * 1024 {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = std::str::from_utf8(&head).ok()?.lines().next()?;
    let mut parts = line.split(' ');
    (parts.next()? == "GET").then_some(())?;
    parts.next().map(str::to_owned)
}

fn answer(pods_dir: &Path, sizes: &Sizes, target: &str) -> Vec<u8> {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let ["containerLogs", ns, pod, container] = parts[..] else {
        return reply(404, format!("no such endpoint: {path}\n").into_bytes());
    };
    let Some(file) = log_file(pods_dir, ns, pod, container) else {
        return reply(
            404,
            format!("container {container} of pod {ns}/{pod} has no log here\n").into_bytes(),
        );
    };
    let Ok(content) = std::fs::read(&file) else {
        return reply(500, format!("reading {}\n", file.display()).into_bytes());
    };
    let param = |name: &str| {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .map(percent_decode)
    };
    let since = param("sinceTime")
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .map(SystemTime::from)
        .or_else(|| {
            let secs: u64 = param("sinceSeconds")?.parse().ok()?;
            SystemTime::now().checked_sub(Duration::from_secs(secs))
        });
    let start = since.map_or(0, |t| offset_at(sizes, &file, t));
    let start = usize::try_from(start)
        .unwrap_or(usize::MAX)
        .min(content.len());
    let mut body = &content[start..];
    if let Some(n) = param("tailLines").and_then(|n| n.parse::<usize>().ok()) {
        let lines: Vec<usize> = body
            .iter()
            .enumerate()
            .filter(|(i, b)| **b == b'\n' && i + 1 < body.len())
            .map(|(i, _)| i + 1)
            .collect();
        if n == 0 {
            body = &[];
        } else if lines.len() >= n {
            body = &body[lines[lines.len() - n]..];
        }
    }
    if let Some(limit) = param("limitBytes").and_then(|n| n.parse::<usize>().ok()) {
        body = &body[..limit.min(body.len())];
    }
    reply(200, body.to_vec())
}

/// The container's log in the newest directory of the pod (a recreated pod gets a new one).
fn log_file(pods_dir: &Path, ns: &str, pod: &str, container: &str) -> Option<PathBuf> {
    let prefix = format!("{ns}_{pod}_");
    std::fs::read_dir(pods_dir)
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path().join(format!("{container}.log")))
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max()
        .map(|(_, p)| p)
}

/// The file's size at the last tick at or before `t`: everything after it may be newer.
fn offset_at(sizes: &Sizes, file: &Path, t: SystemTime) -> u64 {
    let sizes = sizes.lock().unwrap_or_else(|e| e.into_inner());
    sizes.get(file).map_or(0, |seen| {
        seen.iter()
            .take_while(|(when, _)| *when <= t)
            .last()
            .map_or(0, |(_, size)| *size)
    })
}

async fn watch_sizes(pods_dir: PathBuf, sizes: Sizes) {
    loop {
        let now = SystemTime::now();
        let mut found = Vec::new();
        for dir in std::fs::read_dir(&pods_dir).into_iter().flatten().flatten() {
            for f in std::fs::read_dir(dir.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                let p = f.path();
                if p.extension().is_some_and(|e| e == "log")
                    && let Ok(m) = f.metadata()
                {
                    found.push((p, m.len()));
                }
            }
        }
        {
            let mut sizes = sizes.lock().unwrap_or_else(|e| e.into_inner());
            sizes.retain(|p, _| found.iter().any(|(f, _)| f == p));
            for (p, len) in found {
                let seen = sizes.entry(p).or_default();
                match seen.last() {
                    Some((_, last)) if *last == len => {}
                    // Truncated: what the old times said no longer holds.
                    Some((_, last)) if *last > len => *seen = vec![(now, len)],
                    _ => seen.push((now, len)),
                }
            }
        }
        tokio::time::sleep(TICK).await;
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn reply(status: u16, body: Vec<u8>) -> Vec<u8> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        _ => "Internal Server Error",
    };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_starts_at_the_last_size_seen_before() {
        let sizes: Sizes = Arc::default();
        let f = PathBuf::from("/x/c.log");
        let t = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        sizes
            .lock()
            .unwrap()
            .insert(f.clone(), vec![(t(10), 5), (t(20), 9), (t(30), 14)]);
        assert_eq!(offset_at(&sizes, &f, t(5)), 0);
        assert_eq!(offset_at(&sizes, &f, t(20)), 9);
        assert_eq!(offset_at(&sizes, &f, t(25)), 9);
        assert_eq!(offset_at(&sizes, &f, t(40)), 14);
        assert_eq!(
            percent_decode("2026-12-03T08%3A34%3A24Z"),
            "2026-12-03T08:34:24Z"
        );
    }
}
