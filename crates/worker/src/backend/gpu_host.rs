//! What a GPU sandbox takes from the host (docs/gpu.md, "GPU sandboxes (runc)"): the NVIDIA
//! device nodes of its one GPU, the driver's user-space libraries, and the CUDA shim.
//!
//! This is what NVIDIA's container toolkit does for Docker (thesis §6.4.1), done by hand: the
//! kernel driver is the host's, so the libraries that talk to it must be the host's too (their
//! version must match the module's exactly); nothing of them is copied.

use super::oci::{DeviceNode, GpuParams};
use hearth_api::GpuInfo;
use std::collections::HashSet;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The shim's file name, on the host and in the sandbox.
pub const SHIM_NAME: &str = "libhearth_cuda_shim.so";
/// Where the worker looks for the shim when `runc.gpu_shim_path` is not set, after the
/// directory of its own binary.
pub const SHIM_INSTALL_PATH: &str = "/usr/local/lib/hearth/libhearth_cuda_shim.so";
/// The host's device directory and the driver's per-GPU entries in procfs.
pub const DEV_DIR: &str = "/dev";
pub const PROC_GPUS_DIR: &str = "/proc/driver/nvidia/gpus";
/// Device nodes every GPU sandbox needs: the control device and unified memory (the shim
/// turns every allocation into a managed one).
const REQUIRED_NODES: [&str; 2] = ["nvidiactl", "nvidia-uvm"];
/// Given when the host has it (profilers use it).
const OPTIONAL_NODES: [&str; 1] = ["nvidia-uvm-tools"];
/// The library without which no CUDA program runs.
pub const CUDA_LIBRARY: &str = "libcuda.so.1";
/// The most driver libraries bound into a sandbox (a driver has a few dozen); each is a mount
/// that every GPU sandbox start pays for.
pub const MAX_DRIVER_LIBRARIES: usize = 64;
/// The most of `ldconfig -p`'s output parsed (a few hundred KiB on a full system).
const MAX_LDCONFIG_BYTES: usize = 4 << 20;
/// The most GPU entries in procfs looked at, and bytes read of each one's `information`.
const MAX_PROC_GPUS: usize = 64;
const MAX_PROC_INFO_BYTES: u64 = 8192;
/// The ABI tag of this build's libraries in `ldconfig -p` (other ABIs' libraries are listed too).
#[cfg(target_arch = "x86_64")]
const LDCONFIG_ABI: Option<&str> = Some("x86-64");
#[cfg(target_arch = "aarch64")]
const LDCONFIG_ABI: Option<&str> = Some("AArch64");
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const LDCONFIG_ABI: Option<&str> = None;

/// Why a GPU sandbox cannot be given what it needs. Never names a host path beyond `/dev`.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GpuHostError {
    #[error("/dev/{0} is missing: is the NVIDIA driver loaded? (`nvidia-modprobe -u -c=0` creates the nodes)")]
    MissingDevice(String),
    #[error("/dev/{0} is not a character device")]
    NotADevice(String),
    #[error("reading /dev/{0}: {1}")]
    Device(String, String),
    #[error("the NVIDIA driver library {CUDA_LIBRARY} is not in the loader's cache (ldconfig -p)")]
    NoDriver,
    #[error("listing the driver libraries with ldconfig -p failed: {0}")]
    Ldconfig(String),
    #[error("the CUDA shim {SHIM_NAME} was not found (set runc.gpu_shim_path; docs/gpu.md)")]
    NoShim,
}

/// The files every GPU sandbox of this worker binds (found once).
#[derive(Debug, Clone)]
pub struct DriverFiles {
    /// (name in the sandbox's library directory, host file).
    pub libraries: Vec<(String, PathBuf)>,
    pub shim: PathBuf,
    /// Where the device nodes are ([`DEV_DIR`]) and the driver's per-GPU information
    /// ([`PROC_GPUS_DIR`]); other places only in tests.
    pub dev_dir: PathBuf,
    pub proc_gpus: PathBuf,
}

impl DriverFiles {
    /// Finds the driver libraries (`ldconfig -p`) and the shim. Blocking: runs a process and
    /// reads the file system.
    pub fn find(shim: Option<&Path>) -> Result<DriverFiles, GpuHostError> {
        let shim = find_shim(shim)?;
        let out = run_ldconfig()?;
        let listed = parse_ldconfig(&out);
        let libraries = resolve_libraries(listed);
        if !libraries.iter().any(|(name, _)| name == CUDA_LIBRARY) {
            return Err(GpuHostError::NoDriver);
        }
        Ok(DriverFiles {
            libraries,
            shim,
            dev_dir: PathBuf::from(DEV_DIR),
            proc_gpus: PathBuf::from(PROC_GPUS_DIR),
        })
    }

    /// The spec additions of a sandbox on `gpu`: these files and that GPU's device nodes.
    /// Blocking: reads `/dev` and procfs.
    pub fn for_gpu(&self, gpu: &GpuInfo) -> Result<GpuParams, GpuHostError> {
        let minor = device_minor(&self.proc_gpus, gpu);
        Ok(GpuParams {
            devices: device_nodes(&self.dev_dir, minor)?,
            libraries: self.libraries.clone(),
            shim: self.shim.clone(),
        })
    }
}

/// The device nodes of a sandbox on the GPU whose node is `nvidia<minor>`, read from `dev`:
/// the control and unified-memory devices, `nvidia-uvm-tools` if present, and that one GPU's
/// node (no other GPU's).
pub fn device_nodes(dev: &Path, minor: u32) -> Result<Vec<DeviceNode>, GpuHostError> {
    let gpu_node = format!("nvidia{minor}");
    let mut nodes = Vec::new();
    for name in REQUIRED_NODES.iter().copied().chain([gpu_node.as_str()]) {
        match device_node(dev, name)? {
            Some(n) => nodes.push(n),
            None => return Err(GpuHostError::MissingDevice(name.to_string())),
        }
    }
    for name in OPTIONAL_NODES {
        nodes.extend(device_node(dev, name)?);
    }
    Ok(nodes)
}

/// `dev/<name>` as a node at `/dev/<name>` in the sandbox; None when it does not exist.
fn device_node(dev: &Path, name: &str) -> Result<Option<DeviceNode>, GpuHostError> {
    let meta = match std::fs::metadata(dev.join(name)) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(GpuHostError::Device(name.to_string(), e.kind().to_string())),
    };
    if !meta.file_type().is_char_device() {
        return Err(GpuHostError::NotADevice(name.to_string()));
    }
    let rdev = meta.rdev();
    Ok(Some(DeviceNode {
        path: format!("/dev/{name}"),
        major: libc::major(rdev),
        minor: libc::minor(rdev),
    }))
}

/// The minor number of `gpu`'s device node (`/dev/nvidia<minor>`): the driver's procfs entry
/// whose `GPU UUID` is the GPU's says it (`Device Minor`). NVML's index usually equals it but
/// need not; without a matching entry (no procfs, a simulated GPU) the index is used.
pub fn device_minor(proc_gpus: &Path, gpu: &GpuInfo) -> u32 {
    use std::io::Read;
    let Ok(entries) = std::fs::read_dir(proc_gpus) else {
        return gpu.index;
    };
    for entry in entries.flatten().take(MAX_PROC_GPUS) {
        let mut text = String::new();
        let read = std::fs::File::open(entry.path().join("information"))
            .and_then(|f| f.take(MAX_PROC_INFO_BYTES).read_to_string(&mut text));
        if read.is_err() {
            continue;
        }
        if let Some(minor) = minor_if_uuid(&text, &gpu.uuid) {
            return minor;
        }
    }
    tracing::debug!(
        gpu = gpu.index,
        "no procfs entry names the GPU; its index is its minor"
    );
    gpu.index
}

/// `Device Minor` of an `information` file if its `GPU UUID` is `uuid`.
fn minor_if_uuid(information: &str, uuid: &str) -> Option<u32> {
    let field = |key: &str| {
        information.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == key).then(|| v.trim())
        })
    };
    if uuid.is_empty() || field("GPU UUID")? != uuid {
        return None;
    }
    field("Device Minor")?.parse().ok()
}

/// The shim: `configured` if set (it must be a file), else next to the worker's binary, else
/// [`SHIM_INSTALL_PATH`]. Returned canonical, so what is bound is what was checked.
pub fn find_shim(configured: Option<&Path>) -> Result<PathBuf, GpuHostError> {
    let candidates: Vec<PathBuf> = match configured {
        Some(p) => vec![p.to_path_buf()],
        None => std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|d| d.join(SHIM_NAME)))
            .into_iter()
            .chain([PathBuf::from(SHIM_INSTALL_PATH)])
            .collect(),
    };
    for c in &candidates {
        if let Some(file) = regular_file(c) {
            return Ok(file);
        }
    }
    tracing::warn!(searched = ?candidates, "the CUDA shim was not found");
    Err(GpuHostError::NoShim)
}

/// `path` resolved, if it is (a link to) a regular file.
fn regular_file(path: &Path) -> Option<PathBuf> {
    let real = std::fs::canonicalize(path).ok()?;
    std::fs::metadata(&real)
        .ok()?
        .file_type()
        .is_file()
        .then_some(real)
}

fn run_ldconfig() -> Result<String, GpuHostError> {
    // Debian and Ubuntu keep it in /sbin, outside a non-root PATH.
    let mut last = String::new();
    for prog in ["/sbin/ldconfig", "ldconfig"] {
        match std::process::Command::new(prog)
            .arg("-p")
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
        {
            Ok(out) if out.status.success() => {
                let n = out.stdout.len().min(MAX_LDCONFIG_BYTES);
                return Ok(String::from_utf8_lossy(&out.stdout[..n]).into_owned());
            }
            Ok(out) => last = format!("exit status {}", out.status),
            Err(e) => last = e.kind().to_string(),
        }
    }
    Err(GpuHostError::Ldconfig(last))
}

/// The NVIDIA driver's libraries in `ldconfig -p` output, this build's ABI only, in the
/// cache's order (the loader's preference), first of each name, at most
/// [`MAX_DRIVER_LIBRARIES`]. Lines look like
/// `\tlibcuda.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so.1`.
pub fn parse_ldconfig(out: &str) -> Vec<(String, PathBuf)> {
    let mut seen = HashSet::new();
    let mut libs = Vec::new();
    for line in out.lines() {
        let Some((left, path)) = line.split_once(" => ") else {
            continue;
        };
        let Some((name, abi)) = left.trim().split_once(' ') else {
            continue;
        };
        if LDCONFIG_ABI.is_some_and(|tag| !abi.contains(tag)) || !is_driver_library(name) {
            continue;
        }
        let path = Path::new(path.trim());
        if !path.is_absolute() || !seen.insert(name.to_string()) {
            continue;
        }
        libs.push((name.to_string(), path.to_path_buf()));
        if libs.len() == MAX_DRIVER_LIBRARIES {
            break;
        }
    }
    libs
}

/// A file name of the driver's user space: `libcuda.so*`, `libcudadebugger.so*` or
/// `libnvidia-*.so*`. Not `libcudart` (the CUDA runtime, which a function brings itself).
fn is_driver_library(name: &str) -> bool {
    let plain = !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+'));
    plain
        && (name.starts_with("libcuda.so")
            || name.starts_with("libcudadebugger.so")
            || (name.starts_with("libnvidia-") && name.contains(".so")))
}

/// The listed libraries that exist, each resolved to its file (a stale cache entry is left
/// out).
fn resolve_libraries(listed: Vec<(String, PathBuf)>) -> Vec<(String, PathBuf)> {
    listed
        .into_iter()
        .filter_map(|(name, path)| regular_file(&path).map(|file| (name, file)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn gpu(index: u32, uuid: &str) -> GpuInfo {
        GpuInfo {
            index,
            name: "NVIDIA H100".into(),
            uuid: uuid.into(),
            memory_mb: 81_559,
        }
    }

    /// A fake /dev whose NVIDIA nodes are links to real character devices of every machine.
    fn fake_dev(names: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, target) in names {
            symlink(target, dir.path().join(name)).unwrap();
        }
        dir
    }

    #[test]
    fn nodes_are_read_with_their_numbers_and_only_the_assigned_gpu() {
        let dev = fake_dev(&[
            ("nvidiactl", "/dev/null"),
            ("nvidia-uvm", "/dev/zero"),
            ("nvidia2", "/dev/full"),
            ("nvidia0", "/dev/random"),
        ]);
        let nodes = device_nodes(dev.path(), 2).unwrap();
        let got: Vec<(&str, u32, u32)> = nodes
            .iter()
            .map(|n| (n.path.as_str(), n.major, n.minor))
            .collect();
        // null, zero, full are 1:3, 1:5, 1:7 on Linux.
        assert_eq!(
            got,
            [
                ("/dev/nvidiactl", 1, 3),
                ("/dev/nvidia-uvm", 1, 5),
                ("/dev/nvidia2", 1, 7)
            ]
        );
        // uvm-tools is added when present.
        symlink("/dev/urandom", dev.path().join("nvidia-uvm-tools")).unwrap();
        let nodes = device_nodes(dev.path(), 2).unwrap();
        assert_eq!(nodes.last().unwrap().path, "/dev/nvidia-uvm-tools");
        assert_eq!(nodes.len(), 4);
    }

    #[test]
    fn a_missing_or_fake_node_is_refused() {
        let dev = fake_dev(&[("nvidiactl", "/dev/null"), ("nvidia0", "/dev/zero")]);
        match device_nodes(dev.path(), 0) {
            Err(GpuHostError::MissingDevice(n)) => assert_eq!(n, "nvidia-uvm"),
            other => panic!("{other:?}"),
        }
        symlink("/dev/zero", dev.path().join("nvidia-uvm")).unwrap();
        assert!(matches!(
            device_nodes(dev.path(), 1),
            Err(GpuHostError::MissingDevice(n)) if n == "nvidia1"
        ));
        // A regular file where a node should be is not passed on.
        std::fs::write(dev.path().join("nvidia1"), "x").unwrap();
        let e = device_nodes(dev.path(), 1).unwrap_err();
        assert!(matches!(&e, GpuHostError::NotADevice(n) if n == "nvidia1"));
        assert!(!e.to_string().contains(&*dev.path().to_string_lossy()));
    }

    #[test]
    fn the_minor_comes_from_the_procfs_entry_with_the_gpus_uuid() {
        let proc = tempfile::tempdir().unwrap();
        for (bus, uuid, minor) in [
            ("0000:17:00.0", "GPU-aaaa", 1),
            ("0000:65:00.0", "GPU-bbbb", 0),
        ] {
            let d = proc.path().join(bus);
            std::fs::create_dir(&d).unwrap();
            std::fs::write(
                d.join("information"),
                format!(
                    "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 42\nGPU UUID: \t {uuid}\n\
                     Video BIOS: \t ??.??.??.??.??\nBus Type: \t PCIe\nDevice Minor: \t {minor}\n"
                ),
            )
            .unwrap();
        }
        assert_eq!(device_minor(proc.path(), &gpu(0, "GPU-aaaa")), 1);
        assert_eq!(device_minor(proc.path(), &gpu(1, "GPU-bbbb")), 0);
        // No entry with its uuid (a declared GPU), or no procfs: the index.
        assert_eq!(device_minor(proc.path(), &gpu(5, "GPU-cccc")), 5);
        assert_eq!(device_minor(proc.path(), &gpu(5, "")), 5);
        assert_eq!(
            device_minor(&proc.path().join("absent"), &gpu(3, "GPU-aaaa")),
            3
        );
    }

    #[test]
    fn ldconfig_output_yields_the_drivers_libraries_of_this_abi() {
        let out = "\
1203 libs found in cache `/etc/ld.so.cache'
\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1
\tlibnvidia-ptxjitcompiler.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.1
\tlibnvidia-ml.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libnvidia-ml.so.1
\tlibnvidia-ml.so.1 (libc6,x86-64) => /usr/local/cuda/lib64/stubs/libnvidia-ml.so.1
\tlibcudart.so.12 (libc6,x86-64) => /usr/local/cuda/lib64/libcudart.so.12
\tlibcudadebugger.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libcudadebugger.so.1
\tlibcuda.so.1 (libc6) => /lib/i386-linux-gnu/libcuda.so.1
\tlibcuda.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so.1
\tlibcuda.so (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so
\tlibnvidia-../../etc.so (libc6,x86-64) => /etc/shadow
\tlibnvidia-x.so.1 (libc6,x86-64) => relative/libnvidia-x.so.1
\tlibnvidia-cfg.so.1 (libc6,x86-64, OS ABI: Linux 2.3.99) => /lib/x86_64-linux-gnu/libnvidia-cfg.so.1
Cache generated by: ldconfig (Ubuntu GLIBC 2.35-0ubuntu3.8) stable release version 2.35
";
        let libs = parse_ldconfig(out);
        let names: Vec<&str> = libs.iter().map(|(n, _)| n.as_str()).collect();
        if cfg!(target_arch = "x86_64") {
            assert_eq!(
                names,
                [
                    "libnvidia-ptxjitcompiler.so.1",
                    "libnvidia-ml.so.1",
                    "libcudadebugger.so.1",
                    "libcuda.so.1",
                    "libcuda.so",
                    "libnvidia-cfg.so.1",
                ]
            );
            // The first of a name wins (the loader's choice), not a later stub.
            assert_eq!(
                libs[1].1,
                Path::new("/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
            );
            assert_eq!(libs[3].1, Path::new("/lib/x86_64-linux-gnu/libcuda.so.1"));
        }
        assert!(!names.iter().any(|n| n.contains('/')));
    }

    #[test]
    fn the_library_list_is_bounded() {
        let out: String = (0..500)
            .map(|i| format!("\tlibnvidia-n{i}.so.1 (libc6,x86-64) => /l/libnvidia-n{i}.so.1\n"))
            .collect();
        if cfg!(target_arch = "x86_64") {
            assert_eq!(parse_ldconfig(&out).len(), MAX_DRIVER_LIBRARIES);
        }
    }

    #[test]
    fn libraries_are_resolved_to_files_and_stale_entries_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("libcuda.so.550.54.15");
        std::fs::write(&real, "elf").unwrap();
        symlink(&real, dir.path().join("libcuda.so.1")).unwrap();
        std::fs::create_dir(dir.path().join("libnvidia-dir.so.1")).unwrap();
        let listed = vec![
            ("libcuda.so.1".to_string(), dir.path().join("libcuda.so.1")),
            ("libnvidia-gone.so.1".to_string(), dir.path().join("gone")),
            (
                "libnvidia-dir.so.1".to_string(),
                dir.path().join("libnvidia-dir.so.1"),
            ),
        ];
        let libs = resolve_libraries(listed);
        assert_eq!(
            libs,
            [(
                "libcuda.so.1".to_string(),
                std::fs::canonicalize(&real).unwrap()
            )]
        );
    }

    #[test]
    fn the_shim_is_the_configured_file_or_an_error_without_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let shim = dir.path().join(SHIM_NAME);
        std::fs::write(&shim, "elf").unwrap();
        assert_eq!(
            find_shim(Some(&shim)).unwrap(),
            std::fs::canonicalize(&shim).unwrap()
        );
        let e = find_shim(Some(&dir.path().join("nope.so"))).unwrap_err();
        assert!(matches!(e, GpuHostError::NoShim));
        assert!(!e.to_string().contains(&*dir.path().to_string_lossy()));
        assert!(
            find_shim(Some(dir.path())).is_err(),
            "a directory is no shim"
        );
    }
}
