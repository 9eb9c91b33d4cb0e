//! Per-function characteristics learned online (thesis ch. 5.3.2): warm and cold times over a
//! moving window, init time, inter-arrival time, invocation count and memory.
//!
//! Queue disciplines, the bypass and the keep-alive policies read these; a function never seen
//! has zero expected time, which puts it first in size-based queues.

use crate::time::Micros;
use serde::Serialize;
use std::collections::VecDeque;

/// Samples kept per moving window.
pub const WINDOW: usize = 16;
/// Weight of the newest inter-arrival time in its moving average.
pub const IAT_EWMA_ALPHA: f64 = 0.25;

/// The mean of the last [`WINDOW`] samples.
#[derive(Debug, Clone, Default)]
pub struct MovingWindow {
    samples: VecDeque<Micros>,
    sum: u64,
}

impl MovingWindow {
    pub fn push(&mut self, v: Micros) {
        if self.samples.len() == WINDOW {
            if let Some(old) = self.samples.pop_front() {
                self.sum -= old;
            }
        }
        self.samples.push_back(v);
        self.sum += v;
    }

    /// The window's mean, or `None` before the first sample.
    pub fn mean(&self) -> Option<Micros> {
        (!self.samples.is_empty()).then(|| self.sum / self.samples.len() as u64)
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
}

/// What is known about one function on one worker.
#[derive(Debug, Clone, Default)]
pub struct Characteristics {
    warm: MovingWindow,
    cold: MovingWindow,
    iat_ewma: Option<f64>,
    last_iat: Option<Micros>,
    last_arrival: Option<Micros>,
    invocations: u64,
    memory_mb: u64,
}

impl Characteristics {
    /// An invocation arrived (counted whether it runs, queues or is rejected).
    pub fn on_arrival(&mut self, now: Micros, memory_mb: u64) {
        if let Some(last) = self.last_arrival {
            let iat = now.saturating_sub(last);
            self.last_iat = Some(iat);
            self.iat_ewma = Some(match self.iat_ewma {
                None => iat as f64,
                Some(prev) => prev + IAT_EWMA_ALPHA * (iat as f64 - prev),
            });
        }
        self.last_arrival = Some(now);
        self.invocations += 1;
        self.memory_mb = memory_mb;
    }

    /// A warm invocation ran for `exec` µs.
    pub fn on_warm(&mut self, exec: Micros) {
        self.warm.push(exec);
    }

    /// A cold invocation took `total` µs: sandbox start, import and execution.
    pub fn on_cold(&mut self, total: Micros) {
        self.cold.push(total);
    }

    /// Expected warm execution time; 0 for a function that never ran warm.
    pub fn warm_us(&self) -> Micros {
        self.warm.mean().unwrap_or(0)
    }

    pub fn has_warm_samples(&self) -> bool {
        !self.warm.is_empty()
    }

    /// Whether a cold start was seen.
    pub fn has_cold_samples(&self) -> bool {
        !self.cold.is_empty()
    }

    /// Expected cold time (start + execution); the warm time when no cold start was seen.
    pub fn cold_us(&self) -> Micros {
        self.cold.mean().unwrap_or_else(|| self.warm_us())
    }

    /// Init time = cold − warm (thesis ch. 3.3.1: the cost of a cold start).
    pub fn init_us(&self) -> Micros {
        self.cold_us().saturating_sub(self.warm_us())
    }

    /// Expected time of the next invocation: warm if a warm sandbox is expected to be free.
    pub fn expected_us(&self, warm_expected: bool) -> Micros {
        if warm_expected {
            self.warm_us()
        } else {
            self.cold_us()
        }
    }

    /// Moving average of inter-arrival times; 0 before the second arrival.
    pub fn iat_us(&self) -> Micros {
        self.iat_ewma.map_or(0, |v| v.round() as Micros)
    }

    pub fn last_iat(&self) -> Option<Micros> {
        self.last_iat
    }

    pub fn last_arrival(&self) -> Option<Micros> {
        self.last_arrival
    }

    pub fn invocations(&self) -> u64 {
        self.invocations
    }

    pub fn memory_mb(&self) -> u64 {
        self.memory_mb
    }

    /// A snapshot for status pages, relative to `now`.
    pub fn report(&self, now: Micros) -> CharacteristicsReport {
        CharacteristicsReport {
            invocations: self.invocations,
            warm_ms: ms(self.warm_us()),
            cold_ms: ms(self.cold_us()),
            init_ms: ms(self.init_us()),
            warm_samples: self.warm.len(),
            cold_samples: self.cold.len(),
            iat_ewma_ms: ms(self.iat_us()),
            last_arrival_ago_ms: self.last_arrival.map(|t| ms(now.saturating_sub(t))),
            memory_mb: self.memory_mb,
        }
    }
}

fn ms(us: Micros) -> f64 {
    us as f64 / 1000.0
}

/// [`Characteristics`] as `GET /v1/functions/{name}` shows them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CharacteristicsReport {
    pub invocations: u64,
    pub warm_ms: f64,
    pub cold_ms: f64,
    pub init_ms: f64,
    pub warm_samples: usize,
    pub cold_samples: usize,
    pub iat_ewma_ms: f64,
    pub last_arrival_ago_ms: Option<f64>,
    pub memory_mb: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::ms as t_ms;

    #[test]
    fn new_functions_have_zero_expected_time() {
        let c = Characteristics::default();
        assert_eq!(
            (c.warm_us(), c.cold_us(), c.init_us(), c.iat_us()),
            (0, 0, 0, 0)
        );
        assert_eq!(c.expected_us(true), 0);
        assert_eq!(c.expected_us(false), 0);
    }

    #[test]
    fn windows_average_the_last_samples_and_init_is_cold_minus_warm() {
        let mut c = Characteristics::default();
        c.on_cold(t_ms(110));
        c.on_cold(t_ms(130));
        for _ in 0..WINDOW {
            c.on_warm(t_ms(50));
        }
        c.on_warm(t_ms(10)); // pushes one 50 out: mean = (15·50 + 10) / 16
        assert_eq!(c.warm_us(), (15 * 50_000 + 10_000) / 16);
        assert_eq!(c.cold_us(), t_ms(120));
        assert_eq!(c.init_us(), t_ms(120) - c.warm_us());
        assert_eq!(c.expected_us(true), c.warm_us());
        assert_eq!(c.expected_us(false), t_ms(120));
    }

    #[test]
    fn inter_arrival_time_is_an_ewma_of_gaps() {
        let mut c = Characteristics::default();
        c.on_arrival(t_ms(0), 128);
        assert_eq!(c.iat_us(), 0);
        c.on_arrival(t_ms(100), 128);
        assert_eq!(c.iat_us(), t_ms(100));
        c.on_arrival(t_ms(300), 256); // gap 200: 100 + 0.25·(200 − 100) = 125
        assert_eq!(c.iat_us(), t_ms(125));
        assert_eq!(c.last_iat(), Some(t_ms(200)));
        assert_eq!((c.invocations(), c.memory_mb()), (3, 256));
        let r = c.report(t_ms(310));
        assert_eq!(r.last_arrival_ago_ms, Some(10.0));
        assert_eq!(r.iat_ewma_ms, 125.0);
    }
}
