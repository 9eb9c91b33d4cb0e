//! FunctionBench, live (issue 32 §4): every function of `functions/functionbench/` registered
//! on a runc worker with its real libraries installed by Hearth from `requirements.txt` (from the
//! wheelhouse `scripts/wheelhouse.sh` fills; no network), invoked cold and warm, each answer
//! checked for the work it proves. The handlers' own results are checked in depth by
//! `functions/functionbench/tests` (pytest, Debian's python); this checks they run on Hearth.
//!
//! Needs root, runc, the default runtime image and the wheelhouse. Without root and runc it says
//! why and passes, unless `HEARTH_REQUIRE_RUNC=1`; without the wheelhouse it fails and says how
//! to make it.

mod common;

use common::cluster::wait_until;
use common::{runc_available, Server};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn functionbench_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../functions/functionbench")
}

/// What each function's answer must hold: a key and a check of its value.
fn proves(name: &str, r: &Value) -> bool {
    match name {
        "hello" => r["greeting"] == "Hello, FunctionBench!",
        "lin_pack" => r["normalized_residual"].as_f64().is_some_and(|x| x < 16.0),
        "model_training" | "cnn_image_classification" => {
            r["accuracy"].as_f64().is_some_and(|a| a >= 0.9)
        }
        "image_processing" => r["flip_is_involution"] == true,
        "video_processing" => {
            r["frames_read"].as_u64().is_some_and(|n| n > 0)
                && r["frames_read"] == r["frames_written"]
        }
        "chameleon" => r["cells"].as_u64().is_some_and(|c| c > 0),
        "dd" => r["written"].as_u64().is_some_and(|w| w > 0) && r["written"] == r["read"],
        "pyaes" | "json_dumps_loads" | "gzip_compression" => {
            r["sha256"].as_str().is_some_and(|h| h.len() == 64)
        }
        "float_operation" => r["result"].is_number(),
        _ => false,
    }
}

#[test]
fn every_functionbench_function_runs_on_hearth_with_its_libraries() {
    if !runc_available() {
        return;
    }
    let wheelhouse = Path::new("/var/cache/hearth/wheelhouse");
    assert!(
        wheelhouse.is_dir(),
        "no wheelhouse at {}: run scripts/wheelhouse.sh (scripts/setup.sh does)",
        wheelhouse.display()
    );
    let dir = functionbench_dir();
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(dir.join("functions.json")).unwrap()).unwrap();
    let s = Server::start(
        "runc",
        &[("HEARTH_MEMORY_MB", "4096"), ("HEARTH_GENERIC_POOL", "2")],
    );
    let functions = manifest.as_object().unwrap();
    assert_eq!(functions.len(), 12);
    for (name, f) in functions {
        let (code, _) = hearth_cli::code::pack(&dir.join(name)).unwrap();
        let spec = serde_json::json!({"code": code, "memory_mb": f["memory_mb"]});
        let r = s.put_fn(name, spec);
        assert!(r.status == 201 || r.status == 200, "{name}: {}", r.text());
    }
    for (name, f) in functions {
        let mut state = Value::Null;
        wait_until(
            &format!("{name} is built"),
            Duration::from_secs(300),
            || {
                state = s
                    .client()
                    .get(&format!("/v1/functions/{name}"))
                    .unwrap()
                    .json();
                state["state"] != "building"
            },
        );
        assert_eq!(state["state"], "ready", "{name}: {state}");
        let has_requirements = dir.join(name).join("requirements.txt").exists();
        assert_eq!(state.get("layer").is_some(), has_requirements, "{state}");
        let args = f["args"].to_string();
        for round in ["cold", "warm"] {
            let r = s.invoke(name, &args);
            assert_eq!(r.status, 200, "{name} ({round}): {}", r.text());
            let a: Value = r.json();
            assert_eq!(a["cold"], round == "cold", "{name}: {a}");
            assert!(proves(name, &a["result"]), "{name} ({round}): {a}");
        }
    }
}
