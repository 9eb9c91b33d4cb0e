//! Hearth's sans-I/O core (DESIGN.md §1).
//!
//! Every decision lives here as a plain, synchronous, deterministic state machine that is handed
//! the current time and events and returns actions. Nothing in this crate reads a clock, sleeps,
//! spawns, locks or does I/O, so the real worker and the simulator drive the very same code.

pub mod balance;
pub mod function;
pub mod pool;
pub mod time;

pub use function::{FunctionSpec, SpecError};
pub use pool::{
    Acquire, ColdReason, DestroyReason, PoolAction, PoolConfig, PoolStats, SandboxId, SandboxPool,
};
pub use time::Micros;
