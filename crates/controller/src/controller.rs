//! The controller: the public API in front of many workers.
//!
//! Hot path of an invocation: registry lookup → one short lock for the routing decision → (once
//! per worker and function version) a registration on the worker → one request over a pooled
//! persistent connection → the worker's answer, with the controller's time added to `timing`.
//!
//! Failure semantics (docs/cluster.md): an invocation is sent at most once per attempt. It is
//! retried once, on the worker the policy picks next, only when it provably never started: the
//! worker could not be reached (connect failed), refused it while shutting down, or failed while
//! the function was being registered there. A failure after the request went out is answered
//! with 502 and never retried, because the function may have run.

use crate::config::ControllerConfig;
use crate::forward::{Answer, ForwardError, Forwarder};
use crate::members::Member;
use crate::metrics::{Metrics, PlacementLabel, WorkerLabel};
use crate::timing;
use axum::http::StatusCode;
use bytes::Bytes;
use dashmap::DashMap;
use hearth_api::FunctionSpec;
use hearth_api::{StatusReport, WorkerStatus};
use hearth_core::balance::{
    Balancer, Decision, Finished, FunctionInfo, FunctionKey, Rejection, WorkerId,
};
use hearth_core::Micros;
use hearth_service::error::ApiError;
use hearth_service::in_flight::InFlightTracker;
use hearth_service::invocations::AsyncInvocations;
use hearth_service::registry::{CodeSource, Registered, Registry, RegistryError};
use hearth_service::serving::open_data_dir;
use hyper::Method;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Errors of [`Controller::start`].
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("data directory {0}: {1}")]
    DataDir(PathBuf, std::io::Error),
    #[error("registry: {0}")]
    Registry(#[from] RegistryError),
    #[error("{0}")]
    Balance(#[from] hearth_core::balance::ParamsError),
}

/// How one attempt on one worker ended, when it did not produce an answer.
enum Attempt {
    /// The invocation provably never started there: try the next worker.
    NotStarted(String),
    /// Final: answer this error.
    Failed(ApiError),
}

/// The routing policy a controller drives; the simulator drives this same type.
pub type RoutingPolicy = Balancer;

/// The controller.
pub struct Controller {
    config: ControllerConfig,
    epoch: Instant,
    registry: Registry,
    /// Code of each function version, packed once for registering it on workers.
    code: DashMap<String, (u64, Arc<Value>)>,
    balancer: Mutex<RoutingPolicy>,
    members: DashMap<u32, Arc<Member>>,
    forwarder: Forwarder,
    pub invocations: AsyncInvocations,
    pub metrics: Metrics,
    shutting_down: AtomicBool,
    in_flight: InFlightTracker,
}

impl Controller {
    /// Opens the registry, announces its functions to the policy and starts the membership
    /// tasks (deadline sweep, polling of static workers).
    pub async fn start(config: ControllerConfig) -> Result<Arc<Self>, StartError> {
        let data_dir = open_data_dir(&config.data_dir)
            .map_err(|e| StartError::DataDir(config.data_dir.clone(), e))?;
        let registry = Registry::open(&data_dir)?;
        let mut balancer = Balancer::new(config.balance, config.balance_params.clone())?;
        for r in registry.list() {
            balancer.register(0, FunctionKey::of(&r.spec.name), function_info(&r.spec));
        }
        let c = Arc::new(Controller {
            forwarder: Forwarder::new(Duration::from_millis(config.connect_timeout_ms)),
            invocations: AsyncInvocations::new(
                Duration::from_secs(config.async_retention_s),
                config.async_max_records,
            ),
            config,
            epoch: Instant::now(),
            registry,
            code: DashMap::new(),
            balancer: Mutex::new(balancer),
            members: DashMap::new(),
            metrics: Metrics::default(),
            shutting_down: AtomicBool::new(false),
            in_flight: InFlightTracker::new(),
        });
        tokio::spawn(sweep(Arc::downgrade(&c)));
        for url in c.config.workers.clone() {
            tokio::spawn(poll_static(Arc::downgrade(&c), url));
        }
        Ok(c)
    }

    pub fn config(&self) -> &ControllerConfig {
        &self.config
    }

    /// Microseconds since start: the balancer's clock.
    fn now(&self) -> Micros {
        self.epoch.elapsed().as_micros() as Micros
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    // ---- membership ----

    /// A status report (a push, or a poll of a static worker): joins or refreshes the worker.
    pub fn on_report(&self, report: StatusReport, is_static: bool) -> Result<(), ApiError> {
        if report.worker.is_empty() || !report.url.starts_with("http://") {
            return Err(ApiError::bad_request(
                "a status report needs a worker id and an http:// url",
            ));
        }
        if report.shutting_down {
            self.leave_named(&report.worker, "it is shutting down", "leave");
            return Ok(());
        }
        let now = self.now();
        // Under the balancer's lock, so that no decision sees the worker without its address.
        let (member, was_up) = {
            let mut b = self.balancer.lock();
            let was_up = b
                .workers()
                .id(&report.worker)
                .and_then(|id| b.workers().get(id))
                .is_some_and(|w| w.up);
            let id = b.join(now, &report.worker);
            b.report(now, id, report.load);
            let existing = self.members.get(&id.0).map(|m| Arc::clone(&m));
            let member = match existing {
                Some(m) if m.same_process(&report) && !m.is_gone() => m,
                Some(m) if m.same_process(&report) => {
                    let m = Arc::new(m.rejoined());
                    self.members.insert(id.0, Arc::clone(&m));
                    m
                }
                old => {
                    if let Some(old) = old {
                        old.mark_gone();
                    }
                    let m = Arc::new(Member::new(id, &report, is_static));
                    self.members.insert(id.0, Arc::clone(&m));
                    m
                }
            };
            (member, was_up)
        };
        if !was_up {
            tracing::info!(worker = %report.worker, url = %report.url, "worker joined");
            self.metrics.event("join");
        }
        member.set_report(report);
        Ok(())
    }

    /// A worker says goodbye.
    pub fn on_leave(&self, name: &str) -> bool {
        self.leave_named(name, "it left", "leave")
    }

    fn leave_named(&self, name: &str, why: &str, event: &'static str) -> bool {
        let id = self.balancer.lock().workers().id(name);
        id.is_some_and(|id| self.leave(id, why, event))
    }

    /// Takes a worker out of the ring and ends the invocations waiting on it.
    fn leave(&self, id: WorkerId, why: &str, event: &'static str) -> bool {
        let left = self.balancer.lock().leave(self.now(), id);
        if let Some(m) = self.members.get(&id.0) {
            m.mark_gone();
            if left && event == "leave" {
                tracing::info!(worker = %m.name, url = %m.url, "worker left the ring: {why}");
            } else if left {
                tracing::warn!(worker = %m.name, url = %m.url, "worker left the ring: {why}");
            }
        }
        if left {
            self.metrics.event(event);
        }
        left
    }

    fn member(&self, id: WorkerId) -> Option<Arc<Member>> {
        self.members.get(&id.0).map(|m| Arc::clone(&m))
    }

    // ---- functions ----

    /// Registers or updates a function; true when it is new.
    pub async fn register(
        &self,
        spec: FunctionSpec,
        code: Option<CodeSource>,
    ) -> Result<(Registered, bool), ApiError> {
        let (reg, previous) = self
            .registry
            .put(spec, code, false)
            .map_err(registry_error)?;
        if let Some(dir) = reg.code_dir.clone() {
            let code = pack_code(dir).await?;
            self.code
                .insert(reg.spec.name.clone(), (reg.spec.version, code));
        }
        if let Some(old) = previous.as_ref().and_then(|p| p.code_dir.as_deref()) {
            if reg.code_dir.as_deref() != Some(old) {
                self.registry.remove_code_dir(old);
            }
        }
        self.balancer.lock().register(
            self.now(),
            FunctionKey::of(&reg.spec.name),
            function_info(&reg.spec),
        );
        Ok((reg, previous.is_none()))
    }

    /// Deletes a function here and, in the background, on every worker that has it.
    pub fn unregister(self: &Arc<Self>, name: &str) -> Result<(), ApiError> {
        let removed = self
            .registry
            .remove(name)
            .map_err(registry_error)?
            .ok_or_else(|| ApiError::unknown_function(name))?;
        self.code.remove(name);
        if let Some(dir) = &removed.code_dir {
            self.registry.remove_code_dir(dir);
        }
        self.balancer
            .lock()
            .unregister(self.now(), FunctionKey::of(name));
        let holders: Vec<Arc<Member>> = self
            .members
            .iter()
            .filter(|m| m.forget(name))
            .map(|m| Arc::clone(&m))
            .collect();
        let me = Arc::clone(self);
        let path = format!("/v1/functions/{name}");
        tokio::spawn(async move {
            for m in holders {
                let res = me
                    .forwarder
                    .send(
                        Method::DELETE,
                        &m.url,
                        &path,
                        Bytes::new(),
                        Duration::from_secs(10),
                    )
                    .await;
                if let Err(e) = res {
                    tracing::warn!(worker = %m.name, error = %e, "could not delete the function on the worker");
                }
            }
        });
        Ok(())
    }

    /// The code to send along with a registration on a worker.
    async fn code_for(&self, reg: &Registered) -> Result<Option<Arc<Value>>, ApiError> {
        if let Some(c) = self.code.get(&reg.spec.name) {
            if c.0 == reg.spec.version {
                return Ok(Some(Arc::clone(&c.1)));
            }
        }
        let Some(dir) = reg.code_dir.clone() else {
            return Ok(None);
        };
        let code = pack_code(dir).await?;
        self.code
            .insert(reg.spec.name.clone(), (reg.spec.version, Arc::clone(&code)));
        Ok(Some(code))
    }

    /// Registers the function's current version on `m` unless it already has it.
    async fn ensure_registered(&self, m: &Member, reg: &Registered) -> Result<(), Attempt> {
        let (name, version) = (&reg.spec.name, reg.spec.version);
        if m.has(name, version) {
            return Ok(());
        }
        let _one_at_a_time = m.registering.lock().await;
        if m.has(name, version) {
            return Ok(());
        }
        let mut body = json!(*reg.spec);
        if let Some(obj) = body.as_object_mut() {
            obj.remove("version");
            if let Some(code) = self.code_for(reg).await.map_err(Attempt::Failed)? {
                obj.insert("code".into(), (*code).clone());
            }
        }
        let body = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
        let path = format!("/v1/functions/{name}");
        let sent = self
            .forwarder
            .send(Method::PUT, &m.url, &path, body, Duration::from_secs(60))
            .await;
        match sent {
            Ok(a) if a.status.is_success() => {
                m.registered_as(name, version);
                tracing::debug!(worker = %m.name, function = %name, version, "registered on worker");
                Ok(())
            }
            Ok(a) if a.status == StatusCode::SERVICE_UNAVAILABLE => Err(Attempt::NotStarted(
                format!("worker {} is shutting down", m.name),
            )),
            Ok(a) => {
                let msg = error_message(&a.body);
                Err(Attempt::Failed(ApiError::new(
                    a.status,
                    "worker_refused_function",
                    format!("worker {} refused to register {name}: {msg}", m.name),
                )))
            }
            // A failed registration never started the invocation.
            Err(e) => Err(Attempt::NotStarted(format!(
                "registering {name} on worker {}: {e}",
                m.name
            ))),
        }
    }

    // ---- invocations ----

    /// One invocation of `name` with JSON `args`; `t0` is when the request arrived. The answer
    /// is the worker's (success or error), or the controller's own error.
    pub async fn invoke(&self, name: &str, args: Bytes, t0: Instant) -> Result<Answer, ApiError> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(shutting_down());
        }
        let _guard = self.in_flight.enter();
        let reg = self
            .registry
            .get(name)
            .ok_or_else(|| ApiError::unknown_function(name))?;
        let key = FunctionKey::of(name);
        let timeout = Duration::from_millis(reg.spec.timeout_ms + self.config.forward_grace_ms);
        let mut not_started = Vec::new();
        for _attempt in 0..2 {
            let worker = self.route(key)?;
            let Some(m) = self.member(worker) else {
                self.finished(worker, key, Finished::Failed);
                self.leave(worker, "its address is unknown", "failed");
                continue;
            };
            match self.attempt(&m, &reg, args.clone(), timeout).await {
                Ok(answer) => return Ok(self.answered(worker, key, answer, t0)),
                Err(Attempt::NotStarted(why)) => {
                    self.finished(worker, key, Finished::Failed);
                    self.leave(worker, &why, "failed");
                    not_started.push(why);
                }
                Err(Attempt::Failed(e)) => {
                    self.finished(worker, key, Finished::Failed);
                    self.metrics.outcome(if e.code == "worker_timeout" {
                        "worker_timeout"
                    } else {
                        "worker_failed"
                    });
                    return Err(e);
                }
            }
        }
        self.metrics.outcome("worker_failed");
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "worker_unavailable",
            format!(
                "the invocation could not be delivered (it never started): {}",
                not_started.join("; then ")
            ),
        );
        e.retry_after_s = Some(1);
        Err(e)
    }

    /// The policy's decision, as a worker or the error to answer.
    fn route(&self, key: FunctionKey) -> Result<WorkerId, ApiError> {
        let t = Instant::now();
        let decision = self.balancer.lock().route(self.now(), key);
        self.metrics.route.observe(t.elapsed().as_secs_f64());
        match decision {
            Decision::Run { worker, how } => {
                self.metrics
                    .placements
                    .get_or_create(&PlacementLabel { how: how.as_str() })
                    .inc();
                Ok(worker)
            }
            Decision::Reject(Rejection::NoWorkers) => {
                self.metrics.outcome("no_workers");
                let mut e = ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "no_workers",
                    "no worker is available: none has joined, or all have left",
                );
                e.retry_after_s = Some(1);
                Err(e)
            }
            Decision::Reject(Rejection::Overloaded { load, b_max }) => {
                self.metrics.outcome("rejected");
                Err(ApiError::overloaded(format!(
                    "every worker is overloaded: the least-loaded reports a load of {load:.2}, above b_max = {b_max}"
                )))
            }
        }
    }

    /// One attempt on one worker: register if needed, forward, and tell apart what may have run.
    async fn attempt(
        &self,
        m: &Member,
        reg: &Registered,
        args: Bytes,
        timeout: Duration,
    ) -> Result<Answer, Attempt> {
        let name = &reg.spec.name;
        let path = format!("/v1/functions/{name}/invoke");
        for _ in 0..2 {
            self.ensure_registered(m, reg).await?;
            if m.is_gone() {
                return Err(Attempt::NotStarted(format!(
                    "worker {} left the cluster",
                    m.name
                )));
            }
            let sent = tokio::select! {
                biased;
                r = self.forwarder.send(Method::POST, &m.url, &path, args.clone(), timeout) => r,
                _ = m.gone() => {
                    return Err(Attempt::Failed(worker_failed(m, "it left the cluster (missed status deadlines or failed) while running the invocation")));
                }
            };
            let answer = match sent {
                Ok(a) => a,
                Err(ForwardError::NotStarted(e)) => return Err(Attempt::NotStarted(e)),
                Err(e @ ForwardError::MaybeStarted(_)) => {
                    self.leave(m.id, &e.to_string(), "failed");
                    return Err(Attempt::Failed(worker_failed(m, &e.to_string())));
                }
                // A slow answer is not a dead worker: one whose queue holds the invocation past
                // the deadline still pushes status, and ejecting it would fail everything else
                // running there. Liveness is the status deadline's job.
                Err(e @ ForwardError::TimedOut(_)) => {
                    return Err(Attempt::Failed(ApiError::new(
                        StatusCode::GATEWAY_TIMEOUT,
                        "worker_timeout",
                        format!(
                            "worker {}: {e}; the invocation may still be queued or running there \
                             (not retried)",
                            m.name
                        ),
                    )));
                }
            };
            if answer.status == StatusCode::NOT_FOUND
                && error_code(&answer.body) == "unknown_function"
            {
                // The worker lost the function (e.g. a fresh data directory): it did not run.
                m.forget(name);
                continue;
            }
            if answer.status == StatusCode::SERVICE_UNAVAILABLE
                && error_code(&answer.body) == "shutting_down"
            {
                return Err(Attempt::NotStarted(format!(
                    "worker {} is shutting down",
                    m.name
                )));
            }
            return Ok(answer);
        }
        Err(Attempt::Failed(ApiError::internal(format!(
            "worker {} keeps losing function {name}",
            m.name
        ))))
    }

    /// Books a worker's answer and adds the controller's time to a success.
    fn answered(&self, worker: WorkerId, key: FunctionKey, mut a: Answer, t0: Instant) -> Answer {
        if a.status != StatusCode::OK {
            self.finished(worker, key, Finished::Failed);
            self.metrics.outcome("error");
            return a;
        }
        let total = t0.elapsed().as_micros() as u64;
        let how = match timing::add_controller_time(&a.body, total) {
            Some((body, t)) => {
                self.metrics
                    .overhead
                    .observe(total.saturating_sub(t.e2e_us) as f64 / 1e6);
                a.body = Bytes::from(body);
                if t.cold {
                    Finished::Cold { e2e_us: t.e2e_us }
                } else {
                    Finished::Warm { e2e_us: t.e2e_us }
                }
            }
            None => Finished::Failed,
        };
        self.finished(worker, key, how);
        self.metrics.outcome("ok");
        if let Some(m) = self.members.get(&worker.0) {
            self.metrics
                .forwarded
                .get_or_create(&WorkerLabel {
                    worker: m.name.clone(),
                })
                .inc();
        }
        a
    }

    fn finished(&self, worker: WorkerId, key: FunctionKey, how: Finished) {
        self.balancer.lock().finished(self.now(), worker, key, how);
    }

    /// Accepts an async invocation: 202 with an id; the answer is kept here.
    pub fn invoke_async(self: &Arc<Self>, name: &str, args: Bytes) -> Result<String, ApiError> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(shutting_down());
        }
        if self.registry.get(name).is_none() {
            return Err(ApiError::unknown_function(name));
        }
        let id = self.invocations.start(name).ok_or_else(|| {
            ApiError::overloaded("too many async invocations are pending or kept; retry later")
        })?;
        let me = Arc::clone(self);
        let (name, task_id) = (name.to_string(), id.clone());
        tokio::spawn(async move {
            let record = Record {
                c: &me,
                id: &task_id,
                done: false,
            };
            let (status, body) = match me.invoke(&name, args, Instant::now()).await {
                Ok(a) => (a.status.as_u16(), a.body),
                Err(e) => (e.status.as_u16(), Bytes::from(e.body().to_string())),
            };
            record.finish(status, body);
        });
        Ok(id)
    }

    /// Starts `count` sandboxes of `name` on the worker its invocations would go to.
    pub async fn prewarm(&self, name: &str, count: u32) -> Result<Value, ApiError> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(shutting_down());
        }
        let reg = self
            .registry
            .get(name)
            .ok_or_else(|| ApiError::unknown_function(name))?;
        let key = FunctionKey::of(name);
        let home = {
            let b = self.balancer.lock();
            b.home(key)
                .filter(|w| b.workers().get(*w).is_some_and(|s| s.up))
        };
        let worker = match home {
            Some(w) => w,
            None => {
                let w = self.route(key)?;
                self.finished(w, key, Finished::Failed);
                w
            }
        };
        let m = self
            .member(worker)
            .ok_or_else(|| ApiError::internal("the chosen worker has no address"))?;
        self.ensure_registered(&m, &reg)
            .await
            .map_err(|e| match e {
                Attempt::Failed(e) => e,
                Attempt::NotStarted(why) => worker_failed(&m, &why),
            })?;
        let body = Bytes::from(json!({ "count": count }).to_string());
        let timeout = Duration::from_millis(reg.spec.timeout_ms.max(60_000));
        let path = format!("/v1/functions/{name}/prewarm");
        let a = self
            .forwarder
            .send(Method::POST, &m.url, &path, body, timeout)
            .await
            .map_err(|e| worker_failed(&m, &e.to_string()))?;
        let mut v: Value = serde_json::from_slice(&a.body).unwrap_or(Value::Null);
        if !a.status.is_success() {
            let msg = error_message(&a.body);
            let code = if a.status == StatusCode::TOO_MANY_REQUESTS {
                "overloaded"
            } else {
                "prewarm_failed"
            };
            return Err(ApiError::new(
                a.status,
                code,
                format!("worker {}: {msg}", m.name),
            ));
        }
        if let Some(obj) = v.as_object_mut() {
            obj.insert("worker".into(), json!(m.name));
        }
        Ok(v)
    }

    // ---- status ----

    /// Sandboxes of `name` per worker, from the last reports.
    pub fn sandboxes(&self, name: &str) -> Value {
        let mut total = (0u64, 0u64, 0u64);
        let mut per_worker = serde_json::Map::new();
        for m in self.members.iter() {
            if let Some((r, _)) = m.report() {
                if let Some(f) = r.functions.get(name) {
                    total.0 += u64::from(f.warm);
                    total.1 += u64::from(f.running);
                    total.2 += u64::from(f.starting);
                    per_worker.insert(m.name.clone(), json!(f));
                }
            }
        }
        json!({
            "pool": {"warm": total.0, "running": total.1, "starting": total.2},
            "workers": per_worker,
        })
    }

    /// What the policy knows about a function.
    pub fn balancing(&self, name: &str) -> Value {
        let key = FunctionKey::of(name);
        let now = self.now();
        let b = self.balancer.lock();
        let p = b.params();
        let home = b.home(key).map(|w| b.workers().name(w).to_string());
        let Some(f) = b.function(key) else {
            return json!({ "home": home });
        };
        json!({
            "home": home,
            "popular": b.is_popular(now, key),
            "priority": f.priority,
            "warm_us": f.warm_us.get().map(|v| v.round()),
            "cold_us": f.cold_us.get().map(|v| v.round()),
            "load_bound": f.bound(p.b, p.b_max),
        })
    }

    /// `GET /v1/status`.
    pub fn status(&self) -> Value {
        let b = self.balancer.lock();
        let workers: Vec<Value> = self
            .members
            .iter()
            .map(|m| {
                let state = b.workers().get(m.id);
                let report = m.report();
                json!({
                    "worker": m.name,
                    "url": m.url,
                    "up": state.is_some_and(|s| s.up),
                    "static": m.is_static,
                    "load": state.map(|s| s.report.load),
                    "queue_len": state.map(|s| s.report.queue_len),
                    "running": state.map(|s| s.report.running),
                    "free_mb": state.map(|s| s.report.free_mb),
                    "in_flight": state.map(|s| s.in_flight),
                    "backend": report.as_ref().map(|r| r.0.backend.clone()),
                    "cpus": report.as_ref().map(|r| r.0.cpus),
                    "last_report_ms_ago": report.as_ref().map(|r| r.1.elapsed().as_millis() as u64),
                })
            })
            .collect();
        let mut backends: Vec<String> = workers
            .iter()
            .filter(|w| w["up"] == true)
            .filter_map(|w| w["backend"].as_str().map(str::to_string))
            .collect();
        backends.sort();
        backends.dedup();
        let backend = match backends.len() {
            0 => "none".to_string(),
            1 => backends.remove(0),
            _ => "mixed".to_string(),
        };
        let pools: Vec<Value> = b
            .pools()
            .iter()
            .map(|p| {
                let names: Vec<&str> = p.members.iter().map(|w| b.workers().name(*w)).collect();
                json!({"level": p.level, "b_max": p.b_max, "workers": names})
            })
            .collect();
        let mut functions = serde_json::Map::new();
        let mut free_mb = 0u64;
        for m in self.members.iter() {
            if !b.workers().get(m.id).is_some_and(|s| s.up) {
                continue;
            }
            if let Some((r, _)) = m.report() {
                free_mb += r.load.free_mb;
                for (name, f) in &r.functions {
                    let e = functions
                        .entry(name.clone())
                        .or_insert_with(|| json!({"warm": 0, "running": 0, "starting": 0}));
                    for (k, v) in [
                        ("warm", f.warm),
                        ("running", f.running),
                        ("starting", f.starting),
                    ] {
                        e[k] = json!(e[k].as_u64().unwrap_or(0) + u64::from(v));
                    }
                }
            }
        }
        json!({
            "role": "controller",
            "backend": backend,
            "uptime_s": self.epoch.elapsed().as_secs(),
            "shutting_down": self.shutting_down.load(Ordering::Acquire),
            "in_flight": self.in_flight.count(),
            "async_running": self.invocations.running(),
            "balance": b.kind().as_str(),
            "balance_params": b.params(),
            "popularity_threshold": finite_or_null(b.popularity_threshold()),
            "workers_up": b.workers().live().len(),
            "workers": workers,
            "pools": pools,
            "memory": {"free_mb": free_mb},
            "functions": functions,
        })
    }

    /// Live workers' reported loads, for metrics.
    pub fn loads(&self) -> Vec<(String, f64)> {
        let b = self.balancer.lock();
        b.workers()
            .live()
            .iter()
            .map(|w| (b.workers().name(*w).to_string(), b.workers().load(*w)))
            .collect()
    }

    // ---- shutdown ----

    /// New invocations are refused with 503 from now on.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
    }

    /// Waits up to `grace` for in-flight invocations (sync and async) to finish.
    pub async fn drain(&self, grace: Duration) {
        self.begin_shutdown();
        let deadline = tokio::time::Instant::now() + grace;
        if !self.in_flight.wait_idle(deadline).await {
            tracing::warn!(
                in_flight = self.in_flight.count(),
                "grace period over with invocations still running"
            );
        }
    }
}

/// What the policy is told about a function at registration: its priority and, for `sim`
/// functions, the cold and warm times the spec declares.
fn function_info(spec: &FunctionSpec) -> FunctionInfo {
    let us = |v: f64| (v > 0.0).then_some((v * 1000.0) as u64);
    FunctionInfo {
        priority: spec.priority,
        warm_us: us(spec.sim_warm_ms),
        cold_us: us(spec.sim_cold_ms).map(|c| c + us(spec.sim_warm_ms).unwrap_or(0)),
    }
}

/// A function's code directory packed as the `code` of a registration on a worker (off the
/// async threads: it reads and compresses files).
async fn pack_code(dir: PathBuf) -> Result<Arc<Value>, ApiError> {
    let packed =
        tokio::task::spawn_blocking(move || hearth_service::archive::pack_dir_base64(&dir))
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
            .map_err(|e| ApiError::internal(format!("packing the code: {e}")))?;
    Ok(Arc::new(json!({ "archive": packed })))
}

fn finite_or_null(v: f64) -> Value {
    if v.is_finite() {
        json!(v)
    } else {
        Value::Null
    }
}

fn registry_error(e: RegistryError) -> ApiError {
    match e {
        RegistryError::BadCode(m) => ApiError::bad_request(m),
        RegistryError::Storage(m) => ApiError::internal(m),
    }
}

fn shutting_down() -> ApiError {
    let mut e = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "shutting_down",
        "the controller is shutting down",
    );
    e.retry_after_s = Some(1);
    e
}

fn worker_failed(m: &Member, why: &str) -> ApiError {
    let mut e = ApiError::new(
        StatusCode::BAD_GATEWAY,
        "worker_failed",
        format!(
            "worker {} failed during the invocation; it may or may not have run, so it is not retried: {why}",
            m.name
        ),
    )
    .with("worker", json!(m.name));
    e.retry_after_s = Some(1);
    e
}

fn error_code(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(str::to_string))
        .unwrap_or_default()
}

fn error_message(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(body).chars().take(300).collect())
}

/// An accepted async invocation's record: always finished, with an error if its task ends
/// without an answer (so no accepted invocation is ever lost without a record).
struct Record<'a> {
    c: &'a Controller,
    id: &'a str,
    done: bool,
}

impl Record<'_> {
    fn finish(mut self, status: u16, body: Bytes) {
        self.c.invocations.finish_answer(self.id, status, &body);
        self.done = true;
    }
}

impl Drop for Record<'_> {
    fn drop(&mut self) {
        if !self.done {
            let e = ApiError::internal("the invocation ended without an answer");
            self.c
                .invocations
                .finish_answer(self.id, 500, &e.error_body().to_vec());
        }
    }
}

/// Workers that miss their status deadline leave the ring.
async fn sweep(c: std::sync::Weak<Controller>) {
    loop {
        let period = {
            let Some(c) = c.upgrade() else { return };
            let timeout = c.config.status_timeout_ms * 1000;
            let expired = c.balancer.lock().expire(c.now(), timeout);
            for id in expired {
                if let Some(m) = c.member(id) {
                    m.mark_gone();
                    tracing::warn!(worker = %m.name, url = %m.url, "worker missed its status deadline ({} ms); it left the ring", c.config.status_timeout_ms);
                }
                c.metrics.event("expired");
            }
            c.invocations.expire(Instant::now());
            Duration::from_millis((c.config.status_timeout_ms / 4).clamp(10, 1000))
        };
        tokio::time::sleep(period).await;
    }
}

/// Polls a worker from the config's static list.
/// CPUs of this host: the fallback for a status that does not say.
fn host_cpus() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}

async fn poll_static(c: std::sync::Weak<Controller>, url: String) {
    let url = url.trim_end_matches('/').to_string();
    let mut incarnation = 0u64;
    let mut last_uptime = 0u64;
    loop {
        let Some(ctl) = c.upgrade() else { return };
        let interval = Duration::from_millis(ctl.config.status_interval_ms);
        let sent = ctl
            .forwarder
            .send(
                Method::GET,
                &url,
                "/v1/status",
                Bytes::new(),
                interval.max(Duration::from_secs(1)),
            )
            .await;
        match sent {
            Ok(a) if a.status.is_success() => {
                let status: WorkerStatus = match serde_json::from_slice(&a.body) {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(%url, error = %e, "unreadable status from a static worker");
                        drop(ctl);
                        tokio::time::sleep(interval).await;
                        continue;
                    }
                };
                let uptime = status.uptime_s;
                if uptime < last_uptime {
                    incarnation += 1; // it restarted
                }
                last_uptime = uptime;
                let report = StatusReport::from_status(
                    &status,
                    &url,
                    &format!("static-{incarnation}"),
                    host_cpus(),
                );
                if let Err(e) = ctl.on_report(report, true) {
                    tracing::warn!(%url, error = %e, "unusable status from a static worker");
                }
            }
            Ok(a) => tracing::debug!(%url, status = %a.status, "static worker answered an error"),
            Err(e) => tracing::debug!(%url, error = %e, "static worker unreachable"),
        }
        drop(ctl);
        tokio::time::sleep(interval).await;
    }
}
