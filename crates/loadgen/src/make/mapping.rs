//! Standing in for a trace function with a sample function: `busy` with the trace's duration and
//! memory, or the closest FunctionBench-like function by warm time (thesis ch. 5.4.1).

use super::azure::SourceFunction;
use crate::metadata::{FunctionMeta, BUSY, PYTHON_BASELINE_MB};
use serde_json::json;
use std::str::FromStr;

/// Memory given to a function the memory file does not list (MiB).
pub const DEFAULT_MEM_MB: f64 = 128.0;

/// How trace functions become sample functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapping {
    Busy,
    FunctionBench,
}

impl FromStr for Mapping {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "busy" => Ok(Mapping::Busy),
            "functionbench" => Ok(Mapping::FunctionBench),
            _ => Err(format!("expected busy or functionbench, got {s:?}")),
        }
    }
}

/// A FunctionBench-like sample function with fixed arguments and its warm time.
#[derive(Debug, Clone, Copy)]
pub struct Proxy {
    pub sample: &'static str,
    pub args: &'static str,
    pub warm_ms: f64,
}

/// Warm times measured with `python3` on the 2-core development VM (median of 5, outside a
/// sandbox); sizes chosen to cover 0.4 ms – 8 s.
pub const PROXIES: &[Proxy] = &[
    Proxy {
        sample: "matmul",
        args: r#"{"n":20}"#,
        warm_ms: 0.4,
    },
    Proxy {
        sample: "float_operation",
        args: r#"{"n":10000}"#,
        warm_ms: 1.8,
    },
    Proxy {
        sample: "matmul",
        args: r#"{"n":60}"#,
        warm_ms: 7.2,
    },
    Proxy {
        sample: "json_dumps_loads",
        args: r#"{"n":200,"k":20}"#,
        warm_ms: 11.4,
    },
    Proxy {
        sample: "pyaes",
        args: r#"{"n":8192}"#,
        warm_ms: 18.3,
    },
    Proxy {
        sample: "zlib_compression",
        args: r#"{"size":262144}"#,
        warm_ms: 34.5,
    },
    Proxy {
        sample: "pyaes",
        args: r#"{"n":65536}"#,
        warm_ms: 87.5,
    },
    Proxy {
        sample: "json_dumps_loads",
        args: r#"{"n":1000,"k":50}"#,
        warm_ms: 156.0,
    },
    Proxy {
        sample: "zlib_compression",
        args: r#"{"size":4194304}"#,
        warm_ms: 595.0,
    },
    Proxy {
        sample: "float_operation",
        args: r#"{"n":10000000}"#,
        warm_ms: 1700.0,
    },
    Proxy {
        sample: "float_operation",
        args: r#"{"n":50000000}"#,
        warm_ms: 8500.0,
    },
];

/// The proxy whose warm time is closest to `ms` on a log scale (ratios matter, not differences).
pub fn closest_proxy(ms: f64) -> &'static Proxy {
    let target = ms.max(0.1).ln();
    PROXIES
        .iter()
        .min_by(|a, b| {
            let da = (a.warm_ms.ln() - target).abs();
            let db = (b.warm_ms.ln() - target).abs();
            da.total_cmp(&db)
        })
        .unwrap_or(&PROXIES[0])
}

/// The metadata row of `f`, registered as `name`.
pub fn map(f: &SourceFunction, name: String, mapping: Mapping) -> FunctionMeta {
    let mem_mb = f.mem_mb.unwrap_or(DEFAULT_MEM_MB).ceil();
    let cold_ms = (f.max_ms - f.avg_ms).max(0.0);
    match mapping {
        Mapping::Busy => FunctionMeta {
            function: name,
            warm_ms: f.avg_ms,
            cold_ms,
            mem_mb,
            sample: BUSY.into(),
            args: json!({"ms": f.avg_ms, "mb": (mem_mb - PYTHON_BASELINE_MB).max(0.0)}).to_string(),
            source: f.id.clone(),
            deadline_ms: None,
        },
        Mapping::FunctionBench => {
            let p = closest_proxy(f.avg_ms);
            FunctionMeta {
                function: name,
                warm_ms: p.warm_ms,
                cold_ms,
                mem_mb,
                sample: p.sample.into(),
                args: p.args.into(),
                source: f.id.clone(),
                deadline_ms: None,
            }
        }
    }
}

/// A registrable name for a source id: `fn-` and its first 10 name characters, made unique.
pub fn function_name(id: &str, taken: &mut std::collections::HashSet<String>) -> String {
    let stem: String = id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .take(10)
        .collect();
    let base = format!("fn-{stem}");
    let mut name = base.clone();
    let mut n = 1;
    while !taken.insert(name.clone()) {
        n += 1;
        name = format!("{base}-{n}");
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closest_proxy_is_by_ratio() {
        assert_eq!(closest_proxy(0.0).sample, "matmul");
        assert_eq!(closest_proxy(150.0).args, r#"{"n":1000,"k":50}"#);
        assert_eq!(closest_proxy(6000.0).args, r#"{"n":50000000}"#);
    }

    #[test]
    fn busy_mapping_keeps_time_and_memory_and_estimates_cold_as_max_minus_avg() {
        let f = SourceFunction {
            id: "abc".into(),
            per_minute: vec![1, 2],
            avg_ms: 140.0,
            max_ms: 4084.0,
            mem_mb: Some(189.4),
        };
        let m = map(&f, "fn-abc".into(), Mapping::Busy);
        assert_eq!((m.warm_ms, m.cold_ms, m.mem_mb), (140.0, 3944.0, 190.0));
        assert_eq!(m.invocation_args(), json!({"ms": 140.0, "mb": 166.0}));
        let m = map(&f, "fn-abc".into(), Mapping::FunctionBench);
        assert_eq!(m.sample, "json_dumps_loads");
        assert_eq!(m.warm_ms, 156.0);
    }

    #[test]
    fn names_are_valid_and_unique() {
        let mut taken = Default::default();
        let a = function_name("1779fd3337dd353e424d", &mut taken);
        let b = function_name("1779fd3337dd353e4xxx", &mut taken);
        assert_eq!(
            (a.as_str(), b.as_str()),
            ("fn-1779fd3337", "fn-1779fd3337-2")
        );
        assert!(crate::trace::check_function_name(&a).is_ok());
    }
}
