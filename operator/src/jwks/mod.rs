//! Remote JWKS documents, fetched by the controller so that proxies never need egress to an
//! identity provider and no request waits on one.
//!
//! For every URL a CoxswainAccessPolicy names (`compile::jwks::sources`), a task GETs the
//! document over HTTPS, verified against the system's CAs plus the policy's CA bundle, again
//! every refresh interval. A failed fetch is retried with backoff, and a refresh that fails (or
//! returns a document without a usable key) keeps the last good document. The results are
//! plain data the compiler reads (`Store::remote_jwks`); whenever one changes, `changed` is
//! notified and the controller compiles again, so new keys reach the proxies without a restart.

use crate::admin;
use crate::compile::JwksSource;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper::header;
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::Notify;

#[cfg(test)]
#[path = "../../../test/jwks_server.rs"]
mod test_server;
#[cfg(test)]
mod tests;

/// How documents are fetched.
#[derive(Debug, Clone)]
pub struct Settings {
    /// One fetch (resolving, connecting, TLS, the request and the whole body) at most.
    pub timeout: Duration,
    /// A larger document is refused: a JWKS is a few keys, not megabytes.
    pub max_body: usize,
    /// Fetch every document at least this often, whatever its policy's refreshSeconds (which
    /// cannot go below 30): `--jwks-max-refresh-interval`. None: as the policies say.
    pub refresh_cap: Option<Duration>,
    /// The first retry after a failure; the delay doubles up to `retry_max`, and never exceeds
    /// the refresh interval.
    pub retry_min: Duration,
    pub retry_max: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(10),
            max_body: 256 * 1024,
            refresh_cap: None,
            retry_min: Duration::from_secs(1),
            retry_max: Duration::from_secs(60),
        }
    }
}

/// Why a fetch gave no document.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("not a usable https URL: {0}")]
    Uri(String),
    #[error("caBundle: {0}")]
    CaBundle(String),
    #[error("resolving {host}: {source}")]
    Resolve {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("connecting to {host}: {source}")]
    Connect {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS with {host}: {source}")]
    Tls {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
    #[error("answered {0} (redirects are not followed)")]
    Status(hyper::StatusCode),
    #[error("the document is over {0} bytes")]
    TooLarge(usize),
    #[error("reading the document: {0}")]
    Body(String),
    #[error("the document is not UTF-8 text")]
    NotText,
    #[error(
        "the document holds no signing key the proxy can use (RSA, EC P-256/P-384 or Ed25519 \
         in a JWKS document {{\"keys\": [...]}})"
    )]
    NoKey,
    #[error("no complete answer within {0:?}")]
    Timeout(Duration),
}

/// The system's CA certificates, read once.
fn system_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::warn!(error = %e, "reading the system's CA certificates");
        }
        found.certs
    })
}

/// TLS settings trusting the system's CAs and `ca_pem`'s certificates.
fn tls_config(ca_pem: Option<&str>) -> Result<Arc<rustls::ClientConfig>, FetchError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(system_roots().iter().cloned());
    if let Some(pem) = ca_pem {
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            let cert = cert.map_err(|e| FetchError::CaBundle(e.to_string()))?;
            roots
                .add(cert)
                .map_err(|e| FetchError::CaBundle(e.to_string()))?;
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| FetchError::CaBundle(e.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Aborts the connection task when the fetch ends, timed out or not.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One GET of `source` over a fresh connection: the document, when it is UTF-8 text with at
/// least one key the proxy can use.
pub async fn fetch(source: &JwksSource, settings: &Settings) -> Result<String, FetchError> {
    tokio::time::timeout(settings.timeout, fetch_once(source, settings))
        .await
        .map_err(|_| FetchError::Timeout(settings.timeout))?
}

async fn fetch_once(source: &JwksSource, settings: &Settings) -> Result<String, FetchError> {
    let uri: hyper::Uri = source
        .uri
        .parse()
        .map_err(|e: hyper::http::uri::InvalidUri| FetchError::Uri(e.to_string()))?;
    let authority = match (uri.scheme_str(), uri.authority()) {
        (Some("https"), Some(a)) if !a.as_str().contains('@') => a.clone(),
        _ => return Err(FetchError::Uri(source.uri.clone())),
    };
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = authority.port_u16().unwrap_or(443);
    let name = ServerName::try_from(host.clone()).map_err(|e| FetchError::Uri(e.to_string()))?;
    let tls = tls_config(source.ca_pem.as_deref())?;

    let addrs: Vec<_> = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|source| FetchError::Resolve {
            host: host.clone(),
            source,
        })?
        .collect();
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
    let mut tcp = None;
    for addr in addrs {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(s) => {
                tcp = Some(s);
                break;
            }
            Err(e) => last = e,
        }
    }
    let tcp = tcp.ok_or_else(|| FetchError::Connect {
        host: host.clone(),
        source: last,
    })?;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|source| FetchError::Tls {
            host: host.clone(),
            source,
        })?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let _connection = AbortOnDrop(tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "JWKS connection ended");
        }
    }));
    let target = uri.path_and_query().map_or("/", |p| p.as_str());
    let request = hyper::Request::get(target)
        .header(header::HOST, authority.as_str())
        .header(header::ACCEPT, "application/jwk-set+json, application/json")
        .header(
            header::USER_AGENT,
            concat!("coxswain/", env!("CARGO_PKG_VERSION")),
        )
        .body(Empty::<Bytes>::new())
        .map_err(|e| FetchError::Uri(e.to_string()))?;
    let response = sender.send_request(request).await?;
    if !response.status().is_success() {
        return Err(FetchError::Status(response.status()));
    }
    // Refused before reading when the server says up front that it is too large.
    let declared = response
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > settings.max_body as u64) {
        return Err(FetchError::TooLarge(settings.max_body));
    }
    let body = Limited::new(response.into_body(), settings.max_body)
        .collect()
        .await
        .map_err(|e| {
            if e.downcast_ref::<LengthLimitError>().is_some() {
                FetchError::TooLarge(settings.max_body)
            } else {
                FetchError::Body(e.to_string())
            }
        })?
        .to_bytes();
    let document = String::from_utf8(body.to_vec()).map_err(|_| FetchError::NotText)?;
    if coxswain_proxy::jwt::usable_keys(&document) == 0 {
        return Err(FetchError::NoKey);
    }
    Ok(document)
}

/// Keeps every wanted document fetched; see the module's documentation.
pub struct Fetcher {
    shared: Arc<Shared>,
    /// Per source: its refresh interval and the task fetching it.
    tasks: Mutex<BTreeMap<JwksSource, (Duration, tokio::task::JoinHandle<()>)>>,
    /// Notified when a document arrives or changes, or a source's error changes.
    pub changed: Arc<Notify>,
}

struct Shared {
    settings: Settings,
    results: Mutex<BTreeMap<JwksSource, Result<String, String>>>,
    changed: Arc<Notify>,
    admin: Arc<admin::State>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Fetcher {
    pub fn new(settings: Settings, admin: Arc<admin::State>) -> Self {
        let changed = Arc::new(Notify::new());
        Self {
            shared: Arc::new(Shared {
                settings,
                results: Mutex::default(),
                changed: changed.clone(),
                admin,
            }),
            tasks: Mutex::default(),
            changed,
        }
    }

    /// Fetches exactly these sources from now on, each at least every given interval: starts
    /// the new ones and stops (and forgets) those no policy names any more.
    pub fn want(&self, sources: BTreeMap<JwksSource, Duration>) {
        let cap = self.shared.settings.refresh_cap;
        let mut tasks = lock(&self.tasks);
        tasks.retain(|source, (_, task)| {
            let keep = sources.contains_key(source);
            if !keep {
                task.abort();
            }
            keep
        });
        lock(&self.shared.results).retain(|source, _| sources.contains_key(source));
        for (source, every) in sources {
            let every = cap.map_or(every, |c| every.min(c));
            if tasks.get(&source).is_some_and(|(e, _)| *e == every) {
                continue;
            }
            // A new interval restarts the task; the last good document stays meanwhile.
            if let Some((_, old)) = tasks.remove(&source) {
                old.abort();
            }
            let task = tokio::spawn(keep_fetched(self.shared.clone(), source.clone(), every));
            tasks.insert(source, (every, task));
        }
    }

    /// What the compiler gets: each wanted source's document, or why there is none yet.
    /// Sources not tried yet are absent.
    pub fn documents(&self) -> BTreeMap<JwksSource, Result<String, String>> {
        lock(&self.shared.results).clone()
    }
}

impl Drop for Fetcher {
    fn drop(&mut self) {
        for (_, task) in lock(&self.tasks).values() {
            task.abort();
        }
    }
}

/// Fetches `source` every `every`, retrying failures with backoff.
async fn keep_fetched(shared: Arc<Shared>, source: JwksSource, every: Duration) {
    let settings = &shared.settings;
    let mut retry = settings.retry_min;
    loop {
        let wait = match fetch(&source, settings).await {
            Ok(document) => {
                shared.admin.jwks_fetched(true);
                retry = settings.retry_min;
                shared.record(&source, Ok(document));
                every
            }
            Err(e) => {
                shared.admin.jwks_fetched(false);
                let wait = retry.min(every);
                retry = (retry * 2).min(settings.retry_max);
                let kept = shared.record(&source, Err(e.to_string()));
                tracing::warn!(
                    uri = %source.uri,
                    error = %e,
                    retry_in = ?wait,
                    kept_last_good = kept,
                    "fetching a JWKS failed"
                );
                wait
            }
        };
        tokio::time::sleep(wait).await;
    }
}

impl Shared {
    /// Records a fetch's outcome, notifying the controller when what it compiles changes. A
    /// failure never replaces a good document; returns whether one was kept.
    fn record(&self, source: &JwksSource, outcome: Result<String, String>) -> bool {
        let mut results = lock(&self.results);
        let current = results.get(source);
        if outcome.is_err() && current.is_some_and(Result::is_ok) {
            return true;
        }
        if current == Some(&outcome) {
            return false;
        }
        if let Ok(document) = &outcome {
            tracing::info!(uri = %source.uri, bytes = document.len(), "new JWKS document");
        }
        results.insert(source.clone(), outcome);
        self.changed.notify_one();
        false
    }
}
