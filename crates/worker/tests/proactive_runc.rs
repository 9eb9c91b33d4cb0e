//! A proactive sandbox on runc is a real prewarmed sandbox: the invocation runs warm on it.
//!
//! Needs root and runc. Without them this test says why and passes, unless
//! `HEARTH_REQUIRE_RUNC=1` (set by scripts/test.sh, so CI never skips it silently).

mod common;

use common::TestWorker;
use hearth_worker::BackendKind;
use serde_json::json;
use std::path::Path;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_runs_warm_on_a_proactive_runc_sandbox() {
    if !common::runc_available(&[]) {
        return;
    }
    let w = TestWorker::start_backend(BackendKind::Runc, |c| {
        c.proactive_mb = 256;
        c.generic_pool = 0;
    })
    .await;
    let main = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../functions/hello/main.py"),
    )
    .unwrap();
    w.register(
        "hello",
        json!({"code": {"files": {"main.py": main}}, "memory_mb": 128}),
    )
    .await;
    let a = w.proactive_ok(&[("create", "hello")]).await;
    assert_eq!(a["results"][0], json!({"ok": true}), "{a}");
    assert_eq!(
        a["functions"]["hello"],
        json!({"active": 1, "soft": 0, "starting": 0})
    );
    let v = w.invoke("hello").await;
    assert_eq!(v["result"]["greeting"], "Hello, world!", "{v}");
    assert_eq!(v["cold"], false, "{v}");
    let st = w.status().await;
    assert_eq!(st["backend"], "runc");
    assert_eq!(st["functions"]["hello"]["warm"], 0, "{st}");
    assert_eq!(st["proactive"]["used_mb"], 128, "{st}");
    w.worker.shutdown(std::time::Duration::from_secs(5)).await;
}
