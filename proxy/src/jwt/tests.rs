use super::mint::{Signer, jwks, now, unsigned};
use super::*;
use serde_json::json;

fn provider(issuer: &str, audiences: &[&str], keys: &str) -> snap::JwtProvider {
    snap::JwtProvider {
        name: issuer.into(),
        issuer: issuer.into(),
        audiences: audiences.iter().map(|a| (*a).to_owned()).collect(),
        jwks: keys.into(),
        claims_to_headers: vec![
            snap::ClaimToHeader {
                claim: "sub".into(),
                header: "X-User".into(),
            },
            snap::ClaimToHeader {
                claim: "admin".into(),
                header: "x-admin".into(),
            },
        ],
        clock_skew_seconds: 30,
    }
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[test]
fn tokens_of_every_key_type_pass_and_name_their_claims() {
    let signers = [
        Signer::ed25519("ed"),
        Signer::p256("ec"),
        Signer::rsa("rsa"),
    ];
    let keys = jwks(&signers.iter().collect::<Vec<_>>());
    let auth = JwtAuth::new(&snap::JwtAuth {
        providers: vec![provider("https://issuer.example", &["shop"], &keys)],
    });
    let claims = json!({"iss": "https://issuer.example", "aud": ["other", "shop"], "sub": "ada",
                        "admin": true, "exp": now() + 60, "nbf": now() - 5});
    for s in &signers {
        let fields = auth
            .verify(Some(&bearer(&s.sign(&claims))), now())
            .unwrap_or_else(|e| panic!("{}: {e}", s.alg()));
        assert_eq!(
            fields,
            vec![
                ("x-user".to_owned(), "ada".to_owned()),
                ("x-admin".to_owned(), "true".to_owned())
            ]
        );
    }
}

#[test]
fn each_way_a_token_can_be_wrong_is_refused() {
    let good = Signer::p256("k1");
    let other = Signer::p256("k1");
    let auth = JwtAuth::new(&snap::JwtAuth {
        providers: vec![provider(
            "https://issuer.example",
            &["shop"],
            &jwks(&[&good]),
        )],
    });
    let base =
        json!({"iss": "https://issuer.example", "aud": "shop", "sub": "ada", "exp": now() + 60});
    let with = |k: &str, v: serde_json::Value| {
        let mut c = base.clone();
        c[k] = v;
        c
    };
    let cases = [
        (None, Refused::Missing),
        (Some("Basic YWRhOng=".to_owned()), Refused::Missing),
        (Some(bearer("not.a.jwt")), Refused::Malformed),
        (
            Some(bearer(&good.sign(&with("exp", json!(now() - 120))))),
            Refused::Expired,
        ),
        (
            Some(bearer(&good.sign(&with("nbf", json!(now() + 120))))),
            Refused::NotYetValid,
        ),
        (
            Some(bearer(
                &good.sign(&with("iss", json!("https://evil.example"))),
            )),
            Refused::Issuer,
        ),
        (
            Some(bearer(&good.sign(&with("aud", json!("admin-console"))))),
            Refused::Audience,
        ),
        (Some(bearer(&other.sign(&base))), Refused::Signature),
        (Some(bearer(&unsigned(&base))), Refused::Algorithm),
        (
            Some(bearer(&good.sign_with_header(
                &json!({"alg": "HS256", "kid": "k1"}),
                &base,
            ))),
            Refused::Algorithm,
        ),
        (
            Some(bearer(&good.sign_with_header(
                &json!({"alg": "ES256", "kid": "k2"}),
                &base,
            ))),
            Refused::Signature,
        ),
        (
            Some(bearer(&good.sign_with_header(
                &json!({"alg": "ES256", "crit": ["exp"]}),
                &base,
            ))),
            Refused::Malformed,
        ),
    ];
    for (authorization, expected) in cases {
        assert_eq!(
            auth.verify(authorization.as_deref(), now()),
            Err(expected),
            "{authorization:?}"
        );
    }
    // Within the leeway of 30 s, an expired token still passes; a token without a kid is
    // tried against every key.
    let late = good.sign(&with("exp", json!(now() - 20)));
    assert!(auth.verify(Some(&bearer(&late)), now()).is_ok());
    let no_kid = good.sign_with_header(&json!({"alg": "ES256"}), &base);
    assert!(auth.verify(Some(&bearer(&no_kid)), now()).is_ok());
}

#[test]
fn a_key_that_names_its_algorithm_is_not_used_with_another() {
    let rsa = Signer::rsa("rsa");
    let auth = JwtAuth::new(&snap::JwtAuth {
        providers: vec![provider("", &[], &jwks(&[&rsa]))],
    });
    let claims = json!({"sub": "ada"});
    assert!(
        auth.verify(Some(&bearer(&rsa.sign(&claims))), now())
            .is_ok()
    );
    // The same signature bytes under PS256 would be checked with the wrong padding; the key
    // says RS256, so it is not even tried.
    let ps = rsa.sign_with_header(&json!({"alg": "PS256", "kid": "rsa"}), &claims);
    assert_eq!(
        auth.verify(Some(&bearer(&ps)), now()),
        Err(Refused::Signature)
    );
}

#[test]
fn jwks_documents_keep_only_signing_keys_they_can_use() {
    let ed = Signer::ed25519("ed");
    let doc = json!({"keys": [
        ed.jwk(),
        {"kty": "oct", "k": "c2VjcmV0"},
        {"kty": "EC", "crv": "P-521", "x": "AA", "y": "AA"},
        {"kty": "RSA", "use": "enc", "n": "AQAB", "e": "AQAB"},
        {"kty": "EC", "crv": "P-256", "x": "AAAA", "y": "AAAA"},
    ]});
    assert_eq!(usable_keys(&doc.to_string()), 1);
    assert_eq!(usable_keys("not json"), 0);
    assert_eq!(usable_keys("{\"keys\": 3}"), 0);
}
