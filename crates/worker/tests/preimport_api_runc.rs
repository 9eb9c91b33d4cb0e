//! Pre-imported generic sandboxes through the worker's API on runc (issue 32): the driver says
//! each function's layer to the engine, the engine keeps a pool per (runtime, layer), the driver
//! makes a layer's sandboxes with the layer mounted and its modules imported, and the answer
//! says which path each cold start took (`cold_path`).
//!
//! The function's `layer` is given in the registration here (the worker takes it as it comes
//! on this branch; with requirements builds it is the worker's own). Needs root and runc;
//! without them it says why and passes, unless `HEARTH_REQUIRE_RUNC=1`.

mod common;

use common::TestWorker;
use hearth_worker::layers::Layer;
use hearth_worker::BackendKind;
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const HANDLER: &str = "import slowpkg\n\ndef main(args):\n    return {'v': slowpkg.m9.V}\n";

/// A layer in `<data>/layers` whose package takes tens of ms to import (300 modules).
fn write_layer(data: &Path, hex: &str) -> String {
    let base = data.join("layers").join(hex);
    let pkg = base.join("site").join("slowpkg");
    std::fs::create_dir_all(&pkg).unwrap();
    let mut init = String::new();
    for i in 0..300 {
        init.push_str(&format!("from . import m{i}\n"));
        let body: String = (0..20)
            .map(|j| format!("def f{j}(x):\n    return x + {j}\n"))
            .collect();
        std::fs::write(pkg.join(format!("m{i}.py")), format!("V = {i}\n{body}")).unwrap();
    }
    std::fs::write(pkg.join("__init__.py"), init).unwrap();
    let digest = format!("sha256:{hex}");
    let layer = Layer {
        digest: digest.clone(),
        runtime_digest: format!("sha256:{}", "ab".repeat(32)),
        requirements: "slowpkg==1\n".into(),
        bytes: 1,
        modules: vec!["slowpkg".into()],
        site_dir: PathBuf::new(),
    };
    std::fs::write(base.join("layer.json"), serde_json::to_vec(&layer).unwrap()).unwrap();
    world_readable(&data.join("layers"));
    digest
}

fn world_readable(p: &Path) {
    let mode = if p.is_dir() { 0o755 } else { 0o644 };
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    if p.is_dir() {
        for e in std::fs::read_dir(p).unwrap() {
            world_readable(&e.unwrap().path());
        }
    }
}

/// Waits until the generic pools hold `ready` ready sandboxes.
async fn wait_ready(w: &TestWorker, ready: u64) -> Value {
    let start = Instant::now();
    loop {
        let st = w.status().await;
        if st["generic_pool"]["ready"].as_u64() >= Some(ready) {
            return st;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{st}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_of_a_layer_cold_starts_on_a_preimported_sandbox_of_its_layer() {
    if !common::runc_available(&[]) {
        return;
    }
    let w = TestWorker::start_backend(BackendKind::Runc, |c| {
        c.generic_pool = 4;
        c.generic_pool_min = 1;
    })
    .await;
    let digest = write_layer(&w.data_dir, &"5d".repeat(32));
    let hello = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../functions/hello/main.py"),
    )
    .unwrap();
    let layered = |name: &str| {
        json!({"code": {"files": {"main.py": HANDLER}}, "memory_mb": 192, "layer": digest,
               "name": name})
    };
    for f in ["np1", "np2", "np3"] {
        w.register(f, layered(f)).await;
    }
    w.register(
        "plain",
        json!({"code": {"files": {"main.py": hello}}, "memory_mb": 128}),
    )
    .await;
    wait_ready(&w, 1).await;

    // The first cold start of the layer finds no sandbox of its key: the bare one is not
    // taken (it has no layer), the function's sandbox is made from nothing.
    let v = w.invoke("np1").await;
    assert_eq!(
        (v["result"]["v"].clone(), v["cold_path"].clone()),
        (json!(9), json!("fresh")),
        "{v}"
    );
    // The layer's pool refills with a pre-imported sandbox (reserving the function's memory),
    // next to the bare one.
    let st = wait_ready(&w, 2).await;
    assert_eq!(st["generic_pool"]["keys"], 2, "{st}");
    let fresh_init = v["timing"]["init"].as_u64().unwrap();
    let v = w.invoke("np2").await;
    assert_eq!(
        (v["result"]["v"].clone(), v["cold_path"].clone()),
        (json!(9), json!("preimported")),
        "{v}"
    );
    // Its import was done before: only the specialization is left on the cold path.
    let pre_init = v["timing"]["init"].as_u64().unwrap();
    eprintln!("init: fresh {fresh_init} µs, pre-imported {pre_init} µs");
    assert!(
        pre_init * 2 < fresh_init,
        "pre-imported {pre_init} µs, fresh {fresh_init} µs"
    );
    // A function without a layer takes the bare one.
    let v = w.invoke("plain").await;
    assert_eq!(v["cold_path"], "generic", "{v}");
    // And a layer function again finds its key's pool refilled.
    wait_ready(&w, 2).await;
    let v = w.invoke("np3").await;
    assert_eq!(v["cold_path"], "preimported", "{v}");
    w.worker.shutdown(Duration::from_secs(5)).await;
}
