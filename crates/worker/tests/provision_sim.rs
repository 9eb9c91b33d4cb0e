//! Elastic provisioning on a live worker (sim backend): with `[provision] elastic = true` the
//! worker's own timer task feeds the core's controller and applies its sizes; a cut destroys
//! idle sandboxes only, and `GET /v1/status` and the metrics show the budget in force.

mod common;

use axum::http::{Method, StatusCode};
use common::{sim_fn, TestWorker};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_worker_shrinks_its_budget_evicting_idle_sandboxes_only() {
    let w = Arc::new(
        TestWorker::start_with(|c| {
            c.memory_mb = 2048;
            c.free_buffer_mb = 0;
            c.provision.elastic = true;
            c.provision.interval_s = 1;
            c.provision.target_miss_speed = 1.0;
            c.provision.smoothing = 1.0;
            c.provision.min_mb = 128;
        })
        .await,
    );
    for f in ["f", "g", "h"] {
        w.register(f, sim_fn(128, 10)).await;
    }
    w.register(
        "slow",
        json!({"sim_warm_ms": 2500, "sim_cold_ms": 10, "memory_mb": 128}),
    )
    .await;
    // A long invocation that may still run when the budget is cut: it must finish.
    let slow = {
        let w = Arc::clone(&w);
        tokio::spawn(async move {
            w.call(Method::POST, "/v1/functions/slow/invoke", json!({}))
                .await
        })
    };
    for f in ["f", "g", "h", "f", "g", "h"] {
        w.invoke(f).await;
    }
    assert_eq!(w.status().await["memory"]["budget_mb"], 2048);
    // Then nothing arrives: an interval without misses, and the controller cuts the budget to
    // its minimum (the online curve says the three functions need 384 MiB to stay warm).
    let start = Instant::now();
    let st: Value = loop {
        let st = w.status().await;
        if st["memory"]["budget_mb"] == 128 {
            break st;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "never shrank: {st}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (s, v): (StatusCode, Value) = slow.await.unwrap();
    assert_eq!(
        s,
        StatusCode::OK,
        "the running invocation was not spared: {v}"
    );
    // Idle sandboxes went until what is left fits: at most one 128 MiB sandbox stays warm.
    let st = if st["memory"]["running_mb"] == 0 {
        st
    } else {
        w.status().await
    };
    assert!(st["memory"]["warm_mb"].as_u64().unwrap() <= 128, "{st}");
    let warm: u64 = ["f", "g", "h", "slow"]
        .iter()
        .map(|f| st["functions"][f]["warm"].as_u64().unwrap_or(0))
        .sum();
    assert!(warm <= 1, "{st}");
    // The metric shows the budget in force.
    let (s, text) = w.call(Method::GET, "/metrics", Value::Null).await;
    assert_eq!(s, StatusCode::OK);
    let text = text["raw"].as_str().unwrap_or_default().to_string();
    assert!(
        text.lines()
            .any(|l| l.contains("pool_memory_budget_mb") && l.trim_end().ends_with(" 128")),
        "{text}"
    );
    // Invocations still run within the smaller budget.
    let v = w.invoke("f").await;
    assert!(v["cold"].is_boolean(), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_provision_settings_are_refused_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = common::config(hearth_worker::BackendKind::Sim, &tmp);
    c.provision.elastic = true;
    c.provision.min_mb = 4096;
    c.provision.max_mb = 1024;
    let err = c.check().unwrap_err().to_string();
    assert!(
        err.contains("[provision]") && err.contains("min 4096"),
        "{err}"
    );
    c.provision.min_mb = 128;
    c.provision.dead_band = 1.5;
    assert!(c.check().unwrap_err().to_string().contains("dead band"));
    c.provision.dead_band = 0.3;
    c.provision.sample_rate = 0.0;
    assert!(c.check().unwrap_err().to_string().contains("sample_rate"));
    // Off, the section is not checked (the defaults are valid anyway).
    c.provision.elastic = false;
    assert!(c.check().is_ok());
}
