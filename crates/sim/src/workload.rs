//! The simulator's input: the functions of a trace with their model times, and the arrivals.
//!
//! Built from the load generator's trace and metadata files, so the simulator and a real run
//! replay exactly the same workload.

use crate::error::{Result, SimError};
use hearth_core::balance::FunctionKey;
use hearth_core::Micros;
use hearth_loadgen::{Metadata, Trace};
use std::collections::BTreeMap;
use std::sync::Arc;

/// One function as the model sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct SimFunction {
    pub name: Arc<str>,
    /// The balancer's key (the stable hash of the name), computed once.
    pub key: FunctionKey,
    /// CPU work of one invocation at full speed: the metadata's `warm_ms`.
    pub warm_us: Micros,
    /// Extra delay of a cold start: the metadata's `cold_ms` (its documented meaning: the added
    /// cost of a cold start, which the `sim` backend also sleeps).
    pub init_us: Micros,
    pub memory_mb: u64,
    /// Higher is more important (k-CH-RLU pools). The metadata has no column for it: experiments
    /// set it.
    pub priority: i32,
    /// Deadline relative to arrival (SRSF): the metadata's `deadline_ms` (whole ms, rounded up,
    /// as registered with the API) or one an experiment sets.
    pub deadline_us: Option<Micros>,
    /// Sandboxes started on every worker before the trace begins (as `hearth load trace
    /// --prewarm` does before it starts its clock).
    pub prewarm: u32,
    /// The function's `timeout_ms`: an execution (init excluded, as the worker times only the
    /// handler) still running this long after it started is killed, ends in a 504 and its
    /// sandbox is not reused. None: no limit (the metadata has no column for it, and `hearth
    /// load trace` registers a generous one).
    pub timeout_us: Option<Micros>,
    /// The part of `init_us` spent importing dependencies (the API's `sim_import_ms`): what a
    /// pre-imported generic sandbox of the function's layer saves besides the sandbox's creation.
    pub import_us: Micros,
    /// The function's dependency layer (any name: a digest for a worker); functions of one layer
    /// share pre-imported generic sandboxes. None: no layer, bare generic sandboxes.
    pub layer: Option<Arc<str>>,
}

impl SimFunction {
    /// A function of priority 0 without deadline, prewarming or timeout.
    pub fn new(name: &str, warm_us: Micros, init_us: Micros, memory_mb: u64) -> Self {
        SimFunction {
            name: Arc::from(name),
            key: FunctionKey::of(name),
            warm_us,
            init_us,
            memory_mb,
            priority: 0,
            deadline_us: None,
            prewarm: 0,
            timeout_us: None,
            import_us: 0,
            layer: None,
        }
    }

    /// Warm time plus init time: what a cold invocation takes unloaded.
    pub fn cold_us(&self) -> Micros {
        self.warm_us + self.init_us
    }
}

/// One scheduled invocation: when, and which function (an index into [`Workload::functions`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    pub at_us: Micros,
    pub function: u32,
}

/// Functions and arrivals. The index of an arrival is the invocation's `id` in the results, as
/// for the load generator.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Workload {
    pub functions: Vec<SimFunction>,
    /// In time order; ties keep trace order.
    pub arrivals: Vec<Arrival>,
}

fn us(ms: f64) -> Micros {
    (ms * 1000.0).round() as Micros
}

impl Workload {
    /// The functions the trace invokes (in name order), with their metadata; a trace function
    /// the metadata lacks is an error.
    pub fn new(trace: &Trace, meta: &Metadata) -> Result<Self> {
        let mut index: BTreeMap<&str, u32> = BTreeMap::new();
        for inv in &trace.invocations {
            if index.contains_key(inv.function.as_str()) {
                continue;
            }
            if meta.get(&inv.function).is_none() {
                return Err(SimError::UnknownFunction {
                    function: inv.function.clone(),
                    at_ms: inv.at_us as f64 / 1000.0,
                });
            }
            index.insert(inv.function.as_str(), 0);
        }
        let mut functions = Vec::with_capacity(index.len());
        for (i, (name, slot)) in index.iter_mut().enumerate() {
            *slot = i as u32;
            let m = meta
                .get(name)
                .ok_or_else(|| SimError::Config(format!("no metadata for {name}")))?;
            let mut f = SimFunction::new(name, us(m.warm_ms), us(m.cold_ms), m.memory_mb());
            f.deadline_us = m.deadline_ms_registered().map(|d| d * 1000);
            functions.push(f);
        }
        let arrivals = trace
            .invocations
            .iter()
            .map(|inv| Arrival {
                at_us: inv.at_us,
                function: index[inv.function.as_str()],
            })
            .collect();
        Ok(Workload {
            functions,
            arrivals,
        })
    }

    /// Reads a trace and its metadata.
    pub fn read(trace: &std::path::Path, meta: &std::path::Path) -> Result<Self> {
        let t = Trace::read(trace)?;
        let m = Metadata::read(meta)?;
        Workload::new(&t, &m)
    }

    /// Prewarms each function's sandboxes by Little's law (its rate × warm time, at least one),
    /// exactly as `hearth load trace --prewarm` counts them.
    pub fn prewarm_by_littles_law(&mut self, trace: &Trace, meta: &Metadata) {
        let rates = trace.rates_per_s();
        for f in &mut self.functions {
            if let (Some(m), Some(rate)) = (meta.get(&f.name), rates.get(&*f.name)) {
                f.prewarm = m.prewarm_count(*rate);
            }
        }
    }

    /// Gives every function the same sandbox set-up (cold start) time, `init_us`: Atoll's
    /// Fig. 12a varies the allocation overhead this way.
    pub fn set_init_us(&mut self, init_us: Micros) {
        for f in &mut self.functions {
            f.init_us = init_us;
        }
    }

    pub fn function(&self, i: u32) -> &SimFunction {
        &self.functions[i as usize]
    }

    /// Invocations per function, by index.
    pub fn counts(&self) -> Vec<u64> {
        let mut n = vec![0u64; self.functions.len()];
        for a in &self.arrivals {
            n[a.function as usize] += 1;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_loadgen::{FunctionMeta, Invocation};

    fn meta(rows: &[(&str, f64, f64, f64)]) -> Metadata {
        let mut m = Metadata::default();
        for (f, warm, cold, mem) in rows {
            m.insert(FunctionMeta {
                function: f.to_string(),
                warm_ms: *warm,
                cold_ms: *cold,
                mem_mb: *mem,
                sample: String::new(),
                args: String::new(),
                source: String::new(),
                deadline_ms: None,
            });
        }
        m
    }

    fn trace(rows: &[(u64, &str)]) -> Trace {
        Trace::from_invocations(
            rows.iter()
                .map(|(at_us, f)| Invocation {
                    at_us: *at_us,
                    function: f.to_string(),
                })
                .collect(),
        )
    }

    #[test]
    fn functions_take_their_times_from_the_metadata() {
        let m = meta(&[
            ("b", 10.5, 200.0, 100.4),
            ("a", 1.0, 0.0, 8.0),
            ("x", 1.0, 1.0, 1.0),
        ]);
        let w = Workload::new(&trace(&[(5, "b"), (7, "a"), (9, "b")]), &m).unwrap();
        let names: Vec<&str> = w.functions.iter().map(|f| &*f.name).collect();
        assert_eq!(names, ["a", "b"], "only the trace's functions, by name");
        let b = &w.functions[1];
        assert_eq!(
            (b.warm_us, b.init_us, b.cold_us()),
            (10_500, 200_000, 210_500)
        );
        assert_eq!(b.memory_mb, 101);
        assert_eq!(w.functions[0].memory_mb, 32, "the worker's minimum");
        let fns: Vec<u32> = w.arrivals.iter().map(|a| a.function).collect();
        assert_eq!(fns, [1, 0, 1]);
        assert_eq!(w.counts(), [1, 2]);
    }

    #[test]
    fn a_trace_function_without_metadata_is_an_error() {
        let m = meta(&[("a", 1.0, 0.0, 8.0)]);
        let err = Workload::new(&trace(&[(0, "a"), (2500, "ghost")]), &m).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the trace invokes \"ghost\" (first at 2.500 ms) but the metadata has no row for it"
        );
    }
}
