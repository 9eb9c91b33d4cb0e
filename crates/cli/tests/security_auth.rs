//! Authentication and tenants, tried as an attacker would (issue 11): every route but `/healthz`
//! needs a key; keys are scoped to a namespace and a role; one tenant cannot see, run or read the
//! results of another's functions; nobody without the cluster key can join, impersonate or evict
//! a worker; quotas and the fair share keep one namespace from starving another.

mod common;

use common::cluster::{join, sim_fn, wait_members, wait_until};
use common::{wait_invocation, Server};
use serde_json::json;
use std::time::Duration;

fn put(s: &Server, key: &str, name: &str, spec: serde_json::Value) -> u16 {
    s.client_with(key)
        .put(
            &format!("/v1/functions/{name}"),
            spec.to_string().as_bytes(),
        )
        .unwrap()
        .status
}

#[test]
fn every_route_but_healthz_refuses_a_caller_without_a_valid_key() {
    let s = Server::start("sim", &[]);
    assert_eq!(s.put_fn("f", sim_fn(1, 0)).status, 201);
    let forged = "hk_0123456789abcdef_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    let routes: [(&str, &str); 13] = [
        ("PUT", "/v1/functions/evil"),
        ("GET", "/v1/functions"),
        ("GET", "/v1/functions/f"),
        ("DELETE", "/v1/functions/f"),
        ("POST", "/v1/functions/f/invoke"),
        ("POST", "/v1/functions/f/prewarm"),
        ("GET", "/v1/status"),
        ("GET", "/metrics"),
        ("GET", "/v1/keys"),
        ("POST", "/v1/keys"),
        ("DELETE", "/v1/keys/0123456789abcdef"),
        ("GET", "/v1/invocations?status=failed"),
        ("GET", "/v1/invocations/0123456789abcdef0123456789abcdef"),
    ];
    for (method, path) in routes {
        for mut c in [s.anonymous(), s.client_with(forged)] {
            let body = (method != "GET" && method != "DELETE").then_some(&b"{}"[..]);
            let r = c.request(method, path, body).unwrap();
            assert_eq!(r.status, 401, "{method} {path}: {}", r.text());
            assert_eq!(r.json()["error"]["code"], "unauthorized");
            assert!(r.header("www-authenticate").is_some());
        }
    }
    assert_eq!(s.anonymous().get("/healthz").unwrap().status, 200);
    // Nothing above took effect.
    let r = s.client().get("/v1/functions").unwrap().json();
    assert_eq!(r["functions"].as_array().unwrap().len(), 1);
    assert_eq!(r["functions"][0]["name"], "f");
}

#[test]
fn the_first_start_writes_a_private_operator_key_that_the_cli_finds() {
    let s = Server::start("sim", &[]);
    use std::os::unix::fs::PermissionsExt;
    let file = s.data_dir.join("admin.key");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // The CLI reads the key from the data directory when HEARTH_API_KEY is not set.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["fn", "list", "--url", &s.url])
        .env_remove("HEARTH_API_KEY")
        .env("HEARTH_DATA_DIR", &s.data_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // … and without any key it is refused with the server's message.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["fn", "list", "--url", &s.url])
        .env("HEARTH_API_KEY", "")
        .env("HEARTH_DATA_DIR", s.data_dir.join("nowhere"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("API key"));
}

#[test]
fn tenants_see_run_and_read_only_their_own_namespace() {
    let s = Server::start("sim", &[]);
    let a_admin = s.new_key("team-a", "admin");
    let a_invoke = s.new_key("team-a", "invoke");
    let a_invoke2 = s.new_key("team-a", "invoke");
    let b_admin = s.new_key("team-b", "admin");
    // The same name in two namespaces is two functions.
    assert_eq!(put(&s, &a_admin, "hello", sim_fn(1, 0)), 201);
    assert_eq!(
        put(
            &s,
            &b_admin,
            "hello",
            json!({"sim_warm_ms": 2, "memory_mb": 64, "env": {"SECRET": "b"}})
        ),
        201
    );
    let shown = s
        .client_with(&a_admin)
        .get("/v1/functions/hello")
        .unwrap()
        .json();
    assert_eq!(shown["namespace"], "team-a");
    assert_eq!(shown["name"], "hello");
    // A tenant lists only its own functions (not B's secret) and cannot name another
    // namespace's.
    let list = s.client_with(&a_admin).get("/v1/functions").unwrap();
    assert!(!list.text().contains("SECRET"), "{}", list.text());
    assert_eq!(list.json()["functions"].as_array().unwrap().len(), 1);
    for path in [
        "/v1/functions/team-b.hello",
        "/v1/functions/team-b.hello/invoke",
    ] {
        let method = if path.ends_with("invoke") {
            "POST"
        } else {
            "GET"
        };
        let r = s
            .client_with(&a_admin)
            .request(method, path, Some(b"{}"))
            .unwrap();
        assert_eq!(r.status, 400, "{path}: {}", r.text());
    }
    // An invoke key runs functions but cannot register, delete or read specs.
    let r = s
        .client_with(&a_invoke)
        .post("/v1/functions/hello/invoke", b"{}")
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(put(&s, &a_invoke, "evil", sim_fn(1, 0)), 403);
    let r = s
        .client_with(&a_invoke)
        .delete("/v1/functions/hello")
        .unwrap();
    assert_eq!(r.status, 403);
    let r = s.client_with(&a_invoke).get("/v1/functions/hello").unwrap();
    assert_eq!(r.status, 403);
    // Tenants see neither the platform's status nor other namespaces' metrics.
    assert_eq!(
        s.client_with(&b_admin).get("/v1/status").unwrap().status,
        403
    );
    let r = s
        .client_with(&b_admin)
        .post("/v1/functions/hello/invoke", b"{}")
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let m = s.client_with(&b_admin).get("/metrics").unwrap().text();
    assert!(m.contains("function=\"team-b.hello\""), "{m}");
    assert!(!m.contains("team-a"), "{m}");
    // Async results: the key that started it reads it, the namespace admin too; nobody else,
    // not even with the id.
    let r = s
        .client_with(&a_invoke)
        .post("/v1/functions/hello/invoke?async=true", b"{}")
        .unwrap();
    assert_eq!(r.status, 202, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_string();
    let path = format!("/v1/invocations/{id}");
    wait_until("the async call finishes", Duration::from_secs(10), || {
        s.client_with(&a_invoke).get(&path).unwrap().json()["status"] == "succeeded"
    });
    assert_eq!(s.client_with(&a_admin).get(&path).unwrap().status, 200);
    for other in [&a_invoke2, &b_admin] {
        let r = s.client_with(other).get(&path).unwrap();
        assert_eq!(r.status, 404, "{}", r.text());
    }
}

#[test]
fn keys_are_managed_within_a_namespace_and_revoked_keys_stop_working() {
    let s = Server::start("sim", &[]);
    let a_admin = s.new_key("team-a", "admin");
    // A namespace admin makes keys of its own namespace only.
    let r = s
        .client_with(&a_admin)
        .post("/v1/keys", br#"{"role": "invoke"}"#)
        .unwrap();
    assert_eq!(r.status, 201, "{}", r.text());
    let made = r.json();
    assert_eq!(made["namespace"], "team-a");
    let token = made["key"].as_str().unwrap().to_string();
    for body in [
        &br#"{"role": "admin", "namespace": "team-b"}"#[..],
        br#"{"role": "admin", "namespace": "*"}"#,
    ] {
        let r = s.client_with(&a_admin).post("/v1/keys", body).unwrap();
        assert_eq!(r.status, 403, "{}", r.text());
    }
    // The body is bounded before it is parsed.
    let huge = json!({"role": "invoke", "description": "x".repeat(100 * 1024)}).to_string();
    let r = s
        .client_with(&a_admin)
        .post("/v1/keys", huge.as_bytes())
        .unwrap();
    assert_eq!(r.status, 413, "{}", r.text());
    // Listing shows no secrets, and only the namespace's keys to its admin.
    let listed = s.client_with(&a_admin).get("/v1/keys").unwrap().text();
    assert!(!listed.contains(&token[20..]), "{listed}");
    assert!(!listed.contains("\"*\""), "{listed}");
    let all = s.client().get("/v1/keys").unwrap().json();
    assert_eq!(all["keys"].as_array().unwrap().len(), 3);
    // Revoked: refused at once.
    let id = made["id"].as_str().unwrap();
    assert_eq!(
        s.client_with(&a_admin)
            .delete(&format!("/v1/keys/{id}"))
            .unwrap()
            .status,
        204
    );
    let r = s
        .client_with(&token)
        .post("/v1/functions/x/invoke", b"{}")
        .unwrap();
    assert_eq!(r.status, 401);
    // The last operator key cannot be deleted (no lock-out).
    let op = all["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["namespace"] == "*")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = s.client().delete(&format!("/v1/keys/{op}")).unwrap();
    assert_eq!(r.status, 409, "{}", r.text());
}

#[test]
fn without_a_worker_credential_nobody_joins_impersonates_or_evicts_a_worker() {
    let c = Server::start_controller("ch-bl", &[]);
    let w = join(&c, None, &[]);
    let id = w.worker_id();
    wait_members(&c, std::slice::from_ref(&id));
    assert_eq!(c.put_fn("f", sim_fn(1, 0)).status, 201);
    // A fake worker (with no key, or even the operator's key) cannot join …
    let fake = json!({"worker": "evil", "url": "http://127.0.0.1:9", "incarnation": "x"});
    let tenant = c.new_key("team-a", "admin");
    for mut client in [c.anonymous(), c.client(), c.client_with(&tenant)] {
        let r = client
            .put("/v1/cluster/workers/evil", fake.to_string().as_bytes())
            .unwrap();
        assert!(r.status == 401 || r.status == 403, "{}", r.text());
        // … nor take over the real worker's id with another address …
        let stolen = json!({"worker": id, "url": "http://127.0.0.1:9", "incarnation": "y"});
        let r = client
            .put(
                &format!("/v1/cluster/workers/{id}"),
                stolen.to_string().as_bytes(),
            )
            .unwrap();
        assert!(r.status == 401 || r.status == 403, "{}", r.text());
        // … nor make it leave.
        let r = client.delete(&format!("/v1/cluster/workers/{id}")).unwrap();
        assert!(r.status == 401 || r.status == 403, "{}", r.text());
    }
    let workers = c.status()["workers"].clone();
    assert_eq!(workers.as_array().unwrap().len(), 1, "{workers}");
    assert_eq!(workers[0]["url"], w.url.as_str());
    assert_eq!(workers[0]["up"], true);
    for _ in 0..20 {
        let r = c.invoke("f", "{}");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["worker"], id.as_str());
    }
    // The worker itself serves the controller (with its token for it), not anonymous callers.
    assert_eq!(
        w.anonymous()
            .post("/v1/functions/f/invoke", b"{}")
            .unwrap()
            .status,
        401
    );
}

#[test]
fn a_worker_without_a_valid_credential_is_refused_by_the_controller() {
    let c = Server::start_controller("ch-bl", &[]);
    let dir = tempfile::tempdir().unwrap();
    let wrong = dir.path().join("wrong.credential");
    std::fs::write(
        &wrong,
        "hw_0123456789abcdef_not-a-credential-of-that-controller\n\
         hx_0123456789abcdef_not-a-credential-of-that-controller\n",
    )
    .unwrap();
    let w = Server::start(
        "sim",
        &[
            ("HEARTH_CONTROLLER", c.url.as_str()),
            ("HEARTH_STATUS_INTERVAL_MS", "100"),
            ("HEARTH_CLUSTER_KEY_FILE", wrong.to_str().unwrap()),
        ],
    );
    wait_until(
        "the worker has tried to join",
        Duration::from_secs(10),
        || w.log_text().contains("cannot push status"),
    );
    assert!(c.status()["workers"].as_array().unwrap().is_empty());
}

#[test]
fn tenants_functions_run_through_a_controller_under_their_namespace() {
    let c = Server::start_controller("ch-bl", &[]);
    let w = join(&c, None, &[]);
    wait_members(&c, &[w.worker_id()]);
    let a = c.new_key("team-a", "admin");
    let b = c.new_key("team-b", "admin");
    assert_eq!(put(&c, &a, "f", sim_fn(1, 0)), 201);
    assert_eq!(put(&c, &b, "f", sim_fn(2, 0)), 201);
    for key in [&a, &b] {
        let r = c
            .client_with(key)
            .post("/v1/functions/f/invoke", b"{}")
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // On the worker they are two functions, kept apart by namespace.
    let names: Vec<String> = w.client().get("/v1/functions").unwrap().json()["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            format!(
                "{}.{}",
                f["namespace"].as_str().unwrap(),
                f["name"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(names, ["team-a.f", "team-b.f"]);
    let r = c
        .client_with(&a)
        .post("/v1/functions/f/invoke?async=true", b"{}")
        .unwrap();
    assert_eq!(r.status, 202, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_string();
    let done = wait_invocation(&c, &id);
    assert_eq!(done["status"], "succeeded", "{done}");
    let r = c
        .client_with(&b)
        .get(&format!("/v1/invocations/{id}"))
        .unwrap();
    assert_eq!(r.status, 404);
}

#[test]
fn one_namespace_cannot_hold_all_of_a_workers_slots_against_another() {
    let s = Server::start("sim", &[("HEARTH_CONCURRENCY", "4")]);
    let a = s.new_key("team-a", "admin");
    let b = s.new_key("team-b", "admin");
    assert_eq!(put(&s, &a, "sleepy", sim_fn(3000, 0)), 201);
    assert_eq!(put(&s, &b, "quick", sim_fn(1, 0)), 201);
    // Team A fires 4 long calls at a worker with 4 slots: only its fair share (half) is taken.
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let mut c = s.client_with(&a);
            std::thread::spawn(move || c.post("/v1/functions/sleepy/invoke", b"{}").unwrap())
        })
        .collect();
    wait_until("team A's calls run", Duration::from_secs(10), || {
        s.status()["queue"]["running"].as_u64() == Some(2)
    });
    // Team B still gets a slot at once, while A's calls are still running.
    let r = s
        .client_with(&b)
        .post("/v1/functions/quick/invoke", b"{}")
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        calls.iter().filter(|t| !t.is_finished()).count() >= 2,
        "B's call had to wait for A's"
    );
    let answers: Vec<_> = calls.into_iter().map(|t| t.join().unwrap()).collect();
    let refused: Vec<_> = answers.iter().filter(|r| r.status == 429).collect();
    assert_eq!(
        refused.len(),
        2,
        "{:?}",
        answers.iter().map(|r| r.text()).collect::<Vec<_>>()
    );
    for r in refused {
        assert_eq!(r.json()["error"]["code"], "fair_share");
        assert!(r.header("retry-after").is_some());
    }
}

#[test]
fn namespace_quotas_answer_429_with_retry_after() {
    let s = Server::start(
        "sim",
        &[(
            "HEARTH_QUOTAS",
            "{team-a={concurrency=1}, team-b={rate_per_s=1, burst=1}}",
        )],
    );
    let a = s.new_key("team-a", "admin");
    let b = s.new_key("team-b", "admin");
    assert_eq!(put(&s, &a, "slow", sim_fn(1500, 0)), 201);
    assert_eq!(put(&s, &b, "f", sim_fn(1, 0)), 201);
    let mut first = s.client_with(&a);
    let running =
        std::thread::spawn(move || first.post("/v1/functions/slow/invoke", b"{}").unwrap());
    wait_until("the first call runs", Duration::from_secs(10), || {
        s.status()["queue"]["running"].as_u64() == Some(1)
    });
    let r = s
        .client_with(&a)
        .post("/v1/functions/slow/invoke", b"{}")
        .unwrap();
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "quota_concurrency");
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(running.join().unwrap().status, 200);
    // Rate: one per second with a burst of one.
    let mut c = s.client_with(&b);
    assert_eq!(c.post("/v1/functions/f/invoke", b"{}").unwrap().status, 200);
    let r = c.post("/v1/functions/f/invoke", b"{}").unwrap();
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "quota_rate");
    assert!(r.header("retry-after").is_some());
}

#[test]
fn a_listener_beyond_loopback_without_authentication_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    for service in ["worker", "controller"] {
        let log = dir.path().join(format!("{service}.log"));
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_hearth"))
            .args([service, "--listen", "0.0.0.0:0", "--data-dir"])
            .arg(dir.path().join(service))
            .args(if service == "worker" {
                &["--backend", "sim"][..]
            } else {
                &[]
            })
            .env("HEARTH_AUTH", "false")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        // It must exit at once; one still running is serving without authentication.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let err = std::fs::read_to_string(&log).unwrap();
        let status = status.unwrap_or_else(|| panic!("the {service} started without auth: {err}"));
        assert!(!status.success(), "{service} started");
        assert!(err.contains("without authentication"), "{err}");
    }
}
