//! Closed-loop clients, as a load tester's threads (the CH-RLU paper's Locust runs): each
//! client picks a function by the weights in force, invokes it, waits for its end (completion,
//! timeout or refusal), thinks, and invokes again. The offered load thus falls when latency
//! rises, which an open-loop trace never does.
//!
//! The description is data only; the event loop ([`crate::simulation`]) runs the clients, and
//! [`Clients`] keeps their state and draws, so a run stays a pure function of its inputs.

use crate::error::{Result, SimError};
use hearth_core::Micros;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Most clients a closed loop may run (each is one event in flight at a time).
pub const MAX_CLIENTS: u32 = 100_000;
/// Longest think time and span accepted (a day).
const MAX_US: Micros = 86_400_000_000;
/// Largest weight accepted (so that sums stay finite).
const MAX_WEIGHT: f64 = 1e12;
/// Most weight mixes a closed loop may switch between.
const MAX_MIXES: usize = 100_000;
/// A client whose invocation was refused the instant it was sent waits at least this long
/// before the next (the refusal's round trip): with no think time it would otherwise retry
/// forever at one instant of virtual time, before any status push could change the answer.
pub const REFUSED_RETRY_US: Micros = 1_000;

/// Function weights in force from `from_us` on (one weight per workload function, not all 0).
#[derive(Debug, Clone, PartialEq)]
pub struct Mix {
    pub from_us: Micros,
    pub weights: Vec<f64>,
}

/// N clients over time that invoke, wait for the end, think and invoke again.
#[derive(Debug, Clone, PartialEq)]
pub struct ClosedLoop {
    /// How many clients run from each instant on, as `(from_us, clients)` in time order, the
    /// first at 0. Clients added start at once; clients removed finish their invocation and
    /// stop.
    pub clients: Vec<(Micros, u32)>,
    /// Think time after each end, uniform in `[think_min_us, think_max_us]` (Locust's
    /// `between(0, 1)` in the paper).
    pub think_min_us: Micros,
    pub think_max_us: Micros,
    /// The weights each function is picked by, in time order, the first from 0.
    pub mixes: Vec<Mix>,
    /// No client invokes at or after this instant; the run ends when the last call ends.
    pub span_us: Micros,
    /// Seeds the think times and the function picks.
    pub seed: u64,
}

impl ClosedLoop {
    /// `clients` clients for `span_us`, picking by `weights` (fixed), thinking
    /// `think_min_us..=think_max_us`.
    pub fn fixed(
        clients: u32,
        weights: Vec<f64>,
        think_min_us: Micros,
        think_max_us: Micros,
        span_us: Micros,
        seed: u64,
    ) -> Self {
        ClosedLoop {
            clients: vec![(0, clients)],
            think_min_us,
            think_max_us,
            mixes: vec![Mix {
                from_us: 0,
                weights,
            }],
            span_us,
            seed,
        }
    }

    /// Refuses a description that cannot run over `functions` functions.
    pub fn check(&self, functions: usize) -> Result<()> {
        let bad = |m: &str| Err(SimError::Config(format!("closed loop: {m}")));
        if self.span_us == 0 || self.span_us > MAX_US {
            return bad("the span must be between 1 µs and a day");
        }
        if self.think_min_us > self.think_max_us || self.think_max_us > MAX_US {
            return bad("the think time must be a range of at most a day");
        }
        if self.clients.first().map(|c| c.0) != Some(0) {
            return bad("the client schedule must start at 0");
        }
        if !self.clients.windows(2).all(|w| w[0].0 < w[1].0) {
            return bad("the client schedule must be in strictly increasing time order");
        }
        if self.clients.iter().any(|c| c.1 > MAX_CLIENTS) {
            return bad(&format!("at most {MAX_CLIENTS} clients"));
        }
        if self.mixes.is_empty() || self.mixes.len() > MAX_MIXES {
            return bad(&format!("between 1 and {MAX_MIXES} weight mixes"));
        }
        if self.mixes[0].from_us != 0 {
            return bad("the first weight mix must start at 0");
        }
        if !self.mixes.windows(2).all(|w| w[0].from_us < w[1].from_us) {
            return bad("the weight mixes must be in strictly increasing time order");
        }
        for m in &self.mixes {
            if m.weights.len() != functions {
                return bad("every weight mix needs one weight per function");
            }
            if !m.weights.iter().all(|w| (0.0..=MAX_WEIGHT).contains(w)) {
                return bad("weights must be between 0 and 1e12");
            }
            if m.weights.iter().sum::<f64>() <= 0.0 {
                return bad("a weight mix needs a positive weight");
            }
        }
        Ok(())
    }
}

/// The clients of a running closed loop: which are busy (invoking or thinking), their draws.
#[derive(Debug)]
pub(crate) struct Clients {
    spec: ClosedLoop,
    /// Cumulative weights of each mix.
    cumulative: Vec<Vec<f64>>,
    /// Client `i` has an invocation in flight or a next one scheduled.
    busy: Vec<bool>,
    /// The client of each invocation, by id.
    owner: Vec<u32>,
    rng: ChaCha8Rng,
}

impl Clients {
    pub(crate) fn new(spec: ClosedLoop, functions: usize) -> Result<Self> {
        spec.check(functions)?;
        let cumulative = spec
            .mixes
            .iter()
            .map(|m| {
                let mut acc = 0.0;
                m.weights
                    .iter()
                    .map(|w| {
                        acc += w;
                        acc
                    })
                    .collect()
            })
            .collect();
        let most = spec.clients.iter().map(|c| c.1).max().unwrap_or(0);
        Ok(Clients {
            rng: ChaCha8Rng::seed_from_u64(spec.seed),
            busy: vec![false; most as usize],
            owner: Vec::new(),
            cumulative,
            spec,
        })
    }

    /// The client schedule's steps (time, index), for the loop to visit.
    pub(crate) fn steps(&self) -> impl Iterator<Item = (Micros, usize)> + '_ {
        let span = self.spec.span_us;
        self.spec
            .clients
            .iter()
            .enumerate()
            .filter(move |(_, c)| c.0 < span)
            .map(|(i, c)| (c.0, i))
    }

    /// The idle clients that schedule step `step` puts to work; they are busy from now on.
    pub(crate) fn start(&mut self, step: usize) -> Vec<u32> {
        let n = self.spec.clients.get(step).map_or(0, |c| c.1) as usize;
        let mut started = Vec::new();
        for (i, b) in self.busy.iter_mut().enumerate().take(n) {
            if !*b {
                *b = true;
                started.push(i as u32);
            }
        }
        started
    }

    /// Whether client `c` may invoke at `now` (else it goes idle).
    pub(crate) fn may_invoke(&mut self, c: u32, now: Micros) -> bool {
        let ok = now < self.spec.span_us && c < self.clients_at(now);
        if !ok {
            if let Some(b) = self.busy.get_mut(c as usize) {
                *b = false;
            }
        }
        ok
    }

    /// Client `c` invokes at `now`, as invocation `id`: the function picked.
    pub(crate) fn pick(&mut self, c: u32, id: u32, now: Micros) -> u32 {
        if self.owner.len() <= id as usize {
            self.owner.resize(id as usize + 1, u32::MAX);
        }
        self.owner[id as usize] = c;
        let mix = self
            .spec
            .mixes
            .partition_point(|m| m.from_us <= now)
            .saturating_sub(1);
        let cum = &self.cumulative[mix];
        let total = cum.last().copied().unwrap_or(0.0);
        let x = self.rng.gen::<f64>() * total;
        // The first function whose cumulative weight passes x (never a zero-weight one).
        cum.partition_point(|v| *v <= x).min(cum.len() - 1) as u32
    }

    /// Invocation `id`, issued at `issued_us`, ended at `now`: its client's next invocation
    /// time after thinking (at least [`REFUSED_RETRY_US`] after one refused at once), if that
    /// is within the span (else the client goes idle). Whether the schedule still runs the
    /// client then is for [`Clients::may_invoke`] to say at that time.
    pub(crate) fn ended(
        &mut self,
        id: u32,
        issued_us: Micros,
        now: Micros,
    ) -> Option<(u32, Micros)> {
        let c = *self.owner.get(id as usize)?;
        let mut think = if self.spec.think_max_us > self.spec.think_min_us {
            self.rng
                .gen_range(self.spec.think_min_us..=self.spec.think_max_us)
        } else {
            self.spec.think_min_us
        };
        if now == issued_us {
            think = think.max(REFUSED_RETRY_US);
        }
        let at = now.saturating_add(think);
        if at < self.spec.span_us {
            Some((c, at))
        } else {
            if let Some(b) = self.busy.get_mut(c as usize) {
                *b = false;
            }
            None
        }
    }

    /// Clients the schedule runs at `t`.
    fn clients_at(&self, t: Micros) -> u32 {
        let i = self
            .spec
            .clients
            .partition_point(|c| c.0 <= t)
            .saturating_sub(1);
        self.spec.clients.get(i).map_or(0, |c| c.1)
    }
}
