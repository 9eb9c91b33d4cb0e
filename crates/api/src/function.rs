//! The registered function: what a user asked for, validated.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Limits applied to every spec; generous enough for real functions, tight enough to catch typos.
pub const MAX_MEMORY_MB: u64 = 64 * 1024;
pub const MAX_CPUS: f64 = 64.0;
pub const MAX_TIMEOUT_MS: u64 = 15 * 60 * 1000;

/// A function as registered: the worker, the controller and the simulator all read this.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionSpec {
    pub name: String,
    #[serde(default = "default_runtime")]
    pub runtime: String,
    /// `module.function`; the module is looked up in the function's code directory.
    #[serde(default = "default_handler")]
    pub handler: String,
    #[serde(default = "default_memory_mb")]
    pub memory_mb: u64,
    #[serde(default = "default_cpus")]
    pub cpus: f64,
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    #[serde(default)]
    pub priority: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Warm execution time for the `sim` backend.
    #[serde(default)]
    pub sim_warm_ms: f64,
    /// Cold-start cost (sandbox + init) for the `sim` backend.
    #[serde(default)]
    pub sim_cold_ms: f64,
    /// Bumped on every update; sandboxes of an older version are never reused.
    #[serde(default)]
    pub version: u64,
}

fn default_runtime() -> String {
    "python3".into()
}
fn default_handler() -> String {
    "main.main".into()
}
fn default_memory_mb() -> u64 {
    128
}
fn default_cpus() -> f64 {
    1.0
}
fn default_timeout_ms() -> u64 {
    30_000
}

/// Why a spec was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    #[error("function name must be 1-64 characters of [A-Za-z0-9_-], starting with a letter or digit: {0:?}")]
    BadName(String),
    #[error("unsupported runtime {0:?} (supported: python3)")]
    BadRuntime(String),
    #[error("handler must look like `function` or `module.function` with identifiers: {0:?}")]
    BadHandler(String),
    #[error("memory_mb must be between 16 and {MAX_MEMORY_MB}: {0}")]
    BadMemory(u64),
    #[error("cpus must be between 0.01 and {MAX_CPUS}: {0}")]
    BadCpus(f64),
    #[error("timeout_ms must be between 1 and {MAX_TIMEOUT_MS}: {0}")]
    BadTimeout(u64),
    #[error("sim_warm_ms and sim_cold_ms must be finite and non-negative")]
    BadSimTimes,
    #[error("environment variable names must be identifiers not starting with HEARTH_: {0:?}")]
    BadEnv(String),
}

impl FunctionSpec {
    /// A spec with defaults for everything but the name.
    pub fn new(name: impl Into<String>) -> Self {
        FunctionSpec {
            name: name.into(),
            runtime: default_runtime(),
            handler: default_handler(),
            memory_mb: default_memory_mb(),
            cpus: default_cpus(),
            timeout_ms: default_timeout_ms(),
            priority: 0,
            deadline_ms: None,
            env: BTreeMap::new(),
            sim_warm_ms: 0.0,
            sim_cold_ms: 0.0,
            version: 0,
        }
    }

    /// Checks the spec and normalizes the handler to `module.function` (default module `main`).
    pub fn validate(&mut self) -> Result<(), SpecError> {
        if !valid_key(&self.name) {
            return Err(SpecError::BadName(self.name.clone()));
        }
        if self.runtime != "python3" && self.runtime != "python" {
            return Err(SpecError::BadRuntime(self.runtime.clone()));
        }
        self.runtime = "python3".into();
        if !self.handler.contains('.') {
            self.handler = format!("main.{}", self.handler);
        }
        if !self.handler.split('.').all(is_identifier) {
            return Err(SpecError::BadHandler(self.handler.clone()));
        }
        if !(16..=MAX_MEMORY_MB).contains(&self.memory_mb) {
            return Err(SpecError::BadMemory(self.memory_mb));
        }
        if !(self.cpus.is_finite() && (0.01..=MAX_CPUS).contains(&self.cpus)) {
            return Err(SpecError::BadCpus(self.cpus));
        }
        if !(1..=MAX_TIMEOUT_MS).contains(&self.timeout_ms) {
            return Err(SpecError::BadTimeout(self.timeout_ms));
        }
        let sim_ok = |v: f64| v.is_finite() && v >= 0.0;
        if !(sim_ok(self.sim_warm_ms) && sim_ok(self.sim_cold_ms)) {
            return Err(SpecError::BadSimTimes);
        }
        if let Some(bad) = self
            .env
            .keys()
            .find(|k| !is_identifier(k) || k.starts_with("HEARTH_"))
        {
            return Err(SpecError::BadEnv(bad.clone()));
        }
        Ok(())
    }

    /// The module part of the handler (`main` for `main.main`).
    pub fn handler_module(&self) -> &str {
        self.handler.rsplit_once('.').map_or("main", |(m, _)| m)
    }
}

/// A function key: a name, or `namespace.name` (see [`crate::namespace`]).
fn valid_key(key: &str) -> bool {
    match key.split_once('.') {
        Some((ns, name)) => crate::namespace::valid_namespace(ns) && valid_name(name),
        None => valid_name(key),
    }
}

/// A function's name inside its namespace.
pub fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'_' || *c == b'-')
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handler_is_normalized_to_module_function() {
        let mut s = FunctionSpec::new("f");
        s.handler = "handle".into();
        s.validate().unwrap();
        assert_eq!(s.handler, "main.handle");
        assert_eq!(s.handler_module(), "main");
        s.handler = "pkg.mod.run".into();
        s.validate().unwrap();
        assert_eq!(s.handler_module(), "pkg.mod");
    }

    #[test]
    fn bad_specs_are_refused_with_the_reason() {
        type Mutation = fn(&mut FunctionSpec);
        let cases: Vec<(Mutation, &str)> = vec![
            (|s| s.name = "../etc".into(), "function name"),
            (|s| s.name = String::new(), "function name"),
            (|s| s.memory_mb = 1, "memory_mb"),
            (|s| s.cpus = 0.0, "cpus"),
            (|s| s.cpus = f64::NAN, "cpus"),
            (|s| s.timeout_ms = 0, "timeout_ms"),
            (|s| s.handler = "main.1x".into(), "handler"),
            (|s| s.runtime = "node".into(), "runtime"),
            (|s| s.sim_warm_ms = -1.0, "sim_warm_ms"),
            (
                |s| {
                    s.env.insert("HEARTH_SOCKET".into(), "x".into());
                },
                "environment",
            ),
        ];
        for (mutate, needle) in cases {
            let mut s = FunctionSpec::new("ok");
            mutate(&mut s);
            let err = s.validate().unwrap_err().to_string();
            assert!(err.contains(needle), "{err} should mention {needle}");
        }
    }

    #[test]
    fn defaults_fill_a_minimal_json_spec() {
        let s: FunctionSpec = serde_json::from_str(r#"{"name":"f"}"#).unwrap();
        assert_eq!((s.memory_mb, s.cpus, s.timeout_ms), (128, 1.0, 30_000));
    }
}
