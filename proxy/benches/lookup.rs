//! Route lookup at 10 and 100,000 routes: the table the proxy builds per snapshot, asked for
//! one request's route, the way both engines ask it (`make bench`; a benchmark, not a test).
//!
//! Routes are spread as a large cluster spreads them: 10 per hostname (prefix paths and one
//! exact path), hostnames exact and wildcard, so the lookup is one host probe and a scan of
//! that host's routes. The printed ratio is lookup time at 100,000 routes over lookup time at
//! 10; the host index makes it independent of the table's size.

use coxswain_api::snapshot::{self as snap, Sealed, Snapshot};
use coxswain_proxy::router::{Request, Router};
use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use std::time::Instant;

const ROUTES_PER_HOST: usize = 10;

/// A sealed snapshot of `routes` routes on port 80, 10 per hostname.
fn snapshot(routes: usize) -> Sealed {
    let hosts = routes.div_ceil(ROUTES_PER_HOST);
    let mut virtual_hosts = Vec::with_capacity(hosts);
    for h in 0..hosts {
        let hostname = if h % 10 == 9 {
            format!("*.w{h}.example.com")
        } else {
            format!("h{h}.example.com")
        };
        let routes = (0..ROUTES_PER_HOST)
            .map(|r| {
                let (kind, value) = if r == 0 {
                    (snap::path_match::Kind::Exact, format!("/exact/{h}"))
                } else {
                    (snap::path_match::Kind::Prefix, format!("/api/v{r}/items"))
                };
                snap::Route {
                    source: Some(snap::RouteSource {
                        kind: "HTTPRoute".into(),
                        namespace: "bench".into(),
                        name: format!("r{h}"),
                        rule: r as u32,
                        rule_name: String::new(),
                    }),
                    r#match: Some(snap::RouteMatch {
                        path: Some(snap::PathMatch {
                            kind: kind as i32,
                            value,
                        }),
                        ..Default::default()
                    }),
                    backends: vec![snap::WeightedBackend {
                        cluster: format!("bench/svc{}:80", h % 100),
                        weight: 1,
                        ..Default::default()
                    }],
                    ..Default::default()
                }
            })
            .collect();
        virtual_hosts.push(snap::VirtualHost {
            hostname,
            routes,
            single_label: false,
            terminate_tls: false,
        });
    }
    virtual_hosts.sort_by(|a, b| a.hostname.cmp(&b.hostname));
    Snapshot {
        listeners: vec![snap::Listener {
            port: 80,
            protocol: snap::Protocol::Http as i32,
            sources: vec!["Gateway/bench/edge/http".into()],
            virtual_hosts,
            ..Default::default()
        }],
        clusters: (0..100)
            .map(|s| snap::Cluster {
                name: format!("bench/svc{s}:80"),
                endpoints: vec![snap::Endpoint {
                    address: format!("10.0.0.{}", s + 1),
                    port: 8080,
                    ready: true,
                    ..Default::default()
                }],
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
    .seal()
}

/// Requests that hit the last route of a host (the longest scan), an exact route, a wildcard
/// host, and a miss, spread over the table.
fn requests(routes: usize) -> Vec<(String, String)> {
    let hosts = routes.div_ceil(ROUTES_PER_HOST);
    (0..64)
        .map(|i| {
            let h = (i * 7919) % hosts;
            let host = if h % 10 == 9 {
                format!("a.w{h}.example.com")
            } else {
                format!("h{h}.example.com")
            };
            let path = match i % 4 {
                0 => format!("/exact/{h}"),
                1 => "/api/v9/items/42".to_owned(),
                2 => "/api/v1/items?page=2".to_owned(),
                _ => "/nothing/here".to_owned(),
            };
            (host, path)
        })
        .collect()
}

fn lookup(router: &Router, requests: &[(String, String)]) -> usize {
    let headers: [(String, String); 0] = [];
    let mut found = 0;
    for (host, path) in requests {
        let req = Request {
            host,
            path_and_query: path,
            method: "GET",
            headers: &headers[..],
        };
        found += usize::from(router.route(80, &req).is_some());
    }
    found
}

fn bench(c: &mut Criterion) {
    let mut per_request = Vec::new();
    for routes in [10, 100_000] {
        let router = Router::build(&snapshot(routes)).expect("a valid snapshot");
        let requests = requests(routes);
        assert!(
            lookup(&router, &requests) > requests.len() / 2,
            "the requests find routes"
        );
        c.bench_function(&format!("lookup/{routes}_routes"), |b| {
            b.iter(|| lookup(black_box(&router), black_box(&requests)))
        });
        // Criterion keeps its estimates to itself: time the same loop once more for the ratio.
        let rounds = 20_000;
        let start = Instant::now();
        for _ in 0..rounds {
            black_box(lookup(black_box(&router), black_box(&requests)));
        }
        per_request.push(start.elapsed().as_secs_f64() / (rounds * requests.len()) as f64);
    }
    println!(
        "route lookup: {:.0} ns at 10 routes, {:.0} ns at 100,000 routes: ratio {:.2}",
        per_request[0] * 1e9,
        per_request[1] * 1e9,
        per_request[1] / per_request[0]
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
