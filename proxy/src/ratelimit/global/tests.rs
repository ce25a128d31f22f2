use super::*;
use pb::rate_limit_response::{Code, DescriptorStatus};

fn entry(key: &str, source: Source, value: &str) -> snap::rate_limit_descriptor::Entry {
    snap::rate_limit_descriptor::Entry {
        key: key.into(),
        source: source as i32,
        value: value.into(),
    }
}

fn limit(descriptors: Vec<snap::RateLimitDescriptor>, exempt: &[&str]) -> GlobalLimit {
    let g = snap::GlobalRateLimit {
        cluster: "ratelimit".into(),
        domain: "coxswain".into(),
        descriptors,
        exempt: exempt
            .iter()
            .map(|a| snap::Cidr {
                address: (*a).into(),
                prefix_len: 32,
            })
            .collect(),
        ..Default::default()
    };
    GlobalLimit::new(&g, &HashMap::new())
}

fn described(client: Option<&str>) -> Described<'static> {
    Described {
        client: client.map(|c| c.parse().expect("test address")),
        method: "GET",
        path: "/api/v1",
    }
}

/// The request's fields, as the engines look them up.
fn head<'h>(fields: &'h [(&'h str, &'h str)]) -> impl Fn(&str) -> Option<&'h str> {
    move |name| {
        fields
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }
}

#[test]
fn descriptors_are_filled_from_the_request() {
    let g = limit(
        vec![snap::RateLimitDescriptor {
            entries: vec![
                entry("policy", Source::Value, "team-a/api"),
                entry("remote_address", Source::ClientAddress, ""),
                entry("tenant", Source::Header, "X-Tenant"),
                entry("path", Source::Path, ""),
                entry("method", Source::Method, ""),
            ],
            requests: 10,
            unit_seconds: 60,
        }],
        &[],
    );
    let asked = g
        .request(head(&[("x-tenant", "blue")]), described(Some("10.0.0.7")))
        .expect("counted");
    assert_eq!(asked.domain, "coxswain");
    assert_eq!(asked.hits_addend, 1);
    let d = &asked.descriptors[0];
    let pairs: Vec<(&str, &str)> = d
        .entries
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()))
        .collect();
    assert_eq!(
        pairs,
        [
            ("policy", "team-a/api"),
            ("remote_address", "10.0.0.7"),
            ("tenant", "blue"),
            ("path", "/api/v1"),
            ("method", "GET"),
        ]
    );
    let over = d.limit.expect("override");
    assert_eq!(over.requests_per_unit, 10);
    assert_eq!(over.unit, pb::Unit::Minute as i32);
}

#[test]
fn a_descriptor_whose_field_is_missing_is_left_out() {
    let g = limit(
        vec![
            snap::RateLimitDescriptor {
                entries: vec![entry("tenant", Source::Header, "x-tenant")],
                ..Default::default()
            },
            snap::RateLimitDescriptor {
                entries: vec![entry("remote_address", Source::ClientAddress, "")],
                ..Default::default()
            },
        ],
        &[],
    );
    let asked = g
        .request(head(&[]), described(Some("10.0.0.7")))
        .expect("the client's descriptor is left");
    assert_eq!(asked.descriptors.len(), 1);
    assert_eq!(asked.descriptors[0].entries[0].key, "remote_address");
    // No service-side override without a count of our own.
    assert!(asked.descriptors[0].limit.is_none());
    // Nothing left to count: the service is not asked at all.
    assert!(g.request(head(&[]), described(None)).is_none());
}

#[test]
fn exempt_clients_are_never_counted() {
    let g = limit(
        vec![snap::RateLimitDescriptor {
            entries: vec![entry("route", Source::Value, "r")],
            ..Default::default()
        }],
        &["192.0.2.1"],
    );
    assert!(g.request(head(&[]), described(Some("192.0.2.1"))).is_none());
    assert!(g.request(head(&[]), described(Some("192.0.2.2"))).is_some());
}

#[test]
fn long_values_are_cut_on_a_character_boundary() {
    let long = format!("{}é", "a".repeat(MAX_VALUE - 1));
    assert_eq!(cut(&long).len(), MAX_VALUE - 1);
    assert_eq!(cut("short"), "short");
}

fn status(code: Code, reset_s: i64, nanos: i32) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit: None,
        limit_remaining: 0,
        duration_until_reset: Some(pb::Duration {
            seconds: reset_s,
            nanos,
        }),
    }
}

#[test]
fn over_limit_waits_for_the_latest_reset_among_the_descriptors_over() {
    let answer = pb::RateLimitResponse {
        overall_code: Code::OverLimit as i32,
        statuses: vec![
            status(Code::OverLimit, 2, 500),
            status(Code::Ok, 50, 0),
            status(Code::OverLimit, 1, 0),
        ],
        response_headers_to_add: vec![
            pb::HeaderValue {
                key: "X-RateLimit-Limit".into(),
                value: "10".into(),
            },
            pb::HeaderValue {
                key: "content-length".into(),
                value: "99".into(),
            },
            pb::HeaderValue {
                key: "x-bad".into(),
                value: "a\r\nb".into(),
            },
        ],
        request_headers_to_add: vec![],
    };
    match outcome(answer) {
        Ok(Outcome::Over {
            retry_after,
            fields,
        }) => {
            assert_eq!(retry_after, 3, "2.0000005 s rounds up");
            assert_eq!(fields, [("x-ratelimit-limit".to_owned(), "10".to_owned())]);
        }
        other => panic!("expected over limit, got {other:?}"),
    }
    let bare = pb::RateLimitResponse {
        overall_code: Code::OverLimit as i32,
        ..Default::default()
    };
    assert!(matches!(
        outcome(bare),
        Ok(Outcome::Over { retry_after: 1, .. })
    ));
}

#[test]
fn ok_is_under_and_unknown_is_an_error() {
    let ok = pb::RateLimitResponse {
        overall_code: Code::Ok as i32,
        ..Default::default()
    };
    assert!(matches!(outcome(ok), Ok(Outcome::Under)));
    let unknown = pb::RateLimitResponse::default();
    assert!(matches!(outcome(unknown), Err(LimitError::Unknown(0))));
}

#[tokio::test]
async fn a_service_the_snapshot_lacks_fails() {
    let g = limit(
        vec![snap::RateLimitDescriptor {
            entries: vec![entry("route", Source::Value, "r")],
            ..Default::default()
        }],
        &[],
    );
    let asked = g.request(head(&[]), described(None)).expect("counted");
    assert!(matches!(
        g.check(asked).await,
        Outcome::Failed(LimitError::Missing(_))
    ));
    assert!(!g.fails_open());
}
