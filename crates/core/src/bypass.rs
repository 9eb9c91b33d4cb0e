//! The short-function bypass (thesis ch. 5.3.1): an invocation expected to be shorter than a
//! threshold runs at once, skipping the queue and the concurrency limit, while the worker's load
//! is under a limit.

use crate::time::Micros;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BypassConfig {
    /// Expected run time below which an invocation may bypass the queue (0: never).
    pub threshold_us: Micros,
    /// Normalized load (load average / CPUs) at or above which nothing bypasses.
    pub max_load: f64,
}

impl Default for BypassConfig {
    fn default() -> Self {
        BypassConfig {
            threshold_us: 0,
            max_load: 1.0,
        }
    }
}

impl BypassConfig {
    /// Whether an invocation with `expected_us` bypasses, given what is known of its function
    /// (`known`: it ran warm before; an unknown function's zero estimate is no evidence it is
    /// short) and the load.
    pub fn allows(&self, known: bool, expected_us: Micros, normalized_load: f64) -> bool {
        self.threshold_us > 0
            && known
            && expected_us < self.threshold_us
            && normalized_load < self.max_load
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::ms;

    #[test]
    fn bypass_decisions() {
        let b = BypassConfig {
            threshold_us: ms(10),
            max_load: 0.8,
        };
        assert!(b.allows(true, ms(2), 0.5));
        assert!(
            !b.allows(true, ms(10), 0.5),
            "not shorter than the threshold"
        );
        assert!(!b.allows(true, ms(2), 0.8), "load at the limit");
        assert!(!b.allows(false, 0, 0.0), "unknown function");
        assert!(
            !BypassConfig::default().allows(true, 0, 0.0),
            "off by default"
        );
    }
}
