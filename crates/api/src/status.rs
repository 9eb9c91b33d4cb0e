//! A worker's status (`GET /v1/status`) and the report it pushes to its controller.

use crate::gpu::{GpuInfo, MAX_GPUS};
use crate::proactive::{ProactiveCounts, ProactivePoolStatus};
use hearth_core::balance::WorkerLoad;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// Sandboxes of one function on a worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionSandboxes {
    #[serde(default)]
    pub warm: u32,
    #[serde(default)]
    pub running: u32,
    #[serde(default)]
    pub starting: u32,
    /// Its proactive sandboxes (not counted above); absent when it has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proactive: Option<ProactiveCounts>,
}

/// Memory of a worker's sandboxes, MiB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryStatus {
    #[serde(default)]
    pub budget_mb: u64,
    #[serde(default)]
    pub running_mb: u64,
    #[serde(default)]
    pub warm_mb: u64,
    #[serde(default)]
    pub free_mb: u64,
    /// Held by generic sandboxes (ready or being made) for cold starts to specialize.
    #[serde(default)]
    pub generic_mb: u64,
}

/// The pool of generic sandboxes that cold starts specialize (docs/sandboxes.md): the ready
/// and starting ones, the pool's target, and the cold starts that specialized one (`taken`) or
/// found none ready (`missed`).
pub type GenericPoolStatus = hearth_core::GenericStats;

/// The machine's load as the worker sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadStatus {
    pub cpus: u32,
    #[serde(default)]
    pub load_avg_1m: f64,
    /// The load average divided by the CPUs.
    pub normalized: f64,
}

/// The invocation queue and the concurrency regulator.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueStatus {
    pub length: u32,
    /// Invocations running, bypasses included.
    pub running: u32,
    #[serde(default)]
    pub running_bypass: u32,
    #[serde(default)]
    pub limit: u32,
    /// Queued invocations per function.
    #[serde(default)]
    pub queued: HashMap<String, u32>,
    /// `warm_wait`: invocations waiting for a busy sandbox of their function to free, cold
    /// starts avoided that way, and waits that ran out (a sandbox was started after all).
    #[serde(default)]
    pub warm_waiting: u32,
    #[serde(default)]
    pub warm_waits_avoided: u64,
    #[serde(default)]
    pub warm_waits_gave_up: u64,
}

/// The policies a worker runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PolicyStatus {
    pub queue: String,
    pub keepalive: String,
    pub regulator: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keepalive_ttl_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bypass_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bypass_load: Option<f64>,
}

/// Whether the worker keeps its CPUs out of deep idle states.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LowLatencyStatus {
    pub enabled: bool,
    pub held: bool,
}

/// `GET /v1/status` of a worker. The sections a worker of this version always sends are
/// optional when read, so that a report can be built from an older or foreign status.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerStatus {
    #[serde(default)]
    pub worker: String,
    #[serde(default)]
    pub backend: String,
    #[serde(default)]
    pub uptime_s: u64,
    #[serde(default)]
    pub shutting_down: bool,
    #[serde(default)]
    pub in_flight: u64,
    #[serde(default)]
    pub async_running: u64,
    #[serde(default)]
    pub memory: MemoryStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<LoadStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueStatus>,
    #[serde(default)]
    pub functions: BTreeMap<String, FunctionSandboxes>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policies: Option<PolicyStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub low_latency: Option<LowLatencyStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generic_pool: Option<GenericPoolStatus>,
    /// The proactive pool (Atoll; `proactive_mb`), absent when it is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proactive: Option<ProactivePoolStatus>,
    /// The worker's GPUs (found through NVML, or declared in `[gpu] sim`); absent when it has
    /// none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuInfo>,
    /// The GPU scheduler (thesis ch. 6): per device D, running, utilization and memory; per
    /// flow its state and virtual time; absent without GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_scheduler: Option<hearth_core::gpu::GpuStatus>,
}

/// What a worker tells its controller (`PUT /v1/cluster/workers/{id}`) every status interval.
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
    /// The worker's whole sandbox memory budget: the controller refuses functions no worker
    /// could hold. Absent from older workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_budget_mb: Option<u64>,
    /// The worker's proactive pool (size, use, room), for the controller's allocator; absent
    /// when the pool is off and from older workers. Per-function proactive counts are in
    /// `functions`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proactive: Option<ProactivePoolStatus>,
    /// The worker's GPUs: the controller routes `device: gpu` functions only to workers with
    /// one large enough. Absent when it has none and from older workers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuInfo>,
    /// Counts this incarnation's pushes from 1: the controller refuses a push whose number is
    /// not above the last one it took (a replay). 0 in a report the controller made itself by
    /// polling.
    #[serde(default)]
    pub seq: u64,
}

impl StatusReport {
    /// The report of a worker with this status. The load is the normalized load average plus
    /// the queued invocations per CPU ([`WorkerLoad::of_worker`]); where the status has no
    /// `load` or `queue` section, the load is the running sandboxes per CPU (`host_cpus` CPUs
    /// when the status does not say) and the queue is empty.
    pub fn from_status(
        status: &WorkerStatus,
        url: &str,
        incarnation: &str,
        host_cpus: f64,
    ) -> Self {
        let sandboxes_running: u32 = status.functions.values().map(|f| f.running).sum();
        let cpus = status
            .load
            .map(|l| f64::from(l.cpus))
            .filter(|c| *c > 0.0)
            .unwrap_or(host_cpus);
        let load = status
            .load
            .map_or(f64::from(sandboxes_running) / cpus, |l| l.normalized);
        let (queue_len, running) = status
            .queue
            .as_ref()
            .map_or((0, sandboxes_running), |q| (q.length, q.running));
        StatusReport {
            worker: status.worker.clone(),
            url: url.to_string(),
            incarnation: incarnation.to_string(),
            backend: status.backend.clone(),
            load: WorkerLoad::of_worker(load, queue_len, running, cpus, status.memory.free_mb),
            cpus,
            shutting_down: status.shutting_down,
            functions: status.functions.clone(),
            memory_budget_mb: (status.memory.budget_mb > 0).then_some(status.memory.budget_mb),
            proactive: status.proactive,
            gpus: bounded_gpus(&status.gpus),
            seq: 0,
        }
    }

    /// The report's GPUs, fit to keep: at most [`MAX_GPUS`], each [`GpuInfo::bounded`]. The
    /// controller keeps only these of a report, whatever a peer sent.
    pub fn bounded_gpus(&self) -> Vec<GpuInfo> {
        bounded_gpus(&self.gpus)
    }
}

fn bounded_gpus(gpus: &[GpuInfo]) -> Vec<GpuInfo> {
    gpus.iter().take(MAX_GPUS).map(GpuInfo::bounded).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn status(v: serde_json::Value) -> WorkerStatus {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn reports_read_the_load_and_queue_sections_when_present() {
        let s = status(json!({
            "worker": "w1", "backend": "sim", "shutting_down": false,
            "load": {"cpus": 8, "load_avg_1m": 4.0, "normalized": 0.5},
            "queue": {"length": 3, "running": 5, "limit": 8},
            "memory": {"budget_mb": 4096, "running_mb": 0, "warm_mb": 128, "free_mb": 3968},
            "functions": {"f": {"warm": 1, "running": 2, "starting": 0}},
        }));
        let r = StatusReport::from_status(&s, "http://127.0.0.1:1", "abc", 2.0);
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
        let s = status(json!({
            "worker": "w1", "backend": "sim",
            "memory": {"free_mb": 10},
            "functions": {"f": {"warm": 0, "running": 3, "starting": 1}, "g": {"running": 1}},
        }));
        let r = StatusReport::from_status(&s, "http://x:1", "abc", 2.0);
        assert!((r.load.load - 4.0 / 2.0).abs() < 1e-9);
        assert_eq!((r.load.queue_len, r.load.running), (0, 4));
    }

    #[test]
    fn a_status_round_trips() {
        let s = WorkerStatus {
            worker: "w".into(),
            load: Some(LoadStatus {
                cpus: 2,
                load_avg_1m: 0.5,
                normalized: 0.25,
            }),
            queue: Some(QueueStatus::default()),
            generic_pool: Some(GenericPoolStatus {
                ready: 1,
                taken: 3,
                ..GenericPoolStatus::default()
            }),
            ..WorkerStatus::default()
        };
        let back: WorkerStatus = serde_json::from_slice(&serde_json::to_vec(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn the_report_carries_the_proactive_pool_and_older_reports_still_parse() {
        let s = status(json!({
            "worker": "w1", "backend": "sim",
            "memory": {"budget_mb": 1024, "free_mb": 512},
            "functions": {"f": {"warm": 0, "running": 0, "starting": 0,
                                "proactive": {"active": 2, "soft": 1, "starting": 0}}},
            "proactive": {"pool_mb": 512, "used_mb": 384, "free_mb": 128},
        }));
        let r = StatusReport::from_status(&s, "http://x:1", "abc", 2.0);
        let pool = r.proactive.unwrap();
        assert_eq!((pool.pool_mb, pool.used_mb, pool.free_mb), (512, 384, 128));
        assert_eq!(r.functions["f"].proactive.unwrap().active, 2);
        let wire = serde_json::to_value(&r).unwrap();
        let back: StatusReport = serde_json::from_value(wire).unwrap();
        assert_eq!(back, r);
        // A report of a worker without the pool has neither field, and one of an older worker
        // (no field at all) parses.
        let plain =
            StatusReport::from_status(&status(json!({"functions": {"f": {}}})), "u", "i", 1.0);
        let wire = serde_json::to_value(&plain).unwrap();
        assert!(wire.get("proactive").is_none(), "{wire}");
        assert!(wire["functions"]["f"].get("proactive").is_none(), "{wire}");
        let old: StatusReport = serde_json::from_value(json!({
            "worker": "w", "url": "u", "incarnation": "i", "backend": "sim",
            "load": serde_json::to_value(plain.load).unwrap(), "cpus": 1.0,
            "shutting_down": false, "functions": {"f": {"warm": 1}},
        }))
        .unwrap();
        assert_eq!(old.proactive, None);
        assert!(old.gpus.is_empty());
    }

    #[test]
    fn the_report_carries_the_gpus_bounded() {
        let gpu = |i: u32| json!({"index": i, "name": "sim", "uuid": format!("sim-{i}"), "memory_mb": 16384});
        let many: Vec<_> = (0..40).map(gpu).collect();
        let s = status(json!({"worker": "w", "gpus": many}));
        let r = StatusReport::from_status(&s, "http://x:1", "i", 1.0);
        assert_eq!(r.gpus.len(), MAX_GPUS);
        assert_eq!(r.gpus[1].uuid, "sim-1");
        assert_eq!(r.gpus[1].memory_mb, 16384);
        let wire = serde_json::to_value(&r).unwrap();
        assert_eq!(wire["gpus"].as_array().unwrap().len(), MAX_GPUS);
        // A worker without GPUs says nothing about them.
        let plain = StatusReport::from_status(&status(json!({})), "u", "i", 1.0);
        assert!(serde_json::to_value(&plain).unwrap().get("gpus").is_none());
        assert!(serde_json::to_value(WorkerStatus::default())
            .unwrap()
            .get("gpus")
            .is_none());
    }
}
