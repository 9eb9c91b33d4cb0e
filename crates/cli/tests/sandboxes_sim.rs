//! Sandbox start-up under bursts (issue 13): creations beyond `max_concurrent_creations` wait
//! for a turn instead of all running at once.

mod common;

use common::Server;
use serde_json::json;

#[test]
fn a_burst_of_cold_starts_takes_turns_at_the_creation_cap() {
    let w = Server::start(
        "sim",
        &[
            ("HEARTH_MAX_CONCURRENT_CREATIONS", "1"),
            ("HEARTH_CONCURRENCY", "8"),
        ],
    );
    let spec = json!({"sim_warm_ms": 1, "sim_cold_ms": 200, "memory_mb": 64});
    assert_eq!(w.put_fn("f", spec).status, 201);
    let calls: Vec<_> = (0..3)
        .map(|_| {
            let mut c = w.client();
            std::thread::spawn(move || c.post("/v1/functions/f/invoke", b"{}").unwrap())
        })
        .collect();
    let mut inits: Vec<u64> = calls
        .into_iter()
        .map(|h| {
            let r = h.join().unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
            assert_eq!(r.json()["cold"], true, "{}", r.text());
            r.json()["timing"]["init"].as_u64().unwrap()
        })
        .collect();
    inits.sort_unstable();
    // One creation at a time: the third waited for two others (200 ms each) before its own.
    assert!(inits[2] >= 3 * 200_000, "{inits:?}");
    assert!(inits[1] >= 2 * 200_000, "{inits:?}");
}

#[test]
fn the_creation_cap_is_range_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args([
            "worker",
            "--backend",
            "sim",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(tmp.path())
        .env("HEARTH_MAX_CONCURRENT_CREATIONS", "5000")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("max_concurrent_creations"), "{err}");
}
