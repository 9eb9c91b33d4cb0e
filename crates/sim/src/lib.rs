//! Hearth's discrete-event simulator (DESIGN.md §1, §2).
//!
//! A trace replays through N simulated workers and one balancer on a virtual clock, with no
//! async runtime and no threads. Each simulated worker is the real worker's
//! [`hearth_core::WorkerEngine`] (queue, regulator, bypass, sandbox pool and keep-alive policy)
//! plus a server model: processor sharing of its CPUs, cold starts as an init delay, the engine's
//! own simulated load average. The balancer is the controller's
//! [`hearth_core::balance::Balancer`], fed stale status pushes. A policy written once is thus
//! evaluated here and deployed unchanged. `docs/simulator.md` describes the model and its limits.
//!
//! The simulator reads the load generator's trace and metadata files and writes its results
//! format, so `hearth report` works on both; [`experiments`] runs the seeds' comparisons.

pub mod closed_loop;
pub mod config;
pub mod contention;
pub mod cpu;
pub mod cpu_model;
pub mod cpu_quantum;
mod error;
pub mod events;
pub mod experiments;
pub mod gpu;
pub mod record;
pub mod router;
pub mod simulation;
pub mod workload;

pub use closed_loop::{ClosedLoop, Mix};
pub use config::{Routing, SimAutoscale, SimConfig, SimElastic};
pub use contention::{Contention, Server};
pub use cpu_model::{CpuConfig, CpuModel, CpuSched};
pub use cpu_quantum::{CpuStats, QuantumParams};
pub use error::{Result, SimError};
pub use record::{Collect, CsvSink, End, Record, Refusal, Sink};
pub use simulation::{simulate, Phase, ScaleEvent, SimStats, SimWorker, Simulation};
pub use workload::{SimFunction, Workload};
