//! Least privilege inside the cluster (issue 31, items 1, 3, 6, 12 and the key limit of item
//! 5), tried over HTTP against a real controller and workers, as an attacker holding one
//! worker's real credential would: every attack that worked with the old all-powerful cluster
//! key is refused, and the cluster keeps serving.

mod common;

use common::cluster::{
    controller_token, credential_for, join, sim_fn, wait_members, wait_until, worker_token,
    workers_up,
};
use common::Server;
use serde_json::{json, Value};
use std::time::Duration;

fn refused(status: u16) -> bool {
    status == 401 || status == 403 || status == 400 || status == 404
}

/// A status report for `worker` at `url` (nothing listens there), as a push carries it.
fn report(worker: &str, url: &str, incarnation: &str, seq: u64) -> Vec<u8> {
    json!({
        "worker": worker, "url": url, "incarnation": incarnation, "backend": "sim",
        "load": {"load": 0.0}, "cpus": 1.0, "shutting_down": false, "functions": {},
        "seq": seq,
    })
    .to_string()
    .into_bytes()
}

#[test]
fn a_worker_credential_opens_nothing_but_its_own_membership() {
    let c = Server::start_controller("ch-bl", &[]);
    let w1 = join(&c, None, &[]);
    let w2 = join(&c, None, &[]);
    let (id1, id2) = (w1.worker_id(), w2.worker_id());
    wait_members(&c, &[id1.clone(), id2.clone()]);
    let tenant = c.new_key("team-a", "admin");
    let spec = json!({"sim_warm_ms": 1, "memory_mb": 64, "env": {"SECRET": "s3cr3t-of-team-a"}});
    let r = c
        .client_with(&tenant)
        .put("/v1/functions/f", spec.to_string().as_bytes())
        .unwrap();
    assert_eq!(r.status, 201, "{}", r.text());
    let hw = worker_token(&c, &id1);

    // At the controller, worker 1's credential reads no tenant's spec or env …
    let mut at_c = c.client_with(&hw);
    for path in [
        "/v1/functions",
        "/v1/functions/team-a.f",
        "/v1/functions/f",
        "/v1/status",
        "/v1/cluster/workers",
        "/v1/keys",
        "/v1/cluster/credentials",
        "/metrics",
        "/v1/invocations?status=failed",
    ] {
        let r = at_c.get(path).unwrap();
        assert!(refused(r.status), "GET {path}: {} {}", r.status, r.text());
        assert!(!r.text().contains("s3cr3t"), "GET {path}: {}", r.text());
    }
    // … makes no operator key, no credential for another worker …
    let r = at_c
        .post(
            "/v1/keys",
            json!({"namespace": "*", "role": "admin"})
                .to_string()
                .as_bytes(),
        )
        .unwrap();
    assert_eq!(r.status, 403, "{}", r.text());
    let r = at_c
        .post(
            "/v1/cluster/credentials",
            json!({"worker": "evil"}).to_string().as_bytes(),
        )
        .unwrap();
    assert_eq!(r.status, 403, "{}", r.text());
    // … replaces no tenant's code, invokes nothing on a tenant's behalf …
    let evil = json!({"sim_warm_ms": 1, "memory_mb": 64});
    for name in ["team-a.f", "f"] {
        let r = at_c
            .put(
                &format!("/v1/functions/{name}"),
                evil.to_string().as_bytes(),
            )
            .unwrap();
        assert!(refused(r.status), "PUT {name}: {} {}", r.status, r.text());
        let r = at_c
            .post(&format!("/v1/functions/{name}/invoke"), b"{}")
            .unwrap();
        assert!(
            refused(r.status),
            "invoke {name}: {} {}",
            r.status,
            r.text()
        );
        let r = at_c.delete(&format!("/v1/functions/{name}")).unwrap();
        assert!(
            refused(r.status),
            "DELETE {name}: {} {}",
            r.status,
            r.text()
        );
    }
    // … joins as no other id, takes over no real worker's id, drives no other worker out.
    for other in ["evil", id2.as_str()] {
        let r = at_c
            .put(
                &format!("/v1/cluster/workers/{other}"),
                &report(other, "http://127.0.0.1:9", "x", 1),
            )
            .unwrap();
        assert_eq!(r.status, 403, "join as {other}: {}", r.text());
        let r = at_c
            .delete(&format!("/v1/cluster/workers/{other}"))
            .unwrap();
        assert_eq!(r.status, 403, "{other} leaves: {}", r.text());
    }
    // At a worker, a worker credential is nothing.
    for w in [&w1, &w2] {
        let r = w
            .client_with(&hw)
            .post("/v1/functions/team-a.f/invoke", b"{}")
            .unwrap();
        assert_eq!(r.status, 401, "{}", r.text());
    }

    // The controller's token for worker 1 opens nothing at the controller or at worker 2, and
    // no key management at worker 1 itself.
    let hx = controller_token(&c, &id1);
    for path in ["/v1/status", "/v1/functions", "/v1/keys"] {
        assert_eq!(c.client_with(&hx).get(path).unwrap().status, 401, "{path}");
        assert_eq!(w2.client_with(&hx).get(path).unwrap().status, 401, "{path}");
    }
    let mut at_w1 = w1.client_with(&hx);
    assert_eq!(at_w1.get("/v1/keys").unwrap().status, 403);
    let r = at_w1
        .post(
            "/v1/keys",
            json!({"namespace": "*", "role": "admin"})
                .to_string()
                .as_bytes(),
        )
        .unwrap();
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(at_w1.get("/v1/status").unwrap().status, 200);
    // The controllers' own cluster key is not a credential anywhere.
    let master = std::fs::read_to_string(c.cluster_key_file()).unwrap();
    for s in [&c, &w1] {
        assert_eq!(
            s.client_with(master.trim())
                .get("/v1/status")
                .unwrap()
                .status,
            401
        );
    }

    // Nothing moved: both workers up, the tenant's function its own.
    assert_eq!(workers_up(&c).len(), 2);
    for _ in 0..10 {
        let r = c
            .client_with(&tenant)
            .post("/v1/functions/f/invoke", b"{}")
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let r = c.client_with(&tenant).get("/v1/functions/f").unwrap();
    assert_eq!(r.json()["env"]["SECRET"], "s3cr3t-of-team-a");
}

#[test]
fn a_revoked_worker_credential_is_refused_and_its_worker_leaves_the_ring() {
    let c = Server::start_controller("ch-bl", &[]);
    let w = join(&c, None, &[]);
    let id = w.worker_id();
    wait_members(&c, std::slice::from_ref(&id));
    // Listed without secrets; only the operator may list.
    let r = c.client().get("/v1/cluster/credentials").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let listed: Vec<Value> = r.json()["credentials"].as_array().unwrap().clone();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["worker"], id.as_str());
    let hw = worker_token(&c, &id);
    assert!(!r.text().contains(&hw[20..]), "{}", r.text());
    let tenant = c.new_key("team-a", "admin");
    assert_eq!(
        c.client_with(&tenant)
            .get("/v1/cluster/credentials")
            .unwrap()
            .status,
        403
    );
    let cred = listed[0]["id"].as_str().unwrap();
    let r = c
        .client()
        .delete(&format!("/v1/cluster/credentials/{cred}"))
        .unwrap();
    assert_eq!(r.status, 204, "{}", r.text());
    assert!(workers_up(&c).is_empty(), "evicted at once");
    let r = c
        .client_with(&hw)
        .put(
            &format!("/v1/cluster/workers/{id}"),
            &report(&id, &w.url, "x", 1),
        )
        .unwrap();
    assert_eq!(r.status, 401, "{}", r.text());
    // It stays out (its pushes keep failing).
    std::thread::sleep(Duration::from_millis(500));
    assert!(workers_up(&c).is_empty());
    assert_eq!(c.put_fn("f", sim_fn(0, 0)).status, 201);
    assert_eq!(c.invoke("f", "{}").status, 503);
}

#[test]
fn a_worker_refuses_the_controllers_cluster_key() {
    let c = Server::start_controller("ch-bl", &[]);
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["worker", "--backend", "sim", "--listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(dir.path().join("w"))
        .env("HEARTH_CONTROLLER", &c.url)
        .env("HEARTH_CLUSTER_KEY_FILE", c.cluster_key_file())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("hearth cluster credential create"), "{err}");
    let master = std::fs::read_to_string(c.cluster_key_file()).unwrap();
    assert!(!err.contains(master.trim()), "{err}");
}

/// Item 3: a worker's own `admin.key` cannot put another tenant's code under a name its
/// controller routes to it; Prometheus gets a `metrics` key that reads `/metrics` only.
#[test]
fn a_managed_worker_takes_functions_from_its_controller_only_and_metrics_keys_read_metrics_only() {
    let c = Server::start_controller("ch-bl", &[]);
    let w = join(&c, None, &[]);
    wait_members(&c, &[w.worker_id()]);
    let tenant = c.new_key("team-a", "admin");
    let spec = sim_fn(1, 0);
    let r = c
        .client_with(&tenant)
        .put("/v1/functions/f", spec.to_string().as_bytes())
        .unwrap();
    assert_eq!(r.status, 201, "{}", r.text());
    let r = c
        .client_with(&tenant)
        .post("/v1/functions/f/invoke", b"{}")
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    // The worker's operator key (its admin.key).
    let mut local = w.client();
    let r = local
        .put("/v1/functions/team-a.f", spec.to_string().as_bytes())
        .unwrap();
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(
        r.text().contains("managed by its controller"),
        "{}",
        r.text()
    );
    assert_eq!(local.delete("/v1/functions/team-a.f").unwrap().status, 403);
    let r = local
        .post("/v1/functions/team-a.f/prewarm", b"{\"count\": 1}")
        .unwrap();
    assert_eq!(r.status, 403, "{}", r.text());
    // The tenant's function is still the controller's.
    let r = c
        .client_with(&tenant)
        .post("/v1/functions/f/invoke", b"{}")
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());

    // A metrics key: /metrics and nothing else, on the controller and on a worker.
    for s in [&c, &w] {
        let r = s
            .client()
            .post(
                "/v1/keys",
                json!({"namespace": "*", "role": "metrics"})
                    .to_string()
                    .as_bytes(),
            )
            .unwrap();
        assert_eq!(r.status, 201, "{}", r.text());
        let m = r.json()["key"].as_str().unwrap().to_string();
        let mut client = s.client_with(&m);
        assert_eq!(client.get("/metrics").unwrap().status, 200);
        for path in [
            "/v1/status",
            "/v1/functions",
            "/v1/keys",
            "/v1/invocations?status=failed",
        ] {
            let r = client.get(path).unwrap();
            assert_eq!(r.status, 403, "{path}: {}", r.text());
        }
        let r = client.post("/v1/functions/team-a.f/invoke", b"{}").unwrap();
        assert!(refused(r.status), "{}", r.text());
    }
}

/// Item 12: a replayed status push, or one from an incarnation a newer one replaced, is a 409.
#[test]
fn replayed_and_outdated_status_pushes_are_refused() {
    let c = Server::start_controller("ch-bl", &[]);
    credential_for(&c, "replay-1").unwrap();
    let mut client = c.client_with(&worker_token(&c, "replay-1"));
    let path = "/v1/cluster/workers/replay-1";
    let url = "http://127.0.0.1:9";
    let push = |client: &mut hearth_cli::client::Client, inc: &str, seq: u64| {
        let r = client
            .put(path, &report("replay-1", url, inc, seq))
            .unwrap();
        (r.status, r.text())
    };
    assert_eq!(push(&mut client, "a", 1).0, 200);
    assert_eq!(push(&mut client, "a", 2).0, 200);
    let (status, text) = push(&mut client, "a", 2);
    assert_eq!(status, 409, "{text}");
    assert!(text.contains("replay"), "{text}");
    assert_eq!(push(&mut client, "a", 1).0, 409);
    assert_eq!(push(&mut client, "a", 3).0, 200);
    // A newer incarnation replaces it; the old one's pushes are refused from then on.
    assert_eq!(push(&mut client, "b", 1).0, 200);
    let (status, text) = push(&mut client, "a", 4);
    assert_eq!(status, 409, "{text}");
    assert!(text.contains("replaced"), "{text}");
    assert_eq!(push(&mut client, "b", 2).0, 200);
}

/// Item 6: a function deleted at the controller does not survive on a worker that was down,
/// whether it was deleted before or after the worker came back.
#[test]
fn functions_deleted_while_a_worker_was_down_are_gone_from_it() {
    let c = Server::start_controller("ch-bl", &[]);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("w");
    let env = [("HEARTH_WORKER_ID", "down-1")];
    let mut w = join(&c, Some(&dir), &env);
    wait_members(&c, &["down-1".to_string()]);
    for f in ["before", "after"] {
        assert_eq!(c.put_fn(f, sim_fn(1, 0)).status, 201);
        assert_eq!(c.invoke(f, "{}").status, 200);
        assert_eq!(w.invoke(f, "{}").status, 200, "{f} is on the worker");
    }
    // Deleted while the worker is down.
    w.kill();
    let r = c.client().delete("/v1/functions/before").unwrap();
    assert_eq!(r.status, 204, "{}", r.text());
    let w = join(&c, Some(&dir), &env);
    wait_members(&c, &["down-1".to_string()]);
    wait_until(
        "before is gone from the worker",
        Duration::from_secs(10),
        || w.invoke("before", "{}").status == 404,
    );
    // Deleted after it came back (its new incarnation never had it registered by the
    // controller, but it kept it on its disk).
    assert_eq!(w.client().get("/v1/functions/after").unwrap().status, 200);
    let r = c.client().delete("/v1/functions/after").unwrap();
    assert_eq!(r.status, 204, "{}", r.text());
    wait_until(
        "after is gone from the worker",
        Duration::from_secs(10),
        || w.invoke("after", "{}").status == 404,
    );
}

/// Item 5 (keys): one tenant filling its key limit blocks neither another tenant nor the
/// operator, and its own refusal is a 429 naming the limit.
#[test]
fn one_namespace_filling_its_key_limit_blocks_no_one_else() {
    let c = Server::start_controller("ch-bl", &[("HEARTH_MAX_KEYS_PER_NAMESPACE", "4")]);
    let a = c.new_key("team-a", "admin");
    let b = c.new_key("team-b", "admin");
    let body = json!({"role": "invoke"}).to_string();
    for _ in 0..3 {
        let r = c.client_with(&a).post("/v1/keys", body.as_bytes()).unwrap();
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let r = c.client_with(&a).post("/v1/keys", body.as_bytes()).unwrap();
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "quota_keys");
    assert!(r.text().contains("max_keys_per_namespace"), "{}", r.text());
    let r = c.client_with(&b).post("/v1/keys", body.as_bytes()).unwrap();
    assert_eq!(r.status, 201, "{}", r.text());
    let r = c
        .client()
        .post(
            "/v1/keys",
            json!({"namespace": "team-c", "role": "admin"})
                .to_string()
                .as_bytes(),
        )
        .unwrap();
    assert_eq!(r.status, 201, "{}", r.text());
}

/// A fake worker at `127.0.0.1:PORT` that claims to be `worker` with credential `credential`
/// (but cannot prove it), and records every `Authorization` header it is sent.
fn fake_worker(
    worker: &str,
    credential: &str,
) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (seen2, body) = (
        std::sync::Arc::clone(&seen),
        json!({"worker": worker, "credential": credential, "proof": "forged"}).to_string(),
    );
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut r = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            while r.read_line(&mut line).is_ok_and(|n| n > 0) {
                if line == "\r\n" {
                    break;
                }
                if line.to_ascii_lowercase().starts_with("authorization:") {
                    seen2.lock().unwrap().push(line.trim().to_string());
                }
                line.clear();
            }
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (url, seen)
}

/// A polled (static) worker gets the controller's token only after it proved who it is: a fake
/// claiming its id never gets it; revoking its credential takes it out, and it stays out.
#[test]
fn a_polled_worker_proves_who_it_is_and_is_dropped_when_its_credential_is_revoked() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("controller");
    let (key_file, credential) = {
        let c = Server::start_controller_in(&data, "ch-bl", &[]);
        let file = credential_for(&c, "static-1").unwrap();
        let id = c.client().get("/v1/cluster/credentials").unwrap().json()["credentials"][0]["id"]
            .as_str()
            .unwrap()
            .to_string();
        (file, id)
    };
    let w = Server::start(
        "sim",
        &[
            ("HEARTH_CLUSTER_KEY_FILE", key_file.to_str().unwrap()),
            ("HEARTH_WORKER_ID", "static-1"),
        ],
    );
    let (fake, seen) = fake_worker("static-1", &credential);
    let list = format!("[\"{}\", \"{fake}\"]", w.url);
    let c = Server::start_controller_in(
        &data,
        "ch-bl",
        &[
            ("HEARTH_WORKERS", list.as_str()),
            ("HEARTH_STATUS_INTERVAL_MS", "100"),
        ],
    );
    wait_members(&c, &["static-1".to_string()]);
    assert_eq!(c.put_fn("f", sim_fn(0, 0)).status, 201);
    let r = c.invoke("f", "{}");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["worker"], "static-1");
    std::thread::sleep(Duration::from_millis(300));
    let seen_by_fake = seen.lock().unwrap().clone();
    assert!(
        seen_by_fake.iter().all(|h| !h.contains("hx_")),
        "the fake got a token: {seen_by_fake:?}"
    );
    let r = c
        .client()
        .delete(&format!("/v1/cluster/credentials/{credential}"))
        .unwrap();
    assert_eq!(r.status, 204, "{}", r.text());
    assert!(workers_up(&c).is_empty());
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        workers_up(&c).is_empty(),
        "a revoked polled worker came back"
    );
}

/// `hearth cluster credential create|list|rm`: the file is written 0600 with both tokens, the
/// list shows no secret, and rm revokes.
#[test]
fn the_cli_makes_lists_and_revokes_worker_credentials() {
    use std::os::unix::fs::PermissionsExt;
    let c = Server::start_controller("ch-bl", &[]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("w9.credential");
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_hearth"))
            .args(args)
            .args(["--url", &c.url])
            .env("HEARTH_API_KEY", c.key.as_deref().unwrap())
            .output()
            .unwrap()
    };
    let o = run(&[
        "cluster",
        "credential",
        "create",
        "--worker",
        "w9",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        std::fs::metadata(&out).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let hw = text.lines().next().unwrap();
    assert!(hw.starts_with("hw_") && text.lines().nth(1).unwrap().starts_with("hx_"));
    // It is never printed.
    assert!(!String::from_utf8_lossy(&o.stdout).contains(&hw[20..]));
    // A second create to the same file is refused (no silent overwrite).
    let again = run(&[
        "cluster",
        "credential",
        "create",
        "--worker",
        "w9",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!again.status.success());
    let o = run(&["cluster", "credential", "list"]);
    assert!(o.status.success());
    let listed: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(listed["credentials"][0]["worker"], "w9");
    assert!(!String::from_utf8_lossy(&o.stdout).contains(&hw[20..]));
    let id = listed["credentials"][0]["id"].as_str().unwrap().to_string();
    let o = run(&["cluster", "credential", "rm", &id]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = c
        .client_with(hw)
        .put(
            "/v1/cluster/workers/w9",
            &report("w9", "http://127.0.0.1:9", "a", 1),
        )
        .unwrap();
    assert_eq!(r.status, 401, "{}", r.text());
}
