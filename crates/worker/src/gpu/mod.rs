//! The worker's GPUs: which it has ([`discover`]: NVML, or simulated devices declared in the
//! config) and which functions it can therefore take ([`admission`]). The GPU scheduler that
//! places invocations on these devices reads the same list ([`crate::Worker::gpus`]).

pub mod admission;
pub mod discover;
pub mod executor;

pub use admission::{admit, GpuRefusal};
pub use discover::{
    discover, discover_nvml, Discovered, GpuDevices, GpuSettings, SimGpu, MIN_SIM_GPU_MEMORY_MB,
};
pub use executor::{GpuExecutor, GpuRun, GpuRunError};
