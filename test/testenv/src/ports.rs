//! Loopback ports for the servers a test starts.
//!
//! A port found with `bind(0)` and released goes back to the kernel's ephemeral range, where
//! the next `bind(0)` or outgoing connection of any process may take it before the server it
//! was meant for binds it; that server then fails to bind, or worse, a test's requests reach
//! another test's listener. These ports come from below the ephemeral range instead, where the
//! kernel never picks one by itself: each handed out once per process, each checked free when
//! handed out, from a starting point of the process's own so that test processes side by side
//! walk different ports.
//!
//! Plain std, no dependency: the proxy's tests include this file by path (the proxy crate
//! stays clear of testenv's Kubernetes client).

use std::net::{TcpListener, UdpSocket};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

/// The lowest port handed out: clear of the well-known and most registered services.
const LOWEST: u32 = 10_000;
/// Fewer ports than this below the ephemeral range, and ports come from `bind(0)` instead.
const LEAST_SPAN: u32 = 2_000;

/// A loopback port free for TCP and UDP now, never handed out before by this process.
pub fn free_port() -> u16 {
    let below = ephemeral_start();
    if below < LOWEST + LEAST_SPAN {
        return from_kernel();
    }
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let span = below - LOWEST;
    let start = std::process::id().wrapping_mul(7_919) % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let Ok(port) = u16::try_from(LOWEST + (start + n) % span) else {
            continue;
        };
        if TcpListener::bind(("127.0.0.1", port)).is_ok()
            && UdpSocket::bind(("127.0.0.1", port)).is_ok()
        {
            return port;
        }
    }
    panic!("no free loopback port between {LOWEST} and {below}");
}

/// The first port of the kernel's ephemeral range (Linux's default when it cannot be read).
fn ephemeral_start() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// Where the ephemeral range leaves no room below it: the kernel's pick, at least never the
/// same twice in this process.
fn from_kernel() -> u16 {
    static HANDED_OUT: Mutex<std::collections::BTreeSet<u16>> =
        Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("no free loopback port: {e}"));
        if HANDED_OUT
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(port)
        {
            return port;
        }
    }
}
