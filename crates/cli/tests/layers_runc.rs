//! Dependency layers and function build state end to end (issue 32 §2, docs/dependencies.md),
//! with real build sandboxes and wheels the tests make themselves (no network).
//!
//! Needs root, runc and a runtime image: the store's `python3.11` (`hearth runtime build`),
//! or a Debian root filesystem with python3 and pip named by `HEARTH_TEST_RUNTIME_ROOTFS`.
//! Without root and runc these tests say why and pass, unless `HEARTH_REQUIRE_RUNC=1`; without
//! a runtime image they fail and say how to make one.

mod common;

use common::cluster::wait_until;
use common::{runc_available, Server};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A wheel for `name`/`version` with the given tag, holding `name/__init__.py` with `init`
/// and, if `filler` > 0, `name/blob.bin` of that many random bytes (so it does not compress).
/// Written with Python's zipfile, as any wheel: `*.dist-info/{METADATA,WHEEL,RECORD,top_level.txt}`.
fn make_wheel(
    dir: &Path,
    name: &str,
    version: &str,
    tag: &str,
    init: &str,
    filler: u64,
) -> PathBuf {
    let file = dir.join(format!("{name}-{version}-{tag}.whl"));
    let script = r#"
import sys, zipfile, os, hashlib, base64
path, name, version, tag, init, filler = sys.argv[1:7]
filler = int(filler)
di = f"{name}-{version}.dist-info"
files = {
    f"{name}/__init__.py": init.encode(),
    f"{di}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
    f"{di}/WHEEL": f"Wheel-Version: 1.0\nGenerator: hearth-test\nRoot-Is-Purelib: true\nTag: {tag}\n".encode(),
    f"{di}/top_level.txt": f"{name}\n".encode(),
}
def digest(b):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode()
with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
    record = []
    for n, b in files.items():
        z.writestr(n, b)
        record.append(f"{n},{digest(b)},{len(b)}")
    if filler:
        h = hashlib.sha256()
        n = f"{name}/blob.bin"
        with z.open(n, "w", force_zip64=True) as out:
            left = filler
            while left:
                chunk = os.urandom(min(left, 1 << 20))
                h.update(chunk)
                out.write(chunk)
                left -= len(chunk)
        record.append(f"{n},sha256={base64.urlsafe_b64encode(h.digest()).rstrip(b'=').decode()},{filler}")
    record.append(f"{di}/RECORD,,")
    z.writestr(f"{di}/RECORD", "\n".join(record) + "\n")
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(&file)
        .args([name, version, tag, init, &filler.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    file
}

/// A runtime store holding one image, `python3.11`: the host's store's, or one made of
/// `HEARTH_TEST_RUNTIME_ROOTFS`.
fn runtime_store(tmp: &Path) -> PathBuf {
    let store =
        hearth_worker::runtimes::RuntimeStore::new(hearth_worker::runtimes::DEFAULT_STORE_DIR);
    let rootfs = match std::env::var("HEARTH_TEST_RUNTIME_ROOTFS") {
        Ok(p) => PathBuf::from(p),
        Err(_) => match store.resolve("python3.11") {
            Some(rt) => rt.rootfs,
            None => panic!(
                "no runtime image: run `hearth runtime build` (scripts/setup.sh) or set \
                 HEARTH_TEST_RUNTIME_ROOTFS to a Debian bookworm root with python3 and \
                 python3-pip (mmdebstrap --variant=essential --include=python3,python3-pip \
                 bookworm DIR)"
            ),
        },
    };
    assert!(
        rootfs.join("usr/bin/python3").exists(),
        "{} has no python3",
        rootfs.display()
    );
    let dir = tmp.join("runtimes");
    let hex = "5e".repeat(32);
    std::fs::create_dir_all(dir.join(&hex)).unwrap();
    std::os::unix::fs::symlink(&rootfs, dir.join(&hex).join("rootfs")).unwrap();
    let rt = json!({"name": "python3.11", "digest": format!("sha256:{hex}"), "source": "test"});
    std::fs::write(dir.join(&hex).join("runtime.json"), rt.to_string()).unwrap();
    std::fs::create_dir_all(dir.join("names")).unwrap();
    std::fs::write(dir.join("names/python3.11"), format!("sha256:{hex}")).unwrap();
    dir
}

/// A temp dir with a wheelhouse (`wheels/`) and a runtime store, and the worker settings
/// that use them.
struct Fixture {
    tmp: tempfile::TempDir,
    env: Vec<(String, String)>,
}

impl Fixture {
    fn new(extra: &[(&str, &str)]) -> Fixture {
        let tmp = tempfile::Builder::new()
            .prefix("hearth-layers-")
            .tempdir()
            .unwrap();
        let wheels = tmp.path().join("wheels");
        std::fs::create_dir_all(&wheels).unwrap();
        make_wheel(
            &wheels,
            "hlcalc",
            "1.0",
            "py3-none-any",
            "def compute(x):\n    return x * 7 + 1\n",
            0,
        );
        let store = runtime_store(tmp.path());
        let mut env = vec![
            (
                "HEARTH_BUILD__FIND_LINKS".to_string(),
                format!("[\"{}\"]", wheels.display()),
            ),
            (
                "HEARTH_RUNC__RUNTIME_STORE".to_string(),
                store.display().to_string(),
            ),
        ];
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Fixture { tmp, env }
    }

    fn wheels(&self) -> PathBuf {
        self.tmp.path().join("wheels")
    }

    fn start(&self) -> Server {
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        Server::start("runc", &env)
    }
}

fn with_reqs(reqs: &str, src: &str) -> Value {
    json!({"code": {"files": {"main.py": src, "requirements.txt": reqs}}, "memory_mb": 64})
}

const USES_HLCALC: &str =
    "import hlcalc\n\ndef main(args):\n    return hlcalc.compute(args.get('x', 1))\n";

fn show(s: &Server, name: &str) -> Value {
    s.client()
        .get(&format!("/v1/functions/{name}"))
        .unwrap()
        .json()
}

fn wait_final(s: &Server, name: &str) -> Value {
    let mut last = Value::Null;
    wait_until(
        &format!("{name} is built"),
        Duration::from_secs(120),
        || {
            last = show(s, name);
            last["state"] != "building"
        },
    );
    last
}

fn layer_dirs(s: &Server) -> Vec<String> {
    std::fs::read_dir(s.data_dir.join("layers"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Nothing of a build is left: no container, no mount, no work directory, no partial layer.
fn no_build_leftovers(s: &Server) {
    let out = std::process::Command::new("runc")
        .arg("--root")
        .arg(s.data_dir.join("builds/runc"))
        .args(["list", "-q"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "",
        "build containers left"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let data = s.data_dir.display().to_string();
    assert!(
        !mounts.contains(&format!("{data}/builds/")),
        "build mounts left"
    );
    let mut left: Vec<String> = std::fs::read_dir(s.data_dir.join("builds"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["root", "runc"], "build directories left");
    assert!(
        layer_dirs(s).iter().all(|d| !d.starts_with(".tmp")),
        "{:?}",
        layer_dirs(s)
    );
}

#[test]
fn a_layer_is_built_once_shared_and_removed_when_unused() {
    if !runc_available() {
        return;
    }
    let f = Fixture::new(&[]);
    let s = f.start();
    let t0 = Instant::now();
    let r = s.put_fn(
        "calc",
        with_reqs("HLCalc==1.0  # the test package\n", USES_HLCALC),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let v: Value = r.json();
    assert_eq!(v["state"], "building", "{v}");
    let layer = v["layer"].as_str().unwrap().to_string();
    // Not runnable yet: a clear error naming what to look at.
    let early = s.invoke("calc", "{}");
    if early.status == 409 {
        let e: Value = early.json();
        assert_eq!(e["error"]["code"], "function_building", "{e}");
    }
    let v = wait_final(&s, "calc");
    assert_eq!(v["state"], "ready", "{v}");
    assert!(v.get("build_log").is_none());
    let first_ms = t0.elapsed().as_millis();
    let hex = layer.strip_prefix("sha256:").unwrap();
    let record: Value = serde_json::from_slice(
        &std::fs::read(s.data_dir.join("layers").join(hex).join("layer.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(record["modules"], json!(["hlcalc"]));
    assert_eq!(record["requirements"], "hlcalc==1.0\n");
    let site = s.data_dir.join("layers").join(hex).join("site");
    assert!(site.join("hlcalc/__init__.py").is_file());
    let pycache = std::fs::read_dir(site.join("hlcalc/__pycache__"))
        .unwrap()
        .count();
    assert!(pycache > 0, "bytecode compiled at build time");
    // The function's own code is byte-compiled too.
    let code_dirs: Vec<PathBuf> = std::fs::read_dir(s.data_dir.join("functions/calc"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(
        code_dirs.iter().any(|d| d
            .join("__pycache__")
            .read_dir()
            .is_ok_and(|mut r| r.next().is_some())),
        "no bytecode of the code"
    );

    // The same requirements, spelt otherwise: ready within a second, no new layer.
    let before = layer_dirs(&s);
    let t1 = Instant::now();
    let r = s.put_fn("calc2", with_reqs("hlcalc == 1.0\n", USES_HLCALC));
    assert_eq!(r.status, 201, "{}", r.text());
    let v: Value = r.json();
    assert_eq!(v["layer"], layer.as_str());
    let v = if v["state"] == "building" {
        wait_final(&s, "calc2")
    } else {
        v
    };
    let second_ms = t1.elapsed().as_millis();
    assert_eq!(v["state"], "ready", "{v}");
    assert!(second_ms < 1000, "second registration took {second_ms} ms");
    assert_eq!(layer_dirs(&s), before);
    eprintln!("first registration ready in {first_ms} ms, second in {second_ms} ms");

    // The list carries the state too.
    let list: Value = s.client().get("/v1/functions").unwrap().json();
    for f in list["functions"].as_array().unwrap() {
        assert_eq!(f["state"], "ready", "{f}");
    }

    // Running it needs the layer mounted at /hearth/deps in the sandbox (the pool helper's
    // part of issue 32): until that is merged, the import fails and this says so.
    let r = s.invoke("calc", r#"{"x": 6}"#);
    if r.status == 200 {
        assert_eq!(r.json()["result"], 43);
    } else {
        let text = r.text();
        assert!(text.contains("hlcalc"), "{text}");
        eprintln!("NOTE: the layer is not mounted in function sandboxes yet: {text}");
    }

    // Still used by calc2: kept; then by nobody: removed.
    assert_eq!(s.client().delete("/v1/functions/calc").unwrap().status, 204);
    std::thread::sleep(Duration::from_millis(300));
    assert!(layer_dirs(&s).contains(&hex.to_string()));
    assert_eq!(
        s.client().delete("/v1/functions/calc2").unwrap().status,
        204
    );
    wait_until(
        "the unused layer is removed",
        Duration::from_secs(10),
        || !layer_dirs(&s).contains(&hex.to_string()),
    );
    no_build_leftovers(&s);
}

#[test]
fn requirements_with_options_urls_or_paths_are_refused_at_registration() {
    if !runc_available() {
        return;
    }
    let f = Fixture::new(&[]);
    let s = f.start();
    for (reqs, line) in [
        ("hlcalc\n--index-url https://evil.example/simple\n", 2),
        ("# deps\nhlcalc @ https://evil.example/hlcalc.whl\n", 2),
        ("https://evil.example/x.whl\n", 1),
        ("-e .\n", 1),
        ("../../etc\n", 1),
        ("-r /etc/passwd\n", 1),
    ] {
        let r = s.put_fn("bad", with_reqs(reqs, USES_HLCALC));
        assert_eq!(r.status, 400, "{reqs}: {}", r.text());
        let text = r.text();
        assert!(text.contains(&format!("line {line}")), "{reqs}: {text}");
        assert!(
            !text.contains("evil.example") && !text.contains("passwd"),
            "{text}"
        );
    }
    assert_eq!(s.client().get("/v1/functions/bad").unwrap().status, 404);
}

#[test]
fn failed_builds_say_why_and_harm_nothing() {
    if !runc_available() {
        return;
    }
    let f = Fixture::new(&[("HEARTH_BUILD__MAX_LAYER_MB", "64")]);
    // A wheel for another ABI, and one for another machine: pip finds no match.
    make_wheel(
        &f.wheels(),
        "oldabi",
        "1.0",
        "cp27-cp27mu-manylinux1_x86_64",
        "x = 1\n",
        0,
    );
    make_wheel(
        &f.wheels(),
        "armonly",
        "1.0",
        "cp311-cp311-manylinux_2_17_aarch64",
        "x = 1\n",
        0,
    );
    // 100 MiB of random bytes: more than the layer may take.
    make_wheel(
        &f.wheels(),
        "huge",
        "1.0",
        "py3-none-any",
        "x = 1\n",
        100 << 20,
    );
    let s = f.start();
    let r = s.put_fn(
        "hello",
        json!({"code": {"files": {"main.py": "def main(a):\n    return 'hi'\n"}}, "memory_mb": 64}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    for (name, reqs, says) in [
        (
            "missing",
            "nosuchpackage==1.0\n",
            "No matching distribution",
        ),
        ("oldabi", "oldabi\n", "No matching distribution"),
        ("armonly", "armonly\n", "No matching distribution"),
        ("huge", "huge\n", "max_layer_mb"),
    ] {
        let r = s.put_fn(name, with_reqs(reqs, "def main(a):\n    return 1\n"));
        assert_eq!(r.status, 201, "{}", r.text());
        let v = wait_final(&s, name);
        assert_eq!(v["state"], "failed", "{name}: {v}");
        let log = v["build_log"].as_str().unwrap();
        assert!(log.contains(says), "{name}: {log}");
        assert!(log.len() <= 4096, "{name}: {} bytes of log", log.len());
        assert!(!log.contains(&s.data_dir.display().to_string()), "{log}");
        assert!(!log.contains(&f.wheels().display().to_string()), "{log}");
        let e = s.invoke(name, "{}");
        assert_eq!(e.status, 409, "{}", e.text());
        let e: Value = e.json();
        assert_eq!(e["error"]["code"], "function_build_failed", "{e}");
        assert!(e["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("hearth fn show {name}")));
    }
    // Nor can sandboxes of it be started ahead.
    let r = s
        .client()
        .post("/v1/functions/missing/prewarm", br#"{"count": 1}"#)
        .unwrap();
    assert_eq!(r.status, 409, "{}", r.text());
    // The function without requirements was never affected.
    assert_eq!(show(&s, "hello")["state"], "ready");
    let r = s.invoke("hello", "{}");
    assert_eq!(r.status, 200, "{}", r.text());
    no_build_leftovers(&s);
}

#[test]
fn a_build_over_its_time_is_killed_and_leaves_nothing() {
    if !runc_available() {
        return;
    }
    let f = Fixture::new(&[("HEARTH_BUILD__TIMEOUT_S", "1")]);
    make_wheel(
        &f.wheels(),
        "slow",
        "1.0",
        "py3-none-any",
        "x = 1\n",
        300 << 20,
    );
    let s = f.start();
    let r = s.put_fn("slow", with_reqs("slow\n", "def main(a):\n    return 1\n"));
    assert_eq!(r.status, 201, "{}", r.text());
    let v = wait_final(&s, "slow");
    assert_eq!(v["state"], "failed", "{v}");
    assert!(
        v["build_log"].as_str().unwrap().contains("timeout_s"),
        "{v}"
    );
    no_build_leftovers(&s);
}

#[test]
fn the_newest_registration_wins_over_a_build_still_running() {
    if !runc_available() {
        return;
    }
    let f = Fixture::new(&[("HEARTH_BUILD__MAX_LAYER_MB", "64")]);
    make_wheel(
        &f.wheels(),
        "toolarge",
        "1.0",
        "py3-none-any",
        "x = 1\n",
        100 << 20,
    );
    let s = f.start();
    // Version 1's build fails, slowly; version 2 (registered meanwhile) builds fine after it.
    let r = s.put_fn("f", with_reqs("toolarge\n", "def main(a):\n    return 1\n"));
    assert_eq!(r.status, 201, "{}", r.text());
    let r = s.put_fn("f", with_reqs("hlcalc\n", USES_HLCALC));
    assert_eq!(r.status, 200, "{}", r.text());
    let v2: Value = r.json();
    let v = wait_final(&s, "f");
    assert_eq!(v["version"], v2["version"]);
    assert_eq!(
        v["state"], "ready",
        "the old build decided the new version's state: {v}"
    );
    assert_eq!(v["layer"], v2["layer"]);
    // ?wait=true answers with the final state.
    let r = s
        .client()
        .put(
            "/v1/functions/g?wait=true",
            with_reqs("hlcalc\nhlcalc==1.0\n", USES_HLCALC)
                .to_string()
                .as_bytes(),
        )
        .unwrap();
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["state"], "ready");
    no_build_leftovers(&s);
}

#[test]
fn build_state_survives_a_restart_and_an_interrupted_build_runs_again() {
    if !runc_available() {
        return;
    }
    let f = Fixture::new(&[]);
    make_wheel(
        &f.wheels(),
        "bigger",
        "1.0",
        "py3-none-any",
        "x = 2\n",
        60 << 20,
    );
    let data = f.tmp.path().join("data");
    let env: Vec<(&str, &str)> = f
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let mut s = Server::start_in("runc", &data, &env);
    let r = s.put_fn("calc", with_reqs("hlcalc\n", USES_HLCALC));
    assert_eq!(r.status, 201);
    assert_eq!(wait_final(&s, "calc")["state"], "ready");
    let r = s.put_fn("bad", with_reqs("nosuchpackage\n", USES_HLCALC));
    assert_eq!(r.status, 201);
    assert_eq!(wait_final(&s, "bad")["state"], "failed");
    let r = s.put_fn("big", with_reqs("bigger\n", "def main(a):\n    return 1\n"));
    assert_eq!(r.status, 201);
    assert_eq!(show(&s, "big")["state"], "building");
    s.kill();
    s.restart();
    assert_eq!(show(&s, "calc")["state"], "ready");
    let bad = show(&s, "bad");
    assert_eq!(bad["state"], "failed");
    assert!(bad["build_log"]
        .as_str()
        .unwrap()
        .contains("No matching distribution"));
    assert_eq!(wait_final(&s, "big")["state"], "ready");
    no_build_leftovers(&s);
}

#[tokio::test]
async fn a_build_sandbox_reaches_no_network() {
    if !runc_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let store = hearth_worker::runtimes::RuntimeStore::new(runtime_store(tmp.path()));
    let runtime = store.resolve("python3.11").unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let builder = hearth_worker::layers::build::Builder::new(
        hearth_worker::layers::build::BuildSettings {
            find_links: Vec::new(),
            ..Default::default()
        },
        Path::new("runc"),
        &data,
        "netprobe",
        hearth_worker::config::RuncConfig::default().uid_base,
        hearth_worker::layers::LayerStore::new(data.join("layers")),
    )
    .await
    .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let probe = format!(
        "import socket\n\
         for host, port in [('127.0.0.1', {port}), ('10.255.255.1', 80), ('1.1.1.1', 443)]:\n\
         \x20   s = socket.socket(); s.settimeout(2)\n\
         \x20   try:\n\
         \x20       s.connect((host, port)); print('CONNECTED', host)\n\
         \x20   except OSError as e:\n\
         \x20       print('refused', host, type(e).__name__)\n\
         import os\n\
         print('uid', os.getuid())\n\
         try:\n\
         \x20   open('/usr/hearth-probe', 'w'); print('WROTE /usr')\n\
         except OSError:\n\
         \x20   print('usr read-only')\n"
    );
    let (ok, log) = builder
        .probe(
            &runtime,
            vec!["/usr/bin/python3".into(), "-c".into(), probe],
        )
        .await
        .unwrap();
    assert!(ok, "{log}");
    assert!(!log.contains("CONNECTED"), "{log}");
    assert_eq!(log.matches("refused").count(), 3, "{log}");
    assert!(
        log.contains("usr read-only") && !log.contains("uid 0\n"),
        "{log}"
    );
    drop(listener);
}

#[test]
fn the_cli_waits_for_the_build_and_shows_the_state() {
    if !runc_available() {
        return;
    }
    let f = Fixture::new(&[]);
    let s = f.start();
    let code = f.tmp.path().join("calc");
    std::fs::create_dir_all(&code).unwrap();
    std::fs::write(code.join("main.py"), USES_HLCALC).unwrap();
    std::fs::write(code.join("requirements.txt"), "hlcalc\n").unwrap();
    let code = code.display().to_string();
    let out = common::hearth(&[
        "fn", "register", "calc", "--code", &code, "--wait", "--url", &s.url,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["state"], "ready", "{v}");
    std::fs::write(
        f.tmp.path().join("calc/requirements.txt"),
        "nosuchpackage\n",
    )
    .unwrap();
    let out = common::hearth(&[
        "fn", "register", "calc", "--code", &code, "--wait", "--url", &s.url,
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("No matching distribution") && err.contains("hearth fn show calc"),
        "{err}"
    );
    let out = common::hearth(&["fn", "list", "--url", &s.url]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("STATE")
            && text
                .lines()
                .any(|l| l.starts_with("calc") && l.contains("failed")),
        "{text}"
    );
    let out = common::hearth(&["fn", "show", "calc", "--url", &s.url]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["state"], "failed");
    assert!(v["build_log"]
        .as_str()
        .unwrap()
        .contains("No matching distribution"));
}

#[test]
fn layers_and_bytecode_count_against_the_namespace_quotas() {
    if !runc_available() {
        return;
    }
    let f = Fixture::new(&[
        ("HEARTH_BUILD__MAX_LAYER_BYTES_PER_NAMESPACE", "20000"),
        ("HEARTH_MAX_CODE_BYTES_PER_NAMESPACE", "40000"),
    ]);
    make_wheel(&f.wheels(), "mid", "1.0", "py3-none-any", "x = 1\n", 50_000);
    let s = f.start();
    let r = s.put_fn("calc", with_reqs("hlcalc\n", USES_HLCALC));
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(wait_final(&s, "calc")["state"], "ready");
    // The layer's files are root's and nobody else may write them.
    let layer = show(&s, "calc")["layer"].as_str().unwrap().to_string();
    let site = s
        .data_dir
        .join("layers")
        .join(layer.strip_prefix("sha256:").unwrap())
        .join("site");
    for p in [
        site.clone(),
        site.join("hlcalc"),
        site.join("hlcalc/__init__.py"),
    ] {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.uid(), 0, "{}", p.display());
        assert_eq!(m.mode() & 0o022, 0, "{} is writable by others", p.display());
    }
    // A layer over the namespace's share fails, and is not kept.
    let r = s.put_fn("mid", with_reqs("mid\n", "def main(a):\n    return 1\n"));
    assert_eq!(r.status, 201, "{}", r.text());
    let v = wait_final(&s, "mid");
    assert_eq!(v["state"], "failed", "{v}");
    assert!(
        v["build_log"]
            .as_str()
            .unwrap()
            .contains("max_layer_bytes_per_namespace"),
        "{v}"
    );
    let mid = v["layer"]
        .as_str()
        .unwrap()
        .strip_prefix("sha256:")
        .unwrap()
        .to_string();
    wait_until(
        "the refused layer is removed",
        Duration::from_secs(10),
        || !layer_dirs(&s).contains(&mid),
    );
    // Code that fits, whose bytecode does not.
    let src: String = (0..700)
        .map(|i| format!("def f{i}(x):\n    return x + {i}\n"))
        .collect();
    assert!(src.len() < 30_000);
    let r = s.put_fn("bulky", json!({"code": {"files": {"main.py": format!("{src}def main(a):\n    return 1\n")}}, "memory_mb": 64}));
    assert_eq!(r.status, 201, "{}", r.text());
    let v = wait_final(&s, "bulky");
    assert_eq!(v["state"], "failed", "{v}");
    assert!(
        v["build_log"]
            .as_str()
            .unwrap()
            .contains("max_code_bytes_per_namespace"),
        "{v}"
    );
    assert_eq!(show(&s, "calc")["state"], "ready");
    no_build_leftovers(&s);
}

#[test]
fn registrations_that_need_the_same_layer_share_one_build() {
    if !runc_available() {
        return;
    }
    let f = Fixture::new(&[]);
    make_wheel(
        &f.wheels(),
        "shared",
        "1.0",
        "py3-none-any",
        "x = 3\n",
        30 << 20,
    );
    let s = f.start();
    let code = |n: u32| with_reqs(&format!("# {n}\nShared\n"), "def main(a):\n    return 1\n");
    for n in 0..3 {
        let r = s.put_fn(&format!("s{n}"), code(n));
        assert_eq!(r.status, 201, "{}", r.text());
        // Not in the store yet when each registered: they waited for the one running build.
        assert_eq!(r.json()["state"], "building", "{}", r.text());
    }
    let layers: Vec<Value> = (0..3)
        .map(|n| {
            let v = wait_final(&s, &format!("s{n}"));
            assert_eq!(v["state"], "ready", "{v}");
            v["layer"].clone()
        })
        .collect();
    assert!(layers.iter().all(|l| *l == layers[0]), "{layers:?}");
    let built = s.log_text().matches("layer built").count();
    assert_eq!(
        built,
        1,
        "one build for three registrations: {}",
        s.log_text()
    );
    assert_eq!(layer_dirs(&s).len(), 1, "{:?}", layer_dirs(&s));
    no_build_leftovers(&s);
}

/// A PEP 503 index served by Python's http.server on the host's loopback; stopped (by its
/// PID) when dropped.
struct LocalIndex {
    child: std::process::Child,
    port: u16,
}

impl LocalIndex {
    fn serve(root: &Path) -> LocalIndex {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new("python3")
            .args(["-m", "http.server", "--bind", "127.0.0.1"])
            .arg(port.to_string())
            .current_dir(root)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        wait_until("the index listens", Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        LocalIndex { child, port }
    }
}

impl Drop for LocalIndex {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// With `build.index_url`, a build installs from that index through the worker's
/// allow-listing proxy (its sandbox still has no network of its own).
#[test]
fn a_build_installs_from_its_index_through_the_proxy() {
    if !runc_available() {
        return;
    }
    let idx = tempfile::tempdir().unwrap();
    let pkg = idx.path().join("simple/hlindex");
    std::fs::create_dir_all(&pkg).unwrap();
    let wheel = make_wheel(
        &idx.path().join("simple/hlindex"),
        "hlindex",
        "2.0",
        "py3-none-any",
        "def compute(x):\n    return x * 11\n",
        0,
    );
    let file = wheel.file_name().unwrap().to_string_lossy().to_string();
    std::fs::write(
        pkg.join("index.html"),
        format!("<html><body><a href=\"{file}\">{file}</a></body></html>"),
    )
    .unwrap();
    let index = LocalIndex::serve(idx.path());
    let url = format!("http://127.0.0.1:{}/simple", index.port);
    let f = Fixture::new(&[
        ("HEARTH_BUILD__NO_INDEX", "false"),
        ("HEARTH_BUILD__FIND_LINKS", "[]"),
        ("HEARTH_BUILD__INDEX_URL", &url),
        ("HEARTH_BUILD__TIMEOUT_S", "60"),
    ]);
    let s = f.start();
    let src = "import hlindex\n\ndef main(args):\n    return hlindex.compute(3)\n";
    let r = s.put_fn("fromindex", with_reqs("hlindex==2.0\n", src));
    assert_eq!(r.status, 201, "{}", r.text());
    let v = wait_final(&s, "fromindex");
    assert_eq!(v["state"], "ready", "{v}");
    let r = s.invoke("fromindex", "{}");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["result"], 33);
    let log = show(&s, "fromindex");
    assert!(log.get("build_log").is_none(), "{log}");
    no_build_leftovers(&s);
    drop(s);
    // What else the proxy refuses (other ports and hosts, other methods, credentials in a
    // URL, endless heads, the download budget) is tested on the proxy itself
    // (crates/worker/src/layers/proxy.rs); that the build has no network of its own is
    // `a_build_sandbox_reaches_no_network`.
    drop(index);
}
