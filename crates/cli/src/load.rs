//! `hearth load`: closed-loop clients or an open-loop trace replay against a running API, one CSV
//! row per invocation plus a JSON summary.

use crate::client::{default_url, Client};
use crate::code;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use hearth_loadgen::replay::{closed_loop, open_loop, Call, ReplayStats, Target};
use hearth_loadgen::{
    metadata, FunctionMeta, Metadata, ResultRow, ResultWriter, Summary, Trace, WarmReference,
};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Subcommand)]
pub enum LoadCommand {
    /// Closed loop: N clients each invoke, wait for the answer, optionally think, and repeat.
    Closed(ClosedArgs),
    /// Open loop: send a trace's invocations at their scheduled instants.
    Trace(TraceArgs),
}

#[derive(Args)]
pub struct Common {
    /// API address.
    #[arg(long, env = "HEARTH_URL", default_value_t = default_url())]
    url: String,
    /// Results file: one CSV row per invocation (the summary goes beside it as .summary.json).
    #[arg(long, short, default_value = "results.csv")]
    out: PathBuf,
    /// Most connections, so most invocations in flight, at once.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// An invocation with no answer by then is recorded as an error (default: a minute more
    /// than the longest function timeout registered from the metadata, at least 120 s).
    #[arg(long, value_parser = humantime::parse_duration)]
    timeout: Option<Duration>,
    /// Where the sample functions named by the metadata live (registered with the runc backend).
    #[arg(long, default_value = "functions")]
    functions_dir: PathBuf,
}

#[derive(Args)]
pub struct ClosedArgs {
    #[command(flatten)]
    common: Common,
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// e.g. 30s, 5m.
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Functions to invoke, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    function: Vec<String>,
    /// Relative weights of the functions, comma-separated (default: equal).
    #[arg(long, value_delimiter = ',')]
    weights: Vec<f64>,
    /// Think uniformly 0–1 s between an answer and the next request.
    #[arg(long)]
    think: bool,
    /// Register the functions from this metadata file (else they must be registered already).
    #[arg(long)]
    meta: Option<PathBuf>,
    /// Arguments (JSON) for functions without metadata.
    #[arg(long, default_value = "{}")]
    data: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Args)]
pub struct TraceArgs {
    /// Trace file (`time_ms,function`).
    trace: PathBuf,
    #[command(flatten)]
    common: Common,
    /// Metadata file (default: TRACE.meta.csv beside the trace).
    #[arg(long)]
    meta: Option<PathBuf>,
    /// Start rate × warm time sandboxes of each function first (Little's law).
    #[arg(long)]
    prewarm: bool,
    /// Skip registering the functions (they are registered already).
    #[arg(long)]
    no_register: bool,
}

pub fn run(cmd: LoadCommand) -> Result<()> {
    match cmd {
        LoadCommand::Closed(a) => closed(a),
        LoadCommand::Trace(a) => trace(a),
    }
}

/// The function timeout registered for `f`: generous, since the sim backend and a loaded machine
/// stretch cold starts and runs.
fn function_timeout_ms(f: &FunctionMeta) -> u64 {
    (4.0 * (f.warm_ms + f.cold_ms)).clamp(30_000.0, 900_000.0) as u64
}

/// Where to send; unless `--timeout` says otherwise, the client outwaits every function's own
/// timeout, so a slow invocation is the server's 504 rather than a client give-up.
fn target<'a>(c: &Common, functions: impl IntoIterator<Item = &'a FunctionMeta>) -> Target {
    let longest_ms = functions
        .into_iter()
        .map(function_timeout_ms)
        .max()
        .unwrap_or(0);
    let default = Duration::from_millis(longest_ms + 60_000).max(Duration::from_secs(120));
    Target {
        url: c.url.clone(),
        max_connections: c.max_connections,
        request_timeout: c.timeout.unwrap_or(default),
        api_key: crate::client::default_api_key(),
    }
}

/// The backend of the API at `url` (`runc` or `sim`), which also checks it is reachable.
fn backend(client: &mut Client) -> Result<String> {
    let r = client.get("/v1/status")?;
    if r.status != 200 {
        bail!("GET /v1/status answered {}: {}", r.status, r.text());
    }
    Ok(r.json()["backend"].as_str().unwrap_or("runc").to_string())
}

/// Registers `f` as its metadata says: `sim_*` times for the sim backend, the sample's code for
/// real sandboxes.
fn register(client: &mut Client, f: &FunctionMeta, sim: bool, functions_dir: &Path) -> Result<()> {
    let timeout_ms = function_timeout_ms(f);
    let mut spec = json!({
        "memory_mb": f.memory_mb(),
        "timeout_ms": timeout_ms,
        "sim_warm_ms": f.warm_ms,
        "sim_cold_ms": f.cold_ms,
    });
    if let Some(d) = f.deadline_ms_registered() {
        spec["deadline_ms"] = json!(d);
    }
    if !sim {
        let dir = functions_dir.join(f.sample());
        let (code, _) = code::pack(&dir).map_err(anyhow::Error::msg).with_context(|| {
            format!(
                "function {} uses the sample function {:?}: run from the repository root or pass --functions-dir",
                f.function,
                f.sample()
            )
        })?;
        spec["code"] = code;
    }
    let r = client.put(
        &format!("/v1/functions/{}", f.function),
        spec.to_string().as_bytes(),
    )?;
    if r.status >= 300 {
        bail!("registering {}: {} {}", f.function, r.status, r.text());
    }
    Ok(())
}

/// Prewarming is best effort: a worker without room for the sandboxes says so, and the run goes on.
fn prewarm(client: &mut Client, function: &str, count: u32) -> Result<()> {
    let body = json!({ "count": count }).to_string();
    let r = client.post(
        &format!("/v1/functions/{function}/prewarm"),
        body.as_bytes(),
    )?;
    if r.status >= 300 {
        let why = r.error_message();
        eprintln!(
            "warning: prewarming {count} sandbox(es) of {function}: {} {why}",
            r.status
        );
    }
    Ok(())
}

/// Prewarms every function at once, so the wait is the longest cold start, not their sum.
fn prewarm_all(url: &str, counts: &[(&str, u32)]) -> Result<()> {
    let total: u32 = counts.iter().map(|(_, n)| n).sum();
    eprintln!(
        "prewarming {total} sandboxes of {} functions (Little's law: rate × warm time each)…",
        counts.len()
    );
    std::thread::scope(|scope| {
        let handles: Vec<_> = counts
            .iter()
            .map(|&(f, n)| scope.spawn(move || prewarm(&mut Client::new(url)?, f, n)))
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .map_err(|_| anyhow::anyhow!("a prewarm thread panicked"))?
        })
    })
}

/// Streams rows into the results file and keeps them for the summary.
struct Recorder {
    writer: ResultWriter,
    rows: Vec<ResultRow>,
}

impl Recorder {
    fn new(path: &Path) -> Result<Self> {
        Ok(Recorder {
            writer: ResultWriter::create(path)?,
            rows: Vec::new(),
        })
    }

    fn record(&mut self, row: ResultRow) -> hearth_loadgen::Result<()> {
        self.writer.write(&row)?;
        self.rows.push(row);
        Ok(())
    }

    /// Closes the file, writes the JSON summary beside it and prints the table and warnings.
    fn finish(self, out: &Path, meta: Option<&Metadata>, stats: &ReplayStats) -> Result<()> {
        self.writer.finish()?;
        let reference = meta
            .map(WarmReference::from_metadata)
            .unwrap_or_default()
            .or(WarmReference::from_runs([&self.rows[..]]));
        let label = out
            .file_stem()
            .map_or("run".into(), |s| s.to_string_lossy().into_owned());
        let summary = Summary::of(&label, &self.rows, &reference);
        let json_path = out.with_extension("summary.json");
        let mut v = serde_json::to_value(&summary)?;
        v["connections"] = json!({
            "opened": stats.connections_opened,
            "max": stats.max_connections,
            "waits": stats.connection_waits,
        });
        v["interrupted"] = json!(stats.interrupted);
        std::fs::write(&json_path, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("writing {}", json_path.display()))?;
        print!(
            "{}",
            hearth_loadgen::report::summary_table(std::slice::from_ref(&summary))
        );
        println!(
            "results: {} ({} rows); summary: {}",
            out.display(),
            self.rows.len(),
            json_path.display()
        );
        if summary.late_sends > 0 {
            eprintln!(
                "warning: the generator fell behind: {} of {} invocations ({:.2}%) left more than 1 ms after their scheduled time (send lag p99 {:.3} ms, max {:.3} ms); latencies count from the scheduled time, so the delay is inside e2e",
                summary.late_sends,
                summary.invocations,
                100.0 * summary.late_sends as f64 / summary.invocations.max(1) as f64,
                summary.send_lag_ms.p99,
                summary.send_lag_ms.max
            );
        }
        if stats.connection_waits > 0 {
            eprintln!(
                "warning: all {} connections were busy {} times; those invocations waited for one (raise --max-connections)",
                stats.max_connections, stats.connection_waits
            );
        }
        if stats.interrupted {
            eprintln!(
                "warning: interrupted (Ctrl-C): the results hold the {} invocations sent before the stop, each with its answer",
                self.rows.len()
            );
        }
        Ok(())
    }
}

/// An interrupted run ends like one killed by SIGINT (status 130), once its results are written.
fn exit_if_interrupted(stats: &ReplayStats) {
    if stats.interrupted {
        std::process::exit(130);
    }
}

fn closed(a: ClosedArgs) -> Result<()> {
    let weights = if a.weights.is_empty() {
        vec![1.0; a.function.len()]
    } else if a.weights.len() == a.function.len() {
        a.weights.clone()
    } else {
        bail!(
            "--weights has {} values for {} functions",
            a.weights.len(),
            a.function.len()
        );
    };
    let data: Value = serde_json::from_str(&a.data).context("--data is not valid JSON")?;
    let meta = a.meta.as_deref().map(Metadata::read).transpose()?;
    let mut client = Client::new(&a.common.url)?;
    let sim = backend(&mut client)? == "sim";
    let mut calls = Vec::new();
    for f in &a.function {
        let m = meta.as_ref().and_then(|m| m.get(f));
        match m {
            Some(m) => register(&mut client, m, sim, &a.common.functions_dir)?,
            None => {
                if meta.is_some() {
                    bail!("function {f} is not in the metadata file");
                }
                let r = client.get(&format!("/v1/functions/{f}"))?;
                if r.status == 404 {
                    bail!("unknown function {f}: register it first (hearth fn register) or pass --meta");
                }
            }
        }
        calls.push(Call::new(
            f,
            &m.map_or_else(|| data.clone(), FunctionMeta::invocation_args),
        ));
    }
    let cfg = closed_loop::ClosedLoop {
        target: target(&a.common, meta.iter().flat_map(|m| m.functions.values())),
        clients: a.clients,
        duration: a.duration,
        think: a.think,
        seed: a.seed,
    };
    eprintln!(
        "load closed: {} client(s) for {:?} on {}",
        a.clients,
        a.duration,
        a.function.join(",")
    );
    let mut rec = Recorder::new(&a.common.out)?;
    let stats = closed_loop::run(&cfg, &calls, &weights, |row| rec.record(row))?;
    rec.finish(&a.common.out, meta.as_ref(), &stats)?;
    exit_if_interrupted(&stats);
    Ok(())
}

fn trace(a: TraceArgs) -> Result<()> {
    let trace = Trace::read(&a.trace)?;
    let meta_path = a
        .meta
        .clone()
        .unwrap_or_else(|| metadata::default_path(&a.trace));
    if !meta_path.exists() {
        bail!(
            "no metadata file {}: make one with `hearth trace make` or pass --meta",
            meta_path.display()
        );
    }
    let meta = Metadata::read(&meta_path)?;
    let rates = trace.rates_per_s();
    for f in rates.keys() {
        if meta.get(f).is_none() {
            bail!(
                "function {f} of {} is not in {}",
                a.trace.display(),
                meta_path.display()
            );
        }
    }
    let mut client = Client::new(&a.common.url)?;
    let sim = backend(&mut client)? == "sim";
    let mut calls = HashMap::new();
    for f in rates.keys() {
        let m = meta.get(f).context("checked above")?;
        if !a.no_register {
            register(&mut client, m, sim, &a.common.functions_dir)?;
        }
        calls.insert(f.to_string(), Call::new(f, &m.invocation_args()));
    }
    if a.prewarm {
        let counts: Vec<(&str, u32)> = rates
            .iter()
            .filter_map(|(f, r)| meta.get(f).map(|m| (*f, m.prewarm_count(*r))))
            .collect();
        prewarm_all(&a.common.url, &counts)?;
    }
    let concurrency = meta.expected_concurrency(rates.iter().map(|(f, r)| (*f, *r)));
    let cfg = open_loop::OpenLoop {
        target: target(&a.common, meta.functions.values()),
        preopen: ((2.0 * concurrency).ceil() as usize + 4).min(a.common.max_connections),
        lead: Duration::from_millis(200),
    };
    eprintln!(
        "load trace: {} invocations of {} functions over {:.1} s (expected concurrency {:.2}); backend {}",
        trace.invocations.len(),
        rates.len(),
        trace.span_us() as f64 / 1e6,
        concurrency,
        if sim { "sim" } else { "runc" }
    );
    let mut rec = Recorder::new(&a.common.out)?;
    let stats = open_loop::run(&cfg, &trace, &calls, |row| rec.record(row))?;
    rec.finish(&a.common.out, Some(&meta), &stats)?;
    exit_if_interrupted(&stats);
    Ok(())
}
