//! The etcd-backed store: [`AsyncStore`] and [`ClusterState`] for several controllers.
//!
//! # Key layout (under the prefix `{p}`, e.g. `/hearth`)
//!
//! Values marked *sealed* are sealed with the cluster's key once the store has one
//! ([`EtcdStore::seal_with`], [`super::seal`]); the others hold nothing secret.
//!
//! | key | value | lease |
//! |-----|-------|-------|
//! | `{p}/inv/{id}` | [`StoredInvocation`] JSON, sealed | none while unfinished; the retention lease once final |
//! | `{p}/pending/{id}` | `""` while unfinished | none |
//! | `{p}/claims/{id}` | the claiming store's session id | that store's session lease |
//! | `{p}/idem/{sha256(function "\0" owner "\0" key)}` | the invocation id | none while unfinished; the retention lease once final |
//! | `{p}/inv-ns/{ns}/run/{id}` | `""` while unfinished | none |
//! | `{p}/inv-ns/{ns}/done/{finished ms:020}/{id}` | `"{bytes}"` or `"{bytes} {idem hash}"` once final | the record's retention lease |
//! | `{p}/inv-bytes/{ns}/{lease:016x}` | bytes of `ns`'s final records under that lease | that lease |
//! | `{p}/inv-total/{lease:016x}/{stripe}` | bytes of the final records under that lease of the namespaces in that stripe | that lease |
//! | `{p}/functions/{key}` | [`FunctionRecord`] JSON without `version` (read: the key's mod revision), sealed | none |
//! | `{p}/code/{sha256}/{index:04}` | chunk `index` of the code archive (≤ [`CODE_CHUNK_BYTES`]), sealed (an older version's in clear are read too: the SHA-256 checks them) | none |
//! | `{p}/code/{sha256}/meta` | `{"bytes":N,"chunks":M}`, written after every chunk | none |
//! | `{p}/members/workers/{name}` | [`MemberRecord`] JSON | the member's lease |
//! | `{p}/members/controllers/{name}` | [`MemberRecord`] JSON | the member's lease |
//! | `{p}/docs/{kind}/{id}` | a shared document's JSON, sealed unless `kind` is `config` (the cluster's settings, the cluster key's fingerprint) | none |
//!
//! # Invocations
//!
//! * `create` is one transaction: if the inv key and (when given) the idempotency key do not
//!   exist, it writes the record, the pending marker, the claim (session lease) and the
//!   idempotency key; otherwise it reads the idempotency key's target and returns it as
//!   [`Created::Existing`]. An idempotency key whose record is gone is taken over by a second
//!   transaction that checks the key's mod revision and the old record's absence.
//! * `finish` is one transaction guarded by "the pending key exists": it writes the final record
//!   under the retention lease, deletes the pending key and the claim, and moves the
//!   idempotency key (if it still names this id) to the retention lease. Exactly one finisher's
//!   transaction succeeds.
//! * The idempotency key gets its lease at finish, not at create, so that it cannot expire
//!   while the invocation still runs (a long run would otherwise allow a duplicate); it goes
//!   together with its record.
//! * Retention: finished records and their idempotency keys share one lease per reuse window
//!   (`clamp(retention / 10, 1 s, 60 s)`), granted with TTL = retention + window, so a record
//!   lives between `retention` and `retention + window` after it finished and etcd deletes it
//!   by itself. etcd 3.4 renews every lease's TTL on a leader change unless the cluster runs
//!   with `--experimental-enable-lease-checkpoint`, so [`AsyncStore::expire`] also deletes, in
//!   a bounded scan ([`MAX_SCAN`] records), finished records older than its cutoff.
//! * The session lease (TTL = `session_ttl_ms` rounded up to whole seconds; etcd may raise it
//!   to its minimum TTL, 1.5 × election timeout rounded up) is kept alive at TTL/3. Once etcd
//!   answers that it is gone (it was not kept alive past its TTL: etcd unreachable, the
//!   process frozen) a new one is granted: the claims under the old one are lost on purpose,
//!   and other controllers may take those invocations over as orphans. While etcd does not
//!   answer at all the old lease is kept trying (a new leader extends every lease).
//!   Membership leases work the same way, and re-publish the member under the new lease.
//!
//! # Bounds (issue 31 item 5)
//!
//! The same [`AsyncLimits`] as the SQLite store, with the same errors
//! ([`EtcdStore::with_async_limits`]); a record's bytes are its JSON before sealing.
//! * `create` first counts, in one read (two count-only ranges), the index keys of the
//!   namespace and of all: at `max_records` it is [`StoreError::Full`], at
//!   `max_records_per_namespace` [`StoreError::NamespaceFull`] (a repeated idempotency key
//!   still gets its first record). The count is exact (it is the keys themselves), but the
//!   check is not atomic with the write: controllers accepting at the same instant can
//!   overshoot a bound by the calls they accept concurrently, never more.
//! * `finish` reads, in one range each, the namespace's byte counters and the total ones,
//!   and adds its bytes to its own lease's counters in its transaction, guarded by their mod
//!   revisions (retried on conflict; a store's finishes in one stripe take turns locally, so
//!   conflicts come only from other controllers dropping records). Over
//!   `max_bytes_per_namespace` the namespace's own oldest final records go (its `done/`
//!   index, oldest first); then, over `max_bytes`, the oldest of the namespace holding the
//!   most, down to the next largest. Each drop is one transaction that deletes the record,
//!   its index and idempotency keys and takes its bytes off its lease's counters.
//! * Index keys and counters carry the record's retention lease, so records expiring by
//!   lease take their counts with them; `expire` deletes the index key and lowers the
//!   counters with the record. Records written before these keys existed are not counted
//!   (they go within one retention).
//!
//! # Failures
//!
//! Every unary request is tried for at most 2 s per attempt and retried (backoff 50 ms
//! doubling to 1 s) within 8 s on transport errors, timeouts and `Unavailable`: a write sent
//! to a follower whose leader just died is dropped by etcd and only ends at a timeout, so a
//! lost member costs about one attempt. Every operation is safe to repeat: `create` and
//! `take_orphans` recognise their own earlier attempt, `finish` after a retried attempt
//! reports success when the stored record is exactly the one it wrote.
//!
//! # Code and the races of content addressing
//!
//! `put_function` writes the chunks, then `meta`, checks that every chunk is there, and puts
//! the function record in a transaction guarded by `meta`'s mod revision. `delete_function`
//! deletes the record, then `meta`, then scans the function records; if none refers to the
//! code it deletes the chunks in a transaction guarded by "`meta` does not exist". A
//! concurrent put of the same code therefore either sees its guard fail (and writes the code
//! again) or makes the delete's guard fail; code referred to by a stored function is never
//! deleted. An interrupted delete can leave unreferenced chunks behind (a leak, not an error).
//!
//! Error messages never carry values (arguments, answers, code).

use super::seal::{self, Sealer};
use super::sqlite::AsyncLimits;
use super::{
    AsyncStore, Change, ClusterState, CodeRef, Created, DeadLetterFilter, Doc, FunctionRecord,
    MemberKind, MemberRecord, Membership, StoreError, StoredInvocation,
};
use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, Error as EtcdError, EventType,
    GetOptions, KeyValue, KvClient, LeaseClient, PutOptions, Txn, TxnOp, TxnOpResponse,
    WatchClient, WatchOptions,
};
use hearth_api::namespace::namespace_of;
use hearth_api::AsyncState;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

/// The largest invocation or function record (JSON) the store accepts; etcd refuses requests
/// over 1.5 MiB by default.
pub const MAX_RECORD_BYTES: usize = 1 << 20;
/// The largest code archive the store accepts.
pub const MAX_CODE_BYTES: usize = 64 << 20;
/// Code is stored in chunks of at most this many bytes (one request each).
pub const CODE_CHUNK_BYTES: usize = 512 << 10;
/// How long finished records are kept unless [`EtcdStore::with_retention`] says otherwise.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(3600);
/// Scans (`take_orphans`, `dead_letters`, `expire`, code references) look at most this many keys.
pub const MAX_SCAN: usize = 10_000;
/// How long connecting to an endpoint may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// The client's timeout on every request (streams: until their first answer). Unary requests
/// are also cut at 2 s per attempt and retried within 8 s (see the module doc).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Capacity of the channels [`ClusterState::watch_functions`] and `watch_members` return.
pub const WATCH_CHANNEL: usize = 1024;

/// Retries of one request stop after this long in all.
const RETRY_BUDGET: Duration = Duration::from_secs(8);
/// One attempt of a unary request. Shorter than [`REQUEST_TIMEOUT`] because a write sent to a
/// follower whose leader just died is dropped and would only end at the timeout; the retry
/// goes through the new leader. (Every operation here is safe to retry: see `finish`.) It
/// also bounds the wait of a balanced channel with no ready endpoint, which the request
/// timeout does not cover.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// Opening a stream (watch) or the client.
const OPEN_TIMEOUT: Duration = Duration::from_secs(6);
/// Records per page when a scan reads values (each up to [`MAX_RECORD_BYTES`]).
const VALUE_PAGE: i64 = 32;
/// Keys per page when a scan reads keys only.
const KEY_PAGE: i64 = 1000;
/// Responses can hold a page of large records.
const MAX_DECODE_BYTES: usize = 64 << 20;
/// How long `leave` and `close` wait for a revoke.
const REVOKE_WAIT: Duration = Duration::from_secs(2);

/// Why one etcd call failed (kept apart from [`StoreError`] to decide on retries).
#[derive(Debug)]
enum CallError {
    Etcd(EtcdError),
    TimedOut,
}

impl CallError {
    /// Errors that another attempt (maybe on another endpoint) can cure.
    fn retryable(&self) -> bool {
        use etcd_client::Error as E;
        match self {
            CallError::TimedOut => true,
            CallError::Etcd(E::TransportError(_) | E::IoError(_)) => true,
            CallError::Etcd(E::GRpcStatus(s)) => {
                use tonic::Code;
                matches!(
                    s.code(),
                    Code::Unavailable
                        | Code::Unknown
                        | Code::DeadlineExceeded
                        | Code::Cancelled
                        | Code::Aborted
                )
            }
            _ => false,
        }
    }

    fn lease_not_found(&self) -> bool {
        match self {
            CallError::Etcd(EtcdError::GRpcStatus(s)) => s.message().contains("lease not found"),
            CallError::Etcd(EtcdError::LeaseKeepAliveError(m)) => m.contains("not found"),
            _ => false,
        }
    }

    fn store(self, what: &str) -> StoreError {
        match self {
            CallError::TimedOut => StoreError::Unavailable(format!("{what}: etcd timed out")),
            CallError::Etcd(e) => StoreError::Unavailable(format!("{what}: {e}")),
        }
    }
}

/// The result of a call and whether it needed another attempt (its first may have been
/// applied without an answer).
struct Called<T> {
    value: T,
    retried: bool,
}

/// Runs `op` with a timeout, retrying retryable errors with backoff within [`RETRY_BUDGET`].
async fn call<C, T, F, Fut>(client: &C, op: F) -> Result<Called<T>, CallError>
where
    C: Clone,
    F: FnMut(C) -> Fut,
    Fut: Future<Output = Result<T, EtcdError>>,
{
    call_within(RETRY_BUDGET, client, op).await
}

/// [`call`] with its own retry budget.
async fn call_within<C, T, F, Fut>(
    budget: Duration,
    client: &C,
    mut op: F,
) -> Result<Called<T>, CallError>
where
    C: Clone,
    F: FnMut(C) -> Fut,
    Fut: Future<Output = Result<T, EtcdError>>,
{
    let started = Instant::now();
    let mut delay = Duration::from_millis(50);
    let mut retried = false;
    loop {
        let err = match tokio::time::timeout(ATTEMPT_TIMEOUT, op(client.clone())).await {
            Ok(Ok(value)) => return Ok(Called { value, retried }),
            Ok(Err(e)) => CallError::Etcd(e),
            Err(_) => CallError::TimedOut,
        };
        if !err.retryable() || started.elapsed() + delay > budget {
            return Err(err);
        }
        tracing::debug!(error = ?err, "etcd call failed; retrying");
        retried = true;
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(1));
    }
}

/// The end (exclusive) of the range of keys that start with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Whole seconds, rounded up, at least 1.
fn whole_secs(d: Duration) -> i64 {
    let ms = d.as_millis().max(1);
    ms.div_ceil(1000).min(i64::MAX as u128) as i64
}

/// A serde_json error without the input it quotes (values must not reach messages).
fn json_why(e: &serde_json::Error) -> String {
    format!(
        "{:?} error at line {} column {}",
        e.classify(),
        e.line(),
        e.column()
    )
}

/// Invocation ids: what this store writes into keys, nothing that could escape the layout.
fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Function keys and member names: one key segment, printable, no `/`.
fn valid_segment(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 256
        && s != "."
        && s != ".."
        && s.bytes().all(|b| b.is_ascii_graphic() && b != b'/')
}

/// The idempotency key's name: a hash of the function, the calling key and its key.
fn idem_hash(function: &str, owner: &str, idempotency_key: &str) -> String {
    let mut h = Sha256::new();
    h.update(function.as_bytes());
    h.update([0u8]);
    h.update(owner.as_bytes());
    h.update([0u8]);
    h.update(idempotency_key.as_bytes());
    format!("{:x}", h.finalize())
}

/// How many total-byte counters each retention lease has.
const STRIPES: usize = 8;

/// A namespace's stripe: the same on every controller (FNV-1a).
fn stripe(ns: &str) -> usize {
    let h = ns.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (h % STRIPES as u64) as usize
}

/// The namespace a record counts against, as one key segment.
fn ns_segment(function: &str) -> &str {
    let ns = namespace_of(function);
    if valid_segment(ns) {
        ns
    } else {
        "-"
    }
}

/// A byte counter's value (absent or unreadable: 0).
fn counter(kv: Option<&KeyValue>) -> u64 {
    kv.and_then(|kv| std::str::from_utf8(kv.value()).ok()?.parse().ok())
        .unwrap_or(0)
}

/// A finished record's index value: its bytes, and its idempotency key's hash if it has one.
fn index_value(bytes: usize, idem: Option<&str>) -> String {
    match idem {
        Some(h) => format!("{bytes} {h}"),
        None => bytes.to_string(),
    }
}

/// What a finished record's index key holds: (id, bytes, idempotency key hash).
fn parse_index(kv: &KeyValue) -> Option<(String, u64, Option<String>)> {
    let key = std::str::from_utf8(kv.key()).ok()?;
    let id = key.rsplit('/').next()?;
    let value = std::str::from_utf8(kv.value()).ok()?;
    let (bytes, idem) = match value.split_once(' ') {
        Some((b, h)) => (b, Some(h)),
        None => (value, None),
    };
    let idem = idem.filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    Some((
        valid_id(id).then(|| id.to_string())?,
        bytes.parse().ok()?,
        idem.map(str::to_string),
    ))
}

/// Puts `key = old - bytes` under `lease`, or deletes it at 0; nothing when it was absent.
fn counter_minus(key: String, old: Option<&KeyValue>, bytes: u64, lease: i64) -> Option<TxnOp> {
    let kv = old?;
    let left = counter(Some(kv)).saturating_sub(bytes);
    Some(if left == 0 {
        TxnOp::delete(key, None)
    } else {
        let opts = (lease != 0).then(|| PutOptions::new().with_lease(lease));
        TxnOp::put(key, left.to_string(), opts)
    })
}

/// The first key-value of the first two `Get`s in a transaction's responses.
fn two_gets(resp: &etcd_client::TxnResponse) -> [Option<KeyValue>; 2] {
    let mut out = [None, None];
    for (slot, r) in out.iter_mut().zip(resp.op_responses()) {
        if let TxnOpResponse::Get(g) = r {
            *slot = g.kvs().first().cloned();
        }
    }
    out
}

fn hex_sha256(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

fn encode_invocation(inv: &StoredInvocation) -> Result<Vec<u8>, StoreError> {
    if !valid_id(&inv.id) {
        return Err(StoreError::Config(
            "an invocation id must be 1 to 128 letters, digits, `-` or `_`".into(),
        ));
    }
    let json = serde_json::to_vec(inv).map_err(|e| StoreError::Corrupt {
        what: "invocation record",
        why: json_why(&e),
    })?;
    if json.len() > MAX_RECORD_BYTES {
        return Err(StoreError::TooLarge {
            what: "invocation record",
            bytes: json.len(),
            max: MAX_RECORD_BYTES,
        });
    }
    Ok(json)
}

/// The sealer a store and its watch tasks share: set once the controller has read its
/// cluster key ([`EtcdStore::seal_with`]); unset, values are written and read in clear.
type Sealing = Arc<OnceLock<Sealer>>;

/// How a watch turns a key's name and value into an item (None: skipped, with a warning).
type Decode<T> = Arc<dyn Fn(&str, &KeyValue) -> Option<T> + Send + Sync>;

/// `plain` as it is written under `etcd_key`: sealed when the store has a sealer.
fn seal_value(sealing: &Sealing, etcd_key: &str, plain: Vec<u8>) -> Result<Vec<u8>, StoreError> {
    match sealing.get() {
        Some(s) => s.seal(etcd_key, &plain),
        None => Ok(plain),
    }
}

/// The plain bytes of a stored value. With a sealer a value must be sealed (a clear one was
/// not written by a controller of this cluster); without one a sealed value is an error.
fn open_value(sealing: &Sealing, what: &'static str, kv: &KeyValue) -> Result<Vec<u8>, StoreError> {
    let key = std::str::from_utf8(kv.key()).map_err(|_| StoreError::Corrupt {
        what,
        why: "its key is not UTF-8".into(),
    })?;
    match sealing.get() {
        Some(s) => s.open(what, key, kv.value()),
        None if seal::is_sealed(kv.value()) => Err(StoreError::Corrupt {
            what,
            why: "it is sealed, and this process has no cluster key to open it".into(),
        }),
        None => Ok(kv.value().to_vec()),
    }
}

fn decode_invocation(sealing: &Sealing, kv: &KeyValue) -> Result<StoredInvocation, StoreError> {
    let bytes = open_value(sealing, "invocation record", kv)?;
    serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt {
        what: "invocation record",
        why: json_why(&e),
    })
}

/// The code's bookkeeping record, written after all its chunks.
#[derive(Debug, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
struct CodeMeta {
    bytes: u64,
    chunks: u64,
}

fn chunk_count(bytes: u64) -> u64 {
    bytes.div_ceil(CODE_CHUNK_BYTES as u64)
}

/// A lease kept alive by a background task, and what holders need to know about it.
struct LeaseState {
    id: AtomicI64,
    ttl: Duration,
    base: Instant,
    /// Milliseconds after `base` of the last confirmed grant or keep-alive.
    last_ok_ms: AtomicU64,
    alive: AtomicBool,
    /// Woken when a request found the lease gone: check now rather than at the next tick.
    poke: Notify,
}

impl LeaseState {
    fn new(id: i64, ttl_s: i64) -> Arc<LeaseState> {
        Arc::new(LeaseState {
            id: AtomicI64::new(id),
            ttl: Duration::from_secs(ttl_s.max(1) as u64),
            base: Instant::now(),
            last_ok_ms: AtomicU64::new(0),
            alive: AtomicBool::new(true),
            poke: Notify::new(),
        })
    }

    fn id(&self) -> i64 {
        self.id.load(Ordering::SeqCst)
    }

    fn mark_ok(&self) {
        self.last_ok_ms
            .store(self.base.elapsed().as_millis() as u64, Ordering::SeqCst);
    }

    fn since_ok(&self) -> Duration {
        let now = self.base.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_ok_ms.load(Ordering::SeqCst)))
    }

    /// Alive and confirmed within its TTL (a frozen process sees this turn false at once).
    fn fresh(&self) -> bool {
        self.alive.load(Ordering::SeqCst) && self.since_ok() < self.ttl
    }
}

/// Keeps `state`'s lease alive at TTL/3; once etcd says it is gone grants a new one, runs
/// `on_new` with it (a member re-puts its key) and goes on.
async fn keep_lease<F, Fut>(lease: LeaseClient, state: Arc<LeaseState>, what: String, on_new: F)
where
    F: Fn(i64) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), EtcdError>> + Send,
{
    let interval = (state.ttl / 3).max(Duration::from_millis(100));
    loop {
        keep_until_lost(&lease, &state, interval).await;
        state.alive.store(false, Ordering::SeqCst);
        tracing::warn!(lease = %what, "etcd lease lost; granting a new one");
        let mut backoff = Duration::from_millis(100);
        loop {
            let ttl_s = state.ttl.as_secs() as i64;
            match call(&lease, |mut l| async move { l.grant(ttl_s, None).await }).await {
                Ok(granted) => {
                    let id = granted.value.id();
                    match on_new(id).await {
                        Ok(()) => {
                            state.id.store(id, Ordering::SeqCst);
                            state.mark_ok();
                            state.alive.store(true, Ordering::SeqCst);
                            tracing::info!(lease = %what, "etcd lease granted again");
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(lease = %what, error = %e, "using a new etcd lease failed");
                            let mut l = lease.clone();
                            let _ = tokio::time::timeout(REVOKE_WAIT, l.revoke(id)).await;
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(lease = %what, error = ?e, "granting an etcd lease failed")
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }
}

/// Keeps the lease alive; returns once etcd answers that it is gone (expired or revoked).
///
/// While no answer comes (etcd unreachable, a leader election) it keeps trying rather than
/// giving the lease up by the local clock: a new leader extends every lease, and the lease
/// the holder still has is better than a new one. [`LeaseState::fresh`] meanwhile turns false
/// once the TTL passes unconfirmed.
async fn keep_until_lost(lease: &LeaseClient, state: &LeaseState, interval: Duration) {
    let id = state.id();
    let answer_wait = state.ttl.clamp(Duration::from_secs(1), REQUEST_TIMEOUT);
    loop {
        let mut l = lease.clone();
        let opened = tokio::time::timeout(REQUEST_TIMEOUT, l.keep_alive(id))
            .await
            .map_err(|_| CallError::TimedOut)
            .and_then(|r| r.map_err(CallError::Etcd));
        let (mut keeper, mut stream) = match opened {
            Ok(pair) => pair,
            Err(e) if e.lease_not_found() => return,
            Err(e) => {
                tracing::debug!(error = ?e, "etcd keep-alive stream failed; retrying");
                tokio::time::sleep(interval.min(Duration::from_millis(200))).await;
                continue;
            }
        };
        // The first answer (ttl > 0) came with opening the stream.
        state.mark_ok();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = state.poke.notified() => {}
            }
            if keeper.keep_alive().await.is_err() {
                break;
            }
            match tokio::time::timeout(answer_wait, stream.message()).await {
                Ok(Ok(Some(resp))) if resp.ttl() > 0 => state.mark_ok(),
                Ok(Ok(Some(_))) => return,
                _ => break,
            }
        }
    }
}

/// The etcd clients a store and its background tasks use.
#[derive(Clone)]
struct Conn {
    kv: KvClient,
    lease: LeaseClient,
    watch: WatchClient,
}

/// How a scan ended.
struct Scanned {
    /// The revision every page was read at.
    revision: i64,
    /// False when it stopped at its cap.
    complete: bool,
}

impl Conn {
    fn new(client: &Client) -> Conn {
        Conn {
            kv: client
                .kv_client()
                .max_decoding_message_size(MAX_DECODE_BYTES),
            lease: client.lease_client(),
            watch: client
                .watch_client()
                .max_decoding_message_size(MAX_DECODE_BYTES),
        }
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>, CallError> {
        let got = call(&self.kv, |mut kv| async move { kv.get(key, None).await }).await?;
        Ok(got.value.kvs().first().cloned())
    }

    async fn txn(&self, txn: Txn) -> Result<Called<etcd_client::TxnResponse>, CallError> {
        call(&self.kv, |mut kv| {
            let txn = txn.clone();
            async move { kv.txn(txn).await }
        })
        .await
    }

    /// Reads the keys under `prefix` page by page, all at one revision, calling `each` until
    /// it returns false or `cap` keys were read.
    async fn scan(
        &self,
        prefix: &str,
        keys_only: bool,
        cap: usize,
        mut each: impl FnMut(KeyValue) -> bool,
    ) -> Result<Scanned, CallError> {
        let end = prefix_end(prefix.as_bytes());
        let mut start = prefix.as_bytes().to_vec();
        let mut revision = 0;
        let mut seen = 0usize;
        let page = if keys_only { KEY_PAGE } else { VALUE_PAGE };
        loop {
            let want = (cap - seen).min(page as usize) as i64;
            let mut opts = GetOptions::new().with_range(end.clone()).with_limit(want);
            if keys_only {
                opts = opts.with_keys_only();
            }
            if revision > 0 {
                opts = opts.with_revision(revision);
            }
            let got = call(&self.kv, |mut kv| {
                let (start, opts) = (start.clone(), opts.clone());
                async move { kv.get(start, Some(opts)).await }
            })
            .await?;
            let mut resp = got.value;
            if revision == 0 {
                revision = resp.header().map_or(0, |h| h.revision());
            }
            let more = resp.more();
            let kvs = resp.take_kvs();
            let Some(last) = kvs.last() else {
                return Ok(Scanned {
                    revision,
                    complete: true,
                });
            };
            start = last.key().to_vec();
            start.push(0);
            for kv in kvs {
                seen += 1;
                if !each(kv) {
                    return Ok(Scanned {
                        revision,
                        complete: false,
                    });
                }
            }
            if !more {
                return Ok(Scanned {
                    revision,
                    complete: true,
                });
            }
            if seen >= cap {
                return Ok(Scanned {
                    revision,
                    complete: false,
                });
            }
        }
    }
}

/// The etcd-backed store (see the module doc for its key layout).
///
/// Dropping it (or [`EtcdStore::close`]) stops its session keep-alive and revokes the session
/// lease, so its unfinished invocations become orphans at once; watch tasks run on until
/// their receivers are dropped.
pub struct EtcdStore {
    conn: Conn,
    prefix: String,
    /// Written into claims: which store holds them.
    session_id: String,
    session: Arc<LeaseState>,
    session_task: JoinHandle<()>,
    closed: AtomicBool,
    retention_ms: AtomicU64,
    /// The shared retention lease: (id, granted at, for which retention).
    retention_lease: tokio::sync::Mutex<Option<(i64, Instant, Duration)>>,
    runtime: tokio::runtime::Handle,
    sealing: Sealing,
    /// The bounds on async records, shared and per namespace ([`EtcdStore::with_async_limits`]).
    limits: parking_lot::Mutex<AsyncLimits>,
    /// One per stripe ([`stripe`]): this store's finishes in one stripe write the same
    /// counters, so they take turns here instead of failing each other's compare in etcd.
    finish_turns: Vec<tokio::sync::Mutex<()>>,
}

/// How a client proves itself to etcd and checks etcd, beyond its endpoints: read from the
/// `store_*` settings by [`super::StoreAccess::load`]. Never printed (it holds a password).
#[derive(Clone, Default)]
pub struct EtcdCredentials {
    /// PEM of the CA etcd's server certificate must chain to (required for `etcds://`).
    pub ca_pem: Option<Vec<u8>>,
    /// PEM client certificate and key, for an etcd run with `--client-cert-auth`.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// An etcd user and its password, for an etcd with `auth enable`.
    pub user: Option<(String, String)>,
}

impl std::fmt::Debug for EtcdCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCredentials")
            .field("ca", &self.ca_pem.is_some())
            .field("client_cert", &self.identity.is_some())
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .finish()
    }
}

impl EtcdCredentials {
    /// `opts` with TLS (for `https://` endpoints) and the user added.
    pub fn apply(
        &self,
        mut opts: ConnectOptions,
        endpoints: &[String],
    ) -> Result<ConnectOptions, StoreError> {
        let https = endpoints
            .iter()
            .filter(|e| e.starts_with("https://"))
            .count();
        if https != 0 && https != endpoints.len() {
            return Err(StoreError::Config(
                "etcd endpoints must be all TLS or all plain".into(),
            ));
        }
        if https > 0 {
            let Some(ca) = &self.ca_pem else {
                return Err(StoreError::Config(
                    "an etcds:// store needs store_ca (the CA that signed etcd's certificate)"
                        .into(),
                ));
            };
            let mut tls = etcd_client::TlsOptions::new()
                .ca_certificate(etcd_client::Certificate::from_pem(ca));
            if let Some((cert, key)) = &self.identity {
                tls = tls.identity(etcd_client::Identity::from_pem(cert, key));
            }
            opts = opts.with_tls(tls);
        } else if self.identity.is_some() || self.ca_pem.is_some() {
            return Err(StoreError::Config(
                "store_ca, store_cert and store_key need an etcds:// store".into(),
            ));
        }
        if let Some((user, password)) = &self.user {
            opts = opts
                .with_user(user.clone(), password.clone())
                .with_auto_token_refresh(true);
        }
        Ok(opts)
    }
}

impl EtcdStore {
    /// Connects to `endpoints` (`http://HOST:PORT`, as [`super::StoreUrl::Etcd`] gives them)
    /// and grants this store's session lease (`session_ttl_ms` rounded up to whole seconds),
    /// kept alive in the background. Fails when no endpoint answers within the timeouts.
    pub async fn connect(
        endpoints: &[String],
        prefix: &str,
        session_ttl_ms: u64,
    ) -> Result<Arc<EtcdStore>, StoreError> {
        Self::connect_with(
            endpoints,
            prefix,
            session_ttl_ms,
            &EtcdCredentials::default(),
        )
        .await
    }

    /// [`EtcdStore::connect`] with TLS and a user (`https://` endpoints need
    /// `credentials.ca_pem`).
    pub async fn connect_with(
        endpoints: &[String],
        prefix: &str,
        session_ttl_ms: u64,
        credentials: &EtcdCredentials,
    ) -> Result<Arc<EtcdStore>, StoreError> {
        if endpoints.is_empty() {
            return Err(StoreError::Config("no etcd endpoints".into()));
        }
        let prefix = prefix.trim_end_matches('/');
        if prefix.is_empty() || prefix.len() > 256 || !prefix.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(StoreError::Config(
                "the etcd key prefix must be 1 to 256 printable characters, like /hearth".into(),
            ));
        }
        let opts = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout(REQUEST_TIMEOUT)
            // Detects dead connections under watch and keep-alive streams; etcd refuses
            // pings more often than every 5 s.
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            // A member cut off from the quorum fails requests (and cancels watches) instead
            // of serving stale data.
            .with_require_leader(true);
        let opts = credentials.apply(opts, endpoints)?;
        let client = tokio::time::timeout(OPEN_TIMEOUT, Client::connect(endpoints, Some(opts)))
            .await
            .map_err(|_| CallError::TimedOut)
            .and_then(|r| r.map_err(CallError::Etcd))
            .map_err(|e| e.store("connecting to etcd"))?;
        let conn = Conn::new(&client);
        let ttl_s = whole_secs(Duration::from_millis(session_ttl_ms));
        // The first request: it fails after about CONNECT_TIMEOUT when no endpoint answers.
        let granted = call_within(CONNECT_TIMEOUT, &conn.lease, |mut l| async move {
            l.grant(ttl_s, None).await
        })
        .await
        .map_err(|e| e.store("granting the etcd session lease"))?
        .value;
        let session = LeaseState::new(granted.id(), granted.ttl().max(ttl_s));
        session.mark_ok();
        let session_id = format!("{:032x}", rand::random::<u128>());
        let runtime = tokio::runtime::Handle::current();
        let session_task = runtime.spawn(keep_lease(
            conn.lease.clone(),
            session.clone(),
            format!("session {session_id}"),
            |_| async {
                tracing::warn!(
                    "claims held under the lost etcd session lease are released; other \
                     controllers may take those invocations over"
                );
                Ok(())
            },
        ));
        Ok(Arc::new(EtcdStore {
            conn,
            prefix: prefix.to_string(),
            session_id,
            session,
            session_task,
            closed: AtomicBool::new(false),
            retention_ms: AtomicU64::new(DEFAULT_RETENTION.as_millis() as u64),
            retention_lease: tokio::sync::Mutex::new(None),
            runtime,
            sealing: Arc::new(OnceLock::new()),
            limits: parking_lot::Mutex::new(AsyncLimits::global(usize::MAX, usize::MAX)),
            finish_turns: (0..STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
        }))
    }

    /// Seals, from now on, what carries secrets (function records, invocation records,
    /// shared documents other than the cluster's settings) with `sealer`, and opens only
    /// values sealed with it. Set once, before the first write; a second call fails.
    pub fn seal_with(&self, sealer: Sealer) -> Result<(), StoreError> {
        self.sealing
            .set(sealer)
            .map_err(|_| StoreError::Config("the store's sealing key is already set".into()))
    }

    /// Whether values are sealed ([`EtcdStore::seal_with`] was called).
    pub fn seals(&self) -> bool {
        self.sealing.get().is_some()
    }

    /// A code chunk as it is written under `key`: sealed (off the async threads: a chunk is
    /// up to [`CODE_CHUNK_BYTES`]) when the store has a sealer.
    async fn seal_chunk(&self, key: &str, chunk: &[u8]) -> Result<Vec<u8>, StoreError> {
        let Some(sealer) = self.sealing.get().cloned() else {
            return Ok(chunk.to_vec());
        };
        let (key, chunk) = (key.to_string(), chunk.to_vec());
        tokio::task::spawn_blocking(move || sealer.seal(&key, &chunk))
            .await
            .map_err(|_| StoreError::Unavailable("sealing code: the task failed".into()))?
    }

    /// The plain bytes of a sealed code chunk. Code chunks are the one kind of value also
    /// read in clear (an older version's): their SHA-256 is checked either way.
    async fn open_chunk(&self, kv: KeyValue) -> Result<Vec<u8>, StoreError> {
        let sealing = self.sealing.clone();
        tokio::task::spawn_blocking(move || open_value(&sealing, "code chunk", &kv))
            .await
            .map_err(|_| StoreError::Unavailable("opening code: the task failed".into()))?
    }

    /// Seals the records an older version wrote in clear (function records, invocation
    /// records, shared documents other than the cluster's settings, code chunks), each in a
    /// transaction
    /// guarded by its mod revision and under its lease; how many it sealed. Run by a
    /// controller at start, after [`EtcdStore::seal_with`]: without it an upgraded cluster
    /// would skip its own functions and keys as "not sealed". It trusts what is in clear
    /// at that moment, so run it (upgrade) while etcd is reachable only by the cluster.
    pub async fn seal_clear_records(&self) -> Result<usize, StoreError> {
        let Some(sealer) = self.sealing.get() else {
            return Err(StoreError::Config("the store has no sealing key".into()));
        };
        let unavailable = |e: CallError| e.store("sealing records written in clear");
        let clear_docs = format!("{}/docs/{CLEAR_DOC_KIND}/", self.prefix);
        let mut sealed = 0;
        for part in ["functions", "inv", "docs", "code"] {
            let mut clear = Vec::new();
            self.conn
                .scan(&self.key(part, ""), false, MAX_SCAN, |kv| {
                    // The cluster's settings and code's bookkeeping stay in clear.
                    let settings = kv.key().starts_with(clear_docs.as_bytes())
                        || (part == "code" && kv.key().ends_with(b"/meta"));
                    if !settings && !seal::is_sealed(kv.value()) {
                        clear.push(kv);
                    }
                    true
                })
                .await
                .map_err(unavailable)?;
            for kv in clear {
                let Ok(key) = std::str::from_utf8(kv.key()) else {
                    continue;
                };
                let value = if part == "code" {
                    self.seal_chunk(key, kv.value()).await?
                } else {
                    sealer.seal(key, kv.value())?
                };
                let opts = (kv.lease() != 0).then(|| PutOptions::new().with_lease(kv.lease()));
                let txn = Txn::new()
                    .when([Compare::mod_revision(
                        key,
                        CompareOp::Equal,
                        kv.mod_revision(),
                    )])
                    .and_then([TxnOp::put(key, value, opts)]);
                match self.conn.txn(txn).await {
                    Ok(done) if done.value.succeeded() => sealed += 1,
                    // Changed meanwhile (then written sealed) or its lease just ended.
                    Ok(_) => {}
                    Err(e) if e.lease_not_found() => {}
                    Err(e) => return Err(unavailable(e)),
                }
            }
        }
        Ok(sealed)
    }

    /// Keeps finished records (and their idempotency keys) for `retention` (at least 1 s)
    /// instead of [`DEFAULT_RETENTION`]; records finished from now on get it.
    pub fn with_retention(self: Arc<Self>, retention: Duration) -> Arc<Self> {
        let retention = retention
            .max(Duration::from_secs(1))
            .min(Duration::from_secs(365 * 24 * 3600));
        self.retention_ms
            .store(retention.as_millis() as u64, Ordering::SeqCst);
        self
    }

    /// Bounds the async records every controller on this etcd keeps, in all and per
    /// namespace, the same way the SQLite store does (each at least 1); unbounded otherwise.
    /// Every controller of a cluster should be given the same bounds.
    pub fn with_async_limits(self: Arc<Self>, limits: AsyncLimits) -> Arc<Self> {
        *self.limits.lock() = AsyncLimits {
            max_records: limits.max_records.max(1),
            max_bytes: limits.max_bytes.max(1),
            max_records_per_namespace: limits.max_records_per_namespace.max(1),
            max_bytes_per_namespace: limits.max_bytes_per_namespace.max(1),
        };
        self
    }

    /// How long finished records are kept.
    pub fn retention(&self) -> Duration {
        Duration::from_millis(self.retention_ms.load(Ordering::SeqCst))
    }

    /// The id this store writes into its claims.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// The key prefix, without a trailing `/`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether the session lease is held and was confirmed within its TTL.
    pub fn session_alive(&self) -> bool {
        self.session.fresh()
    }

    /// Stops the session keep-alive and revokes the session lease (waiting at most 2 s), so
    /// other controllers can take this store's unfinished invocations over at once. Creating
    /// or claiming through this store fails afterwards.
    pub async fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        self.session_task.abort();
        let id = self.session.id();
        self.session.alive.store(false, Ordering::SeqCst);
        let mut lease = self.conn.lease.clone();
        if let Err(e) = tokio::time::timeout(REVOKE_WAIT, lease.revoke(id)).await {
            tracing::warn!(error = %e, "revoking the etcd session lease timed out");
        }
    }

    fn key(&self, area: &str, name: &str) -> String {
        format!("{}/{area}/{name}", self.prefix)
    }

    /// Scoped to the function and the calling key (`owner`): another key's repeat of the same
    /// `Idempotency-Key` is a call of its own (issue 31 item 10).
    fn idem_key(&self, function: &str, owner: &str, idempotency_key: &str) -> String {
        self.key("idem", &idem_hash(function, owner, idempotency_key))
    }

    /// Where a namespace's index keys live: `run/{id}` while unfinished, then
    /// `done/{finished ms, 20 digits}/{id}` (so a range read gives the oldest first).
    fn ns_index(&self, ns: &str) -> String {
        format!("{}/inv-ns/{ns}/", self.prefix)
    }

    fn run_key(&self, ns: &str, id: &str) -> String {
        format!("{}/inv-ns/{ns}/run/{id}", self.prefix)
    }

    fn done_key(&self, ns: &str, finished_ms: u64, id: &str) -> String {
        format!("{}/inv-ns/{ns}/done/{finished_ms:020}/{id}", self.prefix)
    }

    /// The bytes of `ns`'s finished records under one retention lease (carrying that lease).
    fn ns_bytes_key(&self, ns: &str, lease: i64) -> String {
        format!("{}/inv-bytes/{ns}/{lease:016x}", self.prefix)
    }

    /// The bytes of all finished records under one retention lease whose namespace falls
    /// in `ns`'s stripe (carrying that lease): striped so that finishes in different
    /// namespaces seldom write the same counter.
    fn total_bytes_key(&self, ns: &str, lease: i64) -> String {
        format!("{}/inv-total/{lease:016x}/{}", self.prefix, stripe(ns))
    }

    fn members_prefix(&self, kind: MemberKind) -> String {
        let area = match kind {
            MemberKind::Worker => "workers",
            MemberKind::Controller => "controllers",
        };
        format!("{}/members/{area}/", self.prefix)
    }

    fn code_key(&self, sha: &str, chunk: u64) -> String {
        format!("{}/code/{sha}/{chunk:04}", self.prefix)
    }

    fn code_meta_key(&self, sha: &str) -> String {
        format!("{}/code/{sha}/meta", self.prefix)
    }

    /// The retention lease shared by the records finished within one reuse window.
    async fn retention_lease(&self) -> Result<i64, StoreError> {
        let retention = self.retention();
        let window = (retention / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
        let mut cached = self.retention_lease.lock().await;
        if let Some((id, at, for_retention)) = *cached {
            if at.elapsed() < window && for_retention == retention {
                return Ok(id);
            }
        }
        let ttl_s = whole_secs(retention + window);
        let granted = call(&self.conn.lease, |mut l| async move {
            l.grant(ttl_s, None).await
        })
        .await
        .map_err(|e| e.store("granting a retention lease"))?
        .value;
        *cached = Some((granted.id(), Instant::now(), retention));
        Ok(granted.id())
    }

    async fn forget_retention_lease(&self, id: i64) {
        let mut cached = self.retention_lease.lock().await;
        if cached.is_some_and(|(cached_id, _, _)| cached_id == id) {
            *cached = None;
        }
    }

    async fn read_invocation(&self, id: &str) -> Result<Option<StoredInvocation>, StoreError> {
        let kv = self
            .conn
            .get(&self.key("inv", id))
            .await
            .map_err(|e| e.store("reading an invocation"))?;
        kv.map(|kv| decode_invocation(&self.sealing, &kv))
            .transpose()
    }

    /// Makes sure the code `sha` is stored completely; returns `meta`'s mod revision, which
    /// the function record's transaction checks (see the module doc).
    async fn ensure_code(&self, sha: &str, code: &[u8]) -> Result<i64, StoreError> {
        let chunks = chunk_count(code.len() as u64);
        let meta_key = self.code_meta_key(sha);
        let want = CodeMeta {
            bytes: code.len() as u64,
            chunks,
        };
        let unavailable = |e: CallError| e.store("storing code");
        let existing = self.conn.get(&meta_key).await.map_err(unavailable)?;
        let meta_rev = match existing {
            Some(kv) if serde_json::from_slice::<CodeMeta>(kv.value()).ok() == Some(want) => {
                kv.mod_revision()
            }
            _ => {
                for (i, chunk) in code.chunks(CODE_CHUNK_BYTES).enumerate() {
                    let key = self.code_key(sha, i as u64);
                    let chunk = self.seal_chunk(&key, chunk).await?;
                    call(&self.conn.kv, |mut kv| {
                        let (key, chunk) = (key.clone(), chunk.clone());
                        async move { kv.put(key, chunk, None).await }
                    })
                    .await
                    .map_err(unavailable)?;
                }
                let meta = serde_json::to_vec(&CodeMeta {
                    bytes: code.len() as u64,
                    chunks,
                })
                .map_err(|e| StoreError::Corrupt {
                    what: "code meta",
                    why: json_why(&e),
                })?;
                let put = call(&self.conn.kv, |mut kv| {
                    let (key, meta) = (meta_key.clone(), meta.clone());
                    async move { kv.put(key, meta, None).await }
                })
                .await
                .map_err(unavailable)?;
                put.value.header().map_or(0, |h| h.revision())
            }
        };
        // Every chunk must be there after `meta` was (re)written or read: a delete that
        // removed them before then is caught here, one after then changes `meta`.
        let start = self.code_key(sha, 0);
        let end = format!("{}/code/{sha}/:", self.prefix);
        let counted = call(&self.conn.kv, |mut kv| {
            let (start, end) = (start.clone(), end.clone());
            async move {
                kv.get(
                    start,
                    Some(GetOptions::new().with_range(end).with_count_only()),
                )
                .await
            }
        })
        .await
        .map_err(unavailable)?;
        if counted.value.count() as u64 != chunks {
            // Make the next attempt rewrite the chunks.
            let key = meta_key.clone();
            call(&self.conn.kv, |mut kv| {
                let key = key.clone();
                async move { kv.delete(key, None).await }
            })
            .await
            .map_err(unavailable)?;
            return Ok(0);
        }
        Ok(meta_rev)
    }

    /// Deletes the code `sha` unless a function record refers to it (see the module doc).
    async fn collect_code(&self, sha: &str) -> Result<(), StoreError> {
        let unavailable = |e: CallError| e.store("deleting unreferenced code");
        let meta_key = self.code_meta_key(sha);
        call(&self.conn.kv, |mut kv| {
            let key = meta_key.clone();
            async move { kv.delete(key, None).await }
        })
        .await
        .map_err(unavailable)?;
        let mut referenced = false;
        let scanned = self
            .conn
            .scan(&self.key("functions", ""), false, MAX_SCAN, |kv| {
                let refers = read_function(&self.sealing, &kv)
                    .map(|f| f.code.is_some_and(|c| c.sha256 == sha))
                    // Unreadable: keep the code rather than guess.
                    .unwrap_or(true);
                referenced |= refers;
                !refers
            })
            .await
            .map_err(unavailable)?;
        if referenced || !scanned.complete {
            return Ok(());
        }
        let txn = Txn::new()
            .when([Compare::create_revision(
                meta_key.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then([TxnOp::delete(
                self.code_key(sha, 0),
                Some(DeleteOptions::new().with_range(format!("{}/code/{sha}/:", self.prefix))),
            )]);
        self.conn.txn(txn).await.map_err(unavailable)?;
        Ok(())
    }

    /// Claims the unclaimed, unfinished invocation `id` for this store's session; its record
    /// (None when the record is missing) or None when someone else was first.
    async fn claim(&self, id: &str) -> Result<Option<Option<KeyValue>>, StoreError> {
        let unavailable = |e: CallError| e.store("claiming an orphaned invocation");
        let claim_key = self.key("claims", id);
        let inv_key = self.key("inv", id);
        for _ in 0..2 {
            let session = self.session.id();
            let txn = Txn::new()
                .when([
                    Compare::create_revision(claim_key.clone(), CompareOp::Equal, 0),
                    Compare::create_revision(self.key("pending", id), CompareOp::Greater, 0),
                ])
                .and_then([
                    TxnOp::put(
                        claim_key.clone(),
                        self.session_id.clone(),
                        Some(PutOptions::new().with_lease(session)),
                    ),
                    TxnOp::get(inv_key.clone(), None),
                ])
                .or_else([
                    TxnOp::get(claim_key.clone(), None),
                    TxnOp::get(inv_key.clone(), None),
                ]);
            let done = match self.conn.txn(txn).await {
                Ok(done) => done,
                Err(e) if e.lease_not_found() => {
                    if self.await_new_session(session).await {
                        continue;
                    }
                    return Err(e.store("claiming an orphan (session lease lost)"));
                }
                Err(e) => return Err(unavailable(e)),
            };
            let gets: Vec<Option<KeyValue>> = done
                .value
                .op_responses()
                .into_iter()
                .filter_map(|r| match r {
                    TxnOpResponse::Get(g) => Some(g.kvs().first().cloned()),
                    _ => None,
                })
                .collect();
            let ours = done.value.succeeded()
                || (done.retried
                    && gets
                        .first()
                        .and_then(|c| c.as_ref())
                        .is_some_and(|c| c.value() == self.session_id.as_bytes()));
            // The record is the last get either way; a retried attempt that found our own
            // claim means the first attempt was applied.
            return Ok(ours.then(|| gets.into_iter().last().flatten()));
        }
        Err(StoreError::Unavailable(
            "claiming an orphaned invocation: the session lease kept vanishing".into(),
        ))
    }

    /// After a request found the session lease gone: wakes the keep-alive task and waits (at
    /// most 3 s) for the new lease. False when none came or the store is closed.
    async fn await_new_session(&self, lost: i64) -> bool {
        if self.closed.load(Ordering::SeqCst) {
            return false;
        }
        self.session.poke.notify_one();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(3) {
            if self.session.id() != lost && self.session.alive.load(Ordering::SeqCst) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    fn spawn_watch<T: Send + 'static>(
        &self,
        prefix: String,
        decode: Decode<T>,
    ) -> mpsc::Receiver<Change<T>> {
        let (tx, rx) = mpsc::channel(WATCH_CHANNEL);
        self.runtime
            .spawn(watch_loop(self.conn.clone(), prefix, decode, tx));
        rx
    }
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        self.session_task.abort();
        if !self.closed.swap(true, Ordering::SeqCst) {
            let id = self.session.id();
            let mut lease = self.conn.lease.clone();
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    let _ = tokio::time::timeout(REVOKE_WAIT, lease.revoke(id)).await;
                });
            }
        }
    }
}

/// Why one round of a watch ended.
enum WatchEnd {
    ReceiverGone,
    Failed(String),
}

/// Snapshot, then changes; after any failure a fresh snapshot, with backoff (100 ms doubling
/// to 2 s). Ends when the receiver is dropped.
async fn watch_loop<T: Send + 'static>(
    conn: Conn,
    prefix: String,
    decode: Decode<T>,
    tx: mpsc::Sender<Change<T>>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match watch_once(&conn, &prefix, &decode, &tx, &mut backoff).await {
            WatchEnd::ReceiverGone => return,
            WatchEnd::Failed(why) => {
                tracing::debug!(prefix = %prefix, why = %why, "etcd watch restarts")
            }
        }
        tokio::select! {
            _ = tx.closed() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

async fn watch_once<T>(
    conn: &Conn,
    prefix: &str,
    decode: &Decode<T>,
    tx: &mpsc::Sender<Change<T>>,
    backoff: &mut Duration,
) -> WatchEnd {
    if tx.is_closed() {
        return WatchEnd::ReceiverGone;
    }
    let name_of = |kv: &KeyValue| -> Option<String> {
        let key = std::str::from_utf8(kv.key()).ok()?;
        Some(key.strip_prefix(prefix)?.to_string())
    };
    let mut items = Vec::new();
    let scanned = match conn
        .scan(prefix, false, usize::MAX, |kv| {
            if let Some(item) = name_of(&kv).and_then(|name| decode(&name, &kv)) {
                items.push(item);
            }
            true
        })
        .await
    {
        Ok(s) => s,
        Err(e) => return WatchEnd::Failed(format!("snapshot: {e:?}")),
    };
    if tx.send(Change::Snapshot(items)).await.is_err() {
        return WatchEnd::ReceiverGone;
    }
    *backoff = Duration::from_millis(100);
    let opts = WatchOptions::new()
        .with_prefix()
        .with_start_revision(scanned.revision + 1);
    let mut watch = conn.watch.clone();
    let opened = tokio::time::timeout(OPEN_TIMEOUT, watch.watch(prefix, Some(opts))).await;
    let mut stream = match opened {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return WatchEnd::Failed(format!("watch: {e}")),
        Err(_) => return WatchEnd::Failed("watch: timed out".into()),
    };
    loop {
        let msg = tokio::select! {
            _ = tx.closed() => return WatchEnd::ReceiverGone,
            m = stream.message() => m,
        };
        let resp = match msg {
            Ok(Some(resp)) => resp,
            Ok(None) => return WatchEnd::Failed("watch stream ended".into()),
            Err(e) => return WatchEnd::Failed(format!("watch: {e}")),
        };
        if resp.canceled() || resp.compact_revision() > 0 {
            return WatchEnd::Failed(format!(
                "watch canceled (compacted at {}): {}",
                resp.compact_revision(),
                resp.cancel_reason()
            ));
        }
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            let Some(name) = name_of(kv) else { continue };
            let change = match ev.event_type() {
                EventType::Put => match decode(&name, kv) {
                    Some(item) => Change::Put(item),
                    None => continue,
                },
                EventType::Delete => Change::Delete(name),
            };
            if tx.send(change).await.is_err() {
                return WatchEnd::ReceiverGone;
            }
        }
    }
}

/// A function record as stored: JSON without its version (the key's revision is).
fn encode_function(record: &FunctionRecord) -> Result<Vec<u8>, StoreError> {
    let corrupt = |e: serde_json::Error| StoreError::Corrupt {
        what: "function record",
        why: json_why(&e),
    };
    let mut stored = serde_json::to_value(record).map_err(corrupt)?;
    if let Some(map) = stored.as_object_mut() {
        map.remove("version");
    }
    let json = serde_json::to_vec(&stored).map_err(corrupt)?;
    if json.len() > MAX_RECORD_BYTES {
        return Err(StoreError::TooLarge {
            what: "function record",
            bytes: json.len(),
            max: MAX_RECORD_BYTES,
        });
    }
    Ok(json)
}

/// A stored function record (opened when sealed), without its key and version.
fn read_function(sealing: &Sealing, kv: &KeyValue) -> Result<FunctionRecord, StoreError> {
    let bytes = open_value(sealing, "function record", kv)?;
    serde_json::from_slice::<FunctionRecord>(&bytes).map_err(|e| StoreError::Corrupt {
        what: "function record",
        why: json_why(&e),
    })
}

fn decode_function(sealing: &Sealing, name: &str, kv: &KeyValue) -> Option<FunctionRecord> {
    match read_function(sealing, kv) {
        Ok(mut f) => {
            f.key = name.to_string();
            f.version = kv.mod_revision().max(0) as u64;
            Some(f)
        }
        Err(e) => {
            tracing::warn!(function = %name, error = %e, "skipping an unreadable function record");
            None
        }
    }
}

fn decode_member(name: &str, kv: &KeyValue) -> Option<MemberRecord> {
    match serde_json::from_slice::<MemberRecord>(kv.value()) {
        Ok(m) => Some(m),
        Err(e) => {
            tracing::warn!(member = %name, why = %json_why(&e), "skipping an unreadable member record");
            None
        }
    }
}

/// Async records' bounds (see the module doc, "Bounds").
impl EtcdStore {
    fn limits(&self) -> AsyncLimits {
        *self.limits.lock()
    }

    /// Before a new record of `ns`: refuses it when the store or the namespace holds its
    /// limit of records, unless its idempotency key names a stored record (then that one).
    /// One read (two count-only ranges); None: go ahead.
    async fn check_room(
        &self,
        ns: &str,
        idem_key: Option<&str>,
        limits: AsyncLimits,
    ) -> Result<Option<Created>, StoreError> {
        let count = || Some(GetOptions::new().with_prefix().with_count_only());
        let mut reads = vec![
            TxnOp::get(self.ns_index(ns), count()),
            TxnOp::get(self.key("inv-ns", ""), count()),
        ];
        if let Some(ik) = idem_key {
            reads.push(TxnOp::get(ik, None));
        }
        let read = self
            .conn
            .txn(Txn::new().and_then(reads))
            .await
            .map_err(|e| e.store("counting async records"))?
            .value;
        let mut held = [0usize; 2];
        let mut idem_target = None;
        for (i, r) in read.op_responses().into_iter().enumerate() {
            if let TxnOpResponse::Get(g) = r {
                match i {
                    0 | 1 => held[i] = g.count().max(0) as usize,
                    _ => idem_target = g.kvs().first().map(|kv| kv.value().to_vec()),
                }
            }
        }
        let refused = if held[1] >= limits.max_records {
            StoreError::Full(limits.max_records)
        } else if held[0] >= limits.max_records_per_namespace {
            StoreError::NamespaceFull {
                namespace: ns.to_string(),
                what: "records",
                setting: "async_max_records_per_namespace",
                max: limits.max_records_per_namespace,
            }
        } else {
            return Ok(None);
        };
        // A repeat of a stored call is answered with the first one, as below the bound.
        if let Some(target) = idem_target.and_then(|t| String::from_utf8(t).ok()) {
            if valid_id(&target) {
                if let Some(first) = self.read_invocation(&target).await? {
                    return Ok(Some(Created::Existing(Box::new(first))));
                }
            }
        }
        Err(refused)
    }

    /// Keeps finished records under both byte bounds after `ns` finished one, as the SQLite
    /// store does: `ns`'s own oldest go until it fits its share, then, while all are over
    /// the shared bound, the oldest of whichever namespace holds the most (never below the
    /// next largest). How many went.
    async fn make_room(
        &self,
        ns: &str,
        ns_bytes: u64,
        total: u64,
        limits: AsyncLimits,
    ) -> Result<usize, StoreError> {
        let mut dropped = 0;
        let mut total = total;
        let per_ns = limits.max_bytes_per_namespace as u64;
        if ns_bytes > per_ns {
            let (n, went) = self
                .drop_oldest(ns, ns_bytes - per_ns, "async_max_bytes_per_namespace")
                .await?;
            dropped += n;
            total = total.saturating_sub(went);
        }
        let max = limits.max_bytes as u64;
        // Bounded: each round drops at least one record or stops.
        for _ in 0..64 {
            if total <= max {
                break;
            }
            let held = self.bytes_per_namespace().await?;
            total = held.values().sum();
            if total <= max {
                break;
            }
            let Some((largest, most)) = held
                .iter()
                .max_by_key(|(_, b)| **b)
                .map(|(n, b)| (n.clone(), *b))
            else {
                break;
            };
            let next = held
                .iter()
                .filter(|(n, _)| **n != largest)
                .map(|(_, b)| *b)
                .max()
                .unwrap_or(0);
            let share = (most - next).max(1);
            let (n, went) = self
                .drop_oldest(&largest, (total - max).min(share), "async_max_bytes")
                .await?;
            if n == 0 {
                break;
            }
            dropped += n;
            total = total.saturating_sub(went);
        }
        Ok(dropped)
    }

    /// The bytes of finished records each namespace holds (a read of the byte counters: a
    /// few per namespace, at most [`MAX_SCAN`] in all). Only when over the shared bound.
    async fn bytes_per_namespace(&self) -> Result<HashMap<String, u64>, StoreError> {
        let prefix = self.key("inv-bytes", "");
        let mut held: HashMap<String, u64> = HashMap::new();
        self.conn
            .scan(&prefix, false, MAX_SCAN, |kv| {
                let key = String::from_utf8_lossy(kv.key());
                if let Some((ns, _)) = key
                    .strip_prefix(prefix.as_str())
                    .and_then(|r| r.split_once('/'))
                {
                    *held.entry(ns.to_string()).or_default() += counter(Some(&kv));
                }
                true
            })
            .await
            .map_err(|e| e.store("reading async byte counters"))?;
        held.retain(|_, b| *b > 0);
        Ok(held)
    }

    /// Drops `ns`'s oldest finished records until at least `over` bytes went (records
    /// another controller dropped meanwhile count as gone). (dropped, bytes gone).
    async fn drop_oldest(
        &self,
        ns: &str,
        over: u64,
        bound: &str,
    ) -> Result<(usize, u64), StoreError> {
        let mut dropped = 0;
        let mut went = 0u64;
        let prefix = format!("{}done/", self.ns_index(ns));
        let mut victims = Vec::new();
        self.conn
            .scan(&prefix, false, MAX_SCAN, |kv| {
                let bytes = parse_index(&kv).map_or(0, |(_, b, _)| b);
                victims.push(kv);
                went += bytes;
                went < over
            })
            .await
            .map_err(|e| e.store("finding a namespace's oldest async results"))?;
        went = 0;
        for kv in victims {
            let Some((id, bytes, idem)) = parse_index(&kv) else {
                continue;
            };
            let index_key = String::from_utf8_lossy(kv.key()).into_owned();
            let guard = vec![Compare::mod_revision(
                index_key.clone(),
                CompareOp::Equal,
                kv.mod_revision(),
            )];
            if self
                .remove_finished(
                    ns,
                    &id,
                    &index_key,
                    bytes,
                    idem.as_deref(),
                    kv.lease(),
                    guard,
                )
                .await?
            {
                dropped += 1;
                tracing::debug!(id = %id, namespace = %ns, bound, "async result dropped early to stay under a bound");
            }
            went += bytes;
        }
        Ok((dropped, went))
    }

    /// Deletes a finished record, its index key and (if it still names it) its idempotency
    /// key, and takes its bytes off the counters of its lease, in one transaction guarded by
    /// `guard` and the counters' revisions (retried while only the counters changed).
    /// False when `guard` failed or the lease (and so the record) is gone.
    #[allow(clippy::too_many_arguments)]
    async fn remove_finished(
        &self,
        ns: &str,
        id: &str,
        index_key: &str,
        bytes: u64,
        idem: Option<&str>,
        lease: i64,
        guard: Vec<Compare>,
    ) -> Result<bool, StoreError> {
        let unavailable = |e: CallError| e.store("dropping an async result");
        let (nk, tk) = (
            self.ns_bytes_key(ns, lease),
            self.total_bytes_key(ns, lease),
        );
        let read =
            || Txn::new().and_then([TxnOp::get(nk.clone(), None), TxnOp::get(tk.clone(), None)]);
        let mut seen = two_gets(&self.conn.txn(read()).await.map_err(unavailable)?.value);
        for _ in 0..16 {
            let (n, t) = (seen[0].as_ref(), seen[1].as_ref());
            let rev = |kv: Option<&KeyValue>| kv.map_or(0, |kv| kv.mod_revision());
            let mut when = guard.clone();
            when.push(Compare::mod_revision(nk.clone(), CompareOp::Equal, rev(n)));
            when.push(Compare::mod_revision(tk.clone(), CompareOp::Equal, rev(t)));
            let mut then = vec![
                TxnOp::delete(self.key("inv", id), None),
                TxnOp::delete(index_key, None),
            ];
            then.extend(counter_minus(nk.clone(), n, bytes, lease));
            then.extend(counter_minus(tk.clone(), t, bytes, lease));
            if let Some(h) = idem {
                let ik = self.key("idem", h);
                then.push(TxnOp::txn(
                    Txn::new()
                        .when([Compare::value(ik.clone(), CompareOp::Equal, id)])
                        .and_then([TxnOp::delete(ik, None)]),
                ));
            }
            let txn = Txn::new()
                .when(when)
                .and_then(then)
                .or_else([TxnOp::get(nk.clone(), None), TxnOp::get(tk.clone(), None)]);
            let done = match self.conn.txn(txn).await {
                Ok(done) => done,
                Err(e) if e.lease_not_found() => return Ok(false),
                Err(e) => return Err(unavailable(e)),
            };
            if done.value.succeeded() {
                return Ok(true);
            }
            let now = two_gets(&done.value);
            let same = |a: &Option<KeyValue>, b: &Option<KeyValue>| {
                a.as_ref().map(|kv| kv.mod_revision()) == b.as_ref().map(|kv| kv.mod_revision())
            };
            if same(&now[0], &seen[0]) && same(&now[1], &seen[1]) {
                // The counters did not change: the guard failed.
                return Ok(false);
            }
            seen = now;
        }
        Err(StoreError::Unavailable(
            "dropping an async result: its byte counters kept changing".into(),
        ))
    }
}

#[async_trait]
impl AsyncStore for EtcdStore {
    async fn create(&self, inv: &StoredInvocation) -> Result<Created, StoreError> {
        let json = encode_invocation(inv)?;
        let id = inv.id.as_str();
        let inv_key = self.key("inv", id);
        let json = seal_value(&self.sealing, &inv_key, json)?;
        let idem_key = inv
            .idempotency_key
            .as_deref()
            .map(|k| self.idem_key(&inv.function, &inv.owner, k));
        let ns = ns_segment(&inv.function);
        let limits = self.limits();
        if limits.max_records < usize::MAX || limits.max_records_per_namespace < usize::MAX {
            if let Some(first) = self.check_room(ns, idem_key.as_deref(), limits).await? {
                return Ok(first);
            }
        }
        // Set when the idempotency key names a record that is gone: (its mod revision, id).
        let mut take_over: Option<(i64, String)> = None;
        for _ in 0..4 {
            let session = self.session.id();
            let mut when = vec![Compare::create_revision(
                inv_key.clone(),
                CompareOp::Equal,
                0,
            )];
            let mut then = vec![
                TxnOp::put(inv_key.clone(), json.clone(), None),
                TxnOp::put(self.key("pending", id), "", None),
                TxnOp::put(self.run_key(ns, id), "", None),
                TxnOp::put(
                    self.key("claims", id),
                    self.session_id.clone(),
                    Some(PutOptions::new().with_lease(session)),
                ),
            ];
            let mut otherwise = vec![TxnOp::get(inv_key.clone(), None)];
            if let Some(ik) = &idem_key {
                match &take_over {
                    None => when.push(Compare::create_revision(ik.clone(), CompareOp::Equal, 0)),
                    Some((rev, old)) => {
                        when.push(Compare::mod_revision(ik.clone(), CompareOp::Equal, *rev));
                        when.push(Compare::create_revision(
                            self.key("inv", old),
                            CompareOp::Equal,
                            0,
                        ));
                    }
                }
                then.push(TxnOp::put(ik.clone(), id, None));
                otherwise.push(TxnOp::get(ik.clone(), None));
            }
            let txn = Txn::new().when(when).and_then(then).or_else(otherwise);
            let done = match self.conn.txn(txn).await {
                Ok(done) => done,
                Err(e) if e.lease_not_found() => {
                    if self.await_new_session(session).await {
                        continue;
                    }
                    return Err(e.store("creating an invocation (session lease lost)"));
                }
                Err(e) => return Err(e.store("creating an invocation")),
            };
            if done.value.succeeded() {
                return Ok(Created::New);
            }
            let mut gets = done.value.op_responses().into_iter().map(|r| match r {
                TxnOpResponse::Get(g) => g.kvs().first().cloned(),
                _ => None,
            });
            let existing_inv = gets.next().flatten();
            let existing_idem = gets.next().flatten();
            if let Some(ikv) = existing_idem {
                let target = String::from_utf8_lossy(ikv.value()).into_owned();
                if target == id {
                    // An earlier attempt of this very call was applied.
                    return Ok(Created::New);
                }
                if !valid_id(&target) {
                    return Err(StoreError::Corrupt {
                        what: "idempotency key",
                        why: "it does not name an invocation id".into(),
                    });
                }
                match self.read_invocation(&target).await? {
                    Some(first) => return Ok(Created::Existing(Box::new(first))),
                    None => {
                        take_over = Some((ikv.mod_revision(), target));
                        continue;
                    }
                }
            }
            if existing_inv.is_some() {
                // The same id was stored before: by an earlier attempt of this call, or the
                // caller created it twice.
                return Ok(Created::New);
            }
            // The idempotency key went away between the attempts: try again.
            take_over = None;
        }
        Err(StoreError::Unavailable(
            "creating an invocation: its idempotency key kept changing".into(),
        ))
    }

    async fn get(&self, id: &str) -> Result<Option<StoredInvocation>, StoreError> {
        if !valid_id(id) {
            return Ok(None);
        }
        self.read_invocation(id).await
    }

    async fn update(&self, inv: &StoredInvocation) -> Result<(), StoreError> {
        let json = encode_invocation(inv)?;
        let json = seal_value(&self.sealing, &self.key("inv", &inv.id), json)?;
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key("pending", &inv.id),
                CompareOp::Greater,
                0,
            )])
            .and_then([TxnOp::put(self.key("inv", &inv.id), json, None)]);
        self.conn
            .txn(txn)
            .await
            .map_err(|e| e.store("updating an invocation"))?;
        Ok(())
    }

    async fn finish(&self, inv: &StoredInvocation) -> Result<bool, StoreError> {
        let json = encode_invocation(inv)?;
        let bytes = json.len() as u64;
        let json = seal_value(&self.sealing, &self.key("inv", &inv.id), json)?;
        let id = inv.id.as_str();
        let ns = ns_segment(&inv.function);
        let idem = inv
            .idempotency_key
            .as_deref()
            .map(|k| idem_hash(&inv.function, &inv.owner, k));
        let index_key = self.done_key(ns, inv.finished_unix_ms.unwrap_or_else(super::unix_ms), id);
        let index = index_value(bytes as usize, idem.as_deref());
        let unavailable = |e: CallError| e.store("finishing an invocation");
        let mut finished = None;
        let turn = self.finish_turns[stripe(ns)].lock().await;
        for _ in 0..16 {
            let lease = self.retention_lease().await?;
            let keep = || Some(PutOptions::new().with_lease(lease));
            let (nk, tk) = (
                self.ns_bytes_key(ns, lease),
                self.total_bytes_key(ns, lease),
            );
            // The one extra read: this lease's counters, and what the namespace and all hold.
            let read = Txn::new().and_then([
                TxnOp::get(
                    self.key("inv-bytes", &format!("{ns}/")),
                    Some(GetOptions::new().with_prefix()),
                ),
                TxnOp::get(
                    self.key("inv-total", ""),
                    Some(GetOptions::new().with_prefix()),
                ),
            ]);
            let read = self.conn.txn(read).await.map_err(unavailable)?.value;
            let mut ranges = read.op_responses().into_iter().filter_map(|r| match r {
                TxnOpResponse::Get(mut g) => Some(g.take_kvs()),
                _ => None,
            });
            let (ns_kvs, total_kvs) = (
                ranges.next().unwrap_or_default(),
                ranges.next().unwrap_or_default(),
            );
            let ns_held: u64 = ns_kvs.iter().map(|kv| counter(Some(kv))).sum();
            let total_held: u64 = total_kvs.iter().map(|kv| counter(Some(kv))).sum();
            let own = |kvs: &[KeyValue], key: &str| {
                kvs.iter().find(|kv| kv.key() == key.as_bytes()).cloned()
            };
            let (n, t) = (own(&ns_kvs, &nk), own(&total_kvs, &tk));
            let rev = |kv: &Option<KeyValue>| kv.as_ref().map_or(0, |kv| kv.mod_revision());
            let mut then = vec![
                TxnOp::put(self.key("inv", id), json.clone(), keep()),
                TxnOp::delete(self.key("pending", id), None),
                TxnOp::delete(self.key("claims", id), None),
                TxnOp::delete(self.run_key(ns, id), None),
                TxnOp::put(index_key.clone(), index.clone(), keep()),
                TxnOp::put(
                    nk.clone(),
                    (counter(n.as_ref()) + bytes).to_string(),
                    keep(),
                ),
                TxnOp::put(
                    tk.clone(),
                    (counter(t.as_ref()) + bytes).to_string(),
                    keep(),
                ),
            ];
            if let Some(h) = idem.as_deref() {
                let ik = self.key("idem", h);
                then.push(TxnOp::txn(
                    Txn::new()
                        .when([Compare::value(ik.clone(), CompareOp::Equal, id)])
                        .and_then([TxnOp::put(ik, id, keep())]),
                ));
            }
            let txn = Txn::new()
                .when([
                    Compare::create_revision(self.key("pending", id), CompareOp::Greater, 0),
                    Compare::mod_revision(nk.clone(), CompareOp::Equal, rev(&n)),
                    Compare::mod_revision(tk.clone(), CompareOp::Equal, rev(&t)),
                ])
                .and_then(then)
                .or_else([TxnOp::get(self.key("pending", id), None)]);
            match self.conn.txn(txn).await {
                Ok(done) if done.value.succeeded() => {
                    finished = Some((true, ns_held + bytes, total_held + bytes));
                    break;
                }
                Ok(done) => {
                    if two_gets(&done.value)[0].is_some() {
                        // Still unfinished: a counter changed meanwhile.
                        continue;
                    }
                    let mine = if done.retried {
                        // An attempt whose answer was lost may have been the one applied.
                        let now = self.read_invocation(id).await?;
                        now.as_ref() == Some(inv)
                    } else {
                        false
                    };
                    finished = Some((mine, ns_held + bytes, total_held + bytes));
                    break;
                }
                Err(e) if e.lease_not_found() => self.forget_retention_lease(lease).await,
                Err(e) => return Err(unavailable(e)),
            }
        }
        drop(turn);
        let Some((mine, ns_held, total_held)) = finished else {
            return Err(StoreError::Unavailable(
                "finishing an invocation: its lease or byte counters kept changing".into(),
            ));
        };
        let limits = self.limits();
        if mine
            && (ns_held > limits.max_bytes_per_namespace as u64
                || total_held > limits.max_bytes as u64)
        {
            // The answer is stored; failing to make room only leaves the store over its bound
            // until the next finish or the retention lease.
            if let Err(e) = self.make_room(ns, ns_held, total_held, limits).await {
                tracing::warn!(error = %e, namespace = %ns, "making room for async results failed");
            }
        }
        Ok(mine)
    }

    async fn take_orphans(&self, limit: usize) -> Result<Vec<StoredInvocation>, StoreError> {
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        let unavailable = |e: CallError| e.store("looking for orphaned invocations");
        let pending_prefix = self.key("pending", "");
        let claims_prefix = self.key("claims", "");
        let suffix = |kv: &KeyValue, prefix: &str| -> Option<String> {
            let key = std::str::from_utf8(kv.key()).ok()?;
            Some(key.strip_prefix(prefix)?.to_string())
        };
        let mut pending = Vec::new();
        self.conn
            .scan(&pending_prefix, true, MAX_SCAN, |kv| {
                pending.extend(suffix(&kv, &pending_prefix));
                true
            })
            .await
            .map_err(unavailable)?;
        let mut claimed = std::collections::HashSet::new();
        self.conn
            .scan(&claims_prefix, true, MAX_SCAN, |kv| {
                claimed.extend(suffix(&kv, &claims_prefix));
                true
            })
            .await
            .map_err(unavailable)?;
        for id in pending.into_iter().filter(|id| !claimed.contains(id)) {
            if out.len() >= limit {
                break;
            }
            if !valid_id(&id) {
                continue;
            }
            let Some(record) = self.claim(&id).await? else {
                continue;
            };
            match record.map(|kv| decode_invocation(&self.sealing, &kv)) {
                Some(Ok(inv)) => out.push(inv),
                Some(Err(e)) => {
                    tracing::warn!(id = %id, error = %e, "an orphaned invocation is unreadable; left claimed")
                }
                None => {
                    tracing::warn!(id = %id, "an orphaned invocation has no record; left claimed")
                }
            }
        }
        Ok(out)
    }

    async fn dead_letters(
        &self,
        filter: &DeadLetterFilter,
        limit: usize,
    ) -> Result<Vec<StoredInvocation>, StoreError> {
        let mut out: Vec<StoredInvocation> = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        let newest_first = |a: &StoredInvocation, b: &StoredInvocation| {
            b.finished_unix_ms
                .cmp(&a.finished_unix_ms)
                .then(b.submitted_unix_ms.cmp(&a.submitted_unix_ms))
        };
        self.conn
            .scan(&self.key("inv", ""), false, MAX_SCAN, |kv| {
                match decode_invocation(&self.sealing, &kv) {
                    Ok(inv) if inv.state == AsyncState::Failed && filter.accepts(&inv.function) => {
                        out.push(inv);
                        // Keep memory bounded by the limit, not by the scan.
                        if out.len() >= limit.saturating_mul(2).max(64) {
                            out.sort_by(newest_first);
                            out.truncate(limit);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "skipping an unreadable invocation record")
                    }
                }
                true
            })
            .await
            .map_err(|e| e.store("listing dead letters"))?;
        out.sort_by(newest_first);
        out.truncate(limit);
        Ok(out)
    }

    /// Records normally go by their retention lease; this deletes, in a bounded scan, the
    /// finished ones that finished before `before_unix_ms` and are still there (a lease
    /// renewed by leader changes, or records finished before a shorter retention was set).
    async fn expire(&self, before_unix_ms: u64) -> Result<usize, StoreError> {
        let mut old = Vec::new();
        self.conn
            .scan(&self.key("inv", ""), false, MAX_SCAN, |kv| {
                if let Ok(inv) = decode_invocation(&self.sealing, &kv) {
                    if inv.state != AsyncState::Running
                        && inv.finished_unix_ms.is_some_and(|f| f < before_unix_ms)
                    {
                        old.push((inv, kv.mod_revision(), kv.lease()));
                    }
                }
                true
            })
            .await
            .map_err(|e| e.store("expiring invocations"))?;
        let mut gone = 0;
        for (inv, rev, lease) in old {
            let ns = ns_segment(&inv.function);
            let bytes = encode_invocation(&inv).map_or(0, |j| j.len() as u64);
            let idem = inv
                .idempotency_key
                .as_deref()
                .map(|k| idem_hash(&inv.function, &inv.owner, k));
            let index_key = self.done_key(ns, inv.finished_unix_ms.unwrap_or(0), &inv.id);
            let guard = vec![
                Compare::mod_revision(self.key("inv", &inv.id), CompareOp::Equal, rev),
                Compare::create_revision(self.key("pending", &inv.id), CompareOp::Equal, 0),
            ];
            if self
                .remove_finished(
                    ns,
                    &inv.id,
                    &index_key,
                    bytes,
                    idem.as_deref(),
                    lease,
                    guard,
                )
                .await?
            {
                gone += 1;
            }
        }
        Ok(gone)
    }
}

/// A member's lease, kept alive (and re-granted after a loss) by a background task.
struct EtcdMembership {
    state: Arc<LeaseState>,
    task: JoinHandle<()>,
    lease: LeaseClient,
    left: bool,
}

#[async_trait]
impl Membership for EtcdMembership {
    async fn leave(mut self: Box<Self>) {
        self.task.abort();
        self.left = true;
        self.state.alive.store(false, Ordering::SeqCst);
        let id = self.state.id();
        if tokio::time::timeout(REVOKE_WAIT, self.lease.revoke(id))
            .await
            .is_err()
        {
            tracing::warn!("revoking a membership lease timed out; it expires after its TTL");
        }
    }

    fn is_alive(&self) -> bool {
        self.state.fresh()
    }
}

impl Drop for EtcdMembership {
    fn drop(&mut self) {
        self.task.abort();
        if !self.left {
            let id = self.state.id();
            let mut lease = self.lease.clone();
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    let _ = tokio::time::timeout(REVOKE_WAIT, lease.revoke(id)).await;
                });
            }
        }
    }
}

#[async_trait]
impl ClusterState for EtcdStore {
    async fn put_function(
        &self,
        key: &str,
        spec: &serde_json::Value,
        code: Option<&[u8]>,
    ) -> Result<FunctionRecord, StoreError> {
        if !valid_segment(key) {
            return Err(StoreError::Config(
                "a function key must be 1 to 256 printable characters without `/`".into(),
            ));
        }
        if let Some(code) = code {
            if code.len() > MAX_CODE_BYTES {
                return Err(StoreError::TooLarge {
                    what: "code archive",
                    bytes: code.len(),
                    max: MAX_CODE_BYTES,
                });
            }
        }
        let mut record = FunctionRecord {
            key: key.to_string(),
            spec: spec.clone(),
            version: 0,
            code: code.map(|c| CodeRef {
                sha256: hex_sha256(c),
                bytes: c.len() as u64,
            }),
        };
        let fkey = self.key("functions", key);
        for _ in 0..5 {
            let mut when = Vec::new();
            if let (Some(code), Some(code_ref)) = (code, &record.code) {
                let meta_rev = self.ensure_code(&code_ref.sha256, code).await?;
                if meta_rev == 0 {
                    continue;
                }
                when.push(Compare::mod_revision(
                    self.code_meta_key(&code_ref.sha256),
                    CompareOp::Equal,
                    meta_rev,
                ));
            } else if code.is_none() {
                // No new code: the function keeps the code it has, if the record is unchanged
                // when this one replaces it.
                let current = self
                    .conn
                    .get(&fkey)
                    .await
                    .map_err(|e| e.store("reading a function"))?;
                match current {
                    Some(kv) => {
                        record.code = read_function(&self.sealing, &kv).ok().and_then(|f| f.code);
                        when.push(Compare::mod_revision(
                            fkey.clone(),
                            CompareOp::Equal,
                            kv.mod_revision(),
                        ));
                    }
                    None => {
                        record.code = None;
                        when.push(Compare::create_revision(fkey.clone(), CompareOp::Equal, 0));
                    }
                }
            }
            let json = seal_value(&self.sealing, &fkey, encode_function(&record)?)?;
            let txn = Txn::new()
                .when(when)
                .and_then([TxnOp::put(fkey.clone(), json, None)]);
            let done = self
                .conn
                .txn(txn)
                .await
                .map_err(|e| e.store("storing a function"))?;
            if done.value.succeeded() {
                record.version = done.value.header().map_or(0, |h| h.revision()).max(0) as u64;
                return Ok(record);
            }
        }
        Err(StoreError::Unavailable(
            "storing a function: its code kept changing underneath".into(),
        ))
    }

    async fn delete_function(&self, key: &str) -> Result<bool, StoreError> {
        if !valid_segment(key) {
            return Ok(false);
        }
        let fkey = self.key("functions", key);
        let deleted = call(&self.conn.kv, |mut kv| {
            let fkey = fkey.clone();
            async move {
                kv.delete(fkey, Some(DeleteOptions::new().with_prev_key()))
                    .await
            }
        })
        .await
        .map_err(|e| e.store("deleting a function"))?;
        let Some(prev) = deleted.value.prev_kvs().first().cloned() else {
            // A retried delete whose first attempt was applied also lands here.
            return Ok(deleted.value.deleted() > 0);
        };
        if let Ok(FunctionRecord {
            code: Some(code), ..
        }) = read_function(&self.sealing, &prev)
        {
            if let Err(e) = self.collect_code(&code.sha256).await {
                tracing::warn!(function = %key, error = %e, "unreferenced code was not deleted");
            }
        }
        Ok(true)
    }

    async fn code(&self, code: &CodeRef) -> Result<Vec<u8>, StoreError> {
        let sha = code.sha256.as_str();
        if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(StoreError::Corrupt {
                what: "code reference",
                why: "the SHA-256 is not 64 hex digits".into(),
            });
        }
        let bytes = usize::try_from(code.bytes).unwrap_or(usize::MAX);
        if bytes > MAX_CODE_BYTES {
            return Err(StoreError::TooLarge {
                what: "code archive",
                bytes,
                max: MAX_CODE_BYTES,
            });
        }
        let mut out = Vec::with_capacity(bytes);
        for i in 0..chunk_count(code.bytes) {
            let kv = self
                .conn
                .get(&self.code_key(sha, i))
                .await
                .map_err(|e| e.store("reading code"))?
                .ok_or_else(|| StoreError::Corrupt {
                    what: "code archive",
                    why: format!("chunk {i} is missing"),
                })?;
            if seal::is_sealed(kv.value()) {
                out.extend_from_slice(&self.open_chunk(kv).await?);
            } else {
                // Written by an older version: the SHA-256 below checks it all the same.
                out.extend_from_slice(kv.value());
            }
            if out.len() > bytes {
                break;
            }
        }
        if out.len() != bytes || hex_sha256(&out) != sha.to_ascii_lowercase() {
            return Err(StoreError::Corrupt {
                what: "code archive",
                why: "its content does not match its SHA-256".into(),
            });
        }
        Ok(out)
    }

    fn watch_functions(&self) -> mpsc::Receiver<Change<FunctionRecord>> {
        let sealing = self.sealing.clone();
        self.spawn_watch(
            self.key("functions", ""),
            Arc::new(move |name, kv| decode_function(&sealing, name, kv)),
        )
    }

    async fn join(
        &self,
        kind: MemberKind,
        me: &MemberRecord,
        ttl_ms: u64,
    ) -> Result<Box<dyn Membership>, StoreError> {
        if !valid_segment(&me.name) {
            return Err(StoreError::Config(
                "a member name must be 1 to 256 printable characters without `/`".into(),
            ));
        }
        let json = serde_json::to_vec(me).map_err(|e| StoreError::Corrupt {
            what: "member record",
            why: json_why(&e),
        })?;
        if json.len() > MAX_RECORD_BYTES {
            return Err(StoreError::TooLarge {
                what: "member record",
                bytes: json.len(),
                max: MAX_RECORD_BYTES,
            });
        }
        let key = format!("{}{}", self.members_prefix(kind), me.name);
        let ttl_s = whole_secs(Duration::from_millis(ttl_ms));
        let granted = call(&self.conn.lease, |mut l| async move {
            l.grant(ttl_s, None).await
        })
        .await
        .map_err(|e| e.store("granting a membership lease"))?
        .value;
        let id = granted.id();
        let put = |kv: KvClient, id: i64, key: String, json: Vec<u8>| async move {
            call(&kv, |mut kv| {
                let (key, json) = (key.clone(), json.clone());
                async move {
                    kv.put(key, json, Some(PutOptions::new().with_lease(id)))
                        .await
                }
            })
            .await
            .map(|_| ())
        };
        if let Err(e) = put(self.conn.kv.clone(), id, key.clone(), json.clone()).await {
            let mut lease = self.conn.lease.clone();
            let _ = tokio::time::timeout(REVOKE_WAIT, lease.revoke(id)).await;
            return Err(e.store("publishing a member"));
        }
        let state = LeaseState::new(id, granted.ttl().max(ttl_s));
        state.mark_ok();
        let kv = self.conn.kv.clone();
        let task = self.runtime.spawn(keep_lease(
            self.conn.lease.clone(),
            state.clone(),
            format!("member {key}"),
            move |id| {
                let (kv, key, json) = (kv.clone(), key.clone(), json.clone());
                async move {
                    put(kv, id, key, json).await.map_err(|e| match e {
                        CallError::Etcd(e) => e,
                        CallError::TimedOut => {
                            EtcdError::LeaseKeepAliveError("publishing timed out".into())
                        }
                    })
                }
            },
        ));
        Ok(Box::new(EtcdMembership {
            state,
            task,
            lease: self.conn.lease.clone(),
            left: false,
        }))
    }

    fn watch_members(&self, kind: MemberKind) -> mpsc::Receiver<Change<MemberRecord>> {
        self.spawn_watch(self.members_prefix(kind), Arc::new(decode_member))
    }

    async fn put_doc(
        &self,
        kind: &str,
        id: &str,
        doc: &serde_json::Value,
    ) -> Result<(), StoreError> {
        let (key, json) = self.doc_key_value(kind, id, doc)?;
        call(&self.conn.kv, |mut kv| {
            let (key, json) = (key.clone(), json.clone());
            async move { kv.put(key, json, None).await }
        })
        .await
        .map_err(|e| e.store("storing a shared document"))?;
        Ok(())
    }

    async fn put_doc_if_absent(
        &self,
        kind: &str,
        id: &str,
        doc: &serde_json::Value,
    ) -> Result<serde_json::Value, StoreError> {
        let (key, json) = self.doc_key_value(kind, id, doc)?;
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), json, None)])
            .or_else([TxnOp::get(key.clone(), None)]);
        let done = self
            .conn
            .txn(txn)
            .await
            .map_err(|e| e.store("storing a shared document"))?;
        if done.value.succeeded() {
            return Ok(doc.clone());
        }
        let kv = done.value.op_responses().into_iter().find_map(|r| match r {
            etcd_client::TxnOpResponse::Get(g) => g.kvs().first().cloned(),
            _ => None,
        });
        match kv {
            Some(kv) => read_doc(&self.sealing, &kv),
            // Deleted in between (or a retried put landed): what was asked is what is there.
            None => Ok(doc.clone()),
        }
    }

    async fn delete_doc(&self, kind: &str, id: &str) -> Result<bool, StoreError> {
        if !valid_segment(kind) || !valid_segment(id) {
            return Ok(false);
        }
        let key = format!("{}/docs/{kind}/{id}", self.prefix);
        let deleted = call(&self.conn.kv, |mut kv| {
            let key = key.clone();
            async move { kv.delete(key, None).await }
        })
        .await
        .map_err(|e| e.store("deleting a shared document"))?;
        Ok(deleted.value.deleted() > 0)
    }

    fn watch_docs(&self, kind: &str) -> mpsc::Receiver<Change<Doc>> {
        let sealing = self.sealing.clone();
        self.spawn_watch(
            format!("{}/docs/{kind}/", self.prefix),
            Arc::new(move |id, kv| decode_doc(&sealing, id, kv)),
        )
    }
}

impl EtcdStore {
    /// A shared document's key and stored bytes, checked.
    fn doc_key_value(
        &self,
        kind: &str,
        id: &str,
        doc: &serde_json::Value,
    ) -> Result<(String, Vec<u8>), StoreError> {
        if !valid_segment(kind) || !valid_segment(id) {
            return Err(StoreError::Config(
                "a document's kind and id must be printable characters without `/`".into(),
            ));
        }
        let json = serde_json::to_vec(doc).map_err(|e| StoreError::Corrupt {
            what: "shared document",
            why: json_why(&e),
        })?;
        if json.len() > MAX_RECORD_BYTES {
            return Err(StoreError::TooLarge {
                what: "shared document",
                bytes: json.len(),
                max: MAX_RECORD_BYTES,
            });
        }
        let key = format!("{}/docs/{kind}/{id}", self.prefix);
        // The cluster's settings stay readable without the key (its fingerprint is one of
        // them); every other document (API key records among them) is sealed.
        let json = if kind == CLEAR_DOC_KIND {
            json
        } else {
            seal_value(&self.sealing, &key, json)?
        };
        Ok((key, json))
    }
}

/// The one kind of shared document kept in clear: the cluster's settings.
pub const CLEAR_DOC_KIND: &str = "config";

/// A shared document's value, opened unless it is of [`CLEAR_DOC_KIND`].
fn read_doc(sealing: &Sealing, kv: &KeyValue) -> Result<serde_json::Value, StoreError> {
    let key = std::str::from_utf8(kv.key()).unwrap_or("");
    let clear = key
        .rsplit_once('/')
        .and_then(|(parent, _)| parent.rsplit_once('/'))
        .is_some_and(|(_, kind)| kind == CLEAR_DOC_KIND);
    let bytes = if clear {
        kv.value().to_vec()
    } else {
        open_value(sealing, "shared document", kv)?
    };
    serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt {
        what: "shared document",
        why: json_why(&e),
    })
}

fn decode_doc(sealing: &Sealing, id: &str, kv: &KeyValue) -> Option<Doc> {
    match read_doc(sealing, kv) {
        Ok(value) => Some(Doc {
            id: id.to_string(),
            value,
        }),
        Err(e) => {
            tracing::warn!(document = %id, error = %e, "skipping an unreadable shared document");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }

    #[test]
    fn lease_seconds_round_up() {
        assert_eq!(whole_secs(Duration::from_millis(0)), 1);
        assert_eq!(whole_secs(Duration::from_millis(1)), 1);
        assert_eq!(whole_secs(Duration::from_millis(1000)), 1);
        assert_eq!(whole_secs(Duration::from_millis(1001)), 2);
    }

    #[test]
    fn ids_and_segments() {
        assert!(valid_id("0123abcdef"));
        assert!(!valid_id("a/b"));
        assert!(!valid_id(""));
        assert!(valid_segment("ns.fn-1"));
        assert!(!valid_segment("a/b"));
        assert!(!valid_segment(".."));
        assert!(!valid_segment("a b"));
    }

    #[test]
    fn json_errors_do_not_quote_values() {
        let e = serde_json::from_slice::<CodeMeta>(br#"{"bytes":"SECRET","chunks":1}"#)
            .err()
            .map(|e| json_why(&e))
            .unwrap_or_default();
        assert!(!e.contains("SECRET"), "{e}");
        assert!(!e.is_empty());
    }
}
