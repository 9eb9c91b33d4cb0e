//! `hearth provision`: how much memory a worker needs for a trace (FaasCache static
//! provisioning, thesis §3.4.1; docs/provisioning.md). Reads the trace format of `hearth sim`.

use anyhow::{bail, Result};
use clap::Args;
use hearth_core::provision::{HitRatioCurve, Sampler, StaticSizing};
use hearth_loadgen::{metadata, LoadgenError, Metadata, Trace};
use serde_json::json;
use std::path::{Path, PathBuf};

/// The largest trace file read (bytes): a day of a busy Azure sample is well under it.
pub const MAX_TRACE_BYTES: u64 = 2 << 30;
/// The largest metadata file read (bytes).
pub const MAX_META_BYTES: u64 = 64 << 20;
/// The most invocations a trace may have.
pub const MAX_ROWS: usize = 50_000_000;
/// The most rows of the hit-ratio table.
const MAX_TABLE_ROWS: usize = 32;

#[derive(Args)]
pub struct ProvisionArgs {
    /// The trace (`time_ms,function`), as for `hearth sim`.
    #[arg(long)]
    trace: PathBuf,
    /// Its metadata, for the functions' memory (default: TRACE.meta.csv beside it).
    #[arg(long)]
    meta: Option<PathBuf>,
    /// Size the memory for this fraction of warm starts, in (0, 1].
    #[arg(long, default_value_t = 0.9, value_parser = parse_fraction)]
    target_hit_ratio: f64,
    /// SHARDS sampling rate in (0, 1]: 0.1 reads reuse distances of about a tenth of the
    /// functions (1: exact).
    #[arg(long, default_value_t = 1.0, value_parser = parse_fraction)]
    sample_rate: f64,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

fn parse_fraction(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("not a number: {s:?}"))?;
    if v > 0.0 && v <= 1.0 {
        Ok(v)
    } else {
        Err(format!("must be in (0, 1], got {v}"))
    }
}

/// Checks a file's size before it is read; the error names the kind of file, not its path.
fn check_size(path: &Path, which: &str, max: u64) -> Result<()> {
    let len = std::fs::metadata(path)
        .map_err(|e| anyhow::anyhow!("the {which} file cannot be read ({})", e.kind()))?
        .len();
    if len > max {
        bail!("the {which} file is {len} bytes, more than the {max} read");
    }
    Ok(())
}

/// A loader error without the host path or the file's contents.
fn scrub(which: &str, e: LoadgenError) -> anyhow::Error {
    match e {
        LoadgenError::Io { err, .. } => {
            anyhow::anyhow!("the {which} file cannot be read ({})", err.kind())
        }
        LoadgenError::Csv { err, .. } => match err.position() {
            Some(p) => anyhow::anyhow!("the {which} file is not valid CSV at line {}", p.line()),
            None => anyhow::anyhow!("the {which} file is not valid CSV"),
        },
        LoadgenError::Invalid { line, .. } => {
            anyhow::anyhow!("the {which} file has an invalid row at line {line}")
        }
        _ => anyhow::anyhow!("the {which} file cannot be used (empty, or missing its columns)"),
    }
}

/// The table's sizes: powers of two from 64 MiB to the curve's reach, plus the answers.
fn table_sizes(curve: &HitRatioCurve, sizing: &StaticSizing) -> Vec<u64> {
    let mut sizes = Vec::new();
    let mut mb = 64;
    while sizes.len() < MAX_TABLE_ROWS - 2 {
        sizes.push(mb);
        if mb >= curve.max_useful_mb() {
            break;
        }
        mb *= 2;
    }
    sizes.extend(sizing.target_mb);
    sizes.extend(sizing.knee.map(|k| k.memory_mb));
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

pub fn run(a: ProvisionArgs) -> Result<()> {
    let sampler = Sampler::new(a.sample_rate)?;
    let meta_path = a
        .meta
        .clone()
        .unwrap_or_else(|| metadata::default_path(&a.trace));
    check_size(&a.trace, "trace", MAX_TRACE_BYTES)?;
    check_size(&meta_path, "metadata", MAX_META_BYTES)?;
    let trace = Trace::read(&a.trace).map_err(|e| scrub("trace", e))?;
    if trace.invocations.len() > MAX_ROWS {
        bail!(
            "the trace has {} invocations, more than the {MAX_ROWS} read",
            trace.invocations.len()
        );
    }
    let meta = Metadata::read(&meta_path).map_err(|e| scrub("metadata", e))?;
    let mut missing = 0usize;
    let mut rows = Vec::with_capacity(trace.invocations.len());
    for inv in &trace.invocations {
        match meta.get(&inv.function) {
            Some(m) => rows.push((inv.function.as_str(), m.memory_mb())),
            None => missing += 1,
        }
    }
    if missing > 0 {
        bail!("{missing} invocations are of functions the metadata file does not list");
    }
    let curve = HitRatioCurve::from_trace(rows, sampler);
    let sizing = StaticSizing::of(&curve, a.target_hit_ratio)?;
    let functions = trace.counts().len();
    let table: Vec<(u64, f64)> = table_sizes(&curve, &sizing)
        .into_iter()
        .map(|mb| (mb, curve.hit_ratio(mb)))
        .collect();
    if a.json {
        let out = json!({
            "invocations": trace.invocations.len(),
            "functions": functions,
            "sample_rate": curve.sample_rate,
            "sampled_invocations": curve.sampled,
            "sampled_functions": curve.functions,
            "compulsory_misses": curve.compulsory,
            "target_hit_ratio": sizing.target_hit_ratio,
            "target_mb": sizing.target_mb,
            "knee": sizing.knee,
            "max_hit_ratio": sizing.max_hit_ratio,
            "max_useful_mb": sizing.max_useful_mb,
            "table": table.iter().map(|(mb, hr)| json!({"memory_mb": mb, "hit_ratio": hr}))
                .collect::<Vec<_>>(),
        });
        println!("{out}");
        return Ok(());
    }
    println!(
        "{} invocations of {functions} functions; sample rate {} ({} invocations of {} functions \
         sampled, {} first invocations: compulsory misses)",
        trace.invocations.len(),
        curve.sample_rate,
        curve.sampled,
        curve.functions,
        curve.compulsory,
    );
    match sizing.target_mb {
        Some(mb) => println!("target hit ratio {}: {mb} MiB", sizing.target_hit_ratio),
        None => println!(
            "target hit ratio {}: out of reach (the best is {:.3}, from {} MiB)",
            sizing.target_hit_ratio, sizing.max_hit_ratio, sizing.max_useful_mb
        ),
    }
    match sizing.knee {
        Some(k) => println!("knee: {} MiB (hit ratio {:.3})", k.memory_mb, k.hit_ratio),
        None => println!("knee: none (no function is invoked twice)"),
    }
    println!(
        "best hit ratio {:.3} from {} MiB\n\n{:>12}  hit ratio",
        sizing.max_hit_ratio, sizing.max_useful_mb, "memory (MiB)"
    );
    for (mb, hr) in table {
        println!("{mb:>12}  {hr:.3}");
    }
    Ok(())
}
