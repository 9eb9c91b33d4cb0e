//! Test harness: a worker started in this process, called through its router (no socket).
#![allow(dead_code)]

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use hearth_worker::{BackendKind, Worker, WorkerConfig};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;
use tower_service::Service;

/// Whether real-sandbox tests can run here: root, runc, and every path in `needs` (e.g. a
/// cgroup file). Without them a test says why and passes, unless `HEARTH_REQUIRE_RUNC` is set
/// (scripts/test.sh sets it, so CI never skips them silently).
pub fn runc_available(needs: &[&str]) -> bool {
    let ok = unsafe { libc::geteuid() } == 0
        && std::process::Command::new("runc")
            .arg("--version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
        && needs.iter().all(|p| std::path::Path::new(p).exists());
    if !ok {
        assert!(
            std::env::var("HEARTH_REQUIRE_RUNC").is_err(),
            "HEARTH_REQUIRE_RUNC is set but root, runc or one of {needs:?} is missing"
        );
        eprintln!(
            "skipping: real-sandbox tests need root and runc (apt-get install runc) and {needs:?}"
        );
    }
    ok
}

/// The controller's token for the test worker (the `hx_` line of its credential file).
pub const CLUSTER_KEY: &str = "hx_0123456789abcdef_test-controller-token-0123456789";

pub struct TestWorker {
    pub worker: Arc<Worker>,
    pub app: Router,
    /// The operator's key (auth on only).
    pub admin: Option<String>,
    pub data_dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
}

/// A worker configuration for `backend` in a fresh data directory, auth off.
pub fn config(backend: BackendKind, tmp: &tempfile::TempDir) -> WorkerConfig {
    WorkerConfig {
        listen: "127.0.0.1:0".into(),
        data_dir: tmp.path().join("data"),
        worker_id: Some(format!("pt{}", std::process::id())),
        backend,
        memory_mb: 1024,
        auth: false,
        low_latency: false,
        ..WorkerConfig::default()
    }
}

impl TestWorker {
    /// A sim worker with a `memory_mb` budget and a `proactive_mb` pool, auth off.
    pub async fn sim(memory_mb: u64, proactive_mb: u64) -> TestWorker {
        Self::start_with(|c| {
            c.memory_mb = memory_mb;
            c.proactive_mb = proactive_mb;
            c.free_buffer_mb = 0;
        })
        .await
    }

    /// A sim worker with the defaults of [`config`] changed by `tweak`.
    pub async fn start_with(tweak: impl FnOnce(&mut WorkerConfig)) -> TestWorker {
        Self::start_backend(BackendKind::Sim, tweak).await
    }

    pub async fn start_backend(
        backend: BackendKind,
        tweak: impl FnOnce(&mut WorkerConfig),
    ) -> TestWorker {
        let tmp = tempfile::Builder::new()
            .prefix("hearth-worker-test-")
            .tempdir()
            .unwrap();
        let mut c = config(backend, &tmp);
        let key_file = tmp.path().join("cluster.key");
        std::fs::write(
            &key_file,
            format!("hw_0123456789abcdef_test-worker-token-0123456789\n{CLUSTER_KEY}\n"),
        )
        .unwrap();
        c.cluster_key_file = Some(key_file);
        tweak(&mut c);
        c.check().unwrap();
        let data_dir = c.data_dir.clone();
        let worker = Worker::start(c).await.unwrap();
        let admin = std::fs::read_to_string(data_dir.join("admin.key"))
            .ok()
            .map(|k| k.trim().to_string());
        let app = hearth_worker::api::router(Arc::clone(&worker));
        TestWorker {
            worker,
            app,
            admin,
            data_dir,
            _tmp: Some(tmp),
        }
    }

    /// A worker started elsewhere (in a data directory the caller keeps), auth off.
    pub fn from_parts(worker: Arc<Worker>, app: Router, data_dir: PathBuf) -> TestWorker {
        TestWorker {
            worker,
            app,
            admin: None,
            data_dir,
            _tmp: None,
        }
    }

    /// Sends a request with `token` as the bearer (if any) and a raw body.
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Vec<u8>,
    ) -> (StatusCode, Value) {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json");
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let req = req.body(Body::from(body)).unwrap();
        let mut app = self.app.clone();
        let resp = app.call(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let v = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| json!({"raw": String::from_utf8_lossy(&bytes).to_string()}))
        };
        (status, v)
    }

    /// A JSON request as the operator (or anonymous with auth off).
    pub async fn call(&self, method: Method, path: &str, body: Value) -> (StatusCode, Value) {
        let token = self.admin.clone();
        self.raw(
            method,
            path,
            token.as_deref(),
            body.to_string().into_bytes(),
        )
        .await
    }

    /// Registers `name` with `spec`; panics unless it is created.
    pub async fn register(&self, name: &str, spec: Value) {
        let (s, v) = self
            .call(Method::PUT, &format!("/v1/functions/{name}"), spec)
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }

    /// Invokes `name` with `{}`; panics unless it answers 200.
    pub async fn invoke(&self, name: &str) -> Value {
        self.invoke_with(name, json!({})).await
    }

    /// Invokes `name` with `args`; panics unless it answers 200.
    pub async fn invoke_with(&self, name: &str, args: Value) -> Value {
        let (s, v) = self
            .call(Method::POST, &format!("/v1/functions/{name}/invoke"), args)
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        v
    }

    /// `POST /v1/cluster/proactive` as a peer (the cluster key; auth off: anyone).
    pub async fn proactive(&self, commands: &[(&str, &str)]) -> (StatusCode, Value) {
        let commands: Vec<Value> = commands
            .iter()
            .map(|(op, f)| json!({"op": op, "function": f}))
            .collect();
        self.raw(
            Method::POST,
            "/v1/cluster/proactive",
            Some(CLUSTER_KEY),
            json!({ "commands": commands }).to_string().into_bytes(),
        )
        .await
    }

    /// [`Self::proactive`], which must answer 200.
    pub async fn proactive_ok(&self, commands: &[(&str, &str)]) -> Value {
        let (s, v) = self.proactive(commands).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        v
    }

    pub async fn status(&self) -> Value {
        let (s, v) = self.call(Method::GET, "/v1/status", Value::Null).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        v
    }
}

/// A sim function of `memory_mb` whose sandboxes take `cold_ms` to start.
pub fn sim_fn(memory_mb: u64, cold_ms: u64) -> Value {
    json!({"sim_warm_ms": 5, "sim_cold_ms": cold_ms, "memory_mb": memory_mb})
}
