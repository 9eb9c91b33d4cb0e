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

fn sim_args<'a>(trace: &'a Path, out: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["sim", "--trace", p(trace), "-o", p(out)];
    args.extend_from_slice(extra);
    args
}

fn sim(trace: &Path, out: &Path, extra: &[&str]) -> String {
    ok(hearth(&sim_args(trace, out, extra)))
}

/// A `hearth sim` that must fail: its error output.
fn sim_fails(trace: &Path, out: &Path, extra: &[&str]) -> String {
    failed(hearth(&sim_args(trace, out, extra)))
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
    let run = |extra: &[&str]| sim_fails(&t, &out, extra);
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

/// The most invocations in flight at once: +1 at each send, −1 at each end (ends first at a
/// tie, as a client's next call can leave the instant its last one ended).
fn most_in_flight(rows: &[hearth_loadgen::ResultRow]) -> usize {
    let mut events: Vec<(u64, i32)> = rows
        .iter()
        .flat_map(|r| [(r.scheduled_us, 1), (r.scheduled_us + r.e2e_us, -1)])
        .collect();
    events.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in events {
        now += d;
        most = most.max(now);
    }
    most as usize
}

/// The `simulated N invocations` count of a run's summary.
fn simulated(text: &str) -> usize {
    text.split("simulated ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no invocation count in {text}"))
}

#[test]
fn a_closed_loop_keeps_at_most_n_calls_in_flight_for_the_traces_span() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path());
    let out = dir.path().join("closed.csv");
    let base = ["--workers", "2", "--cpus", "1", "--memory", "1GiB"];
    let mut args = base.to_vec();
    args.extend([
        "--closed-loop",
        "3",
        "--think-min",
        "0s",
        "--think-max",
        "10ms",
    ]);
    let text = sim(&t, &out, &args);
    let n = simulated(&text);
    assert!(
        text.contains(&format!("completed {n}, dropped 0")),
        "{text}"
    );
    let rows = read_results(&out).unwrap();
    assert_eq!(rows.len(), n);
    // The clients, not the trace's 200 arrivals, made the calls: all three start at once and
    // never more than three are in flight.
    assert_eq!(most_in_flight(&rows), 3, "{text}");
    assert_eq!(rows.iter().filter(|r| r.scheduled_us == 0).count(), 3);
    // No call leaves after the trace's last arrival (995 ms), and both functions are picked.
    assert!(rows.iter().all(|r| r.scheduled_us <= 995_000));
    for f in ["fa", "fb"] {
        assert!(rows.iter().any(|r| r.function == f), "{f} never called");
    }
    // Each client's calls take at least the shortest e2e plus the shortest think time (0 here),
    // so three clients make at most 3 × span ÷ min e2e (+ the calls in flight at the end).
    let min_e2e = rows.iter().map(|r| r.e2e_us).min().unwrap();
    assert!(min_e2e >= 4_000, "fa's warm time is 4 ms: {min_e2e}");
    assert!(n <= 3 * (995_000 / min_e2e as usize + 1), "{n} calls");
    ok(hearth(&["report", p(&out), "--no-plots"]));

    // One client with a fixed 50 ms think time: each call leaves exactly 50 ms after the
    // previous one ended.
    let one = dir.path().join("one.csv");
    let mut args = base.to_vec();
    args.extend([
        "--closed-loop",
        "1",
        "--think-min",
        "50ms",
        "--think-max",
        "50ms",
    ]);
    sim(&t, &one, &args);
    let mut rows = read_results(&one).unwrap();
    rows.sort_by_key(|r| r.scheduled_us);
    assert!(rows.len() > 5, "{} calls", rows.len());
    assert_eq!(most_in_flight(&rows), 1);
    for w in rows.windows(2) {
        assert_eq!(
            w[1].scheduled_us,
            w[0].scheduled_us + w[0].e2e_us + 50_000,
            "{w:?}"
        );
    }
}

#[test]
fn a_longer_think_time_makes_fewer_calls() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path());
    let run = |name: &str, think_min: &str, think_max: &str| {
        let out = dir.path().join(name);
        let text = sim(
            &t,
            &out,
            &[
                "--workers",
                "2",
                "--closed-loop",
                "4",
                "--think-min",
                think_min,
                "--think-max",
                think_max,
            ],
        );
        let n = simulated(&text);
        assert_eq!(read_results(&out).unwrap().len(), n);
        n
    };
    let eager = run("eager.csv", "0s", "0s");
    let slow = run("slow.csv", "100ms", "200ms");
    assert!(
        slow < eager,
        "{slow} calls thinking 100–200 ms, {eager} without"
    );
    // Each of the 4 clients waits at least 100 ms between calls over the 995 ms span.
    assert!(slow <= 4 * (995 / 100 + 1), "{slow} calls");
    assert!(slow >= 4, "every client calls at least once: {slow}");
}

#[test]
fn bad_closed_loop_values_get_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path());
    let out = dir.path().join("o.csv");
    let run = |extra: &[&str]| sim_fails(&t, &out, extra);
    for clients in ["0", "100001"] {
        let err = run(&["--closed-loop", clients]);
        assert!(
            err.contains("--closed-loop must be between 1 and 100000 clients"),
            "{clients}: {err}"
        );
    }
    let err = run(&["--closed-loop", "many"]);
    assert!(err.contains("--closed-loop"), "{err}");
    let err = run(&[
        "--closed-loop",
        "2",
        "--think-min",
        "2s",
        "--think-max",
        "1s",
    ]);
    assert!(
        err.contains("--think-min (2s) must not be longer than --think-max (1s)"),
        "{err}"
    );
    let err = run(&["--closed-loop", "2", "--think-max", "2days"]);
    assert!(err.contains("think time") && err.contains("a day"), "{err}");
    // A think time without a closed loop would be ignored: it is refused instead.
    let err = run(&["--think-max", "2s"]);
    assert!(err.contains("--closed-loop"), "{err}");
    assert!(
        std::fs::metadata(&out).is_err(),
        "a refused run writes no results"
    );
}
