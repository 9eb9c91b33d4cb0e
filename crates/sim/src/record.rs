//! What the simulator reports: one [`Record`] per invocation when it ends, and each worker's
//! status when it pushes it. A [`Sink`] receives them: the CSV sink writes the load generator's
//! results format (`hearth report` reads both); experiments aggregate in memory instead.

use crate::error::Result;
use crate::workload::Workload;
use hearth_core::autoscale::ScaleDecision;
use hearth_core::balance::{Rejection, WorkerLoad};
use hearth_core::{ColdReason, Micros, Reject};
use hearth_loadgen::{Outcome, ResultRow, ResultWriter};
use std::path::Path;

/// Why an invocation was dropped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Refusal {
    /// The balancer refused it (CH-RLU: every worker over `b_max`).
    Balancer(Rejection),
    /// The worker refused it, at once or later from its queue.
    Worker(Reject),
}

impl Refusal {
    /// The HTTP status the real controller or worker would answer.
    pub fn status(&self) -> u16 {
        match self {
            Refusal::Balancer(Rejection::NoWorkers) | Refusal::Worker(Reject::ShuttingDown) => 503,
            Refusal::Worker(Reject::Late { .. }) => 504,
            _ => 429,
        }
    }

    /// `code: message`, as the load generator records a refusal.
    pub fn describe(&self) -> String {
        match self {
            Refusal::Balancer(Rejection::NoWorkers) => "no_workers: no worker is up".into(),
            Refusal::Balancer(Rejection::Overloaded { load, b_max }) => format!(
                "overloaded: every worker is over the load bound (least-loaded {load:.2} > b_max {b_max:.2})"
            ),
            Refusal::Worker(Reject::QueueFull { length }) => {
                format!("queue_full: the worker's invocation queue is full ({length} waiting)")
            }
            Refusal::Worker(Reject::NoMemory { needed_mb, free_mb }) => format!(
                "overloaded: no memory for a new sandbox: it needs {needed_mb} MiB and {free_mb} MiB are free"
            ),
            Refusal::Worker(Reject::TooLarge {
                needed_mb,
                budget_mb,
            }) => format!(
                "insufficient_memory: {needed_mb} MiB per sandbox, budget {budget_mb} MiB"
            ),
            Refusal::Worker(Reject::ShuttingDown) => "shutting_down: the worker is stopping".into(),
            Refusal::Worker(Reject::Late { late_by_us }) => format!(
                "deadline_passed: dropped {late_by_us} µs past its deadline, before it started"
            ),
        }
    }
}

/// How an invocation ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum End {
    /// It ran. Times in µs: waiting in the worker's queue, the cold start's init delay, and
    /// execution (stretched by processor sharing).
    Done {
        cold: Option<ColdReason>,
        queue_us: Micros,
        init_us: Micros,
        exec_us: Micros,
    },
    Dropped(Refusal),
    /// It ran past its function's timeout: killed `timeout_us` after it started executing, its
    /// sandbox destroyed (the worker's 504 `timeout`). Times as for [`End::Done`]; `exec_us` is
    /// the timeout.
    TimedOut {
        cold: Option<ColdReason>,
        queue_us: Micros,
        init_us: Micros,
        exec_us: Micros,
    },
}

/// One invocation's fate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Record {
    /// Index of the invocation in the workload (its `id` in the results).
    pub id: u32,
    pub function: u32,
    /// The worker it was placed on, if any.
    pub worker: Option<u32>,
    pub scheduled_us: Micros,
    /// When it ended (answered or refused).
    pub end_us: Micros,
    pub end: End,
}

impl Record {
    pub fn e2e_us(&self) -> Micros {
        self.end_us - self.scheduled_us
    }

    pub fn is_done(&self) -> bool {
        matches!(self.end, End::Done { .. })
    }
}

/// Receives what the simulation reports, in simulation order.
pub trait Sink {
    fn record(&mut self, r: &Record) -> Result<()>;

    /// A worker pushed `load` to the balancer at `now` (for load-over-time and variance).
    fn status(&mut self, _now: Micros, _worker: u32, _load: &WorkerLoad) {}

    /// The autoscaler decided `decision` at `now`, adding or draining `workers`.
    fn scaled(&mut self, _now: Micros, _decision: &ScaleDecision, _workers: &[u32]) {}
}

/// Keeps every record in memory (tests, small runs).
#[derive(Debug, Default)]
pub struct Collect {
    pub records: Vec<Record>,
}

impl Sink for Collect {
    fn record(&mut self, r: &Record) -> Result<()> {
        self.records.push(*r);
        Ok(())
    }
}

/// The worker names the results use: `w1` … `wN`.
pub fn worker_name(i: u32) -> String {
    format!("w{}", i + 1)
}

/// A record as a results row: `sent_us = scheduled_us` (no client), no control-plane overhead,
/// `server_e2e_us = e2e_us`.
pub fn result_row(w: &Workload, r: &Record) -> ResultRow {
    let f = w.function(r.function);
    let e2e = r.e2e_us();
    let mut row = ResultRow {
        id: u64::from(r.id),
        function: f.name.to_string(),
        scheduled_us: r.scheduled_us,
        sent_us: r.scheduled_us,
        e2e_us: e2e,
        outcome: Outcome::Ok,
        status: 200,
        cold: false,
        cold_reason: String::new(),
        worker: r.worker.map(worker_name).unwrap_or_default(),
        queue_us: None,
        init_us: None,
        exec_us: None,
        overhead_us: None,
        server_e2e_us: None,
        error: String::new(),
    };
    match r.end {
        End::Done {
            cold,
            queue_us,
            init_us,
            exec_us,
        } => {
            row.cold = cold.is_some();
            row.cold_reason = cold.map(|c| c.as_str().to_string()).unwrap_or_default();
            row.queue_us = Some(queue_us);
            row.init_us = Some(init_us);
            row.exec_us = Some(exec_us);
            row.overhead_us = Some(0);
            row.server_e2e_us = Some(e2e);
        }
        End::Dropped(d) => {
            row.status = d.status();
            row.outcome = Outcome::from_status(row.status);
            row.error = d.describe();
        }
        End::TimedOut { exec_us, .. } => {
            // As the load generator records the worker's 504: no timings, the error's code and
            // message.
            row.status = 504;
            row.outcome = Outcome::from_status(row.status);
            row.error = format!(
                "timeout: {} did not finish within its timeout of {} ms; its sandbox was killed",
                f.name,
                exec_us / 1000
            );
        }
    }
    row
}

/// Writes the results CSV, one row per invocation in the order they end.
pub struct CsvSink<'w> {
    workload: &'w Workload,
    out: ResultWriter,
}

impl<'w> CsvSink<'w> {
    pub fn create(workload: &'w Workload, path: &Path) -> Result<Self> {
        Ok(CsvSink {
            workload,
            out: ResultWriter::create(path)?,
        })
    }

    pub fn finish(self) -> Result<()> {
        Ok(self.out.finish()?)
    }
}

impl Sink for CsvSink<'_> {
    fn record(&mut self, r: &Record) -> Result<()> {
        self.out.write(&result_row(self.workload, r))?;
        Ok(())
    }
}

/// Two sinks fed the same reports.
pub struct Tee<'a, A: Sink, B: Sink>(pub &'a mut A, pub &'a mut B);

impl<A: Sink, B: Sink> Sink for Tee<'_, A, B> {
    fn record(&mut self, r: &Record) -> Result<()> {
        self.0.record(r)?;
        self.1.record(r)
    }

    fn status(&mut self, now: Micros, worker: u32, load: &WorkerLoad) {
        self.0.status(now, worker, load);
        self.1.status(now, worker, load);
    }

    fn scaled(&mut self, now: Micros, decision: &ScaleDecision, workers: &[u32]) {
        self.0.scaled(now, decision, workers);
        self.1.scaled(now, decision, workers);
    }
}
