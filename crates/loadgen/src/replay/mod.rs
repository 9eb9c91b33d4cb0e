//! Sending invocations to a running worker or controller: open loop (a trace replayed at its
//! instants) and closed loop (clients that wait for each answer). The only networked part of the
//! crate; everything it produces is [`ResultRow`]s.

mod clock;
pub mod closed_loop;
pub mod http;
pub mod open_loop;

use crate::error::{LoadgenError, Result};
use crate::results::{Outcome, ResultRow};
use bytes::Bytes;
use hearth_api::{ErrorBody, InvokeAnswer};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How to invoke one function: its name and the request body (its arguments).
#[derive(Debug, Clone)]
pub struct Call {
    pub function: Arc<str>,
    path: Arc<str>,
    pub body: Bytes,
}

impl Call {
    pub fn new(function: &str, args: &serde_json::Value) -> Self {
        Call {
            function: function.into(),
            path: format!("/v1/functions/{function}/invoke").into(),
            body: Bytes::from(args.to_string()),
        }
    }
}

/// Where to send and how patiently.
#[derive(Debug, Clone)]
pub struct Target {
    /// `http://HOST:PORT`.
    pub url: String,
    /// Most connections (so most invocations in flight) at once.
    pub max_connections: usize,
    /// A request with no answer by then is recorded as an error.
    pub request_timeout: Duration,
    /// Sent as `Authorization: Bearer …` with every invocation.
    pub api_key: Option<String>,
}

/// What a run did besides its rows.
#[derive(Debug, Clone, Default)]
pub struct ReplayStats {
    pub invocations: usize,
    pub connections_opened: usize,
    pub max_connections: usize,
    /// Invocations that found all connections busy and waited for one.
    pub connection_waits: usize,
    /// Ctrl-C (SIGINT) stopped the sending early; the invocations already sent were awaited.
    pub interrupted: bool,
}

/// Set by the first Ctrl-C of a run: sending stops, answers in flight are still awaited (so the
/// results file holds every invocation that went out), and a second Ctrl-C quits at once.
#[derive(Clone, Default)]
struct Interrupt(Arc<AtomicBool>);

impl Interrupt {
    /// Listens for SIGINT on `rt` for the rest of the process.
    fn install(rt: &tokio::runtime::Runtime) -> Self {
        let flag = Interrupt::default();
        let set = flag.clone();
        rt.spawn(async move {
            if tokio::signal::ctrl_c().await.is_err() {
                return; // no signal handling here: Ctrl-C keeps its default (quit)
            }
            set.0.store(true, Ordering::Release);
            eprintln!(
                "interrupted: no more invocations are sent; waiting for the answers in flight \
                 (Ctrl-C again to quit without them)"
            );
            if tokio::signal::ctrl_c().await.is_ok() {
                std::process::exit(130);
            }
        });
        flag
    }

    fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

fn us_since(t0: Instant, t: Instant) -> u64 {
    t.saturating_duration_since(t0).as_micros() as u64
}

/// Turns one exchange into a result row.
fn result_row(
    id: u64,
    call: &Call,
    t0: Instant,
    scheduled: Instant,
    ex: http::Exchange,
) -> ResultRow {
    let scheduled_us = us_since(t0, scheduled);
    let mut row = ResultRow {
        id,
        function: call.function.to_string(),
        scheduled_us,
        sent_us: us_since(t0, ex.sent).max(scheduled_us),
        e2e_us: us_since(scheduled, ex.done),
        outcome: Outcome::Error,
        status: 0,
        cold: false,
        cold_reason: String::new(),
        worker: String::new(),
        queue_us: None,
        init_us: None,
        exec_us: None,
        overhead_us: None,
        server_e2e_us: None,
        error: String::new(),
    };
    match ex.answer {
        Err(e) => row.error = e,
        Ok((status, body)) => {
            row.status = status;
            row.outcome = Outcome::from_status(status);
            if status == 200 {
                // Not `InvokeAnswer::parse`: the row keeps why an answer was refused.
                match serde_json::from_slice::<InvokeAnswer>(&body) {
                    Ok(a) => {
                        row.cold = a.cold;
                        row.cold_reason = a
                            .cold_reason
                            .map_or_else(String::new, |r| r.as_str().to_string());
                        row.worker = a.worker;
                        row.queue_us = Some(a.timing.queue);
                        row.init_us = Some(a.timing.init);
                        row.exec_us = Some(a.timing.exec);
                        row.overhead_us = Some(a.timing.overhead);
                        row.server_e2e_us = Some(a.timing.e2e);
                    }
                    Err(e) => {
                        row.outcome = Outcome::Error;
                        row.error = format!("unexpected answer: {e}");
                    }
                }
            } else {
                row.error = match ErrorBody::parse(&body) {
                    Some(a) => format!("{}: {}", a.error.code, a.error.message),
                    None => String::from_utf8_lossy(&body).chars().take(200).collect(),
                };
            }
        }
    }
    row
}

/// Hands rows to `on_row` until every sender is gone; the first error from `on_row` is returned
/// once the run is over (the requests already under way still finish).
fn drain(
    rx: std::sync::mpsc::Receiver<ResultRow>,
    pool: &http::Pool,
    interrupt: &Interrupt,
    mut on_row: impl FnMut(ResultRow) -> Result<()>,
) -> Result<ReplayStats> {
    let mut invocations = 0;
    let mut failed = None;
    for row in rx {
        invocations += 1;
        if failed.is_none() {
            failed = on_row(row).err();
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(ReplayStats {
            invocations,
            connections_opened: pool.opened(),
            max_connections: pool.max(),
            connection_waits: pool.waits(),
            interrupted: interrupt.is_set(),
        }),
    }
}

/// The runtime that carries requests: two threads, beside the dispatcher's own.
fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("hearth-load")
        .enable_all()
        .build()
        .map_err(|e| LoadgenError::Replay(format!("cannot start the runtime: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exchange(status: u16, body: &str) -> http::Exchange {
        let now = Instant::now();
        http::Exchange {
            sent: now,
            done: now + Duration::from_millis(3),
            answer: Ok((status, Bytes::from(body.to_string()))),
        }
    }

    #[test]
    fn answers_become_rows_with_the_timing_breakdown() {
        let call = Call::new("f", &serde_json::json!({"ms": 1}));
        let t0 = Instant::now();
        let ok = r#"{"result":{"x":[1,2]},"cold":true,"cold_reason":"new","worker":"w1","timing":{"queue":1,"init":2,"exec":3,"overhead":4,"e2e":10}}"#;
        let row = result_row(7, &call, t0, t0, exchange(200, ok));
        assert_eq!(row.outcome, Outcome::Ok);
        assert!(row.cold && row.cold_reason == "new" && row.worker == "w1");
        assert_eq!(
            (
                row.queue_us,
                row.init_us,
                row.exec_us,
                row.overhead_us,
                row.server_e2e_us
            ),
            (Some(1), Some(2), Some(3), Some(4), Some(10))
        );
        assert!(row.e2e_us >= 3000);
        let busy = r#"{"error":{"code":"overloaded","message":"queue full"}}"#;
        let row = result_row(8, &call, t0, t0, exchange(429, busy));
        assert_eq!((row.outcome, row.status), (Outcome::Dropped, 429));
        assert_eq!(row.error, "overloaded: queue full");
        let row = result_row(9, &call, t0, t0, exchange(200, "{}"));
        assert_eq!(row.outcome, Outcome::Error);
        assert!(row.error.contains("unexpected answer"), "{}", row.error);
    }
}
