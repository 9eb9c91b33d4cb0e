//! The pool's vocabulary: identities, configuration, decisions, actions and statistics.

use super::generic::{GenericConfig, GenericKey, GenericStats};
use crate::policy::keepalive::KeepAliveConfig;
use crate::time::Micros;
use serde::Serialize;
use std::sync::Arc;

/// A sandbox's identity, unique within one pool for its lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct SandboxId(pub u64);

impl std::fmt::Display for SandboxId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sb{}", self.0)
    }
}

/// Pool limits and the keep-alive policy.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Memory that starting, running and warm sandboxes may use together.
    pub memory_budget_mb: u64,
    /// Background eviction keeps at least this much of the budget free, so that a cold start
    /// rarely has to evict on the invocation path.
    pub free_buffer_mb: u64,
    pub keepalive: KeepAliveConfig,
    /// Pre-made generic sandboxes that cold starts specialize ([`super::generic`]).
    pub generic: GenericConfig,
    /// The proactive memory pool (Atoll §4.3): memory reserved within the budget for sandboxes
    /// the controller sets up ahead of demand. Reactive sandboxes never use it, so a burst of
    /// cold starts cannot take the room the controller planned with; 0 turns it off. At most
    /// the budget ([`PoolConfig::validate`]).
    pub proactive_mb: u64,
}

/// A pool configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolConfigError {
    #[error("the proactive pool ({proactive_mb} MiB) is larger than the memory budget ({budget_mb} MiB)")]
    ProactiveOverBudget { proactive_mb: u64, budget_mb: u64 },
}

impl PoolConfig {
    /// Checks what the pool cannot repair itself (it clamps the proactive pool to the budget).
    pub fn validate(&self) -> Result<(), PoolConfigError> {
        if self.proactive_mb > self.memory_budget_mb {
            return Err(PoolConfigError::ProactiveOverBudget {
                proactive_mb: self.proactive_mb,
                budget_mb: self.memory_budget_mb,
            });
        }
        Ok(())
    }
}

/// Why a proactive sandbox was not created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProactiveError {
    #[error("the proactive pool is off on this worker")]
    Disabled,
    /// The proactive pool's free room is short (its sandboxes never evict reactive ones).
    #[error("the proactive pool has {free_mb} MiB free, {needed_mb} MiB needed")]
    PoolFull { needed_mb: u64, free_mb: u64 },
    #[error("the worker is shutting down")]
    ShuttingDown,
}

/// What [`super::SandboxPool::proactive_evict`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "when", content = "sandbox", rename_all = "snake_case")]
pub enum ProactiveEvicted {
    /// An idle (soft or not) sandbox: its Destroy action is out.
    Now(SandboxId),
    /// A busy or starting sandbox: destroyed when its run ends or it is ready; its memory
    /// stays counted until then.
    WhenDone(SandboxId),
}

/// Why an invocation had to start a new sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum ColdReason {
    /// The function never had a sandbox on this worker (or was re-registered since).
    New,
    /// Its last warm sandbox's keep-alive window ended `ago_us` before this invocation.
    Expired { ago_us: Micros },
    /// Its last warm sandbox was evicted for memory `ago_us` before this invocation.
    Evicted { ago_us: Micros },
    /// All its warm sandboxes were busy.
    Concurrent,
    /// A prewarmed sandbox was still starting.
    PrewarmMiss,
}

impl ColdReason {
    /// The reason's name, as used in answers and metric labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            ColdReason::New => "new",
            ColdReason::Expired { .. } => "expired",
            ColdReason::Evicted { .. } => "evicted",
            ColdReason::Concurrent => "concurrent",
            ColdReason::PrewarmMiss => "prewarm_miss",
        }
    }

    /// How long ago the function's last warm sandbox went, for `expired` and `evicted`.
    pub fn ago_us(&self) -> Option<Micros> {
        match self {
            ColdReason::Expired { ago_us } | ColdReason::Evicted { ago_us } => Some(*ago_us),
            _ => None,
        }
    }
}

/// What the pool decided for one invocation. A `Cold` sandbox's memory is reserved until it is
/// released or its start fails, so the decision must be carried out or handed back.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquire {
    /// Run on this idle sandbox.
    Warm(SandboxId),
    /// Start this new sandbox (its memory is reserved) and run on it: by specializing the
    /// ready generic sandbox `generic` when there is one, from nothing otherwise.
    Cold {
        sandbox: SandboxId,
        reason: ColdReason,
        generic: Option<SandboxId>,
    },
    /// Not enough memory even after evicting every idle sandbox.
    NoMemory { needed_mb: u64, free_mb: u64 },
}

/// Why a sandbox is being destroyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DestroyReason {
    Expired,
    Evicted,
    /// Its function was updated or deleted.
    Retired,
    /// It timed out, crashed or could not start; never reused.
    Failed,
    Shutdown,
}

impl DestroyReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            DestroyReason::Expired => "expired",
            DestroyReason::Evicted => "evicted",
            DestroyReason::Retired => "retired",
            DestroyReason::Failed => "failed",
            DestroyReason::Shutdown => "shutdown",
        }
    }
}

/// An action for the driver to carry out.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolAction {
    Destroy {
        sandbox: SandboxId,
        reason: DestroyReason,
    },
    /// Start `sandbox` for `function` ahead of demand (the policy's pre-warm; memory is
    /// reserved). Report [`SandboxPool::on_sandbox_ready`] or [`SandboxPool::on_start_failed`].
    Prewarm {
        sandbox: SandboxId,
        function: Arc<str>,
    },
    /// Make generic sandbox `sandbox` (its memory is reserved). Report
    /// [`SandboxPool::on_generic_ready`] or [`SandboxPool::on_generic_failed`].
    /// Of `key` (its runtime; with a layer, mounted and its modules imported before it is
    /// ready), with the cgroup limit `memory_mb` (what it reserves).
    CreateGeneric {
        sandbox: SandboxId,
        key: GenericKey,
        memory_mb: u64,
    },
}

/// Per-function counts for status reports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FunctionPoolStats {
    pub warm: u32,
    pub running: u32,
    pub starting: u32,
    /// Proactive sandboxes (counted here only, not in the reactive counts above): idle and
    /// usable, running, starting, and soft-evicted (idle, kept, not used for scheduling).
    pub proactive_idle: u32,
    pub proactive_busy: u32,
    pub proactive_starting: u32,
    pub proactive_soft: u32,
}

/// Memory and sandbox counts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PoolStats {
    pub memory_budget_mb: u64,
    /// Memory of starting and busy sandboxes.
    pub memory_running_mb: u64,
    /// Memory of idle (warm) sandboxes.
    pub memory_warm_mb: u64,
    /// Memory of generic sandboxes, ready or being made.
    pub memory_generic_mb: u64,
    /// The proactive pool's size and the memory of its sandboxes in every state (not counted
    /// in the running and warm figures above, which are reactive sandboxes only).
    pub proactive_pool_mb: u64,
    pub memory_proactive_mb: u64,
    pub generic: GenericStats,
    pub functions: Vec<(String, FunctionPoolStats)>,
}

impl PoolStats {
    /// The counts of `function`, if the pool knows it.
    pub fn function(&self, function: &str) -> Option<&FunctionPoolStats> {
        self.functions
            .iter()
            .find(|(n, _)| n == function)
            .map(|(_, s)| s)
    }
}
