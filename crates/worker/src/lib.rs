//! The Hearth worker: the async shell around the sans-I/O core (DESIGN.md §1–§5), in three
//! layers: the [`driver`] owns the engine, its timers and the sandbox backend; the [`facade`]
//! holds the domain operations and returns domain errors ([`errors`]); [`api`] is the HTTP edge,
//! the only place that knows status codes.

pub mod agent_client;
pub mod api;
pub mod backend;
pub mod config;
pub mod cpu_sched;
pub mod cpuset;
pub mod driver;
pub mod errors;
pub mod facade;
pub mod gpu;
pub mod latency;
pub mod layers;
pub mod membership;
pub mod metrics;
pub mod runtimes;
pub mod server;

pub use config::{BackendKind, WorkerConfig};
pub use facade::Worker;
