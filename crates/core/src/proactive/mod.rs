//! Atoll's proactive sandbox allocation (SoCC '21, §4.3), as pure state machines.
//!
//! * [`estimator`] (§4.3.1): per function, an EWMA of the arrival rate measured over fixed
//!   intervals, turned into a number of sandboxes by the Poisson inverse CDF of the arrivals
//!   expected while one sandbox is set up. [`DemandEstimator`] keeps it pluggable.
//! * [`allocator`] (§4.3.2–4.3.3, Pseudocode 1): the semi-global scheduler's sandbox manager. It
//!   keeps, per worker, a proactive memory pool and the sandboxes of each function in it
//!   (active or soft-evicted), and turns a function's new demand into [`AllocAction`]s: spread
//!   evenly (or packed), soft-evict the excess lazily, hard-evict by fairness (or LRU) only when
//!   a pool is full.
//!
//! * [`scaling`] (§5.2, Pseudocode 2): the load balancer's per-function scaling over groups
//!   (semi-global schedulers) on a consistent-hash ring, driven by the sandbox-weighted queueing
//!   delay over the function's slack, and lottery routing over active and (discounted) removed
//!   groups for gradual scale-out and scale-in.
//!
//! The controller (and the simulator, with virtual time) drives them: it feeds arrivals and
//! ticks to the estimator, periodically hands each function's estimate to
//! [`Allocator::set_demand`], carries out the actions on the workers and reports back creation
//! failures, losses and uses. [`Allocator::tickets`] gives the per-worker active sandboxes that
//! lottery routing draws from. Neither piece reads a clock or does I/O.

pub mod allocator;
pub mod atoll;
pub mod estimator;
pub mod scaling;

pub use allocator::{
    AllocAction, AllocConfig, AllocConfigError, AllocStats, Allocator, EvictionMode, Placement,
    VictimPolicy, WorkerId,
};
pub use atoll::{
    Atoll, AtollConfig, AtollError, AtollStats, Command, FunctionSpec, Ladder, Outcome, Route,
    ScaleOutMode,
};
pub use estimator::{
    poisson_quantile, DemandEstimator, EstimatorError, PoissonConfig, PoissonEstimator,
};
pub use scaling::{GroupId, ScaleAction, Scaler, ScalerConfig, ScalerError};
