//! `hearth provision`: the memory a trace needs (target hit ratio and knee), as text and JSON,
//! and errors that name the problem without echoing paths or file contents.

mod common;

use common::{failed, hearth, ok, p};
use std::path::{Path, PathBuf};

/// Four hot functions of 64 MiB in turn, and a 1 GiB one every 40 invocations: 256 MiB keeps
/// the hot set warm (the knee); the big one needs 1280 MiB.
fn trace(dir: &Path) -> PathBuf {
    let trace = dir.join("t.csv");
    let mut t = String::from("time_ms,function\n");
    let mut ms = 0;
    for i in 0..400 {
        if i % 40 == 39 {
            t.push_str(&format!("{ms},big\n"));
            ms += 10;
        }
        t.push_str(&format!("{ms},{}\n", ["fa", "fb", "fc", "fd"][i % 4]));
        ms += 10;
    }
    std::fs::write(&trace, t).unwrap();
    std::fs::write(
        dir.join("t.meta.csv"),
        "function,warm_ms,cold_ms,mem_mb\nfa,4,30,64\nfb,4,30,64\nfc,4,30,64\nfd,4,30,64\nbig,50,500,1024\n",
    )
    .unwrap();
    trace
}

#[test]
fn provision_prints_the_target_size_the_knee_and_a_table() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path());
    // The hot set hits except right after a big invocation: 359 of 410.
    let text = ok(hearth(&[
        "provision",
        "--trace",
        p(&t),
        "--target-hit-ratio",
        "0.85",
    ]));
    assert!(text.contains("410 invocations of 5 functions"), "{text}");
    assert!(text.contains("target hit ratio 0.85: 256 MiB"), "{text}");
    assert!(text.contains("knee: 256 MiB"), "{text}");
    assert!(text.contains("memory (MiB)  hit ratio"), "{text}");

    let out = hearth(&[
        "provision",
        "--trace",
        p(&t),
        "--target-hit-ratio",
        "0.95",
        "--json",
    ]);
    assert!(out.status.success());
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // 5 compulsory misses of 410; the hot set misses after each big invocation; only 1280 MiB
    // keeps everything.
    assert_eq!(j["compulsory_misses"], 5);
    assert_eq!(j["target_mb"], 1280);
    assert_eq!(j["knee"]["memory_mb"], 256);
    assert_eq!(j["max_useful_mb"], 1280);
    let best = j["max_hit_ratio"].as_f64().unwrap();
    assert!((best - 405.0 / 410.0).abs() < 1e-9, "{best}");
    let table = j["table"].as_array().unwrap();
    let sizes: Vec<u64> = table
        .iter()
        .map(|r| r["memory_mb"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [64, 128, 256, 512, 1024, 1280, 2048]);
    let at = |mb: u64| {
        table[sizes.iter().position(|s| *s == mb).unwrap()]["hit_ratio"]
            .as_f64()
            .unwrap()
    };
    assert_eq!(at(64), 0.0);
    assert!((at(256) - 359.0 / 410.0).abs() < 1e-9, "{table:?}");
    assert_eq!(at(1024), at(256));

    // Out of reach: the first invocations always miss.
    let text = ok(hearth(&[
        "provision",
        "--trace",
        p(&t),
        "--target-hit-ratio",
        "1",
    ]));
    assert!(text.contains("out of reach"), "{text}");
}

#[test]
fn provision_refuses_bad_input_without_echoing_it() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path());
    for (flag, v) in [
        ("--target-hit-ratio", "1.5"),
        ("--target-hit-ratio", "0"),
        ("--sample-rate", "-1"),
        ("--sample-rate", "nan"),
    ] {
        let arg = format!("{flag}={v}");
        let err = failed(hearth(&["provision", "--trace", p(&t), &arg]));
        assert!(err.contains(flag), "{flag} {v}: {err}");
    }
    let missing = dir.path().join("secret-dir").join("nope.csv");
    let err = failed(hearth(&["provision", "--trace", p(&missing)]));
    assert!(err.contains("trace file cannot be read"), "{err}");
    assert!(!err.contains("secret-dir"), "{err}");

    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "time_ms,function\n0,fa\n-5,TOPSECRET\n").unwrap();
    std::fs::copy(
        dir.path().join("t.meta.csv"),
        dir.path().join("bad.meta.csv"),
    )
    .unwrap();
    let err = failed(hearth(&["provision", "--trace", p(&bad)]));
    assert!(err.contains("invalid row at line 3"), "{err}");
    assert!(
        !err.contains("TOPSECRET") && !err.contains(p(dir.path())),
        "{err}"
    );

    let unknown = dir.path().join("u.csv");
    std::fs::write(&unknown, "time_ms,function\n0,fa\n1,other\n").unwrap();
    std::fs::copy(dir.path().join("t.meta.csv"), dir.path().join("u.meta.csv")).unwrap();
    let err = failed(hearth(&["provision", "--trace", p(&unknown)]));
    assert!(err.contains("1 invocations are of functions"), "{err}");
    assert!(!err.contains("other"), "{err}");
}
