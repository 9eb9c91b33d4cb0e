//! Hearth's workloads: trace and metadata files, generation of traces from the Azure Functions
//! traces and synthetic shapes, open- and closed-loop replay against a running API, one result
//! row per invocation, and the summary and plots of `hearth report`.
//!
//! Everything but [`replay`] is synchronous and free of I/O beyond reading and writing files, so
//! the simulator reads the same traces and writes the same results without a runtime.

mod csvio;
pub mod error;
pub mod make;
pub mod metadata;
pub mod replay;
pub mod report;
pub mod results;
pub mod summary;
pub mod trace;

pub use error::{LoadgenError, Result};
pub use metadata::{FunctionMeta, Metadata};
pub use results::{read_results, write_results, Outcome, ResultRow, ResultWriter};
pub use summary::{Summary, WarmReference};
pub use trace::{Invocation, Trace};
