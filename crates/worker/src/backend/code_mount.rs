//! Making a function's code appear inside a generic sandbox that is already running.
//!
//! A generic sandbox's `/code` is a bind of its bundle's `code/` directory, which the worker
//! first turns into a mount point of its own, shared (its own peer group), and which the
//! container binds as a slave ([`super::oci`]). Specializing the sandbox mounts a read-only
//! clone of the function's code directory onto that mount point on the host: mount propagation
//! carries it into the container's `/code`, one way only (a slave never propagates back). The
//! sandbox cannot undo or change it: it has no capabilities and seccomp refuses `mount`.
//!
//! The clone is made with the new mount API (`open_tree`, `mount_setattr`, `move_mount`,
//! Linux 5.12+), so it is read-only, nosuid and nodev from the moment it exists: a bind mount
//! made with `mount(2)` is writable until remounted, and a remount would not propagate.

use std::ffi::CString;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

const OPEN_TREE_CLONE: libc::c_uint = 0x1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

fn c_path(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn check(rc: libc::c_long) -> io::Result<libc::c_long> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Turns the (existing, empty) directory `dir` into a mount point in a peer group of its own,
/// so that what is later mounted on it propagates to the container's slave copy and nowhere
/// else.
pub fn prepare_mount_point(dir: &Path) -> io::Result<()> {
    let target = c_path(dir)?;
    let null = std::ptr::null();
    // SAFETY: every pointer is a NUL-terminated string that outlives the calls, or null where
    // the kernel ignores the argument.
    unsafe {
        if libc::mount(
            target.as_ptr(),
            target.as_ptr(),
            null,
            libc::MS_BIND,
            null.cast(),
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
        // Private first: a bind of a directory on a shared mount would join that mount's peer
        // group, and the code mounted here would propagate back into the host's tree.
        for flag in [libc::MS_PRIVATE, libc::MS_SHARED] {
            if libc::mount(null, target.as_ptr(), null, flag, null.cast()) != 0 {
                let e = io::Error::last_os_error();
                libc::umount2(target.as_ptr(), libc::MNT_DETACH);
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Mounts a read-only, nosuid, nodev clone of `code_dir` onto the mount point `target`.
pub fn mount_code(code_dir: &Path, target: &Path) -> io::Result<()> {
    let source = c_path(code_dir)?;
    let target = c_path(target)?;
    // SAFETY: the path is NUL-terminated and outlives the call; the returned descriptor is
    // owned below.
    let fd = check(unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            source.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_RECURSIVE as libc::c_uint,
        )
    })?;
    // SAFETY: open_tree returned a new descriptor that nothing else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
    use std::os::fd::AsRawFd;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: `attr` is a valid `struct mount_attr` whose size is passed; the empty path with
    // AT_EMPTY_PATH names the descriptor itself.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })?;
    // SAFETY: as above; the target path is NUL-terminated and outlives the call.
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    })?;
    Ok(())
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
        let code = tmp.path().join("code");
        std::fs::create_dir(&point).unwrap();
        std::fs::create_dir(&code).unwrap();
        std::fs::write(code.join("main.py"), "x = 1\n").unwrap();
        prepare_mount_point(&point).unwrap();
        mount_code(&code, &point).unwrap();
        assert_eq!(
            std::fs::read_to_string(point.join("main.py")).unwrap(),
            "x = 1\n"
        );
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
