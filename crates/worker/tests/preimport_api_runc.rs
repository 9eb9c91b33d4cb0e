//! Pre-imported generic sandboxes through the worker's API on runc (issue 32): the driver says
//! each function's layer to the engine, the engine keeps a pool per (runtime, layer), the driver
//! makes a layer's sandboxes with the layer mounted and its modules imported, and the answer
//! says which path each cold start took (`cold_path`).
//!
//! The function's layer is built by the worker from its `requirements.txt`, out of a wheel this
//! test makes (no network). Needs root, runc and the default runtime image; without root and
//! runc it says why and passes, unless `HEARTH_REQUIRE_RUNC=1`.

mod common;

use axum::http::Method;
use common::TestWorker;
use hearth_worker::BackendKind;
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

const HANDLER: &str = "import slowpkg\n\ndef main(args):\n    return {'v': slowpkg.m9.V}\n";

/// A wheel in `dir` of a package that takes tens of ms to import (300 modules), written with
/// Python's zipfile as any wheel is.
fn write_wheel(dir: &Path) {
    let script = r#"
import sys, zipfile
path = sys.argv[1]
di = "slowpkg-1.0.dist-info"
with zipfile.ZipFile(path, "w") as z:
    init = "".join("from . import m%d\n" % i for i in range(300))
    z.writestr("slowpkg/__init__.py", init)
    body = "".join("def f%d(x):\n    return x + %d\n" % (j, j) for j in range(20))
    for i in range(300):
        z.writestr("slowpkg/m%d.py" % i, "V = %d\n%s" % (i, body))
    z.writestr(di + "/METADATA", "Metadata-Version: 2.1\nName: slowpkg\nVersion: 1.0\n")
    z.writestr(di + "/WHEEL", "Wheel-Version: 1.0\nGenerator: hearth-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    z.writestr(di + "/top_level.txt", "slowpkg\n")
    z.writestr(di + "/RECORD", "")
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(dir.join("slowpkg-1.0-py3-none-any.whl"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits until `name` is no longer building; panics unless it is ready.
async fn wait_built(w: &TestWorker, name: &str) {
    let start = Instant::now();
    loop {
        let (_, v) = w
            .call(Method::GET, &format!("/v1/functions/{name}"), json!({}))
            .await;
        match v["state"].as_str() {
            Some("ready") => return,
            Some("building") => {}
            _ => panic!("{v}"),
        }
        assert!(start.elapsed() < Duration::from_secs(120), "{v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
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
    let wheels = tempfile::tempdir().unwrap();
    write_wheel(wheels.path());
    let links = wheels.path().to_path_buf();
    let w = TestWorker::start_backend(BackendKind::Runc, |c| {
        c.generic_pool = 4;
        c.generic_pool_min = 1;
        c.build.find_links = vec![links];
    })
    .await;
    let hello = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../functions/hello/main.py"),
    )
    .unwrap();
    let layered = |name: &str| {
        json!({"code": {"files": {"main.py": HANDLER, "requirements.txt": "slowpkg==1.0\n"}},
               "memory_mb": 192, "name": name})
    };
    for f in ["np1", "np2", "np3"] {
        w.register(f, layered(f)).await;
        wait_built(&w, f).await;
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
