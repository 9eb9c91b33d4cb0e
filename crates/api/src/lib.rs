//! Hearth's public wire types (DESIGN.md §4): what the worker and the controller answer and what
//! the CLI, the load generator and the benchmarks read. Every part of Hearth speaks these types,
//! so the answer contract is written down once and nobody reads answers by searching bytes.
//!
//! Results pass through untouched: an invocation's `result` is a [`serde_json::value::RawValue`],
//! checked to be JSON but never turned into a tree, at the worker, the controller or the client.

pub mod error;
pub mod function;
pub mod gpu;
pub mod invocation;
pub mod namespace;
pub mod proactive;
pub mod status;

pub use error::{ErrorBody, ErrorCode, ErrorObject};
pub use function::{FunctionSpec, SpecError, MAX_TIMEOUT_MS};
pub use gpu::{largest_gpu_mb, Device, GpuInfo, GpuPlacement, MAX_GPUS, MAX_GPU_MEMORY_MB};
pub use invocation::{
    raw_json, AsyncAccepted, AsyncOutcome, AsyncRecord, AsyncState, ColdPath, ColdReason,
    InvokeAnswer, PrewarmAnswer, Timing,
};
pub use proactive::{
    ProactiveAnswer, ProactiveCommand, ProactiveCounts, ProactiveFailure, ProactiveOp,
    ProactivePoolStatus, ProactiveRequest, ProactiveResult, ProactiveStarted,
    MAX_PROACTIVE_BODY_BYTES, MAX_PROACTIVE_COMMANDS, PROACTIVE_STREAM_TYPE,
};
pub use status::{
    FunctionSandboxes, GenericPoolStatus, LoadStatus, LowLatencyStatus, MemoryStatus, PolicyStatus,
    QueueStatus, StatusReport, WorkerStatus,
};
