//! Checks of the settings that the worker's and the controller's configs both have, so that both
//! refuse the same values with the same messages.

use crate::config_loader::ConfigError;

/// `listen` must be `IP:PORT`.
pub fn listen(listen: &str) -> Result<(), ConfigError> {
    if listen.parse::<std::net::SocketAddr>().is_err() {
        return Err(ConfigError::Invalid(format!(
            "listen must be IP:PORT, got {listen:?}"
        )));
    }
    Ok(())
}

/// A peer's URL (setting `key`) must look like `http://HOST:PORT` or `https://HOST:PORT`.
pub fn http_url(key: &str, url: &str) -> Result<(), ConfigError> {
    let host = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    if !host.is_some_and(|h| !h.is_empty()) {
        return Err(ConfigError::Invalid(format!(
            "{key} must look like http://HOST:PORT or https://HOST:PORT, got {url:?}"
        )));
    }
    Ok(())
}

/// `tls_cert` and `tls_key` come together: one without the other is a mistake, not plain HTTP.
/// Their files are read at start ([`crate::serving::load_tls`]).
pub fn tls_pair(
    cert: Option<&std::path::Path>,
    key: Option<&std::path::Path>,
) -> Result<(), ConfigError> {
    let empty = |p: Option<&std::path::Path>| p.is_some_and(|p| p.as_os_str().is_empty());
    if empty(cert) || empty(key) {
        return Err(ConfigError::Invalid(
            "tls_cert and tls_key must be paths to PEM files, not empty".into(),
        ));
    }
    match (cert, key) {
        (Some(_), None) => Err(ConfigError::Invalid(
            "tls_cert is set but tls_key is not: TLS needs both (or neither, for plain HTTP)"
                .into(),
        )),
        (None, Some(_)) => Err(ConfigError::Invalid(
            "tls_key is set but tls_cert is not: TLS needs both (or neither, for plain HTTP)"
                .into(),
        )),
        _ => Ok(()),
    }
}

/// Status reports between workers and the controller are 10 ms to 1 min apart.
pub fn status_interval_ms(ms: u64) -> Result<(), ConfigError> {
    if !(10..=60_000).contains(&ms) {
        return Err(ConfigError::Invalid(format!(
            "status_interval_ms must be between 10 and 60000, got {ms}"
        )));
    }
    Ok(())
}

/// A `store` setting, its `store_*` access settings and its lease: a known store URL, TLS
/// and user settings that fit it, no plain etcd on the network without `store_insecure`, a
/// TTL of 1 s to 10 minutes.
pub fn store(
    url: &str,
    lease_ttl_ms: u64,
    access: &crate::store::StoreAccess,
) -> Result<(), ConfigError> {
    let parsed = crate::store::StoreUrl::parse(url)
        .map_err(|e| ConfigError::Invalid(format!("store: {e}")))?;
    access
        .check(&parsed)
        .map_err(|e| ConfigError::Invalid(format!("store: {e}")))?;
    if !(1_000..=600_000).contains(&lease_ttl_ms) {
        return Err(ConfigError::Invalid(format!(
            "lease_ttl_ms must be between 1000 and 600000, got {lease_ttl_ms}"
        )));
    }
    Ok(())
}

/// The first back-off of async retries: 1 ms to 10 minutes.
pub fn async_retry_backoff_ms(ms: u64) -> Result<(), ConfigError> {
    if !(1..=600_000).contains(&ms) {
        return Err(ConfigError::Invalid(format!(
            "async_retry_backoff_ms must be between 1 and 600000, got {ms}"
        )));
    }
    Ok(())
}

/// `runtime_threads`: 0 (automatic) to 1024.
pub fn runtime_threads(n: u32) -> Result<(), ConfigError> {
    if n > 1024 {
        return Err(ConfigError::Invalid(format!(
            "runtime_threads must be between 0 (half the CPUs) and 1024, got {n}"
        )));
    }
    Ok(())
}

/// Threads of a server's async runtime: the `runtime_threads` setting, else half the host's
/// CPUs and at least one. A warm request wakes the client, the server and (on a worker) a
/// sandbox in turn; on a small machine a second runtime thread mostly adds wake-ups, because a
/// thread that queues a task wakes an idle one to steal it, which finds nothing
/// (bench/RESULTS.md, "One runtime thread").
pub fn effective_runtime_threads(setting: u32) -> usize {
    match setting {
        0 => (crate::serving::available_cpus() / 2).max(1),
        n => n as usize,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_are_refused_with_the_setting_named() {
        assert!(listen("127.0.0.1:0").is_ok());
        let err = listen("nowhere").unwrap_err().to_string();
        assert_eq!(err, "listen must be IP:PORT, got \"nowhere\"");
        assert!(http_url("controller", "http://h:1").is_ok());
        assert!(http_url("controller", "https://h:1").is_ok());
        for bad in ["http://", "https://", "h:1", "ftp://h:1", "httpss://h:1"] {
            let err = http_url("controller", bad).unwrap_err().to_string();
            assert!(
                err.starts_with("controller must look like http://HOST:PORT or https://"),
                "{err}"
            );
        }
        let p = |s: &'static str| Some(std::path::Path::new(s));
        assert!(tls_pair(None, None).is_ok() && tls_pair(p("c"), p("k")).is_ok());
        let err = tls_pair(p("c"), None).unwrap_err().to_string();
        assert!(
            err.starts_with("tls_cert is set but tls_key is not"),
            "{err}"
        );
        let err = tls_pair(None, p("k")).unwrap_err().to_string();
        assert!(
            err.starts_with("tls_key is set but tls_cert is not"),
            "{err}"
        );
        assert!(tls_pair(p(""), p("k")).is_err());
        assert!(status_interval_ms(10).is_ok() && status_interval_ms(60_000).is_ok());
        for bad in [9, 60_001] {
            let err = status_interval_ms(bad).unwrap_err().to_string();
            assert!(err.contains("between 10 and 60000"), "{err}");
        }
        assert!(runtime_threads(0).is_ok() && runtime_threads(1024).is_ok());
        let err = runtime_threads(1025).unwrap_err().to_string();
        assert!(
            err.starts_with("runtime_threads must be between 0"),
            "{err}"
        );
    }

    #[test]
    fn runtime_threads_default_to_half_the_cpus_and_at_least_one() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(effective_runtime_threads(0), (cpus / 2).max(1));
        assert_eq!(effective_runtime_threads(3), 3);
    }
}
