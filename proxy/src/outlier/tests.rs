use super::*;

fn cluster(n: usize) -> (ClusterHealth, Vec<Arc<EndpointHealth>>) {
    let c = ClusterHealth::default();
    let all: Vec<_> = (0..n)
        .map(|i| c.endpoint(SocketAddr::from(([10, 0, 0, i as u8], 80))))
        .collect();
    c.settle(&all);
    (c, all)
}

fn settings(base_ms: u64) -> Settings {
    Settings {
        consecutive_failures: 3,
        base_ejection: Duration::from_millis(base_ms),
        max_ejected_percent: 50,
    }
}

#[test]
fn consecutive_failures_eject_and_a_success_resets_the_streak() {
    let (c, all) = cluster(3);
    let s = settings(60_000);
    assert!(!c.record(&all[0], true, &all, &s));
    assert!(!c.record(&all[0], true, &all, &s));
    // A success in between: the streak starts again.
    assert!(!c.record(&all[0], false, &all, &s));
    assert!(!c.record(&all[0], true, &all, &s));
    assert!(!c.record(&all[0], true, &all, &s));
    assert!(!c.any_ejected());
    assert!(c.record(&all[0], true, &all, &s));
    assert!(c.any_ejected());
    assert!(!c.available(&all[0], now_ms()));
    assert!(c.available(&all[1], now_ms()));
    assert_eq!(c.ejections_total.load(Ordering::Relaxed), 1);
    assert_eq!(c.ejected_now(), 1);
}

#[test]
fn no_more_than_the_share_is_ejected_and_a_lone_endpoint_never() {
    let (c, all) = cluster(3);
    let s = settings(60_000);
    for e in &all {
        for _ in 0..3 {
            c.record(e, true, &all, &s);
        }
    }
    // 50 % of 3 is 1.
    assert_eq!(all.iter().filter(|e| e.ejected(now_ms())).count(), 1);
    let (c, one) = cluster(1);
    for _ in 0..10 {
        assert!(!c.record(&one[0], true, &one, &s));
    }
}

#[test]
fn an_ejection_ends_after_its_period_and_the_next_lasts_longer() {
    let (c, all) = cluster(2);
    let s = settings(30);
    for _ in 0..3 {
        c.record(&all[0], true, &all, &s);
    }
    let first = all[0].ejected_until.load(Ordering::Relaxed);
    assert!(!c.available(&all[0], now_ms()));
    // Back once the period has passed (the clock is read by the caller: pass a later time).
    assert!(c.available(&all[0], first));
    assert!(!c.any_ejected());
    for _ in 0..3 {
        c.record(&all[0], true, &all, &s);
    }
    let now = now_ms();
    let second = all[0].ejected_until.load(Ordering::Relaxed);
    assert!(
        second - now >= 55,
        "second ejection lasts two periods: {}",
        second - now
    );
    // Enough successes forgive the history.
    assert!(c.available(&all[0], second));
    for _ in 0..FORGIVEN_AFTER {
        c.record(&all[0], false, &all, &s);
    }
    assert_eq!(all[0].ejections.load(Ordering::Relaxed), 0);
}

#[test]
fn zero_consecutive_failures_turns_ejection_off() {
    let (c, all) = cluster(2);
    let s = Settings {
        consecutive_failures: 0,
        ..settings(1000)
    };
    for _ in 0..100 {
        assert!(!c.record(&all[0], true, &all, &s));
    }
}
