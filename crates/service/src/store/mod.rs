//! Durable state behind the worker and the controller (DESIGN.md §6a).
//!
//! Two traits, because a single node and a cluster need different things:
//!
//! * [`AsyncStore`]: the records of async invocations, durable before their 202, with
//!   idempotency keys, one final result each, and the orphans a crashed process left. SQLite in
//!   the data directory on a single node ([`sqlite::SqliteAsyncStore`]), etcd in a cluster
//!   ([`etcd::EtcdStore`]).
//! * [`ClusterState`]: what several controllers share: the function registry with
//!   content-addressed code, and membership (workers and controllers) as leases with
//!   keep-alive. etcd only; a lone controller without `--store` keeps its SQLite registry.
//!
//! The synchronous invoke path never calls either: routing reads local copies that
//! [`ClusterState::watch_functions`] and [`ClusterState::watch_members`] keep current.

pub mod etcd;
pub mod local_etcd;
pub mod seal;
pub mod sqlite;

use async_trait::async_trait;
use hearth_api::AsyncState;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Why a store operation failed. Messages never carry keys' values (code, args, results).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store cannot be reached or answered with an error; retrying later may work.
    #[error("state store unavailable: {0}")]
    Unavailable(String),
    /// A value in the store could not be read (corrupt or from an incompatible version).
    #[error("state store holds an unreadable {what}: {why}")]
    Corrupt { what: &'static str, why: String },
    /// The value is larger than the store accepts.
    #[error("{what} of {bytes} bytes is larger than the state store's limit of {max} bytes")]
    TooLarge {
        what: &'static str,
        bytes: usize,
        max: usize,
    },
    /// The store holds as many invocations as it may.
    #[error("the async store is full ({0} records)")]
    Full(usize),
    /// The calling namespace holds its share of the store (`setting`): other namespaces are
    /// unaffected, and the caller's own finished results make room as they expire.
    #[error(
        "namespace {namespace:?} holds its limit of {max} async {what} ({setting}); \
         retry once some of its results expire"
    )]
    NamespaceFull {
        namespace: String,
        what: &'static str,
        setting: &'static str,
        max: usize,
    },
    /// A bad `--store` URL or store setting.
    #[error("bad state store setting: {0}")]
    Config(String),
}

/// One async invocation as it is stored: enough to run it again after any crash, and its
/// final answer once there is one.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StoredInvocation {
    /// 128 random bits as 32 hex digits.
    pub id: String,
    /// The function key (`ns.name`, or `name` in `default`).
    pub function: String,
    /// The id of the key that started it ("" without authentication): who may read it.
    pub owner: String,
    /// The request body (JSON arguments), base64 in the stored form.
    #[serde(with = "b64")]
    pub args: Vec<u8>,
    pub submitted_unix_ms: u64,
    /// Attempts started so far (a re-dispatch after a crash counts the lost one).
    pub attempts: u32,
    /// 1 + the retries allowed.
    pub max_attempts: u32,
    /// `running` until the final answer is written.
    pub state: AsyncState,
    /// Why each failed attempt failed, oldest first (bounded): the dead-letter reason.
    #[serde(default)]
    pub failures: Vec<String>,
    /// The `Idempotency-Key` it was started with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The final answer's HTTP status and body (a worker's answer, or the controller's error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_unix_ms: Option<u64>,
}

/// At most this many failure reasons are kept per invocation, each at most this long.
pub const MAX_FAILURES_KEPT: usize = 8;
pub const MAX_FAILURE_CHARS: usize = 512;

impl StoredInvocation {
    /// What the store matches a repeated `Idempotency-Key` by, besides the function: the key
    /// scoped to the caller's key id (`owner`), so that another key of the same namespace
    /// sending the same `Idempotency-Key` gets a call of its own, never the first key's answer
    /// (issue 31 item 10). Length-prefixed, so no two (owner, key) pairs give the same string.
    pub fn idempotency_scope(&self) -> Option<String> {
        self.idempotency_key
            .as_deref()
            .map(|k| format!("{}:{}:{k}", self.owner.len(), self.owner))
    }

    /// Appends a failure reason within the bounds.
    pub fn note_failure(&mut self, why: &str) {
        let why: String = why.chars().take(MAX_FAILURE_CHARS).collect();
        if self.failures.len() >= MAX_FAILURES_KEPT {
            self.failures.remove(0);
        }
        self.failures.push(why);
    }
}

/// What [`AsyncStore::create`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    /// The invocation is stored (and claimed by the caller).
    New,
    /// Its idempotency key was already used for this function by the same calling key: the
    /// first call's record.
    Existing(Box<StoredInvocation>),
}

/// Durable async invocation records.
#[async_trait]
pub trait AsyncStore: Send + Sync + 'static {
    /// Stores a new invocation durably, claimed by this process, unless its idempotency key
    /// (scoped to its function and its owner, the calling key) was used before: then nothing is written and the first call's
    /// record comes back.
    async fn create(&self, inv: &StoredInvocation) -> Result<Created, StoreError>;

    /// The record, if it exists (finished ones until they expire).
    async fn get(&self, id: &str) -> Result<Option<StoredInvocation>, StoreError>;

    /// Records progress of an unfinished invocation (attempts started, failure reasons). A
    /// record that is already final is left alone.
    async fn update(&self, inv: &StoredInvocation) -> Result<(), StoreError>;

    /// Writes the final answer unless another finisher was first: true when this call made
    /// it final (exactly one visible result), false when it was already final or gone.
    async fn finish(&self, inv: &StoredInvocation) -> Result<bool, StoreError>;

    /// Unfinished invocations that nobody is working on any more (those of a crashed process
    /// or controller), at most `limit`; each one returned is now claimed by the caller.
    async fn take_orphans(&self, limit: usize) -> Result<Vec<StoredInvocation>, StoreError>;

    /// Failed invocations (the dead-letter list), newest first, at most `limit`; only those
    /// `filter` selects.
    async fn dead_letters(
        &self,
        filter: &DeadLetterFilter,
        limit: usize,
    ) -> Result<Vec<StoredInvocation>, StoreError>;

    /// Forgets finished records that finished before `before_unix_ms`; how many went.
    async fn expire(&self, before_unix_ms: u64) -> Result<usize, StoreError>;
}

/// Which dead letters to list.
#[derive(Debug, Clone, Default)]
pub struct DeadLetterFilter {
    /// Only functions of this namespace (None: all, for the operator).
    pub namespace: Option<String>,
    /// Only this function key.
    pub function: Option<String>,
}

impl DeadLetterFilter {
    pub fn accepts(&self, function_key: &str) -> bool {
        self.namespace.as_deref().map_or(true, |ns| {
            hearth_api::namespace::namespace_of(function_key) == ns
        }) && self.function.as_deref().map_or(true, |f| f == function_key)
    }
}

/// A function as the cluster stores it: the spec (JSON, its `version` is the store's) and a
/// reference to its code.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FunctionRecord {
    /// The function key.
    pub key: String,
    /// The registration's spec as JSON (without code).
    pub spec: serde_json::Value,
    /// Increases with every update, cluster-wide (etcd: the key's mod revision).
    #[serde(default)]
    pub version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<CodeRef>,
}

/// Content-addressed code: the packed archive (as `hearth_service::archive` makes it) by its
/// SHA-256.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CodeRef {
    /// Hex SHA-256 of the archive bytes.
    pub sha256: String,
    pub bytes: u64,
}

/// A member of the cluster, as published under its lease.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MemberRecord {
    /// Unique among members of its kind (a worker's name, a controller's id).
    pub name: String,
    /// Where it serves (`http://HOST:PORT`).
    pub url: String,
    /// Changes with every process start.
    pub incarnation: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemberKind {
    Worker,
    Controller,
}

/// A change seen by a watch. After a lost connection the watch starts again with a fresh
/// [`Change::Snapshot`], which replaces everything known before.
#[derive(Debug, Clone, PartialEq)]
pub enum Change<T> {
    Snapshot(Vec<T>),
    Put(T),
    /// The key (function key or member name) that went.
    Delete(String),
}

/// A membership lease held with keep-alive; dropping it (or [`Membership::leave`]) revokes it,
/// so the member disappears at once rather than after the TTL.
#[async_trait]
pub trait Membership: Send + Sync {
    /// Revokes the lease now.
    async fn leave(self: Box<Self>);
    /// False once the lease was lost (keep-alive failed past its TTL); the holder re-joins.
    fn is_alive(&self) -> bool;
}

/// What several controllers share (etcd).
#[async_trait]
pub trait ClusterState: Send + Sync + 'static {
    /// Stores a function (spec and, when given, its packed code archive) and returns its new
    /// version. Code is content-addressed: the same archive is stored once.
    async fn put_function(
        &self,
        key: &str,
        spec: &serde_json::Value,
        code: Option<&[u8]>,
    ) -> Result<FunctionRecord, StoreError>;

    /// Deletes a function; false when it did not exist. Code no function refers to goes too.
    async fn delete_function(&self, key: &str) -> Result<bool, StoreError>;

    /// A code archive by its reference (checked against its hash).
    async fn code(&self, code: &CodeRef) -> Result<Vec<u8>, StoreError>;

    /// Every function now, then every change, for as long as the receiver is kept.
    fn watch_functions(&self) -> mpsc::Receiver<Change<FunctionRecord>>;

    /// Publishes `me` as a member of `kind` under a lease of `ttl_ms` kept alive in the
    /// background.
    async fn join(
        &self,
        kind: MemberKind,
        me: &MemberRecord,
        ttl_ms: u64,
    ) -> Result<Box<dyn Membership>, StoreError>;

    /// Every member of `kind` now, then every change.
    fn watch_members(&self, kind: MemberKind) -> mpsc::Receiver<Change<MemberRecord>>;

    /// Stores a small shared document (an API key's record, a setting) of `kind` under `id`.
    async fn put_doc(
        &self,
        kind: &str,
        id: &str,
        doc: &serde_json::Value,
    ) -> Result<(), StoreError>;

    /// Stores `doc` unless a document of `kind` and `id` exists; returns the one stored (the
    /// first writer's, when several controllers start at once).
    async fn put_doc_if_absent(
        &self,
        kind: &str,
        id: &str,
        doc: &serde_json::Value,
    ) -> Result<serde_json::Value, StoreError>;

    /// Deletes a document; false when there was none.
    async fn delete_doc(&self, kind: &str, id: &str) -> Result<bool, StoreError>;

    /// Every document of `kind` now, then every change (a Delete carries the id).
    fn watch_docs(&self, kind: &str) -> mpsc::Receiver<Change<Doc>>;
}

/// A shared document and its id.
#[derive(Debug, Clone, PartialEq)]
pub struct Doc {
    pub id: String,
    pub value: serde_json::Value,
}

/// Which store a `--store` URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// `sqlite` (or none): the embedded default, in the data directory.
    Sqlite,
    /// `etcd://HOST:PORT[,HOST:PORT…]` (plain, held as `http://…`) or `etcds://…` (TLS, held
    /// as `https://…`): client endpoints, tried in turn.
    Etcd(Vec<String>),
}

impl StoreUrl {
    /// Parses a `--store` value; endpoints must be `host:port` (no credentials in the URL).
    pub fn parse(s: &str) -> Result<Self, StoreError> {
        let s = s.trim();
        if s.is_empty() || s == "sqlite" {
            return Ok(StoreUrl::Sqlite);
        }
        let (scheme, rest) = if let Some(rest) = s.strip_prefix("etcds://") {
            ("https", rest)
        } else if let Some(rest) = s.strip_prefix("etcd://") {
            ("http", rest)
        } else {
            return Err(StoreError::Config(
                "--store must be `sqlite`, `etcds://HOST:PORT[,HOST:PORT…]` (TLS) or \
                 `etcd://HOST:PORT[,…]` (plain)"
                    .into(),
            ));
        };
        let mut endpoints = Vec::new();
        for ep in rest.trim_end_matches('/').split(',') {
            let ep = ep.trim();
            let ok = !ep.is_empty()
                && !ep.contains(['@', '/', '?', '#', ' '])
                && ep
                    .rsplit_once(':')
                    .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
            if !ok {
                return Err(StoreError::Config(format!(
                    "etcd endpoint {ep:?} is not HOST:PORT"
                )));
            }
            endpoints.push(format!("{scheme}://{ep}"));
        }
        if endpoints.len() > 16 {
            return Err(StoreError::Config("at most 16 etcd endpoints".into()));
        }
        Ok(StoreUrl::Etcd(endpoints))
    }
}

impl StoreUrl {
    /// Whether the store is etcd without TLS on an address that is not loopback: anyone on
    /// that network could read the cluster's records and write its own.
    pub fn is_plain_remote(&self) -> bool {
        match self {
            StoreUrl::Sqlite => false,
            StoreUrl::Etcd(endpoints) => endpoints.iter().any(|e| {
                e.strip_prefix("http://")
                    .is_some_and(|hp| !endpoint_is_loopback(hp))
            }),
        }
    }

    /// Whether the store is etcd without TLS at all.
    pub fn is_plain_etcd(&self) -> bool {
        matches!(self, StoreUrl::Etcd(e) if e.iter().any(|e| e.starts_with("http://")))
    }
}

/// `HOST:PORT` on loopback: 127.0.0.0/8, `[::1]` or `localhost`.
fn endpoint_is_loopback(host_port: &str) -> bool {
    let Some((host, _)) = host_port.rsplit_once(':') else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The largest password file read (a password is a line).
pub const MAX_PASSWORD_FILE_BYTES: u64 = 4096;
/// The largest CA, certificate or key file read.
pub const MAX_PEM_FILE_BYTES: u64 = 1 << 20;

/// The `store_*` settings of a controller or worker: how it proves itself to etcd and checks
/// etcd. Files, not values, so that no secret is in argv, the environment or the config.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreAccess {
    /// `store_ca`: PEM of the CA that signed etcd's server certificate (for `etcds://`).
    pub ca: Option<std::path::PathBuf>,
    /// `store_cert` and `store_key`: PEM client certificate and key (etcd's
    /// `--client-cert-auth`).
    pub cert: Option<std::path::PathBuf>,
    pub key: Option<std::path::PathBuf>,
    /// `store_user`: the etcd user (etcd's `auth enable`); its password is in
    /// `store_password_file` (mode 0600 or stricter).
    pub user: Option<String>,
    pub password_file: Option<std::path::PathBuf>,
    /// `store_insecure`: the operator accepts a plain `etcd://` store on a non-loopback
    /// address (a loud warning at every start).
    pub insecure: bool,
}

impl StoreAccess {
    /// Checks the settings together with the store URL, without reading any file: TLS files
    /// only for `etcds://` (which needs `store_ca`), cert and key together, a user with its
    /// password file, and a plain remote etcd only with `store_insecure`.
    pub fn check(&self, url: &StoreUrl) -> Result<(), StoreError> {
        // Without etcd they are unused (a `--store` flag may still name one after the file
        // and the environment were checked).
        let StoreUrl::Etcd(endpoints) = url else {
            return Ok(());
        };
        let tls = endpoints.iter().any(|e| e.starts_with("https://"));
        if tls && self.ca.is_none() {
            return Err(StoreError::Config(
                "an etcds:// store needs store_ca (the CA that signed etcd's certificate)".into(),
            ));
        }
        if !tls && (self.ca.is_some() || self.cert.is_some() || self.key.is_some()) {
            return Err(StoreError::Config(
                "store_ca, store_cert and store_key need an etcds:// store".into(),
            ));
        }
        if self.cert.is_some() != self.key.is_some() {
            return Err(StoreError::Config(
                "store_cert and store_key go together".into(),
            ));
        }
        if self.user.is_some() != self.password_file.is_some() {
            return Err(StoreError::Config(
                "store_user and store_password_file go together".into(),
            ));
        }
        if let Some(user) = &self.user {
            if user.is_empty()
                || user.len() > 128
                || !user
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.:@".contains(&b))
            {
                return Err(StoreError::Config(
                    "store_user must be 1 to 128 letters, digits or `-_.:@`".into(),
                ));
            }
        }
        if url.is_plain_remote() && !self.insecure {
            return Err(StoreError::Config(
                "refusing a plain etcd:// store on a non-loopback address: anyone who reaches \
                 it reads the members, publishes fake workers and deletes or replays \
                 records. Use etcds:// with store_ca (and a user or client \
                 certificate), or set store_insecure = true (HEARTH_STORE_INSECURE=1) to \
                 accept the risk"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Logs what the operator should know about this store at start: a loud warning for a
    /// plain etcd (loopback or acknowledged), nothing for a TLS one.
    pub fn warn_at_start(&self, url: &StoreUrl) {
        if url.is_plain_remote() {
            tracing::error!(
                "INSECURE: the etcd store is plain etcd:// on the network (store_insecure is \
                 set): anyone who reaches it reads the members, publishes fake workers and \
                 deletes or replays records (functions, code, async records and keys stay \
                 sealed)"
            );
        } else if url.is_plain_etcd() {
            tracing::warn!(
                "the etcd store is plain etcd:// on loopback: fine for one machine, not for a \
                 cluster (use etcds:// with a user)"
            );
        }
        if matches!(url, StoreUrl::Etcd(_)) && self.user.is_none() && self.cert.is_none() {
            tracing::warn!("the etcd store is used without a user or client certificate");
        }
    }

    /// Reads the files the settings name. Errors name the setting and the cause, never a
    /// file's contents.
    pub async fn load(&self) -> Result<etcd::EtcdCredentials, StoreError> {
        let ca_pem = match &self.ca {
            Some(p) => Some(read_bounded("store_ca", p, MAX_PEM_FILE_BYTES, false).await?),
            None => None,
        };
        let identity = match (&self.cert, &self.key) {
            (Some(c), Some(k)) => Some((
                read_bounded("store_cert", c, MAX_PEM_FILE_BYTES, false).await?,
                read_bounded("store_key", k, MAX_PEM_FILE_BYTES, true).await?,
            )),
            _ => None,
        };
        for (what, pem) in [
            ("store_ca", &ca_pem),
            ("store_cert", &identity.as_ref().map(|i| i.0.clone())),
        ] {
            if let Some(pem) = pem {
                if !pem.windows(11).any(|w| w == b"-----BEGIN ") {
                    return Err(StoreError::Config(format!("{what} is not a PEM file")));
                }
            }
        }
        let user = match (&self.user, &self.password_file) {
            (Some(u), Some(p)) => {
                let raw =
                    read_bounded("store_password_file", p, MAX_PASSWORD_FILE_BYTES, true).await?;
                let text = String::from_utf8(raw).map_err(|_| {
                    StoreError::Config("store_password_file is not UTF-8 text".into())
                })?;
                let password = text.trim_end_matches(['\n', '\r']).to_string();
                if password.is_empty() || password.contains(['\n', '\r']) {
                    return Err(StoreError::Config(
                        "store_password_file must hold the password on one line".into(),
                    ));
                }
                Some((u.clone(), password))
            }
            _ => None,
        };
        Ok(etcd::EtcdCredentials {
            ca_pem,
            identity,
            user,
        })
    }
}

/// A file of at most `max` bytes; a `private` one (password, key) must not be readable or
/// writable by group or others.
async fn read_bounded(
    what: &str,
    path: &std::path::Path,
    max: u64,
    private: bool,
) -> Result<Vec<u8>, StoreError> {
    use std::os::unix::fs::PermissionsExt;
    let cannot = |e: std::io::Error| {
        StoreError::Config(format!(
            "cannot read {what} ({}): {}",
            path.display(),
            e.kind()
        ))
    };
    let meta = tokio::fs::metadata(path).await.map_err(cannot)?;
    if !meta.is_file() {
        return Err(StoreError::Config(format!(
            "{what} ({}) is not a file",
            path.display()
        )));
    }
    if meta.len() > max {
        return Err(StoreError::Config(format!(
            "{what} ({}) is larger than {max} bytes",
            path.display()
        )));
    }
    if private && meta.permissions().mode() & 0o077 != 0 {
        return Err(StoreError::Config(format!(
            "{what} ({}) is readable by group or others: chmod 600 it",
            path.display()
        )));
    }
    let bytes = tokio::fs::read(path).await.map_err(cannot)?;
    if bytes.len() as u64 > max {
        return Err(StoreError::Config(format!(
            "{what} ({}) is larger than {max} bytes",
            path.display()
        )));
    }
    Ok(bytes)
}

/// A shared handle to an async store.
pub type SharedAsyncStore = Arc<dyn AsyncStore>;

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Serde for bytes as standard base64.
mod b64 {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(s)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls() {
        assert_eq!(StoreUrl::parse("sqlite").unwrap(), StoreUrl::Sqlite);
        assert_eq!(
            StoreUrl::parse("etcd://127.0.0.1:2379,127.0.0.1:22379").unwrap(),
            StoreUrl::Etcd(vec![
                "http://127.0.0.1:2379".into(),
                "http://127.0.0.1:22379".into()
            ])
        );
        for bad in [
            "etcd://",
            "etcd://host",
            "etcd://u:p@h:1",
            "etcd://h:0",
            "etcd://h:99999",
            "redis://h:1",
        ] {
            assert!(StoreUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tls_store_urls() {
        assert_eq!(
            StoreUrl::parse("etcds://10.0.0.5:2379,etcd-2.internal:2379").unwrap(),
            StoreUrl::Etcd(vec![
                "https://10.0.0.5:2379".into(),
                "https://etcd-2.internal:2379".into()
            ])
        );
        for bad in ["etcds://", "etcds://u:p@h:1", "etcdss://h:1"] {
            assert!(StoreUrl::parse(bad).is_err(), "{bad}");
        }
    }

    fn access() -> StoreAccess {
        StoreAccess::default()
    }

    #[test]
    fn a_plain_etcd_on_the_network_needs_the_acknowledgement() {
        let remote = StoreUrl::parse("etcd://10.0.0.5:2379").unwrap();
        let e = access().check(&remote).unwrap_err().to_string();
        assert!(e.contains("store_insecure"), "{e}");
        // One remote endpoint among loopback ones is enough to refuse.
        let mixed = StoreUrl::parse("etcd://127.0.0.1:2379,etcd.internal:2379").unwrap();
        assert!(access().check(&mixed).is_err());
        let acknowledged = StoreAccess {
            insecure: true,
            ..access()
        };
        acknowledged.check(&remote).unwrap();
        for local in [
            "etcd://127.0.0.1:2379",
            "etcd://localhost:2379",
            "etcd://[::1]:2379",
            "etcd://127.0.0.2:2379",
        ] {
            access()
                .check(&StoreUrl::parse(local).unwrap())
                .unwrap_or_else(|e| panic!("{local}: {e}"));
        }
        // TLS: needs its CA, takes cert and key together and a user with its password file.
        let tls = StoreUrl::parse("etcds://10.0.0.5:2379").unwrap();
        assert!(access()
            .check(&tls)
            .unwrap_err()
            .to_string()
            .contains("store_ca"));
        let with_ca = StoreAccess {
            ca: Some("/etc/hearth/etcd-ca.pem".into()),
            ..access()
        };
        with_ca.check(&tls).unwrap();
        assert!(with_ca.check(&remote).is_err(), "a CA for a plain store");
        let half = StoreAccess {
            cert: Some("c.pem".into()),
            ..with_ca.clone()
        };
        assert!(half.check(&tls).is_err());
        let user_only = StoreAccess {
            user: Some("controller".into()),
            ..with_ca.clone()
        };
        assert!(user_only.check(&tls).is_err());
        let bad_user = StoreAccess {
            user: Some("a b".into()),
            password_file: Some("p".into()),
            ..with_ca.clone()
        };
        assert!(bad_user.check(&tls).is_err());
    }

    #[tokio::test]
    async fn password_files_must_be_private_and_are_never_echoed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "correct-horse\n").unwrap();
        std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o644)).unwrap();
        let a = StoreAccess {
            user: Some("controller".into()),
            password_file: Some(pw.clone()),
            ..StoreAccess::default()
        };
        let e = a.load().await.unwrap_err().to_string();
        assert!(
            e.contains("chmod 600") && !e.contains("correct-horse"),
            "{e}"
        );
        std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = a.load().await.unwrap();
        assert_eq!(
            c.user,
            Some(("controller".to_string(), "correct-horse".to_string()))
        );
        assert!(!format!("{c:?}").contains("correct-horse"));
        std::fs::write(&pw, "two\nlines\n").unwrap();
        let e = a.load().await.unwrap_err().to_string();
        assert!(e.contains("one line") && !e.contains("lines\n"), "{e}");
        // A CA that is not PEM is named, not echoed.
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "SECRET-NOT-PEM").unwrap();
        let a = StoreAccess {
            ca: Some(ca),
            ..StoreAccess::default()
        };
        let e = a.load().await.unwrap_err().to_string();
        assert!(e.contains("not a PEM") && !e.contains("SECRET"), "{e}");
    }

    #[test]
    fn failures_are_bounded() {
        let mut inv = StoredInvocation {
            id: "x".into(),
            function: "f".into(),
            owner: String::new(),
            args: b"{}".to_vec(),
            submitted_unix_ms: 1,
            attempts: 0,
            max_attempts: 3,
            state: AsyncState::Running,
            failures: vec![],
            idempotency_key: None,
            http_status: None,
            answer: None,
            finished_unix_ms: None,
        };
        for i in 0..20 {
            inv.note_failure(&format!("{i}{}", "y".repeat(2000)));
        }
        assert_eq!(inv.failures.len(), MAX_FAILURES_KEPT);
        assert!(inv
            .failures
            .iter()
            .all(|f| f.chars().count() <= MAX_FAILURE_CHARS));
        assert!(inv.failures[MAX_FAILURES_KEPT - 1].starts_with("19"));
        let round: StoredInvocation =
            serde_json::from_slice(&serde_json::to_vec(&inv).unwrap()).unwrap();
        assert_eq!(round, inv);
    }
}
