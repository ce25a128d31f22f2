use super::*;

fn limit(requests: u32, period_ms: u64, burst: u32) -> snap::RateLimit {
    snap::RateLimit {
        id: "t".into(),
        requests,
        period_ms,
        burst,
        ..Default::default()
    }
}

fn ip(s: &str) -> Option<IpAddr> {
    Some(s.parse().unwrap_or_else(|e| panic!("{s}: {e}")))
}

#[test]
fn a_bucket_holds_burst_plus_one_then_refuses_until_it_refills() {
    let registry = Registry::default();
    // 10 a second: one every 100 ms; a burst of 2 above that.
    let l = registry
        .limiter(&limit(10, 1000, 2))
        .expect("a valid limit");
    for i in 0..3 {
        assert!(l.admit(ip("10.0.0.1"), None).is_ok(), "request {i}");
    }
    let refused = l
        .admit(ip("10.0.0.1"), None)
        .expect_err("the fourth at once");
    // The next one fits once one interval passed (less the time the test took).
    assert!(
        refused.retry_after <= Duration::from_millis(100),
        "{refused:?}"
    );
    assert_eq!(refused.retry_after_secs(), 1, "Retry-After is at least 1 s");
    std::thread::sleep(Duration::from_millis(110));
    assert!(l.admit(ip("10.0.0.1"), None).is_ok(), "refilled by one");
    assert!(l.admit(ip("10.0.0.1"), None).is_err(), "by one only");
}

#[test]
fn keys_have_buckets_of_their_own() {
    let registry = Registry::default();
    let l = registry.limiter(&limit(1, 60_000, 0)).expect("valid");
    assert!(l.admit(ip("10.0.0.1"), None).is_ok());
    assert!(l.admit(ip("10.0.0.1"), None).is_err());
    assert!(l.admit(ip("10.0.0.2"), None).is_ok(), "another client");
    assert!(l.admit(None, None).is_ok(), "no address is a key too");

    let by_header = registry
        .limiter(&snap::RateLimit {
            id: "h".into(),
            key: snap::rate_limit::Key::Header as i32,
            header: "X-Api-Key".into(),
            ..limit(1, 60_000, 0)
        })
        .expect("valid");
    assert_eq!(by_header.header(), Some("x-api-key"));
    assert!(by_header.admit(ip("10.0.0.1"), Some(b"a")).is_ok());
    assert!(
        by_header.admit(ip("10.0.0.2"), Some(b"a")).is_err(),
        "same key, other client"
    );
    assert!(by_header.admit(ip("10.0.0.1"), Some(b"b")).is_ok());

    let route = registry
        .limiter(&snap::RateLimit {
            id: "r".into(),
            key: snap::rate_limit::Key::Route as i32,
            ..limit(1, 60_000, 0)
        })
        .expect("valid");
    assert!(route.admit(ip("10.0.0.1"), None).is_ok());
    assert!(
        route.admit(ip("10.0.0.2"), None).is_err(),
        "one bucket for all"
    );
}

#[test]
fn exempt_clients_are_never_counted() {
    let registry = Registry::default();
    let l = registry
        .limiter(&snap::RateLimit {
            exempt: vec![snap::Cidr {
                address: "192.168.0.0".into(),
                prefix_len: 16,
            }],
            ..limit(1, 60_000, 0)
        })
        .expect("valid");
    for _ in 0..100 {
        assert!(l.admit(ip("192.168.3.4"), None).is_ok());
    }
    assert!(l.admit(ip("10.0.0.1"), None).is_ok());
    assert!(l.admit(ip("10.0.0.1"), None).is_err());
}

#[test]
fn requests_in_progress_are_limited_until_their_slot_is_dropped() {
    let registry = Registry::default();
    let l = registry
        .limiter(&snap::RateLimit {
            max_in_flight: 2,
            ..limit(1000, 1000, 1000)
        })
        .expect("valid");
    let a = l.admit(ip("10.0.0.1"), None).expect("first");
    let b = l.admit(ip("10.0.0.1"), None).expect("second");
    assert!(a.is_some() && b.is_some());
    assert!(l.admit(ip("10.0.0.1"), None).is_err(), "a third at once");
    assert!(l.admit(ip("10.0.0.2"), None).is_ok(), "another client");
    drop(a);
    assert!(l.admit(ip("10.0.0.1"), None).is_ok(), "one ended");
}

#[test]
fn a_swap_keeps_buckets_unless_the_settings_change() {
    let registry = Registry::default();
    let first = registry.limiter(&limit(1, 60_000, 0)).expect("valid");
    assert!(first.admit(ip("10.0.0.1"), None).is_ok());
    let same = registry.limiter(&limit(1, 60_000, 0)).expect("valid");
    assert!(Arc::ptr_eq(&first, &same));
    assert!(
        same.admit(ip("10.0.0.1"), None).is_err(),
        "the bucket stayed empty"
    );
    let changed = registry.limiter(&limit(2, 60_000, 0)).expect("valid");
    assert!(!Arc::ptr_eq(&first, &changed));
    assert!(changed.admit(ip("10.0.0.1"), None).is_ok());
}

#[test]
fn a_limit_without_rate_or_bound_is_not_built_and_a_bound_alone_works() {
    let registry = Registry::default();
    assert!(registry.limiter(&limit(0, 1000, 0)).is_none());
    assert!(registry.limiter(&limit(10, 0, 0)).is_none());
    let bound = registry
        .limiter(&snap::RateLimit {
            max_in_flight: 1,
            ..limit(0, 0, 0)
        })
        .expect("an in-progress bound alone");
    let held = bound.admit(ip("10.0.0.1"), None).expect("first");
    assert!(bound.admit(ip("10.0.0.1"), None).is_err());
    drop(held);
    for _ in 0..100 {
        assert!(
            bound.admit(ip("10.0.0.1"), None).is_ok(),
            "no rate to run out of"
        );
    }
}

#[test]
fn memory_stays_bounded_under_many_clients() {
    let registry = Registry::default();
    let l = registry.limiter(&limit(1, 60_000, 0)).expect("valid");
    for i in 0..100_000u32 {
        let _ = l.admit(Some(IpAddr::from(i.to_be_bytes())), None);
    }
    assert!(
        l.tracked() <= SHARDS * SHARD_KEYS,
        "{} buckets",
        l.tracked()
    );
    // Keys past the bound share a bucket: they are limited together, not let through.
    let stranger = Some(IpAddr::from([10, 255, 255, 255]));
    let first = l.admit(stranger, None).is_ok();
    let second = l.admit(stranger, None).is_ok();
    assert!(!(first && second), "an untracked key is still limited");
}

#[test]
fn limits_no_table_uses_are_swept_as_the_registry_grows() {
    let registry = Registry::default();
    let kept = registry.limiter(&limit(1, 1000, 0)).expect("valid");
    for i in 0..1000 {
        // Built and dropped at once, as a table that was replaced.
        let _ = registry.limiter(&snap::RateLimit {
            id: format!("gone-{i}"),
            ..limit(1, 1000, 0)
        });
    }
    let held = registry
        .limiters
        .lock()
        .map(|l| l.by_id.len())
        .unwrap_or_default();
    assert!(held <= 64 + 1, "{held} limits held for 1 in use");
    let again = registry.limiter(&limit(1, 1000, 0)).expect("valid");
    assert!(
        Arc::ptr_eq(&kept, &again),
        "the one in use survived the sweeps"
    );
}
