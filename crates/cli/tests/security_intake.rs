//! Code intake and input checks against hostile registrations (issue 11): `code.path` cannot
//! read the host, archives are bounded while they unpack, every number is range-checked, the
//! data directory is private, and unpacking never stalls the API.

mod common;

use base64::Engine;
use common::cluster::{join, wait_until};
use common::Server;
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// A worker whose config file allows `code.path` under `roots`, on `data_dir`.
fn worker_with_roots(data_dir: &Path, roots: &[&Path], env: &[(&str, &str)]) -> Server {
    let config = data_dir.with_extension("toml");
    let list: Vec<String> = roots
        .iter()
        .map(|r| format!("{:?}", r.display().to_string()))
        .collect();
    std::fs::write(
        &config,
        format!("code_path_roots = [{}]\n", list.join(", ")),
    )
    .unwrap();
    let config = config.to_str().unwrap().to_string();
    Server::run_hearth(
        &["worker", "--backend", "sim", "--config", &config],
        data_dir,
        env,
    )
}

/// The error of an answer: (code, message, whole error object).
fn error(r: &hearth_cli::client::Response) -> (String, String, Value) {
    let v = r.json();
    let e = v["error"].clone();
    (
        e["code"].as_str().unwrap_or_default().to_string(),
        e["message"].as_str().unwrap_or_default().to_string(),
        e,
    )
}

/// Asserts that no host path under the test's directories appears in `text`.
fn names_no_host_path(text: &str, paths: &[&Path]) {
    for p in paths {
        let p = p.display().to_string();
        assert!(
            !text.contains(&p),
            "the answer names the host path {p}: {text}"
        );
    }
    assert!(
        !text.contains("/tmp/"),
        "the answer names a host path: {text}"
    );
    assert!(
        !text.contains("/etc/"),
        "the answer names a host path: {text}"
    );
}

/// A tar.gz (base64) with the given entries appended by `build`.
fn targz(build: impl FnOnce(&mut tar::Builder<flate2::write::GzEncoder<Vec<u8>>>)) -> String {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    build(&mut b);
    let bytes = b.into_inner().unwrap().finish().unwrap();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn add_file(b: &mut tar::Builder<flate2::write::GzEncoder<Vec<u8>>>, name: &str, data: &[u8]) {
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    b.append_data(&mut h, name, data).unwrap();
}

/// A tar.gz holding main.py and one file of `zeros` zero bytes (compresses ~1000:1).
fn zero_bomb(zeros: u64) -> String {
    targz(|b| {
        add_file(b, "main.py", b"def main(a):\n    return a\n");
        let mut h = tar::Header::new_gnu();
        h.set_size(zeros);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, "data.bin", std::io::repeat(0).take_n(zeros))
            .unwrap();
    })
}

/// `Read::take` on `Repeat`, named so the call site reads.
trait TakeN: std::io::Read + Sized {
    fn take_n(self, n: u64) -> std::io::Take<Self> {
        std::io::Read::take(self, n)
    }
}
impl<R: std::io::Read> TakeN for R {}

#[test]
fn code_path_is_refused_unless_the_operator_allows_roots() {
    let s = Server::start("sim", &[]);
    // The attack: the worker's own data directory (another function's code and secrets).
    let r = s.put_fn("thief", json!({"code": {"path": s.data_dir}}));
    assert_eq!(r.status, 400, "{}", r.text());
    let (code, message, _) = error(&r);
    assert_eq!(code, "bad_request");
    assert!(message.contains("upload"), "{message}");
    assert!(message.contains("--code"), "{message}");
    names_no_host_path(&r.text(), &[&s.data_dir]);
    let r = s.put_fn("thief", json!({"code": {"path": "/etc/passwd"}}));
    assert_eq!(r.status, 400, "{}", r.text());
    names_no_host_path(&r.text(), &[]);
    assert!(s.client().get("/v1/functions/thief").unwrap().status == 404);
}

#[test]
fn code_path_roots_confine_copies_to_public_files_inside_them() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("functions");
    let data_dir = tmp.path().join("data");
    std::fs::create_dir_all(root.join("ok/pkg")).unwrap();
    std::fs::write(root.join("ok/main.py"), "def main(a):\n    return a\n").unwrap();
    std::fs::write(root.join("ok/pkg/util.py"), "X = 1\n").unwrap();
    std::fs::create_dir_all(root.join("private")).unwrap();
    std::fs::write(root.join("private/main.py"), "SECRET = 'hunter2'\n").unwrap();
    chmod(&root.join("private/main.py"), 0o600);
    std::fs::create_dir_all(root.join("linked")).unwrap();
    std::fs::write(root.join("linked/main.py"), "X = 1\n").unwrap();
    std::os::unix::fs::symlink("/etc/hostname", root.join("linked/host.txt")).unwrap();
    std::os::unix::fs::symlink("/etc", root.join("escape")).unwrap();
    for d in [
        tmp.path(),
        &root,
        &root.join("ok"),
        &root.join("ok/pkg"),
        &root.join("private"),
    ] {
        chmod(d, 0o755);
    }
    let s = worker_with_roots(&data_dir, &[&root, tmp.path()], &[]);
    let hidden = [tmp.path(), root.as_path(), data_dir.as_path()];

    let r = s.put_fn("ok", json!({"code": {"path": root.join("ok")}}));
    assert_eq!(r.status, 201, "{}", r.text());
    let got = s.client().get("/v1/functions").unwrap().json();
    assert_eq!(got["functions"][0]["name"], "ok");

    // A 0600 file would become readable by every sandbox: refused, its content never echoed.
    let r = s.put_fn("private", json!({"code": {"path": root.join("private")}}));
    assert_eq!(r.status, 400, "{}", r.text());
    let (_, message, _) = error(&r);
    assert!(
        message.contains("main.py"),
        "names the file inside the tree: {message}"
    );
    assert!(message.contains("readable"), "{message}");
    assert!(!r.text().contains("hunter2"), "{}", r.text());
    names_no_host_path(&r.text(), &hidden);

    // A symlink inside the tree that leads out of it.
    let r = s.put_fn("linked", json!({"code": {"path": root.join("linked")}}));
    assert_eq!(r.status, 400, "{}", r.text());
    let (_, message, _) = error(&r);
    assert!(
        message.contains("host.txt") && message.contains("symbolic link"),
        "{message}"
    );
    names_no_host_path(&r.text(), &hidden);

    // The path itself resolving out of the roots, a path outside them, one that does not exist:
    // all the same answer (no probing of the host's files).
    let mut answers = Vec::new();
    for p in [root.join("escape"), "/etc".into(), root.join("nope")] {
        let r = s.put_fn("out", json!({"code": {"path": p}}));
        assert_eq!(r.status, 400, "{}", r.text());
        names_no_host_path(&r.text(), &hidden);
        answers.push(error(&r).1);
    }
    assert!(answers.iter().all(|a| *a == answers[0]), "{answers:?}");

    // The server's own data directory, even inside a root, and a directory holding it.
    for p in [
        data_dir.clone(),
        data_dir.join("functions"),
        tmp.path().to_path_buf(),
    ] {
        let r = s.put_fn("thief", json!({"code": {"path": p}}));
        assert_eq!(r.status, 400, "{}", r.text());
        names_no_host_path(&r.text(), &hidden);
    }
    assert!(s.client().get("/v1/functions/thief").unwrap().status == 404);
}

#[test]
fn archives_are_bounded_while_they_unpack() {
    let s = Server::start(
        "sim",
        &[
            ("HEARTH_MAX_CODE_UNPACKED_BYTES", "1048576"),
            ("HEARTH_MAX_CODE_FILES", "20"),
        ],
    );
    let r = s.put_fn("bomb", json!({"code": {"archive": zero_bomb(8 << 20)}}));
    assert_eq!(r.status, 413, "{}", r.text());
    let (code, message, e) = error(&r);
    assert_eq!(code, "code_too_large");
    assert!(
        message.contains("max_code_unpacked_bytes") && message.contains("1048576"),
        "{message}"
    );
    assert_eq!(e["limit"], 1048576, "{e}");

    let many = targz(|b| {
        add_file(b, "main.py", b"def main(a):\n    return a\n");
        for i in 0..30 {
            add_file(b, &format!("m{i}.py"), b"");
        }
    });
    let r = s.put_fn("many", json!({"code": {"archive": many}}));
    assert_eq!(r.status, 413, "{}", r.text());
    let (code, message, _) = error(&r);
    assert_eq!(code, "code_too_large");
    assert!(
        message.contains("max_code_files") && message.contains("20"),
        "{message}"
    );

    let files: serde_json::Map<String, Value> =
        (0..30).map(|i| (format!("m{i}.py"), json!(""))).collect();
    let r = s.put_fn("many", json!({"code": {"files": files}}));
    assert_eq!(r.status, 413, "{}", r.text());

    // Nothing of the refused uploads stays on disk.
    let left: Vec<_> = walk(&s.data_dir.join("functions"));
    assert!(left.iter().all(|p| !p.ends_with("data.bin")), "{left:?}");
    assert!(s.client().get("/v1/functions/bomb").unwrap().status == 404);
}

#[test]
fn the_default_unpacked_limit_stops_a_zip_bomb() {
    let s = Server::start("sim", &[]);
    let bomb = zero_bomb(300 << 20);
    assert!(
        bomb.len() < 3 << 20,
        "the bomb is small on the wire: {}",
        bomb.len()
    );
    let r = s.put_fn("bomb", json!({"code": {"archive": bomb}}));
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(error(&r).1.contains("262144000"), "{}", r.text());
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn archives_hold_only_files_and_directories_inside_the_tree() {
    let s = Server::start("sim", &[]);
    let main = b"def main(a):\n    return a\n";
    let link = |kind: tar::EntryType, name: &str, target: &str| {
        let (name, target) = (name.to_string(), target.to_string());
        targz(move |b| {
            add_file(b, "main.py", main);
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_size(0);
            h.set_mode(0o644);
            b.append_link(&mut h, &name, &target).unwrap();
        })
    };
    for (what, archive) in [
        (
            "symlink",
            link(tar::EntryType::Symlink, "passwd", "/etc/passwd"),
        ),
        (
            "hard link",
            link(tar::EntryType::Link, "shadow", "/etc/shadow"),
        ),
    ] {
        let r = s.put_fn("links", json!({"code": {"archive": archive}}));
        assert_eq!(r.status, 400, "{what}: {}", r.text());
        assert!(
            error(&r).1.contains("regular files and directories"),
            "{}",
            r.text()
        );
    }
    let device = targz(|b| {
        add_file(b, "main.py", main);
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Char);
        h.set_size(0);
        h.set_mode(0o666);
        h.set_path("null").unwrap();
        h.set_cksum();
        b.append(&h, std::io::empty()).unwrap();
    });
    let r = s.put_fn("dev", json!({"code": {"archive": device}}));
    assert_eq!(r.status, 400, "{}", r.text());

    // Absolute and `..` names, written into raw headers (the builder refuses them).
    for bad in ["/etc/cron.d/x", "../../x.py", "a/../../x.py"] {
        let archive = targz(|b| {
            add_file(b, "main.py", main);
            let mut h = tar::Header::new_old();
            let raw = &mut h.as_old_mut().name;
            raw[..bad.len()].copy_from_slice(bad.as_bytes());
            h.set_size(1);
            h.set_mode(0o644);
            h.set_cksum();
            b.append(&h, &b"x"[..]).unwrap();
        });
        let r = s.put_fn("escape", json!({"code": {"archive": archive}}));
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
    }
    assert!(s.client().get("/v1/functions/escape").unwrap().status == 404);
}

#[test]
fn bad_file_names_are_bad_requests() {
    let s = Server::start("sim", &[]);
    let main = "def main(a):\n    return a\n";
    for files in [
        json!({"main.py": main, "a": "", "a/b.py": ""}),
        json!({"main.py": main, "pkg/": ""}),
        json!({"main.py": main, "x\u{0}y.py": ""}),
        json!({"main.py": main, "../x.py": ""}),
        json!({"main.py": main, "/x.py": ""}),
        json!({"main.py": main, "": ""}),
        json!({"main.py": main, "./x.py": ""}),
    ] {
        let r = s.put_fn("f", json!({"code": {"files": files}}));
        assert_eq!(r.status, 400, "{files}: {}", r.text());
        names_no_host_path(&r.text(), &[&s.data_dir]);
    }
}

#[test]
fn numbers_out_of_range_are_refused_with_the_field_and_bounds() {
    let s = Server::start("sim", &[]);
    let env65: serde_json::Map<String, Value> =
        (0..65).map(|i| (format!("V{i}"), json!("x"))).collect();
    for (body, field, min, max) in [
        (
            json!({"deadline_ms": u64::MAX}),
            "deadline_ms",
            json!(1),
            json!(900000),
        ),
        (
            json!({"deadline_ms": 0}),
            "deadline_ms",
            json!(1),
            json!(900000),
        ),
        (
            json!({"sim_cold_ms": 1e308}),
            "sim_cold_ms",
            json!(0),
            json!(3600000),
        ),
        (
            json!({"sim_warm_ms": -1}),
            "sim_warm_ms",
            json!(0),
            json!(3600000),
        ),
        (
            json!({"priority": 1_000_000}),
            "priority",
            json!(-1000),
            json!(1000),
        ),
        (
            json!({"memory_mb": 1}),
            "memory_mb",
            json!(16),
            json!(65536),
        ),
        (json!({"cpus": 1000}), "cpus", json!(0.01), json!(64)),
        (
            json!({"timeout_ms": 0}),
            "timeout_ms",
            json!(1),
            json!(900000),
        ),
        (json!({"env": env65}), "env", json!(0), json!(64)),
        (
            json!({"env": {"BIG": "x".repeat(5000)}}),
            "env",
            json!(0),
            json!(4096),
        ),
        (
            json!({"handler": format!("m.{}", "h".repeat(300))}),
            "handler",
            json!(0),
            json!(256),
        ),
    ] {
        let r = s.put_fn("f", body.clone());
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        let (code, message, e) = error(&r);
        assert_eq!(code, "bad_request");
        assert_eq!(e["field"], field, "{body}: {e}");
        assert_eq!(e["min"], min, "{body}: {e}");
        assert_eq!(e["max"], max, "{body}: {e}");
        assert!(message.contains(field), "{message}");
        assert!(message.contains(&max.to_string()), "{message}");
    }
    let r = s.put_fn("f", json!({"sim_warm_ms": 5}));
    assert_eq!(r.status, 201, "{}", r.text());
    for count in [0, 1001, 4_000_000_000u32] {
        let r = s
            .client()
            .post(
                "/v1/functions/f/prewarm",
                json!({"count": count}).to_string().as_bytes(),
            )
            .unwrap();
        assert_eq!(r.status, 400, "{}", r.text());
        let (_, _, e) = error(&r);
        assert_eq!(
            (e["field"].clone(), e["min"].clone(), e["max"].clone()),
            (json!("count"), json!(1), json!(1000)),
            "{e}"
        );
    }
}

#[test]
fn the_controller_checks_specs_like_workers_and_knows_their_memory() {
    let c = Server::start_controller("ch-rlu", &[]);
    let r = c.put_fn("f", json!({"deadline_ms": u64::MAX}));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(error(&r).2["field"], "deadline_ms");
    let r = c.put_fn("f", json!({"code": {"path": c.data_dir}}));
    assert_eq!(r.status, 400, "{}", r.text());
    names_no_host_path(&r.text(), &[&c.data_dir]);
    let _w = join(&c, None, &[("HEARTH_MEMORY_MB", "2048")]);
    wait_until("the worker is up", Duration::from_secs(10), || {
        c.status()["workers_up"] == 1
    });
    let r = c.put_fn("huge", json!({"memory_mb": 4096, "sim_warm_ms": 1}));
    assert_eq!(r.status, 400, "{}", r.text());
    let (_, message, _) = error(&r);
    assert!(
        message.contains("2048") && message.contains("memory_mb"),
        "{message}"
    );
    let r = c.put_fn("fits", json!({"memory_mb": 2048, "sim_warm_ms": 1}));
    assert_eq!(r.status, 201, "{}", r.text());
    let r = c
        .client()
        .post("/v1/functions/fits/prewarm", br#"{"count": 0}"#)
        .unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(error(&r).2["field"], "count");
}

#[test]
fn the_data_directory_and_database_are_private() {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("data");
    std::fs::create_dir_all(&data_dir).unwrap();
    chmod(&data_dir, 0o755); // an existing data directory from before is fixed at start
    let s = Server::start_in("sim", &data_dir, &[]);
    let r = s.put_fn("f", json!({"sim_warm_ms": 1, "env": {"TOKEN": "secret"}}));
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(mode(&data_dir), 0o700);
    for f in ["hearth.db", "hearth.db-wal", "hearth.db-shm"] {
        let p = data_dir.join(f);
        if p.exists() || f == "hearth.db" {
            assert_eq!(mode(&p), 0o600, "{f}");
        }
    }
    let fresh = tmp.path().join("fresh/nested");
    let c = Server::start_controller_in(&fresh, "ch-rlu", &[]);
    assert_eq!(mode(&fresh), 0o700);
    assert_eq!(mode(&fresh.join("hearth.db")), 0o600);
    drop(c);
}

/// Registrations unpack off the async threads: while several big ones are unpacking at once,
/// `/healthz` answers, and they are all still unpacking when it does (ordering, not timing).
#[test]
fn a_worker_answers_health_while_big_registrations_unpack() {
    health_answers_while_big_registrations_unpack(&Server::start("sim", &[]));
}

#[test]
fn a_controller_answers_health_while_big_registrations_unpack() {
    health_answers_while_big_registrations_unpack(&Server::start_controller("ch-rlu", &[]));
}

fn health_answers_while_big_registrations_unpack(s: &Server) {
    let n = 3;
    let bomb = std::sync::Arc::new(zero_bomb(200 << 20));
    let regs: Vec<_> = (0..n)
        .map(|i| {
            let (url, bomb) = (s.url.clone(), std::sync::Arc::clone(&bomb));
            std::thread::spawn(move || {
                let body = format!(r#"{{"code": {{"archive": "{bomb}"}}}}"#);
                let mut c = common::client_for(&url).unwrap();
                c.put(&format!("/v1/functions/big{i}"), body.as_bytes())
                    .unwrap()
                    .status
            })
        })
        .collect();
    let incoming = s.data_dir.join("functions/.incoming");
    let unpacking = || std::fs::read_dir(&incoming).map_or(0, |d| d.count());
    wait_until(
        "every registration is unpacking",
        Duration::from_secs(60),
        || unpacking() == n,
    );
    let r = s.client().get("/healthz").unwrap();
    assert_eq!(r.status, 200);
    let still = unpacking();
    assert_eq!(
        still, n,
        "health answered only after a registration finished unpacking"
    );
    for t in regs {
        assert_eq!(t.join().unwrap(), 201);
    }
    assert_eq!(unpacking(), 0, "staging directories are cleaned up");
}
