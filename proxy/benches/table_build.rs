//! Applying a snapshot at 3,000 and 20,000 hosts (`make bench`; a benchmark, not a test): what
//! a shared proxy does between receiving a push and swapping the table in, for the change
//! `make bench-propagation` makes (one route changed, or one host added) and from scratch.
//!
//! The snapshot has the propagation bench's shape: one route per hostname, ten routes per
//! Service (cluster), one port. Each case checks the bytes ([`Outline::verify`]: the hash and
//! the outline) and builds the table from the previous one, as `discovery` does.
//! `COXSWAIN_BENCH_HOSTS=N` replaces the two sizes with N.

use coxswain_api::snapshot::outline::Outline;
use coxswain_api::snapshot::{self as snap, Sealed, Snapshot};
use coxswain_proxy::metrics::Metrics;
use coxswain_proxy::table::Table;
use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;

fn route(h: usize, header: &str) -> snap::Route {
    snap::Route {
        source: Some(snap::RouteSource {
            kind: "HTTPRoute".into(),
            namespace: "bench".into(),
            name: format!("r{h}"),
            rule: 0,
            rule_name: String::new(),
        }),
        r#match: Some(snap::RouteMatch {
            path: Some(snap::PathMatch {
                kind: snap::path_match::Kind::Prefix as i32,
                value: "/".into(),
            }),
            ..Default::default()
        }),
        filters: vec![snap::Filter {
            kind: Some(snap::filter::Kind::ResponseHeaderModifier(
                snap::HeaderModifier {
                    set: vec![snap::Header {
                        name: "x-route".into(),
                        value: header.into(),
                    }],
                    ..Default::default()
                },
            )),
        }],
        backends: vec![snap::WeightedBackend {
            cluster: format!("bench/svc{}:80", h / 10),
            weight: 1,
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// `hosts` hosts, route `changed` with another header value, and host `hosts` added when
/// `added`.
fn snapshot(hosts: usize, changed: Option<usize>, added: bool) -> Sealed {
    let count = hosts + usize::from(added);
    let mut virtual_hosts: Vec<snap::VirtualHost> = (0..count)
        .map(|h| snap::VirtualHost {
            hostname: format!("h{h}.example.com"),
            routes: vec![route(h, if changed == Some(h) { "v2" } else { "v1" })],
            ..Default::default()
        })
        .collect();
    virtual_hosts.sort_by(|a, b| a.hostname.cmp(&b.hostname));
    Snapshot {
        listeners: vec![snap::Listener {
            port: 80,
            protocol: snap::Protocol::Http as i32,
            sources: vec!["Gateway/bench/edge/http".into()],
            virtual_hosts,
            ..Default::default()
        }],
        clusters: (0..count.div_ceil(10))
            .map(|s| snap::Cluster {
                name: format!("bench/svc{s}:80"),
                endpoints: (0..2)
                    .map(|e| snap::Endpoint {
                        address: format!("10.{}.{}.{e}", s / 250, s % 250),
                        port: 8080,
                        ready: true,
                        serving: true,
                        terminating: false,
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
    .seal()
}

fn apply(encoded: &bytes::Bytes, metrics: &Metrics, previous: &Table) -> Table {
    let outline = Outline::verify(encoded.clone()).expect("a sealed snapshot");
    Table::build_after(&outline, metrics, previous).expect("a valid snapshot")
}

fn bench(c: &mut Criterion) {
    let sizes: Vec<usize> = match std::env::var("COXSWAIN_BENCH_HOSTS") {
        Ok(n) => vec![n.parse().expect("COXSWAIN_BENCH_HOSTS is a number")],
        Err(_) => vec![3_000, 20_000],
    };
    let mut group = c.benchmark_group("table_build");
    group.sample_size(20);
    for hosts in sizes {
        let metrics = Metrics::default();
        let base = snapshot(hosts, None, false);
        let previous = apply(base.encoded(), &metrics, &Table::empty());
        let changed = snapshot(hosts, Some(hosts / 2), false);
        let added = snapshot(hosts, None, true);
        group.bench_function(format!("{hosts}_hosts_from_scratch"), |b| {
            b.iter(|| apply(black_box(base.encoded()), &metrics, &Table::empty()))
        });
        group.bench_function(format!("{hosts}_hosts_one_route_changed"), |b| {
            b.iter(|| apply(black_box(changed.encoded()), &metrics, &previous))
        });
        group.bench_function(format!("{hosts}_hosts_one_host_added"), |b| {
            b.iter(|| apply(black_box(added.encoded()), &metrics, &previous))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
