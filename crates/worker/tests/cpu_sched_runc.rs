//! CPU scheduling of real runc sandboxes (`cpu_sched` sfs/alps, docs/alps-backend.md): boosts
//! and demotions land in the sandboxes' cgroups, spinning functions can starve neither the
//! worker nor each other past their slice, a function cannot raise its own priority or touch
//! another sandbox, and a killed worker leaves nothing raised behind.
//!
//! Needs root and runc. Without them each test says why and passes, unless
//! `HEARTH_REQUIRE_RUNC=1` (set by scripts/test.sh, so CI never skips them silently).
//! `measure_short_function_beside_spinners` is a measurement, run on demand:
//! `cargo test -p hearth-worker --release --test cpu_sched_runc -- --ignored --nocapture measure`.

mod common;

use axum::http::{Method, StatusCode};
use common::TestWorker;
use hearth_worker::config::CpuSchedKind;
use hearth_worker::{BackendKind, Worker, WorkerConfig};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// CPU scheduling needs cgroup v1 `cpu` with `cpu.idle`.
const CPU_IDLE: &str = "/sys/fs/cgroup/cpu/cpu.idle";

/// One test at a time: their spinners would compete for the same two CPUs.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Kills and removes what a test's worker leaves behind when an assertion fails before its
/// shutdown (sandboxes, cgroups, mounts), so that a failure does not leave spinners running.
struct Reaper {
    id: String,
    data_dir: PathBuf,
}

impl Drop for Reaper {
    fn drop(&mut self) {
        let live = sandboxes(&self.id);
        for c in &live {
            let cg = |ctl: &str| {
                Path::new("/sys/fs/cgroup")
                    .join(ctl)
                    .join("hearth")
                    .join(&self.id)
                    .join(c)
            };
            let _ = std::fs::write(cg("freezer").join("freezer.state"), "THAWED");
            let procs =
                std::fs::read_to_string(cg("pids").join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        if !live.is_empty() {
            std::thread::sleep(Duration::from_millis(300));
        }
        if let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") {
            for h in hierarchies.flatten() {
                let parent = h.path().join("hearth").join(&self.id);
                if let Ok(children) = std::fs::read_dir(&parent) {
                    for c in children.flatten().filter(|c| c.path().is_dir()) {
                        let _ = std::fs::remove_dir(c.path());
                    }
                }
                let _ = std::fs::remove_dir(&parent);
            }
        }
        if let Ok(bundles) = std::fs::read_dir(self.data_dir.join("sandboxes")) {
            for b in bundles.flatten() {
                for m in ["run", "code"] {
                    if let Ok(p) =
                        std::ffi::CString::new(b.path().join(m).to_string_lossy().as_bytes())
                    {
                        unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) };
                    }
                }
            }
        }
    }
}

/// A worker id of its own per test (they run in parallel in one process).
fn worker_id() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "cs{}x{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn function_source(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../functions/{name}/main.py")),
    )
    .unwrap()
}

fn settings(c: &mut WorkerConfig, id: &str, kind: CpuSchedKind, slice_ms: u64) {
    c.worker_id = Some(id.to_string());
    c.cpu_sched = kind;
    c.sfs_slice_ms = slice_ms;
    c.generic_pool = 0;
    c.concurrency = hearth_worker::config::Concurrency::Limit(8);
}

/// A runc worker with `id` and its reaper (dropped first, declared after it).
async fn runc_worker(id: &str, kind: CpuSchedKind, slice_ms: u64) -> (Arc<TestWorker>, Reaper) {
    let w = TestWorker::start_backend(BackendKind::Runc, |c| settings(c, id, kind, slice_ms)).await;
    let reaper = Reaper {
        id: id.to_string(),
        data_dir: w.data_dir.clone(),
    };
    (Arc::new(w), reaper)
}

/// `busy` spins on the CPU for `ms` of wall time; registered with a long timeout.
async fn register_spinner(w: &TestWorker, cpus: f64) {
    w.register(
        "spin",
        json!({"code": {"files": {"main.py": function_source("busy")}},
               "memory_mb": 64, "cpus": cpus, "timeout_ms": 120_000}),
    )
    .await;
}

/// Starts `n` invocations of `spin` that spin for ten minutes (aborted by the test).
fn start_spinners(w: &Arc<TestWorker>, n: usize) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let w = Arc::clone(w);
            tokio::spawn(async move {
                let _ = w
                    .call(
                        Method::POST,
                        "/v1/functions/spin/invoke",
                        json!({"ms": 600_000}),
                    )
                    .await;
            })
        })
        .collect()
}

fn cpu_dir(worker: &str) -> PathBuf {
    Path::new("/sys/fs/cgroup/cpu/hearth").join(worker)
}

/// The worker's sandbox containers (their cgroup directory names).
fn sandboxes(worker: &str) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(cpu_dir(worker)) else {
        return Vec::new();
    };
    let mut v: Vec<String> = rd
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("hearth-"))
        .collect();
    v.sort();
    v
}

fn cg(worker: &str, container: &str, file: &str) -> String {
    std::fs::read_to_string(cpu_dir(worker).join(container).join(file))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Host ids of every task (thread) in a sandbox.
fn tasks(worker: &str, container: &str) -> Vec<i32> {
    cg(worker, container, "tasks")
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// A task's scheduling policy and nice value, from /proc/<pid>/task/<tid>/stat.
fn sched_of(tid: i32) -> Option<(u32, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{tid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 3.. after the comm: nice is field 19, policy field 41 (proc(5)).
    Some((f.get(41 - 3)?.parse().ok()?, f.get(19 - 3)?.parse().ok()?))
}

/// CPU time a sandbox has used, ns.
fn usage(worker: &str, container: &str) -> u64 {
    std::fs::read_to_string(
        Path::new("/sys/fs/cgroup/cpuacct/hearth")
            .join(worker)
            .join(container)
            .join("cpuacct.usage"),
    )
    .ok()
    .and_then(|s| s.trim().parse().ok())
    .unwrap_or(0)
}

async fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of a metric line `name{labels} value` (or `name value`).
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
}

async fn metrics(w: &TestWorker) -> String {
    let (s, v) = w.call(Method::GET, "/metrics", Value::Null).await;
    assert_eq!(s, StatusCode::OK);
    v["raw"].as_str().unwrap_or_default().to_string()
}

const SCHED_OTHER: u32 = 0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_answers_while_boosted_sandboxes_spin_on_every_cpu() {
    if !common::runc_available(&[CPU_IDLE]) {
        return;
    }
    let _serial = SERIAL.lock().await;
    let id = worker_id();
    // A slice of 10 s of CPU: the spinners stay boosted for the whole test.
    let (w, _reaper) = runc_worker(&id, CpuSchedKind::Sfs, 10_000).await;
    register_spinner(&w, 2.0).await;
    w.register(
        "fo",
        json!({"code": {"files": {"main.py": function_source("float_operation")}},
               "memory_mb": 64, "timeout_ms": 60_000}),
    )
    .await;
    w.invoke("fo").await;
    let fo = sandboxes(&id);
    let spinners = start_spinners(&w, 3);
    let spinning = || -> Vec<String> {
        sandboxes(&id)
            .into_iter()
            .filter(|c| !fo.contains(c))
            .collect()
    };
    wait_until(
        "three spinners run boosted",
        Duration::from_secs(60),
        || {
            let sb = spinning();
            sb.len() == 3
                && sb
                    .iter()
                    .all(|c| cg(&id, c, "cpu.idle") == "0" && usage(&id, c) > 0)
        },
    )
    .await;
    // The worst a frontend could ask: the highest weight the kernel allows, on every spinner.
    let set_shares = |v: &str| {
        for c in spinning() {
            std::fs::write(cpu_dir(&id).join(&c).join("cpu.shares"), v).unwrap();
        }
    };
    set_shares("262144");
    for _ in 0..5 {
        let st = tokio::time::timeout(Duration::from_secs(10), w.status())
            .await
            .expect("the worker's status must answer while sandboxes spin");
        assert_eq!(st["backend"], "runc");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // At the neutral rank (what the enforcer wrote), a warm short function shares the CPUs
    // with the spinners and finishes.
    set_shares("1024");
    let (s, v) = tokio::time::timeout(
        Duration::from_secs(30),
        w.call(
            Method::POST,
            "/v1/functions/fo/invoke",
            json!({"n": 20_000}),
        ),
    )
    .await
    .expect("a short invocation must finish while sandboxes spin");
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["cold"], false, "{v}");
    // No task of any sandbox holds a raised policy or nice value: the boost is the cgroup's.
    for c in sandboxes(&id) {
        for t in tasks(&id, &c) {
            if let Some((policy, nice)) = sched_of(t) {
                assert_eq!(policy, SCHED_OTHER, "task {t} of {c}");
                assert!(nice >= 0, "task {t} of {c} has nice {nice}");
            }
        }
        assert_eq!(cg(&id, &c, "cpu.rt_runtime_us"), "0", "{c}");
    }
    for h in spinners {
        h.abort();
        let _ = h.await;
    }
    w.worker.shutdown(Duration::from_secs(5)).await;
    assert!(sandboxes(&id).is_empty(), "shutdown removes every sandbox");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spinning_invocations_are_demoted_once_their_slice_is_used() {
    if !common::runc_available(&[CPU_IDLE]) {
        return;
    }
    let _serial = SERIAL.lock().await;
    let id = worker_id();
    let (w, _reaper) = runc_worker(&id, CpuSchedKind::Sfs, 20).await;
    register_spinner(&w, 1.0).await;
    let spinners = start_spinners(&w, 2);
    // Both run (CPU time grows) yet sit demoted: their 20 ms slices are long used up.
    wait_until("both spinners are demoted", Duration::from_secs(60), || {
        let sb = sandboxes(&id);
        sb.len() == 2
            && sb
                .iter()
                .all(|c| cg(&id, c, "cpu.idle") == "1" && usage(&id, c) > 20_000_000)
    })
    .await;
    let m = metrics(&w).await;
    assert!(
        metric(&m, "hearth_cpu_sched_slices_expired_total").unwrap_or(0.0) >= 2.0,
        "{m}"
    );
    assert!(metric(&m, "hearth_cpu_sched_boosts_total").unwrap_or(0.0) >= 2.0);
    let before: Vec<u64> = sandboxes(&id).iter().map(|c| usage(&id, c)).collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after: Vec<u64> = sandboxes(&id).iter().map(|c| usage(&id, c)).collect();
    assert!(
        before.iter().zip(&after).all(|(b, a)| a > b),
        "demoted sandboxes keep running when no boosted one wants the CPU: {before:?} {after:?}"
    );
    for h in spinners {
        h.abort();
        let _ = h.await;
    }
    w.worker.shutdown(Duration::from_secs(5)).await;
}

/// Tries what a function might to get ahead: real-time policies, a negative nice value, and
/// lowering every process of its uid; forks a child that spins on after the answer.
const GREEDY: &str = r#"
import errno
import os


def attempt(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))


def main(args):
    out = {
        "fifo": attempt(lambda: os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))),
        "rr": attempt(lambda: os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(99))),
        "nice": attempt(lambda: os.setpriority(os.PRIO_PROCESS, 0, -5)),
        "user": attempt(lambda: os.setpriority(os.PRIO_USER, os.getuid(), 19)),
    }
    pid = os.fork()
    if pid == 0:
        while True:
            pass
    out["child"] = pid
    return out
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_cannot_raise_its_priority_or_lower_another_sandbox() {
    if !common::runc_available(&[CPU_IDLE]) {
        return;
    }
    let _serial = SERIAL.lock().await;
    let id = worker_id();
    let (w, _reaper) = runc_worker(&id, CpuSchedKind::Sfs, 50).await;
    w.register(
        "victim",
        json!({"code": {"files": {"main.py": function_source("hello")}}, "memory_mb": 64}),
    )
    .await;
    w.invoke("victim").await;
    let victim = sandboxes(&id);
    assert_eq!(victim.len(), 1);
    w.register(
        "greedy",
        json!({"code": {"files": {"main.py": GREEDY}}, "memory_mb": 64}),
    )
    .await;
    let v = w.invoke("greedy").await;
    let r = &v["result"];
    // No capabilities and RLIMIT_RTPRIO 0: nothing raises; lowering one's own is allowed.
    assert_eq!(r["fifo"], "EPERM", "{v}");
    assert_eq!(r["rr"], "EPERM", "{v}");
    assert_eq!(r["nice"], "EACCES", "{v}");
    assert_eq!(r["user"], "ok", "{v}");
    let greedy: Vec<String> = sandboxes(&id)
        .into_iter()
        .filter(|c| !victim.contains(c))
        .collect();
    assert_eq!(greedy.len(), 1);
    let g = &greedy[0];
    // The answer ended the boost: the sandbox, forked spinner included, is demoted.
    wait_until(
        "the greedy sandbox is demoted",
        Duration::from_secs(10),
        || cg(&id, g, "cpu.idle") == "1",
    )
    .await;
    let spinning = tasks(&id, g);
    assert!(spinning.len() >= 2, "the agent and its forked child");
    for t in &spinning {
        if let Some((policy, nice)) = sched_of(*t) {
            assert_eq!(policy, SCHED_OTHER, "task {t}");
            assert_eq!(nice, 19, "PRIO_USER reached its own sandbox's task {t}");
        }
    }
    // ... and no further: the other sandbox's tasks (same uid, other PID namespace) keep 0.
    for t in tasks(&id, &victim[0]) {
        if let Some((policy, nice)) = sched_of(t) {
            assert_eq!((policy, nice), (SCHED_OTHER, 0), "victim task {t}");
        }
    }
    // The victim still answers (the spinner is idle-class beside it).
    let v = w.invoke("victim").await;
    assert_eq!(v["result"]["greeting"], "Hello, world!", "{v}");
    w.worker.shutdown(Duration::from_secs(5)).await;
}

/// Spins `n` iterations and says how much CPU time the handler used (its process's clock).
const SELF_TIMED: &str = r#"
import time


def main(args):
    start = time.process_time()
    acc = 0.0
    for i in range(int(args.get("n", 300000))):
        acc += i * 0.5
    return {"cpu_us": int((time.process_time() - start) * 1e6), "acc": acc}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_time_is_measured_per_invocation_and_cfs_touches_nothing() {
    if !common::runc_available(&[CPU_IDLE]) {
        return;
    }
    let _serial = SERIAL.lock().await;
    let spec = json!({"code": {"files": {"main.py": SELF_TIMED}}, "memory_mb": 64});
    let id = worker_id();
    let (w, _reaper) = runc_worker(&id, CpuSchedKind::Sfs, 50).await;
    w.register("timed", spec.clone()).await;
    let mut handler_us = 0.0;
    for _ in 0..3 {
        let v = w.invoke("timed").await;
        handler_us += v["result"]["cpu_us"].as_f64().unwrap();
    }
    let count = "hearth_invocation_cpu_seconds_count{function=\"timed\"}";
    // Recorded by the enforcer thread moments after each answer.
    let start = Instant::now();
    let m = loop {
        let m = metrics(&w).await;
        if metric(&m, count) == Some(3.0) {
            break m;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{m}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let cpu_us = metric(&m, "hearth_invocation_cpu_seconds_sum{function=\"timed\"}").unwrap() * 1e6;
    // The sandbox's CPU time holds the handler's own, plus the agent's work around it (reading
    // the request, JSON, the answer): a few milliseconds per call at most.
    assert!(
        cpu_us > 0.9 * handler_us && cpu_us < handler_us + 3.0 * 20_000.0,
        "sandbox cpu {cpu_us} µs against the handler's own {handler_us} µs"
    );
    w.worker.shutdown(Duration::from_secs(5)).await;

    // cfs: no intervention at all.
    let id = worker_id();
    let (w, _reaper) = runc_worker(&id, CpuSchedKind::Cfs, 50).await;
    w.register("timed", spec).await;
    w.invoke("timed").await;
    let sb = sandboxes(&id);
    assert_eq!(sb.len(), 1);
    assert_eq!(cg(&id, &sb[0], "cpu.idle"), "0");
    assert_eq!(cg(&id, &sb[0], "cpu.shares"), "1024");
    let m = metrics(&w).await;
    assert_eq!(metric(&m, "hearth_cpu_sched_boosts_total"), Some(0.0));
    assert_eq!(metric(&m, "hearth_cpu_sched_usage_reads_total"), Some(0.0));
    assert_eq!(metric(&m, count), None);
    w.worker.shutdown(Duration::from_secs(5)).await;
}

/// Where the crash test's child worker keeps its data (the environment variable's value).
const CHILD_ENV: &str = "HEARTH_CPU_SCHED_TEST_CHILD";

fn crash_config(data_dir: &Path, id: &str) -> WorkerConfig {
    let mut c = WorkerConfig {
        listen: "127.0.0.1:0".into(),
        data_dir: data_dir.to_path_buf(),
        backend: BackendKind::Runc,
        memory_mb: 1024,
        auth: false,
        low_latency: false,
        ..WorkerConfig::default()
    };
    settings(&mut c, id, CpuSchedKind::Sfs, 10_000);
    c
}

/// Not a test of its own: the worker that `a_killed_worker_leaves_nothing_raised_and_a_restart_
/// cleans_up` starts in a child process and kills while a sandbox spins boosted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the crash test in a child process"]
async fn child_worker_for_the_crash_test() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (data_dir, id) = dir.rsplit_once(':').unwrap();
    let data_dir = PathBuf::from(data_dir);
    let worker = Worker::start(crash_config(&data_dir, id)).await.unwrap();
    let app = hearth_worker::api::router(Arc::clone(&worker));
    let w = Arc::new(TestWorker::from_parts(worker, app, data_dir.clone()));
    register_spinner(&w, 1.0).await;
    let _spinner = start_spinners(&w, 1);
    wait_until("the spinner runs boosted", Duration::from_secs(60), || {
        let sb = sandboxes(id);
        sb.len() == 1 && cg(id, &sb[0], "cpu.idle") == "0" && usage(id, &sb[0]) > 0
    })
    .await;
    std::fs::write(data_dir.join("ready"), sandboxes(id)[0].as_bytes()).unwrap();
    // Killed by the parent long before this.
    tokio::time::sleep(Duration::from_secs(120)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_leaves_nothing_raised_and_a_restart_cleans_up() {
    if !common::runc_available(&[CPU_IDLE]) {
        return;
    }
    let tmp = tempfile::Builder::new()
        .prefix("hearth-cpu-sched-crash-")
        .tempdir()
        .unwrap();
    let _serial = SERIAL.lock().await;
    let data_dir = tmp.path().join("data");
    let id = worker_id();
    let _reaper = Reaper {
        id: id.clone(),
        data_dir: data_dir.clone(),
    };
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "child_worker_for_the_crash_test",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_ENV, format!("{}:{id}", data_dir.display()))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Killed on every way out, a failed assertion included.
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = KillOnDrop(child);
    let ready = data_dir.join("ready");
    wait_until("the child's spinner runs", Duration::from_secs(90), || {
        ready.exists() || child.0.try_wait().ok().flatten().is_some()
    })
    .await;
    let container = std::fs::read_to_string(&ready).expect("the child worker got ready");
    // SIGKILL: no cleanup of any kind runs in the worker.
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let orphans = tasks(&id, &container);
    assert!(!orphans.is_empty(), "the sandbox outlives its worker");
    for t in &orphans {
        if let Some((policy, nice)) = sched_of(*t) {
            assert_eq!((policy, nice), (SCHED_OTHER, 0), "orphaned task {t}");
        }
    }
    // What stays raised is the sandbox's weight among its siblings, inside a tree that weighs
    // as one default group against every other process, and without real-time budget.
    assert_eq!(cg(&id, &container, "cpu.rt_runtime_us"), "0");
    let tree = std::fs::read_to_string("/sys/fs/cgroup/cpu/hearth/cpu.shares").unwrap();
    assert_eq!(tree.trim(), "1024");
    // A restart on the same data directory removes the old sandbox, cgroups and all.
    let worker = Worker::start(crash_config(&data_dir, &id)).await.unwrap();
    assert!(
        !cpu_dir(&id).join(&container).exists(),
        "the restart removed the old sandbox's cgroup"
    );
    for t in &orphans {
        // Gone, or a zombie until init reaps it.
        let state = std::fs::read_to_string(format!("/proc/{t}/stat")).unwrap_or_default();
        let state = state.rsplit_once(") ").map(|(_, r)| &r[..1]);
        assert!(
            matches!(state, None | Some("Z") | Some("X")),
            "orphaned task {t} was killed ({state:?})"
        );
    }
    worker.shutdown(Duration::from_secs(5)).await;
}

/// A setting of the measurement from the environment.
fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// CPU time (user + system, clock ticks) of this process's thread named `name`.
fn thread_ticks(name: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
        .filter(|s| s.contains(&format!("({name})")))
        .filter_map(|s| {
            let f: Vec<&str> = s.rsplit_once(") ")?.1.split_whitespace().collect();
            Some(f.get(14 - 3)?.parse::<u64>().ok()? + f.get(15 - 3)?.parse::<u64>().ok()?)
        })
        .sum()
}

/// Measurement, not a test: a short CPU-bound function's latency alone and beside spinning
/// functions under cfs and sfs. Prints a table. `HEARTH_MEASURE_N` calls (30) of
/// float_operation with `HEARTH_MEASURE_WORK` iterations (20000), beside
/// `HEARTH_MEASURE_SPINNERS` spinners (4), slice `HEARTH_MEASURE_SLICE_MS` (the default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement (minutes); run with --ignored --nocapture"]
async fn measure_short_function_beside_spinners() {
    if !common::runc_available(&[CPU_IDLE]) {
        return;
    }
    let _serial = SERIAL.lock().await;
    let n: usize = env_or("HEARTH_MEASURE_N", 30);
    let work: u64 = env_or("HEARTH_MEASURE_WORK", 20_000);
    let spinners: usize = env_or("HEARTH_MEASURE_SPINNERS", 4);
    let slice_ms: u64 = env_or(
        "HEARTH_MEASURE_SLICE_MS",
        hearth_worker::cpu_sched::DEFAULT_SFS_SLICE_MS,
    );
    println!(
        "# float_operation n={work}, {n} calls one after another (20 ms apart), beside \
         {spinners} spinning `busy` (1 CPU each); sfs slice {slice_ms} ms; times in ms"
    );
    println!(
        "{:<6} {:<9} {:>8} {:>8} {:>8} {:>9}",
        "sched", "spinners", "e2e p50", "e2e p90", "e2e max", "exec p50"
    );
    for kind in [CpuSchedKind::Cfs, CpuSchedKind::Sfs] {
        let id = worker_id();
        let (w, _reaper) = runc_worker(&id, kind, slice_ms).await;
        register_spinner(&w, 1.0).await;
        w.register(
            "fo",
            json!({"code": {"files": {"main.py": function_source("float_operation")}},
                   "memory_mb": 64}),
        )
        .await;
        w.invoke("fo").await;
        let enforcer_before = thread_ticks("hearth-cpu-sche");
        let started = Instant::now();
        for with in [0, spinners] {
            let handles = start_spinners(&w, with);
            if with > 0 {
                wait_until("the spinners run", Duration::from_secs(60), || {
                    sandboxes(&id)
                        .iter()
                        .filter(|c| usage(&id, c) > 100_000_000)
                        .count()
                        >= with
                })
                .await;
            }
            let (mut e2e, mut exec) = (Vec::new(), Vec::new());
            for _ in 0..n {
                let v = w.invoke_with("fo", json!({ "n": work })).await;
                e2e.push(v["timing"]["e2e"].as_u64().unwrap());
                exec.push(v["timing"]["exec"].as_u64().unwrap());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            e2e.sort_unstable();
            exec.sort_unstable();
            let p = |v: &[u64], q: usize| v[(v.len() - 1) * q / 100] as f64 / 1000.0;
            println!(
                "{:<6} {:<9} {:>8.1} {:>8.1} {:>8.1} {:>9.1}",
                kind.as_str(),
                with,
                p(&e2e, 50),
                p(&e2e, 90),
                p(&e2e, 100),
                p(&exec, 50)
            );
            for h in handles {
                h.abort();
                let _ = h.await;
            }
        }
        if kind != CpuSchedKind::Cfs {
            let m = metrics(&w).await;
            let get = |k: &str| metric(&m, k).unwrap_or(0.0);
            let expired = get("hearth_cpu_slice_overshoot_seconds_count");
            let ticks = thread_ticks("hearth-cpu-sche").saturating_sub(enforcer_before);
            println!(
                "  {} boosts, {} expired (overshoot mean {:.0} µs), {} cgroup writes, {} usage \
                 reads; enforcer thread CPU {:.0} ms over {:.1} s",
                get("hearth_cpu_sched_boosts_total"),
                get("hearth_cpu_sched_slices_expired_total"),
                get("hearth_cpu_slice_overshoot_seconds_sum") * 1e6 / expired.max(1.0),
                get("hearth_cpu_sched_cgroup_writes_total"),
                get("hearth_cpu_sched_usage_reads_total"),
                ticks as f64 * 1000.0 / 100.0,
                started.elapsed().as_secs_f64(),
            );
        }
        w.worker.shutdown(Duration::from_secs(5)).await;
    }
}

/// Waits (up to 30 s) until the worker's generic pool has a ready sandbox.
async fn wait_generic_ready(w: &TestWorker) {
    let start = Instant::now();
    while w.status().await["generic_pool"]["ready"]
        .as_u64()
        .unwrap_or(0)
        < 1
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no generic sandbox became ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `runc.cpu_shares_per_gb` (CPU in proportion to memory, as OpenWhisk consolidates): a
/// sandbox's `cpu.shares` follow its function's memory, whether it was created for the function
/// or a generic sandbox was specialized to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_shares_follow_memory_on_both_cold_paths() {
    if !common::runc_available(&[CPU_IDLE]) {
        return;
    }
    let _serial = SERIAL.lock().await;
    let spec = |memory_mb: u64| json!({"code": {"files": {"main.py": function_source("noop")}}, "memory_mb": memory_mb});
    // Created for the function.
    let id = worker_id();
    let w = TestWorker::start_backend(BackendKind::Runc, |c| {
        settings(c, &id, CpuSchedKind::Cfs, 50);
        c.runc.cpu_shares_per_gb = 1024;
    })
    .await;
    let _reaper = Reaper {
        id: id.clone(),
        data_dir: w.data_dir.clone(),
    };
    w.register("small", spec(256)).await;
    let v = w.invoke("small").await;
    assert_eq!(v["cold_path"], "fresh", "{v}");
    let sb = sandboxes(&id);
    assert_eq!(sb.len(), 1);
    assert_eq!(cg(&id, &sb[0], "cpu.shares"), "256");
    w.worker.shutdown(Duration::from_secs(5)).await;

    // A generic sandbox specialized to a 512 MiB function.
    let id = worker_id();
    let w = TestWorker::start_backend(BackendKind::Runc, |c| {
        settings(c, &id, CpuSchedKind::Cfs, 50);
        c.runc.cpu_shares_per_gb = 1024;
        c.generic_pool = 1;
    })
    .await;
    let _reaper2 = Reaper {
        id: id.clone(),
        data_dir: w.data_dir.clone(),
    };
    wait_generic_ready(&w).await;
    w.register("large", spec(512)).await;
    let v = w.invoke("large").await;
    assert_eq!(v["cold_path"], "generic", "{v}");
    let used: Vec<String> = sandboxes(&id)
        .into_iter()
        .filter(|c| cg(&id, c, "cpu.shares") == "512")
        .collect();
    assert_eq!(
        used.len(),
        1,
        "the specialized sandbox holds the function's shares"
    );
    w.worker.shutdown(Duration::from_secs(5)).await;
}

/// A handler that reports the CPUs it may run on and tries to move itself to CPU `to`.
const AFFINITY_SOURCE: &str = r#"
import os

def main(event):
    allowed = sorted(os.sched_getaffinity(0))
    try:
        os.sched_setaffinity(0, {int(event.get("to", 0))})
        escaped = sorted(os.sched_getaffinity(0))
    except OSError as e:
        escaped = "refused: " + type(e).__name__
    return {"allowed": allowed, "escaped": escaped}
"#;

/// `runc.cpuset`: every sandbox, created for its function or specialized from a generic one,
/// runs only on the configured CPUs, and a handler cannot move itself off them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cpuset_pins_sandboxes_and_a_handler_cannot_leave_it() {
    if !common::runc_available(&[CPU_IDLE, "/sys/fs/cgroup/cpuset"]) {
        return;
    }
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    let online = hearth_worker::cpuset::CpuSet::parse(online.trim()).unwrap();
    if online.len() < 2 {
        eprintln!("skipped: one CPU online, nothing to pin away from");
        return;
    }
    let pinned = *online.cpus().last().unwrap();
    let other = online.cpus()[0];
    let _serial = SERIAL.lock().await;
    for generic in [false, true] {
        let id = worker_id();
        let w = TestWorker::start_backend(BackendKind::Runc, |c| {
            settings(c, &id, CpuSchedKind::Cfs, 50);
            c.runc.cpuset =
                Some(hearth_worker::cpuset::CpuSet::parse(&pinned.to_string()).unwrap());
            c.generic_pool = u32::from(generic);
        })
        .await;
        let _reaper = Reaper {
            id: id.clone(),
            data_dir: w.data_dir.clone(),
        };
        if generic {
            wait_generic_ready(&w).await;
        }
        w.register(
            "where",
            json!({"code": {"files": {"main.py": AFFINITY_SOURCE}}}),
        )
        .await;
        let v = w.invoke_with("where", json!({"to": other})).await;
        assert_eq!(
            v["cold_path"],
            if generic { "generic" } else { "fresh" },
            "{v}"
        );
        assert_eq!(v["result"]["allowed"], json!([pinned]), "{v}");
        let escaped = v["result"]["escaped"].as_str().unwrap_or_default();
        assert!(
            escaped.starts_with("refused"),
            "the handler left its CPUs: {v}"
        );
        for sb in sandboxes(&id) {
            let cpus = std::fs::read_to_string(
                Path::new("/sys/fs/cgroup/cpuset/hearth")
                    .join(&id)
                    .join(&sb)
                    .join("cpuset.cpus"),
            )
            .unwrap_or_default();
            assert_eq!(cpus.trim(), pinned.to_string(), "{sb}");
        }
        w.worker.shutdown(Duration::from_secs(5)).await;
    }
}
