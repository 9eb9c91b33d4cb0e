//! Async invocations: accepted with 202 and an id, run in the background, their answers kept for
//! a configurable time.

use dashmap::DashMap;
use hearth_api::{AsyncOutcome, AsyncRecord, AsyncState, ErrorBody, ErrorCode, InvokeAnswer};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

struct Record {
    function: String,
    /// The id of the key that started it ("" without authentication): who may read it.
    owner: String,
    status: AsyncState,
    submitted_unix_ms: u64,
    finished: Option<Instant>,
    /// The answer a synchronous call would have got.
    outcome: Option<AsyncOutcome>,
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

    /// Records a new invocation of the function key `function` started by `owner` (a key id);
    /// None when the store is full.
    pub fn start(&self, function: &str, owner: &str) -> Option<String> {
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
                owner: owner.to_string(),
                status: AsyncState::Running,
                submitted_unix_ms,
                finished: None,
                outcome: None,
            },
        );
        Some(id)
    }

    /// Stores the outcome of a finished invocation.
    pub fn finish(&self, id: &str, outcome: AsyncOutcome) {
        if let Some(mut r) = self.records.get_mut(id) {
            r.status = match outcome {
                AsyncOutcome::Succeeded(_) => AsyncState::Succeeded,
                AsyncOutcome::Failed { .. } => AsyncState::Failed,
            };
            r.finished = Some(Instant::now());
            r.outcome = Some(outcome);
        }
    }

    /// Stores an answer as it came over the wire (a worker's, at the controller).
    pub fn finish_answer(&self, id: &str, http_status: u16, body: &[u8]) {
        self.finish(id, outcome_of(http_status, body));
    }

    /// The record, with the outcome's fields once finished.
    pub fn get(&self, id: &str) -> Option<AsyncRecord> {
        self.get_if(id, |_, _| true)
    }

    /// The record if `may_read(owner, function key)` allows it: to anyone else it does not exist.
    pub fn get_if(
        &self,
        id: &str,
        may_read: impl FnOnce(&str, &str) -> bool,
    ) -> Option<AsyncRecord> {
        let r = self.records.get(id)?;
        if !may_read(&r.owner, &r.function) {
            return None;
        }
        let mut record = AsyncRecord::running(id, &r.function, r.submitted_unix_ms);
        if let Some(outcome) = &r.outcome {
            record = record.finished(outcome);
        }
        record.status = r.status;
        Some(record)
    }

    /// Forgets answers older than the retention time.
    pub fn expire(&self, now: Instant) {
        let keep = self.retention;
        self.records
            .retain(|_, r| r.finished.map_or(true, |t| now.duration_since(t) < keep));
    }

    pub fn running(&self) -> usize {
        self.records
            .iter()
            .filter(|r| r.status == AsyncState::Running)
            .count()
    }
}

/// The typed outcome of an answer read off the wire; a body that is neither a success nor an
/// error answer is kept as an internal error that says so.
pub fn outcome_of(http_status: u16, body: &[u8]) -> AsyncOutcome {
    if (200..300).contains(&http_status) {
        if let Some(a) = InvokeAnswer::parse(body) {
            return AsyncOutcome::Succeeded(a);
        }
    } else if let Some(error) = ErrorBody::parse(body) {
        return AsyncOutcome::Failed { http_status, error };
    }
    AsyncOutcome::Failed {
        http_status: 502,
        error: ErrorBody::new(
            ErrorCode::Internal,
            format!("the answer (HTTP {http_status}) was not a Hearth answer"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifecycle_and_retention() {
        let s = AsyncInvocations::new(Duration::from_millis(50), 2);
        let a = s.start("f", "k1").unwrap();
        let b = s.start("f", "k2").unwrap();
        assert_ne!(a, b);
        assert!(s.start("f", "k1").is_none(), "full store refuses");
        // Only its owner (or whoever the check lets in) sees a record.
        assert!(s.get_if(&a, |owner, _| owner == "k1").is_some());
        assert!(s.get_if(&a, |owner, _| owner == "k2").is_none());
        assert_eq!(s.get(&a).unwrap().status, AsyncState::Running);
        s.finish_answer(
            &a,
            200,
            br#"{"result":{"x":1},"cold":true,"worker":"w","timing":{"queue":0,"init":0,"exec":1,"overhead":1,"e2e":2}}"#,
        );
        let got = serde_json::to_value(s.get(&a).unwrap()).unwrap();
        assert_eq!(got["status"], "succeeded");
        assert_eq!(got["result"]["x"], 1);
        assert_eq!(got["http_status"], 200);
        s.finish_answer(
            &b,
            502,
            br#"{"error":{"code":"handler_error","message":"m"}}"#,
        );
        assert_eq!(s.get(&b).unwrap().status, AsyncState::Failed);
        s.expire(Instant::now());
        assert!(s.get(&a).is_some());
        s.expire(Instant::now() + Duration::from_millis(60));
        assert!(s.get(&a).is_none() && s.get(&b).is_none());
    }
}
