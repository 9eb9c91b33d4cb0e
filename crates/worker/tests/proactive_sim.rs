//! `POST /v1/cluster/proactive` with the sim backend: a controller's create, soft-evict,
//! un-mark and evict commands on a worker's proactive pool (Atoll §4.3), and what invocations
//! and the status see of them.

mod common;

use axum::http::{Method, StatusCode};
use common::{sim_fn, TestWorker, CLUSTER_KEY};
use serde_json::{json, Value};

fn counts(answer: &Value, f: &str) -> (u64, u64, u64) {
    let c = &answer["functions"][f];
    (
        c["active"].as_u64().unwrap(),
        c["soft"].as_u64().unwrap(),
        c["starting"].as_u64().unwrap(),
    )
}

fn oks(answer: &Value) -> Vec<bool> {
    answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["ok"].as_bool().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_creates_are_ready_when_answered_and_an_invocation_runs_warm_on_one() {
    let w = TestWorker::sim(1024, 512).await;
    w.register("f", sim_fn(128, 50)).await;
    let a = w
        .proactive_ok(&[("create", "f"), ("create", "f"), ("create", "f")])
        .await;
    assert_eq!(oks(&a), [true, true, true], "{a}");
    // The answer waited for the starts: all three are ready, none starting.
    assert_eq!(counts(&a, "f"), (3, 0, 0), "{a}");
    let st = w.status().await;
    assert_eq!(
        st["proactive"],
        json!({"pool_mb": 512, "used_mb": 384, "free_mb": 128}),
        "{st}"
    );
    // The reactive part of the budget is what is left beside the whole pool.
    assert_eq!(st["memory"]["free_mb"], 512, "{st}");
    assert_eq!(
        st["functions"]["f"]["proactive"],
        json!({"active": 3, "soft": 0, "starting": 0})
    );

    let v = w.invoke("f").await;
    assert_eq!(v["cold"], false, "{v}");
    let st = w.status().await;
    // It ran on a proactive sandbox: no reactive sandbox was made.
    assert_eq!(st["functions"]["f"]["warm"], 0, "{st}");
    assert_eq!(st["functions"]["f"]["proactive"]["active"], 3, "{st}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soft_evicted_sandbox_is_not_used_until_unmarked() {
    let w = TestWorker::sim(1024, 512).await;
    w.register("g", sim_fn(128, 20)).await;
    w.register("h", sim_fn(128, 20)).await;

    let a = w
        .proactive_ok(&[("create", "g"), ("soft-evict", "g")])
        .await;
    assert_eq!(oks(&a), [true, true], "{a}");
    assert_eq!(counts(&a, "g"), (0, 1, 0), "{a}");
    let v = w.invoke("g").await;
    assert_eq!(
        v["cold"], true,
        "a soft-evicted sandbox is never scheduled: {v}"
    );
    let st = w.status().await;
    assert_eq!(st["functions"]["g"]["warm"], 1, "{st}");
    assert_eq!(
        st["functions"]["g"]["proactive"]["soft"], 1,
        "kept warm: {st}"
    );
    // Nothing usable is left to soft-evict.
    let a = w.proactive_ok(&[("soft-evict", "g")]).await;
    assert_eq!(a["results"][0]["ok"], false, "{a}");
    assert_eq!(a["results"][0]["code"], "nothing_to_do", "{a}");

    let a = w
        .proactive_ok(&[("create", "h"), ("soft-evict", "h"), ("unmark", "h")])
        .await;
    assert_eq!(oks(&a), [true, true, true], "{a}");
    assert_eq!(counts(&a, "h"), (1, 0, 0), "{a}");
    let v = w.invoke("h").await;
    assert_eq!(v["cold"], false, "the un-marked sandbox serves again: {v}");
    assert_eq!(w.status().await["functions"]["h"]["warm"], 0);
    let a = w.proactive_ok(&[("unmark", "h")]).await;
    assert_eq!(
        a["results"][0],
        json!({"ok": false, "code": "nothing_to_do",
               "error": "nothing to unmark: h has no soft-evicted proactive sandbox"}),
        "{a}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evict_frees_the_pool_soft_evicted_first() {
    let w = TestWorker::sim(1024, 512).await;
    w.register("f", sim_fn(128, 10)).await;
    let a = w
        .proactive_ok(&[("create", "f"), ("create", "f"), ("soft-evict", "f")])
        .await;
    assert_eq!(counts(&a, "f"), (1, 1, 0), "{a}");
    assert_eq!(w.status().await["proactive"]["used_mb"], 256);

    let a = w.proactive_ok(&[("evict", "f")]).await;
    assert_eq!(oks(&a), [true], "{a}");
    assert_eq!(counts(&a, "f"), (1, 0, 0), "the soft one went first: {a}");
    let st = w.status().await;
    assert_eq!(st["proactive"]["used_mb"], 128, "{st}");
    assert_eq!(st["proactive"]["free_mb"], 384, "{st}");

    let a = w.proactive_ok(&[("evict", "f"), ("evict", "f")]).await;
    assert_eq!(oks(&a), [true, false], "{a}");
    assert_eq!(
        a["results"][1]["error"],
        "nothing to evict: f has no remaining proactive sandbox"
    );
    assert_eq!(counts(&a, "f"), (0, 0, 0), "{a}");
    assert_eq!(w.status().await["proactive"]["used_mb"], 0);
    // The next invocation finds no sandbox left.
    assert_eq!(w.invoke("f").await["cold"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pool_or_an_unknown_function_fails_that_command_only() {
    let w = TestWorker::sim(1024, 320).await;
    w.register("f", sim_fn(128, 10)).await;
    let a = w
        .proactive_ok(&[
            ("create", "f"),
            ("create", "nope"),
            ("create", "f"),
            ("create", "f"),
        ])
        .await;
    assert_eq!(oks(&a), [true, false, true, false], "{a}");
    assert_eq!(a["results"][1]["code"], "unknown_function", "{a}");
    assert!(
        a["results"][1]["error"]
            .as_str()
            .unwrap()
            .contains("unknown function \"nope\""),
        "{a}"
    );
    assert_eq!(
        a["results"][3],
        json!({"ok": false, "code": "pool_full",
               "error": "proactive pool full: needs 128 MiB, 64 free"}),
        "{a}"
    );
    assert_eq!(counts(&a, "f"), (2, 0, 0), "{a}");
    assert_eq!(counts(&a, "nope"), (0, 0, 0), "{a}");
    // A full proactive pool leaves the reactive budget alone: a cold start still fits.
    w.register("r", sim_fn(512, 1)).await;
    assert_eq!(w.invoke("r").await["cold"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_without_a_proactive_pool_answers_409() {
    let w = TestWorker::sim(1024, 0).await;
    w.register("f", sim_fn(128, 10)).await;
    let (s, v) = w.proactive(&[("create", "f")]).await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["error"]["code"], "conflict");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("proactive pool is off"),
        "{v}"
    );
    assert!(w.status().await.get("proactive").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_cluster_peer_may_send_proactive_commands() {
    let w = TestWorker::start_with(|c| {
        c.auth = true;
        c.proactive_mb = 512;
    })
    .await;
    let admin = w.admin.clone().unwrap();
    // A tenant's admin key and the tenant's function.
    let (s, key) = w
        .call(
            Method::POST,
            "/v1/keys",
            json!({"namespace": "team-a", "role": "admin"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{key}");
    let tenant = key["key"].as_str().unwrap().to_string();
    let (s, v) = w
        .raw(
            Method::PUT,
            "/v1/functions/f",
            Some(&tenant),
            sim_fn(128, 10).to_string().into_bytes(),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");

    let body = json!({"commands": [{"op": "create", "function": "team-a.f"}]})
        .to_string()
        .into_bytes();
    let path = "/v1/cluster/proactive";
    let (s, v) = w.raw(Method::POST, path, None, body.clone()).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "anonymous: {v}");
    for (who, token) in [("the operator", admin.as_str()), ("a tenant", &tenant)] {
        let (s, v) = w.raw(Method::POST, path, Some(token), body.clone()).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{who}: {v}");
        assert_eq!(v["error"]["code"], "forbidden", "{who}: {v}");
    }
    let (s, v) = w
        .raw(Method::POST, path, Some("hk_not-a-real-key"), body.clone())
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    assert_eq!(
        w.status().await["proactive"]["used_mb"],
        0,
        "nothing was created"
    );

    // The cluster key may, for a function of any namespace.
    let (s, v) = w.raw(Method::POST, path, Some(CLUSTER_KEY), body).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["results"][0]["ok"], true, "{v}");
    assert_eq!(v["functions"]["team-a.f"]["active"], 1, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_and_malformed_batches_are_refused_whole() {
    let w = TestWorker::sim(1024, 512).await;
    w.register("f", sim_fn(16, 1)).await;
    let max = hearth_api::MAX_PROACTIVE_COMMANDS;
    let many: Vec<(&str, &str)> = vec![("soft-evict", "f"); max + 1];
    let (s, v) = w.proactive(&many).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(
        v["error"]["message"],
        format!("a batch holds at most {max} commands, got {}", max + 1)
    );
    // Exactly the limit is accepted (each finds nothing to do).
    let (s, v) = w.proactive(&many[..max]).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["results"].as_array().unwrap().len(), max);

    let big = vec![b' '; hearth_api::MAX_PROACTIVE_BODY_BYTES + 1];
    let (s, v) = w
        .raw(
            Method::POST,
            "/v1/cluster/proactive",
            Some(CLUSTER_KEY),
            big,
        )
        .await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    assert_eq!(v["error"]["code"], "payload_too_large");

    for bad in [
        json!({"commands": [{"op": "destroy", "function": "f"}]}),
        json!({"commands": [{"op": "create"}]}),
        json!({"orders": []}),
        json!({"commands": [{"op": "create", "function": "x".repeat(98)}]}),
    ] {
        let (s, v) = w
            .raw(
                Method::POST,
                "/v1/cluster/proactive",
                Some(CLUSTER_KEY),
                bad.to_string().into_bytes(),
            )
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {v}");
    }
    assert_eq!(w.status().await["proactive"]["used_mb"], 0);
}

/// Reads the next line of a streamed answer (frames are appended to `buf` until a newline).
async fn next_line(body: &mut axum::body::Body, buf: &mut Vec<u8>) -> Option<Value> {
    use http_body_util::BodyExt;
    loop {
        if let Some(at) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=at).collect();
            return Some(serde_json::from_slice(&line).unwrap());
        }
        let frame = body.frame().await?.unwrap();
        buf.extend_from_slice(&frame.into_data().unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_answer_confirms_each_create_when_it_is_up_not_with_the_slowest() {
    use tower_service::Service;
    let w = TestWorker::sim(1024, 512).await;
    w.register("slow", sim_fn(128, 3_000)).await;
    w.register("fast", sim_fn(128, 20)).await;
    let body = json!({"commands": [
        {"op": "create", "function": "slow"},
        {"op": "create", "function": "fast"},
        {"op": "soft-evict", "function": "nobody"},
    ]});
    let req = axum::http::Request::builder()
        .method(Method::POST)
        .uri("/v1/cluster/proactive")
        .header("content-type", "application/json")
        .header("accept", "application/x-ndjson")
        .header("authorization", format!("Bearer {CLUSTER_KEY}"))
        .body(axum::body::Body::from(body.to_string()))
        .unwrap();
    let resp = w.app.clone().call(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
    let mut body = resp.into_body();
    let mut buf = Vec::new();
    // First: every command applied, both creates under way.
    let first = next_line(&mut body, &mut buf).await.unwrap();
    let results = &first["results"];
    assert_eq!(
        results[0],
        json!({"ok": true, "still_starting": true}),
        "{first}"
    );
    assert_eq!(
        results[1],
        json!({"ok": true, "still_starting": true}),
        "{first}"
    );
    assert_eq!(results[2]["code"], "unknown_function", "{first}");
    assert_eq!(counts(&first, "slow"), (0, 0, 1), "{first}");
    // Then the fast one, while the slow one is still starting: it serves a call warm now.
    let line = next_line(&mut body, &mut buf).await.unwrap();
    assert_eq!(line, json!({"index": 1, "result": {"ok": true}}));
    let v = w.invoke("fast").await;
    assert_eq!(v["cold"], false, "{v}");
    let st = w.status().await;
    assert_eq!(st["functions"]["slow"]["proactive"]["starting"], 1, "{st}");
    // Then the slow one, and the end of the answer.
    let line = next_line(&mut body, &mut buf).await.unwrap();
    assert_eq!(line, json!({"index": 0, "result": {"ok": true}}));
    assert!(next_line(&mut body, &mut buf).await.is_none());
}
