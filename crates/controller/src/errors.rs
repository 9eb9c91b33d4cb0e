//! The controller's domain errors: what can go wrong in each operation, in the facade's terms.
//! The HTTP edge (`api.rs`) is the one place that turns them into status codes and error bodies.

use crate::forward::Answer;
use hearth_service::registry::RegistryError;
use std::path::PathBuf;
use std::time::Duration;

/// Errors of [`crate::Controller::start`].
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("data directory {0}: {1}")]
    DataDir(PathBuf, std::io::Error),
    #[error("registry: {0}")]
    Registry(#[from] RegistryError),
    #[error("{0}")]
    Balance(#[from] hearth_core::balance::ParamsError),
    #[error("[atoll]: {0}")]
    Atoll(#[from] hearth_core::proactive::AtollError),
    #[error("authentication: {0}")]
    Auth(#[from] hearth_service::auth::AuthError),
    #[error("{0}")]
    Tls(#[from] hearth_service::tls::TlsError),
    #[error("state store: {0}")]
    Store(#[from] hearth_service::store::StoreError),
}

/// Why an invocation (or an async one's acceptance) did not produce a result here.
#[derive(Debug, thiserror::Error)]
pub enum InvokeError {
    #[error("the controller is shutting down")]
    ShuttingDown,
    #[error("function {0:?} is not registered")]
    UnknownFunction(String),
    #[error("no worker is available: none has joined, or all have left")]
    NoWorkers,
    #[error(
        "every worker is overloaded: the least-loaded reports a load of {load:.2}, above b_max = \
         {b_max}"
    )]
    Overloaded { load: f64, b_max: f64 },
    #[error("too many async invocations are pending or kept; retry later")]
    AsyncStoreFull,
    /// The calling namespace holds its share of the async store (429 `namespace_limit`).
    #[error("{0}")]
    AsyncNamespaceFull(hearth_service::store::StoreError),
    /// The async store could not record the invocation: nothing was accepted.
    #[error("{0}")]
    AsyncStore(String),
    /// It provably never started on any worker tried (each reason in order), so it is safe to
    /// retry.
    #[error("the invocation could not be delivered (it never started): {}", .why.join("; then "))]
    WorkerUnavailable { why: Vec<String> },
    /// The worker failed after the request went out: it may have run, so it is not retried.
    #[error(
        "worker {worker} failed during the invocation; it may or may not have run, so it is not \
         retried: {why}"
    )]
    WorkerFailed { worker: String, why: String },
    /// A slow answer, not a dead worker: the invocation may still be queued or running there.
    #[error(
        "worker {worker}: the worker did not answer within {after:?}; the invocation may still \
         be queued or running there (not retried)"
    )]
    WorkerTimeout { worker: String, after: Duration },
    /// The worker refused the function's registration; `status` is the worker's.
    #[error("worker {worker} refused to register {function}: {message}")]
    WorkerRefused {
        worker: String,
        function: String,
        status: u16,
        message: String,
    },
    /// The worker's own answer (an error answer, or a success the controller could not read),
    /// passed to the client unchanged.
    #[error("worker answered HTTP {}", .0.status)]
    WorkerAnswer(Answer),
    /// A `gpu` function and no live worker with a GPU that can hold it.
    #[error(
        "{function} has device \"gpu\" and needs gpu_memory_mb {needed_mb}, but {}",
        match .largest_mb {
            None => "no live worker has a GPU".to_string(),
            Some(mb) => format!("the largest GPU of a live worker has {mb} MiB"),
        }
    )]
    NoGpuWorker {
        function: String,
        needed_mb: u64,
        largest_mb: Option<u64>,
    },
    #[error("{0}")]
    Internal(String),
}

/// Why a registration was refused.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("{0}")]
    Registry(#[from] RegistryError),
    /// Reading and compressing the function's code failed.
    #[error("{0}")]
    Packing(String),
    /// No live worker could ever hold one sandbox of the function.
    #[error(
        "memory_mb {memory_mb} is more than any live worker has: the largest memory budget is \
         {largest_mb} MiB"
    )]
    TooMuchMemory { memory_mb: u64, largest_mb: u64 },
    /// No live worker's GPU could ever hold one invocation of the function.
    #[error(
        "gpu_memory_mb {gpu_memory_mb} is more than any live worker's GPU has: the largest is \
         {largest_mb} MiB"
    )]
    TooMuchGpuMemory { gpu_memory_mb: u64, largest_mb: u64 },
    /// The cluster's store could not record it: nothing changed.
    #[error("{0}")]
    Store(#[from] hearth_service::store::StoreError),
}

/// Why a function could not be deleted.
#[derive(Debug, thiserror::Error)]
pub enum UnregisterError {
    #[error("function {0:?} is not registered")]
    UnknownFunction(String),
    #[error("{0}")]
    Registry(#[from] RegistryError),
    /// The cluster's store could not record it: nothing changed.
    #[error("{0}")]
    Store(#[from] hearth_service::store::StoreError),
}

/// Why a prewarm started nothing.
#[derive(Debug, thiserror::Error)]
pub enum PrewarmError {
    /// Everything an invocation can fail with before the prewarm request goes out (shutting
    /// down, unknown function, no or overloaded workers, a failed registration).
    #[error(transparent)]
    Invoke(#[from] InvokeError),
    /// The worker answered the prewarm with an error; `status` is the worker's.
    #[error("worker {worker}: {message}")]
    WorkerRefused {
        worker: String,
        status: u16,
        message: String,
    },
    /// The worker's success answer was not a prewarm answer.
    #[error("worker {worker}: the answer was not a Hearth prewarm answer")]
    UnreadableAnswer { worker: String },
}

/// Why a status report was not taken.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("a status report needs a worker id and an http:// or https:// url")]
    Unusable,
    /// A replayed or out-of-order push, or one from an incarnation a newer one replaced (409).
    #[error("stale status report from worker {worker:?}: {why}")]
    Stale { worker: String, why: &'static str },
}

impl From<hearth_service::store::StoreError> for InvokeError {
    /// A full async store is a 429 of its own; any other store failure accepted nothing.
    fn from(e: hearth_service::store::StoreError) -> Self {
        match e {
            hearth_service::store::StoreError::Full(_) => InvokeError::AsyncStoreFull,
            e @ hearth_service::store::StoreError::NamespaceFull { .. } => {
                InvokeError::AsyncNamespaceFull(e)
            }
            e => InvokeError::AsyncStore(e.to_string()),
        }
    }
}
