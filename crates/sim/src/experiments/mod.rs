//! The experiment suite (`hearth experiment NAME`): the seeds' comparisons, run through the
//! simulator on traces made from `../shared/traces/`, each writing a table (`results.md`,
//! `results.json`) and figures (PNG) to an output folder. `docs/experiments.md` shows them
//! next to the papers' claims.
//!
//! Every workload is made with the load generator's trace making (seeded), every simulation is
//! deterministic, so an experiment's output depends only on its options.

mod alps;
pub mod atoll;
mod balance;
pub mod fidelity;
mod gpu;
mod keepalive;
pub mod metrics;
pub mod plot;
mod priority;
mod provision;
mod queue;
pub mod runner;
mod scaling;

use crate::error::{Result, SimError};
use crate::workload::Workload;
use hearth_loadgen::make::{self, azure::AzureFiles, mapping::Mapping, select::Selection};
use hearth_loadgen::make::{Made, Scaling};
use serde_json::Value;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// The experiments, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Experiment {
    /// Keep-alive policies vs memory size (thesis Fig. 3.4).
    Keepalive,
    /// Balancing policies, and more smaller servers (CH-RLU paper Figs. 12–14).
    Balance,
    /// Queue disciplines and the concurrency limit (thesis Figs. 5.7–5.9).
    Queue,
    /// k-CH-RLU's priority pools (thesis Figs. 4.10–4.11).
    Priority,
    /// Atoll's ladder, eviction, scale-out and overhead studies (SoCC '21 Figs. 7, 11, 12a).
    Atoll,
    /// CPU scheduling of invocations: CFS, SFS, ALPS, SRPT (ALPS, ATC '24, Figs. 5–7, 9, §7.5).
    Alps,
    /// Hit-ratio curves and elastic vertical scaling (thesis Figs. 3.2, 3.8).
    Provision,
    /// Bursty traffic and horizontal autoscaling (CH-RLU paper Figs. 9–11).
    Scaling,
    /// GPU function scheduling: MQFQ-Sticky, FCFS, Batch on one server (thesis §6.5).
    Gpu,
}

impl Experiment {
    pub const ALL: [Experiment; 9] = [
        Experiment::Keepalive,
        Experiment::Balance,
        Experiment::Queue,
        Experiment::Priority,
        Experiment::Atoll,
        Experiment::Alps,
        Experiment::Provision,
        Experiment::Scaling,
        Experiment::Gpu,
    ];

    /// Whether the experiment runs its workers under `--server` (the others model their
    /// servers their own way: Atoll's sandboxes, CPU schedulers, one static cache, GPUs).
    pub fn takes_server(self) -> bool {
        matches!(
            self,
            Experiment::Keepalive
                | Experiment::Balance
                | Experiment::Queue
                | Experiment::Priority
                | Experiment::Scaling
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Experiment::Keepalive => "keepalive",
            Experiment::Balance => "balance",
            Experiment::Queue => "queue",
            Experiment::Priority => "priority",
            Experiment::Atoll => "atoll",
            Experiment::Alps => "alps",
            Experiment::Provision => "provision",
            Experiment::Scaling => "scaling",
            Experiment::Gpu => "gpu",
        }
    }
}

impl std::str::FromStr for Experiment {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Experiment::ALL
            .into_iter()
            .find(|e| e.name() == s)
            .ok_or_else(|| {
                format!("unknown experiment {s:?} (expected keepalive, balance, queue, priority, atoll, alps, provision, scaling or gpu)")
            })
    }
}

/// How to run an experiment.
#[derive(Debug, Clone)]
pub struct Options {
    /// The shared trace folder (`../shared/traces`).
    pub traces: PathBuf,
    /// Where the table and figures go.
    pub out: PathBuf,
    /// Shorter traces and fewer points: a smoke test in seconds, not a result.
    pub quick: bool,
    /// Simulations run at once.
    pub jobs: usize,
    /// Seed of the trace sampling (and of everything else random in the setup).
    pub seed: u64,
    /// The workers' server model; experiments that compare CPU schedulers keep their own.
    pub server: crate::contention::Server,
}

impl Options {
    /// `jobs` under this run's server model (unchanged under ideal processor sharing, and for
    /// jobs with a time-sliced CPU model, which the contention server does not cover).
    pub fn with_server<'a, 'w>(&self, jobs: &'a mut [runner::Job<'w>]) -> &'a [runner::Job<'w>] {
        for j in jobs.iter_mut() {
            self.apply_server(&mut j.config);
        }
        jobs
    }

    /// Puts one configuration under this run's server model, as [`Options::with_server`].
    pub fn apply_server(&self, config: &mut crate::SimConfig) {
        if self.server.contention().is_some() && config.cpu.sched == crate::cpu_model::CpuSched::Ps
        {
            config.server = self.server;
        }
    }
}

/// What an experiment produced.
#[derive(Debug, Clone)]
pub struct Report {
    /// Setup, tables and notes as Markdown (also written to `results.md`).
    pub markdown: String,
    /// The files written.
    pub files: Vec<PathBuf>,
}

/// Runs `e` with `o`, writing into `o.out`.
pub fn run(e: Experiment, o: &Options) -> Result<Report> {
    if o.server != crate::contention::Server::Ps && !e.takes_server() {
        let takes: Vec<&str> = Experiment::ALL
            .iter()
            .filter(|x| x.takes_server())
            .map(|x| x.name())
            .collect();
        return Err(SimError::Config(format!(
            "experiment {} keeps its own server model; --server {} applies to {}",
            e.name(),
            o.server.name(),
            takes.join(", ")
        )));
    }
    std::fs::create_dir_all(&o.out)
        .map_err(|err| SimError::Config(format!("{}: {err}", o.out.display())))?;
    let (markdown, json, mut files) = match e {
        Experiment::Keepalive => keepalive::run(o)?,
        Experiment::Balance => balance::run(o)?,
        Experiment::Queue => queue::run(o)?,
        Experiment::Priority => priority::run(o)?,
        Experiment::Atoll => atoll::run(o)?,
        Experiment::Alps => alps::run(o)?,
        Experiment::Provision => provision::run(o)?,
        Experiment::Scaling => scaling::run(o)?,
        Experiment::Gpu => gpu::run(o)?,
    };
    let markdown = match o.server {
        crate::contention::Server::Ps => markdown,
        s => format!(
            "Server model: **{}** (processor sharing with the interference measured on runc, \
             docs/simulator.md).\n\n{markdown}",
            s.name()
        ),
    };
    let md = o.out.join("results.md");
    write(&md, &markdown)?;
    let js = o.out.join("results.json");
    let text = serde_json::to_string_pretty(&json)
        .map_err(|err| SimError::Internal(format!("results JSON: {err}")))?;
    write(&js, &text)?;
    files.insert(0, js);
    files.insert(0, md);
    Ok(Report { markdown, files })
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|err| SimError::Config(format!("{}: {err}", path.display())))
}

/// What an experiment module returns: Markdown, JSON, figures.
type Output = (String, Value, Vec<PathBuf>);

/// An Azure 2019 sample of the shared traces, as `hearth trace make azure` makes it.
#[derive(Debug, Clone)]
struct AzureSample {
    /// Relative to the traces folder.
    file: &'static str,
    selection: Selection,
    minutes: usize,
    mapping: Mapping,
    scaling: Scaling,
}

/// The day-long in-vitro sample of 1,350 functions (Azure 2019).
const AZURE_1350: &str = "azure2019-invitro-sample/1350_inv.csv";

fn azure(o: &Options, s: &AzureSample) -> Result<(Workload, Made)> {
    let path = o.traces.join(s.file);
    if !path.is_file() {
        return Err(SimError::Config(format!(
            "trace data not found: {} (pass --traces with the folder of the shared traces, ../shared/traces)",
            path.display()
        )));
    }
    let made = make::from_azure(&make::AzureOptions {
        files: AzureFiles::beside(&path)?,
        from_minute: 0,
        minutes: s.minutes,
        selection: s.selection,
        mapping: s.mapping,
        scaling: s.scaling,
        seed: o.seed,
    })?;
    let workload = Workload::new(&made.trace, &made.metadata)?;
    Ok((workload, made))
}

/// A Markdown table.
#[derive(Debug, Clone, Default)]
struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(header: &[&str]) -> Self {
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    fn with_header(header: Vec<String>) -> Self {
        Table {
            header,
            rows: Vec::new(),
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn markdown(&self) -> String {
        let mut out = String::new();
        let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
        out.push_str(&line(&self.header));
        let sep: Vec<String> = self
            .header
            .iter()
            .enumerate()
            .map(|(i, _)| if i == 0 { "---".into() } else { "---:".into() })
            .collect();
        out.push_str(&line(&sep));
        for r in &self.rows {
            out.push_str(&line(r));
        }
        out
    }
}

/// One line describing a made workload.
fn describe(name: &str, made: &Made, w: &Workload) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "{name}: {} functions, {} invocations over {:.0} s ({:.1}/s), Little's-law concurrency {:.1}",
        w.functions.len(),
        w.arrivals.len(),
        made.span_s,
        w.arrivals.len() as f64 / made.span_s.max(1e-9),
        made.expected_concurrency()
    );
    s
}

/// `x` with `digits` decimals.
fn f(x: f64, digits: usize) -> String {
    format!("{x:.digits$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_tables_render() {
        for e in Experiment::ALL {
            assert_eq!(e.name().parse::<Experiment>(), Ok(e));
        }
        assert!("fig12".parse::<Experiment>().is_err());
        let mut t = Table::new(&["policy", "slowdown"]);
        t.row(vec!["ch-rlu".into(), f(1.25, 2)]);
        assert_eq!(
            t.markdown(),
            "| policy | slowdown |\n| --- | ---: |\n| ch-rlu | 1.25 |\n"
        );
    }

    #[test]
    fn missing_traces_are_named() {
        let o = Options {
            traces: PathBuf::from("/nonexistent/traces"),
            out: std::env::temp_dir(),
            quick: true,
            jobs: 1,
            seed: 1,
            server: crate::contention::Server::Ps,
        };
        let s = AzureSample {
            file: AZURE_1350,
            selection: Selection::Random(5),
            minutes: 10,
            mapping: Mapping::Busy,
            scaling: Scaling::None,
        };
        let err = azure(&o, &s).unwrap_err().to_string();
        assert!(err.contains("--traces"), "{err}");
    }
}
