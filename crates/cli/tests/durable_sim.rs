//! Async invocations that survive crashes, retries with a dead-letter list, idempotency keys,
//! and ids run once per worker (issue 12), on sim workers and real processes killed with
//! SIGKILL.

mod common;

use common::cluster::{home, join, runs_on, sim_fn, wait_members, wait_until};
use common::{wait_invocation, Server};
use serde_json::json;
use std::time::Duration;

/// Quick retries, so that tests do not wait on the default back-off.
const FAST_RETRY: (&str, &str) = ("HEARTH_ASYNC_RETRY_BACKOFF_MS", "50");

fn start_async(s: &Server, function: &str) -> String {
    let r = s
        .client()
        .post(
            &format!("/v1/functions/{function}/invoke?async=true"),
            b"{}",
        )
        .unwrap();
    assert_eq!(r.status, 202, "{}", r.text());
    r.json()["id"].as_str().unwrap().to_string()
}

#[test]
fn a_single_node_async_invocation_survives_a_killed_worker() {
    let mut w = Server::start("sim", &[FAST_RETRY]);
    assert_eq!(w.put_fn("slow", sim_fn(1_500, 0)).status, 201);
    let id = start_async(&w, "slow");
    wait_until("it runs", Duration::from_secs(10), || {
        w.status()["functions"]["slow"]["running"] == 1
    });
    w.kill();
    w.restart();
    // The accepted id still answers, and the restarted worker runs it again to the end.
    let v = wait_invocation(&w, &id);
    assert_eq!(v["status"], "succeeded", "{v}");
    assert_eq!(
        v["attempts"], 2,
        "the attempt lost with the process is counted: {v}"
    );
    assert_eq!(v["result"]["simulated"], true);
}

#[test]
fn a_controllers_async_invocation_survives_its_crash_and_runs_once_on_the_worker() {
    let mut c = Server::start_controller("ch", &[FAST_RETRY]);
    let w = join(&c, None, &[]);
    wait_members(&c, &[w.worker_id()]);
    assert_eq!(c.put_fn("slow", sim_fn(1_500, 0)).status, 201);
    let id = start_async(&c, "slow");
    wait_until("it runs", Duration::from_secs(10), || {
        w.status()["functions"]["slow"]["running"] == 1
    });
    c.kill();
    c.restart();
    wait_members(&c, &[w.worker_id()]);
    let v = wait_invocation(&c, &id);
    assert_eq!(v["status"], "succeeded", "{v}");
    assert_eq!(v["attempts"], 2, "{v}");
    // The restarted controller sent the same id again: the worker attached it to the run
    // that was going, rather than running the function twice.
    assert_eq!(runs_on(&w, "slow"), 1);
}

#[test]
fn failed_async_invocations_are_retried_then_listed_as_dead_letters() {
    let c = Server::start_controller("ch", &[FAST_RETRY]);
    let w = join(&c, None, &[]);
    wait_members(&c, &[w.worker_id()]);
    // Runs 1 s with a 200 ms timeout: every attempt times out.
    let mut spec = sim_fn(1_000, 0);
    spec["timeout_ms"] = json!(200);
    spec["retries"] = json!(1);
    assert_eq!(c.put_fn("late", spec).status, 201);
    assert_eq!(c.put_fn("ok", sim_fn(1, 0)).status, 201);
    let id = start_async(&c, "late");
    let ok = start_async(&c, "ok");
    let v = wait_invocation(&c, &id);
    assert_eq!(v["status"], "failed", "{v}");
    assert_eq!(v["attempts"], 2, "1 + retries: {v}");
    assert_eq!(v["error"]["code"], "timeout", "{v}");
    let failures = v["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 2, "{v}");
    assert!(failures
        .iter()
        .all(|f| f.as_str().unwrap().contains("timeout")));
    assert_eq!(wait_invocation(&c, &ok)["status"], "succeeded");

    let list = c
        .client()
        .get("/v1/invocations?status=failed")
        .unwrap()
        .json();
    let ids: Vec<&str> = list["invocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [id.as_str()]);
    // A tenant sees its own namespace's dead letters only.
    let tenant = c.new_key("team", "admin");
    let theirs = c
        .client_with(&tenant)
        .get("/v1/invocations?status=failed")
        .unwrap();
    assert_eq!(theirs.status, 200, "{}", theirs.text());
    assert_eq!(theirs.json()["invocations"], json!([]));
    // An invoke key may not list dead letters; a name cannot reach into another namespace.
    let invoker = c.new_key("default", "invoke");
    let r = c
        .client_with(&invoker)
        .get("/v1/invocations?status=failed")
        .unwrap();
    assert_eq!(r.status, 403, "{}", r.text());
    let r = c
        .client_with(&tenant)
        .get("/v1/invocations?status=failed&function=default.late")
        .unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    let r = c
        .client()
        .get("/v1/invocations?status=failed&limit=100000")
        .unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    let bad = c.client().get("/v1/invocations?status=running").unwrap();
    assert_eq!(bad.status, 400);
    // A function's own setting is range-checked.
    let mut spec = sim_fn(1, 0);
    spec["retries"] = json!(11);
    let r = c.put_fn("greedy", spec);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["field"], "retries");
}

#[test]
fn an_idempotency_key_returns_the_first_calls_id_and_result() {
    let c = Server::start_controller("ch", &[]);
    let w = join(&c, None, &[]);
    wait_members(&c, &[w.worker_id()]);
    assert_eq!(c.put_fn("f", sim_fn(20, 0)).status, 201);
    assert_eq!(home(&c, "f"), w.worker_id());

    // Async: the same key gives the same id, marked as a replay.
    let mut client = c.client();
    client
        .set_header("Idempotency-Key", Some("order-42"))
        .unwrap();
    let first = client
        .post("/v1/functions/f/invoke?async=true", b"{}")
        .unwrap();
    assert_eq!(first.status, 202);
    assert!(first.header("hearth-idempotent-replay").is_none());
    let again = client
        .post("/v1/functions/f/invoke?async=true", b"{}")
        .unwrap();
    assert_eq!(again.status, 202);
    assert_eq!(again.json()["id"], first.json()["id"]);
    assert_eq!(again.header("hearth-idempotent-replay"), Some("true"));
    wait_invocation(&c, first.json()["id"].as_str().unwrap());

    // Sync: the same key gives the same answer, byte for byte (timing included).
    client
        .set_header("Idempotency-Key", Some("order-43"))
        .unwrap();
    let a = client.post("/v1/functions/f/invoke", b"{}").unwrap();
    assert_eq!(a.status, 200, "{}", a.text());
    let b = client.post("/v1/functions/f/invoke", b"{}").unwrap();
    assert_eq!(b.status, 200);
    assert_eq!(a.text(), b.text());
    assert_eq!(b.header("hearth-idempotent-replay"), Some("true"));
    assert_eq!(runs_on(&w, "f"), 2, "each key ran once");
    // Another key runs again.
    client
        .set_header("Idempotency-Key", Some("order-44"))
        .unwrap();
    let other = client.post("/v1/functions/f/invoke", b"{}").unwrap();
    assert_ne!(other.text(), a.text());
    assert_eq!(runs_on(&w, "f"), 3);
    // The CLI sends one too.
    let cli = |key: &str| {
        common::ok(common::hearth(&[
            "invoke",
            "f",
            "--idempotency-key",
            key,
            "--url",
            &c.url,
        ]))
    };
    assert_eq!(cli("cli-1"), cli("cli-1"));
    assert_ne!(cli("cli-1"), cli("cli-2"));
    // A bad key is refused.
    client
        .set_header("Idempotency-Key", Some(&"k".repeat(300)))
        .unwrap();
    assert_eq!(
        client.post("/v1/functions/f/invoke", b"{}").unwrap().status,
        400
    );
}

#[test]
fn a_client_cannot_use_invocation_ids_to_read_another_callers_answer() {
    // Only the cluster's peers may send Hearth-Invocation-Id: a client's is ignored, so a
    // guessed id never returns someone else's remembered answer.
    let c = Server::start_controller("ch", &[]);
    let w = join(&c, None, &[]);
    wait_members(&c, &[w.worker_id()]);
    assert_eq!(c.put_fn("f", sim_fn(5, 0)).status, 201);
    assert_eq!(c.invoke("f", "{}").status, 200);
    let mut client = w.client();
    client
        .set_header(
            "Hearth-Invocation-Id",
            Some("0123456789abcdef0123456789abcdef"),
        )
        .unwrap();
    let a = client.post("/v1/functions/f/invoke", b"{}").unwrap();
    let b = client.post("/v1/functions/f/invoke", b"{}").unwrap();
    assert_eq!((a.status, b.status), (200, 200));
    assert_ne!(a.text(), b.text(), "each call ran");
}
