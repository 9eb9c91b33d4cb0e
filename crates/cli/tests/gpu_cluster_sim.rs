//! GPU functions through a controller (real processes, `sim` workers): a `device: gpu` function
//! runs only on workers that report a GPU large enough, and without one the controller says so.

mod common;

use common::cluster::{answering_workers, join, sim_fn, wait_members};
use common::Server;
use serde_json::json;

fn gpu_fn(gpu_memory_mb: u64) -> serde_json::Value {
    json!({"device": "gpu", "gpu_memory_mb": gpu_memory_mb, "memory_mb": 64,
           "sim_gpu_warm_ms": 1, "sim_gpu_cold_ms": 2})
}

const NO_GPU: &[(&str, &str)] = &[("HEARTH_GPU__DEVICES", "none")];
const ONE_GPU: &[(&str, &str)] = &[
    ("HEARTH_GPU__DEVICES", "sim"),
    ("HEARTH_GPU__SIM", "[{memory_mb=16384}]"),
];

#[test]
fn a_gpu_function_runs_only_on_the_worker_with_a_gpu() {
    // Round-robin alternates between the workers: only the GPU restriction keeps `g` on one.
    let c = Server::start_controller("round-robin", &[]);
    let cpu = join(&c, None, NO_GPU);
    let gpu = join(&c, None, ONE_GPU);
    let gpu_id = gpu.worker_id();
    wait_members(&c, &[cpu.worker_id(), gpu_id.clone()]);
    let r = c.put_fn("g", gpu_fn(16_384));
    assert_eq!(r.status, 201, "{}", r.text());
    for _ in 0..6 {
        let r = c.invoke("g", "{}");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["worker"], gpu_id.as_str());
    }
    assert_eq!(
        cpu.client().get("/v1/functions/g").unwrap().status,
        404,
        "never registered on the worker without a GPU"
    );
    // CPU functions still go everywhere.
    assert_eq!(c.put_fn("f", sim_fn(0, 0)).status, 201);
    let used: std::collections::BTreeSet<String> =
        answering_workers(&c, "f", 4).into_iter().collect();
    assert_eq!(used.len(), 2, "{used:?}");
    // The controller shows which worker has which GPUs.
    let workers = c.status()["workers"].clone();
    let with_gpu: Vec<_> = workers
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w.get("gpus").is_some())
        .collect();
    assert_eq!(with_gpu.len(), 1, "{workers}");
    assert_eq!(with_gpu[0]["worker"], gpu_id.as_str());
    assert_eq!(with_gpu[0]["gpus"][0]["memory_mb"], 16_384);
    // More GPU memory than any live worker's GPU has is refused at registration.
    let r = c.put_fn("huge", gpu_fn(16_385));
    assert_eq!(r.status, 400, "{}", r.text());
    let e = &r.json()["error"];
    assert_eq!(
        (e["code"].as_str(), e["max"].as_u64()),
        (Some("no_gpu"), Some(16_384))
    );
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("the largest is 16384 MiB"),
        "{e}"
    );
}

#[test]
fn without_a_gpu_worker_the_controller_answers_no_gpu() {
    let c = Server::start_controller("round-robin", &[]);
    let cpu = join(&c, None, NO_GPU);
    wait_members(&c, &[cpu.worker_id()]);
    // Accepted (a GPU worker may join later), but not run anywhere.
    let r = c.put_fn("g", gpu_fn(1024));
    assert_eq!(r.status, 201, "{}", r.text());
    let r = c.invoke("g", "{}");
    assert_eq!(r.status, 503, "{}", r.text());
    let e = &r.json()["error"];
    assert_eq!(e["code"], "no_gpu");
    assert_eq!(e["field"], "device");
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains(
            "g has device \"gpu\" and needs gpu_memory_mb 1024, but no live worker has a GPU"
        ),
        "{msg}"
    );
    assert_eq!(cpu.client().get("/v1/functions/g").unwrap().status, 404);
    // `any` runs on the CPU worker.
    let r = c.put_fn(
        "a",
        json!({"device": "any", "gpu_memory_mb": 1024, "memory_mb": 64, "sim_warm_ms": 1}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(c.invoke("a", "{}").status, 200);
}

#[test]
fn fn_register_takes_the_device_and_gpu_memory() {
    let w = Server::start("sim", ONE_GPU);
    let out = common::hearth(&[
        "fn",
        "register",
        "g",
        "--url",
        &w.url,
        "--device",
        "gpu",
        "--gpu-memory",
        "8192",
        "--sim-gpu-warm-ms",
        "3",
        "--sim-gpu-cold-ms",
        "50",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = w.client().get("/v1/functions/g").unwrap().json();
    assert_eq!(
        (v["device"].as_str(), v["gpu_memory_mb"].as_u64()),
        (Some("gpu"), Some(8192))
    );
    assert_eq!(
        (v["sim_gpu_warm_ms"].as_f64(), v["sim_gpu_cold_ms"].as_f64()),
        (Some(3.0), Some(50.0))
    );
    // An unknown device is refused before anything is sent, naming the accepted ones.
    let out = common::hearth(&["fn", "register", "t", "--url", &w.url, "--device", "tpu"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(r#"one of "cpu", "gpu" or "any", got "tpu""#),
        "{err}"
    );
    // Too much GPU memory for this worker: its answer, with the device's memory.
    let out = common::hearth(&[
        "fn",
        "register",
        "big",
        "--url",
        &w.url,
        "--device",
        "gpu",
        "--gpu-memory",
        "20000",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "400 no_gpu: big needs gpu_memory_mb 20000 but this worker's largest GPU has 16384 MiB"
        ),
        "{err}"
    );
}
