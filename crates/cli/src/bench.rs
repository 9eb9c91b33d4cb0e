//! `hearth bench`: control-plane overhead and cold-start benchmarks against a running API.

use crate::client::{Client, Response};
use crate::stats::percentile;
use hearth_api::InvokeAnswer;
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// Registers a benchmark function that sleeps `exec_ms` (a no-op for 0). With the sim backend the
/// same time is its `sim_warm_ms` (its `sim_gpu_warm_ms` with `gpu`: a `device: gpu` function of
/// 512 MiB, for a worker with simulated GPUs).
pub fn register_bench_function(url: &str, exec_ms: u64, gpu: bool) -> Result<String, String> {
    let mut c = Client::new(url).map_err(|e| e.to_string())?;
    let status = c.get("/v1/status").map_err(|e| e.to_string())?.json();
    let sim = status["backend"] == "sim";
    let (name, src) = if exec_ms == 0 {
        (
            "hearth-bench-noop".to_string(),
            "def main(args):\n    return {}\n".to_string(),
        )
    } else {
        (
            format!("hearth-bench-sleep-{exec_ms}ms"),
            format!(
                "import time\n\ndef main(args):\n    time.sleep({})\n    return {{}}\n",
                exec_ms as f64 / 1000.0
            ),
        )
    };
    let mut spec = json!({
        "code": {"files": {"main.py": src}},
        "memory_mb": 64,
        "timeout_ms": 10_000 + exec_ms,
    });
    if sim {
        spec["sim_warm_ms"] = json!(exec_ms);
        spec["sim_cold_ms"] = json!(0);
    }
    let name = if gpu {
        spec["device"] = json!("gpu");
        spec["gpu_memory_mb"] = json!(512);
        if sim {
            // A 1 ms GPU sandbox start (0 would mean the simulated device's 1.5 s), so the
            // warm-up's cold starts end before the measured run.
            spec["sim_gpu_warm_ms"] = json!(exec_ms);
            spec["sim_gpu_cold_ms"] = json!(1);
        }
        format!("{name}-gpu")
    } else {
        name
    };
    let r = c
        .put(
            &format!("/v1/functions/{name}"),
            spec.to_string().as_bytes(),
        )
        .map_err(|e| e.to_string())?;
    if r.status >= 300 {
        return Err(format!("registering {name}: {} {}", r.status, r.text()));
    }
    Ok(name)
}

/// Result of a closed-loop run.
#[derive(Debug, Clone)]
pub struct OverheadReport {
    pub clients: usize,
    pub duration: Duration,
    pub invocations: usize,
    pub errors: usize,
    pub cold: usize,
    /// Client-observed overhead: e2e − exec.
    pub overhead_us: Vec<u64>,
    pub e2e_us: Vec<u64>,
    /// The worker's own `timing.overhead`: its share of the client-observed overhead.
    pub server_overhead_us: Vec<u64>,
    /// Through a controller: its own share (`timing.controller`); empty against a worker.
    pub controller_us: Vec<u64>,
}

impl OverheadReport {
    pub fn throughput(&self) -> f64 {
        self.invocations as f64 / self.duration.as_secs_f64()
    }

    pub fn to_json(&self) -> Value {
        let pct = |v: &[u64]| {
            json!({
                "p50": percentile(v, 50.0),
                "p90": percentile(v, 90.0),
                "p99": percentile(v, 99.0),
                "max": v.last().copied().unwrap_or(0),
            })
        };
        json!({
            "clients": self.clients,
            "duration_s": self.duration.as_secs_f64(),
            "invocations": self.invocations,
            "errors": self.errors,
            "cold": self.cold,
            "throughput": (self.throughput() * 10.0).round() / 10.0,
            "overhead_us": pct(&self.overhead_us),
            "server_overhead_us": pct(&self.server_overhead_us),
            "controller_us": pct(&self.controller_us),
            "e2e_us": pct(&self.e2e_us),
        })
    }
}

/// What one client thread measured.
#[derive(Default)]
struct ClientSamples {
    overhead: Vec<u64>,
    e2e: Vec<u64>,
    server: Vec<u64>,
    controller: Vec<u64>,
    errors: usize,
    cold: usize,
}

/// One closed-loop client: warm up until `warm_end`, then measure until `end`.
fn client_loop(
    url: &str,
    path: &str,
    warm_end: Instant,
    end: Instant,
) -> Result<ClientSamples, String> {
    let mut c = Client::new(url).map_err(|e| e.to_string())?;
    let body = b"{}";
    while Instant::now() < warm_end {
        c.post(path, body).map_err(|e| e.to_string())?;
    }
    let mut s = ClientSamples::default();
    loop {
        let t = Instant::now();
        if t >= end {
            return Ok(s);
        }
        let r = c.post(path, body).map_err(|e| e.to_string())?;
        let us = t.elapsed().as_micros() as u64;
        // Read after the clock stopped: the parse (the result stays raw) is not measured.
        let Some(a) = answer(&r) else {
            s.errors += 1;
            continue;
        };
        if a.cold {
            s.cold += 1;
        }
        s.server.push(a.timing.overhead);
        if let Some(c) = a.timing.controller {
            s.controller.push(c);
        }
        s.e2e.push(us);
        s.overhead.push(us.saturating_sub(a.timing.exec));
    }
}

/// Runs `clients` closed-loop clients invoking `function` for `duration` after a warm-up.
/// Overhead per invocation = e2e seen by the client − the handler's `exec`.
pub fn closed_loop(
    url: &str,
    function: &str,
    clients: usize,
    duration: Duration,
    warmup: Duration,
) -> Result<OverheadReport, String> {
    closed_loop_prewarmed(url, function, clients, clients, duration, warmup)
}

/// [`closed_loop`] with `prewarm` sandboxes made first (fewer than the clients: a burst that
/// finds too few warm sandboxes).
pub fn closed_loop_prewarmed(
    url: &str,
    function: &str,
    clients: usize,
    prewarm: usize,
    duration: Duration,
    warmup: Duration,
) -> Result<OverheadReport, String> {
    let path = format!("/v1/functions/{function}/invoke");
    // One warm sandbox per client by default, so the measured loop is warm; none with 0 (the
    // warm-up's first calls start them).
    if prewarm > 0 {
        let mut c = Client::new(url).map_err(|e| e.to_string())?;
        let r = c
            .post(
                &format!("/v1/functions/{function}/prewarm"),
                json!({ "count": prewarm }).to_string().as_bytes(),
            )
            .map_err(|e| e.to_string())?;
        if r.status >= 300 {
            return Err(format!("prewarm failed: {} {}", r.status, r.text()));
        }
    }
    let warm_end = Instant::now() + Duration::from_millis(50) + warmup;
    let end = warm_end + duration;
    let handles: Vec<_> = (0..clients)
        .map(|_| {
            let (url, path) = (url.to_string(), path.clone());
            std::thread::spawn(move || client_loop(&url, &path, warm_end, end))
        })
        .collect();
    let mut report = OverheadReport {
        clients,
        duration,
        invocations: 0,
        errors: 0,
        cold: 0,
        overhead_us: Vec::new(),
        e2e_us: Vec::new(),
        server_overhead_us: Vec::new(),
        controller_us: Vec::new(),
    };
    for h in handles {
        let c = h.join().map_err(|_| "client thread panicked")??;
        report.invocations += c.overhead.len();
        report.overhead_us.extend(c.overhead);
        report.e2e_us.extend(c.e2e);
        report.server_overhead_us.extend(c.server);
        report.controller_us.extend(c.controller);
        report.errors += c.errors;
        report.cold += c.cold;
    }
    report.overhead_us.sort_unstable();
    report.e2e_us.sort_unstable();
    report.server_overhead_us.sort_unstable();
    report.controller_us.sort_unstable();
    Ok(report)
}

/// A success answer; `None` for an error status or a body that is not an invocation answer.
fn answer(r: &Response) -> Option<InvokeAnswer> {
    if r.status != 200 {
        return None;
    }
    InvokeAnswer::parse(&r.body)
}

/// One measured cold start: how its sandbox was made (`preimported`, `generic` or `fresh`), its
/// init and the
/// client's end-to-end time, in µs.
pub struct ColdSample {
    pub path: String,
    pub init_us: u64,
    pub e2e_us: u64,
}

/// How long a round waits for a worker's generic pool to have a ready sandbox.
const GENERIC_READY_WAIT: Duration = Duration::from_secs(10);

/// Cold starts of a hello function: each round re-registers it (a new version is never served by
/// an old sandbox) and invokes it once. Against a worker with a generic pool, each round first
/// waits until a generic sandbox is ready (up to 10 s), so that the rounds measure the path a
/// cold start takes on a worker at rest.
pub fn cold_starts(url: &str, rounds: usize) -> Result<Vec<ColdSample>, String> {
    let spec = json!({
        "code": {"files": {"main.py": "def main(args):\n    return {\"greeting\": \"Hello, \" + args.get(\"name\", \"world\") + \"!\"}\n"}},
        "memory_mb": 64,
        "sim_cold_ms": 0,
    });
    cold_starts_of(url, "hearth-bench-hello", &spec, rounds)
}

/// How long a round waits for its registration to be ready (a dependency layer may be built).
const REGISTRATION_READY_WAIT: Duration = Duration::from_secs(600);

/// Cold starts of the function `spec` (a registration body with its code) under `name`, as
/// [`cold_starts`] does for hello: each round registers it afresh, waits for the registration
/// to be ready (its layer built) and for the worker's generic pools to be at rest, then
/// invokes it once. The function is deleted at the end.
pub fn cold_starts_of(
    url: &str,
    name: &str,
    spec: &Value,
    rounds: usize,
) -> Result<Vec<ColdSample>, String> {
    let mut c = Client::new(url).map_err(|e| e.to_string())?;
    let body = spec.to_string();
    let (fn_path, invoke_path) = (
        format!("/v1/functions/{name}"),
        format!("/v1/functions/{name}/invoke"),
    );
    let mut samples = Vec::new();
    for _ in 0..rounds {
        let r = c
            .put(&fn_path, body.as_bytes())
            .map_err(|e| e.to_string())?;
        if r.status >= 300 {
            return Err(format!("registering: {} {}", r.status, r.text()));
        }
        wait_for_registration(&mut c, &fn_path)?;
        wait_for_generic(&mut c)?;
        let t = Instant::now();
        let r = c.post(&invoke_path, b"{}").map_err(|e| e.to_string())?;
        let us = t.elapsed().as_micros() as u64;
        let Some(a) = answer(&r).filter(|a| a.cold) else {
            return Err(format!(
                "expected a cold start, got {} {}",
                r.status,
                r.text()
            ));
        };
        samples.push(ColdSample {
            path: a.cold_path.map_or("fresh", |p| p.as_str()).to_string(),
            init_us: a.timing.init,
            e2e_us: us,
        });
    }
    let _ = c.delete(&fn_path);
    Ok(samples)
}

/// Waits until `GET fn_path` says `"state": "ready"` (a registration whose dependency layer is
/// still being built is not); a server that reports no state is ready at once. A failed
/// registration (`"state": "failed"`) is an error.
fn wait_for_registration(c: &mut Client, fn_path: &str) -> Result<(), String> {
    let deadline = Instant::now() + REGISTRATION_READY_WAIT;
    loop {
        let r = c.get(fn_path).map_err(|e| e.to_string())?;
        let v: Value = serde_json::from_slice(&r.body).unwrap_or_default();
        match v["state"].as_str() {
            None | Some("ready") => return Ok(()),
            Some("failed") => return Err(format!("the registration failed: {}", r.text())),
            Some(_) if Instant::now() > deadline => {
                return Err("the registration was not ready within 600 s".into())
            }
            Some(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// The host's own import of `modules` (comma-separated) with `site` first on `sys.path`, in
/// µs: `runs` subprocesses of `python` (`-I -S`, as the agent runs), each timing its import
/// in-process (the interpreter's start excluded, as a sandbox's init excludes it). Sorted.
pub fn host_imports(
    python: &Path,
    site: &Path,
    modules: &str,
    runs: usize,
) -> Result<Vec<u64>, String> {
    let names: Vec<&str> = modules
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .collect();
    let valid = |m: &str| {
        m.split('.').all(|p| {
            p.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
    };
    if names.is_empty() || !names.iter().all(|m| valid(m)) {
        return Err(format!(
            "--host-import wants dotted module names, got {modules:?}"
        ));
    }
    let script = format!(
        "import sys, time\nsys.path.insert(0, sys.argv[1])\nt = time.perf_counter()\nimport {}\nprint(int((time.perf_counter() - t) * 1e6))\n",
        names.join(", ")
    );
    let mut out = Vec::with_capacity(runs);
    for _ in 0..runs {
        let o = std::process::Command::new(python)
            .args(["-I", "-S", "-c", &script])
            .arg(site)
            .output()
            .map_err(|e| format!("running {}: {e}", python.display()))?;
        if !o.status.success() {
            let err = String::from_utf8_lossy(&o.stderr);
            let last = err.lines().last().unwrap_or("");
            return Err(format!("the host import failed: {last}"));
        }
        let us = String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse::<u64>()
            .map_err(|e| format!("the host import printed no time: {e}"))?;
        out.push(us);
    }
    out.sort_unstable();
    Ok(out)
}

/// Waits until the worker's generic pools are at rest: a sandbox ready and none being made
/// (a key's pool refills after each of its cold starts); returns at once if it has no pool (a
/// controller, the sim backend, `generic_pool = 0`).
fn wait_for_generic(c: &mut Client) -> Result<(), String> {
    let deadline = Instant::now() + GENERIC_READY_WAIT;
    loop {
        let r = c.get("/v1/status").map_err(|e| e.to_string())?;
        let status: Value = serde_json::from_slice(&r.body).unwrap_or_default();
        let pool = &status["generic_pool"];
        if !pool.is_object()
            || (pool["ready"].as_u64().unwrap_or(0) > 0 && pool["creating"].as_u64() == Some(0))
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err("no generic sandbox became ready within 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Latency of accepting async invocations (the 202, after the record is durable): `n`
/// sequential accepts of the no-op bench function, after `warmup` unmeasured ones. Returns the
/// accept latencies in µs, sorted, and the errors.
pub fn async_accepts(url: &str, n: usize, warmup: usize) -> Result<(Vec<u64>, usize), String> {
    let f = register_bench_function(url, 0, false)?;
    let path = format!("/v1/functions/{f}/invoke?async=true");
    let mut c = Client::new(url).map_err(|e| e.to_string())?;
    let mut lat = Vec::with_capacity(n);
    let mut errors = 0;
    for i in 0..warmup + n {
        let t0 = Instant::now();
        let r = c.post(&path, b"{}").map_err(|e| e.to_string())?;
        let us = t0.elapsed().as_micros() as u64;
        if r.status != 202 {
            errors += 1;
            if errors > 10 && errors * 2 > i {
                return Err(format!("accepts fail: {} {}", r.status, r.text()));
            }
            continue;
        }
        if i >= warmup {
            lat.push(us);
        }
    }
    lat.sort_unstable();
    Ok((lat, errors))
}

#[cfg(test)]
mod tests {
    use super::answer;
    use crate::client::Response;

    fn response(status: u16, body: &[u8]) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body: body.to_vec(),
        }
    }

    #[test]
    fn exec_is_read_from_the_timing_object() {
        let b = br#"{"result":{},"cold":false,"worker":"w","timing":{"queue":0,"init":0,"exec":1234,"overhead":5,"e2e":1239}}"#;
        let a = answer(&response(200, b)).unwrap();
        assert_eq!(a.timing.exec, 1234);
        assert_eq!(a.timing.overhead, 5);
        assert_eq!(a.timing.controller, None);
        assert!(answer(&response(200, b"{}")).is_none());
        assert!(answer(&response(503, b)).is_none());
    }

    #[test]
    fn a_preimported_cold_start_is_read() {
        let b = br#"{"result":{},"cold":true,"cold_reason":"new","cold_path":"preimported","worker":"w","timing":{"queue":0,"init":9000,"exec":7,"overhead":5,"e2e":12}}"#;
        let a = answer(&response(200, b)).unwrap();
        assert_eq!(a.cold_path.map(|p| p.as_str()), Some("preimported"));
    }

    #[test]
    fn the_host_import_is_timed_in_process_and_checked() {
        let site = tempfile::tempdir().unwrap();
        let pkg = site.path().join("benchpkg");
        std::fs::create_dir(&pkg).unwrap();
        std::fs::write(pkg.join("__init__.py"), "import time\ntime.sleep(0.02)\n").unwrap();
        let python = std::path::Path::new("/usr/bin/python3");
        if !python.exists() {
            eprintln!("skipped: no /usr/bin/python3");
            return;
        }
        let us = super::host_imports(python, site.path(), "benchpkg", 3).unwrap();
        assert_eq!(us.len(), 3);
        assert!(us.iter().all(|u| (20_000..2_000_000).contains(u)), "{us:?}");
        assert!(us.windows(2).all(|w| w[0] <= w[1]));
        for bad in ["", "os; import x", "a..b", "a b"] {
            assert!(
                super::host_imports(python, site.path(), bad, 1).is_err(),
                "{bad}"
            );
        }
        let err = super::host_imports(python, site.path(), "no_such_mod_xyz", 1).unwrap_err();
        assert!(err.contains("ModuleNotFoundError"), "{err}");
    }

    #[test]
    fn a_result_holding_timing_keys_does_not_fool_the_reader() {
        let b = br#"{"result":{"timing":{"exec":9},"cold":true},"cold":false,"worker":"w","timing":{"queue":0,"init":0,"exec":7,"overhead":5,"e2e":12,"controller":3}}"#;
        let a = answer(&response(200, b)).unwrap();
        assert!(!a.cold);
        assert_eq!((a.timing.exec, a.timing.controller), (7, Some(3)));
    }
}
