//! Joining a controller: the worker pushes its status to `PUT /v1/cluster/workers/{id}` every
//! `status_interval_ms` (the first push joins it) and says goodbye with a `DELETE` when it shuts
//! down. The controller balances on these reports, stale by up to one interval by design.
//!
//! The report is built from [`Worker::status`]: the load (the normalized 1-minute load average
//! `load.normalized` plus the queued invocations per CPU, [`WorkerLoad::of_worker`]), the queue
//! (`queue.length`, `queue.running`), free memory and the sandboxes per function. Where the status
//! has no `load` or `queue` section, the load is the running sandboxes per CPU and the queue is
//! empty.

use crate::worker::Worker;
use bytes::Bytes;
use hearth_core::balance::WorkerLoad;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Sandboxes of one function on a worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionSandboxes {
    #[serde(default)]
    pub warm: u32,
    #[serde(default)]
    pub running: u32,
    #[serde(default)]
    pub starting: u32,
}

/// What a worker tells its controller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    pub worker: String,
    /// Where the controller sends this worker's invocations.
    pub url: String,
    /// Random per process start: a new one tells the controller that the worker restarted and
    /// its functions must be registered again.
    pub incarnation: String,
    pub backend: String,
    pub load: WorkerLoad,
    pub cpus: f64,
    pub shutting_down: bool,
    pub functions: BTreeMap<String, FunctionSandboxes>,
}

impl StatusReport {
    /// Builds a report from the JSON of `GET /v1/status`.
    pub fn from_status(status: &Value, url: &str, incarnation: &str) -> Self {
        let functions: BTreeMap<String, FunctionSandboxes> = status["functions"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(name, v)| {
                        let n = |k: &str| v[k].as_u64().unwrap_or(0) as u32;
                        let pool = FunctionSandboxes {
                            warm: n("warm"),
                            running: n("running"),
                            starting: n("starting"),
                        };
                        (name.clone(), pool)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let sandboxes_running: u32 = functions.values().map(|f| f.running).sum();
        let cpus = status["load"]["cpus"]
            .as_f64()
            .filter(|c| *c > 0.0)
            .unwrap_or_else(host_cpus);
        let load = status["load"]["normalized"]
            .as_f64()
            .unwrap_or(f64::from(sandboxes_running) / cpus);
        StatusReport {
            worker: status["worker"].as_str().unwrap_or_default().to_string(),
            url: url.to_string(),
            incarnation: incarnation.to_string(),
            backend: status["backend"].as_str().unwrap_or_default().to_string(),
            load: WorkerLoad::of_worker(
                load,
                status["queue"]["length"].as_u64().unwrap_or(0) as u32,
                status["queue"]["running"]
                    .as_u64()
                    .map_or(sandboxes_running, |r| r as u32),
                cpus,
                status["memory"]["free_mb"].as_u64().unwrap_or(0),
            ),
            cpus,
            shutting_down: status["shutting_down"].as_bool().unwrap_or(false),
            functions,
        }
    }
}

fn host_cpus() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}

/// A new random incarnation id.
pub fn new_incarnation() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Percent-encodes a worker id for use as one path segment.
pub fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

async fn send(
    client: &HttpClient,
    method: Method,
    url: &str,
    body: Bytes,
    timeout: Duration,
) -> Result<StatusCode, String> {
    let req = Request::builder()
        .method(method)
        .uri(url)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    let exchange = async {
        let resp = client.request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let _ = resp.into_body().collect().await;
        Ok(status)
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("no answer within {timeout:?}"))?
}

/// Pushes status to `controller` until `stopping` turns true, then leaves.
pub async fn run(
    worker: Arc<Worker>,
    controller: String,
    url: String,
    interval: Duration,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) {
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let incarnation = new_incarnation();
    let endpoint = format!(
        "{}/v1/cluster/workers/{}",
        controller.trim_end_matches('/'),
        path_segment(worker.id())
    );
    let timeout = interval.max(Duration::from_secs(1));
    let mut joined: Option<bool> = None;
    loop {
        if *stopping.borrow() {
            break;
        }
        let report = StatusReport::from_status(&worker.status(), &url, &incarnation);
        let body = serde_json::to_vec(&report)
            .map(Bytes::from)
            .unwrap_or_default();
        let res = send(&client, Method::PUT, &endpoint, body, timeout).await;
        match res {
            Ok(s) if s.is_success() => {
                if joined != Some(true) {
                    tracing::info!(%controller, %url, "joined the controller");
                }
                joined = Some(true);
            }
            other => {
                if joined != Some(false) {
                    let why = match other {
                        Ok(s) => format!("it answered {s}"),
                        Err(e) => e,
                    };
                    tracing::warn!(%controller, error = %why, "cannot push status to the controller; retrying every interval");
                }
                joined = Some(false);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stopping.wait_for(|s| *s) => break,
        }
    }
    match send(
        &client,
        Method::DELETE,
        &endpoint,
        Bytes::new(),
        Duration::from_secs(1),
    )
    .await
    {
        Ok(_) => tracing::info!(%controller, "left the controller"),
        Err(e) => {
            tracing::warn!(%controller, error = %e, "could not tell the controller we are leaving")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reports_read_the_load_and_queue_sections_when_present() {
        let status = json!({
            "worker": "w1", "backend": "sim", "shutting_down": false,
            "load": {"cpus": 8, "load_avg_1m": 4.0, "normalized": 0.5},
            "queue": {"length": 3, "running": 5, "limit": 8},
            "memory": {"budget_mb": 4096, "running_mb": 0, "warm_mb": 128, "free_mb": 3968},
            "functions": {"f": {"warm": 1, "running": 2, "starting": 0}},
        });
        let r = StatusReport::from_status(&status, "http://127.0.0.1:1", "abc");
        assert_eq!(r.worker, "w1");
        // The normalized load average plus the queue per CPU: 0.5 + 3 / 8.
        assert_eq!(r.load.load, 0.875);
        assert_eq!(
            (r.load.queue_len, r.load.running, r.load.free_mb),
            (3, 5, 3968)
        );
        assert_eq!(r.cpus, 8.0);
        assert_eq!(r.functions["f"].running, 2);
    }

    #[test]
    fn without_a_load_section_the_load_is_running_sandboxes_per_cpu() {
        let status = json!({
            "worker": "w1", "backend": "sim",
            "memory": {"free_mb": 10},
            "functions": {"f": {"warm": 0, "running": 3, "starting": 1}, "g": {"running": 1}},
        });
        let r = StatusReport::from_status(&status, "http://x:1", "abc");
        assert!((r.load.load - 4.0 / host_cpus()).abs() < 1e-9);
        assert_eq!((r.load.queue_len, r.load.running), (0, 4));
    }

    #[test]
    fn worker_ids_become_one_path_segment() {
        assert_eq!(path_segment("127.0.0.1:7878"), "127.0.0.1:7878");
        assert_eq!(path_segment("a/b c"), "a%2Fb%20c");
    }
}
