use super::*;

const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[test]
fn a_valid_traceparent_is_read() {
    let (trace, span, sampled) = parse_traceparent(VALID.as_bytes()).unwrap();
    assert_eq!(trace[0], 0x4b);
    assert_eq!(trace[15], 0x36);
    assert_eq!(span, [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]);
    assert!(sampled);
    let unsampled = VALID.replace("-01", "-00");
    assert!(!parse_traceparent(unsampled.as_bytes()).unwrap().2);
    // Surrounding whitespace is not part of the value.
    assert!(parse_traceparent(format!(" {VALID} ").as_bytes()).is_some());
}

#[test]
fn what_the_w3c_format_refuses_starts_a_new_trace() {
    let refused = [
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        // Upper-case hex.
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        // All-zero ids.
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        // Version ff, and version 00 with more after it.
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz",
        // A later version with more fields must separate them with a dash.
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01xyz",
        "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
    ];
    for v in refused {
        assert_eq!(parse_traceparent(v.as_bytes()), None, "{v}");
    }
    // A later version is read for the fields this one knows.
    assert!(
        parse_traceparent(b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later")
            .is_some()
    );
}

#[test]
fn the_traceparent_sent_names_this_span_as_parent() {
    let (trace_id, _, _) = parse_traceparent(VALID.as_bytes()).unwrap();
    let context = Context {
        trace_id,
        span_id: [1, 2, 3, 4, 5, 6, 7, 0xff],
        parent: None,
        sampled: true,
    };
    assert_eq!(
        context.traceparent().as_str(),
        "00-4bf92f3577b34da6a3ce929d0e0e4736-01020304050607ff-01"
    );
    let unsampled = Context {
        sampled: false,
        ..context
    };
    assert!(unsampled.traceparent().as_str().ends_with("-00"));
    let back = parse_traceparent(context.traceparent().as_str().as_bytes()).unwrap();
    assert_eq!(back, (trace_id, context.span_id, true));
}

#[test]
fn ids_are_random_and_never_zero() {
    let a = ids::trace_id();
    let b = ids::trace_id();
    assert_ne!(a, b);
    assert_ne!(a, [0; 16]);
    assert_ne!(ids::span_id(), ids::span_id());
}

#[test]
fn the_ratio_samples_that_share_of_new_traces() {
    assert!(!Sampler::new(0.0).samples(&ids::trace_id()));
    assert!(Sampler::new(1.0).samples(&ids::trace_id()));
    let quarter = Sampler::new(0.25);
    let sampled = (0..20_000)
        .filter(|_| quarter.samples(&ids::trace_id()))
        .count();
    assert!((4_000..6_000).contains(&sampled), "{sampled} of 20000");
}

#[test]
fn endpoints_must_be_http_host_and_port() {
    assert_eq!(
        check_endpoint("http://otel-collector.observability:4317"),
        Ok(())
    );
    assert_eq!(check_endpoint("http://10.0.0.1:4317/"), Ok(()));
    assert_eq!(check_endpoint("http://[2001:db8::1]:4317"), Ok(()));
    for (bad, says) in [
        ("otel-collector:4317", "scheme"),
        ("https://collector:4317", "TLS"),
        ("http://collector", "no port"),
        ("http://collector:4317/v1/traces", "path"),
        ("http://user@collector:4317", "user"),
        ("http://:4317", "host"),
        ("not a url", "URL"),
    ] {
        let e = check_endpoint(bad).unwrap_err().to_string();
        assert!(e.contains(says), "{bad}: {e}");
    }
    assert!(check_ratio(0.0).is_ok() && check_ratio(1.0).is_ok() && check_ratio(0.5).is_ok());
    assert!(
        check_ratio(1.5).is_err() && check_ratio(-0.1).is_err() && check_ratio(f64::NAN).is_err()
    );
}

#[test]
fn methods_outside_the_standard_set_are_other() {
    assert_eq!(known_method("GET"), "GET");
    assert_eq!(known_method("PATCH"), "PATCH");
    assert_eq!(known_method("get"), "_OTHER");
    assert_eq!(known_method("PROPFIND"), "_OTHER");
}

#[test]
fn spans_without_a_tracer_do_nothing() {
    let mut root = Span::root(None, "reconcile");
    root.set("routes", 3usize);
    root.fail("no");
    let child = root.child("compile");
    assert_eq!(child.context(), None);
    child.end();
    root.end();
}

#[test]
fn a_full_queue_drops_and_counts() {
    // No exporter takes spans off this queue of two.
    let (queue, _spans) = mpsc::channel(2);
    let tracer = Arc::new(Tracer {
        sampler: Sampler::new(1.0),
        queue,
        counters: Arc::default(),
    });
    let root = tracer.begin(None);
    assert!(root.context.sampled && root.context.parent.is_none());
    for _ in 0..5 {
        let mut span = Span::root(Some(&tracer), "pass");
        span.set("n", 1i64);
        span.end();
    }
    assert_eq!(tracer.counters().queue_full.load(Ordering::Relaxed), 3);
    let mut text = String::new();
    tracer.counters().render("coxswain_proxy", &mut text);
    assert!(
        text.contains("coxswain_proxy_trace_spans_dropped_total{reason=\"queue_full\"} 3"),
        "{text}"
    );
}

#[test]
fn a_request_continues_the_callers_trace() {
    let tracer = Tracer::start(Settings::new("http://127.0.0.1:9", 0.0, "test")).unwrap();
    let begun = tracer.begin(Some(VALID.as_bytes()));
    let (trace_id, parent, _) = parse_traceparent(VALID.as_bytes()).unwrap();
    assert_eq!(begun.context.trace_id, trace_id);
    assert_eq!(begun.context.parent, Some(parent));
    assert_ne!(begun.context.span_id, parent);
    // The caller sampled it: recorded although the ratio is 0.
    assert!(begun.context.sampled);
    // A new trace at ratio 0 is not.
    assert!(!tracer.begin(None).context.sampled);
    assert!(!tracer.begin(Some(b"garbage")).context.sampled);
}
