//! Container probes as the kubelet runs them: httpGet (2xx/3xx is success; HTTPS without
//! certificate verification), tcpSocket (the connect succeeds) and exec (exit code 0, run inside
//! the container's namespaces).

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Resolves a probe port: a number, or the name of one of the container's ports.
pub(crate) fn port(container: &Container, port: &IntOrString) -> Option<u16> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).ok(),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok()),
    }
}

/// One probe attempt; `pid` is the container's main process (for exec probes).
pub(crate) async fn check(
    probe: &Probe,
    container: &Container,
    pod_ip: Ipv4Addr,
    pid: Option<u32>,
) -> bool {
    let timeout = Duration::from_secs(
        u64::try_from(probe.timeout_seconds.unwrap_or(1))
            .unwrap_or(1)
            .max(1),
    );
    tokio::time::timeout(timeout, attempt(probe, container, pod_ip, pid))
        .await
        .unwrap_or(false)
}

async fn attempt(probe: &Probe, container: &Container, pod_ip: Ipv4Addr, pid: Option<u32>) -> bool {
    if let Some(http) = &probe.http_get {
        let Some(port) = port(container, &http.port) else {
            return false;
        };
        let host = http
            .host
            .as_deref()
            .and_then(|h| h.parse::<Ipv4Addr>().ok())
            .unwrap_or(pod_ip);
        let addr = SocketAddr::from((host, port));
        let Ok(tcp) = TcpStream::connect(addr).await else {
            return false;
        };
        let mut request = format!(
            "GET {} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/1.36\r\nAccept: */*\r\nConnection: close\r\n",
            http.path.as_deref().unwrap_or("/")
        );
        for header in http.http_headers.iter().flatten() {
            request.push_str(&format!("{}: {}\r\n", header.name, header.value));
        }
        request.push_str("\r\n");
        if http.scheme.as_deref() == Some("HTTPS") {
            let config = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .map(|b| {
                b.dangerous()
                    .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate))
                    .with_no_client_auth()
            });
            let Ok(config) = config else {
                return false;
            };
            let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
            let name = rustls_pki_types::ServerName::IpAddress(std::net::IpAddr::V4(host).into());
            match connector.connect(name, tcp).await {
                Ok(tls) => http_status_ok(tls, &request).await,
                Err(_) => false,
            }
        } else {
            http_status_ok(tcp, &request).await
        }
    } else if let Some(tcp) = &probe.tcp_socket {
        let Some(port) = port(container, &tcp.port) else {
            return false;
        };
        TcpStream::connect((pod_ip, port)).await.is_ok()
    } else if let Some(exec) = &probe.exec {
        let (Some(pid), Some(command)) = (pid, exec.command.as_ref()) else {
            return false;
        };
        tokio::process::Command::new("nsenter")
            .arg("-t")
            .arg(pid.to_string())
            .args(["-n", "-m", "--"])
            .args(command)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .await
            .is_ok_and(|s| s.success())
    } else {
        // gRPC probes are not run by the test node: report failure so it is noticed.
        false
    }
}

async fn http_status_ok<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, request: &str) -> bool {
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut head = Vec::with_capacity(256);
    let mut buf = [0u8; 256];
    while !head.windows(2).any(|w| w == b"\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.len() > 8192 {
            break;
        }
    }
    let line = String::from_utf8_lossy(&head);
    line.split_whitespace()
        .nth(1)
        .and_then(|code| code.parse::<u16>().ok())
        .is_some_and(|code| (200..400).contains(&code))
}

/// Kubelet probes do not verify serving certificates; neither does this.
#[derive(Debug)]
struct AcceptAnyCertificate;

impl rustls::client::danger::ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls_pki_types::CertificateDer<'_>,
        _intermediates: &[rustls_pki_types::CertificateDer<'_>],
        _server_name: &rustls_pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &rustls_pki_types::CertificateDer<'_>,
        _dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _message: &[u8],
        _cert: &rustls_pki_types::CertificateDer<'_>,
        _dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}
