//! The GPU scheduler: flows, the single dispatcher of Algorithm 3, D tokens with utilization
//! feedback, the container pool and device memory, as one sans-I/O state machine.
//!
//! Events come in with the time ([`GpuScheduler::on_arrival`], [`GpuScheduler::on_completed`],
//! [`GpuScheduler::on_failed`], [`GpuScheduler::on_utilization`], [`GpuScheduler::on_timeout`]);
//! each runs the dispatcher, and the decisions come out of [`GpuScheduler::poll_action`]. The
//! driver arms one timer for [`GpuScheduler::next_timeout`] (flow TTLs). An arrival refused at
//! the door gets `Err` and no id; every id handed out gets exactly one
//! [`GpuAction::Dispatch`] or [`GpuAction::Reject`] over its life.
//!
//! Memory accounting: a `Prefetch`, `Swap` or `Dispatch` changes where the scheduler counts a
//! container's memory the moment it is issued; the driver (the shim's `cuMemPrefetchAsync`)
//! moves it asynchronously. Swaps are issued before the dispatch that needed their room.
//! Under [`GpuMemoryPolicy::PrefetchOnly`] and [`GpuMemoryPolicy::Uvm`] nothing is swapped:
//! the driver evicts least recently used memory when a dispatch needs room, and the dispatch's
//! [`GpuPaging`] says how much, since that copy is on its critical path.

use super::config::{GpuConfigError, GpuMemoryPolicy, GpuPolicy, GpuSchedConfig};
use super::flow::{Flow, FlowState, Pending};
use crate::time::Micros;
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

/// Most distinct functions with a flow at once; idle flows without containers are forgotten
/// to make room.
pub const MAX_FLOWS: usize = 4096;
/// Longest function name accepted.
pub const MAX_FUNCTION_NAME: usize = 256;
/// Largest priority weight (weights are relative; this keeps VT increments meaningful).
pub const MAX_WEIGHT: f64 = 1e6;

/// An invocation's identity within one scheduler (arrival order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct GpuInvocationId(pub u64);

/// A GPU container's identity within one scheduler, for its lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ContainerId(pub u64);

/// An arriving invocation.
#[derive(Debug, Clone, Copy)]
pub struct GpuArrival<'a> {
    pub function: &'a str,
    /// Priority weight w_k (> 0); the latest arrival's weight is the flow's.
    pub weight: f64,
    /// Device memory a new container of the function holds (until its shim reports).
    pub gpu_memory_mb: u64,
}

/// How a dispatched invocation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GpuCompletion {
    /// Execution time on the device, when known: feeds τ_k.
    pub exec_us: Option<Micros>,
    /// The container is healthy and may serve again.
    pub reusable: bool,
    /// Device memory the shim reports the container holds now.
    pub device_memory_mb: Option<u64>,
}

/// How a dispatched invocation gets its container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Start {
    /// An idle container whose memory is on the device.
    Warm,
    /// An idle container whose memory is on the host: prefetch it, then run ("GPU-cold but
    /// CPU-warm"); under stock UVM its pages fault in as it runs instead
    /// ([`GpuPaging`] says which).
    HostWarm,
    /// Create the GPU container, then run.
    Cold,
}

/// Memory a dispatch moves between host and device on its critical path, for the driver
/// (or a simulated device) to charge before or during the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct GpuPaging {
    /// Copied onto the device in bulk before the run (a host-warm start under the prefetching
    /// policies).
    pub prefetch_mb: u64,
    /// Paged in on demand while the run touches it (a host-warm start under stock UVM).
    pub fault_in_mb: u64,
    /// Other idle containers' memory the driver evicts on demand to make room (prefetch-only
    /// and UVM; under prefetch-swap the room comes from asynchronous swaps).
    pub evict_mb: u64,
}

/// Why a container goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GpuDestroyReason {
    /// Evicted (LRU) to make room under the per-device container cap.
    PoolFull,
    /// Its invocation failed (crash, CUDA context lost).
    Failed,
    /// The completion said it may not serve again.
    NotReusable,
    /// Its shim reported more memory than its device has.
    TooLarge,
}

/// Why an invocation will not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum GpuReject {
    #[error("the GPU queue is full ({length} waiting)")]
    QueueFull { length: usize },
    #[error(
        "the function needs {needed_mb} MiB of device memory; the largest GPU has {largest_mb} MiB"
    )]
    TooLarge { needed_mb: u64, largest_mb: u64 },
    #[error("the weight must be finite, above 0 and at most {MAX_WEIGHT}")]
    BadWeight,
    #[error("the function name must be 1 to {MAX_FUNCTION_NAME} bytes")]
    BadFunction,
    #[error("too many GPU functions at once (at most {MAX_FLOWS})")]
    TooManyFunctions,
    #[error("the GPU scheduler is shutting down")]
    ShuttingDown,
}

/// An event the scheduler cannot apply.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum GpuEventError {
    #[error("invocation {0:?} is not running")]
    UnknownInvocation(GpuInvocationId),
    #[error("there is no GPU {0}")]
    UnknownGpu(usize),
    #[error("utilization must be finite and within 0..=1, got {0}")]
    BadUtilization(f64),
}

/// Where a dispatched invocation runs and how it starts: what a driver (the worker's executor,
/// the simulator) carries from the dispatch to the invocation's end. `Copy`, unlike the
/// dispatch, which also names the function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuPlacement {
    pub invocation: GpuInvocationId,
    pub gpu: usize,
    pub container: ContainerId,
    pub start: Start,
    /// Time the invocation waited in its queue.
    pub queued_us: Micros,
    /// Device memory the scheduler counts for the container.
    pub memory_mb: u64,
    /// What moves on the critical path before or while it runs.
    pub paging: GpuPaging,
}

/// A decision for the driver.
#[must_use]
#[derive(Debug, Clone, PartialEq)]
pub enum GpuAction {
    /// Run the invocation in `placement.container` on `placement.gpu` (create or prefetch it
    /// first, per `placement.start`).
    Dispatch {
        function: Arc<str>,
        placement: GpuPlacement,
    },
    /// Move an idle container's memory onto the device (its flow became active).
    Prefetch { container: ContainerId, gpu: usize },
    /// Move an idle container's memory to the host (asynchronously).
    Swap { container: ContainerId, gpu: usize },
    /// Stop and remove a container (its memory and context are freed).
    Destroy {
        container: ContainerId,
        gpu: usize,
        reason: GpuDestroyReason,
    },
    /// A queued invocation will never run.
    Reject {
        invocation: GpuInvocationId,
        reason: GpuReject,
    },
}

#[derive(Debug, Clone)]
struct Container {
    function: Arc<str>,
    gpu: usize,
    memory_mb: u64,
    on_device: bool,
    busy: bool,
    last_used: Micros,
    /// When its flow's activation last ordered its memory onto the device: a dispatch in
    /// that same event finds the copy still under way, so it is a host-warm start, not warm.
    prefetched_at: Option<Micros>,
}

#[derive(Debug, Clone)]
struct Running {
    function: Arc<str>,
    container: ContainerId,
    gpu: usize,
    /// What this dispatch added to the device's tracked utilization, and in which sample
    /// epoch: once a newer sample arrived, the sample accounts for it instead.
    util_added: f64,
    epoch: u64,
}

#[derive(Debug, Clone)]
struct Device {
    memory_mb: u64,
    d: u32,
    running: u32,
    tracked_util: f64,
    measured_util: Option<f64>,
    epoch: u64,
}

/// What the dispatcher decided for the head of a flow.
#[derive(Debug)]
struct Plan {
    gpu: usize,
    /// Existing idle container, or `None` to create one.
    container: Option<ContainerId>,
    start: Start,
    memory_mb: u64,
    /// Idle container destroyed for the container cap.
    evict: Option<ContainerId>,
    /// Idle containers swapped out (or, without swapping, evicted on demand) for room.
    swaps: Vec<ContainerId>,
}

/// Running totals, for status and experiments.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuCounters {
    pub dispatched_warm: u64,
    pub dispatched_host_warm: u64,
    pub dispatched_cold: u64,
    pub completed: u64,
    pub failed: u64,
    pub swaps: u64,
    pub prefetches: u64,
    pub destroys: u64,
    pub rejects: u64,
    /// Idle containers whose memory the driver evicted on demand for a dispatch (prefetch-only
    /// and UVM), as opposed to `swaps`.
    #[serde(default)]
    pub evictions: u64,
}

/// One GPU, as [`GpuScheduler::status`] shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuDeviceStatus {
    pub index: usize,
    pub d: u32,
    /// Tokens in use: invocations running on it.
    pub running: u32,
    pub tracked_util: f64,
    pub measured_util: Option<f64>,
    pub memory_total_mb: u64,
    /// Container memory counted on the device (running and idle GPU-warm).
    pub memory_resident_mb: u64,
    /// Memory of running containers.
    pub memory_used_mb: u64,
    pub containers: u32,
    pub containers_idle: u32,
}

/// The queue and the devices ([`GpuScheduler::gauges`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuGauges {
    pub queued: usize,
    pub gpus: Vec<GpuDeviceStatus>,
}

/// One flow, as [`GpuScheduler::status`] shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuFlowStatus {
    pub function: String,
    pub state: FlowState,
    pub vt: f64,
    pub queued: usize,
    pub in_flight: u32,
    pub ttl_us: Micros,
    pub tau_us: f64,
    pub weight: f64,
    pub home_gpu: Option<usize>,
}

/// A snapshot of the scheduler.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuStatus {
    pub policy: GpuPolicy,
    pub global_vt: f64,
    pub queued: usize,
    pub gpus: Vec<GpuDeviceStatus>,
    pub flows: Vec<GpuFlowStatus>,
    pub counters: GpuCounters,
}

/// The scheduler (module docs).
#[derive(Debug)]
pub struct GpuScheduler {
    config: GpuSchedConfig,
    flows: BTreeMap<Arc<str>, Flow>,
    containers: BTreeMap<ContainerId, Container>,
    running: HashMap<GpuInvocationId, Running>,
    devices: Vec<Device>,
    global_vt: f64,
    queued: usize,
    next_invocation: u64,
    next_container: u64,
    actions: VecDeque<GpuAction>,
    /// Batch: the flow being drained.
    batch_current: Option<Arc<str>>,
    shutting_down: bool,
    counters: GpuCounters,
    largest_gpu_mb: u64,
}

impl GpuScheduler {
    /// A scheduler for `config`, which must pass [`GpuSchedConfig::check`].
    pub fn new(config: GpuSchedConfig) -> Result<Self, GpuConfigError> {
        config.check()?;
        let devices = config
            .gpus
            .iter()
            .map(|g| Device {
                memory_mb: g.memory_mb,
                d: config.d,
                running: 0,
                tracked_util: 0.0,
                measured_util: None,
                epoch: 0,
            })
            .collect();
        let largest_gpu_mb = config.gpus.iter().map(|g| g.memory_mb).max().unwrap_or(0);
        Ok(GpuScheduler {
            config,
            flows: BTreeMap::new(),
            containers: BTreeMap::new(),
            running: HashMap::new(),
            devices,
            global_vt: 0.0,
            queued: 0,
            next_invocation: 1,
            next_container: 1,
            actions: VecDeque::new(),
            batch_current: None,
            shutting_down: false,
            counters: GpuCounters::default(),
            largest_gpu_mb,
        })
    }

    pub fn config(&self) -> &GpuSchedConfig {
        &self.config
    }

    /// The device parallelism D of `gpu` now (0 for a GPU it does not have).
    pub fn parallelism(&self, gpu: usize) -> u32 {
        self.devices.get(gpu).map_or(0, |d| d.d)
    }

    /// Invocations dispatched to `gpu` and not yet ended (0 for a GPU it does not have): what a
    /// simulated device shares among them.
    pub fn running_on(&self, gpu: usize) -> u32 {
        self.devices.get(gpu).map_or(0, |d| d.running)
    }

    /// Queues an invocation and dispatches what can go. `Err`: refused outright (no id, no
    /// action follows).
    pub fn on_arrival(
        &mut self,
        now: Micros,
        arrival: GpuArrival<'_>,
    ) -> Result<GpuInvocationId, GpuReject> {
        let refused = self.admit(&arrival);
        if let Err(reason) = refused {
            self.counters.rejects += 1;
            return Err(reason);
        }
        let name: Arc<str> = match self.flows.get_key_value(arrival.function) {
            Some((name, _)) => name.clone(),
            None => {
                if self.flows.len() >= MAX_FLOWS {
                    self.forget_idle_flows();
                    if self.flows.len() >= MAX_FLOWS {
                        self.counters.rejects += 1;
                        return Err(GpuReject::TooManyFunctions);
                    }
                }
                let name: Arc<str> = Arc::from(arrival.function);
                self.flows
                    .insert(name.clone(), Flow::new(now, self.config.default_exec_us));
                name
            }
        };
        let id = GpuInvocationId(self.next_invocation);
        self.next_invocation += 1;
        let global_vt = self.global_vt;
        let default_exec_us = self.config.default_exec_us;
        let flow = self
            .flows
            .entry(name.clone())
            .or_insert_with(|| Flow::new(now, default_exec_us));
        flow.note_arrival(now);
        flow.weight = arrival.weight;
        flow.queue.push_back(Pending {
            id,
            arrival: now,
            memory_mb: arrival.gpu_memory_mb,
        });
        self.queued += 1;
        if flow.queue.len() == 1 && flow.in_flight == 0 {
            // A flow that was idle starts at Global_VT (MQFQ's start tag), else the service it
            // missed while idle would be credit to monopolize the device with.
            flow.vt = flow.vt.max(global_vt);
        }
        if flow.state == FlowState::Inactive {
            self.set_state(now, &name, FlowState::Active);
        }
        self.dispatch(now);
        Ok(id)
    }

    fn admit(&self, arrival: &GpuArrival<'_>) -> Result<(), GpuReject> {
        if self.shutting_down {
            return Err(GpuReject::ShuttingDown);
        }
        if arrival.function.is_empty() || arrival.function.len() > MAX_FUNCTION_NAME {
            return Err(GpuReject::BadFunction);
        }
        if !(arrival.weight.is_finite() && arrival.weight > 0.0 && arrival.weight <= MAX_WEIGHT) {
            return Err(GpuReject::BadWeight);
        }
        if arrival.gpu_memory_mb > self.largest_gpu_mb {
            return Err(GpuReject::TooLarge {
                needed_mb: arrival.gpu_memory_mb,
                largest_mb: self.largest_gpu_mb,
            });
        }
        if self.queued >= self.config.max_queue {
            return Err(GpuReject::QueueFull {
                length: self.queued,
            });
        }
        Ok(())
    }

    /// Its caller gave up while it was queued (a dropped connection, a timeout): it leaves the
    /// queue and gets no action. `false` when it is not queued (already dispatched or unknown).
    pub fn on_cancel(&mut self, now: Micros, id: GpuInvocationId) -> bool {
        let found = self.flows.values_mut().find_map(|f| {
            let at = f.queue.iter().position(|p| p.id == id)?;
            f.queue.remove(at)
        });
        if found.is_none() {
            return false;
        }
        self.queued = self.queued.saturating_sub(1);
        self.dispatch(now);
        true
    }

    /// The invocation finished; its container is idle again (or destroyed if not reusable).
    pub fn on_completed(
        &mut self,
        now: Micros,
        id: GpuInvocationId,
        completion: GpuCompletion,
    ) -> Result<(), GpuEventError> {
        let run = self.finish(now, id)?;
        self.counters.completed += 1;
        let flow_active = match self.flows.get_mut(&run.function) {
            Some(flow) => {
                if let Some(exec) = completion.exec_us {
                    flow.note_exec(exec);
                }
                flow.state == FlowState::Active
            }
            None => false,
        };
        let capacity = self.devices[run.gpu].memory_mb;
        let mut destroy = None;
        let mut swap = false;
        if let Some(c) = self.containers.get_mut(&run.container) {
            c.busy = false;
            c.last_used = now;
            if let Some(mb) = completion.device_memory_mb {
                c.memory_mb = mb;
            }
            if !completion.reusable {
                destroy = Some(GpuDestroyReason::NotReusable);
            } else if c.memory_mb > capacity {
                destroy = Some(GpuDestroyReason::TooLarge);
            } else {
                // FCFS moves memory off after every run; the flow policies once the flow is
                // no longer active (§6.3.3). Only prefetch-swap swaps proactively.
                swap = self.config.memory == GpuMemoryPolicy::PrefetchSwap
                    && c.on_device
                    && (self.config.policy == GpuPolicy::Fcfs || !flow_active);
            }
        }
        if let Some(reason) = destroy {
            self.destroy(run.container, reason);
        } else if swap {
            self.swap(run.container);
        }
        self.fit_memory(run.gpu);
        self.dispatch(now);
        Ok(())
    }

    /// The invocation failed and its container is gone; the device, its token and the
    /// container's memory are free again.
    pub fn on_failed(&mut self, now: Micros, id: GpuInvocationId) -> Result<(), GpuEventError> {
        let run = self.finish(now, id)?;
        self.counters.failed += 1;
        self.destroy(run.container, GpuDestroyReason::Failed);
        self.dispatch(now);
        Ok(())
    }

    fn finish(&mut self, now: Micros, id: GpuInvocationId) -> Result<Running, GpuEventError> {
        let run = self
            .running
            .remove(&id)
            .ok_or(GpuEventError::UnknownInvocation(id))?;
        let dev = &mut self.devices[run.gpu];
        dev.running = dev.running.saturating_sub(1);
        if run.epoch == dev.epoch {
            dev.tracked_util = (dev.tracked_util - run.util_added).max(0.0);
        }
        if let Some(flow) = self.flows.get_mut(&run.function) {
            flow.in_flight = flow.in_flight.saturating_sub(1);
            flow.last_exec = now;
        }
        Ok(run)
    }

    /// A utilization sample of `gpu` (0..=1; the thesis samples every 200 ms). With dynamic D,
    /// D rises by one below the threshold and falls by one above it, within 1..=d_max.
    pub fn on_utilization(
        &mut self,
        now: Micros,
        gpu: usize,
        util: f64,
    ) -> Result<(), GpuEventError> {
        if !(util.is_finite() && (0.0..=1.0).contains(&util)) {
            return Err(GpuEventError::BadUtilization(util));
        }
        let threshold = self.config.util_threshold;
        let (dynamic, d_max) = (self.config.dynamic_d, self.config.d_max);
        let dev = self
            .devices
            .get_mut(gpu)
            .ok_or(GpuEventError::UnknownGpu(gpu))?;
        dev.measured_util = Some(util);
        dev.tracked_util = util;
        dev.epoch += 1;
        if dynamic {
            if util < threshold {
                dev.d = (dev.d + 1).min(d_max);
            } else if util > threshold {
                dev.d = dev.d.saturating_sub(1).max(1);
            }
        }
        self.dispatch(now);
        Ok(())
    }

    /// The driver's timer fired: expire flow TTLs and dispatch.
    pub fn on_timeout(&mut self, now: Micros) {
        self.dispatch(now);
    }

    /// When [`GpuScheduler::on_timeout`] is next due: the earliest TTL expiry of an empty,
    /// idle, still-active flow.
    pub fn next_timeout(&self) -> Option<Micros> {
        self.flows
            .values()
            .filter(|f| f.state != FlowState::Inactive && f.is_idle())
            .map(|f| f.last_exec.saturating_add(self.config.ttl_us(f.iat_us)))
            .min()
    }

    /// Rejects everything queued and every later arrival; running invocations finish.
    pub fn shutdown(&mut self) {
        self.shutting_down = true;
        let mut queued: Vec<GpuInvocationId> = Vec::with_capacity(self.queued);
        for flow in self.flows.values_mut() {
            queued.extend(flow.queue.drain(..).map(|p| p.id));
        }
        queued.sort();
        self.queued = 0;
        for invocation in queued {
            self.counters.rejects += 1;
            self.actions.push_back(GpuAction::Reject {
                invocation,
                reason: GpuReject::ShuttingDown,
            });
        }
    }

    /// The next decision, in the order made.
    pub fn poll_action(&mut self) -> Option<GpuAction> {
        self.actions.pop_front()
    }

    /// What the worker's `/metrics` shows: the queue and the devices, without the per-flow
    /// list that [`GpuScheduler::status`] builds (up to `MAX_FLOWS` names).
    pub fn gauges(&self) -> GpuGauges {
        GpuGauges {
            queued: self.queued,
            gpus: self.devices_status(),
        }
    }

    /// Every device with its containers' memory, in one pass over the containers.
    fn devices_status(&self) -> Vec<GpuDeviceStatus> {
        let mut gpus: Vec<GpuDeviceStatus> = self
            .devices
            .iter()
            .enumerate()
            .map(|(index, dev)| GpuDeviceStatus {
                index,
                d: dev.d,
                running: dev.running,
                tracked_util: dev.tracked_util,
                measured_util: dev.measured_util,
                memory_total_mb: dev.memory_mb,
                memory_resident_mb: 0,
                memory_used_mb: 0,
                containers: 0,
                containers_idle: 0,
            })
            .collect();
        for c in self.containers.values() {
            let Some(s) = gpus.get_mut(c.gpu) else {
                continue;
            };
            s.containers += 1;
            if c.on_device {
                s.memory_resident_mb += c.memory_mb;
            }
            if c.busy {
                s.memory_used_mb += c.memory_mb;
            } else {
                s.containers_idle += 1;
            }
        }
        gpus
    }

    pub fn status(&self) -> GpuStatus {
        let gpus = self.devices_status();
        let flows = self
            .flows
            .iter()
            .map(|(name, f)| GpuFlowStatus {
                function: name.to_string(),
                state: f.state,
                vt: f.vt,
                queued: f.queue.len(),
                in_flight: f.in_flight,
                ttl_us: self.config.ttl_us(f.iat_us),
                tau_us: f.tau_us,
                weight: f.weight,
                home_gpu: f.home,
            })
            .collect();
        GpuStatus {
            policy: self.config.policy,
            global_vt: self.global_vt,
            queued: self.queued,
            gpus,
            flows,
            counters: self.counters,
        }
    }

    // ---- the dispatcher (Algorithm 3) ----

    /// Updates flow states, then dispatches heads of flows until the chosen one cannot go
    /// (Algorithm 3 returns no token: the single dispatcher waits for the next event).
    fn dispatch(&mut self, now: Micros) {
        loop {
            self.update_states(now);
            let Some(name) = self.pick() else { break };
            let Some(plan) = self.place(now, &name) else {
                break;
            };
            self.execute(now, &name, plan);
        }
    }

    /// Algorithm 3's `update_state` for every flow, with Global_VT in between.
    ///
    /// Global_VT is the minimum VT over the backlogged flows (queued or in-flight work); with
    /// none, it keeps its last value. Empty flows kept Active by their TTL do not count: they
    /// have nothing to dispatch, and would hold every busy flow throttled behind them.
    fn update_states(&mut self, now: Micros) {
        let mut changes: Vec<(Arc<str>, FlowState)> = Vec::new();
        for (name, f) in &self.flows {
            if f.state != FlowState::Inactive
                && f.is_idle()
                && now.saturating_sub(f.last_exec) >= self.config.ttl_us(f.iat_us)
            {
                changes.push((name.clone(), FlowState::Inactive));
            }
        }
        for (name, state) in changes.drain(..) {
            self.set_state(now, &name, state);
        }
        if let Some(min) = self
            .flows
            .values()
            .filter(|f| !f.is_idle())
            .map(|f| f.vt)
            .min_by(f64::total_cmp)
        {
            self.global_vt = min;
        }
        let throttles = self.config.policy == GpuPolicy::MqfqSticky;
        for (name, f) in &self.flows {
            if f.state == FlowState::Inactive || f.is_idle() {
                continue; // idle flows keep their state until their TTL runs out
            }
            // The prose of §6.3.2 ("a flow's VT may be T ahead of Global_VT"), not line 22 of
            // Algorithm 3, which has the comparison reversed.
            let want = if throttles && f.vt - self.global_vt > self.config.t {
                FlowState::Throttled
            } else {
                FlowState::Active
            };
            if want != f.state {
                changes.push((name.clone(), want));
            }
        }
        for (name, state) in changes {
            self.set_state(now, &name, state);
        }
    }

    /// Moves a flow to `state` with its memory actions: an activated flow's idle containers
    /// are prefetched where there is free room; a deactivated one's are swapped out.
    fn set_state(&mut self, now: Micros, name: &Arc<str>, state: FlowState) {
        let Some(flow) = self.flows.get_mut(name) else {
            return;
        };
        let was = flow.state;
        flow.state = state;
        if was == state
            || self.config.policy == GpuPolicy::Fcfs
            || self.config.memory == GpuMemoryPolicy::Uvm
        {
            return;
        }
        let idle: Vec<ContainerId> = self
            .containers
            .iter()
            .filter(|(_, c)| !c.busy && c.function == *name)
            .map(|(id, _)| *id)
            .collect();
        for id in idle {
            if state == FlowState::Active {
                let Some(c) = self.containers.get(&id) else {
                    continue;
                };
                if !c.on_device && c.memory_mb <= self.free_mb(c.gpu) {
                    let gpu = c.gpu;
                    if let Some(c) = self.containers.get_mut(&id) {
                        c.on_device = true;
                        c.prefetched_at = Some(now);
                    }
                    self.counters.prefetches += 1;
                    self.actions
                        .push_back(GpuAction::Prefetch { container: id, gpu });
                }
            } else if self.config.memory == GpuMemoryPolicy::PrefetchSwap {
                self.swap(id);
            }
        }
    }

    /// The flow whose head goes next, per policy.
    fn pick(&mut self) -> Option<Arc<str>> {
        match self.config.policy {
            GpuPolicy::MqfqSticky => {
                // Longest queue first; with D ≠ 1 (over all devices) ties go to the flow with
                // fewest in flight (stickiness), then lowest VT, then name.
                let sticky = self.devices.iter().map(|d| d.d).sum::<u32>() != 1;
                self.flows
                    .iter()
                    .filter(|(_, f)| f.state == FlowState::Active && !f.queue.is_empty())
                    .min_by(|(an, a), (bn, b)| {
                        let key = |f: &Flow| {
                            (Reverse(f.queue.len()), if sticky { f.in_flight } else { 0 })
                        };
                        key(a)
                            .cmp(&key(b))
                            .then(a.vt.total_cmp(&b.vt))
                            .then_with(|| an.cmp(bn))
                    })
                    .map(|(n, _)| n.clone())
            }
            GpuPolicy::Fcfs => self.oldest_head(),
            GpuPolicy::Batch => {
                if let Some(cur) = &self.batch_current {
                    if self.flows.get(cur).is_some_and(|f| !f.queue.is_empty()) {
                        return Some(cur.clone());
                    }
                }
                self.batch_current = self.oldest_head();
                self.batch_current.clone()
            }
        }
    }

    /// The flow holding the oldest queued invocation (ids are in arrival order).
    fn oldest_head(&self) -> Option<Arc<str>> {
        self.flows
            .iter()
            .filter_map(|(n, f)| f.queue.front().map(|p| (p.id, n)))
            .min()
            .map(|(_, n)| n.clone())
    }

    /// Where the head of `name` can run now, if anywhere (§6.3.4):
    /// 1. an idle GPU-warm container of the function on a GPU with a free token (its home
    ///    GPU first, then the most recently used);
    /// 2. else an idle host-warm one on such a GPU whose memory can be made room for;
    /// 3. else a new container: on the function's home GPU while it still has a container
    ///    there (busy ones: wait for the home GPU rather than cold-start elsewhere), otherwise
    ///    on the GPU with the most free tokens, then free memory, then lowest index, among
    ///    those that can take it now. That GPU becomes the function's home.
    fn place(&self, now: Micros, name: &Arc<str>) -> Option<Plan> {
        let flow = self.flows.get(name)?;
        let head = flow.queue.front()?;
        let home = flow.home;
        let mut idle: Vec<(&ContainerId, &Container)> = self
            .containers
            .iter()
            .filter(|(_, c)| !c.busy && c.function == *name && self.can_dispatch(c.gpu))
            .collect();
        idle.sort_by_key(|(id, c)| (Some(c.gpu) != home, Reverse(c.last_used), **id));
        if let Some((id, c)) = idle.iter().find(|(_, c)| c.on_device) {
            let start = match c.prefetched_at {
                Some(t) if t == now => Start::HostWarm,
                _ => Start::Warm,
            };
            return Some(Plan {
                gpu: c.gpu,
                container: Some(**id),
                start,
                memory_mb: c.memory_mb,
                evict: None,
                swaps: Vec::new(),
            });
        }
        for (id, c) in &idle {
            if let Some(swaps) = self.make_room(c.gpu, c.memory_mb, 0, None) {
                return Some(Plan {
                    gpu: c.gpu,
                    container: Some(**id),
                    start: Start::HostWarm,
                    memory_mb: c.memory_mb,
                    evict: None,
                    swaps,
                });
            }
        }
        let memory_mb = head.memory_mb;
        let home_held = home.filter(|&g| {
            self.containers
                .values()
                .any(|c| c.gpu == g && c.function == *name)
        });
        let targets: Vec<usize> = match home_held {
            Some(g) => vec![g],
            None => {
                let mut all: Vec<usize> = (0..self.devices.len()).collect();
                all.sort_by_key(|&g| {
                    let dev = &self.devices[g];
                    (
                        Reverse(dev.d.saturating_sub(dev.running)),
                        Reverse(self.free_mb(g)),
                        g,
                    )
                });
                all
            }
        };
        for gpu in targets {
            if !self.can_dispatch(gpu) || self.devices[gpu].memory_mb < memory_mb {
                continue;
            }
            let count = self.containers.values().filter(|c| c.gpu == gpu).count();
            let (evict, freed) = if count < self.config.containers_per_gpu as usize {
                (None, 0)
            } else {
                match self.victim(gpu) {
                    Some((id, c)) => (Some(id), if c.on_device { c.memory_mb } else { 0 }),
                    None => continue,
                }
            };
            if let Some(swaps) = self.make_room(gpu, memory_mb, freed, evict) {
                return Some(Plan {
                    gpu,
                    container: None,
                    start: Start::Cold,
                    memory_mb,
                    evict,
                    swaps,
                });
            }
        }
        None
    }

    /// A free token on `gpu`, and (with dynamic D) tracked utilization under the threshold
    /// unless nothing runs there.
    fn can_dispatch(&self, gpu: usize) -> bool {
        let dev = &self.devices[gpu];
        dev.running < dev.d
            && (!self.config.dynamic_d
                || dev.running == 0
                || dev.tracked_util < self.config.util_threshold)
    }

    fn free_mb(&self, gpu: usize) -> u64 {
        self.devices[gpu]
            .memory_mb
            .saturating_sub(self.resident_mb(gpu))
    }

    fn resident_mb(&self, gpu: usize) -> u64 {
        self.containers
            .values()
            .filter(|c| c.gpu == gpu && c.on_device)
            .map(|c| c.memory_mb)
            .sum()
    }

    /// Eviction order among idle containers: those of flows that are not active first, then
    /// least recently used, then oldest id.
    fn eviction_key(&self, id: ContainerId, c: &Container) -> (bool, Micros, ContainerId) {
        let active = self
            .flows
            .get(&c.function)
            .is_some_and(|f| f.state == FlowState::Active);
        (active, c.last_used, id)
    }

    /// Order in which idle memory leaves a device for room: the scheduler's own swaps know
    /// flows ([`Self::eviction_key`]); the driver's on-demand eviction is plain LRU.
    fn reclaim_key(&self, id: ContainerId, c: &Container) -> (bool, Micros, ContainerId) {
        match self.config.memory {
            GpuMemoryPolicy::PrefetchSwap => self.eviction_key(id, c),
            GpuMemoryPolicy::PrefetchOnly | GpuMemoryPolicy::Uvm => (false, c.last_used, id),
        }
    }

    /// The idle container on `gpu` the container cap gives up.
    fn victim(&self, gpu: usize) -> Option<(ContainerId, &Container)> {
        self.containers
            .iter()
            .filter(|(_, c)| c.gpu == gpu && !c.busy)
            .min_by_key(|(id, c)| self.eviction_key(**id, c))
            .map(|(id, c)| (*id, c))
    }

    /// The idle GPU-warm containers to swap out so that `needed_mb` more fits on `gpu`
    /// (`freed_mb` is freed anyway by destroying `skip`), or `None` if even all of them
    /// would not do. Under UVM never `None`: the driver oversubscribes, so it evicts what
    /// idle memory there is and the run goes anyway.
    fn make_room(
        &self,
        gpu: usize,
        needed_mb: u64,
        freed_mb: u64,
        skip: Option<ContainerId>,
    ) -> Option<Vec<ContainerId>> {
        let mut free = self.free_mb(gpu) + freed_mb;
        if free >= needed_mb {
            return Some(Vec::new());
        }
        let mut swappable: Vec<(ContainerId, &Container)> = self
            .containers
            .iter()
            .filter(|(id, c)| c.gpu == gpu && !c.busy && c.on_device && Some(**id) != skip)
            .map(|(id, c)| (*id, c))
            .collect();
        swappable.sort_by_key(|(id, c)| self.reclaim_key(*id, c));
        let mut swaps = Vec::new();
        for (id, c) in swappable {
            swaps.push(id);
            free += c.memory_mb;
            if free >= needed_mb {
                return Some(swaps);
            }
        }
        (self.config.memory == GpuMemoryPolicy::Uvm).then_some(swaps)
    }

    fn execute(&mut self, now: Micros, name: &Arc<str>, plan: Plan) {
        if let Some(victim) = plan.evict {
            self.destroy(victim, GpuDestroyReason::PoolFull);
        }
        let mut evict_mb = 0u64;
        for id in plan.swaps {
            evict_mb = evict_mb.saturating_add(self.reclaim(id));
        }
        let host_warm = plan.start == Start::HostWarm;
        let uvm = self.config.memory == GpuMemoryPolicy::Uvm;
        let paging = GpuPaging {
            prefetch_mb: if host_warm && !uvm { plan.memory_mb } else { 0 },
            fault_in_mb: if host_warm && uvm { plan.memory_mb } else { 0 },
            evict_mb,
        };
        let container = match plan.container {
            Some(id) => id,
            None => {
                let id = ContainerId(self.next_container);
                self.next_container += 1;
                self.containers.insert(
                    id,
                    Container {
                        function: name.clone(),
                        gpu: plan.gpu,
                        memory_mb: plan.memory_mb,
                        on_device: true,
                        busy: false,
                        last_used: now,
                        prefetched_at: None,
                    },
                );
                id
            }
        };
        if let Some(c) = self.containers.get_mut(&container) {
            c.busy = true;
            c.on_device = true;
            c.last_used = now;
        }
        let uniform = self.config.uniform_cost;
        let Some(flow) = self.flows.get_mut(name) else {
            return;
        };
        let Some(head) = flow.queue.pop_front() else {
            return;
        };
        self.queued -= 1;
        flow.in_flight += 1;
        flow.vt += flow.cost(uniform);
        flow.last_exec = now;
        if flow.home.is_none() || plan.start == Start::Cold {
            flow.home = Some(plan.gpu);
        }
        let dev = &mut self.devices[plan.gpu];
        dev.running += 1;
        let util_added = 1.0 / f64::from(dev.d);
        dev.tracked_util += util_added;
        self.running.insert(
            head.id,
            Running {
                function: name.clone(),
                container,
                gpu: plan.gpu,
                util_added,
                epoch: dev.epoch,
            },
        );
        match plan.start {
            Start::Warm => self.counters.dispatched_warm += 1,
            Start::HostWarm => self.counters.dispatched_host_warm += 1,
            Start::Cold => self.counters.dispatched_cold += 1,
        }
        self.actions.push_back(GpuAction::Dispatch {
            function: name.clone(),
            placement: GpuPlacement {
                invocation: head.id,
                gpu: plan.gpu,
                container,
                start: plan.start,
                queued_us: now.saturating_sub(head.arrival),
                memory_mb: plan.memory_mb,
                paging,
            },
        });
    }

    /// Takes an idle container's memory off its device for room: a Swap under prefetch-swap
    /// (asynchronous, nothing on the critical path), otherwise the driver's on-demand eviction,
    /// whose size is returned for the dispatch that needed it.
    fn reclaim(&mut self, id: ContainerId) -> u64 {
        if self.config.memory == GpuMemoryPolicy::PrefetchSwap {
            self.swap(id);
            return 0;
        }
        match self.containers.get_mut(&id) {
            Some(c) if c.on_device && !c.busy => {
                c.on_device = false;
                self.counters.evictions += 1;
                c.memory_mb
            }
            _ => 0,
        }
    }

    fn swap(&mut self, id: ContainerId) {
        if let Some(c) = self.containers.get_mut(&id) {
            if c.on_device && !c.busy {
                c.on_device = false;
                self.counters.swaps += 1;
                self.actions.push_back(GpuAction::Swap {
                    container: id,
                    gpu: c.gpu,
                });
            }
        }
    }

    fn destroy(&mut self, id: ContainerId, reason: GpuDestroyReason) {
        if let Some(c) = self.containers.remove(&id) {
            self.counters.destroys += 1;
            self.actions.push_back(GpuAction::Destroy {
                container: id,
                gpu: c.gpu,
                reason,
            });
        }
    }

    /// Swaps idle containers out (eviction order) until resident memory fits `gpu` again,
    /// after a shim reported a container grew (without swapping: counts them evicted).
    fn fit_memory(&mut self, gpu: usize) {
        let over = self
            .resident_mb(gpu)
            .saturating_sub(self.devices[gpu].memory_mb);
        if over == 0 {
            return;
        }
        let capacity = self.devices[gpu].memory_mb;
        let mut idle: Vec<ContainerId> = self
            .containers
            .iter()
            .filter(|(_, c)| c.gpu == gpu && !c.busy && c.on_device)
            .map(|(id, _)| *id)
            .collect();
        idle.sort_by_key(|id| self.containers.get(id).map(|c| self.reclaim_key(*id, c)));
        for id in idle {
            if self.resident_mb(gpu) <= capacity {
                break;
            }
            // Without swapping, the driver already evicted them when the container grew.
            let _ = self.reclaim(id);
        }
    }

    /// Drops flows that hold nothing (inactive, empty, no container) to make room for new ones.
    fn forget_idle_flows(&mut self) {
        let holders: std::collections::BTreeSet<Arc<str>> = self
            .containers
            .values()
            .map(|c| c.function.clone())
            .collect();
        self.flows.retain(|name, f| {
            f.state != FlowState::Inactive || !f.is_idle() || holders.contains(name)
        });
        if self
            .batch_current
            .as_ref()
            .is_some_and(|n| !self.flows.contains_key(n))
        {
            self.batch_current = None;
        }
    }
}
