//! How a function's code appears at a sandbox's `/code`, without the host's paths.
//!
//! The code is a read-only overlay whose only layers are the function's code directory and an
//! empty directory, both given to the kernel as `/proc/self/fd/N` of descriptors the worker
//! holds while it mounts. A sandbox reading `/proc/self/mountinfo` then sees `overlay` with
//! `lowerdir=/proc/self/fd/N:/proc/self/fd/M` and root `/`, where a bind mount would show the
//! path of the code directory in its file system: the data directory and the function's
//! name. The overlay costs about 0.1 ms more than a bind to mount and unmount (measured in
//! docs/sandboxes.md); it is read-only, nosuid and nodev from the moment it exists.
//!
//! A function's own sandbox gets the overlay at its bundle's `code/`, which the container
//! binds at `/code`. A generic sandbox's `/code` is instead a tiny empty tmpfs the worker
//! mounts at its bundle's `code/`, shared (its own peer group), which the container binds as a
//! slave ([`super::oci`]); specializing the sandbox mounts the overlay onto it on the host, and
//! mount propagation carries it into the container's `/code`, one way only (a slave never
//! propagates back). The sandbox cannot undo or change it: it has no capabilities and seccomp
//! refuses `mount`.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn c_path(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// Opens a directory as an `O_PATH` descriptor (nothing is read through it).
fn open_dir_path(dir: &Path) -> io::Result<OwnedFd> {
    let path = c_path(dir)?;
    // SAFETY: the path is NUL-terminated and outlives the call.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Mounts `fstype` at `target` with `flags` and `data`.
pub(crate) fn mount(
    source: &CStr,
    target: &Path,
    fstype: &CStr,
    flags: libc::c_ulong,
    data: &str,
) -> io::Result<()> {
    let target = c_path(target)?;
    let data = CString::new(data).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Turns the (existing, empty) directory `dir` into a mount point in a peer group of its own:
/// an empty read-only tmpfs (root `/` in mountinfo, where a bind of `dir` onto itself would
/// show its host path), so that what is later mounted on it propagates to the container's
/// slave copy and nowhere else.
pub fn prepare_mount_point(dir: &Path) -> io::Result<()> {
    let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    mount(
        c"hearth-code",
        dir,
        c"tmpfs",
        flags,
        "size=4k,nr_inodes=4,mode=0755",
    )?;
    let target = c_path(dir)?;
    let null = std::ptr::null();
    // Private first: a mount on a shared parent would join that mount's peer group, and the
    // code mounted here would propagate back into the host's tree.
    for flag in [libc::MS_PRIVATE, libc::MS_SHARED] {
        // SAFETY: `target` is a NUL-terminated string that outlives the call; the other
        // pointers are null where the kernel ignores them.
        if unsafe { libc::mount(null, target.as_ptr(), null, flag, null.cast()) } != 0 {
            let e = io::Error::last_os_error();
            // SAFETY: as above.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
            return Err(e);
        }
    }
    Ok(())
}

/// Mounts the code of `code_dir` read-only (and nosuid, nodev) at `target`: an overlay of
/// `code_dir` over `empty` (an empty directory: overlay needs two layers when it has no upper
/// one), both named by descriptor so that no host path is recorded in the mount.
pub fn mount_code(code_dir: &Path, target: &Path, empty: &Path) -> io::Result<()> {
    let code = open_dir_path(code_dir)?;
    let empty = open_dir_path(empty)?;
    // Overlay xattrs in the code (`trusted.overlay.redirect`, `.metacopy`) are never followed.
    let data = format!(
        "lowerdir=/proc/self/fd/{}:/proc/self/fd/{},redirect_dir=nofollow,metacopy=off",
        code.as_raw_fd(),
        empty.as_raw_fd()
    );
    let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
    mount(c"overlay", target, c"overlay", flags, &data)
}

/// Unmounts everything stacked on `dir` (the code, then the mount point itself), lazily: a
/// dying sandbox may still hold it. Never fails; stops at the first directory that is not a
/// mount point.
pub fn unmount_all(dir: &Path) {
    let Ok(target) = c_path(dir) else { return };
    // A handful at most: the mount point and the code on it.
    for _ in 0..8 {
        // SAFETY: `target` is a NUL-terminated path that outlives the call.
        if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Root only (the worker's runc backend needs root anyway); skipped otherwise.
    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn code_mounted_on_the_point_is_read_only_and_goes_with_unmount_all() {
        if !is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let point = tmp.path().join("point");
        let code = tmp.path().join("secret-function-code");
        let empty = tmp.path().join("empty");
        for d in [&point, &code, &empty] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::write(code.join("main.py"), "x = 1\n").unwrap();
        prepare_mount_point(&point).unwrap();
        mount_code(&code, &point, &empty).unwrap();
        assert_eq!(
            std::fs::read_to_string(point.join("main.py")).unwrap(),
            "x = 1\n"
        );
        // Neither mount names a host path: root `/`, the layers by descriptor.
        let point_str = point.to_string_lossy().to_string();
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let lines: Vec<&str> = info
            .lines()
            .filter(|l| l.split(' ').nth(4) == Some(point_str.as_str()))
            .collect();
        assert_eq!(lines.len(), 2, "{lines:?}");
        for line in &lines {
            assert_eq!(line.split(' ').nth(3), Some("/"), "{line}");
            assert!(!line.contains("secret-function-code"), "{line}");
        }
        // Read-only even for root.
        let err = std::fs::write(point.join("new.py"), "y").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EROFS));
        unmount_all(&point);
        assert!(!point.join("main.py").exists());
        std::fs::remove_dir(&point).unwrap();
        // The code directory itself was never touched.
        assert!(code.join("main.py").exists() && !code.join("new.py").exists());
    }
}
