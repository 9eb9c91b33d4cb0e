//! One server with G simulated GPUs and C CPU cores (the thesis' testbed, §6.5), as a
//! deterministic discrete-event loop over virtual time.
//!
//! The GPU side is the worker's own scheduler, [`hearth_core::gpu::GpuScheduler`]: arrivals,
//! completions, utilization samples and TTL timers go in with the virtual time, dispatches come
//! out. The device is [`hearth_core::gpu::SimGpuModel`]:
//! * a run takes the function's Table 6.1 warm GPU time, stretched by the invocations running
//!   on its GPU at dispatch (itself included; fixed for the run);
//! * a cold start first pays Table 6.1's cold − warm time (at least the model's GPU
//!   container start);
//! * every dispatch then pays the memory movement its [`hearth_core::gpu::GpuPaging`] names:
//!   a host-warm start's bulk prefetch over PCIe, or under stock UVM its pages faulted in on
//!   demand (slower), plus what the driver evicted on demand for it (prefetch-only, UVM);
//! * `Prefetch` and `Swap` are asynchronous in the real system (`cuMemPrefetchAsync`) and cost
//!   the critical path nothing here;
//! * every 200 ms each GPU reports the sum of its running invocations' solo shares (at most
//!   1), which drives dynamic D.
//!
//! The CPU side runs on C cores, first come first served, each invocation taking the
//! function's Table 6.1 CPU warm time (CPU containers are assumed warm: 48 cores and CPU
//! memory are not the constraint studied). What goes where is the [`Placement`]: everything on
//! the GPUs, everything on the CPUs, or the speedup dispatch of §6.5.2
//! ([`hearth_core::gpu::CpuGpuDispatch`], seeded with Table 6.1's speedups as the thesis'
//! offline profile).

use super::workload::GpuWorkload;
use crate::error::{Result, SimError};
use hearth_core::gpu::{
    CpuGpuDispatch, Device, DispatchConfig, GpuAction, GpuArrival, GpuCompletion, GpuCounters,
    GpuInvocationId, GpuPlacement, GpuSchedConfig, GpuScheduler, SimGpuModel, Start,
};
use hearth_core::Micros;
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

/// Utilization sampling period (§6.3.4: 200 ms).
pub const SAMPLE_US: Micros = 200_000;
/// Most CPU cores.
pub const MAX_CPUS: u32 = 4096;

/// Which device runs the invocations.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// Every invocation on the GPUs.
    Gpu,
    /// Every invocation on the CPU cores.
    Cpu,
    /// Polymorphic functions: the speedup dispatch chooses per invocation.
    Hybrid(DispatchConfig),
}

/// The server.
#[derive(Debug, Clone)]
pub struct GpuServerConfig {
    /// The GPU scheduler (its `gpus` are the server's GPUs).
    pub sched: GpuSchedConfig,
    pub model: SimGpuModel,
    /// CPU cores for CPU-side runs (the thesis' server: 48).
    pub cpus: u32,
    pub placement: Placement,
}

impl Default for GpuServerConfig {
    fn default() -> Self {
        GpuServerConfig {
            sched: GpuSchedConfig::default(),
            model: SimGpuModel::default(),
            cpus: 48,
            placement: Placement::Gpu,
        }
    }
}

/// How an invocation got its container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StartKind {
    Warm,
    HostWarm,
    Cold,
}

/// Where an invocation ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ran {
    Gpu(usize),
    Cpu,
    /// The scheduler refused it (queue full, too large).
    Rejected,
}

/// One invocation's outcome (times in µs of virtual time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GpuRecord {
    /// Index into the workload's functions.
    pub function: u32,
    pub arrival_us: Micros,
    /// Dispatch (container chosen, or CPU core taken).
    pub start_us: Micros,
    pub end_us: Micros,
    pub queue_us: Micros,
    /// Cold start and memory movement (prefetch, fault-in, on-demand eviction) of the run.
    pub setup_us: Micros,
    /// The run itself, interference included.
    pub exec_us: Micros,
    pub start: StartKind,
    pub ran: Ran,
}

impl GpuRecord {
    pub fn latency_us(&self) -> Micros {
        self.end_us - self.arrival_us
    }
}

/// A finished simulation.
#[derive(Debug, Clone)]
pub struct GpuRun {
    /// One per arrival, in arrival order.
    pub records: Vec<GpuRecord>,
    pub counters: GpuCounters,
    /// Mean of the utilization samples over the run, per GPU.
    pub mean_util: Vec<f64>,
    /// Mean D over the samples, per GPU.
    pub mean_d: Vec<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    // Order within one instant: completions free tokens before samples, timers and arrivals.
    GpuDone(u64),
    CpuDone(usize),
    Sample,
    Timer,
    Arrival(usize),
}

struct Running {
    arrival: usize,
    gpu: usize,
    share: f64,
}

/// Runs `w` on the server `c`; the same inputs give the same records.
pub fn simulate_gpu(w: &GpuWorkload, c: &GpuServerConfig) -> Result<GpuRun> {
    c.model
        .check()
        .map_err(|e| SimError::Config(e.to_string()))?;
    if !(1..=MAX_CPUS).contains(&c.cpus) {
        return Err(SimError::Config(format!("cpus must be 1 to {MAX_CPUS}")));
    }
    let gpus = c.sched.gpus.len();
    let mut sched =
        GpuScheduler::new(c.sched.clone()).map_err(|e| SimError::Config(e.to_string()))?;
    let mut dispatch = match c.placement {
        Placement::Hybrid(d) => {
            let mut h = CpuGpuDispatch::new(d).map_err(|e| SimError::Config(e.to_string()))?;
            for f in &w.functions {
                h.seed_speedup(&f.name, f.profile.speedup())
                    .map_err(|e| SimError::Config(e.to_string()))?;
            }
            Some(h)
        }
        _ => None,
    };
    let mut records: Vec<Option<GpuRecord>> = vec![None; w.arrivals.len()];
    let mut events: BinaryHeap<Reverse<(Micros, Event, u64)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push =
        |events: &mut BinaryHeap<Reverse<(Micros, Event, u64)>>, at: Micros, e: Event| {
            seq += 1;
            events.push(Reverse((at, e, seq)));
        };
    for (i, a) in w.arrivals.iter().enumerate() {
        push(&mut events, a.at_us, Event::Arrival(i));
    }
    let use_gpu = c.placement != Placement::Cpu;
    if use_gpu {
        push(&mut events, SAMPLE_US, Event::Sample);
    }
    let mut ids: HashMap<GpuInvocationId, usize> = HashMap::new();
    let mut running: HashMap<u64, Running> = HashMap::new();
    let mut on_gpu: Vec<u32> = vec![0; gpus];
    let mut cpu_queue: VecDeque<usize> = VecDeque::new();
    let mut cpu_free = c.cpus;
    let mut cpu_running: Vec<Option<usize>> = vec![None; c.cpus as usize];
    let mut outstanding = 0usize;
    let mut arrivals_left = w.arrivals.len();
    let mut armed: Option<Micros> = None;
    let (mut util_sum, mut d_sum, mut samples) = (vec![0.0; gpus], vec![0.0; gpus], 0u64);
    let mut now: Micros = 0;
    while let Some(Reverse((at, event, _))) = events.pop() {
        now = at;
        match event {
            Event::Arrival(i) => {
                arrivals_left -= 1;
                outstanding += 1;
                let f = &w.functions[w.arrivals[i].function as usize];
                let device = match (&dispatch, c.placement) {
                    (_, Placement::Cpu) => Device::Cpu,
                    (Some(d), Placement::Hybrid(_)) => d.choose(&f.name),
                    _ => Device::Gpu,
                };
                if device == Device::Cpu {
                    cpu_queue.push_back(i);
                } else {
                    let arrival = GpuArrival {
                        function: &f.name,
                        weight: 1.0,
                        gpu_memory_mb: f.profile.memory_mb,
                    };
                    match sched.on_arrival(now, arrival) {
                        Ok(id) => {
                            ids.insert(id, i);
                        }
                        Err(_) => {
                            outstanding -= 1;
                            records[i] = Some(rejected(w, i, now));
                        }
                    }
                }
            }
            Event::GpuDone(inv) => {
                let r = running.remove(&inv).ok_or_else(|| {
                    SimError::Internal(format!("GPU invocation {inv} finished twice"))
                })?;
                on_gpu[r.gpu] -= 1;
                outstanding -= 1;
                let exec_us = records[r.arrival].map(|rec| rec.exec_us);
                let completion = GpuCompletion {
                    exec_us,
                    reusable: true,
                    device_memory_mb: None,
                };
                sched
                    .on_completed(now, GpuInvocationId(inv), completion)
                    .map_err(|e| SimError::Internal(e.to_string()))?;
                if let (Some(d), Some(e)) = (dispatch.as_mut(), exec_us) {
                    let f = &w.functions[w.arrivals[r.arrival].function as usize];
                    d.record(&f.name, Device::Gpu, e)
                        .map_err(|e| SimError::Internal(e.to_string()))?;
                }
            }
            Event::CpuDone(core) => {
                let i = cpu_running[core]
                    .take()
                    .ok_or_else(|| SimError::Internal(format!("CPU core {core} finished idle")))?;
                cpu_free += 1;
                outstanding -= 1;
                if let (Some(d), Some(rec)) = (dispatch.as_mut(), records[i]) {
                    let f = &w.functions[w.arrivals[i].function as usize];
                    d.record(&f.name, Device::Cpu, rec.exec_us)
                        .map_err(|e| SimError::Internal(e.to_string()))?;
                }
            }
            Event::Sample => {
                samples += 1;
                for g in 0..gpus {
                    let shares: Vec<f64> = running
                        .values()
                        .filter(|r| r.gpu == g)
                        .map(|r| r.share)
                        .collect();
                    let util = c.model.utilization(&shares);
                    util_sum[g] += util;
                    sched
                        .on_utilization(now, g, util)
                        .map_err(|e| SimError::Internal(e.to_string()))?;
                    d_sum[g] += f64::from(sched.parallelism(g));
                }
                if arrivals_left > 0 || outstanding > 0 {
                    push(&mut events, now + SAMPLE_US, Event::Sample);
                }
            }
            Event::Timer => {
                if armed == Some(now) {
                    armed = None;
                    sched.on_timeout(now);
                }
            }
        }
        // The scheduler's decisions.
        while let Some(action) = sched.poll_action() {
            match action {
                GpuAction::Dispatch { placement, .. } => {
                    let GpuPlacement {
                        invocation,
                        gpu,
                        start,
                        queued_us,
                        paging,
                        ..
                    } = placement;
                    let i = ids.remove(&invocation).ok_or_else(|| {
                        SimError::Internal(format!("unknown dispatch {invocation:?}"))
                    })?;
                    let p = &w.functions[w.arrivals[i].function as usize].profile;
                    on_gpu[gpu] += 1;
                    let kind = match start {
                        Start::Warm => StartKind::Warm,
                        Start::HostWarm => StartKind::HostWarm,
                        Start::Cold => StartKind::Cold,
                    };
                    let (setup_us, exec_us) = c.model.run_us(
                        start,
                        p.cold_extra_us(c.model.gpu_init_us),
                        &paging,
                        p.gpu_warm_us(),
                        on_gpu[gpu],
                    );
                    let end_us = now + setup_us + exec_us;
                    records[i] = Some(GpuRecord {
                        function: w.arrivals[i].function,
                        arrival_us: w.arrivals[i].at_us,
                        start_us: now,
                        end_us,
                        queue_us: queued_us,
                        setup_us,
                        exec_us,
                        start: kind,
                        ran: Ran::Gpu(gpu),
                    });
                    running.insert(
                        invocation.0,
                        Running {
                            arrival: i,
                            gpu,
                            share: p.solo_util,
                        },
                    );
                    push(&mut events, end_us, Event::GpuDone(invocation.0));
                }
                GpuAction::Reject { invocation, .. } => {
                    if let Some(i) = ids.remove(&invocation) {
                        outstanding -= 1;
                        records[i] = Some(rejected(w, i, now));
                    }
                }
                GpuAction::Prefetch { .. } | GpuAction::Swap { .. } | GpuAction::Destroy { .. } => {
                }
            }
        }
        // CPU cores, first come first served.
        while cpu_free > 0 {
            let Some(i) = cpu_queue.pop_front() else {
                break;
            };
            let core = cpu_running
                .iter()
                .position(Option::is_none)
                .ok_or_else(|| SimError::Internal("no free CPU core".into()))?;
            cpu_free -= 1;
            cpu_running[core] = Some(i);
            let p = &w.functions[w.arrivals[i].function as usize].profile;
            let exec_us = p.cpu_warm_us();
            records[i] = Some(GpuRecord {
                function: w.arrivals[i].function,
                arrival_us: w.arrivals[i].at_us,
                start_us: now,
                end_us: now + exec_us,
                queue_us: now - w.arrivals[i].at_us,
                setup_us: 0,
                exec_us,
                start: StartKind::Warm,
                ran: Ran::Cpu,
            });
            push(&mut events, now + exec_us, Event::CpuDone(core));
        }
        // One timer for the scheduler's flow TTLs.
        if let Some(t) = sched.next_timeout() {
            let t = if t <= now && event == Event::Timer {
                now + 1
            } else {
                t.max(now)
            };
            if armed != Some(t) {
                armed = Some(t);
                push(&mut events, t, Event::Timer);
            }
        }
        if arrivals_left == 0 && outstanding == 0 {
            break;
        }
    }
    if outstanding > 0 || arrivals_left > 0 {
        return Err(SimError::Stalled {
            at_s: now as f64 / 1e6,
            outstanding,
        });
    }
    let records = records
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| SimError::Internal("an invocation has no record".into()))?;
    let n = samples.max(1) as f64;
    Ok(GpuRun {
        records,
        counters: sched.status().counters,
        mean_util: util_sum.iter().map(|u| u / n).collect(),
        mean_d: d_sum.iter().map(|d| d / n).collect(),
    })
}

fn rejected(w: &GpuWorkload, i: usize, now: Micros) -> GpuRecord {
    GpuRecord {
        function: w.arrivals[i].function,
        arrival_us: w.arrivals[i].at_us,
        start_us: now,
        end_us: now,
        queue_us: 0,
        setup_us: 0,
        exec_us: 0,
        start: StartKind::Cold,
        ran: Ran::Rejected,
    }
}
