//! `coxswain serve proxy --snapshot-file` as a process: SIGTERM stops accepting, lets the
//! request in flight finish, and exits well within the drain period.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::free_port;

fn http_get(port: u16, path: &str) -> std::io::Result<String> {
    support::http_get(port, path, "test")
}

#[test]
fn sigterm_drains_in_flight_requests_then_exits() {
    let backend = support::backend("slow", Duration::from_millis(1500));
    let (port, admin) = (free_port(), free_port());
    let manifests = support::app_manifests(port, backend);
    let dir = tempfile::tempdir().unwrap();
    let snapshot =
        support::compile_snapshot(env!("CARGO_BIN_EXE_coxswain"), dir.path(), &manifests);

    let mut proxy = Command::new(env!("CARGO_BIN_EXE_coxswain"))
        .args([
            "serve",
            "proxy",
            "--bind-address",
            "127.0.0.1",
            "--drain-seconds",
            "8",
        ])
        .arg("--snapshot-file")
        .arg(&snapshot)
        .args(["--health-addr", &format!("127.0.0.1:{admin}")])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    support::wait_proxy_ready(admin, &mut proxy);

    let in_flight = std::thread::spawn(move || http_get(port, "/work"));
    std::thread::sleep(Duration::from_millis(300));
    let signalled = Instant::now();
    let kill = Command::new("kill")
        .args(["-TERM", &proxy.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());

    // New connections are refused once the listeners close.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        http_get(port, "/late").is_err(),
        "accepted a connection after SIGTERM"
    );

    let answer = in_flight.join().unwrap().unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("slow"), "{answer}");

    let status = loop {
        if let Some(s) = proxy.try_wait().unwrap() {
            break s;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(6),
            "proxy did not exit after draining"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    // It waited for the request (about 1.2 s left), not for the whole drain period (8 s).
    assert!(
        signalled.elapsed() < Duration::from_secs(4),
        "{:?}",
        signalled.elapsed()
    );
}
