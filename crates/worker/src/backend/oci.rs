//! OCI runtime spec (`config.json`) for one runc sandbox, plus the host-side helpers that go
//! with it: the shared base rootfs and the cgroup v1 OOM counter. Measured and explained in
//! `docs/sandboxes.md`.
//!
//! The spec targets runc 1.1 with the cgroupfs driver on a cgroup v1 (hybrid) host, running as
//! root without a user namespace.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// Inputs for one sandbox's OCI runtime spec.
pub struct OciParams<'a> {
    /// The runtime image's root file system on the host: `/usr` and `/etc` are bound from it
    /// (read-only), so nothing of the host's own software or configuration is visible.
    pub runtime_root: &'a Path,
    /// The sandbox's root (absolute): a small tmpfs of its own laid out by
    /// [`prepare_base_rootfs`], holding the agent at [`AGENT_MOUNT`]; read-only inside.
    pub rootfs: &'a Path,
    /// Host mount point bound read-only at [`CODE_MOUNT`]: the function's code as an overlay
    /// or, for a generic sandbox, the empty tmpfs its code is later mounted onto
    /// ([`super::code_mount`]). Never a plain directory, whose path mountinfo would show.
    pub code_dir: &'a Path,
    /// Host per-sandbox dir, read-write at [`RUN_MOUNT`]; must be writable by `uid`.
    pub run_dir: &'a Path,
    /// `module.function` for `HEARTH_HANDLER`.
    pub handler: &'a str,
    /// User-supplied environment; reserved keys (`PATH`, `HEARTH_*`) and malformed pairs are dropped.
    pub env: &'a [(String, String)],
    /// Memory limit in MiB; 0 means no limit.
    pub memory_mb: u64,
    /// CPU quota in CPUs (0.5 = half a CPU); 0 or less means no quota.
    pub cpus: f64,
    /// `cpu.shares` (CPU in proportion to memory); None: the kernel's default weight.
    pub cpu_shares: Option<u64>,
    /// `cpuset.cpus` (`runc.cpuset`, canonical list); None: any CPU.
    pub cpuset: Option<&'a str>,
    /// The sandbox's own uid and gid, from the worker's range (`runc.uid_base`): per-uid
    /// kernel limits (inotify instances, POSIX mqueue bytes, pending signals) are then per
    /// sandbox, and no other host process shares its identity.
    pub uid: u32,
    pub gid: u32,
    /// `/hearth/<worker>/<sandbox>`: absolute, i.e. from each cgroup v1 hierarchy's root (a
    /// relative path would nest under runc's own cgroup).
    pub cgroups_path: &'a str,
    /// Size of the private `/tmp` tmpfs in MiB.
    pub tmp_size_mb: u64,
    /// `HEARTH_MAX_RESULT_BYTES`: the agent refuses larger results itself.
    pub max_result_bytes: usize,
    /// Inodes (files, directories) of `/tmp`, and separately of `/dev/shm`.
    pub tmp_inodes: u64,
    /// A generic sandbox (no function yet): the agent starts without a handler
    /// (`HEARTH_GENERIC=1`, no user env), and `code_dir` is a shared mount point bound as a
    /// slave, onto which the worker later mounts the function's code ([`super::code_mount`]).
    pub generic: bool,
    /// A GPU sandbox: its device nodes, the driver's libraries and the CUDA shim. Never
    /// generic (GPU sandboxes are not pooled).
    pub gpu: Option<&'a GpuParams>,
    /// Host mount point bound read-only at [`DEPS_MOUNT`] (`HEARTH_DEPS`): the function's
    /// dependency layer as an overlay named by descriptor, like the code
    /// ([`super::code_mount`]); None without a layer.
    pub deps_dir: Option<&'a Path>,
    /// Modules a generic sandbox imports before it reports ready (`HEARTH_PREIMPORT`), already
    /// checked by [`preimport_list`]; ignored unless `generic`.
    pub preimport: &'a str,
}

/// Where a dependency layer's packages appear in a sandbox.
pub use crate::layers::DEPS_MOUNT;

/// The most modules a generic sandbox pre-imports, and the longest name.
pub const MAX_PREIMPORT: usize = 64;
const MAX_MODULE_NAME: usize = 200;

/// Whether `name` is a dotted Python identifier (ASCII), as `HEARTH_PREIMPORT` carries them.
pub fn valid_module_name(name: &str) -> bool {
    name.len() <= MAX_MODULE_NAME
        && name.split('.').all(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// `HEARTH_PREIMPORT`'s value for a layer's modules: the valid names (dotted identifiers), at
/// most [`MAX_PREIMPORT`], comma-separated. A layer's record is the worker's own, but a package
/// names its modules itself: nothing else may reach the agent's environment.
pub fn preimport_list(modules: &[String]) -> String {
    let names: Vec<&str> = modules
        .iter()
        .map(String::as_str)
        .filter(|m| valid_module_name(m))
        .take(MAX_PREIMPORT)
        .collect();
    names.join(",")
}

/// A character device of the host given to a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNode {
    /// Its path, the same on the host and in the sandbox (`/dev/nvidiactl`).
    pub path: String,
    pub major: u32,
    pub minor: u32,
}

/// What a GPU sandbox adds to its spec ([`super::gpu_host`] reads it from the host).
#[derive(Debug, Clone)]
pub struct GpuParams {
    /// The nodes of the control device, unified memory, and the sandbox's one GPU.
    pub devices: Vec<DeviceNode>,
    /// The driver's user-space libraries: (file name in [`GPU_LIB_DIR`], host file).
    pub libraries: Vec<(String, PathBuf)>,
    /// The CUDA shim on the host, preloaded into the agent from [`SHIM_MOUNT`].
    pub shim: PathBuf,
}

/// Where the function's code appears inside the sandbox.
pub const CODE_MOUNT: &str = "/code";
/// The agent's directory inside the sandbox (in its root tmpfs).
pub const AGENT_MOUNT: &str = "/hearth/agent";
/// The agent script's name in [`AGENT_MOUNT`].
pub const AGENT_FILE: &str = "hearth_agent.py";
/// Where the per-sandbox run dir appears inside the sandbox.
pub const RUN_MOUNT: &str = "/hearth/run";
/// The agent's Unix socket inside the sandbox; on the host it is `<run_dir>/agent.sock`.
pub const AGENT_SOCKET: &str = "/hearth/run/agent.sock";
/// Name of the agent's socket file in the run dir (host side).
pub const AGENT_SOCKET_NAME: &str = "agent.sock";
/// Process of the sandbox: `-I` (isolated: no user site, ignores `PYTHON*` env) and `-S` (no
/// `site` import) keep interpreter start-up near 14 ms. Because `-I` ignores
/// `PYTHONUNBUFFERED`, the agent must flush its own output.
///
/// The interpreter first runs [`AGENT_BOOT`] (`-c`), which locks file writes with Landlock and
/// then runs the agent script (the last argument) as `__main__`.
pub const AGENT_ARGS: [&str; 6] = [
    "/usr/bin/python3",
    "-I",
    "-S",
    "-c",
    AGENT_BOOT,
    "/hearth/agent/hearth_agent.py",
];
/// What every sandbox runs before its agent: a Landlock ruleset (kernel 5.13+) that lets the
/// sandbox open files for writing only beneath `/tmp`, `/dev` (null, pts, shm, mqueue) and
/// `/hearth/run`; it is inherited by every child and exec and can never be lifted. It is what
/// keeps a sandbox from lowering its `oom_score_adj` (or writing any other `/proc` file):
/// the kernel lets a process lower it down to `oom_score_adj_min`, which only a writer with
/// `CAP_SYS_RESOURCE` sets, and a worker without that capability (a container, a systemd unit
/// with a bounding set) leaves it at 0 when runc writes 1000. A kernel without Landlock
/// (ENOSYS, EOPNOTSUPP) starts the agent unlocked; any other failure stops the sandbox.
/// It calls `syscall(2)` through `_ctypes` alone (the C module under `ctypes`): importing all
/// of `ctypes` took 3.4 ms of the cold path, `_ctypes` 0.5 ms.
pub const AGENT_BOOT: &str = r#"import sys
def _hearth_lock():
    import _ctypes, os, struct
    class Long(_ctypes._SimpleCData):
        _type_ = "l"
    class Fn(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = Long
    class Libc:
        _handle = _ctypes.dlopen(None, os.RTLD_NOW)
    call = Fn(("syscall", Libc))
    write = 2  # LANDLOCK_ACCESS_FS_WRITE_FILE
    ruleset = call(444, struct.pack("=Q", write), 8, 0)
    if ruleset < 0:
        err = _ctypes.get_errno()
        if err in (38, 95):
            return
        raise OSError(err, "landlock_create_ruleset")
    for path in ("/tmp", "/dev", "/dev/mqueue", "/hearth/run"):
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        if call(445, ruleset, 1, struct.pack("=Qi", write, fd), 0) < 0:
            raise OSError(_ctypes.get_errno(), "landlock_add_rule " + path)
        os.close(fd)
    if call(446, ruleset, 0) < 0:
        raise OSError(_ctypes.get_errno(), "landlock_restrict_self")
    os.close(ruleset)
_hearth_lock()
del _hearth_lock
sys.argv = sys.argv[1:]
__file__ = sys.argv[0]
with open(__file__, "rb") as _f:
    _code = compile(_f.read(), __file__, "exec")
del _f
exec(_code)
"#;
/// A GPU sandbox's own tmpfs for the mount points of the driver's libraries and the shim (the
/// shared rootfs is never written to), and the directory `LD_LIBRARY_PATH` names first.
pub const GPU_MOUNT: &str = "/hearth/gpu";
pub const GPU_LIB_DIR: &str = "/hearth/gpu/lib";
/// The CUDA shim inside a GPU sandbox (`LD_PRELOAD`).
pub const SHIM_MOUNT: &str = "/hearth/gpu/libhearth_cuda_shim.so";
/// Environment keys a GPU sandbox's user env may not set: the shim must stay preloaded, and
/// the one device inside is ordinal 0. (`LD_LIBRARY_PATH` is appended to, not replaced.)
pub const GPU_RESERVED_ENV: [&str; 2] = ["LD_PRELOAD", "CUDA_VISIBLE_DEVICES"];
/// Mode of device nodes created in a sandbox: the sandbox user opens them; the cgroup device
/// rules decide which exist for it.
const DEVICE_FILE_MODE: u32 = 0o666;
/// `PATH` inside the sandbox; `/bin` is a symlink to `usr/bin`.
pub const SANDBOX_PATH: &str = "/usr/bin:/bin";
/// CFS period; the quota is `cpus` times this.
pub const CPU_PERIOD_US: u64 = 100_000;
/// The kernel rejects CFS quotas below 1 ms.
const MIN_CPU_QUOTA_US: i64 = 1_000;
/// Cap on tasks (processes and threads) per sandbox: stops fork bombs. Python handlers use a
/// few threads (a thread pool defaults to at most 32 workers).
pub const PIDS_LIMIT: i64 = 128;
/// RLIMIT_NOFILE soft and hard limit, per process. With [`PIDS_LIMIT`] it bounds what one
/// sandbox can hold open host-wide to 128 × 256 = 32,768 files (see [`SANDBOX_FILES_BOUND`]),
/// where 256 × 1024 let one sandbox take 8 % of a 2.4 M `fs.file-max`.
pub const NOFILE_LIMIT: u64 = 256;
/// The most files one sandbox's processes can hold open together: 1.3 % of `fs.file-max` on a
/// host with 24 GiB of memory (the kernel's default `file-max` is about one file per 10 KiB
/// of memory).
pub const SANDBOX_FILES_BOUND: u64 = PIDS_LIMIT as u64 * NOFILE_LIMIT;
/// RLIMIT_MSGQUEUE (bytes of POSIX message queues, counted per uid): room for one queue of the
/// kernel's default size (10 messages of 8 KiB) and little more, where the default is 800 KiB.
pub const MSGQUEUE_LIMIT: u64 = 128 * 1024;
/// The hostname inside every sandbox: nothing of the worker's.
pub const SANDBOX_HOSTNAME: &str = "sandbox";
/// Size of the `/dev` and `/dev/shm` tmpfs mounts (runc's defaults).
const DEV_TMPFS_SIZE: &str = "size=65536k";
/// Global-OOM preference: the host kernel kills a sandbox before the worker. Memory-cgroup OOM
/// (the sandbox's own limit) only ever picks tasks inside the sandbox anyway.
const OOM_SCORE_ADJ: i64 = 1000;
/// Mount point of the cgroup v1 hierarchies on the host.
pub const CGROUP_V1_ROOT: &str = "/sys/fs/cgroup";

/// Empty directories of the base rootfs: every mount destination must exist beforehand, because
/// runc creates missing ones by writing into the (shared) rootfs before making it read-only.
const BASE_DIRS: &[&str] = &[
    "usr",
    "etc",
    "code",
    "hearth",
    "hearth/agent",
    "hearth/run",
    "hearth/gpu",
    "hearth/deps",
    "tmp",
    "proc",
    "dev",
    "sys",
];
/// usr-merge symlinks of the host (Debian 12), so `/bin/sh` or `/lib64/ld-linux-x86-64.so.2`
/// resolve through the `/usr` bind mount.
const BASE_LINKS: &[(&str, &str)] = &[
    ("bin", "usr/bin"),
    ("lib", "usr/lib"),
    ("lib64", "usr/lib64"),
    ("sbin", "usr/sbin"),
];
/// runc chmods a tmpfs mount to the mode of the directory it covers (ignoring `mode=`), so the
/// base `tmp` directory itself must be world-writable and sticky.
const BASE_TMP_MODE: u32 = 0o1777;

/// Syscalls allowed unconditionally: the moby/containerd default seccomp allow-list, resolved for
/// x86_64 with no capabilities and kernel >= 4.8 (so `ptrace` and `process_vm_*` are in).
/// Names of 32-bit-only syscalls are left out because the profile admits only the x86_64 ABI.
///
/// Compared with moby's current default profile (`github.com/moby/profiles`,
/// `seccomp/default.json` at commit cd3bed80, 2026-06-30), which no longer allows:
/// * `io_uring_setup`, `io_uring_enter`, `io_uring_register` — removed in moby/profiles commit
///   0e2acd4 (2023-11-02, "seccomp: block io_uring_* syscalls in default profile", following
///   containerd): io_uring has been the source of many kernel exploits, and ChromeOS, Android
///   and Google's servers turn it off;
/// * `socket(AF_ALG, ...)` — commit dec315c (2026-04-30): the kernel crypto API; see
///   [`SOCKET_DENIED_FAMILIES`].
///
/// Syscalls the current profile added since (`cachestat`, `fchmodat2`, `futex_wait`,
/// `futex_wake`, `futex_requeue`, `map_shadow_stack`, `mseal`, `listmount`, `statmount`,
/// `*xattrat`, `uretprobe`) are not listed: runc 1.1.5's libseccomp does not know their names,
/// and runc answers syscalls newer than any it knows with ENOSYS, which libc falls back from.
const SECCOMP_ALLOW: &str = "\
    accept accept4 access adjtimex alarm bind brk capget capset chdir chmod chown clock_adjtime \
    clock_getres clock_gettime clock_nanosleep close close_range connect copy_file_range creat \
    dup dup2 dup3 epoll_create epoll_create1 epoll_ctl epoll_ctl_old epoll_pwait epoll_pwait2 \
    epoll_wait epoll_wait_old eventfd eventfd2 execve execveat exit exit_group faccessat \
    faccessat2 fadvise64 fallocate fanotify_mark fchdir fchmod fchmodat fchown fchownat fcntl \
    fdatasync fgetxattr flistxattr flock fork fremovexattr fsetxattr fstat fstatfs fsync \
    ftruncate futex futex_waitv futimesat getcpu getcwd getdents getdents64 getegid geteuid \
    getgid getgroups getitimer getpeername getpgid getpgrp getpid getppid getpriority getrandom \
    getresgid getresuid getrlimit get_robust_list getrusage getsid getsockname getsockopt \
    get_thread_area gettid gettimeofday getuid getxattr inotify_add_watch inotify_init \
    inotify_init1 inotify_rm_watch io_cancel ioctl io_destroy io_getevents io_pgetevents \
    ioprio_get ioprio_set io_setup io_submit \
    kill landlock_add_rule landlock_create_ruleset landlock_restrict_self lchown lgetxattr link \
    linkat listen listxattr llistxattr lremovexattr lseek lsetxattr lstat madvise membarrier \
    memfd_create memfd_secret mincore mkdir mkdirat mknod mknodat mlock mlock2 mlockall mmap \
    mprotect mq_getsetattr mq_notify mq_open mq_timedreceive mq_timedsend mq_unlink mremap \
    msgctl msgget msgrcv msgsnd msync munlock munlockall munmap name_to_handle_at nanosleep \
    newfstatat open openat openat2 pause pidfd_open pidfd_send_signal pipe pipe2 pkey_alloc \
    pkey_free pkey_mprotect poll ppoll prctl pread64 preadv preadv2 prlimit64 process_mrelease \
    pselect6 pwrite64 pwritev pwritev2 read readahead readlink readlinkat readv recvfrom \
    recvmmsg recvmsg remap_file_pages removexattr rename renameat renameat2 restart_syscall \
    rmdir rseq rt_sigaction rt_sigpending rt_sigprocmask rt_sigqueueinfo rt_sigreturn \
    rt_sigsuspend rt_sigtimedwait rt_tgsigqueueinfo sched_getaffinity sched_getattr \
    sched_getparam sched_get_priority_max sched_get_priority_min sched_getscheduler \
    sched_rr_get_interval sched_setaffinity sched_setattr sched_setparam sched_setscheduler \
    sched_yield seccomp select semctl semget semop semtimedop sendfile sendmmsg sendmsg sendto \
    setfsgid setfsuid setgid setgroups setitimer setpgid setpriority setregid setresgid \
    setresuid setreuid setrlimit set_robust_list setsid setsockopt set_thread_area \
    set_tid_address setuid setxattr shmat shmctl shmdt shmget shutdown sigaltstack signalfd \
    signalfd4 socketpair splice stat statfs statx symlink symlinkat sync sync_file_range syncfs \
    sysinfo tee tgkill time timer_create timer_delete timer_getoverrun timer_gettime \
    timer_settime timerfd_create timerfd_gettime timerfd_settime times tkill truncate umask \
    uname unlink unlinkat utime utimensat utimes vfork vmsplice wait4 waitid write writev \
    process_vm_readv process_vm_writev ptrace arch_prctl modify_ldt";
/// `personality(2)` values the default profile allows (PER_LINUX, PER_LINUX32,
/// UNAME26, UNAME26|PER_LINUX32, query).
const SECCOMP_PERSONALITIES: [u64; 5] = [0, 8, 0x20000, 0x20008, 0xffff_ffff];
/// Namespace flags `clone(2)` may not carry without CAP_SYS_ADMIN (CLONE_NEWNS | NEWUTS | NEWIPC
/// | NEWUSER | NEWPID | NEWNET | NEWCGROUP).
const CLONE_NS_MASK: u64 = 0x7e02_0000;
/// `socket(2)` families refused by the default profile: AF_ALG (38, the kernel crypto API)
/// and AF_VSOCK (40). Allowed are `< 38`, `== 39` and `> 40`: seccomp ANDs the conditions of one
/// rule, so "neither 38 nor 40" needs three rules (as in moby's profile).
pub const SOCKET_DENIED_FAMILIES: [u64; 2] = [38, 40];
/// ENOSYS for `clone3`, so glibc falls back to `clone`, whose flags seccomp can inspect.
const ENOSYS: u64 = 38;

/// The seccomp section: docker's default profile (default action EPERM) for the x86_64 ABI only,
/// as of moby/profiles 2026-06 (see [`SECCOMP_ALLOW`]).
///
/// Listing only `SCMP_ARCH_X86_64` means i386 (`int 0x80`) and x32 syscalls kill the process
/// (SIGSYS) instead of being filtered; docker also admits those ABIs, but compiling the filter
/// for three ABIs made every `runc run` about 15 ms slower here.
pub fn seccomp_profile() -> Value {
    let mut rules = vec![json!({
        "names": SECCOMP_ALLOW.split_whitespace().collect::<Vec<_>>(),
        "action": "SCMP_ACT_ALLOW",
    })];
    let [alg, vsock] = SOCKET_DENIED_FAMILIES;
    for (value, op) in [
        (alg, "SCMP_CMP_LT"),
        (alg + 1, "SCMP_CMP_EQ"),
        (vsock, "SCMP_CMP_GT"),
    ] {
        rules.push(json!({
            "names": ["socket"],
            "action": "SCMP_ACT_ALLOW",
            "args": [{"index": 0, "value": value, "op": op}],
        }));
    }
    rules.extend(SECCOMP_PERSONALITIES.iter().map(|v| {
        json!({
            "names": ["personality"],
            "action": "SCMP_ACT_ALLOW",
            "args": [{"index": 0, "value": v, "op": "SCMP_CMP_EQ"}],
        })
    }));
    rules.push(json!({
        "names": ["clone"],
        "action": "SCMP_ACT_ALLOW",
        "args": [{"index": 0, "value": CLONE_NS_MASK, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}],
    }));
    rules.push(json!({
        "names": ["clone3"],
        "action": "SCMP_ACT_ERRNO",
        "errnoRet": ENOSYS,
    }));
    json!({
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": 1,
        "architectures": ["SCMP_ARCH_X86_64"],
        "syscalls": rules,
    })
}

/// Whether a user env key is one Hearth sets itself (duplicates in `environ` are ambiguous:
/// glibc's `getenv` and Python's `os.environ` both take the first).
fn reserved_env_key(key: &str) -> bool {
    key == "PATH" || key.starts_with("HEARTH_")
}

fn env_list(p: &OciParams) -> Vec<String> {
    let gpu = p.gpu.is_some();
    let mut env = vec![
        format!("PATH={SANDBOX_PATH}"),
        format!("HEARTH_SOCKET={AGENT_SOCKET}"),
        format!("HEARTH_CODE_DIR={CODE_MOUNT}"),
        if p.generic {
            "HEARTH_GENERIC=1".to_string()
        } else {
            format!("HEARTH_HANDLER={}", p.handler)
        },
        format!("HEARTH_MAX_RESULT_BYTES={}", p.max_result_bytes),
    ];
    if p.deps_dir.is_some() {
        env.push(format!("HEARTH_DEPS={DEPS_MOUNT}"));
        if p.generic && !p.preimport.is_empty() {
            env.push(format!("HEARTH_PREIMPORT={}", p.preimport));
        }
    }
    let user = p.env.iter().filter(|(k, v)| {
        user_env_allowed(k, v) && !(gpu && GPU_RESERVED_ENV.contains(&k.as_str()))
    });
    if !gpu {
        env.extend(user.map(|(k, v)| format!("{k}={v}")));
        return env;
    }
    // The loader takes the last LD_PRELOAD of the environment and getenv the first: no key
    // may appear twice, so the user's LD_LIBRARY_PATH is folded into Hearth's.
    let mut lib_path = GPU_LIB_DIR.to_string();
    let mut rest = Vec::new();
    for (k, v) in user {
        if k == "LD_LIBRARY_PATH" {
            if !v.is_empty() {
                lib_path.push(':');
                lib_path.push_str(v);
            }
        } else {
            rest.push(format!("{k}={v}"));
        }
    }
    env.extend([
        format!("LD_PRELOAD={SHIM_MOUNT}"),
        format!("LD_LIBRARY_PATH={lib_path}"),
        "CUDA_VISIBLE_DEVICES=0".to_string(),
    ]);
    env.extend(rest);
    env
}

/// Whether a user's env pair reaches the sandbox: reserved keys (`PATH`, `HEARTH_*`) and
/// malformed pairs are dropped. A generic sandbox gets the pairs when it is specialized.
pub fn user_env_allowed(key: &str, value: &str) -> bool {
    !key.is_empty()
        && !key.contains('=')
        && !key.contains('\0')
        && !value.contains('\0')
        && !reserved_env_key(key)
}

fn bind(dest: &str, src: &Path, writable: bool) -> Value {
    let mut options = vec![
        "rbind",
        if writable { "rw" } else { "ro" },
        "nosuid",
        "nodev",
    ];
    if writable {
        options.push("noexec");
    }
    json!({
        "destination": dest,
        "type": "bind",
        "source": src.to_string_lossy(),
        "options": options,
    })
}

fn mounts(p: &OciParams) -> Vec<Value> {
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc",
               "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "strictatime", "mode=755", DEV_TMPFS_SIZE]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
               "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
               "options": ["nosuid", "noexec", "nodev", "mode=1777", DEV_TMPFS_SIZE,
                           format!("nr_inodes={}", p.tmp_inodes)]}),
        json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
               "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs",
               "options": ["nosuid", "noexec", "nodev", "ro"]}),
        // cgroup v1: runc mounts a tmpfs with the sandbox's own cgroup of each controller bound
        // read-only, so libraries can read their memory and CPU limits.
        json!({"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
               "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]}),
        bind("/usr", &p.runtime_root.join("usr"), false),
        bind("/etc", &p.runtime_root.join("etc"), false),
        if p.generic {
            let mut code = bind(CODE_MOUNT, p.code_dir, false);
            if let Some(o) = code["options"].as_array_mut() {
                o.push(json!("rslave"));
            }
            code
        } else {
            bind(CODE_MOUNT, p.code_dir, false)
        },
        bind(RUN_MOUNT, p.run_dir, true),
    ];
    if let Some(deps) = p.deps_dir {
        mounts.push(bind(DEPS_MOUNT, deps, false));
    }
    mounts.extend([
        json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "nodev", "mode=1777", format!("size={}m", p.tmp_size_mb),
                           format!("nr_inodes={}", p.tmp_inodes)]}),
    ]);
    if let Some(gpu) = p.gpu {
        mounts.extend(gpu_mounts(gpu));
    }
    mounts
}

/// A GPU sandbox's tmpfs at [`GPU_MOUNT`], then the shim and each driver library bound
/// read-only onto mount points runc makes in it. The tmpfs is root's (mode 755): the sandbox
/// user cannot add files; each bind carries its own flags (no `noexec`: they are mapped as
/// code).
fn gpu_mounts(gpu: &GpuParams) -> Vec<Value> {
    // A mount point per file, a directory, and room to spare.
    let inodes = gpu.libraries.len() + 16;
    let mut mounts = vec![
        json!({"destination": GPU_MOUNT, "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "nodev", "noexec", "mode=755", "size=64k",
                           format!("nr_inodes={inodes}")]}),
        bind(SHIM_MOUNT, &gpu.shim, false),
    ];
    mounts.extend(
        gpu.libraries
            .iter()
            .map(|(name, file)| bind(&format!("{GPU_LIB_DIR}/{name}"), file, false)),
    );
    mounts
}

/// `linux.devices` of a GPU sandbox: its nodes, made by runc in the sandbox's `/dev`.
fn device_nodes(p: &OciParams) -> Vec<Value> {
    p.gpu
        .map(|gpu| {
            gpu.devices
                .iter()
                .map(|d| {
                    json!({"path": d.path, "type": "c", "major": d.major, "minor": d.minor,
                           "fileMode": DEVICE_FILE_MODE, "uid": 0, "gid": 0})
                })
                .collect()
        })
        .unwrap_or_default()
}

fn resources(p: &OciParams) -> Value {
    let mut devices = vec![json!({"allow": false, "access": "rwm"})];
    // A GPU sandbox's nodes and nothing else of the driver's (no other GPU's node).
    if let Some(gpu) = p.gpu {
        devices.extend(gpu.devices.iter().map(|d| {
            json!({"allow": true, "type": "c", "major": d.major, "minor": d.minor,
                   "access": "rwm"})
        }));
    }
    let mut res = json!({
        // Deny all devices; runc adds its default allow-list (null, zero, full, tty, random, ...).
        "devices": devices,
        "pids": {"limit": PIDS_LIMIT},
    });
    if p.memory_mb > 0 {
        // No "swap": runc accepts it here (memsw accounting is on), but without a swap device
        // it changes nothing, and leaving it out keeps the spec valid on kernels without
        // swap accounting (no memory.memsw.* files).
        res["memory"] = json!({"limit": p.memory_mb.saturating_mul(1024 * 1024)});
    }
    let mut cpu = serde_json::Map::new();
    if let Some(quota) = cpu_quota_us(p.cpus) {
        cpu.insert("period".into(), json!(CPU_PERIOD_US));
        cpu.insert("quota".into(), json!(quota));
    }
    if let Some(shares) = p.cpu_shares {
        cpu.insert("shares".into(), json!(shares));
    }
    if let Some(cpus) = p.cpuset {
        cpu.insert("cpus".into(), json!(cpus));
    }
    if !cpu.is_empty() {
        res["cpu"] = Value::Object(cpu);
    }
    res
}

/// The CFS quota for `cpus` CPUs per [`CPU_PERIOD_US`]; `None` for no quota.
pub fn cpu_quota_us(cpus: f64) -> Option<i64> {
    (cpus > 0.0 && cpus.is_finite())
        .then(|| ((cpus * CPU_PERIOD_US as f64).round() as i64).max(MIN_CPU_QUOTA_US))
}

/// The config.json value.
pub fn runtime_spec(p: &OciParams) -> Value {
    let mut spec = cpu_spec(p);
    if p.gpu.is_some() {
        spec["linux"]["devices"] = Value::Array(device_nodes(p));
    }
    spec
}

fn cpu_spec(p: &OciParams) -> Value {
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": p.uid, "gid": p.gid},
            "args": AGENT_ARGS,
            "env": env_list(p),
            "cwd": CODE_MOUNT,
            "capabilities": {
                "bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": [],
            },
            "rlimits": [
                {"type": "RLIMIT_NOFILE", "hard": NOFILE_LIMIT, "soft": NOFILE_LIMIT},
                {"type": "RLIMIT_MSGQUEUE", "hard": MSGQUEUE_LIMIT, "soft": MSGQUEUE_LIMIT},
            ],
            "noNewPrivileges": true,
            "oomScoreAdj": OOM_SCORE_ADJ,
        },
        "root": {"path": p.rootfs.to_string_lossy(), "readonly": true},
        "hostname": SANDBOX_HOSTNAME,
        "mounts": mounts(p),
        "linux": {
            "cgroupsPath": p.cgroups_path,
            "resources": resources(p),
            "namespaces": namespaces(),
            "maskedPaths": MASKED_PATHS,
            "readonlyPaths": READONLY_PATHS,
            "seccomp": seccomp_profile(),
        },
    })
}

/// What runc masks in every sandbox and build sandbox (its defaults, plus `/proc/scsi`,
/// `/sys/firmware` and the power-capping counters, which leak host energy use).
pub const MASKED_PATHS: [&str; 11] = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
/// What is read-only in every sandbox and build sandbox (runc's defaults).
pub const READONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The namespaces of every sandbox and build sandbox: a new network namespace has only
/// loopback (runc brings it up); "cgroup" hides the host cgroup paths (worker and sandbox ids)
/// from /proc/self/cgroup. No user namespace (docs/sandboxes.md).
pub fn namespaces() -> Value {
    json!([
        {"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"},
        {"type": "mount"}, {"type": "cgroup"},
    ])
}

/// Creates (idempotently) the shared base rootfs: empty mount-point dirs and the usr-merge symlinks.
pub fn prepare_base_rootfs(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{symlink, PermissionsExt};
    for d in BASE_DIRS {
        std::fs::create_dir_all(dir.join(d))?;
    }
    std::fs::set_permissions(
        dir.join("tmp"),
        std::fs::Permissions::from_mode(BASE_TMP_MODE),
    )?;
    // runc gives a tmpfs the mode of the directory it covers: GPU sandboxes' must stay root's.
    std::fs::set_permissions(
        dir.join(GPU_MOUNT.trim_start_matches('/')),
        std::fs::Permissions::from_mode(0o755),
    )?;
    for (link, target) in BASE_LINKS {
        let path = dir.join(link);
        match std::fs::read_link(&path) {
            Ok(t) if t == Path::new(target) => continue,
            Ok(_) => std::fs::remove_file(&path)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        symlink(target, &path)?;
    }
    Ok(())
}

/// The directory of `cgroups_path` in the cgroup v1 hierarchy `controller` (e.g. "memory").
pub fn cgroup_v1_dir(controller: &str, cgroups_path: &str) -> PathBuf {
    Path::new(CGROUP_V1_ROOT)
        .join(controller)
        .join(cgroups_path.trim_start_matches('/'))
}

/// The cgroup v1 freezer's control file of a sandbox: writing `FROZEN` stops every task in it
/// (the kernel freezes new children too), `THAWED` resumes them. The sandbox cannot write it: it
/// is root's, and `/sys/fs/cgroup` is read-only inside.
pub fn freezer_state_path(cgroups_path: &str) -> PathBuf {
    cgroup_v1_dir("freezer", cgroups_path).join("freezer.state")
}

/// Parses the `oom_kill N` line of a cgroup v1 `memory.oom_control` file.
fn parse_oom_kill(oom_control: &str) -> Option<u64> {
    oom_control.lines().find_map(|line| {
        let mut it = line.split_whitespace();
        match (it.next(), it.next()) {
            (Some("oom_kill"), Some(n)) => n.parse().ok(),
            _ => None,
        }
    })
}

/// Reads the OOM-kill count of a sandbox's memory cgroup (cgroup v1), None if unavailable.
///
/// Read it after the sandbox's process died and before `runc delete`, which removes the cgroup.
/// A count above zero means the kernel killed a task of the sandbox for exceeding its limit.
pub fn oom_kill_count(cgroups_path: &str) -> Option<u64> {
    let path = cgroup_v1_dir("memory", cgroups_path).join("memory.oom_control");
    parse_oom_kill(&std::fs::read_to_string(path).ok()?)
}

/// Removes the (empty) directory `cgroups_path` from every cgroup v1 hierarchy under
/// [`CGROUP_V1_ROOT`], including `name=systemd` and the hybrid `unified` one. runc's
/// `delete` removes only the sandbox's own directories, so a worker uses this on start-up and
/// shutdown for its parent (`/hearth/<worker>`, then `/hearth`). Returns how many were removed;
/// a directory that still has children or tasks fails with EBUSY.
pub fn remove_cgroup_dirs(cgroups_path: &str) -> std::io::Result<usize> {
    let rel = cgroups_path.trim_matches('/');
    if rel.is_empty() {
        return Ok(0);
    }
    let mut removed = 0;
    for entry in std::fs::read_dir(CGROUP_V1_ROOT)? {
        let dir = entry?.path().join(rel);
        match std::fs::remove_dir(&dir) {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params<'a>(env: &'a [(String, String)]) -> OciParams<'a> {
        OciParams {
            runtime_root: Path::new("/var/lib/hearth/runtimes/ab/rootfs"),
            rootfs: Path::new("/data/sandboxes/1/rootfs"),
            code_dir: Path::new("/data/sandboxes/1/code"),
            run_dir: Path::new("/data/run/s1"),
            handler: "main.main",
            env,
            memory_mb: 128,
            cpus: 0.5,
            cpu_shares: None,
            cpuset: None,
            uid: 65534,
            gid: 65534,
            cgroups_path: "/hearth/w1/s1",
            max_result_bytes: 6 * 1024 * 1024,
            tmp_size_mb: 64,
            tmp_inodes: 4096,
            generic: false,
            gpu: None,
            deps_dir: None,
            preimport: "",
        }
    }

    fn mount<'a>(spec: &'a Value, dest: &str) -> &'a Value {
        spec["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["destination"] == dest)
            .unwrap_or_else(|| panic!("no mount at {dest}"))
    }

    fn env_of(spec: &Value) -> Vec<&str> {
        spec["process"]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap())
            .collect()
    }

    fn options(m: &Value) -> Vec<&str> {
        m["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o.as_str().unwrap())
            .collect()
    }

    #[test]
    fn root_is_shared_and_readonly() {
        let spec = runtime_spec(&params(&[]));
        assert_eq!(spec["ociVersion"], "1.0.2");
        assert_eq!(spec["root"]["path"], "/data/sandboxes/1/rootfs");
        assert_eq!(spec["root"]["readonly"], true);
        assert_eq!(spec["hostname"], "sandbox");
    }

    #[test]
    fn mounts_are_in_place() {
        let spec = runtime_spec(&params(&[]));
        for (dest, src, rw) in [
            ("/usr", "/var/lib/hearth/runtimes/ab/rootfs/usr", false),
            ("/etc", "/var/lib/hearth/runtimes/ab/rootfs/etc", false),
            ("/code", "/data/sandboxes/1/code", false),
            ("/hearth/run", "/data/run/s1", true),
        ] {
            let m = mount(&spec, dest);
            assert_eq!(m["type"], "bind");
            assert_eq!(m["source"], src);
            let o = options(m);
            assert!(o.contains(&"rbind") && o.contains(&"nosuid") && o.contains(&"nodev"));
            assert_eq!(o.contains(&"rw"), rw, "{dest}");
            assert_eq!(o.contains(&"ro"), !rw, "{dest}");
        }
        let tmp = mount(&spec, "/tmp");
        assert_eq!(tmp["type"], "tmpfs");
        assert!(options(tmp).contains(&"size=64m"));
        assert!(options(tmp).contains(&"nr_inodes=4096"));
        assert!(options(mount(&spec, "/dev/shm")).contains(&"nr_inodes=4096"));
        for dest in [
            "/proc",
            "/dev",
            "/dev/pts",
            "/dev/shm",
            "/dev/mqueue",
            "/sys",
        ] {
            mount(&spec, dest);
        }
        assert!(options(mount(&spec, "/sys")).contains(&"ro"));
        // Every destination must already exist in the base rootfs or under a mount made first.
        for m in spec["mounts"].as_array().unwrap() {
            let dest = m["destination"].as_str().unwrap().trim_start_matches('/');
            let top = dest.split('/').next().unwrap();
            assert!(
                BASE_DIRS.contains(&dest) || BASE_DIRS.contains(&top),
                "{dest}"
            );
        }
    }

    #[test]
    fn process_is_unprivileged() {
        let spec = runtime_spec(&params(&[]));
        let proc = &spec["process"];
        assert_eq!(proc["user"]["uid"], 65534);
        assert_eq!(proc["user"]["gid"], 65534);
        assert_eq!(proc["noNewPrivileges"], true);
        assert_eq!(proc["terminal"], false);
        for set in [
            "bounding",
            "effective",
            "inheritable",
            "permitted",
            "ambient",
        ] {
            assert_eq!(proc["capabilities"][set], json!([]), "{set}");
        }
        assert_eq!(proc["args"], json!(AGENT_ARGS));
        assert_eq!(proc["cwd"], "/code");
        assert_eq!(proc["rlimits"][0]["type"], "RLIMIT_NOFILE");
        assert_eq!(proc["rlimits"][0]["hard"], 256);
        assert_eq!(proc["rlimits"][1]["type"], "RLIMIT_MSGQUEUE");
        assert_eq!(proc["rlimits"][1]["hard"], 128 * 1024);
        assert_eq!(SANDBOX_FILES_BOUND, 32_768);
    }

    #[test]
    fn a_generic_sandbox_starts_without_a_function_and_binds_code_as_a_slave() {
        let user = vec![("FOO".to_string(), "bar".to_string())];
        let mut p = params(&user);
        p.generic = true;
        let spec = runtime_spec(&p);
        let env = env_of(&spec);
        assert!(env.contains(&"HEARTH_GENERIC=1"));
        assert!(!env.iter().any(|e| e.starts_with("HEARTH_HANDLER=")));
        let code = options(mount(&spec, "/code"));
        assert!(code.contains(&"rslave") && code.contains(&"ro"), "{code:?}");
        // A function's sandbox keeps the host's mounts private to it.
        let spec = runtime_spec(&params(&user));
        assert!(!options(mount(&spec, "/code")).contains(&"rslave"));
    }

    #[test]
    fn a_layer_is_bound_read_only_and_only_a_generic_sandbox_preimports() {
        let user = vec![("HEARTH_DEPS".to_string(), "/evil".to_string())];
        let spec = runtime_spec(&params(&user));
        assert!(!env_of(&spec).iter().any(|e| e.starts_with("HEARTH_DEPS")));
        assert!(spec["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["destination"] != DEPS_MOUNT));
        let mut p = params(&user);
        p.deps_dir = Some(Path::new("/data/sandboxes/1/deps"));
        p.preimport = "numpy,PIL";
        let spec = runtime_spec(&p);
        let env = env_of(&spec);
        assert!(env.contains(&"HEARTH_DEPS=/hearth/deps"), "{env:?}");
        assert!(!env.iter().any(|e| e.starts_with("HEARTH_PREIMPORT")));
        assert_eq!(
            env.iter().filter(|e| e.starts_with("HEARTH_DEPS")).count(),
            1
        );
        let deps = mount(&spec, DEPS_MOUNT);
        assert_eq!(deps["source"], "/data/sandboxes/1/deps");
        for o in ["ro", "nosuid", "nodev"] {
            assert!(options(deps).contains(&o), "{deps}");
        }
        p.generic = true;
        let env = env_of(&runtime_spec(&p)).join(" ");
        assert!(env.contains("HEARTH_PREIMPORT=numpy,PIL"), "{env}");
    }

    #[test]
    fn preimport_lists_only_dotted_identifiers() {
        let names: Vec<String> = [
            "numpy", "PIL", "a.b_c", "_x", "9bad", "a..b", "a b", "x,y", "", "é", "ok.",
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        assert_eq!(preimport_list(&names), "numpy,PIL,a.b_c,_x");
        let many: Vec<String> = (0..100).map(|i| format!("m{i}")).collect();
        assert_eq!(preimport_list(&many).split(',').count(), MAX_PREIMPORT);
        assert!(!valid_module_name(&"a".repeat(201)));
    }

    #[test]
    fn env_has_agent_settings_and_filters_user_pairs() {
        let user = vec![
            ("FOO".to_string(), "bar=baz".to_string()),
            ("PATH".to_string(), "/evil".to_string()),
            ("HEARTH_HANDLER".to_string(), "x.y".to_string()),
            ("A=B".to_string(), "c".to_string()),
            (String::new(), "c".to_string()),
            ("NUL".to_string(), "a\0b".to_string()),
        ];
        let spec = runtime_spec(&params(&user));
        let env = env_of(&spec);
        assert_eq!(
            env,
            [
                "PATH=/usr/bin:/bin",
                "HEARTH_SOCKET=/hearth/run/agent.sock",
                "HEARTH_CODE_DIR=/code",
                "HEARTH_HANDLER=main.main",
                "HEARTH_MAX_RESULT_BYTES=6291456",
                "FOO=bar=baz",
            ]
        );
    }

    #[test]
    fn limits_and_cgroup_path() {
        let spec = runtime_spec(&params(&[]));
        let linux = &spec["linux"];
        assert_eq!(linux["cgroupsPath"], "/hearth/w1/s1");
        let res = &linux["resources"];
        assert_eq!(res["memory"]["limit"], 128u64 * 1024 * 1024);
        assert!(res["memory"].get("swap").is_none());
        assert_eq!(res["cpu"]["period"], 100_000);
        assert_eq!(res["cpu"]["quota"], 50_000);
        assert_eq!(res["pids"]["limit"], PIDS_LIMIT);
        assert_eq!(res["devices"][0]["allow"], false);
    }

    #[test]
    fn cpu_quota_edges() {
        let env = [];
        let mut p = params(&env);
        p.cpus = 2.0;
        assert_eq!(resources(&p)["cpu"]["quota"], 200_000);
        p.cpus = 0.001;
        assert_eq!(resources(&p)["cpu"]["quota"], MIN_CPU_QUOTA_US);
        p.cpus = 0.0;
        assert!(resources(&p).get("cpu").is_none());
        p.cpus = f64::NAN;
        assert!(resources(&p).get("cpu").is_none());
        p.memory_mb = 0;
        assert!(resources(&p).get("memory").is_none());
    }

    #[test]
    fn cpu_shares_follow_memory_when_asked() {
        let env = [];
        let mut p = params(&env);
        assert!(resources(&p)["cpu"].get("shares").is_none());
        p.cpu_shares = Some(512);
        assert_eq!(resources(&p)["cpu"]["shares"], 512);
        assert_eq!(resources(&p)["cpu"]["quota"], 50_000, "the quota stays");
        p.cpus = 0.0;
        assert_eq!(resources(&p)["cpu"], json!({"shares": 512}));
    }

    #[test]
    fn a_cpuset_pins_the_sandbox_beside_its_other_cpu_limits() {
        let env = [];
        let mut p = params(&env);
        assert!(resources(&p)["cpu"].get("cpus").is_none());
        p.cpuset = Some("1");
        assert_eq!(resources(&p)["cpu"]["cpus"], "1");
        assert_eq!(resources(&p)["cpu"]["quota"], 50_000, "the quota stays");
        p.cpus = 0.0;
        p.cpu_shares = Some(256);
        assert_eq!(resources(&p)["cpu"], json!({"shares": 256, "cpus": "1"}));
    }

    #[test]
    fn namespaces_without_user_ns() {
        let spec = runtime_spec(&params(&[]));
        let ns: Vec<&str> = spec["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["type"].as_str().unwrap())
            .collect();
        for t in ["pid", "network", "ipc", "uts", "mount", "cgroup"] {
            assert!(ns.contains(&t), "{t}");
        }
        assert!(!ns.contains(&"user"));
        assert!(spec["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n.get("path").is_none()));
    }

    #[test]
    fn seccomp_is_default_deny_allow_list() {
        let spec = runtime_spec(&params(&[]));
        let sc = &spec["linux"]["seccomp"];
        assert_eq!(sc["defaultAction"], "SCMP_ACT_ERRNO");
        assert_eq!(sc["architectures"], json!(["SCMP_ARCH_X86_64"]));
        let allowed: Vec<&str> = sc["syscalls"][0]["names"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap())
            .collect();
        for name in [
            "read",
            "mmap",
            "futex",
            "bind",
            "rt_sigreturn",
            "exit_group",
        ] {
            assert!(allowed.contains(&name), "{name} missing from allow-list");
        }
        let rules = sc["syscalls"].as_array().unwrap();
        // socket(family) is allowed for every family but AF_ALG (38) and AF_VSOCK (40).
        let socket_allowed = |family: u64| {
            rules
                .iter()
                .filter(|r| r["names"] == json!(["socket"]))
                .any(|r| {
                    let a = &r["args"][0];
                    let v = a["value"].as_u64().unwrap();
                    match a["op"].as_str().unwrap() {
                        "SCMP_CMP_LT" => family < v,
                        "SCMP_CMP_EQ" => family == v,
                        "SCMP_CMP_GT" => family > v,
                        op => panic!("unexpected op {op}"),
                    }
                })
        };
        for family in [1, 2, 10, 16, 37, 39, 41, 45] {
            assert!(socket_allowed(family), "family {family}");
        }
        assert!(!socket_allowed(38) && !socket_allowed(40));
        for name in [
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "mount",
            "unshare",
            "setns",
            "bpf",
            "clone3",
            "kexec_load",
            "reboot",
        ] {
            assert!(!allowed.contains(&name), "{name} must not be allowed");
        }
        let mut dedup = allowed.clone();
        dedup.sort_unstable();
        dedup.dedup();
        assert_eq!(dedup.len(), allowed.len(), "duplicate syscall names");
        assert!(allowed.len() > 250);
        let clone3 = rules
            .iter()
            .find(|r| r["names"] == json!(["clone3"]))
            .unwrap();
        assert_eq!(clone3["errnoRet"], 38);
    }

    /// A host with two GPUs; the sandbox gets the second (`/dev/nvidia1`).
    fn gpu_params() -> GpuParams {
        let node = |path: &str, major, minor| DeviceNode {
            path: path.to_string(),
            major,
            minor,
        };
        GpuParams {
            devices: vec![
                node("/dev/nvidiactl", 195, 255),
                node("/dev/nvidia-uvm", 508, 0),
                node("/dev/nvidia1", 195, 1),
                node("/dev/nvidia-uvm-tools", 508, 1),
            ],
            libraries: vec![
                (
                    "libcuda.so.1".to_string(),
                    PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"),
                ),
                (
                    "libnvidia-ml.so.1".to_string(),
                    PathBuf::from("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15"),
                ),
            ],
            shim: PathBuf::from("/usr/local/lib/hearth/libhearth_cuda_shim.so"),
        }
    }

    #[test]
    fn a_gpu_sandbox_gets_its_nodes_allowed_and_no_other_device() {
        let gpu = gpu_params();
        let mut p = params(&[]);
        p.gpu = Some(&gpu);
        let spec = runtime_spec(&p);
        let nodes: Vec<(&str, u64, u64)> = spec["linux"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                assert_eq!(d["type"], "c");
                assert_eq!(d["fileMode"], 0o666);
                assert_eq!((&d["uid"], &d["gid"]), (&json!(0), &json!(0)));
                (
                    d["path"].as_str().unwrap(),
                    d["major"].as_u64().unwrap(),
                    d["minor"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            nodes,
            [
                ("/dev/nvidiactl", 195, 255),
                ("/dev/nvidia-uvm", 508, 0),
                ("/dev/nvidia1", 195, 1),
                ("/dev/nvidia-uvm-tools", 508, 1),
            ]
        );
        let rules = spec["linux"]["resources"]["devices"].as_array().unwrap();
        assert_eq!(
            rules[0],
            json!({"allow": false, "access": "rwm"}),
            "deny-all first"
        );
        let allowed: Vec<(u64, u64)> = rules[1..]
            .iter()
            .map(|r| {
                assert_eq!((&r["allow"], &r["type"]), (&json!(true), &json!("c")));
                assert_eq!(r["access"], "rwm");
                (r["major"].as_u64().unwrap(), r["minor"].as_u64().unwrap())
            })
            .collect();
        assert_eq!(allowed, [(195, 255), (508, 0), (195, 1), (508, 1)]);
        assert!(!allowed.contains(&(195, 0)), "another GPU's node");
        assert!(!nodes.iter().any(|n| n.0 == "/dev/nvidia0"));
        // A CPU sandbox has no node and only the deny-all rule.
        let cpu = runtime_spec(&params(&[]));
        assert!(cpu["linux"].get("devices").is_none());
        assert_eq!(
            cpu["linux"]["resources"]["devices"],
            json!([{"allow": false, "access": "rwm"}])
        );
    }

    #[test]
    fn a_gpu_sandboxs_libraries_and_shim_are_read_only_binds_in_its_own_tmpfs() {
        let gpu = gpu_params();
        let mut p = params(&[]);
        p.gpu = Some(&gpu);
        let spec = runtime_spec(&p);
        let all = spec["mounts"].as_array().unwrap();
        let at = |dest: &str| all.iter().position(|m| m["destination"] == dest).unwrap();
        let tmpfs = mount(&spec, GPU_MOUNT);
        assert_eq!(tmpfs["type"], "tmpfs");
        let o = options(tmpfs);
        assert!(o.contains(&"mode=755") && o.contains(&"nosuid") && o.contains(&"nodev"));
        assert!(BASE_DIRS.contains(&GPU_MOUNT.trim_start_matches('/')));
        for (dest, src) in [
            (SHIM_MOUNT, "/usr/local/lib/hearth/libhearth_cuda_shim.so"),
            (
                "/hearth/gpu/lib/libcuda.so.1",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
            ),
            (
                "/hearth/gpu/lib/libnvidia-ml.so.1",
                "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15",
            ),
        ] {
            let m = mount(&spec, dest);
            assert_eq!((&m["type"], &m["source"]), (&json!("bind"), &json!(src)));
            let o = options(m);
            assert!(o.contains(&"ro") && o.contains(&"nosuid") && o.contains(&"nodev"));
            assert!(
                !o.contains(&"rw") && !o.contains(&"noexec"),
                "{dest}: {o:?}"
            );
            assert!(at(dest) > at(GPU_MOUNT), "{dest} is bound after the tmpfs");
        }
        // Nothing else of the GPU's is mounted, and a CPU sandbox gets none of it.
        let gpu_dests = all
            .iter()
            .filter(|m| m["destination"].as_str().unwrap().starts_with(GPU_MOUNT))
            .count();
        assert_eq!(gpu_dests, 4);
        let cpu = runtime_spec(&params(&[]));
        assert!(!cpu["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["destination"].as_str().unwrap().starts_with(GPU_MOUNT)));
    }

    #[test]
    fn a_gpu_sandbox_preloads_the_shim_and_its_user_env_cannot_undo_it() {
        let user = vec![
            ("LD_PRELOAD".to_string(), "/code/evil.so".to_string()),
            ("CUDA_VISIBLE_DEVICES".to_string(), "1".to_string()),
            ("LD_LIBRARY_PATH".to_string(), "/code/lib".to_string()),
            ("FOO".to_string(), "bar".to_string()),
            ("HEARTH_SOCKET".to_string(), "/tmp/x".to_string()),
        ];
        let gpu = gpu_params();
        let mut p = params(&user);
        p.gpu = Some(&gpu);
        let spec = runtime_spec(&p);
        let env = env_of(&spec);
        assert_eq!(
            env,
            [
                "PATH=/usr/bin:/bin",
                "HEARTH_SOCKET=/hearth/run/agent.sock",
                "HEARTH_CODE_DIR=/code",
                "HEARTH_HANDLER=main.main",
                "HEARTH_MAX_RESULT_BYTES=6291456",
                "LD_PRELOAD=/hearth/gpu/libhearth_cuda_shim.so",
                "LD_LIBRARY_PATH=/hearth/gpu/lib:/code/lib",
                "CUDA_VISIBLE_DEVICES=0",
                "FOO=bar",
            ]
        );
        // Without a user LD_LIBRARY_PATH the driver's directory alone.
        let user = vec![("LD_LIBRARY_PATH".to_string(), String::new())];
        let mut p = params(&user);
        p.gpu = Some(&gpu);
        let spec = runtime_spec(&p);
        let env = env_of(&spec);
        assert!(env.contains(&"LD_LIBRARY_PATH=/hearth/gpu/lib"), "{env:?}");
        assert_eq!(
            env.iter()
                .filter(|e| e.starts_with("LD_LIBRARY_PATH="))
                .count(),
            1
        );
        // A CPU sandbox sets none of these.
        let spec = runtime_spec(&params(&[]));
        assert!(!env_of(&spec)
            .iter()
            .any(|e| e.starts_with("LD_") || e.starts_with("CUDA_")));
    }

    #[test]
    fn base_rootfs_is_idempotent() {
        let dir = std::env::temp_dir().join(format!("hearth-oci-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        prepare_base_rootfs(&dir).unwrap();
        prepare_base_rootfs(&dir).unwrap();
        for d in BASE_DIRS {
            assert!(dir.join(d).is_dir(), "{d}");
        }
        for (link, target) in BASE_LINKS {
            assert_eq!(
                std::fs::read_link(dir.join(link)).unwrap(),
                Path::new(target)
            );
        }
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join("tmp"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o1777);
        let gpu = std::fs::metadata(dir.join("hearth/gpu"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(gpu & 0o7777, 0o755, "GPU sandboxes' tmpfs stays root's");
        // A wrong symlink is replaced.
        std::fs::remove_file(dir.join("bin")).unwrap();
        std::os::unix::fs::symlink("elsewhere", dir.join("bin")).unwrap();
        prepare_base_rootfs(&dir).unwrap();
        assert_eq!(
            std::fs::read_link(dir.join("bin")).unwrap(),
            Path::new("usr/bin")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn oom_control_parsing() {
        let text = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(parse_oom_kill(text), Some(3));
        assert_eq!(parse_oom_kill("oom_kill_disable 0\nunder_oom 0\n"), None);
        assert_eq!(
            oom_kill_count("/hearth/no-such-worker/no-such-sandbox"),
            None
        );
        assert_eq!(
            cgroup_v1_dir("memory", "/hearth/w/s"),
            Path::new("/sys/fs/cgroup/memory/hearth/w/s")
        );
    }
}
