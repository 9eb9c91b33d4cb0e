//! GPU functions on one server (thesis ch. 6): the Table 6.1 functions, the §6.5 workload
//! made from the Azure trace, and a discrete-event server whose GPUs are scheduled by the
//! worker's own [`hearth_core::gpu::GpuScheduler`] (MQFQ-Sticky, FCFS, Batch) and timed by
//! [`hearth_core::gpu::SimGpuModel`]. `hearth experiment gpu` runs the §6.5 comparisons on it.

pub mod profile;
pub mod server;
pub mod workload;

pub use profile::{closest, GpuProfile, TABLE_6_1};
pub use server::{simulate_gpu, GpuRecord, GpuRun, GpuServerConfig, Placement, Ran, StartKind};
pub use workload::{GpuFunction, GpuWorkload};
