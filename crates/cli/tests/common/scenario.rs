//! One scenario, two drivers: a live `hearth worker --backend sim` (the real async worker, its
//! HTTP API, the backend that sleeps instead of running code) and the discrete-event simulator
//! (`hearth_sim`, the same `hearth_core::WorkerEngine` on a virtual clock). Both must make the
//! same decisions: per call whether it ran warm or cold and why, whether it waited in the queue
//! or timed out; the order in which calls started; how many idle sandboxes were evicted.
//!
//! A [`Scenario`] is data only, so a new one is a new constant. The live worker runs in real time,
//! so a scenario must leave room for jitter: calls, expiries and runs at least ~100 ms apart
//! wherever the order of two of them decides something, and learned times (SJF's expected times,
//! GDSF's costs) far enough apart that a millisecond of overshoot cannot swap them. The
//! simulator's CPUs must not slow anything down (`cpus` ≥ `concurrency`): the `sim` backend
//! sleeps, it does not share CPUs.

use super::Server;
use hearth_core::balance::BalanceKind;
use hearth_core::time::{ms, secs};
use hearth_core::{KeepAliveConfig, KeepAliveKind, QueueDiscipline, RegulatorConfig};
use hearth_sim::workload::Arrival;
use hearth_sim::{simulate, Collect, End, Routing, SimConfig, SimFunction, Workload};
use serde_json::{json, Value};
use std::fmt;
use std::time::{Duration, Instant};

/// The worker's settings that decide anything here.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub memory_mb: u64,
    pub free_buffer_mb: u64,
    pub cpus: u32,
    pub concurrency: u32,
    /// `fcfs`, `sjf`, `eedf`, `rare` or `srsf`.
    pub queue: &'static str,
    /// `ttl`, `lru`, `gdsf`, `lfu`, `landlord` or `hist`.
    pub keepalive: &'static str,
    /// The TTL policy's keep-alive, in whole seconds as the worker takes it.
    pub keepalive_ttl_s: u64,
}

/// A function, registered with the `sim` backend's times (`sim_warm_ms`, `sim_cold_ms`).
#[derive(Debug, Clone, Copy)]
pub struct Function {
    pub name: &'static str,
    pub memory_mb: u64,
    /// Execution time.
    pub exec_ms: u64,
    /// Added time of a cold start.
    pub init_ms: u64,
    /// The function's `timeout_ms` (execution only); None: the worker's default.
    pub timeout_ms: Option<u64>,
}

/// `function` is invoked `at_ms` after the start.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    pub at_ms: u64,
    pub function: &'static str,
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: &'static str,
    pub settings: Settings,
    pub functions: &'static [Function],
    /// In time order.
    pub calls: &'static [Call],
}

/// What happened to one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Answered 200: warm (`cold: None`) or cold with the reason's name; whether it waited in
    /// the queue.
    Ran { cold: Option<String>, queued: bool },
    /// Killed at the function's timeout (504 `timeout`).
    TimedOut,
    /// Refused, with the error's code.
    Refused(String),
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Ran { cold, queued } => {
                write!(f, "{}", cold.as_deref().unwrap_or("warm"))?;
                if *queued {
                    write!(f, " (queued)")?;
                }
                Ok(())
            }
            Outcome::TimedOut => write!(f, "timeout"),
            Outcome::Refused(code) => write!(f, "refused: {code}"),
        }
    }
}

/// Everything a driver decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decisions {
    /// By call index.
    pub outcomes: Vec<Outcome>,
    /// Indices of the calls that ran (200), in the order they started (arrival + queue wait).
    pub run_order: Vec<usize>,
    /// Idle sandboxes destroyed to make room.
    pub evicted: u64,
}

impl Scenario {
    fn function(&self, name: &str) -> (usize, &Function) {
        self.functions
            .iter()
            .enumerate()
            .find(|(_, f)| f.name == name)
            .unwrap_or_else(|| panic!("scenario {}: no function {name}", self.name))
    }

    fn check(&self) {
        let s = &self.settings;
        assert!(
            s.cpus >= s.concurrency,
            "{}: the sim backend does not share CPUs",
            self.name
        );
        assert!(
            self.calls.windows(2).all(|w| w[0].at_ms <= w[1].at_ms),
            "{}: calls out of time order",
            self.name
        );
        for c in self.calls {
            self.function(c.function);
        }
    }

    /// The simulator's view: one worker configured as the live one.
    pub fn sim_config(&self) -> SimConfig {
        let s = &self.settings;
        let kind: KeepAliveKind = s.keepalive.parse().unwrap();
        SimConfig {
            workers: 1,
            cpus: s.cpus,
            memory_mb: s.memory_mb,
            free_buffer_mb: s.free_buffer_mb,
            queue: s.queue.parse::<QueueDiscipline>().unwrap(),
            regulator: RegulatorConfig::Fixed(s.concurrency),
            keepalive: KeepAliveConfig {
                ttl: secs(s.keepalive_ttl_s),
                ..KeepAliveConfig::new(kind)
            },
            routing: Routing::seeded(BalanceKind::RoundRobin, 1),
            ..SimConfig::default()
        }
    }

    pub fn workload(&self) -> Workload {
        Workload {
            functions: self
                .functions
                .iter()
                .map(|f| SimFunction {
                    timeout_us: f.timeout_ms.map(ms),
                    ..SimFunction::new(f.name, ms(f.exec_ms), ms(f.init_ms), f.memory_mb)
                })
                .collect(),
            arrivals: self
                .calls
                .iter()
                .map(|c| Arrival {
                    at_us: ms(c.at_ms),
                    function: self.function(c.function).0 as u32,
                })
                .collect(),
        }
    }

    /// Runs the scenario through the simulator with `config`.
    pub fn simulate_with(&self, config: &SimConfig) -> Decisions {
        self.check();
        let workload = self.workload();
        let mut out = Collect::default();
        let stats = simulate(&workload, config, &mut out).unwrap();
        let mut outcomes = vec![None; self.calls.len()];
        let mut starts = Vec::new();
        for r in &out.records {
            let o = match r.end {
                End::Done { cold, queue_us, .. } => {
                    starts.push((r.scheduled_us + queue_us, r.id as usize));
                    Outcome::Ran {
                        cold: cold.map(|c| c.as_str().to_string()),
                        queued: queue_us > 0,
                    }
                }
                End::TimedOut { .. } => Outcome::TimedOut,
                End::Dropped(d) => {
                    let text = d.describe();
                    Outcome::Refused(text.split(':').next().unwrap_or("").to_string())
                }
            };
            outcomes[r.id as usize] = Some(o);
        }
        starts.sort();
        Decisions {
            outcomes: outcomes.into_iter().map(Option::unwrap).collect(),
            run_order: starts.into_iter().map(|(_, i)| i).collect(),
            evicted: stats.evicted,
        }
    }

    /// Runs the scenario through the simulator, configured as the live worker.
    pub fn simulate(&self) -> Decisions {
        self.simulate_with(&self.sim_config())
    }

    /// Runs the scenario against a fresh `hearth worker --backend sim`, each call from a thread of
    /// its own at its time.
    pub fn run_live(&self) -> Decisions {
        self.check();
        let s = &self.settings;
        let (memory, free, ttl) = (
            s.memory_mb.to_string(),
            s.free_buffer_mb.to_string(),
            s.keepalive_ttl_s.to_string(),
        );
        let (cpus, concurrency) = (s.cpus.to_string(), s.concurrency.to_string());
        let server = Server::start_with_args(
            "sim",
            &[
                ("HEARTH_MEMORY_MB", &memory),
                ("HEARTH_FREE_BUFFER_MB", &free),
                ("HEARTH_KEEPALIVE_TTL_S", &ttl),
            ],
            &[
                "--cpus",
                &cpus,
                "--concurrency",
                &concurrency,
                "--queue",
                s.queue,
                "--keepalive",
                s.keepalive,
            ],
        );
        for f in self.functions {
            let mut spec = json!({
                "sim_warm_ms": f.exec_ms,
                "sim_cold_ms": f.init_ms,
                "memory_mb": f.memory_mb,
            });
            if let Some(t) = f.timeout_ms {
                spec["timeout_ms"] = json!(t);
            }
            let r = server.put_fn(f.name, spec);
            assert!(r.status < 300, "register {}: {}", f.name, r.text());
        }
        // Connections are made before the clock starts; each call waits for its instant.
        let t0 = Instant::now() + Duration::from_millis(100);
        let threads: Vec<_> = self
            .calls
            .iter()
            .map(|c| {
                let mut client = super::client_for(&server.url).unwrap();
                let path = format!("/v1/functions/{}/invoke", c.function);
                let at = t0 + Duration::from_millis(c.at_ms);
                std::thread::spawn(move || {
                    std::thread::sleep(at.saturating_duration_since(Instant::now()));
                    let late = Instant::now().saturating_duration_since(at);
                    let r = client.post(&path, b"{}").unwrap();
                    (r.status, r.json(), late)
                })
            })
            .collect();
        let answers: Vec<(u16, Value, Duration)> =
            threads.into_iter().map(|t| t.join().unwrap()).collect();
        let mut outcomes = Vec::new();
        let mut starts = Vec::new();
        for (i, (status, v, late)) in answers.iter().enumerate() {
            assert!(
                *late < Duration::from_millis(50),
                "{}: call {i} sent {late:?} late: the machine is too busy for this test",
                self.name
            );
            outcomes.push(match status {
                200 => {
                    let queue_us = v["timing"]["queue"].as_u64().unwrap();
                    starts.push((ms(self.calls[i].at_ms) + queue_us, i));
                    let cold = v["cold"].as_bool().unwrap();
                    Outcome::Ran {
                        cold: cold.then(|| v["cold_reason"].as_str().unwrap().to_string()),
                        queued: queue_us > 0,
                    }
                }
                504 if v["error"]["code"] == "timeout" => Outcome::TimedOut,
                _ => Outcome::Refused(v["error"]["code"].as_str().unwrap_or("?").to_string()),
            });
        }
        starts.sort();
        let metrics = server.client().get("/metrics").unwrap().text();
        let evicted = metrics
            .lines()
            .find_map(|l| l.strip_prefix(r#"hearth_sandboxes_destroyed_total{state="evicted"} "#))
            .map_or(0, |n| n.trim().parse().unwrap());
        Decisions {
            outcomes,
            run_order: starts.into_iter().map(|(_, i)| i).collect(),
            evicted,
        }
    }

    /// Call by call, side by side.
    pub fn table(&self, a: &Decisions, a_name: &str, b: &Decisions, b_name: &str) -> String {
        let mut t = format!(
            "{:>3} {:>6} {:<10} {:<24} {b_name}\n",
            "#", "at_ms", "function", a_name
        );
        for (i, c) in self.calls.iter().enumerate() {
            let show = |d: &Decisions| d.outcomes.get(i).map_or("-".into(), |o| o.to_string());
            let (x, y) = (show(a), show(b));
            let mark = if x == y { "" } else { "   <- differs" };
            t += &format!(
                "{i:>3} {:>6} {:<10} {x:<24} {y}{mark}\n",
                c.at_ms, c.function
            );
        }
        t += &format!(
            "run order: {a_name} {:?}, {b_name} {:?}\n",
            a.run_order, b.run_order
        );
        t += &format!(
            "evicted:   {a_name} {}, {b_name} {}\n",
            a.evicted, b.evicted
        );
        t
    }

    /// Drives the scenario both ways and asserts the same decisions; returns them.
    pub fn assert_live_matches_sim(&self) -> Decisions {
        let sim = self.simulate();
        let live = self.run_live();
        assert_eq!(
            live,
            sim,
            "scenario {}: the live worker and the simulator decided differently\n{}",
            self.name,
            self.table(&live, "live", &sim, "sim")
        );
        live
    }
}
