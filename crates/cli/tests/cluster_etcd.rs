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

/// Another controller of `first`'s cluster: given the same cluster.key, as the operator
/// gives every controller (etcd keeps only its fingerprint).
fn controller_joining(e: &LocalEtcd, first: &Server) -> Server {
    let url = e.store_url();
    let key = first.cluster_key_file();
    let mut env = SETTINGS.to_vec();
    env.push(("HEARTH_CLUSTER_KEY_FILE", key.to_str().unwrap()));
    Server::run_hearth_in_tmp(&["controller", "--store", &url, "--balance", "ch"], &env)
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
    let c2 = controller_joining(&e, &c1);
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
    // The cluster key is not in etcd (only its fingerprint): nothing to adopt from there.
    assert!(!c2.data_dir.join("cluster.key").exists());
    assert_key_not_in_etcd(&e, &c1);

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
    let c2 = controller_joining(&e, &c1);
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
    let c2 = controller_joining(&e, &c1);
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

// ---- etcd secured (issue 31) ----

/// Every value under /hearth, read with `e`'s admin credentials.
fn etcd_values(e: &LocalEtcd) -> Vec<(String, String)> {
    block_on(e.dump("/hearth/"))
        .expect("read etcd")
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
        .collect()
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// The cluster key of `c` is nowhere in etcd; its SHA-256 fingerprint is.
fn assert_key_not_in_etcd(e: &LocalEtcd, c: &Server) {
    let token = std::fs::read_to_string(c.cluster_key_file()).unwrap();
    let token = token.trim();
    let values = etcd_values(e);
    for (k, v) in &values {
        assert!(!v.contains(token), "{k} holds the cluster key");
    }
    let fp = hearth_service::store::seal::key_fingerprint(token);
    let (_, stored) = values
        .iter()
        .find(|(k, _)| k == "/hearth/docs/config/cluster-key-sha256")
        .expect("the fingerprint is stored");
    assert!(stored.contains(&fp), "{stored}");
    assert!(
        !values
            .iter()
            .any(|(k, _)| k == "/hearth/docs/config/cluster-key"),
        "the key's old place is empty"
    );
}

/// Runs `hearth ARGS` with `env` and expects it to exit by itself with an error within 30 s;
/// returns its stderr.
fn refused(args: &[&str], env: &[(&str, &str)]) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hearth"));
    cmd.args(args)
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(tmp.path().join("d"))
        .env("HEARTH_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            assert!(
                !status.success(),
                "hearth should have refused to start: {err}"
            );
            return err;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("hearth {args:?} did not refuse to start within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A private CA, etcd's certificate for 127.0.0.1, a client certificate, and password files
/// (0600) in a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let dir = tempfile::Builder::new()
            .prefix("hearth-etcd-pki-")
            .tempdir()
            .unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(
            DnType::CommonName,
            format!("Hearth etcd CA {}", std::process::id()),
        );
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let w = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        w("ca.pem", &ca_cert.pem());
        for (name, sans) in [
            ("server", vec!["127.0.0.1".to_string()]),
            ("client", vec![]),
        ] {
            let mut p = CertificateParams::new(sans).unwrap();
            p.distinguished_name
                .push(DnType::CommonName, format!("hearth {name}"));
            let key = KeyPair::generate().unwrap();
            let cert = p.signed_by(&key, &ca_cert, &ca_key).unwrap();
            w(&format!("{name}.pem"), &cert.pem());
            w(&format!("{name}-key.pem"), &key.serialize_pem());
            // Keys are private: the services refuse one that others may read.
            std::fs::set_permissions(
                dir.path().join(format!("{name}-key.pem")),
                std::os::unix::fs::PermissionsExt::from_mode(0o600),
            )
            .unwrap();
        }
        Pki { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_string()
    }

    fn password_file(&self, user: &str, password: &str) -> String {
        use std::os::unix::fs::PermissionsExt;
        let p = self.dir.path().join(format!("{user}.password"));
        std::fs::write(&p, format!("{password}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        p.to_str().unwrap().to_string()
    }

    /// The `HEARTH_STORE_*` settings of `user`.
    fn settings(&self, user: &str, password: &str) -> Vec<(&'static str, String)> {
        vec![
            ("HEARTH_STORE_CA", self.path("ca.pem")),
            ("HEARTH_STORE_CERT", self.path("client.pem")),
            ("HEARTH_STORE_KEY", self.path("client-key.pem")),
            ("HEARTH_STORE_USER", user.to_string()),
            (
                "HEARTH_STORE_PASSWORD_FILE",
                self.password_file(user, password),
            ),
        ]
    }
}

fn borrow<'a>(v: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    v.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

#[test]
fn a_cluster_runs_through_a_secured_etcd_that_keeps_its_secrets_sealed() {
    if !etcd_for_tests() {
        return;
    }
    let pki = Pki::new();
    let mut e = LocalEtcd::start_with(
        1,
        Some(hearth_service::store::local_etcd::LocalEtcdTls {
            ca: pki.path("ca.pem").into(),
            cert: pki.path("server.pem").into(),
            key: pki.path("server-key.pem").into(),
            client_cert_auth: true,
        }),
    )
    .unwrap();
    e.set_admin_identity(
        std::fs::read(pki.path("client.pem")).unwrap(),
        std::fs::read(pki.path("client-key.pem")).unwrap(),
    );
    wait_ready(&mut e);
    block_on(async {
        e.enable_auth("root-pw-0123").await.unwrap();
        e.add_user("controller", "ctl-pw-4567", &[("/hearth/", true, true)])
            .await
            .unwrap();
        e.add_user(
            "worker-w1",
            "wrk-pw-89ab",
            &[("/hearth/members/workers/w1", false, true)],
        )
        .await
        .unwrap();
    });
    let url = e.store_url();
    assert!(url.starts_with("etcds://"), "{url}");

    // The controller works through it with its certificate and user.
    let ctl = pki.settings("controller", "ctl-pw-4567");
    let mut env = SETTINGS
        .iter()
        .map(|(k, v)| (*k, v.to_string()))
        .collect::<Vec<_>>();
    env.extend(ctl.iter().cloned());
    let c1 = Server::run_hearth_in_tmp(
        &["controller", "--store", &url, "--balance", "ch"],
        &borrow(&env),
    );
    // A worker joins with its own etcd user, allowed its own member key only, and its own
    // worker credential.
    let key = common::cluster::credential_for(&c1, "w1").unwrap();
    let mut wenv = pki.settings("worker-w1", "wrk-pw-89ab");
    wenv.extend([
        ("HEARTH_STORE", url.clone()),
        ("HEARTH_WORKER_ID", "w1".to_string()),
        ("HEARTH_CLUSTER_KEY_FILE", key.to_str().unwrap().to_string()),
        ("HEARTH_LEASE_TTL_MS", "1000".to_string()),
    ]);
    let w = Server::start("sim", &borrow(&wenv));
    wait_members(&c1, &["w1".to_string()]);
    let mut spec = sim_fn(5, 0);
    spec["env"] = serde_json::json!({"API_TOKEN": "tok-in-env-31"});
    let r = c1.put_fn("f", spec);
    assert_eq!(r.status, 201, "{}", r.text());
    let r = c1.invoke("f", "{}");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["worker"], "w1");
    let r = c1
        .client()
        .post(
            "/v1/functions/f/invoke?async=true",
            br#"{"card":"4111-secret-arg"}"#,
        )
        .unwrap();
    assert_eq!(r.status, 202, "{}", r.text());
    let v = wait_invocation(&c1, r.json()["id"].as_str().unwrap());
    assert_eq!(v["status"], "succeeded", "{v}");

    // What etcd holds: no env value, arguments or cluster key in clear.
    for (k, v) in etcd_values(&e) {
        assert!(!v.contains("tok-in-env-31"), "{k} holds the env value");
        assert!(!v.contains("4111-secret-arg"), "{k} holds the arguments");
    }
    assert_key_not_in_etcd(&e, &c1);
    // No password in the logs.
    for s in [&c1, &w] {
        let log = s.log_text();
        assert!(
            !log.contains("ctl-pw-4567") && !log.contains("wrk-pw-89ab"),
            "{log}"
        );
    }

    // A second controller with a different cluster.key refuses to start.
    let other = tempfile::tempdir().unwrap();
    let other_key = other.path().join("cluster.key");
    std::fs::write(&other_key, "hearth_cluster_another_key_0123456789abcdef\n").unwrap();
    let mut env2 = env.clone();
    env2.push((
        "HEARTH_CLUSTER_KEY_FILE",
        other_key.to_str().unwrap().to_string(),
    ));
    let err = refused(&["controller", "--store", &url], &borrow(&env2));
    assert!(err.contains("differs from the cluster's"), "{err}");
    assert!(!err.contains("hearth_cluster_another_key"), "{err}");
    // ...and one without credentials cannot even reach the store.
    let err = refused(
        &["controller", "--store", &url],
        &[("HEARTH_STORE_CA", &pki.path("ca.pem"))],
    );
    assert!(err.contains("store") || err.contains("etcd"), "{err}");
    // The first one still serves.
    assert_eq!(c1.invoke("f", "{}").status, 200);
}

#[test]
fn a_plain_etcd_off_loopback_is_refused_unless_acknowledged() {
    let err = refused(&["controller", "--store", "etcd://192.0.2.10:2379"], &[]);
    assert!(err.contains("store_insecure"), "{err}");
    let err = refused(
        &["worker", "--backend", "sim"],
        &[
            ("HEARTH_STORE", "etcd://192.0.2.10:2379"),
            ("HEARTH_AUTH", "false"),
        ],
    );
    assert!(err.contains("store_insecure"), "{err}");
    // Acknowledged, it passes the check, says so loudly, and then fails only for want of an
    // etcd at that address.
    let err = refused(
        &["controller", "--store", "etcd://192.0.2.10:2379"],
        &[("HEARTH_STORE_INSECURE", "1")],
    );
    assert!(
        err.contains("INSECURE") && err.contains("unavailable"),
        "{err}"
    );
    assert!(!err.contains("refusing a plain"), "{err}");
}
