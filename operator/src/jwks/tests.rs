//! Fetches against a real in-process HTTPS server whose certificate a test CA signed: what is
//! accepted, what is refused and why, and a fetcher that follows a changing document while
//! keeping the last good one through failures.

use super::test_server::{JwksServer, test_ca};
use super::*;
use coxswain_testenv::eventually;
use std::sync::atomic::AtomicBool;

const KEY_A: &str = r#"{"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "a", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}"#;
const KEY_B: &str = r#"{"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "b", "x": "GbUZ8ns9sNXYVMLAu5UQEW6RP9ScKx8JfsQ9ARKeM_8"}]}"#;

fn source(server: &JwksServer, ca_pem: Option<&str>) -> JwksSource {
    JwksSource {
        uri: server.uri(),
        ca_pem: ca_pem.map(str::to_owned),
    }
}

#[tokio::test]
async fn a_document_is_fetched_over_tls_the_ca_bundle_verifies() {
    let server = JwksServer::start(200, KEY_A).await;
    let got = fetch(&source(&server, Some(&server.ca_pem)), &Settings::default()).await;
    assert_eq!(got.unwrap(), KEY_A);

    // By address too: the certificate names 127.0.0.1.
    let by_ip = JwksSource {
        uri: format!("https://127.0.0.1:{}/keys?v=2", server.port),
        ca_pem: Some(server.ca_pem.clone()),
    };
    assert_eq!(fetch(&by_ip, &Settings::default()).await.unwrap(), KEY_A);
}

#[tokio::test]
async fn a_server_another_ca_signed_is_refused() {
    let server = JwksServer::start(200, KEY_A).await;
    let (other_ca, _) = test_ca("some other CA");
    for ca in [Some(other_ca.as_str()), None] {
        let err = fetch(&source(&server, ca), &Settings::default())
            .await
            .unwrap_err();
        assert!(matches!(err, FetchError::Tls { .. }), "{err}");
    }
}

#[tokio::test]
async fn non_2xx_answers_large_bodies_and_keyless_documents_are_refused() {
    let server = JwksServer::start(404, "not here").await;
    let src = source(&server, Some(&server.ca_pem));
    let settings = Settings::default();
    let err = fetch(&src, &settings).await.unwrap_err();
    assert!(
        matches!(err, FetchError::Status(s) if s.as_u16() == 404),
        "{err}"
    );
    server.set(302, "");
    let err = fetch(&src, &settings).await.unwrap_err();
    assert!(
        err.to_string().contains("redirects are not followed"),
        "{err}"
    );

    let padded = format!(
        r#"{{"keys": [], "padding": "{}"}}"#,
        "x".repeat(settings.max_body)
    );
    server.set(200, &padded);
    let err = fetch(&src, &settings).await.unwrap_err();
    assert!(matches!(err, FetchError::TooLarge(_)), "{err}");

    server.set(200, r#"{"keys": []}"#);
    let err = fetch(&src, &settings).await.unwrap_err();
    assert!(matches!(err, FetchError::NoKey), "{err}");

    let uri = JwksSource {
        uri: format!("http://localhost:{}/keys", server.port),
        ca_pem: None,
    };
    let err = fetch(&uri, &settings).await.unwrap_err();
    assert!(matches!(err, FetchError::Uri(_)), "{err}");
}

#[tokio::test]
async fn a_server_that_never_answers_times_out() {
    // Accepts connections and never completes a TLS handshake.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let src = JwksSource {
        uri: format!("https://localhost:{}/", silent.local_addr().unwrap().port()),
        ca_pem: None,
    };
    let settings = Settings {
        timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let err = fetch(&src, &settings).await.unwrap_err();
    assert!(matches!(err, FetchError::Timeout(_)), "{err}");
}

fn fetcher() -> (Fetcher, Arc<admin::State>) {
    let admin = Arc::new(admin::State::new(Arc::new(AtomicBool::new(true))));
    let settings = Settings {
        retry_min: Duration::from_millis(50),
        retry_max: Duration::from_millis(100),
        ..Default::default()
    };
    (Fetcher::new(settings, admin.clone()), admin)
}

#[tokio::test]
async fn refreshes_follow_the_document_and_failures_keep_the_last_good_one() {
    let server = JwksServer::start(200, KEY_A).await;
    let src = source(&server, Some(&server.ca_pem));
    let (fetcher, admin) = fetcher();
    let documents = || fetcher.documents().get(&src).cloned();
    fetcher.want(BTreeMap::from([(src.clone(), Duration::from_millis(100))]));
    let first = eventually("the first document", Duration::from_secs(10), || async {
        documents()
    })
    .await;
    assert_eq!(first, Ok(KEY_A.to_owned()));

    // The server fails for a while: refreshes fail, the document stays.
    server.set(503, "down");
    let before = server.served();
    eventually("two failed refreshes", Duration::from_secs(10), || async {
        (server.served() >= before + 2).then_some(())
    })
    .await;
    assert_eq!(documents(), Some(Ok(KEY_A.to_owned())));
    let metrics = admin.render();
    assert!(
        metrics.lines().any(|l| l
            .starts_with("coxswain_controller_jwks_fetches_total{outcome=\"failed\"}")
            && !l.ends_with(" 0")),
        "{metrics}"
    );

    // Rotated: the next refresh brings the new keys, and the controller is told.
    server.set(200, KEY_B);
    eventually("the rotated document", Duration::from_secs(10), || async {
        (documents() == Some(Ok(KEY_B.to_owned()))).then_some(())
    })
    .await;
    tokio::time::timeout(Duration::from_secs(1), fetcher.changed.notified())
        .await
        .expect("the change was notified");

    // No policy names it any more: forgotten, and no longer fetched.
    fetcher.want(BTreeMap::new());
    assert_eq!(documents(), None);
}

#[tokio::test]
async fn a_source_never_fetched_says_why() {
    let server = JwksServer::start(200, KEY_A).await;
    let (wrong_ca, _) = test_ca("not the server's");
    let src = source(&server, Some(&wrong_ca));
    let (fetcher, _) = fetcher();
    fetcher.want(BTreeMap::from([(src.clone(), Duration::from_secs(300))]));
    let why = eventually("the failure", Duration::from_secs(10), || async {
        fetcher.documents().get(&src).cloned()
    })
    .await
    .unwrap_err();
    assert!(why.starts_with("TLS with localhost"), "{why}");
}
