//! Atoll's work off the invocation path (docs/atoll.md): every interval the balancer
//! re-estimates demand and re-allocates proactive sandboxes; its commands go to the workers,
//! each worker's as one batch at a time (`POST /v1/cluster/proactive`), and the answers confirm
//! creations to the balancer (or report them failed, so that it allocates them again).
//!
//! One sender task per worker keeps a worker's commands in order and never more than one batch
//! in flight to it; a slow worker delays only its own commands. Its queue is bounded: when full,
//! a tick's commands for that worker are dropped and their creations reported failed.

use crate::facade::Controller;
use crate::metrics::ProactiveLabel;
use hearth_api::{
    ProactiveAnswer, ProactiveCommand, ProactiveOp, ProactiveRequest, MAX_PROACTIVE_COMMANDS,
};
use hearth_core::balance::WorkerId;
use hearth_core::proactive::{AllocAction, Command};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::mpsc;

/// The worker's endpoint for proactive commands.
pub const PATH: &str = "/v1/cluster/proactive";
/// Most commands in one request (the worker's limit).
const MAX_BATCH: usize = MAX_PROACTIVE_COMMANDS;
/// Batches waiting for one worker before a tick's commands are dropped.
const QUEUE: usize = 8;
/// A batch may take this long: the worker answers within 30 s of its creations starting.
const BATCH_TIMEOUT: Duration = Duration::from_secs(60);

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
    let mut senders: HashMap<u32, mpsc::Sender<Vec<Command>>> = HashMap::new();
    loop {
        tick.tick().await;
        let Some(ctl) = c.upgrade() else {
            return;
        };
        if ctl.is_shutting_down() {
            return;
        }
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
            if let Err(e) = tx.try_send(batch) {
                let closed = matches!(e, mpsc::error::TrySendError::Closed(_));
                let batch = e.into_inner();
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

/// One worker's sender: batches in order, queued ones merged up to [`MAX_BATCH`].
async fn send_batches(c: Weak<Controller>, worker: WorkerId, mut rx: mpsc::Receiver<Vec<Command>>) {
    while let Some(mut batch) = rx.recv().await {
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(more) => batch.extend(more),
                Err(_) => break,
            }
        }
        let Some(ctl) = c.upgrade() else {
            return;
        };
        for chunk in batch.chunks(MAX_BATCH) {
            send(&ctl, worker, chunk).await;
        }
    }
}

/// Sends one batch and books its results.
async fn send(c: &Arc<Controller>, worker: WorkerId, batch: &[Command]) {
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
    let answer = m
        .forwarder(c.forwarder())
        .send(hyper::Method::POST, &m.url, PATH, body, BATCH_TIMEOUT)
        .await;
    let results = match answer {
        Ok(a) if a.is_success() => match serde_json::from_slice::<ProactiveAnswer>(&a.body) {
            Ok(b) if b.results.len() == sent.len() => b.results,
            _ => {
                tracing::warn!(worker = %m.name, "unreadable answer to proactive commands");
                return fail_all(c, worker, sent.iter().copied());
            }
        },
        Ok(a) => {
            tracing::warn!(worker = %m.name, status = %a.status, "worker refused proactive commands");
            return fail_all(c, worker, sent.iter().copied());
        }
        Err(e) => {
            tracing::warn!(worker = %m.name, "proactive commands not delivered: {e}");
            return fail_all(c, worker, sent.iter().copied());
        }
    };
    for (cmd, r) in sent.iter().zip(results) {
        if !r.ok {
            tracing::debug!(worker = %m.name, error = r.error.as_deref().unwrap_or(""), "proactive command refused");
        }
        book(c, worker, cmd, r.ok, if r.ok { "ok" } else { "refused" });
    }
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
