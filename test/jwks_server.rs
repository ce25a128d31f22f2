//! An HTTPS server of JWKS documents for the controller's fetch tests: a CA made for the test
//! (rcgen) signs its certificate for localhost and 127.0.0.1, and the test changes the answer
//! while it runs. Shared by the operator's unit and integration tests through `#[path]`.
#![allow(dead_code, clippy::unwrap_used)]

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A CA certificate (PEM) and the issuer signing with it.
pub fn test_ca(name: &str) -> (String, rcgen::Issuer<'static, rcgen::KeyPair>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let pem = params.self_signed(&key).unwrap().pem();
    (pem, rcgen::Issuer::new(params, key))
}

pub struct JwksServer {
    pub port: u16,
    /// The CA that signed the server's certificate.
    pub ca_pem: String,
    /// (status, body) of every answer.
    answer: Arc<Mutex<(u16, String)>>,
    served: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl JwksServer {
    /// Listens on 127.0.0.1, answering every request with `status` and `body`.
    pub async fn start(status: u16, body: &str) -> Self {
        let (ca_pem, issuer) = test_ca("jwks test CA");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        let private = rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], private)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let answer = Arc::new(Mutex::new((status, body.to_owned())));
        let served = Arc::new(AtomicUsize::new(0));
        let (a, s) = (answer.clone(), served.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, answer, served) = (acceptor.clone(), a.clone(), s.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |_request| {
                        let (status, body) = answer.lock().unwrap().clone();
                        served.fetch_add(1, Ordering::SeqCst);
                        async move {
                            Ok::<_, Infallible>(
                                hyper::Response::builder()
                                    .status(status)
                                    .header("content-type", "application/jwk-set+json")
                                    .body(Full::new(Bytes::from(body)))
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self {
            port,
            ca_pem,
            answer,
            served,
            task,
        }
    }

    pub fn uri(&self) -> String {
        format!("https://localhost:{}/.well-known/jwks.json", self.port)
    }

    /// Answers from now on with `status` and `body`.
    pub fn set(&self, status: u16, body: &str) {
        *self.answer.lock().unwrap() = (status, body.to_owned());
    }

    /// Requests answered so far.
    pub fn served(&self) -> usize {
        self.served.load(Ordering::SeqCst)
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
