//! GPU functions on a `sim` worker: registered only where a GPU can hold them (`[gpu]`), with
//! clear 4xx answers elsewhere, and the devices shown in the worker's status.

mod common;

use axum::http::{Method, StatusCode};
use common::TestWorker;
use hearth_worker::config::{GpuDevices, SimGpu};
use serde_json::{json, Value};

fn gpu_fn(gpu_memory_mb: u64) -> Value {
    json!({"device": "gpu", "gpu_memory_mb": gpu_memory_mb, "memory_mb": 128,
           "sim_gpu_warm_ms": 2, "sim_gpu_cold_ms": 5})
}

/// A sim worker whose GPUs are `sizes` (MiB); none at all for an empty list.
async fn worker_with_gpus(sizes: &[u64]) -> TestWorker {
    let sizes = sizes.to_vec();
    TestWorker::start_with(move |c| {
        if sizes.is_empty() {
            c.gpu.devices = GpuDevices::None;
        } else {
            c.gpu.devices = GpuDevices::Sim;
            c.gpu.sim = sizes
                .iter()
                .map(|&memory_mb| SimGpu { memory_mb })
                .collect();
        }
    })
    .await
}

#[tokio::test]
async fn a_gpu_function_is_refused_on_a_worker_without_a_gpu() {
    let w = worker_with_gpus(&[]).await;
    let (s, v) = w.call(Method::PUT, "/v1/functions/g", gpu_fn(1024)).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["code"], "no_gpu");
    assert_eq!(v["error"]["field"], "device");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("g has device \"gpu\" but this worker has no GPU (gpu.devices = \"none\")"),
        "{msg}"
    );
    let (s, _) = w.call(Method::GET, "/v1/functions/g", Value::Null).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "nothing was registered");
    // CPU and polymorphic functions run here (`any` on its CPU variant).
    w.register("c", json!({"sim_warm_ms": 1, "memory_mb": 64}))
        .await;
    w.register(
        "a",
        json!({"device": "any", "gpu_memory_mb": 1024, "sim_warm_ms": 1, "memory_mb": 64}),
    )
    .await;
    w.invoke("a").await;
    assert!(w.status().await.get("gpus").is_none());
}

#[tokio::test]
async fn a_gpu_function_is_accepted_and_runs_on_a_simulated_gpu() {
    let w = worker_with_gpus(&[16_384]).await;
    w.register("g", gpu_fn(16_384)).await;
    let v = w.invoke("g").await;
    assert_eq!(v["worker"], w.worker.id());
    let (s, v) = w.call(Method::GET, "/v1/functions/g", Value::Null).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        (v["device"].as_str(), v["gpu_memory_mb"].as_u64()),
        (Some("gpu"), Some(16_384))
    );
    let gpus = &w.status().await["gpus"];
    assert_eq!(
        gpus,
        &json!([{"index": 0, "name": "simulated", "uuid": "sim-0", "memory_mb": 16384}])
    );
    assert_eq!(w.worker.gpus().len(), 1);
}

#[tokio::test]
async fn gpu_memory_above_the_largest_device_is_refused_naming_its_memory() {
    let w = worker_with_gpus(&[8192, 16_384]).await;
    let (s, v) = w
        .call(Method::PUT, "/v1/functions/big", gpu_fn(16_385))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["code"], "no_gpu");
    assert_eq!(v["error"]["field"], "gpu_memory_mb");
    assert_eq!(v["error"]["max"], 16_384);
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("big needs gpu_memory_mb 16385 but this worker's largest GPU has 16384 MiB"),
        "{msg}"
    );
}

#[tokio::test]
async fn bad_gpu_fields_are_refused_naming_the_field() {
    let w = worker_with_gpus(&[16_384]).await;
    let cases = [
        (
            json!({"device": "tpu"}),
            r#"device must be one of "cpu", "gpu" or "any", got "tpu""#,
        ),
        (
            json!({"device": "gpu"}),
            "gpu_memory_mb must be between 1 and 196608, got 0",
        ),
        (
            json!({"device": "gpu", "gpu_memory_mb": 196_609}),
            "gpu_memory_mb must be between 1 and 196608",
        ),
        (
            json!({"gpu_memory_mb": 512}),
            "gpu_memory_mb applies to device",
        ),
        (
            json!({"device": "any", "gpu_memory_mb": 512, "sim_gpu_warm_ms": -1}),
            "sim_gpu_warm_ms must be between 0 and 3600000",
        ),
    ];
    for (body, needle) in cases {
        let (s, v) = w.call(Method::PUT, "/v1/functions/f", body.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{body}: {msg}");
    }
    // A long unknown device is cut in the answer.
    let long = "x".repeat(5000);
    let (s, v) = w
        .call(Method::PUT, "/v1/functions/f", json!({"device": long}))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(v["error"]["message"].as_str().unwrap().len() < 200, "{v}");
}

#[tokio::test]
async fn a_gpu_function_stored_earlier_is_refused_once_its_gpu_is_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let start = |devices: GpuDevices| {
        let mut c = common::config(hearth_worker::BackendKind::Sim, &tmp);
        c.gpu.devices = devices;
        if devices == GpuDevices::Sim {
            c.gpu.sim = vec![SimGpu { memory_mb: 16_384 }];
        }
        c.check().unwrap();
        let data_dir = c.data_dir.clone();
        async move {
            let worker = hearth_worker::Worker::start(c).await.unwrap();
            let app = hearth_worker::api::router(std::sync::Arc::clone(&worker));
            TestWorker::from_parts(worker, app, data_dir)
        }
    };
    let with_gpu = start(GpuDevices::Sim).await;
    with_gpu.register("g", gpu_fn(4096)).await;
    with_gpu.worker.begin_shutdown();
    drop(with_gpu);
    // The same data directory, now without GPUs: the function is still listed, but neither
    // runs nor prewarms.
    let without = start(GpuDevices::None).await;
    let (s, _) = without
        .call(Method::GET, "/v1/functions/g", Value::Null)
        .await;
    assert_eq!(s, StatusCode::OK);
    for path in [
        "/v1/functions/g/invoke",
        "/v1/functions/g/invoke?async=true",
    ] {
        let (s, v) = without.call(Method::POST, path, json!({})).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{path}: {v}");
        assert_eq!(v["error"]["code"], "no_gpu", "{path}: {v}");
    }
    let (s, v) = without
        .call(Method::POST, "/v1/functions/g/prewarm", json!({"count": 1}))
        .await;
    assert_eq!(
        (s, &v["error"]["code"]),
        (StatusCode::BAD_REQUEST, &json!("no_gpu")),
        "{v}"
    );
}

/// A sim worker with one 16 GiB GPU under `tweak`ed GPU scheduling.
async fn gpu_worker(
    tweak: impl FnOnce(&mut hearth_worker::config::GpuSettings) + Send + 'static,
) -> TestWorker {
    TestWorker::start_with(move |c| {
        c.gpu.devices = GpuDevices::Sim;
        c.gpu.sim = vec![SimGpu { memory_mb: 16_384 }];
        tweak(&mut c.gpu);
    })
    .await
}

async fn invoke_with(w: &TestWorker, name: &str, args: Value) -> (StatusCode, Value) {
    w.call(Method::POST, &format!("/v1/functions/{name}/invoke"), args)
        .await
}

#[tokio::test]
async fn gpu_invocations_start_cold_then_warm_and_show_in_status_and_metrics() {
    let w = gpu_worker(|_| {}).await;
    w.register(
        "g",
        json!({"device": "gpu", "gpu_memory_mb": 2048, "sim_gpu_warm_ms": 3, "sim_gpu_cold_ms": 40}),
    )
    .await;
    let first = w.invoke("g").await;
    assert_eq!(
        first["gpu"],
        json!({"index": 0, "start": "cold"}),
        "{first}"
    );
    assert_eq!(first["cold"], true);
    let init = first["timing"]["init"].as_u64().unwrap();
    assert!(
        (40_000..200_000).contains(&init),
        "the GPU sandbox's start: {first}"
    );
    // Seen once, the flow's TTL is 0: its memory went to the host, so the next call waits
    // for the prefetch (2 GiB at 12 GB/s); the one after that finds it on the device.
    let second = w.invoke("g").await;
    assert_eq!(
        second["gpu"],
        json!({"index": 0, "start": "host-warm"}),
        "{second}"
    );
    assert_eq!(second["cold"], false);
    assert!(
        second["timing"]["init"].as_u64().unwrap() >= 170_000,
        "{second}"
    );
    let third = w.invoke("g").await;
    assert_eq!(
        third["gpu"],
        json!({"index": 0, "start": "warm"}),
        "{third}"
    );
    assert_eq!(third["timing"]["init"], 0);
    assert!(
        third["timing"]["exec"].as_u64().unwrap() >= 3_000,
        "{third}"
    );
    let st = w.status().await;
    let sched = &st["gpu_scheduler"];
    assert_eq!(sched["policy"], "mqfq-sticky", "{st}");
    assert_eq!(sched["counters"]["dispatched_cold"], 1);
    assert_eq!(sched["counters"]["dispatched_host_warm"], 1);
    assert_eq!(sched["counters"]["dispatched_warm"], 1);
    let flow = &sched["flows"][0];
    assert_eq!(flow["function"], "g");
    assert!(flow["vt"].as_f64().unwrap() > 0.0, "{flow}");
    assert_eq!(sched["gpus"][0]["memory_resident_mb"], 2048, "{sched}");
    let (s, body) = w
        .raw(Method::GET, "/metrics", w.admin.as_deref(), Vec::new())
        .await;
    assert_eq!(s, StatusCode::OK);
    let text = body["raw"].as_str().unwrap_or_default().to_string();
    assert!(
        text.contains("hearth_gpu_invocations_total{gpu=\"0\",start=\"cold\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("hearth_gpu_memory_resident_mb{gpu=\"0\"} 2048"),
        "{text}"
    );
}

#[tokio::test]
async fn a_crashed_or_leaking_gpu_sandbox_is_discarded_and_the_device_serves_the_next_call() {
    let w = gpu_worker(|_| {}).await;
    w.register(
        "g",
        json!({"device": "gpu", "gpu_memory_mb": 1024, "sim_gpu_warm_ms": 1, "sim_gpu_cold_ms": 2}),
    )
    .await;
    w.invoke("g").await;
    let (s, v) = invoke_with(&w, "g", json!({"hearth_sim_gpu": {"crash": true}})).await;
    assert_eq!(s, StatusCode::BAD_GATEWAY, "{v}");
    assert_eq!(v["error"]["code"], "sandbox_crashed");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("lost its CUDA context"), "{msg}");
    let next = w.invoke("g").await;
    assert_eq!(
        next["gpu"]["start"], "cold",
        "the crashed sandbox is gone: {next}"
    );
    // A leak the device can hold is accounted; one it cannot ends the sandbox.
    let (s, v) = invoke_with(&w, "g", json!({"hearth_sim_gpu": {"leak_mb": 1000}})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let st = w.status().await;
    assert_eq!(
        st["gpu_scheduler"]["gpus"][0]["memory_resident_mb"], 2024,
        "{st}"
    );
    let (s, v) = invoke_with(&w, "g", json!({"hearth_sim_gpu": {"leak_mb": 20000}})).await;
    assert_eq!(s, StatusCode::BAD_GATEWAY, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("ran out of device memory"),
        "{v}"
    );
    let st = w.status().await;
    assert_eq!(
        st["gpu_scheduler"]["gpus"][0]["memory_resident_mb"], 0,
        "{st}"
    );
    assert_eq!(st["gpu_scheduler"]["counters"]["failed"], 2);
    let next = w.invoke("g").await;
    assert_eq!(next["gpu"]["start"], "cold", "{next}");
}

#[tokio::test]
async fn with_d_one_a_second_gpu_invocation_waits_for_the_first() {
    let w = std::sync::Arc::new(
        gpu_worker(|g| {
            g.scheduler.d = 1;
            g.scheduler.d_max = 1;
            g.scheduler.dynamic_d = false;
        })
        .await,
    );
    for f in ["a", "b"] {
        w.register(
            f,
            json!({"device": "gpu", "gpu_memory_mb": 512, "sim_gpu_warm_ms": 150, "sim_gpu_cold_ms": 1}),
        )
        .await;
    }
    let (w1, w2) = (w.clone(), w.clone());
    let a = tokio::spawn(async move { w1.invoke("a").await });
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    let b = tokio::spawn(async move { w2.invoke("b").await });
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    assert_eq!(a["timing"]["queue"], 0, "{a}");
    let queued = b["timing"]["queue"].as_u64().unwrap();
    assert!(queued >= 80_000, "b waited for a's token: {b}");
}

#[tokio::test]
async fn a_gpu_queue_over_its_bound_answers_429() {
    let w = std::sync::Arc::new(
        gpu_worker(|g| {
            g.scheduler.d = 1;
            g.scheduler.d_max = 1;
            g.scheduler.dynamic_d = false;
            g.scheduler.max_queue = 1;
        })
        .await,
    );
    w.register(
        "g",
        json!({"device": "gpu", "gpu_memory_mb": 512, "sim_gpu_warm_ms": 300, "sim_gpu_cold_ms": 1}),
    )
    .await;
    let (w1, w2) = (w.clone(), w.clone());
    let running = tokio::spawn(async move { w1.invoke("g").await });
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    let queued = tokio::spawn(async move { w2.invoke("g").await });
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    let (s, v) = invoke_with(&w, "g", json!({})).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(v["error"]["code"], "queue_full");
    running.await.unwrap();
    queued.await.unwrap();
}

#[tokio::test]
async fn an_any_function_goes_where_its_speedup_says() {
    let w = gpu_worker(|_| {}).await;
    // 40× faster on the GPU, and 1× (no gain): after one run on each side, the first stays on
    // the GPU and the second on the CPU.
    w.register(
        "fast",
        json!({"device": "any", "gpu_memory_mb": 512, "sim_warm_ms": 40, "sim_gpu_warm_ms": 1}),
    )
    .await;
    w.register(
        "flat",
        json!({"device": "any", "gpu_memory_mb": 512, "sim_warm_ms": 2, "sim_gpu_warm_ms": 2}),
    )
    .await;
    let on_gpu = |v: &Value| v.get("gpu").is_some();
    for f in ["fast", "flat"] {
        let mut sides = Vec::new();
        for _ in 0..2 {
            sides.push(on_gpu(&w.invoke(f).await));
        }
        assert!(
            sides.contains(&true) && sides.contains(&false),
            "{f} explores both: {sides:?}"
        );
    }
    for _ in 0..3 {
        assert!(on_gpu(&w.invoke("fast").await), "fast runs on the GPU");
        assert!(!on_gpu(&w.invoke("flat").await), "flat runs on the CPU");
    }
}

#[tokio::test]
async fn prewarming_a_gpu_function_is_refused_and_makes_no_cpu_sandbox() {
    let w = gpu_worker(|_| {}).await;
    w.register("g", gpu_fn(1024)).await;
    let (s, v) = w
        .call(Method::POST, "/v1/functions/g/prewarm", json!({"count": 2}))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("runs on a GPU"), "{msg}");
    assert_eq!(
        w.status().await["memory"]["warm_mb"],
        0,
        "no CPU sandbox was made"
    );
}

#[tokio::test]
async fn an_any_function_too_large_for_every_gpu_runs_on_the_cpu() {
    let w = gpu_worker(|_| {}).await;
    w.register(
        "big",
        json!({"device": "any", "gpu_memory_mb": 20000, "sim_warm_ms": 1, "sim_gpu_warm_ms": 1}),
    )
    .await;
    for _ in 0..3 {
        let v = w.invoke("big").await;
        assert!(v.get("gpu").is_none(), "ran on the CPU: {v}");
    }
}

#[tokio::test]
async fn a_gpu_invocation_past_its_deadline_says_so_and_is_counted() {
    let w = gpu_worker(|_| {}).await;
    w.register(
        "d",
        json!({"device": "gpu", "gpu_memory_mb": 256, "sim_gpu_warm_ms": 20,
               "sim_gpu_cold_ms": 1, "deadline_ms": 5}),
    )
    .await;
    let v = w.invoke("d").await;
    assert_eq!(v["deadline_missed"], true, "{v}");
    let (_, body) = w
        .raw(Method::GET, "/metrics", w.admin.as_deref(), Vec::new())
        .await;
    let text = body["raw"].as_str().unwrap_or_default();
    assert!(
        text.contains("hearth_deadlines_missed_total{function=\"d\"} 1"),
        "{text}"
    );
}
