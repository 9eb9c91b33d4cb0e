//! Time as the core sees it: plain microseconds on a clock chosen by the driver.
//!
//! The worker passes microseconds since it started; the simulator passes virtual time. Using an
//! integer (not `Instant`) keeps the state machines deterministic and trivially testable.

/// Microseconds on the driver's clock.
pub type Micros = u64;

/// Converts milliseconds to [`Micros`].
pub const fn ms(v: u64) -> Micros {
    v * 1_000
}

/// Converts seconds to [`Micros`].
pub const fn secs(v: u64) -> Micros {
    v * 1_000_000
}
