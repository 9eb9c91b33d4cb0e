//! What the worker and the controller share: the serving skeleton and graceful shutdown, the
//! layered config loader and its checks, the HTTP edge's request readers and common endpoints,
//! the API error type, in-flight tracking, metrics helpers, the function registry with its code
//! store, and the store of async invocations. The controller depends on this crate and on
//! `hearth-api`, never on the worker.

pub mod archive;
pub mod async_api;
pub mod auth;
pub mod config_checks;
pub mod config_loader;
pub mod dedup;
pub mod delivery;
pub mod error;
pub mod http;
pub mod in_flight;
pub mod intake;
pub mod invocations;
pub mod keys_api;
pub mod metrics;
pub mod quota;
pub mod registry;
pub mod serving;
pub mod store;
pub mod tls;

pub use async_trait::async_trait;
pub use error::ApiError;
