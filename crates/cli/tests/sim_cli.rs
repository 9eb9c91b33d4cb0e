//! `hearth sim` and `hearth experiment` from the command line: a run that `hearth report`
//! reads, the fidelity comparison, and clear errors for bad input.

mod common;

use common::{failed, hearth, ok, p};
use hearth_loadgen::{read_results, Outcome};
use std::path::{Path, PathBuf};

/// Two functions, 200 invocations 5 ms apart, and their metadata.
fn trace(dir: &Path) -> PathBuf {
    let trace = dir.join("t.csv");
    let mut t = String::from("time_ms,function\n");
    for i in 0..200 {
        t.push_str(&format!("{},{}\n", i * 5, ["fa", "fb"][i % 2]));
    }
    std::fs::write(&trace, t).unwrap();
    std::fs::write(
        dir.join("t.meta.csv"),
        "function,warm_ms,cold_ms,mem_mb\nfa,4,30,64\nfb,20,100,128\n",
    )
    .unwrap();
    trace
}

fn sim(trace: &Path, out: &Path, extra: &[&str]) -> String {
    let mut args = vec!["sim", "--trace", p(trace), "-o", p(out)];
    args.extend_from_slice(extra);
    ok(hearth(&args))
}

#[test]
fn a_simulated_run_writes_results_that_report_and_fidelity_read() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path());
    let out = dir.path().join("sim.csv");
    let text = sim(
        &t,
        &out,
        &[
            "--workers",
            "2",
            "--cpus",
            "1",
            "--memory",
            "1GiB",
            "--concurrency",
            "4",
        ],
    );
    assert!(
        text.contains("simulated 200 invocations of 2 functions"),
        "{text}"
    );
    assert!(text.contains("completed 200, dropped 0"), "{text}");
    let rows = read_results(&out).unwrap();
    assert_eq!(rows.len(), 200);
    assert!(rows
        .iter()
        .all(|r| r.outcome == Outcome::Ok && r.sent_us == r.scheduled_us));
    assert!(rows.iter().any(|r| r.cold), "first invocations are cold");
    // One CPU per worker, up to four invocations sharing it: some executions stretch.
    assert!(
        rows.iter().any(|r| r.exec_us.unwrap() > 20_000),
        "processor sharing"
    );
    ok(hearth(&["report", p(&out), "--no-plots"]));

    // The same trace with a tiny queue: some are dropped, and still every one ends once.
    let tight = dir.path().join("tight.csv");
    let text = sim(
        &t,
        &tight,
        &[
            "--workers",
            "1",
            "--cpus",
            "1",
            "--max-queue",
            "1",
            "--concurrency",
            "1",
        ],
    );
    let rows = read_results(&tight).unwrap();
    let dropped = rows
        .iter()
        .filter(|r| r.outcome == Outcome::Dropped)
        .count();
    assert!(dropped > 0, "{text}");
    assert!(rows
        .iter()
        .filter(|r| r.outcome == Outcome::Dropped)
        .all(|r| r.error.starts_with("queue_full")));

    let fid = dir.path().join("fidelity");
    let text = ok(hearth(&[
        "experiment",
        "fidelity",
        "--real",
        p(&out),
        "--sim",
        p(&tight),
        "--meta",
        p(&dir.path().join("t.meta.csv")),
        "-o",
        p(&fid),
    ]));
    assert!(text.contains("mean queue length"), "{text}");
    for f in [
        "results.md",
        "results.json",
        "fidelity_over_time.png",
        "fidelity_latency_cdf.png",
    ] {
        assert!(std::fs::metadata(fid.join(f)).unwrap().len() > 0, "{f}");
    }
}

#[test]
fn openwhisk_keeps_each_function_on_its_home_while_its_memory_slots_last() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path());
    let run = |memory: &str| {
        let out = dir.path().join(format!("ow-{memory}.csv"));
        let text = sim(
            &t,
            &out,
            &[
                "--workers",
                "4",
                "--memory",
                memory,
                "--free-buffer",
                "0",
                "--balance",
                "openwhisk",
            ],
        );
        assert!(text.contains("completed 200, dropped 0"), "{text}");
        let rows = read_results(&out).unwrap();
        let mut workers = std::collections::BTreeMap::new();
        for r in &rows {
            workers
                .entry(r.function.clone())
                .or_insert_with(std::collections::BTreeSet::new)
                .insert(r.worker.clone());
        }
        workers
    };
    // Plenty of memory: every invocation of a function on one worker (its home).
    let roomy = run("8GiB");
    assert!(roomy.values().all(|w| w.len() == 1), "{roomy:?}");
    // 200 MiB per worker: fb (128 MiB, 20 ms every 10 ms) has two in flight, and the second
    // does not fit its home's slots: it is probed onto the next worker.
    let tight = run("200MiB");
    assert!(tight["fb"].len() > 1, "{tight:?}");
}

#[test]
fn bad_input_gets_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path());
    let out = dir.path().join("o.csv");
    let run = |extra: &[&str]| {
        let mut args = vec!["sim", "--trace", p(&t), "-o", p(&out)];
        args.extend_from_slice(extra);
        failed(hearth(&args))
    };
    assert!(run(&["--memory", "lots"]).contains("size"));
    assert!(run(&["--workers", "0"]).contains("--workers must be at least 1"));
    let err = run(&["--balance", "fastest"]);
    assert!(err.contains("greedy") && err.contains("openwhisk"), "{err}");
    assert!(run(&["--concurrency", "many"]).contains("--concurrency"));
    assert!(run(&["--keepalive", "forever"]).contains("keep-alive policy"));
    assert!(run(&["--meta", "/nonexistent/m.csv"]).contains("/nonexistent/m.csv"));
    // A trace function with no metadata row; a malformed trace names its line.
    let meta = dir.path().join("t.meta.csv");
    let with_trace = |name: &str, text: &str| {
        let trace = dir.path().join(name);
        std::fs::write(&trace, text).unwrap();
        failed(hearth(&[
            "sim",
            "--trace",
            p(&trace),
            "--meta",
            p(&meta),
            "-o",
            p(&out),
        ]))
    };
    let err = with_trace("ghost.csv", "time_ms,function\n0,fa\n7.5,ghost\n");
    assert!(err.contains("\"ghost\"") && err.contains("no row"), "{err}");
    let err = with_trace("bad.csv", "time_ms,function\n0,fa\nsoon,fb\n");
    assert!(err.contains("bad.csv, line 3"), "{err}");
    assert!(failed(hearth(&["experiment", "fig12"])).contains("unknown experiment"));
    assert!(failed(hearth(&["experiment", "fidelity"])).contains("--real"));
    let err = failed(hearth(&[
        "experiment",
        "queue",
        "--traces",
        "/nonexistent",
        "-o",
        p(&out),
    ]));
    assert!(err.contains("--traces"), "{err}");
}

#[test]
fn a_generic_pool_makes_cold_starts_cheaper_not_fewer() {
    // 20 functions invoked once each, 500 ms apart, 100 ms of init: every invocation is cold.
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("g.csv");
    let mut t = String::from("time_ms,function\n");
    let mut meta = String::from("function,warm_ms,cold_ms,mem_mb\n");
    for i in 0..20 {
        t.push_str(&format!("{},g{i}\n", 1000 + i * 500));
        meta.push_str(&format!("g{i},5,100,128\n"));
    }
    std::fs::write(&trace, t).unwrap();
    std::fs::write(dir.path().join("g.meta.csv"), meta).unwrap();
    let run = |name: &str, extra: &[&str]| {
        let out = dir.path().join(name);
        let mut args = vec!["--workers", "1", "--memory", "4GiB"];
        args.extend_from_slice(extra);
        let text = sim(&trace, &out, &args);
        assert!(text.contains("completed 20, dropped 0, cold 20 "), "{text}");
        let rows = read_results(&out).unwrap();
        assert_eq!(rows.len(), 20);
        assert!(rows.iter().all(|r| r.cold));
        rows.iter()
            .map(|r| r.init_us.unwrap())
            .collect::<Vec<u64>>()
    };
    let off = run("off.csv", &[]);
    assert!(off.iter().all(|&i| i == 100_000), "{off:?}");
    let on = run("on.csv", &["--generic-pool", "2"]);
    // The pool is made at start and refilled in 40 ms, long before the next cold start: each
    // specializes a generic sandbox and pays 100 − 40 ms.
    assert!(on.iter().all(|&i| i == 60_000), "{on:?}");
    // The creation time is a flag: a longer one saves more.
    let slow = run(
        "slow.csv",
        &["--generic-pool", "2", "--generic-create", "70ms"],
    );
    assert!(slow.iter().all(|&i| i == 30_000), "{slow:?}");
}
