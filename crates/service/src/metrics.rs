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

/// The lines of an OpenMetrics exposition a tenant may see: the metadata, and the samples of
/// functions in namespace `ns` (labelled `function="<key>"`); samples without a function label
/// describe the whole platform and are the operator's.
pub fn scope_to_namespace(text: &str, ns: &str) -> String {
    let mut out = String::with_capacity(text.len() / 4);
    for line in text.lines() {
        let keep = line.starts_with('#')
            || line
                .split_once("function=\"")
                .and_then(|(_, rest)| rest.split_once('"'))
                .is_some_and(|(key, _)| hearth_api::namespace::namespace_of(key) == ns);
        if keep {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod scope_tests {
    #[test]
    fn a_namespace_sees_only_its_functions_samples() {
        let text = "# TYPE x counter\nx_total{function=\"hello\"} 1\nx_total{function=\"a.f\",k=\"v\"} 2\nup 1\n# EOF\n";
        let a = super::scope_to_namespace(text, "a");
        assert_eq!(
            a,
            "# TYPE x counter\nx_total{function=\"a.f\",k=\"v\"} 2\n# EOF\n"
        );
        let d = super::scope_to_namespace(text, "default");
        assert!(d.contains("function=\"hello\"") && !d.contains("a.f") && !d.contains("up 1"));
    }
}
