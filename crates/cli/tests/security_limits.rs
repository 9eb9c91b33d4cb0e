//! Bounded resources at the HTTP edge and in results (issue 11): connection floods, slow heads,
//! oversize results, the async store's size and the guessability of async ids. Each test is an
//! attack that worked before the limits existed.
//!
//! The runc tests need root and runc; without them they say why and pass, unless
//! `HEARTH_REQUIRE_RUNC=1`.

mod common;

use common::cluster::{patient_client, wait_members, wait_until};
use common::{read_until_closed, runc_available, wait_invocation, Server};
use hearth_cli::client::Client;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn inline(src: &str) -> Value {
    json!({"code": {"files": {"main.py": src}}, "memory_mb": 64})
}

fn sim_fn() -> Value {
    json!({"sim_warm_ms": 1, "sim_cold_ms": 1, "memory_mb": 64})
}

/// The start of a body, for failure messages (a failing result test may get megabytes).
fn head(text: &str) -> String {
    text.chars().take(300).collect()
}

fn addr_of(s: &Server) -> String {
    s.url.trim_start_matches("http://").to_string()
}

/// Raises this process's soft open-file limit to its hard one (the test opens > 1,024 sockets).
fn raise_own_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    assert!(lim.rlim_cur >= 2048, "the test needs 2048 open files");
}

/// A sim worker whose open-file limit is 1,024 (soft and hard), like a default systemd or
/// container setting.
struct LimitedWorker {
    url: String,
    child: Child,
    _tmp: tempfile::TempDir,
}

impl LimitedWorker {
    fn start(env: &[(&str, &str)]) -> LimitedWorker {
        let tmp = tempfile::Builder::new()
            .prefix("hearth-test-")
            .tempdir()
            .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let listen = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hearth"));
        cmd.args(["worker", "--backend", "sim", "--listen", &listen])
            .arg("--data-dir")
            .arg(tmp.path().join("data"))
            .env("HEARTH_SHUTDOWN_GRACE_S", "2")
            .env("HEARTH_LOG", "warn")
            .env_remove("HEARTH_REQUIRE_RUNC")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(tmp.path().join("log")).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        unsafe {
            cmd.pre_exec(|| {
                let lim = libc::rlimit {
                    rlim_cur: 1024,
                    rlim_max: 1024,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn hearth");
        let w = LimitedWorker {
            url: format!("http://{listen}"),
            child,
            _tmp: tmp,
        };
        wait_until("the worker answers", Duration::from_secs(30), || {
            w.get("/healthz").is_some_and(|r| r.status == 200)
        });
        w
    }

    fn client(&self) -> Client {
        let key = std::fs::read_to_string(self._tmp.path().join("data/admin.key")).ok();
        Client::new(&self.url)
            .unwrap()
            .with_token(key.map(|k| k.trim().to_string()))
            .with_timeout(Some(Duration::from_secs(5)))
    }

    fn get(&self, path: &str) -> Option<hearth_cli::client::Response> {
        self.client().get(path).ok()
    }
}

impl Drop for LimitedWorker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// 1,100 idle connections used to take every descriptor of a worker limited to 1,024 open
/// files, and it answered nothing more. Now the excess is refused and the idle ones are closed,
/// so it still answers health checks and invocations while the attacker holds its sockets.
#[test]
fn idle_connections_do_not_stop_a_worker_limited_to_1024_open_files() {
    raise_own_fd_limit();
    let w = LimitedWorker::start(&[("HEARTH_IDLE_TIMEOUT_MS", "1000")]);
    let addr = w.url.trim_start_matches("http://").to_string();
    let held: Vec<TcpStream> = (0..1100)
        .filter_map(|_| TcpStream::connect(&addr).ok())
        .collect();
    assert!(held.len() > 1024, "only {} connections opened", held.len());
    wait_until(
        "the worker answers /healthz",
        Duration::from_secs(60),
        || w.get("/healthz").is_some_and(|r| r.status == 200),
    );
    let mut c = w.client();
    let r = c
        .put("/v1/functions/f", sim_fn().to_string().as_bytes())
        .unwrap();
    assert_eq!(r.status, 201, "{}", r.text());
    let r = c.post("/v1/functions/f/invoke", b"{}").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    drop(held);
}

/// A connection over `max_connections` is answered 503 `too_many_connections` with
/// `Connection: close` at once and closed, instead of being held (or never accepted).
#[test]
fn connections_over_the_cap_get_503_too_many_connections_and_are_closed() {
    let s = Server::start(
        "sim",
        &[
            ("HEARTH_MAX_CONNECTIONS", "3"),
            ("HEARTH_IDLE_TIMEOUT_MS", "600000"),
        ],
    );
    let addr = addr_of(&s);
    let mut held = Vec::new();
    for _ in 0..3 {
        // Each one is proven accepted by an answer on it. The start-up health probe's own
        // connection may still count for a moment after the probe closed it: a 503 then is
        // retried, for at most 2 s.
        let mut tries = 0;
        let t = loop {
            let mut t = TcpStream::connect(&addr).unwrap();
            t.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            t.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            let mut buf = [0u8; 1024];
            let n = t.read(&mut buf).unwrap();
            if buf[..n].starts_with(b"HTTP/1.1 200") {
                break t;
            }
            tries += 1;
            assert!(
                tries < 100 && buf[..n].starts_with(b"HTTP/1.1 503"),
                "{}",
                String::from_utf8_lossy(&buf[..n])
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        held.push(t);
    }
    let mut over = TcpStream::connect(&addr).unwrap();
    let got = read_until_closed(&mut over).expect("the connection over the cap was held open");
    let text = String::from_utf8_lossy(&got).to_string();
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("connection: close"),
        "{text}"
    );
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    let v: Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["error"]["code"], "too_many_connections", "{text}");
    // A slot freed by a client is usable again.
    drop(held.pop());
    wait_until("a freed slot is reused", Duration::from_secs(20), || {
        patient_client(&s)
            .get("/healthz")
            .is_ok_and(|r| r.status == 200)
    });
}

/// Slowloris: half a request head, then nothing. The connection used to stay open forever.
#[test]
fn a_half_sent_request_head_is_closed_after_the_header_timeout() {
    let s = Server::start("sim", &[("HEARTH_HEADER_READ_TIMEOUT_MS", "500")]);
    let mut slow = TcpStream::connect(addr_of(&s)).unwrap();
    slow.write_all(b"POST /v1/functions/f/invoke HTTP/1.1\r\nHost: x\r\nContent-")
        .unwrap();
    assert!(
        read_until_closed(&mut slow).is_some(),
        "a half-sent head kept its connection"
    );
    // A whole request on a fresh connection is unaffected.
    assert_eq!(patient_client(&s).get("/healthz").unwrap().status, 200);
}

/// Async ids were `<process prefix>-<counter>`: anyone could read another caller's result by
/// guessing the next number.
#[test]
fn async_ids_are_128_random_bits() {
    let s = Server::start("sim", &[]);
    assert_eq!(s.put_fn("f", sim_fn()).status, 201);
    let mut c = patient_client(&s);
    let ids: Vec<String> = (0..2)
        .map(|_| {
            let r = c.post("/v1/functions/f/invoke?async=true", b"{}").unwrap();
            assert_eq!(r.status, 202, "{}", r.text());
            r.json()["id"].as_str().unwrap().to_string()
        })
        .collect();
    for id in &ids {
        assert!(
            id.len() >= 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "{id}"
        );
    }
    let common = ids[0]
        .bytes()
        .zip(ids[1].bytes())
        .take_while(|(a, b)| a == b)
        .count();
    assert!(common < 8, "consecutive ids share a prefix: {ids:?}");
    for id in &ids {
        assert_eq!(wait_invocation(&s, id)["status"], "succeeded");
    }
}

/// A handler returning more than `max_result_bytes`: refused by the agent with a clear error
/// (it used to pass up to 64 MiB, and over that was reported as a crash), and the sandbox stays
/// warm for the next call.
#[test]
fn a_result_over_max_result_bytes_is_502_result_too_large_and_the_sandbox_stays_warm() {
    if !runc_available() {
        return;
    }
    let s = Server::start("runc", &[("HEARTH_MAX_RESULT_BYTES", "65536")]);
    let src = "def main(args):\n    return 'x' * args['n']\n";
    assert_eq!(s.put_fn("big", inline(src)).status, 201);
    let r = s.invoke("big", r#"{"n": 100000}"#);
    assert_eq!(r.status, 502, "{}", head(&r.text()));
    let e = r.error_body().unwrap().error;
    assert_eq!(e.code.as_str(), "result_too_large", "{}", r.text());
    assert!(e.message.contains("65536"), "{}", e.message);
    let v = s.invoke("big", r#"{"n": 10}"#).json();
    assert_eq!(v["result"], "x".repeat(10), "{v}");
    assert_eq!(v["cold"], false, "the sandbox was not kept: {v}");
}

/// Code in the sandbox switches the agent's own check off and sends a huge result: the worker
/// stops reading at the limit, answers `result_too_large` and replaces the sandbox.
#[test]
fn a_sandbox_that_bypasses_the_agents_limit_is_cut_off_and_replaced() {
    if !runc_available() {
        return;
    }
    let s = Server::start("runc", &[("HEARTH_MAX_RESULT_BYTES", "65536")]);
    let src = "import sys\n\ndef main(args):\n    if args.get('evil'):\n        \
               sys.modules['__main__'].MAX_RESULT = 0\n        return 'x' * 1000000\n    \
               return 'ok'\n";
    assert_eq!(s.put_fn("evil", inline(src)).status, 201);
    let r = s.invoke("evil", r#"{"evil": true}"#);
    assert_eq!(r.status, 502, "{}", head(&r.text()));
    let e = r.error_body().unwrap().error;
    assert_eq!(e.code.as_str(), "result_too_large", "{}", e.message);
    assert!(e.message.contains("65536"), "{}", e.message);
    let v = s.invoke("evil", "{}").json();
    assert_eq!(v["result"], "ok", "{v}");
    assert_eq!(
        v["cold"], true,
        "a sandbox cut off mid-answer was reused: {v}"
    );
}

/// Code in the sandbox replaces the agent's encoder so that its "result" is not JSON: the worker
/// must never answer that with 200.
#[test]
fn a_handler_cannot_make_the_worker_answer_200_with_invalid_json() {
    if !runc_available() {
        return;
    }
    let s = Server::start("runc", &[]);
    let src = "import sys\n\ndef main(args):\n    \
               sys.modules['__main__']._encode = lambda r: '{\"result\": not json'\n    \
               return 1\n";
    assert_eq!(s.put_fn("liar", inline(src)).status, 201);
    let r = s.invoke("liar", "{}");
    assert_eq!(r.status, 502, "{}", r.text());
    let e = r.error_body().unwrap().error;
    assert_eq!(e.code.as_str(), "handler_error");
    assert_eq!(e.details["type"], "InvalidResult", "{}", r.text());
}

/// Many large async results: the store keeps at most `async_max_bytes` of them (it used to keep
/// every one, up to 64 MiB each, for ten minutes), dropping the oldest first.
#[test]
fn large_async_results_do_not_grow_the_store_past_its_bound() {
    if !runc_available() {
        return;
    }
    let s = Server::start("runc", &[("HEARTH_ASYNC_MAX_BYTES", "1048576")]);
    let src = "def main(args):\n    return 'x' * 200000\n";
    assert_eq!(s.put_fn("big", inline(src)).status, 201);
    let mut c = patient_client(&s);
    let mut ids = Vec::new();
    for _ in 0..12 {
        let r = c
            .post("/v1/functions/big/invoke?async=true", b"{}")
            .unwrap();
        assert_eq!(r.status, 202, "{}", r.text());
        let id = r.json()["id"].as_str().unwrap().to_string();
        // One at a time, so that "oldest" is well defined.
        assert_ne!(wait_invocation(&s, &id)["status"], "running");
        ids.push(id);
    }
    let kept: Vec<&String> = ids
        .iter()
        .filter(|id| {
            c.get(&format!("/v1/invocations/{id}")).unwrap().json()["status"] == "succeeded"
        })
        .collect();
    // 200 kB each under a 1 MiB bound: at most five.
    assert!((1..=5).contains(&kept.len()), "{} kept", kept.len());
    assert_eq!(
        kept.last(),
        ids.last().as_ref(),
        "the newest result was dropped"
    );
    let r = c.get(&format!("/v1/invocations/{}", ids[0])).unwrap();
    assert_eq!(r.status, 404, "the oldest result is still kept");
}

/// A worker's answer larger than the controller's limit: the controller stops reading (it used
/// to buffer a whole 1 GiB answer) and answers 502 `result_too_large`.
#[test]
fn the_controller_never_buffers_an_answer_over_its_limit() {
    if !runc_available() {
        return;
    }
    let controller =
        Server::start_controller("round-robin", &[("HEARTH_MAX_RESULT_BYTES", "1024")]);
    let cluster_key = common::cluster::credential_for(&controller, "limits-w1").unwrap();
    let worker = Server::start(
        "runc",
        &[
            ("HEARTH_CONTROLLER", controller.url.as_str()),
            ("HEARTH_STATUS_INTERVAL_MS", "100"),
            ("HEARTH_CLUSTER_KEY_FILE", cluster_key.to_str().unwrap()),
            ("HEARTH_WORKER_ID", "limits-w1"),
        ],
    );
    wait_members(&controller, &[worker.worker_id()]);
    let src = "def main(args):\n    return 'x' * args['n']\n";
    assert_eq!(controller.put_fn("big", inline(src)).status, 201);
    let r = controller.invoke("big", r#"{"n": 10}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    let r = controller.invoke("big", r#"{"n": 500000}"#);
    assert_eq!(r.status, 502, "{}", head(&r.text()));
    let e = r.error_body().unwrap().error;
    assert_eq!(e.code.as_str(), "result_too_large", "{}", e.message);
    // The worker itself is fine and so is the path to it.
    let r = controller.invoke("big", r#"{"n": 10}"#);
    assert_eq!(r.status, 200, "{}", r.text());
}
