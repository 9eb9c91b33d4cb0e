//! Sandbox hardening of the runc backend (issue 11): syscalls Docker's current default profile
//! denies, code left running between invocations, output and scratch space that would fill the
//! host's disk, and bundle files readable by other host users.
//!
//! Needs root and runc. Without them these tests say why and pass, unless
//! `HEARTH_REQUIRE_RUNC=1` (set by scripts/test.sh, so CI never skips them silently).

mod common;

use common::{runc_available, Server};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn inline(src: &str, memory_mb: u64) -> Value {
    json!({"code": {"files": {"main.py": src}}, "memory_mb": memory_mb, "cpus": 1.0})
}

fn invoke_ok(s: &Server, name: &str, args: &str) -> Value {
    let r = s.invoke(name, args);
    assert_eq!(r.status, 200, "{name}: {}", r.text());
    r.json()
}

/// CPU nanoseconds the sandbox's tasks used.
fn cpu_ns(cgroup: &Path) -> u64 {
    std::fs::read_to_string(cgroup.join("cpuacct.usage"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// CPU the sandbox burns over half a second while no invocation runs, in milliseconds.
/// CPU the worker's only sandbox uses in 500 ms once it is idle: it must first be frozen (an
/// idle sandbox is, after `runc.idle_freeze_ms`), and then use none.
fn idle_cpu_ms(s: &Server) -> u64 {
    let state = s.only_sandbox_cgroup("freezer").join("freezer.state");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(&state).unwrap().trim() != "FROZEN" {
        assert!(
            Instant::now() < deadline,
            "the idle sandbox was never frozen"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let cg = s.only_sandbox_cgroup("cpuacct");
    let before = cpu_ns(&cg);
    std::thread::sleep(Duration::from_millis(500));
    (cpu_ns(&cg) - before) / 1_000_000
}

/// The bundle directory of the worker's only function sandbox.
fn only_bundle(s: &Server) -> PathBuf {
    // A generic sandbox the pool is still making (after a cold start took one) has a bundle
    // too, and is no function's: wait until none is being made.
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.status()["generic_pool"]["creating"].as_u64().unwrap_or(0) > 0 {
        assert!(Instant::now() < deadline, "{}", s.status());
        std::thread::sleep(Duration::from_millis(10));
    }
    let dirs: Vec<PathBuf> = std::fs::read_dir(s.data_dir.join("sandboxes"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| !s.is_ready_generic(&p.file_name().unwrap().to_string_lossy()))
        .collect();
    assert_eq!(dirs.len(), 1, "one sandbox expected: {dirs:?}");
    dirs.into_iter().next().unwrap()
}

#[test]
fn io_uring_and_af_alg_are_denied() {
    if !runc_available() {
        return;
    }
    let s = Server::start("runc", &[]);
    let probe = r#"
import ctypes, socket

def main(args):
    libc = ctypes.CDLL(None, use_errno=True)
    out = {}
    # io_uring_setup(entries, params), io_uring_enter(fd, ...), io_uring_register(fd, ...)
    for name, nr in (("io_uring_setup", 425), ("io_uring_enter", 426), ("io_uring_register", 427)):
        params = ctypes.create_string_buffer(120)
        ctypes.set_errno(0)
        if nr == 425:
            r = libc.syscall(nr, 8, params)
        else:
            r = libc.syscall(nr, 0, 0, 0, 0, 0, 0)
        out[name] = [r, ctypes.get_errno()]
    try:
        socket.socket(38, socket.SOCK_SEQPACKET, 0).close()  # AF_ALG: the kernel crypto API
        out["af_alg"] = "ok"
    except OSError as e:
        out["af_alg"] = e.errno
    return out
"#;
    assert_eq!(s.put_fn("probe", inline(probe, 64)).status, 201);
    let v = &invoke_ok(&s, "probe", "{}")["result"];
    for name in ["io_uring_setup", "io_uring_enter", "io_uring_register"] {
        let r = &v[name];
        assert_eq!(r[0], -1, "{name} must fail: {v}");
        let errno = r[1].as_i64().unwrap();
        assert!(
            errno == libc::EPERM as i64 || errno == libc::ENOSYS as i64,
            "{name} must be filtered by seccomp (EPERM/ENOSYS), got errno {errno}: {v}"
        );
    }
    assert_eq!(v["af_alg"], libc::EPERM, "AF_ALG sockets are denied: {v}");
}

/// A handler that leaves a CPU-spinning child process behind: nothing of the sandbox runs
/// between invocations, and the sandbox still serves warm.
#[test]
fn a_child_process_left_spinning_does_not_run_between_invocations() {
    if !runc_available() {
        return;
    }
    let s = Server::start("runc", &[]);
    let src = r#"
import subprocess, sys

def main(args):
    if args.get("spawn"):
        p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        return {"child": p.pid}
    return {"ok": True}
"#;
    assert_eq!(s.put_fn("stray", inline(src, 64)).status, 201);
    let v = invoke_ok(&s, "stray", r#"{"spawn": true}"#);
    assert!(v["result"]["child"].as_u64().is_some(), "{v}");
    let used = idle_cpu_ms(&s);
    assert!(
        used < 50,
        "the sandbox burned {used} ms of CPU in 500 ms between invocations"
    );
    let v = invoke_ok(&s, "stray", "{}");
    assert_eq!(v["result"]["ok"], true, "{v}");
    assert_eq!(v["cold"], false, "the sandbox is still served warm: {v}");
    let used = idle_cpu_ms(&s);
    assert!(used < 50, "after the next invocation: {used} ms");
}

/// A handler that leaves a busy thread inside the agent: it does not spin between invocations.
#[test]
fn a_background_thread_left_spinning_does_not_run_between_invocations() {
    if !runc_available() {
        return;
    }
    let s = Server::start("runc", &[]);
    let src = r#"
import threading

def spin():
    while True:
        pass

def main(args):
    if args.get("spawn"):
        threading.Thread(target=spin, daemon=True).start()
    return {"threads": threading.active_count()}
"#;
    assert_eq!(s.put_fn("thread", inline(src, 64)).status, 201);
    let v = invoke_ok(&s, "thread", r#"{"spawn": true}"#);
    assert_eq!(v["result"]["threads"], 2, "{v}");
    let used = idle_cpu_ms(&s);
    assert!(
        used < 50,
        "the sandbox burned {used} ms of CPU in 500 ms between invocations"
    );
    let v = invoke_ok(&s, "thread", "{}");
    assert_eq!(v["result"]["threads"], 2, "{v}");
    let used = idle_cpu_ms(&s);
    assert!(used < 50, "after the next invocation: {used} ms");
}

/// Sizes of the sandbox's log files (`stdio.log` and its rotations).
fn log_bytes(bundle: &Path) -> (u64, Vec<(String, u64)>) {
    let mut files = Vec::new();
    for e in std::fs::read_dir(bundle).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("stdio.log") {
            files.push((name, e.metadata().unwrap().len()));
        }
    }
    (files.iter().map(|f| f.1).sum(), files)
}

#[test]
fn a_handler_printing_far_more_than_the_log_cap_keeps_the_log_under_it() {
    if !runc_available() {
        return;
    }
    // The default `runc.log_file_bytes`.
    let cap: u64 = 1024 * 1024;
    let s = Server::start("runc", &[]);
    let src = r#"
import sys

def main(args):
    line = "x" * 1023 + "\n"
    for i in range(args["kib"]):
        sys.stdout.write(line)
        if i % 8 == 0:
            sys.stderr.write(line)
    sys.stdout.write("END-OF-OUTPUT\n")
    sys.stdout.flush()
    return {"ok": True}
"#;
    assert_eq!(s.put_fn("loud", inline(src, 64)).status, 201);
    invoke_ok(&s, "loud", r#"{"kib": 16384}"#);
    let bundle = only_bundle(&s);
    // The newest output reaches the log (the worker copies it asynchronously) ...
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(bundle.join("stdio.log")).unwrap_or_default();
        if text.contains("END-OF-OUTPUT") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the last output never reached the log: {:?}",
            log_bytes(&bundle)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // ... and the ~18 MiB printed left at most two files of `cap` bytes.
    let (total, files) = log_bytes(&bundle);
    assert!(files.len() <= 2, "{files:?}");
    assert!(total <= 2 * cap, "log holds {total} bytes: {files:?}");
    // The sandbox is still usable.
    let v = invoke_ok(&s, "loud", r#"{"kib": 1}"#);
    assert_eq!(v["cold"], false, "{v}");
}

#[test]
fn writable_directories_are_bounded_in_bytes_and_files() {
    if !runc_available() {
        return;
    }
    let s = Server::start("runc", &[]);
    let src = r#"
import errno, os

def fill(path, mib):
    try:
        with open(path, "wb") as f:
            for _ in range(mib):
                f.write(b"x" * 1048576)
                f.flush()
        return "ok"
    except OSError as e:
        return e.errno
    finally:
        try:
            os.remove(path)
        except OSError:
            pass

def many(d, n):
    made = []
    try:
        for i in range(n):
            p = "%s/f%d" % (d, i)
            open(p, "w").close()
            made.append(p)
        return "ok"
    except OSError as e:
        return e.errno
    finally:
        for p in made:
            os.remove(p)

def main(args):
    return {
        "run_bytes": fill("/hearth/run/big", 64),
        "run_files": many("/hearth/run", 20000),
        "tmp_files": many("/tmp", 20000),
        "shm_files": many("/dev/shm", 20000),
        "tmp_small": fill("/tmp/small", 1),
    }
"#;
    assert_eq!(s.put_fn("fill", inline(src, 256)).status, 201);
    let v = &invoke_ok(&s, "fill", "{}")["result"];
    let enospc = libc::ENOSPC;
    assert_eq!(v["run_bytes"], enospc, "64 MiB into /hearth/run: {v}");
    assert_eq!(v["run_files"], enospc, "20000 files in /hearth/run: {v}");
    assert_eq!(v["tmp_files"], enospc, "20000 files in /tmp: {v}");
    assert_eq!(v["shm_files"], enospc, "20000 files in /dev/shm: {v}");
    assert_eq!(v["tmp_small"], "ok", "/tmp stays usable: {v}");
}

/// No file the worker keeps for a sandbox is readable by other host users.
#[test]
fn bundle_files_are_private_to_root() {
    if !runc_available() {
        return;
    }
    let s = Server::start("runc", &[]);
    let src = "def main(args):\n    print('secret output')\n    return {}\n";
    assert_eq!(s.put_fn("quiet", inline(src, 64)).status, 201);
    invoke_ok(&s, "quiet", "{}");
    let sandboxes = s.data_dir.join("sandboxes");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&sandboxes), 0o700, "{}", sandboxes.display());
    let bundle = only_bundle(&s);
    assert_eq!(mode(&bundle), 0o700, "{}", bundle.display());
    let mut seen = Vec::new();
    for e in std::fs::read_dir(&bundle).unwrap().flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        let m = mode(&p);
        if name == "run" {
            // The agent's own directory (its socket), owned by the sandbox user.
            assert_eq!(m & 0o077, 0, "{name}: {m:o}");
        } else if name == "rootfs" || name == "code" {
            // The sandbox's root (its layout and the agent) and its code, mounted for it to
            // read, behind the bundle's 0700.
            assert_eq!(m & 0o022, 0, "{name} is writable by others: {m:o}");
        } else {
            assert_eq!(m & 0o077, 0, "{name} is open to other users: {m:o}");
            seen.push(name);
        }
    }
    for f in ["config.json", "stdio.log"] {
        assert!(seen.iter().any(|n| n == f), "{f} missing: {seen:?}");
        assert_eq!(mode(&bundle.join(f)), 0o600, "{f}");
    }
}

/// Mounts, containers and cgroups that a worker named `worker` with `data_dir` left.
fn traces(data_dir: &Path, worker: &str) -> Vec<String> {
    let mut found = Vec::new();
    let dd = data_dir.to_string_lossy();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for line in mounts.lines().filter(|l| l.contains(dd.as_ref())) {
        found.push(format!("mount: {line}"));
    }
    let out = std::process::Command::new("runc")
        .arg("--root")
        .arg(data_dir.join("runc"))
        .args(["list", "-q"])
        .output()
        .unwrap();
    for c in String::from_utf8_lossy(&out.stdout).lines() {
        found.push(format!("container: {c}"));
    }
    for ctrl in ["freezer", "memory", "cpu", "pids"] {
        let parent = Path::new("/sys/fs/cgroup")
            .join(ctrl)
            .join("hearth")
            .join(worker);
        if let Ok(rd) = std::fs::read_dir(&parent) {
            for e in rd.flatten().filter(|e| e.path().is_dir()) {
                found.push(format!("cgroup: {}", e.path().display()));
            }
        }
    }
    found
}

/// A runc worker `id` on `data` that ran function `f` once (so a sandbox of it lives, mounted
/// and in its cgroups) and has a ready generic sandbox (its code mount point shared), killed
/// with SIGKILL; the name of its cgroups.
fn killed_with_a_live_sandbox(data: &Path, id: &str) -> String {
    let mut s = Server::start_in("runc", data, &[("HEARTH_WORKER_ID", id)]);
    let src = "def main(args):\n    return {'ok': True}\n";
    assert_eq!(s.put_fn("f", inline(src, 64)).status, 201);
    invoke_ok(&s, "f", "{}");
    s.wait_generic_ready();
    let cgroup_name = id.replace('-', "_");
    let before = traces(data, &cgroup_name);
    assert!(
        before.iter().any(|t| t.starts_with("mount:"))
            && before.iter().any(|t| t.starts_with("container:"))
            && before.iter().any(|t| t.contains("/code ")),
        "the check sees the live sandboxes: {before:#?}"
    );
    s.kill();
    cgroup_name
}

/// A worker killed with SIGKILL leaves frozen sandboxes with their run tmpfs mounted; the next
/// worker on the same data directory removes them before it serves.
#[test]
fn a_killed_workers_frozen_sandboxes_and_mounts_are_removed_on_restart() {
    if !runc_available() {
        return;
    }
    let tmp = tempfile::Builder::new()
        .prefix("hearth-test-")
        .tempdir()
        .unwrap();
    let data = tmp.path().join("data");
    let id = format!("test-crash-{}", std::process::id());
    let cgroup_name = killed_with_a_live_sandbox(&data, &id);
    // No pool on the restarted worker: the check then sees only what the killed one left.
    let env = [
        ("HEARTH_WORKER_ID", id.as_str()),
        ("HEARTH_GENERIC_POOL", "0"),
    ];
    let s = Server::start_in("runc", &data, &env);
    let left = traces(&data, &cgroup_name);
    assert!(left.is_empty(), "left behind: {left:#?}");
    drop(s);
}

/// A worker killed with SIGKILL and restarted on the same data directory under another id
/// removes the old id's sandboxes, mounts and cgroups (issue 12: they were orphaned forever).
#[test]
fn a_worker_restarted_under_a_new_id_removes_the_old_ids_sandboxes() {
    if !runc_available() {
        return;
    }
    let tmp = tempfile::Builder::new()
        .prefix("hearth-test-")
        .tempdir()
        .unwrap();
    let data = tmp.path().join("data");
    let old_id = format!("test-old-{}", std::process::id());
    let old_cgroups = killed_with_a_live_sandbox(&data, &old_id);
    let new_id = format!("test-new-{}", std::process::id());
    let env = [
        ("HEARTH_WORKER_ID", new_id.as_str()),
        ("HEARTH_GENERIC_POOL", "0"),
    ];
    let s = Server::start_in("runc", &data, &env);
    let left = traces(&data, &old_cgroups);
    assert!(left.is_empty(), "left behind: {left:#?}");
    for ctrl in ["freezer", "memory", "cpu", "pids"] {
        let parent = Path::new("/sys/fs/cgroup")
            .join(ctrl)
            .join("hearth")
            .join(&old_cgroups);
        assert!(!parent.exists(), "{} is left", parent.display());
    }
    // The new worker serves the function it found in the registry.
    let v = invoke_ok(&s, "f", "{}");
    assert_eq!(v["result"]["ok"], true, "{v}");
    drop(s);
}
