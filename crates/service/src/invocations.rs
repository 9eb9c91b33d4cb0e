//! Async invocations: accepted with 202 and an id, run in the background, their answers kept for
//! a configurable time and within a bound in bytes.
//!
//! Ids are 128 random bits (a CSPRNG), so one caller cannot guess another's. The store holds at
//! most `max_records` invocations (a new one over it is refused) and at most `max_bytes` of
//! finished answers: storing an answer first drops the oldest finished ones until it fits, and
//! an answer larger than the whole bound is replaced by a `result_too_large` error.

use dashmap::DashMap;
use hearth_api::{AsyncOutcome, AsyncRecord, AsyncState, ErrorBody, ErrorCode, InvokeAnswer};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What a record costs besides its answer (id, function name, bookkeeping), counted so that
/// many tiny answers are bounded too.
const RECORD_OVERHEAD_BYTES: usize = 256;

struct Record {
    function: String,
    /// The id of the key that started it ("" without authentication): who may read it.
    owner: String,
    status: AsyncState,
    submitted_unix_ms: u64,
    finished: Option<Instant>,
    /// The answer a synchronous call would have got.
    outcome: Option<AsyncOutcome>,
    /// What the answer counts against the bound.
    bytes: usize,
}

/// Finished records, oldest first, and the bytes they hold.
#[derive(Default)]
struct Finished {
    order: VecDeque<(Instant, String)>,
    bytes: usize,
}

/// The store of async invocations.
pub struct AsyncInvocations {
    records: DashMap<String, Record>,
    finished: Mutex<Finished>,
    retention: Duration,
    max_records: usize,
    max_bytes: usize,
}

/// The default bound in bytes of finished answers kept.
pub const DEFAULT_ASYNC_MAX_BYTES: usize = 256 * 1024 * 1024;

impl AsyncInvocations {
    pub fn new(retention: Duration, max_records: usize) -> Self {
        AsyncInvocations {
            records: DashMap::new(),
            finished: Mutex::new(Finished::default()),
            retention,
            max_records,
            max_bytes: DEFAULT_ASYNC_MAX_BYTES,
        }
    }

    /// Bounds the bytes of finished answers kept.
    pub fn with_max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes.max(1);
        self
    }

    /// Records a new invocation of the function key `function` started by `owner` (a key id);
    /// None when the store is full.
    pub fn start(&self, function: &str, owner: &str) -> Option<String> {
        if self.records.len() >= self.max_records {
            return None;
        }
        let submitted_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        loop {
            let id = new_id();
            if let dashmap::Entry::Vacant(v) = self.records.entry(id.clone()) {
                v.insert(Record {
                    function: function.to_string(),
                    owner: owner.to_string(),
                    status: AsyncState::Running,
                    submitted_unix_ms,
                    finished: None,
                    outcome: None,
                    bytes: 0,
                });
                return Some(id);
            }
        }
    }

    /// Stores the outcome of a finished invocation, dropping the oldest finished answers if it
    /// would not fit under the bound otherwise.
    pub fn finish(&self, id: &str, outcome: AsyncOutcome) {
        let mut bytes = outcome_bytes(&outcome);
        let outcome = if bytes > self.max_bytes {
            let too_large = AsyncOutcome::Failed {
                http_status: 502,
                error: ErrorBody::new(
                    ErrorCode::ResultTooLarge,
                    format!(
                        "the answer ({bytes} bytes) is larger than the async store's limit of {} bytes",
                        self.max_bytes
                    ),
                ),
            };
            bytes = outcome_bytes(&too_large).min(self.max_bytes);
            too_large
        } else {
            outcome
        };
        let now = Instant::now();
        let mut fin = self.finished.lock();
        {
            let Some(mut r) = self.records.get_mut(id) else {
                return;
            };
            if r.outcome.is_some() {
                return;
            }
            r.status = match outcome {
                AsyncOutcome::Succeeded(_) => AsyncState::Succeeded,
                AsyncOutcome::Failed { .. } => AsyncState::Failed,
            };
            r.finished = Some(now);
            r.outcome = Some(outcome);
            r.bytes = bytes;
        }
        fin.bytes += bytes;
        fin.order.push_back((now, id.to_string()));
        while fin.bytes > self.max_bytes {
            let Some((_, old)) = fin.order.pop_front() else {
                break;
            };
            if let Some((_, r)) = self.records.remove(&old) {
                fin.bytes -= r.bytes;
                tracing::debug!(id = %old, "async result dropped early to stay under async_max_bytes");
            }
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
        let mut fin = self.finished.lock();
        while let Some((t, _)) = fin.order.front() {
            if now.saturating_duration_since(*t) < keep {
                break;
            }
            if let Some((_, id)) = fin.order.pop_front() {
                if let Some((_, r)) = self.records.remove(&id) {
                    fin.bytes -= r.bytes;
                }
            }
        }
    }

    pub fn running(&self) -> usize {
        self.records
            .iter()
            .filter(|r| r.status == AsyncState::Running)
            .count()
    }

    /// Bytes of finished answers held now.
    pub fn stored_bytes(&self) -> usize {
        self.finished.lock().bytes
    }
}

/// 128 bits from the thread's CSPRNG (ChaCha, seeded from the OS), as 32 hex digits.
pub fn new_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// What an answer counts against the store's bound: its result or error, plus the record.
fn outcome_bytes(outcome: &AsyncOutcome) -> usize {
    let answer = match outcome {
        AsyncOutcome::Succeeded(a) => a.result.get().len() + a.worker.len() + 256,
        AsyncOutcome::Failed { error, .. } => serde_json::to_vec(error).map_or(0, |v| v.len()),
    };
    answer + RECORD_OVERHEAD_BYTES
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
        assert_eq!(s.stored_bytes(), 0);
    }

    fn answer_of(result_bytes: usize) -> Vec<u8> {
        format!(
            r#"{{"result":"{}","cold":false,"worker":"w","timing":{{"queue":0,"init":0,"exec":1,"overhead":1,"e2e":2}}}}"#,
            "x".repeat(result_bytes)
        )
        .into_bytes()
    }

    #[test]
    fn many_large_answers_never_take_the_store_over_its_bound() {
        let bound = 1024 * 1024;
        let s = AsyncInvocations::new(Duration::from_secs(600), 1000).with_max_bytes(bound);
        let mut ids = Vec::new();
        for _ in 0..20 {
            let id = s.start("f", "").unwrap();
            s.finish_answer(&id, 200, &answer_of(200_000));
            assert!(s.stored_bytes() <= bound, "{}", s.stored_bytes());
            ids.push(id);
        }
        // The newest answers are kept, the oldest dropped first.
        assert_eq!(s.get(&ids[19]).unwrap().status, AsyncState::Succeeded);
        assert!(s.get(&ids[0]).is_none());
        let kept = ids.iter().filter(|id| s.get(id).is_some()).count();
        assert!((4..=5).contains(&kept), "{kept}");
        // Running records are never dropped to make room.
        let running = s.start("f", "").unwrap();
        for _ in 0..10 {
            let id = s.start("f", "").unwrap();
            s.finish_answer(&id, 200, &answer_of(200_000));
        }
        assert_eq!(s.get(&running).unwrap().status, AsyncState::Running);
        // An answer larger than the whole bound is kept as an error that says so.
        let huge = s.start("f", "").unwrap();
        s.finish_answer(&huge, 200, &answer_of(2 * bound));
        let v = serde_json::to_value(s.get(&huge).unwrap()).unwrap();
        assert_eq!(v["status"], "failed");
        assert_eq!(v["error"]["code"], "result_too_large", "{v}");
        assert!(s.stored_bytes() <= bound);
        s.expire(Instant::now() + Duration::from_secs(601));
        assert_eq!(s.stored_bytes(), 0);
    }

    #[test]
    fn ids_are_128_random_bits() {
        let s = AsyncInvocations::new(Duration::from_secs(1), 10);
        let a = s.start("f", "").unwrap();
        let b = s.start("f", "").unwrap();
        for id in [&a, &b] {
            assert_eq!(id.len(), 32, "{id}");
            assert!(id.bytes().all(|c| c.is_ascii_hexdigit()), "{id}");
        }
        // No shared prefix beyond chance (a per-process prefix plus a counter would share 8+).
        let common = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
        assert!(common < 8, "{a} {b}");
        let (x, y) = (
            u128::from_str_radix(&a, 16).unwrap(),
            u128::from_str_radix(&b, 16).unwrap(),
        );
        assert!(x.abs_diff(y) > 1 << 64, "{a} {b}");
    }
}
