//! Finding the worker's GPUs (`[gpu]` in the config): `auto` asks NVML, through `nvml-wrapper`,
//! which loads `libnvidia-ml` at run time, so a machine without NVIDIA drivers simply has no
//! GPUs; `none` uses none even where there are some; `sim` declares simulated devices, so that
//! GPU functions run (on the `sim` backend) on any machine.

use hearth_api::{GpuInfo, MAX_GPUS, MAX_GPU_MEMORY_MB};
use hearth_core::gpu::{DispatchConfig, GpuSchedConfig, GpuSpec, SimGpuModel};
use serde::{Deserialize, Serialize};

/// The smallest simulated device: below this no GPU function is worth simulating.
pub const MIN_SIM_GPU_MEMORY_MB: u64 = 256;

/// Where the worker's GPUs come from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuDevices {
    /// NVML's devices; none (without an error) where NVML or its driver is missing.
    #[default]
    Auto,
    /// No GPUs: `device: gpu` functions are refused here.
    None,
    /// The devices of `[gpu] sim`, each with its memory.
    Sim,
}

impl GpuDevices {
    pub fn as_str(self) -> &'static str {
        match self {
            GpuDevices::Auto => "auto",
            GpuDevices::None => "none",
            GpuDevices::Sim => "sim",
        }
    }
}

/// One simulated GPU (`[[gpu.sim]]`, or `sim = [{ memory_mb = 16384 }]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimGpu {
    pub memory_mb: u64,
}

/// `[gpu]`: the worker's GPUs, and how its GPU invocations are scheduled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GpuSettings {
    pub devices: GpuDevices,
    /// The simulated devices of `devices = "sim"` (1 to [`MAX_GPUS`]).
    pub sim: Vec<SimGpu>,
    /// `[gpu.scheduler]`: MQFQ-Sticky, FCFS or Batch and their parameters (thesis Table 6.2:
    /// `policy`, `t`, `alpha`, `fixed_ttl_us`, `d`, `d_max`, `dynamic_d`, `util_threshold`,
    /// `containers_per_gpu`, `max_queue`, …); the devices come from `devices`.
    pub scheduler: GpuSchedConfig,
    /// `[gpu.dispatch]`: where `device: any` functions run (`min_speedup`, `gpu_fraction`).
    pub dispatch: DispatchConfig,
    /// `[gpu.sim_model]`: the simulated device (`interference`, `pcie_mb_per_s`,
    /// `gpu_init_us`).
    pub sim_model: SimGpuModel,
    /// Share of a simulated device one invocation keeps busy alone: its utilization samples
    /// are the running invocations' shares, at most 1.
    pub sim_solo_util: f64,
}

impl Default for GpuSettings {
    fn default() -> Self {
        GpuSettings {
            devices: GpuDevices::default(),
            sim: Vec::new(),
            scheduler: GpuSchedConfig::default(),
            dispatch: DispatchConfig::default(),
            sim_model: SimGpuModel::default(),
            sim_solo_util: 0.5,
        }
    }
}

impl GpuSettings {
    /// Refuses a device list that cannot be meant: `sim` without devices, devices without
    /// `sim`, too many, or memory out of range.
    pub fn check(&self) -> Result<(), String> {
        let n = self.sim.len();
        match self.devices {
            GpuDevices::Sim if n == 0 => {
                return Err(
                    "gpu.devices = \"sim\" needs at least one simulated device, e.g. \
                     gpu.sim = [{ memory_mb = 16384 }]"
                        .into(),
                )
            }
            GpuDevices::Auto | GpuDevices::None if n > 0 => {
                return Err(format!(
                    "gpu.sim declares {n} simulated device(s) but gpu.devices is \"{}\": set \
                     gpu.devices = \"sim\" to use them",
                    self.devices.as_str()
                ))
            }
            _ => {}
        }
        if n > MAX_GPUS {
            return Err(format!(
                "gpu.sim may declare at most {MAX_GPUS} devices, got {n}"
            ));
        }
        let sched = GpuSchedConfig {
            // Checked here for its own fields; the devices are the ones found at start.
            gpus: vec![GpuSpec {
                memory_mb: MIN_SIM_GPU_MEMORY_MB,
            }],
            ..self.scheduler.clone()
        };
        sched.check().map_err(|e| format!("gpu.scheduler: {e}"))?;
        self.dispatch
            .check()
            .map_err(|e| format!("gpu.dispatch: {e}"))?;
        self.sim_model
            .check()
            .map_err(|e| format!("gpu.sim_model: {e}"))?;
        if !(self.sim_solo_util.is_finite()
            && self.sim_solo_util > 0.0
            && self.sim_solo_util <= 1.0)
        {
            return Err(format!(
                "gpu.sim_solo_util must be above 0 and at most 1, got {}",
                self.sim_solo_util
            ));
        }
        for (i, g) in self.sim.iter().enumerate() {
            if !(MIN_SIM_GPU_MEMORY_MB..=MAX_GPU_MEMORY_MB).contains(&g.memory_mb) {
                return Err(format!(
                    "gpu.sim[{i}].memory_mb must be between {MIN_SIM_GPU_MEMORY_MB} and \
                     {MAX_GPU_MEMORY_MB}, got {}",
                    g.memory_mb
                ));
            }
        }
        Ok(())
    }
}

/// The worker's GPUs under `settings`. Never fails: `auto` on a machine without NVML (or whose
/// NVML fails) has no GPUs, which the log says. Blocking (NVML loads a library and may take a
/// while to initialize): call it off the async threads.
pub fn discover(settings: &GpuSettings) -> Vec<GpuInfo> {
    discover_nvml(settings).gpus
}

/// What [`discover_nvml`] found: the GPUs, and NVML itself when they came from it (the worker
/// keeps it to read their utilization, rather than initializing NVML a second time).
pub struct Discovered {
    pub gpus: Vec<GpuInfo>,
    pub nvml: Option<nvml_wrapper::Nvml>,
}

/// [`discover`], keeping NVML. Blocking, as [`discover`].
pub fn discover_nvml(settings: &GpuSettings) -> Discovered {
    let (gpus, nvml) = discover_with(settings, nvml_devices);
    Discovered { gpus, nvml }
}

/// [`discover`] with `nvml` in place of NVML itself (which it hands back with the GPUs).
fn discover_with<N>(
    settings: &GpuSettings,
    nvml: impl FnOnce() -> Result<(Vec<GpuInfo>, N), NvmlProblem>,
) -> (Vec<GpuInfo>, Option<N>) {
    match settings.devices {
        GpuDevices::None => (Vec::new(), None),
        GpuDevices::Sim => (simulated(&settings.sim), None),
        GpuDevices::Auto => match nvml() {
            Ok((gpus, handle)) => {
                if !gpus.is_empty() {
                    tracing::info!(count = gpus.len(), "found NVIDIA GPUs through NVML");
                }
                (gpus, Some(handle))
            }
            Err(NvmlProblem::Absent(why)) => {
                tracing::info!("no NVIDIA GPUs: {why}");
                (Vec::new(), None)
            }
            Err(NvmlProblem::Failed(why)) => {
                tracing::warn!("NVML is installed but failed, so this worker uses no GPU: {why}");
                (Vec::new(), None)
            }
        },
    }
}

/// The declared simulated devices, in order.
fn simulated(sim: &[SimGpu]) -> Vec<GpuInfo> {
    sim.iter()
        .take(MAX_GPUS)
        .enumerate()
        .map(|(i, g)| GpuInfo {
            index: i as u32,
            name: "simulated".into(),
            uuid: format!("sim-{i}"),
            memory_mb: g.memory_mb.min(MAX_GPU_MEMORY_MB),
        })
        .collect()
}

/// Why NVML gave no devices.
#[derive(Debug)]
enum NvmlProblem {
    /// No library or no driver: a machine without NVIDIA GPUs.
    Absent(String),
    /// Something else went wrong.
    Failed(String),
}

/// NVML's devices (at most [`MAX_GPUS`]; a device NVML cannot describe is left out), and NVML.
fn nvml_devices() -> Result<(Vec<GpuInfo>, nvml_wrapper::Nvml), NvmlProblem> {
    use nvml_wrapper::error::NvmlError;
    let nvml = nvml_wrapper::Nvml::init().map_err(|e| match e {
        NvmlError::LibloadingError(_) | NvmlError::LibraryNotFound | NvmlError::DriverNotLoaded => {
            NvmlProblem::Absent(e.to_string())
        }
        e => NvmlProblem::Failed(e.to_string()),
    })?;
    let count = nvml
        .device_count()
        .map_err(|e| NvmlProblem::Failed(format!("counting devices: {e}")))?;
    if count as usize > MAX_GPUS {
        tracing::warn!(
            count,
            "NVML reports more GPUs than a worker uses; using the first {MAX_GPUS}"
        );
    }
    let mut gpus = Vec::new();
    for index in 0..count.min(MAX_GPUS as u32) {
        let described = nvml.device_by_index(index).and_then(|d| {
            Ok(GpuInfo {
                index,
                name: d.name()?,
                uuid: d.uuid()?,
                memory_mb: d.memory_info()?.total / (1024 * 1024),
            })
        });
        match described {
            Ok(g) => gpus.push(g.bounded()),
            Err(e) => tracing::warn!(index, "leaving out a GPU NVML cannot describe: {e}"),
        }
    }
    Ok((gpus, nvml))
}

#[cfg(test)]
mod tests {
    use super::*;
    use figment::providers::Format;

    fn sim(sizes: &[u64]) -> GpuSettings {
        GpuSettings {
            devices: GpuDevices::Sim,
            sim: sizes
                .iter()
                .map(|&memory_mb| SimGpu { memory_mb })
                .collect(),
            ..GpuSettings::default()
        }
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's error, test-only
    fn scheduling_settings_are_read_and_range_checked() {
        let parse = |text: &str| {
            figment::Figment::from(figment::providers::Toml::string(text)).extract::<GpuSettings>()
        };
        let g: GpuSettings = parse(
            "devices = \"sim\"\nsim = [{ memory_mb = 4096 }]\n[scheduler]\npolicy = \"fcfs\"\nd = 3\nd_max = 3\n[dispatch]\nmin_speedup = 2.0\n",
        )
        .unwrap();
        assert_eq!(g.scheduler.policy, hearth_core::gpu::GpuPolicy::Fcfs);
        assert_eq!((g.scheduler.d, g.dispatch.min_speedup), (3, 2.0));
        assert_eq!(g.sim_solo_util, 0.5, "defaults fill the rest");
        g.check().unwrap();
        let bad = |f: fn(&mut GpuSettings), needle: &str| {
            let mut g = sim(&[4096]);
            f(&mut g);
            let e = g.check().unwrap_err();
            assert!(e.contains(needle), "{e} should name {needle}");
        };
        bad(|g| g.scheduler.d = 0, "gpu.scheduler");
        bad(|g| g.dispatch.gpu_fraction = 2.0, "gpu.dispatch");
        bad(|g| g.sim_model.interference = f64::NAN, "gpu.sim_model");
        bad(|g| g.sim_solo_util = 0.0, "gpu.sim_solo_util");
        assert!(
            parse("[scheduler]\ngpus = [{ memory_mb = 1 }]\n").is_err(),
            "the devices are never read from the settings"
        );
    }

    #[test]
    fn simulated_devices_are_listed_in_order_with_their_memory() {
        let s = sim(&[16_384, 40_960]);
        s.check().unwrap();
        let gpus = discover(&s);
        assert_eq!(gpus.len(), 2);
        assert_eq!(
            gpus[1],
            GpuInfo {
                index: 1,
                name: "simulated".into(),
                uuid: "sim-1".into(),
                memory_mb: 40_960
            }
        );
    }

    #[test]
    fn simulated_devices_are_bounded_in_count_and_memory() {
        sim(&[MIN_SIM_GPU_MEMORY_MB, MAX_GPU_MEMORY_MB])
            .check()
            .unwrap();
        let e = sim(&[1024; MAX_GPUS + 1]).check().unwrap_err();
        assert!(e.contains("at most 16 devices, got 17"), "{e}");
        let e = sim(&[1024, MAX_GPU_MEMORY_MB + 1]).check().unwrap_err();
        assert!(
            e.contains("gpu.sim[1].memory_mb must be between 256 and 196608, got 196609"),
            "{e}"
        );
        let e = sim(&[0]).check().unwrap_err();
        assert!(e.contains("gpu.sim[0].memory_mb"), "{e}");
        let e = sim(&[]).check().unwrap_err();
        assert!(e.contains("at least one simulated device"), "{e}");
        let stray = GpuSettings {
            devices: GpuDevices::None,
            ..sim(&[1024])
        };
        assert!(stray.check().unwrap_err().contains("gpu.devices = \"sim\""));
    }

    #[test]
    fn the_sim_list_parses_from_toml() {
        let s: GpuSettings =
            toml_settings("devices = \"sim\"\nsim = [{ memory_mb = 16384 }, { memory_mb = 8192 }]");
        assert_eq!(s, sim(&[16_384, 8192]));
        let s: GpuSettings = toml_settings("");
        assert_eq!(s.devices, GpuDevices::Auto);
        let e = figment::Figment::from(figment::providers::Serialized::defaults(
            GpuSettings::default(),
        ))
        .merge(figment::providers::Toml::string("devices = \"tpu\""))
        .extract::<GpuSettings>()
        .unwrap_err()
        .to_string();
        assert!(e.contains("tpu"), "{e}");
    }

    fn toml_settings(text: &str) -> GpuSettings {
        figment::Figment::from(figment::providers::Serialized::defaults(
            GpuSettings::default(),
        ))
        .merge(figment::providers::Toml::string(text))
        .extract()
        .unwrap()
    }

    #[test]
    fn auto_without_nvml_or_with_a_failing_one_has_no_gpus_and_no_error() {
        let auto = GpuSettings::default();
        let absent = || Err::<(_, ()), _>(NvmlProblem::Absent("libnvidia-ml.so: not found".into()));
        assert_eq!(discover_with(&auto, absent), (Vec::new(), None));
        let failed = || Err::<(_, ()), _>(NvmlProblem::Failed("GPU is lost".into()));
        assert_eq!(discover_with(&auto, failed), (Vec::new(), None));
        let one = GpuInfo {
            index: 0,
            name: "NVIDIA H100".into(),
            uuid: "GPU-0".into(),
            memory_mb: 81_559,
        };
        let found = discover_with(&auto, || Ok((vec![one.clone()], ())));
        assert_eq!(
            found,
            (vec![one], Some(())),
            "NVML is handed back with its GPUs"
        );
        // `none` never asks NVML.
        let none = GpuSettings {
            devices: GpuDevices::None,
            ..GpuSettings::default()
        };
        let asked = || -> Result<(Vec<GpuInfo>, ()), NvmlProblem> { panic!("NVML asked") };
        assert_eq!(discover_with(&none, asked), (Vec::new(), None));
    }

    #[test]
    fn auto_on_this_machine_answers_what_nvml_has_without_failing() {
        // Without NVIDIA drivers (this build machine) NVML is absent and `auto` finds nothing;
        // on a GPU machine it lists NVML's devices.
        let direct = nvml_devices();
        let found = discover(&GpuSettings::default());
        match direct {
            Ok((gpus, _)) => assert_eq!(found, gpus),
            Err(e) => assert!(found.is_empty(), "{e:?} but found {found:?}"),
        }
        assert!(found.len() <= MAX_GPUS);
    }
}
