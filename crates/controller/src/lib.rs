//! The Hearth controller: one public API in front of many workers (DESIGN.md §2). It keeps the
//! registry, tracks the workers that join, routes each invocation with a balancing policy from
//! the sans-I/O core ([`hearth_core::balance::Balancer`]) and forwards it over persistent
//! connections.
//!
//! Three layers, as in the worker:
//! - the [`driver`] owns the routing policy behind its lock, with its clock and the membership
//!   bookkeeping that feeds it (reports, leaves, missed deadlines); [`membership`] holds what the
//!   controller knows of each worker and the tasks that sweep deadlines and poll static workers;
//! - the [`facade`] ([`Controller`]) holds the domain operations (register, invoke, prewarm,
//!   status, …) and returns typed answers and domain errors ([`errors`]), never HTTP;
//! - [`api`] is the HTTP edge, the only place that knows status codes and error bodies.
//!
//! [`forward`] is the HTTP client to the workers; [`status`] the typed status pages;
//! [`cluster_sync`] keeps a controller among several in step with the cluster's store (etcd).

pub mod api;
pub mod autoscale;
pub mod cluster_sync;
pub mod config;
pub mod driver;
pub mod errors;
pub mod facade;
pub mod forward;
pub mod membership;
pub mod metrics;
pub mod proactive;
pub mod server;
pub mod status;

pub use config::ControllerConfig;
pub use driver::RoutingPolicy;
pub use facade::Controller;
