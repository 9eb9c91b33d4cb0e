//! Per-invocation results: one CSV row per invocation, written by the load generator and the
//! simulator, read by `hearth report`.

use crate::csvio::{self, CsvOut};
use crate::error::{LoadgenError, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// How an invocation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Answered 200.
    Ok,
    /// Refused with 429 (queue full / overloaded).
    Dropped,
    /// Any other status, or no answer (connection error, client timeout).
    Error,
}

impl Outcome {
    pub fn from_status(status: u16) -> Self {
        match status {
            200 => Outcome::Ok,
            429 => Outcome::Dropped,
            _ => Outcome::Error,
        }
    }
}

/// One invocation. Times are µs since the run started; `e2e_us` runs from the *scheduled* send
/// time to the answer, so a late generator cannot hide queueing (no coordinated omission).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultRow {
    /// Index of the invocation in the trace (or per-run counter in a closed loop).
    pub id: u64,
    pub function: String,
    pub scheduled_us: u64,
    pub sent_us: u64,
    pub e2e_us: u64,
    pub outcome: Outcome,
    /// HTTP status; 0 when there was no answer.
    pub status: u16,
    pub cold: bool,
    /// `new`, `expired`, `evicted`, `concurrent`, `prewarm_miss`; empty when warm.
    #[serde(default)]
    pub cold_reason: String,
    #[serde(default)]
    pub worker: String,
    /// The server's timing breakdown (empty unless `outcome` is `ok`).
    pub queue_us: Option<u64>,
    pub init_us: Option<u64>,
    pub exec_us: Option<u64>,
    pub overhead_us: Option<u64>,
    pub server_e2e_us: Option<u64>,
    #[serde(default)]
    pub error: String,
}

impl ResultRow {
    /// How late the request left (actual − scheduled).
    pub fn lag_us(&self) -> u64 {
        self.sent_us.saturating_sub(self.scheduled_us)
    }

    /// Response time from the actual send: what the client saw of the system alone.
    pub fn response_us(&self) -> u64 {
        self.e2e_us.saturating_sub(self.lag_us())
    }

    /// When the answer arrived (µs since the run started).
    pub fn done_us(&self) -> u64 {
        self.scheduled_us + self.e2e_us
    }

    pub fn is_ok(&self) -> bool {
        self.outcome == Outcome::Ok
    }
}

/// Streams result rows to a CSV file.
pub struct ResultWriter {
    out: CsvOut,
}

impl ResultWriter {
    pub fn create(path: &Path) -> Result<Self> {
        Ok(ResultWriter {
            out: CsvOut::create(path)?,
        })
    }

    pub fn write(&mut self, row: &ResultRow) -> Result<()> {
        self.out.row(row)
    }

    pub fn finish(self) -> Result<()> {
        self.out.finish()
    }
}

/// Writes all rows at once.
pub fn write_results(path: &Path, rows: &[ResultRow]) -> Result<()> {
    let mut w = ResultWriter::create(path)?;
    for r in rows {
        w.write(r)?;
    }
    w.finish()
}

/// Reads a results file.
pub fn read_results(path: &Path) -> Result<Vec<ResultRow>> {
    let mut rows = Vec::new();
    csvio::read_rows(
        path,
        "results",
        &[
            &["id"],
            &["function"],
            &["scheduled_us"],
            &["sent_us"],
            &["e2e_us"],
            &["outcome"],
        ],
        |_, row: ResultRow| {
            rows.push(row);
            Ok(())
        },
    )?;
    if rows.is_empty() {
        return Err(LoadgenError::file(path, "the results file has no rows"));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn row(id: u64, function: &str, e2e_us: u64, outcome: Outcome) -> ResultRow {
        ResultRow {
            id,
            function: function.into(),
            scheduled_us: id * 1000,
            sent_us: id * 1000 + 40,
            e2e_us,
            outcome,
            status: match outcome {
                Outcome::Ok => 200,
                Outcome::Dropped => 429,
                Outcome::Error => 0,
            },
            cold: false,
            cold_reason: String::new(),
            worker: "w1".into(),
            queue_us: Some(1),
            init_us: Some(0),
            exec_us: Some(e2e_us / 2),
            overhead_us: Some(3),
            server_e2e_us: Some(e2e_us / 2 + 4),
            error: String::new(),
        }
    }

    #[test]
    fn round_trip_keeps_every_field() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.csv");
        let mut cold = row(1, "b", 9000, Outcome::Ok);
        cold.cold = true;
        cold.cold_reason = "new".into();
        let mut dropped = row(2, "a", 300, Outcome::Dropped);
        dropped.queue_us = None;
        dropped.error = "queue full, \"retry\"".into();
        let rows = vec![row(0, "a", 500, Outcome::Ok), cold, dropped];
        write_results(&p, &rows).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.starts_with("id,function,scheduled_us,sent_us,e2e_us,outcome,status,cold,cold_reason,worker,queue_us,init_us,exec_us,overhead_us,server_e2e_us,error\n"), "{text}");
        assert_eq!(read_results(&p).unwrap(), rows);
        assert_eq!(rows[0].lag_us(), 40);
        assert_eq!(rows[0].response_us(), 460);
    }

    #[test]
    fn a_file_that_is_not_results_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("trace.csv");
        std::fs::write(&p, "time_ms,function\n1,a\n").unwrap();
        let err = read_results(&p).unwrap_err().to_string();
        assert!(err.contains("not a results file"), "{err}");
    }
}
