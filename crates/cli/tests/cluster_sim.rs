//! A controller in front of `sim` workers, all real processes: the same public API as a worker,
//! routing, async invocations, a worker killed mid-run, rejoining, static membership, restarts
//! and `hearth up --workers N`.

mod common;

use common::cluster::{
    answering_workers, credential_for, home, join, patient_client, sim_fn, wait_members,
    wait_until, worker_token, workers_up,
};
use common::{wait_invocation, Server};
use serde_json::json;
use std::collections::BTreeSet;
use std::time::Duration;

fn ids(workers: &[&Server]) -> Vec<String> {
    workers.iter().map(|w| w.worker_id()).collect()
}

#[test]
fn the_controller_serves_the_worker_api_and_keeps_functions_on_their_home_worker() {
    // CH-BL: under the bound a function always runs on its home (CH-RLU would also spread a
    // function this hot: it is the most popular one).
    let c = Server::start_controller("ch-bl", &[]);
    let workers = [
        join(&c, None, &[]),
        join(&c, None, &[]),
        join(&c, None, &[]),
    ];
    wait_members(&c, &ids(&workers.iter().collect::<Vec<_>>()));
    assert_eq!(c.status()["role"], "controller");
    assert_eq!(c.status()["backend"], "sim");

    let r = c.put_fn("f", sim_fn(1, 20));
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(
        c.put_fn("f", sim_fn(1, 20)).status,
        200,
        "an update answers 200"
    );
    let h = home(&c, "f");
    for i in 0..5 {
        let r = c.invoke("f", r#"{"n": 1}"#);
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(
            v["worker"],
            h.as_str(),
            "under the bound, f stays on its home worker"
        );
        assert_eq!(v["cold"], i == 0);
        let t = &v["timing"];
        let ctl = t["controller"]
            .as_u64()
            .expect("the controller adds its own time");
        assert!(t["overhead"].as_u64().unwrap() >= ctl);
        assert_eq!(
            t["e2e"].as_u64().unwrap(),
            t["queue"].as_u64().unwrap()
                + t["init"].as_u64().unwrap()
                + t["exec"].as_u64().unwrap()
                + t["overhead"].as_u64().unwrap()
        );
    }
    // Registered on a worker before its first invocation there, and only there.
    for w in &workers {
        let got = w.client().get("/v1/functions/f").unwrap().status;
        assert_eq!(
            got,
            if w.worker_id() == h { 200 } else { 404 },
            "{}",
            w.worker_id()
        );
    }
    // Functions spread over the ring.
    let mut used = BTreeSet::new();
    for i in 0..20 {
        let name = format!("g{i}");
        assert_eq!(c.put_fn(&name, sim_fn(0, 0)).status, 201);
        let r = c.invoke(&name, "{}");
        assert_eq!(r.status, 200, "{}", r.text());
        used.insert(r.json()["worker"].as_str().unwrap().to_string());
    }
    assert!(used.len() >= 2, "20 functions all landed on {used:?}");

    // Errors are the worker's.
    let r = c.invoke("nope", "{}");
    assert_eq!(
        (r.status, r.json()["error"]["code"].clone()),
        (404, json!("unknown_function"))
    );
    assert_eq!(c.invoke("f", "{oops").status, 400);
    assert_eq!(c.put_fn("bad", json!({"memory_mb": 1})).status, 400);
    let r = c
        .client()
        .post("/v1/functions/f/prewarm", br#"{"count": 2}"#)
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        (r.json()["ready"].clone(), r.json()["worker"].clone()),
        (json!(2), json!(h))
    );
    let list = c.client().get("/v1/functions").unwrap().json();
    assert_eq!(list["functions"].as_array().unwrap().len(), 21);
    let metrics = c.client().get("/metrics").unwrap().text();
    assert!(
        metrics.contains("hearth_controller_invocations_total{outcome=\"ok\"}"),
        "{metrics}"
    );

    // Deleting at the controller deletes on the worker too.
    assert_eq!(c.client().delete("/v1/functions/f").unwrap().status, 204);
    assert_eq!(c.invoke("f", "{}").status, 404);
    let hw = workers.iter().find(|w| w.worker_id() == h).unwrap();
    wait_until("the home worker forgets f", Duration::from_secs(10), || {
        hw.client().get("/v1/functions/f").unwrap().status == 404
    });
}

#[test]
fn round_robin_takes_the_workers_in_turn() {
    let c = Server::start_controller("round-robin", &[]);
    let (a, b) = (join(&c, None, &[]), join(&c, None, &[]));
    wait_members(&c, &ids(&[&a, &b]));
    assert_eq!(c.put_fn("f", sim_fn(0, 0)).status, 201);
    let got = answering_workers(&c, "f", 4);
    assert_ne!(got[0], got[1]);
    assert_eq!((&got[0], &got[1]), (&got[2], &got[3]));
}

#[test]
fn async_invocations_are_accepted_and_answered_by_the_controller() {
    let c = Server::start_controller("ch-rlu", &[]);
    let (a, b) = (join(&c, None, &[]), join(&c, None, &[]));
    wait_members(&c, &ids(&[&a, &b]));
    assert_eq!(c.put_fn("f", sim_fn(50, 0)).status, 201);
    let r = c
        .client()
        .post("/v1/functions/f/invoke?async=true", br#"{"x": 1}"#)
        .unwrap();
    assert_eq!(r.status, 202, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_string();
    let v = wait_invocation(&c, &id);
    assert_eq!(v["status"], "succeeded", "{v}");
    assert_eq!(v["http_status"], 200);
    assert_eq!(v["worker"], home(&c, "f").as_str());
    assert_eq!(v["result"]["simulated"], true);
    let r = c.client().get("/v1/invocations/nope").unwrap();
    assert_eq!(r.status, 404);
    let r = c
        .client()
        .post("/v1/functions/missing/invoke?async=true", b"{}")
        .unwrap();
    assert_eq!(r.status, 404);
}

#[test]
fn a_worker_killed_mid_run_fails_its_sync_call_clearly_retries_its_async_one_elsewhere() {
    // A long status deadline: here the controller notices failures by the connections alone.
    let c = Server::start_controller("ch", &[("HEARTH_STATUS_TIMEOUT_MS", "60000")]);
    let mut workers = [
        join(&c, None, &[]),
        join(&c, None, &[]),
        join(&c, None, &[]),
    ];
    wait_members(&c, &ids(&workers.iter().collect::<Vec<_>>()));
    assert_eq!(c.put_fn("slow", sim_fn(3_000, 0)).status, 201);
    let h = home(&c, "slow");
    let victim = workers.iter().position(|w| w.worker_id() == h).unwrap();

    let mut sync_client = patient_client(&c);
    let sync_call = std::thread::spawn(move || {
        sync_client
            .post("/v1/functions/slow/invoke", b"{}")
            .expect("an answer, not a hang")
    });
    let r = c
        .client()
        .post("/v1/functions/slow/invoke?async=true", b"{}")
        .unwrap();
    assert_eq!(r.status, 202);
    let async_id = r.json()["id"].as_str().unwrap().to_string();
    wait_until(
        "both invocations run on the home worker",
        Duration::from_secs(10),
        || workers[victim].status()["functions"]["slow"]["running"] == 2,
    );
    workers[victim].kill();

    let r = sync_call.join().unwrap();
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "worker_failed");
    assert_eq!(r.json()["error"]["worker"], h.as_str());
    // The accepted async invocation is retried on another worker and ends there, with the
    // lost attempt's reason kept.
    let v = wait_invocation(&c, &async_id);
    assert_eq!(v["status"], "succeeded", "{v}");
    assert_eq!(v["attempts"], 2, "{v}");
    assert_ne!(v["worker"], h.as_str(), "{v}");
    assert!(
        v["failures"][0].as_str().unwrap().contains("worker_failed"),
        "{v}"
    );
    assert!(
        !workers_up(&c).contains(&h),
        "the failed worker left the ring"
    );

    // Its functions now go to the next worker on the ring.
    assert_eq!(c.put_fn("quick", sim_fn(0, 0)).status, 201);
    let r = c.invoke("slow", "{}");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_ne!(r.json()["worker"], h.as_str());

    // A worker that dies idle: the next invocation cannot connect, so it provably never
    // started and is retried once on the next worker.
    let survivors: Vec<usize> = (0..3).filter(|i| *i != victim).collect();
    let mut target = None;
    for i in 0..40 {
        let name = format!("q{i}");
        assert_eq!(c.put_fn(&name, sim_fn(0, 0)).status, 201);
        let hq = home(&c, &name);
        if hq == workers[survivors[0]].worker_id() {
            assert_eq!(c.invoke(&name, "{}").status, 200);
            target = Some(name);
            break;
        }
    }
    let q = target.expect("some function lives on the first survivor");
    workers[survivors[0]].kill();
    std::thread::sleep(Duration::from_millis(100));
    let r = patient_client(&c)
        .post(&format!("/v1/functions/{q}/invoke"), b"{}")
        .unwrap();
    assert_eq!(r.status, 200, "retried on the next worker: {}", r.text());
    assert_eq!(
        r.json()["worker"],
        workers[survivors[1]].worker_id().as_str()
    );
}

#[test]
fn an_invocation_queued_past_its_deadline_gets_504_and_its_worker_stays_in_the_ring() {
    // The controller waits timeout_ms (1 s) + 300 ms; the worker runs one invocation at a time.
    let c = Server::start_controller("ch", &[("HEARTH_FORWARD_GRACE_MS", "300")]);
    let w = join(&c, None, &[("HEARTH_CONCURRENCY", "1")]);
    wait_members(&c, &ids(&[&w]));
    let mut spec = sim_fn(900, 0);
    spec["timeout_ms"] = 1_000.into();
    assert_eq!(c.put_fn("slow", spec).status, 201);

    // Two at once: the second waits ~900 ms in the worker's queue, then runs 900 ms.
    let mut first_client = patient_client(&c);
    let first = std::thread::spawn(move || {
        first_client
            .post("/v1/functions/slow/invoke", b"{}")
            .unwrap()
    });
    wait_until("the first runs", Duration::from_secs(10), || {
        w.status()["functions"]["slow"]["running"] == 1
    });
    let r = patient_client(&c)
        .post("/v1/functions/slow/invoke", b"{}")
        .unwrap();
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "worker_timeout");
    assert_eq!(
        first.join().unwrap().status,
        200,
        "the one running finished"
    );
    let metrics = c.client().get("/metrics").unwrap().text();
    assert!(
        !metrics.contains("event=\"failed\""),
        "a slow worker is not a dead one: it never left the ring\n{metrics}"
    );
    assert!(
        metrics.contains("hearth_controller_invocations_total{outcome=\"worker_timeout\"} 1"),
        "{metrics}"
    );
    assert_eq!(workers_up(&c), ids(&[&w]));
    wait_until("the late invocation ends", Duration::from_secs(10), || {
        w.status()["queue"]["running"] == 0
    });
    let r = c.invoke("slow", "{}");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["worker"], w.worker_id().as_str());
}

/// `Hearth-Drop-Late` travels through the controller: on a worker that runs one invocation at
/// a time, a drop-late call whose deadline passes while it waits behind a long one is dropped
/// there (504 `deadline_passed`, passed on as the worker said it), and the same call without the
/// header runs late. A bad value is refused at the controller.
#[test]
fn a_drop_late_call_travels_through_the_controller_and_is_dropped_at_the_worker() {
    let c = Server::start_controller("ch-bl", &[]);
    let w = join(&c, None, &[("HEARTH_CONCURRENCY", "1")]);
    wait_members(&c, &ids(&[&w]));
    assert_eq!(c.put_fn("long", sim_fn(1500, 0)).status, 201);
    assert_eq!(c.put_fn("f", sim_fn(5, 0)).status, 201);
    let call = |function: &str, headers: &[(&str, &str)]| {
        let mut cl = patient_client(&c);
        for (name, value) in headers {
            cl.set_header(name, Some(value)).unwrap();
        }
        let path = format!("/v1/functions/{function}/invoke");
        std::thread::spawn(move || cl.post(&path, b"{}").unwrap())
    };
    let long = call("long", &[]);
    wait_until("long runs", Duration::from_secs(10), || {
        w.status()["functions"]["long"]["running"] == 1
    });
    let deadline = ("Hearth-Deadline-Ms", "50");
    let dropped = call("f", &[deadline, ("Hearth-Drop-Late", "true")]);
    wait_until("the drop-late call queues", Duration::from_secs(10), || {
        w.status()["queue"]["length"] == 1
    });
    let kept = call("f", &[deadline]);
    wait_until("the plain call queues", Duration::from_secs(10), || {
        w.status()["queue"]["length"] == 2
    });

    let r = dropped.join().unwrap();
    assert_eq!(r.status, 504, "{}", r.text());
    let v = r.json();
    assert_eq!(v["error"]["code"], "deadline_passed", "{v}");
    assert!(v["error"]["late_by_us"].as_u64().unwrap() > 0, "{v}");
    let r = kept.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["deadline_missed"], true);
    assert_eq!(long.join().unwrap().status, 200);

    let worker_metrics = w.client().get("/metrics").unwrap().text();
    assert!(
        worker_metrics.contains("hearth_deadlines_dropped_total{function=\"f\"} 1"),
        "{worker_metrics}"
    );
    let r = call("f", &[("Hearth-Drop-Late", "maybe")]).join().unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("Hearth-Drop-Late"), "{}", r.text());
    assert_eq!(
        workers_up(&c),
        ids(&[&w]),
        "a dropped call is no worker failure"
    );
}

#[test]
fn a_silent_worker_leaves_the_ring_and_rejoins_when_it_comes_back() {
    let c = Server::start_controller(
        "ch-rlu",
        &[
            ("HEARTH_STATUS_TIMEOUT_MS", "600"),
            ("HEARTH_STATUS_INTERVAL_MS", "100"),
        ],
    );
    let tmp = tempfile::Builder::new()
        .prefix("hearth-test-")
        .tempdir()
        .unwrap();
    let a_dir = tmp.path().join("a");
    let a_env = [("HEARTH_WORKER_ID", "test-rejoin-a")];
    let mut a = join(&c, Some(&a_dir), &a_env);
    let b = join(&c, None, &[]);
    wait_members(&c, &ids(&[&a, &b]));
    // A function that lives on a.
    let name = (0..40)
        .map(|i| format!("f{i}"))
        .find(|n| {
            assert_eq!(c.put_fn(n, sim_fn(0, 0)).status, 201);
            home(&c, n) == "test-rejoin-a"
        })
        .expect("some function lives on a");
    assert_eq!(c.invoke(&name, "{}").json()["worker"], "test-rejoin-a");

    a.kill();
    wait_members(&c, &[b.worker_id()]);
    let r = c.invoke(&name, "{}");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["worker"],
        b.worker_id().as_str(),
        "remapped while a is away"
    );

    // a comes back (another port, same id and data): it rejoins and gets its functions back.
    let a = join(&c, Some(&a_dir), &a_env);
    wait_members(&c, &ids(&[&a, &b]));
    let r = c.invoke(&name, "{}");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["worker"], "test-rejoin-a");
}

#[test]
fn static_workers_are_polled_and_the_registry_survives_a_controller_restart() {
    let tmp = tempfile::Builder::new()
        .prefix("hearth-test-")
        .tempdir()
        .unwrap();
    // A static worker proves who it is with a credential the operator made for it; the
    // controller is started once first to make it.
    let data = tmp.path().join("controller");
    let key_file = {
        let c = Server::start_controller_in(&data, "ch-rlu", &[]);
        credential_for(&c, "static-1").unwrap()
    };
    let key_file = key_file.to_str().unwrap();
    let w = Server::start(
        "sim",
        &[
            ("HEARTH_CLUSTER_KEY_FILE", key_file),
            ("HEARTH_WORKER_ID", "static-1"),
        ],
    );
    let static_list = format!("[\"{}\"]", w.url);
    let env = [
        ("HEARTH_WORKERS", static_list.as_str()),
        ("HEARTH_STATUS_INTERVAL_MS", "100"),
    ];
    {
        let c = Server::start_controller_in(&data, "ch-rlu", &env);
        wait_members(&c, &[w.worker_id()]);
        assert_eq!(c.status()["workers"][0]["static"], true);
        let r = c.put_fn("kept", json!({"sim_warm_ms": 1, "priority": 3}));
        assert_eq!(r.status, 201, "{}", r.text());
        assert_eq!(c.invoke("kept", "{}").status, 200);
    }
    let c = Server::start_controller_in(&data, "ch-rlu", &env);
    let r = c.client().get("/v1/functions/kept").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["priority"], 3);
    wait_members(&c, &[w.worker_id()]);
    let r = c.invoke("kept", "{}");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["worker"], w.worker_id().as_str());
}

#[test]
fn no_workers_is_a_503_and_bad_reports_are_refused() {
    let c = Server::start_controller("least-loaded", &[]);
    assert_eq!(c.put_fn("f", sim_fn(0, 0)).status, 201);
    let r = c.invoke("f", "{}");
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "no_workers");
    assert!(r.header("retry-after").is_some());
    credential_for(&c, "x").unwrap();
    let member = worker_token(&c, "x");
    let r = c
        .client_with(&member)
        .put("/v1/cluster/workers/x", b"{\"worker\": 1}")
        .unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(workers_up(&c).is_empty());
}

#[test]
fn hearth_up_starts_a_controller_and_worker_processes_and_stops_them() {
    let tmp = tempfile::Builder::new()
        .prefix("hearth-test-")
        .tempdir()
        .unwrap();
    let data = tmp.path().join("up");
    let mut up = Server::run_hearth(
        &[
            "up",
            "--workers",
            "2",
            "--backend",
            "sim",
            "--balance",
            "ch-bl",
            "--queue",
            "sjf",
            "--keepalive",
            "gdsf",
            "--concurrency",
            "3",
        ],
        &data,
        &[("HEARTH_STATUS_INTERVAL_MS", "100")],
    );
    wait_until("both workers joined", Duration::from_secs(20), || {
        workers_up(&up).len() == 2
    });
    assert_eq!(up.status()["balance"], "ch-bl");
    // Every worker runs with the scheduling flags given to `hearth up`.
    for w in up.status()["workers"].as_array().unwrap() {
        let url = w["url"].as_str().unwrap();
        // The controller's token for that worker, from the credential `hearth up` made it.
        let id = w["worker"].as_str().unwrap();
        let file = std::fs::read_to_string(data.join(format!("workers/{id}.credential"))).unwrap();
        let token = file.lines().find(|l| l.starts_with("hx_")).unwrap();
        let st = hearth_cli::client::Client::new(url)
            .unwrap()
            .with_token(Some(token.to_string()))
            .get("/v1/status")
            .unwrap()
            .json();
        let p = &st["policies"];
        assert_eq!(
            (
                p["queue"].as_str(),
                p["keepalive"].as_str(),
                p["regulator"].as_str()
            ),
            (Some("sjf"), Some("gdsf"), Some("fixed(3)")),
            "{st}"
        );
    }
    assert_eq!(up.put_fn("f", sim_fn(0, 0)).status, 201);
    let r = up.invoke("f", "{}");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(data.join("workers/worker-1").is_dir() && data.join("workers/worker-2").is_dir());
    assert!(up.terminate().success(), "{}", up.log_text());
    let pattern = data.to_string_lossy().to_string();
    wait_until(
        "the worker processes are gone",
        Duration::from_secs(10),
        || {
            !std::process::Command::new("pgrep")
                .args(["-f", &pattern])
                .status()
                .unwrap()
                .success()
        },
    );
}

/// The pid of the `hearth worker` that `hearth up` (pid `up`) runs in `dir`, if one is running.
fn worker_pid(up: u32, dir: &std::path::Path) -> Option<u32> {
    let dir = dir.to_string_lossy().to_string();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        // The parent pid is the 2nd field after the parenthesized command.
        let ppid: u32 = stat.rsplit_once(") ")?.1.split(' ').nth(1)?.parse().ok()?;
        let cmdline = std::fs::read_to_string(e.path().join("cmdline")).ok()?;
        (ppid == up && cmdline.split('\0').any(|a| a == dir)).then_some(pid)
    })
}

/// `hearth up --workers N` supervises its workers: one killed with SIGKILL is restarted and
/// rejoins, and the cluster keeps serving meanwhile (issue 12: the whole cluster stopped).
#[test]
fn hearth_up_restarts_a_worker_that_crashed() {
    let tmp = tempfile::Builder::new()
        .prefix("hearth-test-")
        .tempdir()
        .unwrap();
    let data = tmp.path().join("up");
    let mut up = Server::run_hearth(
        &["up", "--workers", "2", "--backend", "sim"],
        &data,
        &[("HEARTH_STATUS_INTERVAL_MS", "100")],
    );
    wait_until("both workers joined", Duration::from_secs(20), || {
        workers_up(&up).len() == 2
    });
    assert_eq!(up.put_fn("f", sim_fn(1, 0)).status, 201);
    let dir = data.join("workers/worker-1");
    let first = worker_pid(up.pid(), &dir).expect("worker-1 runs");
    unsafe {
        libc::kill(first as i32, libc::SIGKILL);
    }
    // The cluster keeps serving with the other worker while worker-1 is away.
    wait_until(
        "the crashed worker is replaced",
        Duration::from_secs(20),
        || worker_pid(up.pid(), &dir).is_some_and(|p| p != first),
    );
    wait_until("both workers are up again", Duration::from_secs(20), || {
        workers_up(&up).len() == 2
    });
    for _ in 0..10 {
        let r = up.invoke("f", "{}");
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert!(
        up.log_text().contains("worker restarted"),
        "{}",
        up.log_text()
    );
    assert!(up.terminate().success(), "{}", up.log_text());
}

/// A function deleted while its worker was away is removed from that worker when it rejoins: it
/// neither keeps the code and secrets nor answers there (issue 12).
#[test]
fn a_rejoining_worker_drops_functions_deleted_while_it_was_away() {
    let c = Server::start_controller("ch-bl", &[]);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("worker");
    let mut w = join(&c, Some(&dir), &[("HEARTH_WORKER_ID", "test-rejoin-stale")]);
    wait_members(&c, &[w.worker_id()]);
    let spec = json!({"sim_warm_ms": 1, "memory_mb": 64, "env": {"SECRET": "s3cret"}});
    assert_eq!(c.put_fn("gone", spec).status, 201);
    assert_eq!(c.put_fn("kept", sim_fn(1, 0)).status, 201);
    for f in ["gone", "kept"] {
        assert_eq!(c.invoke(f, "{}").status, 200);
    }
    assert!(w.terminate().success());
    assert_eq!(c.client().delete("/v1/functions/gone").unwrap().status, 204);
    let w = join(&c, Some(&dir), &[("HEARTH_WORKER_ID", "test-rejoin-stale")]);
    wait_members(&c, &[w.worker_id()]);
    wait_until(
        "the stale function is gone from the worker",
        Duration::from_secs(10),
        || {
            let list = w.client().get("/v1/functions").unwrap().text();
            !list.contains("\"gone\"")
        },
    );
    assert!(!w
        .client()
        .get("/v1/functions")
        .unwrap()
        .text()
        .contains("s3cret"));
    assert_eq!(w.invoke("gone", "{}").status, 404);
    let r = c.invoke("kept", "{}");
    assert_eq!(r.status, 200, "{}", r.text());
}

/// A deadline counts from the controller's acceptance: the call's own one travels to the worker
/// with the time the controller had spent, and the controller judges the answer again with its
/// own end-to-end time.
#[test]
fn a_call_deadline_travels_through_the_controller_and_is_judged_there() {
    let c = Server::start_controller("ch-bl", &[]);
    let w = join(&c, None, &[]);
    wait_members(&c, &ids(&[&w]));
    assert_eq!(c.put_fn("f", sim_fn(30, 0)).status, 201);
    let mut cl = c.client();
    cl.set_header("Hearth-Deadline-Ms", Some("10")).unwrap();
    let v = cl.post("/v1/functions/f/invoke", b"{}").unwrap().json();
    assert_eq!(v["deadline_ms"], 10, "{v}");
    assert_eq!(v["deadline_missed"], true, "{v}");
    let e2e = v["timing"]["e2e"].as_i64().unwrap();
    assert_eq!(
        v["deadline_margin_us"].as_i64().unwrap(),
        10_000 - e2e,
        "judged on the controller's end-to-end time: {v}"
    );
    cl.set_header("Hearth-Deadline-Ms", Some("60000")).unwrap();
    let v = cl.post("/v1/functions/f/invoke", b"{}").unwrap().json();
    assert_eq!(v["deadline_missed"], false, "{v}");
    cl.set_header("Hearth-Deadline-Ms", Some("0")).unwrap();
    assert_eq!(
        cl.post("/v1/functions/f/invoke", b"{}").unwrap().status,
        400
    );
    let metrics = c.client().get("/metrics").unwrap().text();
    assert!(
        metrics.contains("hearth_controller_deadlines_missed_total 1"),
        "{metrics}"
    );
}
