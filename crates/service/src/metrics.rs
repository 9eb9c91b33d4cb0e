//! Metrics helpers both services use to build and expose their Prometheus registries.

use prometheus_client::registry::Metric;
use prometheus_client::registry::Registry;

/// Registers `metric` under `name` and hands it back, so that a metrics struct is built and
/// registered in one expression (the worker's and the controller's).
pub fn registered<M: Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// Histogram buckets from `first` seconds, doubling, 24 of them.
pub fn doubling_buckets(first: f64) -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(first, 2.0, 24)
}

/// The text exposition of `registry` (`GET /metrics`).
pub fn encode_text(registry: &Registry) -> String {
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, registry) {
        tracing::warn!(error = %e, "encoding metrics failed");
    }
    out
}
