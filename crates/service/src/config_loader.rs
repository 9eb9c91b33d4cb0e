//! The configuration loader both services use (the worker's and the controller's configs): the
//! defaults, overridden by a TOML file, overridden by `HEARTH_*` environment variables.

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: {source}")]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

/// Which `HEARTH_*` variables a configuration reads.
#[derive(Debug, Clone, Copy)]
pub struct EnvKeys {
    /// Top-level keys of the configuration, the only `HEARTH_*` variables read as configuration
    /// (`HEARTH_<KEY>`, nested ones as `HEARTH_<KEY>__<FIELD>`).
    pub keys: &'static [&'static str],
    /// Other `HEARTH_*` variables this program knows (lower case, without the prefix); any other
    /// one is warned about. `None`: no warnings, for a program whose environment also carries
    /// another service's settings.
    pub warn_unknown_except: Option<&'static [&'static str]>,
}

impl EnvKeys {
    /// Whether `key` (an environment variable without `HEARTH_`) is one of `keys` or nested in one.
    pub fn is_config_key(&self, key: &str) -> bool {
        let key = key.to_ascii_lowercase();
        self.keys.iter().any(|k| {
            key == *k
                || key
                    .strip_prefix(k)
                    .is_some_and(|rest| rest.starts_with("__"))
        })
    }
}

/// Defaults ← TOML file (if any) ← `HEARTH_*` environment (nested keys split on `__`), then
/// `check`ed.
pub fn load<T>(
    file: Option<&Path>,
    env: EnvKeys,
    check: impl FnOnce(&T) -> Result<(), ConfigError>,
) -> Result<T, ConfigError>
where
    T: Default + Serialize + DeserializeOwned,
{
    let mut fig = Figment::from(Serialized::defaults(T::default()));
    if let Some(path) = file {
        if !path.exists() {
            return Err(ConfigError::File {
                path: path.into(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "not found"),
            });
        }
        fig = fig.merge(Toml::file(path));
    }
    let fig = fig.merge(
        Env::prefixed("HEARTH_")
            .filter(move |k| env.is_config_key(k.as_str()))
            .split("__"),
    );
    if let Some(known) = env.warn_unknown_except {
        for (name, _) in std::env::vars() {
            if let Some(key) = name.strip_prefix("HEARTH_") {
                let key = key.to_ascii_lowercase();
                if !env.is_config_key(&key) && !known.contains(&key.as_str()) {
                    tracing::warn!(variable = %name, "ignoring unknown HEARTH_ variable");
                }
            }
        }
    }
    let config: T = fig
        .extract()
        .map_err(|e| ConfigError::Invalid(e.to_string()))?;
    check(&config)?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_whole_or_nested_under_a_double_underscore() {
        let env = EnvKeys {
            keys: &["listen", "runc"],
            warn_unknown_except: None,
        };
        assert!(env.is_config_key("LISTEN"));
        assert!(env.is_config_key("runc__uid"));
        assert!(!env.is_config_key("runc_uid"));
        assert!(!env.is_config_key("listening"));
        assert!(!env.is_config_key("url"));
    }

    #[test]
    fn a_missing_file_is_named() {
        let env = EnvKeys {
            keys: &[],
            warn_unknown_except: None,
        };
        let err = load::<std::collections::BTreeMap<String, u32>>(
            Some(Path::new("/nonexistent/hearth.toml")),
            env,
            |_| Ok(()),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "config file /nonexistent/hearth.toml: not found"
        );
    }
}

/// Serde for a switch that may come from the environment as `1`/`0` as well as `true`/`false`
/// (`HEARTH_STORE_INSECURE=1`).
pub fn flag<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Flag {
        Bool(bool),
        Num(u64),
        Text(String),
    }
    match Flag::deserialize(d)? {
        Flag::Bool(b) => Ok(b),
        Flag::Num(0) => Ok(false),
        Flag::Num(1) => Ok(true),
        Flag::Text(t) if matches!(t.as_str(), "1" | "true") => Ok(true),
        Flag::Text(t) if matches!(t.as_str(), "0" | "false") => Ok(false),
        _ => Err(serde::de::Error::custom("expected true, false, 1 or 0")),
    }
}

#[cfg(test)]
mod flag_tests {
    #[derive(serde::Deserialize)]
    struct S {
        #[serde(deserialize_with = "super::flag")]
        on: bool,
    }

    #[test]
    fn flags_take_booleans_and_ones_and_zeros() {
        for (text, want) in [("true", true), ("false", false), ("1", true), ("0", false)] {
            let s: S = serde_json::from_str(&format!("{{\"on\":{text}}}")).unwrap();
            assert_eq!(s.on, want, "{text}");
            let s: S = serde_json::from_str(&format!("{{\"on\":\"{text}\"}}")).unwrap();
            assert_eq!(s.on, want, "{text:?}");
        }
        for bad in ["2", "\"yes\"", "null"] {
            assert!(
                serde_json::from_str::<S>(&format!("{{\"on\":{bad}}}")).is_err(),
                "{bad}"
            );
        }
    }
}
