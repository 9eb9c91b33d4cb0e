//! One sandbox's CPU controls (cgroup v1): `cpu.idle` and `cpu.shares` of its `cpu` cgroup, and
//! `cpuacct.usage` of its `cpuacct` cgroup (a separate hierarchy on this host).
//!
//! Only the enforcer thread touches these files: every write and read here is a syscall that
//! must stay off the async threads. The files are opened on first use and kept open (one
//! `pwrite`/`pread` each afterwards); open files do not keep a removed cgroup alive, they only
//! fail with ENODEV.

use crate::backend::oci;
use parking_lot::Mutex;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// `cpu.shares` the kernel gives a group when it leaves `cpu.idle` (NICE_0_LOAD): un-idling a
/// group resets its shares to this, whatever they were.
pub const DEFAULT_SHARES: u64 = 1024;
/// Bounds the kernel accepts for `cpu.shares` (cgroup v1).
pub const MIN_SHARES: u64 = 2;
pub const MAX_SHARES: u64 = 262_144;

/// A sandbox's CPU controls, shared by the sandbox (for as long as it lives) and the enforcer
/// (while an invocation runs on it).
pub struct SandboxCpu {
    /// `/hearth/<worker>/<container>`.
    cgroups_path: String,
    state: Mutex<State>,
}

/// What the enforcer last wrote, so that unchanged values are not written again.
#[derive(Default)]
struct State {
    files: Option<Files>,
    /// `cpu.idle` as last written (None: unknown, so the next value is written).
    idle: Option<bool>,
    /// `cpu.shares` as the kernel has them while not idle.
    shares: Option<u64>,
    /// The invocation the sandbox runs (the enforcer's id).
    owner: Option<u64>,
}

struct Files {
    idle: File,
    shares: File,
    usage: File,
}

/// Errors of the cgroup files; the sandbox is usually gone (ENODEV, ENOENT).
pub type CgroupResult<T> = std::io::Result<T>;

impl SandboxCpu {
    /// Nothing is opened yet: making one costs an allocation, on the creation path.
    pub fn new(cgroups_path: &str) -> SandboxCpu {
        SandboxCpu {
            cgroups_path: cgroups_path.to_string(),
            state: Mutex::new(State::default()),
        }
    }

    /// Opens the three files if not yet open.
    fn files<'a>(path: &str, state: &'a mut State) -> CgroupResult<&'a Files> {
        if state.files.is_none() {
            let cpu = oci::cgroup_v1_dir("cpu", path);
            let open_w = |name: &str| std::fs::OpenOptions::new().write(true).open(cpu.join(name));
            state.files = Some(Files {
                idle: open_w("cpu.idle")?,
                shares: open_w("cpu.shares")?,
                usage: File::open(oci::cgroup_v1_dir("cpuacct", path).join("cpuacct.usage"))?,
            });
        }
        match state.files.as_ref() {
            Some(f) => Ok(f),
            None => Err(std::io::ErrorKind::NotFound.into()),
        }
    }

    /// CPU time every task of the sandbox has used since it started, in nanoseconds.
    pub fn usage_ns(&self) -> CgroupResult<u64> {
        let mut st = self.state.lock();
        let f = Self::files(&self.cgroups_path, &mut st)?;
        let mut buf = [0u8; 32];
        let n = f.usage.read_at(&mut buf, 0)?;
        std::str::from_utf8(&buf[..n])
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| std::io::ErrorKind::InvalidData.into())
    }

    /// In its slice: a normal (non-idle) group with `shares`, so it runs ahead of every idle
    /// sibling and, among running siblings, in proportion to its shares. Writes only what
    /// changes: `cpu.idle` first (the kernel refuses shares while idle, and un-idling resets them
    /// to [`DEFAULT_SHARES`]), then `cpu.shares` if they differ.
    pub fn boost(&self, shares: u64) -> CgroupResult<Writes> {
        let shares = shares.clamp(MIN_SHARES, MAX_SHARES);
        let mut st = self.state.lock();
        let mut writes = Writes(0);
        if st.idle != Some(false) {
            Self::files(&self.cgroups_path, &mut st)?
                .idle
                .write_all_at(b"0", 0)?;
            st.idle = Some(false);
            st.shares = Some(DEFAULT_SHARES);
            writes.0 += 1;
        }
        if st.shares != Some(shares) {
            let text = shares.to_string();
            Self::files(&self.cgroups_path, &mut st)?
                .shares
                .write_all_at(text.as_bytes(), 0)?;
            st.shares = Some(shares);
            writes.0 += 1;
        }
        Ok(writes)
    }

    /// Out of its slice (or between invocations): `cpu.idle`, so every sandbox in its slice
    /// runs first and demoted ones share what is left fairly among themselves.
    pub fn demote(&self) -> CgroupResult<Writes> {
        let mut st = self.state.lock();
        if st.idle == Some(true) {
            return Ok(Writes(0));
        }
        Self::files(&self.cgroups_path, &mut st)?
            .idle
            .write_all_at(b"1", 0)?;
        st.idle = Some(true);
        Ok(Writes(1))
    }

    /// Invocation `id` runs on the sandbox from now.
    pub(super) fn claim(&self, id: u64) {
        self.state.lock().owner = Some(id);
    }

    /// Whether invocation `id` is the last one that claimed the sandbox.
    pub(super) fn owned_by(&self, id: u64) -> bool {
        self.state.lock().owner == Some(id)
    }

    /// Whether the last write left the sandbox demoted (for tests and status).
    pub fn is_demoted(&self) -> Option<bool> {
        self.state.lock().idle
    }
}

/// Whether this host has what the enforcement writes and reads: cgroup v1 `cpu` with
/// `cpu.idle` (Linux 5.15 and later) and `cpuacct` with `cpuacct.usage`.
pub fn host_supported() -> bool {
    let root = std::path::Path::new(oci::CGROUP_V1_ROOT);
    ["cpu/cpu.idle", "cpu/cpu.shares", "cpuacct/cpuacct.usage"]
        .iter()
        .all(|f| root.join(f).exists())
}

/// Gives a killed sandbox the most CPU weight: its tasks must run to exit, and a demoted sandbox
/// beside boosted ones would hardly run (its teardown, and with it `runc delete`, would wait).
/// Killed, they run no user code. Blocking; errors are ignored (the cgroup may be gone).
pub fn raise_for_teardown(cgroups_path: &str) {
    let cpu = oci::cgroup_v1_dir("cpu", cgroups_path);
    let _ = std::fs::write(cpu.join("cpu.idle"), "0");
    let _ = std::fs::write(cpu.join("cpu.shares"), MAX_SHARES.to_string());
}

/// How many control files a step wrote (counted in metrics: the mechanism's cost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Writes(pub u32);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_cgroup_is_an_error_not_a_panic() {
        let cg = SandboxCpu::new("/hearth/no-such-worker/no-such-sandbox");
        assert!(cg.usage_ns().is_err());
        assert!(cg.boost(2048).is_err());
        assert!(cg.demote().is_err());
        assert_eq!(cg.is_demoted(), None);
    }
}
