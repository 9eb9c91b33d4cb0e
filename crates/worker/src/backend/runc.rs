//! The `runc` backend: every sandbox is an OCI container started with Debian's runc, running the
//! Python agent as its only process (docs/sandboxes.md).
//!
//! Layout under the data directory: `runc/` is runc's private state root, `rootfs/` the shared
//! read-only base root, `agent/` the agent script, and `sandboxes/<container>/` each sandbox's
//! bundle (`config.json`, `stdio.log`) with `run/` mounted at /hearth/run for the agent's socket.

use super::oci::{self, OciParams};
use super::SandboxError;
use crate::agent_client::{AgentConn, AgentError, AgentReply};
use crate::config::RuncConfig;
use hearth_api::FunctionSpec;
use hearth_core::SandboxId;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::Command;

/// The agent, shipped inside the binary so an installed `hearth` needs no source tree.
pub const AGENT_SOURCE: &str = include_str!("../../../../runtime/python/hearth_agent.py");

pub struct RuncBackend {
    cfg: RuncConfig,
    state_root: PathBuf,
    sandboxes_dir: PathBuf,
    rootfs: PathBuf,
    agent_dir: PathBuf,
    /// `/hearth/<worker>`: the cgroup parent of every sandbox of this worker.
    cgroup_parent: String,
    /// Container names are `<prefix><sandbox id>`, unique per worker on a host.
    prefix: String,
    /// The largest result a sandbox may answer (told to the agent, enforced on reading it).
    max_result_bytes: usize,
}

pub struct RuncSandbox {
    container: String,
    dir: PathBuf,
    code_dir: PathBuf,
    cgroups_path: String,
    memory_mb: u64,
    conn: AgentConn,
}

impl RuncSandbox {
    pub fn code_dir(&self) -> &Path {
        &self.code_dir
    }
}

/// Keeps what a container name and cgroup path may hold.
fn sanitize(id: &str) -> String {
    id.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

impl RuncBackend {
    /// Prepares the directories and checks that runc is usable.
    pub async fn new(
        cfg: RuncConfig,
        data_dir: &Path,
        worker_id: &str,
        max_result_bytes: usize,
    ) -> Result<Self, SandboxError> {
        let fail = |what: &str, e: std::io::Error| {
            SandboxError::StartFailed(format!("preparing the runc backend ({what}): {e}"))
        };
        let version = Command::new(&cfg.runc_path)
            .arg("--version")
            .output()
            .await
            .map_err(|e| {
                SandboxError::StartFailed(format!(
                    "cannot run {} ({e}); install it with `apt-get install runc` or use --backend sim",
                    cfg.runc_path.display()
                ))
            })?;
        if !version.status.success() {
            return Err(SandboxError::StartFailed(format!(
                "{} --version failed",
                cfg.runc_path.display()
            )));
        }
        let worker = sanitize(worker_id);
        let b = RuncBackend {
            state_root: data_dir.join("runc"),
            sandboxes_dir: data_dir.join("sandboxes"),
            rootfs: data_dir.join("rootfs"),
            agent_dir: data_dir.join("agent"),
            cgroup_parent: format!("/hearth/{worker}"),
            prefix: format!("hearth-{worker}-"),
            cfg,
            max_result_bytes,
        };
        // <data>/sandboxes/<id>/run/agent.sock must fit in sockaddr_un (108 bytes).
        let socket_len = b.sandboxes_dir.as_os_str().len()
            + "/18446744073709551615/run/".len()
            + oci::AGENT_SOCKET_NAME.len();
        if socket_len > 107 {
            return Err(SandboxError::StartFailed(format!(
                "the data directory path {} is too long for sandbox sockets; use a shorter --data-dir",
                data_dir.display()
            )));
        }
        for d in [&b.state_root, &b.sandboxes_dir, &b.agent_dir] {
            std::fs::create_dir_all(d).map_err(|e| fail("directories", e))?;
        }
        oci::prepare_base_rootfs(&b.rootfs).map_err(|e| fail("base rootfs", e))?;
        let agent = b.agent_dir.join("hearth_agent.py");
        std::fs::write(&agent, AGENT_SOURCE).map_err(|e| fail("agent", e))?;
        set_mode(&agent, 0o644).map_err(|e| fail("agent", e))?;
        set_mode(&b.agent_dir, 0o755).map_err(|e| fail("agent", e))?;
        Ok(b)
    }

    fn runc(&self) -> Command {
        let mut c = Command::new(&self.cfg.runc_path);
        c.arg("--root").arg(&self.state_root);
        c.stdin(Stdio::null());
        c.kill_on_drop(false);
        c
    }

    pub async fn create(
        &self,
        id: SandboxId,
        spec: &FunctionSpec,
        code_dir: &Path,
    ) -> Result<RuncSandbox, SandboxError> {
        let container = format!("{}{}", self.prefix, id.0);
        // Short directory names keep the socket path under the 108-byte AF_UNIX limit.
        let dir = self.sandboxes_dir.join(id.0.to_string());
        let cgroups_path = format!("{}/{}", self.cgroup_parent, container);
        let started = Instant::now();
        if let Err(e) = self.write_bundle(&container, &dir, spec, code_dir, &cgroups_path) {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(SandboxError::StartFailed(format!(
                "writing the bundle: {e}"
            )));
        }
        match self.start(&container, &dir, &cgroups_path, started).await {
            Ok(mut conn) => match conn.health().await {
                Ok(r) if r.status == 200 => Ok(RuncSandbox {
                    container,
                    dir,
                    code_dir: code_dir.to_path_buf(),
                    cgroups_path,
                    memory_mb: spec.memory_mb,
                    conn,
                }),
                Ok(r) => {
                    self.remove(&container, &dir).await;
                    Err(init_error(&r.body))
                }
                Err(e) => {
                    let err = self
                        .diagnose(&cgroups_path, spec.memory_mb, &dir, &e.to_string())
                        .await;
                    self.remove(&container, &dir).await;
                    Err(err)
                }
            },
            Err(e) => {
                self.remove(&container, &dir).await;
                Err(e)
            }
        }
    }

    fn write_bundle(
        &self,
        container: &str,
        dir: &Path,
        spec: &FunctionSpec,
        code_dir: &Path,
        cgroups_path: &str,
    ) -> std::io::Result<()> {
        let run_dir = dir.join("run");
        std::fs::create_dir_all(&run_dir)?;
        std::os::unix::fs::chown(&run_dir, Some(self.cfg.uid), Some(self.cfg.gid))?;
        set_mode(&run_dir, 0o700)?;
        let env: Vec<(String, String)> = spec
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let config = oci::runtime_spec(&OciParams {
            rootfs: &self.rootfs,
            code_dir,
            agent_dir: &self.agent_dir,
            run_dir: &run_dir,
            hostname: container,
            handler: &spec.handler,
            env: &env,
            memory_mb: spec.memory_mb,
            cpus: spec.cpus,
            uid: self.cfg.uid,
            gid: self.cfg.gid,
            cgroups_path,
            tmp_size_mb: self.cfg.tmp_size_mb,
            max_result_bytes: self.max_result_bytes,
        });
        std::fs::write(dir.join("config.json"), config.to_string())
    }

    /// `runc run --detach`, then waits for the agent's socket to accept.
    async fn start(
        &self,
        container: &str,
        dir: &Path,
        cgroups_path: &str,
        started: Instant,
    ) -> Result<AgentConn, SandboxError> {
        let log = std::fs::File::create(dir.join("stdio.log"))
            .and_then(|f| Ok((f.try_clone()?, f)))
            .map_err(|e| SandboxError::StartFailed(format!("creating the log: {e}")))?;
        let status = self
            .runc()
            .arg("run")
            .arg("--detach")
            .arg("--no-new-keyring")
            .arg("--bundle")
            .arg(dir)
            .arg(container)
            .stdout(log.0)
            .stderr(log.1)
            .status()
            .await
            .map_err(|e| SandboxError::StartFailed(format!("running runc: {e}")))?;
        if !status.success() {
            return Err(SandboxError::StartFailed(format!(
                "runc run exited with {status}: {}",
                log_tail(dir, 10)
            )));
        }
        let socket = dir.join("run").join(oci::AGENT_SOCKET_NAME);
        let deadline = started + Duration::from_millis(self.cfg.start_timeout_ms);
        let mut polls: u32 = 0;
        loop {
            if socket.exists() {
                if let Ok(conn) = AgentConn::connect(&socket, self.max_result_bytes).await {
                    return Ok(conn);
                }
            }
            polls += 1;
            if polls.is_multiple_of(20) && !cgroup_has_processes(cgroups_path) {
                return Err(SandboxError::StartFailed(format!(
                    "the agent exited during start-up: {}",
                    log_tail(dir, 10)
                )));
            }
            if Instant::now() > deadline {
                return Err(SandboxError::StartFailed(format!(
                    "the agent did not listen within {} ms: {}",
                    self.cfg.start_timeout_ms,
                    log_tail(dir, 10)
                )));
            }
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
    }

    pub async fn invoke(
        &self,
        sb: &mut RuncSandbox,
        args: &[u8],
    ) -> Result<AgentReply, SandboxError> {
        match sb.conn.invoke(args).await {
            Ok(r) => Ok(r),
            Err(AgentError::TooLarge { limit, .. }) => Err(SandboxError::ResultTooLarge { limit }),
            Err(e) => Err(self
                .diagnose(&sb.cgroups_path, sb.memory_mb, &sb.dir, &e.to_string())
                .await),
        }
    }

    /// Tells an OOM kill from any other death of the agent.
    async fn diagnose(
        &self,
        cgroups_path: &str,
        memory_mb: u64,
        dir: &Path,
        err: &str,
    ) -> SandboxError {
        // The kernel may record the kill a moment after the socket closes.
        for _ in 0..20 {
            if oci::oom_kill_count(cgroups_path).unwrap_or(0) > 0 {
                return SandboxError::OutOfMemory {
                    limit_mb: memory_mb,
                };
            }
            if !cgroup_has_processes(cgroups_path) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if oci::oom_kill_count(cgroups_path).unwrap_or(0) > 0 {
            return SandboxError::OutOfMemory {
                limit_mb: memory_mb,
            };
        }
        let tail = log_tail(dir, 10);
        if tail.is_empty() {
            SandboxError::Crashed(err.to_string())
        } else {
            SandboxError::Crashed(format!("{err}; sandbox output: {tail}"))
        }
    }

    pub async fn destroy(&self, sb: RuncSandbox) {
        let RuncSandbox {
            container,
            dir,
            conn,
            ..
        } = sb;
        drop(conn);
        self.remove(&container, &dir).await;
    }

    /// Kills and deletes the container (runc removes its cgroups) and its bundle directory.
    /// `kill` first: `delete --force` on a running container sleeps 100 ms after its SIGKILL.
    async fn remove(&self, container: &str, dir: &Path) {
        let _ = self
            .runc()
            .args(["kill", container, "KILL"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await;
        match self
            .runc()
            .arg("delete")
            .arg("--force")
            .arg(container)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .await
        {
            Ok(out) if !out.status.success() => {
                let msg = String::from_utf8_lossy(&out.stderr);
                if !msg.contains("does not exist") {
                    tracing::warn!(%container, error = %msg.trim(), "runc delete failed");
                }
            }
            Err(e) => tracing::warn!(%container, error = %e, "runc delete failed"),
            Ok(_) => {}
        }
        if let Err(e) = std::fs::remove_dir_all(dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %dir.display(), error = %e, "removing sandbox dir failed");
            }
        }
    }

    /// Removes every container, bundle and cgroup of this worker (the data directory and the
    /// cgroup parent are the worker's own).
    pub async fn cleanup_all(&self) {
        let listed = self.runc().arg("list").arg("--quiet").output().await;
        if let Ok(out) = listed {
            for name in String::from_utf8_lossy(&out.stdout).lines() {
                let name = name.trim();
                if let Some(id) = name.strip_prefix(&self.prefix) {
                    self.remove(name, &self.sandboxes_dir.join(id)).await;
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(&self.sandboxes_dir) {
            for e in entries.flatten() {
                if let Err(err) = std::fs::remove_dir_all(e.path()) {
                    tracing::warn!(dir = %e.path().display(), error = %err, "removing sandbox dir failed");
                }
            }
        }
        // Sandbox cgroups runc could not delete (a crashed worker), then the worker's parent.
        let memory_parent = oci::cgroup_v1_dir("memory", &self.cgroup_parent);
        if let Ok(children) = std::fs::read_dir(&memory_parent) {
            for c in children.flatten().filter(|c| c.path().is_dir()) {
                let child = format!("{}/{}", self.cgroup_parent, c.file_name().to_string_lossy());
                let _ = oci::remove_cgroup_dirs(&child);
            }
        }
        if let Err(e) = oci::remove_cgroup_dirs(&self.cgroup_parent) {
            tracing::warn!(cgroup = %self.cgroup_parent, error = %e, "removing cgroups failed");
        }
        // The shared `/hearth` parent stays: removing it when empty raced with another worker
        // whose runc was creating `/hearth/<worker>` in it (runc failed with ENOENT).
    }
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Whether any process is left in the sandbox's cgroup.
fn cgroup_has_processes(cgroups_path: &str) -> bool {
    let procs = oci::cgroup_v1_dir("pids", cgroups_path).join("cgroup.procs");
    match std::fs::read_to_string(procs) {
        Ok(s) => !s.trim().is_empty(),
        Err(_) => false,
    }
}

/// The last lines the sandbox printed, for error messages.
fn log_tail(dir: &Path, lines: usize) -> String {
    let Ok(text) = std::fs::read_to_string(dir.join("stdio.log")) else {
        return String::new();
    };
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The agent's init-error body: `{"type", "message", "traceback", "phase": "init"}`.
fn init_error(body: &[u8]) -> SandboxError {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let field = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
    SandboxError::InitFailed {
        kind: field("type"),
        message: field("message"),
        traceback: field("traceback"),
    }
}
