//! Worker scheduling end to end with the `sim` backend: queue disciplines, the concurrency
//! limit, the bypass, learned characteristics, keep-alive policies and why a start was cold.

mod common;

use common::Server;
use serde_json::{json, Value};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

fn sim_fn(warm_ms: u64, cold_ms: u64, memory_mb: u64) -> Value {
    json!({"sim_warm_ms": warm_ms, "sim_cold_ms": cold_ms, "memory_mb": memory_mb})
}

/// Invokes `f` on a thread of its own; the answer comes with the instant it arrived.
fn invoke_bg(s: &Server, f: &str) -> JoinHandle<(Value, Instant)> {
    let url = s.url.clone();
    let path = format!("/v1/functions/{f}/invoke");
    std::thread::spawn(move || {
        let v = common::client_for(&url)
            .unwrap()
            .post(&path, b"{}")
            .unwrap()
            .json();
        (v, Instant::now())
    })
}

fn wait_until(s: &Server, what: &str, cond: impl Fn(&Value) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = s.status();
        if cond(&st) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {st}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// With one invocation at a time: a long invocation runs, then a second long one and a short one
/// queue behind it. Returns the short one's and the second long one's answers, with when each
/// arrived back.
fn long_then_short(queue: &str) -> ((Value, Instant), (Value, Instant)) {
    let s = Server::start_with_args(
        "sim",
        &[],
        &["--queue", queue, "--concurrency", "1", "--keepalive", "lru"],
    );
    s.put_fn("long", sim_fn(400, 0, 64));
    s.put_fn("short", sim_fn(20, 0, 64));
    // Learn both warm times (a cold run, then a warm one).
    for f in ["long", "short", "long", "short"] {
        assert_eq!(s.invoke(f, "{}").status, 200);
    }
    let first = invoke_bg(&s, "long");
    wait_until(&s, "the first long one runs", |st| {
        st["functions"]["long"]["running"] == 1
    });
    let long2 = invoke_bg(&s, "long");
    wait_until(&s, "the second long one queues", |st| {
        st["queue"]["length"] == 1
    });
    let short = invoke_bg(&s, "short");
    wait_until(&s, "the short one queues", |st| st["queue"]["length"] == 2);
    assert_eq!(first.join().unwrap().0["cold"], false);
    (short.join().unwrap(), long2.join().unwrap())
}

#[test]
fn sjf_runs_a_short_function_queued_behind_a_long_one_first() {
    let ((short, short_at), (long2, long2_at)) = long_then_short("sjf");
    assert!(short_at < long2_at, "short {short} long {long2}");
    // The short one waited only for the first long one.
    let q = short["timing"]["queue"].as_u64().unwrap();
    assert!((100_000..450_000).contains(&q), "{short}");
    assert!(long2["timing"]["queue"].as_u64().unwrap() > q, "{long2}");
}

#[test]
fn fcfs_keeps_arrival_order() {
    let ((short, short_at), (long2, long2_at)) = long_then_short("fcfs");
    assert!(long2_at < short_at, "short {short} long {long2}");
    assert!(
        short["timing"]["queue"].as_u64().unwrap() > 400_000,
        "{short}"
    );
}

#[test]
fn a_short_known_function_bypasses_the_queue() {
    let s = Server::start_with_args(
        "sim",
        &[("HEARTH_BYPASS_MS", "50")],
        &["--queue", "fcfs", "--concurrency", "1"],
    );
    s.put_fn("long", sim_fn(500, 0, 64));
    s.put_fn("tiny", sim_fn(1, 0, 64));
    for f in ["tiny", "tiny"] {
        assert_eq!(s.invoke(f, "{}").status, 200);
    }
    let long = invoke_bg(&s, "long");
    wait_until(&s, "long runs", |st| {
        st["functions"]["long"]["running"] == 1
    });
    let queued = invoke_bg(&s, "long");
    wait_until(&s, "a second long one queues", |st| {
        st["queue"]["length"] == 1
    });
    // tiny does not wait behind them.
    let v = s.invoke("tiny", "{}").json();
    assert_eq!(v["timing"]["queue"], 0, "{v}");
    assert!(v["timing"]["e2e"].as_u64().unwrap() < 300_000, "{v}");
    long.join().unwrap();
    queued.join().unwrap();
    let m = s.client().get("/metrics").unwrap().text();
    assert!(m.contains("hearth_bypassed_total 1"), "{m}");
    assert!(
        m.contains(r#"hearth_queue_wait_seconds_count{discipline="fcfs"} 1"#),
        "{m}"
    );
    assert_eq!(s.status()["policies"]["bypass_ms"], 50.0);
}

#[test]
fn characteristics_are_learned_and_shown() {
    let s = Server::start("sim", &[]);
    s.put_fn("f", sim_fn(30, 100, 96));
    let r = s.client().get("/v1/functions/f").unwrap().json();
    assert_eq!(r["characteristics"]["invocations"], 0, "{r}");
    assert_eq!(
        r["characteristics"]["warm_ms"], 0.0,
        "new: zero expected time"
    );
    for _ in 0..3 {
        assert_eq!(s.invoke("f", "{}").status, 200);
        std::thread::sleep(Duration::from_millis(50));
    }
    let c = s.client().get("/v1/functions/f").unwrap().json()["characteristics"].clone();
    assert_eq!(c["invocations"], 3);
    assert_eq!(
        (c["warm_samples"].clone(), c["cold_samples"].clone()),
        (json!(2), json!(1))
    );
    let warm = c["warm_ms"].as_f64().unwrap();
    let cold = c["cold_ms"].as_f64().unwrap();
    assert!((30.0..60.0).contains(&warm), "{c}");
    assert!((130.0..200.0).contains(&cold), "{c}");
    assert!(
        (c["init_ms"].as_f64().unwrap() - (cold - warm)).abs() < 0.01,
        "{c}"
    );
    assert!(c["iat_ewma_ms"].as_f64().unwrap() >= 50.0, "{c}");
    assert_eq!(c["memory_mb"], 96);
    // The CLI shows them too.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hearth"))
        .env("HEARTH_API_KEY", s.key.as_deref().unwrap_or(""))
        .args(["fn", "show", "f", "--url", &s.url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("\"warm_ms\"") && text.contains("\"iat_ewma_ms\""),
        "{text}"
    );
}

#[test]
fn gdsf_keeps_the_costly_small_function_and_says_why_the_other_was_cold() {
    // Room for two 128 MiB sandboxes. "costly" takes 300 ms to start, "cheap" 10 ms; both run
    // 1 ms. GDSF evicts the lowest freq × cost / size: cheap, not the older costly one.
    let s = Server::start_with_args(
        "sim",
        &[("HEARTH_MEMORY_MB", "256"), ("HEARTH_FREE_BUFFER_MB", "0")],
        &["--keepalive", "gdsf"],
    );
    s.put_fn("costly", sim_fn(1, 300, 128));
    s.put_fn("cheap", sim_fn(1, 10, 128));
    s.put_fn("third", sim_fn(1, 10, 128));
    assert_eq!(s.invoke("costly", "{}").json()["cold_reason"], "new");
    assert_eq!(s.invoke("cheap", "{}").json()["cold_reason"], "new");
    // An LRU policy would evict costly (least recently used) here.
    assert_eq!(s.invoke("third", "{}").json()["cold_reason"], "new");
    assert_eq!(
        s.invoke("costly", "{}").json()["cold"],
        false,
        "costly kept"
    );
    let v = s.invoke("cheap", "{}").json();
    assert_eq!(v["cold_reason"], "evicted", "{v}");
    assert_eq!(v["cold_reason_policy"], "gdsf", "{v}");
    assert!(v["cold_reason_ago_us"].as_u64().unwrap() > 0, "{v}");
    let st = s.status();
    assert_eq!(st["policies"]["keepalive"], "gdsf");
    let m = s.client().get("/metrics").unwrap().text();
    assert!(
        m.contains(r#"hearth_cold_starts_total{function="cheap",reason="evicted",path="fresh"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(r#"hearth_sandboxes_destroyed_total{state="evicted"} 2"#),
        "{m}"
    );
}

#[test]
fn a_burst_beyond_the_limit_queues_and_drains_with_warm_reuse() {
    let s = Server::start_with_args("sim", &[], &["--concurrency", "2", "--queue", "eedf"]);
    s.put_fn("f", sim_fn(100, 50, 64));
    let burst: Vec<_> = (0..6).map(|_| invoke_bg(&s, "f")).collect();
    wait_until(&s, "the burst queues", |st| {
        st["queue"]["running"] == 2 && st["queue"]["length"] == 4
    });
    let answers: Vec<Value> = burst.into_iter().map(|h| h.join().unwrap().0).collect();
    let cold = answers.iter().filter(|v| v["cold"] == true).count();
    assert_eq!(
        cold, 2,
        "only as many cold starts as the limit: {answers:?}"
    );
    let queued = answers
        .iter()
        .filter(|v| v["timing"]["queue"].as_u64().unwrap() > 50_000)
        .count();
    assert_eq!(queued, 4, "{answers:?}");
    let m = s.client().get("/metrics").unwrap().text();
    assert!(m.contains("hearth_queue_length 0"), "{m}");
    assert!(m.contains("hearth_concurrency_limit 2"), "{m}");
}

#[test]
fn a_client_that_leaves_the_queue_frees_its_place() {
    let s = Server::start_with_args("sim", &[], &["--concurrency", "1"]);
    s.put_fn("slow", sim_fn(600, 0, 64));
    let first = invoke_bg(&s, "slow");
    wait_until(&s, "slow runs", |st| {
        st["functions"]["slow"]["running"] == 1
    });
    // A client that gives up after 100 ms, while queued.
    let mut impatient = common::client_for(&s.url)
        .unwrap()
        .with_timeout(Some(Duration::from_millis(100)));
    assert!(impatient.post("/v1/functions/slow/invoke", b"{}").is_err());
    drop(impatient);
    wait_until(&s, "the abandoned invocation leaves the queue", |st| {
        st["queue"]["length"] == 0
    });
    assert!(
        !first.is_finished(),
        "it left while the first was still running"
    );
    assert_eq!(first.join().unwrap().0["cold"], true);
    // Nothing leaked: the next one runs at once on the warm sandbox.
    let v = s.invoke("slow", "{}").json();
    assert_eq!(
        (v["cold"].clone(), v["timing"]["queue"].clone()),
        (json!(false), json!(0)),
        "{v}"
    );
    wait_until(&s, "idle again", |st| {
        st["queue"]["running"] == 0 && st["functions"]["slow"]["warm"] == 1
    });
}

/// Deadlines (Atoll): an answer says whether its deadline was met and by how much, the call may
/// set its own with `Hearth-Deadline-Ms`, misses are counted per function, a bad header is a
/// 400, and a client cannot claim time already spent (`Hearth-Elapsed-Us` is the cluster's).
#[test]
fn answers_judge_the_deadline_and_a_call_may_set_its_own() {
    let s = Server::start("sim", &[]);
    let mut spec = sim_fn(60, 0, 64);
    spec["deadline_ms"] = json!(20);
    assert_eq!(s.put_fn("d", spec).status, 201);
    s.put_fn("free", sim_fn(1, 0, 64));

    let v = s.invoke("d", "{}").json();
    assert_eq!(v["deadline_ms"], 20, "{v}");
    assert_eq!(
        v["deadline_missed"], true,
        "60 ms of work against 20 ms: {v}"
    );
    let margin = v["deadline_margin_us"].as_i64().unwrap();
    assert!(margin <= -40_000, "about 40 ms late: {v}");

    let mut c = s.client();
    c.set_header("Hearth-Deadline-Ms", Some("5000")).unwrap();
    // The call's deadline replaces the function's; a client's elapsed time is ignored.
    c.set_header("Hearth-Elapsed-Us", Some("4999000")).unwrap();
    let v = c.post("/v1/functions/d/invoke", b"{}").unwrap().json();
    assert_eq!(v["deadline_ms"], 5000, "{v}");
    assert_eq!(v["deadline_missed"], false, "{v}");
    assert!(v["deadline_margin_us"].as_i64().unwrap() > 4_000_000, "{v}");

    // Without any deadline the answer has no deadline fields.
    let v = s.invoke("free", "{}").json();
    assert!(v.get("deadline_missed").is_none(), "{v}");

    for bad in ["0", "abc", "-5", "900001", "1.5"] {
        c.set_header("Hearth-Deadline-Ms", Some(bad)).unwrap();
        let r = c.post("/v1/functions/d/invoke", b"{}").unwrap();
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert!(r.text().contains("Hearth-Deadline-Ms"), "{}", r.text());
    }
    let metrics = s.client().get("/metrics").unwrap().text();
    assert!(
        metrics.contains("hearth_deadlines_missed_total{function=\"d\"} 1"),
        "{metrics}"
    );
}

/// Invokes `f` with `headers` on a thread of its own; the answer's status and body come back.
fn invoke_bg_with(s: &Server, f: &str, headers: &[(&str, &str)]) -> JoinHandle<(u16, Value)> {
    let mut c = common::client_for(&s.url).unwrap();
    for (name, value) in headers {
        c.set_header(name, Some(value)).unwrap();
    }
    let path = format!("/v1/functions/{f}/invoke");
    std::thread::spawn(move || {
        let r = c.post(&path, b"{}").unwrap();
        (r.status, r.json())
    })
}

/// `Hearth-Drop-Late` (Atoll): with one invocation at a time, a call whose deadline passes
/// while it waits behind a long one is answered 504 `deadline_passed` without running when it
/// asked to drop late work; the same call without the header still runs and is judged late.
/// Without any deadline the header changes nothing; a bad value is a 400 naming the header.
#[test]
fn a_call_that_asked_to_drop_late_work_is_dropped_when_its_deadline_passes_in_the_queue() {
    let s = Server::start_with_args("sim", &[], &["--queue", "fcfs", "--concurrency", "1"]);
    s.put_fn("long", sim_fn(1500, 0, 64));
    s.put_fn("f", sim_fn(5, 0, 64));
    let long = invoke_bg(&s, "long");
    wait_until(&s, "long runs", |st| {
        st["functions"]["long"]["running"] == 1
    });
    let deadline = ("Hearth-Deadline-Ms", "50");
    let dropped = invoke_bg_with(&s, "f", &[deadline, ("Hearth-Drop-Late", "true")]);
    wait_until(&s, "the drop-late call queues", |st| {
        st["queue"]["length"] == 1
    });
    let kept = invoke_bg_with(&s, "f", &[deadline]);
    wait_until(&s, "the plain call queues behind it", |st| {
        st["queue"]["length"] == 2
    });

    let (status, v) = dropped.join().unwrap();
    assert_eq!(status, 504, "{v}");
    assert_eq!(v["error"]["code"], "deadline_passed", "{v}");
    assert_eq!(v["error"]["deadline_ms"], 50, "{v}");
    let late_by = v["error"]["late_by_us"].as_u64().unwrap();
    assert!(late_by > 0, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("deadline") && message.contains(&late_by.to_string()),
        "{message}"
    );
    let (status, v) = kept.join().unwrap();
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["deadline_missed"], true, "{v}");
    assert_eq!(long.join().unwrap().0["deadline_missed"], Value::Null);

    // No deadline at all: accepted, and it runs.
    let (status, v) = invoke_bg_with(&s, "f", &[("Hearth-Drop-Late", "1")])
        .join()
        .unwrap();
    assert_eq!(status, 200, "{v}");
    assert!(v.get("deadline_missed").is_none(), "{v}");
    let roomy = ("Hearth-Deadline-Ms", "60000");
    let (status, v) = invoke_bg_with(&s, "f", &[roomy, ("Hearth-Drop-Late", "false")])
        .join()
        .unwrap();
    assert_eq!(
        (status, v["deadline_missed"].clone()),
        (200, json!(false)),
        "{v}"
    );

    let mut c = s.client();
    for bad in ["yes", "2", "", "truee"] {
        c.set_header("Hearth-Drop-Late", Some(bad)).unwrap();
        let r = c.post("/v1/functions/f/invoke", b"{}").unwrap();
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert!(r.text().contains("Hearth-Drop-Late"), "{}", r.text());
    }
    let metrics = s.client().get("/metrics").unwrap().text();
    assert!(
        metrics.contains("hearth_deadlines_dropped_total{function=\"f\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("hearth_deadlines_missed_total{function=\"f\"} 1"),
        "{metrics}"
    );
}
