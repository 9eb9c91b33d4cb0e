//! Balancing: which worker gets an invocation (DESIGN.md §6; CH-RLU paper §2.3, §4; thesis
//! ch. 4.4).
//!
//! [`Balancer`] is one synchronous, deterministic state machine. Its driver tells it about
//! membership ([`Balancer::join`], [`Balancer::leave`], [`Balancer::expire`]), the load each
//! worker reports ([`Balancer::report`]), the functions ([`Balancer::register`]) and finished
//! invocations ([`Balancer::finished`]), always with the time, and asks it for a [`Decision`] per
//! invocation ([`Balancer::route`]). It never reads a clock; its randomness comes from its own
//! generator seeded from [`BalanceParams::seed`]. The controller drives it with real time and
//! pushed status; the simulator drives the very same type with virtual time.

mod ch_rlu;
mod functions;
mod hash;
mod openwhisk;
mod pools;
mod popularity;
mod ring;
mod workers;

pub use functions::{FunctionInfo, FunctionState};
pub use hash::{hash64, FunctionKey};
pub use pools::Pool;
pub use ring::Ring;
pub use workers::{WorkerId, WorkerLoad, WorkerState, Workers};

use crate::time::Micros;
use ch_rlu::{forward, Routed};
use functions::Functions;
use openwhisk::OpenWhisk;
use pools::Pools;
use popularity::Popularity;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use ring::Visited;
use serde::{Deserialize, Serialize};

/// The balancing policies, by their config names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BalanceKind {
    /// Each live worker in turn.
    RoundRobin,
    /// A uniformly random live worker.
    Random,
    /// The live worker with the lowest reported load.
    LeastLoaded,
    /// Always the function's home on the consistent-hashing ring.
    Ch,
    /// Consistent hashing with bounded loads: forward along the ring while the load is not
    /// below `b`, at most `max_chain_len` times, then the least-loaded worker.
    ChBl,
    /// Consistent hashing with random load updates (Algorithm 2).
    ChRlu,
    /// CH-RLU inside one pool per priority level, overflowing to lower pools.
    KChRlu,
    /// OpenWhisk's default (ShardingContainerPoolBalancer): memory slots per worker, home by
    /// hash, co-prime step probing, a random live worker when every one is full.
    #[serde(rename = "openwhisk")]
    OpenWhisk,
}

impl BalanceKind {
    pub const ALL: [BalanceKind; 8] = [
        BalanceKind::RoundRobin,
        BalanceKind::Random,
        BalanceKind::LeastLoaded,
        BalanceKind::Ch,
        BalanceKind::ChBl,
        BalanceKind::ChRlu,
        BalanceKind::KChRlu,
        BalanceKind::OpenWhisk,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BalanceKind::RoundRobin => "round-robin",
            BalanceKind::Random => "random",
            BalanceKind::LeastLoaded => "least-loaded",
            BalanceKind::Ch => "ch",
            BalanceKind::ChBl => "ch-bl",
            BalanceKind::ChRlu => "ch-rlu",
            BalanceKind::KChRlu => "k-ch-rlu",
            BalanceKind::OpenWhisk => "openwhisk",
        }
    }
}

impl std::fmt::Display for BalanceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for BalanceKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        BalanceKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = BalanceKind::ALL.iter().map(|k| k.as_str()).collect();
                format!(
                    "unknown balancing policy {s:?} (expected one of {})",
                    names.join(", ")
                )
            })
    }
}

/// Policy parameters (the paper's names; defaults from its §5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BalanceParams {
    /// Load bound b (normalized load; CH-BL's bound, CH-RLU's before cold/warm scaling).
    pub b: f64,
    /// Upper load bound b_max: CH-RLU's bound never exceeds it, and above it the least-loaded
    /// fallback rejects.
    pub b_max: f64,
    /// p: functions whose IAT is in the lowest p per cent are popular.
    pub popular_pct: f64,
    /// T: per cent of functions (by name hash) whose IATs build the popularity percentile.
    pub sample_pct: f64,
    /// Forwards along the ring before falling back (CH-BL, CH-RLU, each pool of k-CH-RLU; the
    /// paper's §6.1 sets 3 for both CH-BL and CH-RLU).
    pub max_chain_len: u32,
    /// Ring points per worker.
    pub virtual_nodes: u32,
    /// How often the popularity threshold is recomputed.
    pub popularity_refresh_ms: u64,
    /// k-CH-RLU: b_max per pool, highest priority first; the last value applies to the pools
    /// after it. Empty: `b_max + i × pool_b_max_step` for the pool `i` places below the top.
    pub pool_b_max: Vec<f64>,
    /// k-CH-RLU: how much higher each lower-priority pool's b_max is than the pool above it,
    /// when `pool_b_max` is empty (thesis §4.4.2: lower-priority pools run with a higher bound).
    pub pool_b_max_step: f64,
    /// Seed of the balancer's random generator (random policy, load noise).
    pub seed: u64,
}

impl Default for BalanceParams {
    fn default() -> Self {
        BalanceParams {
            b: 1.2,
            b_max: 6.0,
            popular_pct: 20.0,
            sample_pct: 20.0,
            max_chain_len: 3,
            virtual_nodes: 100,
            popularity_refresh_ms: 250,
            pool_b_max: Vec::new(),
            pool_b_max_step: 2.0,
            seed: 0x4845_4152_5448, // "HEARTH"
        }
    }
}

/// Parameters that cannot work.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParamsError {
    #[error("balancing parameter {0} must be a finite number above 0, got {1}")]
    NotPositive(&'static str, f64),
    #[error("balancing parameter {0} must be a finite number from 0 to {1}, got {2}")]
    OutOfBounds(&'static str, f64, f64),
    #[error("balancing parameter {0} must be between 0 and 100, got {1}")]
    NotPercent(&'static str, f64),
    #[error("balancing parameter {0} must be between {1} and {2}, got {3}")]
    OutOfRange(&'static str, u64, u64, u64),
}

impl BalanceParams {
    pub fn check(&self) -> Result<(), ParamsError> {
        let positive = |name, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(ParamsError::NotPositive(name, v))
            }
        };
        positive("b", self.b)?;
        positive("b_max", self.b_max)?;
        if self.pool_b_max.len() > MAX_POOL_B_MAX {
            return Err(ParamsError::OutOfRange(
                "pool_b_max (entries)",
                0,
                MAX_POOL_B_MAX as u64,
                self.pool_b_max.len() as u64,
            ));
        }
        for v in &self.pool_b_max {
            positive("pool_b_max", *v)?;
        }
        let step = self.pool_b_max_step;
        if !(step.is_finite() && (0.0..=MAX_POOL_B_MAX_STEP).contains(&step)) {
            return Err(ParamsError::OutOfBounds(
                "pool_b_max_step",
                MAX_POOL_B_MAX_STEP,
                step,
            ));
        }
        for (name, v) in [
            ("popular_pct", self.popular_pct),
            ("sample_pct", self.sample_pct),
        ] {
            if !(v.is_finite() && (0.0..=100.0).contains(&v)) {
                return Err(ParamsError::NotPercent(name, v));
            }
        }
        positive("sample_pct", self.sample_pct)?;
        let range = |name, v: u64, lo, hi| {
            if (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(ParamsError::OutOfRange(name, lo, hi, v))
            }
        };
        range("max_chain_len", u64::from(self.max_chain_len), 0, 64)?;
        range("virtual_nodes", u64::from(self.virtual_nodes), 1, 1000)?;
        range(
            "popularity_refresh_ms",
            self.popularity_refresh_ms,
            1,
            3_600_000,
        )?;
        Ok(())
    }
}

/// Most entries `pool_b_max` may have (one per priority level in use is all it needs).
const MAX_POOL_B_MAX: usize = 64;
/// Largest `pool_b_max_step`: a bound of b_max + 100 per level is already "never forward".
const MAX_POOL_B_MAX_STEP: f64 = 100.0;

/// How a worker was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// By a policy without a ring (round-robin, random, least-loaded).
    Direct,
    /// The function's home on the ring.
    Home,
    /// Forwarded `hops` times along the ring.
    Forwarded { hops: u32 },
    /// The forwarding chain was exhausted: the least-loaded worker.
    LeastLoaded,
    /// k-CH-RLU: placed in lower-priority pool `pool` after `hops` forwards there.
    Overflow { pool: u32, hops: u32 },
    /// OpenWhisk: every live worker's memory slots were full; a random live one.
    Random,
}

impl Placement {
    pub fn as_str(&self) -> &'static str {
        match self {
            Placement::Direct => "direct",
            Placement::Home => "home",
            Placement::Forwarded { .. } => "forwarded",
            Placement::LeastLoaded => "least_loaded",
            Placement::Overflow { .. } => "overflow",
            Placement::Random => "random",
        }
    }
}

/// Why an invocation was not placed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rejection {
    /// No worker is up.
    NoWorkers,
    /// CH-RLU: the chain was exhausted and even the least-loaded worker is over b_max.
    Overloaded { load: f64, b_max: f64 },
}

/// The answer to [`Balancer::route`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decision {
    Run { worker: WorkerId, how: Placement },
    Reject(Rejection),
}

/// How an invocation the balancer placed ended, as the driver saw it: its *running* times from
/// the worker's timing, never its end-to-end time. The paper's c/w compares running times
/// (§4.5); an end-to-end time includes the queue wait, which under load swamps both and pulls
/// the ratio towards 1, shrinking the load bound exactly when load is high.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// Ran in a warm sandbox for `exec_us` (the paper's warm time w).
    Warm { exec_us: u64 },
    /// Started a sandbox: `init_us` of sandbox start and import, then `exec_us` (the paper's
    /// cold time c = init + exec).
    Cold { init_us: u64, exec_us: u64 },
    /// Failed or never reached the worker: only the in-flight count changes.
    Failed,
}

#[derive(Debug, Clone)]
enum Policy {
    RoundRobin { next: usize },
    Random,
    LeastLoaded,
    Ch(Ring),
    ChBl(Ring),
    ChRlu(Ring),
    KChRlu(Pools),
    OpenWhisk(OpenWhisk),
}

/// The balancer: membership, loads, function characteristics and one policy.
#[derive(Debug, Clone)]
pub struct Balancer {
    kind: BalanceKind,
    params: BalanceParams,
    workers: Workers,
    functions: Functions,
    popularity: Popularity,
    policy: Policy,
    rng: SmallRng,
    visited: Visited,
}

impl Balancer {
    pub fn new(kind: BalanceKind, params: BalanceParams) -> Result<Self, ParamsError> {
        params.check()?;
        let vnodes = params.virtual_nodes;
        let policy = match kind {
            BalanceKind::RoundRobin => Policy::RoundRobin { next: 0 },
            BalanceKind::Random => Policy::Random,
            BalanceKind::LeastLoaded => Policy::LeastLoaded,
            BalanceKind::Ch => Policy::Ch(Ring::new(vnodes)),
            BalanceKind::ChBl => Policy::ChBl(Ring::new(vnodes)),
            BalanceKind::ChRlu => Policy::ChRlu(Ring::new(vnodes)),
            BalanceKind::KChRlu => Policy::KChRlu(Pools::new(vnodes)),
            BalanceKind::OpenWhisk => Policy::OpenWhisk(OpenWhisk::default()),
        };
        let mut b = Balancer {
            kind,
            popularity: Popularity::new(
                params.sample_pct,
                params.popular_pct,
                params.popularity_refresh_ms.saturating_mul(1_000),
            ),
            rng: SmallRng::seed_from_u64(params.seed),
            params,
            workers: Workers::default(),
            functions: Functions::default(),
            policy,
            visited: Visited::default(),
        };
        b.resize_pools();
        Ok(b)
    }

    pub fn kind(&self) -> BalanceKind {
        self.kind
    }

    pub fn params(&self) -> &BalanceParams {
        &self.params
    }

    pub fn workers(&self) -> &Workers {
        &self.workers
    }

    /// A worker joins (or comes back). Returns its id.
    pub fn join(&mut self, now: Micros, name: &str) -> WorkerId {
        let (id, newly_up) = self.workers.join(now, name);
        if newly_up {
            match &mut self.policy {
                Policy::Ch(r) | Policy::ChBl(r) | Policy::ChRlu(r) => r.insert(id, name),
                Policy::KChRlu(_) => self.resize_pools(),
                Policy::OpenWhisk(ow) => ow.resize(self.workers.count()),
                _ => {}
            }
        }
        id
    }

    /// A worker leaves (shut down, failed, or silent too long). Consistent hashing remaps only
    /// the functions whose home it was.
    pub fn leave(&mut self, _now: Micros, id: WorkerId) -> bool {
        if !self.workers.leave(id) {
            return false;
        }
        match &mut self.policy {
            Policy::Ch(r) | Policy::ChBl(r) | Policy::ChRlu(r) => {
                r.remove(id);
            }
            Policy::KChRlu(_) => self.resize_pools(),
            _ => {}
        }
        true
    }

    /// A worker's (stale by design) status report.
    pub fn report(&mut self, now: Micros, id: WorkerId, load: WorkerLoad) {
        self.workers.report(now, id, load);
    }

    /// Workers not heard from for longer than `max_age` leave; returns them.
    pub fn expire(&mut self, now: Micros, max_age: Micros) -> Vec<WorkerId> {
        let silent = self.workers.silent(now, max_age);
        for id in &silent {
            self.leave(now, *id);
        }
        silent
    }

    /// A function is registered or updated.
    pub fn register(&mut self, _now: Micros, key: FunctionKey, info: FunctionInfo) {
        let sampled = self.popularity.sampled(key);
        if self.functions.register(key, info, sampled) {
            self.resize_pools();
        }
    }

    /// A function is deleted.
    pub fn unregister(&mut self, _now: Micros, key: FunctionKey) {
        if self.functions.unregister(key) {
            self.resize_pools();
        }
    }

    pub fn function(&self, key: FunctionKey) -> Option<&FunctionState> {
        self.functions.get(key)
    }

    /// Whether the function is popular now (Algorithm 1).
    pub fn is_popular(&self, now: Micros, key: FunctionKey) -> bool {
        self.functions
            .get(key)
            .is_some_and(|f| self.popularity.is_popular(now, &f.iat))
    }

    /// Algorithm 1's current IAT threshold (seconds / R): functions at or below it are popular.
    pub fn popularity_threshold(&self) -> f64 {
        self.popularity.threshold()
    }

    /// The function's home worker on the ring (ring policies; the home in its pool for
    /// k-CH-RLU).
    pub fn home(&self, key: FunctionKey) -> Option<WorkerId> {
        match &self.policy {
            Policy::Ch(r) | Policy::ChBl(r) | Policy::ChRlu(r) => r.home(key.0).map(|h| h.1),
            Policy::KChRlu(p) => {
                let priority = self.functions.get(key).map_or(0, |f| f.priority);
                let pool = p.pools().get(p.pool_of(priority))?;
                pool.ring.home(key.0).map(|h| h.1)
            }
            Policy::OpenWhisk(ow) => ow.home(key),
            _ => None,
        }
    }

    /// The load bound CH-RLU applies to the function now: `min(c·b/w, b_max)`, with the
    /// b_max of its own pool under k-CH-RLU; CH-BL's is `b`. None for policies without one.
    pub fn load_bound(&self, key: FunctionKey) -> Option<f64> {
        let p = &self.params;
        let ratio = self
            .functions
            .get(key)
            .map_or(1.0, FunctionState::cold_warm_ratio);
        match &self.policy {
            Policy::ChBl(_) => Some(p.b),
            Policy::ChRlu(_) => Some((ratio * p.b).min(p.b_max)),
            Policy::KChRlu(pools) => {
                let priority = self.functions.get(key).map_or(0, |f| f.priority);
                let pool = pools.pools().get(pools.pool_of(priority))?;
                Some((ratio * p.b).min(pool.b_max))
            }
            _ => None,
        }
    }

    /// k-CH-RLU's pools, highest priority first (empty for other policies).
    pub fn pools(&self) -> &[Pool] {
        match &self.policy {
            Policy::KChRlu(p) => p.pools(),
            _ => &[],
        }
    }

    /// Chooses a worker for one invocation of `key` at `now`. The chosen worker's in-flight
    /// count goes up until [`Balancer::finished`].
    pub fn route(&mut self, now: Micros, key: FunctionKey) -> Decision {
        if self.workers.live().is_empty() {
            return Decision::Reject(Rejection::NoWorkers);
        }
        let sampled = self.popularity.sampled(key);
        let f = self.functions.entry(key, sampled);
        self.popularity.record(now, &mut f.iat);
        let priority = f.priority;
        let ratio = f.cold_warm_ratio();
        let iat = f.iat;
        let memory_mb = f.memory_mb;
        if self.popularity.refresh_due(now) {
            self.popularity.recompute(
                now,
                self.functions.sampled_iats(),
                self.functions.all_iats(),
            );
        }
        let noise_mean = self
            .popularity
            .is_popular(now, &iat)
            .then(|| self.popularity.arrival_rate());
        let routed = Routed {
            key: key.0,
            ratio,
            noise_mean,
        };
        let p = &self.params;
        let live = self.workers.live();
        let placed = match &mut self.policy {
            Policy::RoundRobin { next } => {
                let w = live[*next % live.len()];
                *next = next.wrapping_add(1);
                Some((w, Placement::Direct))
            }
            Policy::Random => Some((live[self.rng.gen_range(0..live.len())], Placement::Direct)),
            Policy::LeastLoaded => self
                .workers
                .least_loaded(live.iter().copied())
                .map(|w| (w, Placement::Direct)),
            Policy::Ch(ring) => ring.home(key.0).map(|(_, w)| (w, Placement::Home)),
            Policy::ChBl(ring) => {
                let plain = Routed {
                    ratio: 1.0,
                    noise_mean: None,
                    ..routed
                };
                // The same chain limit as CH-RLU (paper §6.1); when it is exhausted, the
                // least-loaded worker (Algorithm 2, line 4). CH-BL has no b_max, so it never
                // rejects: that worker takes the invocation whatever its load.
                let walked = forward(
                    ring,
                    &plain,
                    p.b,
                    p.max_chain_len,
                    &self.workers,
                    &mut self.rng,
                    &mut self.visited,
                );
                match walked {
                    Some((w, hops)) => Some((w, on_ring(hops))),
                    None => self
                        .workers
                        .least_loaded(live.iter().copied())
                        .map(|w| (w, Placement::LeastLoaded)),
                }
            }
            Policy::ChRlu(ring) => {
                let bound = (ratio * p.b).min(p.b_max);
                let walked = forward(
                    ring,
                    &routed,
                    bound,
                    p.max_chain_len,
                    &self.workers,
                    &mut self.rng,
                    &mut self.visited,
                );
                match walked {
                    Some((w, hops)) => Some((w, on_ring(hops))),
                    None => {
                        let w = self.workers.least_loaded(live.iter().copied());
                        match w {
                            Some(w) if self.workers.load(w) > p.b_max => {
                                return Decision::Reject(Rejection::Overloaded {
                                    load: self.workers.load(w),
                                    b_max: p.b_max,
                                })
                            }
                            Some(w) => Some((w, Placement::LeastLoaded)),
                            None => None,
                        }
                    }
                }
            }
            Policy::KChRlu(pools) => pools.route(
                &routed,
                priority,
                p.b,
                p.max_chain_len,
                &self.workers,
                &mut self.rng,
                &mut self.visited,
            ),
            Policy::OpenWhisk(ow) => {
                ow.route(key, slot_mb(memory_mb), &self.workers, &mut self.rng)
            }
        };
        match placed {
            Some((worker, how)) => {
                self.workers.dispatched(worker, slot_mb(memory_mb));
                Decision::Run { worker, how }
            }
            None => Decision::Reject(Rejection::NoWorkers),
        }
    }

    /// An invocation placed on `worker` ended; its running times refine the function's cold/warm
    /// ratio, and its memory slots there are free again.
    pub fn finished(&mut self, _now: Micros, worker: WorkerId, key: FunctionKey, how: Finished) {
        let memory_mb = self.functions.get(key).map_or(0, |f| f.memory_mb);
        self.workers.done(worker, slot_mb(memory_mb));
        let Some(f) = self.functions.get_mut(key) else {
            return;
        };
        match how {
            Finished::Warm { exec_us } => f.warm_us.add(exec_us as f64),
            Finished::Cold { init_us, exec_us } => {
                f.cold_us.add(init_us.saturating_add(exec_us) as f64)
            }
            Finished::Failed => {}
        }
    }

    fn resize_pools(&mut self) {
        if let Policy::KChRlu(pools) = &mut self.policy {
            pools.resize(
                &self.workers,
                self.functions.per_priority(),
                self.params.b_max,
                &self.params.pool_b_max,
                self.params.pool_b_max_step,
            );
        }
    }
}

/// The memory slots an invocation takes: its function's memory, or OpenWhisk's default action
/// memory (256 MiB) when the function's is unknown.
fn slot_mb(memory_mb: u64) -> u64 {
    if memory_mb == 0 {
        openwhisk::DEFAULT_MEMORY_MB
    } else {
        memory_mb
    }
}

fn on_ring(hops: u32) -> Placement {
    if hops == 0 {
        Placement::Home
    } else {
        Placement::Forwarded { hops }
    }
}

#[cfg(test)]
mod tests;
