use super::*;

fn http_service(edit: impl FnOnce(&mut snap::ExternalAuth)) -> ExternalAuth {
    let mut e = snap::ExternalAuth {
        address: "127.0.0.1:9".into(),
        ..Default::default()
    };
    edit(&mut e);
    ExternalAuth::new(&e, &HashMap::new())
}

fn asked() -> AuthRequest {
    AuthRequest {
        method: "POST".into(),
        scheme: "https",
        host: "app.example.com".into(),
        hostname: "app.example.com".into(),
        path_and_query: "/orders/7?full=1".into(),
        fields: vec![
            ("host".into(), "app.example.com".into()),
            ("authorization".into(), "Bearer t0ken".into()),
            ("x-tenant".into(), "blue".into()),
            ("cookie".into(), "a=1".into()),
            ("cookie".into(), "b=2".into()),
            ("connection".into(), "keep-alive".into()),
            ("content-length".into(), "12".into()),
        ],
        client: Some("192.0.2.7".parse().unwrap_or(IpAddr::from([0, 0, 0, 0]))),
        port: 8443,
        protocol: "HTTP/1.1",
        body_size: 12,
        sni: Some("app.example.com".into()),
    }
}

fn field<'r>(r: &'r hyper::Request<Full<Bytes>>, name: &str) -> Option<&'r str> {
    r.headers().get(name).and_then(|v| v.to_str().ok())
}

#[test]
fn http_request_prefixes_the_path_and_sends_only_the_mandatory_fields_by_default() {
    let service = http_service(|e| {
        e.path = "/auth/".into();
        e.path_is_prefix = true;
    });
    let r = service.http_request(&asked()).expect("request");
    assert_eq!(r.method(), "POST");
    assert_eq!(r.uri(), "/auth/orders/7?full=1");
    assert_eq!(field(&r, "host"), Some("app.example.com"));
    assert_eq!(field(&r, "authorization"), Some("Bearer t0ken"));
    // GEP-1494: no body goes to the service, so Content-Length is 0 whatever the client sent.
    assert_eq!(field(&r, "content-length"), Some("0"));
    assert_eq!(field(&r, "x-tenant"), None);
    assert_eq!(field(&r, "cookie"), None);
    assert_eq!(field(&r, "connection"), None);
}

#[test]
fn http_request_in_the_auth_url_form_describes_the_original_request() {
    let service = http_service(|e| {
        e.path = "/verify?scope=orders".into();
        e.method = "GET".into();
        e.host = "auth.internal".into();
        e.all_request_fields = true;
        e.original_fields = true;
    });
    let r = service.http_request(&asked()).expect("request");
    assert_eq!(r.method(), "GET");
    assert_eq!(r.uri(), "/verify?scope=orders");
    assert_eq!(field(&r, "host"), Some("auth.internal"));
    assert_eq!(field(&r, "x-tenant"), Some("blue"));
    assert_eq!(r.headers().get_all("cookie").iter().count(), 2);
    assert_eq!(
        field(&r, "connection"),
        None,
        "hop-by-hop fields stay on their hop"
    );
    assert_eq!(
        field(&r, "x-original-url"),
        Some("https://app.example.com/orders/7?full=1")
    );
    assert_eq!(field(&r, "x-original-method"), Some("POST"));
    assert_eq!(field(&r, "x-original-uri"), Some("/orders/7?full=1"));
    assert_eq!(field(&r, "x-real-ip"), Some("192.0.2.7"));
    assert_eq!(field(&r, "content-length"), Some("0"));
}

fn fields(pairs: &[(&'static str, &'static str)]) -> hyper::HeaderMap {
    let mut map = hyper::HeaderMap::new();
    for (n, v) in pairs {
        map.append(*n, hyper::header::HeaderValue::from_static(v));
    }
    map
}

#[test]
fn an_allowing_answer_sets_only_the_listed_fields_and_always_replaces_the_clients() {
    let service = http_service(|e| e.response_fields = vec!["X-User".into(), "X-Groups".into()]);
    let answer = fields(&[
        ("x-user", "ada"),
        ("x-other", "no"),
        ("content-type", "text/plain"),
    ]);
    let verdict = service
        .http_verdict(&asked(), 200, &answer, Bytes::new())
        .expect("verdict");
    let Verdict::Allow(edits) = verdict else {
        panic!("expected Allow, got {verdict:?}");
    };
    // The client's own X-Groups is removed even though the service sent none.
    assert_eq!(edits.remove, vec!["x-user", "x-groups"]);
    assert_eq!(edits.add, vec![("x-user".to_owned(), "ada".to_owned())]);
}

#[test]
fn an_allowing_answer_copies_every_field_but_the_connections_own_when_none_are_listed() {
    let service = http_service(|e| e.all_response_fields = true);
    let answer = fields(&[("x-user", "ada"), ("connection", "close"), ("host", "auth")]);
    let Ok(Verdict::Allow(edits)) = service.http_verdict(&asked(), 204, &answer, Bytes::new())
    else {
        panic!("expected Allow");
    };
    assert_eq!(edits.add, vec![("x-user".to_owned(), "ada".to_owned())]);
    assert_eq!(edits.remove, vec!["x-user"]);
}

#[test]
fn a_refusal_is_passed_on_with_its_fields_and_body() {
    let service = http_service(|_| {});
    let answer = fields(&[
        ("www-authenticate", "Bearer realm=\"orders\""),
        ("content-length", "6"),
        ("transfer-encoding", "chunked"),
    ]);
    let Ok(Verdict::Deny(denial)) =
        service.http_verdict(&asked(), 401, &answer, Bytes::from_static(b"nope\r\n"))
    else {
        panic!("expected Deny");
    };
    assert_eq!(denial.status, 401);
    assert_eq!(
        denial.fields,
        vec![(
            "www-authenticate".to_owned(),
            "Bearer realm=\"orders\"".to_owned()
        )]
    );
    assert_eq!(&denial.body[..], b"nope\r\n");
}

#[test]
fn nginx_semantics_pass_on_only_401_and_403() {
    let service = http_service(|e| e.deny_401_403_only = true);
    for status in [401, 403] {
        assert!(matches!(
            service.http_verdict(&asked(), status, &fields(&[]), Bytes::new()),
            Ok(Verdict::Deny(Denial { status: s, .. })) if s == status
        ));
    }
    for status in [302, 404, 500] {
        assert!(matches!(
            service.http_verdict(&asked(), status, &fields(&[]), Bytes::new()),
            Err(AuthError::Unexpected(s)) if s == status
        ));
    }
    // Without them, a 1xx is never a decision.
    let plain = http_service(|_| {});
    assert!(matches!(
        plain.http_verdict(&asked(), 101, &fields(&[]), Bytes::new()),
        Err(AuthError::Unexpected(101))
    ));
}

#[test]
fn a_401_with_a_signin_url_redirects_there_with_the_request_url() {
    let service =
        http_service(|e| e.signin_url = "https://login.example.com/start?app=shop".into());
    let Ok(Verdict::Deny(denial)) = service.http_verdict(&asked(), 401, &fields(&[]), Bytes::new())
    else {
        panic!("expected Deny");
    };
    assert_eq!(denial.status, 302);
    assert_eq!(
        denial.fields,
        vec![(
            "location".to_owned(),
            "https://login.example.com/start?app=shop&rd=https%3A%2F%2Fapp.example.com%2Forders%2F7%3Ffull%3D1"
                .to_owned()
        )]
    );
}

fn option(name: &str, value: &str, append: Option<bool>) -> pb::HeaderValueOption {
    pb::HeaderValueOption {
        header: Some(pb::HeaderValue {
            key: name.into(),
            value: value.into(),
            raw_value: Vec::new(),
        }),
        append: append.map(|value| pb::BoolValue { value }),
    }
}

#[test]
fn grpc_ok_applies_set_append_and_remove_but_never_to_host() {
    let answer = pb::CheckResponse {
        status: Some(pb::RpcStatus::default()),
        http_response: Some(pb::check_response::HttpResponse::OkResponse(
            pb::OkHttpResponse {
                headers: vec![
                    option("X-User", "ada", None),
                    option("x-trace", "t1", Some(true)),
                    option("host", "evil", None),
                    option("bad name", "x", None),
                    option("x-split", "a\r\nb", None),
                ],
                headers_to_remove: vec!["Authorization".into(), "host".into(), ":path".into()],
                response_headers_to_add: Vec::new(),
            },
        )),
    };
    let Verdict::Allow(edits) = grpc_verdict(answer) else {
        panic!("expected Allow");
    };
    assert_eq!(edits.remove, vec!["authorization", "x-user"]);
    assert_eq!(
        edits.add,
        vec![
            ("x-user".to_owned(), "ada".to_owned()),
            ("x-trace".to_owned(), "t1".to_owned())
        ]
    );
}

#[test]
fn grpc_denial_carries_the_servers_status_fields_and_body_or_403() {
    let answer = pb::CheckResponse {
        status: Some(pb::RpcStatus {
            code: 7,
            message: "denied".into(),
        }),
        http_response: Some(pb::check_response::HttpResponse::DeniedResponse(
            pb::DeniedHttpResponse {
                status: Some(pb::HttpStatus { code: 401 }),
                headers: vec![option("www-authenticate", "Bearer", None)],
                body: "who are you".into(),
            },
        )),
    };
    let Verdict::Deny(denial) = grpc_verdict(answer) else {
        panic!("expected Deny");
    };
    assert_eq!(denial.status, 401);
    assert_eq!(
        denial.fields,
        vec![("www-authenticate".to_owned(), "Bearer".to_owned())]
    );
    assert_eq!(&denial.body[..], b"who are you");
    // A denial that names no status (or a nonsense one) is a 403, as in Envoy.
    for status in [None, Some(pb::HttpStatus { code: 42 })] {
        let answer = pb::CheckResponse {
            status: Some(pb::RpcStatus {
                code: 16,
                message: String::new(),
            }),
            http_response: Some(pb::check_response::HttpResponse::DeniedResponse(
                pb::DeniedHttpResponse {
                    status,
                    ..Default::default()
                },
            )),
        };
        assert!(matches!(
            grpc_verdict(answer),
            Verdict::Deny(Denial { status: 403, .. })
        ));
    }
}

#[test]
fn grpc_check_request_describes_the_request_as_envoy_does() {
    let service = ExternalAuth::new(
        &snap::ExternalAuth {
            protocol: snap::external_auth::Protocol::Grpc as i32,
            address: "127.0.0.1:9".into(),
            all_request_fields: true,
            ..Default::default()
        },
        &HashMap::new(),
    );
    let r = service.check_request(&asked());
    let attributes = r.attributes.expect("attributes");
    let http = attributes
        .request
        .and_then(|r| r.http)
        .expect("http request");
    assert_eq!(http.method, "POST");
    assert_eq!(http.path, "/orders/7?full=1");
    assert_eq!(http.host, "app.example.com");
    assert_eq!(http.scheme, "https");
    assert_eq!(http.size, 12);
    assert_eq!(
        http.headers.get("cookie").map(String::as_str),
        Some("a=1,b=2")
    );
    assert_eq!(
        http.headers.get(":path").map(String::as_str),
        Some("/orders/7?full=1")
    );
    let source = attributes
        .source
        .and_then(|p| p.address)
        .and_then(|a| a.socket_address)
        .expect("source");
    assert_eq!(source.address, "192.0.2.7");
    assert_eq!(
        attributes.tls_session.map(|t| t.sni).as_deref(),
        Some("app.example.com")
    );
}

#[test]
fn a_missing_cluster_or_a_bad_failure_status_still_fails_closed() {
    let service = ExternalAuth::new(
        &snap::ExternalAuth {
            cluster: "auth/absent:80".into(),
            failure_status: 200,
            ..Default::default()
        },
        &HashMap::new(),
    );
    // 200 would let the request through looking served: refused as 503 instead.
    assert_eq!(service.failure_status, 503);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let verdict = runtime.block_on(service.check(&asked()));
    assert!(matches!(
        verdict,
        Verdict::Failed(AuthError::Callout(crate::callout::CalloutError::NoEndpoint))
    ));
}

#[test]
fn percent_encoding_keeps_only_unreserved_characters() {
    assert_eq!(percent_encode("a-b_c.d~e"), "a-b_c.d~e");
    assert_eq!(percent_encode("/x?y=1&z"), "%2Fx%3Fy%3D1%26z");
}

#[test]
fn signin_variables_are_filled_in_and_rd_is_added_only_when_absent() {
    assert_eq!(
        signin_location(
            "https://$host/oauth2/start?rd=$escaped_request_uri",
            &asked()
        ),
        "https://app.example.com/oauth2/start?rd=%2Forders%2F7%3Ffull%3D1"
    );
    assert_eq!(
        signin_location("https://login.example.com/start", &asked()),
        "https://login.example.com/start?rd=https%3A%2F%2Fapp.example.com%2Forders%2F7%3Ffull%3D1"
    );
}

#[test]
fn host_templates_take_the_requests_host_without_its_port() {
    let mut req = asked();
    req.host = "app.example.com:8443".into();
    req.hostname = "app.example.com".into();
    assert_eq!(with_host("$host:443", &req), "app.example.com:443");
    let service = http_service(|e| e.host = "$host".into());
    let r = service.http_request(&req).expect("request");
    assert_eq!(field(&r, "host"), Some("app.example.com"));
}
