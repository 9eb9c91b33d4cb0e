//! Failure semantics a client relies on (issue 12): a frozen worker stops getting work within
//! the probe bound, and a worker leaving gracefully drains without a single failed call.

mod common;

use common::cluster::{home, join, patient_client, sim_fn, wait_members, wait_until, workers_up};
use common::Server;
use std::time::{Duration, Instant};

fn signal(s: &Server, sig: i32) {
    // The test's own child, by its PID.
    assert_eq!(unsafe { libc::kill(s.pid() as i32, sig) }, 0);
}

#[test]
fn a_frozen_worker_stops_getting_work_within_the_probe_bound_and_comes_back_thawed() {
    // A status deadline of a minute: only the health probe can notice the freeze.
    let c = Server::start_controller(
        "ch",
        &[
            ("HEARTH_STATUS_TIMEOUT_MS", "60000"),
            ("HEARTH_PROBE_INTERVAL_MS", "100"),
            ("HEARTH_PROBE_TIMEOUT_MS", "300"),
        ],
    );
    let a = join(&c, None, &[]);
    let b = join(&c, None, &[]);
    wait_members(&c, &[a.worker_id(), b.worker_id()]);
    assert_eq!(c.put_fn("f", sim_fn(1, 0)).status, 201);
    let h = home(&c, "f");
    let (frozen, other) = if h == a.worker_id() {
        (&a, &b)
    } else {
        (&b, &a)
    };
    assert_eq!(c.invoke("f", "{}").json()["worker"], h.as_str());

    signal(frozen, libc::SIGSTOP);
    let t0 = Instant::now();
    wait_until(
        "the frozen worker leaves the ring",
        Duration::from_secs(5),
        || !workers_up(&c).contains(&h),
    );
    let detected = t0.elapsed();
    assert!(detected < Duration::from_secs(3), "{detected:?}");
    // Its function goes elsewhere meanwhile, promptly.
    let r = c.invoke("f", "{}");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["worker"], other.worker_id().as_str());

    signal(frozen, libc::SIGCONT);
    wait_until("the thawed worker rejoins", Duration::from_secs(5), || {
        workers_up(&c).contains(&h)
    });
    assert_eq!(c.invoke("f", "{}").json()["worker"], h.as_str());
}

#[test]
fn a_worker_leaving_gracefully_drains_without_a_single_failed_call() {
    let c = Server::start_controller("ch", &[]);
    let mut ws = [join(&c, None, &[]), join(&c, None, &[])];
    wait_members(&c, &[ws[0].worker_id(), ws[1].worker_id()]);
    assert_eq!(c.put_fn("slow", sim_fn(800, 0)).status, 201);
    let h = home(&c, "slow");
    let i = ws.iter().position(|w| w.worker_id() == h).unwrap();
    let running = |w: &Server| {
        w.status()["functions"]["slow"]["running"]
            .as_u64()
            .unwrap_or(0)
    };
    let calls: Vec<_> = (0..6)
        .map(|_| {
            let mut client = patient_client(&c);
            std::thread::spawn(move || client.post("/v1/functions/slow/invoke", b"{}").unwrap())
        })
        .collect();
    wait_until("the calls run", Duration::from_secs(10), || {
        running(&ws[i]) >= 2
    });
    signal(&ws[i], libc::SIGTERM);
    for call in calls {
        let r = call.join().unwrap();
        assert_eq!(
            r.status,
            200,
            "a call failed while its worker drained: {}",
            r.text()
        );
    }
    assert!(ws[i].terminate().success());
    // New calls went on to the other worker.
    let r = c.invoke("slow", "{}");
    assert_eq!(r.status, 200, "{}", r.text());
}
