//! Prometheus metrics (text exposition format at `GET /metrics`).

use hearth_core::gpu::GpuGauges;
use hearth_core::EngineStats;
use hearth_service::metrics::{doubling_buckets, encode_text, registered};
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
    /// `generic` (a generic sandbox was specialized) or `fresh` (created from nothing).
    pub path: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabel {
    pub discipline: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GpuStartLabel {
    pub gpu: String,
    /// `warm`, `host-warm` (memory prefetched first) or `cold`.
    pub start: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GpuLabel {
    pub gpu: String,
}

/// The label value of a GPU start.
pub fn start_label(start: hearth_core::gpu::Start) -> &'static str {
    match start {
        hearth_core::gpu::Start::Warm => "warm",
        hearth_core::gpu::Start::HostWarm => "host-warm",
        hearth_core::gpu::Start::Cold => "cold",
    }
}

/// Every metric the worker exports.
pub struct Metrics {
    registry: Registry,
    pub invocations: Family<FnOutcome, Counter>,
    pub cold_starts: Family<ColdLabel, Counter>,
    pub warm_starts: Family<FnLabel, Counter>,
    pub deadlines_missed: Family<FnLabel, Counter>,
    pub deadlines_dropped: Family<FnLabel, Counter>,
    pub overhead: Histogram,
    pub exec: Family<FnLabel, Histogram>,
    pub init: Family<FnLabel, Histogram>,
    pub sandboxes: Family<StateLabel, Gauge>,
    pub memory_mb: Family<StateLabel, Gauge>,
    pub memory_budget_mb: Gauge,
    pub sandboxes_destroyed: Family<StateLabel, Counter>,
    pub generic_failures: Counter,
    pub queue_wait: Family<QueueLabel, Histogram>,
    pub queue_length: Gauge,
    pub concurrency_limit: Gauge,
    pub running: Gauge,
    pub bypassed: Counter,
    pub load_normalized: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// CPU time of each invocation's sandbox (`cpu_sched` sfs or alps only).
    pub invocation_cpu: Family<FnLabel, Histogram>,
    /// Invocations boosted for their slice.
    pub cpu_sched_boosts: Counter,
    /// Invocations demoted because they used up their slice.
    pub cpu_sched_expired: Counter,
    /// CPU time used past the slice when the demotion happened.
    pub cpu_slice_overshoot: Histogram,
    /// The mechanism's cost: cgroup control writes and CPU-time reads.
    pub cpu_sched_writes: Counter,
    pub cpu_sched_reads: Counter,
    /// GPU invocations by device and how their sandbox started.
    pub gpu_starts: Family<GpuStartLabel, Counter>,
    /// Per GPU, at scrape time: device parallelism D, invocations running, the last
    /// utilization sample, device memory resident.
    pub gpu_parallelism: Family<GpuLabel, Gauge>,
    pub gpu_running: Family<GpuLabel, Gauge>,
    pub gpu_utilization: Family<GpuLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub gpu_memory_resident_mb: Family<GpuLabel, Gauge>,
    /// GPU invocations waiting in the GPU scheduler's flows.
    pub gpu_queue_length: Gauge,
}

/// Latency histogram: 10 µs .. ~84 s, doubling.
fn latency_histogram() -> Histogram {
    Histogram::new(doubling_buckets(1e-5))
}

/// One latency histogram per label set.
fn latency_histograms<L>() -> Family<L, Histogram>
where
    L: Clone + std::hash::Hash + Eq,
{
    Family::new_with_constructor(latency_histogram as fn() -> Histogram)
}

impl Default for Metrics {
    fn default() -> Self {
        let mut r = Registry::with_prefix("hearth");
        Metrics {
            invocations: registered(
                &mut r,
                "invocations",
                "Invocations by function and outcome",
                Family::default(),
            ),
            cold_starts: registered(
                &mut r,
                "cold_starts",
                "Invocations that started a new sandbox, by function and reason",
                Family::default(),
            ),
            warm_starts: registered(
                &mut r,
                "warm_starts",
                "Invocations served by a warm sandbox, by function",
                Family::default(),
            ),
            deadlines_missed: registered(
                &mut r,
                "deadlines_missed",
                "Successful invocations that ended after their deadline, by function",
                Family::default(),
            ),
            deadlines_dropped: registered(
                &mut r,
                "deadlines_dropped",
                "Drop-late invocations refused because their deadline passed before they started, \
                 by function",
                Family::default(),
            ),
            overhead: registered(
                &mut r,
                "invocation_overhead_seconds",
                "Control-plane overhead: end-to-end at the worker minus queue, init and exec",
                latency_histogram(),
            ),
            exec: registered(
                &mut r,
                "invocation_exec_seconds",
                "Handler execution time measured in the sandbox",
                latency_histograms(),
            ),
            init: registered(
                &mut r,
                "invocation_init_seconds",
                "Cold-start time: sandbox creation and handler import",
                latency_histograms(),
            ),
            sandboxes: registered(
                &mut r,
                "pool_sandboxes",
                "Sandboxes by state (warm, running, starting)",
                Family::default(),
            ),
            memory_mb: registered(
                &mut r,
                "pool_memory_mb",
                "Memory reserved by sandboxes, by state (warm, running)",
                Family::default(),
            ),
            memory_budget_mb: registered(
                &mut r,
                "pool_memory_budget_mb",
                "Memory budget for sandboxes",
                Gauge::default(),
            ),
            sandboxes_destroyed: registered(
                &mut r,
                "sandboxes_destroyed",
                "Sandboxes destroyed, by reason",
                Family::default(),
            ),
            generic_failures: registered(
                &mut r,
                "generic_sandbox_failures",
                "Generic sandboxes that failed to start",
                Counter::default(),
            ),
            queue_wait: registered(
                &mut r,
                "queue_wait_seconds",
                "Time invocations waited in the worker queue, by queue discipline",
                latency_histograms(),
            ),
            queue_length: registered(
                &mut r,
                "queue_length",
                "Invocations waiting in the worker queue",
                Gauge::default(),
            ),
            concurrency_limit: registered(
                &mut r,
                "concurrency_limit",
                "The regulator's current limit on concurrently running queued invocations",
                Gauge::default(),
            ),
            running: registered(
                &mut r,
                "running_invocations",
                "Invocations running now, bypasses included",
                Gauge::default(),
            ),
            bypassed: registered(
                &mut r,
                "bypassed",
                "Invocations that skipped the queue as short functions",
                Counter::default(),
            ),
            load_normalized: registered(
                &mut r,
                "load_normalized",
                "1-minute load average divided by the worker's CPUs",
                Gauge::default(),
            ),
            invocation_cpu: registered(
                &mut r,
                "invocation_cpu_seconds",
                "CPU time of the invocation's sandbox (cpuacct.usage delta; cpu_sched sfs or alps)",
                latency_histograms(),
            ),
            cpu_sched_boosts: registered(
                &mut r,
                "cpu_sched_boosts",
                "Invocations boosted for their CPU slice",
                Counter::default(),
            ),
            cpu_sched_expired: registered(
                &mut r,
                "cpu_sched_slices_expired",
                "Invocations demoted after using up their CPU slice",
                Counter::default(),
            ),
            cpu_slice_overshoot: registered(
                &mut r,
                "cpu_slice_overshoot_seconds",
                "CPU time a sandbox had used past its slice when it was demoted",
                latency_histogram(),
            ),
            cpu_sched_writes: registered(
                &mut r,
                "cpu_sched_cgroup_writes",
                "cgroup writes (cpu.idle, cpu.shares) of the CPU scheduling",
                Counter::default(),
            ),
            cpu_sched_reads: registered(
                &mut r,
                "cpu_sched_usage_reads",
                "Reads of sandboxes' cpuacct.usage by the CPU scheduling",
                Counter::default(),
            ),
            gpu_starts: registered(
                &mut r,
                "gpu_invocations",
                "GPU invocations by device and start (warm, host-warm: memory prefetched first, cold)",
                Family::default(),
            ),
            gpu_parallelism: registered(
                &mut r,
                "gpu_parallelism",
                "Device parallelism D of each GPU (MQFQ-Sticky's tokens)",
                Family::default(),
            ),
            gpu_running: registered(
                &mut r,
                "gpu_running",
                "Invocations running on each GPU",
                Family::default(),
            ),
            gpu_utilization: registered(
                &mut r,
                "gpu_utilization",
                "Last utilization sample of each GPU (0..1)",
                Family::default(),
            ),
            gpu_memory_resident_mb: registered(
                &mut r,
                "gpu_memory_resident_mb",
                "Device memory held on each GPU by its sandboxes, MiB",
                Family::default(),
            ),
            gpu_queue_length: registered(
                &mut r,
                "gpu_queue_length",
                "GPU invocations queued in the GPU scheduler",
                Gauge::default(),
            ),
            registry: r,
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

    /// Text exposition, with pool and queue gauges taken from `engine` (and the GPU gauges from
    /// `gpu`) at scrape time.
    pub fn encode(&self, engine: &EngineStats, gpu: Option<&GpuGauges>) -> String {
        if let Some(g) = gpu {
            self.gpu_queue_length.set(g.queued as i64);
            for d in &g.gpus {
                let label = GpuLabel {
                    gpu: d.index.to_string(),
                };
                self.gpu_parallelism
                    .get_or_create(&label)
                    .set(i64::from(d.d));
                self.gpu_running
                    .get_or_create(&label)
                    .set(i64::from(d.running));
                self.gpu_utilization
                    .get_or_create(&label)
                    .set(d.measured_util.unwrap_or(0.0));
                self.gpu_memory_resident_mb
                    .get_or_create(&label)
                    .set(d.memory_resident_mb as i64);
            }
        }
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
        let generic = i64::from(stats.generic.ready);
        for (state, v) in [
            ("warm", warm),
            ("running", running),
            ("starting", starting),
            ("generic", generic),
        ] {
            self.sandboxes.get_or_create(&StateLabel { state }).set(v);
        }
        self.memory_mb
            .get_or_create(&StateLabel { state: "warm" })
            .set(stats.memory_warm_mb as i64);
        self.memory_mb
            .get_or_create(&StateLabel { state: "running" })
            .set(stats.memory_running_mb as i64);
        self.memory_mb
            .get_or_create(&StateLabel { state: "generic" })
            .set(stats.memory_generic_mb as i64);
        self.memory_budget_mb.set(stats.memory_budget_mb as i64);
        encode_text(&self.registry)
    }
}
