//! Sandbox backends: where an invocation actually runs.
//!
//! An enum rather than a trait object: two backends, and the hot path stays free of dynamic
//! dispatch and boxing.

mod code_mount;
pub mod freezer;
pub mod oci;
pub mod runc;
pub mod sim;

use crate::agent_client::AgentReply;
use hearth_api::FunctionSpec;
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
                let dir = code_dir.ok_or_else(|| {
                    SandboxError::StartFailed("the function has no code directory".into())
                })?;
                b.create(id, spec, dir)
                    .await
                    .map(|s| Sandbox::Runc(Box::new(s)))
            }
            Backend::Sim(b) => b.create(spec).await.map(Sandbox::Sim),
        }
    }

    /// Starts a generic sandbox for the pool that cold starts specialize (runc only).
    pub async fn create_generic(
        &self,
        id: SandboxId,
        memory_mb: u64,
    ) -> Result<Sandbox, SandboxError> {
        match self {
            Backend::Runc(b) => b
                .create_generic(id, memory_mb)
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
