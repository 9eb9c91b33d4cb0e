//! The event queue: one binary heap ordered by time, then by kind, then by insertion order, so
//! two runs with the same inputs process events in exactly the same order.
//!
//! Open-loop arrivals are not stored here: they stream from the (sorted) workload and go after
//! every queued event of the same instant (see [`Kind`]); closed-loop clients' invocations are
//! events of the arrivals' rank.

use hearth_core::{Micros, SandboxId};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// What happens. The declaration order is the processing order of events at the same instant:
/// work that ends frees capacity before anything new is decided at that instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A worker's processor-sharing server may have finished a job.
    Cpu { worker: u32 },
    /// An execution reaches its function's timeout (`id`: the invocation, since job slots are
    /// reused); stale if the job ended in time.
    Timeout { job: u32, id: u32 },
    /// A cold start's init delay is over: the job starts executing.
    InitDone { job: u32 },
    /// A pre-warmed sandbox (a keep-alive policy's pre-warm), or a generic sandbox for cold
    /// starts to specialize, finished starting.
    SandboxReady {
        worker: u32,
        sandbox: SandboxId,
        generic: bool,
    },
    /// A proactive sandbox Atoll asked for (function `function`, by workload index) finished
    /// its set-up.
    ProactiveReady {
        worker: u32,
        sandbox: SandboxId,
        function: u32,
    },
    /// A worker the autoscaler added finished starting: it joins the balancer.
    WorkerUp { worker: u32 },
    /// A worker engine's timer (keep-alive expiry, pre-warms, load-average sample).
    Timer { worker: u32 },
    /// Atoll re-estimates demand, re-allocates sandboxes and scales (every interval).
    AtollTick,
    /// A worker's elastic controller closes an interval and may resize its memory.
    Resize { worker: u32 },
    /// The horizontal autoscaler reads the reported loads and may add or drain workers.
    Autoscale,
    /// A worker pushes its status to the balancer.
    Status { worker: u32 },
    /// A closed-loop client invokes (after its think time), as an arrival would.
    Issue { client: u32 },
    /// The closed loop's client count changes (step `step` of its schedule).
    Clients { step: u32 },
}

/// The rank of arrivals among kinds at the same instant: after all of them.
pub const ARRIVAL_RANK: u8 = 8;

impl Kind {
    fn rank(&self) -> u8 {
        match self {
            Kind::Cpu { .. } => 0,
            Kind::Timeout { .. } => 1,
            Kind::InitDone { .. } => 2,
            Kind::SandboxReady { .. } | Kind::ProactiveReady { .. } | Kind::WorkerUp { .. } => 3,
            Kind::Timer { .. } => 4,
            Kind::AtollTick | Kind::Autoscale => 5,
            Kind::Resize { .. } => 6,
            Kind::Status { .. } => 7,
            Kind::Issue { .. } | Kind::Clients { .. } => ARRIVAL_RANK,
        }
    }
}

/// Events by (time, rank, sequence number). The sequence number makes the order total, so the
/// payload never decides.
#[derive(Debug, Default)]
pub struct EventQueue {
    heap: BinaryHeap<Reverse<(Micros, u8, u64, Kind)>>,
    seq: u64,
}

impl EventQueue {
    pub fn push(&mut self, at: Micros, kind: Kind) {
        self.seq += 1;
        self.heap.push(Reverse((at, kind.rank(), self.seq, kind)));
    }

    /// The time and rank of the next event.
    pub fn peek(&self) -> Option<(Micros, u8)> {
        self.heap.peek().map(|Reverse((t, r, _, _))| (*t, *r))
    }

    pub fn pop(&mut self) -> Option<(Micros, Kind)> {
        self.heap.pop().map(|Reverse((t, _, _, k))| (t, k))
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_then_kind_then_insertion_order() {
        let mut q = EventQueue::default();
        q.push(10, Kind::Status { worker: 0 });
        q.push(10, Kind::Cpu { worker: 1 });
        q.push(5, Kind::Timer { worker: 0 });
        q.push(10, Kind::Cpu { worker: 0 });
        let order: Vec<(Micros, Kind)> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(
            order,
            [
                (5, Kind::Timer { worker: 0 }),
                (10, Kind::Cpu { worker: 1 }),
                (10, Kind::Cpu { worker: 0 }),
                (10, Kind::Status { worker: 0 }),
            ]
        );
        assert!(q.is_empty());
    }
}
