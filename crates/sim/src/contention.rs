//! The `contention` server: processor sharing plus the interference measured with real `runc`
//! sandboxes on the 2-CPU VM (`bench/contention.sh`, `bench/RESULTS.md` "Contention"), for
//! studies where the idealized processor sharing of [`crate::cpu`] flatters running everything
//! at once (the thesis' concurrency limit against "no queue").
//!
//! Three effects, each fitted from that bench:
//! * **overcommit overhead**: with more runnable work than CPUs, the CPUs deliver less than
//!   their capacity (context switches, cache sharing): rounds of N = 4, 8, 16 simultaneous
//!   calls of 400 ms of CPU on 2 CPUs took 1.04–1.11 × the ideal N × 400 / 2 ms (1.02 × for
//!   N = 1, the HTTP path), so each job runs at `c / n / (1 + a)` with `a` = 0.05 once `n > c`;
//! * **slower concurrent creations**: K cold starts at once of a hello function (its init is
//!   all sandbox creation, `C` = 65 ms alone) took 65, 80, 125, 200, 270 ms each for K = 1, 2,
//!   4, 8, 12: `C × (1 + b (K − 1))` with `b` = 0.3 (0.23–0.31 at each K). Only the creation
//!   part of a longer init contends: a creation starting with `k` others in flight takes
//!   `init + b k min(init, C)`;
//! * **creations take CPU**: that slope on 2 CPUs is 0.3 × 65 ms × 2 CPUs ≈ 40 ms of CPU per
//!   65 ms creation, so a creation in flight demands `β` = 0.6 of a CPU, spread over its whole
//!   init when that is longer (`β min(1, C / init)`: the same 40 ms of CPU).
//!
//! Applying `b` and `β` to an init of seconds unchanged made `queue`'s no-queue case collapse
//! (creations of seconds slowing each other by 30 % each, more piling up): the creation costs
//! are the sandbox's, not the function's own initialization, whose interference is unmeasured.
//!
//! Memory pressure had no measurable effect (a warm 100 ms call beside a sandbox touching
//! 1 GiB per call: 100.6 ms p50 against 100.2 alone), so it has no term.
//!
//! The rate every running job gets depends only on the number of jobs and of creations, so
//! the virtual-time processor sharing of [`crate::cpu`] keeps its O(log n) events.

use crate::error::{Result, SimError};
use hearth_core::Micros;

/// Fitted share of capacity lost once the CPUs are overcommitted (`a`).
pub const OVERCOMMIT_OVERHEAD: f64 = 0.05;
/// Fitted growth of a creation's time per other creation in flight on its worker (`b`).
pub const CREATION_SLOWDOWN: f64 = 0.3;
/// Fitted CPU demand of one creation in flight, in running jobs (`β`).
pub const CREATION_CPU: f64 = 0.6;
/// A sandbox creation alone: the cold start of a hello function on runc (`C`).
pub const CREATE_US: Micros = 65_000;

/// The contention model's constants (the defaults are the fitted ones).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Contention {
    /// `a`: each job's rate is divided by `1 + a` while demand exceeds the CPUs.
    pub overcommit_overhead: f64,
    /// `b`: a creation starting with `k` others in flight takes `init × (1 + b k)`.
    pub creation_slowdown: f64,
    /// `β`: a creation in flight demands this many running jobs' worth of CPU.
    pub creation_cpu: f64,
    /// `C`: the sandbox-creation part of an init, which contends.
    pub create_us: Micros,
}

impl Default for Contention {
    fn default() -> Self {
        Contention {
            overcommit_overhead: OVERCOMMIT_OVERHEAD,
            creation_slowdown: CREATION_SLOWDOWN,
            creation_cpu: CREATION_CPU,
            create_us: CREATE_US,
        }
    }
}

impl Contention {
    pub fn check(&self) -> Result<()> {
        let within = |x: f64, hi: f64| x.is_finite() && (0.0..=hi).contains(&x);
        if !(within(self.overcommit_overhead, 1.0)
            && within(self.creation_slowdown, 5.0)
            && within(self.creation_cpu, 4.0)
            && (1..=60_000_000).contains(&self.create_us))
        {
            return Err(SimError::Config(
                "contention constants must be within 0-1 (overhead), 0-5 (creation slowdown), \
                 0-4 (creation CPU) and 1 µs-60 s (creation time)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The rate (µs of work per µs) of each of `jobs` running jobs on `cpus` CPUs while
    /// creations demand `creations` CPUs (the sum of their [`Contention::creation_demand`]):
    /// 1 while the demand fits, else the fair share of the demand less the overcommit overhead.
    pub fn rate(&self, cpus: f64, jobs: usize, creations: f64) -> f64 {
        let demand = jobs as f64 + creations;
        if demand <= cpus {
            1.0
        } else {
            cpus / demand / (1.0 + self.overcommit_overhead)
        }
    }

    /// How long a creation of `init_us` takes when it starts with `others` creations already in
    /// flight on its worker: its sandbox-creation part is slowed by each of them.
    pub fn init_us(&self, init_us: Micros, others: u32) -> Micros {
        let part = init_us.min(self.create_us) as f64;
        init_us + (self.creation_slowdown * f64::from(others) * part).round() as Micros
    }

    /// The CPUs a creation of `init_us` demands while in flight: `β`, spread over a longer init.
    pub fn creation_demand(&self, init_us: Micros) -> f64 {
        if init_us <= self.create_us {
            self.creation_cpu
        } else {
            self.creation_cpu * self.create_us as f64 / init_us as f64
        }
    }
}

/// Each worker's server model (`hearth sim --server`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Server {
    /// Egalitarian processor sharing, with no interference: the idealized model.
    #[default]
    Ps,
    /// Processor sharing with the measured interference ([`Contention`]).
    Contention(Contention),
}

impl Server {
    /// The contention constants, under the contention server.
    pub fn contention(&self) -> Option<Contention> {
        match self {
            Server::Ps => None,
            Server::Contention(c) => Some(*c),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Server::Ps => "ps",
            Server::Contention(_) => "contention",
        }
    }
}

impl std::str::FromStr for Server {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "ps" => Ok(Server::Ps),
            "contention" => Ok(Server::Contention(Contention::default())),
            _ => Err(format!("unknown server {s:?} (expected ps or contention)")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn up_to_the_cpus_jobs_run_at_full_speed() {
        let c = Contention::default();
        assert_eq!(c.rate(2.0, 1, 0.0), 1.0);
        assert_eq!(c.rate(2.0, 2, 0.0), 1.0);
        // One creation beside one job: 1.6 of demand on 2 CPUs still fits.
        assert_eq!(c.rate(2.0, 1, c.creation_demand(65_000)), 1.0);
    }

    #[test]
    fn overcommit_costs_the_fitted_overhead_beyond_the_fair_share() {
        let c = Contention::default();
        assert!((c.rate(2.0, 4, 0.0) - 0.5 / 1.05).abs() < 1e-12);
        assert!((c.rate(2.0, 16, 0.0) - 0.125 / 1.05).abs() < 1e-12);
        // Two jobs and two creations: a demand of 3.2 on 2 CPUs.
        assert!((c.rate(2.0, 2, 1.2) - 2.0 / 3.2 / 1.05).abs() < 1e-12);
    }

    #[test]
    fn concurrent_creations_take_longer() {
        let c = Contention::default();
        assert_eq!(c.init_us(65_000, 0), 65_000);
        // The bench's 12 at once: 65 ms × (1 + 0.3 × 11) ≈ 280 ms against 270 measured.
        assert_eq!(c.init_us(65_000, 11), 279_500);
        // A 5 s init: only its 65 ms of sandbox creation contends, and its 39 ms of creation
        // CPU is spread over the 5 s.
        assert_eq!(c.init_us(5_000_000, 11), 5_214_500);
        assert!((c.creation_demand(5_000_000) - 0.6 * 0.013).abs() < 1e-12);
        assert_eq!(c.creation_demand(20_000), 0.6);
    }

    #[test]
    fn the_server_parses_and_out_of_range_constants_are_refused() {
        assert_eq!("ps".parse::<Server>(), Ok(Server::Ps));
        assert_eq!(
            "contention".parse::<Server>().map(|s| s.contention()),
            Ok(Some(Contention::default()))
        );
        assert!("fast".parse::<Server>().is_err());
        assert!(Contention::default().check().is_ok());
        let bad = Contention {
            creation_cpu: f64::NAN,
            ..Contention::default()
        };
        assert!(bad.check().is_err());
    }
}
