//! Hearth's sans-I/O core (DESIGN.md §1).
//!
//! Every decision lives here as a plain, synchronous, deterministic state machine that is handed
//! the current time and events and returns actions. Nothing in this crate reads a clock, sleeps,
//! spawns, locks or does I/O, so the real worker and the simulator drive the very same code.
//!
//! # Driving the engine
//!
//! A driver owns a [`WorkerEngine`] and its clock. It hands every event in with the time, then
//! drains [`WorkerEngine::poll_action`] until it is empty and carries each action out (the
//! engine's one exit for decisions), and arms one timer for [`WorkerEngine::next_timeout`],
//! calling [`WorkerEngine::on_timeout`] when it fires. An arriving invocation gets an
//! [`InvocationId`]; its [`EngineAction::Run`] or [`EngineAction::Reject`] comes out of
//! `poll_action` (first among the actions of that call), or later if it was queued. Every id
//! gets exactly one of the two, unless the driver cancels it while queued. A [`Run`] is the
//! permission to use a sandbox: the driver hands it back with the invocation's end
//! ([`WorkerEngine::on_completed`], [`WorkerEngine::on_start_failed`] or
//! [`WorkerEngine::on_abandoned`]).
//!
//! A whole driver over virtual time (the simulator is this loop with a performance model; the
//! worker is it with real sandboxes, a clock and async waiters):
//!
//! ```
//! use hearth_core::bypass::BypassConfig;
//! use hearth_core::{
//!     Arrival, Completion, EngineAction, EngineConfig, GenericConfig, KeepAliveConfig,
//!     LoadSource, Micros, PoolConfig, QueueDiscipline, RegulatorConfig, Run, WorkerEngine,
//! };
//! use std::collections::BTreeMap;
//!
//! let mut engine = WorkerEngine::new(EngineConfig {
//!     pool: PoolConfig {
//!         memory_budget_mb: 1024,
//!         free_buffer_mb: 0,
//!         keepalive: KeepAliveConfig::default(),
//!         generic: GenericConfig::OFF,
//!         proactive_mb: 0,
//!     },
//!     queue: QueueDiscipline::Fcfs,
//!     max_queue: 100,
//!     regulator: RegulatorConfig::Fixed(2),
//!     bypass: BypassConfig::default(),
//!     cpus: 2,
//!     load_source: LoadSource::External,
//!     warm_wait: false,
//! });
//! // Five invocations of two functions, 1 ms apart; each runs 10 ms (plus 50 ms if cold).
//! let arrivals: Vec<(Micros, &str)> =
//!     vec![(0, "f"), (1_000, "g"), (2_000, "f"), (3_000, "f"), (4_000, "g")];
//! let mut ends: BTreeMap<Micros, Vec<Run>> = BTreeMap::new(); // the driver's own timers
//! let (mut ran, mut rejected, mut now) = (0, 0, 0);
//! let mut next_arrival = arrivals.iter().peekable();
//! loop {
//!     // The earliest of: the next arrival, the next run's end, the engine's own timer.
//!     let arrival_at = next_arrival.peek().map(|(t, _)| *t);
//!     let end_at = ends.keys().next().copied();
//!     let timer_at = engine.next_timeout();
//!     let Some(t) = [arrival_at, end_at, timer_at].into_iter().flatten().min() else {
//!         break; // nothing left to happen
//!     };
//!     now = t;
//!     // Events in, each with the time.
//!     if arrival_at == Some(now) {
//!         let (_, function) = next_arrival.next().unwrap();
//!         let arrival = Arrival { function, memory_mb: 128, deadline_us: None, drop_late: false };
//!         let _id = engine.on_invocation(now, arrival); // its fate comes out of poll_action
//!     } else if end_at == Some(now) {
//!         for run in ends.remove(&now).unwrap() {
//!             let done = Completion {
//!                 exec_us: Some(10_000),
//!                 init_us: run.cold.map(|_| 50_000),
//!                 reusable: true,
//!             };
//!             engine.on_completed(now, &run, done);
//!         }
//!     } else {
//!         engine.on_timeout(now);
//!     }
//!     // Actions out, until there are none.
//!     while let Some(action) = engine.poll_action() {
//!         match action {
//!             EngineAction::Run(run) => {
//!                 ran += 1;
//!                 let took = 10_000 + if run.cold.is_some() { 50_000 } else { 0 };
//!                 ends.entry(now + took).or_default().push(run);
//!             }
//!             EngineAction::Reject { .. } => rejected += 1,
//!             EngineAction::Destroy { .. } => {} // stop and remove the sandbox
//!             EngineAction::Prewarm { sandbox, .. } => {
//!                 // start it, then report engine.on_sandbox_ready or on_prewarm_failed
//!                 engine.on_sandbox_ready(now, sandbox, Some(50_000));
//!             }
//!             EngineAction::CreateGeneric { sandbox, .. } => {
//!                 // make a generic sandbox, then report on_generic_ready or on_generic_failed
//!                 engine.on_generic_ready(now, sandbox);
//!             }
//!         }
//!     }
//!     if ran + rejected == arrivals.len() && ends.is_empty() {
//!         break; // the keep-alive timers would run on; a real worker keeps serving
//!     }
//! }
//! assert_eq!((ran, rejected), (5, 0));
//! assert_eq!(engine.stats().queue_length, 0);
//! // f's second sandbox started while its first was busy: three warm sandboxes stay.
//! assert_eq!(engine.pool().stats().memory_warm_mb, 3 * 128);
//! # let _ = now;
//! ```

pub mod autoscale;
pub mod balance;
pub mod bypass;
pub mod characteristics;
pub mod cpu_sched;
pub mod engine;
pub mod gpu;
pub mod load;
pub mod policy;
pub mod pool;
pub mod proactive;
pub mod provision;
pub mod regulator;
pub mod time;

pub use engine::{
    Arrival, Completion, EngineAction, EngineConfig, EngineStats, InvocationId, LoadSource, Reject,
    Run, WorkerEngine,
};
pub use policy::keepalive::{KeepAliveConfig, KeepAliveKind, KeepAlivePolicy};
pub use policy::queue::QueueDiscipline;
pub use pool::{
    Acquire, ColdReason, DestroyReason, GenericConfig, GenericKey, GenericStats, PoolAction,
    PoolConfig, PoolConfigError, PoolStats, ProactiveError, ProactiveEvicted, SandboxId,
    SandboxPool,
};
pub use regulator::{AimdConfig, RegulatorConfig};
pub use time::Micros;
