//! ALPS' frontend as a state machine: completions in, a training every window, policies out.

use super::config::{AlpsConfig, CpuSchedError};
use super::learn::{self, Learned};
use super::srpt::WindowJob;
use super::{Completion, Slice, Trained};
use crate::time::Micros;
use std::collections::HashMap;

/// ALPS' frontend (§5.1–5.2). The driver reports each completed invocation, calls
/// [`Alps::tick`] with the time and the CPU utilization (at least at
/// [`Alps::next_tick_at`]), and reads [`Alps::policy_for`] when an invocation starts.
#[derive(Debug, Clone)]
pub struct Alps {
    config: AlpsConfig,
    cpus: u32,
    /// The open window's completions, functions by index into `names`.
    window: Vec<WindowJob>,
    names: Vec<Box<str>>,
    index: HashMap<Box<str>, u32>,
    /// Completions of the open window left out (full window, too many functions, end before
    /// arrival).
    ignored: u64,
    window_from: Micros,
    next_train_at: Micros,
    /// The last training's policies.
    policies: HashMap<Box<str>, Learned>,
    /// The median tsᵘ of the last training: the slice of a function it did not see.
    unseen_us: f64,
    /// Eq. 3's p at the latest tick (1 with `overload` off).
    penalty: f64,
    trainings: u64,
}

impl Alps {
    /// A frontend for a worker of `cpus` CPUs whose clock starts at 0: the first window closes
    /// at W.
    pub fn new(config: AlpsConfig, cpus: u32) -> Result<Self, CpuSchedError> {
        config.validate()?;
        if !(1..=4096).contains(&cpus) {
            return Err(CpuSchedError::Cpus(cpus));
        }
        let next_train_at = config.window_us();
        Ok(Alps {
            config,
            cpus,
            window: Vec::new(),
            names: Vec::new(),
            index: HashMap::new(),
            ignored: 0,
            window_from: 0,
            next_train_at,
            policies: HashMap::new(),
            unseen_us: 0.0,
            penalty: 1.0,
            trainings: 0,
        })
    }

    pub fn config(&self) -> &AlpsConfig {
        &self.config
    }

    /// One invocation ended: it joins the open window.
    pub fn completed(&mut self, c: Completion<'_>) {
        if c.end_us < c.arrival_us || self.window.len() >= self.config.max_window {
            self.ignored += 1;
            return;
        }
        let function = match self.index.get(c.function) {
            Some(&i) => i,
            None => {
                if self.names.len() >= self.config.max_functions {
                    self.ignored += 1;
                    return;
                }
                let i = self.names.len() as u32;
                let name: Box<str> = c.function.into();
                self.names.push(name.clone());
                self.index.insert(name, i);
                i
            }
        };
        self.window.push(WindowJob {
            function,
            arrival_us: c.arrival_us,
            cpu_us: c.cpu_us,
        });
    }

    /// When the open window closes (call [`Alps::tick`] then, or later).
    pub fn next_tick_at(&self) -> Micros {
        self.next_train_at
    }

    /// Time passed to `now` and the worker's CPUs are `utilization_pct` busy: updates Eq. 3's
    /// penalty (every call), and when the window has run its W, trains on it and opens the
    /// next one. A window without completions keeps the previous policies. A utilization
    /// that is not a number leaves the penalty as it was.
    #[must_use = "a training is worth logging"]
    pub fn tick(&mut self, now: Micros, utilization_pct: f64) -> Option<Trained> {
        if self.config.overload && utilization_pct.is_finite() {
            let l = utilization_pct.clamp(0.0, 100.0);
            self.penalty = learn::penalty(l, self.config.theta_pct, self.config.gamma);
        }
        if now < self.next_train_at {
            return None;
        }
        let trained = self.train(now);
        self.window_from = now;
        self.next_train_at = now + self.config.window_us();
        Some(trained)
    }

    fn train(&mut self, now: Micros) -> Trained {
        let invocations = self.window.len();
        let mut out = Trained {
            at_us: now,
            window_from_us: self.window_from,
            invocations,
            functions: self.names.len(),
            ignored: self.ignored,
            mean_wait_us: 0.0,
        };
        if invocations > 0 {
            let learned = learn::learn(&self.window, self.names.len(), self.cpus, &self.config);
            let mut wait = 0.0;
            self.policies.clear();
            for (name, l) in self.names.drain(..).zip(learned) {
                if let Some(l) = l {
                    wait += l.mean_wait_us * f64::from(l.invocations);
                    self.policies.insert(name, l);
                }
            }
            out.mean_wait_us = wait / invocations as f64;
            let mut tuned: Vec<f64> = self.policies.values().map(|l| l.tuned_us).collect();
            tuned.sort_by(f64::total_cmp);
            self.unseen_us = tuned
                .get(tuned.len().saturating_sub(1) / 2)
                .copied()
                .unwrap_or(0.0);
            self.trainings += 1;
        }
        self.window.clear();
        self.names.clear();
        self.index.clear();
        self.ignored = 0;
        out
    }

    /// What an invocation of `function` starting now gets: its learned rank and its slice after
    /// Eq. 3 at the latest utilization. A function the last window did not see gets the neutral
    /// rank and the median of the learned slices (a typical function's, neither favoured nor
    /// left behind every learned one); before the first training, no slice (fair sharing).
    pub fn policy_for(&self, function: &str) -> Slice {
        let (rank, tuned) = match self.policies.get(function) {
            Some(l) => (l.rank, l.tuned_us),
            None => (self.config.neutral_rank, self.unseen_us),
        };
        let slice = if self.config.overload {
            learn::overload(tuned, self.penalty)
        } else {
            tuned
        };
        Slice {
            rank,
            slice_us: slice.round() as Micros,
        }
    }

    /// The last training's figures for `function`, if it saw it.
    pub fn learned(&self, function: &str) -> Option<&Learned> {
        self.policies.get(function)
    }

    /// Functions with a learned policy.
    pub fn policies(&self) -> usize {
        self.policies.len()
    }

    /// Eq. 3's p at the latest tick.
    pub fn penalty(&self) -> f64 {
        self.penalty
    }

    /// Windows trained so far (empty ones not counted).
    pub fn trainings(&self) -> u64 {
        self.trainings
    }

    /// Completions in the open window.
    pub fn window_len(&self) -> usize {
        self.window.len()
    }
}
