//! A function's flow (§6.3.1): its queue of invocations, its virtual time and what the
//! scheduler learns about it (inter-arrival time, mean execution time).

use super::scheduler::GpuInvocationId;
use crate::time::Micros;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// Weight of the newest sample in the IAT and τ moving averages: recent behaviour dominates
/// within a handful of samples, one outlier moves the estimate by a quarter.
const EWMA_WEIGHT: f64 = 0.25;

/// A flow's scheduling state (Table 6.2, Algorithm 3 `update_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FlowState {
    /// May dispatch; its containers' memory is wanted on the device.
    Active,
    /// Ran more than T ahead of Global_VT: waits, its idle memory moves to the host.
    Throttled,
    /// Empty, idle and past its TTL: out of Global_VT, its memory moves to the host.
    Inactive,
}

/// An invocation waiting in a flow.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    pub id: GpuInvocationId,
    pub arrival: Micros,
    pub memory_mb: u64,
}

/// One function's flow.
#[derive(Debug, Clone)]
pub(crate) struct Flow {
    pub queue: VecDeque<Pending>,
    /// Service received, in seconds of device time per unit weight.
    pub vt: f64,
    pub in_flight: u32,
    /// When the flow last dispatched or completed (TTL runs from here).
    pub last_exec: Micros,
    last_arrival: Option<Micros>,
    /// Mean gap between arrivals, µs (none until a second arrival).
    pub iat_us: Option<f64>,
    pub weight: f64,
    /// Mean execution time τ_k, µs.
    pub tau_us: f64,
    tau_seen: bool,
    pub state: FlowState,
    /// The GPU the function's containers were placed on (§6.3.4 stickiness).
    pub home: Option<usize>,
}

impl Flow {
    pub fn new(now: Micros, default_exec_us: Micros) -> Self {
        Flow {
            queue: VecDeque::new(),
            vt: 0.0,
            in_flight: 0,
            last_exec: now,
            last_arrival: None,
            iat_us: None,
            weight: 1.0,
            tau_us: default_exec_us as f64,
            tau_seen: false,
            state: FlowState::Inactive,
            home: None,
        }
    }

    /// Records an arrival's gap into the IAT estimate.
    pub fn note_arrival(&mut self, now: Micros) {
        if let Some(prev) = self.last_arrival {
            let gap = now.saturating_sub(prev) as f64;
            self.iat_us = Some(match self.iat_us {
                Some(iat) => iat + EWMA_WEIGHT * (gap - iat),
                None => gap,
            });
        }
        self.last_arrival = Some(now);
    }

    /// Records a measured execution time into τ_k (the first one replaces the default).
    pub fn note_exec(&mut self, exec_us: Micros) {
        let exec = exec_us as f64;
        self.tau_us = if self.tau_seen {
            self.tau_us + EWMA_WEIGHT * (exec - self.tau_us)
        } else {
            exec
        };
        self.tau_seen = true;
    }

    /// The VT one dispatch costs: τ_k / w_k seconds, or 1 / w_k under classical fair queuing.
    pub fn cost(&self, uniform: bool) -> f64 {
        if uniform {
            1.0 / self.weight
        } else {
            self.tau_us / 1e6 / self.weight
        }
    }

    pub fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.in_flight == 0
    }
}
