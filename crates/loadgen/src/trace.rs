//! Trace files: one row per invocation, `time_ms,function`, read by the load generator and the
//! simulator alike.

use crate::csvio::{self, CsvOut};
use crate::error::{LoadgenError, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// One scheduled invocation: `at_us` after the trace starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub at_us: u64,
    pub function: String,
}

/// A workload: invocations in time order (ties keep file order).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trace {
    pub invocations: Vec<Invocation>,
}

#[derive(Deserialize)]
struct TraceRowIn {
    // Iluvatar's trace files spell the columns `invoke_time_ms,func_name`; both are accepted.
    #[serde(alias = "invoke_time_ms")]
    time_ms: f64,
    #[serde(alias = "func_name")]
    function: String,
}

#[derive(Serialize)]
struct TraceRowOut<'a> {
    time_ms: String,
    function: &'a str,
}

/// Checks a function name with the worker's own rules, so a trace never names a function that
/// cannot be registered.
pub fn check_function_name(name: &str) -> std::result::Result<(), String> {
    match hearth_api::FunctionSpec::new(name).validate() {
        Err(hearth_api::SpecError::BadName(_)) => Err(format!(
            "function name must be 1-64 characters of [A-Za-z0-9_-] starting with a letter or digit: {name:?}"
        )),
        _ => Ok(()),
    }
}

/// Milliseconds with microsecond precision, as written in trace files.
pub fn format_ms(us: u64) -> String {
    format!("{}.{:03}", us / 1000, us % 1000)
}

impl Trace {
    /// Builds a trace from invocations in any order.
    pub fn from_invocations(mut invocations: Vec<Invocation>) -> Self {
        invocations.sort_by_key(|i| i.at_us);
        Trace { invocations }
    }

    /// Reads a trace file; rows may come in any order.
    pub fn read(path: &Path) -> Result<Self> {
        let mut invocations = Vec::new();
        csvio::read_rows(
            path,
            "trace",
            &[&["time_ms", "invoke_time_ms"], &["function", "func_name"]],
            |line, row: TraceRowIn| {
                if !row.time_ms.is_finite() || row.time_ms < 0.0 {
                    return Err(LoadgenError::invalid(
                        path,
                        line,
                        format!("time_ms must be a non-negative number, got {}", row.time_ms),
                    ));
                }
                check_function_name(&row.function)
                    .map_err(|m| LoadgenError::invalid(path, line, m))?;
                invocations.push(Invocation {
                    at_us: (row.time_ms * 1000.0).round() as u64,
                    function: row.function,
                });
                Ok(())
            },
        )?;
        if invocations.is_empty() {
            return Err(LoadgenError::file(path, "the trace has no invocations"));
        }
        Ok(Trace::from_invocations(invocations))
    }

    /// Writes the trace as `time_ms,function`.
    pub fn write(&self, path: &Path) -> Result<()> {
        let mut out = CsvOut::create(path)?;
        for inv in &self.invocations {
            out.row(&TraceRowOut {
                time_ms: format_ms(inv.at_us),
                function: &inv.function,
            })?;
        }
        out.finish()
    }

    /// Time of the last invocation (µs).
    pub fn span_us(&self) -> u64 {
        self.invocations.last().map_or(0, |i| i.at_us)
    }

    /// Invocations per function.
    pub fn counts(&self) -> BTreeMap<&str, usize> {
        let mut m = BTreeMap::new();
        for i in &self.invocations {
            *m.entry(i.function.as_str()).or_insert(0) += 1;
        }
        m
    }

    /// Mean arrival rate per function (invocations/s over the whole trace span; a span under one
    /// second counts as one second so a tiny trace does not claim an enormous rate).
    pub fn rates_per_s(&self) -> BTreeMap<&str, f64> {
        let span_s = (self.span_us() as f64 / 1e6).max(1.0);
        self.counts()
            .into_iter()
            .map(|(f, n)| (f, n as f64 / span_s))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &tempfile::TempDir, text: &str) -> std::path::PathBuf {
        let p = dir.path().join("t.csv");
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn round_trips_and_sorts_by_time() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(&dir, "time_ms,function\n2.5,b\n0,a\n1.0005,a\n");
        let t = Trace::read(&p).unwrap();
        let got: Vec<(u64, &str)> = t
            .invocations
            .iter()
            .map(|i| (i.at_us, i.function.as_str()))
            .collect();
        assert_eq!(got, vec![(0, "a"), (1001, "a"), (2500, "b")]);
        let out = dir.path().join("out.csv");
        t.write(&out).unwrap();
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            "time_ms,function\n0.000,a\n1.001,a\n2.500,b\n"
        );
        assert_eq!(Trace::read(&out).unwrap(), t);
    }

    #[test]
    fn reads_iluvatar_column_names() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(&dir, "func_name,invoke_time_ms\nda708abab3,6\n");
        let t = Trace::read(&p).unwrap();
        assert_eq!(t.invocations[0].at_us, 6000);
        assert_eq!(t.invocations[0].function, "da708abab3");
    }

    #[test]
    fn malformed_traces_name_the_line_and_problem() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("time,fn\n1,a\n", "missing column `time_ms`"),
            ("time_ms,function\n1,a\nsoon,b\n", "line 3"),
            ("time_ms,function\n-4,a\n", "non-negative"),
            ("time_ms,function\n1,../etc\n", "function name"),
            ("time_ms,function\n1\n", "line 2"),
            ("time_ms,function\n", "no invocations"),
        ];
        for (text, needle) in cases {
            let err = Trace::read(&write(&dir, text)).unwrap_err().to_string();
            assert!(
                err.contains(needle),
                "{text:?}: {err} should mention {needle}"
            );
            assert!(err.contains("t.csv"), "{err} should name the file");
        }
        let err = Trace::read(&dir.path().join("missing.csv"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing.csv"), "{err}");
    }
}
