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
