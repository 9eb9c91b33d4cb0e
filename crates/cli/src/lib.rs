//! The `hearth` command line: client commands, benchmarks and the server entry points.

pub mod alps_bench;
pub mod auth_bench;
pub mod bench;
pub mod client;
pub mod cluster;
pub mod code;
pub mod experiment_cmd;
pub mod load;
pub mod provision_cmd;
pub mod report_cmd;
pub mod route_bench;
pub mod runtime_cmd;
pub mod sim_cmd;
pub mod stats;
pub mod trace_cmd;
