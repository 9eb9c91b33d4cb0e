//! `POST /v1/cluster/proactive`: a controller's commands on a worker's proactive sandboxes
//! (Atoll, SoCC'21 §4.3; docs/atoll.md), and the worker's answer. Only cluster peers may send
//! it.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Most commands in one request: a batch larger than this is refused whole (400).
pub const MAX_PROACTIVE_COMMANDS: usize = 4096;

/// Largest request body (413 beyond): 4096 commands of the longest function key
/// (`namespace.name`, 97 characters) with their op fit in well under this.
pub const MAX_PROACTIVE_BODY_BYTES: usize = 1024 * 1024;

/// What to do with one proactive sandbox of a function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProactiveOp {
    /// Start one in the proactive pool's free room (never evicts).
    Create,
    /// Make one soft-evicted sandbox usable again.
    Unmark,
    /// Stop scheduling on one (kept warm, keeps its memory).
    SoftEvict,
    /// Destroy one, soft-evicted ones first.
    Evict,
}

impl ProactiveOp {
    /// The op as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ProactiveOp::Create => "create",
            ProactiveOp::Unmark => "unmark",
            ProactiveOp::SoftEvict => "soft-evict",
            ProactiveOp::Evict => "evict",
        }
    }
}

/// One command: `op` on one sandbox of `function` (the worker's function key, `name` or
/// `namespace.name`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProactiveCommand {
    pub op: ProactiveOp,
    pub function: String,
}

/// The request body: commands run in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProactiveRequest {
    pub commands: Vec<ProactiveCommand>,
}

/// Why one command did nothing, for a program to branch on (`error` says it for people).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProactiveFailure {
    /// The function is not registered on this worker (or its name is not a function key).
    UnknownFunction,
    /// The proactive pool's free room is smaller than the function's memory.
    PoolFull,
    /// No sandbox of the function to un-mark, soft-evict or evict.
    NothingToDo,
    /// The sandbox could not be started (it is gone; its memory is free again).
    StartFailed,
    /// The proactive pool is off on this worker.
    Disabled,
    /// The worker is shutting down.
    ShuttingDown,
}

/// The outcome of one command, in the order sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProactiveResult {
    pub ok: bool,
    /// Why it failed: a sentence (never a host path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<ProactiveFailure>,
    /// A create still starting when the answer's wait ran out: it counts in `starting` and
    /// becomes usable when ready (a later failure shows in the status report's counts).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub still_starting: bool,
}

impl ProactiveResult {
    pub fn ok() -> Self {
        ProactiveResult {
            ok: true,
            error: None,
            code: None,
            still_starting: false,
        }
    }

    pub fn failed(code: ProactiveFailure, error: impl Into<String>) -> Self {
        ProactiveResult {
            ok: false,
            error: Some(error.into()),
            code: Some(code),
            still_starting: false,
        }
    }
}

/// A worker's proactive sandboxes of one function.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProactiveCounts {
    /// Ready and schedulable: idle or running an invocation.
    #[serde(default)]
    pub active: u32,
    /// Soft-evicted: idle, kept warm, not scheduled.
    #[serde(default)]
    pub soft: u32,
    /// Being started.
    #[serde(default)]
    pub starting: u32,
}

/// The answer (200): one result per command, and the counts of every function a command named
/// as they are once the batch is done.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProactiveAnswer {
    pub results: Vec<ProactiveResult>,
    #[serde(default)]
    pub functions: BTreeMap<String, ProactiveCounts>,
}

/// The media type of a streamed answer: a controller that sends `Accept: application/x-ndjson`
/// gets the [`ProactiveAnswer`] as its first line as soon as every command is applied (creates
/// still starting say `still_starting`), then one [`ProactiveStarted`] line per such create as
/// it becomes ready or fails. It need not wait for the slowest start of a batch to send the next
/// batch or to route to the sandboxes already up.
pub const PROACTIVE_STREAM_TYPE: &str = "application/x-ndjson";

/// A streamed answer's later line: the create at `index` of the request is ready (`ok`) or
/// failed to start. Creates with no such line by the stream's end are still starting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProactiveStarted {
    pub index: usize,
    pub result: ProactiveResult,
}

/// A worker's proactive pool, MiB: its size, the memory its sandboxes hold (in every state),
/// and the room left.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProactivePoolStatus {
    #[serde(default)]
    pub pool_mb: u64,
    #[serde(default)]
    pub used_mb: u64,
    #[serde(default)]
    pub free_mb: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_request_reads_kebab_case_ops_and_refuses_unknown_ones() {
        let r: ProactiveRequest = serde_json::from_value(json!({"commands": [
            {"op": "create", "function": "f"},
            {"op": "soft-evict", "function": "t.g"},
        ]}))
        .unwrap();
        assert_eq!(r.commands[1].op, ProactiveOp::SoftEvict);
        assert_eq!(r.commands[1].function, "t.g");
        let bad = serde_json::from_value::<ProactiveRequest>(
            json!({"commands": [{"op": "soft_evict", "function": "f"}]}),
        );
        assert!(bad.is_err());
    }

    #[test]
    fn results_say_only_what_applies() {
        assert_eq!(
            serde_json::to_value(ProactiveResult::ok()).unwrap(),
            json!({"ok": true})
        );
        let f = ProactiveResult::failed(ProactiveFailure::PoolFull, "proactive pool full");
        assert_eq!(
            serde_json::to_value(&f).unwrap(),
            json!({"ok": false, "error": "proactive pool full", "code": "pool_full"})
        );
    }
}
