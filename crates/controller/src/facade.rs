//! The controller's domain operations: register, delete, invoke (sync and async), prewarm, and
//! what it tells about itself. Each returns a domain result or a domain error
//! ([`crate::errors`]); none knows about HTTP status codes. Routing is the [`Driver`]'s.
//!
//! Hot path of an invocation: registry lookup → one short lock for the routing decision → (once
//! per worker and function version) a registration on the worker → one request over a pooled
//! persistent connection → the worker's answer, with the controller's time added to `timing`.
//!
//! Failure semantics (docs/cluster.md): an invocation is sent at most once per attempt. It is
//! retried once, on the worker the policy picks next, only when it provably never started: the
//! worker could not be reached (connect failed), refused it while shutting down, or failed while
//! the function was being registered there. A failure after the request went out is answered
//! as a failure and never retried, because the function may have run.

/// How long a worker may take to register a function: its build sandbox installs the
/// function's requirements first (`build.timeout_s`, 300 s by default).
const REGISTER_ON_WORKER_TIMEOUT: Duration = Duration::from_secs(600);

use crate::config::ControllerConfig;
use crate::driver::{Driver, RouteError, RoutingPolicy};
use crate::errors::{
    InvokeError, PrewarmError, RegisterError, ReportError, StartError, UnregisterError,
};
use crate::forward::{Answer, ForwardError, Forwarder};
use crate::membership::{self, Member};
use crate::metrics::{Metrics, WorkerLabel};
use crate::status::{
    AtollView, Balancing, ControllerStatus, FunctionAtoll, FunctionBalancing, MemoryView, PoolView,
    SandboxCounts, Sandboxes, WorkerView,
};
use bytes::Bytes;
use dashmap::DashMap;
use hearth_api::{FunctionSpec, InvokeAnswer, PrewarmAnswer, StatusReport};
use hearth_core::balance::{Finished, FunctionKey, Rejection, WorkerId};
use hearth_core::proactive::{Atoll, Outcome};
use hearth_service::auth::{Auth, AuthSettings, ClusterKey};
use hearth_service::delivery::{Accepted, Attempted, Delivery, DeliverySettings, Runner};
use hearth_service::in_flight::InFlightTracker;
use hearth_service::quota::{QuotaError, QuotaGuard, Quotas};
use hearth_service::registry::{CodeSource, Registered, Registry};
use hearth_service::serving::open_data_dir;
use hearth_service::store::sqlite::SqliteAsyncStore;
use hearth_service::store::{
    AsyncStore, ClusterState, CodeRef, MemberKind, MemberRecord, Membership, StoreError, StoreUrl,
    StoredInvocation,
};
use hyper::header::HeaderValue;
use hyper::Method;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How one attempt on one worker ended, when it did not produce an answer.
enum Attempt {
    /// The invocation provably never started there: try the next worker.
    NotStarted(String),
    /// Final: answer this error.
    Failed(InvokeError),
}

/// The controller.
pub struct Controller {
    config: ControllerConfig,
    registry: Arc<Registry>,
    /// Code of each function version, packed once for registering it on workers.
    code: DashMap<String, (u64, Arc<Value>)>,
    driver: Driver,
    forwarder: Forwarder,
    /// Async invocations, durable before their 202.
    delivery: Arc<Delivery>,
    /// The cluster shared with other controllers (etcd); None: this controller alone.
    cluster: Option<Arc<dyn ClusterState>>,
    /// The code each function's local copy was unpacked from (cluster mode).
    code_refs: DashMap<String, CodeRef>,
    /// This controller's membership in the cluster, given up when it stops.
    membership: parking_lot::Mutex<Option<Box<dyn Membership>>>,
    pub metrics: Arc<Metrics>,
    shutting_down: AtomicBool,
    in_flight: InFlightTracker,
    auth: Arc<Auth>,
    quotas: Quotas,
}

impl Controller {
    /// Opens the registry, announces its functions to the policy and starts the membership
    /// tasks (deadline sweep, polling of static workers).
    pub async fn start(config: ControllerConfig) -> Result<Arc<Self>, StartError> {
        let data_dir = open_data_dir(&config.data_dir)
            .map_err(|e| StartError::DataDir(config.data_dir.clone(), e))?;
        let registry = Arc::new(Registry::open_with(&data_dir, config.code_intake())?);
        // In a cluster, the store comes first: the balancing settings are the first
        // controller's, adopted by every later one, and the cluster key (every controller's
        // own file) must match the fingerprint the first one stored.
        let mut config = config;
        let store_url = StoreUrl::parse(&config.store)?;
        let etcd = match &store_url {
            StoreUrl::Sqlite => None,
            StoreUrl::Etcd(endpoints) => {
                let access = config.store_access();
                access.check(&store_url)?;
                access.warn_at_start(&store_url);
                let credentials = access.load().await?;
                Some(
                    hearth_service::store::etcd::EtcdStore::connect_with(
                        endpoints,
                        STORE_PREFIX,
                        config.lease_ttl_ms,
                        &credentials,
                    )
                    .await?
                    .with_retention(Duration::from_secs(config.async_retention_s))
                    .with_async_limits(config.async_limits()),
                )
            }
        };
        let cluster_key = match &etcd {
            Some(etcd) => {
                // In a cluster the key also seals what etcd holds, so there is always one;
                // every controller is given the same file (only its fingerprint is in etcd).
                let key = match &config.cluster_key_file {
                    Some(path) => ClusterKey::read(path)?,
                    None => ClusterKey::read_or_create(&config.cluster_key_path())?,
                };
                etcd.seal_with(hearth_service::store::seal::Sealer::from_cluster_key(
                    key.token(),
                ))?;
                crate::cluster_sync::settle_cluster_key(etcd.as_ref(), &key).await?;
                // An upgraded cluster's records, written in clear before sealing existed.
                let sealed = etcd.seal_clear_records().await?;
                if sealed > 0 {
                    tracing::warn!(
                        records = sealed,
                        "sealed records an older version wrote in clear"
                    );
                }
                (config.auth || config.cluster_key_file.is_some()).then_some(key)
            }
            None if config.auth => Some(ClusterKey::read_or_create(&config.cluster_key_path())?),
            None => match &config.cluster_key_file {
                Some(path) => Some(ClusterKey::read(path)?),
                None => None,
            },
        };
        if let Some(etcd) = &etcd {
            crate::cluster_sync::settle_balance(etcd.as_ref(), &mut config).await?;
        }
        let auth = Auth::open(AuthSettings {
            enabled: config.auth,
            data_dir: &data_dir,
            cluster_key,
            worker_secret: None,
        })?;
        if let Some(k) = auth.keys() {
            k.set_max_per_namespace(config.max_keys_per_namespace);
        }
        let quotas = Quotas::new(config.quota, config.quotas.clone());
        let policy = RoutingPolicy::new(config.balance, config.balance_params.clone())?;
        let atoll = match &config.atoll {
            Some(a) => Some(Atoll::new(a.clone())?),
            None => None,
        };
        let metrics = Arc::new(Metrics::default());
        let tls =
            hearth_service::serving::load_client_tls("tls_ca", config.tls_ca.as_deref()).await?;
        let (store, cluster): (Arc<dyn AsyncStore>, Option<Arc<dyn ClusterState>>) = match etcd {
            None => (
                Arc::new(SqliteAsyncStore::open_with(
                    &data_dir,
                    config.async_limits(),
                )?),
                None,
            ),
            Some(etcd) => (etcd.clone(), Some(etcd)),
        };
        let orphan_scan = cluster.as_ref().map(|_| ORPHAN_SCAN);
        let runner = Arc::new(ControllerRunner(std::sync::OnceLock::new()));
        let delivery = Delivery::new(
            store,
            Arc::clone(&runner) as Arc<dyn Runner>,
            DeliverySettings {
                retry_backoff: Duration::from_millis(config.async_retry_backoff_ms),
                orphan_scan,
                // Workers that push status have all reported by then.
                first_scan_after: Duration::from_millis(2 * config.status_interval_ms),
                retention: Duration::from_secs(config.async_retention_s),
                // An answer larger than a namespace's share would only evict itself.
                max_answer_bytes: config
                    .async_max_bytes
                    .min(config.async_limits().max_bytes_per_namespace),
            },
        );
        // The autoscaler's webhook client: the same trust, never the cluster credential.
        let hook = Forwarder::new(
            Duration::from_millis(config.connect_timeout_ms),
            None,
            Arc::clone(&tls),
        )
        .with_max_answer_bytes(0);
        let c = Arc::new(Controller {
            // No credential here: each member's own forwarder carries its own token.
            forwarder: Forwarder::new(Duration::from_millis(config.connect_timeout_ms), None, tls)
                .with_max_answer_bytes(config.max_result_bytes),
            delivery,
            cluster,
            code_refs: DashMap::new(),
            membership: parking_lot::Mutex::new(None),
            config,
            registry,
            code: DashMap::new(),
            driver: Driver::new(policy, atoll, Arc::clone(&metrics)),
            metrics,
            shutting_down: AtomicBool::new(false),
            in_flight: InFlightTracker::new(),
            auth,
            quotas,
        });
        let _ = runner.0.set(Arc::downgrade(&c));
        for r in c.registry.list() {
            c.driver.register(&r.spec);
        }
        if let Some(cluster) = c.cluster.clone() {
            c.join_cluster(cluster).await?;
        }
        c.delivery.start_background();
        tokio::spawn(membership::sweep(Arc::downgrade(&c)));
        tokio::spawn(membership::probe(Arc::downgrade(&c)));
        if let Some(a) = &c.config.atoll {
            tokio::spawn(crate::proactive::run(Arc::downgrade(&c), a.interval_us));
        }
        for url in c.config.workers.clone() {
            tokio::spawn(membership::poll_worker(Arc::downgrade(&c), url, None));
        }
        if let Some(a) = c.config.autoscale.clone() {
            tokio::spawn(crate::autoscale::run(Arc::downgrade(&c), a, hook));
        }
        Ok(c)
    }

    pub fn config(&self) -> &ControllerConfig {
        &self.config
    }

    /// The controller's authentication (keys, the cluster credential).
    pub fn auth(&self) -> &Arc<Auth> {
        &self.auth
    }

    /// Admits one invocation of namespace `ns` against its quota; the slot is held until the
    /// guard drops.
    pub fn admit_namespace(&self, ns: &str) -> Result<QuotaGuard, QuotaError> {
        self.quotas.admit(ns, None, Instant::now())
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub(crate) fn driver(&self) -> &Driver {
        &self.driver
    }

    pub(crate) fn forwarder(&self) -> &Forwarder {
        &self.forwarder
    }

    // ---- membership ----

    /// A worker's status push, made with worker credential `credential` (None: authentication
    /// is off): joins or refreshes it. The worker is then called with its own controller token.
    pub fn on_report(
        self: &Arc<Self>,
        report: StatusReport,
        credential: Option<&str>,
    ) -> Result<(), ReportError> {
        let header = self.worker_header(credential);
        self.on_report_from(report, false, header)
    }

    /// `Bearer <the controller token of credential>`, if authentication is on.
    pub(crate) fn worker_header(&self, credential: Option<&str>) -> Option<HeaderValue> {
        let key = self.auth.cluster_key()?;
        key.header_for(credential?)
    }

    /// A status report, pushed or (`is_static`) polled; a new incarnation of a worker (or one
    /// back after it was taken out) is reconciled with the registry in the background.
    pub(crate) fn on_report_from(
        self: &Arc<Self>,
        report: StatusReport,
        is_static: bool,
        credential: Option<HeaderValue>,
    ) -> Result<(), ReportError> {
        if let Some(m) = self.driver.on_report(report, is_static, credential)? {
            let me = Arc::clone(self);
            tokio::spawn(async move { me.reconcile(&m).await });
        }
        Ok(())
    }

    /// Deletes from a worker that (re)joined the functions the cluster no longer has: deleted
    /// while it was away, they must not keep their code, secrets and endpoint there. A worker in
    /// a cluster holds only the cluster's functions.
    async fn reconcile(&self, m: &Member) {
        let timeout = Duration::from_secs(10);
        let listed = m
            .forwarder(&self.forwarder)
            .send(Method::GET, &m.url, "/v1/functions", Bytes::new(), timeout)
            .await;
        let answer = match listed {
            Ok(a) if a.is_success() => a,
            Ok(a) => {
                tracing::warn!(worker = %m.name, status = %a.status, "cannot list the functions of a worker that joined");
                return;
            }
            Err(e) => {
                tracing::warn!(worker = %m.name, error = %e, "cannot list the functions of a worker that joined");
                return;
            }
        };
        let Ok(listed) = serde_json::from_slice::<Value>(&answer.body) else {
            tracing::warn!(worker = %m.name, "unreadable function list from a worker that joined");
            return;
        };
        let keys = listed["functions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| {
                let name = f["name"].as_str()?;
                let ns = f["namespace"]
                    .as_str()
                    .unwrap_or(hearth_api::namespace::DEFAULT_NAMESPACE);
                Some(hearth_api::namespace::function_key(ns, name))
            });
        for key in keys.filter(|k| self.registry.get(k).is_none()) {
            let path = format!("/v1/functions/{key}");
            match m
                .forwarder(&self.forwarder)
                .send(Method::DELETE, &m.url, &path, Bytes::new(), timeout)
                .await
            {
                Ok(a) if a.is_success() => {
                    m.forget(&key);
                    tracing::info!(worker = %m.name, function = %key, "deleted a function the cluster no longer has");
                }
                Ok(a) => {
                    tracing::warn!(worker = %m.name, function = %key, status = %a.status, "could not delete a stale function")
                }
                Err(e) => {
                    tracing::warn!(worker = %m.name, function = %key, error = %e, "could not delete a stale function")
                }
            }
        }
    }

    /// A worker says goodbye; false when no live worker has that name.
    pub fn on_leave(&self, name: &str) -> bool {
        self.driver.on_leave(name)
    }

    /// Takes a worker out of the ring at once (its credential was revoked); true if it was in.
    pub fn evict(&self, name: &str, why: &str) -> bool {
        self.driver.evict(name, why)
    }

    // ---- functions ----

    /// Registers or updates a function; true when it is new. A spec no live worker could ever
    /// run is refused here, rather than by every worker at its first invocation. The code is
    /// copied or unpacked on a blocking thread.
    pub async fn register(
        &self,
        spec: FunctionSpec,
        code: Option<CodeSource>,
    ) -> Result<(Registered, bool), RegisterError> {
        if let Some(largest_mb) = self.largest_worker_memory_mb() {
            if spec.memory_mb > largest_mb {
                return Err(RegisterError::TooMuchMemory {
                    memory_mb: spec.memory_mb,
                    largest_mb,
                });
            }
        }
        // A GPU function larger than every live worker's GPUs is a mistake; with no GPU worker
        // up at all it waits for one to join (its invocations answer `no_gpu` until then).
        if let (Some(needed_mb), Some(largest_mb)) =
            (spec.required_gpu_mb(), self.driver.largest_live_gpu_mb())
        {
            if needed_mb > largest_mb {
                return Err(RegisterError::TooMuchGpuMemory {
                    gpu_memory_mb: needed_mb,
                    largest_mb,
                });
            }
        }
        // Code is needed unless some live worker runs functions without it (the sim backend).
        let backends = self.live_backends();
        let require_code = !backends.is_empty() && backends.iter().all(|b| b != "sim");
        let Some(cluster) = self.cluster.clone() else {
            let (reg, previous) = self.registry.put_blocking(spec, code, require_code).await?;
            if let Some(dir) = reg.code_dir.clone() {
                let code = pack_code(dir).await?;
                self.code
                    .insert(reg.spec.name.clone(), (reg.spec.version, code));
            }
            let created = previous.is_none();
            self.registered_here(&reg, previous);
            return Ok((reg, created));
        };
        // In a cluster: the code is checked here, stored in the cluster (which decides the
        // version), then registered here under that version.
        let name = spec.name.clone();
        let staged = match code {
            Some(src) => {
                let (registry, spec) = (Arc::clone(&self.registry), spec.clone());
                let staged = blocking(move || registry.stage_code(&spec, &src)).await??;
                let archive = {
                    let dir = staged.path().to_path_buf();
                    blocking(move || hearth_service::archive::pack_dir(&dir))
                        .await?
                        .map_err(|e| RegisterError::Packing(format!("packing the code: {e}")))?
                };
                Some((staged, archive))
            }
            None => None,
        };
        let before = self.registry.get(&name);
        let had_code = before.as_ref().is_some_and(|r| r.code_dir.is_some());
        if require_code && staged.is_none() && !had_code {
            return Err(RegisterError::Registry(
                hearth_service::registry::RegistryError::BadCode(
                    "`code` is required (an archive or files): every worker of this cluster runs real sandboxes"
                        .into(),
                ),
            ));
        }
        // The namespace's limits are checked before the cluster stores it: every controller
        // then applies it as stored.
        self.registry
            .check_namespace(&name, staged.as_ref().map(|(s, _)| s.bytes()))?;
        let mut stored_spec =
            serde_json::to_value(&spec).map_err(|e| RegisterError::Packing(e.to_string()))?;
        if let Some(obj) = stored_spec.as_object_mut() {
            obj.remove("version");
        }
        let record = cluster
            .put_function(
                &name,
                &stored_spec,
                staged.as_ref().map(|(_, a)| a.as_slice()),
            )
            .await?;
        let (staged, archive) = match staged {
            Some((s, a)) => (Some(s), Some(a)),
            None => (None, None),
        };
        let registry = Arc::clone(&self.registry);
        let version = record.version;
        let (reg, previous) =
            blocking(move || registry.put_staged(spec, staged, false, Some(version))).await??;
        if let Some(code_ref) = record.code {
            self.code_refs.insert(name.clone(), code_ref);
        }
        if let Some(archive) = archive {
            use base64::Engine;
            let b64 = base64::engine::general_purpose::STANDARD.encode(archive);
            self.code.insert(
                name.clone(),
                (reg.spec.version, Arc::new(json!({ "archive": b64 }))),
            );
        }
        // The store's watch may have applied it here already: new is new to the cluster.
        let created = before.is_none() && record.version > 0;
        self.registered_here(&reg, previous);
        Ok((reg, created))
    }

    /// After a function was registered in the local registry: the old version's code goes
    /// (unless kept), and the policy learns the function.
    fn registered_here(&self, reg: &Registered, previous: Option<Registered>) {
        if let Some(old) = previous.as_ref().and_then(|p| p.code_dir.as_deref()) {
            if reg.code_dir.as_deref() != Some(old) {
                self.registry.remove_code_dir(old);
            }
        }
        self.driver.register(&reg.spec);
    }

    /// The backends of live workers.
    fn live_backends(&self) -> Vec<String> {
        let members = self.driver.members();
        members
            .iter()
            .filter(|m| self.driver.is_up(m.id))
            .filter_map(|m| m.report().map(|(r, _)| r.backend))
            .collect()
    }

    /// The largest memory budget among live workers that report theirs; None when none does.
    fn largest_worker_memory_mb(&self) -> Option<u64> {
        let members = self.driver.members();
        self.driver.read(|b| {
            members
                .iter()
                .filter(|m| b.workers().get(m.id).is_some_and(|s| s.up))
                .filter_map(|m| m.report().and_then(|(r, _)| r.memory_budget_mb))
                .max()
        })
    }

    /// Deletes a function (in the cluster first, when there is one), here and, in the
    /// background, on every worker that has it.
    pub async fn unregister(self: &Arc<Self>, name: &str) -> Result<(), UnregisterError> {
        if let Some(cluster) = &self.cluster {
            let existed = cluster.delete_function(name).await?;
            if !existed && self.registry.get(name).is_none() {
                return Err(UnregisterError::UnknownFunction(name.to_string()));
            }
            self.forget_function(name);
            return Ok(());
        }
        if self.registry.get(name).is_none() {
            return Err(UnregisterError::UnknownFunction(name.to_string()));
        }
        self.forget_function(name);
        Ok(())
    }

    /// Removes a function here and, in the background, from every worker this controller
    /// registered it on.
    pub(crate) fn forget_function(self: &Arc<Self>, name: &str) {
        let removed = match self.registry.remove(name) {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(function = %name, error = %e, "cannot remove a function from the local registry");
                return;
            }
        };
        self.code.remove(name);
        self.code_refs.remove(name);
        if let Some(dir) = &removed.code_dir {
            self.registry.remove_code_dir(dir);
        }
        let holders = self.driver.unregister(name);
        let me = Arc::clone(self);
        let path = format!("/v1/functions/{name}");
        tokio::spawn(async move {
            for m in holders {
                let res = m
                    .forwarder(&me.forwarder)
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
    }

    /// A function from the cluster's store, registered here at its cluster version; `code` is
    /// its archive when the local copy's code differs.
    pub(crate) async fn apply_function(
        &self,
        spec: FunctionSpec,
        code: Option<(CodeRef, CodeSource)>,
        version: u64,
    ) -> Result<(), RegisterError> {
        let registry = Arc::clone(&self.registry);
        let name = spec.name.clone();
        let (code_ref, src) = match code {
            Some((r, src)) => (Some(r), Some(src)),
            None => (None, None),
        };
        let (reg, previous) = blocking(move || {
            let staged = match &src {
                Some(src) => Some(registry.stage_code(&spec, src)?),
                None => None,
            };
            registry.apply_staged(spec, staged, version)
        })
        .await??;
        if let Some(r) = code_ref {
            self.code_refs.insert(name.clone(), r);
        }
        self.code.remove(&name);
        tracing::info!(function = %name, version, "function updated from the cluster");
        self.registered_here(&reg, previous);
        Ok(())
    }

    /// The code reference the local copy of `name` was unpacked from.
    pub(crate) fn local_code_ref(&self, name: &str) -> Option<CodeRef> {
        self.code_refs.get(name).map(|r| r.clone())
    }

    /// A code archive from the cluster's store, as base64 (what a registration carries).
    pub(crate) async fn cluster_code(&self, code: &CodeRef) -> Result<String, StoreError> {
        use base64::Engine;
        let cluster = self
            .cluster
            .as_ref()
            .ok_or_else(|| StoreError::Config("no cluster store".into()))?;
        let bytes = cluster.code(code).await?;
        Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    /// A worker's membership lease ended (it died, froze past its lease, or left): it leaves
    /// the ring, and its waiting invocations end.
    pub(crate) fn worker_lease_ended(&self, name: &str) {
        self.driver.lease_ended(name);
    }

    /// Joins the cluster: the functions as the store has them now (before serving), then
    /// their changes, the workers of its membership, and this controller's own membership.
    async fn join_cluster(
        self: &Arc<Self>,
        cluster: Arc<dyn ClusterState>,
    ) -> Result<(), StartError> {
        let mut functions = cluster.watch_functions();
        match tokio::time::timeout(Duration::from_secs(15), functions.recv()).await {
            Ok(Some(hearth_service::store::Change::Snapshot(all))) => {
                crate::cluster_sync::apply_snapshot(self, all).await;
            }
            _ => {
                return Err(StartError::Store(StoreError::Unavailable(
                    "the cluster's functions could not be read within 15 s".into(),
                )))
            }
        }
        tokio::spawn(crate::cluster_sync::follow_functions(
            Arc::downgrade(self),
            functions,
        ));
        if self.auth.enabled() {
            self.auth.replicate_to(Arc::clone(&cluster));
            tokio::spawn(crate::cluster_sync::follow_keys(
                Arc::clone(&self.auth),
                Arc::clone(&cluster),
                cluster.watch_docs(hearth_service::keys_api::KEYS_KIND),
            ));
        }
        // The workers the cluster has now: serving starts once they have reported here (or
        // after a bound), so that a restarted controller does not answer `no_workers` to a
        // cluster full of workers.
        let mut members = cluster.watch_members(MemberKind::Worker);
        let known = match tokio::time::timeout(Duration::from_secs(5), members.recv()).await {
            Ok(Some(hearth_service::store::Change::Snapshot(all))) => all.len(),
            _ => 0,
        };
        drop(members);
        tokio::spawn(crate::cluster_sync::follow_workers(
            Arc::downgrade(self),
            cluster.watch_members(MemberKind::Worker),
        ));
        let deadline = tokio::time::Instant::now()
            + Duration::from_millis(self.config.status_timeout_ms.min(5_000));
        while self.driver.read(|b| b.workers().live().len()) < known
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let me = MemberRecord {
            name: self.config.controller_name(),
            url: self.config.public_url(),
            incarnation: crate::membership::new_incarnation(),
        };
        let m = cluster
            .join(MemberKind::Controller, &me, self.config.lease_ttl_ms)
            .await?;
        *self.membership.lock() = Some(m);
        Ok(())
    }

    /// The code to send along with a registration on a worker.
    async fn code_for(&self, reg: &Registered) -> Result<Option<Arc<Value>>, RegisterError> {
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

    /// Whether the controller is stopping (background tasks end).
    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    /// Registers function `name` on `m` unless it has it; false when it is not registered
    /// here (any more) or the worker refused it.
    pub(crate) async fn register_on(&self, m: &Member, name: &str) -> bool {
        match self.registry.get(name) {
            Some(reg) => self.ensure_registered(m, &reg).await.is_ok(),
            None => false,
        }
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
        // The registration request: the spec without the controller's version, plus the code.
        let mut body = json!(*reg.spec);
        if let Some(obj) = body.as_object_mut() {
            obj.remove("version");
            let code = self
                .code_for(reg)
                .await
                .map_err(|e| Attempt::Failed(InvokeError::Internal(e.to_string())))?;
            if let Some(code) = code {
                obj.insert("code".into(), (*code).clone());
            }
        }
        let body = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
        // `wait`: the worker answers once the function's dependencies are built (or failed),
        // so the invocation that brought it there runs on a ready function, or gets the
        // worker's clear `function_build_failed`.
        let path = format!("/v1/functions/{name}?wait=true");
        // In a cluster, the version is the cluster's: other controllers registering the same
        // one on this worker change nothing there.
        let version_header = self
            .cluster
            .as_ref()
            .and_then(|_| hyper::header::HeaderValue::from_str(&version.to_string()).ok())
            .map(|v| (hearth_service::async_api::FUNCTION_VERSION, v));
        let sent = m
            .forwarder(&self.forwarder)
            .send_with(
                Method::PUT,
                &m.url,
                &path,
                body,
                REGISTER_ON_WORKER_TIMEOUT,
                version_header.as_slice(),
            )
            .await;
        match sent {
            Ok(a) if a.is_success() => {
                m.registered_as(name, version);
                tracing::debug!(worker = %m.name, function = %name, version, "registered on worker");
                Ok(())
            }
            Ok(a) if a.is_unavailable() => Err(Attempt::NotStarted(format!(
                "worker {} is shutting down",
                m.name
            ))),
            Ok(a) => Err(Attempt::Failed(InvokeError::WorkerRefused {
                worker: m.name.clone(),
                function: name.clone(),
                status: a.status.as_u16(),
                message: a.error_message(),
            })),
            // A failed registration never started the invocation.
            Err(e) => Err(Attempt::NotStarted(format!(
                "registering {name} on worker {}: {e}",
                m.name
            ))),
        }
    }

    // ---- invocations ----

    /// One invocation of `name` with JSON `args`; `t0` is when the request arrived. A worker's
    /// error answer comes back as [`InvokeError::WorkerAnswer`], to be passed on unchanged.
    /// `deadline` is what the call set itself (`Hearth-Deadline-Ms`, counted from `t0`, and
    /// `Hearth-Drop-Late`).
    pub async fn invoke(
        &self,
        name: &str,
        args: Bytes,
        t0: Instant,
        deadline: CallDeadline,
    ) -> Result<InvokeAnswer, InvokeError> {
        self.invoke_as(name, args, t0, None, deadline).await
    }

    /// [`Self::invoke`] of an async invocation: its `id` goes to the worker, which runs a
    /// repeated id once.
    pub async fn invoke_as(
        &self,
        name: &str,
        args: Bytes,
        t0: Instant,
        id: Option<&str>,
        deadline: CallDeadline,
    ) -> Result<InvokeAnswer, InvokeError> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(InvokeError::ShuttingDown);
        }
        let _guard = self.in_flight.enter();
        let reg = self
            .registry
            .get(name)
            .ok_or_else(|| InvokeError::UnknownFunction(name.to_string()))?;
        let key = FunctionKey::of(name);
        let timeout = Duration::from_millis(reg.spec.timeout_ms + self.config.forward_grace_ms);
        let mut not_started = Vec::new();
        for _attempt in 0..2 {
            let worker = self.route(key, name)?;
            let Some(m) = self.driver.member(worker) else {
                self.driver
                    .finished(worker, key, name, Finished::Failed, None);
                self.driver
                    .leave(worker, "its address is unknown", "failed");
                continue;
            };
            let call = Call { id, t0, deadline };
            match self.attempt(&m, &reg, args.clone(), timeout, call).await {
                Ok(answer) => return self.answered(worker, key, name, answer, t0),
                Err(Attempt::NotStarted(why)) => {
                    self.driver
                        .finished(worker, key, name, Finished::Failed, None);
                    self.driver.leave(worker, &why, "failed");
                    not_started.push(why);
                }
                Err(Attempt::Failed(e)) => {
                    self.driver
                        .finished(worker, key, name, Finished::Failed, None);
                    self.metrics.outcome(match e {
                        InvokeError::WorkerTimeout { .. } => "worker_timeout",
                        _ => "worker_failed",
                    });
                    return Err(e);
                }
            }
        }
        self.metrics.outcome("worker_failed");
        Err(InvokeError::WorkerUnavailable { why: not_started })
    }

    /// The policy's decision, as a worker or the error to answer.
    fn route(&self, key: FunctionKey, name: &str) -> Result<WorkerId, InvokeError> {
        self.driver.route(key, name).map_err(|r| match r {
            RouteError::Policy(Rejection::NoWorkers) => InvokeError::NoWorkers,
            RouteError::Policy(Rejection::Overloaded { load, b_max }) => {
                InvokeError::Overloaded { load, b_max }
            }
            RouteError::NoGpu {
                needed_mb,
                largest_mb,
            } => InvokeError::NoGpuWorker {
                function: name.to_string(),
                needed_mb,
                largest_mb,
            },
        })
    }

    /// One attempt on one worker: register if needed, forward, and tell apart what may have run.
    async fn attempt(
        &self,
        m: &Member,
        reg: &Registered,
        args: Bytes,
        timeout: Duration,
        call: Call<'_>,
    ) -> Result<Answer, Attempt> {
        use hearth_service::async_api::{DEADLINE_MS, DROP_LATE, ELAPSED_US, INVOCATION_ID};
        let name = &reg.spec.name;
        let mut headers: Vec<(&'static str, HeaderValue)> = Vec::new();
        if let Some(v) = call.id.and_then(|id| HeaderValue::from_str(id).ok()) {
            headers.push((INVOCATION_ID, v));
        }
        if let Some(d) = call.deadline.deadline_ms {
            headers.push((DEADLINE_MS, HeaderValue::from(d)));
        }
        if let Some(drop) = call.deadline.drop_late {
            let v = if drop { "true" } else { "false" };
            headers.push((DROP_LATE, HeaderValue::from_static(v)));
        }
        let path = format!("/v1/functions/{name}/invoke");
        let failed = |why: &str| {
            Attempt::Failed(InvokeError::WorkerFailed {
                worker: m.name.clone(),
                why: why.to_string(),
            })
        };
        for _ in 0..2 {
            self.ensure_registered(m, reg).await?;
            if m.is_gone() {
                return Err(Attempt::NotStarted(format!(
                    "worker {} left the cluster",
                    m.name
                )));
            }
            // The worker's share of the deadline is what is left of it now.
            if call.deadline.deadline_ms.is_some() || reg.spec.deadline_ms.is_some() {
                headers.retain(|(n, _)| *n != ELAPSED_US);
                let elapsed = call.t0.elapsed().as_micros() as u64;
                headers.push((ELAPSED_US, HeaderValue::from(elapsed)));
            }
            let sent = tokio::select! {
                biased;
                r = m.forwarder(&self.forwarder).send_with(Method::POST, &m.url, &path, args.clone(), timeout, &headers) => r,
                _ = m.gone() => {
                    return Err(failed("it left the cluster (missed status deadlines or failed) while running the invocation"));
                }
            };
            let answer = match sent {
                Ok(a) => a,
                Err(ForwardError::NotStarted(e)) => return Err(Attempt::NotStarted(e)),
                Err(e @ ForwardError::MaybeStarted(_)) => {
                    self.driver.leave(m.id, &e.to_string(), "failed");
                    return Err(failed(&e.to_string()));
                }
                // A slow answer is not a dead worker: one whose queue holds the invocation past
                // the deadline still pushes status, and ejecting it would fail everything else
                // running there. Liveness is the status deadline's job.
                Err(ForwardError::TimedOut(after)) => {
                    return Err(Attempt::Failed(InvokeError::WorkerTimeout {
                        worker: m.name.clone(),
                        after,
                    }));
                }
            };
            if answer.lost_function() {
                // The worker lost the function (e.g. a fresh data directory): it did not run.
                m.forget(name);
                continue;
            }
            if answer.shutting_down() {
                return Err(Attempt::NotStarted(format!(
                    "worker {} is shutting down",
                    m.name
                )));
            }
            return Ok(answer);
        }
        Err(Attempt::Failed(InvokeError::Internal(format!(
            "worker {} keeps losing function {name}",
            m.name
        ))))
    }

    /// Books a worker's answer; a success gets the controller's time added, anything else is
    /// passed on unchanged.
    fn answered(
        &self,
        worker: WorkerId,
        key: FunctionKey,
        name: &str,
        a: Answer,
        t0: Instant,
    ) -> Result<InvokeAnswer, InvokeError> {
        if !a.is_ok() {
            self.driver
                .finished(worker, key, name, Finished::Failed, None);
            self.metrics.outcome("error");
            return Err(InvokeError::WorkerAnswer(a));
        }
        let total = t0.elapsed().as_micros() as u64;
        let timed = with_controller_time(&a.body, total);
        let (how, outcome) = match &timed {
            Some((_, ran)) => {
                self.metrics
                    .overhead
                    .observe(total.saturating_sub(ran.e2e_us) as f64 / 1e6);
                (ran.finished(), Some(ran.outcome))
            }
            None => (Finished::Failed, None),
        };
        self.driver.finished(worker, key, name, how, outcome);
        self.metrics.outcome("ok");
        if let Some(m) = self.driver.member(worker) {
            self.metrics
                .forwarded
                .get_or_create(&WorkerLabel {
                    worker: m.name.clone(),
                })
                .inc();
        }
        match timed {
            Some((mut answer, _)) => {
                // Judged again here: the deadline counts from this controller's acceptance.
                answer.judge_deadline(total);
                if answer.deadline_missed == Some(true) {
                    self.metrics.deadlines_missed.inc();
                }
                Ok(answer)
            }
            // A 200 that is not an invocation answer: passed on as the worker sent it.
            None => Err(InvokeError::WorkerAnswer(a)),
        }
    }

    /// Accepts an async invocation: stored durably, then run (with the function's retries, or
    /// `retries`). `owner` (a key id) may read the result; `slot` is the namespace's quota
    /// slot, held until the invocation ends. A repeated `idempotency_key` returns the first
    /// call's id.
    pub async fn invoke_async(
        self: &Arc<Self>,
        name: &str,
        args: Bytes,
        owner: &str,
        idempotency_key: Option<String>,
        retries: Option<u32>,
        slot: QuotaGuard,
    ) -> Result<Accepted, InvokeError> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(InvokeError::ShuttingDown);
        }
        let reg = self
            .registry
            .get(name)
            .ok_or_else(|| InvokeError::UnknownFunction(name.to_string()))?;
        let retries = retries.unwrap_or(reg.spec.retries);
        self.delivery
            .accept(name, owner, args, retries, idempotency_key, slot)
            .await
            .map_err(InvokeError::from)
    }

    /// Async delivery (records, waiting for one, dead letters).
    pub fn delivery(&self) -> &Arc<Delivery> {
        &self.delivery
    }

    /// Starts `count` sandboxes of `name` on the worker its invocations would go to.
    pub async fn prewarm(&self, name: &str, count: u32) -> Result<PrewarmAnswer, PrewarmError> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(InvokeError::ShuttingDown.into());
        }
        let reg = self
            .registry
            .get(name)
            .ok_or_else(|| InvokeError::UnknownFunction(name.to_string()))?;
        let key = FunctionKey::of(name);
        // A GPU function's home on the ring may have no GPU: it goes where it would run.
        let home = match self.driver.gpu_need(name) {
            Some(_) => None,
            None => self.driver.home(key),
        };
        let worker = match home {
            Some(w) => w,
            None => {
                let w = self.route(key, name)?;
                self.driver.finished(w, key, name, Finished::Failed, None);
                w
            }
        };
        let m = self
            .driver
            .member(worker)
            .ok_or_else(|| InvokeError::Internal("the chosen worker has no address".to_string()))?;
        let failed = |why: String| InvokeError::WorkerFailed {
            worker: m.name.clone(),
            why,
        };
        self.ensure_registered(&m, &reg)
            .await
            .map_err(|e| match e {
                Attempt::Failed(e) => e,
                Attempt::NotStarted(why) => failed(why),
            })?;
        let body = Bytes::from(json!({ "count": count }).to_string());
        let timeout = Duration::from_millis(reg.spec.timeout_ms.max(60_000));
        let path = format!("/v1/functions/{name}/prewarm");
        let a = m
            .forwarder(&self.forwarder)
            .send(Method::POST, &m.url, &path, body, timeout)
            .await
            .map_err(|e| failed(e.to_string()))?;
        if !a.is_success() {
            return Err(PrewarmError::WorkerRefused {
                worker: m.name.clone(),
                status: a.status.as_u16(),
                message: a.error_message(),
            });
        }
        let mut answer: PrewarmAnswer =
            serde_json::from_slice(&a.body).map_err(|_| PrewarmError::UnreadableAnswer {
                worker: m.name.clone(),
            })?;
        answer.worker = Some(m.name.clone());
        Ok(answer)
    }

    // ---- status ----

    /// Sandboxes of `name` per worker, from the last reports.
    pub fn sandboxes(&self, name: &str) -> Sandboxes {
        let mut s = Sandboxes {
            pool: SandboxCounts::default(),
            workers: BTreeMap::new(),
        };
        for m in self.driver.members() {
            if let Some((r, _)) = m.report() {
                if let Some(f) = r.functions.get(name) {
                    s.pool.add(f);
                    s.workers.insert(m.name.clone(), *f);
                }
            }
        }
        s
    }

    /// What the policy knows about a function.
    pub fn balancing(&self, name: &str) -> Balancing {
        let key = FunctionKey::of(name);
        let now = self.driver.now();
        let balancing = self.driver.read(|b| {
            let p = b.params();
            Balancing {
                home: b.home(key).map(|w| b.workers().name(w).to_string()),
                function: b.function(key).map(|f| FunctionBalancing {
                    popular: b.is_popular(now, key),
                    priority: f.priority,
                    warm_us: f.warm_us.get().map(|v| v.round()),
                    cold_us: f.cold_us.get().map(|v| v.round()),
                    // The bound the policy applies (its pool's under k-CH-RLU); CH-RLU's for
                    // policies that have none.
                    load_bound: b.load_bound(key).unwrap_or_else(|| f.bound(p.b, p.b_max)),
                }),
                atoll: None,
            }
        });
        Balancing {
            atoll: self.driver.read_atoll(|a| {
                let (active_groups, removed_groups) = a.groups_of(name);
                let (proactive, soft_evicted) = a.sandboxes(name);
                FunctionAtoll {
                    active_groups,
                    removed_groups,
                    proactive,
                    soft_evicted,
                }
            }),
            ..balancing
        }
    }

    /// `GET /v1/status`.
    pub fn status(&self) -> ControllerStatus {
        let members = self.driver.members();
        let status = self.driver.read(|b| {
            let workers: Vec<WorkerView> = members
                .iter()
                .map(|m| {
                    let state = b.workers().get(m.id);
                    let report = m.report();
                    WorkerView {
                        worker: m.name.clone(),
                        url: m.url.clone(),
                        up: state.is_some_and(|s| s.up),
                        is_static: m.is_static,
                        load: state.map(|s| s.report.load),
                        queue_len: state.map(|s| s.report.queue_len),
                        running: state.map(|s| s.report.running),
                        free_mb: state.map(|s| s.report.free_mb),
                        in_flight: state.map(|s| s.in_flight),
                        backend: report.as_ref().map(|r| r.0.backend.clone()),
                        cpus: report.as_ref().map(|r| r.0.cpus),
                        last_report_ms_ago: report
                            .as_ref()
                            .map(|r| r.1.elapsed().as_millis() as u64),
                        gpus: report
                            .as_ref()
                            .map(|r| r.0.gpus.clone())
                            .unwrap_or_default(),
                    }
                })
                .collect();
            let mut backends: Vec<String> = workers
                .iter()
                .filter(|w| w.up)
                .filter_map(|w| w.backend.clone())
                .collect();
            backends.sort();
            backends.dedup();
            let backend = match backends.len() {
                0 => "none".to_string(),
                1 => backends.remove(0),
                _ => "mixed".to_string(),
            };
            let pools = b
                .pools()
                .iter()
                .map(|p| PoolView {
                    level: p.level,
                    b_max: p.b_max,
                    workers: p
                        .members
                        .iter()
                        .map(|w| b.workers().name(*w).to_string())
                        .collect(),
                })
                .collect();
            let mut functions: BTreeMap<String, SandboxCounts> = BTreeMap::new();
            let mut free_mb = 0u64;
            for m in &members {
                if !b.workers().get(m.id).is_some_and(|s| s.up) {
                    continue;
                }
                if let Some((r, _)) = m.report() {
                    free_mb += r.load.free_mb;
                    for (name, f) in &r.functions {
                        functions.entry(name.clone()).or_default().add(f);
                    }
                }
            }
            let threshold = b.popularity_threshold();
            ControllerStatus {
                role: "controller",
                backend,
                uptime_s: self.driver.uptime_s(),
                shutting_down: self.shutting_down.load(Ordering::Acquire),
                in_flight: self.in_flight.count(),
                async_running: self.delivery.running(),
                balance: b.kind().as_str(),
                balance_params: b.params().clone(),
                popularity_threshold: threshold.is_finite().then_some(threshold),
                workers_up: b.workers().live().len(),
                workers,
                pools,
                memory: MemoryView { free_mb },
                functions,
                atoll: None,
            }
        });
        ControllerStatus {
            atoll: self.driver.read_atoll(|a| AtollView {
                ladder: a.config().ladder.as_str(),
                groups: a.group_count(),
                group_size: a.config().group_size,
                stats: *a.stats(),
            }),
            ..status
        }
    }

    /// Live workers' reported loads, for metrics.
    pub fn loads(&self) -> Vec<(String, f64)> {
        self.driver.loads()
    }

    // ---- shutdown ----

    /// New invocations are refused from now on.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
    }

    /// Waits up to `grace` for in-flight invocations (sync and async) to finish, then leaves
    /// the cluster's membership (its unfinished async invocations are taken over by another
    /// controller once its session ends).
    pub async fn drain(&self, grace: Duration) {
        self.begin_shutdown();
        let deadline = tokio::time::Instant::now() + grace;
        if !self.in_flight.wait_idle(deadline).await {
            tracing::warn!(
                in_flight = self.in_flight.count(),
                "grace period over with invocations still running"
            );
        }
        let m = self.membership.lock().take();
        if let Some(m) = m {
            m.leave().await;
        }
    }
}

/// Where Hearth's keys live in etcd.
const STORE_PREFIX: &str = "/hearth";
/// How often a controller in a cluster looks for async invocations another one left.
const ORPHAN_SCAN: Duration = Duration::from_secs(1);

/// Runs blocking work (files, SQLite) off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, RegisterError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| RegisterError::Packing(format!("the registration task failed: {e}")))
}

/// A function's code directory packed as the `code` of a registration on a worker (off the
/// async threads: it reads and compresses files).
async fn pack_code(dir: PathBuf) -> Result<Arc<Value>, RegisterError> {
    let packed =
        tokio::task::spawn_blocking(move || hearth_service::archive::pack_dir_base64(&dir))
            .await
            .map_err(|e| RegisterError::Packing(e.to_string()))?
            .map_err(|e| RegisterError::Packing(format!("packing the code: {e}")))?;
    Ok(Arc::new(json!({ "archive": packed })))
}

/// How an invocation ran at the worker, as its answer says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ran {
    cold: bool,
    /// The worker's own end-to-end time.
    e2e_us: u64,
    /// Its queueing delay and times, for Atoll (piggybacked on every answer).
    outcome: Outcome,
}

impl Ran {
    /// What the policy learns from it: the running times (init and exec), not the worker's
    /// end-to-end time, whose queue wait would pull CH-RLU's cold/warm ratio towards 1 under
    /// load (CH-RLU paper §4.5).
    fn finished(self) -> Finished {
        let exec_us = self.outcome.exec_us.unwrap_or(0);
        if self.cold {
            Finished::Cold {
                init_us: self.outcome.init_us.unwrap_or(0),
                exec_us,
            }
        } else {
            Finished::Warm { exec_us }
        }
    }
}

/// What a call set of its own deadline, forwarded to the worker as it came.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallDeadline {
    /// `Hearth-Deadline-Ms`; the function's `deadline_ms` applies without it.
    pub deadline_ms: Option<u64>,
    /// `Hearth-Drop-Late` as the caller sent it (`None`: absent, the worker's default).
    pub drop_late: Option<bool>,
}

/// One forwarded call: its async id, when this controller accepted it, its own deadline.
#[derive(Clone, Copy)]
struct Call<'a> {
    id: Option<&'a str>,
    t0: Instant,
    deadline: CallDeadline,
}

/// A worker's success answer with the controller's share of `total_us` (the end-to-end time
/// here) added to its timing, and how it ran there. None when the body is not an invocation
/// answer.
fn with_controller_time(body: &[u8], total_us: u64) -> Option<(InvokeAnswer, Ran)> {
    let mut answer = InvokeAnswer::parse(body)?;
    let t = &answer.timing;
    let ran = Ran {
        cold: answer.cold,
        e2e_us: t.e2e,
        outcome: Outcome {
            queue_us: t.queue,
            init_us: answer.cold.then_some(t.init),
            exec_us: Some(t.exec),
        },
    };
    answer.timing.add_controller(total_us);
    Some((answer, ran))
}

/// The controller runs async invocations by forwarding them with their id.
struct ControllerRunner(std::sync::OnceLock<std::sync::Weak<Controller>>);

#[hearth_service::async_trait]
impl Runner for ControllerRunner {
    async fn run(&self, inv: &StoredInvocation) -> Attempted {
        let Some(c) = self.0.get().and_then(|c| c.upgrade()) else {
            return Attempted::abandoned();
        };
        let args = Bytes::from(inv.args.clone());
        match c
            .invoke_as(
                &inv.function,
                args,
                Instant::now(),
                Some(&inv.id),
                CallDeadline::default(),
            )
            .await
        {
            Ok(answer) => Attempted::answer(200, Bytes::from(answer.to_vec())),
            Err(InvokeError::WorkerAnswer(a)) => Attempted::answer(a.status.as_u16(), a.body),
            Err(InvokeError::ShuttingDown) => Attempted::abandoned(),
            Err(e) => Attempted::error(&crate::api::invoke_error(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &[u8] = br#"{"result":{"timing":{"e2e":1},"cold":true},"cold":false,"worker":"w","timing":{"queue":0,"init":0,"exec":1000,"overhead":40,"e2e":1040}}"#;

    #[test]
    fn controller_time_is_added_to_overhead_and_e2e() {
        let (answer, ran) = with_controller_time(BODY, 1100).unwrap();
        assert_eq!(
            ran,
            Ran {
                cold: false,
                e2e_us: 1040,
                outcome: Outcome {
                    queue_us: 0,
                    init_us: None,
                    exec_us: Some(1000),
                },
            }
        );
        let v: Value = serde_json::from_slice(&answer.to_vec()).unwrap();
        assert_eq!(v["timing"]["controller"], 60);
        assert_eq!(v["timing"]["overhead"], 100);
        assert_eq!(v["timing"]["e2e"], 1100);
        assert_eq!(v["timing"]["exec"], 1000);
        assert_eq!(v["worker"], "w");
    }

    #[test]
    fn the_result_is_untouched_even_when_it_mimics_the_answer() {
        let (answer, ran) = with_controller_time(BODY, 1100).unwrap();
        assert_eq!(answer.result.get(), r#"{"timing":{"e2e":1},"cold":true}"#);
        assert!(!ran.cold, "the answer's own flag, not the result's");
        let v: Value = serde_json::from_slice(&answer.to_vec()).unwrap();
        assert_eq!(v["result"]["cold"], true, "the result is untouched");
        assert_eq!(v["result"]["timing"]["e2e"], 1);
    }

    #[test]
    fn the_policy_learns_running_times_not_the_queue_wait() {
        // 5 ms in the worker's queue, 3 ms of init, 1 ms of exec.
        let body = br#"{"result":{},"cold":true,"worker":"w","timing":{"queue":5000,"init":3000,"exec":1000,"overhead":40,"e2e":9040}}"#;
        let (_, ran) = with_controller_time(body, 10_000).unwrap();
        assert_eq!(
            ran.finished(),
            Finished::Cold {
                init_us: 3000,
                exec_us: 1000
            }
        );
        let warm = br#"{"result":{},"cold":false,"worker":"w","timing":{"queue":5000,"init":0,"exec":1000,"overhead":40,"e2e":6040}}"#;
        let (_, ran) = with_controller_time(warm, 7_000).unwrap();
        assert_eq!(ran.finished(), Finished::Warm { exec_us: 1000 });
    }

    #[test]
    fn what_is_not_a_success_answer_is_not_read() {
        assert!(with_controller_time(br#"{"error":{"code":"x","message":"y"}}"#, 1).is_none());
        assert!(with_controller_time(b"not json", 1).is_none());
    }
}
