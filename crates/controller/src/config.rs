//! Controller configuration: a TOML file, overridden by `HEARTH_*` environment variables,
//! overridden by command-line flags (the worker's scheme, with the controller's keys).

use hearth_core::balance::{BalanceKind, BalanceParams};
use hearth_core::proactive::AtollConfig;

pub use crate::autoscale::AutoscaleConfig;
use hearth_service::config_checks;
use hearth_service::config_loader::EnvKeys;
use hearth_service::quota::QuotaLimits;
use hearth_service::serving::{self, DEFAULT_MAX_RESULT_BYTES};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use hearth_service::config_loader::ConfigError;

/// Everything a controller needs to run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControllerConfig {
    /// Address of the public API (and of the workers' status pushes).
    pub listen: String,
    /// The registry database and function code.
    pub data_dir: PathBuf,
    /// The balancing policy.
    pub balance: BalanceKind,
    /// Its parameters (`[balance_params]`).
    pub balance_params: BalanceParams,
    /// Atoll (`[atoll]`, docs/atoll.md): when set, Atoll's balancer routes instead of
    /// `balance`, and the controller allocates proactive sandboxes on the workers.
    pub atoll: Option<AtollConfig>,
    /// Horizontal autoscaling (`[autoscale]`, docs/autoscaling.md): when set, the controller's
    /// autoscaler runs the configured command or webhook to add or remove workers.
    pub autoscale: Option<AutoscaleConfig>,
    /// Workers polled by the controller (`http://HOST:PORT` or `https://HOST:PORT`), besides
    /// those that join by pushing.
    pub workers: Vec<String>,
    /// Where the cluster's state lives: `sqlite` (this controller's data directory; one
    /// controller), `etcds://HOST:PORT[,…]` (etcd over TLS: several controllers serve one
    /// cluster) or `etcd://HOST:PORT[,…]` (plain: loopback, or with `store_insecure`).
    pub store: String,
    /// PEM CA that signed etcd's server certificate (needed by `etcds://`).
    pub store_ca: Option<PathBuf>,
    /// PEM client certificate and key for an etcd run with `--client-cert-auth`.
    pub store_cert: Option<PathBuf>,
    pub store_key: Option<PathBuf>,
    /// This controller's etcd user; its password is in `store_password_file` (0600).
    pub store_user: Option<String>,
    pub store_password_file: Option<PathBuf>,
    /// Accept a plain `etcd://` store on a non-loopback address (a loud warning at start).
    #[serde(deserialize_with = "hearth_service::config_loader::flag")]
    pub store_insecure: bool,
    /// Time to live of this controller's etcd session (its claims on async invocations): when
    /// it dies, another controller takes them over within this (whole seconds, at least 1 s).
    pub lease_ttl_ms: u64,
    /// The URL other members reach this controller at (default: `http://` + the listen
    /// address); published in etcd.
    pub advertise_url: Option<String>,
    /// How often static workers are polled; pushing workers choose their own interval.
    pub status_interval_ms: u64,
    /// Threads of the controller's async runtime (0: half the host's CPUs, at least 1).
    pub runtime_threads: u32,
    /// A worker not heard from for this long leaves the ring.
    pub status_timeout_ms: u64,
    /// How often each live worker's `/healthz` is probed (0: never). A probe unanswered within
    /// `probe_timeout_ms` takes the worker out of the ring until it reports again, so that a
    /// frozen worker stops getting work within `probe_interval_ms + probe_timeout_ms`.
    pub probe_interval_ms: u64,
    pub probe_timeout_ms: u64,
    /// Connecting to a worker may take this long before it counts as down.
    pub connect_timeout_ms: u64,
    /// A forwarded invocation may take its function's timeout plus this before the controller
    /// gives up on the worker (504): the worker enforces the timeout itself, so only a stuck
    /// worker hits this.
    pub forward_grace_ms: u64,
    /// Largest accepted invocation body.
    pub max_body_bytes: usize,
    /// Largest accepted registration body.
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
    /// How long results of async invocations are kept after they finish.
    pub async_retention_s: u64,
    /// Back-off before the first retry of a failed async invocation; doubles per retry, up to
    /// 30 s.
    pub async_retry_backoff_ms: u64,
    /// Most async invocations kept before new ones are refused with 429.
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
    /// Require an API key on every route but `/healthz` (docs/security.md). Off is allowed on
    /// loopback listeners only.
    pub auth: bool,
    /// The controllers' master key (never given to workers: they get worker credentials,
    /// `hearth cluster credential create`); the controller's token for each worker is derived
    /// from it. Default `<data_dir>/cluster.key`, made (0600) on the first start.
    pub cluster_key_file: Option<PathBuf>,
    /// Keys one namespace may hold (the operator's `*` keys count apart against the same
    /// number); more are refused 429.
    pub max_keys_per_namespace: usize,
    /// Every namespace's quota (0: unlimited).
    pub quota: QuotaLimits,
    /// Quotas of particular namespaces, replacing `quota` for them.
    pub quotas: BTreeMap<String, QuotaLimits>,
    /// The listener's certificate chain (PEM, leaf first): with `tls_key`, the API is served
    /// over TLS only (docs/security.md). Unset: plain HTTP.
    pub tls_cert: Option<PathBuf>,
    /// The private key of `tls_cert` (PEM: PKCS#8, PKCS#1 or SEC1).
    pub tls_key: Option<PathBuf>,
    /// Certificates (PEM) trusted when connecting to workers over `https://`; unset: the
    /// system's roots.
    pub tls_ca: Option<PathBuf>,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            listen: "127.0.0.1:7878".into(),
            data_dir: hearth_service::serving::default_data_dir().join("controller"),
            balance: BalanceKind::ChRlu,
            balance_params: BalanceParams::default(),
            atoll: None,
            autoscale: None,
            workers: Vec::new(),
            status_interval_ms: 1000,
            runtime_threads: 0,
            status_timeout_ms: 3000,
            store: "sqlite".into(),
            store_ca: None,
            store_cert: None,
            store_key: None,
            store_user: None,
            store_password_file: None,
            store_insecure: false,
            lease_ttl_ms: 2000,
            advertise_url: None,
            probe_interval_ms: 250,
            probe_timeout_ms: 1000,
            connect_timeout_ms: 1000,
            forward_grace_ms: 30_000,
            max_body_bytes: 6 * 1024 * 1024,
            max_code_bytes: 64 * 1024 * 1024,
            code_path_roots: Vec::new(),
            max_code_unpacked_bytes: hearth_service::registry::DEFAULT_MAX_CODE_UNPACKED_BYTES,
            max_code_files: hearth_service::registry::DEFAULT_MAX_CODE_FILES,
            async_retention_s: 600,
            async_retry_backoff_ms: 1000,
            async_max_records: 100_000,
            async_max_bytes: 256 * 1024 * 1024,
            async_max_records_per_namespace: None,
            async_max_bytes_per_namespace: None,
            max_functions_per_namespace:
                hearth_service::registry::DEFAULT_MAX_FUNCTIONS_PER_NAMESPACE,
            max_code_bytes_per_namespace: None,
            max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
            header_read_timeout_ms: serving::DEFAULT_HEADER_READ_TIMEOUT_MS,
            idle_timeout_ms: serving::DEFAULT_IDLE_TIMEOUT_MS,
            max_connections: serving::DEFAULT_MAX_CONNECTIONS,
            shutdown_grace_s: 30,
            auth: true,
            cluster_key_file: None,
            max_keys_per_namespace: hearth_service::auth::DEFAULT_MAX_KEYS_PER_NAMESPACE,
            quota: QuotaLimits::default(),
            quotas: BTreeMap::new(),
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
        }
    }
}

/// Top-level keys, the only `HEARTH_*` variables the controller reads.
const CONFIG_KEYS: &[&str] = &[
    "listen",
    "data_dir",
    "balance",
    "balance_params",
    "atoll",
    "autoscale",
    "workers",
    "status_interval_ms",
    "runtime_threads",
    "status_timeout_ms",
    "store",
    "store_ca",
    "store_cert",
    "store_key",
    "store_user",
    "store_password_file",
    "store_insecure",
    "lease_ttl_ms",
    "advertise_url",
    "probe_interval_ms",
    "probe_timeout_ms",
    "connect_timeout_ms",
    "forward_grace_ms",
    "max_body_bytes",
    "max_code_bytes",
    "code_path_roots",
    "max_code_unpacked_bytes",
    "max_code_files",
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
    "auth",
    "cluster_key_file",
    "max_keys_per_namespace",
    "quota",
    "quotas",
    "tls_cert",
    "tls_key",
    "tls_ca",
];

/// Unknown `HEARTH_*` variables are not warned about: `hearth up` runs the controller in a
/// process whose environment also carries its workers' settings.
const ENV_KEYS: EnvKeys = EnvKeys {
    keys: CONFIG_KEYS,
    warn_unknown_except: None,
};

impl ControllerConfig {
    /// Defaults ← TOML file (if any) ← `HEARTH_*` environment (nested keys with `__`, e.g.
    /// `HEARTH_BALANCE_PARAMS__B_MAX`).
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

    /// This controller's name in the cluster's membership: the advertised address.
    pub fn controller_name(&self) -> String {
        let url = self.public_url();
        url.split("://").nth(1).unwrap_or(&url).to_string()
    }

    /// The URL others reach this controller at.
    pub fn public_url(&self) -> String {
        match &self.advertise_url {
            Some(u) => u.trim_end_matches('/').to_string(),
            None => {
                let scheme = if self.tls_cert.is_some() {
                    "https"
                } else {
                    "http"
                };
                format!("{scheme}://{}", self.listen)
            }
        }
    }

    /// Threads for the async runtime: `runtime_threads`, else half the host's CPUs (at least 1).
    pub fn effective_runtime_threads(&self) -> usize {
        config_checks::effective_runtime_threads(self.runtime_threads)
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
        for w in &self.workers {
            config_checks::http_url("workers", w)?;
        }
        config_checks::status_interval_ms(self.status_interval_ms)?;
        config_checks::runtime_threads(self.runtime_threads)?;
        config_checks::store(&self.store, self.lease_ttl_ms, &self.store_access())?;
        if let Some(u) = &self.advertise_url {
            config_checks::http_url("advertise_url", u)?;
        }
        if self.probe_interval_ms != 0 && !(10..=60_000).contains(&self.probe_interval_ms) {
            return bad(format!(
                "probe_interval_ms must be 0 (off) or between 10 and 60000, got {}",
                self.probe_interval_ms
            ));
        }
        if !(10..=60_000).contains(&self.probe_timeout_ms) {
            return bad(format!(
                "probe_timeout_ms must be between 10 and 60000, got {}",
                self.probe_timeout_ms
            ));
        }
        if self.status_timeout_ms < self.status_interval_ms {
            return bad(format!(
                "status_timeout_ms ({}) must be at least status_interval_ms ({})",
                self.status_timeout_ms, self.status_interval_ms
            ));
        }
        if !(1..=1_000_000).contains(&self.max_keys_per_namespace) {
            return bad("max_keys_per_namespace must be between 1 and 1000000".into());
        }
        if self.connect_timeout_ms == 0 || self.max_body_bytes == 0 || self.max_code_bytes == 0 {
            return bad(
                "connect_timeout_ms, max_body_bytes and max_code_bytes must be positive".into(),
            );
        }
        config_checks::tls_pair(self.tls_cert.as_deref(), self.tls_key.as_deref())?;
        hearth_service::auth::check_exposure(&self.listen, self.auth)
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        hearth_service::quota::check_quotas(&self.quota, &self.quotas)
            .map_err(ConfigError::Invalid)?;
        self.code_intake().check().map_err(ConfigError::Invalid)?;
        if let Some(a) = &self.atoll {
            a.validate()
                .map_err(|e| ConfigError::Invalid(format!("[atoll]: {e}")))?;
        }
        if let Some(a) = &self.autoscale {
            a.check()
                .map_err(|e| ConfigError::Invalid(format!("[autoscale]: {e}")))?;
        }
        self.balance_params
            .check()
            .map_err(|e| ConfigError::Invalid(e.to_string()))
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

    /// Where the cluster credential is.
    pub fn cluster_key_path(&self) -> PathBuf {
        self.cluster_key_file
            .clone()
            .unwrap_or_else(|| self.data_dir.join(hearth_service::auth::CLUSTER_KEY_FILE))
    }
}

impl ControllerConfig {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API, test-only
    fn policy_and_parameters_come_from_file_and_environment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "balance = \"k-ch-rlu\"\nworkers = [\"http://127.0.0.1:9001\"]\n\
             [balance_params]\nb = 1.5\npool_b_max = [6.0, 10.0]\n",
        )
        .unwrap();
        figment::Jail::expect_with(|jail| {
            jail.set_env("HEARTH_BALANCE_PARAMS__MAX_CHAIN_LEN", "2");
            let c = ControllerConfig::load(Some(&path)).map_err(|e| e.to_string())?;
            assert_eq!(c.balance, BalanceKind::KChRlu);
            assert_eq!(c.balance_params.b, 1.5);
            assert_eq!(c.balance_params.b_max, 6.0);
            assert_eq!(c.balance_params.max_chain_len, 2);
            assert_eq!(c.balance_params.pool_b_max, vec![6.0, 10.0]);
            assert_eq!(c.workers, vec!["http://127.0.0.1:9001".to_string()]);
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API, test-only
    fn per_namespace_limits_come_from_the_environment_and_are_checked() {
        figment::Jail::expect_with(|jail| {
            let c = ControllerConfig::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.async_limits().max_records_per_namespace, 25_000);
            jail.set_env("HEARTH_MAX_FUNCTIONS_PER_NAMESPACE", "3");
            jail.set_env("HEARTH_ASYNC_MAX_BYTES_PER_NAMESPACE", "1000");
            let c = ControllerConfig::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.code_intake().max_functions_per_namespace, 3);
            assert_eq!(c.async_limits().max_bytes_per_namespace, 1000);
            Ok(())
        });
        // A bad value, checked on the struct (in the environment it would race with the
        // tests that load without a jail).
        let c = ControllerConfig {
            async_max_records: 10,
            async_max_records_per_namespace: Some(11),
            ..ControllerConfig::default()
        };
        let err = c.check().unwrap_err().to_string();
        assert!(err.contains("async_max_records_per_namespace"), "{err}");
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API, test-only
    fn openwhisk_and_the_pool_step_are_named_in_the_config() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "balance = \"openwhisk\"\n").unwrap();
        figment::Jail::expect_with(|jail| {
            jail.set_env("HEARTH_BALANCE_PARAMS__POOL_B_MAX_STEP", "3.5");
            let c = ControllerConfig::load(Some(&path)).map_err(|e| e.to_string())?;
            assert_eq!(c.balance, BalanceKind::OpenWhisk);
            assert_eq!(c.balance_params.pool_b_max_step, 3.5);
            Ok(())
        });
    }

    #[test]
    fn atoll_is_off_by_default_and_configured_by_its_section() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "").unwrap();
        assert_eq!(ControllerConfig::load(Some(&path)).unwrap().atoll, None);
        std::fs::write(
            &path,
            "[atoll]\nladder = \"gdpi\"\ngroup_size = 2\nscale_out = \"instant\"\n\
             [atoll.alloc]\nvictim = \"lru\"\n[atoll.scaler]\nscale_out = 0.5\n",
        )
        .unwrap();
        let a = ControllerConfig::load(Some(&path)).unwrap().atoll.unwrap();
        assert_eq!(a.ladder, hearth_core::proactive::Ladder::Gdpi);
        assert_eq!(a.group_size, 2);
        assert_eq!(a.scale_out, hearth_core::proactive::ScaleOutMode::Instant);
        assert_eq!(a.alloc.victim, hearth_core::proactive::VictimPolicy::Lru);
        assert_eq!(a.scaler.scale_out, 0.5);
        assert_eq!(a.scaler.scale_in, 0.05, "unset keys keep their defaults");
        assert_eq!(a.interval_us, 100_000);
    }

    #[test]
    fn autoscale_is_off_by_default_and_configured_by_its_section() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "").unwrap();
        assert_eq!(ControllerConfig::load(Some(&path)).unwrap().autoscale, None);
        std::fs::write(
            &path,
            "[autoscale]\ncommand = [\"/usr/local/bin/add-worker\", \"--pool\", \"a\"]\n\
             interval_ms = 1000\n[autoscale.params]\nmax_workers = 8\ndead_band_ms = 60000\n",
        )
        .unwrap();
        let a = ControllerConfig::load(Some(&path))
            .unwrap()
            .autoscale
            .unwrap();
        assert_eq!(a.command, ["/usr/local/bin/add-worker", "--pool", "a"]);
        assert_eq!(a.interval_ms, 1000);
        assert_eq!(a.params.max_workers, 8);
        assert_eq!(a.params.dead_band_ms, 60_000);
        assert_eq!(
            a.params.overloaded_share, 0.5,
            "unset keys keep their defaults"
        );
        assert_eq!(a.action_timeout_ms, 30_000);
    }

    #[test]
    fn bad_policies_and_parameters_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        for (text, needle) in [
            ("balance = \"fastest\"\n", "fastest"),
            ("[balance_params]\nb_max = -1\n", "b_max"),
            ("[balance_params]\nbee = 1\n", "bee"),
            ("workers = [\"127.0.0.1:1\"]\n", "workers"),
            ("status_timeout_ms = 10\n", "status_timeout_ms"),
            ("[atoll]\nladder = \"fast\"\n", "fast"),
            ("[atoll]\ngroup_size = 0\n", "group_size"),
            ("[atoll]\ninterval_us = 5\n", "interval"),
            ("[atoll.estimator]\nquantile = 1.5\n", "quantile"),
            (
                "[atoll.scaler]\nscale_in = 0.5\nscale_out = 0.3\n",
                "scale_in",
            ),
            ("[atoll.scaler]\nscale_outt = 0.3\n", "scale_outt"),
            ("[atoll.alloc]\nvictim = \"random\"\n", "random"),
            ("[autoscale]\ninterval_ms = 1000\n", "command or a webhook"),
            (
                "[autoscale]\nwebhook = \"http://127.0.0.1:1/h\"\n[autoscale.params]\nscale_in_load = 0.9\n",
                "scale_in_load",
            ),
            ("[autoscale]\ncommandd = [\"x\"]\n", "commandd"),
        ] {
            std::fs::write(&path, text).unwrap();
            let err = ControllerConfig::load(Some(&path)).unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }
}
