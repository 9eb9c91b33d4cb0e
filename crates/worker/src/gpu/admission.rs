//! Which functions a worker's GPUs can take: a `gpu` function needs a device with at least its
//! `gpu_memory_mb`; `cpu` and `any` functions run anywhere (`any` falls back to its CPU variant).
//! Checked when a function is registered and again when it is invoked or prewarmed, since a
//! function stored earlier may outlive the GPUs it was registered with.

use super::discover::GpuDevices;
use hearth_api::{largest_gpu_mb, FunctionSpec, GpuInfo};

/// Why this worker cannot run a function's GPU variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuRefusal {
    #[error(
        "{function} has device \"gpu\" but this worker has no GPU ({why}); run it on a worker \
         with a GPU, or use device \"any\" to fall back to the CPU"
    )]
    NoGpu { function: String, why: &'static str },
    #[error(
        "{function} needs gpu_memory_mb {needed_mb} but this worker's largest GPU has \
         {largest_mb} MiB"
    )]
    TooLittleMemory {
        function: String,
        needed_mb: u64,
        largest_mb: u64,
    },
    /// The GPU scheduler refused the invocation itself (a bad weight or name, too many GPU
    /// functions at once).
    #[error("{function}: {reason}")]
    Scheduler {
        function: String,
        reason: hearth_core::gpu::GpuReject,
    },
}

/// `Ok` when a worker with `gpus` (from `source`) can take `spec`.
pub fn admit(gpus: &[GpuInfo], source: GpuDevices, spec: &FunctionSpec) -> Result<(), GpuRefusal> {
    let Some(needed_mb) = spec.required_gpu_mb() else {
        return Ok(());
    };
    let Some(largest_mb) = largest_gpu_mb(gpus) else {
        return Err(GpuRefusal::NoGpu {
            function: spec.name.clone(),
            why: match source {
                GpuDevices::None => "gpu.devices = \"none\"",
                GpuDevices::Auto => "gpu.devices = \"auto\" found no NVIDIA GPU",
                GpuDevices::Sim => "gpu.sim declares no device",
            },
        });
    };
    if needed_mb > largest_mb {
        return Err(GpuRefusal::TooLittleMemory {
            function: spec.name.clone(),
            needed_mb,
            largest_mb,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_api::Device;

    fn gpu(memory_mb: u64) -> GpuInfo {
        GpuInfo {
            index: 0,
            name: "simulated".into(),
            uuid: "sim-0".into(),
            memory_mb,
        }
    }

    fn spec(device: Device, gpu_memory_mb: u64) -> FunctionSpec {
        FunctionSpec {
            device,
            gpu_memory_mb,
            ..FunctionSpec::new("f")
        }
    }

    #[test]
    fn gpu_functions_need_a_device_large_enough() {
        let gpus = [gpu(8192), gpu(16_384)];
        assert_eq!(
            admit(&gpus, GpuDevices::Sim, &spec(Device::Gpu, 16_384)),
            Ok(())
        );
        let e = admit(&gpus, GpuDevices::Sim, &spec(Device::Gpu, 16_385)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "f needs gpu_memory_mb 16385 but this worker's largest GPU has 16384 MiB"
        );
        let e = admit(&[], GpuDevices::None, &spec(Device::Gpu, 1)).unwrap_err();
        assert!(
            e.to_string().contains("no GPU (gpu.devices = \"none\")"),
            "{e}"
        );
    }

    #[test]
    fn cpu_and_any_functions_run_without_a_gpu() {
        assert_eq!(admit(&[], GpuDevices::Auto, &spec(Device::Cpu, 0)), Ok(()));
        assert_eq!(
            admit(&[], GpuDevices::Auto, &spec(Device::Any, 4096)),
            Ok(())
        );
        // `any` too large for the devices here runs its CPU variant.
        assert_eq!(
            admit(&[gpu(1024)], GpuDevices::Sim, &spec(Device::Any, 4096)),
            Ok(())
        );
    }
}
