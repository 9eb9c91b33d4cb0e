//! The public API end to end with the `sim` backend: same pool, accounting, API and metrics as
//! real sandboxes, without processes.

mod common;

use common::{wait_invocation, Server};
use serde_json::json;
use std::time::{Duration, Instant};

fn sim_fn(warm_ms: u64, cold_ms: u64) -> serde_json::Value {
    json!({"sim_warm_ms": warm_ms, "sim_cold_ms": cold_ms, "memory_mb": 128})
}

#[test]
fn register_list_show_delete_and_restart_persistence() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    {
        let s = Server::start_in("sim", &data, &[]);
        let r = s.put_fn(
            "alpha",
            json!({"memory_mb": 256, "timeout_ms": 1500, "priority": 2}),
        );
        assert_eq!(r.status, 201, "{}", r.text());
        assert_eq!(r.json()["version"], 1);
        let r = s.put_fn("alpha", json!({"memory_mb": 512}));
        assert_eq!(r.status, 200, "an update answers 200");
        assert_eq!(r.json()["version"], 2);
        assert_eq!(s.put_fn("beta", sim_fn(1, 1)).status, 201);
        let list = s.client().get("/v1/functions").unwrap().json();
        let names: Vec<&str> = list["functions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["alpha", "beta"]);
        let show = s.client().get("/v1/functions/alpha").unwrap();
        assert_eq!(show.status, 200);
        assert_eq!(show.json()["memory_mb"], 512);
        assert_eq!(show.json()["pool"]["warm"], 0);
        assert_eq!(s.client().delete("/v1/functions/beta").unwrap().status, 204);
        let r = s.client().delete("/v1/functions/beta").unwrap();
        assert_eq!(r.status, 404);
        assert_eq!(r.json()["error"]["code"], "unknown_function");
    }
    // A restart on the same data directory keeps the registry.
    let s = Server::start_in("sim", &data, &[]);
    let show = s.client().get("/v1/functions/alpha").unwrap();
    assert_eq!(show.status, 200, "{}", show.text());
    assert_eq!(show.json()["memory_mb"], 512);
    assert_eq!(show.json()["version"], 2);
    assert_eq!(s.client().get("/v1/functions/beta").unwrap().status, 404);
    assert_eq!(s.invoke("alpha", "{}").status, 200);
}

#[test]
fn bad_registrations_get_clear_400s() {
    let s = Server::start("sim", &[]);
    for (body, needle) in [
        (json!({"memroy_mb": 5}), "memroy_mb"),
        (json!({"memory_mb": 1}), "memory_mb"),
        (json!({"handler": "1bad"}), "handler"),
        (json!({"code": {"zip": "x"}}), "code must be one of"),
        (json!([1, 2]), "JSON object"),
    ] {
        let r = s.put_fn("f", body.clone());
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(msg.contains(needle), "{body}: {msg}");
    }
    let r = s.client().put("/v1/functions/f", b"{not json").unwrap();
    assert_eq!(r.status, 400);
    let r = s.put_fn("bad%20name", json!({}));
    assert_eq!(r.status, 400, "{}", r.text());
}

#[test]
fn cold_then_warm_with_a_consistent_timing_breakdown() {
    let s = Server::start("sim", &[]);
    s.put_fn("f", sim_fn(20, 60));
    let r = s.invoke("f", r#"{"x": 1}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["cold"], true);
    assert_eq!(v["cold_reason"], "new");
    assert_eq!(v["result"], json!({"simulated": true}));
    assert!(v["worker"].as_str().unwrap().starts_with("test-"));
    let t = &v["timing"];
    let get = |k: &str| t[k].as_u64().unwrap();
    assert!(get("init") >= 60_000, "{t}");
    assert!(get("exec") >= 20_000, "{t}");
    assert_eq!(
        get("e2e"),
        get("queue") + get("init") + get("exec") + get("overhead")
    );
    let v = s.invoke("f", "").json();
    assert_eq!(v["cold"], false, "an empty body is {{}} and runs warm: {v}");
    assert!(v.get("cold_reason").is_none());
    assert_eq!(v["timing"]["init"], 0);
    let m = s.client().get("/metrics").unwrap().text();
    assert!(
        m.contains(r#"hearth_invocations_total{function="f",outcome="success"} 2"#),
        "{m}"
    );
    assert!(
        m.contains(r#"hearth_cold_starts_total{function="f",reason="new",path="fresh"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(r#"hearth_warm_starts_total{function="f"} 1"#),
        "{m}"
    );
    assert!(
        m.contains("hearth_invocation_overhead_seconds_bucket"),
        "{m}"
    );
    assert!(m.contains("hearth_invocation_exec_seconds_bucket{"), "{m}");
    assert!(m.contains("hearth_invocation_init_seconds_bucket{"), "{m}");
    assert!(
        m.contains(r#"hearth_pool_sandboxes{state="warm"} 1"#),
        "{m}"
    );
}

#[test]
fn concurrent_invocations_get_separate_sandboxes() {
    let s = Server::start("sim", &[("HEARTH_CONCURRENCY", "8")]);
    s.put_fn("f", sim_fn(300, 0));
    let url = s.url.clone();
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || {
                let mut c = common::client_for(&url).unwrap();
                c.post("/v1/functions/f/invoke", b"{}").unwrap().json()
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let st = s.status();
    assert_eq!(st["functions"]["f"]["running"], 3, "{st}");
    assert_eq!(st["memory"]["running_mb"], 384, "{st}");
    let answers: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let reasons: Vec<&str> = answers
        .iter()
        .map(|v| v["cold_reason"].as_str().unwrap_or("warm"))
        .collect();
    assert_eq!(
        reasons.iter().filter(|r| **r == "new").count(),
        1,
        "{reasons:?}"
    );
    assert_eq!(
        reasons.iter().filter(|r| **r == "concurrent").count(),
        2,
        "{reasons:?}"
    );
    let st = s.status();
    assert_eq!(st["functions"]["f"]["warm"], 3, "{st}");
    assert_eq!(st["memory"]["warm_mb"], 384, "{st}");
}

#[test]
fn async_invocations_report_status_and_result() {
    let s = Server::start("sim", &[]);
    s.put_fn("f", sim_fn(200, 0));
    let r = s
        .client()
        .post("/v1/functions/f/invoke?async=true", b"{}")
        .unwrap();
    assert_eq!(r.status, 202, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_string();
    let now = s
        .client()
        .get(&format!("/v1/invocations/{id}"))
        .unwrap()
        .json();
    assert_eq!(now["status"], "running");
    let done = wait_invocation(&s, &id);
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["result"], json!({"simulated": true}));
    assert_eq!(done["cold"], true);
    assert!(done["timing"]["exec"].as_u64().unwrap() >= 200_000);
    let missing = s.client().get("/v1/invocations/nope").unwrap();
    assert_eq!(missing.status, 404);
    let r = s
        .client()
        .post("/v1/functions/ghost/invoke?async=true", b"{}")
        .unwrap();
    assert_eq!(
        r.status, 404,
        "unknown functions are refused before accepting"
    );
    let r = s
        .client()
        .post("/v1/functions/f/invoke?async=maybe", b"{}")
        .unwrap();
    assert_eq!(r.status, 400);
}

#[test]
fn async_results_expire_after_the_retention_time() {
    let s = Server::start("sim", &[("HEARTH_ASYNC_RETENTION_S", "1")]);
    s.put_fn("f", sim_fn(0, 0));
    let r = s
        .client()
        .post("/v1/functions/f/invoke?async=true", b"{}")
        .unwrap();
    let id = r.json()["id"].as_str().unwrap().to_string();
    assert_eq!(wait_invocation(&s, &id)["status"], "succeeded");
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        s.client()
            .get(&format!("/v1/invocations/{id}"))
            .unwrap()
            .status,
        404
    );
}

#[test]
fn prewarm_makes_the_first_invocations_warm() {
    let s = Server::start("sim", &[]);
    s.put_fn("f", sim_fn(1, 100));
    let r = s
        .client()
        .post("/v1/functions/f/prewarm", br#"{"count": 3}"#)
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["ready"], 3);
    let st = s.status();
    assert_eq!(st["functions"]["f"]["warm"], 3, "{st}");
    assert_eq!(st["memory"]["warm_mb"], 384);
    assert_eq!(s.invoke("f", "{}").json()["cold"], false);
    let r = s
        .client()
        .post("/v1/functions/ghost/prewarm", b"{}")
        .unwrap();
    assert_eq!(r.status, 404);
    let r = s
        .client()
        .post("/v1/functions/f/prewarm", br#"{"count": 0}"#)
        .unwrap();
    assert_eq!(r.status, 400);
}

#[test]
fn request_errors_unknown_malformed_too_large() {
    let s = Server::start("sim", &[("HEARTH_MAX_BODY_BYTES", "1024")]);
    s.put_fn("f", sim_fn(0, 0));
    let r = s.invoke("ghost", "{}");
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "unknown_function");
    let r = s.invoke("f", "{\"a\": ");
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "bad_request");
    let big = format!("{{\"x\": \"{}\"}}", "a".repeat(2000));
    let r = s.invoke("f", &big);
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "payload_too_large");
    // None of it harmed the worker.
    assert_eq!(s.invoke("f", "{}").status, 200);
    let r = s.client().get("/v1/nothing").unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "not_found");
}

#[test]
fn no_memory_waits_in_the_queue_a_full_queue_is_429_and_oversized_is_refused() {
    let s = Server::start(
        "sim",
        &[
            ("HEARTH_MEMORY_MB", "256"),
            ("HEARTH_FREE_BUFFER_MB", "0"),
            ("HEARTH_CONCURRENCY", "4"),
            ("HEARTH_MAX_QUEUE", "1"),
        ],
    );
    s.put_fn("big", json!({"sim_warm_ms": 500, "memory_mb": 200}));
    let spawn = |url: String| {
        std::thread::spawn(move || {
            common::client_for(&url)
                .unwrap()
                .post("/v1/functions/big/invoke", b"{}")
                .unwrap()
        })
    };
    let first = spawn(s.url.clone());
    std::thread::sleep(Duration::from_millis(150));
    // No memory for a second sandbox while the first runs: it waits in the queue...
    let second = spawn(s.url.clone());
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(s.status()["queue"]["length"], 1, "{}", s.status());
    // ...which holds one: a third is refused at once.
    let r = s.invoke("big", "{}");
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.json()["error"]["code"], "queue_full");
    assert_eq!(first.join().unwrap().status, 200);
    // The second ran on the sandbox the first left, after waiting for it.
    let v = second.join().unwrap().json();
    assert_eq!(v["cold"], false, "{v}");
    assert!(v["timing"]["queue"].as_u64().unwrap() > 200_000, "{v}");
    let m = s.client().get("/metrics").unwrap().text();
    assert!(m.contains(r#"outcome="rejected"} 1"#), "{m}");
    // A function bigger than the whole budget can never run here.
    let r = s.put_fn("huge", json!({"sim_warm_ms": 1, "memory_mb": 300}));
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("256 MiB"), "{}", r.text());
}

#[test]
fn warm_sandboxes_are_evicted_lru_for_a_new_function() {
    let s = Server::start(
        "sim",
        &[("HEARTH_MEMORY_MB", "256"), ("HEARTH_FREE_BUFFER_MB", "0")],
    );
    for f in ["a", "b", "c"] {
        s.put_fn(f, sim_fn(0, 0));
    }
    assert_eq!(s.invoke("a", "{}").json()["cold_reason"], "new");
    assert_eq!(s.invoke("b", "{}").json()["cold_reason"], "new");
    // c needs room: a (least recently used) is evicted, so a is cold again, evicted.
    assert_eq!(s.invoke("c", "{}").json()["cold_reason"], "new");
    let v = s.invoke("a", "{}").json();
    assert_eq!(v["cold_reason"], "evicted", "{v}");
    assert!(v["cold_reason_ago_us"].as_u64().is_some());
    let st = s.status();
    assert!(
        st["memory"]["warm_mb"].as_u64().unwrap() + st["memory"]["running_mb"].as_u64().unwrap()
            <= 256
    );
}

#[test]
fn keep_alive_ttl_expires_idle_sandboxes() {
    let s = Server::start("sim", &[("HEARTH_KEEPALIVE_TTL_S", "1")]);
    s.put_fn("f", sim_fn(0, 0));
    s.invoke("f", "{}");
    assert_eq!(s.status()["functions"]["f"]["warm"], 1);
    std::thread::sleep(Duration::from_millis(1600));
    assert!(s.status()["functions"].get("f").is_none(), "{}", s.status());
    let v = s.invoke("f", "{}").json();
    assert_eq!(v["cold_reason"], "expired", "{v}");
}

#[test]
fn timeouts_are_504_and_the_sandbox_is_not_reused() {
    let s = Server::start("sim", &[]);
    s.put_fn("slow", json!({"sim_warm_ms": 2000, "timeout_ms": 200}));
    let t = Instant::now();
    let r = s.invoke("slow", "{}");
    assert_eq!(r.status, 504, "{}", r.text());
    assert!(t.elapsed() < Duration::from_millis(1500));
    assert_eq!(r.json()["error"]["code"], "timeout");
    std::thread::sleep(Duration::from_millis(50));
    assert!(s.status()["functions"].get("slow").is_none());
    let m = s.client().get("/metrics").unwrap().text();
    assert!(m.contains(r#"outcome="timeout"} 1"#), "{m}");
}

#[test]
fn deleting_a_function_lets_running_invocations_finish() {
    let s = Server::start("sim", &[]);
    s.put_fn("f", sim_fn(400, 0));
    let url = s.url.clone();
    let running = std::thread::spawn(move || {
        common::client_for(&url)
            .unwrap()
            .post("/v1/functions/f/invoke", b"{}")
            .unwrap()
    });
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(s.client().delete("/v1/functions/f").unwrap().status, 204);
    assert_eq!(s.invoke("f", "{}").status, 404);
    assert_eq!(running.join().unwrap().status, 200);
    std::thread::sleep(Duration::from_millis(50));
    let st = s.status();
    assert!(st["functions"].get("f").is_none(), "{st}");
    assert_eq!(st["memory"]["running_mb"], 0);
    assert_eq!(st["memory"]["warm_mb"], 0);
}

#[test]
fn sigterm_finishes_in_flight_invocations_then_exits() {
    let mut s = Server::start("sim", &[]);
    s.put_fn("f", sim_fn(800, 0));
    let url = s.url.clone();
    let running = std::thread::spawn(move || {
        common::client_for(&url)
            .unwrap()
            .post("/v1/functions/f/invoke", b"{}")
            .unwrap()
    });
    std::thread::sleep(Duration::from_millis(200));
    let status = s.terminate();
    assert!(status.success(), "{status}: {}", s.log_text());
    let r = running.join().unwrap();
    assert_eq!(
        r.status,
        200,
        "the in-flight invocation completes: {}",
        r.text()
    );
    assert!(s.log_text().contains("all sandboxes removed"));
}

/// A stopping worker keeps answering while its in-flight work finishes: new invocations get
/// 503 `shutting_down` with `Retry-After` (the API's promise), not a refused connection.
#[test]
fn a_stopping_worker_answers_503_until_its_in_flight_work_is_done() {
    let mut s = Server::start("sim", &[]);
    s.put_fn("f", sim_fn(1500, 0));
    let url = s.url.clone();
    let running = std::thread::spawn(move || {
        common::client_for(&url)
            .unwrap()
            .post("/v1/functions/f/invoke", b"{}")
            .unwrap()
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.status()["queue"]["running"] != 1 {
        assert!(Instant::now() < deadline, "the long call never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    unsafe {
        libc::kill(s.pid() as i32, libc::SIGTERM);
    }
    // Every poll is a new connection; none may be refused. One accepted in the instant the
    // worker switches to draining is closed unanswered, as graceful shutdown closes idle
    // connections; a client retries that.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "the worker never began stopping");
        let st = match s.client().get("/v1/status") {
            Ok(r) => r.json(),
            Err(hearth_cli::client::ClientError::Io(e))
                if e.kind() == std::io::ErrorKind::UnexpectedEof =>
            {
                continue;
            }
            Err(e) => panic!("a stopping worker answers: {e:?}"),
        };
        if st["shutting_down"] == true {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let r = s.invoke("f", "{}");
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "shutting_down");
    assert!(r.header("retry-after").is_some());
    assert!(
        !running.is_finished(),
        "the 503 came while work was still in flight"
    );
    assert_eq!(running.join().unwrap().status, 200);
    assert!(s.terminate().success(), "{}", s.log_text());
}

#[test]
fn healthz_and_status_policies() {
    let s = Server::start("sim", &[("HEARTH_MEMORY_MB", "1000")]);
    let r = s.client().get("/healthz").unwrap();
    assert_eq!(r.status, 200);
    let st = s.status();
    assert_eq!(st["backend"], "sim");
    assert_eq!(st["memory"]["budget_mb"], 1000);
    assert_eq!(st["memory"]["free_mb"], 1000);
    assert_eq!(st["policies"]["keepalive"], "ttl");
    assert_eq!(st["policies"]["queue"], "eedf");
    let cpus = st["load"]["cpus"].as_u64().unwrap();
    assert!(cpus >= 1, "{st}");
    assert_eq!(st["policies"]["regulator"], format!("fixed({cpus})"));
    assert_eq!(st["queue"]["length"], 0);
    assert_eq!(st["queue"]["limit"], cpus);
    assert!(st["load"]["normalized"].as_f64().is_some(), "{st}");
}
