//! What the controller tells about itself and its workers (`GET /v1/status`, a function's
//! `pool`, `workers` and `balancing`): typed, so its shape is written down in one place.

use hearth_api::FunctionSandboxes;
use hearth_core::balance::BalanceParams;
use hearth_core::proactive::AtollStats;
use serde::Serialize;
use std::collections::BTreeMap;

/// `GET /v1/status`.
#[derive(Debug, Clone, Serialize)]
pub struct ControllerStatus {
    /// Always `"controller"`: tells a cluster from a single worker.
    pub role: &'static str,
    /// The live workers' backend, `"mixed"` when they differ, `"none"` without any.
    pub backend: String,
    pub uptime_s: u64,
    pub shutting_down: bool,
    pub in_flight: usize,
    pub async_running: usize,
    pub balance: &'static str,
    pub balance_params: BalanceParams,
    /// None (`null`) while the policy has no finite threshold.
    pub popularity_threshold: Option<f64>,
    pub workers_up: usize,
    pub workers: Vec<WorkerView>,
    pub pools: Vec<PoolView>,
    pub memory: MemoryView,
    /// Sandboxes per function, summed over the live workers.
    pub functions: BTreeMap<String, SandboxCounts>,
    /// Atoll's state when it routes (`[atoll]`); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub atoll: Option<AtollView>,
}

/// Atoll's balancer as a whole.
#[derive(Debug, Clone, Serialize)]
pub struct AtollView {
    pub ladder: &'static str,
    pub groups: usize,
    pub group_size: u32,
    pub stats: AtollStats,
}

/// Atoll's view of one function.
#[derive(Debug, Clone, Serialize)]
pub struct FunctionAtoll {
    /// Groups serving it, in the order they joined, and groups it is leaving.
    pub active_groups: Vec<u32>,
    pub removed_groups: Vec<u32>,
    /// Proactive sandboxes allocated (creations in flight included) and soft-evicted.
    pub proactive: u32,
    pub soft_evicted: u32,
}

/// One worker as the controller sees it; the policy's fields are `null` for a worker it no
/// longer tracks, the report's until the first one.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerView {
    pub worker: String,
    pub url: String,
    pub up: bool,
    #[serde(rename = "static")]
    pub is_static: bool,
    pub load: Option<f64>,
    pub queue_len: Option<u32>,
    pub running: Option<u32>,
    pub free_mb: Option<u64>,
    pub in_flight: Option<u32>,
    pub backend: Option<String>,
    pub cpus: Option<f64>,
    pub last_report_ms_ago: Option<u64>,
    /// Its GPUs by its last report (where `device: gpu` functions may go); absent without.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<hearth_api::GpuInfo>,
}

/// One pool of the pools policy.
#[derive(Debug, Clone, Serialize)]
pub struct PoolView {
    pub level: i32,
    pub b_max: f64,
    pub workers: Vec<String>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct MemoryView {
    /// Free memory the live workers last reported, summed.
    pub free_mb: u64,
}

/// Sandboxes of one function, summed over workers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SandboxCounts {
    pub warm: u64,
    pub running: u64,
    pub starting: u64,
}

impl SandboxCounts {
    pub fn add(&mut self, f: &FunctionSandboxes) {
        self.warm += u64::from(f.warm);
        self.running += u64::from(f.running);
        self.starting += u64::from(f.starting);
    }
}

/// Sandboxes of one function: the total and per worker, from the last reports.
#[derive(Debug, Clone, Serialize)]
pub struct Sandboxes {
    pub pool: SandboxCounts,
    pub workers: BTreeMap<String, FunctionSandboxes>,
}

/// What the policy knows about a function.
#[derive(Debug, Clone, Serialize)]
pub struct Balancing {
    /// The worker its invocations go to first.
    pub home: Option<String>,
    /// Absent while the policy does not know the function.
    #[serde(flatten)]
    pub function: Option<FunctionBalancing>,
    /// Atoll's view, when it routes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub atoll: Option<FunctionAtoll>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FunctionBalancing {
    pub popular: bool,
    pub priority: i32,
    /// Smoothed warm and cold times, rounded.
    pub warm_us: Option<f64>,
    pub cold_us: Option<f64>,
    pub load_bound: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_function_has_only_a_home() {
        let b = Balancing {
            home: None,
            function: None,
            atoll: None,
        };
        assert_eq!(serde_json::to_string(&b).unwrap(), r#"{"home":null}"#);
        let b = Balancing {
            home: Some("w".into()),
            function: Some(FunctionBalancing {
                popular: true,
                priority: 1,
                warm_us: Some(10.0),
                cold_us: None,
                load_bound: 1.25,
            }),
            atoll: None,
        };
        let v: serde_json::Value = serde_json::to_value(&b).unwrap();
        assert_eq!(
            (&v["home"], &v["popular"], &v["cold_us"], &v["load_bound"]),
            (
                &"w".into(),
                &true.into(),
                &serde_json::Value::Null,
                &1.25.into()
            )
        );
    }
}
