//! Sandbox start-up under bursts (issue 13): creations beyond `max_concurrent_creations` wait
//! for a turn instead of all running at once.

mod common;

use common::Server;
use serde_json::{json, Value};

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
    // One creation at a time: the third waited for two others (200 ms each) before its own
    // (less a few ms: the first creation may start before the third call's clock does; without
    // the cap all three take 200 ms).
    assert!(inits[2] >= 3 * 200_000 - 10_000, "{inits:?}");
    assert!(inits[1] >= 2 * 200_000 - 10_000, "{inits:?}");
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

/// Registers `f` (300 ms warm, 1 s more to start a sandbox), teaches the worker both times (a
/// cold call, then a warm one), then makes one call busy on the only sandbox and sends a second
/// 100 ms later; returns the second's answer.
fn a_second_call_while_the_sandbox_is_busy(w: &Server) -> Value {
    let spec = json!({"sim_warm_ms": 300, "sim_cold_ms": 1000, "memory_mb": 64});
    assert_eq!(w.put_fn("f", spec).status, 201);
    assert_eq!(w.invoke("f", "{}").json()["cold"], true);
    assert_eq!(w.invoke("f", "{}").json()["cold"], false);
    let mut c = w.client();
    let first = std::thread::spawn(move || c.post("/v1/functions/f/invoke", b"{}").unwrap());
    std::thread::sleep(std::time::Duration::from_millis(100));
    let second = w.invoke("f", "{}");
    assert_eq!(second.status, 200, "{}", second.text());
    assert_eq!(first.join().unwrap().status, 200);
    second.json()
}

#[test]
fn with_warm_wait_a_call_waits_for_the_busy_sandbox_instead_of_starting_one() {
    let w = Server::start(
        "sim",
        &[("HEARTH_WARM_WAIT", "true"), ("HEARTH_CONCURRENCY", "8")],
    );
    // Waiting (≤ 300 ms) beats a start (1 s).
    let second = a_second_call_while_the_sandbox_is_busy(&w);
    assert_eq!(second["cold"], false, "{second}");
    assert!(second["timing"]["queue"].as_u64().unwrap() > 0);
    let q = &w.status()["queue"];
    assert_eq!(q["warm_waits_avoided"], 1, "{q}");
    assert_eq!(w.status()["functions"]["f"]["warm"], 1, "one sandbox only");
}

/// `warm_wait` is on by default; `false` brings back a start for every call that finds the
/// function's sandboxes busy.
#[test]
fn warm_wait_is_on_by_default_and_can_be_switched_off() {
    for (env, waits) in [(None, true), (Some("false"), false)] {
        let mut settings = vec![("HEARTH_CONCURRENCY", "8")];
        if let Some(v) = env {
            settings.push(("HEARTH_WARM_WAIT", v));
        }
        let w = Server::start("sim", &settings);
        let second = a_second_call_while_the_sandbox_is_busy(&w);
        assert_eq!(second["cold"], !waits, "warm_wait {env:?}: {second}");
    }
}
