//! The `runc` backend: every sandbox is an OCI container started with Debian's runc, running the
//! Python agent as its only process (docs/sandboxes.md).
//!
//! Layout under the data directory: `runc/` is runc's private state root and
//! `sandboxes/<id>/` each sandbox's bundle (`config.json`, `stdio.log`), in which the worker
//! mounts the sandbox's root (`rootfs/`, a small tmpfs holding the base layout and the agent),
//! its code (`code/`, see [`code_mount`]) and `run/` (a tmpfs at /hearth/run for the agent's
//! socket). None of them shows a host path in the sandbox's mountinfo. Everything is root's
//! alone (dirs 0700, files 0600) but what the sandbox reads.
//!
//! Each sandbox runs as a uid (and gid) of its own from the worker's range
//! (`runc.uid_base`, [`UidPool`]), taken when it is made and freed once it is gone.
//!
//! Hardening beyond the OCI spec (docs/sandboxes.md):
//! * a sandbox idle for `idle_freeze_ms` is frozen (cgroup v1 freezer), so nothing a handler
//!   leaves behind (processes, threads, signal handlers) runs unseen between invocations;
//! * the sandbox's stdout and stderr go through a pipe that the worker copies into a log of at
//!   most two files of `log_file_bytes`;
//! * `run/` is a tmpfs of `run_size_mb` and `run_inodes` mounted by the worker, not host disk.

use super::code_mount;
use super::freezer::{Freezer, IdleFreezer};
use super::gpu_host::DriverFiles;
use super::oci::{self, GpuParams, OciParams};
use super::{GpuOpError, SandboxError};
use crate::agent_client::{AgentConn, AgentError, AgentReply, GpuMemory};
use crate::config::RuncConfig;
use crate::cpu_sched::SandboxCpu;
use crate::layers::{Layer, LayerStore};
use crate::runtimes::{Runtime, RuntimeStore};
use hearth_api::{FunctionSpec, GpuInfo};
use hearth_core::SandboxId;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::process::Command;
use tokio::task::JoinHandle;

/// The agent, shipped inside the binary so an installed `hearth` needs no source tree.
pub const AGENT_SOURCE: &str = include_str!("../../../../runtime/python/hearth_agent.py");

/// A sandbox's log in its bundle, and the one older file it is rotated to.
const LOG_NAME: &str = "stdio.log";
const LOG_ROTATED: &str = "stdio.log.1";
/// Bytes moved from the sandbox's output pipe per read.
const LOG_CHUNK: usize = 64 * 1024;
/// The most of a log read back for an error message.
const LOG_TAIL_BYTES: u64 = 16 * 1024;
/// How long teardown waits for the log copier to reach the end of a dead sandbox's output.
const LOG_DRAIN_WAIT: Duration = Duration::from_secs(2);
/// How long an error path waits for a sandbox's last output to reach its log.
const LOG_SETTLE_WAIT: Duration = Duration::from_millis(200);
/// An empty freezer cgroup under the worker's parent, frozen while the worker runs. The kernel
/// patches a static key on every CPU whenever the number of freezing cgroups goes from 0 to 1
/// or back: with a single sandbox, each invocation's freeze and thaw would do that twice
/// (measured 215 µs per freeze+thaw; 4.6 µs while this anchor keeps the key on).
const FREEZER_ANCHOR: &str = "frozen-anchor";
/// The CUDA ordinal of a GPU sandbox's one device: only its GPU's node exists inside and
/// `CUDA_VISIBLE_DEVICES=0`, whatever the GPU's index on the host.
const SANDBOX_DEVICE: u32 = 0;

pub struct RuncBackend {
    cfg: RuncConfig,
    /// Runtime images (`runc.runtime_store`): each sandbox's `/usr` and `/etc`.
    runtimes: RuntimeStore,
    /// `runc.default_runtime`, resolved at start (a worker without it refuses to start).
    default_runtime: Runtime,
    /// Dependency layers (`<data>/layers`), mounted into the sandboxes of their functions.
    layers: LayerStore,
    state_root: PathBuf,
    sandboxes_dir: PathBuf,
    /// `/hearth/<worker>`: the cgroup parent of every sandbox of this worker.
    cgroup_parent: String,
    /// Container names are `<prefix><sandbox id>`, unique per worker on a host.
    prefix: String,
    /// The largest result a sandbox may answer (told to the agent, enforced on reading it).
    max_result_bytes: usize,
    /// Whether [`FREEZER_ANCHOR`] is in place.
    anchor_frozen: std::sync::atomic::AtomicBool,
    /// Freezes idle sandboxes.
    idle: Arc<IdleFreezer>,
    /// Whether sandboxes carry CPU controls for the CPU scheduling (off with `cfs`).
    cpu_sched: bool,
    /// The driver's libraries and the shim, found at the first GPU sandbox (a worker without
    /// GPUs never looks).
    gpu_files: tokio::sync::OnceCell<Arc<DriverFiles>>,
    /// Each sandbox's own uid, from `runc.uid_base`.
    uids: std::sync::Mutex<UidPool>,
    /// Per layer digest: the layer's modules its functions' handlers import by name
    /// (`from PIL import Image` → `PIL.Image`), learned at their cold starts, which the
    /// layer's next pre-imported sandboxes import too. A layer's top-level modules alone leave
    /// such submodules on the cold path.
    learned_imports: std::sync::Mutex<std::collections::HashMap<String, Vec<String>>>,
    /// The host-wide claim on this worker's block of uids, held while the worker lives.
    _uid_block: UidBlock,
}

/// Where workers claim their blocks of sandbox uids: one lock file per block, `flock`ed by the
/// worker using it. The kernel drops the lock when the worker exits, however it exits.
const UID_LOCK_DIR: &str = "/run/hearth";
/// Blocks tried after `uid_base`: workers on one host.
const MAX_UID_BLOCKS: u64 = 1024;

/// A block of `uid_count` sandbox uids that no other worker on this host uses: with the same
/// `uid_base` and `uid_count`, each worker on a host takes the next free block
/// (`uid_base + k × uid_count`), so two workers' sandboxes never share a uid.
#[derive(Debug)]
pub(crate) struct UidBlock {
    pub(crate) base: u32,
    /// The locked file (the lock lives as long as it is open).
    _lock: std::fs::File,
}

/// Claims the first free block of `count` uids from `base` (see [`UidBlock`]).
pub(crate) fn claim_uid_block(dir: &Path, base: u32, count: u32) -> std::io::Result<UidBlock> {
    use std::os::fd::AsRawFd;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let last_uid = u64::from(u32::MAX) - 2;
    for k in 0..MAX_UID_BLOCKS {
        let start = u64::from(base) + k * u64::from(count);
        if start + u64::from(count) > last_uid {
            break;
        }
        let Ok(start) = u32::try_from(start) else {
            break;
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(dir.join(format!("uids-{start}-{count}.lock")))?;
        // SAFETY: the descriptor is open for the duration of the call.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(UidBlock {
                base: start,
                _lock: file,
            });
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(e);
        }
    }
    Err(std::io::Error::other(format!(
        "every block of {count} sandbox uids from {base} is taken by another worker on this host"
    )))
}

/// The worker's range of sandbox uids (`uid_base .. uid_base + uid_count`). A uid is taken
/// for each new sandbox and given back once every process of that sandbox is gone; the next
/// one taken is the one after the last taken, so a freed uid comes back only after the rest
/// of the range has been handed out.
#[derive(Debug)]
pub(crate) struct UidPool {
    base: u32,
    count: u32,
    /// Offset of the next uid to try.
    next: u32,
    used: std::collections::HashSet<u32>,
}

impl UidPool {
    pub(crate) fn new(base: u32, count: u32) -> Self {
        UidPool {
            base,
            count,
            next: 0,
            used: std::collections::HashSet::new(),
        }
    }

    /// A uid no live sandbox of this worker has; None when all are in use.
    pub(crate) fn take(&mut self) -> Option<u32> {
        if self.used.len() >= self.count as usize {
            return None;
        }
        for _ in 0..self.count {
            let uid = self.base + self.next;
            self.next = (self.next + 1) % self.count;
            if self.used.insert(uid) {
                return Some(uid);
            }
        }
        None
    }

    pub(crate) fn give_back(&mut self, uid: u32) {
        self.used.remove(&uid);
    }

    pub(crate) fn in_use(&self) -> usize {
        self.used.len()
    }
}

pub struct RuncSandbox {
    container: String,
    dir: PathBuf,
    /// Its own uid and gid (from the worker's range), freed when it is removed.
    uid: u32,
    /// The function's code directory on the host; `None` while generic.
    code_dir: Option<PathBuf>,
    /// The digest of the dependency layer mounted at [`oci::DEPS_MOUNT`] (a generic sandbox
    /// only serves functions of the same layer).
    layer: Option<String>,
    cgroups_path: String,
    memory_mb: u64,
    conn: AgentConn,
    /// Frozen once idle for `idle_freeze_ms` ([`super::freezer`]).
    freezer: Arc<Freezer>,
    log: LogCopier,
    /// Its CPU controls, for the CPU scheduling (None with `cfs`).
    cpu: Option<Arc<SandboxCpu>>,
    /// The host GPU of a GPU sandbox.
    gpu: Option<GpuInfo>,
    /// The device memory its CUDA shim last said it holds (GPU sandboxes).
    device_memory: Option<u64>,
}

/// The task copying a sandbox's stdout and stderr from its pipe into the capped log. It ends
/// when every process of the sandbox has closed the pipe.
struct LogCopier {
    task: Option<JoinHandle<()>>,
}

impl LogCopier {
    /// Waits up to `wait` for the copier to reach the end of the output; true if it did.
    async fn settle(&mut self, wait: Duration) -> bool {
        if let Some(task) = self.task.as_mut() {
            if tokio::time::timeout(wait, task).await.is_err() {
                return false;
            }
            self.task = None;
        }
        true
    }

    /// Lets the copier finish (the sandbox is dead), or stops it after `wait`.
    async fn finish(&mut self, wait: Duration) {
        if !self.settle(wait).await {
            if let Some(task) = self.task.take() {
                task.abort();
            }
        }
    }
}

impl RuncSandbox {
    pub fn code_dir(&self) -> Option<&Path> {
        self.code_dir.as_deref()
    }

    pub fn cpu(&self) -> Option<&Arc<SandboxCpu>> {
        self.cpu.as_ref()
    }

    /// The host GPU of a GPU sandbox.
    pub fn gpu(&self) -> Option<&GpuInfo> {
        self.gpu.as_ref()
    }

    /// The uid (and gid) its processes run as.
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// The device memory the sandbox's CUDA shim last reported (after its start, each
    /// invocation, prefetch and swap-out): what the function holds, wherever it now lies. The
    /// sandbox says so itself: a hint for the scheduler, not a measure to trust.
    pub fn device_memory_bytes(&self) -> Option<u64> {
        self.device_memory
    }
}

/// What a new container is made for.
#[derive(Clone, Copy)]
enum Purpose<'a> {
    /// A function's sandbox: its code bound at `/code`, its handler imported at start.
    Function {
        spec: &'a FunctionSpec,
        code_dir: &'a Path,
        /// A GPU sandbox's devices, libraries and shim.
        gpu: Option<&'a GpuParams>,
    },
    /// A generic sandbox: the agent without a handler, `/code` an empty mount point; with a
    /// layer (its digest), the layer mounted and its modules imported before it is ready.
    /// `memory_mb` is its limit from the start (in the spec).
    Generic {
        /// The runtime image's digest; None: the worker's default runtime.
        runtime: Option<&'a str>,
        layer: Option<&'a str>,
        memory_mb: u64,
    },
}

impl Purpose<'_> {
    /// The digest of the runtime image the sandbox runs on (None: the default one).
    fn runtime(&self) -> Option<&str> {
        match self {
            Purpose::Function { spec, .. } => spec.runtime_digest.as_deref(),
            Purpose::Generic { runtime, .. } => *runtime,
        }
    }

    /// The digest of the dependency layer the sandbox mounts.
    fn layer(&self) -> Option<&str> {
        match self {
            Purpose::Function { spec, .. } => spec.layer.as_deref(),
            Purpose::Generic { layer, .. } => *layer,
        }
    }
}

/// A sandbox's code mount point, in its bundle: the function's code (an overlay), or for a
/// generic sandbox the empty tmpfs its code is later mounted onto.
const CODE_POINT: &str = "code";
/// A sandbox's dependency layer mount point, in its bundle (an overlay of the layer's `site/`,
/// bound at [`oci::DEPS_MOUNT`]).
const DEPS_POINT: &str = "deps";
/// A sandbox's root tmpfs, in its bundle.
const ROOTFS: &str = "rootfs";
/// An empty directory in the bundle: the code overlay's second (empty) layer.
const EMPTY_LAYER: &str = "empty";
/// Size and files of a sandbox's root tmpfs: a dozen directories, four links and the agent
/// (23 KB).
const ROOTFS_TMPFS: &str = "size=256k,nr_inodes=64,mode=0755";

/// Layers whose learned imports are kept at once (more: the map starts over).
const MAX_LEARNED_LAYERS: usize = 1024;
/// The most of a handler module that is read for its imports.
const MAX_HANDLER_SCAN_BYTES: u64 = 256 * 1024;

/// The dotted names a handler module imports (`import a.b`, `from a.b import c` → `a.b`,
/// `a.b.c`) whose first part is one of `roots` (the layer's top-level modules). A plain text
/// scan of its top-level statements: a name that is not a module (an attribute imported with
/// `from … import`) is only a pre-import that fails and is skipped.
fn handler_imports(code_dir: &Path, handler: &str, roots: &[String]) -> Vec<String> {
    let module = handler.rsplit_once('.').map_or("main", |(m, _)| m);
    let rel = module.replace('.', "/");
    let file = [format!("{rel}.py"), format!("{rel}/__init__.py")]
        .into_iter()
        .map(|f| code_dir.join(f))
        .find(|p| p.is_file());
    let Some(file) = file else {
        return Vec::new();
    };
    let mut text = String::new();
    let read = std::fs::File::open(&file).and_then(|f| {
        use std::io::Read;
        f.take(MAX_HANDLER_SCAN_BYTES).read_to_string(&mut text)
    });
    if read.is_err() {
        return Vec::new();
    }
    let mut out: Vec<String> = Vec::new();
    let mut add = |name: &str| {
        let name = name.trim();
        let root = name.split('.').next().unwrap_or("");
        if oci::valid_module_name(name)
            && roots.iter().any(|r| r == root)
            && !out.iter().any(|n| n == name)
        {
            out.push(name.to_string());
        }
    };
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim_end();
        if let Some(rest) = line.strip_prefix("import ") {
            for part in rest.split(',') {
                add(part.split(" as ").next().unwrap_or(""));
            }
        } else if let Some(rest) = line.strip_prefix("from ") {
            let Some((base, names)) = rest.split_once(" import ") else {
                continue;
            };
            let base = base.trim();
            if base.starts_with('.') {
                continue;
            }
            add(base);
            for n in names.trim_matches(|c| c == '(' || c == ')').split(',') {
                let n = n.split(" as ").next().unwrap_or("").trim();
                if !n.is_empty() && n != "*" {
                    add(&format!("{base}.{n}"));
                }
            }
        }
    }
    out
}

/// Keeps what a container name and cgroup path may hold.
fn sanitize(id: &str) -> String {
    id.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

impl RuncBackend {
    /// Prepares the directories and checks that runc is usable. With `cpu_sched`, every
    /// sandbox carries its CPU controls ([`SandboxCpu`]).
    pub async fn new(
        cfg: RuncConfig,
        data_dir: &Path,
        worker_id: &str,
        max_result_bytes: usize,
        cpu_sched: bool,
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
        let block = claim_uid_block(Path::new(UID_LOCK_DIR), cfg.uid_base, cfg.uid_count)
            .map_err(|e| fail("sandbox uids", e))?;
        let uids = UidPool::new(block.base, cfg.uid_count);
        tracing::info!(
            first = block.base,
            count = cfg.uid_count,
            "sandbox uids of this worker"
        );
        let runtimes = RuntimeStore::new(&cfg.runtime_store);
        let default_runtime = runtimes.resolve(&cfg.default_runtime).ok_or_else(|| {
            SandboxError::StartFailed(format!(
                "the default runtime image {:?} is not installed in {}: build it with \
                 `scripts/build-runtime.sh` (or `hearth runtime build {}`) as root",
                cfg.default_runtime,
                cfg.runtime_store.display(),
                cfg.default_runtime
            ))
        })?;
        tracing::info!(runtime = %cfg.default_runtime, digest = %default_runtime.digest,
            "default runtime image");
        let b = RuncBackend {
            runtimes,
            default_runtime,
            layers: LayerStore::new(data_dir.join("layers")),
            state_root: data_dir.join("runc"),
            sandboxes_dir: data_dir.join("sandboxes"),
            cgroup_parent: format!("/hearth/{worker}"),
            prefix: format!("hearth-{worker}-"),
            anchor_frozen: std::sync::atomic::AtomicBool::new(false),
            idle: IdleFreezer::start(Duration::from_millis(cfg.idle_freeze_ms)),
            cfg,
            max_result_bytes,
            cpu_sched,
            gpu_files: tokio::sync::OnceCell::new(),
            uids: std::sync::Mutex::new(uids),
            learned_imports: std::sync::Mutex::new(std::collections::HashMap::new()),
            _uid_block: block,
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
        for d in [&b.state_root, &b.sandboxes_dir] {
            std::fs::create_dir_all(d).map_err(|e| fail("directories", e))?;
        }
        if landlock_abi().is_none() {
            tracing::warn!(
                "this kernel has no Landlock: sandboxes start without their write lock and can \
                 lower their oom_score_adj unless the worker has CAP_SYS_RESOURCE \
                 (docs/sandboxes.md)"
            );
        }
        // runc's state (each container's config, the function's env included) and the bundles
        // (logs hold what functions print) are root's alone.
        for d in [&b.state_root, &b.sandboxes_dir] {
            set_mode(d, 0o700).map_err(|e| fail("directories", e))?;
        }
        Ok(b)
    }

    fn runc(&self) -> Command {
        let mut c = Command::new(&self.cfg.runc_path);
        c.arg("--root").arg(&self.state_root);
        c.stdin(Stdio::null());
        c.kill_on_drop(false);
        c
    }

    /// Starts a sandbox for `spec` with its code and waits until its handler is imported.
    pub async fn create(
        &self,
        id: SandboxId,
        spec: &FunctionSpec,
        code_dir: &Path,
    ) -> Result<RuncSandbox, SandboxError> {
        self.make(
            id,
            Purpose::Function {
                spec,
                code_dir,
                gpu: None,
            },
        )
        .await
    }

    /// Records which of `layer`'s modules `spec`'s handler module imports (read from the
    /// code on the host, bounded), for the layer's next pre-imported sandboxes. The caller has
    /// read the layer already (to mount it, or to find it for a specialization).
    async fn learn_imports(&self, layer: &Layer, spec: &FunctionSpec, code_dir: &Path) {
        let (dir, handler, roots) = (
            code_dir.to_path_buf(),
            spec.handler.clone(),
            layer.modules.clone(),
        );
        let Ok(names) =
            tokio::task::spawn_blocking(move || handler_imports(&dir, &handler, &roots)).await
        else {
            return;
        };
        let digest = layer.digest.clone();
        let mut learned = self
            .learned_imports
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if learned.len() >= MAX_LEARNED_LAYERS && !learned.contains_key(&digest) {
            learned.clear();
        }
        let list = learned.entry(digest).or_default();
        for n in names {
            if list.len() >= oci::MAX_PREIMPORT {
                break;
            }
            if !list.contains(&n) {
                list.push(n);
            }
        }
    }

    /// What a pre-imported sandbox of `layer` imports: its top-level modules, then what its
    /// functions were seen to import from it.
    fn preimports_of(&self, layer: &Layer) -> Vec<String> {
        let mut all = layer.modules.clone();
        let learned = self
            .learned_imports
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(more) = learned.get(&layer.digest) {
            all.extend(more.iter().filter(|m| !layer.modules.contains(m)).cloned());
        }
        all
    }

    /// Starts a GPU sandbox for `spec` on `gpu` and waits until its handler is imported
    /// (docs/gpu.md): the GPU's device nodes only, the driver's libraries, and the CUDA shim
    /// preloaded into the agent. Always a new sandbox: GPU sandboxes never come from the generic
    /// pool, whose sandboxes have no devices. Once the handler is imported its device memory
    /// is prefetched to the GPU, which also proves the shim is loaded (a sandbox without it is
    /// refused: its memory could be neither counted nor moved).
    pub async fn create_gpu(
        &self,
        id: SandboxId,
        spec: &FunctionSpec,
        code_dir: &Path,
        gpu: &GpuInfo,
    ) -> Result<RuncSandbox, SandboxError> {
        let files = self.driver_files().await?;
        let info = gpu.clone();
        let params = tokio::task::spawn_blocking(move || files.for_gpu(&info))
            .await
            .map_err(|e| SandboxError::StartFailed(format!("reading the GPU's devices: {e}")))?
            .map_err(|e| SandboxError::StartFailed(e.to_string()))?;
        self.create_with_gpu(id, spec, code_dir, gpu, &params).await
    }

    /// [`Self::create_gpu`] with the host's part already found.
    async fn create_with_gpu(
        &self,
        id: SandboxId,
        spec: &FunctionSpec,
        code_dir: &Path,
        gpu: &GpuInfo,
        params: &GpuParams,
    ) -> Result<RuncSandbox, SandboxError> {
        let purpose = Purpose::Function {
            spec,
            code_dir,
            gpu: Some(params),
        };
        let mut sb = self.make(id, purpose).await?;
        sb.gpu = Some(gpu.clone());
        match self.move_memory(&mut sb, true).await {
            Ok(_) => Ok(sb),
            Err(e) => {
                let err = match e {
                    GpuOpError::Broken(e) => e,
                    GpuOpError::NoShim => SandboxError::StartFailed(
                        "the CUDA shim did not load in the sandbox (LD_PRELOAD)".into(),
                    ),
                    other => SandboxError::StartFailed(other.to_string()),
                };
                self.destroy(sb).await;
                Err(err)
            }
        }
    }

    /// The driver's libraries and the shim, looked for once (blocking work off the runtime).
    /// Sets the driver's files instead of finding them (a mock driver and stand-in nodes).
    #[cfg(test)]
    pub(crate) fn preset_gpu_files(&self, files: DriverFiles) {
        let _ = self.gpu_files.set(Arc::new(files));
    }

    async fn driver_files(&self) -> Result<Arc<DriverFiles>, SandboxError> {
        let shim = self.cfg.gpu_shim_path.clone();
        self.gpu_files
            .get_or_try_init(|| async move {
                tokio::task::spawn_blocking(move || DriverFiles::find(shim.as_deref()))
                    .await
                    .map_err(|e| SandboxError::StartFailed(format!("finding the GPU driver: {e}")))?
                    .map(Arc::new)
                    .map_err(|e| SandboxError::StartFailed(e.to_string()))
            })
            .await
            .cloned()
    }

    /// Moves a GPU sandbox's device memory to its GPU, waiting for the move (thesis §6.4.2:
    /// before an invocation of an active flow).
    pub async fn gpu_prefetch(&self, sb: &mut RuncSandbox) -> Result<GpuMemory, GpuOpError> {
        self.move_memory(sb, true).await
    }

    /// Moves a GPU sandbox's device memory to host memory, waiting for the move (its flow went
    /// idle, or the GPU's memory is needed).
    pub async fn gpu_swap_out(&self, sb: &mut RuncSandbox) -> Result<GpuMemory, GpuOpError> {
        self.move_memory(sb, false).await
    }

    /// A prefetch (`to_gpu`) or swap-out through the agent, thawing the sandbox for it and
    /// leaving it to the idle freezer afterwards, as an invocation does.
    async fn move_memory(
        &self,
        sb: &mut RuncSandbox,
        to_gpu: bool,
    ) -> Result<GpuMemory, GpuOpError> {
        if sb.gpu.is_none() {
            return Err(GpuOpError::NotGpu);
        }
        sb.freezer.begin().map_err(|e| {
            GpuOpError::Broken(SandboxError::Crashed(format!("thawing the sandbox: {e}")))
        })?;
        let moved = if to_gpu {
            sb.conn.prefetch(SANDBOX_DEVICE).await
        } else {
            sb.conn.swap_out().await
        };
        let outcome = match moved {
            Ok(m) => {
                sb.device_memory = Some(m.resident_bytes);
                Ok(m)
            }
            Err(AgentError::NoShim) => Err(GpuOpError::NoShim),
            Err(AgentError::Cuda { code }) => Err(GpuOpError::Cuda { code }),
            Err(e) => return Err(GpuOpError::Broken(self.diagnose_sandbox(sb, &e).await)),
        };
        self.idle.invocation_ended(&sb.freezer).map_err(|e| {
            GpuOpError::Broken(SandboxError::Crashed(format!("freezing the sandbox: {e}")))
        })?;
        outcome
    }

    /// Starts a generic sandbox (memory limit `memory_mb`) and waits until its agent listens.
    /// With `layer` (a digest), the layer is mounted and its modules imported first: a
    /// pre-imported sandbox, for the functions of that layer only.
    pub async fn create_generic(
        &self,
        id: SandboxId,
        memory_mb: u64,
        runtime: Option<&str>,
        layer: Option<&str>,
    ) -> Result<RuncSandbox, SandboxError> {
        // The limit is in the spec: a pre-import runs the layer's package code before the
        // agent answers, and must never run without it.
        self.make(
            id,
            Purpose::Generic {
                runtime,
                layer,
                memory_mb,
            },
        )
        .await
    }

    /// The runtime image of a sandbox: by digest, else the worker's default. A function whose
    /// image was removed from the store cannot start (its owner re-registers it).
    fn runtime_of(&self, digest: Option<&str>) -> Result<Runtime, SandboxError> {
        match digest {
            None => Ok(self.default_runtime.clone()),
            Some(d) if d == self.default_runtime.digest => Ok(self.default_runtime.clone()),
            Some(d) => self.runtimes.by_digest(d).ok_or_else(|| {
                SandboxError::StartFailed(format!(
                    "the function's runtime image {d} is no longer installed on this worker: \
                     register the function again"
                ))
            }),
        }
    }

    /// The digest of the default runtime image (`runc.default_runtime`).
    pub fn default_runtime_digest(&self) -> &str {
        &self.default_runtime.digest
    }

    /// The runtime store sandboxes and builds take images from.
    pub fn runtimes(&self) -> &RuntimeStore {
        &self.runtimes
    }

    async fn make(&self, id: SandboxId, purpose: Purpose<'_>) -> Result<RuncSandbox, SandboxError> {
        let container = format!("{}{}", self.prefix, id.0);
        // Short directory names keep the socket path under the 108-byte AF_UNIX limit.
        let dir = self.sandboxes_dir.join(id.0.to_string());
        let cgroups_path = self.cgroups_path(&container);
        let started = Instant::now();
        self.freeze_anchor();
        let layer = self.find_layer(purpose.layer()).await?;
        if let (Purpose::Function { spec, code_dir, .. }, Some(l)) = (purpose, &layer) {
            self.learn_imports(l, spec, code_dir).await;
        }
        let runtime = self.runtime_of(purpose.runtime())?;
        let uid = self.take_uid()?;
        let prepared = match self
            .write_bundle(&dir, purpose, &runtime, layer.as_ref(), &cgroups_path, uid)
            .await
        {
            Ok(()) => start_log_copier(&dir, self.cfg.log_file_bytes),
            Err(e) => Err(e),
        };
        let (log_pipe, mut log) = match prepared {
            Ok(p) => p,
            Err(e) => {
                discard_bundle_off_runtime(&dir).await;
                self.give_back_uid(uid, &cgroups_path);
                return Err(SandboxError::StartFailed(format!(
                    "writing the bundle: {e}"
                )));
            }
        };
        let mut conn = match self
            .start(&container, &dir, &cgroups_path, started, log_pipe, &mut log)
            .await
        {
            Ok(conn) => conn,
            Err(e) => {
                self.remove(&container, &dir, &mut log).await;
                self.give_back_uid(uid, &cgroups_path);
                return Err(e);
            }
        };
        let failure = match conn.health().await {
            // Frozen until its first invocation: whatever the handler's import started does
            // not run meanwhile.
            Ok(r) if r.status == 200 => {
                match Freezer::open_frozen(&oci::freezer_state_path(&cgroups_path)) {
                    Ok(freezer) => {
                        self.idle.track(&freezer);
                        let (code_dir, memory_mb) = match purpose {
                            Purpose::Function { spec, code_dir, .. } => {
                                (Some(code_dir.to_path_buf()), spec.memory_mb)
                            }
                            Purpose::Generic { memory_mb, .. } => (None, memory_mb),
                        };
                        return Ok(RuncSandbox {
                            container,
                            dir,
                            uid,
                            code_dir,
                            layer: layer.map(|l| l.digest),
                            cpu: self
                                .cpu_sched
                                .then(|| Arc::new(SandboxCpu::new(&cgroups_path))),
                            cgroups_path,
                            memory_mb,
                            conn,
                            freezer,
                            log,
                            gpu: None,
                            device_memory: None,
                        });
                    }
                    Err(e) => SandboxError::StartFailed(format!("freezing the sandbox: {e}")),
                }
            }
            Ok(r) => init_error(&r.body),
            Err(e) => {
                let memory_mb = match purpose {
                    Purpose::Function { spec, .. } => spec.memory_mb,
                    Purpose::Generic { memory_mb, .. } => memory_mb,
                };
                self.diagnose(&cgroups_path, memory_mb, &dir, &mut log, &e.to_string())
                    .await
            }
        };
        self.remove(&container, &dir, &mut log).await;
        self.give_back_uid(uid, &cgroups_path);
        Err(failure)
    }

    /// The stored layer of `digest` (reading its record off the runtime). A function whose
    /// layer this worker lacks cannot start here: the error names no host path.
    async fn find_layer(&self, digest: Option<&str>) -> Result<Option<Layer>, SandboxError> {
        let Some(digest) = digest else {
            return Ok(None);
        };
        let (store, d) = (self.layers.clone(), digest.to_string());
        let found = tokio::task::spawn_blocking(move || store.get(&d))
            .await
            .map_err(|e| SandboxError::StartFailed(format!("reading the layer: {e}")))?;
        found.map(Some).ok_or_else(|| {
            SandboxError::StartFailed(format!(
                "the dependency layer {digest} is not on this worker"
            ))
        })
    }

    /// A uid for a new sandbox, from the worker's range.
    fn take_uid(&self) -> Result<u32, SandboxError> {
        let mut pool = self.uids.lock().unwrap_or_else(|e| e.into_inner());
        pool.take().ok_or_else(|| {
            SandboxError::StartFailed(format!(
                "all {} sandbox uids of runc.uid_count are in use",
                self.cfg.uid_count
            ))
        })
    }

    /// Frees a removed sandbox's uid, unless a process of the sandbox is somehow left in its
    /// cgroup: then the uid stays taken (logged), for a new sandbox must never share it.
    fn give_back_uid(&self, uid: u32, cgroups_path: &str) {
        if cgroup_has_processes(cgroups_path) {
            tracing::warn!(uid, cgroup = %cgroups_path, "a removed sandbox still has processes; its uid stays taken");
            return;
        }
        let mut pool = self.uids.lock().unwrap_or_else(|e| e.into_inner());
        pool.give_back(uid);
    }

    /// How many sandbox uids are taken (sandboxes alive or being removed).
    pub fn uids_in_use(&self) -> usize {
        self.uids.lock().unwrap_or_else(|e| e.into_inner()).in_use()
    }

    /// Makes a generic sandbox `sb` the sandbox of `spec`: mounts its code at `/code`, sets its
    /// memory and CPU limits, and has the agent import the handler (with the function's env).
    /// On failure the sandbox is destroyed.
    pub async fn specialize(
        &self,
        mut sb: RuncSandbox,
        spec: &FunctionSpec,
        code_dir: &Path,
    ) -> Result<RuncSandbox, SandboxError> {
        if let Ok(Some(layer)) = self.find_layer(spec.layer.as_deref()).await {
            self.learn_imports(&layer, spec, code_dir).await;
        }
        match self.specialize_in_place(&mut sb, spec, code_dir).await {
            Ok(()) => Ok(sb),
            Err(e) => {
                self.destroy(sb).await;
                Err(e)
            }
        }
    }

    async fn specialize_in_place(
        &self,
        sb: &mut RuncSandbox,
        spec: &FunctionSpec,
        code_dir: &Path,
    ) -> Result<(), SandboxError> {
        if sb.code_dir.is_some() {
            return Err(SandboxError::StartFailed(
                "the sandbox already belongs to a function".into(),
            ));
        }
        if sb.layer != spec.layer {
            return Err(SandboxError::StartFailed(
                "the generic sandbox's dependency layer is not the function's".into(),
            ));
        }
        let fail = |what: &str, e: std::io::Error| {
            SandboxError::StartFailed(format!("specializing the sandbox ({what}): {e}"))
        };
        // Mounts and cgroup writes, on a blocking thread (not the runtime serving warm calls).
        let (code, point) = (code_dir.to_path_buf(), sb.dir.join(CODE_POINT));
        let empty = sb.dir.join(EMPTY_LAYER);
        let cgroups_path = sb.cgroups_path.clone();
        let (memory_mb, cpus) = (spec.memory_mb, spec.cpus);
        let shares = self.cfg.cpu_shares(memory_mb);
        // On failure the caller destroys the sandbox, which unmounts whatever was mounted.
        tokio::task::spawn_blocking(move || {
            match std::fs::DirBuilder::new().mode(0o700).create(&empty) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(("code", e)),
                _ => {}
            }
            code_mount::mount_code(&code, &point, &empty).map_err(|e| ("code", e))?;
            set_limits(&cgroups_path, memory_mb, cpus, shares).map_err(|e| ("limits", e))
        })
        .await
        .map_err(|e| fail("code", std::io::Error::other(e)))?
        .map_err(|(what, e)| fail(what, e))?;
        sb.code_dir = Some(code_dir.to_path_buf());
        sb.memory_mb = spec.memory_mb;
        let env: Vec<(String, String)> = spec
            .env
            .iter()
            .filter(|(k, v)| oci::user_env_allowed(k, v))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        sb.freezer
            .begin()
            .map_err(|e| SandboxError::StartFailed(format!("thawing the sandbox: {e}")))?;
        match sb.conn.load(&spec.handler, oci::CODE_MOUNT, &env).await {
            Ok(r) if r.status == 200 => self
                .idle
                .invocation_ended(&sb.freezer)
                .map_err(|e| SandboxError::StartFailed(format!("freezing the sandbox: {e}"))),
            Ok(r) => Err(init_error(&r.body)),
            Err(e) => Err(self.diagnose_sandbox(sb, &e).await),
        }
    }

    /// Creates and freezes [`FREEZER_ANCHOR`] once (again after [`Self::cleanup_all`]). Only
    /// a cost saving: failure is logged, and sandboxes are frozen all the same.
    fn freeze_anchor(&self) {
        use std::sync::atomic::Ordering;
        if self.anchor_frozen.load(Ordering::Relaxed) {
            return;
        }
        let dir = self.anchor_dir();
        match std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(dir.join("freezer.state"), "FROZEN"))
        {
            Ok(()) => self.anchor_frozen.store(true, Ordering::Relaxed),
            Err(e) => tracing::warn!(error = %e, "freezing the freezer anchor cgroup failed"),
        }
    }

    fn anchor_dir(&self) -> PathBuf {
        oci::cgroup_v1_dir(
            "freezer",
            &format!("{}/{FREEZER_ANCHOR}", self.cgroup_parent),
        )
    }

    /// `/hearth/<worker>/<container>`.
    fn cgroups_path(&self, container: &str) -> String {
        format!("{}/{}", self.cgroup_parent, container)
    }

    /// Writes the bundle: directories, the run tmpfs, (generic) the code mount point, and
    /// `config.json`. The spec is built here; the file system work (a dozen system calls and
    /// two mounts) runs on a blocking thread, not on the runtime that serves warm invocations.
    async fn write_bundle(
        &self,
        dir: &Path,
        purpose: Purpose<'_>,
        runtime: &Runtime,
        layer: Option<&Layer>,
        cgroups_path: &str,
        uid: u32,
    ) -> std::io::Result<()> {
        let run_dir = dir.join("run");
        let point = dir.join(CODE_POINT);
        let deps_point = dir.join(DEPS_POINT);
        let site_dir = layer.map(|l| l.site_dir.clone());
        let preimport = match (purpose, layer) {
            (Purpose::Generic { .. }, Some(l)) => oci::preimport_list(&self.preimports_of(l)),
            _ => String::new(),
        };
        let (code_dir, handler, env, memory_mb, cpus, gpu) = match purpose {
            Purpose::Function {
                spec,
                code_dir,
                gpu,
            } => {
                let env: Vec<(String, String)> = spec
                    .env
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                (
                    code_dir,
                    spec.handler.as_str(),
                    env,
                    spec.memory_mb,
                    spec.cpus,
                    gpu,
                )
            }
            Purpose::Generic { memory_mb, .. } => {
                (point.as_path(), "", Vec::new(), memory_mb, 0.0, None)
            }
        };
        let code_dir = code_dir.to_path_buf();
        let rootfs = dir.join(ROOTFS);
        let cpuset = self.cfg.cpuset.as_ref().map(ToString::to_string);
        let config = oci::runtime_spec(&OciParams {
            runtime_root: &runtime.rootfs,
            rootfs: &rootfs,
            code_dir: &point,
            run_dir: &run_dir,
            handler,
            env: &env,
            memory_mb,
            cpus,
            cpu_shares: self.cfg.cpu_shares(memory_mb),
            cpuset: cpuset.as_deref(),
            uid,
            gid: uid,
            cgroups_path,
            tmp_size_mb: self.cfg.tmp_size_mb,
            max_result_bytes: self.max_result_bytes,
            tmp_inodes: self.cfg.tmp_inodes,
            generic: matches!(purpose, Purpose::Generic { .. }),
            gpu,
            deps_dir: site_dir.as_ref().map(|_| deps_point.as_path()),
            preimport: &preimport,
        })
        .to_string();
        let generic = matches!(purpose, Purpose::Generic { .. });
        let (dir, cfg) = (dir.to_path_buf(), self.cfg.clone());
        tokio::task::spawn_blocking(move || {
            let private = |d: &Path| std::fs::DirBuilder::new().mode(0o700).create(d);
            private(&dir)?;
            private(&run_dir)?;
            mount_run_tmpfs(&run_dir, &cfg, uid)?;
            mount_rootfs(&rootfs)?;
            // Covered by the mount that becomes the sandbox's `/code`, whose root has the
            // code directory's mode (or the mount point tmpfs's 0755).
            private(&point)?;
            let empty = dir.join(EMPTY_LAYER);
            if !generic || site_dir.is_some() {
                private(&empty)?;
            }
            if generic {
                code_mount::prepare_mount_point(&point)?;
            } else {
                code_mount::mount_code(&code_dir, &point, &empty)?;
            }
            // The layer as the code: an overlay named by descriptor, read-only, nosuid, nodev.
            if let Some(site) = &site_dir {
                private(&deps_point)?;
                code_mount::mount_code(site, &deps_point, &empty)?;
            }
            use std::io::Write;
            private_file(&dir.join("config.json"))?.write_all(config.as_bytes())
        })
        .await
        .map_err(std::io::Error::other)?
    }

    /// `runc run --detach` with `log_pipe` as the sandbox's stdout and stderr, then waits for
    /// the agent's socket to accept.
    async fn start(
        &self,
        container: &str,
        dir: &Path,
        cgroups_path: &str,
        started: Instant,
        log_pipe: OwnedFd,
        log: &mut LogCopier,
    ) -> Result<AgentConn, SandboxError> {
        let stderr = log_pipe
            .try_clone()
            .map_err(|e| SandboxError::StartFailed(format!("creating the log pipe: {e}")))?;
        // The command (and with it the worker's ends of the pipe) is dropped once runc returns:
        // from then on only the sandbox holds the pipe open.
        let status = self
            .runc()
            .arg("run")
            .arg("--detach")
            .arg("--no-new-keyring")
            .arg("--bundle")
            .arg(dir)
            .arg(container)
            .stdout(log_pipe)
            .stderr(stderr)
            .status()
            .await
            .map_err(|e| SandboxError::StartFailed(format!("running runc: {e}")))?;
        if !status.success() {
            log.settle(LOG_SETTLE_WAIT).await;
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
                log.settle(LOG_SETTLE_WAIT).await;
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

    /// Thaws the sandbox if it was frozen and runs one invocation; it is frozen again once idle
    /// for `idle_freeze_ms`, so nothing in a sandbox runs longer than that between invocations.
    /// A sandbox that cannot be frozen is reported broken (and destroyed).
    pub async fn invoke(
        &self,
        sb: &mut RuncSandbox,
        args: &[u8],
    ) -> Result<AgentReply, SandboxError> {
        sb.freezer
            .begin()
            .map_err(|e| SandboxError::Crashed(format!("thawing the sandbox: {e}")))?;
        match sb.conn.invoke(args).await {
            Ok(r) => {
                if r.device_memory_bytes.is_some() {
                    sb.device_memory = r.device_memory_bytes;
                }
                self.idle
                    .invocation_ended(&sb.freezer)
                    .map_err(|e| SandboxError::Crashed(format!("freezing the sandbox: {e}")))?;
                Ok(r)
            }
            // The worker cut the read: the connection is unusable and the sandbox goes.
            Err(AgentError::TooLarge { limit, .. }) => Err(SandboxError::ResultTooLarge { limit }),
            Err(e) => Err(self.diagnose_sandbox(sb, &e).await),
        }
    }

    /// [`Self::diagnose`] for a sandbox whose agent connection failed with `err`.
    async fn diagnose_sandbox(&self, sb: &mut RuncSandbox, err: &AgentError) -> SandboxError {
        let (cgroups_path, memory_mb, dir) = (&sb.cgroups_path, sb.memory_mb, &sb.dir);
        self.diagnose(cgroups_path, memory_mb, dir, &mut sb.log, &err.to_string())
            .await
    }

    /// Tells an OOM kill from any other death of the agent.
    async fn diagnose(
        &self,
        cgroups_path: &str,
        memory_mb: u64,
        dir: &Path,
        log: &mut LogCopier,
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
        // If the sandbox is dead, its last words reach the log within moments.
        log.settle(LOG_SETTLE_WAIT).await;
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
            uid,
            cgroups_path,
            conn,
            freezer,
            mut log,
            ..
        } = sb;
        drop(conn);
        drop(freezer);
        self.remove(&container, &dir, &mut log).await;
        self.give_back_uid(uid, &cgroups_path);
    }

    /// Kills the container, waits for its log to be copied, deletes it (runc removes its
    /// cgroups), and removes its bundle directory with the run tmpfs. `kill` first: `delete
    /// --force` on a running container sleeps 100 ms after its SIGKILL.
    async fn remove(&self, container: &str, dir: &Path, log: &mut LogCopier) {
        self.remove_in(&self.cgroup_parent, container, dir, log)
            .await
    }

    /// [`Self::remove`] for a container under the cgroup parent `parent` (an earlier worker id's
    /// after a restart under a new one).
    async fn remove_in(&self, parent: &str, container: &str, dir: &Path, log: &mut LogCopier) {
        let _ = self
            .runc()
            .args(["kill", container, "KILL"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await;
        if self.cpu_sched {
            // Killed, its tasks run no more user code, but they must run to exit: a demoted
            // sandbox beside boosted ones would hardly run, and `runc delete` would wait.
            let path = format!("{parent}/{container}");
            let _ = tokio::task::spawn_blocking(move || {
                crate::cpu_sched::cgroup::raise_for_teardown(&path)
            })
            .await;
        }
        // In a frozen cgroup (v1) the SIGKILL takes effect only once the tasks are thawed; they
        // run no user code before dying. Fails harmlessly if the cgroup is gone.
        let _ = std::fs::write(
            oci::freezer_state_path(&format!("{parent}/{container}")),
            "THAWED",
        );
        // The copier reaches the end of the output once the last process of the sandbox has
        // exited; waiting for it here also spares `delete --force` its 100 ms sleep.
        log.finish(LOG_DRAIN_WAIT).await;
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
        // runc's delete gives up on a cgroup whose last task is still exiting (EBUSY), which
        // left an empty sandbox cgroup behind now and then; try once more now that it is done.
        let path = format!("{parent}/{container}");
        let _ = tokio::task::spawn_blocking(move || oci::remove_cgroup_dirs(&path)).await;
        discard_bundle_off_runtime(dir).await;
    }

    /// Removes every container, bundle and cgroup left in this data directory, whatever worker
    /// id made them: a worker restarted under a new id must not orphan its old sandboxes. The
    /// data directory is one worker's; its runc state root lists only its containers, and the
    /// cgroup parents it used are recorded in [`CGROUP_PARENTS_FILE`].
    pub async fn cleanup_all(&self) {
        let record = self.state_root.join(CGROUP_PARENTS_FILE);
        let mut parents: Vec<String> = std::fs::read_to_string(&record)
            .unwrap_or_default()
            .lines()
            .map(str::trim)
            .filter(|p| is_worker_cgroup_parent(p))
            .map(str::to_string)
            .collect();
        let listed = self.runc().arg("list").arg("--quiet").output().await;
        if let Ok(out) = listed {
            for name in String::from_utf8_lossy(&out.stdout).lines() {
                let name = name.trim();
                // `hearth-<worker>-<sandbox id>`: the worker part names its cgroup parent.
                let Some((worker, id)) = name
                    .strip_prefix("hearth-")
                    .and_then(|rest| rest.rsplit_once('-'))
                else {
                    continue;
                };
                let parent = format!("/hearth/{worker}");
                let mut no_log = LogCopier { task: None };
                self.remove_in(&parent, name, &self.sandboxes_dir.join(id), &mut no_log)
                    .await;
                if is_worker_cgroup_parent(&parent) && !parents.contains(&parent) {
                    parents.push(parent);
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(&self.sandboxes_dir) {
            for e in entries.flatten() {
                discard_bundle(&e.path());
            }
        }
        self.anchor_frozen
            .store(false, std::sync::atomic::Ordering::Relaxed);
        if !parents.contains(&self.cgroup_parent) {
            parents.push(self.cgroup_parent.clone());
        }
        for parent in &parents {
            remove_cgroup_parent(parent);
        }
        // Recorded before any sandbox is made, so that a crash of this worker is cleaned up by
        // the next one whatever its id.
        if let Err(e) = std::fs::write(&record, format!("{}\n", self.cgroup_parent)) {
            tracing::warn!(error = %e, "recording the worker's cgroup parent failed");
        }
        // The shared `/hearth` parent stays: removing it when empty raced with another worker
        // whose runc was creating `/hearth/<worker>` in it (runc failed with ENOENT).
    }
}

/// In the runc state root: the cgroup parents (`/hearth/<worker>`) this data directory's
/// workers used.
const CGROUP_PARENTS_FILE: &str = "hearth-cgroup-parents";

/// `/hearth/<worker>` with a sanitized worker id: never anything else is removed.
fn is_worker_cgroup_parent(p: &str) -> bool {
    p.strip_prefix("/hearth/")
        .is_some_and(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
}

/// Removes a worker's cgroups: its freezer anchor (empty, so removable while frozen), sandbox
/// cgroups runc could not delete (a crashed worker), then the parent itself.
fn remove_cgroup_parent(parent: &str) {
    if let Err(e) = oci::remove_cgroup_dirs(&format!("{parent}/{FREEZER_ANCHOR}")) {
        tracing::warn!(cgroup = %parent, error = %e, "removing the freezer anchor cgroup failed");
    }
    let memory_parent = oci::cgroup_v1_dir("memory", parent);
    if let Ok(children) = std::fs::read_dir(&memory_parent) {
        for c in children.flatten().filter(|c| c.path().is_dir()) {
            let child = format!("{parent}/{}", c.file_name().to_string_lossy());
            let _ = oci::remove_cgroup_dirs(&child);
        }
    }
    if let Err(e) = oci::remove_cgroup_dirs(parent) {
        tracing::warn!(cgroup = %parent, error = %e, "removing cgroups failed");
    }
}

/// Creates a file only root can read (fails if it exists).
fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

/// Mounts the tmpfs that becomes the sandbox's /hearth/run: bounded in bytes and in files (the
/// host disk is not), owned by the sandbox user; its pages are charged to the memory cgroup of
/// the sandbox that writes them.
fn mount_run_tmpfs(run_dir: &Path, cfg: &RuncConfig, uid: u32) -> std::io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let invalid = |_| std::io::Error::from(std::io::ErrorKind::InvalidInput);
    let target = CString::new(run_dir.as_os_str().as_bytes()).map_err(invalid)?;
    let data = CString::new(format!(
        "size={}m,nr_inodes={},mode=0700,uid={},gid={}",
        cfg.run_size_mb, cfg.run_inodes, uid, uid
    ))
    .map_err(invalid)?;
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            c"hearth-run".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Removes a bundle directory, unmounting its code, run and root tmpfs first (lazily: a
/// dying sandbox may still hold them). Never fails; problems are logged.
fn discard_bundle(dir: &Path) {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    code_mount::unmount_all(&dir.join(CODE_POINT));
    code_mount::unmount_all(&dir.join(DEPS_POINT));
    for sub in ["run", ROOTFS] {
        if let Ok(path) = CString::new(dir.join(sub).as_os_str().as_bytes()) {
            // SAFETY: `path` is a NUL-terminated path that outlives the call. EINVAL (not a
            // mount point) and ENOENT are the normal answers when nothing is mounted.
            unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
        }
    }
    if let Err(e) = std::fs::remove_dir_all(dir) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(dir = %dir.display(), error = %e, "removing sandbox dir failed");
        }
    }
}

/// [`discard_bundle`] on a blocking thread: unmounting and removing a directory tree are
/// system calls by the dozen.
async fn discard_bundle_off_runtime(dir: &Path) {
    let dir = dir.to_path_buf();
    let _ = tokio::task::spawn_blocking(move || discard_bundle(&dir)).await;
}

/// The kernel's Landlock ABI version (`landlock_create_ruleset(NULL, 0,
/// LANDLOCK_CREATE_RULESET_VERSION)`), None without Landlock.
fn landlock_abi() -> Option<i64> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with this flag the kernel reads neither pointer nor size.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    (v > 0).then_some(v)
}

/// Makes the sandbox's root: a tmpfs at `rootfs` (so mountinfo inside shows `/` for it, not
/// a host path) with the base layout and the agent script, read-only for the sandbox user.
fn mount_rootfs(rootfs: &Path) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::DirBuilder::new().mode(0o700).create(rootfs)?;
    let flags = libc::MS_NOSUID | libc::MS_NODEV;
    code_mount::mount(c"hearth-root", rootfs, c"tmpfs", flags, ROOTFS_TMPFS)?;
    oci::prepare_base_rootfs(rootfs)?;
    let agent_dir = rootfs.join(oci::AGENT_MOUNT.trim_start_matches('/'));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(agent_dir.join(oci::AGENT_FILE))?
        .write_all(AGENT_SOURCE.as_bytes())
}

/// Creates the sandbox's output pipe and starts copying it into `<dir>/stdio.log`. Returns the
/// write end, which becomes the sandbox's stdout and stderr.
fn start_log_copier(dir: &Path, file_bytes: u64) -> std::io::Result<(OwnedFd, LogCopier)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both are open descriptors that nothing else owns.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let reader = pipe::Receiver::from_owned_fd(read)?;
    let file = tokio::fs::File::from_std(private_file(&dir.join(LOG_NAME))?);
    let task = tokio::spawn(copy_log(reader, file, dir.to_path_buf(), file_bytes));
    Ok((write, LogCopier { task: Some(task) }))
}

/// Copies the sandbox's output into its log, rotating `stdio.log` to `stdio.log.1` whenever it
/// reaches `file_bytes`. It always drains the pipe, so a sandbox that prints a lot never blocks
/// for long, and it holds one fixed buffer, so it never grows; if the log cannot be written
/// (the bundle is being removed) the output is dropped.
async fn copy_log(mut pipe: pipe::Receiver, file: tokio::fs::File, dir: PathBuf, file_bytes: u64) {
    let mut file = Some(file);
    let mut buf = vec![0u8; LOG_CHUNK];
    let mut written: u64 = 0;
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!(error = %e, "reading a sandbox's output failed");
                break;
            }
        };
        let mut chunk = &buf[..n];
        while !chunk.is_empty() {
            if written >= file_bytes {
                file = rotate_log(file.take(), &dir).await;
                written = 0;
            }
            let room = usize::try_from(file_bytes - written).unwrap_or(usize::MAX);
            let (now, rest) = chunk.split_at(chunk.len().min(room));
            if let Some(f) = file.as_mut() {
                if f.write_all(now).await.is_err() {
                    file = None;
                }
            }
            written += now.len() as u64;
            chunk = rest;
        }
    }
    if let Some(mut f) = file {
        let _ = f.flush().await;
    }
}

/// `stdio.log` becomes `stdio.log.1` (replacing the older one) and a new `stdio.log` begins.
async fn rotate_log(file: Option<tokio::fs::File>, dir: &Path) -> Option<tokio::fs::File> {
    // Flushing waits for the copier's pending write, so no byte lands after the rename.
    file?.flush().await.ok()?;
    let log = dir.join(LOG_NAME);
    tokio::fs::rename(&log, dir.join(LOG_ROTATED)).await.ok()?;
    let file = tokio::task::spawn_blocking(move || private_file(&log))
        .await
        .ok()?
        .ok()?;
    Some(tokio::fs::File::from_std(file))
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

/// The last lines the sandbox printed (from the last [`LOG_TAIL_BYTES`] of its log), for error
/// messages.
fn log_tail(dir: &Path, lines: usize) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(dir.join(LOG_NAME)) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let mut bytes = Vec::new();
    if f.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)))
        .is_err()
        || f.take(LOG_TAIL_BYTES).read_to_end(&mut bytes).is_err()
    {
        return String::new();
    }
    let text = String::from_utf8_lossy(&bytes);
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

/// Sets a sandbox's memory limit (0: none), CPU quota (0: none) and, when CPU follows memory,
/// its `cpu.shares` in its cgroups (v1). A generic sandbox gets its function's limits this way
/// when it is specialized.
fn set_limits(
    cgroups_path: &str,
    memory_mb: u64,
    cpus: f64,
    shares: Option<u64>,
) -> std::io::Result<()> {
    let memory = oci::cgroup_v1_dir("memory", cgroups_path);
    let limit = if memory_mb == 0 {
        "-1".to_string()
    } else {
        memory_mb.saturating_mul(1024 * 1024).to_string()
    };
    std::fs::write(memory.join("memory.limit_in_bytes"), limit)?;
    let cpu = oci::cgroup_v1_dir("cpu", cgroups_path);
    let quota = oci::cpu_quota_us(cpus).unwrap_or(-1);
    std::fs::write(
        cpu.join("cpu.cfs_period_us"),
        oci::CPU_PERIOD_US.to_string(),
    )?;
    std::fs::write(cpu.join("cpu.cfs_quota_us"), quota.to_string())?;
    match shares {
        Some(shares) => std::fs::write(cpu.join("cpu.shares"), shares.to_string()),
        None => Ok(()),
    }
}

#[cfg(test)]
pub(crate) mod gpu_tests {
    //! A GPU sandbox started by runc for real, on any machine: the shim and the mock driver of
    //! runtime/gpu-shim's tests stand in for the NVIDIA driver, and harmless character devices
    //! (null, zero) for its nodes. Needs root, runc, a cgroup v1 freezer and gcc; without them
    //! it says why and passes.
    use super::*;
    use crate::backend::oci::DeviceNode;

    const HANDLER: &str = r#"
import ctypes, os

cuda = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
glob = ctypes.CDLL(None)
held = []

def main(args):
    if "fail" in args:
        return {"fail": cuda.mock_cuda_fail(args["fail"].encode(), args["rc"])}
    st = os.stat("/dev/nvidiactl")
    with open("/proc/self/maps") as f:
        maps = f.read()
    out = {
        "ctl": [os.major(st.st_rdev), os.minor(st.st_rdev)],
        "gpu0": os.path.exists("/dev/nvidia0"),
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "preload": os.environ.get("LD_PRELOAD"),
        "shim_mapped": "/hearth/gpu/libhearth_cuda_shim.so" in maps,
        "driver_mapped": "/hearth/gpu/lib/libcuda.so.1" in maps,
        "set": cuda.cuCtxSetCurrent(ctypes.c_void_p(0x1000)),
    }
    ptr = ctypes.c_uint64(0)
    out["alloc"] = glob.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(args["bytes"]))
    held.append(ptr)
    return out
"#;

    pub(crate) fn usable() -> bool {
        let ok = unsafe { libc::geteuid() } == 0
            && Path::new("/sys/fs/cgroup/freezer").is_dir()
            && std::process::Command::new("runc")
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
            && std::process::Command::new("gcc")
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success());
        if !ok {
            eprintln!(
                "skipping: the mock GPU sandbox test needs root, runc, a cgroup v1 freezer and gcc"
            );
        }
        ok
    }

    /// Builds the shim and the mock `libcuda.so.1` into `out`.
    pub(crate) fn build(out: &Path) -> (PathBuf, PathBuf) {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../runtime/gpu-shim");
        let shim = out.join("libhearth_cuda_shim.so");
        let mock = out.join("mock/libcuda.so.1");
        let status = std::process::Command::new("make")
            .arg("-s")
            .arg("-C")
            .arg(&src)
            .arg(format!("OUT={}", out.display()))
            .arg(&shim)
            .arg(&mock)
            .status()
            .unwrap();
        assert!(status.success(), "building the shim and the mock driver");
        (shim, mock)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_gpu_sandbox_runs_with_its_nodes_driver_and_shim() {
        if !usable() {
            return;
        }
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::Builder::new()
            .prefix("hgpu")
            .tempdir_in("/tmp")
            .unwrap();
        let (shim, mock) = build(&tmp.path().join("b"));
        let code = tmp.path().join("code");
        std::fs::create_dir(&code).unwrap();
        std::fs::write(code.join("main.py"), HANDLER).unwrap();
        for p in [tmp.path(), &code] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let b = RuncBackend::new(
            RuncConfig::default(),
            &tmp.path().join("d"),
            &format!("gt{}", std::process::id()),
            1 << 20,
            false,
        )
        .await
        .unwrap();
        let node = |path: &str, minor| DeviceNode {
            path: path.to_string(),
            major: 1,
            minor,
        };
        let params = GpuParams {
            // Named as the driver's, numbered as /dev/null and /dev/zero.
            devices: vec![
                node("/dev/nvidiactl", 3),
                node("/dev/nvidia-uvm", 5),
                node("/dev/nvidia1", 5),
            ],
            libraries: vec![("libcuda.so.1".to_string(), mock)],
            shim,
        };
        let gpu = GpuInfo {
            index: 1,
            name: "mock".into(),
            uuid: "GPU-mock".into(),
            memory_mb: 1024,
        };
        let mut spec = FunctionSpec::new("g");
        spec.memory_mb = 256;
        spec.env
            .insert("LD_PRELOAD".to_string(), "/code/evil.so".to_string());

        let mut sb = b
            .create_with_gpu(SandboxId(7), &spec, &code, &gpu, &params)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(sb.gpu().map(|g| g.index), Some(1));
        assert_eq!(sb.device_memory_bytes(), Some(0));
        // A GPU sandbox runs as its own uid too, given back when it goes (below). The worker's
        // block is the first one no other worker on this host holds.
        let base = u64::from(RuncConfig::default().uid_base);
        let span = 65_536 * MAX_UID_BLOCKS;
        assert!(
            (base..base + span).contains(&u64::from(sb.uid())),
            "{}",
            sb.uid()
        );
        assert_eq!(b.uids_in_use(), 1);

        let r = b.invoke(&mut sb, br#"{"bytes": 1048576}"#).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(r.status, 200, "{v}");
        assert_eq!(
            v,
            serde_json::json!({
                "ctl": [1, 3], "gpu0": false, "visible": "0",
                "preload": "/hearth/gpu/libhearth_cuda_shim.so",
                "shim_mapped": true, "driver_mapped": true, "set": 0, "alloc": 0,
            })
        );
        assert_eq!(r.device_memory_bytes, Some(1 << 20));
        assert_eq!(sb.device_memory_bytes(), Some(1 << 20));

        let out = b.gpu_swap_out(&mut sb).await.unwrap();
        assert_eq!(
            out,
            GpuMemory {
                resident_bytes: 1 << 20,
                regions: 1
            }
        );
        assert_eq!(b.gpu_prefetch(&mut sb).await.unwrap(), out);

        // A driver refusal is typed, and the sandbox goes on serving.
        let r = b
            .invoke(&mut sb, br#"{"fail": "cuMemPrefetchAsync", "rc": 700}"#)
            .await
            .unwrap();
        assert_eq!(&r.body[..], br#"{"fail":0}"#);
        match b.gpu_swap_out(&mut sb).await {
            Err(e @ GpuOpError::Cuda { code: Some(700) }) => assert!(!e.is_fatal()),
            other => panic!("{other:?}"),
        }
        let r = b.invoke(&mut sb, br#"{"bytes": 4096}"#).await.unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.device_memory_bytes, Some((1 << 20) + 4096));

        b.destroy(sb).await;
        assert_eq!(
            b.uids_in_use(),
            0,
            "the uid is free once the sandbox is gone"
        );
        b.cleanup_all().await;
    }
}

#[cfg(test)]
mod uid_tests {
    use super::{claim_uid_block, handler_imports, UidPool};

    /// Workers on one host with the same range take consecutive blocks, and a block is free
    /// again once its worker is gone (its lock file closed).
    #[test]
    fn workers_on_one_host_get_blocks_apart() {
        let dir = tempfile::tempdir().unwrap();
        let a = claim_uid_block(dir.path(), 2_000_000_000, 1000).unwrap();
        let b = claim_uid_block(dir.path(), 2_000_000_000, 1000).unwrap();
        assert_eq!((a.base, b.base), (2_000_000_000, 2_000_001_000));
        drop(a);
        let c = claim_uid_block(dir.path(), 2_000_000_000, 1000).unwrap();
        assert_eq!(c.base, 2_000_000_000);
        // No block past the last uid.
        let top = u32::MAX - 2 - 1000;
        let d = claim_uid_block(dir.path(), top, 1000).unwrap();
        assert_eq!(d.base, top);
        let e = claim_uid_block(dir.path(), top, 1000).unwrap_err();
        assert!(e.to_string().contains("taken by another worker"), "{e}");
    }

    /// Where the kernel lists Landlock among its security modules, the worker finds it (and
    /// does not warn at start).
    #[test]
    fn a_handlers_imports_from_its_layer_are_learned_and_nothing_else() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(
            t.path().join("main.py"),
            "import numpy as np, os\nfrom PIL import Image, ImageFilter as F  # x\n\
             from . import helper\nimport mylocal\nfrom sklearn.linear_model import (Ridge)\n\
             from PIL import *\nimport os; rm -rf\n",
        )
        .unwrap();
        let roots: Vec<String> = ["numpy", "PIL", "sklearn"].map(String::from).to_vec();
        assert_eq!(
            handler_imports(t.path(), "main.main", &roots),
            [
                "numpy",
                "PIL",
                "PIL.Image",
                "PIL.ImageFilter",
                "sklearn.linear_model",
                "sklearn.linear_model.Ridge"
            ]
        );
        // A package handler, and no module file at all.
        std::fs::create_dir(t.path().join("pkg")).unwrap();
        std::fs::write(t.path().join("pkg/__init__.py"), "import sklearn\n").unwrap();
        assert_eq!(handler_imports(t.path(), "pkg.run", &roots), ["sklearn"]);
        assert!(handler_imports(t.path(), "nothere.main", &roots).is_empty());
    }

    #[test]
    fn landlock_is_found_where_the_kernel_has_it() {
        let lsm = std::fs::read_to_string("/sys/kernel/security/lsm").unwrap_or_default();
        if lsm.split(',').any(|m| m.trim() == "landlock") {
            assert!(super::landlock_abi().is_some_and(|v| v >= 1));
        } else {
            eprintln!("skipped: no Landlock listed in /sys/kernel/security/lsm");
        }
    }

    #[test]
    fn every_live_sandbox_has_its_own_uid_and_a_freed_one_comes_back_last() {
        let mut pool = UidPool::new(2_000_000_000, 4);
        let taken: Vec<u32> = (0..4).map(|_| pool.take().unwrap()).collect();
        assert_eq!(
            taken,
            [2_000_000_000, 2_000_000_001, 2_000_000_002, 2_000_000_003]
        );
        assert_eq!(pool.take(), None, "all four are in use");
        pool.give_back(2_000_000_001);
        assert_eq!(pool.in_use(), 3);
        assert_eq!(pool.take(), Some(2_000_000_001));
        // Freed 0 and 2: the next taken is after the last taken (1), so 2 before 0.
        pool.give_back(2_000_000_000);
        pool.give_back(2_000_000_002);
        assert_eq!(pool.take(), Some(2_000_000_002));
        assert_eq!(pool.take(), Some(2_000_000_000));
        assert_eq!(pool.take(), None);
    }

    #[test]
    fn a_range_of_one_uid_serves_one_sandbox_at_a_time() {
        let mut pool = UidPool::new(3_000_000_000, 1);
        assert_eq!(pool.take(), Some(3_000_000_000));
        assert_eq!(pool.take(), None);
        pool.give_back(3_000_000_000);
        assert_eq!(pool.take(), Some(3_000_000_000));
    }
}

#[cfg(test)]
mod layer_tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const HANDLER: &str = r#"
import os, sys, time
t0 = time.perf_counter()
import slowpkg
IMPORT_MS = (time.perf_counter() - t0) * 1000

def main(args):
    try:
        open("/hearth/deps/slowpkg/evil.py", "w").write("x")
        write = "written"
    except OSError as e:
        write = e.errno
    mounts = [l for l in open("/proc/self/mountinfo") if " /hearth/deps " in l]
    return {"value": slowpkg.m7.VALUE, "file": slowpkg.__file__, "path": sys.path[:2],
            "write": write, "mounts": mounts, "import_ms": IMPORT_MS,
            "env": {k: v for k, v in os.environ.items() if k.startswith("HEARTH_")}}
"#;

    fn usable() -> bool {
        let ok = unsafe { libc::geteuid() } == 0
            && Path::new("/sys/fs/cgroup/freezer").is_dir()
            && std::process::Command::new("runc")
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success());
        if !ok {
            eprintln!("skipping: the layer sandbox test needs root, runc and a cgroup v1 freezer");
        }
        ok
    }

    /// A layer in the store's layout whose package takes measurable time to import (300
    /// modules), world-readable as a built layer is.
    fn write_layer(store: &Path, digest: &str) -> PathBuf {
        let hex = crate::runtimes::digest_hex(digest).unwrap();
        let site = store.join(hex).join("site");
        let pkg = site.join("slowpkg");
        std::fs::create_dir_all(&pkg).unwrap();
        let mut init = String::new();
        for i in 0..300 {
            init.push_str(&format!("from . import m{i}\n"));
            let body: String = (0..20)
                .map(|j| format!("def f{j}(x):\n    return x + {j}\n"))
                .collect();
            std::fs::write(pkg.join(format!("m{i}.py")), format!("VALUE = {i}\n{body}")).unwrap();
        }
        std::fs::write(pkg.join("__init__.py"), init).unwrap();
        let layer = Layer {
            digest: digest.to_string(),
            runtime_digest: format!("sha256:{}", "ab".repeat(32)),
            requirements: "slowpkg==1\n".into(),
            bytes: 1,
            modules: vec!["slowpkg".into(), "bad name".into(), "missing_mod".into()],
            site_dir: PathBuf::new(),
        };
        std::fs::write(
            store.join(hex).join("layer.json"),
            serde_json::to_vec(&layer).unwrap(),
        )
        .unwrap();
        for e in walk(store) {
            let mode = if e.is_dir() { 0o755 } else { 0o644 };
            std::fs::set_permissions(&e, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        site
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut out = vec![dir.to_path_buf()];
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_layer_is_mounted_read_only_without_its_path_and_preimported_in_a_generic_sandbox() {
        if !usable() {
            return;
        }
        let tmp = tempfile::Builder::new()
            .prefix("hlay")
            .tempdir_in("/tmp")
            .unwrap();
        let data = tmp.path().join("d");
        let digest = format!("sha256:{}", "5e".repeat(32));
        write_layer(&data.join("layers"), &digest);
        let code = tmp.path().join("code");
        std::fs::create_dir(&code).unwrap();
        std::fs::write(code.join("main.py"), HANDLER).unwrap();
        for p in [tmp.path(), &code] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let b = RuncBackend::new(
            RuncConfig::default(),
            &data,
            &format!("lt{}", std::process::id()),
            1 << 20,
            false,
        )
        .await
        .unwrap();
        let mut spec = FunctionSpec::new("f");
        spec.memory_mb = 256;
        spec.layer = Some(digest.clone());

        // A function's own sandbox: the layer right after the code, read-only, no host path.
        let mut sb = b
            .create(SandboxId(1), &spec, &code)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let r = b.invoke(&mut sb, b"{}").await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(r.status, 200, "{v}");
        assert_eq!(v["value"], 7);
        assert_eq!(v["file"], "/hearth/deps/slowpkg/__init__.py");
        assert_eq!(v["path"], serde_json::json!(["/code", "/hearth/deps"]));
        assert_eq!(v["write"], libc::EROFS, "{v}");
        assert_eq!(v["env"]["HEARTH_DEPS"], "/hearth/deps");
        assert!(v["env"].get("HEARTH_PREIMPORT").is_none(), "{v}");
        let mounts = v["mounts"].as_array().unwrap();
        assert_eq!(mounts.len(), 1, "{v}");
        let line = mounts[0].as_str().unwrap();
        let host = tmp.path().to_string_lossy().to_string();
        assert!(!line.contains(&host) && !line.contains("5e5e"), "{line}");
        assert!(line.contains(" ro,") && line.contains("nosuid") && line.contains("nodev"));
        let cold_import_ms = v["import_ms"].as_f64().unwrap();
        b.destroy(sb).await;

        // A generic sandbox of a layer: its modules imported before it is ready (the bad name
        // and the missing module skipped), the handler's import then a dictionary lookup.
        let g = b
            .create_generic(SandboxId(2), 256, None, Some(&digest))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // Its limit came with its spec: the pre-import ran under it.
        let limit = std::fs::read_to_string(format!(
            "/sys/fs/cgroup/memory{}/memory.limit_in_bytes",
            g.cgroups_path
        ))
        .unwrap();
        assert_eq!(limit.trim(), (256u64 << 20).to_string());
        let mut sb = b.specialize(g, &spec, &code).await.unwrap();
        let r = b.invoke(&mut sb, b"{}").await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(r.status, 200, "{v}");
        assert_eq!(v["value"], 7);
        assert!(v["env"].get("HEARTH_PREIMPORT").is_none(), "{v}");
        let warm_import_ms = v["import_ms"].as_f64().unwrap();
        assert!(
            warm_import_ms * 10.0 < cold_import_ms,
            "pre-imported {warm_import_ms} ms vs {cold_import_ms} ms"
        );
        b.destroy(sb).await;

        // Keys never mix: a bare generic sandbox refuses a function of a layer, and a
        // function of an absent layer cannot start.
        let g = b
            .create_generic(SandboxId(3), 256, None, None)
            .await
            .unwrap();
        assert!(matches!(
            b.specialize(g, &spec, &code).await,
            Err(SandboxError::StartFailed(_))
        ));
        spec.layer = Some(format!("sha256:{}", "77".repeat(32)));
        match b.create(SandboxId(4), &spec, &code).await {
            Err(SandboxError::StartFailed(e)) => assert!(!e.contains(&host), "{e}"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("started without its layer"),
        }
        assert_eq!(b.uids_in_use(), 0);
        b.cleanup_all().await;
        let left = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!left.contains(&host), "mounts left behind");
    }
}
