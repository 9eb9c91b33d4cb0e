//! A load average computed the way Linux computes its 1-minute `loadavg`: every 5 s,
//! `load = load · e^(−5/60) + n · (1 − e^(−5/60))`, where `n` is the number of runnable tasks.
//!
//! The simulator and the `sim` backend have no real load to read, so they feed this with their
//! running invocations; a real worker reads `/proc/loadavg` instead.

use crate::time::{secs, Micros};

/// Linux samples the run queue every 5 s (`LOAD_FREQ`).
pub const SAMPLE_PERIOD: Micros = secs(5);
/// The 1-minute average's time constant.
pub const WINDOW: Micros = secs(60);

#[derive(Debug, Clone)]
pub struct LoadAverage {
    value: f64,
    next_sample: Micros,
    decay: f64,
}

impl Default for LoadAverage {
    fn default() -> Self {
        LoadAverage {
            value: 0.0,
            next_sample: SAMPLE_PERIOD,
            decay: (-(SAMPLE_PERIOD as f64) / WINDOW as f64).exp(),
        }
    }
}

impl LoadAverage {
    /// Applies every sample due by `now`, with `running` tasks since the last call.
    pub fn advance(&mut self, now: Micros, running: usize) {
        if now < self.next_sample {
            return;
        }
        let steps = (now - self.next_sample) / SAMPLE_PERIOD + 1;
        let d = self.decay.powi(steps.min(i32::MAX as u64) as i32);
        self.value = self.value * d + running as f64 * (1.0 - d);
        self.next_sample += steps * SAMPLE_PERIOD;
    }

    pub fn value(&self) -> f64 {
        self.value
    }

    /// When the next sample is due.
    pub fn next_sample(&self) -> Micros {
        self.next_sample
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_the_kernel_recurrence() {
        let mut l = LoadAverage::default();
        l.advance(secs(4), 2);
        assert_eq!(l.value(), 0.0, "no sample before 5 s");
        l.advance(secs(5), 2);
        let e = (-5.0f64 / 60.0).exp();
        assert!((l.value() - 2.0 * (1.0 - e)).abs() < 1e-12);
        // Two periods at once (10 s and 15 s) with 2 running: same as two single steps.
        let mut m = l.clone();
        m.advance(secs(10), 2);
        m.advance(secs(15), 2);
        l.advance(secs(15), 2);
        assert!((l.value() - m.value()).abs() < 1e-12);
        assert_eq!(l.next_sample(), secs(20));
        // A minute at 4 running lifts it to within 1/e of 4.
        for t in (20..=75).step_by(5) {
            l.advance(secs(t), 4);
        }
        assert!(l.value() > 4.0 * (1.0 - (-1.0f64).exp()), "{}", l.value());
    }
}
