//! `hearth experiment NAME`: the seeds' comparisons through the simulator (docs/experiments.md).

use anyhow::{bail, Result};
use clap::Args;
use hearth_loadgen::{read_results, Metadata};
use hearth_sim::experiments::{self, fidelity, Experiment, Options};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct ExperimentArgs {
    /// keepalive, balance, queue, priority, atoll, alps, provision, scaling, gpu; or fidelity (compares --real with
    /// --sim).
    name: String,
    /// The shared traces folder.
    #[arg(long, default_value = "../shared/traces")]
    traces: PathBuf,
    /// Output folder for the table and figures (default: exp/NAME).
    #[arg(long, short)]
    out: Option<PathBuf>,
    /// Short traces and few points: a smoke test in seconds, not a result.
    #[arg(long)]
    quick: bool,
    /// Simulations run at once (default: the CPUs).
    #[arg(long)]
    jobs: Option<usize>,
    /// Seed of the trace sampling.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The workers' server model: ps (ideal processor sharing) or contention (with the
    /// interference measured on runc; docs/simulator.md). keepalive, balance, queue, priority
    /// and scaling take it; the others keep their own and refuse contention.
    #[arg(long, default_value = "ps")]
    server: hearth_sim::Server,
    /// fidelity: the results of the real worker.
    #[arg(long)]
    real: Option<PathBuf>,
    /// fidelity: the simulator's results of the same trace.
    #[arg(long)]
    sim: Option<PathBuf>,
    /// fidelity: the trace's metadata (warm times for normalized latency).
    #[arg(long)]
    meta: Option<PathBuf>,
    /// fidelity: bin width (s) of the over-time plots.
    #[arg(long, default_value_t = 1.0)]
    bin_s: f64,
}

pub fn run(a: ExperimentArgs) -> Result<()> {
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("exp").join(&a.name));
    let t0 = Instant::now();
    let (markdown, files) = if a.name == "fidelity" {
        let (Some(real), Some(sim)) = (&a.real, &a.sim) else {
            bail!("fidelity needs --real RESULTS.csv and --sim RESULTS.csv");
        };
        if !(a.bin_s.is_finite() && a.bin_s > 0.0) {
            bail!("--bin-s must be a positive number of seconds");
        }
        let meta = a.meta.as_deref().map(Metadata::read).transpose()?;
        let (md, json, mut files) = fidelity::compare(
            &read_results(real)?,
            &read_results(sim)?,
            meta.as_ref(),
            a.bin_s,
            &out,
        )?;
        let md_path = out.join("results.md");
        std::fs::write(&md_path, &md)?;
        std::fs::write(
            out.join("results.json"),
            serde_json::to_string_pretty(&json)?,
        )?;
        files.insert(0, md_path);
        (md, files)
    } else {
        let e: Experiment = a.name.parse().map_err(anyhow::Error::msg)?;
        let jobs = a
            .jobs
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        if jobs == 0 {
            bail!("--jobs must be at least 1");
        }
        let r = experiments::run(
            e,
            &Options {
                traces: a.traces.clone(),
                out: out.clone(),
                quick: a.quick,
                jobs,
                seed: a.seed,
                server: a.server,
            },
        )?;
        (r.markdown, r.files)
    };
    print!("{markdown}");
    println!();
    for f in files {
        println!("wrote {}", f.display());
    }
    println!("took {:.1} s", t0.elapsed().as_secs_f64());
    Ok(())
}
