//! Percentiles for benchmark reports: the nearest-rank percentile `hearth report` uses too.

pub use hearth_loadgen::summary::percentile;
