//! `ports::free_port` hands out distinct ports that bind, outside the kernel's ephemeral range.

use coxswain_testenv::ports::free_port;
use std::net::TcpListener;

#[test]
fn ports_are_distinct_bindable_and_below_the_ephemeral_range() {
    let ports: Vec<u16> = (0..200).map(|_| free_port()).collect();
    let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
    assert_eq!(distinct.len(), ports.len(), "{ports:?}");
    let ephemeral: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .expect("this test runs on Linux")
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .expect("the range's first port");
    // Below 12,000 the module falls back to bind(0); nothing to check about the range then.
    for port in ports {
        if ephemeral >= 12_000 {
            assert!((10_000..ephemeral).contains(&port), "{port}");
        }
        // Handed out free: a server can bind it now.
        drop(TcpListener::bind(("127.0.0.1", port)).expect("a handed-out port binds"));
    }
    // And a port bind(0) gives is never one of them: the kernel picks inside its range.
    let kernel = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    assert!(kernel >= ephemeral, "{kernel}");
}
