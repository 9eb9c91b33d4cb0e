//! Prometheus metrics of the controller (`GET /metrics`).

use hearth_service::metrics::{doubling_buckets, encode_text, registered};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PlacementLabel {
    pub how: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerLabel {
    pub worker: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabel {
    pub event: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProactiveLabel {
    pub op: &'static str,
    pub result: &'static str,
}

/// Every metric the controller exports.
pub struct Metrics {
    registry: Registry,
    /// Invocations by how they ended at the controller.
    pub invocations: Family<OutcomeLabel, Counter>,
    /// Invocations by how the policy placed them.
    pub placements: Family<PlacementLabel, Counter>,
    /// Invocations forwarded, by worker.
    pub forwarded: Family<WorkerLabel, Counter>,
    /// Routing decision time (lock + policy).
    pub route: Histogram,
    /// The controller's own share of a successful invocation.
    pub overhead: Histogram,
    /// Successful invocations that ended after their deadline, as this controller judges them.
    pub deadlines_missed: Counter,
    /// Membership changes.
    pub membership: Family<EventLabel, Counter>,
    /// Reported load per live worker, set at scrape time.
    pub worker_load: Family<WorkerLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub workers_up: Gauge,
    /// Atoll's commands sent to workers, by operation and result (ok, refused, failed).
    pub proactive: Family<ProactiveLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut r = Registry::with_prefix("hearth_controller");
        Metrics {
            invocations: registered(
                &mut r,
                "invocations",
                "Invocations by outcome (ok, error answered by a worker, worker_failed, worker_timeout, rejected, no_workers)",
                Family::default(),
            ),
            placements: registered(
                &mut r,
                "placements",
                "Routing decisions by placement (home, forwarded, least_loaded, overflow, direct)",
                Family::default(),
            ),
            forwarded: registered(
                &mut r,
                "forwarded",
                "Invocations forwarded, by worker",
                Family::default(),
            ),
            // 1 µs .. ~8 s.
            route: registered(
                &mut r,
                "route_seconds",
                "Time to take a routing decision",
                Histogram::new(doubling_buckets(1e-6)),
            ),
            overhead: registered(
                &mut r,
                "overhead_seconds",
                "The controller's share of an invocation: its end-to-end time minus the worker's",
                Histogram::new(doubling_buckets(1e-5)),
            ),
            deadlines_missed: registered(
                &mut r,
                "deadlines_missed",
                "Successful invocations that ended after their deadline (counted from here)",
                Counter::default(),
            ),
            membership: registered(
                &mut r,
                "membership_events",
                "Workers joining and leaving (join, leave, expired, failed)",
                Family::default(),
            ),
            worker_load: registered(
                &mut r,
                "worker_load",
                "Normalized load each live worker last reported",
                Family::default(),
            ),
            workers_up: registered(&mut r, "workers_up", "Live workers", Gauge::default()),
            proactive: registered(
                &mut r,
                "proactive_commands",
                "Atoll's proactive-sandbox commands sent to workers, by op (create, unmark, soft-evict, evict) and result (ok, refused by the worker, failed to send)",
                Family::default(),
            ),
            registry: r,
        }
    }
}

impl Metrics {
    pub fn outcome(&self, outcome: &'static str) {
        self.invocations
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    pub fn event(&self, event: &'static str) {
        self.membership.get_or_create(&EventLabel { event }).inc();
    }

    /// Text exposition; `loads` are the live workers' reported loads.
    pub fn encode(&self, loads: &[(String, f64)]) -> String {
        self.worker_load.clear();
        for (worker, load) in loads {
            self.worker_load
                .get_or_create(&WorkerLabel {
                    worker: worker.clone(),
                })
                .set(*load);
        }
        self.workers_up.set(loads.len() as i64);
        encode_text(&self.registry)
    }
}
