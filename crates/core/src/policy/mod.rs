//! Policies chosen by name: keep-alive and eviction, queue disciplines.

pub mod hist;
pub mod keepalive;
pub mod queue;
