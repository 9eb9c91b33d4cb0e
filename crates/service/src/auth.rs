//! Authentication: API keys scoped to a namespace with a role, the cluster credential that
//! workers and controllers present to each other, and the middleware that turns a request's
//! `Authorization: Bearer …` into a [`Principal`] the routes check.
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
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Invoke => "invoke",
        }
    }

    fn parse(s: &str) -> Option<Role> {
        match s {
            "admin" => Some(Role::Admin),
            "invoke" => Some(Role::Invoke),
            _ => None,
        }
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
    /// A peer of the cluster (a controller calling a worker, a worker pushing its status).
    Peer,
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
    /// See the whole platform: status, every namespace's metrics, the cluster's workers, keys of
    /// every namespace.
    Operate,
    /// Join the cluster and push status: only a peer.
    Join,
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

    /// Whether this principal sees every namespace (the operator, a peer, or no authentication).
    pub fn sees_all(&self) -> bool {
        match self {
            Principal::Key(k) => k.scope == Scope::All && k.role == Role::Admin,
            _ => true,
        }
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
            Principal::Open | Principal::Peer => true,
            Principal::Key(k) => match action {
                Action::Manage(ns) => k.role == Role::Admin && k.scope.covers(ns),
                Action::Invoke(ns) => k.scope.covers(ns),
                Action::Operate => k.role == Role::Admin && k.scope == Scope::All,
                Action::Join => false,
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
            Principal::Open | Principal::Peer => true,
            Principal::Key(k) => k.id == owner || (k.role == Role::Admin && k.scope.covers(ns)),
        }
    }
}

fn forbidden(action: Action<'_>) -> ApiError {
    let what = match action {
        Action::Manage(ns) => format!("managing functions of namespace {ns:?} needs its admin key"),
        Action::Invoke(ns) => format!("this key cannot invoke functions of namespace {ns:?}"),
        Action::Operate => "this endpoint needs the operator's key (namespace \"*\")".to_string(),
        Action::Join => "only cluster members (with the cluster key) may use this endpoint".into(),
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

/// The API keys of one service, hashed in SQLite and held in memory for the request path.
pub struct KeyStore {
    db: Mutex<Connection>,
    keys: DashMap<String, (Arc<KeyInfo>, Digest32)>,
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
        })
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
        if self.keys.len() >= 10_000 {
            return Err(AuthError::BadRequest(
                "this service already has 10000 keys; delete unused ones first".into(),
            ));
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
        self.db.lock().execute(
            "INSERT INTO api_keys (id, hash, namespace, role, description, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                id,
                hash.to_vec(),
                info.scope.as_str(),
                info.role.as_str(),
                info.description,
                info.created_unix_s
            ],
        )?;
        let info = Arc::new(info);
        self.keys.insert(id, (Arc::clone(&info), hash));
        Ok((info, token))
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

    /// Deletes a key; false if there was none.
    pub fn revoke(&self, id: &str) -> Result<bool, AuthError> {
        self.db
            .lock()
            .execute("DELETE FROM api_keys WHERE id = ?1", params![id])?;
        Ok(self.keys.remove(id).is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// A key's replicated form.
    pub fn record(&self, id: &str) -> Option<KeyRecord> {
        let e = self.keys.get(id)?;
        let (info, hash) = e.value();
        Some(KeyRecord {
            id: info.id.clone(),
            hash: hash.iter().map(|b| format!("{b:02x}")).collect(),
            namespace: info.scope.as_str().to_string(),
            role: info.role.as_str().to_string(),
            description: info.description.clone(),
            created_unix_s: info.created_unix_s,
        })
    }

    /// Every key's id.
    pub fn ids(&self) -> Vec<String> {
        self.keys.iter().map(|e| e.key().clone()).collect()
    }

    /// Stores a key made elsewhere in the cluster (or replaces it).
    pub fn apply(&self, r: &KeyRecord) -> Result<(), AuthError> {
        let bad = || AuthError::BadRequest(format!("unreadable replicated key {}", r.id));
        let bytes: Vec<u8> = (0..r.hash.len())
            .step_by(2)
            .filter_map(|i| u8::from_str_radix(r.hash.get(i..i + 2)?, 16).ok())
            .collect();
        let hash = Digest32::try_from(bytes.as_slice()).map_err(|_| bad())?;
        let scope = Scope::parse(&r.namespace)?;
        let role = Role::parse(&r.role).ok_or_else(bad)?;
        if r.id.len() != ID_LEN || !r.id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        self.db.lock().execute(
            "INSERT INTO api_keys (id, hash, namespace, role, description, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT(id) DO UPDATE SET hash = ?2, namespace = ?3, role = ?4,
                 description = ?5, created_at = ?6",
            params![
                r.id,
                hash.to_vec(),
                scope.as_str(),
                role.as_str(),
                r.description,
                r.created_unix_s
            ],
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

/// The shared secret of a cluster: sent by its members, checked by each.
pub struct ClusterKey {
    token: String,
    hash: Digest32,
}

impl ClusterKey {
    /// Reads the credential from `path`; an error never shows the file's contents.
    pub fn read(path: &Path) -> Result<Self, AuthError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            AuthError::Config(format!(
                "cannot read the cluster key file {}: {}",
                path.display(),
                e.kind()
            ))
        })?;
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
            tracing::info!(path = %path.display(), "created the cluster key; give it to workers (cluster_key_file)");
        }
        Self::read(path)
    }

    /// What a member sends.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// `Bearer <token>`, for outgoing requests.
    pub fn header_value(&self) -> Option<HeaderValue> {
        HeaderValue::from_str(&format!("Bearer {}", self.token)).ok()
    }

    fn matches(&self, token: &str) -> bool {
        bool::from(sha256(token).ct_eq(&self.hash))
    }
}

/// How a service authenticates.
pub struct AuthSettings<'a> {
    pub enabled: bool,
    pub data_dir: &'a Path,
    /// The cluster credential, if this service takes part in a cluster.
    pub cluster_key: Option<ClusterKey>,
}

/// A service's authentication: its keys and the cluster credential.
pub struct Auth {
    enabled: bool,
    keys: Option<KeyStore>,
    cluster: Option<ClusterKey>,
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

    /// Who sent these headers: 401 without a valid key when authentication is on.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, ApiError> {
        if !self.enabled {
            return Ok(Principal::Open);
        }
        let token = bearer(headers).ok_or_else(|| {
            unauthorized("this endpoint needs an API key: send `Authorization: Bearer <key>` (the hearth CLI sends $HEARTH_API_KEY, else admin.key from the data directory)")
        })?;
        if let Some(c) = &self.cluster {
            if !token.starts_with(KEY_PREFIX) {
                return if c.matches(token) {
                    Ok(Principal::Peer)
                } else {
                    Err(unauthorized("invalid API key"))
                };
            }
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
        assert!(operator.require(Action::Join).is_err());
        assert!(Principal::Peer.require(Action::Join).is_ok());
        // Names: a tenant's plain name lands in its namespace; it cannot name another's.
        assert_eq!(admin_a.function_key("f").unwrap(), "a.f");
        assert!(admin_a.function_key("b.f").is_err());
        assert_eq!(operator.function_key("f").unwrap(), "f");
        assert_eq!(operator.function_key("b.f").unwrap(), "b.f");
        assert_eq!(Principal::Peer.function_key("b.f").unwrap(), "b.f");
        // Results: one's own, or the namespace admin's.
        assert!(invoker.may_read("k1", "a"));
        assert!(!key(Scope::Namespace("a".into()), Role::Invoke).may_read("k2", "a"));
        assert!(admin_a.may_read("k2", "a"));
        assert!(!admin_a.may_read("k2", "b"));
    }

    #[test]
    fn the_cluster_key_makes_a_peer_and_nothing_else_does() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CLUSTER_KEY_FILE);
        let ck = ClusterKey::read_or_create(&path).unwrap();
        let token = ck.token().to_string();
        let auth = Auth::open(AuthSettings {
            enabled: true,
            data_dir: dir.path(),
            cluster_key: Some(ck),
        })
        .unwrap();
        assert!(matches!(
            auth.authenticate(&headers(&token)).unwrap(),
            Principal::Peer
        ));
        let mut other = token.clone();
        let last = other.pop();
        other.push(if last == Some('A') { 'B' } else { 'A' });
        assert!(auth.authenticate(&headers(&other)).is_err());
        assert!(ClusterKey::read(&path).is_ok());
        std::fs::write(&path, "short").unwrap();
        let e = ClusterKey::read(&path).err().unwrap().to_string();
        assert!(!e.contains("short"), "{e}");
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
