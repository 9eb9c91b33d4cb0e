//! Prometheus metrics (text exposition format at `GET /metrics`).

use hearth_core::EngineStats;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// How an invocation ended.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Outcome {
    success,
    handler_error,
    init_error,
    timeout,
    out_of_memory,
    crashed,
    rejected,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FnOutcome {
    pub function: String,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FnLabel {
    pub function: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ColdLabel {
    pub function: String,
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabel {
    pub discipline: &'static str,
}

/// Every metric the worker exports.
pub struct Metrics {
    registry: Registry,
    pub invocations: Family<FnOutcome, Counter>,
    pub cold_starts: Family<ColdLabel, Counter>,
    pub warm_starts: Family<FnLabel, Counter>,
    pub overhead: Histogram,
    pub exec: Family<FnLabel, Histogram>,
    pub init: Family<FnLabel, Histogram>,
    pub sandboxes: Family<StateLabel, Gauge>,
    pub memory_mb: Family<StateLabel, Gauge>,
    pub memory_budget_mb: Gauge,
    pub sandboxes_destroyed: Family<StateLabel, Counter>,
    pub queue_wait: Family<QueueLabel, Histogram>,
    pub queue_length: Gauge,
    pub concurrency_limit: Gauge,
    pub running: Gauge,
    pub bypassed: Counter,
    pub load_normalized: Gauge<f64, std::sync::atomic::AtomicU64>,
}

fn latency_buckets() -> impl Iterator<Item = f64> {
    // 10 µs .. ~84 s, doubling.
    prometheus_client::metrics::histogram::exponential_buckets(1e-5, 2.0, 24)
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("hearth");
        let invocations = Family::<FnOutcome, Counter>::default();
        let cold_starts = Family::<ColdLabel, Counter>::default();
        let warm_starts = Family::<FnLabel, Counter>::default();
        let overhead = Histogram::new(latency_buckets());
        let exec = Family::<FnLabel, Histogram>::new_with_constructor(
            (|| Histogram::new(latency_buckets())) as fn() -> Histogram,
        );
        let init = Family::<FnLabel, Histogram>::new_with_constructor(
            (|| Histogram::new(latency_buckets())) as fn() -> Histogram,
        );
        let sandboxes = Family::<StateLabel, Gauge>::default();
        let memory_mb = Family::<StateLabel, Gauge>::default();
        let memory_budget_mb = Gauge::default();
        let sandboxes_destroyed = Family::<StateLabel, Counter>::default();
        let queue_wait = Family::<QueueLabel, Histogram>::new_with_constructor(
            (|| Histogram::new(latency_buckets())) as fn() -> Histogram,
        );
        let queue_length = Gauge::default();
        let concurrency_limit = Gauge::default();
        let running = Gauge::default();
        let bypassed = Counter::default();
        let load_normalized = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "invocations",
            "Invocations by function and outcome",
            invocations.clone(),
        );
        registry.register(
            "cold_starts",
            "Invocations that started a new sandbox, by function and reason",
            cold_starts.clone(),
        );
        registry.register(
            "warm_starts",
            "Invocations served by a warm sandbox, by function",
            warm_starts.clone(),
        );
        registry.register(
            "invocation_overhead_seconds",
            "Control-plane overhead: end-to-end at the worker minus queue, init and exec",
            overhead.clone(),
        );
        registry.register(
            "invocation_exec_seconds",
            "Handler execution time measured in the sandbox",
            exec.clone(),
        );
        registry.register(
            "invocation_init_seconds",
            "Cold-start time: sandbox creation and handler import",
            init.clone(),
        );
        registry.register(
            "pool_sandboxes",
            "Sandboxes by state (warm, running, starting)",
            sandboxes.clone(),
        );
        registry.register(
            "pool_memory_mb",
            "Memory reserved by sandboxes, by state (warm, running)",
            memory_mb.clone(),
        );
        registry.register(
            "pool_memory_budget_mb",
            "Memory budget for sandboxes",
            memory_budget_mb.clone(),
        );
        registry.register(
            "sandboxes_destroyed",
            "Sandboxes destroyed, by reason",
            sandboxes_destroyed.clone(),
        );
        registry.register(
            "queue_wait_seconds",
            "Time invocations waited in the worker queue, by queue discipline",
            queue_wait.clone(),
        );
        registry.register(
            "queue_length",
            "Invocations waiting in the worker queue",
            queue_length.clone(),
        );
        registry.register(
            "concurrency_limit",
            "The regulator's current limit on concurrently running queued invocations",
            concurrency_limit.clone(),
        );
        registry.register(
            "running_invocations",
            "Invocations running now, bypasses included",
            running.clone(),
        );
        registry.register(
            "bypassed",
            "Invocations that skipped the queue as short functions",
            bypassed.clone(),
        );
        registry.register(
            "load_normalized",
            "1-minute load average divided by the worker's CPUs",
            load_normalized.clone(),
        );
        Metrics {
            registry,
            invocations,
            cold_starts,
            warm_starts,
            overhead,
            exec,
            init,
            sandboxes,
            memory_mb,
            memory_budget_mb,
            sandboxes_destroyed,
            queue_wait,
            queue_length,
            concurrency_limit,
            running,
            bypassed,
            load_normalized,
        }
    }
}

impl Metrics {
    pub fn outcome(&self, function: &str, outcome: Outcome) {
        self.invocations
            .get_or_create(&FnOutcome {
                function: function.to_string(),
                outcome,
            })
            .inc();
    }

    /// Text exposition, with pool and queue gauges taken from `engine` at scrape time.
    pub fn encode(&self, engine: &EngineStats) -> String {
        self.queue_length.set(engine.queue_length as i64);
        self.concurrency_limit.set(i64::from(engine.limit));
        self.running
            .set(i64::from(engine.running + engine.running_bypass));
        self.load_normalized.set(engine.normalized_load);
        let stats = &engine.pool;
        let (mut warm, mut running, mut starting) = (0i64, 0i64, 0i64);
        for (_, f) in &stats.functions {
            warm += i64::from(f.warm);
            running += i64::from(f.running);
            starting += i64::from(f.starting);
        }
        for (state, v) in [("warm", warm), ("running", running), ("starting", starting)] {
            self.sandboxes.get_or_create(&StateLabel { state }).set(v);
        }
        self.memory_mb
            .get_or_create(&StateLabel { state: "warm" })
            .set(stats.memory_warm_mb as i64);
        self.memory_mb
            .get_or_create(&StateLabel { state: "running" })
            .set(stats.memory_running_mb as i64);
        self.memory_budget_mb.set(stats.memory_budget_mb as i64);
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "encoding metrics failed");
        }
        out
    }
}
