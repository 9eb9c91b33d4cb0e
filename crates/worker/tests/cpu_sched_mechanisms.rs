//! Measurement, not a test: which kernel mechanism lets a short task run ahead of spinning ones
//! (docs/alps-backend.md, "Why not real-time priorities"). Plain processes in cgroups, no runc:
//! four spinners, each in its own `cpu` group like a sandbox, and a thread that does 20 ms of CPU
//! every 30 ms in a sibling group; printed is that thread's wall time per burst with the
//! spinners' groups normal, at `cpu.shares` 2, at `cpu.idle` 1, and with the thread itself
//! `SCHED_FIFO` (its group granted real-time budget). Root and cgroup v1 `cpu` needed.
//!
//! `cargo test -p hearth-worker --release --test cpu_sched_mechanisms -- --ignored --nocapture`

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const BURST: Duration = Duration::from_millis(20);
const BURSTS: usize = 20;

fn cpu_group(rel: &str) -> PathBuf {
    Path::new("/sys/fs/cgroup/cpu").join(rel)
}

fn write(path: PathBuf, value: &str) {
    std::fs::write(&path, value).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The experiment's groups and spinners; everything is killed and removed when it goes.
struct Setup {
    parent: String,
    spinners: Vec<std::process::Child>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        for s in &mut self.spinners {
            let _ = s.kill();
            let _ = s.wait();
        }
        for g in ["s0", "s1", "s2", "s3", "q"] {
            let _ = std::fs::remove_dir(cpu_group(&format!("{}/{g}", self.parent)));
        }
        let _ = std::fs::write(cpu_group(&self.parent).join("cpu.rt_runtime_us"), "0");
        let _ = std::fs::remove_dir(cpu_group(&self.parent));
    }
}

/// Runs the bursts in group `q` (a thread of its own, real-time if `fifo`); p50 and max, ms.
fn bursts(parent: &str, fifo: bool) -> (f64, f64) {
    let q = cpu_group(&format!("{parent}/q"));
    std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        write(q.join("tasks"), &tid.to_string());
        if fifo {
            let p = libc::sched_param { sched_priority: 10 };
            // SAFETY: `p` is a valid sched_param; 0 is this thread.
            let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) };
            assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        }
        let mut walls = Vec::new();
        for _ in 0..BURSTS {
            std::thread::sleep(Duration::from_millis(30));
            let (w0, c0) = (Instant::now(), thread_cpu());
            while thread_cpu() - c0 < BURST {
                std::hint::spin_loop();
            }
            walls.push(w0.elapsed().as_secs_f64() * 1000.0);
        }
        // Back to the root group before the thread ends (its group is removed next).
        write(
            Path::new("/sys/fs/cgroup/cpu/tasks").to_path_buf(),
            &tid.to_string(),
        );
        walls.sort_by(f64::total_cmp);
        (walls[walls.len() / 2], walls[walls.len() - 1])
    })
    .join()
    .unwrap()
}

#[test]
#[ignore = "a measurement; run with --ignored --nocapture"]
fn measure_mechanisms_with_plain_processes() {
    if unsafe { libc::geteuid() } != 0 || !Path::new("/sys/fs/cgroup/cpu/cpu.idle").exists() {
        eprintln!("skipping: needs root and cgroup v1 `cpu` with cpu.idle");
        return;
    }
    println!("# {BURSTS} bursts of 20 ms CPU beside 4 spinners (each in its own group); wall ms");
    println!("{:<28} {:>7} {:>7}", "spinners' groups", "p50", "max");
    for case in [
        "normal",
        "cpu.shares 2",
        "cpu.idle 1",
        "short task SCHED_FIFO",
    ] {
        let parent = format!("hearth-mech-{}", std::process::id());
        std::fs::create_dir_all(cpu_group(&parent)).unwrap();
        let mut setup = Setup {
            parent: parent.clone(),
            spinners: Vec::new(),
        };
        for g in ["s0", "s1", "s2", "s3", "q"] {
            std::fs::create_dir_all(cpu_group(&format!("{parent}/{g}"))).unwrap();
        }
        for g in ["s0", "s1", "s2", "s3"] {
            let child = std::process::Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .current_dir("/")
                .spawn()
                .unwrap();
            let dir = cpu_group(&format!("{parent}/{g}"));
            write(dir.join("cgroup.procs"), &child.id().to_string());
            setup.spinners.push(child);
            match case {
                "cpu.shares 2" => write(dir.join("cpu.shares"), "2"),
                "cpu.idle 1" => write(dir.join("cpu.idle"), "1"),
                _ => {}
            }
        }
        let fifo = case == "short task SCHED_FIFO";
        if fifo {
            write(cpu_group(&parent).join("cpu.rt_runtime_us"), "500000");
            write(
                cpu_group(&format!("{parent}/q")).join("cpu.rt_runtime_us"),
                "500000",
            );
        }
        std::thread::sleep(Duration::from_millis(300));
        let (p50, max) = bursts(&parent, fifo);
        if fifo {
            write(
                cpu_group(&format!("{parent}/q")).join("cpu.rt_runtime_us"),
                "0",
            );
        }
        println!("{case:<28} {p50:>7.1} {max:>7.1}");
        drop(setup);
    }
}
