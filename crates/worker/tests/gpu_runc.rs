//! A GPU sandbox on runc with a real NVIDIA GPU: the function reaches the driver through the
//! bound `libcuda.so.1`, sees exactly one device, and its allocation goes through the CUDA shim,
//! whose count comes back with the invoke answer and from prefetch and swap-out.
//!
//! Needs an NVIDIA GPU (`/dev/nvidiactl`), root, runc, and the shim: `HEARTH_GPU_SHIM`, else
//! `runtime/gpu-shim/libhearth_cuda_shim.so`, else built here with `make` (gcc). Without the GPU
//! it says so and passes (a GPU is optional even under `HEARTH_REQUIRE_RUNC`).

mod common;

use hearth_api::{FunctionSpec, GpuInfo};
use hearth_core::SandboxId;
use hearth_worker::backend::runc::RuncBackend;
use hearth_worker::backend::{Backend, GpuOpError, Sandbox};
use hearth_worker::config::RuncConfig;
use hearth_worker::gpu::{GpuDevices, GpuSettings};
use std::path::{Path, PathBuf};

/// What the function allocates through `cuMemAlloc_v2` (the shim makes it managed memory).
const ALLOC_BYTES: u64 = 64 << 20;

/// The function: initializes the driver through the global symbol scope (where the preloaded
/// shim interposes), allocates [`ALLOC_BYTES`] once and keeps them.
const HANDLER: &str = r#"
import ctypes

cuda = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
glob = ctypes.CDLL(None)
held = []

def main(args):
    out = {"init": cuda.cuInit(0)}
    count = ctypes.c_int(0)
    out["count_rc"] = cuda.cuDeviceGetCount(ctypes.byref(count))
    out["count"] = count.value
    if not held:
        dev = ctypes.c_int(0)
        out["get"] = cuda.cuDeviceGet(ctypes.byref(dev), 0)
        ctx = ctypes.c_void_p()
        out["retain"] = cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
        out["current"] = cuda.cuCtxSetCurrent(ctx)
        ptr = ctypes.c_uint64(0)
        out["alloc"] = glob.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(args["bytes"]))
        held.append((ctx, ptr))
    return out
"#;

/// The shim library, built if need be; None (with the reason printed) when there is none.
fn shim(tmp: &Path) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HEARTH_GPU_SHIM") {
        return Some(PathBuf::from(p));
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../runtime/gpu-shim");
    let built = src.join("libhearth_cuda_shim.so");
    if built.is_file() {
        return Some(built);
    }
    let ok = std::process::Command::new("make")
        .arg("-C")
        .arg(&src)
        .arg(format!("OUT={}", tmp.display()))
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    let out = tmp.join("libhearth_cuda_shim.so");
    if ok && out.is_file() {
        Some(out)
    } else {
        eprintln!("skipped: the CUDA shim is not built and `make -C runtime/gpu-shim` failed");
        None
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_on_a_gpu_sandbox_reaches_its_one_gpu_through_the_shim() {
    if !Path::new("/dev/nvidiactl").exists() {
        eprintln!("skipped: no NVIDIA GPU (/dev/nvidiactl missing)");
        return;
    }
    if !common::runc_available(&[]) {
        return;
    }
    let tmp = tempfile::Builder::new()
        .prefix("hgpu")
        .tempdir_in("/tmp")
        .unwrap();
    let Some(shim) = shim(tmp.path()) else {
        return;
    };
    let settings = GpuSettings {
        devices: GpuDevices::Auto,
        ..GpuSettings::default()
    };
    let gpus: Vec<GpuInfo> = hearth_worker::gpu::discover(&settings);
    // The last GPU: on a machine with several, another GPU's node must not be needed.
    let gpu = gpus
        .last()
        .cloned()
        .expect("/dev/nvidiactl exists but NVML lists no GPU");

    let cfg = RuncConfig {
        runc_path: PathBuf::from("runc"),
        gpu_shim_path: Some(shim),
        ..RuncConfig::default()
    };
    let data = tmp.path().join("d");
    let runc = RuncBackend::new(
        cfg,
        &data,
        &format!("g{}", std::process::id()),
        1 << 20,
        false,
    )
    .await
    .unwrap();
    let backend = Backend::Runc(runc);
    backend.cleanup_all().await;
    let code = tmp.path().join("code");
    std::fs::create_dir(&code).unwrap();
    std::fs::write(code.join("main.py"), HANDLER).unwrap();
    use std::os::unix::fs::PermissionsExt;
    for p in [tmp.path(), code.as_path(), &code.join("main.py")] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut spec = FunctionSpec::new("cuda");
    spec.memory_mb = 1024;

    let mut sb = backend
        .create_gpu(SandboxId(1), &spec, Some(&code), &gpu)
        .await
        .unwrap_or_else(|e| panic!("GPU sandbox: {e}"));
    assert_eq!(backend.gpu(&sb).map(|g| g.index), Some(gpu.index));
    assert_eq!(
        backend.device_memory_bytes(&sb),
        Some(0),
        "nothing held at start"
    );

    let args = format!("{{\"bytes\": {ALLOC_BYTES}}}");
    let r = backend.invoke(&mut sb, args.as_bytes()).await.unwrap();
    let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(r.status, 200, "{body}");
    for call in ["init", "count_rc", "get", "retain", "current", "alloc"] {
        assert_eq!(body[call], 0, "{call} failed: {body}");
    }
    assert_eq!(body["count"], 1, "exactly one device is visible: {body}");
    assert_eq!(r.device_memory_bytes, Some(ALLOC_BYTES));
    assert_eq!(backend.device_memory_bytes(&sb), Some(ALLOC_BYTES));

    let out = backend.gpu_swap_out(&mut sb).await.unwrap();
    assert_eq!((out.resident_bytes, out.regions), (ALLOC_BYTES, 1));
    let back = backend.gpu_prefetch(&mut sb).await.unwrap();
    assert_eq!(back, out);
    let r = backend.invoke(&mut sb, args.as_bytes()).await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.device_memory_bytes, Some(ALLOC_BYTES));

    backend.destroy(sb).await;
    backend.cleanup_all().await;
}

/// Runs everywhere: the sim backend refuses GPU sandboxes with a typed error, and memory
/// moves on a sandbox that is not a GPU one are refused, not attempted.
#[tokio::test]
async fn the_sim_backend_has_no_gpu_sandboxes() {
    let backend = Backend::Sim(hearth_worker::backend::sim::SimBackend::new());
    let gpu = GpuInfo {
        index: 0,
        name: "simulated".into(),
        uuid: "sim-0".into(),
        memory_mb: 16_384,
    };
    let spec = FunctionSpec::new("f");
    match backend.create_gpu(SandboxId(1), &spec, None, &gpu).await {
        Err(hearth_worker::backend::SandboxError::Unsupported(m)) => {
            assert!(m.contains("sim"), "{m}")
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a sim GPU sandbox"),
    }
    let mut sb: Sandbox = backend.create(SandboxId(2), &spec, None).await.unwrap();
    assert!(matches!(
        backend.gpu_prefetch(&mut sb).await,
        Err(GpuOpError::NotGpu)
    ));
    assert!(matches!(
        backend.gpu_swap_out(&mut sb).await,
        Err(GpuOpError::NotGpu)
    ));
    assert!(backend.gpu(&sb).is_none());
    assert_eq!(backend.device_memory_bytes(&sb), None);
}
