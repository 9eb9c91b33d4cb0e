//! Hearth's sans-I/O core (DESIGN.md §1).
//!
//! Every decision lives here as a plain, synchronous, deterministic state machine that is handed
//! the current time and events and returns actions. Nothing in this crate reads a clock, sleeps,
//! spawns, locks or does I/O, so the real worker and the simulator drive the very same code.

pub mod balance;
pub mod bypass;
pub mod characteristics;
pub mod engine;
pub mod load;
pub mod policy;
pub mod pool;
pub mod regulator;
pub mod time;

pub use engine::{
    Admission, Arrival, Completion, EngineAction, EngineConfig, EngineStats, InvocationId,
    LoadSource, Reject, Run, WorkerEngine,
};
pub use policy::keepalive::{KeepAliveConfig, KeepAliveKind};
pub use policy::queue::QueueDiscipline;
pub use pool::{
    Acquire, ColdReason, DestroyReason, PoolAction, PoolConfig, PoolStats, SandboxId, SandboxPool,
};
pub use regulator::{AimdConfig, RegulatorConfig};
pub use time::Micros;
