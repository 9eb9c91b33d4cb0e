//! Sandbox backends: where an invocation actually runs.
//!
//! An enum rather than a trait object: two backends, and the hot path stays free of dynamic
//! dispatch and boxing.

mod code_mount;
pub mod freezer;
pub mod gpu_host;
pub mod oci;
pub mod runc;
pub mod sim;

use crate::agent_client::{AgentReply, GpuMemory};
use hearth_api::{FunctionSpec, GpuInfo};
use hearth_core::SandboxId;
use std::path::Path;

/// Why a sandbox could not start or serve.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SandboxError {
    /// runc or the agent failed before the handler was imported.
    #[error("sandbox failed to start: {0}")]
    StartFailed(String),
    /// The handler's module could not be imported (syntax error, missing name, ...).
    #[error("handler failed to initialize: {kind}: {message}")]
    InitFailed {
        kind: String,
        message: String,
        traceback: String,
    },
    /// The cgroup's OOM killer ended the sandbox.
    #[error("sandbox was killed for exceeding its memory limit of {limit_mb} MiB")]
    OutOfMemory { limit_mb: u64 },
    /// The sandbox sent a result over `max_result_bytes` past the agent's own check; its
    /// connection was given up unread, so the sandbox is destroyed.
    #[error("the function's result is larger than the limit of {limit} bytes (max_result_bytes)")]
    ResultTooLarge { limit: usize },
    /// The sandbox process died or the connection broke.
    #[error("sandbox crashed: {0}")]
    Crashed(String),
    /// The backend cannot make this kind of sandbox (a GPU sandbox on sim).
    #[error("{0}")]
    Unsupported(&'static str),
}

/// Why a GPU sandbox's memory could not be moved ([`Backend::gpu_prefetch`],
/// [`Backend::gpu_swap_out`]). Only [`GpuOpError::Broken`] means the sandbox must go; after the
/// others it still serves invocations (its memory stays where it was, and unified memory
/// pages it on demand).
#[derive(Debug, Clone, thiserror::Error)]
pub enum GpuOpError {
    /// Not a GPU sandbox (a CPU one, or the sim backend's).
    #[error("not a GPU sandbox")]
    NotGpu,
    /// The agent has no CUDA shim loaded.
    #[error("the CUDA shim is not loaded in the sandbox")]
    NoShim,
    /// The CUDA driver refused a move (its `CUresult` when the agent gave one).
    #[error("the CUDA driver refused to move the sandbox's memory (CUresult {})",
            code.map_or_else(|| "unknown".to_string(), |c| c.to_string()))]
    Cuda { code: Option<i32> },
    /// The sandbox died or its connection broke: destroy it.
    #[error(transparent)]
    Broken(SandboxError),
}

impl GpuOpError {
    /// Whether the sandbox is broken and must be destroyed.
    pub fn is_fatal(&self) -> bool {
        matches!(self, GpuOpError::Broken(_))
    }
}

/// A runc sandbox runs code from a directory; a function without one cannot start there.
fn required_code_dir(code_dir: Option<&Path>) -> Result<&Path, SandboxError> {
    code_dir.ok_or_else(|| SandboxError::StartFailed("the function has no code directory".into()))
}

/// A backend.
// One per worker, made once and never moved on the hot path: boxing the runc variant would
// only add an indirection.
#[allow(clippy::large_enum_variant)]
pub enum Backend {
    Runc(runc::RuncBackend),
    Sim(sim::SimBackend),
}

/// A live sandbox, exclusively owned by whoever runs an invocation on it.
pub enum Sandbox {
    /// Boxed: a runc sandbox carries its freezer, log copier and connection (a few hundred
    /// bytes), a sim one almost nothing.
    Runc(Box<runc::RuncSandbox>),
    Sim(sim::SimSandbox),
}

impl Backend {
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Runc(_) => "runc",
            Backend::Sim(_) => "sim",
        }
    }

    /// The digest of the default runtime image sandboxes run on (runc only).
    pub fn default_runtime_digest(&self) -> Option<&str> {
        match self {
            Backend::Runc(b) => Some(b.default_runtime_digest()),
            Backend::Sim(_) => None,
        }
    }

    /// Whether functions must come with code.
    pub fn needs_code(&self) -> bool {
        matches!(self, Backend::Runc(_))
    }

    /// Starts a sandbox for `spec` and waits until its handler is imported.
    pub async fn create(
        &self,
        id: SandboxId,
        spec: &FunctionSpec,
        code_dir: Option<&Path>,
    ) -> Result<Sandbox, SandboxError> {
        match self {
            Backend::Runc(b) => {
                let dir = required_code_dir(code_dir)?;
                b.create(id, spec, dir)
                    .await
                    .map(|s| Sandbox::Runc(Box::new(s)))
            }
            Backend::Sim(b) => b.create(spec).await.map(Sandbox::Sim),
        }
    }

    /// Starts a GPU sandbox for `spec` on `gpu` (runc only; docs/gpu.md) and waits until its
    /// handler is imported and its device memory prefetched. Always a new sandbox: GPU
    /// sandboxes are never made from the generic pool. The sim backend refuses with
    /// [`SandboxError::Unsupported`] (the sim GPU scheduling runs sim sandboxes).
    pub async fn create_gpu(
        &self,
        id: SandboxId,
        spec: &FunctionSpec,
        code_dir: Option<&Path>,
        gpu: &GpuInfo,
    ) -> Result<Sandbox, SandboxError> {
        match self {
            Backend::Runc(b) => {
                let dir = required_code_dir(code_dir)?;
                b.create_gpu(id, spec, dir, gpu)
                    .await
                    .map(|s| Sandbox::Runc(Box::new(s)))
            }
            Backend::Sim(_) => Err(SandboxError::Unsupported(
                "the sim backend has no GPU sandboxes",
            )),
        }
    }

    /// Moves a GPU sandbox's device memory onto its GPU and waits for it (before dispatching
    /// to it). Inside the sandbox its GPU is CUDA device 0, so no device is named here.
    pub async fn gpu_prefetch(&self, sandbox: &mut Sandbox) -> Result<GpuMemory, GpuOpError> {
        match (self, sandbox) {
            (Backend::Runc(b), Sandbox::Runc(s)) => b.gpu_prefetch(s).await,
            _ => Err(GpuOpError::NotGpu),
        }
    }

    /// Moves a GPU sandbox's device memory to host memory and waits for it (its flow is idle,
    /// or its GPU's memory is wanted).
    pub async fn gpu_swap_out(&self, sandbox: &mut Sandbox) -> Result<GpuMemory, GpuOpError> {
        match (self, sandbox) {
            (Backend::Runc(b), Sandbox::Runc(s)) => b.gpu_swap_out(s).await,
            _ => Err(GpuOpError::NotGpu),
        }
    }

    /// The host GPU a GPU sandbox runs on.
    pub fn gpu<'a>(&self, sandbox: &'a Sandbox) -> Option<&'a GpuInfo> {
        match sandbox {
            Sandbox::Runc(s) => s.gpu(),
            Sandbox::Sim(_) => None,
        }
    }

    /// The device memory a GPU sandbox's shim last reported (its start, every invocation,
    /// prefetch and swap-out). Reported by the sandbox itself: a hint, not a measure.
    pub fn device_memory_bytes(&self, sandbox: &Sandbox) -> Option<u64> {
        match sandbox {
            Sandbox::Runc(s) => s.device_memory_bytes(),
            Sandbox::Sim(_) => None,
        }
    }

    /// Starts a generic sandbox for the pool that cold starts specialize (runc only); with
    /// `layer` (a digest) pre-imported: the layer mounted and its modules imported.
    pub async fn create_generic(
        &self,
        id: SandboxId,
        memory_mb: u64,
        runtime: Option<&str>,
        layer: Option<&str>,
    ) -> Result<Sandbox, SandboxError> {
        match self {
            Backend::Runc(b) => b
                .create_generic(id, memory_mb, runtime, layer)
                .await
                .map(|s| Sandbox::Runc(Box::new(s))),
            Backend::Sim(_) => Err(SandboxError::StartFailed(
                "the sim backend has no generic sandboxes".into(),
            )),
        }
    }

    /// Makes a generic sandbox the sandbox of `spec` (its code, limits, env and handler). On
    /// failure the sandbox is gone.
    pub async fn specialize(
        &self,
        sandbox: Sandbox,
        spec: &FunctionSpec,
        code_dir: Option<&Path>,
    ) -> Result<Sandbox, SandboxError> {
        match (self, sandbox) {
            (Backend::Runc(b), Sandbox::Runc(s)) => {
                let Some(dir) = code_dir else {
                    b.destroy(*s).await;
                    return Err(SandboxError::StartFailed(
                        "the function has no code directory".into(),
                    ));
                };
                b.specialize(*s, spec, dir)
                    .await
                    .map(|s| Sandbox::Runc(Box::new(s)))
            }
            (_, other) => {
                self.destroy(other).await;
                Err(SandboxError::StartFailed(
                    "this backend has no generic sandboxes".into(),
                ))
            }
        }
    }

    /// Runs one invocation. `Ok` means the sandbox answered (a handler error is an `Ok` reply
    /// with status 500); `Err` means the sandbox is broken.
    pub async fn invoke(
        &self,
        sandbox: &mut Sandbox,
        args: &[u8],
    ) -> Result<AgentReply, SandboxError> {
        match (self, sandbox) {
            (Backend::Runc(b), Sandbox::Runc(s)) => b.invoke(s, args).await,
            (Backend::Sim(b), Sandbox::Sim(s)) => Ok(b.invoke(s).await),
            _ => Err(SandboxError::Crashed("sandbox of another backend".into())),
        }
    }

    /// Kills and removes a sandbox; never fails (problems are logged).
    pub async fn destroy(&self, sandbox: Sandbox) {
        if let (Backend::Runc(b), Sandbox::Runc(s)) = (self, sandbox) {
            b.destroy(*s).await;
        }
    }

    /// Removes every trace of this worker's sandboxes (start-up after a crash, and shutdown).
    pub async fn cleanup_all(&self) {
        if let Backend::Runc(b) = self {
            b.cleanup_all().await;
        }
    }

    /// A sandbox's CPU controls for the CPU scheduling (runc with `cpu_sched` sfs or alps).
    pub fn cpu_controls<'a>(
        &self,
        sandbox: &'a Sandbox,
    ) -> Option<&'a std::sync::Arc<crate::cpu_sched::SandboxCpu>> {
        match sandbox {
            Sandbox::Runc(s) => s.cpu(),
            Sandbox::Sim(_) => None,
        }
    }

    /// Host directory of a sandbox's code, if it has one (to know when old code can go).
    pub fn code_dir<'a>(&self, sandbox: &'a Sandbox) -> Option<&'a Path> {
        match sandbox {
            Sandbox::Runc(s) => s.code_dir(),
            Sandbox::Sim(_) => None,
        }
    }
}
