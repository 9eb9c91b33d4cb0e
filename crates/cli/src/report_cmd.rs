//! `hearth report`: summary tables and plots of one or more results files.

use anyhow::{Context, Result};
use clap::Args;
use hearth_loadgen::report::{self, Run, TOP_FUNCTIONS};
use hearth_loadgen::{read_results, Metadata, Summary, WarmReference};
use std::path::PathBuf;

#[derive(Args)]
pub struct ReportArgs {
    /// Results files (one CSV row per invocation); several are compared side by side.
    #[arg(required = true)]
    results: Vec<PathBuf>,
    /// A label per results file, in order (default: the file names).
    #[arg(long = "label")]
    labels: Vec<String>,
    /// Metadata whose warm_ms is each function's reference for stretch (default: the median warm
    /// exec time of each function across the given runs).
    #[arg(long)]
    meta: Option<PathBuf>,
    /// Folder for the plots and summary.json (default: REPORT-report beside the first file).
    #[arg(long, short)]
    out: Option<PathBuf>,
    /// Print the tables only.
    #[arg(long)]
    no_plots: bool,
}

pub fn run(a: ReportArgs) -> Result<()> {
    if !a.labels.is_empty() && a.labels.len() != a.results.len() {
        anyhow::bail!(
            "--label given {} times for {} results files",
            a.labels.len(),
            a.results.len()
        );
    }
    let mut runs = Vec::new();
    for (i, path) in a.results.iter().enumerate() {
        let label = a.labels.get(i).cloned().unwrap_or_else(|| {
            path.file_stem()
                .map_or(format!("run{i}"), |s| s.to_string_lossy().into_owned())
        });
        runs.push(Run {
            label,
            rows: read_results(path)?,
        });
    }
    let measured = WarmReference::from_runs(runs.iter().map(|r| &r.rows[..]));
    let reference = match &a.meta {
        Some(p) => WarmReference::from_metadata(&Metadata::read(p)?).or(measured),
        None => measured,
    };
    let summaries: Vec<Summary> = runs
        .iter()
        .map(|r| Summary::of(&r.label, &r.rows, &reference))
        .collect();
    print!("{}", report::summary_table(&summaries));
    for s in &summaries {
        println!();
        print!("{}", report::function_table(s, TOP_FUNCTIONS));
    }
    let dir = a.out.clone().unwrap_or_else(|| {
        let first = &a.results[0];
        let stem = first
            .file_stem()
            .map_or("results".into(), |s| s.to_string_lossy().into_owned());
        first.with_file_name(format!("{stem}-report"))
    });
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let json = dir.join("summary.json");
    std::fs::write(&json, serde_json::to_string_pretty(&summaries)?)
        .with_context(|| format!("writing {}", json.display()))?;
    println!();
    println!("summary: {}", json.display());
    if !a.no_plots {
        for p in report::write_plots(&runs, &summaries, &dir)? {
            println!("plot: {}", p.display());
        }
    }
    Ok(())
}
