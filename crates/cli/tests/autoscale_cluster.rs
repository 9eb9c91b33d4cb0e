//! The controller's autoscaler against real processes: a controller with `[autoscale]` whose
//! command is a small script that starts one more `sim` worker joining it with the cluster key;
//! a worker with one CPU and a queue of long invocations is overloaded, and the script's worker
//! joins the ring.

mod common;

use common::cluster::{join, sim_fn, wait_until, workers_up};
use common::Server;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The worker the script started: SIGTERM on drop, by the PID the script wrote.
struct Started(PathBuf);

impl Drop for Started {
    fn drop(&mut self) {
        let Ok(text) = std::fs::read_to_string(&self.0) else {
            return;
        };
        for pid in text.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
            // Bounded wait for it to go (it is not our child: poll, treating a zombie as gone).
            for _ in 0..500 {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                let state = stat
                    .rsplit(')')
                    .next()
                    .and_then(|r| r.split_whitespace().next());
                if stat.is_empty() || state == Some("Z") {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The scale-out script: on `out`, once, it starts a sim worker that joins the controller named
/// in `DIR/env` (written once the controller is up), and records the event and the PID.
fn script(dir: &Path) -> PathBuf {
    let d = dir.display();
    let bin = env!("CARGO_BIN_EXE_hearth");
    let text = format!(
        "#!/bin/sh\n\
         [ \"$HEARTH_SCALE_DIRECTION\" = out ] || exit 0\n\
         [ -e '{d}/scaled.pid' ] && exit 0\n\
         . '{d}/env'\n\
         printf '%s' \"$HEARTH_SCALE_EVENT\" > '{d}/event.json'\n\
         HEARTH_WORKER_ID=scaled-1 HEARTH_STATUS_INTERVAL_MS=100 HEARTH_SHUTDOWN_GRACE_S=10 \\\n\
           '{bin}' worker --backend sim --listen \"127.0.0.1:$PORT\" --data-dir '{d}/scaled' \\\n\
           > '{d}/scaled.log' 2>&1 < /dev/null &\n\
         echo $! >> '{d}/scaled.pid'\n"
    );
    let path = dir.join("scale-out.sh");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn an_overloaded_cluster_runs_the_scale_out_command_and_its_worker_joins() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let config = dir.join("controller.toml");
    std::fs::write(
        &config,
        format!(
            "[autoscale]\ncommand = [\"/bin/sh\", \"{}\"]\ninterval_ms = 100\n\
             action_timeout_ms = 20000\n\
             [autoscale.params]\nmin_workers = 1\nmax_workers = 2\ndead_band_ms = 1000\nki = 0.0\n",
            script(dir).display()
        ),
    )
    .unwrap();
    let _started = Started(dir.join("scaled.pid"));
    let c = Server::run_hearth_in_tmp(
        &[
            "controller",
            "--balance",
            "least-loaded",
            "--config",
            config.to_str().unwrap(),
        ],
        // The autoscaler first looks once this has passed: the first worker has joined by then.
        &[("HEARTH_STATUS_TIMEOUT_MS", "5000")],
    );
    std::fs::write(
        dir.join("env"),
        format!(
            "export HEARTH_CONTROLLER='{}'\nexport HEARTH_CLUSTER_KEY_FILE='{}'\nPORT={}\n",
            c.url,
            common::cluster::credential_for(&c, "scaled-1")
                .unwrap()
                .display(),
            free_port()
        ),
    )
    .unwrap();
    // One CPU, one invocation at a time: the queue is the load.
    let w = join(
        &c,
        None,
        &[("HEARTH_CPUS", "1"), ("HEARTH_CONCURRENCY", "1")],
    );
    let first = w.worker_id();
    wait_until("the first worker is up", Duration::from_secs(20), || {
        workers_up(&c) == [first.clone()]
    });
    assert!(
        !dir.join("scaled.pid").exists(),
        "an idle worker at min_workers scales nothing"
    );
    assert_eq!(c.put_fn("slow", sim_fn(4000, 0)).status, 201);
    for _ in 0..5 {
        let r = c
            .client()
            .post("/v1/functions/slow/invoke?async=true", b"{}")
            .unwrap();
        assert_eq!(r.status, 202, "{}", r.text());
    }
    // Four waiting on one CPU: load ≥ 4, over the scale-out load of 1.
    wait_until(
        "the autoscaler's worker joined",
        Duration::from_secs(60),
        || workers_up(&c).contains(&"scaled-1".to_string()),
    );
    let event: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("event.json")).unwrap()).unwrap();
    assert_eq!(event["direction"], "out");
    assert_eq!(event["count"], 1);
    assert_eq!(event["workers"], 1);
    assert_eq!(event["target_workers"], 2);
    assert!(event["mean_load"].as_f64().unwrap() > 1.0, "{event}");
    assert!(
        event["reason"].as_str().unwrap().contains("1 of 1"),
        "{event}"
    );
    let mut up = workers_up(&c);
    up.sort();
    let mut want = vec![first, "scaled-1".to_string()];
    want.sort();
    assert_eq!(up, want);
    // Max is 2: the script ran once.
    let pids = std::fs::read_to_string(dir.join("scaled.pid")).unwrap();
    assert_eq!(pids.lines().count(), 1, "{pids}");
}
