//! Runtime images (issue 32 §1): a sandbox's `/usr` and `/etc` come from the runtime image its
//! function was registered with, never from the host; an image imported from an OCI archive
//! runs functions too; a function keeps its image's digest.
//!
//! Needs root, runc and the default runtime image (`scripts/build-runtime.sh`). Without root
//! and runc these tests say why and pass, unless `HEARTH_REQUIRE_RUNC=1`.

mod common;

use common::{runc_available, Server};
use hearth_worker::runtimes::{RuntimeStore, DEFAULT_RUNTIME, DEFAULT_STORE_DIR};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

const PROBE: &str = r#"
import os, sys

def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError as e:
        return "error %d" % e.errno

def write(path):
    try:
        with open(path, "w") as f:
            f.write("x")
        return "written"
    except OSError as e:
        return "error %d" % e.errno

def main(args):
    return {
        "version": sys.version.split()[0],
        "executable": sys.executable,
        "debian": read("/etc/debian_version"),
        "etc": read("/etc/" + args["etc"]),
        "usr": read("/usr/local/" + args["usr"]),
        "write_usr": write("/usr/lib/hearth-probe"),
        "write_etc": write("/etc/hearth-probe"),
    }
"#;

fn store() -> RuntimeStore {
    RuntimeStore::new(DEFAULT_STORE_DIR)
}

fn default_rootfs() -> std::path::PathBuf {
    store()
        .resolve(DEFAULT_RUNTIME)
        .unwrap_or_else(|| {
            panic!("no {DEFAULT_RUNTIME} runtime image: run scripts/build-runtime.sh as root")
        })
        .rootfs
}

fn probe_spec(extra: Value) -> Value {
    let mut v = json!({"code": {"files": {"main.py": PROBE}}, "memory_mb": 64});
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

/// Files that exist on the host only: a sandbox must not see them.
struct HostOnly {
    etc: String,
    usr: String,
}

impl HostOnly {
    fn create() -> HostOnly {
        let tag = format!("hearth-host-only-{}", std::process::id());
        std::fs::write(format!("/etc/{tag}"), "host secret").unwrap();
        std::fs::create_dir_all("/usr/local").unwrap();
        std::fs::write(format!("/usr/local/{tag}"), "host secret").unwrap();
        HostOnly {
            etc: tag.clone(),
            usr: tag,
        }
    }
}

impl Drop for HostOnly {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(format!("/etc/{}", self.etc));
        let _ = std::fs::remove_file(format!("/usr/local/{}", self.usr));
    }
}

#[test]
fn a_sandbox_sees_its_runtime_image_and_nothing_of_the_hosts_usr_and_etc() {
    if !runc_available() {
        return;
    }
    let rootfs = default_rootfs();
    let image_debian = std::fs::read_to_string(rootfs.join("etc/debian_version")).unwrap();
    let digest = store().resolve(DEFAULT_RUNTIME).unwrap().digest;
    let host = HostOnly::create();
    for (pool, path) in [("0", "fresh"), ("1", "generic")] {
        let s = Server::start("runc", &[("HEARTH_GENERIC_POOL", pool)]);
        let r = s.put_fn("rtprobe", probe_spec(json!({})));
        assert_eq!(r.status, 201, "{}", r.text());
        assert_eq!(r.json()["runtime_digest"], digest.as_str());
        if path == "generic" {
            s.wait_generic_ready();
        }
        let args = json!({"etc": host.etc, "usr": host.usr}).to_string();
        let r = s.invoke("rtprobe", &args);
        assert_eq!(r.status, 200, "{}", r.text());
        let a = r.json();
        assert_eq!(a["cold_path"], path, "{a}");
        let v = &a["result"];
        // The image's Debian and Python, not the host's (whose python3 may differ).
        assert_eq!(v["debian"], image_debian.trim(), "{v}");
        assert_eq!(v["executable"], "/usr/bin/python3");
        assert!(v["version"].as_str().unwrap().starts_with("3.11."), "{v}");
        // ENOENT: the host-only files do not exist in the sandbox.
        assert_eq!(v["etc"], "error 2", "{v}");
        assert_eq!(v["usr"], "error 2", "{v}");
        // Landlock answers EACCES (13) before the read-only mount's EROFS (30).
        for k in ["write_usr", "write_etc"] {
            let e = v[k].as_str().unwrap();
            assert!(e == "error 13" || e == "error 30", "{k}: {v}");
        }
        assert!(!rootfs.join("usr/lib/hearth-probe").exists());
        assert!(!rootfs.join("etc/hearth-probe").exists());
    }
}

#[test]
fn an_unknown_runtime_is_refused_and_a_clients_digest_is_replaced() {
    if !runc_available() {
        return;
    }
    let s = Server::start("runc", &[("HEARTH_GENERIC_POOL", "0")]);
    let r = s.put_fn("rtbad", probe_spec(json!({"runtime": "python9.9"})));
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("python9.9"), "{}", r.text());
    assert!(r.text().contains(DEFAULT_RUNTIME), "{}", r.text());
    let fake = format!("sha256:{}", "0".repeat(64));
    let r = s.put_fn("rtpin", probe_spec(json!({"runtime_digest": fake})));
    assert_eq!(r.status, 201, "{}", r.text());
    let real = store().resolve(DEFAULT_RUNTIME).unwrap().digest;
    assert_eq!(r.json()["runtime_digest"], real.as_str());
    let listed = s.client().get("/v1/runtimes").unwrap().json();
    let names: Vec<&str> = listed["runtimes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&DEFAULT_RUNTIME), "{listed}");
    // The list is for keys that may manage functions: not for anonymous callers, nor for a
    // key that may only invoke; a namespace's admin key may read it.
    assert_eq!(s.anonymous().get("/v1/runtimes").unwrap().status, 401);
    let invoker = s.new_key("team-a", "invoke");
    assert_eq!(
        s.client_with(&invoker).get("/v1/runtimes").unwrap().status,
        403
    );
    let admin = s.new_key("team-a", "admin");
    assert_eq!(
        s.client_with(&admin).get("/v1/runtimes").unwrap().status,
        200
    );
}

/// Packs `rootfs` into an OCI image archive with umoci, as an operator's image would come.
fn oci_archive(rootfs: &Path, dir: &Path) -> std::path::PathBuf {
    let layout = dir.join("layout");
    let bundle = dir.join("bundle");
    let run = |args: &[&str]| {
        let st = Command::new("umoci").args(args).status().unwrap();
        assert!(st.success(), "umoci {args:?}");
    };
    let l = layout.to_str().unwrap();
    run(&["init", "--layout", l]);
    run(&["new", "--image", &format!("{l}:rt")]);
    run(&[
        "unpack",
        "--image",
        &format!("{l}:rt"),
        bundle.to_str().unwrap(),
    ]);
    let st = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", rootfs.display()))
        .arg(bundle.join("rootfs"))
        .status()
        .unwrap();
    assert!(st.success());
    // A marker of this image: the imported runtime must be what the sandbox sees.
    std::fs::write(bundle.join("rootfs/etc/hearth-image"), "imported").unwrap();
    run(&[
        "repack",
        "--image",
        &format!("{l}:rt"),
        bundle.to_str().unwrap(),
    ]);
    let archive = dir.join("image.tar");
    let st = Command::new("tar")
        .arg("-C")
        .arg(&layout)
        .arg("-cf")
        .arg(&archive)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success());
    archive
}

#[test]
fn an_imported_oci_image_runs_functions_and_a_function_keeps_its_digest() {
    if !runc_available() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let archive = oci_archive(&default_rootfs(), t.path());
    let store_dir = t.path().join("store");
    // The default image too, so the worker starts: import the same tree under its name.
    let hearth = env!("CARGO_BIN_EXE_hearth");
    let import = |name: &str, file: &Path| {
        Command::new(hearth)
            .args(["runtime", "import", name])
            .arg(file)
            .arg("--store")
            .arg(&store_dir)
            .output()
            .unwrap()
    };
    let out = import("python3.11", &archive);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = import("custom1", &archive);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = Command::new(hearth)
        .args(["runtime", "list", "--store"])
        .arg(&store_dir)
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout).to_string();
    assert!(
        listed.contains("custom1") && listed.contains("sha256:"),
        "{listed}"
    );

    // An archive without Python is refused, and says so without naming host paths.
    let empty = t.path().join("empty");
    std::fs::create_dir_all(empty.join("etc")).unwrap();
    let bad_archive = oci_archive(&empty, &t.path().join("bad"));
    let out = import("nopython", &bad_archive);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no /usr/bin/python3"), "{err}");
    assert!(!err.contains(t.path().to_str().unwrap()), "{err}");

    let store_env = store_dir.to_str().unwrap();
    let s = Server::start(
        "runc",
        &[
            ("HEARTH_GENERIC_POOL", "0"),
            ("HEARTH_RUNC__RUNTIME_STORE", store_env),
        ],
    );
    let r = s.put_fn("rtcustom", probe_spec(json!({"runtime": "custom1"})));
    assert_eq!(r.status, 201, "{}", r.text());
    let pinned = r.json()["runtime_digest"].as_str().unwrap().to_string();
    let args = json!({"etc": "hearth-image", "usr": "none"}).to_string();
    let r = s.invoke("rtcustom", &args);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["result"]["etc"], "imported");

    // The name is pointed at another image (the default one, rebuilt elsewhere): the
    // function keeps the digest it was registered with.
    let other = store().resolve(DEFAULT_RUNTIME).unwrap();
    let names = store_dir.join("names");
    std::fs::write(names.join("custom1"), &other.digest).unwrap();
    let f = s.client().get("/v1/functions/rtcustom").unwrap().json();
    assert_eq!(f["runtime_digest"], pinned.as_str());
}
