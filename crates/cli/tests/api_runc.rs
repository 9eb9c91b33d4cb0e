//! The public API end to end with real runc sandboxes: errors, isolation, cleanup.
//!
//! Needs root and runc. Without them these tests say why and pass, unless
//! `HEARTH_REQUIRE_RUNC=1` (set by scripts/test.sh, so CI never skips them silently).

mod common;

use common::{runc_available, wait_invocation, Server};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn sample(name: &str) -> serde_json::Value {
    // Uploaded, as `hearth fn register --code DIR` does (`code.path` needs code_path_roots).
    let (code, _) = hearth_cli::code::pack(&repo().join("functions").join(name)).unwrap();
    json!({"code": code, "memory_mb": 128})
}

fn inline(src: &str) -> serde_json::Value {
    json!({"code": {"files": {"main.py": src}}, "memory_mb": 64})
}

/// Containers runc knows of in this worker's state root.
/// Every runc container of the worker, ready generic sandboxes included.
fn all_containers(s: &Server) -> Vec<String> {
    let out = std::process::Command::new("runc")
        .arg("--root")
        .arg(s.data_dir.join("runc"))
        .args(["list", "-q"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .filter(|l| !l.is_empty())
        .collect()
}

/// The containers that are functions' sandboxes: every container but the ready generic ones,
/// whose bundle's code mount point is still empty (`hearth-<worker>-<id>` has its bundle in
/// `sandboxes/<id>`).
fn containers(s: &Server) -> Vec<String> {
    all_containers(s)
        .into_iter()
        .filter(|name| !s.is_ready_generic(name.rsplit('-').next().unwrap_or_default()))
        .collect()
}

#[test]
fn hello_runs_cold_then_warm_in_a_real_sandbox() {
    if !runc_available() {
        return;
    }
    let s = Server::start("runc", &[]);
    let r = s.put_fn("hello", sample("hello"));
    assert_eq!(r.status, 201, "{}", r.text());
    let v = s.invoke("hello", r#"{"name": "Hearth"}"#).json();
    assert_eq!(v["result"]["greeting"], "Hello, Hearth!", "{v}");
    assert_eq!(v["cold"], true);
    assert!(v["timing"]["init"].as_u64().unwrap() > 1_000, "{v}");
    let v = s.invoke("hello", "{}").json();
    assert_eq!(v["result"]["greeting"], "Hello, world!");
    assert_eq!(v["cold"], false);
    let t = &v["timing"];
    assert_eq!(
        t["e2e"].as_u64().unwrap(),
        t["exec"].as_u64().unwrap() + t["overhead"].as_u64().unwrap()
    );
    assert_eq!(containers(&s).len(), 1);
    let st = s.status();
    assert_eq!(st["functions"]["hello"]["warm"], 1, "{st}");
    assert_eq!(st["memory"]["warm_mb"], 128);
}

#[test]
fn the_cli_registers_from_a_file_and_a_directory_and_invokes() {
    if !runc_available() {
        return;
    }
    let s = Server::start("runc", &[]);
    let hearth = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hearth"))
            .args(args)
            .env("HEARTH_URL", &s.url)
            .env("HEARTH_API_KEY", s.key.as_deref().unwrap_or(""))
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let dir = repo().join("functions/busy");
    let (ok, _, err) = hearth(&[
        "fn",
        "register",
        "busy",
        "--code",
        dir.to_str().unwrap(),
        "--memory",
        "96",
        "--timeout",
        "5s",
    ]);
    assert!(ok, "{err}");
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("greet.py");
    std::fs::write(&file, "def handle(args):\n    return {'hi': args['who']}\n").unwrap();
    let (ok, out, err) = hearth(&[
        "fn",
        "register",
        "greet",
        "--code",
        file.to_str().unwrap(),
        "--handler",
        "handle",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("greet.handle"), "{out}");
    let (ok, out, err) = hearth(&["invoke", "greet", "--data", r#"{"who": "you"}"#]);
    assert!(ok, "{err}");
    assert!(out.contains(r#""hi": "you""#), "{out}");
    let (ok, out, err) = hearth(&["invoke", "busy", "--data", r#"{"ms": 20}"#]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["timing"]["exec"].as_u64().unwrap() >= 20_000, "{v}");
    let (ok, out, _) = hearth(&["fn", "list"]);
    assert!(ok && out.contains("busy") && out.contains("greet"), "{out}");
    let (ok, out, _) = hearth(&["fn", "show", "busy"]);
    assert!(ok && out.contains("\"memory_mb\": 96"), "{out}");
    let (ok, _, err) = hearth(&["invoke", "greet", "--data", "{}"]);
    assert!(
        !ok && err.contains("502") && err.contains("KeyError"),
        "{err}"
    );
    let (ok, out, err) = hearth(&["prewarm", "busy", "-n", "2"]);
    assert!(ok, "{err}");
    assert!(out.contains("\"ready\": 2"), "{out}");
    let (ok, out, _) = hearth(&["status"]);
    // One sandbox from the invocation above plus the two prewarmed.
    assert!(ok && out.contains("\"warm\": 3"), "{out}");
    let (ok, out, err) = hearth(&["invoke", "busy", "--async"]);
    assert!(ok, "{err}");
    let id = serde_json::from_str::<serde_json::Value>(&out).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (ok, out, err) = hearth(&["result", &id, "--wait"]);
    assert!(ok && out.contains("succeeded"), "{out}{err}");
    let (ok, _, _) = hearth(&["fn", "rm", "greet"]);
    assert!(ok);
    let (ok, _, err) = hearth(&["invoke", "greet"]);
    assert!(!ok && err.contains("404"), "{err}");
}

#[test]
fn a_raising_handler_is_502_with_type_message_and_traceback() {
    if !runc_available() {
        return;
    }
    let s = Server::start("runc", &[]);
    s.put_fn(
        "raiser",
        inline("def helper(x):\n    raise ValueError(f'boom {x}')\n\ndef main(args):\n    return helper(args.get('x'))\n"),
    );
    let r = s.invoke("raiser", r#"{"x": 7}"#);
    assert_eq!(r.status, 502, "{}", r.text());
    let e = &r.json()["error"];
    assert_eq!(e["code"], "handler_error");
    assert_eq!(e["type"], "ValueError");
    assert!(e["message"].as_str().unwrap().contains("boom 7"), "{e}");
    assert!(
        e["traceback"]
            .as_str()
            .unwrap()
            .contains("raise ValueError"),
        "{e}"
    );
    // The agent survived: the same sandbox serves the next call.
    let r = s.invoke("raiser", r#"{"x": 8}"#);
    assert_eq!(r.status, 502);
    assert_eq!(r.json()["error"]["cold"], false);
    assert_eq!(containers(&s).len(), 1);
}

#[test]
fn an_import_error_is_502_init_error() {
    if !runc_available() {
        return;
    }
    let s = Server::start("runc", &[]);
    s.put_fn("broken", inline("def main(args):\n    return {\n"));
    let r = s.invoke("broken", "{}");
    assert_eq!(r.status, 502, "{}", r.text());
    let e = &r.json()["error"];
    assert_eq!(e["code"], "init_error");
    assert_eq!(e["type"], "SyntaxError");
    std::thread::sleep(Duration::from_millis(200));
    assert!(containers(&s).is_empty(), "the failed sandbox is removed");
    assert_eq!(s.status()["memory"]["running_mb"], 0);
}

#[test]
fn the_memory_limit_kills_the_sandbox_with_a_clear_502() {
    if !runc_available() {
        return;
    }
    let s = Server::start("runc", &[]);
    let mut spec = sample("alloc");
    spec["memory_mb"] = json!(64);
    s.put_fn("alloc", spec);
    s.put_fn("hello", sample("hello"));
    assert_eq!(s.invoke("alloc", r#"{"mb": 8}"#).status, 200);
    let r = s.invoke("alloc", r#"{"mb": 512}"#);
    assert_eq!(r.status, 502, "{}", r.text());
    let e = &r.json()["error"];
    assert_eq!(e["code"], "out_of_memory", "{e}");
    assert!(e["message"].as_str().unwrap().contains("64 MiB"), "{e}");
    // The sandbox is discarded; the worker and other functions are unaffected.
    assert_eq!(s.invoke("hello", "{}").status, 200);
    let v = s.invoke("alloc", r#"{"mb": 8}"#).json();
    assert_eq!(v["cold"], true, "{v}");
    let m = s.client().get("/metrics").unwrap().text();
    assert!(m.contains(r#"outcome="out_of_memory"} 1"#), "{m}");
}

#[test]
fn a_timeout_is_504_and_the_sandbox_is_killed() {
    if !runc_available() {
        return;
    }
    let s = Server::start("runc", &[]);
    let mut spec = sample("sleep");
    spec["timeout_ms"] = json!(500);
    s.put_fn("sleep", spec);
    assert_eq!(s.invoke("sleep", r#"{"ms": 10}"#).status, 200);
    let t = Instant::now();
    let r = s.invoke("sleep", r#"{"ms": 10000}"#);
    assert_eq!(r.status, 504, "{}", r.text());
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let deadline = Instant::now() + Duration::from_secs(5);
    while !containers(&s).is_empty() {
        assert!(Instant::now() < deadline, "timed-out sandbox still exists");
        std::thread::sleep(Duration::from_millis(20));
    }
    let v = s.invoke("sleep", r#"{"ms": 1}"#).json();
    assert_eq!(v["cold"], true, "a timed-out sandbox is never reused: {v}");
}

#[test]
fn handlers_are_isolated_in_sandboxes_created_for_them() {
    if !runc_available() {
        return;
    }
    let s = Server::start("runc", &[("HEARTH_GENERIC_POOL", "0")]);
    handlers_are_isolated(&s, "fresh");
}

/// A function in a generic sandbox specialized for it is as confined as in one created for it,
/// and finds nothing of the sandbox's generic life.
#[test]
fn handlers_are_isolated_in_specialized_generic_sandboxes() {
    if !runc_available() {
        return;
    }
    let s = Server::start("runc", &[]);
    // The status's free memory leaves out what the ready generic sandboxes hold.
    s.wait_generic_ready();
    let st = s.status();
    let n = |k: &str| st["memory"][k].as_u64().unwrap();
    assert!(n("generic_mb") > 0, "{st}");
    let used = n("running_mb") + n("warm_mb") + n("generic_mb");
    assert_eq!(n("free_mb"), n("budget_mb") - used, "{st}");
    handlers_are_isolated(&s, "generic");
}

fn handlers_are_isolated(s: &Server, path: &str) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    s.put_fn("other", inline("def main(args):\n    return {}\n"));
    let other_code = s
        .data_dir
        .join("functions/other/v1/main.py")
        .canonicalize()
        .unwrap();
    let probe = r#"
import os, socket

def attempt(f):
    try:
        f()
        return "ok"
    except Exception as e:
        return type(e).__name__ + ": " + str(e)

def write(path):
    with open(path, "w") as fh:
        fh.write("x")

def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=1)
    s.close()

def main(args):
    pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    return {
        "code_files": sorted(os.listdir("/code")),
        "cwd": os.getcwd(),
        "cwd_files": sorted(os.listdir(".")),
        "tmp_files": sorted(os.listdir("/tmp")),
        "run_files": sorted(os.listdir("/hearth/run")),
        "generic_env": [k for k in os.environ if k == "HEARTH_GENERIC"],
        "handler_env": os.environ.get("HEARTH_HANDLER"),
        "usr": attempt(lambda: write("/usr/hearth-probe")),
        "etc": attempt(lambda: write("/etc/hearth-probe")),
        "code": attempt(lambda: write("/code/probe")),
        "tmp": attempt(lambda: write("/tmp/probe")),
        "pid": os.getpid(),
        "pids": pids,
        "host_pid_visible": os.path.exists("/proc/%d" % args["host_pid"]),
        "uid": os.getuid(),
        "connect": attempt(lambda: connect(args["port"])),
        "other_code": attempt(lambda: open(args["other"]).read()),
        "hostname": socket.gethostname(),
    }
"#;
    s.put_fn("probe", inline(probe));
    if path == "generic" {
        s.wait_generic_ready();
    }
    let args = json!({"port": port, "other": other_code, "host_pid": std::process::id()});
    let r = s.invoke("probe", &args.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    let answer = r.json();
    assert_eq!(answer["cold_path"], path, "{answer}");
    let v = &answer["result"];
    // Its own code and nothing else, as its working directory; empty scratch space; the agent's
    // socket alone in the run directory; an environment that says nothing of a generic life.
    // Beside it, the bytecode Hearth compiled of it at registration (when a runtime image is
    // installed: docs/dependencies.md), and nothing else.
    let own = |k: &str| -> Vec<Value> {
        let files = v[k].as_array().cloned().unwrap_or_default();
        files.into_iter().filter(|f| f != "__pycache__").collect()
    };
    assert_eq!(own("code_files"), [json!("main.py")], "{v}");
    assert_eq!(v["cwd"], "/code", "{v}");
    assert_eq!(own("cwd_files"), [json!("main.py")], "{v}");
    assert_eq!(v["tmp_files"], json!([]), "{v}");
    assert_eq!(v["run_files"], json!(["agent.sock"]), "{v}");
    assert_eq!(v["generic_env"], json!([]), "{v}");
    assert_eq!(v["handler_env"], "main.main", "{v}");
    for k in ["usr", "etc", "code"] {
        let msg = v[k].as_str().unwrap();
        assert!(
            msg.contains("Read-only file system") || msg.contains("Permission denied"),
            "{k}: {msg}"
        );
    }
    assert_eq!(v["tmp"], "ok", "private /tmp is writable");
    assert_ne!(v["uid"], 0, "not root");
    assert!(v["pid"].as_u64().unwrap() < 10, "own pid namespace: {v}");
    assert!(
        v["pids"].as_array().unwrap().len() <= 3,
        "only the sandbox's processes: {v}"
    );
    assert_eq!(v["host_pid_visible"], false);
    assert_ne!(v["connect"], "ok", "host loopback unreachable: {v}");
    assert!(
        v["other_code"].as_str().unwrap().contains("No such file"),
        "{v}"
    );
    drop(listener);
}

#[test]
fn every_sample_function_runs_in_a_sandbox() {
    if !runc_available() {
        return;
    }
    let s = Server::start("runc", &[]);
    for (name, args) in [
        ("noop", "{}"),
        ("busy", r#"{"ms": 5, "mb": 4}"#),
        ("json_dumps_loads", "{}"),
        ("float_operation", "{}"),
        ("zlib_compression", "{}"),
        ("pyaes", "{}"),
        ("matmul", "{}"),
    ] {
        assert!(s.put_fn(name, sample(name)).status < 300);
        let r = s.invoke(name, args);
        assert_eq!(r.status, 200, "{name}: {}", r.text());
        assert!(r.json()["result"].is_object(), "{name}");
    }
}

#[test]
fn registered_code_survives_a_restart() {
    if !runc_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    {
        let s = Server::start_in("runc", &data, &[]);
        assert_eq!(s.put_fn("hello", sample("hello")).status, 201);
        assert_eq!(s.invoke("hello", "{}").status, 200);
    }
    let s = Server::start_in("runc", &data, &[]);
    let v = s.invoke("hello", r#"{"name": "again"}"#).json();
    assert_eq!(v["result"]["greeting"], "Hello, again!", "{v}");
    assert_eq!(v["cold_reason"], "new");
}

#[test]
fn async_invocations_run_in_real_sandboxes() {
    if !runc_available() {
        return;
    }
    let s = Server::start("runc", &[]);
    s.put_fn("hello", sample("hello"));
    let r = s
        .client()
        .post(
            "/v1/functions/hello/invoke?async=true",
            br#"{"name": "later"}"#,
        )
        .unwrap();
    assert_eq!(r.status, 202);
    let id = r.json()["id"].as_str().unwrap().to_string();
    let v = wait_invocation(&s, &id);
    assert_eq!(v["status"], "succeeded", "{v}");
    assert_eq!(v["result"]["greeting"], "Hello, later!");
}

/// Host paths that could be left behind by the worker at `data_dir`.
fn leftovers(data_dir: &Path, worker: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let dd = data_dir.to_string_lossy();
    for line in mounts.lines().filter(|l| l.contains(dd.as_ref())) {
        found.push(format!("mount: {line}"));
    }
    for ctrl in [
        "memory", "cpu", "pids", "cpuset", "devices", "freezer", "blkio",
    ] {
        let p = Path::new("/sys/fs/cgroup")
            .join(ctrl)
            .join("hearth")
            .join(worker);
        if p.exists() {
            found.push(format!("cgroup: {}", p.display()));
        }
    }
    let out = std::process::Command::new("find")
        .arg(data_dir)
        .args(["-type", "s"])
        .output()
        .unwrap();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        found.push(format!("socket: {l}"));
    }
    if let Ok(rd) = std::fs::read_dir(data_dir.join("sandboxes")) {
        for e in rd.flatten() {
            found.push(format!("bundle: {}", e.path().display()));
        }
    }
    found
}

#[test]
fn sigterm_finishes_work_and_leaves_nothing_behind() {
    if !runc_available() {
        return;
    }
    let mut s = Server::start("runc", &[]);
    let worker = s.status()["worker"].as_str().unwrap().to_string();
    s.put_fn("hello", sample("hello"));
    s.put_fn("sleep", sample("sleep"));
    let r = s
        .client()
        .post("/v1/functions/hello/prewarm", br#"{"count": 2}"#)
        .unwrap();
    assert_eq!(r.json()["ready"], 2, "{}", r.text());
    let url = s.url.clone();
    let long = std::thread::spawn(move || {
        common::client_for(&url)
            .unwrap()
            .post("/v1/functions/sleep/invoke", br#"{"ms": 1500}"#)
            .unwrap()
    });
    // Wait until the long invocation runs in its sandbox.
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.status()["functions"]["sleep"]["running"] != 1 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(containers(&s).len(), 3);
    assert!(
        !leftovers(&s.data_dir, &worker).is_empty(),
        "the check sees live sandboxes"
    );
    let status = s.terminate();
    assert!(status.success(), "{}", s.log_text());
    let r = long.join().unwrap();
    assert_eq!(r.status, 200, "in-flight work finishes: {}", r.text());
    assert!(all_containers(&s).is_empty(), "{:?}", all_containers(&s));
    let left = leftovers(&s.data_dir, &worker);
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// A worker stopped while it is making generic sandboxes (each cold start refills the pool in
/// the background) waits for them before it removes its sandboxes: none outlives it.
#[test]
fn a_worker_stopped_while_refilling_its_generic_pool_leaves_nothing_behind() {
    if !runc_available() {
        return;
    }
    // One creation at a time: the pool's refills queue behind each other.
    let env = [
        ("HEARTH_GENERIC_POOL", "4"),
        ("HEARTH_MAX_CONCURRENT_CREATIONS", "1"),
    ];
    let mut s = Server::start("runc", &env);
    let worker = s.status()["worker"].as_str().unwrap().to_string();
    for f in ["a", "b", "c", "d"] {
        s.put_fn(f, inline("def main(args):\n    return {}\n"));
        assert_eq!(s.invoke(f, "{}").status, 200);
    }
    // Four cold starts in a row: the pool is making sandboxes right now.
    let status = s.terminate();
    assert!(status.success(), "{}", s.log_text());
    // A runc the worker started and did not wait for would finish its container by now.
    std::thread::sleep(Duration::from_secs(1));
    assert!(all_containers(&s).is_empty(), "{:?}", all_containers(&s));
    let cgroup = format!(
        ":/hearth/{}",
        worker.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
    );
    let stray: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|p| {
            std::fs::read_to_string(p.path().join("cgroup")).is_ok_and(|c| c.contains(&cgroup))
        })
        // Killed sandboxes the host's init has not reaped yet are no stray work.
        .filter(|p| {
            std::fs::read_to_string(p.path().join("stat")).is_ok_and(|st| {
                st.rsplit(')')
                    .next()
                    .is_some_and(|r| !r.trim_start().starts_with('Z'))
            })
        })
        .map(|p| p.file_name().to_string_lossy().to_string())
        .collect();
    assert!(stray.is_empty(), "processes left in {cgroup}: {stray:?}");
    let left = leftovers(&s.data_dir, &worker);
    assert!(left.is_empty(), "left behind: {left:#?}");
}

#[test]
fn deleting_a_function_while_it_runs_removes_its_sandboxes_after() {
    if !runc_available() {
        return;
    }
    let s = Server::start("runc", &[]);
    s.put_fn("sleep", sample("sleep"));
    s.invoke("sleep", r#"{"ms": 1}"#);
    let url = s.url.clone();
    let running = std::thread::spawn(move || {
        common::client_for(&url)
            .unwrap()
            .post("/v1/functions/sleep/invoke", br#"{"ms": 3000}"#)
            .unwrap()
    });
    std::thread::sleep(Duration::from_millis(150));
    let r = s
        .client()
        .post("/v1/functions/sleep/prewarm", b"{}")
        .unwrap();
    assert_eq!(r.json()["ready"], 1);
    assert_eq!(containers(&s).len(), 2, "one running, one idle");
    assert_eq!(
        s.client().delete("/v1/functions/sleep").unwrap().status,
        204
    );
    // The idle sandbox goes at once (its teardown takes runc a moment), the busy one stays.
    let deadline = Instant::now() + Duration::from_millis(2500);
    while containers(&s).len() != 1 {
        assert!(Instant::now() < deadline, "{:?}", containers(&s));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!running.is_finished(), "the busy one is still running");
    let r = running.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let deadline = Instant::now() + Duration::from_secs(5);
    while !containers(&s).is_empty() {
        assert!(Instant::now() < deadline, "{:?}", containers(&s));
        std::thread::sleep(Duration::from_millis(20));
    }
    // Its code is removed too, off the async threads (so a moment later).
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.data_dir.join("functions/sleep").exists() {
        assert!(Instant::now() < deadline, "its code is removed too");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_trace_replays_against_real_sandboxes() {
    if !runc_available() {
        return;
    }
    let s = Server::start("runc", &[]);
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.csv");
    std::fs::write(
        &trace,
        "time_ms,function\n0,spin\n0,floats\n300,spin\n320,floats\n600,spin\n",
    )
    .unwrap();
    // `spin` is busy with the trace's time and memory; `floats` a FunctionBench-like sample.
    std::fs::write(
        dir.path().join("t.meta.csv"),
        "function,warm_ms,cold_ms,mem_mb,sample,args\nspin,30,0,64,,\n\
         floats,1.8,0,64,float_operation,\"{\"\"n\"\":10000}\"\n",
    )
    .unwrap();
    let out = dir.path().join("r.csv");
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_hearth"))
        .env("HEARTH_API_KEY", s.key.as_deref().unwrap_or(""))
        .args(["load", "trace"])
        .arg(&trace)
        .args(["--url", &s.url, "--functions-dir"])
        .arg(repo().join("functions"))
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let rows = hearth_loadgen::read_results(&out).unwrap();
    assert_eq!(rows.len(), 5);
    for r in &rows {
        assert_eq!(r.outcome, hearth_loadgen::Outcome::Ok, "{r:?}");
        if r.function == "spin" {
            // busy spun for the trace's 30 ms inside the sandbox.
            assert!(r.exec_us.unwrap() >= 30_000, "{r:?}");
        }
    }
    // The first invocation of each function (ids 0 and 1, both at 0 ms) started its sandbox.
    for r in rows.iter().filter(|r| r.id < 2) {
        assert!(r.cold && r.init_us.unwrap() > 0, "{r:?}");
    }
}
