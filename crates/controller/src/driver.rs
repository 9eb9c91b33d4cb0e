//! The driver: owns the sans-I/O routing policy ([`RoutingPolicy`]) behind one lock, feeds it
//! events with the time, and keeps the membership bookkeeping that must change together with it
//! (the [`Member`] of each worker id), so that no decision ever sees a worker without its address.
//!
//! Every call takes the lock once and briefly; nothing here awaits or does I/O. The facade asks it
//! where to run an invocation and tells it how that ended; the membership tasks and the
//! cluster endpoints tell it who joined, reported or left.

use crate::errors::ReportError;
use crate::membership::Member;
use crate::metrics::{Metrics, PlacementLabel};
use dashmap::DashMap;
use hearth_api::FunctionSpec;
use hearth_api::StatusReport;
use hearth_core::balance::{
    Balancer, Decision, Finished, FunctionInfo, FunctionKey, Rejection, WorkerId,
};
use hearth_core::proactive::{self, Atoll, Command, Outcome};
use hearth_core::Micros;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Instant;

/// The routing policy a controller drives; the simulator drives this same type.
pub type RoutingPolicy = Balancer;

/// Replaced incarnations remembered per worker, to refuse their replayed pushes.
const RETIRED_KEPT: usize = 16;

/// The policy, its clock and the members it routes to.
pub struct Driver {
    epoch: Instant,
    policy: Mutex<RoutingPolicy>,
    /// Atoll's balancer when `[atoll]` is configured: it routes instead of the policy, which
    /// keeps the membership (ids, liveness, loads). Lock order: `policy` before `atoll`.
    atoll: Option<Mutex<Atoll>>,
    members: DashMap<u32, Arc<Member>>,
    /// Incarnations of each worker that a newer one replaced: a push from one is refused.
    retired: DashMap<String, std::collections::VecDeque<String>>,
    /// Functions with `device: gpu` and the GPU memory they need: routed here, only to
    /// workers with a GPU that large, never by the policy (which knows no devices).
    gpu_only: DashMap<String, u64>,
    metrics: Arc<Metrics>,
}

/// Why an invocation has no worker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RouteError {
    /// The policy's own rejection.
    Policy(Rejection),
    /// A `gpu` function and no live worker with a GPU of `needed_mb`; `largest_mb` is the
    /// largest GPU among live workers (None: none has a GPU).
    NoGpu {
        needed_mb: u64,
        largest_mb: Option<u64>,
    },
}

impl Driver {
    pub fn new(policy: RoutingPolicy, atoll: Option<Atoll>, metrics: Arc<Metrics>) -> Self {
        Driver {
            epoch: Instant::now(),
            policy: Mutex::new(policy),
            atoll: atoll.map(Mutex::new),
            members: DashMap::new(),
            retired: DashMap::new(),
            gpu_only: DashMap::new(),
            metrics,
        }
    }

    /// Reads Atoll's state under its lock, when Atoll routes (status pages: keep `f` short).
    pub fn read_atoll<R>(&self, f: impl FnOnce(&Atoll) -> R) -> Option<R> {
        self.atoll.as_ref().map(|a| f(&a.lock()))
    }

    /// Atoll's periodic step: the commands for the workers (empty when Atoll is off or it is
    /// not time yet).
    pub fn atoll_tick(&self) -> Vec<Command> {
        let now = self.now();
        self.atoll
            .as_ref()
            .map(|a| a.lock().tick(now))
            .unwrap_or_default()
    }

    /// A proactive sandbox Atoll asked for is ready (`ok`) or could not be made.
    pub fn atoll_created(&self, worker: WorkerId, function: &str, ok: bool) {
        if let Some(a) = &self.atoll {
            let mut a = a.lock();
            if ok {
                a.on_ready(worker.0, function);
            } else {
                a.on_create_failed(worker.0, function);
            }
        }
    }

    /// Brings Atoll's view of `worker`'s proactive sandboxes in line with `report`, which the
    /// worker made while no command to it was under way; returns the sandboxes it had lost.
    pub fn atoll_reconcile(&self, worker: WorkerId, report: &StatusReport) -> u32 {
        let Some(a) = &self.atoll else {
            return 0;
        };
        a.lock().reconcile(worker.0, |f| {
            report
                .functions
                .get(f)
                .and_then(|s| s.proactive.as_ref())
                .map_or((0, 0), |p| (p.active + p.starting, p.soft))
        })
    }

    /// When the controller started.
    pub fn started(&self) -> Instant {
        self.epoch
    }

    /// Microseconds since start: the policy's clock.
    pub fn now(&self) -> Micros {
        self.epoch.elapsed().as_micros() as Micros
    }

    /// Seconds since start.
    pub fn uptime_s(&self) -> u64 {
        self.epoch.elapsed().as_secs()
    }

    /// Reads the policy under its lock (for status pages: keep `f` short).
    pub fn read<R>(&self, f: impl FnOnce(&RoutingPolicy) -> R) -> R {
        f(&self.policy.lock())
    }

    pub fn member(&self, id: WorkerId) -> Option<Arc<Member>> {
        self.members.get(&id.0).map(|m| Arc::clone(&m))
    }

    /// Whether the worker is in the ring now.
    pub fn is_up(&self, id: WorkerId) -> bool {
        self.policy.lock().workers().get(id).is_some_and(|w| w.up)
    }

    /// Every member known, up or not.
    pub fn members(&self) -> Vec<Arc<Member>> {
        self.members.iter().map(|m| Arc::clone(&m)).collect()
    }

    // ---- functions ----

    pub fn register(&self, spec: &FunctionSpec) {
        let now = self.now();
        self.policy
            .lock()
            .register(now, FunctionKey::of(&spec.name), function_info(spec));
        match spec.required_gpu_mb() {
            Some(mb) => {
                self.gpu_only.insert(spec.name.clone(), mb);
                // Atoll places proactive sandboxes on any worker: GPU functions stay out.
                if let Some(a) = &self.atoll {
                    let _ = a.lock().unregister(&spec.name);
                }
            }
            None => {
                self.gpu_only.remove(&spec.name);
                if let Some(a) = &self.atoll {
                    a.lock().register(&spec.name, atoll_spec(spec));
                }
            }
        }
    }

    /// The GPU memory a `gpu` function needs; None for functions that run on any worker.
    pub fn gpu_need(&self, name: &str) -> Option<u64> {
        self.gpu_only.get(name).map(|mb| *mb)
    }

    /// The largest GPU among live workers (MiB); None when none has a GPU.
    pub fn largest_live_gpu_mb(&self) -> Option<u64> {
        let b = self.policy.lock();
        b.workers()
            .live()
            .iter()
            .filter_map(|id| self.member(*id)?.largest_gpu_mb())
            .max()
    }

    /// Forgets a function in the policy; returns the members that had it registered, which
    /// forget it too (and so lose its proactive sandboxes).
    pub fn unregister(&self, name: &str) -> Vec<Arc<Member>> {
        self.gpu_only.remove(name);
        self.policy
            .lock()
            .unregister(self.now(), FunctionKey::of(name));
        if let Some(a) = &self.atoll {
            // The workers drop the function's sandboxes with it: no commands to send.
            let _ = a.lock().unregister(name);
        }
        // Every member, not only those known to hold it: a worker that restarted keeps the
        // functions on its disk while this incarnation's bookkeeping starts empty (issue 31,
        // item 6). A worker without it answers 404.
        self.members
            .iter()
            .map(|m| {
                m.forget(name);
                Arc::clone(&m)
            })
            .filter(|m| !m.is_gone())
            .collect()
    }

    // ---- routing ----

    /// The policy's decision for one invocation. Books the decision's time and placement, or
    /// the rejection's outcome.
    pub fn route(&self, key: FunctionKey, name: &str) -> Result<WorkerId, RouteError> {
        let t = Instant::now();
        if let Some(needed_mb) = self.gpu_need(name) {
            return self.route_gpu(needed_mb, t);
        }
        if let Some(a) = &self.atoll {
            return self.route_atoll(a, name, t).map_err(RouteError::Policy);
        }
        let decision = self.policy.lock().route(self.now(), key);
        self.metrics.route.observe(t.elapsed().as_secs_f64());
        match decision {
            Decision::Run { worker, how } => {
                self.metrics
                    .placements
                    .get_or_create(&PlacementLabel { how: how.as_str() })
                    .inc();
                Ok(worker)
            }
            Decision::Reject(r) => {
                self.metrics.outcome(match r {
                    Rejection::NoWorkers => "no_workers",
                    Rejection::Overloaded { .. } => "rejected",
                });
                Err(RouteError::Policy(r))
            }
        }
    }

    /// A `gpu` function: the least-loaded live worker with a GPU of at least `needed_mb`.
    fn route_gpu(&self, needed_mb: u64, t: Instant) -> Result<WorkerId, RouteError> {
        let chosen = {
            let b = self.policy.lock();
            let fits: Vec<WorkerId> = b
                .workers()
                .live()
                .iter()
                .copied()
                .filter(|id| {
                    self.member(*id)
                        .and_then(|m| m.largest_gpu_mb())
                        .is_some_and(|mb| mb >= needed_mb)
                })
                .collect();
            b.workers().least_loaded(fits)
        }
        .ok_or_else(|| RouteError::NoGpu {
            needed_mb,
            largest_mb: self.largest_live_gpu_mb(),
        });
        self.metrics.route.observe(t.elapsed().as_secs_f64());
        match chosen {
            Ok(worker) => {
                self.metrics
                    .placements
                    .get_or_create(&PlacementLabel { how: "gpu" })
                    .inc();
                Ok(worker)
            }
            Err(e) => {
                self.metrics.outcome("no_gpu");
                Err(e)
            }
        }
    }

    fn route_atoll(&self, a: &Mutex<Atoll>, name: &str, t: Instant) -> Result<WorkerId, Rejection> {
        let now = self.now();
        let route = a.lock().route(now, name);
        self.metrics.route.observe(t.elapsed().as_secs_f64());
        let Some(r) = route else {
            self.metrics.outcome("no_workers");
            return Err(Rejection::NoWorkers);
        };
        let how = if r.free_sandbox {
            "atoll_proactive"
        } else {
            "atoll"
        };
        self.metrics
            .placements
            .get_or_create(&PlacementLabel { how })
            .inc();
        Ok(WorkerId(r.worker))
    }

    /// Tells the policy how an invocation routed to `worker` ended; `outcome` is what the
    /// worker's answer said (None when there was no answer to learn from).
    pub fn finished(
        &self,
        worker: WorkerId,
        key: FunctionKey,
        name: &str,
        how: Finished,
        outcome: Option<Outcome>,
    ) {
        if self.gpu_only.contains_key(name) {
            // Routed past the policy and Atoll: neither booked it.
            return;
        }
        if let Some(a) = &self.atoll {
            let now = self.now();
            let mut a = a.lock();
            match outcome {
                Some(o) => a.finished(now, worker.0, name, o),
                None => {
                    a.abandoned(worker.0, name);
                }
            }
            return;
        }
        self.policy.lock().finished(self.now(), worker, key, how);
    }

    /// The function's home worker, if it is up.
    pub fn home(&self, key: FunctionKey) -> Option<WorkerId> {
        let b = self.policy.lock();
        b.home(key)
            .filter(|w| b.workers().get(*w).is_some_and(|s| s.up))
    }

    /// Live workers' reported loads, for metrics.
    pub fn loads(&self) -> Vec<(String, f64)> {
        let b = self.policy.lock();
        b.workers()
            .live()
            .iter()
            .map(|w| (b.workers().name(*w).to_string(), b.workers().load(*w)))
            .collect()
    }

    // ---- membership ----

    /// A status report (a push, or a poll of a static worker): joins or refreshes the worker.
    /// A report from a new incarnation replaces the member (its functions must be registered
    /// again); the same incarnation coming back keeps what it has.
    /// Returns the member when this report is a new incarnation of the worker (its first, or a
    /// restart), which the caller reconciles with the registry.
    pub fn on_report(
        &self,
        mut report: StatusReport,
        is_static: bool,
        credential: Option<hyper::header::HeaderValue>,
    ) -> Result<Option<Arc<Member>>, ReportError> {
        // Kept for routing: at most MAX_GPUS, labels cut, whatever the peer sent.
        report.gpus = report.bounded_gpus();
        let scheme_ok = report.url.starts_with("http://") || report.url.starts_with("https://");
        if report.worker.is_empty() || !scheme_ok {
            return Err(ReportError::Unusable);
        }
        if !is_static {
            self.check_fresh(&report)?;
        }
        if report.shutting_down {
            self.leave_named(&report.worker, "it is shutting down", "leave");
            return Ok(None);
        }
        let now = self.now();
        // Under the policy's lock, so that no decision sees the worker without its address.
        let (member, was_up, new_incarnation) = {
            let mut b = self.policy.lock();
            let was_up = b
                .workers()
                .id(&report.worker)
                .and_then(|id| b.workers().get(id))
                .is_some_and(|w| w.up);
            let id = b.join(now, &report.worker);
            // The memory budget rides beside the load in the report; OpenWhisk's balancer
            // slots it.
            let load = hearth_core::balance::WorkerLoad {
                memory_mb: report.memory_budget_mb.unwrap_or(report.load.memory_mb),
                ..report.load
            };
            b.report(now, id, load);
            if let (Some(a), false) = (&self.atoll, was_up) {
                let cpus = report.cpus.clamp(1.0, 4096.0) as u32;
                a.lock()
                    .add_worker(id.0, cpus, report.proactive.map_or(0, |p| p.pool_mb));
            }
            let existing = self.member(id);
            let (member, new_incarnation) = match existing {
                Some(m) if m.same_process(&report) && !m.is_gone() => (m, false),
                Some(m) if m.same_process(&report) => {
                    // Back after it was taken out: what was deleted meanwhile must go from it
                    // too, so it is reconciled as a new incarnation is.
                    let m = Arc::new(m.rejoined());
                    self.members.insert(id.0, Arc::clone(&m));
                    (m, true)
                }
                old => {
                    if let Some(old) = old {
                        old.mark_gone();
                        self.retire(&old.name, &old.incarnation);
                    }
                    let m = Arc::new(Member::new(id, &report, is_static, credential));
                    self.members.insert(id.0, Arc::clone(&m));
                    (m, true)
                }
            };
            (member, was_up, new_incarnation)
        };
        if !was_up {
            tracing::info!(worker = %report.worker, url = %report.url, gpus = report.gpus.len(), "worker joined");
            self.metrics.event("join");
        }
        member.set_report(report);
        Ok(new_incarnation.then_some(member))
    }

    /// Refuses a pushed report that is a replay: one from an incarnation a newer one replaced,
    /// or one whose push number is not above the last taken from its incarnation (issue 31,
    /// item 12: an old report accepted again put a dead process back in the ring).
    fn check_fresh(&self, report: &StatusReport) -> Result<(), ReportError> {
        let stale = |why| ReportError::Stale {
            worker: report.worker.clone(),
            why,
        };
        if self
            .retired
            .get(&report.worker)
            .is_some_and(|r| r.contains(&report.incarnation))
        {
            return Err(stale("its incarnation was replaced by a newer one"));
        }
        let id = self.policy.lock().workers().id(&report.worker);
        if let Some(m) = id.and_then(|id| self.member(id)) {
            if m.same_process(report) && !m.take_seq(report.seq) {
                return Err(stale(
                    "its push number is not above the last one taken (a replay)",
                ));
            }
        }
        Ok(())
    }

    /// Remembers a replaced incarnation (the last [`RETIRED_KEPT`] per worker).
    fn retire(&self, name: &str, incarnation: &str) {
        let mut r = self.retired.entry(name.to_string()).or_default();
        if !r.iter().any(|i| i == incarnation) {
            r.push_back(incarnation.to_string());
            while r.len() > RETIRED_KEPT {
                r.pop_front();
            }
        }
    }

    /// Takes a worker out (its credential was revoked), and forgets the incarnation so that
    /// nothing reaches it with its controller token until it joins again with a valid one.
    pub fn evict(&self, name: &str, why: &str) -> bool {
        let id = self.policy.lock().workers().id(name);
        let Some(id) = id else { return false };
        if let Some((_, m)) = self.members.remove(&id.0) {
            m.mark_gone();
            self.retire(&m.name, &m.incarnation);
        }
        self.leave(id, why, "revoked")
    }

    /// A worker says goodbye; false when no live worker has that name.
    pub fn on_leave(&self, name: &str) -> bool {
        self.leave_named(name, "it left", "leave")
    }

    /// A worker's membership lease in the cluster's store ended: it stops getting work. Its
    /// running calls are not ended here: a killed worker's connections fail by themselves, and
    /// a frozen one that thaws finishes them (or their own timeouts end them).
    pub fn lease_ended(&self, name: &str) -> bool {
        self.leave_named(name, "its membership lease ended", "lease_ended")
    }

    fn leave_named(&self, name: &str, why: &str, event: &'static str) -> bool {
        let id = self.policy.lock().workers().id(name);
        id.is_some_and(|id| self.leave(id, why, event))
    }

    /// Takes a worker out of the ring. Its running invocations end by themselves: a crashed
    /// worker's connections fail; one that left gracefully (`leave`), is suspected of being
    /// stuck (`suspected`), lost its lease (`lease_ended`) or had one connection fail
    /// (`failed`) finishes them, or their own timeouts end them. Only a worker silent past its
    /// status deadline ([`Self::expire`]: a machine gone without closing its connections) has
    /// them ended at once.
    pub fn leave(&self, id: WorkerId, why: &str, event: &'static str) -> bool {
        let left = self.policy.lock().leave(self.now(), id);
        if let (Some(a), true) = (&self.atoll, left) {
            a.lock().remove_worker(id.0);
        }
        if let Some(m) = self.members.get(&id.0) {
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

    /// Workers silent for longer than `timeout_ms` leave the ring.
    pub fn expire(&self, timeout_ms: u64) {
        let expired = self.policy.lock().expire(self.now(), timeout_ms * 1000);
        for id in expired {
            if let Some(a) = &self.atoll {
                a.lock().remove_worker(id.0);
            }
            if let Some(m) = self.member(id) {
                m.mark_gone();
                tracing::warn!(worker = %m.name, url = %m.url, "worker missed its status deadline ({timeout_ms} ms); it left the ring");
            }
            self.metrics.event("expired");
        }
    }
}

/// What the routing policy knows of a function: `sim` functions declare their times.
pub fn function_info(spec: &FunctionSpec) -> FunctionInfo {
    FunctionInfo {
        priority: spec.priority,
        warm_us: declared_us(spec.sim_warm_ms),
        cold_us: declared_us(spec.sim_cold_ms)
            .map(|c| c + declared_us(spec.sim_warm_ms).unwrap_or(0)),
        memory_mb: spec.memory_mb,
    }
}

/// What Atoll knows of a function: its memory and deadline; set-up and run times when the
/// `sim` backend declares them (else Atoll learns them from answers).
pub fn atoll_spec(spec: &FunctionSpec) -> proactive::FunctionSpec {
    proactive::FunctionSpec {
        memory_mb: spec.memory_mb,
        deadline_us: spec.deadline_ms.map(|d| d.saturating_mul(1000)),
        setup_us: declared_us(spec.sim_cold_ms),
        exec_us: declared_us(spec.sim_warm_ms),
    }
}

/// A time a `sim` function declares in ms (0: not declared), in µs.
fn declared_us(ms: f64) -> Option<u64> {
    (ms > 0.0).then_some((ms * 1000.0) as u64)
}
