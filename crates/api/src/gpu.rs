//! GPUs on the wire: which device a function runs on, and the GPUs a worker has (thesis ch. 6).
//!
//! A function asks for `device: "cpu" | "gpu" | "any"` and, for the last two, the GPU memory it
//! needs. A worker reports its GPUs (found through NVML, or declared as simulated ones) in its
//! status; the worker refuses `gpu` functions it has no device for, and the controller routes them
//! only to workers that have one.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;

/// Most GPUs one worker reports (and a worker config may declare): far beyond any server, and a
/// bound on what a hostile status report can make the controller keep.
pub const MAX_GPUS: usize = 16;
/// Most GPU memory a function may ask for, and a device may report (192 GiB, above the largest
/// accelerators sold today).
pub const MAX_GPU_MEMORY_MB: u64 = 192 * 1024;
/// Longest device name or uuid kept from a report; longer ones are cut.
pub const MAX_GPU_LABEL_LEN: usize = 96;

/// Where a function's handler runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Device {
    /// On the worker's CPUs (every worker).
    #[default]
    Cpu,
    /// On one of the worker's GPUs: only workers with a GPU take it.
    Gpu,
    /// Polymorphic: a CPU and a GPU variant of the same handler, the worker choosing by the
    /// expected speedup; runs on any worker (the CPU variant where there is no GPU).
    Any,
}

impl Device {
    /// The accepted names, in the order error messages list them.
    pub const NAMES: [&'static str; 3] = ["cpu", "gpu", "any"];

    pub fn as_str(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Gpu => "gpu",
            Device::Any => "any",
        }
    }

    /// Whether the function may use a GPU (`gpu` or `any`): it then names its GPU memory.
    pub fn uses_gpu(self) -> bool {
        self != Device::Cpu
    }

    /// `serde`'s skip test: `cpu` is left out, so that specs without GPUs read as before.
    pub fn is_cpu(&self) -> bool {
        *self == Device::Cpu
    }
}

/// An unknown device name; shows at most [`UnknownDevice::SHOWN`] characters of what was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("device must be one of \"cpu\", \"gpu\" or \"any\", got {0:?}")]
pub struct UnknownDevice(pub String);

impl UnknownDevice {
    /// Characters of the sent value the error repeats: the body may be megabytes.
    pub const SHOWN: usize = 16;

    fn of(sent: &str) -> Self {
        let mut shown: String = sent.chars().take(Self::SHOWN).collect();
        if shown.len() < sent.len() {
            shown.push('…');
        }
        UnknownDevice(shown)
    }
}

impl std::str::FromStr for Device {
    type Err = UnknownDevice;
    fn from_str(s: &str) -> Result<Self, UnknownDevice> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "gpu" => Ok(Device::Gpu),
            "any" => Ok(Device::Any),
            other => Err(UnknownDevice::of(other)),
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Device {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Device {
    /// By hand rather than derived: serde's own message repeats the whole value sent.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s: Cow<'de, str> = Deserialize::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// One GPU of a worker, as it reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// The device's index on its machine (NVML's), or its place in the `[gpu] sim` list.
    pub index: u32,
    /// The model (`NVIDIA H100 80GB HBM3`), or `simulated` for a declared one.
    pub name: String,
    /// NVML's stable id (`GPU-…`), or `sim-<index>` for a declared one.
    pub uuid: String,
    /// The device's whole memory, MiB.
    pub memory_mb: u64,
}

impl GpuInfo {
    /// A copy fit to keep from a report: labels cut to [`MAX_GPU_LABEL_LEN`] characters and the
    /// memory capped at [`MAX_GPU_MEMORY_MB`].
    pub fn bounded(&self) -> GpuInfo {
        let cut = |s: &str| s.chars().take(MAX_GPU_LABEL_LEN).collect();
        GpuInfo {
            index: self.index,
            name: cut(&self.name),
            uuid: cut(&self.uuid),
            memory_mb: self.memory_mb.min(MAX_GPU_MEMORY_MB),
        }
    }
}

/// Where a GPU invocation ran: the device, and how its sandbox started (`warm`: memory on the
/// device; `host-warm`: its memory was prefetched first; `cold`: a GPU sandbox was created).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuPlacement {
    pub index: u32,
    pub start: hearth_core::gpu::Start,
}

/// The memory of the largest of `gpus` (MiB); None when there are none.
pub fn largest_gpu_mb(gpus: &[GpuInfo]) -> Option<u64> {
    gpus.iter().map(|g| g.memory_mb).max()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_read_and_write_lowercase_names() {
        for (name, d) in [
            ("cpu", Device::Cpu),
            ("gpu", Device::Gpu),
            ("any", Device::Any),
        ] {
            let json = format!("\"{name}\"");
            assert_eq!(serde_json::from_str::<Device>(&json).unwrap(), d);
            assert_eq!(serde_json::to_string(&d).unwrap(), json);
            assert_eq!(name.parse::<Device>().unwrap(), d);
        }
        assert_eq!(Device::default(), Device::Cpu);
    }

    #[test]
    fn an_unknown_device_names_the_accepted_ones_and_repeats_a_short_cut_of_the_value() {
        let e = serde_json::from_str::<Device>("\"tpu\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(r#"device must be one of "cpu", "gpu" or "any", got "tpu""#),
            "{e}"
        );
        // Case matters, like every other name in a spec.
        assert!("GPU".parse::<Device>().is_err());
        let long = "x".repeat(10_000);
        let e = serde_json::from_str::<Device>(&format!("\"{long}\""))
            .unwrap_err()
            .to_string();
        assert!(e.len() < 120, "{e}");
        assert!(e.contains(&format!("\"{}…\"", "x".repeat(UnknownDevice::SHOWN))));
        assert!(serde_json::from_str::<Device>("1").is_err());
    }

    #[test]
    fn reported_gpus_are_bounded_before_they_are_kept() {
        let g = GpuInfo {
            index: 3,
            name: "n".repeat(1000),
            uuid: "GPU-1".into(),
            memory_mb: u64::MAX,
        };
        let b = g.bounded();
        assert_eq!(b.name.chars().count(), MAX_GPU_LABEL_LEN);
        assert_eq!((b.index, b.uuid.as_str()), (3, "GPU-1"));
        assert_eq!(b.memory_mb, MAX_GPU_MEMORY_MB);
        assert_eq!(largest_gpu_mb(&[]), None);
        assert_eq!(
            largest_gpu_mb(&[
                GpuInfo {
                    memory_mb: 8,
                    ..b.clone()
                },
                b
            ]),
            Some(MAX_GPU_MEMORY_MB)
        );
    }
}
