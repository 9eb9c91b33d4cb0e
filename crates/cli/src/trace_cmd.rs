//! `hearth trace make`: trace + metadata files from the Azure traces or synthetic shapes.

use anyhow::Result;
use clap::{Args, Subcommand};
use hearth_loadgen::make::{
    self, azure::AzureFiles, mapping::Mapping, select::Selection, synthetic::Shape, Scaling,
    SyntheticFunctions,
};
use hearth_loadgen::metadata;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Subcommand)]
pub enum TraceCommand {
    /// Make a trace and its metadata file.
    #[command(subcommand)]
    Make(MakeCommand),
}

#[derive(Subcommand)]
pub enum MakeCommand {
    /// From the Azure Functions 2019 trace (per-minute invocation counts).
    Azure(AzureArgs),
    /// Atoll's evaluation workloads (SoCC '21 §7.1): 1 and 2 synthetic apps of classes C1–C4,
    /// 3 the popular 18–124 ms functions of an Azure trace; every function gets a deadline.
    Atoll(AtollArgs),
    /// Poisson arrivals at a constant rate.
    Poisson {
        #[command(flatten)]
        synth: SynthArgs,
    },
    /// Poisson arrivals during `--on`, silence during `--off`, repeating.
    Onoff {
        #[command(flatten)]
        synth: SynthArgs,
        #[arg(long, value_parser = humantime::parse_duration)]
        on: Duration,
        #[arg(long, value_parser = humantime::parse_duration)]
        off: Duration,
    },
    /// Poisson arrivals at rate × (1 + amplitude × sin(2πt / period)).
    Sine {
        #[command(flatten)]
        synth: SynthArgs,
        #[arg(long, default_value_t = 0.8)]
        amplitude: f64,
        #[arg(long, value_parser = humantime::parse_duration)]
        period: Duration,
    },
    /// A Poisson background plus one function (`burst`) at --burst-rate for --burst-length.
    Burst {
        #[command(flatten)]
        synth: SynthArgs,
        #[arg(long)]
        burst_rate: f64,
        /// When the burst starts.
        #[arg(long, value_parser = humantime::parse_duration)]
        burst_at: Duration,
        #[arg(long, value_parser = humantime::parse_duration)]
        burst_length: Duration,
    },
}

#[derive(Args)]
pub struct Output {
    /// The trace file to write; the metadata goes beside it as NAME.meta.csv.
    #[arg(long, short)]
    out: PathBuf,
    /// Write the metadata here instead.
    #[arg(long)]
    meta_out: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Scale inter-arrival times so the expected concurrency (Σ rate × warm time) is this.
    #[arg(long, conflicts_with = "time_scale")]
    target_concurrency: Option<f64>,
    /// Multiply every inter-arrival time by this.
    #[arg(long)]
    time_scale: Option<f64>,
}

#[derive(Args)]
pub struct AzureArgs {
    /// The invocations file (HashFunction, then per-minute counts), e.g. …/100_inv.csv.
    #[arg(long)]
    invocations: PathBuf,
    /// The durations file (default: the one beside the invocations file).
    #[arg(long)]
    durations: Option<PathBuf>,
    /// The memory file (default: the one beside the invocations file).
    #[arg(long)]
    memory: Option<PathBuf>,
    /// all, random:N, representative:N (N/4 per frequency quartile) or rare:N (least invoked).
    #[arg(long, default_value = "all")]
    sample: Selection,
    /// First minute of the window (0-based).
    #[arg(long, default_value_t = 0)]
    from_minute: usize,
    /// Length of the window in minutes.
    #[arg(long, default_value_t = 60)]
    minutes: usize,
    /// busy (the trace's time and memory) or functionbench (the closest FunctionBench-like function).
    #[arg(long, default_value = "busy")]
    map: Mapping,
    #[command(flatten)]
    output: Output,
}

#[derive(Args)]
pub struct AtollArgs {
    /// 1 (on/off, constant, sine patterns), 2 (also Poisson) or 3 (Azure trace functions).
    #[arg(long)]
    workload: u8,
    /// Apps (functions); workloads 1–2 deal them round-robin over C1–C4.
    #[arg(long, default_value_t = 20)]
    apps: usize,
    /// Length of the trace, e.g. 60s.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    duration: Duration,
    /// Workload 3: the Azure invocations file, e.g. …/azure2019-invitro-sample/1350_inv.csv
    /// (its duration and memory files beside it).
    #[arg(long)]
    invocations: Option<PathBuf>,
    #[command(flatten)]
    output: Output,
}

#[derive(Args)]
pub struct SynthArgs {
    /// Mean arrival rate of the background functions together (/s).
    #[arg(long)]
    rate: f64,
    /// Length of the trace, e.g. 60s.
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Number of background functions (syn-0, syn-1, …), invoked uniformly.
    #[arg(long, default_value_t = 1)]
    functions: usize,
    /// Warm times (ms), comma-separated, cycled over the functions.
    #[arg(long, value_delimiter = ',', default_value = "100")]
    warm_ms: Vec<f64>,
    #[arg(long, default_value_t = 500.0)]
    cold_ms: f64,
    #[arg(long, default_value_t = 128.0)]
    mem_mb: f64,
    #[command(flatten)]
    output: Output,
}

fn scaling(o: &Output) -> Scaling {
    match (o.target_concurrency, o.time_scale) {
        (Some(c), _) => Scaling::Concurrency(c),
        (None, Some(k)) => Scaling::Factor(k),
        (None, None) => Scaling::None,
    }
}

fn write(made: &make::Made, o: &Output) -> Result<()> {
    let meta = o
        .meta_out
        .clone()
        .unwrap_or_else(|| metadata::default_path(&o.out));
    made.write(&o.out, &meta)?;
    println!("{}", made.describe());
    println!("wrote {} and {}", o.out.display(), meta.display());
    Ok(())
}

pub fn run(cmd: TraceCommand) -> Result<()> {
    let TraceCommand::Make(m) = cmd;
    let synthetic = |shape: Shape, s: &SynthArgs| -> Result<()> {
        let fns = SyntheticFunctions {
            count: s.functions,
            warm_ms: s.warm_ms.clone(),
            cold_ms: s.cold_ms,
            mem_mb: s.mem_mb,
        };
        let made = make::synthetic(&shape, s.duration, &fns, scaling(&s.output), s.output.seed)?;
        write(&made, &s.output)
    };
    match m {
        MakeCommand::Azure(a) => {
            let mut files = match (&a.durations, &a.memory) {
                (Some(d), Some(m)) => AzureFiles {
                    invocations: a.invocations.clone(),
                    durations: d.clone(),
                    memory: m.clone(),
                },
                _ => AzureFiles::beside(&a.invocations)?,
            };
            if let Some(d) = &a.durations {
                files.durations = d.clone();
            }
            if let Some(m) = &a.memory {
                files.memory = m.clone();
            }
            let made = make::from_azure(&make::AzureOptions {
                files,
                from_minute: a.from_minute,
                minutes: a.minutes,
                selection: a.sample,
                mapping: a.map,
                scaling: scaling(&a.output),
                seed: a.output.seed,
            })?;
            write(&made, &a.output)
        }
        MakeCommand::Atoll(a) => {
            let azure = a
                .invocations
                .as_deref()
                .map(AzureFiles::beside)
                .transpose()?;
            let made = make::atoll::make(&make::atoll::AtollOptions {
                workload: a.workload,
                apps: a.apps,
                duration: a.duration,
                azure,
                scaling: scaling(&a.output),
                seed: a.output.seed,
            })?;
            write(&made, &a.output)
        }
        MakeCommand::Poisson { synth } => synthetic(Shape::Poisson { rate: synth.rate }, &synth),
        MakeCommand::Onoff { synth, on, off } => synthetic(
            Shape::OnOff {
                rate: synth.rate,
                on,
                off,
            },
            &synth,
        ),
        MakeCommand::Sine {
            synth,
            amplitude,
            period,
        } => synthetic(
            Shape::Sine {
                rate: synth.rate,
                amplitude,
                period,
            },
            &synth,
        ),
        MakeCommand::Burst {
            synth,
            burst_rate,
            burst_at,
            burst_length,
        } => synthetic(
            Shape::Burst {
                rate: synth.rate,
                burst_rate,
                at: burst_at,
                length: burst_length,
            },
            &synth,
        ),
    }
}
