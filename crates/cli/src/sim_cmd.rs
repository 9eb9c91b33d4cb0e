//! `hearth sim`: replay a trace through simulated workers and a balancer (docs/simulator.md).

use anyhow::{bail, Context, Result};
use clap::Args;
use hearth_core::autoscale::AutoscaleParams;
use hearth_core::balance::{BalanceKind, BalanceParams};
use hearth_core::bypass::BypassConfig;
use hearth_core::proactive::{AtollConfig, Ladder, ScaleOutMode, VictimPolicy};
use hearth_core::{
    AimdConfig, GenericConfig, KeepAliveConfig, KeepAliveKind, QueueDiscipline, RegulatorConfig,
};
use hearth_loadgen::{metadata, Metadata, Trace};
use hearth_sim::config::ATOLL_TTL_US;
use hearth_sim::record::Tee;
use hearth_sim::{
    ClosedLoop, CpuConfig, CpuSched, CsvSink, Record, Routing, Server, SimAutoscale, SimConfig,
    Sink, Workload,
};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct SimArgs {
    /// The trace (`time_ms,function`), as for `hearth load trace`.
    #[arg(long)]
    trace: PathBuf,
    /// Its metadata (default: TRACE.meta.csv beside it).
    #[arg(long)]
    meta: Option<PathBuf>,
    /// Results file, one row per invocation (the load generator's format).
    #[arg(long, short, default_value = "sim-results.csv")]
    out: PathBuf,
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// CPUs per worker.
    #[arg(long, default_value_t = 16)]
    cpus: u32,
    /// Memory per worker for sandboxes: 32GiB, 512MiB, or a number of MiB.
    #[arg(long, default_value = "32GiB", value_parser = parse_size_mb)]
    memory: u64,
    /// Memory background eviction keeps free on each worker.
    #[arg(long, default_value = "256MiB", value_parser = parse_size_mb)]
    free_buffer: u64,
    /// round-robin, random, least-loaded, ch, ch-bl, ch-rlu, k-ch-rlu, openwhisk, greedy (the
    /// omniscient baseline that only a simulator can run), or atoll (Atoll's balancer and
    /// group sandbox managers; see --ladder).
    #[arg(long, visible_alias = "routing", default_value = "ch-rlu", value_parser = parse_routing)]
    balance: RoutingName,
    /// atoll: the Table 1 rung: gfr, gdr, gdpi, atoll or d-atoll. It also sets the queue
    /// (fcfs for gfr, srsf above) and a 15-minute keep-alive unless --queue or
    /// --keepalive-ttl say otherwise.
    #[arg(long, default_value = "atoll", value_parser = parse_ladder)]
    ladder: Ladder,
    /// atoll: workers per group (an SGS's worker pool); workers fill groups in order.
    #[arg(long, default_value_t = 1)]
    group_size: u32,
    /// atoll: how a function moves onto a new group: gradual (lottery over sandboxes) or
    /// instant (equal shares at once).
    #[arg(long, default_value = "gradual", value_parser = parse_scale_out)]
    scale_out: ScaleOutMode,
    /// atoll: hard-eviction victims in a full proactive pool: fair or lru.
    #[arg(long, default_value = "fair", value_parser = parse_victim)]
    victim: VictimPolicy,
    /// atoll: share of each worker's memory reserved for proactive sandboxes (gdpi, atoll,
    /// d-atoll), 0 to 0.95.
    #[arg(long, default_value_t = hearth_sim::config::PROACTIVE_SHARE)]
    proactive_share: f64,
    /// Every function's sandbox set-up (cold start) time, in ms, instead of the metadata's
    /// (Atoll's Fig. 12a allocation overheads).
    #[arg(long)]
    alloc_overhead_ms: Option<f64>,
    /// CH-BL/CH-RLU load bound b.
    #[arg(long)]
    b: Option<f64>,
    /// CH-RLU upper load bound b_max.
    #[arg(long)]
    b_max: Option<f64>,
    /// Keep-alive policy: ttl, lru, gdsf, lfu, landlord or hist.
    #[arg(long, default_value = "ttl")]
    keepalive: KeepAliveKind,
    /// Idle time before a sandbox expires under ttl (default 10m; atoll: 15m).
    #[arg(long, value_parser = humantime::parse_duration)]
    keepalive_ttl: Option<Duration>,
    /// Queue discipline: fcfs, sjf, eedf, rare or srsf (default eedf; atoll: the ladder's).
    #[arg(long)]
    queue: Option<QueueDiscipline>,
    /// Queued invocations per worker beyond which it refuses.
    #[arg(long, default_value_t = 10_000)]
    max_queue: usize,
    /// Concurrency limit: a number (0: the CPUs), aimd, or unlimited (pure processor sharing).
    #[arg(long, visible_alias = "regulator", default_value = "0")]
    concurrency: String,
    /// Invocations expected to take less than this skip the queue (0: never).
    #[arg(long, default_value_t = 0.0)]
    bypass_ms: f64,
    /// How often each worker pushes its (stale) status to the balancer.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    status_interval: Duration,
    /// Workers wait for a busy sandbox of the function rather than start one when that is
    /// expected to be sooner (the worker's `warm_wait`).
    #[arg(long)]
    warm_wait: bool,
    /// Most generic sandboxes each worker keeps ready for cold starts to specialize (0: none;
    /// the worker's `generic_pool`). The pool holds one per cold start of the last 30 s, at
    /// least `--generic-pool-min`.
    #[arg(long, default_value_t = 0)]
    generic_pool: u32,
    #[arg(long, default_value_t = 1)]
    generic_pool_min: u32,
    /// MiB one generic sandbox holds until it is specialized.
    #[arg(long, default_value_t = 64)]
    generic_memory: u64,
    /// Time to make a sandbox: what a cold start on a generic sandbox saves.
    #[arg(long, default_value = "40ms", value_parser = humantime::parse_duration)]
    generic_create: Duration,
    /// Seed of the balancer's random generator (random policy, CH-RLU's load noise).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Start each function's sandboxes on every worker before the trace, by Little's law
    /// (rate × warm time), as `hearth load trace --prewarm` does.
    #[arg(long)]
    prewarm: bool,
    /// Each worker's CPU model: ps (processor sharing, the default), or a time-sliced
    /// scheduler: cfs, fifo, srpt (an oracle), sfs or alps (docs/alps.md).
    #[arg(long, default_value = "ps")]
    cpu_sched: CpuSched,
    /// Each worker's server model: ps (ideal processor sharing, the default) or contention
    /// (processor sharing with the interference measured on runc: overcommit overhead,
    /// concurrent creations slower and taking CPU; docs/simulator.md). Needs --cpu-sched ps.
    #[arg(long, default_value = "ps")]
    server: Server,
    /// CPU time one context switch costs under the time-sliced schedulers.
    #[arg(long, default_value = "0us", value_parser = humantime::parse_duration)]
    switch_cost: Duration,
    /// Spread of each invocation's CPU work around its function's warm time (0 to 0.9: each
    /// takes warm × (1 ± up to this), drawn per invocation from --seed).
    #[arg(long, default_value_t = 0.0)]
    work_spread: f64,
    /// Horizontal autoscaling between MIN and MAX workers (e.g. 3..12), by the controller's
    /// autoscaler on the workers' reported loads; the cluster starts with --workers
    /// (docs/autoscaling.md). Needs one of the controller's balancing policies.
    #[arg(long, value_parser = parse_worker_range)]
    autoscale: Option<(u32, u32)>,
    /// Autoscaling: no second action within this of the previous one.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    dead_band: Duration,
    /// Autoscaling: from the decision to an added worker taking work.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    worker_start: Duration,
    /// Closed loop: CLIENTS clients replace the trace's arrivals; each picks a function by its
    /// share of the trace's invocations, waits for the answer, thinks (--think-min to
    /// --think-max) and invokes again, until the trace's last arrival time (as Locust threads,
    /// docs/simulator.md).
    #[arg(long, value_name = "CLIENTS")]
    closed_loop: Option<u32>,
    /// Closed loop: shortest think time after an answer.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration, requires = "closed_loop")]
    think_min: Duration,
    /// Closed loop: longest think time after an answer (drawn uniformly between the two).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration, requires = "closed_loop")]
    think_max: Duration,
}

/// `MIN..MAX` workers.
fn parse_worker_range(s: &str) -> Result<(u32, u32), String> {
    let (lo, hi) = s
        .split_once("..")
        .ok_or_else(|| format!("expected MIN..MAX (e.g. 3..12), got {s:?}"))?;
    let num = |v: &str| {
        v.trim()
            .parse::<u32>()
            .map_err(|_| format!("expected MIN..MAX with whole numbers, got {s:?}"))
    };
    Ok((num(lo)?, num(hi)?))
}

/// A routing policy by name: one of the controller's, or the simulator's greedy baseline.
#[derive(Debug, Clone, Copy)]
pub enum RoutingName {
    Balancer(BalanceKind),
    Greedy,
    Atoll,
}

fn parse_routing(s: &str) -> Result<RoutingName, String> {
    match s {
        "greedy" => return Ok(RoutingName::Greedy),
        "atoll" => return Ok(RoutingName::Atoll),
        _ => {}
    }
    s.parse::<BalanceKind>()
        .map(RoutingName::Balancer)
        .map_err(|e| format!("{e}, greedy or atoll"))
}

pub fn parse_ladder(s: &str) -> Result<Ladder, String> {
    Ladder::parse(s).ok_or_else(|| {
        format!("unknown ladder rung {s:?} (expected gfr, gdr, gdpi, atoll or d-atoll)")
    })
}

pub fn parse_scale_out(s: &str) -> Result<ScaleOutMode, String> {
    match s {
        "gradual" => Ok(ScaleOutMode::Gradual),
        "instant" => Ok(ScaleOutMode::Instant),
        _ => Err(format!(
            "unknown scale-out {s:?} (expected gradual or instant)"
        )),
    }
}

pub fn parse_victim(s: &str) -> Result<VictimPolicy, String> {
    match s {
        "fair" => Ok(VictimPolicy::Fair),
        "lru" => Ok(VictimPolicy::Lru),
        _ => Err(format!(
            "unknown victim policy {s:?} (expected fair or lru)"
        )),
    }
}

/// The longest set-up time `--alloc-overhead-ms` accepts (10 minutes).
const MAX_OVERHEAD_MS: f64 = 600_000.0;

/// A memory size in MiB: `32GiB`, `32G`, `512MiB`, `512M`, or a plain number of MiB.
pub fn parse_size_mb(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("expected a size such as 32GiB or 512MiB, got {s:?}"))?;
    let factor = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "m" | "mb" | "mib" => 1.0,
        "g" | "gb" | "gib" => 1024.0,
        "t" | "tb" | "tib" => 1024.0 * 1024.0,
        _ => return Err(format!("unknown size unit in {s:?} (use MiB, GiB or TiB)")),
    };
    Ok((v * factor).round() as u64)
}

/// `N` (0: the CPUs), `aimd`, or `unlimited`.
pub fn parse_concurrency(s: &str, cpus: u32) -> Result<RegulatorConfig> {
    match s {
        "aimd" => Ok(RegulatorConfig::Aimd(AimdConfig::default())),
        "unlimited" | "none" => Ok(RegulatorConfig::Fixed(u32::MAX)),
        _ => match s.parse::<u32>() {
            Ok(0) => Ok(RegulatorConfig::Fixed(cpus)),
            Ok(n) => Ok(RegulatorConfig::Fixed(n)),
            Err(_) => {
                bail!("--concurrency must be a number of invocations, aimd or unlimited, got {s:?}")
            }
        },
    }
}

/// The regulator's name, with the unlimited limit spelled out.
pub fn concurrency_name(r: &RegulatorConfig) -> String {
    match r {
        RegulatorConfig::Fixed(u32::MAX) => "unlimited".into(),
        other => other.name(),
    }
}

impl SimArgs {
    fn config(&self) -> Result<SimConfig> {
        let atoll = matches!(self.balance, RoutingName::Atoll);
        let routing = match self.balance {
            RoutingName::Greedy => Routing::Greedy,
            RoutingName::Atoll => {
                if !(1..=1024).contains(&self.group_size) {
                    bail!("--group-size must be between 1 and 1024");
                }
                let mut c = AtollConfig {
                    ladder: self.ladder,
                    group_size: self.group_size,
                    scale_out: self.scale_out,
                    seed: self.seed,
                    ..AtollConfig::default()
                };
                c.alloc.victim = self.victim;
                Routing::Atoll(c)
            }
            RoutingName::Balancer(kind) => {
                let mut params = BalanceParams {
                    seed: self.seed,
                    ..BalanceParams::default()
                };
                if let Some(b) = self.b {
                    params.b = b;
                }
                if let Some(b) = self.b_max {
                    params.b_max = b;
                }
                Routing::Balancer(kind, params)
            }
        };
        if !(self.bypass_ms.is_finite() && self.bypass_ms >= 0.0) {
            bail!("--bypass-ms must be a non-negative number");
        }
        if !(self.proactive_share.is_finite() && (0.0..=0.95).contains(&self.proactive_share)) {
            bail!("--proactive-share must be a fraction between 0 and 0.95");
        }
        if let Some(ms) = self.alloc_overhead_ms {
            if !(ms.is_finite() && (0.0..=MAX_OVERHEAD_MS).contains(&ms)) {
                bail!("--alloc-overhead-ms must be between 0 and {MAX_OVERHEAD_MS} ms");
            }
        }
        let queue = self.queue.unwrap_or(if atoll {
            self.ladder.queue()
        } else {
            QueueDiscipline::Eedf
        });
        let ttl_us = match self.keepalive_ttl {
            Some(d) => d.as_micros() as u64,
            None if atoll => ATOLL_TTL_US,
            None => 600_000_000,
        };
        Ok(SimConfig {
            workers: self.workers,
            cpus: self.cpus,
            memory_mb: self.memory,
            free_buffer_mb: self.free_buffer,
            queue,
            max_queue: self.max_queue,
            regulator: parse_concurrency(&self.concurrency, self.cpus)?,
            bypass: BypassConfig {
                threshold_us: (self.bypass_ms * 1000.0).round() as u64,
                ..BypassConfig::default()
            },
            keepalive: KeepAliveConfig {
                ttl: ttl_us,
                ..KeepAliveConfig::new(self.keepalive)
            },
            routing,
            status_interval_us: self.status_interval.as_micros() as u64,
            warm_wait: self.warm_wait,
            generic: if self.generic_pool == 0 {
                GenericConfig::OFF
            } else {
                GenericConfig {
                    max: self.generic_pool,
                    min: self.generic_pool_min.min(self.generic_pool),
                    memory_mb: self.generic_memory,
                    window_us: GENERIC_WINDOW_US,
                }
            },
            generic_create_us: self.generic_create.as_micros() as u64,
            proactive_share: self.proactive_share,
            cpu: {
                let mut cpu = CpuConfig::new(self.cpu_sched);
                cpu.params.switch_cost_us =
                    self.switch_cost.as_micros().min(u128::from(u64::MAX)) as u64;
                cpu
            },
            server: self.server,
            work_spread: self.work_spread,
            work_seed: self.seed,
            elastic: None,
            // Set from the trace once it is read (see `run`).
            clients: None,
            autoscale: self.autoscale.map(|(min, max)| SimAutoscale {
                params: AutoscaleParams {
                    min_workers: min,
                    max_workers: max,
                    dead_band_ms: self.dead_band.as_millis().min(u128::from(u64::MAX)) as u64,
                    ..AutoscaleParams::default()
                },
                interval_us: self
                    .status_interval
                    .as_micros()
                    .clamp(1, u128::from(u64::MAX)) as u64,
                start_us: self.worker_start.as_micros().min(u128::from(u64::MAX)) as u64,
            }),
        })
    }
}

/// Counts invocations that ended later than their function's deadline after arrival (a dropped
/// one misses it too).
struct Deadlines {
    deadline_us: Vec<Option<u64>>,
    with: u64,
    missed: u64,
}

impl Deadlines {
    fn new(w: &Workload) -> Self {
        Deadlines {
            deadline_us: w.functions.iter().map(|f| f.deadline_us).collect(),
            with: 0,
            missed: 0,
        }
    }
}

impl Sink for Deadlines {
    fn record(&mut self, r: &Record) -> hearth_sim::Result<()> {
        if let Some(d) = self.deadline_us.get(r.function as usize).copied().flatten() {
            self.with += 1;
            self.missed += u64::from(!r.is_done() || r.e2e_us() > d);
        }
        Ok(())
    }
}

/// Turns the trace into a closed loop of `clients` clients: the functions weighted by their
/// invocations, for the trace's span; the arrivals are dropped (the clients make their own).
fn closed_loop(workload: &mut Workload, clients: u32, a: &SimArgs) -> Result<ClosedLoop> {
    if clients == 0 || clients > hearth_sim::closed_loop::MAX_CLIENTS {
        bail!(
            "--closed-loop must be between 1 and {} clients",
            hearth_sim::closed_loop::MAX_CLIENTS
        );
    }
    if a.think_min > a.think_max {
        bail!(
            "--think-min ({}) must not be longer than --think-max ({})",
            humantime::format_duration(a.think_min),
            humantime::format_duration(a.think_max)
        );
    }
    let us = |d: Duration| d.as_micros().min(u128::from(u64::MAX)) as u64;
    let weights = workload.counts().into_iter().map(|n| n as f64).collect();
    let span_us = workload.arrivals.last().map_or(0, |x| x.at_us) + 1;
    workload.arrivals.clear();
    let spec = ClosedLoop::fixed(
        clients,
        weights,
        us(a.think_min),
        us(a.think_max),
        span_us,
        a.seed,
    );
    spec.check(workload.functions.len())?;
    Ok(spec)
}

/// The generic pool's sizing window, as the worker's default `generic_pool_window_s`.
const GENERIC_WINDOW_US: u64 = 30_000_000;

pub fn run(a: SimArgs) -> Result<()> {
    let mut config = a.config()?;
    config.check()?;
    let meta = a
        .meta
        .clone()
        .unwrap_or_else(|| metadata::default_path(&a.trace));
    let t0 = Instant::now();
    let trace = Trace::read(&a.trace)?;
    let metadata = Metadata::read(&meta)?;
    let mut workload = Workload::new(&trace, &metadata)?;
    if a.prewarm {
        workload.prewarm_by_littles_law(&trace, &metadata);
    }
    if let Some(ms) = a.alloc_overhead_ms {
        workload.set_init_us((ms * 1000.0).round() as u64);
    }
    drop(trace);
    if let Some(n) = a.closed_loop {
        config.clients = Some(closed_loop(&mut workload, n, &a)?);
    }
    let read_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut sink = CsvSink::create(&workload, &a.out)?;
    let mut deadlines = Deadlines::new(&workload);
    let stats = hearth_sim::simulate(&workload, &config, &mut Tee(&mut sink, &mut deadlines))?;
    sink.finish()
        .with_context(|| format!("writing {}", a.out.display()))?;
    let sim_s = t1.elapsed().as_secs_f64();
    let span_s = stats.end_us as f64 / 1e6;
    println!(
        "simulated {} invocations of {} functions on {} workers × {} CPUs ({}, {}, {}, concurrency {})",
        stats.invocations,
        workload.functions.len(),
        config.workers,
        config.cpus,
        config.routing.name(),
        config.keepalive.kind,
        config.queue.name(),
        concurrency_name(&config.regulator),
    );
    println!(
        "completed {}, dropped {}, cold {} ({:.2}% of completed)",
        stats.completed,
        stats.dropped,
        stats.cold,
        100.0 * stats.cold as f64 / stats.completed.max(1) as f64
    );
    if deadlines.with > 0 {
        println!(
            "deadlines missed {} of {} ({:.2}%; dropped ones count as missed)",
            deadlines.missed,
            deadlines.with,
            100.0 * deadlines.missed as f64 / deadlines.with as f64
        );
    }
    if let Routing::Atoll(c) = &config.routing {
        println!(
            "atoll {}: {} proactive sandboxes created, {} refused by full pools, {} commands without a sandbox",
            c.ladder.as_str(),
            stats.proactive_created,
            stats.proactive_refused,
            stats.proactive_mismatched
        );
        if let Some(s) = &stats.atoll {
            println!(
                "atoll {}: routed {} ({} to a free proactive sandbox), {} scale-outs, {} scale-ins; allocator: {} creates, {} unmarks, {} soft evictions, {} evictions, {} skipped",
                c.ladder.as_str(),
                s.routed,
                s.routed_to_free,
                s.scale_outs,
                s.scale_ins,
                s.creates,
                s.unmarks,
                s.soft_evicts,
                s.evicts,
                s.skipped
            );
        }
    }
    if config.autoscale.is_some() {
        let outs = stats
            .scaling
            .iter()
            .filter(|e| e.decision.direction == hearth_core::autoscale::Direction::Out)
            .count();
        println!(
            "autoscaling: {} scale-outs, {} scale-ins, at most {} workers at once",
            outs,
            stats.scaling.len() - outs,
            stats.peak_workers
        );
        for e in &stats.scaling {
            println!(
                "  at {:.1} s: scale {} by {} ({})",
                e.at_us as f64 / 1e6,
                e.decision.direction.as_str(),
                e.decision.count,
                e.decision.reason()
            );
        }
    }
    if config.cpu.sched != CpuSched::Ps {
        println!(
            "cpu {}: {} context switches ({:.2} per invocation), {} preemptions, {} demotions to fair sharing",
            config.cpu.sched,
            stats.context_switches,
            stats.context_switches as f64 / stats.completed.max(1) as f64,
            stats.preemptions,
            stats.demotions
        );
    }
    println!(
        "virtual time {span_s:.1} s in {sim_s:.2} s of wall time ({:.0} invocations/s, {:.0}× real time; reading the trace took {read_s:.2} s)",
        stats.invocations as f64 / sim_s.max(1e-9),
        span_s / sim_s.max(1e-9)
    );
    println!(
        "wrote {} (summary and plots: hearth report {} --meta {})",
        a.out.display(),
        a.out.display(),
        meta.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_mib() {
        assert_eq!(parse_size_mb("32GiB"), Ok(32 * 1024));
        assert_eq!(parse_size_mb("512MiB"), Ok(512));
        assert_eq!(parse_size_mb("1.5G"), Ok(1536));
        assert_eq!(parse_size_mb("300"), Ok(300));
        assert!(parse_size_mb("lots").is_err());
        assert!(parse_size_mb("3 parsecs").unwrap_err().contains("unit"));
    }

    #[test]
    fn worker_ranges_parse() {
        assert_eq!(parse_worker_range("3..12"), Ok((3, 12)));
        assert!(parse_worker_range("3-12").is_err());
        assert!(parse_worker_range("a..2").is_err());
    }

    #[test]
    fn concurrency_names() {
        assert_eq!(
            parse_concurrency("0", 16).unwrap(),
            RegulatorConfig::Fixed(16)
        );
        assert_eq!(
            parse_concurrency("unlimited", 16).unwrap(),
            RegulatorConfig::Fixed(u32::MAX)
        );
        assert!(matches!(
            parse_concurrency("aimd", 16).unwrap(),
            RegulatorConfig::Aimd(_)
        ));
        assert!(parse_concurrency("lots", 16).is_err());
    }
}
