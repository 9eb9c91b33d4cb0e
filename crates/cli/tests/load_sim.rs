//! `hearth trace make`, `hearth load` and `hearth report` end to end against a sim worker.

mod common;

use common::{failed, hearth, ok, p, Server};
use hearth_loadgen::{read_results, Outcome};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Replays `trace` (its metadata beside it) on `s` with `hearth load trace -o out`; the rows.
fn replay(s: &Server, trace: &Path, out: &Path) -> Vec<hearth_loadgen::ResultRow> {
    ok(hearth(&[
        "load",
        "trace",
        p(trace),
        "--url",
        &s.url,
        "-o",
        p(out),
    ]));
    read_results(out).unwrap()
}

/// A trace of three functions, one invocation every 10 ms, and its metadata.
fn even_trace(dir: &Path) -> PathBuf {
    let trace = dir.join("even.csv");
    let mut t = String::from("time_ms,function\n");
    for i in 0..150 {
        t.push_str(&format!("{},{}\n", i * 10, ["fa", "fb", "fc"][i % 3]));
    }
    std::fs::write(&trace, t).unwrap();
    std::fs::write(
        dir.join("even.meta.csv"),
        "function,warm_ms,cold_ms,mem_mb\nfa,2,50,64\nfb,5,50,64\nfc,12,50,64\n",
    )
    .unwrap();
    trace
}

#[test]
fn an_open_loop_trace_gives_one_sensible_row_per_invocation() {
    let s = Server::start("sim", &[]);
    let dir = tempfile::tempdir().unwrap();
    let trace = even_trace(dir.path());
    let out = dir.path().join("res.csv");
    let text = ok(hearth(&[
        "load",
        "trace",
        p(&trace),
        "--url",
        &s.url,
        "--out",
        p(&out),
        "--prewarm",
    ]));
    assert!(text.contains("invocations"), "{text}");
    let mut rows = read_results(&out).unwrap();
    rows.sort_by_key(|r| r.id);
    assert_eq!(rows.len(), 150);
    let fns: BTreeSet<&str> = rows.iter().map(|r| r.function.as_str()).collect();
    assert_eq!(fns, BTreeSet::from(["fa", "fb", "fc"]));
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r.id, i as u64);
        assert_eq!(r.function, ["fa", "fb", "fc"][i % 3]);
        assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
        // Prewarmed, so even the first invocations are warm. Invocations of a function are 30 ms
        // apart and take ≤ 12 ms: a cold start can only come from a stalled sender overlapping
        // two of them.
        assert!(
            !r.cold || (i >= 3 && r.cold_reason == "concurrent"),
            "{r:?}"
        );
        // Sent on schedule, the trace's instants relative to the first.
        assert_eq!(r.scheduled_us - rows[0].scheduled_us, i as u64 * 10_000);
        assert!(r.sent_us >= r.scheduled_us);
        let warm_us = [2_000, 5_000, 12_000][i % 3];
        let exec = r.exec_us.unwrap();
        assert!(exec >= warm_us, "{r:?}");
        assert!(r.server_e2e_us.unwrap() >= exec);
        assert!(r.e2e_us >= r.server_e2e_us.unwrap(), "{r:?}");
        assert!(r.e2e_us < warm_us + 2_000_000, "{r:?}");
    }
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("res.summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["invocations"], 150);
    assert_eq!(summary["ok"], 150);
    // Stretch is against the metadata's warm times: e2e ≥ warm, so ≥ 1.
    assert!(summary["weighted_stretch"].as_f64().unwrap() >= 1.0);
}

#[test]
fn ctrl_c_stops_sending_and_keeps_every_answered_invocation() {
    let s = Server::start("sim", &[("HEARTH_CONCURRENCY", "64")]);
    let dir = tempfile::tempdir().unwrap();
    // 20 s of one function every 10 ms, each running 300 ms: about 30 in flight at any time.
    let trace = dir.path().join("long.csv");
    let mut t = String::from("time_ms,function\n");
    for i in 0..2000 {
        t.push_str(&format!("{},slowish\n", i * 10));
    }
    std::fs::write(&trace, t).unwrap();
    std::fs::write(
        dir.path().join("long.meta.csv"),
        "function,warm_ms,cold_ms,mem_mb\nslowish,300,0,16\n",
    )
    .unwrap();
    let out = dir.path().join("res.csv");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_hearth"))
        .env("HEARTH_API_KEY", s.key.as_deref().unwrap_or(""))
        .args([
            "load",
            "trace",
            p(&trace),
            "--url",
            &s.url,
            "--out",
            p(&out),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let invocations = || {
        s.client().get("/v1/functions/slowish").unwrap().json()["characteristics"]["invocations"]
            .as_u64()
            .unwrap_or(0)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while invocations() < 100 {
        assert!(
            std::time::Instant::now() < deadline,
            "the run never got going"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // SAFETY: signalling our own child, which has not been waited for.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let done = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert_eq!(done.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");

    let rows = read_results(&out).unwrap();
    let sent = invocations();
    assert!(
        rows.len() >= 100 && rows.len() < 2000,
        "stopped early: {} rows",
        rows.len()
    );
    assert_eq!(
        rows.len() as u64,
        sent,
        "every invocation the worker saw has its row"
    );
    assert!(
        rows.iter().all(|r| r.outcome == Outcome::Ok),
        "the ones in flight were awaited, not cut off"
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.with_extension("summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["interrupted"], true);
}

#[test]
fn refused_invocations_are_counted_as_dropped() {
    // Memory for one sandbox: the second invocation waits in the queue, which holds one, so the
    // third is refused.
    let s = Server::start(
        "sim",
        &[
            ("HEARTH_MEMORY_MB", "256"),
            ("HEARTH_FREE_BUFFER_MB", "0"),
            ("HEARTH_MAX_QUEUE", "1"),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.csv");
    std::fs::write(&trace, "time_ms,function\n0,big\n50,big\n100,big\n").unwrap();
    std::fs::write(
        dir.path().join("t.meta.csv"),
        "function,warm_ms,cold_ms,mem_mb\nbig,400,0,200\n",
    )
    .unwrap();
    let out = dir.path().join("r.csv");
    let mut rows = replay(&s, &trace, &out);
    rows.sort_by_key(|r| r.id);
    assert_eq!(rows[0].outcome, Outcome::Ok);
    assert_eq!(rows[1].outcome, Outcome::Ok);
    assert!(rows[1].queue_us.unwrap() > 200_000, "{:?}", rows[1]);
    assert_eq!((rows[2].outcome, rows[2].status), (Outcome::Dropped, 429));
    assert!(rows[2].error.contains("queue is full"), "{:?}", rows[2]);
}

#[test]
fn a_closed_loop_invokes_every_function_for_the_duration() {
    let s = Server::start("sim", &[]);
    let dir = tempfile::tempdir().unwrap();
    even_trace(dir.path());
    let out = dir.path().join("closed.csv");
    ok(hearth(&[
        "load",
        "closed",
        "--url",
        &s.url,
        "--clients",
        "2",
        "--duration",
        "600ms",
        "--function",
        "fa,fc",
        "--weights",
        "3,1",
        "--meta",
        p(&dir.path().join("even.meta.csv")),
        "-o",
        p(&out),
    ]));
    let rows = read_results(&out).unwrap();
    let n = |f: &str| rows.iter().filter(|r| r.function == f).count();
    // 2 clients × 600 ms of 2–12 ms invocations: dozens, mostly fa.
    assert!(rows.len() > 40, "{}", rows.len());
    assert!(
        n("fc") > 0 && n("fa") > n("fc"),
        "fa {} fc {}",
        n("fa"),
        n("fc")
    );
    assert!(rows
        .iter()
        .all(|r| r.outcome == Outcome::Ok && r.sent_us >= r.scheduled_us));
    // Nothing is sent after the duration.
    assert!(rows.iter().all(|r| r.scheduled_us < 600_000));
}

#[test]
fn bad_input_gets_a_clear_error() {
    let s = Server::start("sim", &[]);
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "time_ms,function\n0,fa\nlater,fb\n").unwrap();
    let err = failed(hearth(&["load", "trace", p(&bad), "--url", &s.url]));
    assert!(err.contains("bad.csv, line 3"), "{err}");
    let trace = even_trace(dir.path());
    std::fs::write(
        dir.path().join("even.meta.csv"),
        "function,warm_ms,cold_ms,mem_mb\nfa,2,50,64\n",
    )
    .unwrap();
    let err = failed(hearth(&["load", "trace", p(&trace), "--url", &s.url]));
    assert!(
        err.contains("function fb") && err.contains("even.meta.csv"),
        "{err}"
    );
    let err = failed(hearth(&[
        "load",
        "closed",
        "--url",
        &s.url,
        "--duration",
        "1s",
        "--function",
        "nope",
    ]));
    assert!(err.contains("unknown function nope"), "{err}");
    let err = failed(hearth(&["report", p(&trace)]));
    assert!(err.contains("not a results file"), "{err}");
}

/// Writes a three-function Azure 2019 sample in the in-vitro layout.
fn azure_sample(dir: &Path) -> PathBuf {
    let minutes: Vec<String> = (1..=3).map(|m| format!("minute_{m}")).collect();
    let mut inv = format!("HashFunction,HashOwner,HashApp,{}\n", minutes.join(","));
    inv.push_str("aaaa1111,aaaa1111,aaaa1111,4,0,2\n");
    inv.push_str("bbbb2222,bbbb2222,bbbb2222,1,1,1\n");
    inv.push_str("cccc3333,cccc3333,cccc3333,1,0,0\n");
    std::fs::write(dir.join("3_inv.csv"), inv).unwrap();
    std::fs::write(
        dir.join("3_run.csv"),
        "HashOwner,HashApp,HashFunction,Average,Count,Minimum,Maximum\n\
         x,x,aaaa1111,20,10,5.0,220.0\nx,x,bbbb2222,3,5,1.0,53.0\nx,x,cccc3333,9,1,9.0,9.0\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("3_mem.csv"),
        "HashOwner,HashApp,SampleCount,AverageAllocatedMb\n\
         aaaa1111,aaaa1111,9,150\nbbbb2222,bbbb2222,9,80\n",
    )
    .unwrap();
    dir.join("3_inv.csv")
}

#[test]
fn azure_data_becomes_a_trace_that_runs_and_reports_with_plots() {
    let dir = tempfile::tempdir().unwrap();
    let inv = azure_sample(dir.path());
    let trace = dir.path().join("az.csv");
    // 9 invocations over 3 minutes, compressed 1000× so the run takes ~0.2 s.
    let text = ok(hearth(&[
        "trace",
        "make",
        "azure",
        "--invocations",
        p(&inv),
        "--minutes",
        "3",
        "--time-scale",
        "0.001",
        "-o",
        p(&trace),
    ]));
    assert!(text.contains("2 functions, 9 invocations"), "{text}");
    let t = std::fs::read_to_string(&trace).unwrap();
    // Minute 1 of aaaa: 4 spread over the minute (×0.001: every 15 ms); bbbb once per minute.
    assert!(
        t.starts_with(
            "time_ms,function\n0.000,fn-aaaa1111\n0.000,fn-bbbb2222\n15.000,fn-aaaa1111\n"
        ),
        "{t}"
    );
    let meta = std::fs::read_to_string(dir.path().join("az.meta.csv")).unwrap();
    assert!(meta.contains("fn-aaaa1111,20.0,200.0,150.0,busy"), "{meta}");
    let s = Server::start("sim", &[]);
    let res = dir.path().join("az-res.csv");
    assert_eq!(replay(&s, &trace, &res).len(), 9);
    // A second run to compare against.
    let res2 = dir.path().join("az-res2.csv");
    ok(hearth(&[
        "load",
        "trace",
        p(&trace),
        "--url",
        &s.url,
        "-o",
        p(&res2),
        "--prewarm",
    ]));
    let plots = dir.path().join("plots");
    let text = ok(hearth(&[
        "report",
        p(&res),
        p(&res2),
        "--label",
        "cold",
        "--label",
        "prewarmed",
        "--meta",
        p(&dir.path().join("az.meta.csv")),
        "-o",
        p(&plots),
    ]));
    assert!(text.contains("weighted normalized latency"), "{text}");
    for f in [
        "latency_cdf.png",
        "latency_over_time.png",
        "breakdown-cold.png",
        "breakdown-prewarmed.png",
        "summary.json",
    ] {
        let bytes = std::fs::read(plots.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        if f.ends_with(".png") {
            assert!(
                bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 10_000,
                "{f}"
            );
        }
    }
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(plots.join("summary.json")).unwrap()).unwrap();
    // The first run meets each function cold at least once.
    assert!(summary[0]["cold"].as_u64().unwrap() >= 1, "{summary}");
    assert_eq!(summary[1]["label"], "prewarmed");
}

#[test]
fn atoll_workload_1_makes_files_that_parse_and_run_with_deadlines() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("atoll.csv");
    let make = |seed: &str, out: &Path| {
        ok(hearth(&[
            "trace",
            "make",
            "atoll",
            "--workload",
            "1",
            "--apps",
            "4",
            "--duration",
            "40ms",
            "--seed",
            seed,
            "-o",
            p(out),
        ]))
    };
    let text = make("3", &trace);
    assert!(text.contains("4 functions"), "{text}");
    let meta = hearth_loadgen::Metadata::read(&dir.path().join("atoll.meta.csv")).unwrap();
    let classes: BTreeSet<&str> = meta
        .functions
        .values()
        .map(|f| {
            assert!(f.deadline_ms.unwrap() > f.warm_ms, "{f:?}");
            f.class().unwrap()
        })
        .collect();
    assert_eq!(classes, BTreeSet::from(["C1", "C2", "C3", "C4"]));
    let t = hearth_loadgen::Trace::read(&trace).unwrap();
    assert!(!t.invocations.is_empty());
    // The same seed, the same files.
    let again = dir.path().join("again.csv");
    make("3", &again);
    assert_eq!(
        std::fs::read(&trace).unwrap(),
        std::fs::read(&again).unwrap()
    );
    // The functions register with their deadlines (whole ms) and the trace runs.
    let s = Server::start("sim", &[]);
    let res = dir.path().join("atoll-res.csv");
    assert_eq!(replay(&s, &trace, &res).len(), t.invocations.len());
    for (args, needle) in [
        (&["--workload", "4"][..], "--workload"),
        (&["--workload", "1", "--apps", "0"][..], "--apps"),
        (&["--workload", "1", "--duration=-5s"][..], "--duration"),
        (
            &["--workload", "1", "--duration", "0s"][..],
            "--duration must be positive",
        ),
        (&["--workload", "3"][..], "--invocations"),
    ] {
        let mut all = vec!["trace", "make", "atoll", "-o", p(&trace)];
        all.extend_from_slice(args);
        let err = failed(hearth(&all));
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}
