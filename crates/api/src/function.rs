//! The registered function: what a user asked for, validated.

use crate::gpu::{Device, MAX_GPU_MEMORY_MB};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Limits applied to every spec; generous enough for real functions, tight enough to catch typos.
pub const MAX_MEMORY_MB: u64 = 64 * 1024;
pub const MAX_CPUS: f64 = 64.0;
pub const MAX_TIMEOUT_MS: u64 = 15 * 60 * 1000;
/// Smallest sandbox worth starting.
pub const MIN_MEMORY_MB: u64 = 16;
pub const MIN_CPUS: f64 = 0.01;
/// Simulated times: an hour is far beyond any function, and keeps sums and products finite.
pub const MAX_SIM_MS: f64 = 3_600_000.0;
/// Priorities order functions relative to each other; a small range is plenty.
pub const MIN_PRIORITY: i32 = -1000;
pub const MAX_PRIORITY: i32 = 1000;
/// Environment: Lambda's limits (4 KiB of names and values together).
pub const MAX_ENV_VARS: u64 = 64;
pub const MAX_ENV_BYTES: u64 = 4096;
/// `module.function`, dotted: long enough for deep packages.
pub const MAX_HANDLER_LEN: u64 = 256;

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
    /// The part of `sim_cold_ms` spent importing dependencies (issue 32): what a pre-imported
    /// generic sandbox saves. At most `sim_cold_ms`; left out when 0.
    #[serde(default, skip_serializing_if = "is_zero_ms")]
    pub sim_import_ms: f64,
    /// Where the handler runs: `cpu` (default), `gpu` (only on workers with a GPU) or `any`
    /// (a CPU and a GPU variant, chosen by expected speedup). Left out when `cpu`, so specs
    /// without GPUs read and write exactly as before.
    #[serde(default, skip_serializing_if = "Device::is_cpu")]
    pub device: Device,
    /// GPU memory one invocation needs (MiB): required for `gpu` and `any`, 0 for `cpu`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gpu_memory_mb: u64,
    /// Warm execution time on a GPU for the `sim` backend (`any`: the CPU variant's is
    /// `sim_warm_ms`).
    #[serde(default, skip_serializing_if = "is_zero_ms")]
    pub sim_gpu_warm_ms: f64,
    /// Cold-start cost on a GPU (container, driver context, model load) for the `sim` backend.
    #[serde(default, skip_serializing_if = "is_zero_ms")]
    pub sim_gpu_cold_ms: f64,
    /// Attempts after a failed async invocation before it is dead-lettered (Lambda-like).
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// Bumped on every update; sandboxes of an older version are never reused.
    #[serde(default)]
    pub version: u64,
    /// Digest (`sha256:…`) of the runtime image the function was registered with: set by the
    /// worker at registration (a client's value is replaced), so a runtime rebuilt later under
    /// the same name never changes what an existing function runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_digest: Option<String>,
    /// Digest of the dependency layer built from the function's `requirements.txt`: set by the
    /// worker at registration; None when the function has no requirements.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer: Option<String>,
}

/// Retries of a failed async invocation, unless the function says otherwise.
pub const DEFAULT_RETRIES: u32 = 2;
/// The most retries a function may ask for.
pub const MAX_RETRIES: u32 = 10;

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_zero_ms(v: &f64) -> bool {
    *v == 0.0
}

fn default_retries() -> u32 {
    DEFAULT_RETRIES
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

/// A runtime's name: `python3` (the worker's default Python runtime) or a runtime image's
/// name (`python3.11`); which ones exist is the worker's to say.
pub fn valid_runtime_name(s: &str) -> bool {
    (1..=32).contains(&s.len())
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

/// Why a spec was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    #[error("function name must be 1-64 characters of [A-Za-z0-9_-], starting with a letter or digit: {0:?}")]
    BadName(String),
    #[error("runtime must be 1-32 characters of [a-z0-9._-], starting with a letter (e.g. python3, python3.11): {0:?}")]
    BadRuntime(String),
    #[error("handler must look like `function` or `module.function` with identifiers: {0:?}")]
    BadHandler(String),
    /// A number outside its bounds: the field, its bounds (inclusive) and what was sent.
    #[error("{field} must be between {min} and {max}{unit}, got {got}")]
    OutOfRange {
        field: &'static str,
        min: f64,
        max: f64,
        /// What is counted, for counts and sizes (e.g. " variables").
        unit: &'static str,
        got: String,
    },
    #[error("environment variable names must be identifiers not starting with HEARTH_: {0:?}")]
    BadEnv(String),
    /// A GPU setting on a function that runs on CPUs only.
    #[error(
        "{field} applies to device \"gpu\" or \"any\" only: leave it out (or 0) for device \"cpu\""
    )]
    GpuFieldOnCpu { field: &'static str },
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
            sim_import_ms: 0.0,
            device: Device::Cpu,
            gpu_memory_mb: 0,
            sim_gpu_warm_ms: 0.0,
            sim_gpu_cold_ms: 0.0,
            retries: DEFAULT_RETRIES,
            version: 0,
            runtime_digest: None,
            layer: None,
        }
    }

    /// Checks the spec and normalizes the handler to `module.function` (default module `main`).
    pub fn validate(&mut self) -> Result<(), SpecError> {
        if !valid_key(&self.name) {
            return Err(SpecError::BadName(self.name.clone()));
        }
        if !valid_runtime_name(&self.runtime) {
            // Echoed back, so cut short: the body may be megabytes.
            return Err(SpecError::BadRuntime(
                self.runtime.chars().take(32).collect(),
            ));
        }
        if self.runtime == "python" {
            self.runtime = "python3".into();
        }
        check_range(
            "handler",
            0.0,
            MAX_HANDLER_LEN as f64,
            " characters",
            self.handler.len() as f64,
        )?;
        if !self.handler.contains('.') {
            self.handler = format!("main.{}", self.handler);
        }
        if !self.handler.split('.').all(is_identifier) {
            return Err(SpecError::BadHandler(self.handler.clone()));
        }
        let int = |field, min: u64, max: u64, v: u64| {
            check_range(field, min as f64, max as f64, "", v as f64)
        };
        int("memory_mb", MIN_MEMORY_MB, MAX_MEMORY_MB, self.memory_mb)?;
        check_range("cpus", MIN_CPUS, MAX_CPUS, "", self.cpus)?;
        int("timeout_ms", 1, MAX_TIMEOUT_MS, self.timeout_ms)?;
        if let Some(d) = self.deadline_ms {
            int("deadline_ms", 1, MAX_TIMEOUT_MS, d)?;
        }
        int(
            "retries",
            0,
            u64::from(MAX_RETRIES),
            u64::from(self.retries),
        )?;
        check_range("sim_warm_ms", 0.0, MAX_SIM_MS, "", self.sim_warm_ms)?;
        check_range("sim_cold_ms", 0.0, MAX_SIM_MS, "", self.sim_cold_ms)?;
        check_range("sim_import_ms", 0.0, MAX_SIM_MS, "", self.sim_import_ms)?;
        // Part of the cold start: never more than all of it.
        check_range(
            "sim_import_ms",
            0.0,
            self.sim_cold_ms,
            "",
            self.sim_import_ms,
        )?;
        self.validate_gpu()?;
        check_range(
            "priority",
            f64::from(MIN_PRIORITY),
            f64::from(MAX_PRIORITY),
            "",
            f64::from(self.priority),
        )?;
        check_range(
            "env",
            0.0,
            MAX_ENV_VARS as f64,
            " variables",
            self.env.len() as f64,
        )?;
        let env_bytes: usize = self.env.iter().map(|(k, v)| k.len() + v.len()).sum();
        check_range(
            "env",
            0.0,
            MAX_ENV_BYTES as f64,
            " bytes of names and values together",
            env_bytes as f64,
        )?;
        if let Some(bad) = self
            .env
            .keys()
            .find(|k| !is_identifier(k) || k.starts_with("HEARTH_"))
        {
            return Err(SpecError::BadEnv(bad.clone()));
        }
        Ok(())
    }

    /// The GPU fields: set (and in range) exactly when the device may be a GPU.
    fn validate_gpu(&self) -> Result<(), SpecError> {
        if !self.device.uses_gpu() {
            let set = [
                ("gpu_memory_mb", self.gpu_memory_mb != 0),
                ("sim_gpu_warm_ms", self.sim_gpu_warm_ms != 0.0),
                ("sim_gpu_cold_ms", self.sim_gpu_cold_ms != 0.0),
            ];
            return match set.into_iter().find(|(_, set)| *set) {
                Some((field, _)) => Err(SpecError::GpuFieldOnCpu { field }),
                None => Ok(()),
            };
        }
        check_range(
            "gpu_memory_mb",
            1.0,
            MAX_GPU_MEMORY_MB as f64,
            "",
            self.gpu_memory_mb as f64,
        )?;
        check_range("sim_gpu_warm_ms", 0.0, MAX_SIM_MS, "", self.sim_gpu_warm_ms)?;
        check_range("sim_gpu_cold_ms", 0.0, MAX_SIM_MS, "", self.sim_gpu_cold_ms)
    }

    /// The GPU memory (MiB) a worker must have on one device to take this function at all:
    /// `Some` for `gpu` only (`any` falls back to its CPU variant).
    pub fn required_gpu_mb(&self) -> Option<u64> {
        (self.device == Device::Gpu).then_some(self.gpu_memory_mb)
    }

    /// The module part of the handler (`main` for `main.main`).
    pub fn handler_module(&self) -> &str {
        self.handler.rsplit_once('.').map_or("main", |(m, _)| m)
    }
}

/// `Ok` when `v` is finite and within `min..=max`.
fn check_range(
    field: &'static str,
    min: f64,
    max: f64,
    unit: &'static str,
    v: f64,
) -> Result<(), SpecError> {
    if v.is_finite() && (min..=max).contains(&v) {
        return Ok(());
    }
    Err(SpecError::OutOfRange {
        field,
        min,
        max,
        unit,
        got: v.to_string(),
    })
}

impl SpecError {
    /// The field and its inclusive bounds, for a number out of range (the error body's details).
    pub fn range(&self) -> Option<(&'static str, f64, f64)> {
        match self {
            SpecError::OutOfRange {
                field, min, max, ..
            } => Some((field, *min, *max)),
            _ => None,
        }
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
            (|s| s.runtime = "../usr".into(), "runtime"),
            (|s| s.sim_warm_ms = -1.0, "sim_warm_ms"),
            (
                |s| s.sim_cold_ms = 1e308,
                "sim_cold_ms must be between 0 and 3600000",
            ),
            (|s| s.sim_cold_ms = f64::INFINITY, "sim_cold_ms"),
            (|s| s.sim_import_ms = -1.0, "sim_import_ms"),
            (|s| s.sim_import_ms = f64::NAN, "sim_import_ms"),
            (
                |s| s.sim_import_ms = 5.0,
                "sim_import_ms must be between 0 and 0,",
            ),
            (
                |s| s.deadline_ms = Some(u64::MAX),
                "deadline_ms must be between 1 and 900000",
            ),
            (|s| s.deadline_ms = Some(0), "deadline_ms"),
            (
                |s| s.priority = 1001,
                "priority must be between -1000 and 1000",
            ),
            (|s| s.priority = i32::MIN, "priority"),
            (
                |s| s.memory_mb = u64::MAX,
                "memory_mb must be between 16 and 65536",
            ),
            (|s| s.handler = format!("m.{}", "x".repeat(300)), "handler"),
            (
                |s| {
                    for i in 0..65 {
                        s.env.insert(format!("V{i}"), String::new());
                    }
                },
                "env must be between 0 and 64 variables",
            ),
            (
                |s| {
                    s.env.insert("BIG".into(), "x".repeat(4094));
                },
                "env must be between 0 and 4096 bytes",
            ),
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
    fn out_of_range_errors_name_the_field_and_bounds() {
        let mut s = FunctionSpec::new("ok");
        s.sim_warm_ms = 3_600_000.0;
        s.priority = -1000;
        s.deadline_ms = Some(MAX_TIMEOUT_MS);
        s.env.insert("A".into(), "x".repeat(4095));
        s.validate().expect("the bounds themselves are allowed");
        s.sim_warm_ms = 3_600_000.5;
        let e = s.validate().unwrap_err();
        assert_eq!(e.range(), Some(("sim_warm_ms", 0.0, MAX_SIM_MS)));
    }

    #[test]
    fn the_import_is_part_of_the_cold_start() {
        let mut s = FunctionSpec::new("f");
        s.sim_cold_ms = 10.0;
        s.sim_import_ms = 10.0;
        assert!(s.validate().is_ok());
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["sim_import_ms"], 10.0);
        s.sim_import_ms = 10.5;
        let e = s.validate().unwrap_err();
        assert_eq!(e.range(), Some(("sim_import_ms", 0.0, 10.0)));
    }

    fn gpu_spec(device: Device, gpu_memory_mb: u64) -> FunctionSpec {
        FunctionSpec {
            device,
            gpu_memory_mb,
            ..FunctionSpec::new("g")
        }
    }

    #[test]
    fn gpu_functions_need_gpu_memory_within_bounds() {
        for device in [Device::Gpu, Device::Any] {
            let mut s = gpu_spec(device, 16_384);
            s.sim_gpu_warm_ms = 2.5;
            s.sim_gpu_cold_ms = MAX_SIM_MS;
            s.validate()
                .expect("a GPU function with its memory is accepted");
            gpu_spec(device, MAX_GPU_MEMORY_MB).validate().unwrap();
            let e = gpu_spec(device, 0).validate().unwrap_err();
            assert_eq!(e.range(), Some(("gpu_memory_mb", 1.0, 196_608.0)));
            assert!(
                e.to_string()
                    .contains("gpu_memory_mb must be between 1 and 196608, got 0"),
                "{e}"
            );
            let e = gpu_spec(device, MAX_GPU_MEMORY_MB + 1)
                .validate()
                .unwrap_err();
            assert_eq!(e.range(), Some(("gpu_memory_mb", 1.0, 196_608.0)));
            for (field, bad) in [("sim_gpu_warm_ms", -1.0), ("sim_gpu_cold_ms", f64::NAN)] {
                let mut s = gpu_spec(device, 1024);
                if field == "sim_gpu_warm_ms" {
                    s.sim_gpu_warm_ms = bad;
                } else {
                    s.sim_gpu_cold_ms = bad;
                }
                assert_eq!(s.validate().unwrap_err().range().map(|r| r.0), Some(field));
            }
        }
    }

    #[test]
    fn cpu_functions_refuse_gpu_settings_naming_the_field() {
        gpu_spec(Device::Cpu, 0).validate().unwrap();
        let e = gpu_spec(Device::Cpu, 1024).validate().unwrap_err();
        assert_eq!(
            e,
            SpecError::GpuFieldOnCpu {
                field: "gpu_memory_mb"
            }
        );
        assert!(e.to_string().contains(r#"device "cpu""#), "{e}");
        let mut s = FunctionSpec::new("c");
        s.sim_gpu_cold_ms = 5.0;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.starts_with("sim_gpu_cold_ms applies to device"), "{e}");
    }

    #[test]
    fn only_gpu_functions_require_a_gpu_to_run() {
        assert_eq!(gpu_spec(Device::Gpu, 512).required_gpu_mb(), Some(512));
        assert_eq!(gpu_spec(Device::Any, 512).required_gpu_mb(), None);
        assert_eq!(FunctionSpec::new("c").required_gpu_mb(), None);
    }

    #[test]
    fn specs_without_gpus_read_and_write_as_before() {
        // A spec stored before devices existed reads as a CPU function...
        let old = r#"{"name":"f","runtime":"python3","handler":"main.main","memory_mb":128,
            "cpus":1.0,"timeout_ms":30000,"priority":0,"sim_warm_ms":0.0,"sim_cold_ms":0.0,
            "retries":2,"version":3}"#;
        let s: FunctionSpec = serde_json::from_str(old).unwrap();
        assert_eq!((s.device, s.gpu_memory_mb), (Device::Cpu, 0));
        // ...and a CPU function writes none of the new fields.
        let v = serde_json::to_value(&s).unwrap();
        for field in [
            "device",
            "gpu_memory_mb",
            "sim_gpu_warm_ms",
            "sim_gpu_cold_ms",
            "sim_import_ms",
        ] {
            assert!(v.get(field).is_none(), "{field} in {v}");
        }
        let back: FunctionSpec = serde_json::from_value(v).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn gpu_specs_round_trip() {
        let json = r#"{"name":"g","device":"any","gpu_memory_mb":8192,"sim_warm_ms":40,
            "sim_gpu_warm_ms":4,"sim_gpu_cold_ms":900}"#;
        let mut s: FunctionSpec = serde_json::from_str(json).unwrap();
        s.validate().unwrap();
        assert_eq!((s.device, s.gpu_memory_mb), (Device::Any, 8192));
        assert_eq!((s.sim_gpu_warm_ms, s.sim_gpu_cold_ms), (4.0, 900.0));
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["device"], "any");
        let back: FunctionSpec = serde_json::from_value(v).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn an_unknown_device_is_refused_naming_the_accepted_values() {
        let e = serde_json::from_str::<FunctionSpec>(r#"{"name":"f","device":"tpu"}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(r#"one of "cpu", "gpu" or "any", got "tpu""#),
            "{e}"
        );
        // Still no room for fields nobody reads.
        let e = serde_json::from_str::<FunctionSpec>(r#"{"name":"f","gpus":2}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `gpus`"), "{e}");
    }

    #[test]
    fn defaults_fill_a_minimal_json_spec() {
        let s: FunctionSpec = serde_json::from_str(r#"{"name":"f"}"#).unwrap();
        assert_eq!((s.memory_mb, s.cpus, s.timeout_ms), (128, 1.0, 30_000));
    }
}
