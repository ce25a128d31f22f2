//! SVID bootstrap against a real API server: TokenReview decides, the allowlist narrows, the
//! CA signs; real TLS and gRPC on loopback.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use coxswain_api::discovery::BootstrapRequest;
use coxswain_api::discovery::identity_client::IdentityClient;
use coxswain_operator::identity::server::{IdentityService, KubeTokenReviewer};
use coxswain_operator::identity::{Allowlist, Ca};
use coxswain_testenv::TestEnv;
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

#[tokio::test]
async fn bootstrap_issues_svids_only_for_valid_tokens_of_deployed_proxies() {
    let env = TestEnv::new().await;
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
    allow.allow_dedicated(&env.namespace, "edge", "coxswain");
    let service = IdentityService {
        ca: ca.clone(),
        reviewer: KubeTokenReviewer {
            client: env.client.clone(),
        },
        allowlist: Arc::new(RwLock::new(allow)),
        trust_domain: "cluster.local".into(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
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
    });

    let channel = Channel::from_shared(format!("https://localhost:{port}"))
        .unwrap()
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca.cert_pem()))
                .domain_name("localhost"),
        )
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = IdentityClient::new(channel);
    let bootstrap = |token: String| BootstrapRequest {
        token,
        csr_pem: csr(),
    };

    // The shared proxy's and a dedicated Gateway's ServiceAccounts get SVIDs.
    for sa in ["coxswain-proxy", "edge-coxswain"] {
        let t = token(&env, sa, "coxswain-discovery").await;
        let resp = client.bootstrap(bootstrap(t)).await.unwrap().into_inner();
        assert_eq!(
            resp.spiffe_id,
            format!("spiffe://cluster.local/ns/{}/sa/{sa}", env.namespace)
        );
        assert!(resp.certificate_chain_pem.contains("BEGIN CERTIFICATE"));
        assert_eq!(resp.trust_bundle_pem, ca.cert_pem());
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
    }

    // A token for another audience is refused.
    let wrong_audience = token(&env, "coxswain-proxy", "https://kubernetes.default.svc").await;
    let err = client
        .bootstrap(bootstrap(wrong_audience))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err}");

    // A valid token of a ServiceAccount Coxswain does not deploy is refused.
    let stranger = token(&env, "default-app", "coxswain-discovery").await;
    let err = client.bootstrap(bootstrap(stranger)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
    assert!(err.message().contains("default-app"), "{err}");

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

    let _ = stop.send(());
    server.await.unwrap().unwrap();
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
