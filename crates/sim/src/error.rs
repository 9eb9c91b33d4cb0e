//! What can go wrong before or during a simulation.

use hearth_core::balance::ParamsError;
use hearth_loadgen::LoadgenError;

/// A simulation that cannot start or cannot finish.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A trace, metadata or results file could not be read or written.
    #[error(transparent)]
    Files(#[from] LoadgenError),
    #[error("the trace invokes {function:?} (first at {at_ms:.3} ms) but the metadata has no row for it")]
    UnknownFunction { function: String, at_ms: f64 },
    #[error("{0}")]
    Config(String),
    #[error("balancing parameters: {0}")]
    Params(#[from] ParamsError),
    /// A guard against a bug: invocations were outstanding but nothing could ever finish them.
    #[error("the simulation stalled at {at_s:.3} s of virtual time with {outstanding} invocation(s) unfinished")]
    Stalled { at_s: f64, outstanding: usize },
    /// The engine and the simulator disagree about an invocation: a bug, never expected.
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Result<T, E = SimError> = std::result::Result<T, E>;
