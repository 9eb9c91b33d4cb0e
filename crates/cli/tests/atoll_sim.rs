//! Atoll end to end (docs/atoll.md): a controller with `[atoll]` in front of `sim` workers
//! lending proactive pools, all real processes. Under steady load it sets proactive sandboxes
//! up on the workers ahead of demand, so a burst on top runs warm; the reactive rungs of the
//! ladder make none.

mod common;

use common::cluster::{join, wait_members, wait_until};
use common::Server;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// A 2 ms function whose set-up takes 300 ms, with a deadline of 100 ms.
fn slow_to_start() -> Value {
    json!({"sim_warm_ms": 2, "sim_cold_ms": 300, "memory_mb": 64, "deadline_ms": 100})
}

/// A controller with Atoll (`ladder`) over one group of three workers, each lending 512 MiB.
fn cluster(ladder: &str) -> (Server, Vec<Server>) {
    let c = Server::start_controller(
        "ch-rlu",
        &[
            ("HEARTH_ATOLL__LADDER", ladder),
            ("HEARTH_ATOLL__GROUP_SIZE", "3"),
        ],
    );
    let workers: Vec<Server> = (0..3)
        .map(|_| join(&c, None, &[("HEARTH_PROACTIVE_MB", "512")]))
        .collect();
    let ids: Vec<String> = workers.iter().map(|w| w.worker_id()).collect();
    wait_members(&c, &ids);
    (c, workers)
}

/// `f`'s proactive sandboxes of one kind (`active`, `soft`) on one worker, as it reports them.
fn proactive_on(w: &Server, f: &str, kind: &str) -> u64 {
    w.status()["functions"][f]["proactive"][kind]
        .as_u64()
        .unwrap_or(0)
}

/// Ready proactive sandboxes of `f` over the workers, as they report them.
fn ready_proactive(workers: &[Server], f: &str) -> u64 {
    workers.iter().map(|w| proactive_on(w, f, "active")).sum()
}

/// Soft-evicted proactive sandboxes of `f` over the workers, as they report them.
fn soft_proactive(workers: &[Server], f: &str) -> u64 {
    workers.iter().map(|w| proactive_on(w, f, "soft")).sum()
}

/// Runs `threads` closed loops of invocations of `f` (each pausing `pause` between calls) until
/// `stop` is set; counts the cold ones.
fn background(c: &Server, f: &str, threads: usize, pause: Duration, stop: &AtomicBool) -> u32 {
    let cold = AtomicU32::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut client = c.client();
                while !stop.load(Ordering::Relaxed) {
                    let r = client
                        .post(&format!("/v1/functions/{f}/invoke"), b"{}")
                        .unwrap();
                    assert_eq!(r.status, 200, "{}", r.text());
                    if r.json()["cold"] == true {
                        cold.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::sleep(pause);
                }
            });
        }
    });
    cold.load(Ordering::Relaxed)
}

#[test]
fn atoll_sets_proactive_sandboxes_up_ahead_of_a_burst() {
    let (c, workers) = cluster("atoll");
    assert_eq!(c.status()["atoll"]["ladder"], "atoll");
    assert_eq!(c.status()["atoll"]["groups"], 1);
    assert_eq!(c.put_fn("f", slow_to_start()).status, 201);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        // Steady load: four loops of about 50 calls a second each.
        let load = s.spawn(|| background(&c, "f", 4, Duration::from_millis(20), &stop));
        wait_until(
            "the workers hold a dozen ready proactive sandboxes of f",
            Duration::from_secs(30),
            || ready_proactive(&workers, "f") >= 12,
        );
        // A burst of 12 at once on top of the steady load: each finds a sandbox set up.
        let t = Instant::now();
        let burst: Vec<Value> = std::thread::scope(|b| {
            let calls: Vec<_> = (0..12).map(|_| b.spawn(|| c.invoke("f", "{}"))).collect();
            calls
                .into_iter()
                .map(|h| {
                    let r = h.join().unwrap();
                    assert_eq!(r.status, 200, "{}", r.text());
                    r.json()
                })
                .collect()
        });
        stop.store(true, Ordering::Relaxed);
        let _ = load.join().unwrap();
        let cold: Vec<&Value> = burst.iter().filter(|v| v["cold"] == true).collect();
        assert!(
            cold.is_empty(),
            "{} of 12 burst calls were cold starts: {cold:?}",
            cold.len()
        );
        assert!(
            t.elapsed() < Duration::from_millis(300 * 12),
            "the burst ran warm"
        );
    });
    let status = c.status();
    let stats = &status["atoll"]["stats"];
    assert!(stats["creates"].as_u64().unwrap() >= 12, "{stats}");
    assert!(stats["routed_to_free"].as_u64().unwrap() > 0, "{stats}");
    let balancing = c.client().get("/v1/functions/f").unwrap().json();
    let atoll = &balancing["balancing"]["atoll"];
    assert_eq!(atoll["active_groups"], json!([0]), "{atoll}");
    let metrics = c.client().get("/metrics").unwrap().text();
    assert!(
        metrics.lines().any(|l| l.starts_with(
            "hearth_controller_proactive_commands_total{op=\"create\",result=\"ok\"}"
        )),
        "{metrics}"
    );
    // Load gone: the estimate drops and Atoll soft-evicts the sandboxes (kept warm, not used).
    wait_until(
        "f's proactive sandboxes are soft-evicted",
        Duration::from_secs(30),
        || soft_proactive(&workers, "f") >= 12,
    );
}

#[test]
fn reactive_rungs_set_no_proactive_sandbox_up() {
    let (c, workers) = cluster("gfr");
    assert_eq!(c.put_fn("f", slow_to_start()).status, 201);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| background(&c, "f", 2, Duration::from_millis(20), &stop));
        std::thread::sleep(Duration::from_secs(2));
        stop.store(true, Ordering::Relaxed);
    });
    let stats = &c.status()["atoll"]["stats"];
    assert!(stats["routed"].as_u64().unwrap() > 10, "{stats}");
    assert_eq!(stats["creates"], 0, "{stats}");
    assert_eq!(ready_proactive(&workers, "f"), 0);
}

#[test]
fn sandboxes_a_worker_loses_are_forgotten_by_the_controller() {
    let (c, workers) = cluster("atoll");
    assert_eq!(c.put_fn("f", slow_to_start()).status, 201);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let load = s.spawn(|| background(&c, "f", 4, Duration::from_millis(20), &stop));
        wait_until(
            "the workers hold six ready proactive sandboxes of f",
            Duration::from_secs(30),
            || ready_proactive(&workers, "f") >= 6,
        );
        stop.store(true, Ordering::Relaxed);
        let _ = load.join().unwrap();
    });
    // Load gone: the sandboxes are soft-evicted and the controller's count matches the workers'.
    let controller_soft = || {
        c.client().get("/v1/functions/f").unwrap().json()["balancing"]["atoll"]["soft_evicted"]
            .as_u64()
            .unwrap()
    };
    let workers_soft = || soft_proactive(&workers, "f");
    wait_until(
        "f's sandboxes are soft-evicted, as the controller counts them",
        Duration::from_secs(30),
        || {
            ready_proactive(&workers, "f") == 0
                && workers_soft() >= 6
                && controller_soft() == workers_soft()
        },
    );
    // The sandboxes on the worker holding most are destroyed behind the controller's back
    // (as if killed): a cluster peer's evict commands.
    let w = workers
        .iter()
        .max_by_key(|w| proactive_on(w, "f", "soft"))
        .unwrap();
    let held = proactive_on(w, "f", "soft");
    assert!(held > 0);
    let before = controller_soft();
    // The controller's own token for that worker: proactive commands are the controller's.
    let key = common::cluster::controller_token(&c, &w.worker_id());
    let commands: Vec<Value> = (0..held)
        .map(|_| json!({"op": "evict", "function": "f"}))
        .collect();
    let r = w
        .client_with(key.trim())
        .post(
            "/v1/cluster/proactive",
            json!({ "commands": commands }).to_string().as_bytes(),
        )
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(proactive_on(w, "f", "soft"), 0);
    // The controller learns it from the worker's next reports and forgets them: its count
    // follows the workers' again.
    let lost = || c.status()["atoll"]["stats"]["lost"].as_u64().unwrap();
    let start = Instant::now();
    while !(lost() >= held && controller_soft() == workers_soft()) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the controller did not forget the {held} sandboxes the worker lost: it counts \
             {} soft-evicted (before: {before}), the workers hold {}; atoll: {}",
            controller_soft(),
            workers_soft(),
            c.status()["atoll"]
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // No `controller_soft() < before`: a create still under way when the load stopped can
    // land and be soft-evicted after `before` was read, so the count may climb back; the
    // `lost` counter and the counts agreeing are what show the controller forgot them.
    let metrics = c.client().get("/metrics").unwrap().text();
    assert!(
        metrics.lines().any(|l| l.starts_with(
            "hearth_controller_proactive_commands_total{op=\"create\",result=\"lost\"}"
        )),
        "{metrics}"
    );
}
