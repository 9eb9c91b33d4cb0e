//! GPU functions (thesis ch. 6): MQFQ-Sticky scheduling, its FCFS and Batch baselines, the GPU
//! container pool with memory prefetch and swap, dynamic device parallelism, multi-GPU
//! placement, CPU/GPU dispatch and a simulated GPU, all sans-I/O.
//!
//! * [`config`]: [`GpuSchedConfig`] (Table 6.2's T, TTL factor α, D, …) and [`GpuPolicy`].
//! * [`flow`]: a function's flow: queue, virtual time, IAT and τ estimates, [`FlowState`].
//! * [`scheduler`]: [`GpuScheduler`], the single dispatcher of Algorithm 3 with the container
//!   pool (§6.3.3) and the D tokens under utilization feedback (§6.3.4).
//! * [`dispatch`]: [`CpuGpuDispatch`], speedup-based CPU/GPU choice for polymorphic functions.
//! * [`model`]: [`SimGpuModel`], the simulated device for the simulator and the `sim` backend.
//!
//! # MQFQ-Sticky as implemented
//!
//! Each function has a flow. A dispatch costs the flow τ_k / w_k of virtual time (τ_k the
//! function's mean execution time in seconds; 1 / w_k with `uniform_cost`). Global_VT is the
//! minimum VT of the flows that are not Inactive: flows with queued or in-flight work, or empty
//! ones within their TTL (α × mean inter-arrival time, or `fixed_ttl_us`; a flow that has seen
//! one arrival only has TTL 0). A flow is Throttled while `VT − Global_VT > T`.
//!
//! **Deviation from Algorithm 3:** its line 22 throttles when `flow.VT − Global_VT < T`, which
//! would throttle every flow close to Global_VT (the slowest ones) and contradicts the prose
//! ("an active flow's start time is allowed to be T units ahead of Global_VT"); we follow the
//! prose.
//!
//! A flow that returns after being Inactive starts at `max(VT, Global_VT)`: without it, an idle
//! flow would bank the service it did not use and monopolize the device on its return
//! (standard fair queuing). Candidates are the Active flows with queued work, longest queue
//! first; when the devices' D together is not 1, ties go to the flow with fewest in flight
//! (stickiness: fewer concurrent cold starts of one function), then to the lowest VT, then by
//! name, so runs are deterministic. If the chosen flow's head cannot be placed (no token, no
//! room), the dispatcher waits for the next event, as Algorithm 3 does. Empty flows stay Active
//! for their TTL after their last dispatch or completion (anticipatory scheduling) and hold
//! Global_VT back that long; then they go Inactive and their idle containers' memory is swapped
//! to the host. Flows going Throttled are swapped out too; flows becoming Active get their idle
//! containers prefetched where there is free device memory.
//!
//! FCFS dispatches in arrival order over all functions, swapping a container's memory out after
//! each completion; Batch drains the flow holding the oldest invocation, then picks again. Both
//! share the container pool and the D tokens; neither throttles.

pub mod config;
pub mod dispatch;
pub mod flow;
pub mod model;
pub mod scheduler;

#[cfg(test)]
mod tests;

pub use config::{GpuConfigError, GpuPolicy, GpuSchedConfig, GpuSpec};
pub use dispatch::{CpuGpuDispatch, Device, DispatchConfig, DispatchError};
pub use flow::FlowState;
pub use model::{SimGpuModel, SimGpuModelError};
pub use scheduler::{
    ContainerId, GpuAction, GpuArrival, GpuCompletion, GpuCounters, GpuDestroyReason,
    GpuDeviceStatus, GpuEventError, GpuFlowStatus, GpuInvocationId, GpuReject, GpuScheduler,
    GpuStatus, Start,
};
