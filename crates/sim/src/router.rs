//! Who places each invocation: the controller's [`Balancer`] (the very type the controller
//! holds), or the omniscient greedy baseline that only a simulator can run.

use crate::config::Routing;
use crate::error::Result;
use crate::workload::{SimFunction, Workload};
use hearth_core::balance::{
    Balancer, Decision, Finished, FunctionInfo, Rejection, WorkerId, WorkerLoad,
};
use hearth_core::{Micros, WorkerEngine};

/// The CH-RLU paper's "online greedy optimal" policy (§6.3): every server's expected time for
/// the function is `(w if it has an idle warm sandbox, else c) × S(L)`, with `S(L) = max(1, L)`
/// the processor-sharing slowdown at the server's last *reported* normalized load `L`; the
/// lowest wins (ties: fewer invocations in flight from here, then the lower index). Knowing
/// every server's warm sandboxes at the instant of the decision is what makes it omniscient and
/// impractical; its loads are as stale as everyone's.
#[derive(Debug, Clone)]
pub struct Greedy {
    loads: Vec<f64>,
    in_flight: Vec<u32>,
}

impl Greedy {
    pub fn new(workers: usize) -> Self {
        Greedy {
            loads: vec![0.0; workers],
            in_flight: vec![0; workers],
        }
    }

    /// Picks a worker among `engines` for `f`.
    pub fn route<'e>(
        &mut self,
        f: &SimFunction,
        engines: impl Iterator<Item = &'e WorkerEngine>,
    ) -> usize {
        let mut best: Option<(f64, u32, usize)> = None;
        for (w, engine) in engines.enumerate() {
            let base = if engine.pool().idle_count(&f.name) > 0 {
                f.warm_us
            } else {
                f.cold_us()
            };
            let cand = (base as f64 * self.loads[w].max(1.0), self.in_flight[w], w);
            let better = match best {
                None => true,
                Some(b) => cand.0 < b.0 || (cand.0 == b.0 && (cand.1, cand.2) < (b.1, b.2)),
            };
            if better {
                best = Some(cand);
            }
        }
        let w = best.map_or(0, |b| b.2);
        self.in_flight[w] += 1;
        w
    }
}

/// The routing policy of a simulation.
#[derive(Debug)]
pub enum Router {
    Balancer {
        balancer: Box<Balancer>,
        /// The balancer's id of each simulated worker.
        ids: Vec<WorkerId>,
        /// The simulated worker of each balancer id.
        index: Vec<usize>,
    },
    Greedy(Greedy),
}

impl Router {
    /// Joins `workers` workers named by `name` and registers the functions as the controller
    /// registers `sim` functions (warm and cold times known up front).
    pub fn new(
        routing: &Routing,
        workers: usize,
        name: impl Fn(u32) -> String,
        workload: &Workload,
    ) -> Result<Self> {
        match routing {
            Routing::Greedy => Ok(Router::Greedy(Greedy::new(workers))),
            Routing::Balancer(kind, params) => {
                let mut balancer = Balancer::new(*kind, params.clone())?;
                let ids: Vec<WorkerId> = (0..workers as u32)
                    .map(|w| balancer.join(0, &name(w)))
                    .collect();
                let mut index = vec![usize::MAX; workers];
                for (w, id) in ids.iter().enumerate() {
                    if let Some(slot) = index.get_mut(id.0 as usize) {
                        *slot = w;
                    }
                }
                for f in &workload.functions {
                    let info = FunctionInfo {
                        priority: f.priority,
                        warm_us: Some(f.warm_us),
                        cold_us: Some(f.cold_us()),
                    };
                    balancer.register(0, f.key, info);
                }
                Ok(Router::Balancer {
                    balancer: Box::new(balancer),
                    ids,
                    index,
                })
            }
        }
    }

    /// Places one invocation; `engines` are the workers' engines in order.
    pub fn route<'e>(
        &mut self,
        now: Micros,
        f: &SimFunction,
        engines: impl Iterator<Item = &'e WorkerEngine>,
    ) -> Result<usize, Rejection> {
        match self {
            Router::Greedy(g) => Ok(g.route(f, engines)),
            Router::Balancer {
                balancer, index, ..
            } => match balancer.route(now, f.key) {
                Decision::Run { worker, .. } => index
                    .get(worker.0 as usize)
                    .copied()
                    .filter(|w| *w != usize::MAX)
                    .ok_or(Rejection::NoWorkers),
                Decision::Reject(r) => Err(r),
            },
        }
    }

    /// A worker's status push.
    pub fn report(&mut self, now: Micros, worker: usize, load: WorkerLoad) {
        match self {
            Router::Greedy(g) => g.loads[worker] = load.load,
            Router::Balancer { balancer, ids, .. } => balancer.report(now, ids[worker], load),
        }
    }

    /// An invocation placed on `worker` ended.
    pub fn finished(&mut self, now: Micros, worker: usize, f: &SimFunction, how: Finished) {
        match self {
            Router::Greedy(g) => g.in_flight[worker] = g.in_flight[worker].saturating_sub(1),
            Router::Balancer { balancer, ids, .. } => {
                balancer.finished(now, ids[worker], f.key, how)
            }
        }
    }

    /// The balancer, when the policy is one of the controller's.
    pub fn balancer(&self) -> Option<&Balancer> {
        match self {
            Router::Balancer { balancer, .. } => Some(balancer),
            Router::Greedy(_) => None,
        }
    }
}
