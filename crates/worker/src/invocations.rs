//! Async invocations: accepted with 202 and an id, run in the background, their answers kept for
//! a configurable time.

use bytes::Bytes;
use dashmap::DashMap;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where an async invocation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Running,
    Succeeded,
    Failed,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Running => "running",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
        }
    }
}

struct Record {
    function: String,
    status: Status,
    submitted_unix_ms: u64,
    finished: Option<Instant>,
    /// The HTTP status and JSON body a synchronous call would have answered.
    answer: Option<(u16, Bytes)>,
}

/// The store of async invocations.
pub struct AsyncInvocations {
    records: DashMap<String, Record>,
    prefix: String,
    next: AtomicU64,
    retention: Duration,
    max_records: usize,
}

impl AsyncInvocations {
    pub fn new(retention: Duration, max_records: usize) -> Self {
        // A per-process prefix keeps ids unique across restarts of the worker.
        let prefix = format!("{:08x}", rand::random::<u32>());
        AsyncInvocations {
            records: DashMap::new(),
            prefix,
            next: AtomicU64::new(1),
            retention,
            max_records,
        }
    }

    /// Records a new invocation; None when the store is full.
    pub fn start(&self, function: &str) -> Option<String> {
        if self.records.len() >= self.max_records {
            return None;
        }
        let id = format!(
            "{}-{:x}",
            self.prefix,
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        let submitted_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.records.insert(
            id.clone(),
            Record {
                function: function.to_string(),
                status: Status::Running,
                submitted_unix_ms,
                finished: None,
                answer: None,
            },
        );
        Some(id)
    }

    /// Stores the answer of a finished invocation.
    pub fn finish(&self, id: &str, http_status: u16, body: Bytes) {
        if let Some(mut r) = self.records.get_mut(id) {
            r.status = if http_status < 300 {
                Status::Succeeded
            } else {
                Status::Failed
            };
            r.finished = Some(Instant::now());
            r.answer = Some((http_status, body));
        }
    }

    /// `{"id", "function", "status", "submitted_at_ms", "http_status"?, ...answer}`.
    pub fn get(&self, id: &str) -> Option<Value> {
        let r = self.records.get(id)?;
        let mut obj = serde_json::Map::new();
        if let Some((http_status, body)) = &r.answer {
            if let Ok(Value::Object(answer)) = serde_json::from_slice::<Value>(body) {
                obj = answer;
            }
            obj.insert("http_status".into(), json!(http_status));
        }
        obj.insert("id".into(), json!(id));
        obj.insert("function".into(), json!(r.function));
        obj.insert("status".into(), json!(r.status.as_str()));
        obj.insert("submitted_at_ms".into(), json!(r.submitted_unix_ms));
        Some(Value::Object(obj))
    }

    /// Forgets answers older than the retention time.
    pub fn expire(&self, now: Instant) {
        let keep = self.retention;
        self.records
            .retain(|_, r| r.finished.is_none_or(|t| now.duration_since(t) < keep));
    }

    pub fn running(&self) -> usize {
        self.records
            .iter()
            .filter(|r| r.status == Status::Running)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifecycle_and_retention() {
        let s = AsyncInvocations::new(Duration::from_millis(50), 2);
        let a = s.start("f").unwrap();
        let b = s.start("f").unwrap();
        assert_ne!(a, b);
        assert!(s.start("f").is_none(), "full store refuses");
        assert_eq!(s.get(&a).unwrap()["status"], "running");
        s.finish(
            &a,
            200,
            Bytes::from_static(br#"{"result":{"x":1},"cold":true}"#),
        );
        let got = s.get(&a).unwrap();
        assert_eq!(got["status"], "succeeded");
        assert_eq!(got["result"]["x"], 1);
        assert_eq!(got["http_status"], 200);
        s.finish(
            &b,
            502,
            Bytes::from_static(br#"{"error":{"code":"handler_error"}}"#),
        );
        assert_eq!(s.get(&b).unwrap()["status"], "failed");
        s.expire(Instant::now());
        assert!(s.get(&a).is_some());
        s.expire(Instant::now() + Duration::from_millis(60));
        assert!(s.get(&a).is_none() && s.get(&b).is_none());
    }
}
