//! The Hearth controller: one public API in front of many workers (DESIGN.md §2). It keeps the
//! registry, tracks the workers that join, routes each invocation with a balancing policy from
//! the sans-I/O core ([`hearth_core::balance::Balancer`]) and forwards it over persistent
//! connections.

pub mod api;
pub mod config;
pub mod controller;
pub mod forward;
pub mod members;
pub mod metrics;
pub mod server;
pub mod timing;

pub use config::ControllerConfig;
pub use controller::Controller;
