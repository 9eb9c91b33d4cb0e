//! HIST, the hybrid histogram policy ([`crate::policy::hist`]): per function, a histogram of
//! inter-arrival times decides whether a sandbox is unloaded after its run and pre-warmed before
//! the next expected arrival, and how long it is kept; least recently used first under memory
//! pressure. The function's init time (from the pool's cost) sets how early a pre-warm starts.

use super::{
    FnId, FunctionFacts, IdleAfter, IdlePlan, KeepAliveKind, KeepAlivePolicy, SandboxFacts,
};
use crate::policy::hist::{HistConfig, IatHistogram};
use crate::time::Micros;

/// What HIST knows of one function.
#[derive(Debug, Clone, Default)]
struct FunctionHistory {
    last_arrival: Option<Micros>,
    hist: IatHistogram,
    /// How long a sandbox of it takes to start (its learned init time).
    init_us: Micros,
    /// End of the current keep-alive window, and the scheduled pre-warm.
    keep_until: Option<Micros>,
    prewarm_at: Option<Micros>,
}

#[derive(Debug, Clone)]
pub struct Hist {
    config: HistConfig,
    /// By the pool's function index (dense, so a Vec).
    functions: Vec<FunctionHistory>,
}

impl Hist {
    pub fn new(config: HistConfig) -> Self {
        Hist {
            config,
            functions: Vec::new(),
        }
    }

    fn history(&mut self, f: FnId) -> &mut FunctionHistory {
        history(&mut self.functions, f)
    }
}

/// A function's history, made on first use.
fn history(functions: &mut Vec<FunctionHistory>, f: FnId) -> &mut FunctionHistory {
    let i = f.0 as usize;
    if i >= functions.len() {
        functions.resize_with(i + 1, FunctionHistory::default);
    }
    &mut functions[i]
}

impl KeepAlivePolicy for Hist {
    fn kind(&self) -> KeepAliveKind {
        KeepAliveKind::Hist
    }

    fn priority(&self, _f: &FunctionFacts, sb: &SandboxFacts) -> f64 {
        sb.last_used as f64
    }

    fn observes_arrivals(&self) -> bool {
        true
    }

    fn on_arrival(&mut self, now: Micros, function: FnId) {
        let h = history(&mut self.functions, function);
        if let Some(last) = h.last_arrival {
            h.hist.record(now.saturating_sub(last), &self.config);
        }
        h.last_arrival = Some(now);
    }

    fn on_idle(&mut self, now: Micros, function: FnId, after: IdleAfter) -> IdlePlan {
        match after {
            IdleAfter::Run => {
                let h = history(&mut self.functions, function);
                let last = h.last_arrival.unwrap_or(now);
                let plan = h.hist.plan(now, last, h.init_us, &self.config);
                h.keep_until = Some(plan.keep_until);
                h.prewarm_at = plan.prewarm_at;
                IdlePlan {
                    deadline: Some(plan.keep_until),
                    unload: plan.unload,
                    prewarm_at: plan.prewarm_at,
                }
            }
            // A pre-warmed sandbox lives until the window set by the last run ends.
            IdleAfter::Prewarm => IdlePlan {
                deadline: self.history(function).keep_until.filter(|k| *k > now),
                ..IdlePlan::default()
            },
        }
    }

    fn on_cost(&mut self, function: FnId, init_us: Micros) {
        history(&mut self.functions, function).init_us = init_us;
    }

    fn take_prewarm(&mut self, now: Micros, function: FnId, at: Micros) -> bool {
        let h = self.history(function);
        if h.prewarm_at != Some(at) {
            return false;
        }
        h.prewarm_at = None;
        let window_passed = h.keep_until.is_some_and(|k| k <= now);
        !window_passed
    }

    fn forget(&mut self, function: FnId) {
        if let Some(h) = self.functions.get_mut(function.0 as usize) {
            *h = FunctionHistory::default();
        }
    }
}
