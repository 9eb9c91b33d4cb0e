//! The function registry: specs in an embedded SQLite database, code in the data directory.
//!
//! Reads on the invocation path hit an in-memory map; the database is written on registration
//! and read once at start-up, so registered functions survive restarts.
//!
//! How code gets into the data directory, and what may not, is [`crate::intake`]'s.

use crate::error::ApiError;
use crate::intake::{
    check_module, copy_from_roots, create_dir, make_readable, set_mode, unpack_archive,
    write_files, Budget,
};
use dashmap::DashMap;
use hearth_api::ErrorCode;
use hearth_api::FunctionSpec;
use parking_lot::Mutex;
use rusqlite::{params, Connection};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a function's code comes from, in a registration request.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum CodeSource {
    /// A directory or `.py` file on the server's host, copied at registration; only under the
    /// operator's `code_path_roots` (refused when there are none, the default).
    Path(PathBuf),
    /// Base64 of a gzip-compressed tar archive of the code directory.
    Archive(String),
    /// Files by relative path, e.g. `{"main.py": "def main(args): ..."}`.
    Files(BTreeMap<String, String>),
}

/// Lambda's limit on unzipped code.
pub const DEFAULT_MAX_CODE_UNPACKED_BYTES: u64 = 250 * 1024 * 1024;
pub const DEFAULT_MAX_CODE_FILES: u64 = 10_000;
/// Functions one namespace may register.
pub const DEFAULT_MAX_FUNCTIONS_PER_NAMESPACE: u64 = 100;
/// Unpacked code one namespace may hold on disk by default: this many functions at the
/// per-function limit.
pub const NAMESPACE_CODE_FUNCTIONS: u64 = 4;
pub const DEFAULT_MAX_CODE_BYTES_PER_NAMESPACE: u64 =
    NAMESPACE_CODE_FUNCTIONS * DEFAULT_MAX_CODE_UNPACKED_BYTES;

/// What a registration may bring in as code, and how much (operator settings).
#[derive(Debug, Clone, PartialEq)]
pub struct CodeIntake {
    /// Host directories `code.path` may copy from; empty: `code.path` is refused.
    pub path_roots: Vec<PathBuf>,
    /// Most bytes of file content one function's code may unpack to.
    pub max_unpacked_bytes: u64,
    /// Most files and directories one function's code may hold.
    pub max_files: u64,
    /// Most functions one namespace may register.
    pub max_functions_per_namespace: u64,
    /// Most bytes of unpacked code one namespace's functions may hold together.
    pub max_code_bytes_per_namespace: u64,
}

impl Default for CodeIntake {
    fn default() -> Self {
        CodeIntake {
            path_roots: Vec::new(),
            max_unpacked_bytes: DEFAULT_MAX_CODE_UNPACKED_BYTES,
            max_files: DEFAULT_MAX_CODE_FILES,
            max_functions_per_namespace: DEFAULT_MAX_FUNCTIONS_PER_NAMESPACE,
            max_code_bytes_per_namespace: DEFAULT_MAX_CODE_BYTES_PER_NAMESPACE,
        }
    }
}

impl CodeIntake {
    /// Refuses settings that cannot work: relative roots (they would depend on the working
    /// directory) and zero limits.
    pub fn check(&self) -> Result<(), String> {
        if let Some(r) = self.path_roots.iter().find(|r| !r.is_absolute()) {
            return Err(format!(
                "code_path_roots must be absolute paths, got {:?}",
                r.display().to_string()
            ));
        }
        if self.max_unpacked_bytes == 0 || self.max_files == 0 {
            return Err("max_code_unpacked_bytes and max_code_files must be positive".into());
        }
        Ok(())
    }
}

/// A registered function with its code location.
#[derive(Debug, Clone)]
pub struct Registered {
    pub spec: Arc<FunctionSpec>,
    /// Host directory mounted read-only at /code in the sandbox; None for code-less sim functions.
    pub code_dir: Option<PathBuf>,
    /// Whether its dependency layer and bytecode are built: only a `Ready` function runs.
    pub state: FunctionState,
    /// On failure, the tail of the build's log (bounded, no host path in it).
    pub build_log: Option<String>,
}

/// Where a function's build stands (issue 32 §2). Stored with the function, so it survives a
/// restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FunctionState {
    /// Its layer or bytecode is being built: invocations are refused until it is done.
    Building,
    /// Runnable.
    Ready,
    /// The build failed; `build_log` says why. Registering again is the way out.
    Failed,
}

impl FunctionState {
    pub fn as_str(self) -> &'static str {
        match self {
            FunctionState::Building => "building",
            FunctionState::Ready => "ready",
            FunctionState::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "building" => Some(FunctionState::Building),
            "ready" => Some(FunctionState::Ready),
            "failed" => Some(FunctionState::Failed),
            _ => None,
        }
    }
}

/// Most bytes of build log kept for a failed function: its last lines.
pub const MAX_BUILD_LOG_BYTES: usize = 4096;

/// The last lines of `log` that fit in [`MAX_BUILD_LOG_BYTES`] (cut at a line start, or at a
/// character boundary when one line alone is longer).
pub fn log_tail(log: &str) -> String {
    if log.len() <= MAX_BUILD_LOG_BYTES {
        return log.to_string();
    }
    let mut start = log.len() - MAX_BUILD_LOG_BYTES;
    while !log.is_char_boundary(start) {
        start += 1;
    }
    let tail = &log[start..];
    match tail.find('\n') {
        Some(i) if i + 1 < tail.len() => tail[i + 1..].to_string(),
        _ => tail.to_string(),
    }
}

/// Checks a registration's staged code beyond the handler's module and says which dependency
/// layer it needs (the worker's `requirements.txt` rules); an error is the client's (400).
pub type CodeCheck = dyn Fn(&FunctionSpec, &Path) -> Result<Option<String>, String> + Send + Sync;

/// Which limit a code upload crossed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeLimit {
    UnpackedBytes,
    Files,
}

/// Why a registry operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The code is unusable or not allowed (400); the message names no host path.
    #[error("invalid code: {0}")]
    BadCode(String),
    /// The code is over a limit (413); reading stopped there.
    #[error("{}", too_large_message(*.limit, *.max))]
    TooLarge { limit: CodeLimit, max: u64 },
    /// The namespace has as many functions as it may (429).
    #[error(
        "namespace {namespace:?} already has {max} functions, its limit \
         (max_functions_per_namespace)"
    )]
    TooManyFunctions { namespace: String, max: u64 },
    /// The namespace's code would take more than its share of the disk (413).
    #[error(
        "the code would take namespace {namespace:?} over its limit of {max} bytes of \
         unpacked code (max_code_bytes_per_namespace; it holds {held} bytes)"
    )]
    NamespaceCode {
        namespace: String,
        max: u64,
        held: u64,
    },
    #[error("storage: {0}")]
    Storage(String),
}

fn too_large_message(limit: CodeLimit, max: u64) -> String {
    match limit {
        CodeLimit::UnpackedBytes => format!(
            "the code unpacks to more than {max} bytes, the server's limit \
             (max_code_unpacked_bytes); unpacking stopped there"
        ),
        CodeLimit::Files => format!(
            "the code holds more than {max} files and directories, the server's limit \
             (max_code_files); unpacking stopped there"
        ),
    }
}

impl CodeLimit {
    fn setting(self) -> &'static str {
        match self {
            CodeLimit::UnpackedBytes => "max_code_unpacked_bytes",
            CodeLimit::Files => "max_code_files",
        }
    }
}

impl From<rusqlite::Error> for RegistryError {
    fn from(e: rusqlite::Error) -> Self {
        RegistryError::Storage(e.to_string())
    }
}

impl From<std::io::Error> for RegistryError {
    fn from(e: std::io::Error) -> Self {
        RegistryError::Storage(e.to_string())
    }
}

/// The answer both services give for a registry error: 400, 413 `code_too_large`, or 500.
impl From<RegistryError> for ApiError {
    fn from(e: RegistryError) -> Self {
        let message = e.to_string();
        let namespace_limit = |status, namespace: String, setting: &str, max: u64| {
            ApiError::new(status, ErrorCode::NamespaceLimit, message.clone())
                .with("namespace", namespace.into())
                .with("setting", setting.into())
                .with("limit", max.into())
        };
        match e {
            RegistryError::BadCode(m) => ApiError::bad_request(m),
            RegistryError::TooLarge { limit, max } => ApiError::new(
                axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::CodeTooLarge,
                too_large_message(limit, max),
            )
            .with("setting", limit.setting().into())
            .with("limit", max.into()),
            RegistryError::TooManyFunctions { namespace, max } => namespace_limit(
                axum::http::StatusCode::TOO_MANY_REQUESTS,
                namespace,
                "max_functions_per_namespace",
                max,
            ),
            RegistryError::NamespaceCode { namespace, max, .. } => namespace_limit(
                axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                namespace,
                "max_code_bytes_per_namespace",
                max,
            ),
            RegistryError::Storage(m) => ApiError::internal(m),
        }
    }
}

/// The registry.
pub struct Registry {
    db: Mutex<Connection>,
    code_root: PathBuf,
    /// Where uploads unpack before they become a version (removed at start).
    incoming: PathBuf,
    /// The data directory, canonical: never a source of `code.path`.
    data_dir: PathBuf,
    intake: CodeIntake,
    functions: DashMap<String, Registered>,
    /// Bytes of unpacked code of each function with code, for the namespaces' disk share.
    code_bytes: DashMap<String, u64>,
    /// Code of deleted or replaced versions still on disk (a sandbox may still run it): its
    /// namespace and bytes, counted against the namespace until it is removed.
    retired: DashMap<PathBuf, (String, u64)>,
    /// Versions are decided and committed one registration at a time; unpacking is not.
    commit: Mutex<()>,
    /// The worker's extra check of staged code (its dependency layer); None: none, and every
    /// function is ready once registered.
    code_check: std::sync::OnceLock<Arc<CodeCheck>>,
}

/// Names of the database and its SQLite side files, all private to the service's user.
const DB_FILES: [&str; 3] = ["hearth.db", "hearth.db-wal", "hearth.db-shm"];

impl Registry {
    /// Opens (or creates) the registry under `data_dir` with the default code intake.
    pub fn open(data_dir: &Path) -> Result<Self, RegistryError> {
        Self::open_with(data_dir, CodeIntake::default())
    }

    /// Opens (or creates) the registry under `data_dir` and loads every function.
    pub fn open_with(data_dir: &Path, intake: CodeIntake) -> Result<Self, RegistryError> {
        let data_dir = std::fs::canonicalize(data_dir)?;
        let code_root = data_dir.join("functions");
        std::fs::create_dir_all(&code_root)?;
        set_mode(&code_root, 0o755)?;
        let incoming = code_root.join(".incoming");
        if incoming.exists() {
            std::fs::remove_dir_all(&incoming)?;
        }
        for root in &intake.path_roots {
            if std::fs::canonicalize(root).is_err() {
                tracing::warn!(root = %root.display(), "code_path_roots: this root does not exist");
            }
        }
        // Created private before SQLite opens it (umask-proof), and fixed if it was not.
        let db_path = data_dir.join(DB_FILES[0]);
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&db_path)?;
        let db = Connection::open(&db_path)?;
        db.execute_batch(
            "PRAGMA journal_mode=WAL;
             CREATE TABLE IF NOT EXISTS functions (
                 name TEXT PRIMARY KEY,
                 spec TEXT NOT NULL,
                 code_dir TEXT,
                 updated_at INTEGER NOT NULL
             );",
        )?;
        // Build state (issue 32), added to databases of older versions: they were all ready.
        let has_state = db
            .prepare("SELECT 1 FROM pragma_table_info('functions') WHERE name = 'state'")?
            .exists([])?;
        if !has_state {
            db.execute_batch(
                "ALTER TABLE functions ADD COLUMN state TEXT NOT NULL DEFAULT 'ready';
                 ALTER TABLE functions ADD COLUMN build_log TEXT;",
            )?;
        }
        for f in DB_FILES {
            match set_mode(&data_dir.join(f), 0o600) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
        }
        let functions = DashMap::new();
        let code_bytes = DashMap::new();
        {
            let mut stmt =
                db.prepare("SELECT name, spec, code_dir, state, build_log FROM functions")?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Option<String>>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, Option<String>>(4)?,
                ))
            })?;
            for row in rows {
                let (name, spec, code_dir, state, build_log) = row?;
                let state = FunctionState::parse(&state).unwrap_or(FunctionState::Failed);
                match serde_json::from_str::<FunctionSpec>(&spec) {
                    Ok(spec) => {
                        if let Some(dir) = &code_dir {
                            code_bytes.insert(name.clone(), dir_bytes(Path::new(dir)));
                        }
                        functions.insert(
                            name,
                            Registered {
                                spec: Arc::new(spec),
                                code_dir: code_dir.map(PathBuf::from),
                                state,
                                build_log,
                            },
                        );
                    }
                    Err(e) => {
                        tracing::warn!(function = %name, error = %e, "skipping unreadable function record")
                    }
                }
            }
        }
        let reg = Registry {
            db: Mutex::new(db),
            code_root,
            incoming,
            data_dir,
            intake,
            functions,
            code_bytes,
            retired: DashMap::new(),
            commit: Mutex::new(()),
            code_check: std::sync::OnceLock::new(),
        };
        reg.remove_unreferenced_code();
        Ok(reg)
    }

    /// The function, if registered (the invocation path's lookup).
    pub fn get(&self, name: &str) -> Option<Registered> {
        self.functions.get(name).map(|r| r.clone())
    }

    /// Makes every registration with code start `building` and asks `check` about its code
    /// (the worker's dependency layers); set once, before the first registration.
    pub fn set_code_check(&self, check: Arc<CodeCheck>) {
        let _ = self.code_check.set(check);
    }

    /// Ends the build of version `version` of `name`: `Ok` makes it ready, `Err(log)` failed
    /// with the log's tail. Returns false (and changes nothing) when the function is gone or
    /// has a newer version meanwhile: an old build never decides a newer version's state.
    pub fn finish_build(
        &self,
        name: &str,
        version: u64,
        result: Result<(), String>,
    ) -> Result<bool, RegistryError> {
        let _one_at_a_time = self.commit.lock();
        let Some(current) = self.get(name) else {
            return Ok(false);
        };
        if current.spec.version != version || current.state != FunctionState::Building {
            return Ok(false);
        }
        let (state, log) = match result {
            Ok(()) => (FunctionState::Ready, None),
            Err(log) => (FunctionState::Failed, Some(log_tail(&log))),
        };
        self.db.lock().execute(
            "UPDATE functions SET state = ?2, build_log = ?3 WHERE name = ?1",
            params![name, state.as_str(), log],
        )?;
        self.functions.insert(
            name.to_string(),
            Registered {
                state,
                build_log: log,
                ..current
            },
        );
        Ok(true)
    }

    /// Counts `bytes` more of code (the bytecode a build added) for version `version` of
    /// `name`, within its namespace's `max_code_bytes_per_namespace`. Returns false when the
    /// function is gone or has a newer version (nothing counted).
    pub fn add_code_bytes(
        &self,
        name: &str,
        version: u64,
        bytes: u64,
    ) -> Result<bool, RegistryError> {
        let _one_at_a_time = self.commit.lock();
        match self.get(name) {
            Some(r) if r.spec.version == version => {}
            _ => return Ok(false),
        }
        let (_, held) = self.namespace_held(name);
        let mine = self.code_bytes.get(name).map_or(0, |b| *b);
        let max = self.intake.max_code_bytes_per_namespace;
        if held.saturating_add(mine).saturating_add(bytes) > max {
            return Err(RegistryError::NamespaceCode {
                namespace: hearth_api::namespace::namespace_of(name).to_string(),
                max,
                held: held.saturating_add(mine),
            });
        }
        self.code_bytes.insert(name.to_string(), mine + bytes);
        Ok(true)
    }

    /// Every layer digest a registered function that is not `failed` refers to (what must
    /// stay on disk).
    pub fn layers_in_use(&self) -> std::collections::HashSet<String> {
        self.functions
            .iter()
            .filter(|r| r.state != FunctionState::Failed)
            .filter_map(|r| r.spec.layer.clone())
            .collect()
    }

    /// The function's `memory_mb`, if registered (without copying its record: the invocation
    /// path's admission reads it).
    pub fn memory_mb(&self, name: &str) -> Option<u64> {
        self.functions.get(name).map(|r| r.spec.memory_mb)
    }

    /// All functions, by name.
    pub fn list(&self) -> Vec<Registered> {
        let mut all: Vec<Registered> = self.functions.iter().map(|r| r.clone()).collect();
        all.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
        all
    }

    /// [`Self::put`] on a blocking thread: copying, unpacking and checking code read and write
    /// files, which must never hold up the async threads that answer `/healthz` and invocations.
    pub async fn put_blocking(
        self: &Arc<Self>,
        spec: FunctionSpec,
        code: Option<CodeSource>,
        require_code: bool,
    ) -> Result<(Registered, Option<Registered>), RegistryError> {
        let me = Arc::clone(self);
        tokio::task::spawn_blocking(move || me.put(spec, code, require_code))
            .await
            .map_err(|e| RegistryError::Storage(format!("the registration task failed: {e}")))?
    }

    /// Registers or updates a function. `code` may be omitted on update (the previous code is
    /// kept) or when `require_code` is false (sim backend). Returns the stored function and the
    /// previous version, if any. Blocking: see [`Self::put_blocking`].
    pub fn put(
        &self,
        spec: FunctionSpec,
        code: Option<CodeSource>,
        require_code: bool,
    ) -> Result<(Registered, Option<Registered>), RegistryError> {
        self.put_as(spec, code, require_code, None)
    }

    /// [`Self::put_blocking`] with the version decided elsewhere (the cluster's store).
    pub async fn put_blocking_as(
        self: &Arc<Self>,
        spec: FunctionSpec,
        code: Option<CodeSource>,
        require_code: bool,
        version: u64,
    ) -> Result<(Registered, Option<Registered>), RegistryError> {
        let me = Arc::clone(self);
        tokio::task::spawn_blocking(move || me.put_as(spec, code, require_code, Some(version)))
            .await
            .map_err(|e| RegistryError::Storage(format!("the registration task failed: {e}")))?
    }

    /// [`Self::put`] with the version given (None: the previous one + 1).
    pub fn put_as(
        &self,
        spec: FunctionSpec,
        code: Option<CodeSource>,
        require_code: bool,
        version: Option<u64>,
    ) -> Result<(Registered, Option<Registered>), RegistryError> {
        // Unpacked and checked in a directory of its own, concurrently with other uploads.
        let staged = match code {
            Some(src) => Some(self.stage(&spec, &src)?),
            None => None,
        };
        self.put_staged(spec, staged, require_code, version)
    }

    /// Unpacks and checks code without registering it yet (a controller stores it in the
    /// cluster first); blocking.
    pub fn stage_code(
        &self,
        spec: &FunctionSpec,
        src: &CodeSource,
    ) -> Result<Staged, RegistryError> {
        self.stage(spec, src)
    }

    /// Registers `spec` with code already staged (or the previous code), at `version` (None:
    /// the previous one + 1), within its namespace's limits; blocking.
    pub fn put_staged(
        &self,
        spec: FunctionSpec,
        staged: Option<Staged>,
        require_code: bool,
        version: Option<u64>,
    ) -> Result<(Registered, Option<Registered>), RegistryError> {
        self.commit_staged(spec, staged, require_code, version, true)
    }

    /// [`Self::put_staged`] for what the cluster's store already holds: the controller that
    /// stored it checked the namespace's limits, and refusing it here would leave this copy
    /// of the registry behind the cluster's.
    pub fn apply_staged(
        &self,
        spec: FunctionSpec,
        staged: Option<Staged>,
        version: u64,
    ) -> Result<(Registered, Option<Registered>), RegistryError> {
        self.commit_staged(spec, staged, false, Some(version), false)
    }

    /// What the namespace of function key `name` holds now, leaving out `name` itself: its
    /// other functions and their bytes of code.
    fn namespace_held(&self, name: &str) -> (u64, u64) {
        let ns = hearth_api::namespace::namespace_of(name);
        let mine = |k: &str| k != name && hearth_api::namespace::namespace_of(k) == ns;
        let functions = self.functions.iter().filter(|r| mine(r.key())).count() as u64;
        let bytes = self
            .code_bytes
            .iter()
            .filter(|r| mine(r.key()))
            .map(|r| *r.value())
            .chain(
                self.retired
                    .iter()
                    .filter(|r| r.value().0 == ns)
                    .map(|r| r.value().1),
            )
            .fold(0u64, u64::saturating_add);
        (functions, bytes)
    }

    /// Refuses a registration of `name` that would take its namespace over its limits: a new
    /// function beyond `max_functions_per_namespace`, or code of `new_code_bytes` (None: the
    /// code is kept) beyond `max_code_bytes_per_namespace` together with the namespace's other
    /// functions' code (an update replaces the function's old code, so it counts new minus old).
    pub fn check_namespace(
        &self,
        name: &str,
        new_code_bytes: Option<u64>,
    ) -> Result<(), RegistryError> {
        let namespace = || hearth_api::namespace::namespace_of(name).to_string();
        let (functions, held) = self.namespace_held(name);
        if !self.functions.contains_key(name)
            && functions >= self.intake.max_functions_per_namespace
        {
            return Err(RegistryError::TooManyFunctions {
                namespace: namespace(),
                max: self.intake.max_functions_per_namespace,
            });
        }
        let max = self.intake.max_code_bytes_per_namespace;
        if new_code_bytes.is_some_and(|b| held.saturating_add(b) > max) {
            return Err(RegistryError::NamespaceCode {
                namespace: namespace(),
                max,
                held,
            });
        }
        Ok(())
    }

    fn commit_staged(
        &self,
        spec: FunctionSpec,
        staged: Option<Staged>,
        require_code: bool,
        version: Option<u64>,
        enforce: bool,
    ) -> Result<(Registered, Option<Registered>), RegistryError> {
        let _one_at_a_time = self.commit.lock();
        if enforce {
            self.check_namespace(&spec.name, staged.as_ref().map(|s| s.bytes))?;
        }
        let new_bytes = staged.as_ref().map(|s| s.bytes);
        let staged_layer = staged.as_ref().map(|s| s.layer.clone());
        let mut spec = spec;
        let previous = self.get(&spec.name);
        spec.version =
            version.unwrap_or_else(|| previous.as_ref().map_or(1, |p| p.spec.version + 1));
        let code_dir = match staged {
            Some(staged) => Some(staged.commit(&self.code_root, &spec)?),
            None => previous.as_ref().and_then(|p| p.code_dir.clone()),
        };
        if require_code && code_dir.is_none() {
            return Err(RegistryError::BadCode(
                "`code` is required (an archive or files)".into(),
            ));
        }
        let kept_code = previous.as_ref().and_then(|p| p.code_dir.as_ref()) == code_dir.as_ref();
        if let (Some(dir), true) = (&code_dir, kept_code) {
            // The handler may have changed while the code stayed.
            check_module(&spec, dir)?;
        }
        // The layer comes with the code: new code says it, kept code keeps it.
        spec.layer = match &staged_layer {
            Some(layer) => layer.clone(),
            None => previous.as_ref().and_then(|p| p.spec.layer.clone()),
        };
        let builds = self.code_check.get().is_some() && code_dir.is_some();
        let state = match &previous {
            // Nothing to build again: the same code, already built, with the same layer.
            Some(p)
                if kept_code && p.state == FunctionState::Ready && p.spec.layer == spec.layer =>
            {
                FunctionState::Ready
            }
            _ if builds => FunctionState::Building,
            _ => FunctionState::Ready,
        };
        let json =
            serde_json::to_string(&spec).map_err(|e| RegistryError::Storage(e.to_string()))?;
        let code_str = code_dir.as_ref().map(|d| d.to_string_lossy().into_owned());
        let written = self.db.lock().execute(
            "INSERT INTO functions (name, spec, code_dir, updated_at, state, build_log)
             VALUES (?1, ?2, ?3, ?4, ?5, NULL)
             ON CONFLICT(name) DO UPDATE SET spec = ?2, code_dir = ?3, updated_at = ?4,
                 state = ?5, build_log = NULL",
            params![spec.name, json, code_str, unix_now(), state.as_str()],
        );
        if let Err(e) = written {
            if !kept_code {
                if let Some(dir) = &code_dir {
                    let _ = std::fs::remove_dir_all(dir);
                }
            }
            return Err(e.into());
        }
        let reg = Registered {
            spec: Arc::new(spec),
            code_dir,
            state,
            build_log: None,
        };
        if let (Some(old), false) = (
            previous.as_ref().and_then(|p| p.code_dir.clone()),
            kept_code,
        ) {
            self.retire_code(&reg.spec.name, old);
        }
        match (new_bytes, &reg.code_dir) {
            (Some(b), _) => {
                self.code_bytes.insert(reg.spec.name.clone(), b);
            }
            (None, None) => {
                self.code_bytes.remove(&reg.spec.name);
            }
            (None, Some(_)) => {}
        }
        self.functions.insert(reg.spec.name.clone(), reg.clone());
        Ok((reg, previous))
    }

    /// Unpacks `src` into a fresh staging directory and checks the handler's module is there.
    fn stage(&self, spec: &FunctionSpec, src: &CodeSource) -> Result<Staged, RegistryError> {
        std::fs::create_dir_all(&self.incoming)?;
        let dir = self
            .incoming
            .join(format!("{}-{:016x}", spec.name, rand::random::<u64>()));
        create_dir(&dir)?;
        let mut staged = Staged {
            dir: Some(dir),
            bytes: 0,
            layer: None,
        };
        let dir = staged.path().to_path_buf();
        let dir = dir.as_path();
        // Unpacking stops as soon as the namespace's share of the disk is used up, not only
        // the function's own limit: 250 KiB of gzip can expand to the per-function 250 MiB.
        let (_, held) = self.namespace_held(&spec.name);
        let mut budget = Budget::new(&self.intake).within_namespace(
            hearth_api::namespace::namespace_of(&spec.name),
            self.intake.max_code_bytes_per_namespace,
            held,
        );
        match src {
            CodeSource::Path(path) => {
                copy_from_roots(path, &self.intake, &self.data_dir, dir, &mut budget)?
            }
            CodeSource::Archive(b64) => unpack_archive(b64, dir, &mut budget)?,
            CodeSource::Files(files) => write_files(files, dir, &mut budget)?,
        }
        make_readable(dir)?;
        check_module(spec, dir)?;
        if let Some(check) = self.code_check.get() {
            staged.layer = check(spec, dir).map_err(RegistryError::BadCode)?;
        }
        staged.bytes = budget.used_bytes();
        Ok(staged)
    }

    /// Removes a function; returns it if it existed. Its code is removed by
    /// [`Self::remove_code_dir`] once no sandbox uses it.
    pub fn remove(&self, name: &str) -> Result<Option<Registered>, RegistryError> {
        self.db
            .lock()
            .execute("DELETE FROM functions WHERE name = ?1", params![name])?;
        let removed = self.functions.remove(name).map(|(_, r)| r);
        if let Some(dir) = removed.as_ref().and_then(|r| r.code_dir.clone()) {
            self.retire_code(name, dir);
        }
        self.code_bytes.remove(name);
        Ok(removed)
    }

    /// Counts `name`'s old code directory against its namespace until
    /// [`Self::remove_code_dir`] removes it.
    fn retire_code(&self, name: &str, dir: PathBuf) {
        let bytes = self.code_bytes.get(name).map_or(0, |b| *b);
        let ns = hearth_api::namespace::namespace_of(name).to_string();
        self.retired.insert(dir, (ns, bytes));
    }

    /// Deletes a code directory that no registered function refers to. The files are removed
    /// on a blocking thread when called from async code (a function's code can be large).
    pub fn remove_code_dir(&self, dir: &Path) {
        let in_use = self
            .functions
            .iter()
            .any(|r| r.code_dir.as_deref() == Some(dir));
        if in_use || !dir.starts_with(&self.code_root) {
            return;
        }
        self.retired.remove(dir);
        let dir = dir.to_path_buf();
        let remove = move || {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(dir = %dir.display(), error = %e, "could not remove old code");
                }
            }
            if let Some(parent) = dir.parent() {
                let _ = std::fs::remove_dir(parent); // only succeeds when empty
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn_blocking(remove);
            }
            Err(_) => remove(),
        }
    }

    /// Start-up: code directories of deleted or replaced versions are garbage, and so are the
    /// function directories they leave empty.
    fn remove_unreferenced_code(&self) {
        let Ok(entries) = std::fs::read_dir(&self.code_root) else {
            return;
        };
        for fn_dir in entries.flatten() {
            let Ok(versions) = std::fs::read_dir(fn_dir.path()) else {
                continue;
            };
            for v in versions.flatten() {
                self.remove_code_dir(&v.path());
            }
            let _ = std::fs::remove_dir(fn_dir.path()); // only succeeds when empty
        }
    }
}

/// Code unpacked in the staging area; removed unless committed.
pub struct Staged {
    dir: Option<PathBuf>,
    /// Bytes of file content unpacked.
    bytes: u64,
    /// The dependency layer the code needs ([`CodeCheck`]).
    layer: Option<String>,
}

impl Staged {
    /// Bytes of file content the staged code holds.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Where the staged code is (to pack it, for example).
    pub fn path(&self) -> &Path {
        self.dir.as_deref().unwrap_or(Path::new(""))
    }

    /// Moves the code to its version's directory, `v{version}`. A directory of that name left
    /// by a deleted function (maybe still mounted by a sandbox, or being removed) is never
    /// reused: the new one gets a suffix.
    fn commit(mut self, code_root: &Path, spec: &FunctionSpec) -> Result<PathBuf, RegistryError> {
        let fn_dir = code_root.join(&spec.name);
        let mut target = fn_dir.join(format!("v{}", spec.version));
        if target.exists() {
            target = fn_dir.join(format!("v{}-{:08x}", spec.version, rand::random::<u32>()));
        }
        // The function's directory may be removed meanwhile with its last old version.
        let mut tries = 0;
        loop {
            std::fs::create_dir_all(&fn_dir)?;
            set_mode(&fn_dir, 0o755)?;
            match std::fs::rename(self.path(), &target) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < 3 => tries += 1,
                Err(e) => return Err(e.into()),
            }
        }
        self.dir = None;
        Ok(target)
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Bytes of regular files under `dir`, symlinks not followed (code unpacked by intake has none).
fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => {
                    total = total.saturating_add(e.metadata().map_or(0, |m| m.len()));
                }
                _ => {}
            }
        }
    }
    total
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn files(src: &str) -> CodeSource {
        CodeSource::Files(BTreeMap::from([("main.py".to_string(), src.to_string())]))
    }

    #[test]
    fn functions_survive_reopening_and_versions_increase() {
        let dir = tempfile::tempdir().unwrap();
        let reg = Registry::open(dir.path()).unwrap();
        let (a, prev) = reg
            .put(
                FunctionSpec::new("f"),
                Some(files("def main(a): return a")),
                true,
            )
            .unwrap();
        assert!(prev.is_none());
        assert_eq!(a.spec.version, 1);
        let mut s2 = FunctionSpec::new("f");
        s2.memory_mb = 256;
        let (b, prev) = reg.put(s2, None, true).unwrap();
        assert_eq!(b.spec.version, 2);
        assert_eq!(prev.unwrap().spec.version, 1);
        assert_eq!(
            b.code_dir, a.code_dir,
            "code is kept when an update omits it"
        );
        drop(reg);
        let reg = Registry::open(dir.path()).unwrap();
        let got = reg.get("f").unwrap();
        assert_eq!(got.spec.memory_mb, 256);
        assert!(got.code_dir.unwrap().join("main.py").is_file());
        assert!(reg.remove("f").unwrap().is_some());
        drop(reg);
        assert!(Registry::open(dir.path()).unwrap().get("f").is_none());
    }

    #[test]
    fn code_problems_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let reg = Registry::open(dir.path()).unwrap();
        let err = reg.put(FunctionSpec::new("f"), None, true).unwrap_err();
        assert!(err.to_string().contains("`code` is required"), "{err}");
        let other = CodeSource::Files(BTreeMap::from([("x.py".into(), String::new())]));
        let err = reg
            .put(FunctionSpec::new("f"), Some(other), true)
            .unwrap_err();
        assert!(err.to_string().contains("main.py"), "{err}");
        assert!(err.to_string().contains("x.py"), "{err}");
        let escape = CodeSource::Files(BTreeMap::from([("../x.py".into(), String::new())]));
        assert!(reg.put(FunctionSpec::new("f"), Some(escape), true).is_err());
        let err = reg
            .put(
                FunctionSpec::new("f"),
                Some(CodeSource::Archive("!!".into())),
                true,
            )
            .unwrap_err();
        assert!(err.to_string().contains("base64"), "{err}");
        assert!(
            reg.get("f").is_none(),
            "failed registrations leave nothing behind"
        );
    }

    #[test]
    fn archives_unpack_with_readable_permissions() {
        let dir = tempfile::tempdir().unwrap();
        let reg = Registry::open(dir.path()).unwrap();
        let mut tarball = Vec::new();
        {
            let gz = flate2::write::GzEncoder::new(&mut tarball, flate2::Compression::fast());
            let mut b = tar::Builder::new(gz);
            let data = b"def main(args):\n    return args\n";
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o600);
            h.set_cksum();
            b.append_data(&mut h, "pkg/mod.py", &data[..]).unwrap();
            b.into_inner().unwrap().finish().unwrap();
        }
        let b64 = base64::engine::general_purpose::STANDARD.encode(&tarball);
        let mut spec = FunctionSpec::new("g");
        spec.handler = "pkg.mod.main".into();
        let (r, _) = reg.put(spec, Some(CodeSource::Archive(b64)), true).unwrap();
        let file = r.code_dir.unwrap().join("pkg/mod.py");
        let mode = std::fs::metadata(file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
    }

    fn targz(build: impl FnOnce(&mut tar::Builder<flate2::write::GzEncoder<Vec<u8>>>)) -> String {
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let mut b = tar::Builder::new(gz);
        build(&mut b);
        let bytes = b.into_inner().unwrap().finish().unwrap();
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    fn with_roots(data: &Path, roots: Vec<PathBuf>) -> Registry {
        let intake = CodeIntake {
            path_roots: roots,
            ..CodeIntake::default()
        };
        Registry::open_with(data, intake).unwrap()
    }

    #[test]
    fn code_path_is_off_without_roots_and_confined_with_them() {
        let tmp = tempfile::tempdir().unwrap();
        set_mode(tmp.path(), 0o755).unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir_all(root.join("f")).unwrap();
        std::fs::write(root.join("f/main.py"), "def main(a):\n    return a\n").unwrap();
        std::fs::write(root.join("f/key.pem"), "PRIVATE").unwrap();
        set_mode(&root.join("f/key.pem"), 0o640).unwrap();
        let data = tmp.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        let path = |p: &Path| Some(CodeSource::Path(p.to_path_buf()));

        let reg = Registry::open(&data).unwrap();
        let err = reg
            .put(FunctionSpec::new("f"), path(&root.join("f")), true)
            .unwrap_err();
        assert!(err.to_string().contains("code_path_roots"), "{err}");
        drop(reg);

        let reg = with_roots(&data, vec![tmp.path().to_path_buf()]);
        let err = reg
            .put(FunctionSpec::new("f"), path(&root.join("f")), true)
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("key.pem") && !msg.contains("PRIVATE"), "{msg}");
        assert!(!msg.contains(&tmp.path().display().to_string()), "{msg}");
        set_mode(&root.join("f/key.pem"), 0o644).unwrap();
        let (r, _) = reg
            .put(FunctionSpec::new("f"), path(&root.join("f")), true)
            .unwrap();
        assert!(r.code_dir.unwrap().join("key.pem").is_file());
        let err = reg
            .put(FunctionSpec::new("g"), path(&data), true)
            .unwrap_err();
        assert!(err.to_string().contains("data directory"), "{err}");
        let err = reg
            .put(
                FunctionSpec::new("g"),
                path(Path::new("relative/dir")),
                true,
            )
            .unwrap_err();
        assert!(err.to_string().contains("absolute"), "{err}");
    }

    #[test]
    fn build_state_is_kept_per_version_and_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let reg = Registry::open(dir.path()).unwrap();
        // Without a code check (sim workers, controllers) everything is ready at once.
        let (r, _) = reg
            .put(FunctionSpec::new("plain"), Some(files("main")), true)
            .unwrap();
        assert_eq!(r.state, FunctionState::Ready);
        reg.set_code_check(Arc::new(
            |_spec: &FunctionSpec, dir: &Path| match std::fs::read_to_string(
                dir.join("requirements.txt"),
            ) {
                Ok(t) if t.contains("bad") => Err("requirements.txt line 1: refused".into()),
                Ok(t) => Ok(Some(format!("layer-of-{}", t.trim()))),
                Err(_) => Ok(None),
            },
        ));
        let with_reqs = |reqs: &str| {
            CodeSource::Files(BTreeMap::from([
                (
                    "main.py".to_string(),
                    "def main(a):\n    return a\n".to_string(),
                ),
                ("requirements.txt".to_string(), reqs.to_string()),
            ]))
        };
        let err = reg
            .put(FunctionSpec::new("f"), Some(with_reqs("bad")), true)
            .unwrap_err();
        assert!(matches!(err, RegistryError::BadCode(_)), "{err}");
        assert!(
            reg.get("f").is_none(),
            "a refused registration registers nothing"
        );
        let (v1, _) = reg
            .put(FunctionSpec::new("f"), Some(with_reqs("a")), true)
            .unwrap();
        assert_eq!(v1.state, FunctionState::Building);
        assert_eq!(v1.spec.layer.as_deref(), Some("layer-of-a"));
        let (v2, _) = reg
            .put(FunctionSpec::new("f"), Some(with_reqs("b")), true)
            .unwrap();
        assert_eq!(v2.spec.layer.as_deref(), Some("layer-of-b"));
        // The old version's build ends last: it decides nothing.
        assert!(!reg.finish_build("f", v1.spec.version, Ok(())).unwrap());
        assert_eq!(reg.get("f").unwrap().state, FunctionState::Building);
        let long = format!("/secret/host/path\n{}\nlast line", "x".repeat(10_000));
        assert!(reg.finish_build("f", v2.spec.version, Err(long)).unwrap());
        let got = reg.get("f").unwrap();
        assert_eq!(got.state, FunctionState::Failed);
        let log = got.build_log.unwrap();
        assert!(
            log.len() <= MAX_BUILD_LOG_BYTES && log.ends_with("last line"),
            "{}",
            log.len()
        );
        assert!(!log.contains("/secret"));
        assert!(
            !reg.finish_build("f", v2.spec.version, Ok(())).unwrap(),
            "final is final"
        );
        // Re-registering the same code builds again; an update that keeps built code does not.
        let (v3, _) = reg.put(FunctionSpec::new("f"), None, true).unwrap();
        assert_eq!(v3.state, FunctionState::Building);
        assert!(reg.finish_build("f", v3.spec.version, Ok(())).unwrap());
        let mut spec = FunctionSpec::new("f");
        spec.memory_mb = 256;
        let (v4, _) = reg.put(spec, None, true).unwrap();
        assert_eq!(v4.state, FunctionState::Ready);
        assert_eq!(v4.spec.layer.as_deref(), Some("layer-of-b"));
        let (_, _) = reg
            .put(FunctionSpec::new("g"), Some(with_reqs("b")), true)
            .unwrap();
        assert_eq!(
            reg.layers_in_use(),
            std::collections::HashSet::from(["layer-of-b".to_string()])
        );
        drop(reg);
        let reg = Registry::open(dir.path()).unwrap();
        assert_eq!(reg.get("f").unwrap().state, FunctionState::Ready);
        assert_eq!(reg.get("g").unwrap().state, FunctionState::Building);
        assert_eq!(reg.get("plain").unwrap().state, FunctionState::Ready);
    }

    #[test]
    fn an_oversized_header_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let reg = Registry::open(dir.path()).unwrap();
        // A PAX header the tar reader would otherwise load whole into memory.
        let archive = targz(|b| {
            let mut h = tar::Header::new_ustar();
            h.set_entry_type(tar::EntryType::XHeader);
            h.set_size(64 << 20);
            h.set_cksum();
            b.append(&h, std::io::repeat(b'a').take(64 << 20)).unwrap();
        });
        let err = reg
            .put(
                FunctionSpec::new("f"),
                Some(CodeSource::Archive(archive)),
                false,
            )
            .unwrap_err();
        assert!(err.to_string().contains("headers"), "{err}");
    }

    #[test]
    fn limits_count_files_and_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let intake = CodeIntake {
            max_files: 3,
            max_unpacked_bytes: 100,
            ..CodeIntake::default()
        };
        let reg = Registry::open_with(dir.path(), intake).unwrap();
        let files = |n: usize, size: usize| {
            let mut m: BTreeMap<String, String> = (0..n)
                .map(|i| (format!("f{i}.py"), "x".repeat(size)))
                .collect();
            m.insert("main.py".into(), "def main(a): return a\n".into());
            Some(CodeSource::Files(m))
        };
        assert!(reg.put(FunctionSpec::new("ok"), files(2, 10), true).is_ok());
        let err = reg
            .put(FunctionSpec::new("n"), files(3, 1), true)
            .unwrap_err();
        assert!(matches!(
            err,
            RegistryError::TooLarge {
                limit: CodeLimit::Files,
                max: 3
            }
        ));
        let err = reg
            .put(FunctionSpec::new("b"), files(1, 90), true)
            .unwrap_err();
        assert!(matches!(
            err,
            RegistryError::TooLarge {
                limit: CodeLimit::UnpackedBytes,
                max: 100
            }
        ));
        let staged: Vec<_> = std::fs::read_dir(dir.path().join("functions/.incoming"))
            .unwrap()
            .collect();
        assert!(staged.is_empty(), "refused uploads leave nothing behind");
    }

    /// 2.5 MB of uploads became 1.9 GB on disk: gzip of zeros expands about 1,000 times, and
    /// each function could unpack to the per-function 250 MiB. A namespace's code now stops
    /// unpacking at its share, across its functions and across restarts.
    #[test]
    fn a_namespaces_code_stops_at_its_share_of_the_disk() {
        let dir = tempfile::tempdir().unwrap();
        let intake = CodeIntake {
            max_code_bytes_per_namespace: 3 << 20,
            ..CodeIntake::default()
        };
        let bomb = |mb: usize| {
            targz(|b| {
                let zeros = vec![0u8; mb << 20];
                let mut h = tar::Header::new_gnu();
                h.set_size(zeros.len() as u64);
                h.set_mode(0o644);
                h.set_cksum();
                b.append_data(&mut h, "blob.bin", &zeros[..]).unwrap();
                let main = b"def main(a):\n    return a\n";
                let mut h = tar::Header::new_gnu();
                h.set_size(main.len() as u64);
                h.set_mode(0o644);
                h.set_cksum();
                b.append_data(&mut h, "main.py", &main[..]).unwrap();
            })
        };
        let upload = bomb(2);
        assert!(upload.len() < 64 << 10, "{} bytes", upload.len());
        {
            let reg = Registry::open_with(dir.path(), intake.clone()).unwrap();
            reg.put(
                FunctionSpec::new("t.one"),
                Some(CodeSource::Archive(upload.clone())),
                true,
            )
            .unwrap();
        }
        // After a restart the first function's 2 MiB still count.
        let reg = Registry::open_with(dir.path(), intake).unwrap();
        let err = reg
            .put(
                FunctionSpec::new("t.two"),
                Some(CodeSource::Archive(upload.clone())),
                true,
            )
            .unwrap_err();
        match &err {
            RegistryError::NamespaceCode {
                namespace,
                max,
                held,
            } => {
                assert_eq!((namespace.as_str(), *max), ("t", 3 << 20));
                assert!(*held >= 2 << 20, "{held}");
            }
            other => panic!("{other:?}"),
        }
        let api = ApiError::from(err);
        assert_eq!(api.status, axum::http::StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(api.code, ErrorCode::NamespaceLimit);
        // Nothing of the refused upload stays on disk.
        let staged: Vec<_> = std::fs::read_dir(dir.path().join("functions/.incoming"))
            .unwrap()
            .collect();
        assert!(staged.is_empty());
        // Another namespace has a share of its own; an update of the first counts new - old.
        reg.put(
            FunctionSpec::new("u.one"),
            Some(CodeSource::Archive(upload.clone())),
            true,
        )
        .unwrap();
        reg.put(
            FunctionSpec::new("t.one"),
            Some(CodeSource::Archive(bomb(3))),
            true,
        )
        .unwrap_err();
        // Old code still on disk (a sandbox runs it) counts until it is removed.
        let dir = tempfile::tempdir().unwrap();
        let reg = Registry::open_with(
            dir.path(),
            CodeIntake {
                max_code_bytes_per_namespace: 5 << 20,
                ..CodeIntake::default()
            },
        )
        .unwrap();
        let put = |name: &str| {
            reg.put(
                FunctionSpec::new(name),
                Some(CodeSource::Archive(upload.clone())),
                true,
            )
        };
        put("t.one").unwrap();
        let (_, old) = put("t.one").unwrap();
        let old = old.unwrap().code_dir.unwrap();
        assert!(matches!(
            put("t.two").unwrap_err(),
            RegistryError::NamespaceCode { .. }
        ));
        reg.remove_code_dir(&old);
        put("t.two").unwrap();
        reg.put(
            FunctionSpec::new("t.one"),
            Some(CodeSource::Archive(upload)),
            true,
        )
        .unwrap();
    }

    #[test]
    fn a_namespace_has_at_most_its_number_of_functions() {
        let dir = tempfile::tempdir().unwrap();
        let intake = CodeIntake {
            max_functions_per_namespace: 2,
            ..CodeIntake::default()
        };
        let reg = Registry::open_with(dir.path(), intake).unwrap();
        for n in ["t.a", "t.b", "u.a"] {
            reg.put(FunctionSpec::new(n), None, false).unwrap();
        }
        let err = reg.put(FunctionSpec::new("t.c"), None, false).unwrap_err();
        assert!(
            matches!(&err, RegistryError::TooManyFunctions { namespace, max: 2 } if namespace == "t"),
            "{err:?}"
        );
        assert_eq!(ApiError::from(err).status.as_u16(), 429);
        // Updates are not new functions; what the cluster stored is applied as it is.
        reg.put(FunctionSpec::new("t.a"), None, false).unwrap();
        reg.apply_staged(FunctionSpec::new("t.c"), None, 7).unwrap();
        reg.remove("t.a").unwrap();
        reg.remove("t.c").unwrap();
        reg.put(FunctionSpec::new("t.d"), None, false).unwrap();
    }

    /// On a single-threaded runtime, a task spawned beside a registration runs before the
    /// registration completes: the unpacking does not hold the runtime's only thread.
    #[tokio::test(flavor = "current_thread")]
    async fn registration_leaves_the_async_thread_free() {
        let dir = tempfile::tempdir().unwrap();
        let reg = Arc::new(Registry::open(dir.path()).unwrap());
        let files: BTreeMap<String, String> = (0..2000)
            .map(|i| (format!("m{i}.py"), "x = 1\n".repeat(100)))
            .chain([("main.py".to_string(), "def main(a): return a\n".to_string())])
            .collect();
        let other_ran = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&other_ran);
        let other = tokio::spawn(async move { flag.store(true, Ordering::SeqCst) });
        let (put, seen) = {
            let r = reg
                .put_blocking(FunctionSpec::new("f"), Some(CodeSource::Files(files)), true)
                .await;
            (r, other_ran.load(Ordering::SeqCst))
        };
        put.unwrap();
        assert!(seen, "the other task ran while the code was being written");
        other.await.unwrap();
    }
}
