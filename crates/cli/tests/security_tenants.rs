//! Tenants who share a worker or a controller, tried as an attacker would (issue 31 items 5 and
//! 10): one namespace's async results, functions, code and big-memory calls must not take the
//! store, the disk or the memory from another, and an `Idempotency-Key` is the calling key's own.
//! Each test is an attack that worked before the per-namespace limits and the key scoping.

mod common;

use common::cluster::{join, sim_fn, wait_members, wait_until};
use common::{wait_invocation, Server};
use hearth_cli::client::Response;
use hearth_service::store::local_etcd::{etcd_for_tests, LocalEtcd};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

fn put(s: &Server, key: &str, name: &str, spec: &Value) -> Response {
    s.client_with(key)
        .put(
            &format!("/v1/functions/{name}"),
            spec.to_string().as_bytes(),
        )
        .unwrap()
}

/// A function whose code is `main.py` padded to about `bytes` bytes.
fn with_code(bytes: usize) -> Value {
    let mut files = BTreeMap::new();
    let pad = "#".repeat(bytes.saturating_sub(40));
    files.insert(
        "main.py".to_string(),
        format!("def main(a):\n    return a\n{pad}\n"),
    );
    json!({"code": {"files": files}, "sim_warm_ms": 1, "memory_mb": 64})
}

fn assert_namespace_limit(r: &Response, status: u16, setting: &str) {
    assert_eq!(r.status, status, "{}", r.text());
    let e = &r.json()["error"];
    assert_eq!(e["code"], "namespace_limit", "{}", r.text());
    assert_eq!(e["setting"], setting, "{}", r.text());
    assert_eq!(e["namespace"], "team-a", "{}", r.text());
    assert!(e["message"].as_str().unwrap().contains(setting), "{e}");
}

/// Tenant A floods the async store. Before, the store's bounds were shared: A's large results
/// evicted B's finished result (404), and A's records made B's next call 429. Now A makes room
/// only out of its own results, and stops at its own share of records (429 naming it).
#[test]
fn a_tenant_filling_its_async_share_neither_evicts_nor_refuses_another() {
    let mut env = vec![("HEARTH_CONCURRENCY", "8")];
    env.extend_from_slice(ASYNC_SHARES);
    let s = Server::start("sim", &env);
    async_share_is_the_tenants_own(&s);
}

/// The same attack on a cluster, whose async records live in etcd: before, etcd's store
/// counted nothing, in all or per namespace (A could fill etcd, whose quota makes the whole
/// cluster read-only once full).
#[test]
fn a_tenant_filling_its_async_share_in_an_etcd_cluster_neither_evicts_nor_refuses_another() {
    let Some((_etcd, c, _w)) = etcd_cluster(ASYNC_SHARES) else {
        return;
    };
    async_share_is_the_tenants_own(&c);
}

/// Small async bounds: 40 records and 2 MB in all, half of each per namespace.
const ASYNC_SHARES: &[(&str, &str)] = &[
    ("HEARTH_ASYNC_MAX_RECORDS", "40"),
    ("HEARTH_ASYNC_MAX_BYTES", "2000000"),
    ("HEARTH_ASYNC_MAX_RECORDS_PER_NAMESPACE", "20"),
    ("HEARTH_ASYNC_MAX_BYTES_PER_NAMESPACE", "1000000"),
];

/// A fills the async store through `s` (a single node or a cluster's controller).
fn async_share_is_the_tenants_own(s: &Server) {
    let a = s.new_key("team-a", "admin");
    let b = s.new_key("team-b", "admin");
    assert_eq!(put(s, &a, "f", &sim_fn(1, 0)).status, 201);
    assert_eq!(put(s, &b, "f", &sim_fn(1, 0)).status, 201);
    let submit = |key: &str, args: &[u8]| {
        let r = s
            .client_with(key)
            .post("/v1/functions/f/invoke?async=true", args)
            .unwrap();
        if r.status == 202 {
            let id = r.json()["id"].as_str().unwrap().to_string();
            assert_eq!(wait_invocation(s, &id)["status"], "succeeded");
            Ok(id)
        } else {
            Err(r)
        }
    };
    // B's result, finished first: the oldest in the store.
    let b_id = submit(&b, b"{}").unwrap();
    // A: 20 calls of 100 kB arguments, 2.7 MB of records: more than the whole store keeps.
    let big = json!({ "blob": "x".repeat(100_000) }).to_string();
    let a_ids: Vec<String> = (0..20)
        .map(|i| submit(&a, big.as_bytes()).unwrap_or_else(|r| panic!("{i}: {}", r.text())))
        .collect();
    let read = |key: &str, id: &str| {
        s.client_with(key)
            .get(&format!("/v1/invocations/{id}"))
            .unwrap()
            .status
    };
    assert_eq!(read(&b, &b_id), 200, "B's result was evicted by A's");
    // A's own oldest results made room for its newer ones.
    assert_eq!(read(&a, &a_ids[0]), 404, "A kept more than its byte share");
    assert_eq!(read(&a, &a_ids[19]), 200);
    // A's small calls fill its share of records, and no more.
    let mut refused = None;
    for _ in 0..40 {
        if let Err(r) = submit(&a, b"{}") {
            refused = Some(r);
            break;
        }
    }
    let refused = refused.expect("A's records were never refused");
    assert_namespace_limit(&refused, 429, "async_max_records_per_namespace");
    assert!(refused.header("retry-after").is_some());
    // B still starts calls and reads its result.
    submit(&b, b"{}").unwrap_or_else(|r| panic!("B was refused: {}", r.text()));
    assert_eq!(read(&b, &b_id), 200);
}

/// One tenant registered 300 functions, and 2.5 MB of uploads became 1.9 GB on disk. Now a
/// namespace has at most `max_functions_per_namespace` functions and
/// `max_code_bytes_per_namespace` of unpacked code; an update counts its new size minus its
/// old one, and another namespace is unaffected.
#[test]
fn functions_and_code_bytes_are_bounded_per_namespace() {
    let s = Server::start(
        "sim",
        &[
            ("HEARTH_MAX_FUNCTIONS_PER_NAMESPACE", "3"),
            ("HEARTH_MAX_CODE_BYTES_PER_NAMESPACE", "100000"),
        ],
    );
    let a = s.new_key("team-a", "admin");
    let b = s.new_key("team-b", "admin");
    assert_eq!(put(&s, &a, "big", &with_code(60_000)).status, 201);
    // Code over the namespace's room is refused while it unpacks.
    let r = put(&s, &a, "big2", &with_code(60_000));
    assert_namespace_limit(&r, 413, "max_code_bytes_per_namespace");
    // An update replaces the old code: 90 kB in place of 60 kB fits.
    assert_eq!(put(&s, &a, "big", &with_code(90_000)).status, 200);
    let r = put(&s, &a, "big", &with_code(120_000));
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(put(&s, &a, "small", &with_code(5_000)).status, 201);
    assert_eq!(put(&s, &a, "third", &sim_fn(1, 0)).status, 201);
    // The fourth function is refused; updating one of the three is not.
    let r = put(&s, &a, "fourth", &sim_fn(1, 0));
    assert_namespace_limit(&r, 429, "max_functions_per_namespace");
    assert_eq!(put(&s, &a, "third", &sim_fn(2, 0)).status, 200);
    // Another namespace has limits of its own.
    assert_eq!(put(&s, &b, "big", &with_code(90_000)).status, 201);
    for n in ["f1", "f2"] {
        assert_eq!(put(&s, &b, n, &sim_fn(1, 0)).status, 201);
    }
    // Deleting a function gives its room back.
    let r = s.client_with(&a).delete("/v1/functions/big").unwrap();
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(put(&s, &a, "big2", &with_code(60_000)).status, 201);
    let listed = s.client_with(&a).get("/v1/functions").unwrap().json();
    assert_eq!(listed["functions"].as_array().unwrap().len(), 3);
}

/// A tenant's big-memory calls held the worker's sandbox memory, and another tenant's cold start
/// waited seconds behind them. Now one namespace's calls hold at most `namespace_memory_share`
/// of the budget while another namespace has functions here: A's second 400 MiB call is
/// refused (429 `fair_share`) and B's cold start is admitted while A's first call runs.
#[test]
fn a_tenants_big_memory_calls_do_not_hold_another_tenants_cold_start() {
    let s = Server::start(
        "sim",
        &[("HEARTH_MEMORY_MB", "1000"), ("HEARTH_CONCURRENCY", "8")],
    );
    let a = s.new_key("team-a", "admin");
    let b = s.new_key("team-b", "admin");
    let spec = |warm_ms: u64| json!({"sim_warm_ms": warm_ms, "sim_cold_ms": 1, "memory_mb": 400});
    assert_eq!(put(&s, &a, "big", &spec(3000)).status, 201);
    assert_eq!(put(&s, &b, "cold", &spec(1)).status, 201);
    let mut first = s.client_with(&a);
    let running =
        std::thread::spawn(move || first.post("/v1/functions/big/invoke", b"{}").unwrap());
    wait_until("A's first call runs", Duration::from_secs(10), || {
        s.status()["queue"]["running"].as_u64() == Some(1)
    });
    // A's second big call would hold 800 of the 1,000 MiB: refused at once, not queued.
    let r = s
        .client_with(&a)
        .post("/v1/functions/big/invoke", b"{}")
        .unwrap();
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "fair_share");
    assert!(r.text().contains("namespace_memory_share"), "{}", r.text());
    assert!(r.header("retry-after").is_some());
    // B's cold start finds memory while A's call still runs.
    let r = s
        .client_with(&b)
        .post("/v1/functions/cold/invoke", b"{}")
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(!running.is_finished(), "B's call had to wait for A's");
    assert_eq!(running.join().unwrap().status, 200);
    // With A's call over, A runs again.
    let r = s
        .client_with(&a)
        .post("/v1/functions/big/invoke", b"{}")
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}

/// Two invoke keys of one namespace send the same `Idempotency-Key`: the second used to get the
/// first key's answer byte for byte. Now each key gets its own call, sync and async.
fn idempotency_keys_belong_to_the_calling_key(s: &Server, admin: &str) {
    assert_eq!(put(s, admin, "f", &sim_fn(1, 0)).status, 201);
    let k1 = s.new_key("team-a", "invoke");
    let k2 = s.new_key("team-a", "invoke");
    // One Idempotency-Key per path: the sync call's is not the async call's.
    let call = |key: &str, path: &str| {
        let mut c = s.client_with(key);
        let idem = if path.contains("async") {
            "order-2"
        } else {
            "order-1"
        };
        c.set_header("Idempotency-Key", Some(idem)).unwrap();
        c.post(path, b"{}").unwrap()
    };
    for path in [
        "/v1/functions/f/invoke",
        "/v1/functions/f/invoke?async=true",
    ] {
        let first = call(&k1, path);
        assert!(matches!(first.status, 200 | 202), "{}", first.text());
        assert!(first.header("hearth-idempotent-replay").is_none());
        let id_of = |r: &Response| {
            r.header("hearth-invocation-id")
                .map(String::from)
                .or_else(|| r.json()["id"].as_str().map(String::from))
                .unwrap()
        };
        let theirs = call(&k2, path);
        assert_eq!(theirs.status, first.status, "{}", theirs.text());
        assert!(
            theirs.header("hearth-idempotent-replay").is_none(),
            "{path}: the second key got the first key's answer"
        );
        assert_ne!(id_of(&theirs), id_of(&first), "{path}");
        // Each key's own repeat is still a replay of its own call.
        let again = call(&k1, path);
        assert_eq!(again.header("hearth-idempotent-replay"), Some("true"));
        assert_eq!(id_of(&again), id_of(&first));
        let again = call(&k2, path);
        assert_eq!(again.header("hearth-idempotent-replay"), Some("true"));
        assert_eq!(id_of(&again), id_of(&theirs));
        // And the second key reads its own result, not the first's.
        let id = id_of(&theirs);
        let rec = s
            .client_with(&k2)
            .get(&format!("/v1/invocations/{id}"))
            .unwrap();
        assert_eq!(rec.status, 200, "{}", rec.text());
        let mine = s
            .client_with(&k1)
            .get(&format!("/v1/invocations/{id}"))
            .unwrap();
        assert_eq!(mine.status, 404);
        wait_invocation(s, &id);
    }
}

#[test]
fn an_idempotency_key_is_scoped_to_the_calling_key_on_a_worker() {
    let s = Server::start("sim", &[]);
    let admin = s.new_key("team-a", "admin");
    idempotency_keys_belong_to_the_calling_key(&s, &admin);
}

#[test]
fn an_idempotency_key_is_scoped_to_the_calling_key_on_a_controller() {
    let c = Server::start_controller("ch", &[]);
    let w = join(&c, None, &[]);
    wait_members(&c, &[w.worker_id()]);
    let admin = c.new_key("team-a", "admin");
    idempotency_keys_belong_to_the_calling_key(&c, &admin);
}

/// The controller counts functions and code per namespace before its registry (and, in a
/// cluster, its store) takes them.
#[test]
fn a_controller_bounds_functions_per_namespace() {
    let c = Server::start_controller("ch", &[("HEARTH_MAX_FUNCTIONS_PER_NAMESPACE", "2")]);
    let w = join(&c, None, &[]);
    wait_members(&c, &[w.worker_id()]);
    let a = c.new_key("team-a", "admin");
    let b = c.new_key("team-b", "admin");
    for n in ["f1", "f2"] {
        assert_eq!(put(&c, &a, n, &sim_fn(1, 0)).status, 201);
    }
    let r = put(&c, &a, "f3", &sim_fn(1, 0));
    assert_namespace_limit(&r, 429, "max_functions_per_namespace");
    assert_eq!(put(&c, &b, "f1", &sim_fn(1, 0)).status, 201);
}

/// A sim worker and a controller sharing a real etcd (`--store`), when etcd is installed.
fn etcd_cluster(env: &[(&str, &str)]) -> Option<(LocalEtcd, Server, Server)> {
    if !etcd_for_tests() {
        return None;
    }
    let mut e = LocalEtcd::start(1).expect("start etcd");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(e.wait_ready())
        .expect("etcd ready");
    let url = e.store_url();
    let mut settings = vec![
        ("HEARTH_STATUS_INTERVAL_MS", "100"),
        ("HEARTH_LEASE_TTL_MS", "1000"),
    ];
    settings.extend_from_slice(env);
    let c = Server::run_hearth_in_tmp(
        &["controller", "--store", &url, "--balance", "ch"],
        &settings,
    );
    let id = common::cluster::fresh_worker_id();
    let key = common::cluster::credential_for(&c, &id).expect("a worker credential");
    let w = Server::start(
        "sim",
        &[
            ("HEARTH_STORE", url.as_str()),
            ("HEARTH_WORKER_ID", id.as_str()),
            ("HEARTH_CLUSTER_KEY_FILE", key.to_str().unwrap()),
            ("HEARTH_LEASE_TTL_MS", "1000"),
        ],
    );
    wait_members(&c, &[w.worker_id()]);
    Some((e, c, w))
}

/// In a cluster the idempotency keys live in etcd, hashed with the function: now with the
/// calling key as well.
#[test]
fn an_idempotency_key_is_scoped_to_the_calling_key_in_an_etcd_cluster() {
    let Some((_etcd, c, _w)) = etcd_cluster(&[]) else {
        return;
    };
    let admin = c.new_key("team-a", "admin");
    idempotency_keys_belong_to_the_calling_key(&c, &admin);
}

/// A controller with a store checks a namespace's function count before the store takes the
/// function: the refused one is in neither its registry nor the cluster's.
#[test]
fn a_cluster_controller_bounds_functions_before_its_store_takes_them() {
    let Some((_etcd, c, _w)) = etcd_cluster(&[("HEARTH_MAX_FUNCTIONS_PER_NAMESPACE", "2")]) else {
        return;
    };
    let a = c.new_key("team-a", "admin");
    for n in ["f1", "f2"] {
        assert_eq!(put(&c, &a, n, &sim_fn(1, 0)).status, 201);
    }
    let r = put(&c, &a, "f3", &sim_fn(1, 0));
    assert_namespace_limit(&r, 429, "max_functions_per_namespace");
    let r = put(&c, &a, "big", &with_code(1_000));
    assert_namespace_limit(&r, 429, "max_functions_per_namespace");
    std::thread::sleep(Duration::from_millis(300));
    let listed = c.client_with(&a).get("/v1/functions").unwrap().json();
    assert_eq!(listed["functions"].as_array().unwrap().len(), 2, "{listed}");
    assert_eq!(put(&c, &a, "f1", &sim_fn(2, 0)).status, 200);
}
