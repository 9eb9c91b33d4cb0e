//! Atoll's work off the invocation path (docs/atoll.md): every interval the balancer
//! re-estimates demand and re-allocates proactive sandboxes; its commands go to the workers,
//! each worker's in ordered batches (`POST /v1/cluster/proactive`), and the answers confirm
//! creations to the balancer (or report them failed, so that it allocates them again).
//!
//! One sender task per worker keeps a worker's commands in order: the next batch goes once the
//! worker has applied the previous one. Answers stream (`application/x-ndjson`): each create is
//! confirmed when its sandbox is up, not when the slowest of its batch is, so routing finds the
//! sandboxes already up and a batch of slow starts holds back nothing but its own creates (at
//! most [`STREAMS`] batches stream per worker). A slow worker delays only its own commands. Its queue is bounded: when full,
//! a tick's commands for that worker are dropped and their creations reported failed.

use crate::facade::Controller;
use crate::metrics::ProactiveLabel;
use hearth_api::{
    ProactiveAnswer, ProactiveCommand, ProactiveOp, ProactiveRequest, ProactiveStarted,
    MAX_PROACTIVE_COMMANDS,
};
use hearth_core::balance::WorkerId;
use hearth_core::proactive::{AllocAction, Command};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

/// The worker's endpoint for proactive commands.
pub const PATH: &str = "/v1/cluster/proactive";
/// Most commands in one request (the worker's limit).
const MAX_BATCH: usize = MAX_PROACTIVE_COMMANDS;
/// Batches waiting for one worker before a tick's commands are dropped.
const QUEUE: usize = 8;
/// A batch's answer may take this long: the worker ends it within 30 s of its creations
/// starting.
const BATCH_TIMEOUT: Duration = Duration::from_secs(60);
/// Answers still streaming per worker before the next batch waits: creations in flight are
/// bounded by this many batches.
const STREAMS: usize = 8;
/// Longest line of an answer: the results of [`MAX_BATCH`] commands with their messages.
const MAX_ANSWER_LINE: usize = 4 * 1024 * 1024;

/// A worker's report counts as made after its last command had been applied only when it
/// arrived this long after that (longer than a status push may take in transit).
const REPORT_GRACE: Duration = Duration::from_secs(3);

/// One worker's commands as the tick loop sees them: how many are queued or under way, and
/// since when none has been. A report that arrived well after that shows what the worker
/// holds, and sandboxes it no longer holds were lost (docs/atoll.md, "In a cluster").
struct Pending {
    open: AtomicUsize,
    quiet_since: Mutex<Instant>,
}

impl Pending {
    fn new() -> Arc<Self> {
        Arc::new(Pending {
            open: AtomicUsize::new(0),
            quiet_since: Mutex::new(Instant::now()),
        })
    }

    fn add(self: &Arc<Self>, n: usize) -> Open {
        self.open.fetch_add(n, Ordering::AcqRel);
        Open {
            pending: Arc::clone(self),
            n,
        }
    }

    /// When the worker last had no command under way; None while it has some.
    fn quiet_since(&self) -> Option<Instant> {
        let since = *self.quiet_since.lock();
        (self.open.load(Ordering::Acquire) == 0).then_some(since)
    }
}

/// Commands counted as under way until this is dropped (their answer is over, or they were
/// given up).
struct Open {
    pending: Arc<Pending>,
    n: usize,
}

impl Open {
    /// Splits `n` commands off into their own guard.
    fn split(&mut self, n: usize) -> Open {
        let n = n.min(self.n);
        self.n -= n;
        Open {
            pending: Arc::clone(&self.pending),
            n,
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        if self.n == 0 {
            return;
        }
        let mut since = self.pending.quiet_since.lock();
        if self.pending.open.fetch_sub(self.n, Ordering::AcqRel) == self.n {
            *since = Instant::now();
        }
    }
}

/// The wire op of an action and its function (None for `Skipped`, which is not sent).
pub fn op(action: &AllocAction) -> Option<(ProactiveOp, &str)> {
    match action {
        AllocAction::Create { function, .. } => Some((ProactiveOp::Create, function)),
        AllocAction::Unmark { function, .. } => Some((ProactiveOp::Unmark, function)),
        AllocAction::SoftEvict { function, .. } => Some((ProactiveOp::SoftEvict, function)),
        AllocAction::Evict { function, .. } => Some((ProactiveOp::Evict, function)),
        AllocAction::Skipped { .. } => None,
    }
}

/// The tick loop: runs until the controller is gone or shutting down.
pub async fn run(c: Weak<Controller>, interval_us: u64) {
    let mut tick = tokio::time::interval(Duration::from_micros(interval_us.max(1_000)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut senders: HashMap<u32, mpsc::Sender<(Vec<Command>, Open)>> = HashMap::new();
    let mut pending: HashMap<u32, Arc<Pending>> = HashMap::new();
    let mut reconciled: HashMap<u32, Instant> = HashMap::new();
    loop {
        tick.tick().await;
        let Some(ctl) = c.upgrade() else {
            return;
        };
        if ctl.is_shutting_down() {
            return;
        }
        // Before this tick plans anything: the commands of earlier ticks are all counted.
        reconcile(&ctl, &mut pending, &mut reconciled);
        let commands = ctl.driver().atoll_tick();
        let mut by_worker: BTreeMap<u32, Vec<Command>> = BTreeMap::new();
        for cmd in commands {
            by_worker.entry(cmd.worker).or_default().push(cmd);
        }
        for (w, batch) in by_worker {
            let tx = senders.entry(w).or_insert_with(|| {
                let (tx, rx) = mpsc::channel(QUEUE);
                tokio::spawn(send_batches(c.clone(), WorkerId(w), rx));
                tx
            });
            let open = pending
                .entry(w)
                .or_insert_with(Pending::new)
                .add(batch.len());
            if let Err(e) = tx.try_send((batch, open)) {
                let closed = matches!(e, mpsc::error::TrySendError::Closed(_));
                let (batch, _open) = e.into_inner();
                tracing::warn!(
                    worker = w,
                    commands = batch.len(),
                    "proactive commands dropped: the worker's queue is full"
                );
                fail_all(&ctl, WorkerId(w), &batch);
                if closed {
                    senders.remove(&w);
                }
            }
        }
    }
}

/// Forgets the proactive sandboxes each quiet worker has lost: a worker with no command under
/// way whose report arrived [`REPORT_GRACE`] after its last one ended, once per report.
fn reconcile(
    ctl: &Controller,
    pending: &mut HashMap<u32, Arc<Pending>>,
    reconciled: &mut HashMap<u32, Instant>,
) {
    let members = ctl.driver().members();
    let ids: HashSet<u32> = members.iter().map(|m| m.id.0).collect();
    pending.retain(|w, p| p.open.load(Ordering::Acquire) > 0 || ids.contains(w));
    reconciled.retain(|w, _| ids.contains(w));
    for m in members {
        let Some(at) = m.report_at() else {
            continue;
        };
        let quiet = match pending.get(&m.id.0) {
            Some(p) => p.quiet_since(),
            None => Some(ctl.driver().started()),
        };
        let trusted = quiet.is_some_and(|q| at >= q + REPORT_GRACE);
        if !trusted || reconciled.get(&m.id.0) == Some(&at) {
            continue;
        }
        // The report itself (a newer one than `at` is as trustworthy).
        let Some((report, at)) = m.report() else {
            continue;
        };
        reconciled.insert(m.id.0, at);
        let lost = ctl.driver().atoll_reconcile(m.id, &report);
        if lost > 0 {
            tracing::info!(worker = %m.name, lost, "proactive sandboxes lost on the worker are allocated again");
            ctl.metrics
                .proactive
                .get_or_create(&ProactiveLabel {
                    op: "create",
                    result: "lost",
                })
                .inc_by(u64::from(lost));
        }
    }
}

/// One worker's sender: batches in order, queued ones merged up to [`MAX_BATCH`].
async fn send_batches(
    c: Weak<Controller>,
    worker: WorkerId,
    mut rx: mpsc::Receiver<(Vec<Command>, Open)>,
) {
    let streams = Arc::new(Semaphore::new(STREAMS));
    while let Some((mut batch, mut open)) = rx.recv().await {
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok((more, mut more_open)) => {
                    batch.extend(more);
                    open.n += more_open.n;
                    more_open.n = 0;
                }
                Err(_) => break,
            }
        }
        let Some(ctl) = c.upgrade() else {
            return;
        };
        for chunk in batch.chunks(MAX_BATCH) {
            let Ok(permit) = Arc::clone(&streams).acquire_owned().await else {
                return;
            };
            let chunk_open = open.split(chunk.len());
            send(&ctl, worker, chunk, permit, chunk_open).await;
        }
    }
}

/// Sends one batch and books its results: at once those of the commands the worker applied,
/// then, from a task holding `permit`, each create's as the worker reports it started.
async fn send(
    c: &Arc<Controller>,
    worker: WorkerId,
    batch: &[Command],
    permit: OwnedSemaphorePermit,
    open: Open,
) {
    let Some(m) = c.driver().member(worker) else {
        fail_all(c, worker, batch);
        return;
    };
    // The worker must know a function before it can make its sandboxes.
    let mut ready: HashMap<&str, bool> = HashMap::new();
    for cmd in batch {
        let Some((_, name)) = op(&cmd.action) else {
            continue;
        };
        if !ready.contains_key(name) {
            let ok = c.register_on(&m, name).await;
            ready.insert(name, ok);
        }
    }
    let (sent, commands): (Vec<&Command>, Vec<ProactiveCommand>) = batch
        .iter()
        .filter_map(|cmd| {
            let (op, name) = op(&cmd.action)?;
            if ready.get(name) == Some(&true) {
                Some((
                    cmd,
                    ProactiveCommand {
                        op,
                        function: name.to_string(),
                    },
                ))
            } else {
                book(c, worker, cmd, false, "failed");
                None
            }
        })
        .unzip();
    if commands.is_empty() {
        return;
    }
    let body = match serde_json::to_vec(&ProactiveRequest { commands }) {
        Ok(b) => bytes::Bytes::from(b),
        Err(_) => return fail_all(c, worker, sent.iter().copied()),
    };
    let streamed = m
        .forwarder(c.forwarder())
        .send_streamed(
            hyper::Method::POST,
            &m.url,
            PATH,
            body,
            BATCH_TIMEOUT,
            MAX_ANSWER_LINE,
        )
        .await;
    let (status, mut lines) = match streamed {
        Ok(x) => x,
        Err(e) => {
            tracing::warn!(worker = %m.name, "proactive commands not delivered: {e}");
            return fail_all(c, worker, sent.iter().copied());
        }
    };
    if !status.is_success() {
        tracing::warn!(worker = %m.name, %status, "worker refused proactive commands");
        return fail_all(c, worker, sent.iter().copied());
    }
    let first = match lines.next().await {
        Ok(Some(line)) => serde_json::from_slice::<ProactiveAnswer>(&line).ok(),
        _ => None,
    };
    let Some(answer) = first.filter(|a| a.results.len() == sent.len()) else {
        tracing::warn!(worker = %m.name, "unreadable answer to proactive commands");
        return fail_all(c, worker, sent.iter().copied());
    };
    // Every command is applied now; creates still starting are confirmed line by line.
    let mut starting: HashMap<usize, Command> = HashMap::new();
    for (i, (cmd, r)) in sent.iter().zip(answer.results).enumerate() {
        if r.ok && r.still_starting {
            starting.insert(i, (*cmd).clone());
            continue;
        }
        if !r.ok {
            tracing::debug!(worker = %m.name, error = r.error.as_deref().unwrap_or(""), "proactive command refused");
        }
        book(c, worker, cmd, r.ok, if r.ok { "ok" } else { "refused" });
    }
    if starting.is_empty() {
        return;
    }
    let c = Arc::downgrade(c);
    let name = m.name.clone();
    tokio::spawn(async move {
        let _permit = permit;
        let _open = open;
        let ended = loop {
            match lines.next().await {
                Ok(Some(line)) => {
                    let Ok(s) = serde_json::from_slice::<ProactiveStarted>(&line) else {
                        break false;
                    };
                    let (Some(cmd), Some(c)) = (starting.remove(&s.index), c.upgrade()) else {
                        continue;
                    };
                    let ok = s.result.ok;
                    if !ok {
                        tracing::debug!(worker = %name, error = s.result.error.as_deref().unwrap_or(""), "proactive sandbox failed to start");
                    }
                    book(&c, worker, &cmd, ok, if ok { "ok" } else { "refused" });
                }
                Ok(None) => break true,
                Err(e) => {
                    tracing::warn!(worker = %name, "proactive answer cut short: {e}");
                    break false;
                }
            }
        };
        let Some(c) = c.upgrade() else {
            return;
        };
        // The worker's wait ran out on these: they go on starting, as counted. An answer cut
        // short says nothing of them: they are allocated again.
        for cmd in starting.values() {
            book(&c, worker, cmd, ended, if ended { "ok" } else { "failed" });
        }
    });
}

/// Books one command's result: a creation's confirms or un-does the balancer's allocation.
fn book(c: &Controller, worker: WorkerId, cmd: &Command, ok: bool, result: &'static str) {
    let Some((op, name)) = op(&cmd.action) else {
        return;
    };
    if op == ProactiveOp::Create {
        c.driver().atoll_created(worker, name, ok);
    }
    c.metrics
        .proactive
        .get_or_create(&ProactiveLabel {
            op: op.as_str(),
            result,
        })
        .inc();
}

/// Books every command of a batch that never reached the worker (or whose answer was lost).
fn fail_all<'a>(c: &Controller, worker: WorkerId, batch: impl IntoIterator<Item = &'a Command>) {
    for cmd in batch {
        book(c, worker, cmd, false, "failed");
    }
}
