//! An invocation's answer, its timing and cold reason, and the records of async invocations.

use crate::error::{ErrorBody, ErrorObject};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// Per-invocation timing in microseconds (DESIGN.md §4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timing {
    /// Waiting in the worker's queue.
    pub queue: u64,
    /// Sandbox creation and handler import; 0 when warm.
    pub init: u64,
    /// The handler's own time, measured inside the sandbox.
    pub exec: u64,
    /// The control plane's own cost: `e2e − queue − init − exec`.
    pub overhead: u64,
    pub e2e: u64,
    /// The controller's share of `overhead` (present when a controller forwarded the call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<u64>,
}

impl Timing {
    /// Adds the controller's own time: `total_us` at the controller minus the worker's `e2e`.
    /// `overhead` and `e2e` grow by it, so `overhead` stays the whole control plane's cost.
    pub fn add_controller(&mut self, total_us: u64) {
        let ours = total_us.saturating_sub(self.e2e);
        self.overhead += ours;
        self.e2e += ours;
        self.controller = Some(ours);
    }
}

/// Why an invocation needed a new sandbox, as named in answers and metric labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ColdReason {
    New,
    Expired,
    Evicted,
    Concurrent,
    PrewarmMiss,
}

impl ColdReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ColdReason::New => "new",
            ColdReason::Expired => "expired",
            ColdReason::Evicted => "evicted",
            ColdReason::Concurrent => "concurrent",
            ColdReason::PrewarmMiss => "prewarm_miss",
        }
    }
}

impl From<hearth_core::ColdReason> for ColdReason {
    fn from(r: hearth_core::ColdReason) -> Self {
        use hearth_core::ColdReason as C;
        match r {
            C::New => ColdReason::New,
            C::Expired { .. } => ColdReason::Expired,
            C::Evicted { .. } => ColdReason::Evicted,
            C::Concurrent => ColdReason::Concurrent,
            C::PrewarmMiss => ColdReason::PrewarmMiss,
        }
    }
}

/// How a cold start got its sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ColdPath {
    /// A pre-made generic sandbox of the function's dependency layer, its modules already
    /// imported, was specialized to the function (issue 32).
    Preimported,
    /// A pre-made generic sandbox was specialized to the function.
    Generic,
    /// The sandbox was created from nothing.
    Fresh,
}

impl ColdPath {
    pub fn as_str(self) -> &'static str {
        match self {
            ColdPath::Preimported => "preimported",
            ColdPath::Generic => "generic",
            ColdPath::Fresh => "fresh",
        }
    }
}

/// A successful invocation's answer (200): `{"result", "cold", "cold_reason"?,
/// "cold_reason_policy"?, "cold_reason_ago_us"?, "cold_path"?, "worker", "timing"}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InvokeAnswer {
    /// The handler's result, exactly as the sandbox produced it.
    pub result: Box<RawValue>,
    pub cold: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_reason: Option<ColdReason>,
    /// For `expired` and `evicted`: the keep-alive policy that let the sandbox go …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_reason_policy: Option<String>,
    /// … and how long before this invocation it went.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_reason_ago_us: Option<u64>,
    /// For a cold start: whether a generic sandbox was specialized or one was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_path: Option<ColdPath>,
    pub worker: String,
    pub timing: Timing,
    /// The deadline it ran against, in ms from when the platform accepted it (the call's
    /// `Hearth-Deadline-Ms`, else the function's `deadline_ms`); absent without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// Whether it ended after that deadline …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_missed: Option<bool>,
    /// … and by how much: the time left when it ended, in µs (negative: how late it was).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_margin_us: Option<i64>,
    /// For an invocation that ran on a GPU: which, and how its sandbox started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<crate::gpu::GpuPlacement>,
}

impl InvokeAnswer {
    /// Judges the answer against its `deadline_ms`, `total_us` after the platform accepted the
    /// invocation (a controller judges again with its own, longer, total).
    pub fn judge_deadline(&mut self, total_us: u64) {
        if let Some(d) = self.deadline_ms {
            let margin = (d as i64).saturating_mul(1000) - total_us.min(i64::MAX as u64) as i64;
            self.deadline_missed = Some(margin < 0);
            self.deadline_margin_us = Some(margin);
        }
    }

    /// Reads an answer; `None` when the body is not a success answer.
    pub fn parse(body: &[u8]) -> Option<Self> {
        serde_json::from_slice(body).ok()
    }

    /// The JSON text.
    pub fn to_vec(&self) -> Vec<u8> {
        // Raw JSON, strings and integers cannot fail to serialize.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The cold reason together with the keep-alive policy and the age it was reported with.
    pub fn with_cold_reason(
        mut self,
        reason: hearth_core::ColdReason,
        policy: &str,
    ) -> InvokeAnswer {
        self.cold = true;
        self.cold_reason = Some(reason.into());
        if let Some(ago) = reason.ago_us() {
            self.cold_reason_policy = Some(policy.to_string());
            self.cold_reason_ago_us = Some(ago);
        }
        self
    }
}

/// Checks that `bytes` are one JSON value and keeps them as they are.
pub fn raw_json(bytes: &[u8]) -> Result<Box<RawValue>, serde_json::Error> {
    let text = std::str::from_utf8(bytes).map_err(serde::de::Error::custom)?;
    RawValue::from_string(text.to_string())
}

/// 202 to an async invocation: `{"id", "status": "running", "url"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AsyncAccepted {
    pub id: String,
    pub status: AsyncState,
    pub url: String,
}

impl AsyncAccepted {
    pub fn new(id: &str) -> Self {
        AsyncAccepted {
            id: id.to_string(),
            status: AsyncState::Running,
            url: format!("/v1/invocations/{id}"),
        }
    }
}

/// Where an async invocation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AsyncState {
    Running,
    Succeeded,
    Failed,
}

/// `GET /v1/invocations/{id}`: the record, and once finished the fields of the answer a
/// synchronous call would have got (a success answer's fields, or `error`) plus its
/// `http_status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AsyncRecord {
    pub id: String,
    pub function: String,
    pub status: AsyncState,
    pub submitted_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Box<RawValue>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_reason: Option<ColdReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_reason_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_reason_ago_us: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<Timing>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorObject>,
    /// Attempts started (retries and re-dispatches after a crash included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// Why each failed attempt failed, oldest first: a `failed` record's dead-letter reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<String>,
}

/// How an async invocation ended: the answer a synchronous call would have got.
#[derive(Debug, Clone)]
pub enum AsyncOutcome {
    Succeeded(InvokeAnswer),
    Failed { http_status: u16, error: ErrorBody },
}

impl AsyncRecord {
    /// A record still running.
    pub fn running(id: &str, function: &str, submitted_at_ms: u64) -> Self {
        AsyncRecord {
            id: id.to_string(),
            function: function.to_string(),
            status: AsyncState::Running,
            submitted_at_ms,
            http_status: None,
            result: None,
            cold: None,
            cold_reason: None,
            cold_reason_policy: None,
            cold_reason_ago_us: None,
            worker: None,
            timing: None,
            error: None,
            attempts: None,
            failures: Vec::new(),
        }
    }

    /// The record with its outcome filled in.
    pub fn finished(mut self, outcome: &AsyncOutcome) -> Self {
        match outcome {
            AsyncOutcome::Succeeded(a) => {
                self.status = AsyncState::Succeeded;
                self.http_status = Some(200);
                self.result = Some(a.result.clone());
                self.cold = Some(a.cold);
                self.cold_reason = a.cold_reason;
                self.cold_reason_policy = a.cold_reason_policy.clone();
                self.cold_reason_ago_us = a.cold_reason_ago_us;
                self.worker = Some(a.worker.clone());
                self.timing = Some(a.timing);
            }
            AsyncOutcome::Failed { http_status, error } => {
                self.status = AsyncState::Failed;
                self.http_status = Some(*http_status);
                self.error = Some(error.error.clone());
            }
        }
        self
    }
}

/// `POST /v1/functions/{name}/prewarm`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrewarmAnswer {
    pub function: String,
    pub requested: u32,
    pub ready: u32,
    pub no_memory: u32,
    pub errors: Vec<String>,
    /// The worker that started them (from a controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &str = r#"{"result":{"timing":{"e2e":1},"cold":true},"cold":false,"worker":"w","timing":{"queue":0,"init":0,"exec":1000,"overhead":40,"e2e":1040}}"#;

    #[test]
    fn an_answer_round_trips_with_its_result_untouched() {
        let a = InvokeAnswer::parse(BODY.as_bytes()).unwrap();
        assert_eq!(a.result.get(), r#"{"timing":{"e2e":1},"cold":true}"#);
        assert!(!a.cold);
        assert_eq!(a.timing.e2e, 1040);
        assert_eq!(String::from_utf8(a.to_vec()).unwrap(), BODY);
    }

    #[test]
    fn the_controller_time_is_added_to_overhead_and_e2e() {
        let mut a = InvokeAnswer::parse(BODY.as_bytes()).unwrap();
        a.timing.add_controller(1100);
        let v: serde_json::Value = serde_json::from_slice(&a.to_vec()).unwrap();
        assert_eq!(v["timing"]["controller"], 60);
        assert_eq!(v["timing"]["overhead"], 100);
        assert_eq!(v["timing"]["e2e"], 1100);
        assert_eq!(v["timing"]["exec"], 1000);
        assert_eq!(v["result"]["timing"]["e2e"], 1, "the result is not touched");
    }

    #[test]
    fn cold_reasons_carry_policy_and_age_only_when_they_have_one() {
        let base = InvokeAnswer::parse(BODY.as_bytes()).unwrap();
        let a = base
            .clone()
            .with_cold_reason(hearth_core::ColdReason::Expired { ago_us: 7 }, "ttl");
        let v: serde_json::Value = serde_json::from_slice(&a.to_vec()).unwrap();
        assert_eq!(
            (
                &v["cold"],
                &v["cold_reason"],
                &v["cold_reason_policy"],
                &v["cold_reason_ago_us"]
            ),
            (&true.into(), &"expired".into(), &"ttl".into(), &7.into())
        );
        let a = base.with_cold_reason(hearth_core::ColdReason::PrewarmMiss, "ttl");
        let v: serde_json::Value = serde_json::from_slice(&a.to_vec()).unwrap();
        assert_eq!(v["cold_reason"], "prewarm_miss");
        assert!(v.get("cold_reason_policy").is_none());
    }

    #[test]
    fn raw_json_refuses_what_is_not_json() {
        assert!(raw_json(b"{\"a\": [1, 2]}").is_ok());
        assert!(raw_json(b"{\"a\": ").is_err());
        assert!(raw_json(b"\xff").is_err());
    }

    #[test]
    fn a_finished_record_carries_the_answer_fields() {
        let a = InvokeAnswer::parse(BODY.as_bytes()).unwrap();
        let r = AsyncRecord::running("x-1", "f", 5).finished(&AsyncOutcome::Succeeded(a));
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(v["status"], "succeeded");
        assert_eq!(v["http_status"], 200);
        assert_eq!(v["result"]["cold"], true);
        let back: AsyncRecord = serde_json::from_value(v).unwrap();
        assert_eq!(back.timing.map(|t| t.exec), Some(1000));
        let failed = AsyncRecord::running("x-2", "f", 5).finished(&AsyncOutcome::Failed {
            http_status: 504,
            error: ErrorBody::new(crate::ErrorCode::Timeout, "slow"),
        });
        let v: serde_json::Value = serde_json::to_value(&failed).unwrap();
        assert_eq!(
            (v["status"].as_str(), v["error"]["code"].as_str()),
            (Some("failed"), Some("timeout"))
        );
        assert!(v.get("result").is_none());
    }
}
