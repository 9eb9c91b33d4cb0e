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

/// A peer's URL (setting `key`) must look like `http://HOST:PORT`.
pub fn http_url(key: &str, url: &str) -> Result<(), ConfigError> {
    if !url.starts_with("http://") || url.len() <= "http://".len() {
        return Err(ConfigError::Invalid(format!(
            "{key} must look like http://HOST:PORT, got {url:?}"
        )));
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_are_refused_with_the_setting_named() {
        assert!(listen("127.0.0.1:0").is_ok());
        let err = listen("nowhere").unwrap_err().to_string();
        assert_eq!(err, "listen must be IP:PORT, got \"nowhere\"");
        assert!(http_url("controller", "http://h:1").is_ok());
        for bad in ["http://", "h:1", "https://h:1"] {
            let err = http_url("controller", bad).unwrap_err().to_string();
            assert!(
                err.starts_with("controller must look like http://HOST:PORT"),
                "{err}"
            );
        }
        assert!(status_interval_ms(10).is_ok() && status_interval_ms(60_000).is_ok());
        for bad in [9, 60_001] {
            let err = status_interval_ms(bad).unwrap_err().to_string();
            assert!(err.contains("between 10 and 60000"), "{err}");
        }
    }
}
