//! The annotation parser: every annotation's accepted and refused values, precedence between
//! an Ingress, its class defaults and the built-in defaults, ingress-nginx compatibility, and
//! the warnings users see.

use super::*;

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn ours(name: &str) -> String {
    format!("{PREFIX}{name}")
}

fn nginx(name: &str) -> String {
    format!("{NGINX_PREFIX}{name}")
}

/// Parses our annotations (names without prefix) on the Ingress alone, compat off.
fn own(pairs: &[(&str, &str)]) -> (IngressAnnotations, Vec<AnnotationWarning>) {
    let full: Vec<(String, &str)> = pairs.iter().map(|(k, v)| (ours(k), *v)).collect();
    let m: BTreeMap<String, String> = full
        .iter()
        .map(|(k, v)| (k.clone(), (*v).to_owned()))
        .collect();
    parse(&m, &BTreeMap::new(), false)
}

/// The annotation parsed alone must be refused with a warning naming it.
fn refused(name: &str, value: &str) -> AnnotationWarning {
    let (_, warnings) = own(&[(name, value)]);
    assert_eq!(warnings.len(), 1, "{name}={value:?}: {warnings:?}");
    assert_eq!(warnings[0].annotation, ours(name));
    assert!(
        warnings[0].reason.contains(&format!("{value:?}")),
        "{warnings:?}"
    );
    warnings[0].clone()
}

#[test]
fn no_annotations_means_built_in_defaults_and_no_warnings() {
    let (a, w) = parse(&BTreeMap::new(), &BTreeMap::new(), true);
    assert_eq!(a, IngressAnnotations::default());
    assert!(a.access_log);
    assert!(!a.deny_all);
    assert!(w.is_empty());
}

#[test]
fn rewrite_target_and_use_regex() {
    let (a, w) = own(&[("rewrite-target", "/$2"), ("use-regex", "true")]);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(a.rewrite_target, Some(RewriteTarget("/$2".into())));
    assert!(a.use_regex);
    // ingress-nginx enforces regex paths whenever rewrite-target is set.
    let (a, _) = own(&[("rewrite-target", "/")]);
    assert!(!a.use_regex);
    assert!(a.regex_paths());
    let (a, _) = own(&[("use-regex", "false")]);
    assert!(!a.regex_paths());

    for bad in ["relative/path", "/has space", "/tab\there", ""] {
        let w = refused("rewrite-target", bad);
        assert!(!w.fail_closed);
        assert!(w.reason.ends_with("ignored"), "{w:?}");
    }
    refused("use-regex", "yes");
}

#[test]
fn booleans_accept_true_false_one_zero_in_any_case() {
    for (v, want) in [
        ("true", true),
        ("TRUE", true),
        ("1", true),
        ("False", false),
    ] {
        let (a, w) = own(&[("force-ssl-redirect", v)]);
        assert!(w.is_empty());
        assert_eq!(a.force_ssl_redirect, want, "{v}");
    }
    refused("force-ssl-redirect", "on");
}

#[test]
fn ssl_redirect_is_unset_unless_given() {
    assert_eq!(own(&[]).0.ssl_redirect, None);
    assert_eq!(
        own(&[("ssl-redirect", "false")]).0.ssl_redirect,
        Some(false)
    );
    assert_eq!(own(&[("ssl-redirect", "true")]).0.ssl_redirect, Some(true));
    refused("ssl-redirect", "maybe");
}

#[test]
fn redirects_with_codes() {
    let (a, w) = own(&[("permanent-redirect", "https://new.example/x")]);
    assert!(w.is_empty());
    assert_eq!(
        a.redirect,
        Some(Redirect {
            location: "https://new.example/x".into(),
            code: 301
        })
    );
    let (a, _) = own(&[
        ("permanent-redirect", "/elsewhere"),
        ("permanent-redirect-code", "308"),
    ]);
    assert_eq!(a.redirect.map(|r| r.code), Some(308));
    let (a, _) = own(&[("temporal-redirect", "http://tmp.example")]);
    assert_eq!(
        a.redirect,
        Some(Redirect {
            location: "http://tmp.example".into(),
            code: 302
        })
    );
    let (a, _) = own(&[
        ("temporal-redirect", "/t"),
        ("temporal-redirect-code", "307"),
    ]);
    assert_eq!(a.redirect.map(|r| r.code), Some(307));

    // Both: permanent wins and the temporal one is reported.
    let (a, w) = own(&[("permanent-redirect", "/p"), ("temporal-redirect", "/t")]);
    assert_eq!(a.redirect.map(|r| r.location), Some("/p".into()));
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].annotation, ours("temporal-redirect"));

    for bad in [
        "ftp://x",
        "no-scheme.example",
        "https://",
        "https:///path",
        "/a b",
    ] {
        refused("permanent-redirect", bad);
    }
    // A header-injection attempt never reaches a Location header.
    refused("temporal-redirect", "/x\r\nSet-Cookie: a=b");
    for bad in ["200", "304", "399", "abc", "300"] {
        let (a, w) = own(&[
            ("permanent-redirect", "/p"),
            ("permanent-redirect-code", bad),
        ]);
        assert_eq!(w.len(), 1, "{bad}: {w:?}");
        assert_eq!(
            a.redirect.map(|r| r.code),
            Some(301),
            "invalid code falls back"
        );
    }
}

#[test]
fn header_edits() {
    let (a, w) = own(&[
        ("request-header-set", "X-Env: prod\nX-Team:  web  \n\n"),
        ("request-header-add", "X-Trace: a\nX-Trace: b"),
        ("request-header-remove", "X-Debug, x-internal\nCookie"),
        (
            "response-header-set",
            "Strict-Transport-Security: max-age=31536000",
        ),
        ("response-header-add", "X-Served-By: coxswain"),
        ("response-header-remove", "Server"),
    ]);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(
        a.request_headers,
        HeaderEdits {
            set: vec![
                ("x-env".into(), "prod".into()),
                ("x-team".into(), "web".into())
            ],
            add: vec![
                ("x-trace".into(), "a".into()),
                ("x-trace".into(), "b".into())
            ],
            remove: vec!["x-debug".into(), "x-internal".into(), "cookie".into()],
        }
    );
    assert_eq!(
        a.response_headers.set,
        [(
            "strict-transport-security".to_owned(),
            "max-age=31536000".to_owned()
        )]
    );
    assert_eq!(a.response_headers.add.len(), 1);
    assert_eq!(a.response_headers.remove, ["server"]);

    for bad in [
        "no colon",
        "Bad Name: x",
        ": empty name",
        "X-Ok: caf\u{e9}",
        "",
    ] {
        refused("request-header-set", bad);
    }
    // Framing headers cannot be edited.
    refused("response-header-set", "Content-Length: 0");
    refused("request-header-remove", "transfer-encoding");
    refused("request-header-add", "Connection: close");
    refused("response-header-remove", "  ");
}

#[test]
fn durations_and_timeouts() {
    assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("60"), Ok(Duration::from_secs(60)));
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
    assert_eq!(parse_duration(" 7 "), Ok(Duration::from_secs(7)));
    let (a, w) = own(&[
        ("connect-timeout", "5s"),
        ("read-timeout", "120"),
        ("send-timeout", "750ms"),
    ]);
    assert!(w.is_empty());
    assert_eq!(a.connect_timeout, Some(Duration::from_secs(5)));
    assert_eq!(a.read_timeout, Some(Duration::from_secs(120)));
    assert_eq!(a.send_timeout, Some(Duration::from_millis(750)));
    for bad in [
        "",
        "s",
        "1.5s",
        "-1",
        "10d",
        "0",
        "0s",
        "25h",
        "99999999999999999999",
    ] {
        refused("read-timeout", bad);
    }
}

#[test]
fn backend_protocols() {
    for (v, want) in [
        ("HTTP", BackendProtocol::Http),
        ("https", BackendProtocol::Https),
        ("H2C", BackendProtocol::H2c),
        ("GRPC", BackendProtocol::Grpc),
        ("grpcs", BackendProtocol::Grpcs),
    ] {
        assert_eq!(
            own(&[("backend-protocol", v)]).0.backend_protocol,
            Some(want)
        );
    }
    refused("backend-protocol", "FCGI");
    refused("backend-protocol", "AUTO_HTTP");
}

#[test]
fn body_sizes() {
    assert_eq!(parse_size("10485760"), Ok(10_485_760));
    assert_eq!(parse_size("512k"), Ok(512 * 1024));
    assert_eq!(parse_size("1m"), Ok(1 << 20));
    assert_eq!(parse_size("8M"), Ok(8 << 20));
    assert_eq!(parse_size("2g"), Ok(2 << 30));
    assert_eq!(parse_size("0"), Ok(0));
    assert_eq!(
        own(&[("max-body-size", "1m")]).0.max_body_size,
        Some(1 << 20)
    );
    for bad in ["", "m", "1.5m", "1t", "-1", "1 m", "99999999999999999999g"] {
        refused("max-body-size", bad);
    }
}

#[test]
fn allowlists_take_v4_and_v6_and_fail_closed() {
    let (a, w) = own(&[(
        "allowlist-source-range",
        "10.0.0.7/8, 192.168.1.1,2001:db8::1/32 , ::1",
    )]);
    assert!(w.is_empty(), "{w:?}");
    let list: Vec<String> = a
        .allowlist
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    // Host bits cleared, bare addresses as single hosts, sorted.
    assert_eq!(
        list,
        ["10.0.0.0/8", "192.168.1.1/32", "::1/128", "2001:db8::/32"]
    );
    assert!(!a.deny_all);
    assert_eq!(
        parse_cidr("0.0.0.0/0"),
        Ok(Cidr {
            addr: "0.0.0.0".parse().unwrap(),
            prefix: 0
        })
    );

    for bad in [
        "10.0.0.0/33",
        "::/129",
        "10.0.0",
        "example.com",
        "10.0.0.0/8,nope",
        "",
        " , ",
    ] {
        let (a, w) = own(&[("allowlist-source-range", bad)]);
        assert!(a.deny_all, "{bad:?} must fail closed");
        assert_eq!(a.allowlist, None);
        assert_eq!(w.len(), 1);
        assert!(w[0].fail_closed);
        assert!(w[0].reason.contains("403"), "{w:?}");
    }
}

#[test]
fn an_invalid_ingress_allowlist_does_not_fall_back_to_the_class_default() {
    let class = map(&[(&ours("allowlist-source-range"), "10.0.0.0/8")]);
    let mine = map(&[(&ours("allowlist-source-range"), "10.0.0.0/99")]);
    let (a, w) = parse(&mine, &class, false);
    assert!(a.deny_all);
    assert_eq!(w.len(), 1);
}

#[test]
fn cors_with_defaults_and_every_field() {
    // CORS fields without enable-cors do nothing, as in ingress-nginx.
    assert_eq!(
        own(&[("cors-allow-origin", "https://a.example")]).0.cors,
        None
    );

    let (a, w) = own(&[("enable-cors", "true")]);
    assert!(w.is_empty());
    let c = a.cors.unwrap();
    assert_eq!(c.allow_origins, ["*"]);
    assert_eq!(c.allow_methods, DEFAULT_CORS_METHODS);
    assert_eq!(c.allow_headers, DEFAULT_CORS_HEADERS);
    assert!(c.expose_headers.is_empty());
    assert!(c.allow_credentials);
    assert_eq!(c.max_age, DEFAULT_CORS_MAX_AGE);

    let (a, w) = own(&[
        ("enable-cors", "true"),
        (
            "cors-allow-origin",
            "https://app.example, https://*.Example.com:8443",
        ),
        ("cors-allow-methods", "GET, POST"),
        ("cors-allow-headers", "X-Token,Content-Type"),
        ("cors-expose-headers", "X-Request-Id"),
        ("cors-allow-credentials", "false"),
        ("cors-max-age", "600"),
    ]);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(
        a.cors,
        Some(Cors {
            allow_origins: vec![
                "https://app.example".into(),
                "https://*.example.com:8443".into()
            ],
            allow_methods: vec!["GET".into(), "POST".into()],
            allow_headers: vec!["X-Token".into(), "Content-Type".into()],
            expose_headers: vec!["X-Request-Id".into()],
            allow_credentials: false,
            max_age: Duration::from_secs(600),
        })
    );

    let cors = |name: &str, value: &str| {
        let m = map(&[(&ours("enable-cors"), "true"), (&ours(name), value)]);
        let (a, w) = parse(&m, &BTreeMap::new(), false);
        assert_eq!(w.len(), 1, "{name}={value:?}: {w:?}");
        assert!(a.cors.is_some(), "CORS itself stays on");
    };
    for bad in [
        "app.example",
        "ftp://a",
        "https://",
        "https://a:0",
        "https://a b",
        "",
    ] {
        cors("cors-allow-origin", bad);
    }
    cors("cors-allow-methods", "GET POST");
    cors("cors-allow-headers", "X Token");
    cors("cors-expose-headers", "");
    cors("cors-allow-credentials", "sometimes");
    cors("cors-max-age", "1.5");
    cors("cors-max-age", "500ms");
    refused("enable-cors", "y");
}

#[test]
fn canary_weight_and_header() {
    assert_eq!(
        own(&[("canary-weight", "30")]).0.canary,
        None,
        "needs canary"
    );
    let (a, w) = own(&[
        ("canary", "true"),
        ("canary-weight", "30"),
        ("canary-by-header", "X-Canary"),
    ]);
    assert!(w.is_empty());
    assert_eq!(
        a.canary,
        Some(Canary {
            weight: 30,
            total: 100,
            by_header: Some("x-canary".into()),
            by_header_value: None
        })
    );
    let (a, _) = own(&[
        ("canary", "true"),
        ("canary-weight-total", "1000"),
        ("canary-weight", "250"),
        ("canary-by-header-value", "beta"),
    ]);
    let c = a.canary.unwrap();
    assert_eq!((c.weight, c.total), (250, 1000));
    assert_eq!(c.by_header_value.as_deref(), Some("beta"));

    let canary = |pairs: &[(&str, &str)]| {
        let mut all = vec![("canary", "true")];
        all.extend_from_slice(pairs);
        let (a, w) = own(&all);
        assert_eq!(w.len(), 1, "{pairs:?}: {w:?}");
        a.canary.unwrap()
    };
    assert_eq!(canary(&[("canary-weight", "101")]).weight, 0);
    assert_eq!(canary(&[("canary-weight", "-1")]).weight, 0);
    assert_eq!(canary(&[("canary-weight", "ten")]).weight, 0);
    assert_eq!(canary(&[("canary-weight-total", "0")]).total, 100);
    assert_eq!(canary(&[("canary-by-header", "X Canary")]).by_header, None);
    canary(&[("canary-by-header-value", "caf\u{e9}")]);
    refused("canary", "canary");
}

#[test]
fn access_log_accepts_off_only() {
    assert!(!own(&[("access-log", "off")]).0.access_log);
    assert!(!own(&[("access-log", "OFF")]).0.access_log);
    let w = refused("access-log", "on");
    assert!(w.reason.contains("only \"off\""), "{w:?}");
    assert!(own(&[("access-log", "on")]).0.access_log);
}

#[test]
fn precedence_ingress_then_class_default_then_built_in() {
    let class = map(&[
        (&ours("read-timeout"), "30s"),
        (&ours("connect-timeout"), "2s"),
        (&ours("access-log"), "off"),
    ]);
    let mine = map(&[(&ours("read-timeout"), "5s")]);
    let (a, w) = parse(&mine, &class, false);
    assert!(w.is_empty());
    assert_eq!(a.read_timeout, Some(Duration::from_secs(5)), "Ingress wins");
    assert_eq!(
        a.connect_timeout,
        Some(Duration::from_secs(2)),
        "class default"
    );
    assert_eq!(a.send_timeout, None, "built-in default");
    assert!(!a.access_log);

    // An invalid Ingress value is ignored: the class default applies and the warning says so.
    let mine = map(&[(&ours("read-timeout"), "soon")]);
    let (a, w) = parse(&mine, &class, false);
    assert_eq!(a.read_timeout, Some(Duration::from_secs(30)));
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].annotation, ours("read-timeout"));

    // An invalid class default is reported as such and the built-in default applies.
    let bad_class = map(&[(&ours("send-timeout"), "forever")]);
    let (a, w) = parse(&BTreeMap::new(), &bad_class, false);
    assert_eq!(a.send_timeout, None);
    assert!(w[0].reason.contains("IngressClass default"), "{w:?}");
}

#[test]
fn compat_reads_nginx_annotations_and_ours_win() {
    let m = map(&[
        (&nginx("rewrite-target"), "/$1"),
        (&nginx("proxy-read-timeout"), "120"),
        (&nginx("proxy-body-size"), "8m"),
        (&nginx("whitelist-source-range"), "10.0.0.0/8"),
        (&nginx("enable-cors"), "true"),
        (&nginx("cors-allow-origin"), "https://a.example"),
        (&nginx("ssl-redirect"), "false"),
        (&nginx("canary"), "true"),
        (&nginx("canary-weight"), "20"),
        (&nginx("enable-access-log"), "false"),
    ]);
    let (off, w) = parse(&m, &BTreeMap::new(), false);
    assert_eq!(
        off,
        IngressAnnotations::default(),
        "compat off ignores them"
    );
    assert!(w.is_empty(), "{w:?}");

    let (a, w) = parse(&m, &BTreeMap::new(), true);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(a.rewrite_target, Some(RewriteTarget("/$1".into())));
    assert_eq!(a.read_timeout, Some(Duration::from_secs(120)));
    assert_eq!(a.max_body_size, Some(8 << 20));
    assert_eq!(a.allowlist.map(|l| l.len()), Some(1));
    assert_eq!(
        a.cors.map(|c| c.allow_origins),
        Some(vec!["https://a.example".to_owned()])
    );
    assert_eq!(a.ssl_redirect, Some(false));
    assert_eq!(a.canary.map(|c| c.weight), Some(20));
    assert!(!a.access_log);

    // Both keys on the Ingress: ours wins and the nginx one is reported.
    let both = map(&[
        (&ours("read-timeout"), "5s"),
        (&nginx("proxy-read-timeout"), "120"),
    ]);
    let (a, w) = parse(&both, &BTreeMap::new(), true);
    assert_eq!(a.read_timeout, Some(Duration::from_secs(5)));
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].annotation, nginx("proxy-read-timeout"));

    // The Ingress's nginx annotation still beats the class's Coxswain default.
    let class = map(&[(&ours("read-timeout"), "30s")]);
    let mine = map(&[(&nginx("proxy-read-timeout"), "90")]);
    let (a, _) = parse(&mine, &class, true);
    assert_eq!(a.read_timeout, Some(Duration::from_secs(90)));

    // allowlist-source-range is preferred over the older whitelist name.
    let m = map(&[
        (&nginx("allowlist-source-range"), "10.1.0.0/16"),
        (&nginx("whitelist-source-range"), "10.2.0.0/16"),
    ]);
    let (a, _) = parse(&m, &BTreeMap::new(), true);
    assert_eq!(a.allowlist.unwrap()[0].to_string(), "10.1.0.0/16");

    // nginx values are validated like ours.
    let m = map(&[(&nginx("proxy-connect-timeout"), "fast")]);
    let (_, w) = parse(&m, &BTreeMap::new(), true);
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].annotation, nginx("proxy-connect-timeout"));
}

#[test]
fn snippets_are_never_used_and_always_warned_about() {
    let m = map(&[
        (
            &nginx("configuration-snippet"),
            "more_set_headers \"X: y\";",
        ),
        (&nginx("server-snippet"), "location /x {}"),
        (&nginx("location-snippet"), "x"),
        (&nginx("stream-snippet"), "x"),
        (&nginx("auth-snippet"), "x"),
        (&nginx("modsecurity-snippet"), "x"),
        (&nginx("custom-thing-snippet"), "x"),
        (&ours("server-snippet"), "x"),
    ]);
    for compat in [false, true] {
        let (a, w) = parse(&m, &BTreeMap::new(), compat);
        assert_eq!(a, IngressAnnotations::default(), "nothing of them applies");
        assert_eq!(w.len(), m.len(), "compat {compat}: {w:?}");
        for warning in &w {
            assert!(!warning.fail_closed);
            assert!(
                warning.reason.contains(&warning.annotation)
                    && warning.reason.contains("never used")
                    && warning.reason.contains("request-header-set"),
                "{warning:?}"
            );
        }
    }
    // A snippet among the class defaults is reported too.
    let class = map(&[(&nginx("configuration-snippet"), "x")]);
    let (_, w) = parse(&BTreeMap::new(), &class, false);
    assert_eq!(w.len(), 1);
}

#[test]
fn unknown_keys_under_our_prefix_and_unsupported_nginx_ones_are_reported() {
    let m = map(&[
        (&ours("read-timout"), "5s"),
        (&nginx("affinity-mode"), "persistent"),
        ("example.com/unrelated", "x"),
    ]);
    let (_, w) = parse(&m, &BTreeMap::new(), false);
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].annotation, ours("read-timout"));
    assert!(w[0].reason.contains("unknown"), "{w:?}");

    let (_, w) = parse(&m, &BTreeMap::new(), true);
    let names: Vec<&str> = w.iter().map(|w| w.annotation.as_str()).collect();
    assert_eq!(names, [ours("read-timout"), nginx("affinity-mode")]);
    assert!(w.iter().all(|w| !w.fail_closed));
}

#[test]
fn unsupported_nginx_access_control_fails_closed_under_compat() {
    for key in [
        "auth-url",
        "auth-type",
        "auth-tls-verify-client",
        "denylist-source-range",
    ] {
        let m = map(&[(&nginx(key), "x")]);
        let (a, w) = parse(&m, &BTreeMap::new(), true);
        assert!(a.deny_all, "{key}");
        assert_eq!(w.len(), 1);
        assert!(w[0].fail_closed);
        // Without compat, nginx annotations mean nothing to Coxswain.
        let (a, _) = parse(&m, &BTreeMap::new(), false);
        assert!(!a.deny_all, "{key}");
    }
}

#[test]
fn retries_list_codes_and_tries_as_ingress_nginx_does() {
    let (a, w) = own(&[
        ("retry-on", "error timeout http_503 http_502"),
        ("retry-tries", "4"),
    ]);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(
        a.retry,
        Some(Retry {
            codes: vec![502, 503],
            non_idempotent: false,
            tries: 4,
            timeout: None,
        })
    );
    let timed = |v: &str| {
        own(&[("retry-on", "http_503"), ("retry-timeout", v)])
            .0
            .retry
            .unwrap()
            .timeout
    };
    assert_eq!(timed("10"), Some(Duration::from_secs(10)));
    assert_eq!(timed("500ms"), Some(Duration::from_millis(500)));
    assert_eq!(timed("0"), None, "0: no bound, as ingress-nginx");
    refused("retry-timeout", "soon");
    // ingress-nginx's default list, "error timeout": refused connections are always retried,
    // so there is no retry policy to add.
    assert_eq!(own(&[("retry-on", "error timeout")]).0.retry, None);
    assert_eq!(own(&[("retry-on", "off")]).0.retry, None);
    let (a, _) = own(&[
        ("retry-on", "http_500 non_idempotent"),
        ("retry-tries", "0"),
    ]);
    let r = a.retry.unwrap();
    assert!(r.non_idempotent);
    assert_eq!(r.tries, MAX_RETRY_TRIES, "0 is as many as allowed");
    assert_eq!(
        own(&[("retry-on", "http_503")]).0.retry.unwrap().tries,
        DEFAULT_RETRY_TRIES
    );
    refused("retry-on", "http_418");
    refused("retry-on", "invalid_header");
    refused("retry-tries", "12");
    let (_, w) = own(&[("retry-tries", "2")]);
    assert!(w.len() == 1 && w[0].reason.contains("no effect"), "{w:?}");
    let (_, w) = own(&[("retry-timeout", "5s")]);
    assert!(w.len() == 1 && w[0].reason.contains("no effect"), "{w:?}");
    // ingress-nginx's names under compatibility.
    let nginx_ann = map(&[
        (&nginx("proxy-next-upstream"), "error timeout http_504"),
        (&nginx("proxy-next-upstream-tries"), "2"),
    ]);
    let (a, w) = parse(&nginx_ann, &BTreeMap::new(), true);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(a.retry.unwrap().codes, vec![504]);
}
