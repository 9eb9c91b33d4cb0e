//! Several controllers serving one cluster through a real etcd (issue 12): any client may use
//! any controller, state and keys are shared, and a killed controller's async invocations are
//! taken over. etcd runs on loopback in temporary directories (`LocalEtcd`).

mod common;

use common::cluster::{runs_on, sim_fn, wait_members, wait_until, workers_up};
use common::{wait_invocation, Server};
use hearth_service::store::local_etcd::{etcd_for_tests, LocalEtcd};
use std::time::{Duration, Instant};

fn etcd(members: usize) -> Option<LocalEtcd> {
    if !etcd_for_tests() {
        return None;
    }
    let mut e = LocalEtcd::start(members).expect("start etcd");
    wait_ready(&mut e);
    Some(e)
}

fn wait_ready(e: &mut LocalEtcd) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(e.wait_ready())
        .expect("etcd ready");
}

const SETTINGS: [(&str, &str); 4] = [
    ("HEARTH_STATUS_INTERVAL_MS", "100"),
    ("HEARTH_LEASE_TTL_MS", "1000"),
    ("HEARTH_ASYNC_RETRY_BACKOFF_MS", "50"),
    ("HEARTH_PROBE_INTERVAL_MS", "100"),
];

fn controller(e: &LocalEtcd) -> Server {
    let url = e.store_url();
    Server::run_hearth_in_tmp(
        &["controller", "--store", &url, "--balance", "ch"],
        &SETTINGS,
    )
}

/// A sim worker that joins through the store with a credential the first controller made.
fn worker(e: &LocalEtcd, first: &Server) -> Server {
    let id = common::cluster::fresh_worker_id();
    let key = common::cluster::credential_for(first, &id).unwrap();
    let url = e.store_url();
    Server::start(
        "sim",
        &[
            ("HEARTH_STORE", url.as_str()),
            ("HEARTH_WORKER_ID", id.as_str()),
            ("HEARTH_CLUSTER_KEY_FILE", key.to_str().unwrap()),
            ("HEARTH_LEASE_TTL_MS", "1000"),
        ],
    )
}

#[test]
fn two_controllers_serve_one_cluster_with_shared_functions_keys_and_results() {
    let Some(e) = etcd(1) else { return };
    let c1 = controller(&e);
    let c2 = controller(&e);
    let w1 = worker(&e, &c1);
    let w2 = worker(&e, &c1);
    let ids = [w1.worker_id(), w2.worker_id()];
    wait_members(&c1, &ids);
    wait_members(&c2, &ids);

    // Registered on one, invoked on the other; both route a function to the same home.
    let r = c1.put_fn("f", sim_fn(5, 0));
    assert_eq!(r.status, 201, "{}", r.text());
    wait_until("c2 has f", Duration::from_secs(5), || {
        c2.client().get("/v1/functions/f").unwrap().status == 200
    });
    let a = c1.invoke("f", "{}");
    let b = c2.invoke("f", "{}");
    assert_eq!(
        (a.status, b.status),
        (200, 200),
        "{} {}",
        a.text(),
        b.text()
    );
    assert_eq!(a.json()["worker"], b.json()["worker"], "one home for both");
    // The second controller registered the same cluster version on that worker: a no-op
    // there, so the sandbox the first call made stays warm.
    assert_eq!(b.json()["cold"], false, "{}", b.text());

    // Keys: the first controller's operator key works on the second, and a key made on the
    // second works on the first.
    let tenant = c2.new_key("default", "invoke");
    wait_until("the key reaches c1", Duration::from_secs(5), || {
        c1.client_with(&tenant)
            .post("/v1/functions/f/invoke", b"{}")
            .unwrap()
            .status
            == 200
    });
    let r = c2
        .client_with(c1.key.as_deref().unwrap())
        .get("/v1/status")
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(c2.data_dir.join("cluster.key").exists());
    assert_eq!(
        std::fs::read_to_string(c2.data_dir.join("cluster.key")).unwrap(),
        std::fs::read_to_string(c1.cluster_key_file()).unwrap(),
        "the second controller adopted the cluster's key"
    );

    // An async invocation accepted by one is read on the other, by its owner.
    let r = c1
        .client_with(&tenant)
        .post("/v1/functions/f/invoke?async=true", b"{}")
        .unwrap();
    assert_eq!(r.status, 202, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = c2
            .client_with(&tenant)
            .get(&format!("/v1/invocations/{id}"))
            .unwrap()
            .json();
        if v["status"] == "succeeded" {
            break;
        }
        assert!(Instant::now() < deadline, "{v}");
        std::thread::sleep(Duration::from_millis(20));
    }

    // Deleted on the second: gone on the first too, and from the worker.
    assert_eq!(c2.client().delete("/v1/functions/f").unwrap().status, 204);
    wait_until("f is gone on c1", Duration::from_secs(5), || {
        c1.invoke("f", "{}").status == 404
    });
    // Revoked on the first: refused on the second.
    let listed = c1.client().get("/v1/keys").unwrap().json();
    let tenant_id = listed["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["role"] == "invoke")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        c1.client()
            .delete(&format!("/v1/keys/{tenant_id}"))
            .unwrap()
            .status,
        204
    );
    wait_until(
        "the revoked key is refused on c2",
        Duration::from_secs(5),
        || c2.client_with(&tenant).get("/v1/functions").unwrap().status == 401,
    );
}

#[test]
fn a_killed_controllers_async_invocations_are_taken_over_and_run_once() {
    let Some(e) = etcd(1) else { return };
    let mut c1 = controller(&e);
    let c2 = controller(&e);
    let w = worker(&e, &c1);
    wait_members(&c1, &[w.worker_id()]);
    wait_members(&c2, &[w.worker_id()]);
    assert_eq!(c1.put_fn("slow", sim_fn(1_500, 0)).status, 201);
    let mut client = c1.client();
    client.set_header("Idempotency-Key", Some("job-1")).unwrap();
    let r = client
        .post("/v1/functions/slow/invoke?async=true", b"{}")
        .unwrap();
    assert_eq!(r.status, 202, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_string();
    wait_until("it runs", Duration::from_secs(10), || {
        w.status()["functions"]["slow"]["running"] == 1
    });
    c1.kill();
    // The other controller knows the id, and the key, at once.
    let mut client = c2.client_with(c1.key.as_deref().unwrap());
    client.set_header("Idempotency-Key", Some("job-1")).unwrap();
    let again = client
        .post("/v1/functions/slow/invoke?async=true", b"{}")
        .unwrap();
    assert_eq!(again.status, 202, "{}", again.text());
    assert_eq!(again.json()["id"], id.as_str());
    // After c1's session ends, c2 takes the invocation over; the worker runs it once.
    let v = wait_invocation(&c2, &id);
    assert_eq!(v["status"], "succeeded", "{v}");
    assert_eq!(v["attempts"], 2, "{v}");
    assert_eq!(runs_on(&w, "slow"), 1);
}

#[test]
fn a_killed_worker_leaves_every_controller_within_its_lease() {
    let Some(e) = etcd(1) else { return };
    let c1 = controller(&e);
    let c2 = controller(&e);
    let mut w1 = worker(&e, &c1);
    let w2 = worker(&e, &c1);
    let ids = [w1.worker_id(), w2.worker_id()];
    wait_members(&c1, &ids);
    wait_members(&c2, &ids);
    let gone = w1.worker_id();
    w1.kill();
    let t0 = Instant::now();
    for c in [&c1, &c2] {
        wait_until("the killed worker leaves", Duration::from_secs(10), || {
            !workers_up(c).contains(&gone)
        });
    }
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_eq!(c2.put_fn("g", sim_fn(1, 0)).status, 201);
    wait_until("c1 has g", Duration::from_secs(5), || {
        c1.client().get("/v1/functions/g").unwrap().status == 200
    });
    for c in [&c1, &c2] {
        let r = c.invoke("g", "{}");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["worker"], w2.worker_id().as_str());
    }
}

#[test]
fn the_cluster_keeps_working_while_one_of_three_etcd_members_is_down() {
    let Some(mut e) = etcd(3) else { return };
    let c = controller(&e);
    let w = worker(&e, &c);
    wait_members(&c, &[w.worker_id()]);
    assert_eq!(c.put_fn("f", sim_fn(5, 0)).status, 201);
    for member in 0..3 {
        e.kill(member).unwrap();
        // Sync invokes never wait on etcd; async accepts and registrations need a quorum,
        // which two of three keep.
        assert_eq!(c.invoke("f", "{}").status, 200);
        let r = c
            .client()
            .post("/v1/functions/f/invoke?async=true", b"{}")
            .unwrap();
        assert_eq!(r.status, 202, "member {member} down: {}", r.text());
        let v = wait_invocation(&c, r.json()["id"].as_str().unwrap());
        assert_eq!(v["status"], "succeeded", "{v}");
        assert_eq!(c.put_fn(&format!("g{member}"), sim_fn(1, 0)).status, 201);
        e.restart(member).unwrap();
        wait_ready(&mut e);
    }
}
