//! Open loop: every invocation of a trace is sent at its scheduled instant, whether or not the
//! earlier ones have answered. A dispatcher thread keeps the schedule; the requests themselves run
//! on a small runtime, each on its own pooled connection.

use super::{clock, drain, http::Pool, result_row, runtime, Call, Interrupt, ReplayStats, Target};
use crate::error::{LoadgenError, Result};
use crate::results::ResultRow;
use crate::trace::Trace;
use std::collections::HashMap;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// How often a dispatcher waiting for a distant send checks for Ctrl-C.
const INTERRUPT_CHECK: Duration = Duration::from_millis(50);

/// Settings of an open-loop run.
#[derive(Debug, Clone)]
pub struct OpenLoop {
    pub target: Target,
    /// Connections opened before the first send.
    pub preopen: usize,
    /// Time between the start of the run and the trace's time 0 (setup happens before).
    pub lead: Duration,
}

/// Replays `trace`, handing each result row to `on_row` (in the order answers arrive) on the
/// calling thread. Every function of the trace needs a [`Call`].
pub fn run(
    cfg: &OpenLoop,
    trace: &Trace,
    calls: &HashMap<String, Call>,
    on_row: impl FnMut(ResultRow) -> Result<()>,
) -> Result<ReplayStats> {
    // One Call per invocation, looked up before the clock starts.
    let plan: Vec<(u64, Call)> = trace
        .invocations
        .iter()
        .map(|inv| {
            calls
                .get(&inv.function)
                .map(|c| (inv.at_us, c.clone()))
                .ok_or_else(|| {
                    LoadgenError::Config(format!(
                        "function {} of the trace has no metadata",
                        inv.function
                    ))
                })
        })
        .collect::<Result<_>>()?;
    let rt = runtime()?;
    let interrupt = Interrupt::install(&rt);
    let pool = Arc::new(Pool::new(
        &cfg.target.url,
        cfg.target.max_connections,
        cfg.target.request_timeout,
        cfg.target.api_key.as_deref(),
    )?);
    rt.block_on(pool.preopen(cfg.preopen))?;
    let handle = rt.handle().clone();
    let (tx, rx) = mpsc::channel::<ResultRow>();
    let t0 = Instant::now() + cfg.lead;
    let dispatch_pool = Arc::clone(&pool);
    let stop = interrupt.clone();
    let dispatcher = std::thread::Builder::new()
        .name("hearth-dispatch".into())
        .spawn(move || {
            clock::precise_timers_for_this_thread();
            for (id, (at_us, call)) in plan.into_iter().enumerate() {
                let scheduled = t0 + Duration::from_micros(at_us);
                // Long gaps are slept in slices so that Ctrl-C is noticed within one.
                while scheduled.saturating_duration_since(Instant::now()) > INTERRUPT_CHECK {
                    if stop.is_set() {
                        return;
                    }
                    std::thread::sleep(INTERRUPT_CHECK);
                }
                if stop.is_set() {
                    return;
                }
                clock::sleep_until(scheduled);
                let (pool, tx) = (Arc::clone(&dispatch_pool), tx.clone());
                handle.spawn(async move {
                    let ex = pool.post(&call.path, call.body.clone()).await;
                    let _ = tx.send(result_row(id as u64, &call, t0, scheduled, ex));
                });
            }
        })
        .map_err(|e| LoadgenError::Replay(format!("cannot start the dispatcher: {e}")))?;
    let stats = drain(rx, &pool, &interrupt, on_row);
    dispatcher
        .join()
        .map_err(|_| LoadgenError::Replay("the dispatcher panicked".into()))?;
    stats
}
