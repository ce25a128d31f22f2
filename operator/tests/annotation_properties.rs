//! Property tests of the Ingress annotation parser: whatever an Ingress's owner writes into
//! annotations (ours or ingress-nginx's, on the Ingress or its class), parsing never panics,
//! is deterministic, and every warning names an annotation that was actually given.
//! `make fuzz` runs it with many more cases (PROPTEST_CASES).
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

use coxswain_operator::compile::annotations::{NGINX_PREFIX, PREFIX, parse};
use proptest::prelude::*;
use std::collections::BTreeMap;

const NAMES: &[&str] = &[
    "rewrite-target",
    "use-regex",
    "ssl-redirect",
    "force-ssl-redirect",
    "permanent-redirect",
    "permanent-redirect-code",
    "temporal-redirect",
    "temporal-redirect-code",
    "request-header-set",
    "request-header-add",
    "request-header-remove",
    "response-header-set",
    "connect-timeout",
    "read-timeout",
    "send-timeout",
    "proxy-read-timeout",
    "backend-protocol",
    "max-body-size",
    "proxy-body-size",
    "allowlist-source-range",
    "whitelist-source-range",
    "denylist-source-range",
    "enable-cors",
    "cors-allow-origin",
    "cors-allow-methods",
    "cors-allow-headers",
    "cors-expose-headers",
    "cors-allow-credentials",
    "cors-max-age",
    "canary",
    "canary-weight",
    "canary-weight-total",
    "canary-by-header",
    "canary-by-header-value",
    "access-log",
    "enable-access-log",
    "configuration-snippet",
    "auth-url",
    "made-up",
];

/// Values near the edges of what each parser accepts, and random text.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("true".to_owned()),
        Just("0".to_owned()),
        Just("-1".to_owned()),
        Just("99999999999999999999999".to_owned()),
        Just("10.0.0.0/8, ::1/128".to_owned()),
        Just("10.0.0.0/33".to_owned()),
        Just("/$1/$2".to_owned()),
        Just("https://example.com/x".to_owned()),
        Just("x-header: value".to_owned()),
        Just("5s".to_owned()),
        Just("1m".to_owned()),
        Just("GRPCS".to_owned()),
        "[ -~]{0,24}",
        any::<String>(),
    ]
}

fn annotations() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map(
        (
            prop::sample::select(NAMES),
            prop::sample::select(vec![PREFIX, NGINX_PREFIX, "example.com/"]),
        )
            .prop_map(|(name, prefix)| format!("{prefix}{name}")),
        value(),
        0..8,
    )
}

fn cases() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(512),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn parsing_never_panics_and_warnings_name_given_annotations(
        own in annotations(),
        class in annotations(),
        compat in prop::bool::ANY,
    ) {
        let (parsed, warnings) = parse(&own, &class, compat);
        let (again, warnings_again) = parse(&own, &class, compat);
        prop_assert_eq!(format!("{parsed:?}"), format!("{again:?}"));
        prop_assert_eq!(&warnings, &warnings_again);
        for w in &warnings {
            prop_assert!(
                own.contains_key(&w.annotation) || class.contains_key(&w.annotation),
                "warning for {} which was not given", w.annotation
            );
            prop_assert!(!w.reason.is_empty());
        }
    }
}
