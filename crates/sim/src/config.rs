//! What a simulation is configured with: the cluster, each worker's engine, the balancer and the
//! model's own parameters.

use crate::closed_loop::ClosedLoop;
use crate::contention::Server;
use crate::cpu_model::{CpuConfig, CpuSched};
use crate::error::{Result, SimError};
use hearth_core::autoscale::AutoscaleParams;
use hearth_core::balance::{BalanceKind, BalanceParams};
use hearth_core::bypass::BypassConfig;
use hearth_core::pool::{GenericConfig, PoolConfig};
use hearth_core::proactive::AtollConfig;
use hearth_core::provision::{CurveSource, ElasticConfig};
use hearth_core::time::secs;
use hearth_core::{
    EngineConfig, KeepAliveConfig, KeepAliveKind, LoadSource, Micros, QueueDiscipline,
    RegulatorConfig,
};

/// Who places invocations on workers.
#[derive(Debug, Clone, PartialEq)]
pub enum Routing {
    /// The controller's policy object, [`hearth_core::balance::Balancer`].
    Balancer(BalanceKind, BalanceParams),
    /// The CH-RLU paper's omniscient online greedy baseline (§6.3), which only a simulator can
    /// run: the server with the lowest expected time, knowing every worker's warm sandboxes.
    Greedy,
    /// Atoll's load balancer and group sandbox managers ([`hearth_core::proactive::Atoll`]),
    /// ticked every `interval_us` with its commands carried out on the workers' engines.
    Atoll(AtollConfig),
}

impl Routing {
    /// One of the controller's policies with its default parameters and `seed`.
    pub fn seeded(kind: BalanceKind, seed: u64) -> Self {
        Routing::Balancer(
            kind,
            BalanceParams {
                seed,
                ..BalanceParams::default()
            },
        )
    }

    pub fn name(&self) -> &'static str {
        match self {
            Routing::Balancer(k, _) => k.as_str(),
            Routing::Greedy => "greedy",
            Routing::Atoll(c) => match c.ladder {
                hearth_core::proactive::Ladder::Gfr => "atoll:gfr",
                hearth_core::proactive::Ladder::Gdr => "atoll:gdr",
                hearth_core::proactive::Ladder::Gdpi => "atoll:gdpi",
                hearth_core::proactive::Ladder::Atoll => "atoll:atoll",
                hearth_core::proactive::Ladder::DAtoll => "atoll:d-atoll",
            },
        }
    }
}

/// One simulated cluster.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub workers: usize,
    /// CPUs of each worker: processor sharing divides them among running invocations.
    pub cpus: u32,
    /// Each worker's memory budget for sandboxes (MiB).
    pub memory_mb: u64,
    pub free_buffer_mb: u64,
    pub queue: QueueDiscipline,
    pub max_queue: usize,
    pub regulator: RegulatorConfig,
    pub bypass: BypassConfig,
    pub keepalive: KeepAliveConfig,
    pub routing: Routing,
    /// How often each worker pushes its status to the balancer (its load is that stale).
    pub status_interval_us: Micros,
    /// Workers wait for a busy sandbox rather than start one when that is expected sooner.
    pub warm_wait: bool,
    /// Pre-made generic sandboxes that cold starts specialize (off by default).
    pub generic: GenericConfig,
    /// How long making a sandbox takes, and so what a cold start saves by specializing a
    /// generic one: its init becomes the function's init minus this (measured with runc on
    /// the 2-CPU VM, `bench/RESULTS.md`).
    pub generic_create_us: Micros,
    /// Share of each worker's memory reserved for Atoll's proactive pool when the routing is
    /// Atoll with a proactive rung (GDPI, Atoll, D-Atoll); 0 otherwise.
    pub proactive_share: f64,
    /// Each worker's CPU model: processor sharing (the default) or a time-sliced scheduler.
    pub cpu: CpuConfig,
    /// Processor sharing as the idealized server (the default), or with the interference
    /// measured on runc ([`crate::contention`]): overcommit overhead, creations that slow
    /// each other and take CPU. Needs `cpu.sched` = ps.
    pub server: Server,
    /// Spread of each invocation's CPU work around its function's warm time: the work is
    /// `warm × (1 + work_spread × u)`, u uniform in [−1, 1) drawn per invocation from
    /// `work_seed` and its id (0: every invocation takes exactly the warm time).
    pub work_spread: f64,
    pub work_seed: u64,
    /// Elastic provisioning (thesis §3.4.2): each worker's memory budget follows its own
    /// [`hearth_core::provision::ElasticController`], starting from `memory_mb`.
    pub elastic: Option<SimElastic>,
    /// Horizontal autoscaling: the cluster starts with `workers` and the core's autoscaler
    /// adds and drains workers during the run (None: a fixed cluster).
    pub autoscale: Option<SimAutoscale>,
    /// Closed-loop clients issue the invocations instead of the workload's arrivals (which
    /// must then be empty); None: the workload's open-loop arrivals.
    pub clients: Option<ClosedLoop>,
}

/// The elastic controller of each simulated worker and the curve it reads.
#[derive(Debug, Clone)]
pub struct SimElastic {
    pub config: ElasticConfig,
    pub curve: CurveSource,
}

/// The simulated cluster's autoscaling: the controller's very [`AutoscaleParams`], how often it
/// looks, and how long a worker it adds takes to come up.
#[derive(Debug, Clone, PartialEq)]
pub struct SimAutoscale {
    pub params: AutoscaleParams,
    /// How often the autoscaler reads the workers' last reported loads.
    pub interval_us: Micros,
    /// From the decision to the new worker joining the balancer (a VM or process start).
    pub start_us: Micros,
}

impl SimAutoscale {
    /// `params`, looking every second, workers up 10 s after the decision.
    pub fn new(params: AutoscaleParams) -> Self {
        SimAutoscale {
            params,
            interval_us: secs(1),
            start_us: secs(10),
        }
    }
}

/// Longest autoscaler interval and worker start time the simulator accepts (an hour).
const MAX_AUTOSCALE_US: Micros = 3_600_000_000;

/// Atoll's keep-alive for reactive sandboxes (Table 1: 15 minutes).
pub const ATOLL_TTL_US: Micros = 15 * 60 * 1_000_000;
/// The proactive pool's default share of a worker's memory.
pub const PROACTIVE_SHARE: f64 = 0.5;

/// Sandbox creation measured with runc here: a cold start of 47 ms of which the handler's
/// import and the agent's start-up inside a made sandbox are under 10 ms.
pub const GENERIC_CREATE_US: Micros = 40_000;

impl Default for SimConfig {
    /// The CH-RLU paper's cluster (8 × 16 CPUs, 32 GB) with the worker's and controller's own
    /// defaults: EEDF, concurrency = CPUs, TTL keep-alive, CH-RLU, status every second.
    fn default() -> Self {
        SimConfig {
            workers: 8,
            cpus: 16,
            memory_mb: 32 * 1024,
            free_buffer_mb: 256,
            queue: QueueDiscipline::Eedf,
            max_queue: 10_000,
            regulator: RegulatorConfig::Fixed(16),
            bypass: BypassConfig::default(),
            keepalive: KeepAliveConfig::default(),
            routing: Routing::Balancer(BalanceKind::ChRlu, BalanceParams::default()),
            status_interval_us: secs(1),
            warm_wait: false,
            generic: GenericConfig::OFF,
            generic_create_us: GENERIC_CREATE_US,
            proactive_share: PROACTIVE_SHARE,
            cpu: CpuConfig::default(),
            server: Server::Ps,
            work_spread: 0.0,
            work_seed: 0,
            elastic: None,
            autoscale: None,
            clients: None,
        }
    }
}

impl SimConfig {
    /// Refuses settings that cannot work.
    pub fn check(&self) -> Result<()> {
        let bad = |m: &str| Err(SimError::Config(m.to_string()));
        if self.workers == 0 {
            return bad("--workers must be at least 1");
        }
        if self.cpus == 0 {
            return bad("--cpus must be at least 1");
        }
        if self.memory_mb < 16 {
            return bad("--memory must be at least 16 MiB");
        }
        if self.free_buffer_mb >= self.memory_mb {
            return bad("the free-memory buffer must be smaller than the memory");
        }
        if self.max_queue == 0 {
            return bad("--max-queue must be at least 1");
        }
        if self.status_interval_us == 0 {
            return bad("--status-interval must be positive");
        }
        if !(self.proactive_share.is_finite() && (0.0..=0.95).contains(&self.proactive_share)) {
            return bad("--proactive-share must be between 0 and 0.95");
        }
        match &self.routing {
            Routing::Balancer(_, params) => params.check()?,
            Routing::Atoll(c) => {
                c.validate()
                    .map_err(|e| SimError::Config(format!("atoll: {e}")))?;
                if c.ladder.proactive() && self.proactive_mb() == 0 {
                    return bad("a proactive ladder rung needs --proactive-share above 0");
                }
            }
            Routing::Greedy => {}
        }
        if let Some(e) = &self.elastic {
            e.config
                .validate()
                .map_err(|e| SimError::Config(format!("elastic provisioning: {e}")))?;
        }
        if !(self.work_spread.is_finite() && (0.0..=0.9).contains(&self.work_spread)) {
            return bad("the work spread must be between 0 and 0.9");
        }
        if let Some(a) = &self.autoscale {
            a.params
                .check()
                .map_err(|e| SimError::Config(e.to_string()))?;
            if !matches!(self.routing, Routing::Balancer(..)) {
                return bad("autoscaling needs one of the controller's balancing policies");
            }
            if !(1..=MAX_AUTOSCALE_US).contains(&a.interval_us) {
                return bad("the autoscale interval must be between 1 µs and an hour");
            }
            if a.start_us > MAX_AUTOSCALE_US {
                return bad("the worker start time must be at most an hour");
            }
        }
        if let Some(c) = self.server.contention() {
            c.check()?;
            if self.cpu.sched != CpuSched::Ps {
                return bad("--server contention needs --cpu-sched ps");
            }
        }
        self.cpu.check()
    }

    /// A cluster of `workers` workers of `cpus` CPUs and `memory_mb` each set up as Atoll's
    /// Table 1 describes the rung `atoll.ladder`: its queue discipline (FIFO for GFR, SRSF
    /// above), reactive sandboxes kept 15 minutes, one invocation per CPU at a time (the rest
    /// wait in the worker's queue) and, for proactive rungs, half the memory for the
    /// proactive pool.
    pub fn atoll(workers: usize, cpus: u32, memory_mb: u64, atoll: AtollConfig) -> Self {
        SimConfig {
            workers,
            cpus,
            memory_mb,
            queue: atoll.ladder.queue(),
            regulator: RegulatorConfig::Fixed(cpus),
            keepalive: KeepAliveConfig {
                ttl: ATOLL_TTL_US,
                ..KeepAliveConfig::new(KeepAliveKind::Ttl)
            },
            routing: Routing::Atoll(atoll),
            ..SimConfig::default()
        }
    }

    /// The CPU work of invocation `id` of a function whose warm time is `warm_us` (see
    /// [`SimConfig::work_spread`]); deterministic, so an experiment can recompute it.
    pub fn work_us(&self, id: u32, warm_us: Micros) -> Micros {
        if self.work_spread == 0.0 {
            return warm_us;
        }
        // SplitMix64 of (seed, id): one well-mixed draw per invocation, no state.
        let mut z = self
            .work_seed
            .wrapping_add(u64::from(id).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let u = (z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
        (warm_us as f64 * (1.0 + self.work_spread * u))
            .round()
            .max(1.0) as Micros
    }

    /// Each worker's proactive pool (MiB): the share of memory under a proactive Atoll rung,
    /// else 0.
    pub fn proactive_mb(&self) -> u64 {
        match &self.routing {
            Routing::Atoll(c) if c.ladder.proactive() => {
                (self.memory_mb as f64 * self.proactive_share).floor() as u64
            }
            _ => 0,
        }
    }

    /// The engine configuration of every worker, built as the real worker builds it for its
    /// `sim` backend (simulated load average).
    pub fn engine(&self) -> EngineConfig {
        EngineConfig {
            pool: PoolConfig {
                memory_budget_mb: self.memory_mb,
                free_buffer_mb: self.free_buffer_mb,
                keepalive: self.keepalive.clone(),
                generic: self.generic.clone(),
                // Atoll's proactive pool, reserved inside the budget (0 unless proactive).
                proactive_mb: self.proactive_mb(),
            },
            queue: self.queue,
            max_queue: self.max_queue,
            regulator: self.regulator.clone(),
            bypass: self.bypass,
            cpus: self.cpus,
            load_source: LoadSource::Simulated,
            warm_wait: self.warm_wait,
        }
    }
}
