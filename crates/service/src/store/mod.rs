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
    /// `etcd://HOST:PORT[,HOST:PORT…]`: client endpoints, tried in turn.
    Etcd(Vec<String>),
}

impl StoreUrl {
    /// Parses a `--store` value; endpoints must be `host:port` (no credentials in the URL).
    pub fn parse(s: &str) -> Result<Self, StoreError> {
        let s = s.trim();
        if s.is_empty() || s == "sqlite" {
            return Ok(StoreUrl::Sqlite);
        }
        let Some(rest) = s.strip_prefix("etcd://") else {
            return Err(StoreError::Config(
                "--store must be `sqlite` or `etcd://HOST:PORT[,HOST:PORT…]`".into(),
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
            endpoints.push(format!("http://{ep}"));
        }
        if endpoints.len() > 16 {
            return Err(StoreError::Config("at most 16 etcd endpoints".into()));
        }
        Ok(StoreUrl::Etcd(endpoints))
    }
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
