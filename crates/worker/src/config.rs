//! Worker configuration: a TOML file, overridden by `HEARTH_*` environment variables, overridden
//! by command-line flags.

use hearth_core::policy::hist::HistConfig;
use hearth_core::{
    AimdConfig, GenericConfig, KeepAliveConfig, KeepAliveKind, Micros, QueueDiscipline,
    RegulatorConfig,
};
use hearth_service::quota::QuotaLimits;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use crate::cpu_sched::CpuSchedKind;
pub use crate::cpuset::CpuSet;
pub use crate::gpu::{GpuDevices, GpuSettings, SimGpu};
use hearth_service::config_checks;
pub use hearth_service::config_loader::ConfigError;
use hearth_service::config_loader::EnvKeys;
use hearth_service::serving::{self, DEFAULT_MAX_RESULT_BYTES};

/// The concurrency limit: a number of invocations, or `aimd` (0: the worker's CPUs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Concurrency {
    Limit(u32),
    Named(String),
}

impl Default for Concurrency {
    fn default() -> Self {
        Concurrency::Limit(0)
    }
}

impl std::str::FromStr for Concurrency {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.parse::<u32>() {
            Ok(n) => Ok(Concurrency::Limit(n)),
            Err(_) if s.eq_ignore_ascii_case("aimd") => Ok(Concurrency::Named("aimd".into())),
            Err(_) => Err(format!(
                "concurrency must be a number of invocations or \"aimd\", got {s:?}"
            )),
        }
    }
}

/// HIST keep-alive parameters (thesis ch. 3.6.1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HistSettings {
    /// Keep-alive of functions whose inter-arrival times are not predictable.
    pub generic_ttl_s: u64,
    /// Predictable: coefficient of variation of inter-arrival times at most this.
    pub max_cov: f64,
    /// Inter-arrival samples needed before a function's histogram is used.
    pub min_samples: u64,
}

impl Default for HistSettings {
    fn default() -> Self {
        let h = HistConfig::default();
        HistSettings {
            generic_ttl_s: h.generic_ttl / 1_000_000,
            max_cov: h.max_cov,
            min_samples: h.min_samples,
        }
    }
}

/// Elastic provisioning (FaasCache, thesis §3.4.2; docs/provisioning.md): the worker resizes
/// its own memory budget so that its cold starts per second approach a target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProvisionSettings {
    /// Off by default: the budget stays `memory_mb`.
    pub elastic: bool,
    /// How often the budget is reconsidered (the thesis: 10 minutes).
    pub interval_s: u64,
    /// Cold starts per second to aim at.
    pub target_miss_speed: f64,
    /// Relative error in cold starts per second tolerated without a change (the thesis: 0.3).
    pub dead_band: f64,
    /// Bounds of the budget (MiB); 0 for `max_mb` means `memory_mb`.
    pub min_mb: u64,
    pub max_mb: u64,
    /// Weight of the newest interval in the smoothed rates, in (0, 1].
    pub smoothing: f64,
    /// SHARDS rate of the online hit-ratio curve, in (0, 1].
    pub sample_rate: f64,
}

impl Default for ProvisionSettings {
    fn default() -> Self {
        use hearth_core::provision::elastic;
        ProvisionSettings {
            elastic: false,
            interval_s: elastic::DEFAULT_INTERVAL_US / 1_000_000,
            target_miss_speed: 0.1,
            dead_band: elastic::DEFAULT_DEAD_BAND,
            min_mb: 256,
            max_mb: 0,
            smoothing: elastic::DEFAULT_SMOOTHING,
            sample_rate: 1.0,
        }
    }
}

/// Most functions the worker's online hit-ratio curve tracks (bounds its memory).
pub const PROVISION_MAX_FUNCTIONS: usize = 100_000;
/// The online curve's resolution (MiB).
pub const PROVISION_BUCKET_MB: u64 = 16;

/// The sandbox backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Real OCI containers started with runc.
    Runc,
    /// No process: time passes by sleeping the function's `sim_*_ms` (experiments at scale).
    Sim,
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "runc" => Ok(BackendKind::Runc),
            "sim" => Ok(BackendKind::Sim),
            other => Err(format!("unknown backend {other:?} (expected runc or sim)")),
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendKind::Runc => "runc",
            BackendKind::Sim => "sim",
        })
    }
}

/// Settings of the runc backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuncConfig {
    /// The runc binary (Debian's package installs /usr/sbin/runc).
    pub runc_path: PathBuf,
    /// The first of the worker's sandbox uids: each sandbox runs as its own uid and gid taken
    /// from `uid_base .. uid_base + uid_count` (default 2,000,000,000: far above any host user),
    /// given back only once its sandbox is gone. Workers on one host take consecutive blocks of
    /// `uid_count` from here (the first one no other worker holds).
    pub uid_base: u32,
    /// How many uids the range holds: at least twice the most sandboxes the worker's memory
    /// can hold (`memory_mb` / 16 MiB), so a uid is reused only long after it was freed.
    pub uid_count: u32,
    /// Size of each sandbox's private /tmp.
    pub tmp_size_mb: u64,
    /// Files and directories a sandbox may create in /tmp, and separately in /dev/shm.
    pub tmp_inodes: u64,
    /// Size of the tmpfs the worker mounts at each sandbox's /hearth/run (the agent's socket).
    pub run_size_mb: u64,
    /// Files and directories a sandbox may create in /hearth/run (its socket is one).
    pub run_inodes: u64,
    /// A sandbox's stdout and stderr go to `stdio.log`, which is rotated to `stdio.log.1` when it
    /// reaches this size: at most twice this much is kept per sandbox.
    pub log_file_bytes: u64,
    /// A sandbox idle this long is frozen, so nothing a handler left behind runs longer than
    /// this between invocations (0: frozen right after every invocation, which costs every
    /// warm invocation two wake-ups of the sandbox's tasks).
    pub idle_freeze_ms: u64,
    /// How long a new sandbox may take to start and import its handler.
    pub start_timeout_ms: u64,
    /// CPU in proportion to memory, as OpenWhisk consolidates (docs/configuration.md): each
    /// sandbox's `cpu.shares` is this many per GiB of its memory (1024 = a default-weight task
    /// per GiB). 0 (default): every sandbox has the kernel's default weight.
    pub cpu_shares_per_gb: u64,
    /// The CPUs every sandbox may run on (`cpuset.cpus`, the kernel's list format: `"1"`,
    /// `"0-3"`); unset: any CPU. The worker's CPU count defaults to its size.
    pub cpuset: Option<CpuSet>,
    /// The CUDA shim (`make -C runtime/gpu-shim`) that GPU sandboxes preload (docs/gpu.md).
    /// Unset: `libhearth_cuda_shim.so` beside the worker's binary, else
    /// `/usr/local/lib/hearth/libhearth_cuda_shim.so`. Looked for at the first GPU sandbox.
    pub gpu_shim_path: Option<PathBuf>,
    /// The host's store of runtime images (docs/runtimes.md): a sandbox's `/usr` and `/etc`
    /// come from the image its function was registered with, never from the host.
    pub runtime_store: PathBuf,
    /// The image `runtime: "python3"` means (`hearth runtime build python3.11`).
    pub default_runtime: String,
}

impl RuncConfig {
    /// Refuses limits that cannot work: every one must be positive, and none so large that
    /// it means no limit.
    pub fn check(&self) -> Result<(), ConfigError> {
        let ranges: [(&str, u64, u64, u64); 6] = [
            ("idle_freeze_ms", self.idle_freeze_ms, 0, 10_000),
            ("tmp_size_mb", self.tmp_size_mb, 1, 1 << 20),
            ("tmp_inodes", self.tmp_inodes, 16, 1 << 24),
            ("run_size_mb", self.run_size_mb, 1, 1 << 20),
            ("run_inodes", self.run_inodes, 8, 1 << 24),
            ("log_file_bytes", self.log_file_bytes, 4096, 1 << 40),
        ];
        for (key, value, min, max) in ranges {
            if !(min..=max).contains(&value) {
                return Err(ConfigError::Invalid(format!(
                    "runc.{key} must be between {min} and {max}, got {value}"
                )));
            }
        }
        let last = u64::from(self.uid_base) + u64::from(self.uid_count);
        if self.uid_base < MIN_UID_BASE || self.uid_count == 0 || last > MAX_SANDBOX_UID {
            return Err(ConfigError::Invalid(format!(
                "runc.uid_base must be at least {MIN_UID_BASE} and runc.uid_base + \
                 runc.uid_count at most {MAX_SANDBOX_UID} with runc.uid_count > 0, got {} + {}",
                self.uid_base, self.uid_count
            )));
        }
        let per_gb = self.cpu_shares_per_gb;
        if per_gb != 0 && !(MIN_SHARES_PER_GB..=MAX_SHARES_PER_GB).contains(&per_gb) {
            return Err(ConfigError::Invalid(format!(
                "runc.cpu_shares_per_gb must be 0 (off) or between {MIN_SHARES_PER_GB} and \
                 {MAX_SHARES_PER_GB}, got {per_gb}"
            )));
        }
        if let Some(set) = &self.cpuset {
            // Unreadable (not Linux, or sysfs hidden): runc reports a bad CPU at the first
            // sandbox instead.
            if let Ok(online) = std::fs::read_to_string(ONLINE_CPUS) {
                set.check_online(&online)
                    .map_err(|e| ConfigError::Invalid(format!("runc.cpuset: {e}")))?;
            }
        }
        Ok(())
    }

    /// A sandbox's `cpu.shares` for `memory_mb` of memory under `cpu_shares_per_gb`, within
    /// the kernel's bounds (2–262144); None when the option is off.
    pub fn cpu_shares(&self, memory_mb: u64) -> Option<u64> {
        (self.cpu_shares_per_gb > 0)
            .then(|| (memory_mb.saturating_mul(self.cpu_shares_per_gb) / 1024).clamp(2, 262_144))
    }
}

/// Sandbox uids start here by default: no distribution gives users uids this high.
pub const DEFAULT_UID_BASE: u32 = 2_000_000_000;
pub const DEFAULT_UID_COUNT: u32 = 65_536;
/// No sandbox uid below this (the system's and people's uids, `nobody`).
const MIN_UID_BASE: u32 = 100_000;
/// The last usable uid: `(uid_t)-1` means "unchanged" to the kernel, and `-2` is often
/// the overflow uid.
const MAX_SANDBOX_UID: u64 = u32::MAX as u64 - 2;

/// The kernel's list of online CPUs.
const ONLINE_CPUS: &str = "/sys/devices/system/cpu/online";

/// Bounds of `runc.cpu_shares_per_gb` when on.
const MIN_SHARES_PER_GB: u64 = 16;
const MAX_SHARES_PER_GB: u64 = 1 << 20;

impl Default for RuncConfig {
    fn default() -> Self {
        RuncConfig {
            runc_path: PathBuf::from("runc"),
            uid_base: DEFAULT_UID_BASE,
            uid_count: DEFAULT_UID_COUNT,
            tmp_size_mb: 64,
            tmp_inodes: 4096,
            run_size_mb: 4,
            run_inodes: 64,
            log_file_bytes: 1024 * 1024,
            idle_freeze_ms: 20,
            start_timeout_ms: 10_000,
            cpu_shares_per_gb: 0,
            cpuset: None,
            gpu_shim_path: None,
            runtime_store: PathBuf::from(crate::runtimes::DEFAULT_STORE_DIR),
            default_runtime: crate::runtimes::DEFAULT_RUNTIME.to_string(),
        }
    }
}

/// Everything a worker needs to run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerConfig {
    /// Address of the HTTP API.
    pub listen: String,
    /// Registry database, function code, sandbox bundles.
    pub data_dir: PathBuf,
    /// The name this worker reports in every answer (`worker`); defaults to the listen address.
    pub worker_id: Option<String>,
    pub backend: BackendKind,
    /// Memory that running and warm sandboxes may use together.
    pub memory_mb: u64,
    /// Background eviction keeps this much of the budget free.
    pub free_buffer_mb: u64,
    /// The proactive pool (Atoll, docs/atoll.md): memory reserved inside `memory_mb` for the
    /// sandboxes a controller sets up ahead of demand (`POST /v1/cluster/proactive`); reactive
    /// sandboxes use at most the rest. 0 turns it off.
    pub proactive_mb: u64,
    /// CPUs this worker schedules for: the default concurrency limit and the load's divisor
    /// (0: the machine's; with the sim backend, the simulated CPUs).
    pub cpus: u32,
    /// Queue discipline: fcfs, sjf, eedf, rare or srsf.
    pub queue: QueueDiscipline,
    /// Queued invocations beyond this are refused with 429.
    pub max_queue: usize,
    /// Concurrency limit of queued invocations: a number, or "aimd" (0: the CPUs).
    pub concurrency: Concurrency,
    pub aimd: AimdConfig,
    /// Invocations expected to take less than this skip the queue (0: never).
    pub bypass_ms: f64,
    /// ... while the normalized load (load average / CPUs) is under this.
    pub bypass_load: f64,
    /// Keep-alive policy: ttl, lru, gdsf, lfu, landlord or hist.
    pub keepalive: KeepAliveKind,
    /// Keep-alive time of an idle sandbox under the ttl policy.
    pub keepalive_ttl_s: u64,
    pub hist: HistSettings,
    /// Largest accepted invocation body.
    pub max_body_bytes: usize,
    /// Largest accepted registration body (code archives).
    pub max_code_bytes: usize,
    /// Host directories `code.path` may copy code from (empty: `code.path` is refused and code
    /// must be uploaded). See docs/security.md.
    pub code_path_roots: Vec<PathBuf>,
    /// Most bytes one function's code may unpack to (archive, files or `code.path`).
    pub max_code_unpacked_bytes: u64,
    /// Most files and directories one function's code may hold.
    pub max_code_files: u64,
    /// Most functions one namespace may register (429 `namespace_limit` over it).
    pub max_functions_per_namespace: u64,
    /// Most bytes of unpacked code one namespace's functions may hold on disk (413
    /// `namespace_limit` over it); an update counts its new size minus its old one. Unset:
    /// four times `max_code_unpacked_bytes`.
    pub max_code_bytes_per_namespace: Option<u64>,
    /// When an invocation finds its function's sandboxes all busy, wait for one to free rather
    /// than start a new one if that is expected to be sooner (docs/scheduling.md).
    pub warm_wait: bool,
    /// Most sandboxes being created at once; more wait for a turn (a burst queues its creations
    /// instead of running a dozen at once on two CPUs). 0: the CPUs with `runc`, no limit with
    /// `sim` (whose creations are sleeps).
    pub max_concurrent_creations: u32,
    /// Most generic sandboxes kept ready for cold starts to specialize (docs/sandboxes.md);
    /// 0 turns the pool off. `runc` only.
    pub generic_pool: u32,
    /// Generic sandboxes kept ready even when no cold start happened lately.
    pub generic_pool_min: u32,
    /// The memory limit (and budget share) of one generic sandbox until it is specialized.
    pub generic_memory_mb: u64,
    /// The pool holds as many generic sandboxes as there were cold starts in this window.
    pub generic_pool_window_s: u64,
    /// How long results of async invocations are kept after they finish.
    pub async_retention_s: u64,
    /// Back-off before the first retry of a failed async invocation; doubles per retry, up to
    /// 30 s.
    pub async_retry_backoff_ms: u64,
    /// Most async invocations kept (pending and finished) before new ones are refused with 429.
    pub async_max_records: usize,
    /// Bytes of finished async results kept in memory; the oldest results are dropped first to
    /// stay under it.
    pub async_max_bytes: usize,
    /// Most async invocations one namespace may have kept (pending and finished); over it its
    /// new ones get 429 naming this limit, other namespaces are unaffected. Unset: a quarter
    /// of `async_max_records`.
    pub async_max_records_per_namespace: Option<usize>,
    /// Bytes of finished async results one namespace may have kept; over it its own oldest
    /// results are dropped first, never another namespace's. Unset: a quarter of
    /// `async_max_bytes`.
    pub async_max_bytes_per_namespace: Option<usize>,
    /// Largest handler result passed on; a larger one is answered 502 `result_too_large`.
    pub max_result_bytes: usize,
    /// A request head must arrive within this from its first byte, else the connection closes.
    pub header_read_timeout_ms: u64,
    /// A connection with no request running and no traffic for this long is closed.
    pub idle_timeout_ms: u64,
    /// Most open HTTP connections (lowered to fit the open-file limit); more are refused 503.
    pub max_connections: usize,
    /// On SIGTERM, how long in-flight invocations may take to finish.
    pub shutdown_grace_s: u64,
    /// While invocations arrive, ask the kernel to keep idle CPUs out of deep sleep (PM QoS),
    /// released after `low_latency_quiet_ms` without any.
    pub low_latency: bool,
    pub low_latency_quiet_ms: u64,
    /// Threads of the worker's async runtime (0: half the host's CPUs, at least 1). Fewer
    /// threads than CPUs leave the rest to sandboxes and clients, and a runtime thread that
    /// finds work on its own queue does not wake another to steal it: on 2 CPUs one thread
    /// served 23 % more warm invocations than two (bench/RESULTS.md).
    pub runtime_threads: u32,
    pub runc: RuncConfig,
    /// CPU scheduling of sandboxes: `cfs` (the kernel's alone), `sfs` (every invocation ahead
    /// of the rest for `sfs_slice_ms` of CPU time, then demoted) or `alps` (rank and slice per
    /// function). `sfs` and `alps` need the runc backend (docs/alps-backend.md).
    pub cpu_sched: CpuSchedKind,
    /// Elastic provisioning of the memory budget (`[provision]`).
    pub provision: ProvisionSettings,
    /// The worker's GPUs (`[gpu]`): found through NVML (`auto`), none, or simulated (`sim`).
    pub gpu: GpuSettings,
    /// Dependency layers and bytecode builds (`[build]`, docs/dependencies.md).
    pub build: crate::layers::build::BuildSettings,
    /// SFS's slice of CPU time (and the `alps` slice until its frontend has learned one).
    pub sfs_slice_ms: u64,
    /// A controller to join (`http://HOST:PORT`); the worker pushes its status there.
    pub controller: Option<String>,
    /// The cluster's state store to join (`etcds://HOST:PORT[,…]`, or plain `etcd://` on
    /// loopback or with `store_insecure`): the worker publishes itself there under a lease,
    /// and every controller of the cluster finds it and polls it. It needs nothing else
    /// from etcd: its etcd user may write only its own member key (docs/operations.md).
    pub store: Option<String>,
    /// PEM CA that signed etcd's server certificate (needed by `etcds://`).
    pub store_ca: Option<PathBuf>,
    /// PEM client certificate and key for an etcd run with `--client-cert-auth`.
    pub store_cert: Option<PathBuf>,
    pub store_key: Option<PathBuf>,
    /// This worker's etcd user; its password is in `store_password_file` (0600).
    pub store_user: Option<String>,
    pub store_password_file: Option<PathBuf>,
    /// Accept a plain `etcd://` store on a non-loopback address (a loud warning at start).
    #[serde(deserialize_with = "hearth_service::config_loader::flag")]
    pub store_insecure: bool,
    /// The membership lease's time to live (whole seconds in etcd, at least 1 s): a worker that
    /// stops renewing it (killed, frozen) leaves the cluster within this.
    pub lease_ttl_ms: u64,
    /// How often the status is pushed to the controller.
    pub status_interval_ms: u64,
    /// The URL the controller forwards invocations to; defaults to `http://` + the bound address
    /// (`https://` when `tls_cert` is set).
    pub advertise_url: Option<String>,
    /// Require an API key on every route but `/healthz` (docs/security.md). Off is allowed on
    /// loopback listeners only.
    pub auth: bool,
    /// This worker's credential file (0600), made by the operator for this worker's id with
    /// `hearth cluster credential create`: its own token (sent when pushing status; good only
    /// for joining, reporting and leaving as this id) and the controller's token for it (the
    /// only one this worker serves the controller's calls for). Needed to join with `auth` on;
    /// the controllers' own `cluster.key` is refused.
    pub cluster_key_file: Option<PathBuf>,
    /// Every namespace's quota (0: unlimited).
    pub quota: QuotaLimits,
    /// Quotas of particular namespaces, replacing `quota` for them.
    pub quotas: BTreeMap<String, QuotaLimits>,
    /// The share of the concurrency limit one namespace may hold while functions of other
    /// namespaces are registered here (0 < share <= 1).
    pub namespace_share: f64,
    /// The share of this worker's sandbox memory budget one namespace's invocations may hold
    /// at once while functions of other namespaces are registered here (0 < share <= 1): over
    /// it its call gets 429 `fair_share`, so another namespace's cold start finds memory.
    pub namespace_memory_share: f64,
    /// The listener's certificate chain (PEM, leaf first): with `tls_key`, the API is served
    /// over TLS only (docs/security.md). Unset: plain HTTP.
    pub tls_cert: Option<PathBuf>,
    /// The private key of `tls_cert` (PEM: PKCS#8, PKCS#1 or SEC1).
    pub tls_key: Option<PathBuf>,
    /// Certificates (PEM) trusted when connecting to the controller over `https://`; unset: the
    /// system's roots.
    pub tls_ca: Option<PathBuf>,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            listen: "127.0.0.1:7878".into(),
            data_dir: hearth_service::serving::default_data_dir(),
            worker_id: None,
            backend: BackendKind::Runc,
            memory_mb: 4096,
            free_buffer_mb: 256,
            proactive_mb: 0,
            cpus: 0,
            queue: QueueDiscipline::Eedf,
            max_queue: 10_000,
            concurrency: Concurrency::default(),
            aimd: AimdConfig::default(),
            bypass_ms: 0.0,
            bypass_load: 1.0,
            keepalive: KeepAliveKind::Ttl,
            keepalive_ttl_s: 600,
            hist: HistSettings::default(),
            max_body_bytes: 6 * 1024 * 1024,
            max_code_bytes: 64 * 1024 * 1024,
            code_path_roots: Vec::new(),
            max_code_unpacked_bytes: hearth_service::registry::DEFAULT_MAX_CODE_UNPACKED_BYTES,
            max_code_files: hearth_service::registry::DEFAULT_MAX_CODE_FILES,
            max_concurrent_creations: 0,
            generic_pool: 4,
            generic_pool_min: 1,
            generic_memory_mb: 64,
            generic_pool_window_s: 30,
            warm_wait: true,
            async_retention_s: 600,
            async_retry_backoff_ms: 1000,
            async_max_records: 100_000,
            async_max_bytes: 256 * 1024 * 1024,
            async_max_records_per_namespace: None,
            async_max_bytes_per_namespace: None,
            max_functions_per_namespace:
                hearth_service::registry::DEFAULT_MAX_FUNCTIONS_PER_NAMESPACE,
            max_code_bytes_per_namespace: None,
            namespace_memory_share: 0.5,
            max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
            header_read_timeout_ms: serving::DEFAULT_HEADER_READ_TIMEOUT_MS,
            idle_timeout_ms: serving::DEFAULT_IDLE_TIMEOUT_MS,
            max_connections: serving::DEFAULT_MAX_CONNECTIONS,
            shutdown_grace_s: 30,
            low_latency: true,
            low_latency_quiet_ms: 1000,
            runtime_threads: 0,
            runc: RuncConfig::default(),
            cpu_sched: CpuSchedKind::Cfs,
            provision: ProvisionSettings::default(),
            gpu: GpuSettings::default(),
            build: crate::layers::build::BuildSettings::default(),
            sfs_slice_ms: crate::cpu_sched::DEFAULT_SFS_SLICE_MS,
            controller: None,
            store: None,
            store_ca: None,
            store_cert: None,
            store_key: None,
            store_user: None,
            store_password_file: None,
            store_insecure: false,
            lease_ttl_ms: 2000,
            status_interval_ms: 1000,
            advertise_url: None,
            auth: true,
            cluster_key_file: None,
            quota: QuotaLimits::default(),
            quotas: BTreeMap::new(),
            namespace_share: 0.5,
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
        }
    }
}

/// Top-level keys of [`WorkerConfig`], the only `HEARTH_*` variables read as configuration.
const CONFIG_KEYS: &[&str] = &[
    "listen",
    "data_dir",
    "worker_id",
    "backend",
    "memory_mb",
    "free_buffer_mb",
    "proactive_mb",
    "cpus",
    "queue",
    "max_queue",
    "concurrency",
    "aimd",
    "bypass_ms",
    "bypass_load",
    "keepalive",
    "keepalive_ttl_s",
    "hist",
    "max_body_bytes",
    "max_code_bytes",
    "code_path_roots",
    "max_code_unpacked_bytes",
    "max_code_files",
    "max_concurrent_creations",
    "generic_pool",
    "generic_pool_min",
    "generic_memory_mb",
    "generic_pool_window_s",
    "warm_wait",
    "async_retention_s",
    "async_retry_backoff_ms",
    "async_max_records",
    "async_max_bytes",
    "async_max_records_per_namespace",
    "async_max_bytes_per_namespace",
    "max_functions_per_namespace",
    "max_code_bytes_per_namespace",
    "max_result_bytes",
    "header_read_timeout_ms",
    "idle_timeout_ms",
    "max_connections",
    "shutdown_grace_s",
    "low_latency",
    "low_latency_quiet_ms",
    "runtime_threads",
    "runc",
    "cpu_sched",
    "provision",
    "gpu",
    "build",
    "sfs_slice_ms",
    "controller",
    "store",
    "store_ca",
    "store_cert",
    "store_key",
    "store_user",
    "store_password_file",
    "store_insecure",
    "lease_ttl_ms",
    "status_interval_ms",
    "advertise_url",
    "auth",
    "cluster_key_file",
    "quota",
    "quotas",
    "namespace_share",
    "namespace_memory_share",
    "tls_cert",
    "tls_key",
    "tls_ca",
];

/// `HEARTH_*` variables with other uses (client URL, log filter, test switches).
const NON_CONFIG_VARS: &[&str] = &["url", "log", "require_runc", "api_key", "ca_file"];

const ENV_KEYS: EnvKeys = EnvKeys {
    keys: CONFIG_KEYS,
    warn_unknown_except: Some(NON_CONFIG_VARS),
};

impl WorkerConfig {
    /// Defaults ← TOML file (if any) ← `HEARTH_*` environment (nested keys with `__`, e.g.
    /// `HEARTH_RUNC__UID_BASE`).
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        hearth_service::config_loader::load(file, ENV_KEYS, Self::check)
    }

    /// The HTTP edge's connection limits.
    pub fn conn_limits(&self) -> serving::ConnLimits {
        serving::ConnLimits {
            header_read_timeout: std::time::Duration::from_millis(self.header_read_timeout_ms),
            idle_timeout: std::time::Duration::from_millis(self.idle_timeout_ms),
            max_connections: self.max_connections,
        }
    }

    /// Refuses settings that cannot work.
    pub fn check(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        config_checks::listen(&self.listen)?;
        serving::check_limits(
            self.max_result_bytes,
            self.async_max_bytes,
            self.header_read_timeout_ms,
            self.idle_timeout_ms,
            self.max_connections,
        )?;
        serving::check_namespace_limits(&serving::NamespaceLimits {
            async_max_records: self.async_max_records,
            async_max_bytes: self.async_max_bytes,
            async_max_records_per_namespace: self.async_max_records_per_namespace,
            async_max_bytes_per_namespace: self.async_max_bytes_per_namespace,
            max_functions_per_namespace: self.max_functions_per_namespace,
            max_code_bytes_per_namespace: self.max_code_bytes_per_namespace,
        })?;
        config_checks::async_retry_backoff_ms(self.async_retry_backoff_ms)?;
        if self.max_concurrent_creations > 1024 {
            return bad(format!(
                "max_concurrent_creations must be between 0 (automatic) and 1024, got {}",
                self.max_concurrent_creations
            ));
        }
        config_checks::runtime_threads(self.runtime_threads)?;
        if self.generic_pool > 64 || self.generic_pool_min > 64 {
            return bad(format!(
                "generic_pool and generic_pool_min must be between 0 and 64, got {} and {}",
                self.generic_pool, self.generic_pool_min
            ));
        }
        if !(16..=65_536).contains(&self.generic_memory_mb) {
            return bad(format!(
                "generic_memory_mb must be between 16 and 65536, got {}",
                self.generic_memory_mb
            ));
        }
        if !(1..=86_400).contains(&self.generic_pool_window_s) {
            return bad(format!(
                "generic_pool_window_s must be between 1 and 86400, got {}",
                self.generic_pool_window_s
            ));
        }
        if self.memory_mb < 16 {
            return bad(format!(
                "memory_mb must be at least 16, got {}",
                self.memory_mb
            ));
        }
        if self.free_buffer_mb >= self.memory_mb {
            return bad("free_buffer_mb must be smaller than memory_mb".into());
        }
        if self.proactive_mb > self.memory_mb {
            return bad(format!(
                "proactive_mb ({} MiB) must be at most memory_mb ({} MiB): the proactive pool is \
                 reserved inside the memory budget",
                self.proactive_mb, self.memory_mb
            ));
        }
        if self.max_body_bytes == 0 || self.max_code_bytes == 0 {
            return bad("max_body_bytes and max_code_bytes must be positive".into());
        }
        self.code_intake().check().map_err(ConfigError::Invalid)?;
        self.build.check().map_err(ConfigError::Invalid)?;
        if self.max_queue == 0 {
            return bad("max_queue must be at least 1".into());
        }
        if !(self.bypass_ms.is_finite() && self.bypass_ms >= 0.0) {
            return bad(format!("bypass_ms must be >= 0, got {}", self.bypass_ms));
        }
        if !(self.bypass_load.is_finite() && self.bypass_load > 0.0) {
            return bad(format!("bypass_load must be > 0, got {}", self.bypass_load));
        }
        let a = &self.aimd;
        if a.min == 0
            || (a.max != 0 && a.max < a.min)
            || !(a.decrease > 0.0 && a.decrease < 1.0)
            || !(a.threshold.is_finite() && a.threshold > 0.0)
            || a.period_ms == 0
        {
            return bad(
                "aimd needs min >= 1, max 0 or >= min, 0 < decrease < 1, threshold > 0 and \
                 period_ms > 0"
                    .into(),
            );
        }
        if !(self.hist.max_cov.is_finite() && self.hist.max_cov >= 0.0) {
            return bad("hist.max_cov must be >= 0".into());
        }
        self.regulator()?;
        self.runc.check()?;
        // Every sandbox the memory can hold, twice over: uids of sandboxes being torn down
        // are not free yet, and a freed one waits for the rest of the range to be used.
        let most = 2 * (self.memory_mb / hearth_api::function::MIN_MEMORY_MB).max(1);
        if self.backend == BackendKind::Runc && u64::from(self.runc.uid_count) < most {
            return bad(format!(
                "runc.uid_count must be at least {most} (twice the sandboxes {} MiB can hold)",
                self.memory_mb
            ));
        }
        if !(1..=10_000).contains(&self.sfs_slice_ms) {
            return bad(format!(
                "sfs_slice_ms must be between 1 and 10000, got {}",
                self.sfs_slice_ms
            ));
        }
        if self.cpu_sched != CpuSchedKind::Cfs && self.backend != BackendKind::Runc {
            return bad(format!(
                "cpu_sched {} needs the runc backend (the {} backend has no processes to \
                 schedule); use cpu_sched = \"cfs\"",
                self.cpu_sched, self.backend
            ));
        }
        if self.cpu_sched != CpuSchedKind::Cfs && self.runc.cpu_shares_per_gb != 0 {
            return bad(format!(
                "runc.cpu_shares_per_gb and cpu_sched {} both set sandboxes' cpu.shares; \
                 use one of them",
                self.cpu_sched
            ));
        }
        for (key, url) in [
            ("controller", &self.controller),
            ("advertise_url", &self.advertise_url),
        ] {
            if let Some(u) = url {
                config_checks::http_url(key, u)?;
            }
        }
        config_checks::tls_pair(self.tls_cert.as_deref(), self.tls_key.as_deref())?;
        hearth_service::auth::check_exposure(&self.listen, self.auth)
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        if self
            .store
            .as_deref()
            .is_some_and(|s| s.starts_with("sqlite"))
        {
            return bad("a worker's store is an etcd:// URL to join a cluster by (its own async records are always in its data directory)".into());
        }
        let joins = self.controller.is_some() || self.store.is_some();
        if self.auth && joins && self.cluster_key_file.is_none() {
            return bad(
                "joining a controller needs a worker credential: set cluster_key_file to the file \
                 `hearth cluster credential create --worker ID --out FILE` writes"
                    .into(),
            );
        }
        for (key, share) in [
            ("namespace_share", self.namespace_share),
            ("namespace_memory_share", self.namespace_memory_share),
        ] {
            if !(share.is_finite() && share > 0.0 && share <= 1.0) {
                return bad(format!("{key} must be in (0, 1], got {share}"));
            }
        }
        hearth_service::quota::check_quotas(&self.quota, &self.quotas)
            .map_err(ConfigError::Invalid)?;
        if self.provision.elastic {
            self.elastic_config()
                .validate()
                .map_err(|e| ConfigError::Invalid(format!("[provision]: {e}")))?;
            let r = self.provision.sample_rate;
            if !(r > 0.0 && r <= 1.0) {
                return bad(format!(
                    "[provision] sample_rate must be in (0, 1], got {r}"
                ));
            }
        }
        self.gpu.check().map_err(ConfigError::Invalid)?;
        if let Some(store) = &self.store {
            config_checks::store(store, self.lease_ttl_ms, &self.store_access())?;
        }
        config_checks::status_interval_ms(self.status_interval_ms)
    }

    /// The `store_*` settings together.
    pub fn store_access(&self) -> hearth_service::store::StoreAccess {
        hearth_service::store::StoreAccess {
            ca: self.store_ca.clone(),
            cert: self.store_cert.clone(),
            key: self.store_key.clone(),
            user: self.store_user.clone(),
            password_file: self.store_password_file.clone(),
            insecure: self.store_insecure,
        }
    }

    /// Simulated GPUs run no processes: only the `sim` backend can use them. Checked when the
    /// worker starts rather than in [`Self::check`], because the backend may still be set by a
    /// command-line flag after the file and the environment are read.
    pub fn check_gpu_backend(&self) -> Result<(), ConfigError> {
        if self.gpu.devices == GpuDevices::Sim && self.backend != BackendKind::Sim {
            return Err(ConfigError::Invalid(format!(
                "gpu.devices = \"sim\" needs the sim backend (simulated GPUs run no processes), \
                 got backend {}",
                self.backend
            )));
        }
        Ok(())
    }

    /// The elastic controller's settings (`[provision]`); `max_mb = 0` means `memory_mb`.
    pub fn elastic_config(&self) -> hearth_core::provision::ElasticConfig {
        let p = &self.provision;
        hearth_core::provision::ElasticConfig {
            interval_us: p.interval_s.saturating_mul(1_000_000),
            target_miss_speed: p.target_miss_speed,
            dead_band: p.dead_band,
            min_mb: p.min_mb,
            max_mb: if p.max_mb == 0 {
                self.memory_mb
            } else {
                p.max_mb
            },
            smoothing: p.smoothing,
        }
    }

    /// The elastic controller, when `[provision] elastic` is on: its hit-ratio curve is built
    /// online from this worker's own arrivals. Starts at `memory_mb` at time `now`.
    pub fn elastic_controller(
        &self,
        now: Micros,
    ) -> Result<Option<hearth_core::provision::ElasticController>, ConfigError> {
        use hearth_core::provision::{CurveBuilder, CurveSource, ElasticController, Sampler};
        if !self.provision.elastic {
            return Ok(None);
        }
        let bad = |e: String| ConfigError::Invalid(format!("[provision]: {e}"));
        let sampler = Sampler::new(self.provision.sample_rate).map_err(|e| bad(e.to_string()))?;
        let curve = CurveBuilder::new(sampler)
            .max_functions(PROVISION_MAX_FUNCTIONS)
            .bucket_mb(PROVISION_BUCKET_MB);
        ElasticController::new(
            self.elastic_config(),
            CurveSource::Online(curve),
            self.memory_mb,
            now,
        )
        .map(Some)
        .map_err(|e| bad(e.to_string()))
    }

    /// Invocation slots this worker runs at once, for the namespaces' fair share.
    pub fn slots(&self) -> u32 {
        match self.regulator() {
            Ok(RegulatorConfig::Fixed(n)) => n,
            Ok(RegulatorConfig::Aimd(a)) if a.max > 0 => a.max,
            _ => self.effective_cpus(),
        }
    }

    /// The async store's bounds, in all and per namespace.
    pub fn async_limits(&self) -> hearth_service::store::sqlite::AsyncLimits {
        hearth_service::store::sqlite::AsyncLimits {
            max_records: self.async_max_records,
            max_bytes: self.async_max_bytes,
            max_records_per_namespace: self
                .async_max_records_per_namespace
                .unwrap_or_else(|| serving::default_namespace_share(self.async_max_records)),
            max_bytes_per_namespace: self
                .async_max_bytes_per_namespace
                .unwrap_or_else(|| serving::default_namespace_share(self.async_max_bytes)),
        }
    }

    /// What registrations may bring in as code.
    pub fn code_intake(&self) -> hearth_service::registry::CodeIntake {
        hearth_service::registry::CodeIntake {
            path_roots: self.code_path_roots.clone(),
            max_unpacked_bytes: self.max_code_unpacked_bytes,
            max_files: self.max_code_files,
            max_functions_per_namespace: self.max_functions_per_namespace,
            max_code_bytes_per_namespace: self.max_code_bytes_per_namespace.unwrap_or(
                hearth_service::registry::NAMESPACE_CODE_FUNCTIONS
                    .saturating_mul(self.max_code_unpacked_bytes),
            ),
        }
    }

    /// CPUs the worker schedules for: `cpus`, else the size of `runc.cpuset` when its
    /// sandboxes are pinned, else the host's.
    pub fn effective_cpus(&self) -> u32 {
        if self.cpus > 0 {
            return self.cpus;
        }
        if let (BackendKind::Runc, Some(set)) = (self.backend, &self.runc.cpuset) {
            return set.len() as u32;
        }
        hearth_service::serving::available_cpus() as u32
    }

    /// Threads for the async runtime: `runtime_threads`, else half the host's CPUs (at least 1).
    pub fn effective_runtime_threads(&self) -> usize {
        config_checks::effective_runtime_threads(self.runtime_threads)
    }

    /// The cap on concurrent sandbox creations (None: no cap).
    pub fn creation_cap(&self) -> Option<usize> {
        match (self.max_concurrent_creations, self.backend) {
            (0, BackendKind::Sim) => None,
            (0, BackendKind::Runc) => Some(self.effective_cpus().max(1) as usize),
            (n, _) => Some(n as usize),
        }
    }

    /// The generic sandbox pool (off with the `sim` backend, whose sandboxes are sleeps).
    pub fn generic_config(&self) -> GenericConfig {
        if self.backend == BackendKind::Sim || self.generic_pool == 0 {
            return GenericConfig::OFF;
        }
        GenericConfig {
            max: self.generic_pool,
            // A floor above the cap means "always full".
            min: self.generic_pool_min.min(self.generic_pool),
            memory_mb: self.generic_memory_mb,
            window_us: self.generic_pool_window_s.saturating_mul(1_000_000),
        }
    }

    /// The concurrency regulator these settings ask for.
    pub fn regulator(&self) -> Result<RegulatorConfig, ConfigError> {
        match &self.concurrency {
            Concurrency::Limit(0) => Ok(RegulatorConfig::Fixed(self.effective_cpus())),
            Concurrency::Limit(n) => Ok(RegulatorConfig::Fixed(*n)),
            Concurrency::Named(s) if s.eq_ignore_ascii_case("aimd") => {
                Ok(RegulatorConfig::Aimd(self.aimd.clone()))
            }
            Concurrency::Named(s) => Err(ConfigError::Invalid(format!(
                "concurrency must be a number of invocations or \"aimd\", got {s:?}"
            ))),
        }
    }

    /// The keep-alive policy these settings ask for.
    pub fn keepalive_config(&self) -> KeepAliveConfig {
        KeepAliveConfig {
            kind: self.keepalive,
            ttl: self.keepalive_ttl_s.saturating_mul(1_000_000),
            hist: HistConfig {
                generic_ttl: self.hist.generic_ttl_s.saturating_mul(1_000_000),
                max_cov: self.hist.max_cov,
                min_samples: self.hist.min_samples,
                ..HistConfig::default()
            },
        }
    }

    /// The worker's name in answers.
    pub fn worker_id(&self) -> String {
        self.worker_id
            .clone()
            .unwrap_or_else(|| self.listen.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API, test-only
    fn file_then_environment_override_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.toml");
        std::fs::write(
            &path,
            "listen = \"127.0.0.1:9000\"\nmemory_mb = 2048\nbackend = \"sim\"\n[runc]\nuid_base = 3000000000\n\
             gpu_shim_path = \"/opt/hearth/libhearth_cuda_shim.so\"\n",
        )
        .unwrap();
        figment::Jail::expect_with(|jail| {
            jail.set_env("HEARTH_MEMORY_MB", "1024");
            jail.set_env("HEARTH_RUNC__TMP_SIZE_MB", "32");
            let c = WorkerConfig::load(Some(&path)).map_err(|e| e.to_string())?;
            assert_eq!(c.listen, "127.0.0.1:9000");
            assert_eq!(c.memory_mb, 1024);
            assert_eq!(c.backend, BackendKind::Sim);
            assert_eq!(c.runc.uid_base, 3_000_000_000);
            assert_eq!(c.runc.tmp_size_mb, 32);
            assert_eq!(
                c.runc.gpu_shim_path.as_deref(),
                Some(Path::new("/opt/hearth/libhearth_cuda_shim.so"))
            );
            assert_eq!(RuncConfig::default().gpu_shim_path, None);
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API, test-only
    fn the_build_section_loads_and_an_index_is_refused_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.toml");
        std::fs::write(
            &path,
            "backend = \"sim\"\n[build]\nmemory_mb = 512\ntimeout_s = 60\nmax_layer_mb = 128\n\
             find_links = [\"/srv/wheels\"]\nmax_layer_bytes_per_namespace = 1000000\n",
        )
        .unwrap();
        figment::Jail::expect_with(|jail| {
            jail.set_env("HEARTH_BUILD__CPUS", "0.5");
            let c = WorkerConfig::load(Some(&path)).map_err(|e| e.to_string())?;
            assert_eq!(c.build.memory_mb, 512);
            assert_eq!(c.build.timeout_s, 60);
            assert_eq!(c.build.max_layer_mb, 128);
            assert_eq!(c.build.cpus, 0.5);
            assert_eq!(c.build.find_links, [PathBuf::from("/srv/wheels")]);
            assert_eq!(c.build.max_layer_bytes_per_namespace, 1_000_000);
            assert!(c.build.no_index);
            Ok(())
        });
        for bad in [
            "[build]\nindex_url = \"ftp://pypi.org/simple\"\nno_index = false\n",
            "[build]\nextra_index_url = [\"https://x.example/simple\"]\nno_index = true\n",
            "[build]\ntimeout_s = 0\n",
            "[build]\nfind_links = [\"relative/dir\"]\n",
            "[build]\nno_such_key = 1\n",
        ] {
            std::fs::write(&path, format!("backend = \"sim\"\n{bad}")).unwrap();
            figment::Jail::expect_with(|_| {
                let e = WorkerConfig::load(Some(&path)).unwrap_err().to_string();
                assert!(
                    e.contains("build") || e.contains("no_such_key"),
                    "{bad}: {e}"
                );
                if bad.contains("index_url") {
                    assert!(e.contains("index_url"), "{e}");
                }
                Ok(())
            });
        }
    }

    #[test]
    fn runc_limits_must_be_positive_and_bounded() {
        assert!(RuncConfig::default().check().is_ok());
        for bad in [
            RuncConfig {
                run_inodes: 0,
                ..RuncConfig::default()
            },
            RuncConfig {
                log_file_bytes: 10,
                ..RuncConfig::default()
            },
            RuncConfig {
                tmp_size_mb: u64::MAX,
                ..RuncConfig::default()
            },
            // Sandbox uids: not the host's users, not past the last uid, not an empty range.
            RuncConfig {
                uid_base: 65_534,
                ..RuncConfig::default()
            },
            RuncConfig {
                uid_base: u32::MAX - 100,
                ..RuncConfig::default()
            },
            RuncConfig {
                uid_count: 0,
                ..RuncConfig::default()
            },
        ] {
            let c = WorkerConfig {
                runc: bad,
                ..WorkerConfig::default()
            };
            assert!(c.check().unwrap_err().to_string().contains("runc."));
        }
    }

    #[test]
    fn the_uid_range_holds_every_sandbox_the_memory_can_hold_twice() {
        let c = |memory_mb, uid_count| WorkerConfig {
            backend: BackendKind::Runc,
            memory_mb,
            runc: RuncConfig {
                uid_count,
                ..RuncConfig::default()
            },
            ..WorkerConfig::default()
        };
        // 4 GiB holds 256 sandboxes of 16 MiB.
        assert!(c(4096, 512).check().is_ok());
        let e = c(4096, 511).check().unwrap_err().to_string();
        assert!(e.contains("runc.uid_count must be at least 512"), "{e}");
        // The default range serves workers of up to 512 GiB.
        assert!(c(1 << 19, DEFAULT_UID_COUNT).check().is_ok());
        assert!(c(1 << 20, DEFAULT_UID_COUNT).check().is_err());
        // The sim backend has no sandbox processes.
        let sim = WorkerConfig {
            backend: BackendKind::Sim,
            ..c(4096, 1)
        };
        assert!(sim.check().is_ok());
    }

    #[test]
    fn the_generic_pool_is_runc_only_bounded_and_off_at_zero() {
        let runc = WorkerConfig {
            backend: BackendKind::Runc,
            ..WorkerConfig::default()
        };
        let g = runc.generic_config();
        assert_eq!((g.max, g.min, g.memory_mb), (4, 1, 64));
        assert_eq!(g.window_us, 30_000_000);
        let sim = WorkerConfig {
            backend: BackendKind::Sim,
            ..WorkerConfig::default()
        };
        assert!(!sim.generic_config().enabled());
        // 0 turns it off whatever the floor says (HEARTH_GENERIC_POOL=0 alone must work).
        let off = WorkerConfig {
            generic_pool: 0,
            ..runc.clone()
        };
        assert!(off.check().is_ok());
        assert!(!off.generic_config().enabled());
        for bad in [
            WorkerConfig {
                generic_pool: 65,
                ..runc.clone()
            },
            WorkerConfig {
                generic_memory_mb: 8,
                ..runc.clone()
            },
            WorkerConfig {
                generic_pool_window_s: 0,
                ..runc.clone()
            },
        ] {
            assert!(bad.check().unwrap_err().to_string().contains("generic_"));
        }
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API, test-only
    fn unrelated_hearth_variables_are_not_configuration() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("HEARTH_URL", "http://127.0.0.1:1");
            jail.set_env("HEARTH_SOMETHING_ELSE", "x");
            let c = WorkerConfig::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c, WorkerConfig::default());
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API, test-only
    fn policies_are_chosen_by_name_in_the_file_or_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.toml");
        std::fs::write(
            &path,
            "queue = \"sjf\"\nkeepalive = \"gdsf\"\nconcurrency = 3\ncpus = 16\n[aimd]\nthreshold = 0.7\n",
        )
        .unwrap();
        let c = WorkerConfig::load(Some(&path)).unwrap();
        assert_eq!(c.queue, QueueDiscipline::Sjf);
        assert_eq!(c.keepalive_config().kind, KeepAliveKind::Gdsf);
        assert_eq!(c.regulator().unwrap(), RegulatorConfig::Fixed(3));
        figment::Jail::expect_with(|jail| {
            jail.set_env("HEARTH_CONCURRENCY", "aimd");
            jail.set_env("HEARTH_QUEUE", "srsf");
            let c = WorkerConfig::load(Some(&path)).map_err(|e| e.to_string())?;
            assert_eq!(c.queue, QueueDiscipline::Srsf);
            match c.regulator().map_err(|e| e.to_string())? {
                RegulatorConfig::Aimd(a) => assert_eq!(a.threshold, 0.7),
                other => panic!("{other:?}"),
            }
            jail.set_env("HEARTH_CONCURRENCY", "lots");
            let err = WorkerConfig::load(None).unwrap_err().to_string();
            assert!(err.contains("aimd"), "{err}");
            jail.set_env("HEARTH_CONCURRENCY", "0");
            jail.set_env("HEARTH_QUEUE", "lifo");
            let err = WorkerConfig::load(None).unwrap_err().to_string();
            assert!(err.contains("lifo"), "{err}");
            Ok(())
        });
        let d = WorkerConfig {
            cpus: 6,
            ..WorkerConfig::default()
        };
        assert_eq!(
            d.regulator().unwrap(),
            RegulatorConfig::Fixed(6),
            "default: the CPUs"
        );
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API, test-only
    fn unknown_keys_and_bad_values_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.toml");
        // In a jail, so that another test's HEARTH_* variables cannot leak in meanwhile.
        figment::Jail::expect_with(|_| {
            std::fs::write(&path, "memroy_mb = 5\n").unwrap();
            let err = WorkerConfig::load(Some(&path)).unwrap_err().to_string();
            assert!(err.contains("memroy_mb"), "{err}");
            std::fs::write(&path, "listen = \"nowhere\"\n").unwrap();
            let err = WorkerConfig::load(Some(&path)).unwrap_err().to_string();
            assert!(err.contains("listen"), "{err}");
            let err = WorkerConfig::load(Some(&dir.path().join("missing.toml")))
                .unwrap_err()
                .to_string();
            assert!(err.contains("missing.toml"), "{err}");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API, test-only
    fn runtime_threads_default_to_half_the_cpus_and_are_range_checked() {
        figment::Jail::expect_with(|jail| {
            let c = WorkerConfig::load(None).map_err(|e| e.to_string())?;
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            assert_eq!(c.runtime_threads, 0);
            assert_eq!(c.effective_runtime_threads(), (cpus / 2).max(1));
            jail.set_env("HEARTH_RUNTIME_THREADS", "3");
            let c = WorkerConfig::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.effective_runtime_threads(), 3);
            jail.set_env("HEARTH_RUNTIME_THREADS", "1025");
            let err = WorkerConfig::load(None).unwrap_err().to_string();
            assert!(err.contains("runtime_threads"), "{err}");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API, test-only
    fn code_intake_settings_come_from_the_environment_and_are_checked() {
        figment::Jail::expect_with(|jail| {
            let c = WorkerConfig::load(None).map_err(|e| e.to_string())?;
            assert!(c.code_path_roots.is_empty(), "code.path is off by default");
            assert_eq!(c.code_intake().max_unpacked_bytes, 250 * 1024 * 1024);
            assert_eq!(c.code_intake().max_files, 10_000);
            jail.set_env(
                "HEARTH_CODE_PATH_ROOTS",
                "[\"/srv/functions\", \"/opt/fn\"]",
            );
            jail.set_env("HEARTH_MAX_CODE_FILES", "50");
            let c = WorkerConfig::load(None).map_err(|e| e.to_string())?;
            assert_eq!(
                c.code_path_roots,
                vec![PathBuf::from("/srv/functions"), PathBuf::from("/opt/fn")]
            );
            assert_eq!(c.code_intake().max_files, 50);
            jail.set_env("HEARTH_CODE_PATH_ROOTS", "[\"relative\"]");
            let err = WorkerConfig::load(None).unwrap_err().to_string();
            assert!(err.contains("absolute"), "{err}");
            jail.set_env("HEARTH_CODE_PATH_ROOTS", "[]");
            jail.set_env("HEARTH_MAX_CODE_FILES", "0");
            let err = WorkerConfig::load(None).unwrap_err().to_string();
            assert!(err.contains("max_code_files"), "{err}");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API, test-only
    fn per_namespace_limits_have_fair_defaults_and_are_checked() {
        figment::Jail::expect_with(|jail| {
            let c = WorkerConfig::load(None).map_err(|e| e.to_string())?;
            let l = c.async_limits();
            assert_eq!(l.max_records_per_namespace * 4, l.max_records);
            assert_eq!(l.max_bytes_per_namespace * 4, l.max_bytes);
            assert_eq!(c.code_intake().max_functions_per_namespace, 100);
            assert_eq!(
                c.code_intake().max_code_bytes_per_namespace,
                4 * c.max_code_unpacked_bytes
            );
            assert_eq!(c.namespace_memory_share, 0.5);
            // A lowered (or raised) shared bound moves the default share with it.
            jail.set_env("HEARTH_ASYNC_MAX_BYTES", "1048576");
            jail.set_env("HEARTH_MAX_CODE_UNPACKED_BYTES", "1000");
            let c = WorkerConfig::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.async_limits().max_bytes_per_namespace, 262_144);
            assert_eq!(c.code_intake().max_code_bytes_per_namespace, 4000);
            jail.set_env("HEARTH_MAX_FUNCTIONS_PER_NAMESPACE", "7");
            jail.set_env("HEARTH_NAMESPACE_MEMORY_SHARE", "0.25");
            let c = WorkerConfig::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.code_intake().max_functions_per_namespace, 7);
            assert_eq!(c.namespace_memory_share, 0.25);
            Ok(())
        });
        // Bad values, checked on the struct (setting them in the environment would race
        // with this module's tests that load without a jail).
        type Set = fn(&mut WorkerConfig);
        let cases: [(Set, &str); 6] = [
            (
                |c| c.async_max_records_per_namespace = Some(100_001),
                "async_max_records_per_namespace",
            ),
            (
                |c| c.async_max_bytes_per_namespace = Some(0),
                "async_max_bytes_per_namespace",
            ),
            (
                |c| c.max_functions_per_namespace = 0,
                "max_functions_per_namespace",
            ),
            (
                |c| c.max_code_bytes_per_namespace = Some(0),
                "max_code_bytes_per_namespace",
            ),
            (|c| c.namespace_memory_share = 1.5, "namespace_memory_share"),
            (|c| c.namespace_memory_share = 0.0, "namespace_memory_share"),
        ];
        for (set, named) in cases {
            let mut c = WorkerConfig::default();
            assert!(c.check().is_ok());
            set(&mut c);
            let err = c.check().unwrap_err().to_string();
            assert!(err.contains(named), "{named}: {err}");
        }
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API, test-only
    fn a_cpuset_is_parsed_from_the_environment_checked_and_sizes_the_worker() {
        figment::Jail::expect_with(|jail| {
            let c = WorkerConfig::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.runc.cpuset, None);
            // A bare number reaches serde as an integer.
            jail.set_env("HEARTH_RUNC__CPUSET", "0");
            jail.set_env("HEARTH_BACKEND", "runc");
            let c = WorkerConfig::load(None).map_err(|e| e.to_string())?;
            assert_eq!(
                c.runc.cpuset.as_ref().map(|s| s.to_string()),
                Some("0".into())
            );
            assert_eq!(c.effective_cpus(), 1, "the pinned CPUs are the worker's");
            assert_eq!(c.creation_cap(), Some(1));
            jail.set_env("HEARTH_RUNC__CPUSET", "0-8192");
            let err = WorkerConfig::load(None).unwrap_err().to_string();
            assert!(
                err.to_lowercase().contains("runc.cpuset") && err.contains("8191"),
                "{err}"
            );
            jail.set_env("HEARTH_RUNC__CPUSET", "0,x");
            let err = WorkerConfig::load(None).unwrap_err().to_string();
            assert!(err.contains("CPU list"), "{err}");
            if let Ok(online) = std::fs::read_to_string(ONLINE_CPUS) {
                let last = *CpuSet::parse(online.trim()).unwrap().cpus().last().unwrap();
                jail.set_env("HEARTH_RUNC__CPUSET", (last + 1).to_string());
                let err = WorkerConfig::load(None).unwrap_err().to_string();
                assert!(
                    err.contains("runc.cpuset") && err.contains("not online"),
                    "{err}"
                );
            }
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API, test-only
    fn cpu_in_proportion_to_memory_is_off_by_default_and_checked() {
        let d = RuncConfig::default();
        assert_eq!(d.cpu_shares(128), None);
        let on = RuncConfig {
            cpu_shares_per_gb: 1024,
            ..d.clone()
        };
        assert_eq!(on.cpu_shares(256), Some(256));
        assert_eq!(on.cpu_shares(4096), Some(4096));
        assert_eq!(on.cpu_shares(1), Some(2), "the kernel's least");
        assert_eq!(on.cpu_shares(u64::MAX), Some(262_144), "the kernel's most");
        on.check().unwrap();
        for bad in [1, 15, (1 << 20) + 1] {
            let c = RuncConfig {
                cpu_shares_per_gb: bad,
                ..d.clone()
            };
            let err = c.check().unwrap_err().to_string();
            assert!(err.contains("runc.cpu_shares_per_gb"), "{err}");
        }
        figment::Jail::expect_with(|jail| {
            jail.set_env("HEARTH_RUNC__CPU_SHARES_PER_GB", "1024");
            let c = WorkerConfig::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.runc.cpu_shares_per_gb, 1024);
            jail.set_env("HEARTH_CPU_SCHED", "sfs");
            let err = WorkerConfig::load(None).unwrap_err().to_string();
            assert!(err.contains("cpu_shares_per_gb and cpu_sched sfs"), "{err}");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API, test-only
    fn cpu_scheduling_is_cfs_by_default_and_checked_at_start() {
        let d = WorkerConfig::default();
        assert_eq!((d.cpu_sched, d.sfs_slice_ms), (CpuSchedKind::Cfs, 50));
        figment::Jail::expect_with(|jail| {
            jail.set_env("HEARTH_CPU_SCHED", "sfs");
            jail.set_env("HEARTH_SFS_SLICE_MS", "20");
            let c = WorkerConfig::load(None).map_err(|e| e.to_string())?;
            assert_eq!((c.cpu_sched, c.sfs_slice_ms), (CpuSchedKind::Sfs, 20));
            jail.set_env("HEARTH_CPU_SCHED", "alps");
            let c = WorkerConfig::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.cpu_sched, CpuSchedKind::Alps);
            jail.set_env("HEARTH_CPU_SCHED", "fifo");
            let err = WorkerConfig::load(None).unwrap_err().to_string();
            assert!(
                err.contains("fifo") && err.to_lowercase().contains("cpu_sched"),
                "{err}"
            );
            jail.set_env("HEARTH_CPU_SCHED", "sfs");
            jail.set_env("HEARTH_SFS_SLICE_MS", "0");
            let err = WorkerConfig::load(None).unwrap_err().to_string();
            assert!(err.contains("sfs_slice_ms"), "{err}");
            jail.set_env("HEARTH_SFS_SLICE_MS", "50");
            jail.set_env("HEARTH_BACKEND", "sim");
            let err = WorkerConfig::load(None).unwrap_err().to_string();
            assert!(
                err.contains("cpu_sched sfs needs the runc backend"),
                "{err}"
            );
            Ok(())
        });
        assert_eq!("sfs".parse::<CpuSchedKind>(), Ok(CpuSchedKind::Sfs));
        let err = "SFS".parse::<CpuSchedKind>().unwrap_err().to_string();
        assert!(err.contains("expected cfs, sfs or alps"), "{err}");
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API, test-only
    fn the_proactive_pool_is_off_by_default_and_fits_in_the_budget() {
        assert_eq!(WorkerConfig::default().proactive_mb, 0);
        figment::Jail::expect_with(|jail| {
            jail.set_env("HEARTH_MEMORY_MB", "1024");
            jail.set_env("HEARTH_PROACTIVE_MB", "512");
            let c = WorkerConfig::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.proactive_mb, 512);
            jail.set_env("HEARTH_PROACTIVE_MB", "1024");
            assert!(
                WorkerConfig::load(None).is_ok(),
                "the whole budget is allowed"
            );
            jail.set_env("HEARTH_PROACTIVE_MB", "1025");
            let err = WorkerConfig::load(None).unwrap_err().to_string();
            assert!(
                err.contains("proactive_mb (1025 MiB) must be at most memory_mb (1024 MiB)"),
                "{err}"
            );
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API, test-only
    fn the_gpu_section_reads_from_the_file_and_the_environment() {
        assert_eq!(WorkerConfig::default().gpu.devices, GpuDevices::Auto);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.toml");
        std::fs::write(
            &path,
            "backend = \"sim\"\n[gpu]\ndevices = \"sim\"\nsim = [{ memory_mb = 16384 }, { memory_mb = 8192 }]\n",
        )
        .unwrap();
        figment::Jail::expect_with(|jail| {
            let c = WorkerConfig::load(Some(&path)).map_err(|e| e.to_string())?;
            assert_eq!(c.gpu.devices, GpuDevices::Sim);
            let sizes: Vec<u64> = c.gpu.sim.iter().map(|g| g.memory_mb).collect();
            assert_eq!(sizes, [16_384, 8192]);
            jail.set_env("HEARTH_GPU__DEVICES", "none");
            let err = WorkerConfig::load(Some(&path)).unwrap_err().to_string();
            assert!(
                err.contains("set gpu.devices = \"sim\" to use them"),
                "{err}"
            );
            jail.set_env("HEARTH_GPU__DEVICES", "sim");
            jail.set_env("HEARTH_BACKEND", "runc");
            let c = WorkerConfig::load(Some(&path)).map_err(|e| e.to_string())?;
            let err = c.check_gpu_backend().unwrap_err().to_string();
            assert!(
                err.contains("gpu.devices = \"sim\" needs the sim backend"),
                "{err}"
            );
            jail.set_env("HEARTH_BACKEND", "sim");
            jail.set_env("HEARTH_GPU__SIM", "[{memory_mb=24576}]");
            let c = WorkerConfig::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.gpu.sim, [SimGpu { memory_mb: 24_576 }]);
            Ok(())
        });
    }
}
