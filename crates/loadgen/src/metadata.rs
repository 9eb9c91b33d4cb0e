//! Metadata files: one row per function of a trace, saying how to register and invoke it.
//! `function,warm_ms,cold_ms,mem_mb,sample,args,source[,deadline_ms]`.

use crate::csvio::{self, CsvOut};
use crate::error::{LoadgenError, Result};
use crate::trace::check_function_name;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// The sample function that emulates any trace function: spins `ms`, holds `mb`.
pub const BUSY: &str = "busy";
/// What the Python interpreter and agent hold by themselves, left out of `busy`'s `mb`.
pub const PYTHON_BASELINE_MB: f64 = 24.0;
/// The smallest sandbox registered: the runtime alone needs this much.
pub const MIN_MEMORY_MB: u64 = 32;

/// How one trace function behaves and how to stand it up on a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionMeta {
    /// The name in the trace and on the worker.
    #[serde(alias = "func_name")]
    pub function: String,
    /// Unloaded warm execution time: the sim backend's `sim_warm_ms`, and the reference for stretch.
    #[serde(alias = "warm_dur_ms")]
    pub warm_ms: f64,
    /// Extra cost of a cold start: the sim backend's `sim_cold_ms`.
    #[serde(alias = "cold_dur_ms")]
    pub cold_ms: f64,
    /// Memory of the function (MiB); registered as at least [`MIN_MEMORY_MB`].
    pub mem_mb: f64,
    /// The sample function (a directory under `functions/`) whose code is registered; empty means `busy`.
    #[serde(default)]
    pub sample: String,
    /// The invocation body, a JSON object; empty means `busy`'s `{"ms": warm_ms, "mb": …}`.
    #[serde(default)]
    pub args: String,
    /// Where the function came from (e.g. the Azure hash). `hearth trace make atoll` writes
    /// `atoll:C1`…`atoll:C4` (the Atoll class) or `atoll:W3:<hash>`; see [`FunctionMeta::class`].
    #[serde(default)]
    pub source: String,
    /// Relative deadline (ms after arrival: execution + slack), registered as the function's
    /// `deadline_ms` for deadline-aware scheduling. Absent in files without the column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<f64>,
}

/// A metadata row with every column, for files where some function has a deadline: the CSV
/// writer takes its header from the first row, so every row must have the same columns.
#[derive(Serialize)]
struct FullRow<'a> {
    function: &'a str,
    warm_ms: f64,
    cold_ms: f64,
    mem_mb: f64,
    sample: &'a str,
    args: &'a str,
    source: &'a str,
    deadline_ms: Option<f64>,
}

impl FunctionMeta {
    /// The sample function to register.
    pub fn sample(&self) -> &str {
        if self.sample.is_empty() {
            BUSY
        } else {
            &self.sample
        }
    }

    /// The invocation arguments (validated when the file was read).
    pub fn invocation_args(&self) -> Value {
        if self.args.is_empty() {
            json!({
                "ms": self.warm_ms,
                "mb": (self.mem_mb - PYTHON_BASELINE_MB).max(0.0).round(),
            })
        } else {
            serde_json::from_str(&self.args).unwrap_or(Value::Null)
        }
    }

    /// The Atoll class (`C1`…`C4`, or `W3` for workload 3) when `trace make atoll` made it.
    pub fn class(&self) -> Option<&str> {
        let rest = self.source.strip_prefix("atoll:")?;
        Some(rest.split(':').next().unwrap_or(rest))
    }

    /// The deadline to register: whole ms rounded up, at least 1.
    pub fn deadline_ms_registered(&self) -> Option<u64> {
        self.deadline_ms.map(|d| (d.ceil() as u64).max(1))
    }

    /// Memory to register with the worker (MiB).
    pub fn memory_mb(&self) -> u64 {
        (self.mem_mb.ceil() as u64).max(MIN_MEMORY_MB)
    }

    /// Sandboxes that keep up with `rate_per_s` by Little's law (rate × warm time), at least one.
    pub fn prewarm_count(&self, rate_per_s: f64) -> u32 {
        (rate_per_s * self.warm_ms / 1000.0).ceil().max(1.0) as u32
    }

    fn check(&self) -> std::result::Result<(), String> {
        check_function_name(&self.function)?;
        for (what, v) in [
            ("warm_ms", self.warm_ms),
            ("cold_ms", self.cold_ms),
            ("mem_mb", self.mem_mb),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(format!("{what} must be a non-negative number, got {v}"));
            }
        }
        if let Some(d) = self.deadline_ms {
            if !d.is_finite() || d <= 0.0 {
                return Err(format!("deadline_ms must be a positive number, got {d}"));
            }
        }
        if !self.args.is_empty() {
            match serde_json::from_str::<Value>(&self.args) {
                Ok(Value::Object(_)) => {}
                _ => return Err(format!("args must be a JSON object, got {:?}", self.args)),
            }
        }
        Ok(())
    }
}

/// The functions of a trace, by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    pub functions: BTreeMap<String, FunctionMeta>,
}

impl Metadata {
    /// Reads a metadata file; Iluvatar's `func_name,cold_dur_ms,warm_dur_ms,mem_mb` files work too.
    pub fn read(path: &Path) -> Result<Self> {
        let mut functions = BTreeMap::new();
        csvio::read_rows(
            path,
            "metadata",
            &[
                &["function", "func_name"],
                &["warm_ms", "warm_dur_ms"],
                &["cold_ms", "cold_dur_ms"],
                &["mem_mb"],
            ],
            |line, row: FunctionMeta| {
                row.check()
                    .map_err(|m| LoadgenError::invalid(path, line, m))?;
                if functions.contains_key(&row.function) {
                    return Err(LoadgenError::invalid(
                        path,
                        line,
                        format!("function {} is listed twice", row.function),
                    ));
                }
                functions.insert(row.function.clone(), row);
                Ok(())
            },
        )?;
        if functions.is_empty() {
            return Err(LoadgenError::file(path, "the metadata lists no function"));
        }
        Ok(Metadata { functions })
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        let mut out = CsvOut::create(path)?;
        let full = self.functions.values().any(|f| f.deadline_ms.is_some());
        for f in self.functions.values() {
            if full {
                out.row(&FullRow {
                    function: &f.function,
                    warm_ms: f.warm_ms,
                    cold_ms: f.cold_ms,
                    mem_mb: f.mem_mb,
                    sample: &f.sample,
                    args: &f.args,
                    source: &f.source,
                    deadline_ms: f.deadline_ms,
                })?;
            } else {
                out.row(f)?;
            }
        }
        out.finish()
    }

    pub fn insert(&mut self, f: FunctionMeta) {
        self.functions.insert(f.function.clone(), f);
    }

    pub fn get(&self, function: &str) -> Option<&FunctionMeta> {
        self.functions.get(function)
    }

    /// Expected concurrent invocations by Little's law: Σ rate × warm time.
    pub fn expected_concurrency<'a>(&self, rates: impl IntoIterator<Item = (&'a str, f64)>) -> f64 {
        rates
            .into_iter()
            .filter_map(|(f, r)| self.get(f).map(|m| r * m.warm_ms / 1000.0))
            .sum()
    }
}

/// The conventional metadata path beside a trace: `x.csv` → `x.meta.csv`.
pub fn default_path(trace: &Path) -> std::path::PathBuf {
    let stem = trace
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    trace.with_file_name(format!("{stem}.meta.csv"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<Metadata> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.csv");
        std::fs::write(&p, text).unwrap();
        Metadata::read(&p)
    }

    #[test]
    fn busy_is_the_default_sample_with_the_trace_time_and_memory() {
        let m = read("function,warm_ms,cold_ms,mem_mb\nf,250,900,124\n").unwrap();
        let f = m.get("f").unwrap();
        assert_eq!(f.sample(), "busy");
        assert_eq!(f.invocation_args(), json!({"ms": 250.0, "mb": 100.0}));
        assert_eq!(f.memory_mb(), 124);
        // 10/s × 0.25 s = 2.5 → 3 sandboxes; a rare function still gets one.
        assert_eq!(f.prewarm_count(10.0), 3);
        assert_eq!(f.prewarm_count(0.001), 1);
    }

    #[test]
    fn round_trips_with_sample_and_args() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = Metadata::default();
        m.insert(FunctionMeta {
            function: "fn-1".into(),
            warm_ms: 17.0,
            cold_ms: 300.5,
            mem_mb: 6.0,
            sample: "float_operation".into(),
            args: r#"{"n":100000}"#.into(),
            source: "abc".into(),
            deadline_ms: None,
        });
        let p = dir.path().join("m.csv");
        m.write(&p).unwrap();
        let back = Metadata::read(&p).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.get("fn-1").unwrap().memory_mb(), MIN_MEMORY_MB);
        assert_eq!(
            back.get("fn-1").unwrap().invocation_args(),
            json!({"n": 100000})
        );
    }

    #[test]
    fn deadlines_round_trip_even_when_only_some_functions_have_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = Metadata::default();
        let f = |name: &str, d: Option<f64>| FunctionMeta {
            function: name.into(),
            warm_ms: 10.0,
            cold_ms: 40.0,
            mem_mb: 128.0,
            sample: String::new(),
            args: String::new(),
            source: "atoll:C1".into(),
            deadline_ms: d,
        };
        m.insert(f("a", None));
        m.insert(f("b", Some(45.2)));
        let p = dir.path().join("m.csv");
        m.write(&p).unwrap();
        let back = Metadata::read(&p).unwrap();
        assert_eq!(back, m);
        let b = back.get("b").unwrap();
        assert_eq!(b.deadline_ms_registered(), Some(46));
        assert_eq!(b.class(), Some("C1"));
        // Without any deadline the file keeps its old columns.
        let mut plain = Metadata::default();
        plain.insert(f("a", None));
        plain.write(&p).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(!text.contains("deadline_ms"), "{text}");
        assert!(
            read("function,warm_ms,cold_ms,mem_mb,deadline_ms\nf,1,0,1,0\n")
                .unwrap_err()
                .to_string()
                .contains("deadline_ms")
        );
    }

    #[test]
    fn reads_iluvatar_metadata() {
        let m = read(
            "func_name,cold_dur_ms,warm_dur_ms,mem_mb,mean_iat\n4137b8c22f,10672,23,94,797.2\n",
        )
        .unwrap();
        let f = m.get("4137b8c22f").unwrap();
        assert_eq!((f.warm_ms, f.cold_ms, f.mem_mb), (23.0, 10672.0, 94.0));
    }

    #[test]
    fn malformed_metadata_is_refused_with_the_reason() {
        let cases = [
            (
                "function,warm_ms,mem_mb\nf,1,1\n",
                "missing column `cold_ms`",
            ),
            ("function,warm_ms,cold_ms,mem_mb\nf,-1,0,1\n", "warm_ms"),
            ("function,warm_ms,cold_ms,mem_mb\nf,1,0,x\n", "line 2"),
            (
                "function,warm_ms,cold_ms,mem_mb,args\nf,1,0,1,[1]\n",
                "JSON object",
            ),
            (
                "function,warm_ms,cold_ms,mem_mb\nf,1,0,1\nf,2,0,1\n",
                "twice",
            ),
        ];
        for (text, needle) in cases {
            let err = read(text).unwrap_err().to_string();
            assert!(
                err.contains(needle),
                "{text:?}: {err} should mention {needle}"
            );
        }
    }
}
