//! ALPS from the command line: `hearth sim --cpu-sched`, `hearth bench alps` and the errors of
//! `hearth experiment alps`.

mod common;

use common::{failed, hearth, ok, p};
use hearth_loadgen::{read_results, Outcome};
use std::path::{Path, PathBuf};

/// A long (100 ms) and a short (10 ms) function, 1 ms apart, every 200 ms for 20 s.
fn trace(dir: &Path) -> PathBuf {
    let trace = dir.join("t.csv");
    let mut t = String::from("time_ms,function\n");
    for k in 0..100 {
        t.push_str(&format!("{},long\n{},short\n", k * 200, k * 200 + 1));
    }
    std::fs::write(&trace, t).unwrap();
    std::fs::write(
        dir.join("t.meta.csv"),
        "function,warm_ms,cold_ms,mem_mb\nlong,100,0,64\nshort,10,0,64\n",
    )
    .unwrap();
    trace
}

/// Mean exec (ms) of the short function's invocations under `sched`, and the output.
fn short_mean(dir: &Path, sched: &str) -> (f64, String) {
    let t = trace(dir);
    let out = dir.join(format!("{sched}.csv"));
    let text = ok(hearth(&[
        "sim",
        "--trace",
        p(&t),
        "-o",
        p(&out),
        "--workers",
        "1",
        "--cpus",
        "1",
        "--concurrency",
        "unlimited",
        "--cpu-sched",
        sched,
    ]));
    let rows = read_results(&out).unwrap();
    assert_eq!(rows.len(), 200);
    assert!(rows.iter().all(|r| r.outcome == Outcome::Ok));
    let short: Vec<u64> = rows
        .iter()
        .filter(|r| r.function == "short")
        .map(|r| r.exec_us.unwrap())
        .collect();
    let mean = short.iter().sum::<u64>() as f64 / short.len() as f64 / 1000.0;
    (mean, text)
}

#[test]
fn the_cpu_scheduler_is_chosen_on_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    // Processor sharing (the default): the short function shares the CPU from 1 ms, done in 20.
    let (ps, text) = short_mean(dir.path(), "ps");
    assert_eq!(ps, 20.0);
    assert!(!text.contains("context switches"), "{text}");
    // ALPS learns in its first 5 s window, then runs the short function first: 15.75 ms.
    let (alps, text) = short_mean(dir.path(), "alps");
    assert_eq!(alps, 15.75);
    assert!(text.contains("cpu alps: "), "{text}");
    assert!(text.contains("context switches"), "{text}");
    let (srpt, _) = short_mean(dir.path(), "srpt");
    assert_eq!(srpt, 10.0);
    let t = trace(dir.path());
    let err = failed(hearth(&["sim", "--trace", p(&t), "--cpu-sched", "rr"]));
    assert!(err.contains("ps, cfs, fifo, srpt, sfs or alps"), "{err}");
    let err = failed(hearth(&["sim", "--trace", p(&t), "--work-spread", "2"]));
    assert!(err.contains("spread"), "{err}");
}

#[test]
fn bench_alps_times_a_window() {
    let text = ok(hearth(&["bench", "alps", "--rounds", "1", "--json"]));
    let j: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert!(j["window"]["invocations"].as_u64().unwrap() > 500, "{j}");
    assert!(j["window"]["functions"].as_u64().unwrap() > 40, "{j}");
    assert!(j["window"]["train_ms"].as_f64().unwrap() > 0.0, "{j}");
    assert_eq!(j["sizes"].as_array().unwrap().len(), 6);
    let err = failed(hearth(&["bench", "alps", "--window-s", "31"]));
    assert!(err.contains("--window-s"), "{err}");
}

#[test]
fn experiment_alps_names_missing_traces() {
    let dir = tempfile::tempdir().unwrap();
    let err = failed(hearth(&[
        "experiment",
        "alps",
        "--quick",
        "--traces",
        "/nonexistent",
        "-o",
        p(dir.path()),
    ]));
    assert!(err.contains("--traces"), "{err}");
}
