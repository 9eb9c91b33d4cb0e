//! The agent protocol against a hostile handler (issue 31, items 9 and 7), in real runc
//! sandboxes: a handler that writes frames of its own on the agent's answer socket (it runs in
//! the agent's process and finds the socket and the request's id in the agent's frames) never
//! makes a later caller get an earlier caller's answer; forged fields (exec_us 2^64-1, status
//! 400) and a 3,000,000-deep result are refused; and a symlink the sandbox puts at its agent
//! socket's path is never followed to a host socket.
//!
//! Needs root and runc. Without them these tests say why and pass, unless
//! `HEARTH_REQUIRE_RUNC=1` (set by scripts/test.sh, so CI never skips them silently).

mod common;

use common::{runc_available, Server};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A handler that echoes its caller, and on request forges an answer frame on the agent's
/// answer socket: with the agent's own header layout and, where the protocol has one, the id of
/// the request being served, read from the agent's stack (the strongest a handler can do). Its
/// real answer then follows the forged one.
const HOSTILE: &str = r#"
import sys, time

def _serving():
    f = sys._getframe()
    while f is not None and f.f_code.co_name != "_serve":
        f = f.f_back
    return f

def forge(status, body, exec_us=0, flags=1):
    frame = _serving()
    agent = sys.modules["__main__"]
    hdr = agent.RESP_HDR
    fields = [len(body), status, flags, exec_us]
    if hdr.size == 24:
        fields.append(frame.f_locals["rid"])
    frame.f_locals["sendall"](hdr.pack(*fields) + body)

def main(args):
    mode = args.get("mode")
    if mode == "decoy":
        forge(200, b'{"decoy":true}')
        # The worker reads the decoy as this call's answer before the real one is written:
        # the real one then waits in an empty socket for the next caller.
        time.sleep(0.2)
    elif mode == "exec_max":
        forge(200, b'{"forged":true}', 2**64 - 1)
    elif mode == "status400":
        forge(400, b'{"type":"BadRequest","message":"your fault","phase":"request"}', 0, 0)
        time.sleep(0.2)  # read alone, as the call's answer (as the decoy)
    elif mode == "deep":
        # The agent itself answers, in step, with a result 3,000,000 levels deep (6 MB).
        agent = sys.modules["__main__"]
        encode = agent._encode
        def deep(result):
            agent._encode = encode
            return "[" * 3000000 + "]" * 3000000
        agent._encode = deep
    return {"caller": args.get("caller")}
"#;

fn hostile_fn(s: &Server, name: &str) {
    let spec = json!({"code": {"files": {"main.py": HOSTILE}}, "memory_mb": 128, "cpus": 1.0});
    let r = s.put_fn(name, spec);
    assert_eq!(r.status, 201, "{}", r.text());
}

/// (HTTP status, body) of one invocation by `caller`, with `mode` (or none).
fn call(s: &Server, name: &str, caller: &str, mode: Option<&str>) -> (u16, Value) {
    let args = match mode {
        Some(m) => json!({"caller": caller, "mode": m}),
        None => json!({"caller": caller}),
    };
    let r = s.invoke(name, &args.to_string());
    (r.status, r.json())
}

/// A 200 must carry the caller's own answer.
fn assert_own_answer(caller: &str, status: u16, v: &Value) {
    if status == 200 {
        assert_eq!(
            v["result"],
            json!({"caller": caller}),
            "{caller} got another answer: {v}"
        );
    }
}

#[test]
fn a_decoy_frame_never_hands_a_caller_another_callers_answer() {
    if !runc_available() {
        return;
    }
    let s = Server::start("runc", &[("HEARTH_GENERIC_POOL", "0")]);
    hostile_fn(&s, "hostile");
    let (status, v) = call(&s, "hostile", "A", None);
    assert_eq!(status, 200, "{v}");
    assert_own_answer("A", status, &v);

    // B's handler writes a decoy with B's request id: B gets the decoy, its own function's
    // word (a handler decides its caller's answer anyway). Should the worker be so slow that
    // the real answer is already in when it reads the decoy, B gets an error instead.
    let (status_b, v) = call(&s, "hostile", "B", Some("decoy"));
    let (status_c, w) = call(&s, "hostile", "C", None);
    assert_own_answer("C", status_c, &w);
    if status_b == 200 {
        assert_eq!(v["result"], json!({"decoy": true}), "{v}");
        // B's real answer is left in the socket: the next caller must not get it, but an
        // error that says the sandbox is broken.
        assert_eq!(status_c, 502, "the stale answer went unnoticed: {w}");
        assert_eq!(w["error"]["code"], "sandbox_crashed", "{w}");
        let message = w["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("another request"), "{message}");
    } else {
        assert_eq!(
            (status_b, &v["error"]["code"]),
            (502, &json!("sandbox_crashed")),
            "{v}"
        );
        assert_eq!(status_c, 200, "{w}");
    }
    // The broken sandbox is gone: later callers get their own answers.
    for caller in ["D", "E", "F"] {
        let (status, v) = call(&s, "hostile", caller, None);
        assert_eq!(status, 200, "{caller}: {v}");
        assert_own_answer(caller, status, &v);
    }
}

/// A runc worker (no generic pool) with the hostile function registered and warm.
fn hostile_server() -> Server {
    let s = Server::start("runc", &[("HEARTH_GENERIC_POOL", "0")]);
    hostile_fn(&s, "hostile");
    assert_eq!(call(&s, "hostile", "warm", None).0, 200);
    s
}

#[test]
fn an_exec_us_of_2_64_minus_1_breaks_the_sandbox() {
    if !runc_available() {
        return;
    }
    let s = hostile_server();
    // exec_us = 2^64-1 never reaches timing, metrics or the learned warm time.
    let (status, v) = call(&s, "hostile", "X", Some("exec_max"));
    assert_eq!(status, 502, "{v}");
    assert_eq!(v["error"]["code"], "sandbox_crashed", "{v}");
    let (status, v) = call(&s, "hostile", "Y", None);
    assert_eq!(status, 200, "{v}");
    assert_own_answer("Y", status, &v);
    let exec = v["timing"]["exec"].as_u64().unwrap();
    assert!(exec < 10_000_000, "{v}");
    let metrics = s.client().get("/metrics").unwrap().text();
    assert!(!metrics.contains("18446744073709"), "{metrics}");
}

#[test]
fn a_forged_status_400_never_blames_the_caller() {
    if !runc_available() {
        return;
    }
    let s = hostile_server();
    let (status, v) = call(&s, "hostile", "Z", Some("status400"));
    assert_eq!(status, 502, "{v}");
    // The forged answer read alone is the handler's failure; read with the real one behind it,
    // a broken sandbox.
    let code = v["error"]["code"].as_str().unwrap_or_default();
    assert!(code == "handler_error" || code == "sandbox_crashed", "{v}");
    // Its real answer was left behind: the next caller gets an error or its own answer.
    let (status, v) = call(&s, "hostile", "Z2", None);
    assert_own_answer("Z2", status, &v);
}

#[test]
fn a_result_3_000_000_deep_is_the_handlers_failure_and_the_sandbox_serves_on() {
    if !runc_available() {
        return;
    }
    let s = hostile_server();
    let t0 = Instant::now();
    let (status, v) = call(&s, "hostile", "deep", Some("deep"));
    assert!(t0.elapsed() < Duration::from_secs(10), "stalled");
    assert_eq!(status, 502, "{v}");
    assert_eq!(v["error"]["code"], "handler_error", "{v}");
    assert_eq!(v["error"]["type"], "InvalidResult", "{v}");
    let (status, v) = call(&s, "hostile", "after", None);
    assert_eq!(status, 200, "{v}");
    assert_own_answer("after", status, &v);
    assert_eq!(v["cold"], false, "the sandbox was kept: {v}");
}

/// The handler's module, imported before the agent listens, puts a symlink to a host socket
/// (the test's) at the agent's socket path and keeps the agent from binding. The worker must
/// not connect to the host socket, and the invocation fails cleanly.
#[test]
fn a_symlink_at_the_agent_socket_is_never_followed_to_a_host_socket() {
    if !runc_available() {
        return;
    }
    let host = tempfile::Builder::new()
        .prefix("hearth-test-host-")
        .tempdir()
        .unwrap();
    let host_sock = host.path().join("host.sock");
    let listener = std::os::unix::net::UnixListener::bind(&host_sock).unwrap();
    listener.set_nonblocking(true).unwrap();
    let code = format!(
        r#"
import os, time
os.symlink({target:?}, "/hearth/run/agent.sock.tmp")
os.rename("/hearth/run/agent.sock.tmp", "/hearth/run/agent.sock")
time.sleep(3600)

def main(args):
    return {{}}
"#,
        target = host_sock.to_str().unwrap()
    );
    let s = Server::start(
        "runc",
        &[
            ("HEARTH_GENERIC_POOL", "0"),
            ("HEARTH_RUNC__START_TIMEOUT_MS", "3000"),
        ],
    );
    let spec = json!({"code": {"files": {"main.py": code}}, "memory_mb": 64, "cpus": 1.0});
    assert_eq!(s.put_fn("linker", spec).status, 201);

    // The invocation runs in the background while the host socket is watched.
    std::thread::scope(|scope| {
        let call = scope.spawn(|| {
            let r = s.invoke("linker", "{}");
            (r.status, r.json())
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        while !call.is_finished() {
            match listener.accept() {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Ok(_) => panic!("the worker connected to the host socket"),
                Err(e) => panic!("{e}"),
            }
            assert!(Instant::now() < deadline, "the invocation never ended");
            std::thread::sleep(Duration::from_millis(10));
        }
        let (status, v) = call.join().unwrap();
        assert_eq!(status, 502, "{v}");
        assert_eq!(v["error"]["code"], "sandbox_start_failed", "{v}");
    });
    assert!(matches!(
        listener.accept(),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
    ));
}
