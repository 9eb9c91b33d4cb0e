//! The build sandbox: where `pip` installs a layer and `compileall` byte-compiles a layer or a
//! function's code (issue 32 §2, docs/dependencies.md).
//!
//! A build runs in a runc container of its own with the same isolation as a function's
//! sandbox (no capabilities, the seccomp profile of [`oci::seccomp_profile`], a network
//! namespace with only loopback, its own uid from a block claimed like the sandboxes' uids),
//! its own cgroup (`/hearth/<worker>/build-<n>`) with `build.memory_mb`, `build.cpus` and a
//! pids limit, and a wall-clock `build.timeout_s` after which it is killed. Its root is the
//! runtime image's `/usr` and `/etc`, read-only; the only place it can write is `/out`, a tmpfs
//! the worker mounts with `size=build.max_layer_mb` (so a layer can never take more disk than
//! that), plus a small `/tmp`. What it produced is copied from the tmpfs into the layer store
//! by the worker, which never follows a link it finds there.

use crate::backend::oci;
use crate::backend::runc::{claim_uid_block, UidBlock, UidPool};
use crate::layers::proxy::{AllowList, BuildProxy};
use crate::layers::{Layer, LayerStore};
use crate::runtimes::{digest_hex, Runtime};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::ffi::CString;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::process::Command;

/// Most `find_links` directories (each is a mount point of the build root).
pub const MAX_FIND_LINKS: usize = 8;
/// Where the requirements file is, inside a build.
const REQ_MOUNT: &str = "/req";
/// The build's only writable tree (a tmpfs of `max_layer_mb`).
const OUT_MOUNT: &str = "/out";
/// Where the find-links directories are, inside a build: `/links/<i>`.
const LINKS_MOUNT: &str = "/links";
/// Bytes of a build's output kept for its log (the tail is what a failure shows).
const LOG_KEEP_BYTES: usize = 64 * 1024;
/// Processes a build may have: pip and compileall's workers.
const BUILD_PIDS: i64 = 256;
/// Uids of build sandboxes: a block of this many, claimed below the sandboxes' `uid_base`.
const BUILD_UID_COUNT: u32 = 16;
/// Blocks the claim may go through (workers on one host).
const BUILD_UID_BLOCKS: u32 = 1024;
/// The host-wide directory of uid block locks (the same as the sandboxes').
const UID_LOCK_DIR: &str = "/run/hearth";

/// `[build]`: how layers and bytecode are built (docs/configuration.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BuildSettings {
    /// Memory of one build sandbox, MiB (pip resolving and unpacking large wheels).
    pub memory_mb: u64,
    /// CPUs of one build sandbox (CFS quota).
    pub cpus: f64,
    /// Wall-clock limit of one build, seconds: then it is killed and the function fails.
    pub timeout_s: u64,
    /// Size of a build's output tmpfs, MiB: the most disk one layer (or one function's code
    /// with its bytecode) can take.
    pub max_layer_mb: u64,
    /// Builds run at the same time on this worker (others wait their turn).
    pub max_concurrent: usize,
    /// Disk all layers of one namespace may take together (a layer shared by two namespaces
    /// counts for both).
    pub max_layer_bytes_per_namespace: u64,
    /// `pip --no-index`: install only from `find_links` (no network at all).
    pub no_index: bool,
    /// Wheel directories on the host given to pip (`--find-links`), read-only.
    pub find_links: Vec<PathBuf>,
    /// A package index (`--index-url`): needs the allow-listing proxy ([`build_network`]).
    pub index_url: Option<String>,
    /// More indexes (`--extra-index-url`), same condition.
    pub extra_index_url: Vec<String>,
    /// Allow source distributions (their `setup.py` runs in the build sandbox); default off:
    /// `--only-binary :all:`.
    pub allow_sdist: bool,
    /// Hosts (`host` or `host:port`, HTTPS) an index's pages link to for downloads, which the
    /// build may reach too (PyPI's: `files.pythonhosted.org`).
    pub download_hosts: Vec<String>,
    /// The most bytes one build may download through its proxy, MiB.
    pub max_download_mb: u64,
    /// Where builds find runtime images: the worker's `runc.runtime_store`, set at start
    /// (None: [`crate::runtimes::DEFAULT_STORE_DIR`]).
    #[serde(skip)]
    pub runtime_store: Option<PathBuf>,
}

impl Default for BuildSettings {
    fn default() -> Self {
        BuildSettings {
            memory_mb: 1024,
            cpus: 1.0,
            timeout_s: 300,
            max_layer_mb: 1024,
            max_concurrent: 1,
            max_layer_bytes_per_namespace: 2 << 30,
            no_index: true,
            find_links: vec![PathBuf::from("/var/cache/hearth/wheelhouse")],
            index_url: None,
            extra_index_url: Vec::new(),
            allow_sdist: false,
            download_hosts: Vec::new(),
            max_download_mb: 2048,
            runtime_store: None,
        }
    }
}

impl BuildSettings {
    /// Refuses settings that cannot work, and an index until the build network exists.
    pub fn check(&self) -> Result<(), String> {
        if self.memory_mb < 64 || self.memory_mb > 1 << 20 {
            return Err("build.memory_mb must be between 64 and 1048576".into());
        }
        if !(self.cpus > 0.0 && self.cpus <= 1024.0) {
            return Err("build.cpus must be more than 0 and at most 1024".into());
        }
        if self.timeout_s == 0 || self.timeout_s > 24 * 3600 {
            return Err("build.timeout_s must be between 1 and 86400".into());
        }
        if self.max_layer_mb == 0 || self.max_layer_mb > 1 << 20 {
            return Err("build.max_layer_mb must be between 1 and 1048576".into());
        }
        if self.max_concurrent == 0 || self.max_concurrent > BUILD_UID_COUNT as usize {
            return Err(format!(
                "build.max_concurrent must be between 1 and {BUILD_UID_COUNT}"
            ));
        }
        if self.find_links.len() > MAX_FIND_LINKS {
            return Err(format!(
                "build.find_links holds at most {MAX_FIND_LINKS} directories"
            ));
        }
        if let Some(p) = self.find_links.iter().find(|p| !p.is_absolute()) {
            return Err(format!(
                "build.find_links must be absolute paths, got {:?}",
                p.display().to_string()
            ));
        }
        let wants_index = self.index_url.is_some() || !self.extra_index_url.is_empty();
        if wants_index && self.no_index {
            return Err("build.index_url is set but build.no_index = true".into());
        }
        if !self.no_index && !wants_index {
            return Err(
                "build.no_index = false needs build.index_url (pip's default index is not \
                 allowed implicitly: name it)"
                    .into(),
            );
        }
        if self.max_download_mb == 0 || self.max_download_mb > 1 << 20 {
            return Err("build.max_download_mb must be between 1 and 1048576".into());
        }
        if wants_index {
            allow_list(self)?;
        }
        Ok(())
    }
}

/// What a build sandbox may reach when it installs from an index: the host-side proxy
/// ([`super::proxy`]) that lets it reach only the configured index and download hosts.
#[derive(Debug, Clone)]
pub struct BuildNetwork {
    /// `http://host:port` of the proxy inside the sandbox, as pip's `--proxy`.
    pub proxy_url: String,
    pub allow: AllowList,
    pub max_download_bytes: u64,
}

/// The index URLs' hosts and the `download_hosts`.
fn allow_list(s: &BuildSettings) -> Result<AllowList, String> {
    let mut allow = AllowList::default();
    for url in s.index_url.iter().chain(&s.extra_index_url) {
        allow
            .allow_url(url)
            .map_err(|e| format!("build.index_url / extra_index_url: {e}"))?;
    }
    for h in &s.download_hosts {
        allow
            .allow_url(&format!("https://{h}/"))
            .map_err(|e| format!("build.download_hosts {h:?}: {e}"))?;
    }
    Ok(allow)
}

/// How a build reaches its index: None when the settings name none (then a build has no
/// network at all, only its own loopback).
pub fn build_network(settings: &BuildSettings) -> Option<BuildNetwork> {
    if settings.index_url.is_none() && settings.extra_index_url.is_empty() {
        return None;
    }
    Some(BuildNetwork {
        proxy_url: format!("http://{}", super::proxy::SANDBOX_PROXY_ADDR),
        allow: allow_list(settings).ok()?,
        max_download_bytes: settings.max_download_mb.saturating_mul(1024 * 1024),
    })
}

/// Why a build failed: a message for the client and the tail of the build's output; neither
/// names a host path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct BuildFailure {
    pub message: String,
    pub log_tail: String,
}

impl BuildFailure {
    fn new(message: impl Into<String>) -> Self {
        BuildFailure {
            message: message.into(),
            log_tail: String::new(),
        }
    }

    /// The message, then the output: what a failed function's `build_log` shows.
    pub fn log(&self) -> String {
        if self.log_tail.is_empty() {
            return self.message.clone();
        }
        format!("{}\n{}", self.log_tail.trim_end(), self.message)
    }
}

/// What one run of a build sandbox did.
struct Ran {
    ok: bool,
    log: String,
    timed_out: bool,
    oom_killed: bool,
}

type Shared = Arc<tokio::sync::OnceCell<Result<Layer, BuildFailure>>>;

/// Runs builds: at most `max_concurrent` at a time, one per layer digest however many
/// registrations want it.
pub struct Builder {
    settings: BuildSettings,
    runc_path: PathBuf,
    /// `<data>/builds`: runc's state, the shared build root, one directory per build.
    work_dir: PathBuf,
    data_dir: PathBuf,
    store: LayerStore,
    cgroup_parent: String,
    prefix: String,
    uids: std::sync::Mutex<UidPool>,
    _uid_block: UidBlock,
    slots: tokio::sync::Semaphore,
    seq: AtomicU64,
    running: std::sync::Mutex<HashMap<String, Shared>>,
}

impl Builder {
    /// Prepares `<data>/builds` (removing what a crashed run left) and claims build uids.
    pub async fn new(
        settings: BuildSettings,
        runc_path: &Path,
        data_dir: &Path,
        worker: &str,
        sandbox_uid_base: u32,
        store: LayerStore,
    ) -> std::io::Result<Arc<Self>> {
        let work_dir = data_dir.join("builds");
        let base = sandbox_uid_base.saturating_sub(BUILD_UID_COUNT * BUILD_UID_BLOCKS);
        let block = claim_uid_block(Path::new(UID_LOCK_DIR), base, BUILD_UID_COUNT)?;
        let worker: String = worker
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let b = Builder {
            slots: tokio::sync::Semaphore::new(settings.max_concurrent),
            settings,
            runc_path: runc_path.to_path_buf(),
            work_dir,
            data_dir: data_dir.to_path_buf(),
            store,
            cgroup_parent: format!("/hearth/{worker}"),
            prefix: format!("hb-{worker}-"),
            uids: std::sync::Mutex::new(UidPool::new(block.base, BUILD_UID_COUNT)),
            _uid_block: block,
            seq: AtomicU64::new(0),
            running: std::sync::Mutex::new(HashMap::new()),
        };
        b.cleanup().await;
        std::fs::create_dir_all(b.work_dir.join("runc"))?;
        std::fs::set_permissions(&b.work_dir, std::fs::Permissions::from_mode(0o700))?;
        prepare_build_root(&b.work_dir.join("root"))?;
        std::fs::create_dir_all(b.store.dir())?;
        Ok(Arc::new(b))
    }

    pub fn settings(&self) -> &BuildSettings {
        &self.settings
    }

    pub fn store(&self) -> &LayerStore {
        &self.store
    }

    /// Removes the builds a crashed worker left: their containers, tmpfs mounts and files,
    /// and unfinished layer directories.
    async fn cleanup(&self) {
        if let Ok(out) = self.runc().args(["list", "--quiet"]).output().await {
            for name in String::from_utf8_lossy(&out.stdout).lines() {
                if name.starts_with(&self.prefix) {
                    self.remove_container(name).await;
                }
            }
        }
        let work = self.work_dir.clone();
        let layers = self.store.dir().to_path_buf();
        let _ = tokio::task::spawn_blocking(move || {
            unmount_under(&work);
            if let Ok(entries) = std::fs::read_dir(&work) {
                for e in entries.flatten() {
                    if e.file_name() != "runc" {
                        let _ = remove_tree(&e.path());
                    }
                }
            }
            if let Ok(entries) = std::fs::read_dir(&layers) {
                for e in entries.flatten() {
                    if e.file_name().to_string_lossy().starts_with(".tmp-") {
                        let _ = std::fs::remove_dir_all(e.path());
                    }
                }
            }
        })
        .await;
    }

    fn runc(&self) -> Command {
        let mut c = Command::new(&self.runc_path);
        c.arg("--root").arg(self.work_dir.join("runc"));
        c.stdin(Stdio::null());
        c
    }

    async fn remove_container(&self, name: &str) {
        let _ = self
            .runc()
            .args(["kill", name, "KILL"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await;
        for _ in 0..50 {
            let done = self
                .runc()
                .args(["delete", "--force", name])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .await;
            if done.map(|s| s.success()).unwrap_or(false) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tracing::warn!(container = name, "could not delete a build sandbox");
    }

    /// The layer `digest` (the runtime's packages for `normalized` requirements): from the
    /// store, from a build of the same digest already running, or built now.
    pub async fn layer(
        self: &Arc<Self>,
        digest: &str,
        runtime: &Runtime,
        normalized: &str,
    ) -> Result<Layer, BuildFailure> {
        if let Some(layer) = self.store.get(digest) {
            return Ok(layer);
        }
        let cell = {
            let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
            Arc::clone(running.entry(digest.to_string()).or_default())
        };
        let me = Arc::clone(self);
        let (d, rt, req) = (digest.to_string(), runtime.clone(), normalized.to_string());
        let result = cell
            .get_or_init(|| async move {
                // Spawned: a caller that goes away never cancels a build others wait for.
                match tokio::spawn(async move { me.build_layer(&d, &rt, &req).await }).await {
                    Ok(r) => r,
                    Err(e) => Err(BuildFailure::new(format!("the build task failed: {e}"))),
                }
            })
            .await
            .clone();
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if running.get(digest).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
            running.remove(digest);
        }
        result
    }

    async fn build_layer(
        &self,
        digest: &str,
        runtime: &Runtime,
        normalized: &str,
    ) -> Result<Layer, BuildFailure> {
        let Some(hex) = digest_hex(digest) else {
            return Err(BuildFailure::new("not a layer digest"));
        };
        let _slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| BuildFailure::new("the worker is shutting down"))?;
        if let Some(layer) = self.store.get(digest) {
            return Ok(layer);
        }
        let t0 = Instant::now();
        let s = &self.settings;
        let mut args: Vec<String> = [
            "-m",
            "pip",
            "install",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--no-input",
            "--no-warn-script-location",
            // compileall below writes the bytecode: unchecked-hash, named for the sandbox's
            // path (pip's would be timestamped, stale once copied, and name the build's path).
            "--no-compile",
            "--target",
            "/out/site",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if !s.allow_sdist {
            args.extend(["--only-binary".into(), ":all:".into()]);
        }
        if s.no_index {
            args.push("--no-index".into());
        }
        for i in 0..s.find_links.len() {
            args.extend(["--find-links".into(), format!("{LINKS_MOUNT}/{i}")]);
        }
        if let Some(url) = &s.index_url {
            args.extend(["--index-url".into(), url.clone()]);
        }
        for url in &s.extra_index_url {
            args.extend(["--extra-index-url".into(), url.clone()]);
        }
        let network = build_network(s);
        if let Some(net) = &network {
            args.extend(["--proxy".into(), net.proxy_url.clone()]);
        }
        args.extend(["-r".into(), format!("{REQ_MOUNT}/requirements.txt")]);
        // pip, then the bytecode of everything it installed; `$@` carries pip's arguments
        // without a shell ever parsing them.
        // With an index, the forwarder to the proxy's socket listens first (pip retries a
        // refused connection, but a build should not depend on that).
        let forward = if network.is_some() {
            "python3 -c \"$HEARTH_FORWARDER\" & \
             for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do \
             python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 3128), 1)' \
             2>/dev/null && break; sleep 0.1; done; "
        } else {
            ""
        };
        let mut cmd = vec![
            "/bin/sh".to_string(),
            "-c".to_string(),
            format!(
                "{forward}python3 \"$@\" && exec python3 -m compileall -q -j0 --invalidation-mode \
                 unchecked-hash -s /out/site -p {} /out/site",
                super::DEPS_MOUNT
            )
            .to_string(),
            "sh".to_string(),
        ];
        cmd.extend(args);
        let job = Job {
            cmd,
            requirements: Some(normalized.to_string()),
            code: None,
            network,
        };
        let (ran, run) = self.run(runtime, job).await?;
        let result = if ran.ok {
            let base = self.store.dir().to_path_buf();
            let (digest, runtime_digest, requirements, hex) = (
                digest.to_string(),
                runtime.digest.clone(),
                normalized.to_string(),
                hex.to_string(),
            );
            let out = run.out.clone();
            tokio::task::spawn_blocking(move || {
                store_layer(&base, &hex, &out, digest, runtime_digest, requirements)
            })
            .await
            .map_err(|e| BuildFailure::new(format!("storing the layer failed: {e}")))
            .and_then(|r| r)
        } else {
            Err(self.failure(&ran, "pip could not install the requirements"))
        };
        self.finish(run).await;
        match &result {
            Ok(l) => tracing::info!(layer = %l.digest, bytes = l.bytes, modules = l.modules.len(),
                ms = t0.elapsed().as_millis() as u64, "layer built"),
            Err(e) => tracing::info!(layer = digest, error = %e.message, "layer build failed"),
        }
        result
    }

    /// Byte-compiles the function code in `code_dir` (a copy of it, in a build sandbox) and
    /// adds each module's `__pycache__/<name>.cpython-*.pyc` beside it. Returns the bytes added.
    pub async fn compile_code(
        self: &Arc<Self>,
        runtime: &Runtime,
        code_dir: &Path,
    ) -> Result<u64, BuildFailure> {
        let _slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| BuildFailure::new("the worker is shutting down"))?;
        let cmd = [
            "/usr/bin/python3",
            "-m",
            "compileall",
            "-q",
            "-j0",
            "--invalidation-mode",
            "unchecked-hash",
            "-s",
            "/out/code",
            "-p",
            oci::CODE_MOUNT,
            "/out/code",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let job = Job {
            cmd,
            requirements: None,
            code: Some(code_dir.to_path_buf()),
            network: None,
        };
        let (ran, run) = self.run(runtime, job).await?;
        // A module that does not compile (a syntax error, Python 2 code in a vendored package)
        // fails compileall but not the function: it would fail the same way at import, and
        // vendored code that works today keeps working. What did compile is kept.
        if !ran.ok && !ran.timed_out && !ran.oom_killed {
            tracing::info!(log = %self.scrub(&hearth_service::registry::log_tail(&ran.log)),
                "some of the code did not byte-compile");
        }
        let compiled = !ran.timed_out && !ran.oom_killed;
        let result = if compiled {
            let (out, code) = (run.out.join("code"), code_dir.to_path_buf());
            tokio::task::spawn_blocking(move || copy_bytecode(&out, &code))
                .await
                .map_err(|e| BuildFailure::new(format!("storing bytecode failed: {e}")))
                .and_then(|r| {
                    r.map_err(|e| {
                        BuildFailure::new(format!("storing bytecode failed: {}", e.kind()))
                    })
                })
        } else {
            Err(self.failure(&ran, "byte-compiling the code failed"))
        };
        self.finish(run).await;
        result
    }

    /// Runs a command in a build sandbox with nothing to build (tests: what can a build reach?).
    pub async fn probe(
        self: &Arc<Self>,
        runtime: &Runtime,
        cmd: Vec<String>,
    ) -> Result<(bool, String), BuildFailure> {
        let (ran, run) = self
            .run(
                runtime,
                Job {
                    cmd,
                    requirements: None,
                    code: None,
                    network: None,
                },
            )
            .await?;
        self.finish(run).await;
        Ok((ran.ok, ran.log))
    }

    fn failure(&self, ran: &Ran, what: &str) -> BuildFailure {
        let s = &self.settings;
        let message = if ran.timed_out {
            format!(
                "the build took longer than build.timeout_s = {} s and was killed",
                s.timeout_s
            )
        } else if ran.oom_killed {
            format!(
                "the build ran out of memory (build.memory_mb = {}) and was killed",
                s.memory_mb
            )
        } else if ran.log.contains("No space left on device") {
            format!(
                "the layer is larger than build.max_layer_mb = {} MiB",
                s.max_layer_mb
            )
        } else {
            what.to_string()
        };
        BuildFailure {
            message,
            log_tail: self.scrub(&hearth_service::registry::log_tail(&ran.log)),
        }
    }

    /// Host paths out of a log (runc's own messages can name the bundle).
    fn scrub(&self, log: &str) -> String {
        let mut log = log.to_string();
        let mut paths: Vec<String> = self
            .settings
            .find_links
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        paths.push(self.work_dir.display().to_string());
        paths.push(
            self.settings
                .runtime_store
                .clone()
                .unwrap_or_else(|| PathBuf::from(crate::runtimes::DEFAULT_STORE_DIR))
                .display()
                .to_string(),
        );
        paths.push(self.data_dir.display().to_string());
        for p in paths.iter().filter(|p| p.len() > 1) {
            log = log.replace(p.as_str(), "<host>");
        }
        log
    }

    /// Sets up one build sandbox, runs `job` in it to the end (or its limits) and returns
    /// what happened; [`Self::finish`] removes it.
    async fn run(&self, runtime: &Runtime, job: Job) -> Result<(Ran, Run), BuildFailure> {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let uid = self
            .uids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| BuildFailure::new("no build uid is free"))?;
        let dir = self.work_dir.join(n.to_string());
        let run = Run {
            name: format!("{}{n}", self.prefix),
            out: dir.join("out"),
            dir,
            uid,
            cgroups_path: format!("{}/build-{n}", self.cgroup_parent),
        };
        let prepared = {
            let (run, s, job, root, rt) = (
                run.clone(),
                self.settings.clone(),
                job.clone(),
                self.work_dir.join("root"),
                runtime.rootfs.clone(),
            );
            tokio::task::spawn_blocking(move || prepare_run(&run, &s, &job, &root, &rt))
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))
                .and_then(|r| r)
        };
        if let Err(e) = prepared {
            tracing::warn!(error = %e, "preparing a build sandbox failed");
            self.finish(run).await;
            return Err(BuildFailure::new(format!(
                "preparing the build sandbox failed ({})",
                e.kind()
            )));
        }
        // The proxy lives as long as this call: the build's only way out.
        let _proxy = match &job.network {
            Some(net) => {
                let sock = run.dir.join("net").join("proxy.sock");
                let started = BuildProxy::start(&sock, net.allow.clone(), net.max_download_bytes)
                    .and_then(|p| {
                        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666))
                            .map(|()| p)
                    });
                match started {
                    Ok(p) => Some(p),
                    Err(e) => {
                        self.finish(run).await;
                        return Err(BuildFailure::new(format!(
                            "starting the build's proxy failed ({})",
                            e.kind()
                        )));
                    }
                }
            }
            None => None,
        };
        let child = self
            .runc()
            .arg("run")
            .arg("--bundle")
            .arg(run.dir.join("bundle"))
            .arg(&run.name)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                self.finish(run).await;
                return Err(BuildFailure::new(format!("cannot run runc ({})", e.kind())));
            }
        };
        let log = Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
        let mut readers = Vec::new();
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ]
        .into_iter()
        .flatten()
        {
            let log = Arc::clone(&log);
            readers.push(tokio::spawn(keep_tail(stream, log)));
        }
        let limit = Duration::from_secs(self.settings.timeout_s);
        let (status, timed_out) = match tokio::time::timeout(limit, child.wait()).await {
            Ok(s) => (s.ok(), false),
            Err(_) => {
                let _ = self
                    .runc()
                    .args(["kill", &run.name, "KILL"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .await;
                let _ = child.start_kill();
                (
                    tokio::time::timeout(Duration::from_secs(10), child.wait())
                        .await
                        .ok()
                        .and_then(|s| s.ok()),
                    true,
                )
            }
        };
        for r in readers {
            let _ = tokio::time::timeout(Duration::from_secs(5), r).await;
        }
        let oom_killed = oci::oom_kill_count(&run.cgroups_path).unwrap_or(0) > 0;
        let log =
            String::from_utf8_lossy(&log.lock().unwrap_or_else(|e| e.into_inner())).into_owned();
        let ok = !timed_out && !oom_killed && status.is_some_and(|s| s.success());
        Ok((
            Ran {
                ok,
                log,
                timed_out,
                oom_killed,
            },
            run,
        ))
    }

    /// Removes a build sandbox: its container and cgroup, its tmpfs, its files; frees its uid.
    async fn finish(&self, run: Run) {
        self.remove_container(&run.name).await;
        let dir = run.dir.clone();
        let _ = tokio::task::spawn_blocking(move || {
            unmount_under(&dir);
            let _ = remove_tree(&dir);
        })
        .await;
        let _ = oci::remove_cgroup_dirs(&run.cgroups_path);
        self.uids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .give_back(run.uid);
    }
}

#[derive(Clone)]
struct Job {
    cmd: Vec<String>,
    /// The normalized requirements, bound read-only at `/req/requirements.txt`.
    requirements: Option<String>,
    /// Code to copy into `/out/code` (and compile there).
    code: Option<PathBuf>,
    /// The way to the index, when one is configured: a proxy on a socket at
    /// `/hearth/run/proxy.sock`.
    network: Option<BuildNetwork>,
}

#[derive(Clone)]
struct Run {
    name: String,
    dir: PathBuf,
    out: PathBuf,
    uid: u32,
    cgroups_path: String,
}

/// Reads `stream` to its end, keeping the last [`LOG_KEEP_BYTES`] of what all streams wrote.
async fn keep_tail(
    mut stream: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    log: Arc<std::sync::Mutex<Vec<u8>>>,
) {
    let mut buf = [0u8; 8192];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let mut l = log.lock().unwrap_or_else(|e| e.into_inner());
                l.extend_from_slice(&buf[..n]);
                if l.len() > 2 * LOG_KEEP_BYTES {
                    let cut = l.len() - LOG_KEEP_BYTES;
                    l.drain(..cut);
                }
            }
        }
    }
}

/// Empty mount points of the build root (read-only inside; the runtime's `/usr` and `/etc`
/// and the build's own trees are mounted on them).
fn prepare_build_root(root: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::symlink;
    for d in [
        "usr",
        "etc",
        "tmp",
        "proc",
        "dev",
        "sys",
        "out",
        "req",
        "code",
        "links",
        "hearth/run",
    ] {
        std::fs::create_dir_all(root.join(d))?;
    }
    for i in 0..MAX_FIND_LINKS {
        std::fs::create_dir_all(root.join("links").join(i.to_string()))?;
    }
    std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o1777))?;
    for (link, target) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("sbin", "usr/sbin"),
    ] {
        let path = root.join(link);
        if std::fs::symlink_metadata(&path).is_err() {
            symlink(target, &path)?;
        }
    }
    Ok(())
}

/// The build's directory: its output tmpfs (owned by its uid), the requirements file, the
/// code copy, and its `config.json`.
fn prepare_run(
    run: &Run,
    s: &BuildSettings,
    job: &Job,
    root: &Path,
    rootfs: &Path,
) -> std::io::Result<()> {
    std::fs::create_dir_all(&run.out)?;
    std::fs::create_dir_all(run.dir.join("bundle"))?;
    mount_tmpfs(
        &run.out,
        &format!(
            "size={}m,mode=0700,uid={},gid={}",
            s.max_layer_mb, run.uid, run.uid
        ),
    )?;
    for d in ["tmp", "site"] {
        let p = run.out.join(d);
        std::fs::create_dir(&p)?;
        std::os::unix::fs::chown(&p, Some(run.uid), Some(run.uid))?;
    }
    if let Some(req) = &job.requirements {
        let d = run.dir.join("req");
        std::fs::create_dir(&d)?;
        std::fs::write(d.join("requirements.txt"), req)?;
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755))?;
    }
    if let Some(code) = &job.code {
        let dest = run.out.join("code");
        copy_tree(code, &dest, Some(run.uid))?;
    }
    let mut mounts = vec![
        serde_json::json!({"destination": "/proc", "type": "proc", "source": "proc",
               "options": ["nosuid", "noexec", "nodev"]}),
        serde_json::json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        serde_json::json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
               "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
        bind("/usr", &rootfs.join("usr"), false),
        bind("/etc", &rootfs.join("etc"), false),
        bind(OUT_MOUNT, &run.out, true),
        serde_json::json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "nodev", "mode=1777", "size=64m"]}),
    ];
    if job.requirements.is_some() {
        mounts.push(bind(REQ_MOUNT, &run.dir.join("req"), false));
    }
    if job.network.is_some() {
        let net = run.dir.join("net");
        std::fs::create_dir(&net)?;
        std::fs::set_permissions(&net, std::fs::Permissions::from_mode(0o755))?;
        mounts.push(bind("/hearth/run", &net, true));
    }
    for (i, dir) in s.find_links.iter().enumerate() {
        if dir.is_dir() {
            mounts.push(bind(&format!("{LINKS_MOUNT}/{i}"), dir, false));
        }
    }
    let mut resources = serde_json::json!({
        "devices": [{"allow": false, "access": "rwm"}],
        "pids": {"limit": BUILD_PIDS},
        "memory": {"limit": s.memory_mb.saturating_mul(1024 * 1024)},
    });
    if let Some(quota) = oci::cpu_quota_us(s.cpus) {
        resources["cpu"] = serde_json::json!({"period": oci::CPU_PERIOD_US, "quota": quota});
    }
    let spec = serde_json::json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": run.uid, "gid": run.uid},
            "args": job.cmd,
            "env": [
                format!("PATH={}", oci::SANDBOX_PATH),
                "HOME=/tmp",
                "TMPDIR=/out/tmp",
                "PIP_NO_CACHE_DIR=1",
                "PYTHONDONTWRITEBYTECODE=1",
                "LANG=C.UTF-8",
                format!("HEARTH_FORWARDER={}", super::proxy::FORWARDER),
            ],
            "cwd": "/tmp",
            "capabilities": {
                "bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": [],
            },
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 4096, "soft": 4096}],
            "noNewPrivileges": true,
            "oomScoreAdj": 1000,
        },
        "root": {"path": root.to_string_lossy(), "readonly": true},
        "hostname": oci::SANDBOX_HOSTNAME,
        "mounts": mounts,
        "linux": {
            "cgroupsPath": run.cgroups_path,
            "resources": resources,
            "namespaces": oci::namespaces(),
            "maskedPaths": oci::MASKED_PATHS,
            "readonlyPaths": oci::READONLY_PATHS,
            "seccomp": oci::seccomp_profile(),
        },
    });
    let bytes = serde_json::to_vec(&spec).map_err(std::io::Error::other)?;
    std::fs::write(run.dir.join("bundle").join("config.json"), bytes)
}

fn bind(dest: &str, src: &Path, writable: bool) -> serde_json::Value {
    serde_json::json!({
        "destination": dest,
        "type": "bind",
        "source": src.to_string_lossy(),
        "options": ["rbind", if writable { "rw" } else { "ro" }, "nosuid", "nodev"],
    })
}

fn c_path(p: &Path) -> std::io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_os_str().as_bytes()).map_err(|_| std::io::ErrorKind::InvalidInput.into())
}

fn mount_tmpfs(target: &Path, data: &str) -> std::io::Result<()> {
    let t = c_path(target)?;
    let data =
        CString::new(data).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let fstype = c"tmpfs";
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            t.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Detaches every mount at or under `dir` (deepest first), as `/proc/self/mountinfo` lists them.
fn unmount_under(dir: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    for p in points {
        if let Ok(c) = c_path(&p) {
            // SAFETY: a NUL-terminated path.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// Removes a tree, never crossing into a mount that is still there.
fn remove_tree(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Copies a tree without following links: regular files (mode at most 0755, no set-id bits),
/// directories and symbolic links (as links); nothing else. Returns bytes of file content.
fn copy_tree(src: &Path, dest: &Path, owner: Option<u32>) -> std::io::Result<u64> {
    // What a build left is the sandbox's: its `site` may be a link to a host directory, which
    // read_dir would follow (entries below are checked one by one).
    if !std::fs::symlink_metadata(src)?.is_dir() {
        return Err(std::io::Error::other("not a directory"));
    }
    let mut bytes = 0u64;
    std::fs::create_dir(dest)?;
    let chown = |p: &Path| match owner {
        Some(u) => std::os::unix::fs::lchown(p, Some(u), Some(u)),
        None => Ok(()),
    };
    std::fs::set_permissions(dest, std::fs::Permissions::from_mode(0o755))?;
    chown(dest)?;
    for entry in std::fs::read_dir(src)? {
        let entry = entry?;
        let (from, to) = (entry.path(), dest.join(entry.file_name()));
        let meta = std::fs::symlink_metadata(&from)?;
        let ft = meta.file_type();
        if ft.is_dir() {
            bytes += copy_tree(&from, &to, owner)?;
        } else if ft.is_file() {
            let mut input = std::fs::File::open(&from)?;
            let mut output = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&to)?;
            bytes += std::io::copy(&mut input, &mut output)?;
            std::fs::set_permissions(
                &to,
                std::fs::Permissions::from_mode(meta.mode() & 0o755 | 0o644),
            )?;
            chown(&to)?;
        } else if ft.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&from)?, &to)?;
            chown(&to)?;
        }
    }
    Ok(bytes)
}

/// Moves a finished build from its tmpfs into the store: `site/` copied to a temporary
/// directory, `layer.json` written last, then the directory renamed into place.
fn store_layer(
    base: &Path,
    hex: &str,
    out: &Path,
    digest: String,
    runtime_digest: String,
    requirements: String,
) -> Result<Layer, BuildFailure> {
    let io = |what: &str, e: std::io::Error| {
        BuildFailure::new(format!("storing the layer failed ({what}: {})", e.kind()))
    };
    let tmp = base.join(format!(".tmp-{hex}-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(&tmp).map_err(|e| io("directory", e))?;
    let result = (|| {
        let site = tmp.join("site");
        let bytes = copy_tree(&out.join("site"), &site, None).map_err(|e| io("copy", e))?;
        let modules = top_level_modules(&site);
        let layer = Layer {
            digest,
            runtime_digest,
            requirements,
            bytes,
            modules,
            site_dir: PathBuf::new(),
        };
        let json = serde_json::to_vec_pretty(&layer)
            .map_err(|e| io("record", std::io::Error::other(e)))?;
        std::fs::write(tmp.join("layer.json"), json).map_err(|e| io("record", e))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| io("mode", e))?;
        let dest = base.join(hex);
        match std::fs::rename(&tmp, &dest) {
            Ok(()) => {}
            // Another worker process stored the same layer meanwhile: its copy is as good.
            Err(_) if dest.join("layer.json").is_file() => {
                let _ = std::fs::remove_dir_all(&tmp);
            }
            Err(e) => return Err(io("rename", e)),
        }
        Ok(Layer {
            site_dir: dest.join("site"),
            ..layer
        })
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

/// Top-level importable names a layer provides: each distribution's `top_level.txt`, else
/// the first path components in its `RECORD` (packages and `.py` modules), sorted.
pub fn top_level_modules(site: &Path) -> Vec<String> {
    let mut names = std::collections::BTreeSet::new();
    let Ok(entries) = std::fs::read_dir(site) else {
        return Vec::new();
    };
    let valid = |n: &str| {
        !n.is_empty()
            && n.len() <= 100
            && !n.starts_with('_')
            && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !n.as_bytes()[0].is_ascii_digit()
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        // A `*.dist-info` that is a link (to a host directory) is not read through.
        if !name.ends_with(".dist-info") || !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let read = |f: &str| -> Option<String> {
            let p = e.path().join(f);
            let meta = std::fs::symlink_metadata(&p).ok()?;
            if !meta.is_file() || meta.len() > 4 << 20 {
                return None;
            }
            let mut s = String::new();
            std::fs::File::open(&p).ok()?.read_to_string(&mut s).ok()?;
            Some(s)
        };
        if let Some(top) = read("top_level.txt") {
            names.extend(
                top.lines()
                    .map(str::trim)
                    .filter(|n| valid(n))
                    .map(String::from),
            );
        } else if let Some(record) = read("RECORD") {
            for line in record.lines() {
                let path = line.split(',').next().unwrap_or("");
                let first = path.split('/').next().unwrap_or("");
                let has_more = path.contains('/');
                let module = if has_more {
                    (!first.contains('.')).then_some(first)
                } else {
                    first.strip_suffix(".py")
                };
                if let Some(m) = module.filter(|m| valid(m)) {
                    names.insert(m.to_string());
                }
            }
        }
    }
    names.into_iter().collect()
}

/// Copies the bytecode a build made of the code in `built` (a copy of `code`) into `code`:
/// only `__pycache__/<stem>.cpython-*.pyc` of a `<stem>.py` that is in `code`, regular files.
fn copy_bytecode(built: &Path, code: &Path) -> std::io::Result<u64> {
    let mut bytes = 0;
    // `built` is the sandbox's: a directory there may be a link to a host one.
    if !std::fs::symlink_metadata(built).is_ok_and(|m| m.is_dir()) {
        return Ok(0);
    }
    let mut pycs = Vec::new();
    for entry in std::fs::read_dir(code)? {
        let entry = entry?;
        let meta = std::fs::symlink_metadata(entry.path())?;
        let name = entry.file_name();
        if meta.is_dir() {
            if name != "__pycache__" {
                bytes += copy_bytecode(&built.join(&name), &entry.path())?;
            }
        } else if meta.is_file() {
            if let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".py")) {
                pycs.push(stem.to_string());
            }
        }
    }
    if pycs.is_empty() {
        return Ok(bytes);
    }
    let cache = built.join("__pycache__");
    if !std::fs::symlink_metadata(&cache).is_ok_and(|m| m.is_dir()) {
        return Ok(bytes);
    }
    let Ok(entries) = std::fs::read_dir(&cache) else {
        return Ok(bytes);
    };
    let dest = code.join("__pycache__");
    for e in entries.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        let Some((stem, rest)) = n.split_once(".cpython-") else {
            continue;
        };
        let meta = std::fs::symlink_metadata(e.path())?;
        if !pycs.iter().any(|p| p == stem) || !rest.ends_with(".pyc") || !meta.is_file() {
            continue;
        }
        if !dest.is_dir() {
            std::fs::create_dir(&dest)?;
            std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o755))?;
        }
        let to = dest.join(&n);
        let mut input = std::fs::File::open(e.path())?;
        let mut output = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&to)?;
        bytes += std::io::copy(&mut input, &mut output)?;
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o644))?;
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_gets_a_proxy_to_it_and_bad_index_settings_are_refused() {
        assert_eq!(BuildSettings::default().check(), Ok(()));
        assert!(build_network(&BuildSettings::default()).is_none());
        let s = BuildSettings {
            index_url: Some("https://pypi.org/simple".into()),
            download_hosts: vec!["files.pythonhosted.org".into()],
            no_index: false,
            ..Default::default()
        };
        assert_eq!(s.check(), Ok(()));
        let net = build_network(&s).unwrap();
        assert!(net.allow.allows("pypi.org", 443));
        assert!(net.allow.allows("files.pythonhosted.org", 443));
        assert!(!net.allow.allows("example.com", 443));
        for bad in [
            BuildSettings {
                index_url: Some("ftp://x/simple".into()),
                no_index: false,
                ..Default::default()
            },
            BuildSettings {
                index_url: Some("https://u:p@x/simple".into()),
                no_index: false,
                ..Default::default()
            },
            BuildSettings {
                no_index: false,
                ..Default::default()
            },
            BuildSettings {
                index_url: Some("https://x/simple".into()),
                no_index: false,
                download_hosts: vec!["bad host".into()],
                ..Default::default()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
        for bad in [
            BuildSettings {
                memory_mb: 0,
                ..Default::default()
            },
            BuildSettings {
                timeout_s: 0,
                ..Default::default()
            },
            BuildSettings {
                max_concurrent: 0,
                ..Default::default()
            },
            BuildSettings {
                cpus: f64::NAN,
                ..Default::default()
            },
            BuildSettings {
                find_links: vec!["rel".into()],
                ..Default::default()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn modules_come_from_top_level_or_record() {
        let t = tempfile::tempdir().unwrap();
        let a = t.path().join("alpha-1.0.dist-info");
        std::fs::create_dir(&a).unwrap();
        std::fs::write(a.join("top_level.txt"), "alpha\n_private\nbad name\n").unwrap();
        let b = t.path().join("beta-2.0.dist-info");
        std::fs::create_dir(&b).unwrap();
        std::fs::write(
            b.join("RECORD"),
            "beta/__init__.py,sha256=x,1\nbeta_util.py,sha256=y,2\nbeta-2.0.dist-info/RECORD,,\n",
        )
        .unwrap();
        assert_eq!(top_level_modules(t.path()), ["alpha", "beta", "beta_util"]);
        let host = tempfile::tempdir().unwrap();
        std::fs::write(host.path().join("top_level.txt"), "hostname\n").unwrap();
        std::os::unix::fs::symlink(host.path(), t.path().join("gamma-1.dist-info")).unwrap();
        assert_eq!(top_level_modules(t.path()), ["alpha", "beta", "beta_util"]);
    }

    #[test]
    fn links_a_build_left_are_never_followed_into_the_host() {
        let t = tempfile::tempdir().unwrap();
        let host = t.path().join("host");
        std::fs::create_dir_all(host.join("__pycache__")).unwrap();
        std::fs::write(host.join("secret"), "s").unwrap();
        std::fs::write(host.join("__pycache__/main.cpython-311.pyc"), "host").unwrap();
        // A layer whose `site` is a link to a host directory is refused.
        let out = t.path().join("out");
        std::fs::create_dir(&out).unwrap();
        std::os::unix::fs::symlink(&host, out.join("site")).unwrap();
        assert!(copy_tree(&out.join("site"), &t.path().join("copy"), None).is_err());
        assert!(!t.path().join("copy/secret").exists());
        // Links below the root are copied as links, never read through.
        std::fs::remove_file(out.join("site")).unwrap();
        std::fs::create_dir(out.join("site")).unwrap();
        std::os::unix::fs::symlink(&host, out.join("site/pkg")).unwrap();
        copy_tree(&out.join("site"), &t.path().join("copy2"), None).unwrap();
        assert!(std::fs::symlink_metadata(t.path().join("copy2/pkg"))
            .unwrap()
            .file_type()
            .is_symlink());
        // Bytecode from a compiled tree that is a link to the host is not taken.
        let code = t.path().join("code");
        std::fs::create_dir(&code).unwrap();
        std::fs::write(code.join("main.py"), "x").unwrap();
        let built = t.path().join("built");
        std::os::unix::fs::symlink(&host, &built).unwrap();
        assert_eq!(copy_bytecode(&built, &code).unwrap(), 0);
        let built2 = t.path().join("built2");
        std::fs::create_dir(&built2).unwrap();
        std::os::unix::fs::symlink(host.join("__pycache__"), built2.join("__pycache__")).unwrap();
        assert_eq!(copy_bytecode(&built2, &code).unwrap(), 0);
        assert!(!code.join("__pycache__").exists());
    }

    #[test]
    fn only_bytecode_of_the_codes_own_modules_is_copied_back() {
        let t = tempfile::tempdir().unwrap();
        let (code, built) = (t.path().join("code"), t.path().join("built"));
        std::fs::create_dir_all(code.join("pkg")).unwrap();
        std::fs::write(code.join("main.py"), "x").unwrap();
        std::fs::write(code.join("pkg/m.py"), "y").unwrap();
        std::fs::create_dir_all(built.join("__pycache__")).unwrap();
        std::fs::create_dir_all(built.join("pkg/__pycache__")).unwrap();
        std::fs::write(built.join("__pycache__/main.cpython-311.pyc"), "pyc").unwrap();
        std::fs::write(built.join("__pycache__/other.cpython-311.pyc"), "no").unwrap();
        std::fs::write(built.join("__pycache__/big.bin"), "no").unwrap();
        std::os::unix::fs::symlink(
            "/etc/shadow",
            built.join("pkg/__pycache__/m.cpython-311.pyc"),
        )
        .unwrap();
        let bytes = copy_bytecode(&built, &code).unwrap();
        assert_eq!(bytes, 3);
        assert!(code.join("__pycache__/main.cpython-311.pyc").is_file());
        assert!(!code.join("__pycache__/other.cpython-311.pyc").exists());
        assert!(
            !code.join("pkg/__pycache__").exists(),
            "a link is never followed"
        );
    }
}

/// Tiny wheels for tests: a wheel is a zip (stored, not compressed) holding the package and
/// its `*.dist-info/{METADATA,WHEEL,RECORD,top_level.txt}`.
#[cfg(test)]
pub(crate) mod test_wheel {
    use base64::Engine;
    use sha2::{Digest, Sha256};
    use std::path::{Path, PathBuf};

    /// A stored zip of `files` (name, content).
    pub fn zip(files: &[(String, Vec<u8>)]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut central = Vec::new();
        for (name, data) in files {
            let mut crc = flate2::Crc::new();
            crc.update(data);
            let offset = out.len() as u32;
            let head = |sig: u32, central: bool| {
                let mut h = Vec::new();
                h.extend(sig.to_le_bytes());
                if central {
                    h.extend(20u16.to_le_bytes());
                }
                for v in [20u16, 0, 0, 0, 0x21] {
                    h.extend(v.to_le_bytes());
                }
                h.extend(crc.sum().to_le_bytes());
                h.extend((data.len() as u32).to_le_bytes());
                h.extend((data.len() as u32).to_le_bytes());
                h.extend((name.len() as u16).to_le_bytes());
                h.extend(0u16.to_le_bytes());
                h
            };
            out.extend(head(0x0403_4b50, false));
            out.extend(name.as_bytes());
            out.extend(data);
            let mut c = head(0x0201_4b50, true);
            for v in [0u16, 0, 0] {
                c.extend(v.to_le_bytes());
            }
            c.extend((0o100644u32 << 16).to_le_bytes());
            c.extend(offset.to_le_bytes());
            c.extend(name.as_bytes());
            central.extend(c);
        }
        let cd_offset = out.len() as u32;
        out.extend(&central);
        out.extend(0x0605_4b50u32.to_le_bytes());
        for v in [0u16, 0, files.len() as u16, files.len() as u16] {
            out.extend(v.to_le_bytes());
        }
        out.extend((central.len() as u32).to_le_bytes());
        out.extend(cd_offset.to_le_bytes());
        out.extend(0u16.to_le_bytes());
        out
    }

    /// Writes `<dir>/<name>-<version>-<tag>.whl` with `<name>/__init__.py` = `init`.
    pub fn write(dir: &Path, name: &str, version: &str, tag: &str, init: &str) -> PathBuf {
        write_with(dir, name, version, tag, init, Vec::new())
    }

    /// [`write`] with more files in the package (`<name>/<file>`).
    pub fn write_with(
        dir: &Path,
        name: &str,
        version: &str,
        tag: &str,
        init: &str,
        extra: Vec<(String, Vec<u8>)>,
    ) -> PathBuf {
        let di = format!("{name}-{version}.dist-info");
        let wheel_tag = tag;
        let mut files: Vec<(String, Vec<u8>)> = vec![
            (format!("{name}/__init__.py"), init.as_bytes().to_vec()),
            (
                format!("{di}/METADATA"),
                format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n").into_bytes(),
            ),
            (
                format!("{di}/WHEEL"),
                format!(
                    "Wheel-Version: 1.0\nGenerator: hearth-test\nRoot-Is-Purelib: true\nTag: {wheel_tag}\n"
                )
                .into_bytes(),
            ),
            (format!("{di}/top_level.txt"), format!("{name}\n").into_bytes()),
        ];
        let mut record = String::new();
        for (n, d) in &files {
            let h = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(d));
            record.push_str(&format!("{n},sha256={h},{}\n", d.len()));
        }
        // Extra files go in without a hash (allowed by the wheel spec's RECORD): hashing
        // hundreds of MB in a debug build is most of a test's time.
        for (f, d) in extra {
            let n = format!("{name}/{f}");
            record.push_str(&format!("{n},,\n"));
            files.push((n, d));
        }
        record.push_str(&format!("{di}/RECORD,,\n"));
        files.push((format!("{di}/RECORD"), record.into_bytes()));
        let path = dir.join(format!("{name}-{version}-{tag}.whl"));
        std::fs::write(&path, zip(&files)).unwrap();
        path
    }
}

#[cfg(test)]
mod sandbox_tests {
    use super::*;
    use crate::runtimes::RuntimeStore;

    /// The runtime rootfs for build tests: the store's `python3.11`, else the directory in
    /// `HEARTH_TEST_RUNTIME_ROOTFS` (a bookworm root with python3 and pip).
    fn runtime() -> Option<(Runtime, Option<tempfile::TempDir>)> {
        if unsafe { libc::geteuid() } != 0 || !Path::new("/sys/fs/cgroup/memory").is_dir() {
            eprintln!("SKIPPED: build sandbox tests need root and cgroup v1");
            return None;
        }
        if let Some(rt) =
            RuntimeStore::new(crate::runtimes::DEFAULT_STORE_DIR).resolve("python3.11")
        {
            return Some((rt, None));
        }
        let Some(root) = std::env::var_os("HEARTH_TEST_RUNTIME_ROOTFS") else {
            eprintln!(
                "SKIPPED: no runtime python3.11 in {} and HEARTH_TEST_RUNTIME_ROOTFS unset",
                crate::runtimes::DEFAULT_STORE_DIR
            );
            return None;
        };
        let t = tempfile::tempdir().unwrap();
        let rt = Runtime {
            name: "python3.11".into(),
            digest: format!("sha256:{}", "77".repeat(32)),
            source: "test".into(),
            bytes: 0,
            rootfs: std::fs::canonicalize(root).unwrap(),
        };
        Some((rt, Some(t)))
    }

    async fn builder(
        data: &Path,
        links: &Path,
        tweak: impl FnOnce(&mut BuildSettings),
    ) -> Arc<Builder> {
        let mut s = BuildSettings {
            find_links: vec![links.to_path_buf()],
            memory_mb: 256,
            timeout_s: 60,
            max_layer_mb: 64,
            ..BuildSettings::default()
        };
        tweak(&mut s);
        Builder::new(
            s,
            Path::new("runc"),
            data,
            "buildtest",
            crate::config::DEFAULT_UID_BASE,
            LayerStore::new(data.join("layers")),
        )
        .await
        .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_layer_is_built_from_a_wheelhouse_and_bad_builds_fail_clearly() {
        let Some((rt, _keep)) = runtime() else { return };
        let data = tempfile::tempdir().unwrap();
        let links = tempfile::tempdir().unwrap();
        test_wheel::write(
            links.path(),
            "tinypkg",
            "1.0",
            "py3-none-any",
            "def answer():\n    return 42\n",
        );
        test_wheel::write(
            links.path(),
            "oldabi",
            "1.0",
            "cp27-cp27mu-manylinux1_x86_64",
            "",
        );
        let b = builder(data.path(), links.path(), |_| {}).await;
        let req = crate::layers::requirements::normalize(b"TinyPkg==1.0\n").unwrap();
        let digest = crate::layers::requirements::layer_digest(&rt.digest, &req);
        let t0 = Instant::now();
        let layer = b.layer(&digest, &rt, &req).await.unwrap();
        eprintln!("tiny layer built in {:?}", t0.elapsed());
        assert_eq!(layer.modules, ["tinypkg"]);
        assert!(layer.bytes > 0);
        let pyc = layer
            .site_dir
            .join("tinypkg/__pycache__/__init__.cpython-311.pyc");
        let header = std::fs::read(&pyc).unwrap();
        // Flags 0b01: hash-based, unchecked (PEP 552): valid wherever the layer is mounted.
        assert_eq!(u32::from_le_bytes(header[4..8].try_into().unwrap()), 1);
        assert!(
            String::from_utf8_lossy(&header).contains("/hearth/deps/tinypkg/__init__.py"),
            "code objects name the sandbox's path"
        );
        // Stored once: a second request is the store's copy, instantly.
        let t0 = Instant::now();
        assert_eq!(b.layer(&digest, &rt, &req).await.unwrap(), layer);
        assert!(t0.elapsed() < Duration::from_millis(100));

        for (req, why) in [
            ("nosuchpkg\n", "No matching distribution"),
            ("oldabi==1.0\n", "No matching distribution"),
        ] {
            let d = crate::layers::requirements::layer_digest(&rt.digest, req);
            let e = b.layer(&d, &rt, req).await.unwrap_err();
            assert!(e.message.contains("pip could not install"), "{e:?}");
            assert!(e.log_tail.contains(why), "{e:?}");
            assert!(!e.log().contains(&*data.path().to_string_lossy()), "{e:?}");
            assert!(!e.log().contains(&*links.path().to_string_lossy()), "{e:?}");
            assert!(b.store().get(&d).is_none());
        }
        let leftovers: Vec<_> = std::fs::read_dir(data.path().join("builds"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| n != "runc" && n != "root")
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");

        // A 300 MB wheel of random bytes (it does not compress) against a 64 MiB layer.
        let mut blob = vec![0u8; 300 << 20];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").unwrap(), &mut blob)
            .unwrap();
        test_wheel::write_with(
            links.path(),
            "hugepkg",
            "1.0",
            "py3-none-any",
            "",
            vec![("blob.bin".into(), blob)],
        );
        let d = crate::layers::requirements::layer_digest(&rt.digest, "hugepkg\n");
        let e = b.layer(&d, &rt, "hugepkg\n").await.unwrap_err();
        assert!(e.message.contains("max_layer_mb = 64"), "{e:?}");
        assert!(b.store().get(&d).is_none());
        std::fs::remove_file(links.path().join("hugepkg-1.0-py3-none-any.whl")).unwrap();

        // The function's code: bytecode beside each module, named for /code.
        let code = tempfile::tempdir().unwrap();
        std::fs::write(
            code.path().join("handler.py"),
            "def main(a):\n    return a\n",
        )
        .unwrap();
        std::fs::create_dir(code.path().join("sub")).unwrap();
        std::fs::write(code.path().join("sub/m.py"), "X = 1\n").unwrap();
        std::fs::write(code.path().join("py2.py"), "print 'old'\n").unwrap();
        let t0 = Instant::now();
        let added = b.compile_code(&rt, code.path()).await.unwrap();
        eprintln!(
            "code of 2 modules compiled in {:?} ({added} bytes)",
            t0.elapsed()
        );
        assert!(added > 0);
        let pyc = std::fs::read(code.path().join("__pycache__/handler.cpython-311.pyc")).unwrap();
        assert!(String::from_utf8_lossy(&pyc).contains("/code/handler.py"));
        assert!(code
            .path()
            .join("sub/__pycache__/m.cpython-311.pyc")
            .is_file());
        assert!(
            !code.path().join("__pycache__/py2.cpython-311.pyc").exists(),
            "a module that does not compile has no bytecode and fails nothing"
        );

        // A 200-module package: every module gets its bytecode.
        let big = tempfile::tempdir().unwrap();
        let pkg = big.path().join("pkg200");
        std::fs::create_dir(&pkg).unwrap();
        std::fs::write(pkg.join("__init__.py"), "").unwrap();
        for i in 0..200 {
            let body: String = (0..10)
                .map(|j| format!("class C{j}:\n    def f(self, y):\n        return y * {i}\n\n"))
                .collect();
            std::fs::write(pkg.join(format!("m{i}.py")), body).unwrap();
        }
        let t0 = Instant::now();
        let added = b.compile_code(&rt, big.path()).await.unwrap();
        eprintln!(
            "code of 201 modules compiled in {:?} ({added} bytes)",
            t0.elapsed()
        );
        let pycs = std::fs::read_dir(pkg.join("__pycache__")).unwrap().count();
        assert_eq!(pycs, 201);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_build_reaches_no_network_and_stops_at_its_limits() {
        let Some((rt, _keep)) = runtime() else { return };
        let data = tempfile::tempdir().unwrap();
        let links = tempfile::tempdir().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let b = builder(data.path(), links.path(), |s| {
            s.timeout_s = 3;
            s.memory_mb = 64;
        })
        .await;
        let script = format!(
            "import socket\n\
             for host, port in [('127.0.0.1', {port}), ('10.255.255.1', 80)]:\n\
             \x20   s = socket.socket(); s.settimeout(2)\n\
             \x20   try:\n\
             \x20       s.connect((host, port)); print('REACHED', host)\n\
             \x20   except OSError as e:\n\
             \x20       print('BLOCKED', host, type(e).__name__)\n"
        );
        let (ok, log) = b
            .probe(&rt, vec!["/usr/bin/python3".into(), "-c".into(), script])
            .await
            .unwrap();
        assert!(ok, "{log}");
        assert!(!log.contains("REACHED"), "{log}");
        assert_eq!(log.matches("BLOCKED").count(), 2, "{log}");
        drop(listener);

        let t0 = Instant::now();
        let (ok, _) = b
            .probe(
                &rt,
                vec![
                    "/usr/bin/python3".into(),
                    "-c".into(),
                    "import time; time.sleep(60)".into(),
                ],
            )
            .await
            .unwrap();
        assert!(!ok);
        assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());

        let (ok, log) = b
            .probe(
                &rt,
                vec![
                    "/usr/bin/python3".into(),
                    "-c".into(),
                    "b = bytearray(512 << 20); print('ALLOCATED')".into(),
                ],
            )
            .await
            .unwrap();
        assert!(!ok && !log.contains("ALLOCATED"), "{log}");
        let leftovers: Vec<_> = std::fs::read_dir(data.path().join("builds"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| n != "runc" && n != "root")
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}
