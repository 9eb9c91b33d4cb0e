//! The Hearth worker: the async shell around the sans-I/O core (DESIGN.md §1–§5).

pub mod agent_client;
pub mod api;
pub mod archive;
pub mod backend;
pub mod config;
pub mod config_checks;
pub mod config_loader;
pub mod error;
pub mod in_flight;
pub mod invocations;
pub mod latency;
pub mod membership;
pub mod metrics;
pub mod registry;
pub mod server;
pub mod serving;
pub mod worker;

pub use config::{BackendKind, WorkerConfig};
pub use worker::Worker;
