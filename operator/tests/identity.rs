//! SVID bootstrap against a real API server: TokenReview decides, the allowlist narrows, the
//! CA signs; real TLS and gRPC on loopback.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use coxswain_api::discovery::BootstrapRequest;
use coxswain_api::discovery::identity_client::IdentityClient;
use coxswain_operator::admin;
use coxswain_operator::identity::ratelimit::{RateLimit, RateLimiter};
use coxswain_operator::identity::server::{
    IdentityService, KubeTokenReviewer, Review, TokenReviewer,
};
use coxswain_operator::identity::{Allowlist, Ca};
use coxswain_testenv::TestEnv;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

async fn token(env: &TestEnv, sa: &str, audience: &str) -> String {
    support::service_account_token(env, sa, audience).await
}

fn csr() -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let params =
        rcgen::CertificateParams::new(vec!["i-want-to-be-the-controller".to_owned()]).unwrap();
    params.serialize_request(&key).unwrap().pem().unwrap()
}

fn bootstrap(token: String) -> BootstrapRequest {
    BootstrapRequest {
        token,
        csr_pem: csr(),
    }
}

/// The real TokenReview, counting how often it is asked.
struct Counted {
    inner: KubeTokenReviewer,
    calls: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl TokenReviewer for Counted {
    async fn review(&self, token: &str, audience: &str) -> Result<Review, String> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.review(token, audience).await
    }
}

struct Bootstrap {
    ca: Arc<Ca>,
    port: u16,
    admin: Arc<admin::State>,
    reviews: Arc<AtomicUsize>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// The bootstrap listener on loopback, reviewing tokens with `client`; the shared pool's and
/// Gateway edge's proxies are deployed.
async fn start(env: &TestEnv, client: kube::Client, limit: RateLimit) -> Bootstrap {
    let now = time::OffsetDateTime::now_utc();
    let ca = Arc::new(Ca::generate("cluster.local", now).unwrap());
    let (server_cert, server_key) = ca
        .sign_server(
            &["localhost".to_owned()],
            now,
            std::time::Duration::from_secs(3600),
        )
        .unwrap();
    let mut allow = Allowlist::new((&env.namespace, "coxswain-proxy"));
    allow.allow(&env.namespace, "edge-coxswain");
    let admin = Arc::new(admin::State::default());
    let reviews = Arc::new(AtomicUsize::new(0));
    let service = IdentityService {
        ca: ca.clone(),
        reviewer: Counted {
            inner: KubeTokenReviewer { client },
            calls: reviews.clone(),
        },
        allowlist: Arc::new(RwLock::new(allow)),
        trust_domain: "cluster.local".into(),
        limiter: RateLimiter::new(limit),
        admin: admin.clone(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        coxswain_operator::identity::server::serve(
            listener,
            &server_cert,
            &server_key,
            service,
            async {
                let _ = stopped.await;
            },
        )
        .await
        .unwrap();
    });
    Bootstrap {
        ca,
        port,
        admin,
        reviews,
        _stop: stop,
    }
}

impl Bootstrap {
    fn tls(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(self.ca.cert_pem()))
            .domain_name("localhost")
    }

    async fn client(&self) -> IdentityClient<Channel> {
        let channel = Channel::from_shared(format!("https://localhost:{}", self.port))
            .unwrap()
            .tls_config(self.tls())
            .unwrap()
            .connect()
            .await
            .unwrap();
        IdentityClient::new(channel)
    }

    /// A client whose connections come from `source` (another loopback address).
    async fn client_from(&self, source: IpAddr) -> IdentityClient<Channel> {
        let channel = Channel::from_shared(format!("https://localhost:{}", self.port))
            .unwrap()
            .tls_config(self.tls())
            .unwrap()
            .connect_with_connector(FromAddress {
                source,
                port: self.port,
            })
            .await
            .unwrap();
        IdentityClient::new(channel)
    }
}

/// Connects to 127.0.0.1:`port` from `source`.
#[derive(Clone)]
struct FromAddress {
    source: IpAddr,
    port: u16,
}

impl tonic::codegen::Service<tonic::transport::Uri> for FromAddress {
    type Response = hyper_util::rt::TokioIo<tokio::net::TcpStream>;
    type Error = std::io::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: tonic::transport::Uri) -> Self::Future {
        let (source, port) = (self.source, self.port);
        Box::pin(async move {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind((source, 0).into())?;
            let stream = socket.connect(([127, 0, 0, 1], port).into()).await?;
            Ok(hyper_util::rt::TokioIo::new(stream))
        })
    }
}

/// `name{labels} value` from the controller's /metrics, served over HTTP.
async fn metric(admin: &Arc<admin::State>, series: &str) -> Option<u64> {
    let addr = admin::serve(([127, 0, 0, 1], 0).into(), admin.clone())
        .await
        .unwrap();
    let text = support::get(addr.port(), "/metrics").await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

#[tokio::test]
async fn bootstrap_issues_client_only_svids_naming_the_pod_for_deployed_proxies() {
    let env = TestEnv::new().await;
    let b = start(&env, env.client.clone(), RateLimit::default()).await;
    let mut client = b.client().await;

    // The shared proxy's and a dedicated Gateway's ServiceAccounts get SVIDs, issued to the
    // Pod their projected token is bound to.
    for sa in ["coxswain-proxy", "edge-coxswain"] {
        let t =
            support::pod_token(&env, sa, &format!("{sa}-7f9c-x2v4q"), "coxswain-discovery").await;
        let resp = client.bootstrap(bootstrap(t)).await.unwrap().into_inner();
        assert_eq!(
            resp.spiffe_id,
            format!("spiffe://cluster.local/ns/{}/sa/{sa}", env.namespace)
        );
        assert!(resp.certificate_chain_pem.contains("BEGIN CERTIFICATE"));
        assert_eq!(resp.trust_bundle_pem, b.ca.cert_pem());
        let (_, pem) =
            x509_parser::pem::parse_x509_pem(resp.certificate_chain_pem.as_bytes()).unwrap();
        let cert = pem.parse_x509().unwrap();
        let sans = &cert
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names;
        assert_eq!(
            sans.len(),
            1,
            "only the SPIFFE ID, never the names the CSR asked for"
        );
        let pods: Vec<&str> = cert
            .subject()
            .iter_common_name()
            .map(|cn| cn.as_str().unwrap())
            .collect();
        assert_eq!(pods, [format!("{sa}-7f9c-x2v4q").as_str()]);
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth, "an SVID authenticates a client");
        assert!(!eku.server_auth, "an SVID is no server certificate");
        assert!(!eku.any && eku.other.is_empty());
    }

    // A token for another audience is refused, in words that are not the API server's.
    let wrong_audience = token(&env, "coxswain-proxy", "https://kubernetes.default.svc").await;
    let err = client
        .bootstrap(bootstrap(wrong_audience))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err}");
    assert_eq!(
        err.message(),
        "token not accepted for audience coxswain-discovery"
    );

    // A valid token of a ServiceAccount Coxswain does not deploy is refused.
    let stranger = token(&env, "default-app", "coxswain-discovery").await;
    let err = client.bootstrap(bootstrap(stranger)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
    assert!(err.message().contains("default-app"), "{err}");

    // A valid token bound to no Pod cannot say which replica it is: refused.
    let unbound = support::unbound_token(&env, "coxswain-proxy", Some("coxswain-discovery")).await;
    let err = client.bootstrap(bootstrap(unbound)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
    assert!(err.message().contains("not bound to a Pod"), "{err}");

    // Garbage is refused without a round trip to anything that matters.
    let err = client
        .bootstrap(bootstrap("not-a-jwt".into()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    let good = token(&env, "coxswain-proxy", "coxswain-discovery").await;
    let err = client
        .bootstrap(BootstrapRequest {
            token: good,
            csr_pem: "not a csr".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);

    for (reason, n) in [
        ("token_rejected", 2),
        ("not_allowed", 1),
        ("not_pod_bound", 1),
        ("bad_csr", 1),
    ] {
        let series = format!("coxswain_controller_bootstrap_refused_total{{reason=\"{reason}\"}}");
        assert_eq!(metric(&b.admin, &series).await, Some(n), "{series}");
    }
    assert_eq!(
        metric(&b.admin, "coxswain_controller_svids_issued_total").await,
        Some(2)
    );
}

#[tokio::test]
async fn a_failed_token_review_is_not_echoed_to_the_caller() {
    let env = TestEnv::new().await;
    // The controller's client may not create TokenReviews (a ServiceAccount without RBAC).
    let nobody = support::unbound_token(&env, "nobody", None).await;
    let kubeconfig = kube::config::Kubeconfig::read_from(env.cluster().kubeconfig()).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    config.auth_info = kube::config::AuthInfo {
        token: Some(nobody.into()),
        ..Default::default()
    };
    let forbidden = kube::Client::try_from(config).unwrap();
    let b = start(&env, forbidden, RateLimit::default()).await;
    let t = token(&env, "coxswain-proxy", "coxswain-discovery").await;
    let err = b.client().await.bootstrap(bootstrap(t)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err}");
    assert_eq!(
        err.message(),
        "the token could not be reviewed; retry later",
        "the API server's answer (who may not do what) stays in the controller's log"
    );
    assert_eq!(b.reviews.load(Ordering::SeqCst), 1);
    assert_eq!(
        metric(
            &b.admin,
            "coxswain_controller_bootstrap_refused_total{reason=\"review_failed\"}"
        )
        .await,
        Some(1)
    );
}

#[tokio::test]
async fn bootstrap_calls_are_rate_limited_per_source_before_any_token_review() {
    let env = TestEnv::new().await;
    // No refill: the budget is exactly the burst, whatever the test's pace.
    let limit = RateLimit {
        burst: 3,
        per_minute: 0,
        max_sources: 64,
    };
    let b = start(&env, env.client.clone(), limit).await;
    let t = token(&env, "coxswain-proxy", "coxswain-discovery").await;
    let mut client = b.client().await;
    let mut codes = Vec::new();
    for _ in 0..8 {
        codes.push(match client.bootstrap(bootstrap(t.clone())).await {
            Ok(_) => tonic::Code::Ok,
            Err(e) => {
                if e.code() == tonic::Code::ResourceExhausted {
                    assert!(e.message().contains("retry later"), "{e}");
                }
                e.code()
            }
        });
    }
    use tonic::Code::{Ok as Issued, ResourceExhausted as Limited};
    assert_eq!(
        codes,
        [
            Issued, Issued, Issued, Limited, Limited, Limited, Limited, Limited
        ]
    );
    assert_eq!(
        b.reviews.load(Ordering::SeqCst),
        3,
        "refused calls cost the API server nothing"
    );

    // Another source has its own budget; this one stays spent.
    let mut other = b.client_from([127, 0, 0, 2].into()).await;
    other.bootstrap(bootstrap(t.clone())).await.unwrap();
    let err = client.bootstrap(bootstrap(t)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);

    assert_eq!(
        metric(
            &b.admin,
            "coxswain_controller_bootstrap_refused_total{reason=\"rate_limited\"}"
        )
        .await,
        Some(6)
    );
    assert_eq!(
        metric(&b.admin, "coxswain_controller_svids_issued_total").await,
        Some(4)
    );
}

#[tokio::test]
async fn the_ca_lives_in_a_secret_shared_by_replicas_and_external_mode_fails_closed() {
    use coxswain_operator::identity::store::{
        CaMode, CaStoreError, load_or_create, publish_trust_bundle,
    };
    let env = TestEnv::new().await;
    // External mode with no Secret: refuse to start rather than invent a CA.
    let err = load_or_create(
        &env.client,
        &env.namespace,
        "cluster.local",
        CaMode::External,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, CaStoreError::Missing { .. }), "{err}");

    // Auto mode creates it once; later loads (other replicas, restarts) get the same CA.
    let first = load_or_create(&env.client, &env.namespace, "cluster.local", CaMode::Auto)
        .await
        .unwrap();
    let again = load_or_create(&env.client, &env.namespace, "cluster.local", CaMode::Auto)
        .await
        .unwrap();
    let external = load_or_create(
        &env.client,
        &env.namespace,
        "cluster.local",
        CaMode::External,
    )
    .await
    .unwrap();
    assert_eq!(first.cert_pem(), again.cert_pem());
    assert_eq!(first.cert_pem(), external.cert_pem());
    assert_eq!(first.key_pem(), again.key_pem());

    // The trust bundle carries the certificate and never the key.
    publish_trust_bundle(&env.client, &env.namespace, &first)
        .await
        .unwrap();
    let cm = env
        .api::<k8s_openapi::api::core::v1::ConfigMap>()
        .get(coxswain_api::names::TRUST_BUNDLE_CONFIGMAP)
        .await
        .unwrap();
    let data = cm.data.unwrap();
    assert_eq!(data["ca.crt"], first.cert_pem());
    assert!(!data.values().any(|v| v.contains("PRIVATE KEY")));
}
