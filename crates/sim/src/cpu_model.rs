//! Which CPU model a simulated worker has: processor sharing (the default, [`crate::cpu`]) or
//! a time-sliced scheduler ([`crate::cpu_quantum`]) under CFS, FIFO, SRPT, SFS or ALPS.

use crate::contention::Contention;
use crate::cpu::ProcessorSharing;
use crate::cpu_quantum::{CpuStats, Discipline, QuantumCpu, QuantumParams};
use crate::error::{Result, SimError};
use hearth_core::cpu_sched::{CpuSchedConfig, CpuSchedKind, CpuScheduler};
use hearth_core::Micros;
use std::sync::Arc;

/// The CPU scheduler a simulated worker runs (`hearth sim --cpu-sched`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuSched {
    /// Egalitarian processor sharing: the fluid ideal of fair sharing, no slices, no switches.
    #[default]
    Ps,
    /// CFS-like fair sharing in time slices.
    Cfs,
    /// First come, first served, each to its end.
    Fifo,
    /// Shortest remaining processing time (an oracle: it knows each invocation's work).
    Srpt,
    /// SFS: FIFO within one slice, then fair sharing.
    Sfs,
    /// ALPS: the learned rank and slice, then fair sharing.
    Alps,
}

impl CpuSched {
    pub const ALL: [CpuSched; 6] = [
        CpuSched::Ps,
        CpuSched::Cfs,
        CpuSched::Fifo,
        CpuSched::Srpt,
        CpuSched::Sfs,
        CpuSched::Alps,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CpuSched::Ps => "ps",
            CpuSched::Cfs => "cfs",
            CpuSched::Fifo => "fifo",
            CpuSched::Srpt => "srpt",
            CpuSched::Sfs => "sfs",
            CpuSched::Alps => "alps",
        }
    }
}

impl std::fmt::Display for CpuSched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for CpuSched {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        CpuSched::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                format!("unknown CPU scheduler {s:?} (expected ps, cfs, fifo, srpt, sfs or alps)")
            })
    }
}

/// The CPU model of every simulated worker.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuConfig {
    pub sched: CpuSched,
    /// The time-sliced models' constants (ignored by `ps`).
    pub params: QuantumParams,
    /// SFS' and ALPS' settings (their `kind` is set from `sched`).
    pub frontend: CpuSchedConfig,
}

impl Default for CpuConfig {
    fn default() -> Self {
        CpuConfig {
            sched: CpuSched::Ps,
            params: QuantumParams::default(),
            frontend: CpuSchedConfig::default(),
        }
    }
}

impl CpuConfig {
    /// `sched` with the default constants.
    pub fn new(sched: CpuSched) -> Self {
        CpuConfig {
            sched,
            ..CpuConfig::default()
        }
    }

    pub fn check(&self) -> Result<()> {
        let bad = |m: &str| Err(SimError::Config(m.to_string()));
        let p = &self.params;
        if !(1_000..=1_000_000).contains(&p.latency_us) {
            return bad("the CFS latency must be between 1 ms and 1 s");
        }
        if !(100..=p.latency_us).contains(&p.min_granularity_us) {
            return bad("the CFS minimum granularity must be between 100 µs and the latency");
        }
        if p.wakeup_granularity_us > p.latency_us {
            return bad("the CFS wakeup granularity must not exceed the latency");
        }
        if p.switch_cost_us > 10_000 {
            return bad("--switch-cost must be at most 10 ms");
        }
        if !(10_000..=10_000_000).contains(&p.tick_us) {
            return bad("the utilization tick must be between 10 ms and 10 s");
        }
        self.frontend
            .validate()
            .map_err(|e| SimError::Config(format!("cpu scheduler: {e}")))
    }
}

/// One worker's CPUs.
#[derive(Debug, Clone)]
pub enum CpuModel {
    Ps(ProcessorSharing),
    Quantum(Box<QuantumCpu>),
}

impl CpuModel {
    /// The model `config` names for `cpus` CPUs; `names` are the workload's function names by
    /// index (what SFS and ALPS key their policies by).
    pub fn new(config: &CpuConfig, cpus: u32, names: &Arc<[Arc<str>]>) -> Result<Self> {
        let (discipline, kind) = match config.sched {
            CpuSched::Ps => return Ok(CpuModel::Ps(ProcessorSharing::new(cpus))),
            CpuSched::Cfs => (Discipline::Cfs, CpuSchedKind::Cfs),
            CpuSched::Fifo => (Discipline::Fifo, CpuSchedKind::Cfs),
            CpuSched::Srpt => (Discipline::Srpt, CpuSchedKind::Cfs),
            CpuSched::Sfs => (Discipline::Frontend, CpuSchedKind::Sfs),
            CpuSched::Alps => (Discipline::Frontend, CpuSchedKind::Alps),
        };
        let frontend = CpuScheduler::new(
            &CpuSchedConfig {
                kind,
                ..config.frontend.clone()
            },
            cpus,
        )
        .map_err(|e| SimError::Config(format!("cpu scheduler: {e}")))?;
        Ok(CpuModel::Quantum(Box::new(QuantumCpu::new(
            cpus,
            discipline,
            config.params,
            frontend,
            names.clone(),
        ))))
    }

    /// `job`, an invocation of function `function`, starts executing `work_us` at `now`.
    pub fn enter(&mut self, now: Micros, job: u32, work_us: Micros, function: u32) {
        match self {
            CpuModel::Ps(ps) => ps.enter(now, job, work_us),
            CpuModel::Quantum(q) => q.enter(now, job, work_us, function),
        }
    }

    /// When the model next needs [`CpuModel::pop_finished`] if nothing enters before.
    pub fn next_finish(&self) -> Option<Micros> {
        match self {
            CpuModel::Ps(ps) => ps.next_finish(),
            CpuModel::Quantum(q) => q.next_event(),
        }
    }

    /// The next job whose work is done by `now`, if any (call until `None`).
    pub fn pop_finished(&mut self, now: Micros) -> Option<u32> {
        match self {
            CpuModel::Ps(ps) => ps.pop_finished(now),
            CpuModel::Quantum(q) => q.pop_finished(now),
        }
    }

    /// The `contention` server: processor sharing with the measured interference.
    pub fn contention(cpus: u32, contention: Contention) -> Self {
        CpuModel::Ps(ProcessorSharing::with_contention(cpus, contention))
    }

    /// The sandboxes being created on this worker demand `creations` CPUs from `now` on (under
    /// the contention server; the other models ignore them).
    pub fn set_creations(&mut self, now: Micros, creations: f64) {
        if let CpuModel::Ps(ps) = self {
            ps.set_creations(now, creations);
        }
    }

    /// Takes `job` off the CPUs at `now` before its work is done.
    pub fn remove(&mut self, now: Micros, job: u32) -> bool {
        match self {
            CpuModel::Ps(ps) => ps.remove(now, job),
            CpuModel::Quantum(q) => q.remove(now, job),
        }
    }

    /// Jobs executing or waiting for a CPU.
    pub fn len(&self) -> usize {
        match self {
            CpuModel::Ps(ps) => ps.len(),
            CpuModel::Quantum(q) => q.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Context switches and the rest (all zero under processor sharing, which has none).
    pub fn stats(&self) -> CpuStats {
        match self {
            CpuModel::Ps(_) => CpuStats::default(),
            CpuModel::Quantum(q) => q.stats(),
        }
    }

    /// The SFS or ALPS frontend (None under the others).
    pub fn frontend(&self) -> Option<&CpuScheduler> {
        match self {
            CpuModel::Quantum(q) if q.frontend().kind() != CpuSchedKind::Cfs => Some(q.frontend()),
            _ => None,
        }
    }
}
