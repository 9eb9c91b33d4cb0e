//! The `sim` backend: no process. A sandbox costs the function's `sim_cold_ms` to start and each
//! invocation `sim_warm_ms`, spent sleeping, so one machine can emulate many busy workers while
//! the pool, accounting, API and metrics run exactly as with real sandboxes.

use super::SandboxError;
use crate::agent_client::AgentReply;
use bytes::Bytes;
use hearth_core::FunctionSpec;
use std::time::{Duration, Instant};

/// The constant result of a simulated invocation.
const SIM_RESULT: &[u8] = b"{\"simulated\":true}";

pub struct SimBackend;

pub struct SimSandbox {
    warm: Duration,
}

fn duration_ms(ms: f64) -> Duration {
    Duration::from_secs_f64(ms.max(0.0) / 1000.0)
}

impl SimBackend {
    pub async fn create(&self, spec: &FunctionSpec) -> Result<SimSandbox, SandboxError> {
        let cold = duration_ms(spec.sim_cold_ms);
        if !cold.is_zero() {
            tokio::time::sleep(cold).await;
        }
        Ok(SimSandbox {
            warm: duration_ms(spec.sim_warm_ms),
        })
    }
}

impl SimSandbox {
    pub async fn invoke(&mut self) -> AgentReply {
        let start = Instant::now();
        if !self.warm.is_zero() {
            tokio::time::sleep(self.warm).await;
        }
        AgentReply {
            status: 200,
            exec_us: Some(start.elapsed().as_micros() as u64),
            body: Bytes::from_static(SIM_RESULT),
        }
    }
}
