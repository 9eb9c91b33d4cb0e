//! Who places each invocation: the controller's [`Balancer`] (the very type the controller
//! holds), or the omniscient greedy baseline that only a simulator can run.

use crate::config::Routing;
use crate::error::Result;
use crate::workload::{SimFunction, Workload};
use hearth_core::balance::{
    Balancer, Decision, Finished, FunctionInfo, Rejection, WorkerId, WorkerLoad,
};
use hearth_core::proactive::{Atoll, FunctionSpec, Outcome};
use hearth_core::{Micros, WorkerEngine};

/// The CH-RLU paper's "online greedy optimal" policy (§6.3): every server's expected time for
/// the function is `(w if it has an idle warm sandbox, else c) × S(L)`, with `S(L) = max(1, L)`
/// the processor-sharing slowdown at the server's last *reported* normalized load `L`; the
/// lowest wins, ties going as in the balancer's least-loaded: the lower reported load, then
/// fewer invocations in flight from here, then the lower index. Knowing every server's warm
/// sandboxes at the instant of the decision is what makes it omniscient and impractical; its
/// loads are as stale as everyone's.
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
        let mut best: Option<(f64, f64, u32, usize)> = None;
        for (w, engine) in engines.enumerate() {
            let base = if engine.pool().idle_count(&f.name) > 0 {
                f.warm_us
            } else {
                f.cold_us()
            };
            let load = self.loads[w];
            let cand = (base as f64 * load.max(1.0), load, self.in_flight[w], w);
            let better = match best {
                None => true,
                Some(b) => {
                    cand.0 < b.0
                        || (cand.0 == b.0
                            && (cand.1 < b.1 || (cand.1 == b.1 && (cand.2, cand.3) < (b.2, b.3))))
                }
            };
            if better {
                best = Some(cand);
            }
        }
        let w = best.map_or(0, |b| b.3);
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
    /// Atoll's balancer; worker `i` is Atoll's worker `i`. The simulation ticks it and carries
    /// out its commands ([`Router::atoll_mut`]).
    Atoll(Box<Atoll>),
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
            Routing::Atoll(_) => Err(crate::error::SimError::Config(
                "Atoll routing needs the workers' CPUs and pools: use Router::new_atoll".into(),
            )),
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
                        memory_mb: f.memory_mb,
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

    /// Atoll over `workers` workers of `cpus` CPUs, each lending `pool_mb` of proactive memory
    /// (workers fill groups in index order), with every function registered with its memory,
    /// deadline, set-up (init) and execution (warm) times.
    pub fn new_atoll(
        config: &hearth_core::proactive::AtollConfig,
        workers: usize,
        cpus: u32,
        pool_mb: u64,
        workload: &Workload,
    ) -> Result<Self> {
        let mut atoll = Atoll::new(config.clone())
            .map_err(|e| crate::error::SimError::Config(format!("atoll: {e}")))?;
        for w in 0..workers as u32 {
            atoll.add_worker(w, cpus, pool_mb);
        }
        for f in &workload.functions {
            atoll.register(
                &f.name,
                FunctionSpec {
                    memory_mb: f.memory_mb,
                    deadline_us: f.deadline_us,
                    setup_us: Some(f.init_us),
                    exec_us: Some(f.warm_us),
                },
            );
        }
        Ok(Router::Atoll(Box::new(atoll)))
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
            Router::Atoll(a) => a
                .route(now, &f.name)
                .map(|r| r.worker as usize)
                .ok_or(Rejection::NoWorkers),
        }
    }

    /// A worker's status push.
    pub fn report(&mut self, now: Micros, worker: usize, load: WorkerLoad) {
        match self {
            Router::Greedy(g) => g.loads[worker] = load.load,
            Router::Balancer { balancer, ids, .. } => balancer.report(now, ids[worker], load),
            // Atoll's groups see their workers' queues directly (in-flight counts).
            Router::Atoll(_) => {}
        }
    }

    /// An invocation placed on `worker` ended; `outcome` is what Atoll learns from it (its
    /// queueing delay, its set-up if cold, its execution if it ran to the end).
    pub fn finished(
        &mut self,
        now: Micros,
        worker: usize,
        f: &SimFunction,
        how: Finished,
        outcome: Outcome,
    ) {
        match self {
            Router::Greedy(g) => g.in_flight[worker] = g.in_flight[worker].saturating_sub(1),
            Router::Balancer { balancer, ids, .. } => {
                balancer.finished(now, ids[worker], f.key, how)
            }
            Router::Atoll(a) => a.finished(now, worker as u32, &f.name, outcome),
        }
    }

    /// A worker added during the run (autoscaling) joins the balancer: new work may go there.
    /// `w` is its simulated index, the next one.
    pub fn add_worker(&mut self, now: Micros, w: usize, name: &str) -> Result<()> {
        let Router::Balancer {
            balancer,
            ids,
            index,
        } = self
        else {
            return Err(crate::error::SimError::Config(
                "workers can only be added under the controller's balancing policies".into(),
            ));
        };
        if w != ids.len() {
            return Err(crate::error::SimError::Internal(format!(
                "worker {w} added out of order ({} known)",
                ids.len()
            )));
        }
        let id = balancer.join(now, name);
        ids.push(id);
        let slot = id.0 as usize;
        if index.len() <= slot {
            index.resize(slot + 1, usize::MAX);
        }
        index[slot] = w;
        Ok(())
    }

    /// A worker drains: it leaves the balancer (no new work) and finishes what it has.
    pub fn drain_worker(&mut self, now: Micros, w: usize) {
        if let Router::Balancer { balancer, ids, .. } = self {
            if let Some(id) = ids.get(w) {
                balancer.leave(now, *id);
            }
        }
    }

    /// The active (in the balancer, not draining) workers' last reported loads, by simulated
    /// index: what the autoscaler sees.
    pub fn active_loads(&self) -> Vec<hearth_core::autoscale::Sample> {
        match self {
            Router::Balancer {
                balancer, index, ..
            } => {
                let workers = balancer.workers();
                workers
                    .live()
                    .iter()
                    .filter_map(|id| {
                        let w = *index.get(id.0 as usize)?;
                        (w != usize::MAX).then(|| hearth_core::autoscale::Sample {
                            worker: w as u32,
                            load: workers.load(*id),
                        })
                    })
                    .collect()
            }
            Router::Greedy(_) | Router::Atoll(_) => Vec::new(),
        }
    }

    /// Atoll's state, when it routes.
    pub fn atoll(&self) -> Option<&Atoll> {
        match self {
            Router::Atoll(a) => Some(a),
            _ => None,
        }
    }

    pub fn atoll_mut(&mut self) -> Option<&mut Atoll> {
        match self {
            Router::Atoll(a) => Some(a),
            _ => None,
        }
    }

    /// The balancer, when the policy is one of the controller's.
    pub fn balancer(&self) -> Option<&Balancer> {
        match self {
            Router::Balancer { balancer, .. } => Some(balancer),
            Router::Greedy(_) | Router::Atoll(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SimConfig;
    use hearth_core::{Arrival, Completion, EngineAction};

    /// Three engines; the middle one has an idle sandbox of `f`.
    fn engines(f: &SimFunction) -> Vec<WorkerEngine> {
        let mut e: Vec<WorkerEngine> = (0..3)
            .map(|_| WorkerEngine::new(SimConfig::default().engine()))
            .collect();
        let arrival = Arrival {
            function: &f.name,
            memory_mb: f.memory_mb,
            deadline_us: None,
            drop_late: false,
        };
        let id = e[1].on_invocation(0, arrival);
        let Some(EngineAction::Run(run)) = e[1].poll_action() else {
            panic!("runs at once");
        };
        assert_eq!(run.invocation, id);
        let done = Completion {
            exec_us: Some(f.warm_us),
            init_us: Some(f.init_us),
            reusable: true,
        };
        e[1].on_completed(f.cold_us(), &run, done);
        e
    }

    #[test]
    fn greedy_prefers_the_warm_server_until_its_load_outweighs_the_cold_start() {
        let f = SimFunction::new("f", 100, 300, 64);
        let e = engines(&f);
        let mut g = Greedy::new(3);
        assert_eq!(g.route(&f, e.iter()), 1, "warm beats cold at equal loads");
        // Warm at load 3: 100 × 3 = 300 < 400 cold: still warm.
        g.loads = vec![0.5, 3.0, 0.2];
        assert_eq!(g.route(&f, e.iter()), 1);
        // Warm at load 5: 500 > 400: the cold server with the lower load.
        g.loads = vec![0.5, 5.0, 0.2];
        assert_eq!(g.route(&f, e.iter()), 2);
        // Equal expected times and loads: fewer in flight (worker 2 has one from above).
        g.loads = vec![0.2, 5.0, 0.2];
        assert_eq!(g.route(&f, e.iter()), 0);
        assert_eq!(g.in_flight, [1, 2, 1]);
    }
}
