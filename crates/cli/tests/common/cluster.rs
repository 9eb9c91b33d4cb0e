//! Cluster harness: a real `hearth controller` and `sim` workers that join it, as processes.

use super::Server;
use hearth_cli::client::Client;
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

/// How often test workers push status.
pub const STATUS_INTERVAL_MS: &str = "100";

impl Server {
    /// Starts a controller with `balance` and extra `HEARTH_*` settings in a fresh directory.
    pub fn start_controller(balance: &str, env: &[(&str, &str)]) -> Server {
        let tmp = tempfile::Builder::new()
            .prefix("hearth-test-")
            .tempdir()
            .unwrap();
        let data_dir = tmp.path().join("controller");
        let mut s = Server::start_controller_in(&data_dir, balance, env);
        s._tmp = Some(tmp);
        s
    }

    /// Starts a controller on an existing data directory (restart tests).
    pub fn start_controller_in(data_dir: &Path, balance: &str, env: &[(&str, &str)]) -> Server {
        Server::run_hearth(&["controller", "--balance", balance], data_dir, env)
    }

    /// Runs `hearth ARGS` in a fresh temporary data directory (removed with the server).
    pub fn run_hearth_in_tmp(args: &[&str], env: &[(&str, &str)]) -> Server {
        let tmp = tempfile::Builder::new()
            .prefix("hearth-test-")
            .tempdir()
            .unwrap();
        let data_dir = tmp.path().join("controller");
        let mut s = Server::run_hearth(args, &data_dir, env);
        s._tmp = Some(tmp);
        s
    }

    /// Runs `hearth ARGS --listen 127.0.0.1:PORT --data-dir DATA_DIR` and waits for /healthz.
    pub fn run_hearth(args: &[&str], data_dir: &Path, env: &[(&str, &str)]) -> Server {
        Server::spawn_hearth(args, data_dir, env, |_, _| {})
    }

    /// SIGKILL: a crash, with no goodbye to the controller.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// A controller's cluster key (the controllers' master secret, never given to workers).
    pub fn cluster_key_file(&self) -> std::path::PathBuf {
        self.data_dir.join("cluster.key")
    }

    /// Where [`credential_for`] writes `worker`'s credential file (beside the controller's data
    /// directory).
    pub fn credential_file(&self, worker: &str) -> std::path::PathBuf {
        self.data_dir.with_file_name(format!("{worker}.credential"))
    }

    /// The worker's id as it reports it.
    pub fn worker_id(&self) -> String {
        self.status()["worker"].as_str().unwrap().to_string()
    }
}

/// A worker id no other test worker of this run has.
pub fn fresh_worker_id() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("test-w{}-{n}", std::process::id())
}

/// Makes (with the operator's key) a worker credential for `worker` at `controller` and writes
/// its file ([`Server::credential_file`]); an existing file is kept. None when the controller
/// runs without authentication.
pub fn credential_for(controller: &Server, worker: &str) -> Option<std::path::PathBuf> {
    let file = controller.credential_file(worker);
    if file.exists() {
        return Some(file);
    }
    let r = controller
        .client()
        .post(
            "/v1/cluster/credentials",
            serde_json::json!({ "worker": worker })
                .to_string()
                .as_bytes(),
        )
        .unwrap();
    if r.status == 409 {
        return None;
    }
    assert_eq!(r.status, 201, "{}", r.text());
    std::fs::write(&file, r.json()["file"].as_str().unwrap()).unwrap();
    Some(file)
}

/// The controller's token for `worker` (the second line of its credential file).
pub fn controller_token(controller: &Server, worker: &str) -> String {
    let text = std::fs::read_to_string(controller.credential_file(worker)).unwrap();
    text.lines()
        .find(|l| l.starts_with("hx_"))
        .unwrap()
        .to_string()
}

/// A worker's own token (the first line of its credential file).
pub fn worker_token(controller: &Server, worker: &str) -> String {
    let text = std::fs::read_to_string(controller.credential_file(worker)).unwrap();
    text.lines()
        .find(|l| l.starts_with("hw_"))
        .unwrap()
        .to_string()
}

/// A sim worker (with `env` on top) that joins `controller`, in `data_dir` if given. It gets
/// a credential of its own for its id (`HEARTH_WORKER_ID` in `env`, else a fresh one).
pub fn join(controller: &Server, data_dir: Option<&Path>, env: &[(&str, &str)]) -> Server {
    let id = env
        .iter()
        .find(|(k, _)| *k == "HEARTH_WORKER_ID")
        .map(|(_, v)| v.to_string())
        .unwrap_or_else(fresh_worker_id);
    let credential = credential_for(controller, &id);
    let credential = credential.as_ref().map(|p| p.to_str().unwrap().to_string());
    let mut all = vec![
        ("HEARTH_CONTROLLER", controller.url.as_str()),
        ("HEARTH_STATUS_INTERVAL_MS", STATUS_INTERVAL_MS),
        ("HEARTH_WORKER_ID", id.as_str()),
    ];
    if let Some(c) = &credential {
        all.push(("HEARTH_CLUSTER_KEY_FILE", c.as_str()));
    }
    all.extend_from_slice(env);
    match data_dir {
        Some(d) => Server::start_in("sim", d, &all),
        None => Server::start("sim", &all),
    }
}

/// Polls `cond` every 20 ms until it holds; panics with `what` after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The ids of the workers the controller has up.
pub fn workers_up(controller: &Server) -> Vec<String> {
    let mut up: Vec<String> = controller.status()["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["up"] == true)
        .map(|w| w["worker"].as_str().unwrap().to_string())
        .collect();
    up.sort();
    up
}

/// Waits until exactly `ids` are up.
pub fn wait_members(controller: &Server, ids: &[String]) {
    let mut want = ids.to_vec();
    want.sort();
    wait_until(
        &format!("workers {want:?} are up"),
        Duration::from_secs(20),
        || workers_up(controller) == want,
    );
}

/// The worker the policy calls the function's home.
pub fn home(controller: &Server, function: &str) -> String {
    let v = controller
        .client()
        .get(&format!("/v1/functions/{function}"))
        .unwrap()
        .json();
    v["balancing"]["home"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// A client that gives up after 30 s, so a hang fails the test instead of stalling it.
pub fn patient_client(s: &Server) -> Client {
    s.client().with_timeout(Some(Duration::from_secs(30)))
}

pub fn sim_fn(warm_ms: u64, cold_ms: u64) -> Value {
    serde_json::json!({"sim_warm_ms": warm_ms, "sim_cold_ms": cold_ms, "memory_mb": 64})
}

/// The workers that answered `n` invocations of `function` at `controller`, in order.
pub fn answering_workers(controller: &Server, function: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| {
            controller.invoke(function, "{}").json()["worker"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

/// How many invocations of `function` ran to an answer on `worker` (its metrics).
pub fn runs_on(worker: &Server, function: &str) -> u64 {
    let text = worker.client().get("/metrics").unwrap().text();
    text.lines()
        .filter(|l| l.starts_with("hearth_invocations_total{"))
        .filter(|l| l.contains(&format!("function=\"{function}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}
