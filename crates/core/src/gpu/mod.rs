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
//! minimum VT of the backlogged flows, those with queued or in-flight work (with none, it keeps
//! its last value). A flow is Throttled while `VT − Global_VT > T`.
//!
//! An empty flow does not hold Global_VT back, even while its TTL keeps it Active: Table 6.2
//! calls Global_VT the minimum over *active* flows, and a flow kept active only in anticipation
//! has nothing to dispatch, so counting it would throttle every busy flow behind a function
//! called once a minute and leave the device idle with work queued (α × IAT is minutes for such
//! a function). An empty flow that gets work again starts at `max(VT, Global_VT)`, as MQFQ's
//! start tags do, so it cannot bank the service it did not use.
//!
//! **Deviation from Algorithm 3:** its line 22 throttles when `flow.VT − Global_VT < T`, which
//! would throttle every flow close to Global_VT (the slowest ones) and contradicts the prose
//! ("an active flow's start time is allowed to be T units ahead of Global_VT"); we follow the
//! prose.
//!
//! Candidates are the Active flows with queued work, longest queue
//! first; when the devices' D together is not 1, ties go to the flow with fewest in flight
//! (stickiness: fewer concurrent cold starts of one function), then to the lowest VT, then by
//! name, so runs are deterministic. If the chosen flow's head cannot be placed (no token, no
//! room), the dispatcher waits for the next event, as Algorithm 3 does. Empty flows stay Active
//! for their TTL after their last dispatch or completion (anticipatory scheduling: their
//! containers stay on the device); then they go Inactive and their idle containers' memory is swapped
//! to the host. Flows going Throttled are swapped out too; flows becoming Active get their idle
//! containers prefetched where there is free device memory. A dispatch in the same event as such a prefetch is
//! a host-warm start (the copy is still under way), not a warm one.
//!
//! Memory ([`GpuMemoryPolicy`], §6.4.2 Fig. 6.4): the above is `prefetch-swap`, the default.
//! `prefetch-only` prefetches the same way but never swaps proactively; a dispatch needing
//! room has the driver evict LRU memory on its critical path. `uvm` is stock unified memory:
//! no prefetch, no swap, no memory gating; a host-resident container's pages fault in as it
//! runs, evicting LRU ones. Each dispatch's [`GpuPaging`] says what it moves.
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

pub use config::{GpuConfigError, GpuMemoryPolicy, GpuPolicy, GpuSchedConfig, GpuSpec};
pub use dispatch::{CpuGpuDispatch, Device, DispatchConfig, DispatchError};
pub use flow::FlowState;
pub use model::{SimGpuModel, SimGpuModelError};
pub use scheduler::{
    ContainerId, GpuAction, GpuArrival, GpuCompletion, GpuCounters, GpuDestroyReason,
    GpuDeviceStatus, GpuEventError, GpuFlowStatus, GpuGauges, GpuInvocationId, GpuPaging,
    GpuPlacement, GpuReject, GpuScheduler, GpuStatus, Start,
};
