//! Authentication: API keys scoped to a namespace with a role, the credentials of the cluster,
//! and the middleware that turns a request's `Authorization: Bearer …` into a [`Principal`] the
//! routes check.
//!
//! The cluster has three secrets, each for one power (docs/security.md, "The cluster"): the
//! controllers' master key (`hc_…`, never sent anywhere); a worker credential (`hw_…`, issued by
//! the operator for one worker id, stored hashed like an API key), with which a worker may join,
//! push its own status and leave, and nothing else; and the controller's token for that worker
//! (`hx_…`, derived from the master key and the credential's id, so nothing is stored), which
//! only that worker accepts, and only for what a controller does to a worker.
//!
//! A key is `hk_<id>_<secret>`, 256 random bits of secret. Only its SHA-256 is stored (in
//! `<data-dir>/keys.db`, 0600): a fast hash is enough for a secret that cannot be guessed, and it
//! keeps checking a key on the invocation path well under a microsecond (a hash and a map
//! lookup; measured in `bench/RESULTS.md`). The cluster credential is a file both sides hold.

use crate::error::ApiError;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use dashmap::DashMap;
use hearth_api::namespace::{self, DEFAULT_NAMESPACE};
use hearth_api::ErrorCode;
use parking_lot::Mutex;
use rusqlite::{params, Connection};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The file a first start writes the operator's key to, in the data directory.
pub const ADMIN_KEY_FILE: &str = "admin.key";
/// The controller's cluster credential, in its data directory unless configured elsewhere.
pub const CLUSTER_KEY_FILE: &str = "cluster.key";
/// The key store, in the data directory.
const KEYS_DB: &str = "keys.db";
const KEY_PREFIX: &str = "hk_";
const CLUSTER_PREFIX: &str = "hc_";
/// A worker's own credential.
const WORKER_PREFIX: &str = "hw_";
/// The controller's token for one worker.
const CONTROLLER_PREFIX: &str = "hx_";
/// The role a worker credential's record carries in the key store and the cluster's store.
const WORKER_ROLE: &str = "worker";
/// Keys one namespace may hold unless configured otherwise (the operator's `*` keys count apart).
pub const DEFAULT_MAX_KEYS_PER_NAMESPACE: usize = 100;
/// Longest worker id a credential may be bound to.
pub const MAX_WORKER_ID_LEN: usize = 128;
/// Hex characters of a key's public id.
const ID_LEN: usize = 16;
/// Shortest cluster credential accepted from a file (a generated one is 46 characters).
const MIN_CLUSTER_KEY_LEN: usize = 32;

/// What a key may do inside its namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Register, update, delete, prewarm and read functions; invoke; read every result; manage
    /// the namespace's keys.
    Admin,
    /// Invoke, and read the results of its own async invocations.
    Invoke,
    /// Read `/metrics` (of its namespace, or all of them for `*`) and nothing else: what
    /// Prometheus is given.
    Metrics,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Invoke => "invoke",
            Role::Metrics => "metrics",
        }
    }

    fn parse(s: &str) -> Option<Role> {
        match s {
            "admin" => Some(Role::Admin),
            "invoke" => Some(Role::Invoke),
            "metrics" => Some(Role::Metrics),
            _ => None,
        }
    }
}

/// Whether `id` may name a worker a credential is bound to: 1-128 characters of
/// `[A-Za-z0-9._:-]` (a host:port, a name).
pub fn valid_worker_id(id: &str) -> bool {
    (1..=MAX_WORKER_ID_LEN).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
}

/// A worker credential as the store and `GET /v1/cluster/credentials` show it (never its secret).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerCredential {
    pub id: String,
    /// The one worker id it may join as.
    pub worker: String,
    pub description: String,
    pub created_unix_s: i64,
}

impl WorkerCredential {
    /// The wire form.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "worker": self.worker,
            "description": self.description,
            "created_unix_s": self.created_unix_s,
        })
    }
}

/// The namespaces a key acts in: one, or all (`"*"`, the operator's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    All,
    Namespace(String),
}

impl Scope {
    /// `"*"` or a valid namespace name.
    pub fn parse(s: &str) -> Result<Scope, AuthError> {
        if s == "*" {
            Ok(Scope::All)
        } else if namespace::valid_namespace(s) {
            Ok(Scope::Namespace(s.to_string()))
        } else {
            Err(AuthError::BadRequest(format!(
                "namespace must be \"*\" or 1-{} characters of [a-z0-9-] starting with a letter or digit",
                namespace::MAX_NAMESPACE_LEN
            )))
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Scope::All => "*",
            Scope::Namespace(ns) => ns,
        }
    }

    fn covers(&self, ns: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Namespace(own) => own == ns,
        }
    }
}

/// A key as the store and `GET /v1/keys` show it (never its secret).
#[derive(Debug, Clone, PartialEq)]
pub struct KeyInfo {
    pub id: String,
    pub scope: Scope,
    pub role: Role,
    pub description: String,
    pub created_unix_s: i64,
}

impl KeyInfo {
    /// The wire form.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "namespace": self.scope.as_str(),
            "role": self.role,
            "description": self.description,
            "created_unix_s": self.created_unix_s,
        })
    }
}

/// Who sent a request.
#[derive(Debug, Clone)]
pub enum Principal {
    /// Authentication is off (allowed on loopback listeners only): everything is allowed.
    Open,
    /// The controller calling this worker with this worker's controller token (`hx_…`).
    Controller,
    /// A worker at a controller, with its own credential (`hw_…`): it may join, push status for
    /// and leave as `worker` only.
    Member { worker: String, credential: String },
    /// An API key.
    Key(Arc<KeyInfo>),
}

/// What a request wants to do with a function, for [`Principal::authorized_key`].
#[derive(Debug, Clone, Copy)]
pub enum Access {
    Manage,
    Invoke,
}

/// What a request wants to do, for [`Principal::require`].
#[derive(Debug, Clone, Copy)]
pub enum Action<'a> {
    /// Register, update, delete, prewarm or read functions of a namespace.
    Manage(&'a str),
    /// Invoke functions of a namespace.
    Invoke(&'a str),
    /// See the whole platform: status, every namespace's functions, the cluster's workers.
    Operate,
    /// Read `/metrics` of a namespace (`"*"`: of every namespace).
    Metrics(&'a str),
    /// Create, list and revoke API keys of a namespace (`"*"`: the operator's keys, and keys of
    /// every namespace).
    Keys(&'a str),
    /// Create, list and revoke worker credentials.
    Credentials,
    /// Join the cluster as this worker id, push its status, make it leave.
    Report(&'a str),
    /// What only the controller sends a worker: proactive commands, the cluster's own headers
    /// (`Hearth-Invocation-Id`, `Hearth-Function-Version`, `Hearth-Elapsed-Us`).
    Command,
}

impl Action<'_> {
    /// The action's name in docs/security.md's table.
    pub fn label(&self) -> &'static str {
        match self {
            Action::Manage(_) => "manage functions",
            Action::Invoke(_) => "invoke",
            Action::Operate => "operate",
            Action::Metrics(_) => "metrics",
            Action::Keys(_) => "keys",
            Action::Credentials => "credentials",
            Action::Report(_) => "report",
            Action::Command => "command",
        }
    }
}

impl Principal {
    /// The namespace function routes act in.
    pub fn namespace(&self) -> &str {
        match self {
            Principal::Key(k) => match &k.scope {
                Scope::Namespace(ns) => ns,
                Scope::All => DEFAULT_NAMESPACE,
            },
            _ => DEFAULT_NAMESPACE,
        }
    }

    /// Whether this principal sees every namespace (the operator, the controller calling a
    /// worker, or no authentication).
    pub fn sees_all(&self) -> bool {
        match self {
            Principal::Key(k) => k.scope == Scope::All && k.role == Role::Admin,
            Principal::Member { .. } => false,
            Principal::Open | Principal::Controller => true,
        }
    }

    /// Whether this is the cluster itself (the controller calling a worker) or no
    /// authentication: who may send the cluster's own headers.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Principal::Open | Principal::Controller)
    }

    /// The function key a route's `{name}` stands for: a plain name lives in this principal's
    /// namespace; a qualified `namespace.name` may be used only by principals that see every
    /// namespace (the operator, and the controller forwarding on a tenant's behalf).
    pub fn function_key(&self, name: &str) -> Result<String, ApiError> {
        if let Some((ns, plain)) = name.split_once('.') {
            if !self.sees_all() {
                return Err(ApiError::bad_request(format!(
                    "function name must be 1-64 characters of [A-Za-z0-9_-]: {name:?}"
                )));
            }
            if !namespace::valid_namespace(ns) || !hearth_api::function::valid_name(plain) {
                return Err(ApiError::bad_request(format!(
                    "not a function name or namespace.name: {name:?}"
                )));
            }
            return Ok(namespace::function_key(ns, plain));
        }
        Ok(namespace::function_key(self.namespace(), name))
    }

    /// The function key `{name}` stands for, once this principal is allowed `access` to its
    /// namespace.
    pub fn authorized_key(&self, name: &str, access: Access) -> Result<String, ApiError> {
        let key = self.function_key(name)?;
        let ns = namespace::namespace_of(&key);
        self.require(match access {
            Access::Manage => Action::Manage(ns),
            Access::Invoke => Action::Invoke(ns),
        })?;
        Ok(key)
    }

    /// 403 unless this principal may do `action`.
    pub fn require(&self, action: Action<'_>) -> Result<(), ApiError> {
        let allowed = match self {
            Principal::Open => true,
            // What a controller does to a worker, and nothing that manages who may do what.
            Principal::Controller => matches!(
                action,
                Action::Manage(_) | Action::Invoke(_) | Action::Operate | Action::Command
            ),
            Principal::Member { worker, .. } => {
                matches!(action, Action::Report(id) if id == worker)
            }
            Principal::Key(k) => match action {
                Action::Manage(ns) => k.role == Role::Admin && k.scope.covers(ns),
                Action::Invoke(ns) => k.role != Role::Metrics && k.scope.covers(ns),
                Action::Operate => k.role == Role::Admin && k.scope == Scope::All,
                Action::Metrics(ns) => {
                    matches!(k.role, Role::Admin | Role::Metrics) && k.scope.covers(ns)
                }
                Action::Keys(ns) => k.role == Role::Admin && k.scope.covers(ns),
                Action::Credentials => k.role == Role::Admin && k.scope == Scope::All,
                Action::Report(_) | Action::Command => false,
            },
        };
        if allowed {
            Ok(())
        } else {
            Err(forbidden(action))
        }
    }

    /// Who owns what this principal starts (an async invocation): its key's id.
    pub fn owner(&self) -> &str {
        match self {
            Principal::Key(k) => &k.id,
            _ => "",
        }
    }

    /// Whether this principal may read a result owned by `owner` in namespace `ns`: its own, or
    /// any of the namespace when it is the namespace's admin.
    pub fn may_read(&self, owner: &str, ns: &str) -> bool {
        match self {
            Principal::Open | Principal::Controller => true,
            Principal::Member { .. } => false,
            Principal::Key(k) => k.id == owner || (k.role == Role::Admin && k.scope.covers(ns)),
        }
    }
}

fn forbidden(action: Action<'_>) -> ApiError {
    let what = match action {
        Action::Manage(ns) => format!("managing functions of namespace {ns:?} needs its admin key"),
        Action::Invoke(ns) => format!("this key cannot invoke functions of namespace {ns:?}"),
        Action::Operate => "this endpoint needs the operator's key (namespace \"*\")".to_string(),
        Action::Metrics(ns) => {
            format!("reading the metrics of namespace {ns:?} needs its admin or metrics key")
        }
        Action::Keys(ns) => format!("managing keys of namespace {ns:?} needs its admin key"),
        Action::Credentials => {
            "managing worker credentials needs the operator's key (namespace \"*\")".into()
        }
        Action::Report(id) => format!(
            "only worker {id:?} itself, with its own worker credential, may join, report or leave as {id:?}"
        ),
        Action::Command => "only this worker's controller may send this".into(),
    };
    ApiError::new(StatusCode::FORBIDDEN, ErrorCode::Forbidden, what)
}

/// Why authentication could not be set up or a key operation failed.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("key store: {0}")]
    Storage(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Config(String),
    /// Over a limit (429).
    #[error("{0}")]
    Limit(String),
}

impl From<rusqlite::Error> for AuthError {
    fn from(e: rusqlite::Error) -> Self {
        AuthError::Storage(e.to_string())
    }
}

impl From<std::io::Error> for AuthError {
    fn from(e: std::io::Error) -> Self {
        AuthError::Storage(e.to_string())
    }
}

type Digest32 = [u8; 32];

fn sha256(token: &str) -> Digest32 {
    Sha256::digest(token.as_bytes()).into()
}

fn random_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// A key as it is replicated between the controllers of a cluster: its hash, never its token.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KeyRecord {
    pub id: String,
    /// Hex SHA-256 of the token.
    pub hash: String,
    pub namespace: String,
    pub role: String,
    pub description: String,
    pub created_unix_s: i64,
}

/// The API keys and worker credentials of one service, hashed in SQLite and held in memory for
/// the request path.
pub struct KeyStore {
    db: Mutex<Connection>,
    keys: DashMap<String, (Arc<KeyInfo>, Digest32)>,
    /// Worker credentials (rows of role `worker`, the worker id in the namespace column).
    workers: DashMap<String, (Arc<WorkerCredential>, Digest32)>,
    /// Keys one namespace may hold; the operator's `*` keys are counted apart against the same
    /// number.
    max_per_namespace: std::sync::atomic::AtomicUsize,
}

fn hex(hash: &Digest32) -> String {
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

fn valid_id(id: &str) -> bool {
    id.len() == ID_LEN && id.bytes().all(|b| b.is_ascii_hexdigit())
}

impl KeyStore {
    /// Opens (or creates, 0600) the store at `path` and loads every key.
    pub fn open(path: &Path) -> Result<Self, AuthError> {
        create_private(path)?;
        let db = Connection::open(path)?;
        db.execute_batch(
            "CREATE TABLE IF NOT EXISTS api_keys (
                 id TEXT PRIMARY KEY,
                 hash BLOB NOT NULL,
                 namespace TEXT NOT NULL,
                 role TEXT NOT NULL,
                 description TEXT NOT NULL,
                 created_at INTEGER NOT NULL
             );",
        )?;
        let keys = DashMap::new();
        let workers = DashMap::new();
        {
            let mut stmt = db.prepare(
                "SELECT id, hash, namespace, role, description, created_at FROM api_keys",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, Vec<u8>>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, i64>(5)?,
                ))
            })?;
            for row in rows {
                let (id, hash, ns, role, description, created_unix_s) = row?;
                if role == WORKER_ROLE {
                    match Digest32::try_from(hash.as_slice()) {
                        Ok(hash) if valid_worker_id(&ns) => {
                            let c = WorkerCredential {
                                id: id.clone(),
                                worker: ns,
                                description,
                                created_unix_s,
                            };
                            workers.insert(id, (Arc::new(c), hash));
                        }
                        _ => {
                            tracing::warn!(credential = %id, "skipping an unreadable worker credential")
                        }
                    }
                    continue;
                }
                let (Ok(hash), Ok(scope), Some(role)) = (
                    Digest32::try_from(hash.as_slice()),
                    Scope::parse(&ns),
                    Role::parse(&role),
                ) else {
                    tracing::warn!(key = %id, "skipping an unreadable key record");
                    continue;
                };
                let info = KeyInfo {
                    id: id.clone(),
                    scope,
                    role,
                    description,
                    created_unix_s,
                };
                keys.insert(id, (Arc::new(info), hash));
            }
        }
        Ok(KeyStore {
            db: Mutex::new(db),
            keys,
            workers,
            max_per_namespace: DEFAULT_MAX_KEYS_PER_NAMESPACE.into(),
        })
    }

    /// Sets how many keys one namespace may hold (at least 1).
    pub fn set_max_per_namespace(&self, n: usize) {
        self.max_per_namespace
            .store(n.max(1), std::sync::atomic::Ordering::Relaxed);
    }

    /// How many keys one namespace may hold.
    pub fn max_per_namespace(&self) -> usize {
        self.max_per_namespace
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn insert_row(
        &self,
        id: &str,
        hash: &Digest32,
        namespace: &str,
        role: &str,
        description: &str,
        created_unix_s: i64,
    ) -> Result<(), AuthError> {
        self.db.lock().execute(
            "INSERT INTO api_keys (id, hash, namespace, role, description, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT(id) DO UPDATE SET hash = ?2, namespace = ?3, role = ?4,
                 description = ?5, created_at = ?6",
            params![
                id,
                hash.to_vec(),
                namespace,
                role,
                description,
                created_unix_s
            ],
        )?;
        Ok(())
    }

    /// A new key; the token is returned once and never stored.
    pub fn create(
        &self,
        scope: Scope,
        role: Role,
        description: &str,
    ) -> Result<(Arc<KeyInfo>, String), AuthError> {
        if description.len() > 200 {
            return Err(AuthError::BadRequest(
                "description is longer than 200 bytes".into(),
            ));
        }
        // A limit per namespace (the operator's `*` keys apart), so that one tenant filling its
        // own share never blocks another tenant or the operator (issue 31: a service-wide
        // limit did).
        let max = self.max_per_namespace();
        let held = self.keys.iter().filter(|e| e.0.scope == scope).count();
        if held >= max {
            return Err(AuthError::Limit(format!(
                "namespace {:?} already holds {held} keys, its limit (max_keys_per_namespace = {max}); delete unused ones first",
                scope.as_str()
            )));
        }
        let id = format!("{:016x}", rand::random::<u64>());
        let token = format!("{KEY_PREFIX}{id}_{}", random_secret());
        let hash = sha256(&token);
        let info = KeyInfo {
            id: id.clone(),
            scope,
            role,
            description: description.to_string(),
            created_unix_s: unix_now(),
        };
        self.insert_row(
            &id,
            &hash,
            info.scope.as_str(),
            info.role.as_str(),
            &info.description,
            info.created_unix_s,
        )?;
        let info = Arc::new(info);
        self.keys.insert(id, (Arc::clone(&info), hash));
        Ok((info, token))
    }

    /// A new worker credential bound to `worker`; its token (`hw_…`) is returned once and never
    /// stored.
    pub fn create_worker(
        &self,
        worker: &str,
        description: &str,
    ) -> Result<(Arc<WorkerCredential>, String), AuthError> {
        if !valid_worker_id(worker) {
            return Err(AuthError::BadRequest(format!(
                "worker must be 1-{MAX_WORKER_ID_LEN} characters of [A-Za-z0-9._:-]"
            )));
        }
        if description.len() > 200 {
            return Err(AuthError::BadRequest(
                "description is longer than 200 bytes".into(),
            ));
        }
        let max = self.max_per_namespace();
        if self.workers.iter().filter(|e| e.0.worker == worker).count() >= max {
            return Err(AuthError::Limit(format!(
                "worker {worker:?} already has {max} credentials, the limit; revoke unused ones first"
            )));
        }
        let id = format!("{:016x}", rand::random::<u64>());
        let token = format!("{WORKER_PREFIX}{id}_{}", random_secret());
        let hash = sha256(&token);
        let c = WorkerCredential {
            id: id.clone(),
            worker: worker.to_string(),
            description: description.to_string(),
            created_unix_s: unix_now(),
        };
        self.insert_row(
            &id,
            &hash,
            worker,
            WORKER_ROLE,
            description,
            c.created_unix_s,
        )?;
        let c = Arc::new(c);
        self.workers.insert(id, (Arc::clone(&c), hash));
        Ok((c, token))
    }

    /// Every worker credential, oldest first.
    pub fn list_workers(&self) -> Vec<Arc<WorkerCredential>> {
        let mut all: Vec<_> = self.workers.iter().map(|e| Arc::clone(&e.0)).collect();
        all.sort_by(|a, b| (a.created_unix_s, &a.id).cmp(&(b.created_unix_s, &b.id)));
        all
    }

    /// A worker credential by its id.
    pub fn worker_credential(&self, id: &str) -> Option<Arc<WorkerCredential>> {
        self.workers.get(id).map(|e| Arc::clone(&e.0))
    }

    /// The worker credential a `hw_…` token is, if it is one of ours.
    pub fn verify_worker(&self, token: &str) -> Option<Arc<WorkerCredential>> {
        let id = token.strip_prefix(WORKER_PREFIX)?.get(..ID_LEN)?;
        let entry = self.workers.get(id)?;
        let (c, hash) = entry.value();
        bool::from(sha256(token).ct_eq(hash)).then(|| Arc::clone(c))
    }

    /// Every key, oldest first.
    pub fn list(&self) -> Vec<Arc<KeyInfo>> {
        let mut all: Vec<_> = self.keys.iter().map(|e| Arc::clone(&e.0)).collect();
        all.sort_by(|a, b| (a.created_unix_s, &a.id).cmp(&(b.created_unix_s, &b.id)));
        all
    }

    pub fn get(&self, id: &str) -> Option<Arc<KeyInfo>> {
        self.keys.get(id).map(|e| Arc::clone(&e.0))
    }

    /// Deletes a key or worker credential; false if there was none.
    pub fn revoke(&self, id: &str) -> Result<bool, AuthError> {
        self.db
            .lock()
            .execute("DELETE FROM api_keys WHERE id = ?1", params![id])?;
        let key = self.keys.remove(id).is_some();
        Ok(self.workers.remove(id).is_some() || key)
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// A key's or worker credential's replicated form.
    pub fn record(&self, id: &str) -> Option<KeyRecord> {
        if let Some(e) = self.workers.get(id) {
            let (c, hash) = e.value();
            return Some(KeyRecord {
                id: c.id.clone(),
                hash: hex(hash),
                namespace: c.worker.clone(),
                role: WORKER_ROLE.to_string(),
                description: c.description.clone(),
                created_unix_s: c.created_unix_s,
            });
        }
        let e = self.keys.get(id)?;
        let (info, hash) = e.value();
        Some(KeyRecord {
            id: info.id.clone(),
            hash: hex(hash),
            namespace: info.scope.as_str().to_string(),
            role: info.role.as_str().to_string(),
            description: info.description.clone(),
            created_unix_s: info.created_unix_s,
        })
    }

    /// Every key's and worker credential's id.
    pub fn ids(&self) -> Vec<String> {
        self.keys
            .iter()
            .map(|e| e.key().clone())
            .chain(self.workers.iter().map(|e| e.key().clone()))
            .collect()
    }

    /// Stores a key made elsewhere in the cluster (or replaces it).
    pub fn apply(&self, r: &KeyRecord) -> Result<(), AuthError> {
        let bad = || AuthError::BadRequest(format!("unreadable replicated key {}", r.id));
        let bytes: Vec<u8> = (0..r.hash.len())
            .step_by(2)
            .filter_map(|i| u8::from_str_radix(r.hash.get(i..i + 2)?, 16).ok())
            .collect();
        let hash = Digest32::try_from(bytes.as_slice()).map_err(|_| bad())?;
        if !valid_id(&r.id) || r.description.len() > 200 {
            return Err(bad());
        }
        if r.role == WORKER_ROLE {
            if !valid_worker_id(&r.namespace) {
                return Err(bad());
            }
            self.insert_row(
                &r.id,
                &hash,
                &r.namespace,
                WORKER_ROLE,
                &r.description,
                r.created_unix_s,
            )?;
            let c = WorkerCredential {
                id: r.id.clone(),
                worker: r.namespace.clone(),
                description: r.description.clone(),
                created_unix_s: r.created_unix_s,
            };
            self.workers.insert(r.id.clone(), (Arc::new(c), hash));
            return Ok(());
        }
        let scope = Scope::parse(&r.namespace)?;
        let role = Role::parse(&r.role).ok_or_else(bad)?;
        self.insert_row(
            &r.id,
            &hash,
            scope.as_str(),
            role.as_str(),
            &r.description,
            r.created_unix_s,
        )?;
        let info = KeyInfo {
            id: r.id.clone(),
            scope,
            role,
            description: r.description.clone(),
            created_unix_s: r.created_unix_s,
        };
        self.keys.insert(r.id.clone(), (Arc::new(info), hash));
        Ok(())
    }

    /// The key a token is, if it is one of ours.
    pub fn verify(&self, token: &str) -> Option<Arc<KeyInfo>> {
        let id = token.strip_prefix(KEY_PREFIX)?.get(..ID_LEN)?;
        let entry = self.keys.get(id)?;
        let (info, hash) = entry.value();
        bool::from(sha256(token).ct_eq(hash)).then(|| Arc::clone(info))
    }
}

type HmacSha256 = hmac::Hmac<Sha256>;

fn hmac_sha256(key: &[u8], message: &[u8]) -> Digest32 {
    use hmac::Mac;
    // HMAC takes a key of any length: this cannot fail.
    let mut mac = <HmacSha256 as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(message);
    mac.finalize().into_bytes().into()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// What a worker proves it holds its controller token with: HMAC of the challenge and the URL
/// it is reached at, so that a proof relayed from the real worker does not fit another URL.
fn identity_proof(controller_token: &str, nonce: &str, url: &str) -> String {
    let msg = format!("worker-identity:{nonce}\n{}", url.trim_end_matches('/'));
    b64(&hmac_sha256(controller_token.as_bytes(), msg.as_bytes()))
}

/// The text of a secret file (`what`: "cluster key", "worker credential"); the error names the
/// file and the kind of failure, never its contents.
fn read_secret_file(path: &Path, what: &str) -> Result<String, AuthError> {
    std::fs::read_to_string(path).map_err(|e| {
        AuthError::Config(format!(
            "cannot read the {what} file {}: {}",
            path.display(),
            e.kind()
        ))
    })
}

/// The controllers' master secret (`cluster.key`): never sent to anyone; the controller's token
/// for each worker is derived from it.
pub struct ClusterKey {
    token: String,
    hash: Digest32,
}

impl ClusterKey {
    /// Reads the credential from `path`; an error never shows the file's contents.
    pub fn read(path: &Path) -> Result<Self, AuthError> {
        let text = read_secret_file(path, "cluster key")?;
        let token = text.trim().to_string();
        if token.len() < MIN_CLUSTER_KEY_LEN || token.contains(char::is_whitespace) {
            return Err(AuthError::Config(format!(
                "the cluster key file {} must hold one token of at least {MIN_CLUSTER_KEY_LEN} characters",
                path.display()
            )));
        }
        let hash = sha256(&token);
        Ok(ClusterKey { token, hash })
    }

    /// Reads `path`, creating it (0600, a new random credential) if it does not exist.
    pub fn read_or_create(path: &Path) -> Result<Self, AuthError> {
        if !path.exists() {
            write_private(path, &format!("{CLUSTER_PREFIX}{}\n", random_secret()))?;
            tracing::info!(path = %path.display(), "created the cluster key; give the same file to every controller of the cluster, never to a worker (each worker gets a credential of its own)");
        }
        Self::read(path)
    }

    /// The master secret itself (compared between controllers of one cluster).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Whether `token` is this key (constant time).
    pub fn matches(&self, token: &str) -> bool {
        bool::from(sha256(token).ct_eq(&self.hash))
    }

    /// The controller's token for the worker holding credential `credential` (its 16-hex id):
    /// `hx_<id>_` + HMAC-SHA256(master, "controller-to-worker:" + id). Nothing to store; only
    /// controllers (with the master key) and that worker (given it in its credential file) know
    /// it.
    pub fn controller_token(&self, credential: &str) -> String {
        let mac = hmac_sha256(
            self.token.as_bytes(),
            format!("controller-to-worker:{credential}").as_bytes(),
        );
        format!("{CONTROLLER_PREFIX}{credential}_{}", b64(&mac))
    }

    /// `Bearer <controller token>` for calls to that worker.
    pub fn header_for(&self, credential: &str) -> Option<HeaderValue> {
        HeaderValue::from_str(&format!("Bearer {}", self.controller_token(credential))).ok()
    }

    /// Whether `proof` shows that whoever answered at `url` holds the controller token of
    /// `credential` (see [`WorkerSecret::prove`]).
    pub fn check_identity(&self, credential: &str, nonce: &str, url: &str, proof: &str) -> bool {
        let want = identity_proof(&self.controller_token(credential), nonce, url);
        bool::from(want.as_bytes().ct_eq(proof.as_bytes()))
    }
}

/// What a worker holds from its credential file: its own token (sent to the controller) and
/// the controller's token for it (accepted from the controller, and used to prove who it is).
pub struct WorkerSecret {
    token: String,
    credential: String,
    controller_token: String,
    controller_hash: Digest32,
}

impl WorkerSecret {
    /// Reads a worker credential file (`hearth cluster credential create`): a `hw_…` line and a
    /// `hx_…` line of the same credential. The controllers' own `hc_…` key is refused with the
    /// command that makes a worker credential; an error never shows the file's contents.
    pub fn read(path: &Path) -> Result<Self, AuthError> {
        let text = read_secret_file(path, "worker credential")?;
        Self::parse(&text).map_err(|why| {
            AuthError::Config(format!(
                "the worker credential file {} {why}",
                path.display()
            ))
        })
    }

    fn parse(text: &str) -> Result<Self, String> {
        const MAKE: &str =
            "make one with `hearth cluster credential create --worker ID --out FILE` \
             (POST /v1/cluster/credentials with the operator's key) and set cluster_key_file to it";
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        if lines.iter().any(|l| l.starts_with(CLUSTER_PREFIX)) {
            return Err(format!(
                "holds the controllers' cluster key, which is never given to workers: {MAKE}"
            ));
        }
        let (Some(w), Some(x)) = (
            lines.iter().find(|l| l.starts_with(WORKER_PREFIX)),
            lines.iter().find(|l| l.starts_with(CONTROLLER_PREFIX)),
        ) else {
            return Err(format!("must hold a hw_ line and a hx_ line: {MAKE}"));
        };
        let id_of = |t: &str| {
            t.get(3..3 + ID_LEN)
                .filter(|id| valid_id(id))
                .map(String::from)
        };
        match (id_of(w), id_of(x)) {
            (Some(a), Some(b)) if a == b && w.len() <= 256 && x.len() <= 256 => Ok(WorkerSecret {
                token: w.to_string(),
                credential: a,
                controller_token: x.to_string(),
                controller_hash: sha256(x),
            }),
            _ => Err(format!(
                "holds lines of different or malformed credentials: {MAKE}"
            )),
        }
    }

    /// The credential file's text for a new credential (what the operator gives the worker).
    pub fn file_text(worker_token: &str, controller_token: &str) -> String {
        format!("{worker_token}\n{controller_token}\n")
    }

    /// `Bearer <worker token>`, for the worker's pushes to its controller.
    pub fn header_value(&self) -> Option<HeaderValue> {
        HeaderValue::from_str(&format!("Bearer {}", self.token)).ok()
    }

    /// The credential's id.
    pub fn credential(&self) -> &str {
        &self.credential
    }

    /// Proves to a controller that asks (`nonce`) that the worker reached at `url` holds this
    /// credential, before the controller sends it anything.
    pub fn prove(&self, nonce: &str, url: &str) -> String {
        identity_proof(&self.controller_token, nonce, url)
    }

    fn is_controller(&self, token: &str) -> bool {
        bool::from(sha256(token).ct_eq(&self.controller_hash))
    }
}

/// How a service authenticates.
pub struct AuthSettings<'a> {
    pub enabled: bool,
    pub data_dir: &'a Path,
    /// The controllers' master key (a controller).
    pub cluster_key: Option<ClusterKey>,
    /// This worker's credential (a worker in a cluster).
    pub worker_secret: Option<WorkerSecret>,
}

/// A service's authentication: its keys and the cluster credential.
pub struct Auth {
    enabled: bool,
    keys: Option<KeyStore>,
    cluster: Option<ClusterKey>,
    worker_secret: Option<WorkerSecret>,
    /// The key made at this start (the first), published to the cluster when it joins one.
    made_at_start: Option<String>,
    /// The cluster's store, when keys are shared by several controllers.
    replica: std::sync::OnceLock<Arc<dyn crate::store::ClusterState>>,
}

impl Auth {
    /// Opens the key store; on the first start (no keys yet) makes the operator's key and writes
    /// it to `<data-dir>/admin.key` (0600).
    pub fn open(s: AuthSettings<'_>) -> Result<Arc<Auth>, AuthError> {
        if !s.enabled {
            return Ok(Arc::new(Auth {
                enabled: false,
                keys: None,
                cluster: s.cluster_key,
                worker_secret: s.worker_secret,
                made_at_start: None,
                replica: std::sync::OnceLock::new(),
            }));
        }
        let keys = KeyStore::open(&s.data_dir.join(KEYS_DB))?;
        let admin_key_file = s.data_dir.join(ADMIN_KEY_FILE);
        let mut made_at_start = None;
        if keys.is_empty() {
            let (info, token) = keys.create(Scope::All, Role::Admin, "made at first start")?;
            write_private(&admin_key_file, &format!("{token}\n"))?;
            tracing::info!(path = %admin_key_file.display(), "created the operator's API key");
            made_at_start = Some(info.id.clone());
        }
        Ok(Arc::new(Auth {
            enabled: true,
            keys: Some(keys),
            cluster: s.cluster_key,
            worker_secret: s.worker_secret,
            made_at_start,
            replica: std::sync::OnceLock::new(),
        }))
    }

    /// Shares keys through the cluster's store from now on (a controller among several).
    pub fn replicate_to(&self, cluster: Arc<dyn crate::store::ClusterState>) {
        let _ = self.replica.set(cluster);
    }

    /// The cluster's store keys are shared through, if any.
    pub fn replica(&self) -> Option<&Arc<dyn crate::store::ClusterState>> {
        self.replica.get()
    }

    /// The id of the key made at this start, if one was.
    pub fn made_at_start(&self) -> Option<&str> {
        self.made_at_start.as_deref()
    }

    /// No authentication (tests of other parts, loopback-only setups).
    pub fn disabled() -> Arc<Auth> {
        Arc::new(Auth {
            enabled: false,
            keys: None,
            cluster: None,
            worker_secret: None,
            made_at_start: None,
            replica: std::sync::OnceLock::new(),
        })
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    pub fn keys(&self) -> Option<&KeyStore> {
        self.keys.as_ref()
    }

    pub fn cluster_key(&self) -> Option<&ClusterKey> {
        self.cluster.as_ref()
    }

    /// This worker's credential, if it is a worker in a cluster.
    pub fn worker_secret(&self) -> Option<&WorkerSecret> {
        self.worker_secret.as_ref()
    }

    /// Who sent these headers: 401 without a valid key when authentication is on.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, ApiError> {
        if !self.enabled {
            return Ok(Principal::Open);
        }
        let token = bearer(headers).ok_or_else(|| {
            unauthorized("this endpoint needs an API key: send `Authorization: Bearer <key>` (the hearth CLI sends $HEARTH_API_KEY, else admin.key from the data directory)")
        })?;
        if token.starts_with(WORKER_PREFIX) {
            // Only a controller (it holds the master key) admits workers.
            return self
                .cluster
                .as_ref()
                .and(self.keys.as_ref())
                .and_then(|k| k.verify_worker(token))
                .map(|c| Principal::Member {
                    worker: c.worker.clone(),
                    credential: c.id.clone(),
                })
                .ok_or_else(|| unauthorized("invalid or revoked worker credential"));
        }
        if token.starts_with(CONTROLLER_PREFIX) {
            return match &self.worker_secret {
                Some(w) if w.is_controller(token) => Ok(Principal::Controller),
                _ => Err(unauthorized("invalid API key")),
            };
        }
        self.keys
            .as_ref()
            .and_then(|k| k.verify(token))
            .map(Principal::Key)
            .ok_or_else(|| unauthorized("invalid API key"))
    }
}

/// The token of `Authorization: Bearer <token>`.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty() && t.len() <= 256)
}

fn unauthorized(message: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized, message)
}

/// The middleware: the request's [`Principal`] into its extensions, or 401.
pub async fn middleware(State(auth): State<Arc<Auth>>, mut req: Request, next: Next) -> Response {
    match auth.authenticate(req.headers()) {
        Ok(p) => {
            req.extensions_mut().insert(p);
            next.run(req).await
        }
        Err(e) => {
            let mut resp = e.into_response();
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"hearth\""),
            );
            resp
        }
    }
}

/// Creates `path` empty with mode 0600 if it does not exist, and makes it 0600 if it does.
fn create_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

/// Writes a secret file readable by its owner only.
pub fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    create_private(path)?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
}

/// Whether `listen` (`IP:PORT`) is a loopback address: the only place a service may run without
/// authentication.
pub fn is_loopback(listen: &str) -> bool {
    listen
        .parse::<std::net::SocketAddr>()
        .map(|a| a.ip().is_loopback())
        .unwrap_or_else(|_| {
            listen
                .rsplit_once(':')
                .is_some_and(|(host, _)| host == "localhost")
        })
}

/// Refuses to serve without authentication anywhere but loopback.
pub fn check_exposure(listen: &str, auth_enabled: bool) -> Result<(), AuthError> {
    if !auth_enabled && !is_loopback(listen) {
        return Err(AuthError::Config(format!(
            "refusing to listen on {listen} without authentication: anyone who can reach it could run code; turn auth on or listen on 127.0.0.1"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        );
        h
    }

    #[test]
    fn the_first_start_writes_a_private_operator_key_that_authenticates() {
        let dir = tempfile::tempdir().unwrap();
        let auth = Auth::open(AuthSettings {
            enabled: true,
            data_dir: dir.path(),
            cluster_key: None,
            worker_secret: None,
        })
        .unwrap();
        let file = dir.path().join(ADMIN_KEY_FILE);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            std::fs::metadata(dir.path().join(KEYS_DB))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o600
        );
        let token = std::fs::read_to_string(&file).unwrap();
        let p = auth.authenticate(&headers(token.trim())).unwrap();
        assert!(p.sees_all());
        // The store holds only the hash.
        let raw = std::fs::read(dir.path().join(KEYS_DB)).unwrap();
        // The secret is everything after the id: base64url, so it may itself contain '_' (the
        // part after the last '_' alone can be a few bytes long and turn up by chance).
        let (_, secret) = token
            .trim()
            .strip_prefix(KEY_PREFIX)
            .and_then(|t| t.split_once('_'))
            .unwrap();
        assert_eq!(secret.len(), 43, "32 random bytes");
        assert!(!raw.windows(secret.len()).any(|w| w == secret.as_bytes()));
        // A second start keeps the key and writes no new one.
        drop(auth);
        let again = Auth::open(AuthSettings {
            enabled: true,
            data_dir: dir.path(),
            cluster_key: None,
            worker_secret: None,
        })
        .unwrap();
        assert!(again.authenticate(&headers(token.trim())).is_ok());
        assert_eq!(again.keys().unwrap().list().len(), 1);
    }

    #[test]
    fn wrong_missing_and_revoked_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let auth = Auth::open(AuthSettings {
            enabled: true,
            data_dir: dir.path(),
            cluster_key: None,
            worker_secret: None,
        })
        .unwrap();
        let keys = auth.keys().unwrap();
        let (info, token) = keys
            .create(Scope::Namespace("team-a".into()), Role::Invoke, "")
            .unwrap();
        assert!(auth.authenticate(&headers(&token)).is_ok());
        let mut forged = token.clone();
        let last = forged.pop();
        forged.push(if last == Some('x') { 'y' } else { 'x' });
        for bad in [forged.as_str(), "hk_0123456789abcdef_x", "nonsense", ""] {
            let e = auth.authenticate(&headers(bad)).unwrap_err();
            assert_eq!(e.status, StatusCode::UNAUTHORIZED, "{bad:?}");
        }
        assert_eq!(
            auth.authenticate(&HeaderMap::new()).unwrap_err().status,
            StatusCode::UNAUTHORIZED
        );
        assert!(keys.revoke(&info.id).unwrap());
        assert!(auth.authenticate(&headers(&token)).is_err());
    }

    #[test]
    fn roles_and_namespaces_limit_what_a_key_may_do() {
        let key = |scope: Scope, role| {
            Principal::Key(Arc::new(KeyInfo {
                id: "k1".into(),
                scope,
                role,
                description: String::new(),
                created_unix_s: 0,
            }))
        };
        let invoker = key(Scope::Namespace("a".into()), Role::Invoke);
        let admin_a = key(Scope::Namespace("a".into()), Role::Admin);
        let operator = key(Scope::All, Role::Admin);
        assert!(invoker.require(Action::Invoke("a")).is_ok());
        assert!(invoker.require(Action::Manage("a")).is_err());
        assert!(invoker.require(Action::Invoke("b")).is_err());
        assert!(admin_a.require(Action::Manage("a")).is_ok());
        assert!(admin_a.require(Action::Manage("b")).is_err());
        assert!(admin_a.require(Action::Operate).is_err());
        assert!(operator.require(Action::Operate).is_ok());
        assert!(operator.require(Action::Report("w1")).is_err());
        let member = Principal::Member {
            worker: "w1".into(),
            credential: "0123456789abcdef".into(),
        };
        assert!(member.require(Action::Report("w1")).is_ok());
        assert!(member.require(Action::Report("w2")).is_err());
        // Names: a tenant's plain name lands in its namespace; it cannot name another's.
        assert_eq!(admin_a.function_key("f").unwrap(), "a.f");
        assert!(admin_a.function_key("b.f").is_err());
        assert_eq!(operator.function_key("f").unwrap(), "f");
        assert_eq!(operator.function_key("b.f").unwrap(), "b.f");
        assert_eq!(Principal::Controller.function_key("b.f").unwrap(), "b.f");
        assert!(member.function_key("b.f").is_err());
        // Results: one's own, or the namespace admin's.
        assert!(invoker.may_read("k1", "a"));
        assert!(!key(Scope::Namespace("a".into()), Role::Invoke).may_read("k2", "a"));
        assert!(admin_a.may_read("k2", "a"));
        assert!(!admin_a.may_read("k2", "b"));
    }

    /// A controller with its cluster key and a worker credential it issued; the worker's
    /// file as `hearth cluster credential create` writes it.
    fn cluster_pair(dir: &Path) -> (Arc<Auth>, String, String) {
        let ck = ClusterKey::read_or_create(&dir.join(CLUSTER_KEY_FILE)).unwrap();
        let master = ck.token().to_string();
        let auth = Auth::open(AuthSettings {
            enabled: true,
            data_dir: dir,
            cluster_key: Some(ck),
            worker_secret: None,
        })
        .unwrap();
        let (c, token) = auth.keys().unwrap().create_worker("w1", "").unwrap();
        let x = auth.cluster_key().unwrap().controller_token(&c.id);
        (auth, master, WorkerSecret::file_text(&token, &x))
    }

    #[test]
    fn a_worker_credential_is_a_member_for_its_own_id_and_the_cluster_key_is_no_credential() {
        let dir = tempfile::tempdir().unwrap();
        let (auth, master, file) = cluster_pair(dir.path());
        let w = file.lines().next().unwrap();
        let x = file.lines().nth(1).unwrap();
        match auth.authenticate(&headers(w)).unwrap() {
            Principal::Member { worker, .. } => assert_eq!(worker, "w1"),
            other => panic!("{other:?}"),
        }
        // The master key, and the controller's token, open nothing at a controller.
        for bad in [master.as_str(), x] {
            assert_eq!(
                auth.authenticate(&headers(bad)).unwrap_err().status,
                StatusCode::UNAUTHORIZED
            );
        }
        let mut forged = w.to_string();
        let last = forged.pop();
        forged.push(if last == Some('A') { 'B' } else { 'A' });
        assert!(auth.authenticate(&headers(&forged)).is_err());
        // Revoked: 401.
        let id = &w[3..3 + ID_LEN];
        assert!(auth.keys().unwrap().revoke(id).unwrap());
        assert!(auth.authenticate(&headers(w)).is_err());
    }

    #[test]
    fn a_worker_accepts_only_its_own_controller_token_and_refuses_the_cluster_key() {
        let dir = tempfile::tempdir().unwrap();
        let (ctl, master, file) = cluster_pair(dir.path());
        let path = dir.path().join("w1.credential");
        std::fs::write(&path, &file).unwrap();
        let wdir = tempfile::tempdir().unwrap();
        let worker = Auth::open(AuthSettings {
            enabled: true,
            data_dir: wdir.path(),
            cluster_key: None,
            worker_secret: Some(WorkerSecret::read(&path).unwrap()),
        })
        .unwrap();
        let x = file.lines().nth(1).unwrap();
        assert!(matches!(
            worker.authenticate(&headers(x)).unwrap(),
            Principal::Controller
        ));
        // Another worker's controller token, its own worker token, the master key: 401.
        let (other, _) = ctl.keys().unwrap().create_worker("w2", "").unwrap();
        let other_x = ctl.cluster_key().unwrap().controller_token(&other.id);
        for bad in [
            other_x.as_str(),
            file.lines().next().unwrap(),
            master.as_str(),
        ] {
            assert!(worker.authenticate(&headers(bad)).is_err(), "{bad}");
        }
        // Its proof of identity fits the URL it was made for only.
        let s = worker.worker_secret().unwrap();
        let proof = s.prove("00ff", "http://10.0.0.1:7878");
        let key = ctl.cluster_key().unwrap();
        assert!(key.check_identity(s.credential(), "00ff", "http://10.0.0.1:7878", &proof));
        assert!(!key.check_identity(s.credential(), "00ff", "http://10.0.0.2:7878", &proof));
        assert!(!key.check_identity(s.credential(), "00fe", "http://10.0.0.1:7878", &proof));
        // The controllers' key given to a worker is refused, naming the command, not the key.
        std::fs::write(&path, format!("{master}\n")).unwrap();
        let e = WorkerSecret::read(&path).err().unwrap().to_string();
        assert!(e.contains("hearth cluster credential create"), "{e}");
        assert!(!e.contains(&master), "{e}");
        std::fs::write(&path, "short").unwrap();
        let e = WorkerSecret::read(&path).err().unwrap().to_string();
        assert!(!e.contains("short"), "{e}");
    }

    #[test]
    fn worker_credentials_replicate_and_keys_are_limited_per_namespace() {
        let dir = tempfile::tempdir().unwrap();
        let (auth, _, file) = cluster_pair(dir.path());
        let keys = auth.keys().unwrap();
        let id = &file[3..3 + ID_LEN];
        let record = keys.record(id).unwrap();
        assert_eq!(
            (record.role.as_str(), record.namespace.as_str()),
            ("worker", "w1")
        );
        let other = tempfile::tempdir().unwrap();
        let replica = KeyStore::open(&other.path().join(KEYS_DB)).unwrap();
        replica.apply(&record).unwrap();
        assert_eq!(
            replica
                .verify_worker(file.lines().next().unwrap())
                .unwrap()
                .worker,
            "w1"
        );
        // Survives a reopen, and is not an API key.
        drop(replica);
        let replica = KeyStore::open(&other.path().join(KEYS_DB)).unwrap();
        assert_eq!(replica.list_workers().len(), 1);
        assert!(replica.list().is_empty());
        // One namespace filling its share blocks neither another namespace nor the operator.
        keys.set_max_per_namespace(3);
        let a = Scope::Namespace("a".into());
        for _ in 0..3 {
            keys.create(a.clone(), Role::Invoke, "").unwrap();
        }
        let e = keys.create(a, Role::Invoke, "").unwrap_err();
        assert!(
            matches!(e, AuthError::Limit(ref m) if m.contains("max_keys_per_namespace")),
            "{e}"
        );
        assert!(keys
            .create(Scope::Namespace("b".into()), Role::Invoke, "")
            .is_ok());
        assert!(keys.create(Scope::All, Role::Admin, "").is_ok());
        assert!(keys.create_worker("bad/id", "").is_err());
    }

    /// The rules of [`Principal::require`] are the table in docs/security.md, cell by cell.
    #[test]
    fn the_rules_match_the_table_in_the_security_doc() {
        let doc = include_str!("../../../docs/security.md");
        let key = |scope: Scope, role| {
            Principal::Key(Arc::new(KeyInfo {
                id: "k1".into(),
                scope,
                role,
                description: String::new(),
                created_unix_s: 0,
            }))
        };
        let a = || Scope::Namespace("a".into());
        let columns = [
            ("operator", key(Scope::All, Role::Admin)),
            ("namespace admin", key(a(), Role::Admin)),
            ("namespace invoke", key(a(), Role::Invoke)),
            ("metrics key", key(a(), Role::Metrics)),
            (
                "worker credential",
                Principal::Member {
                    worker: "w1".into(),
                    credential: "0123456789abcdef".into(),
                },
            ),
            ("controller token", Principal::Controller),
        ];
        let rows: Vec<Vec<&str>> = doc
            .lines()
            .skip_while(|l| !l.starts_with("| action |"))
            .take_while(|l| l.starts_with('|'))
            .map(|l| l.trim_matches('|').split('|').map(str::trim).collect())
            .collect();
        assert!(rows.len() > 2, "the table is missing from docs/security.md");
        let header = &rows[0];
        let names: Vec<&str> = columns.iter().map(|(n, _)| *n).collect();
        assert_eq!(&header[1..], names.as_slice(), "the table's columns");
        let mut seen = std::collections::BTreeSet::new();
        for row in &rows[2..] {
            let (label, qualifier) = match row[0].split_once(" (") {
                Some((l, q)) => (l, q.trim_end_matches(')')),
                None => (row[0], ""),
            };
            let target = match qualifier {
                "own namespace" => "a",
                "another namespace" => "b",
                "every namespace" => "*",
                "own worker id" => "w1",
                "another worker id" => "w2",
                "" => "",
                q => panic!("unknown qualifier {q:?}"),
            };
            let actions = [
                Action::Manage(target),
                Action::Invoke(target),
                Action::Operate,
                Action::Metrics(target),
                Action::Keys(target),
                Action::Credentials,
                Action::Report(target),
                Action::Command,
            ];
            let action = actions
                .iter()
                .find(|a| a.label() == label)
                .unwrap_or_else(|| panic!("no action is labelled {label:?}"));
            seen.insert(label);
            for ((name, p), cell) in columns.iter().zip(&row[1..]) {
                let want = match *cell {
                    "yes" => true,
                    "no" => false,
                    c => panic!("cell {c:?} of {label:?} must be yes or no"),
                };
                assert_eq!(
                    p.require(*action).is_ok(),
                    want,
                    "{name} / {}: the code and docs/security.md differ",
                    row[0]
                );
            }
        }
        assert_eq!(seen.len(), 8, "every action has a row: {seen:?}");
    }

    #[test]
    fn only_loopback_may_go_without_authentication() {
        assert!(check_exposure("127.0.0.1:7878", false).is_ok());
        assert!(check_exposure("[::1]:7878", false).is_ok());
        assert!(check_exposure("localhost:7878", false).is_ok());
        assert!(check_exposure("0.0.0.0:7878", false).is_err());
        assert!(check_exposure("10.1.2.3:7878", false).is_err());
        assert!(check_exposure("0.0.0.0:7878", true).is_ok());
    }
}
