//! A worker's CPUs as a time-sliced scheduler: jobs run on discrete CPUs, one at a time each,
//! switched at slice ends, completions, preemptions and demotions, with each switch counted
//! (and optionally charged). Beside processor sharing ([`crate::cpu`], the fluid ideal of fair
//! sharing) it models what the kernel does and what a priority policy changes.
//!
//! Two levels, as SFS and ALPS drive the kernel:
//!
//! * **priority**: jobs ordered by a key, lower first; a job arriving with a lower key than a
//!   running priority job preempts the one with the highest key, and any priority job preempts
//!   a fair-level one. A priority job runs until it ends or spends its *budget* of CPU time,
//!   then is demoted to the fair level.
//! * **fair**: CFS-like. Jobs ordered by virtual runtime (CPU time received, all weights
//!   equal); a new job starts at the current minimum and preempts a running fair job only if
//!   that one is more than the wakeup granularity ahead. A running job gets a slice of
//!   `max(latency / nr, min_granularity)`, nr being the fair jobs per CPU; at the slice's end
//!   it yields if a waiting job is behind it in virtual runtime. Fair jobs run only on CPUs no
//!   priority job needs.
//!
//! The disciplines are settings of these two levels: **CFS** all fair; **FIFO** all priority
//! by arrival with an unlimited budget; **SRPT** (an oracle: it knows each job's work) all
//! priority by remaining work; **SFS** and **ALPS** priority by the core's
//! [`CpuScheduler::policy_for`] (SFS: one slice, equal ranks, so FIFO; ALPS: the learned rank
//! and slice), then fair. The frontend is the core's own code, fed completions and ticked with
//! the utilization of the last tick interval.
//!
//! One global run queue per level (no per-CPU queues, no migration cost); a context switch is a
//! job put on a CPU other than the one that ran there last, and costs `switch_cost_us` of CPU
//! time before the job makes progress. Each switch, preemption and slice end is an event: the
//! cost is O(log n) per event, and there are about (CPU time ÷ slice) of them.

use hearth_core::cpu_sched::{Completion, CpuScheduler};
use hearth_core::Micros;
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, VecDeque};
use std::sync::Arc;

/// How jobs are ordered (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Discipline {
    Cfs,
    Fifo,
    Srpt,
    /// SFS or ALPS: the core's [`CpuScheduler`] gives each job its rank and budget.
    Frontend,
}

/// The fair level's and the model's constants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantumParams {
    /// CFS' scheduling period for up to `latency / min_granularity` jobs per CPU (Linux with 8
    /// or more CPUs: 24 ms).
    pub latency_us: Micros,
    /// The shortest slice (Linux: 3 ms).
    pub min_granularity_us: Micros,
    /// How far ahead in virtual runtime a running job must be for a newcomer to preempt it
    /// (Linux: 4 ms).
    pub wakeup_granularity_us: Micros,
    /// CPU time a context switch costs before the job runs.
    pub switch_cost_us: Micros,
    /// How often the frontend is ticked with the utilization of the interval.
    pub tick_us: Micros,
}

impl Default for QuantumParams {
    fn default() -> Self {
        QuantumParams {
            latency_us: 24_000,
            min_granularity_us: 3_000,
            wakeup_granularity_us: 4_000,
            switch_cost_us: 0,
            tick_us: 1_000_000,
        }
    }
}

/// What the scheduler did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuStats {
    /// Jobs put on a CPU that last ran another job (or none).
    pub switches: u64,
    /// Jobs taken off a CPU before they ended or used their priority budget.
    pub preemptions: u64,
    /// Priority jobs moved to fair sharing (budget spent, or SFS' overload rule).
    pub demotions: u64,
    /// CPU time busy, switch costs included (µs, all CPUs).
    pub busy_us: u128,
    /// ALPS trainings.
    pub trainings: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Priority,
    Fair,
}

#[derive(Debug, Clone)]
struct Job {
    work: Micros,
    remaining: Micros,
    /// Priority CPU time left.
    budget: Micros,
    vruntime: Micros,
    /// Arrival order, unique for the model's life.
    seq: u64,
    /// Priority order (lower first): (rank or remaining work, seq).
    key: (u64, u64),
    level: Level,
    entered: Micros,
    function: u32,
    cpu: Option<u32>,
}

#[derive(Debug, Clone, Default)]
struct Cpu {
    job: Option<u32>,
    /// When the job makes progress from (after a switch's cost).
    since: Micros,
    /// Generation of the CPU's pending event (older ones are stale).
    gen: u64,
    /// Seq of the job that ran here last (0: none).
    last_seq: u64,
}

/// The time-sliced CPUs of one worker. Jobs are the caller's ids (small integers, reused only
/// after the job ended or was removed).
#[derive(Debug, Clone)]
pub struct QuantumCpu {
    discipline: Discipline,
    params: QuantumParams,
    frontend: CpuScheduler,
    /// Function names by index, for the frontend.
    names: Arc<[Arc<str>]>,
    cpus: Vec<Cpu>,
    idle: Vec<u32>,
    jobs: Vec<Option<Job>>,
    live: usize,
    priority: BTreeSet<((u64, u64), u32)>,
    fair: BTreeSet<(Micros, u64, u32)>,
    /// Fair jobs, running or waiting.
    fair_count: usize,
    min_vruntime: Micros,
    events: BinaryHeap<Reverse<(Micros, u32, u64)>>,
    finished: VecDeque<u32>,
    now: Micros,
    seq: u64,
    next_tick: Micros,
    busy: u32,
    busy_at: Micros,
    busy_integral: u128,
    busy_at_tick: u128,
    last_tick: Micros,
    stats: CpuStats,
}

impl QuantumCpu {
    /// `cpus` CPUs under `discipline`; `frontend` gives ranks and budgets under
    /// [`Discipline::Frontend`] (ignored otherwise); `names` are the functions' names by index.
    pub fn new(
        cpus: u32,
        discipline: Discipline,
        params: QuantumParams,
        frontend: CpuScheduler,
        names: Arc<[Arc<str>]>,
    ) -> Self {
        let n = cpus.max(1);
        QuantumCpu {
            discipline,
            params,
            frontend,
            names,
            cpus: vec![Cpu::default(); n as usize],
            idle: (0..n).rev().collect(),
            jobs: Vec::new(),
            live: 0,
            priority: BTreeSet::new(),
            fair: BTreeSet::new(),
            fair_count: 0,
            min_vruntime: 0,
            events: BinaryHeap::new(),
            finished: VecDeque::new(),
            now: 0,
            seq: 0,
            next_tick: params.tick_us.max(1),
            busy: 0,
            busy_at: 0,
            busy_integral: 0,
            busy_at_tick: 0,
            last_tick: 0,
            stats: CpuStats::default(),
        }
    }

    /// Jobs on the CPUs or waiting for one (finished ones not yet taken included).
    pub fn len(&self) -> usize {
        self.live + self.finished.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn stats(&self) -> CpuStats {
        let mut s = self.stats;
        s.busy_us = self.busy_integral;
        s
    }

    pub fn frontend(&self) -> &CpuScheduler {
        &self.frontend
    }

    /// `job`, an invocation of function `function`, becomes runnable at `now` with `work_us`
    /// of CPU work.
    pub fn enter(&mut self, now: Micros, job: u32, work_us: Micros, function: u32) {
        self.advance(now);
        self.seq += 1;
        let seq = self.seq;
        let (level, budget, key) = match self.discipline {
            Discipline::Cfs => (Level::Fair, 0, (0, seq)),
            Discipline::Fifo => (Level::Priority, Micros::MAX, (0, seq)),
            Discipline::Srpt => (Level::Priority, Micros::MAX, (work_us, seq)),
            Discipline::Frontend => {
                self.frontend.arrived(now);
                let name = self.names.get(function as usize).map_or("", |n| &**n);
                let s = self.frontend.policy_for(name);
                if s.slice_us == 0 {
                    (Level::Fair, 0, (0, seq))
                } else {
                    (Level::Priority, s.slice_us, (u64::from(s.rank), seq))
                }
            }
        };
        let i = job as usize;
        if self.jobs.len() <= i {
            self.jobs.resize(i + 1, None);
        }
        let vruntime = if level == Level::Fair {
            self.fair_count += 1;
            self.refresh_min_vruntime()
        } else {
            0
        };
        self.jobs[i] = Some(Job {
            work: work_us,
            remaining: work_us,
            budget,
            vruntime,
            seq,
            key,
            level,
            entered: now,
            function,
            cpu: None,
        });
        self.live += 1;
        if work_us == 0 {
            self.finish(job, now);
        } else {
            self.place(job);
        }
        self.clean();
    }

    /// When the model next needs to be called ([`QuantumCpu::pop_finished`]): a job's end, a
    /// slice's end, a demotion, or the frontend's tick.
    pub fn next_event(&self) -> Option<Micros> {
        if !self.finished.is_empty() {
            return Some(self.now);
        }
        let cpu = self.events.peek().map(|Reverse((t, _, _))| *t);
        let tick =
            (self.live > 0 && self.discipline == Discipline::Frontend).then_some(self.next_tick);
        match (cpu, tick) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The next job whose work is done by `now`, if any (call until `None`).
    pub fn pop_finished(&mut self, now: Micros) -> Option<u32> {
        self.advance(now);
        self.clean();
        self.finished.pop_front()
    }

    /// Takes `job` away at `now` before its work is done (its invocation timed out).
    pub fn remove(&mut self, now: Micros, job: u32) -> bool {
        self.advance(now);
        if let Some(pos) = self.finished.iter().position(|&j| j == job) {
            self.finished.remove(pos);
            return true;
        }
        let Some(j) = self.jobs.get(job as usize).and_then(Option::as_ref) else {
            return false;
        };
        let (cpu, level, key, vr, seq) = (j.cpu, j.level, j.key, j.vruntime, j.seq);
        match cpu {
            Some(c) => {
                self.account(c, now);
                self.cpus[c as usize].job = None;
                self.dispatch(c, now);
            }
            None => {
                match level {
                    Level::Priority => self.priority.remove(&(key, job)),
                    Level::Fair => self.fair.remove(&(vr, seq, job)),
                };
            }
        }
        if level == Level::Fair {
            self.fair_count -= 1;
        }
        self.jobs[job as usize] = None;
        self.live -= 1;
        self.clean();
        true
    }

    /// Processes every event up to `now`: CPU events first, then the frontend's ticks, in time
    /// order.
    fn advance(&mut self, now: Micros) {
        loop {
            self.clean();
            let cpu = self.events.peek().map(|Reverse((t, c, _))| (*t, *c));
            let tick = (self.discipline == Discipline::Frontend).then_some(self.next_tick);
            match (cpu, tick) {
                (Some((t, c)), tk) if t <= now && tk.is_none_or(|tk| t <= tk) => {
                    self.events.pop();
                    self.now = self.now.max(t);
                    self.cpu_event(c, t);
                }
                (_, Some(tk)) if tk <= now => {
                    self.now = self.now.max(tk);
                    self.tick(tk);
                }
                _ => break,
            }
        }
        self.now = self.now.max(now);
    }

    /// Drops stale events from the top of the heap.
    fn clean(&mut self) {
        while let Some(Reverse((_, c, gen))) = self.events.peek() {
            if self.cpus[*c as usize].gen == *gen && self.cpus[*c as usize].job.is_some() {
                break;
            }
            self.events.pop();
        }
    }

    fn tick(&mut self, t: Micros) {
        self.integrate(t);
        let span = t.saturating_sub(self.last_tick).max(1) as f64 * self.cpus.len() as f64;
        let util = (self.busy_integral - self.busy_at_tick) as f64 / span * 100.0;
        self.busy_at_tick = self.busy_integral;
        self.last_tick = t;
        if self.frontend.tick(t, util).is_some() {
            self.stats.trainings += 1;
        }
        self.next_tick = t + self.params.tick_us.max(1);
    }

    fn integrate(&mut self, t: Micros) {
        if t > self.busy_at {
            self.busy_integral += u128::from(self.busy) * u128::from(t - self.busy_at);
            self.busy_at = t;
        }
    }

    fn job(&self, j: u32) -> &Job {
        self.jobs[j as usize]
            .as_ref()
            .expect("a job the model holds")
    }

    fn job_mut(&mut self, j: u32) -> &mut Job {
        self.jobs[j as usize]
            .as_mut()
            .expect("a job the model holds")
    }

    /// CPU time the job on `c` has had since it was put there (0 during the switch).
    fn ran(&self, c: usize, t: Micros) -> Micros {
        t.saturating_sub(self.cpus[c].since)
    }

    /// Charges the job on CPU `c` for its run up to `t`.
    fn account(&mut self, c: u32, t: Micros) {
        let c = c as usize;
        let Some(j) = self.cpus[c].job else { return };
        let ran = self.ran(c, t);
        self.cpus[c].since = self.cpus[c].since.max(t);
        let srpt = self.discipline == Discipline::Srpt;
        let job = self.job_mut(j);
        let ran = ran.min(job.remaining);
        job.remaining -= ran;
        match job.level {
            Level::Priority => {
                job.budget = job.budget.saturating_sub(ran);
                if srpt {
                    job.key = (job.remaining, job.seq);
                }
            }
            Level::Fair => job.vruntime += ran,
        }
    }

    /// The least virtual runtime of the fair jobs now (never decreasing, as CFS' min_vruntime).
    fn refresh_min_vruntime(&mut self) -> Micros {
        let mut least = self.fair.first().map(|&(v, _, _)| v);
        for c in 0..self.cpus.len() {
            if let Some(j) = self.cpus[c].job {
                let job = self.job(j);
                if job.level == Level::Fair {
                    let v = job.vruntime + self.ran(c, self.now).min(job.remaining);
                    least = Some(least.map_or(v, |l: Micros| l.min(v)));
                }
            }
        }
        if let Some(l) = least {
            self.min_vruntime = self.min_vruntime.max(l);
        }
        self.min_vruntime
    }

    /// A CPU's pending event came due at `t`.
    fn cpu_event(&mut self, c: u32, t: Micros) {
        let Some(j) = self.cpus[c as usize].job else {
            return;
        };
        self.account(c, t);
        let job = self.job(j);
        if job.remaining == 0 {
            self.cpus[c as usize].job = None;
            self.finish(j, t);
            self.dispatch(c, t);
            return;
        }
        match job.level {
            Level::Priority if job.budget == 0 => {
                self.cpus[c as usize].job = None;
                self.demote(j);
                self.dispatch(c, t);
            }
            Level::Priority => self.schedule(c),
            Level::Fair => {
                let vr = job.vruntime;
                let behind = self.fair.first().is_some_and(|&(v, _, _)| v < vr);
                if behind || !self.priority.is_empty() {
                    self.cpus[c as usize].job = None;
                    self.requeue(j);
                    self.stats.preemptions += 1;
                    self.dispatch(c, t);
                } else {
                    self.schedule(c);
                }
            }
        }
    }

    /// A job that ran out of priority budget (or waited too long for it) shares fairly from
    /// now, starting at the least virtual runtime.
    fn demote(&mut self, j: u32) {
        self.fair_count += 1;
        let min = self.refresh_min_vruntime();
        let job = self.job_mut(j);
        job.level = Level::Fair;
        job.cpu = None;
        job.vruntime = job.vruntime.max(min);
        let key = (job.vruntime, job.seq, j);
        self.fair.insert(key);
        self.stats.demotions += 1;
    }

    /// Puts a job taken off its CPU back in its level's queue.
    fn requeue(&mut self, j: u32) {
        let job = self.job_mut(j);
        job.cpu = None;
        match job.level {
            Level::Priority => {
                let key = (job.key, j);
                self.priority.insert(key);
            }
            Level::Fair => {
                let key = (job.vruntime, job.seq, j);
                self.fair.insert(key);
            }
        }
    }

    fn finish(&mut self, j: u32, t: Micros) {
        let Some(job) = self.jobs[j as usize].take() else {
            return;
        };
        self.live -= 1;
        if job.level == Level::Fair {
            self.fair_count -= 1;
        }
        self.finished.push_back(j);
        if self.discipline == Discipline::Frontend {
            let name = self.names.get(job.function as usize).map_or("", |n| &**n);
            self.frontend.completed(Completion {
                function: name,
                arrival_us: job.entered,
                end_us: t,
                cpu_us: job.work,
            });
        }
    }

    /// CPU `c` is free at `t`: the next priority job, else the next fair one, else idle.
    fn dispatch(&mut self, c: u32, t: Micros) {
        let overload = self.frontend.overload_wait_us();
        while let Some(&(key, j)) = self.priority.first() {
            self.priority.remove(&(key, j));
            let job = self.job(j);
            // SFS' overload rule: an invocation that waited too long for its slice (and has
            // not run yet) goes to fair sharing directly.
            if let Some(limit) = overload {
                if job.remaining == job.work && t.saturating_sub(job.entered) > limit {
                    self.demote(j);
                    continue;
                }
            }
            self.run_on(c, j, t);
            return;
        }
        if let Some(&(v, s, j)) = self.fair.first() {
            self.fair.remove(&(v, s, j));
            self.run_on(c, j, t);
            return;
        }
        self.integrate(t);
        self.busy -= 1;
        self.idle.push(c);
    }

    /// Runs job `j` on CPU `c` (busy already, or just taken from the idle list) from `t`.
    fn run_on(&mut self, c: u32, j: u32, t: Micros) {
        let seq = self.job(j).seq;
        let cost = self.params.switch_cost_us;
        let cpu = &mut self.cpus[c as usize];
        cpu.since = if cpu.last_seq != seq {
            self.stats.switches += 1;
            t + cost
        } else {
            t
        };
        cpu.last_seq = seq;
        cpu.job = Some(j);
        self.job_mut(j).cpu = Some(c);
        self.schedule(c);
    }

    /// The fair level's slice now.
    fn fair_slice(&self) -> Micros {
        let n = self.cpus.len();
        let per_cpu = self.fair_count.div_ceil(n).max(1) as Micros;
        (self.params.latency_us / per_cpu).max(self.params.min_granularity_us)
    }

    /// Arms CPU `c`'s next event: its job's end, its budget's end, or its slice's end.
    fn schedule(&mut self, c: u32) {
        let Some(j) = self.cpus[c as usize].job else {
            return;
        };
        let job = self.job(j);
        let run_for = match job.level {
            Level::Priority => job.remaining.min(job.budget),
            Level::Fair => job.remaining.min(self.fair_slice()),
        };
        let cpu = &mut self.cpus[c as usize];
        cpu.gen += 1;
        let at = cpu.since + run_for;
        self.events.push(Reverse((at, c, cpu.gen)));
    }

    /// Takes CPU `c` from its job at `self.now` (preempted) and puts `j` there.
    fn preempt_for(&mut self, c: u32, j: u32) {
        let now = self.now;
        self.account(c, now);
        if let Some(old) = self.cpus[c as usize].job.take() {
            self.requeue(old);
            self.stats.preemptions += 1;
        }
        self.run_on(c, j, now);
    }

    /// A new job: an idle CPU, else a CPU it may preempt, else its level's queue.
    fn place(&mut self, j: u32) {
        let now = self.now;
        if let Some(c) = self.idle.pop() {
            self.integrate(now);
            self.busy += 1;
            self.run_on(c, j, now);
            return;
        }
        let job = self.job(j);
        let (level, key, vr) = (job.level, job.key, job.vruntime);
        // The fair job furthest ahead, and the priority job with the highest key now.
        let mut fair_victim: Option<(Micros, Reverse<u32>)> = None;
        let mut prio_victim: Option<((u64, u64), u32)> = None;
        for c in 0..self.cpus.len() {
            let Some(r) = self.cpus[c].job else { continue };
            let running = self.job(r);
            let ran = self.ran(c, now).min(running.remaining);
            match running.level {
                Level::Fair => {
                    let cand = (running.vruntime + ran, Reverse(c as u32));
                    if fair_victim.is_none_or(|v| cand > v) {
                        fair_victim = Some(cand);
                    }
                }
                Level::Priority => {
                    let k = if self.discipline == Discipline::Srpt {
                        (running.remaining - ran, running.seq)
                    } else {
                        running.key
                    };
                    if prio_victim.is_none_or(|(pk, _)| k > pk) {
                        prio_victim = Some((k, c as u32));
                    }
                }
            }
        }
        match level {
            Level::Priority => {
                if let Some((_, Reverse(c))) = fair_victim {
                    self.preempt_for(c, j);
                } else if let Some((_, c)) = prio_victim.filter(|(k, _)| key < *k) {
                    self.preempt_for(c, j);
                } else {
                    self.priority.insert((key, j));
                }
            }
            Level::Fair => match fair_victim {
                Some((v, Reverse(c))) if v > vr + self.params.wakeup_granularity_us => {
                    self.preempt_for(c, j)
                }
                _ => {
                    let seq = self.job(j).seq;
                    self.fair.insert((vr, seq, j));
                }
            },
        }
    }
}

#[cfg(test)]
impl QuantumCpu {
    /// The scheduler's invariants: no CPU idles while a job waits, no fair job runs while a
    /// priority job waits, every held job is on a CPU or in exactly one queue.
    fn check(&self) {
        if !(self.priority.is_empty() && self.fair.is_empty()) {
            assert!(self.idle.is_empty(), "a CPU idles while jobs wait");
        }
        if !self.priority.is_empty() {
            for cpu in &self.cpus {
                let j = cpu.job.expect("busy");
                assert_eq!(
                    self.job(j).level,
                    Level::Priority,
                    "fair runs, priority waits"
                );
            }
        }
        let running = self.cpus.iter().filter(|c| c.job.is_some()).count();
        assert_eq!(running + self.idle.len(), self.cpus.len());
        assert_eq!(running as u32, self.busy);
        assert_eq!(running + self.priority.len() + self.fair.len(), self.live);
        let fair_running = self
            .cpus
            .iter()
            .filter_map(|c| c.job)
            .filter(|&j| self.job(j).level == Level::Fair)
            .count();
        assert_eq!(fair_running + self.fair.len(), self.fair_count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_core::cpu_sched::{AlpsConfig, CpuSchedConfig, CpuSchedKind, SfsConfig, SfsMode};

    const LONG: u32 = 0;
    const SHORT: u32 = 1;

    fn names() -> Arc<[Arc<str>]> {
        vec![Arc::from("long"), Arc::from("short")].into()
    }

    fn model(cpus: u32, d: Discipline, frontend: CpuScheduler) -> QuantumCpu {
        QuantumCpu::new(cpus, d, QuantumParams::default(), frontend, names())
    }

    /// Runs the model until it is empty, checking its invariants at every step; (job, end).
    fn drain(q: &mut QuantumCpu) -> Vec<(u32, Micros)> {
        let mut out = Vec::new();
        while let Some(t) = q.next_event() {
            while let Some(j) = q.pop_finished(t) {
                out.push((j, t));
            }
            q.check();
            if q.is_empty() {
                break;
            }
        }
        out
    }

    /// One CPU: a long job (100 ms) at 0 and a short one (10 ms) at 1 ms.
    fn long_then_short(q: &mut QuantumCpu) -> Vec<(u32, Micros)> {
        q.enter(0, 7, 100_000, LONG);
        q.check();
        q.enter(1_000, 8, 10_000, SHORT);
        q.check();
        drain(q)
    }

    #[test]
    fn cfs_makes_the_newcomer_wait_for_the_slice_then_shares() {
        // The long job's slice is the whole latency (alone: 24 ms); the short one, queued at
        // the least virtual runtime, gets the CPU at 24 ms with a slice of 24 / 2 = 12 ms and
        // ends at 34 ms; the long one ends at 110 ms.
        let mut q = model(1, Discipline::Cfs, CpuScheduler::Cfs);
        assert_eq!(long_then_short(&mut q), [(8, 34_000), (7, 110_000)]);
        let s = q.stats();
        assert_eq!((s.switches, s.preemptions, s.demotions), (3, 1, 0));
        assert_eq!(s.busy_us, 110_000);
    }

    #[test]
    fn srpt_runs_the_short_job_at_once_and_fifo_makes_it_wait() {
        let mut q = model(1, Discipline::Srpt, CpuScheduler::Cfs);
        assert_eq!(long_then_short(&mut q), [(8, 11_000), (7, 110_000)]);
        assert_eq!((q.stats().switches, q.stats().preemptions), (3, 1));
        let mut q = model(1, Discipline::Fifo, CpuScheduler::Cfs);
        assert_eq!(long_then_short(&mut q), [(7, 100_000), (8, 110_000)]);
        assert_eq!((q.stats().switches, q.stats().preemptions), (2, 0));
    }

    #[test]
    fn sfs_runs_its_slice_in_arrival_order_then_demotes() {
        // A fixed 20 ms slice: the long job runs 0–20 ms, is demoted; the short one (queued
        // behind it at the same rank) runs 20–30 ms; the long one ends alone at 110 ms.
        let c = CpuSchedConfig {
            kind: CpuSchedKind::Sfs,
            sfs: SfsConfig {
                mode: SfsMode::Fixed,
                slice_ms: 20,
                ..SfsConfig::default()
            },
            ..CpuSchedConfig::default()
        };
        let mut q = model(1, Discipline::Frontend, CpuScheduler::new(&c, 1).unwrap());
        assert_eq!(long_then_short(&mut q), [(8, 30_000), (7, 110_000)]);
        let s = q.stats();
        assert_eq!((s.switches, s.preemptions, s.demotions), (3, 0, 1));
    }

    #[test]
    fn sfs_overload_rule_sends_a_late_job_straight_to_fair_sharing() {
        // Slice 20 ms, overload factor 1: a third job queued behind two long ones has waited
        // 40 ms > 20 ms when a CPU frees: it is demoted without running at priority.
        let c = CpuSchedConfig {
            kind: CpuSchedKind::Sfs,
            sfs: SfsConfig {
                mode: SfsMode::Fixed,
                slice_ms: 20,
                overload_factor: 1.0,
                ..SfsConfig::default()
            },
            ..CpuSchedConfig::default()
        };
        let mut q = model(1, Discipline::Frontend, CpuScheduler::new(&c, 1).unwrap());
        q.enter(0, 1, 100_000, LONG);
        q.enter(0, 2, 100_000, LONG);
        q.enter(0, 3, 10_000, SHORT);
        let ends = drain(&mut q);
        assert_eq!(ends.len(), 3);
        // Two slices' demotions plus the late job's.
        assert_eq!(q.stats().demotions, 3);
        assert_eq!(q.stats().busy_us, 210_000);
    }

    /// An ALPS frontend trained on the hand-checked window: on one CPU, "long" (100 ms) every
    /// 200 ms and "short" (10 ms) 1 ms after it. SRPT: short preempts at once, slices [10] ms →
    /// tsᵘ = 20 ms, rank 1; long slices [1, 99] ms → ts = 50, stdev 49 → tsᵘ = 51 ms, rank 100.
    fn trained_alps() -> CpuScheduler {
        let c = CpuSchedConfig {
            kind: CpuSchedKind::Alps,
            alps: AlpsConfig::default(),
            ..CpuSchedConfig::default()
        };
        let mut s = CpuScheduler::new(&c, 1).unwrap();
        for k in 0..25u64 {
            let t = k * 200_000;
            s.completed(Completion {
                function: "long",
                arrival_us: t,
                end_us: t + 110_000,
                cpu_us: 100_000,
            });
            s.completed(Completion {
                function: "short",
                arrival_us: t + 1_000,
                end_us: t + 11_000,
                cpu_us: 10_000,
            });
        }
        assert!(s.tick(5_000_000, 0.0).is_some());
        assert_eq!(s.policy_for("short").rank, 1);
        assert_eq!(s.policy_for("short").slice_us, 20_000);
        assert_eq!(s.policy_for("long").rank, 100);
        assert_eq!(s.policy_for("long").slice_us, 51_000);
        s
    }

    #[test]
    fn alps_lets_the_better_rank_preempt_within_its_slice() {
        // long (rank 100, 51 ms) at 0; short (rank 1, 20 ms) at 1 ms preempts it and ends at
        // 11 ms; long resumes, spends its slice by 61 ms, is demoted and ends at 110 ms.
        let mut q = model(1, Discipline::Frontend, trained_alps());
        assert_eq!(long_then_short(&mut q), [(8, 11_000), (7, 110_000)]);
        let s = q.stats();
        assert_eq!((s.switches, s.preemptions, s.demotions), (3, 1, 1));
    }

    #[test]
    fn a_switch_costs_cpu_time_and_a_removed_job_frees_its_cpu() {
        let params = QuantumParams {
            switch_cost_us: 50,
            ..QuantumParams::default()
        };
        let mut q = QuantumCpu::new(1, Discipline::Fifo, params, CpuScheduler::Cfs, names());
        q.enter(0, 1, 1_000, LONG);
        q.enter(0, 2, 1_000, LONG);
        q.enter(0, 3, 1_000, LONG);
        // Job 1 ends at 1050; job 2 is removed at 1500 (450 µs into its run); job 3 ends at
        // 1500 + 50 + 1000.
        assert_eq!(q.pop_finished(1_050), Some(1));
        assert!(q.remove(1_500, 2));
        assert!(!q.remove(1_500, 2));
        q.check();
        assert_eq!(drain(&mut q), [(3, 2_550)]);
        assert_eq!(q.stats().switches, 3);
        assert_eq!(q.stats().busy_us, 2_550);
    }

    #[test]
    fn every_discipline_conserves_work_and_never_idles_while_jobs_wait() {
        let sfs = CpuSchedConfig {
            kind: CpuSchedKind::Sfs,
            ..CpuSchedConfig::default()
        };
        let alps = CpuSchedConfig {
            kind: CpuSchedKind::Alps,
            alps: AlpsConfig {
                window_ms: 1_000,
                ..AlpsConfig::default()
            },
            ..CpuSchedConfig::default()
        };
        let cases = [
            (Discipline::Cfs, CpuScheduler::Cfs),
            (Discipline::Fifo, CpuScheduler::Cfs),
            (Discipline::Srpt, CpuScheduler::Cfs),
            (Discipline::Frontend, CpuScheduler::new(&sfs, 3).unwrap()),
            (Discipline::Frontend, CpuScheduler::new(&alps, 3).unwrap()),
        ];
        for (d, front) in cases {
            let params = QuantumParams {
                tick_us: 100_000,
                ..QuantumParams::default()
            };
            let mut q = QuantumCpu::new(3, d, params, front, names());
            let mut x: u64 = 11;
            let mut work = std::collections::HashMap::new();
            let mut entered = std::collections::HashMap::new();
            let mut ends = Vec::new();
            let mut t = 0;
            for id in 0..3_000u32 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                t += (x >> 40) % 9_000;
                // Collect what ended before this arrival, as the simulator does.
                while let Some(e) = q.next_event().filter(|&e| e <= t) {
                    while let Some(j) = q.pop_finished(e) {
                        ends.push((j, e));
                    }
                    q.check();
                }
                let w = if (x >> 20).is_multiple_of(4) {
                    60_000
                } else {
                    2_000 + (x >> 33) % 8_000
                };
                let f = if w > 20_000 { LONG } else { SHORT };
                q.enter(t, id, w, f);
                q.check();
                work.insert(id, w);
                entered.insert(id, t);
            }
            ends.extend(drain(&mut q));
            assert_eq!(ends.len(), 3_000, "{d:?}: every job ends once");
            let mut seen = std::collections::HashSet::new();
            for (j, e) in &ends {
                assert!(seen.insert(*j), "{d:?}: job {j} ended twice");
                assert!(
                    *e >= entered[j] + work[j],
                    "{d:?}: job {j} ran faster than its work"
                );
            }
            let total: u128 = work.values().map(|&w| u128::from(w)).sum();
            assert_eq!(q.stats().busy_us, total, "{d:?}: busy time is the work");
            assert!(q.stats().switches >= 3_000, "{d:?}");
        }
    }
}
