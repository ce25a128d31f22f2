//! Signs JSON Web Tokens for tests, with the JWKS a provider would publish: Ed25519, P-256 and
//! a fixed 2048-bit RSA key (generated for these tests only; ring cannot generate RSA keys).
//! Shared by the proxy's and the controller's tests through `#[path]`.
#![allow(dead_code, clippy::unwrap_used)]

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{self, KeyPair};
use serde_json::{Value, json};

/// PKCS#8 DER of the test RSA key, base64.
const RSA_PKCS8: &str = "MIIEvAIBADANBgkqhkiG9w0BAQEFAASCBKYwggSiAgEAAoIBAQCuHdf0/+YnC+3wEq+taIR26DHXH9kwnErQyS7CprTw+CrrKOWyBtkXKVffFdEkofPSjWvqQTfQiW0ZK7uuJsx4zWUGaiD86XSkVXgITrQxC4gadXbGZz7FiosDkq02dPUtJoID3xAUrvlEjvyVPmCCdUABUirJn/goO9ZraaGh4t9ezo8GjSbWoEvftdE1EV0aYj25YKCDVU+YgIkJL1OH81nXWCPYckgAd4WYe1OWtzNtmf48agrFDoiL6PYM6rJKTsWpWWP8aEYcPUzl4Xhzub0cwIa8p7sPGmZhAi6+FaeyG8PCQR2JyaD7Ck5ANz4NWqOkQ5v9WlAKONuuCODJAgMBAAECggEAPtYnX1RQ16ue+aKMwwyyrYT7o7LrO3dUKshIN1hZeZNeTdLLHnYJN6oke66QdWN7LnP6S6awwXIvLMPTLjTzWu9pM6juccfA4CO2N21L611Jh573t/9/sGPg6m+vUjVgXCSHDGWelJBXBi6CKkxCISK2cCOarHwuXzrFFauf+N9iW6fIzuZzIy2m/42mbd40k4JTRVDXTZNzyt26l4YBzqbAQz9j0jWr0JHzVeKEu/gzoZLbP5HUNwkLO+mipmohDLcyu+3hXflCXohsKxbh0DwTC1xSkVcvLkJeS5zN5dWaulnPRojUG4QdCbyiX+yq9nZfhg8hhj87jDppPIv2BwKBgQDhl0FMy1K2TQG2u1yzeZsoQxXMjkEUzCRzo9sEmnwIqfCH50n8kX1gGPAMe9R92cbZNmtdCZsYuPH/AXgWpNlIg1PAO9Mr3auncNZYa2pr40zEQn8pSt9wQdH1zBoQPc9sts+7yD/ceRagDoO+89hm6ZujnsdekIuRJp9Liz1hdwKBgQDFlk1B/F8YGDhrfVhzXsrAg9C+hPynYdj4l5J3wqjop8nSmng0Y6EMRRfN+Pu6+00VpMCCh6k4qdrz5XL7jwwLgjxVMVZMg4WHNgwFka/hdPuo4wICKk9TIwjHXg5LchAHg8efLSxoQpFTHGcrXzxn02yWaJeUfkkKf9kKMP5fvwKBgHCbmiMFU3Jgmjxm5m1IhKTiZ91GHUKObJu07T0tCEEi40hTseD7lwQDLsBsh7OSo+oFei5k/yCmIVZTm2hiPXwu4f2RX2YELw1UDArzA5p7SfSl5Oft0f8tO+tgSJpW4FW6I5Pu78HUR/D5jdYhzqIAdoqEVazkpmZ8SwPgq3EdAoGACI8tQ5mCKRILh6SDa2QE1ngfV9F8/GdBtesi/ishlAqItKXaZTKXrGdl05dgmEYAndpoOH9V9k1tXbln1Lvqoqj+ohYkDeZ4p1XRCYC5JMQjjrpewOdCTnCrFa/eYKhNR3YO9LdJQC76CqalVXynqju/bXiUcGtUEK9fIJDkxBMCgYBmnSicdC920/Funm9jOgkFrThqqxEbuN6yASxefx/FfQSbxla4YzaJx3ZGeq0AfUK9QM5TXy/+q2puSf3P3sLDzDJqDBB7moxv1b+M58VsBxO6BLpnGcQthPxcw5m+5hA57Z3vEoUFFp6kaJxGgI3RjPCYngjo6yTpenvdJrEMKg==";

enum Pair {
    Ed25519(signature::Ed25519KeyPair),
    P256(signature::EcdsaKeyPair),
    Rsa(signature::RsaKeyPair),
}

pub struct Signer {
    pub kid: String,
    pair: Pair,
}

impl Signer {
    pub fn ed25519(kid: &str) -> Self {
        let rng = SystemRandom::new();
        let pkcs8 = signature::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let pair = signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
        Self {
            kid: kid.into(),
            pair: Pair::Ed25519(pair),
        }
    }

    pub fn p256(kid: &str) -> Self {
        let rng = SystemRandom::new();
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let pkcs8 = signature::EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
        let pair = signature::EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
        Self {
            kid: kid.into(),
            pair: Pair::P256(pair),
        }
    }

    pub fn rsa(kid: &str) -> Self {
        let der = base64::engine::general_purpose::STANDARD
            .decode(RSA_PKCS8)
            .unwrap();
        Self {
            kid: kid.into(),
            pair: Pair::Rsa(signature::RsaKeyPair::from_pkcs8(&der).unwrap()),
        }
    }

    pub fn alg(&self) -> &'static str {
        match self.pair {
            Pair::Ed25519(_) => "EdDSA",
            Pair::P256(_) => "ES256",
            Pair::Rsa(_) => "RS256",
        }
    }

    /// The public key as a JWK.
    pub fn jwk(&self) -> Value {
        let b64 = |b: &[u8]| URL_SAFE_NO_PAD.encode(b);
        match &self.pair {
            Pair::Ed25519(p) => {
                json!({"kty": "OKP", "crv": "Ed25519", "kid": self.kid, "x": b64(p.public_key().as_ref())})
            }
            Pair::P256(p) => {
                let point = p.public_key().as_ref();
                json!({"kty": "EC", "crv": "P-256", "kid": self.kid, "use": "sig",
                       "x": b64(&point[1..33]), "y": b64(&point[33..65])})
            }
            Pair::Rsa(p) => {
                let c = signature::RsaPublicKeyComponents::<Vec<u8>>::from(p.public());
                json!({"kty": "RSA", "kid": self.kid, "alg": "RS256", "n": b64(&c.n), "e": b64(&c.e)})
            }
        }
    }

    /// A token with this key's algorithm and kid.
    pub fn sign(&self, claims: &Value) -> String {
        self.sign_with_header(
            &json!({"alg": self.alg(), "kid": self.kid, "typ": "JWT"}),
            claims,
        )
    }

    pub fn sign_with_header(&self, header: &Value, claims: &Value) -> String {
        let signed = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let rng = SystemRandom::new();
        let sig = match &self.pair {
            Pair::Ed25519(p) => p.sign(signed.as_bytes()).as_ref().to_vec(),
            Pair::P256(p) => p.sign(&rng, signed.as_bytes()).unwrap().as_ref().to_vec(),
            Pair::Rsa(p) => {
                let mut sig = vec![0; p.public().modulus_len()];
                p.sign(
                    &signature::RSA_PKCS1_SHA256,
                    &rng,
                    signed.as_bytes(),
                    &mut sig,
                )
                .unwrap();
                sig
            }
        };
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(sig))
    }
}

/// A JWKS document of these keys.
pub fn jwks(signers: &[&Signer]) -> String {
    json!({"keys": signers.iter().map(|s| s.jwk()).collect::<Vec<_>>()}).to_string()
}

/// An unsigned token (`alg: none`), which must never pass.
pub fn unsigned(claims: &Value) -> String {
    format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(json!({"alg": "none", "typ": "JWT"}).to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    )
}

/// Now, in Unix seconds.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}
