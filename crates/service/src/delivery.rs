//! Async delivery: an accepted invocation is stored durably before its 202, run, retried on
//! failure (Lambda-like: `retries` more attempts, 2 by default, with a growing back-off), and
//! ends with exactly one final record: its answer, or `failed` with the reason of each attempt
//! (the dead-letter list). Invocations a crashed process left unfinished are taken over and run
//! again by whoever finds them ([`AsyncStore::take_orphans`]): the restarted worker on a single
//! node, any controller in a cluster. Execution is at least once; the worker runs a repeated id
//! once ([`crate::dedup`]) and the store keeps only the first final answer.
//!
//! Both the worker and the controller drive the same code with their own [`Runner`].

use crate::store::{AsyncStore, Created, DeadLetterFilter, StoreError, StoredInvocation};
use async_trait::async_trait;
use bytes::Bytes;
use dashmap::DashMap;
use hearth_api::{AsyncRecord, AsyncState, ErrorBody, ErrorCode};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::watch;

/// How one attempt ended: the answer a synchronous call would have got, and whether a failure
/// is worth another attempt.
#[derive(Debug, Clone)]
pub struct Attempted {
    pub http_status: u16,
    pub body: Bytes,
    /// A failure that another attempt may not repeat (5xx, 429, a lost worker).
    pub retry: bool,
    /// This process is stopping: the invocation is left unfinished for whoever takes it over
    /// (the next life, another controller), rather than failed or retried here.
    pub abandon: bool,
}

impl Attempted {
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.http_status)
    }

    /// The reason kept for a failed attempt: its error code and message.
    fn why(&self) -> String {
        match ErrorBody::parse(&self.body) {
            Some(e) => format!(
                "{} ({}): {}",
                e.error.code, self.http_status, e.error.message
            ),
            None => format!("HTTP {}", self.http_status),
        }
    }

    /// An answer as a worker (or the controller) gave it.
    pub fn answer(http_status: u16, body: Bytes) -> Self {
        Attempted {
            http_status,
            body,
            retry: Self::retry_for(http_status),
            abandon: false,
        }
    }

    /// An error of the platform's own, as its HTTP edge would answer it.
    pub fn error(e: &crate::ApiError) -> Self {
        let body = serde_json::to_vec(&e.error_body()).unwrap_or_default();
        Self::answer(e.status.as_u16(), Bytes::from(body))
    }

    /// This process is stopping: leave the invocation to whoever takes it over.
    pub fn abandoned() -> Self {
        Attempted {
            http_status: 503,
            body: Bytes::new(),
            retry: false,
            abandon: true,
        }
    }

    /// The rule for whether a failed answer is retried: server-side failures and throttling
    /// are, a refused request (other 4xx) is not.
    pub fn retry_for(http_status: u16) -> bool {
        http_status >= 500 || http_status == 429
    }
}

/// Runs one attempt of an invocation (the worker runs it; the controller forwards it with the
/// invocation's id so that the worker runs a repeated id once).
#[async_trait]
pub trait Runner: Send + Sync + 'static {
    async fn run(&self, inv: &StoredInvocation) -> Attempted;
}

/// Settings of delivery.
#[derive(Debug, Clone)]
pub struct DeliverySettings {
    /// First back-off between attempts; doubles per attempt, capped at 30 s.
    pub retry_backoff: Duration,
    /// How often orphans are looked for; None: once, at start (a single node's own store).
    pub orphan_scan: Option<Duration>,
    /// The first look waits this long (a restarted controller first lets its workers report).
    pub first_scan_after: Duration,
    /// How long finished records are kept.
    pub retention: Duration,
    /// The largest answer kept; a larger one becomes a `result_too_large` failure.
    pub max_answer_bytes: usize,
}

/// An accepted invocation.
#[derive(Debug, Clone)]
pub struct Accepted {
    pub id: String,
    /// The idempotency key had been used: this is the first call's invocation.
    pub replay: bool,
}

/// Attempts lost to crashes beyond `max_attempts` before an invocation is given up.
const CRASH_ALLOWANCE: u32 = 2;
/// Orphans taken over per scan.
const ORPHANS_PER_SCAN: usize = 256;

/// Async delivery over one store.
pub struct Delivery {
    store: Arc<dyn AsyncStore>,
    runner: Arc<dyn Runner>,
    settings: DeliverySettings,
    /// Local waiters for a final record, by id.
    waiters: DashMap<String, watch::Sender<bool>>,
    running: AtomicUsize,
}

impl Delivery {
    /// Delivery over `store`; nothing runs in the background until [`Self::start_background`].
    pub fn new(
        store: Arc<dyn AsyncStore>,
        runner: Arc<dyn Runner>,
        settings: DeliverySettings,
    ) -> Arc<Self> {
        Arc::new(Delivery {
            store,
            runner,
            settings,
            waiters: DashMap::new(),
            running: AtomicUsize::new(0),
        })
    }

    /// [`Self::new`] and [`Self::start_background`].
    pub fn start(
        store: Arc<dyn AsyncStore>,
        runner: Arc<dyn Runner>,
        settings: DeliverySettings,
    ) -> Arc<Self> {
        let d = Self::new(store, runner, settings);
        d.start_background();
        d
    }

    /// Takes over orphans now (and then every `orphan_scan`), and expires finished records
    /// after `retention`. Called once the runner can run.
    pub fn start_background(self: &Arc<Self>) {
        tokio::spawn(scan_orphans(Arc::downgrade(self)));
        tokio::spawn(expire(Arc::downgrade(self)));
    }

    pub fn store(&self) -> &Arc<dyn AsyncStore> {
        &self.store
    }

    /// Invocations being driven by this process now.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }

    /// Stores the invocation durably and starts it; with an idempotency key already used for
    /// the function, the first call's id instead. `guard` (e.g. a quota slot) is held until
    /// the invocation ends.
    pub async fn accept<G: Send + 'static>(
        self: &Arc<Self>,
        function: &str,
        owner: &str,
        args: Bytes,
        retries: u32,
        idempotency_key: Option<String>,
        guard: G,
    ) -> Result<Accepted, StoreError> {
        let inv = StoredInvocation {
            id: crate::invocations::new_id(),
            function: function.to_string(),
            owner: owner.to_string(),
            args: args.to_vec(),
            submitted_unix_ms: crate::store::unix_ms(),
            // The first attempt starts now: counted before it runs, so a crash counts it.
            attempts: 1,
            max_attempts: retries.saturating_add(1),
            state: AsyncState::Running,
            failures: Vec::new(),
            idempotency_key,
            http_status: None,
            answer: None,
            finished_unix_ms: None,
        };
        match self.store.create(&inv).await? {
            Created::Existing(first) => Ok(Accepted {
                id: first.id,
                replay: true,
            }),
            Created::New => {
                let id = inv.id.clone();
                self.spawn(inv, false, guard);
                Ok(Accepted { id, replay: false })
            }
        }
    }

    fn spawn<G: Send + 'static>(
        self: &Arc<Self>,
        inv: StoredInvocation,
        recovered: bool,
        guard: G,
    ) {
        let me = Arc::clone(self);
        self.running.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let _guard = guard;
            me.drive(inv, recovered).await;
            me.running.fetch_sub(1, Ordering::Relaxed);
        });
    }

    /// Runs attempts until one answers, fails for good, or the attempts are spent; then writes
    /// the final record.
    async fn drive(&self, mut inv: StoredInvocation, recovered: bool) {
        if recovered {
            // The attempt that was running when its process died is lost: count a new one,
            // unless crashes have already taken more than the allowance.
            if inv.attempts >= inv.max_attempts.saturating_add(CRASH_ALLOWANCE) {
                inv.note_failure("attempts lost to crashes: given up");
                let answer = error_answer(
                    502,
                    ErrorCode::WorkerFailed,
                    format!(
                        "the invocation was given up after {} attempts, the last ones lost to crashes",
                        inv.attempts
                    ),
                );
                self.finish(inv, attempted_of(answer)).await;
                return;
            }
            inv.attempts += 1;
            self.update(&inv).await;
        }
        loop {
            let attempted = self.runner.run(&inv).await;
            if attempted.abandon {
                tracing::info!(id = %inv.id, "stopping: the async invocation is left to whoever takes it over");
                return;
            }
            let spent = inv.attempts >= inv.max_attempts;
            if attempted.ok() || !attempted.retry || spent {
                if !attempted.ok() {
                    inv.note_failure(&attempted.why());
                }
                self.finish(inv, attempted).await;
                return;
            }
            inv.note_failure(&attempted.why());
            tracing::debug!(id = %inv.id, attempt = inv.attempts, "async attempt failed; retrying");
            tokio::time::sleep(backoff(self.settings.retry_backoff, inv.attempts)).await;
            inv.attempts += 1;
            self.update(&inv).await;
        }
    }

    /// Progress is best effort: a store that is down must not stop the invocation.
    async fn update(&self, inv: &StoredInvocation) {
        if let Err(e) = self.store.update(inv).await {
            tracing::warn!(id = %inv.id, error = %e, "could not record an async attempt");
        }
    }

    /// Writes the final record; a store that is down is retried (the record is the result).
    async fn finish(&self, mut inv: StoredInvocation, attempted: Attempted) {
        let (status, body) = self.kept_answer(attempted);
        inv.state = if (200..300).contains(&status) {
            AsyncState::Succeeded
        } else {
            AsyncState::Failed
        };
        inv.http_status = Some(status);
        inv.answer = Some(body);
        inv.finished_unix_ms = Some(crate::store::unix_ms());
        let mut wait = Duration::from_millis(100);
        for _ in 0..40 {
            match self.store.finish(&inv).await {
                Ok(first) => {
                    if !first {
                        tracing::debug!(id = %inv.id, "another attempt finished this invocation first");
                    }
                    break;
                }
                Err(StoreError::TooLarge { .. }) => {
                    let (s, b) = too_large(self.settings.max_answer_bytes, body_len(&inv));
                    inv.http_status = Some(s);
                    inv.answer = Some(b);
                    inv.state = AsyncState::Failed;
                }
                Err(e) => {
                    tracing::warn!(id = %inv.id, error = %e, "could not store an async result; retrying");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
            }
        }
        if let Some((_, tx)) = self.waiters.remove(&inv.id) {
            let _ = tx.send(true);
        }
    }

    /// The answer as kept: valid UTF-8 JSON within the bound, or an error that says why not.
    fn kept_answer(&self, a: Attempted) -> (u16, String) {
        let max = self.settings.max_answer_bytes;
        if a.body.len() > max {
            return too_large(max, a.body.len());
        }
        match String::from_utf8(a.body.to_vec()) {
            Ok(s) if serde_json::from_str::<&serde_json::value::RawValue>(&s).is_ok() => {
                (a.http_status, s)
            }
            _ => error_answer(
                502,
                ErrorCode::Internal,
                format!(
                    "the answer (HTTP {}) was not a Hearth answer",
                    a.http_status
                ),
            ),
        }
    }

    /// The record of `id` once it is final, waiting up to `timeout`; the latest record seen
    /// (maybe still running) when the time is up, None when there is none.
    pub async fn wait(
        &self,
        id: &str,
        timeout: Duration,
    ) -> Result<Option<StoredInvocation>, StoreError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let mut rx = self
                .waiters
                .entry(id.to_string())
                .or_insert_with(|| watch::channel(false).0)
                .subscribe();
            let rec = self.store.get(id).await?;
            match &rec {
                Some(r) if r.state != AsyncState::Running => {
                    self.waiters.remove_if(id, |_, tx| tx.receiver_count() <= 1);
                    return Ok(rec);
                }
                None => {
                    self.waiters.remove_if(id, |_, tx| tx.receiver_count() <= 1);
                    return Ok(None);
                }
                Some(_) => {}
            }
            // Finished here: the watch fires. Finished by another process: polled.
            let poll = tokio::time::Instant::now() + Duration::from_millis(100);
            tokio::select! {
                _ = rx.changed() => {}
                _ = tokio::time::sleep_until(poll.min(deadline)) => {}
            }
            if tokio::time::Instant::now() >= deadline {
                drop(rx);
                self.waiters.remove_if(id, |_, tx| tx.receiver_count() == 0);
                return self.store.get(id).await;
            }
        }
    }

    /// Failed invocations (the dead-letter list).
    pub async fn dead_letters(
        &self,
        filter: &DeadLetterFilter,
        limit: usize,
    ) -> Result<Vec<StoredInvocation>, StoreError> {
        self.store.dead_letters(filter, limit).await
    }
}

/// The back-off before attempt `attempts + 1`.
fn backoff(first: Duration, attempts: u32) -> Duration {
    let factor = 1u32 << attempts.saturating_sub(1).min(10);
    (first * factor).min(Duration::from_secs(30))
}

/// An error answer as kept in a record: its status and body.
fn error_answer(status: u16, code: ErrorCode, message: String) -> (u16, String) {
    let body = serde_json::to_string(&ErrorBody::new(code, message)).unwrap_or_default();
    (status, body)
}

/// A kept answer as the outcome of an attempt that is not retried.
fn attempted_of((http_status, body): (u16, String)) -> Attempted {
    Attempted {
        http_status,
        body: Bytes::from(body),
        retry: false,
        abandon: false,
    }
}

fn too_large(max: usize, bytes: usize) -> (u16, String) {
    error_answer(
        502,
        ErrorCode::ResultTooLarge,
        format!("the answer ({bytes} bytes) is larger than the async store's limit of {max} bytes"),
    )
}

fn body_len(inv: &StoredInvocation) -> usize {
    inv.answer.as_ref().map_or(0, |a| a.len())
}

/// Takes over orphans now and then every `orphan_scan`.
async fn scan_orphans(d: Weak<Delivery>) {
    let first = match d.upgrade() {
        Some(me) => me.settings.first_scan_after,
        None => return,
    };
    tokio::time::sleep(first).await;
    loop {
        let Some(me) = d.upgrade() else { return };
        match me.store.take_orphans(ORPHANS_PER_SCAN).await {
            Ok(orphans) => {
                for inv in orphans {
                    tracing::info!(id = %inv.id, function = %inv.function, attempts = inv.attempts, "taking over an unfinished async invocation");
                    me.spawn(inv, true, ());
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not look for unfinished async invocations"),
        }
        let Some(every) = me.settings.orphan_scan else {
            return;
        };
        drop(me);
        tokio::time::sleep(every).await;
    }
}

/// Forgets finished records older than the retention, every minute (or retention/4).
async fn expire(d: Weak<Delivery>) {
    loop {
        let Some(me) = d.upgrade() else { return };
        let keep = me.settings.retention;
        let before = crate::store::unix_ms().saturating_sub(keep.as_millis() as u64);
        if let Err(e) = me.store.expire(before).await {
            tracing::warn!(error = %e, "could not expire old async records");
        }
        drop(me);
        tokio::time::sleep((keep / 4).clamp(Duration::from_millis(100), Duration::from_secs(60)))
            .await;
    }
}

/// `GET /v1/invocations/{id}`'s record: the stored answer's fields once finished, plus the
/// attempts made and the failure reasons.
pub fn record_of(inv: &StoredInvocation) -> AsyncRecord {
    let mut record = AsyncRecord::running(&inv.id, &inv.function, inv.submitted_unix_ms);
    if let (Some(status), Some(answer)) = (inv.http_status, &inv.answer) {
        record = record.finished(&crate::invocations::outcome_of(status, answer.as_bytes()));
    }
    record.status = inv.state;
    record.attempts = Some(inv.attempts);
    record.failures = inv.failures.clone();
    record
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::SqliteAsyncStore;
    use parking_lot::Mutex;

    /// Answers from a script, one per attempt (the last one repeats), and counts runs per id.
    struct Scripted {
        answers: Mutex<Vec<(u16, &'static str)>>,
        runs: Mutex<Vec<String>>,
    }

    #[async_trait]
    impl Runner for Scripted {
        async fn run(&self, inv: &StoredInvocation) -> Attempted {
            self.runs.lock().push(inv.id.clone());
            let mut a = self.answers.lock();
            let (status, body) = if a.len() > 1 { a.remove(0) } else { a[0] };
            Attempted {
                http_status: status,
                body: Bytes::from_static(body.as_bytes()),
                retry: Attempted::retry_for(status),
                abandon: false,
            }
        }
    }

    const OK: (u16, &str) = (
        200,
        r#"{"result":{"x":1},"cold":false,"worker":"w","timing":{"queue":0,"init":0,"exec":1,"overhead":1,"e2e":2}}"#,
    );
    const BOOM: (u16, &str) = (
        502,
        r#"{"error":{"code":"handler_error","message":"boom"}}"#,
    );
    const BAD: (u16, &str) = (400, r#"{"error":{"code":"bad_request","message":"no"}}"#);

    fn settings() -> DeliverySettings {
        DeliverySettings {
            retry_backoff: Duration::from_millis(5),
            orphan_scan: None,
            first_scan_after: Duration::ZERO,
            retention: Duration::from_secs(600),
            max_answer_bytes: 1 << 20,
        }
    }

    fn setup(
        dir: &std::path::Path,
        answers: Vec<(u16, &'static str)>,
    ) -> (Arc<Delivery>, Arc<Scripted>) {
        let store = Arc::new(SqliteAsyncStore::open(dir, 100, 1 << 20).unwrap());
        let runner = Arc::new(Scripted {
            answers: Mutex::new(answers),
            runs: Mutex::new(Vec::new()),
        });
        let d = Delivery::start(store, Arc::clone(&runner) as Arc<dyn Runner>, settings());
        (d, runner)
    }

    async fn accept(d: &Arc<Delivery>, retries: u32, key: Option<&str>) -> Accepted {
        d.accept(
            "f",
            "k",
            Bytes::from_static(b"{}"),
            retries,
            key.map(String::from),
            (),
        )
        .await
        .unwrap()
    }

    async fn final_record(d: &Delivery, id: &str) -> StoredInvocation {
        let r = d.wait(id, Duration::from_secs(5)).await.unwrap().unwrap();
        assert_ne!(r.state, AsyncState::Running);
        r
    }

    #[tokio::test]
    async fn failures_are_retried_then_dead_lettered_with_every_reason() {
        let dir = tempfile::tempdir().unwrap();
        let (d, runner) = setup(dir.path(), vec![BOOM]);
        let a = accept(&d, 2, None).await;
        let r = final_record(&d, &a.id).await;
        assert_eq!(r.state, AsyncState::Failed);
        assert_eq!(r.attempts, 3);
        assert_eq!(runner.runs.lock().len(), 3, "1 + 2 retries");
        assert_eq!(r.failures.len(), 3);
        assert!(r.failures[0].contains("handler_error"), "{:?}", r.failures);
        let dl = d
            .dead_letters(&DeadLetterFilter::default(), 10)
            .await
            .unwrap();
        assert_eq!(dl.len(), 1);
        let shown = serde_json::to_value(record_of(&r)).unwrap();
        assert_eq!(shown["status"], "failed");
        assert_eq!(shown["attempts"], 3);
        assert_eq!(shown["error"]["code"], "handler_error");
    }

    #[tokio::test]
    async fn a_retry_that_succeeds_is_the_one_result() {
        let dir = tempfile::tempdir().unwrap();
        let (d, runner) = setup(dir.path(), vec![BOOM, OK]);
        let a = accept(&d, 2, None).await;
        let r = final_record(&d, &a.id).await;
        assert_eq!(r.state, AsyncState::Succeeded);
        assert_eq!(r.attempts, 2);
        assert_eq!(runner.runs.lock().len(), 2);
        assert_eq!(record_of(&r).result.unwrap().get(), r#"{"x":1}"#);
    }

    #[tokio::test]
    async fn a_refused_request_is_not_retried_and_retries_zero_means_once() {
        let dir = tempfile::tempdir().unwrap();
        let (d, runner) = setup(dir.path(), vec![BAD]);
        let a = accept(&d, 2, None).await;
        assert_eq!(final_record(&d, &a.id).await.attempts, 1);
        let (d2, runner2) = setup(tempfile::tempdir().unwrap().path(), vec![BOOM]);
        let b = accept(&d2, 0, None).await;
        assert_eq!(final_record(&d2, &b.id).await.attempts, 1);
        assert_eq!(runner.runs.lock().len() + runner2.runs.lock().len(), 2);
    }

    #[tokio::test]
    async fn an_idempotency_key_returns_the_first_invocation() {
        let dir = tempfile::tempdir().unwrap();
        let (d, runner) = setup(dir.path(), vec![OK]);
        let a = accept(&d, 2, Some("order-7")).await;
        final_record(&d, &a.id).await;
        let b = accept(&d, 2, Some("order-7")).await;
        assert_eq!(b.id, a.id);
        assert!(b.replay && !a.replay);
        assert_eq!(runner.runs.lock().len(), 1, "not run again");
        let c = accept(&d, 2, Some("order-8")).await;
        assert_ne!(c.id, a.id);
    }

    #[tokio::test]
    async fn an_invocation_cut_by_a_crash_is_run_by_the_next_life() {
        let dir = tempfile::tempdir().unwrap();
        // A first life whose runner never answers: the process "dies" with it running.
        let store = Arc::new(SqliteAsyncStore::open(dir.path(), 100, 1 << 20).unwrap());
        struct Hang;
        #[async_trait]
        impl Runner for Hang {
            async fn run(&self, _: &StoredInvocation) -> Attempted {
                std::future::pending().await
            }
        }
        let first = Delivery::start(store, Arc::new(Hang), settings());
        let a = accept(&first, 2, None).await;
        drop(first);
        // The next life takes it over at start and runs it once.
        let (d, runner) = setup(dir.path(), vec![OK]);
        let r = final_record(&d, &a.id).await;
        assert_eq!(r.state, AsyncState::Succeeded);
        assert_eq!(r.attempts, 2, "the lost attempt is counted");
        assert_eq!(*runner.runs.lock(), vec![a.id.clone()]);
    }

    #[tokio::test]
    async fn an_answer_over_the_bound_is_kept_as_result_too_large() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SqliteAsyncStore::open(dir.path(), 100, 1 << 20).unwrap());
        let runner = Arc::new(Scripted {
            answers: Mutex::new(vec![OK]),
            runs: Mutex::new(Vec::new()),
        });
        let mut s = settings();
        s.max_answer_bytes = 20;
        let d = Delivery::start(store, runner, s);
        let a = accept(&d, 0, None).await;
        let r = final_record(&d, &a.id).await;
        assert_eq!(r.state, AsyncState::Failed);
        assert!(r.answer.unwrap().contains("result_too_large"));
    }
}
