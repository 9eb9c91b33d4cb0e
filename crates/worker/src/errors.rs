//! The worker's domain errors: what can go wrong in each operation, in the facade's terms. The
//! HTTP edge (`api.rs`) is the one place that turns them into status codes and error bodies.

use crate::backend::SandboxError;
use hearth_api::Timing;

/// Why an invocation did not produce a result.
#[derive(Debug, thiserror::Error)]
pub enum InvokeError {
    #[error("the worker is shutting down")]
    ShuttingDown,
    #[error("function {0:?} is not registered")]
    UnknownFunction(String),
    /// Its dependency layer or bytecode is still being built (409 `function_building`).
    #[error(
        "function {0:?} is still being built (its dependencies and bytecode); retry once \
         `hearth fn show {0}` says ready"
    )]
    Building(String),
    /// Its build failed (409 `function_build_failed`): registering it again is the way out.
    #[error(
        "function {0:?} failed to build; `hearth fn show {0}` shows the build log; register \
         it again to retry"
    )]
    BuildFailed(String),
    #[error("the worker's invocation queue is full ({length} waiting); retry later")]
    QueueFull { length: usize },
    #[error(
        "no memory for a new sandbox of {function}: it needs {needed_mb} MiB and {free_mb} MiB \
         are free after evicting every idle sandbox (budget {budget_mb} MiB)"
    )]
    NoMemory {
        function: String,
        needed_mb: u64,
        free_mb: u64,
        budget_mb: u64,
    },
    #[error(
        "{function} needs {needed_mb} MiB per sandbox but this worker's whole budget is \
         {budget_mb} MiB"
    )]
    TooLarge {
        function: String,
        needed_mb: u64,
        budget_mb: u64,
    },
    /// The sandbox could not be started (the handler's import failed, it ran out of memory, …).
    #[error("{function}: {error}")]
    Start {
        function: String,
        error: SandboxError,
    },
    #[error(
        "{function} did not finish within its timeout of {timeout_ms} ms; its sandbox was killed"
    )]
    Timeout { function: String, timeout_ms: u64 },
    /// The caller asked to drop late work (`Hearth-Drop-Late`) and its deadline passed before
    /// the invocation started: it never ran.
    #[error(
        "{function} was dropped without running: its deadline of {deadline_ms} ms passed \
         {late_by_us} µs before it could start (Hearth-Drop-Late)"
    )]
    DeadlinePassed {
        function: String,
        deadline_ms: u64,
        late_by_us: u64,
    },
    /// The sandbox died or broke its connection while running.
    #[error("{0}")]
    Sandbox(SandboxError),
    /// The handler raised (or returned something that is not JSON).
    #[error("{} raised {}: {}", .0.function, .0.kind, .0.message)]
    Handler(Box<HandlerFailure>),
    #[error("too many async invocations are pending or kept; retry later")]
    AsyncStoreFull,
    /// The calling namespace holds its share of the async store (429 `namespace_limit`).
    #[error("{0}")]
    AsyncNamespaceFull(hearth_service::store::StoreError),
    /// The async store could not record the invocation: nothing was accepted.
    #[error("{0}")]
    AsyncStore(String),
    /// A `gpu` function on a worker without a GPU that can hold it.
    #[error("{0}")]
    Gpu(crate::gpu::GpuRefusal),
    #[error("{0}")]
    Internal(&'static str),
}

/// A handler that raised: what it raised, and the run's facts for the answer.
#[derive(Debug)]
pub struct HandlerFailure {
    pub function: String,
    /// The agent's status: 400 when the arguments were unusable for the handler.
    pub agent_status: u16,
    pub kind: String,
    pub message: String,
    pub traceback: String,
    pub cold: bool,
    pub worker: String,
    pub timing: Timing,
}

/// Why a registration was refused.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("memory_mb {memory_mb} exceeds this worker's memory budget of {budget_mb} MiB")]
    TooMuchMemory { memory_mb: u64, budget_mb: u64 },
    /// A `gpu` function this worker's GPUs cannot take.
    #[error("{0}")]
    Gpu(#[from] crate::gpu::GpuRefusal),
    /// The code or its storage (the registry's error says which, and its HTTP answer).
    #[error("{0}")]
    Code(#[from] hearth_service::registry::RegistryError),
    /// The spec names a runtime this worker has no image of.
    #[error("runtime {name:?} is not installed on this worker (installed: {available})")]
    UnknownRuntime { name: String, available: String },
}

/// Why a function could not be deleted.
#[derive(Debug, thiserror::Error)]
pub enum UnregisterError {
    #[error("function {0:?} is not registered")]
    UnknownFunction(String),
    #[error("{0}")]
    Storage(String),
}

/// Why a prewarm started nothing.
#[derive(Debug, thiserror::Error)]
pub enum PrewarmError {
    #[error("the worker is shutting down")]
    ShuttingDown,
    #[error(
        "count must be between 1 and {}",
        hearth_service::http::MAX_PREWARM_COUNT
    )]
    BadCount,
    #[error("function {0:?} is not registered")]
    UnknownFunction(String),
    #[error("no free memory for {no_memory} sandbox(es) of {function} (prewarm never evicts)")]
    NoMemory { function: String, no_memory: u32 },
    #[error("{0}")]
    StartFailed(String),
    #[error("{0}")]
    Gpu(crate::gpu::GpuRefusal),
    /// A `device: gpu` function: the GPU scheduler starts its sandboxes as its flow needs them.
    #[error(
        "{0} runs on a GPU: its GPU sandboxes are started by the GPU scheduler when its \
         invocations need them, and prewarm makes CPU sandboxes only"
    )]
    OnGpu(String),
    /// Still building, or its build failed: nothing to start yet (409).
    #[error("{0}")]
    NotReady(InvokeError),
}

/// Why a batch of proactive commands was refused whole (one command's failure is in its
/// result instead).
#[derive(Debug, thiserror::Error)]
pub enum ProactiveBatchError {
    #[error(
        "the proactive pool is off on this worker (proactive_mb = 0): start it with \
         --proactive-mb or proactive_mb to let a controller allocate proactive sandboxes here"
    )]
    Disabled,
    #[error("the worker is shutting down")]
    ShuttingDown,
    #[error("a batch holds at most {max} commands, got {count}")]
    TooManyCommands { count: usize, max: usize },
    #[error("command {index}: a function key is 1 to {max} characters, got {len}")]
    BadFunctionName {
        index: usize,
        len: usize,
        max: usize,
    },
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
