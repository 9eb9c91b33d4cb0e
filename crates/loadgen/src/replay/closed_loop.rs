//! Closed loop: each client invokes, waits for the answer, optionally thinks (uniform 0–1 s, as
//! in the CH-RLU paper's Locust setup), and repeats until the duration is over.

use super::{drain, http::Pool, result_row, runtime, Call, Interrupt, ReplayStats, Target};
use crate::error::{LoadgenError, Result};
use crate::results::ResultRow;
use rand::distributions::{Distribution, WeightedIndex};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Settings of a closed-loop run.
#[derive(Debug, Clone)]
pub struct ClosedLoop {
    pub target: Target,
    pub clients: usize,
    pub duration: Duration,
    /// Think uniformly 0–1 s between an answer and the next request.
    pub think: bool,
    /// Seeds each client's choice of function and think times.
    pub seed: u64,
}

/// Runs the clients; each picks among `calls` by `weights`. Rows reach `on_row` as answers arrive.
pub fn run(
    cfg: &ClosedLoop,
    calls: &[Call],
    weights: &[f64],
    on_row: impl FnMut(ResultRow) -> Result<()>,
) -> Result<ReplayStats> {
    if calls.is_empty() || calls.len() != weights.len() {
        return Err(LoadgenError::Config(
            "one weight per function is needed".into(),
        ));
    }
    let choose = WeightedIndex::new(weights)
        .map_err(|e| LoadgenError::Config(format!("bad weights {weights:?}: {e}")))?;
    if cfg.clients == 0 {
        return Err(LoadgenError::Config("--clients must be at least 1".into()));
    }
    let rt = runtime()?;
    let interrupt = Interrupt::install(&rt);
    let pool = Arc::new(Pool::new(
        &cfg.target.url,
        cfg.clients,
        cfg.target.request_timeout,
        cfg.target.api_key.as_deref(),
    )?);
    rt.block_on(pool.preopen(cfg.clients))?;
    let (tx, rx) = mpsc::channel::<ResultRow>();
    let t0 = Instant::now();
    let end = t0 + cfg.duration;
    let next_id = Arc::new(AtomicU64::new(0));
    for client in 0..cfg.clients {
        let (pool, tx, next_id) = (Arc::clone(&pool), tx.clone(), Arc::clone(&next_id));
        let (calls, choose) = (calls.to_vec(), choose.clone());
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed.wrapping_add(client as u64));
        let think = cfg.think;
        let stop = interrupt.clone();
        rt.spawn(async move {
            loop {
                let scheduled = Instant::now();
                if scheduled >= end || stop.is_set() {
                    return;
                }
                let call = &calls[choose.sample(&mut rng)];
                let ex = pool.post(&call.path, call.body.clone()).await;
                let id = next_id.fetch_add(1, Ordering::Relaxed);
                if tx.send(result_row(id, call, t0, scheduled, ex)).is_err() {
                    return;
                }
                if think {
                    let pause = Duration::from_secs_f64(rng.gen_range(0.0..1.0));
                    tokio::time::sleep_until((Instant::now() + pause).min(end).into()).await;
                }
            }
        });
    }
    drop(tx);
    drain(rx, &pool, &interrupt, on_row)
}
