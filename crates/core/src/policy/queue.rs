//! Queue disciplines (thesis ch. 5.3.2; SRSF from Atoll §4.2): the order in which a worker
//! starts queued invocations.
//!
//! Each invocation gets a static key when it is queued, from its arrival time and its function's
//! learned characteristics; the queue pops the lowest key, ties in arrival order.

use crate::time::Micros;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// A queue discipline, chosen by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueDiscipline {
    /// First come, first served.
    Fcfs,
    /// Shortest (expected) job first.
    Sjf,
    /// Earliest effective deadline first: arrival + expected time.
    Eedf,
    /// Rarest first: the highest inter-arrival time; a function with none yet (first seen)
    /// is the most unexpected of all and goes first.
    Rare,
    /// Shortest remaining slack first: the latest time it can start and still meet its deadline.
    Srsf,
}

impl QueueDiscipline {
    pub const ALL: [QueueDiscipline; 5] = [
        QueueDiscipline::Fcfs,
        QueueDiscipline::Sjf,
        QueueDiscipline::Eedf,
        QueueDiscipline::Rare,
        QueueDiscipline::Srsf,
    ];

    pub fn name(self) -> &'static str {
        match self {
            QueueDiscipline::Fcfs => "fcfs",
            QueueDiscipline::Sjf => "sjf",
            QueueDiscipline::Eedf => "eedf",
            QueueDiscipline::Rare => "rare",
            QueueDiscipline::Srsf => "srsf",
        }
    }

    /// The sort key of a queued invocation: lower runs first.
    ///
    /// SRSF orders by latest start time, `arrival + deadline − expected`: the remaining slack at
    /// any instant is that minus the current time, the same shift for every queued invocation.
    /// Ties go to the least remaining work. A function without a deadline is treated as if its
    /// deadline were twice its expected time, which makes its key `arrival + expected`: exactly
    /// its EEDF key.
    pub fn key(self, k: &KeyInputs) -> QueueKey {
        let arrival = k.arrival as i64;
        let expected = k.expected_us as i64;
        let (primary, secondary) = match self {
            QueueDiscipline::Fcfs => (arrival, 0),
            QueueDiscipline::Sjf => (expected, 0),
            QueueDiscipline::Eedf => (arrival + expected, 0),
            // Thesis §5.3.2: "the most unexpected functions (i.e., functions with the highest
            // IAT)". A function seen for the first time has no IAT (0 from the
            // characteristics): it is infinitely unexpected, not the least.
            QueueDiscipline::Rare => match k.iat_us {
                IAT_UNKNOWN => (i64::MIN, 0),
                iat => (-(iat.min(i64::MAX as u64) as i64), 0),
            },
            QueueDiscipline::Srsf => match k.deadline_us {
                Some(d) => (arrival + d as i64 - expected, expected),
                None => (arrival + expected, expected),
            },
        };
        QueueKey { primary, secondary }
    }
}

impl std::fmt::Display for QueueDiscipline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for QueueDiscipline {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        QueueDiscipline::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                format!("unknown queue discipline {s:?} (expected fcfs, sjf, eedf, rare or srsf)")
            })
    }
}

/// `KeyInputs::iat_us` of a function with no inter-arrival time yet: what
/// [`crate::characteristics::Characteristics::iat_us`] gives before the second arrival.
pub const IAT_UNKNOWN: Micros = 0;

/// What a discipline may look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyInputs {
    pub arrival: Micros,
    /// Expected run time: warm time if a warm sandbox is expected to be free, else cold time.
    pub expected_us: Micros,
    /// The function's inter-arrival time (moving average); [`IAT_UNKNOWN`] before its second
    /// arrival.
    pub iat_us: Micros,
    /// The function's deadline relative to arrival, if it has one.
    pub deadline_us: Option<Micros>,
}

/// A queue position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct QueueKey {
    pub primary: i64,
    pub secondary: i64,
}

/// A priority queue of items identified by a sequence number (their arrival order, which
/// breaks ties), with removal of a cancelled item by its number.
#[derive(Debug)]
pub struct InvocationQueue<T> {
    discipline: QueueDiscipline,
    entries: BTreeMap<(QueueKey, u64), T>,
    keys: HashMap<u64, QueueKey>,
}

impl<T> InvocationQueue<T> {
    pub fn new(discipline: QueueDiscipline) -> Self {
        InvocationQueue {
            discipline,
            entries: BTreeMap::new(),
            keys: HashMap::new(),
        }
    }

    pub fn discipline(&self) -> QueueDiscipline {
        self.discipline
    }

    /// Queues `item` as number `seq` (numbers must increase with arrival).
    pub fn push(&mut self, seq: u64, inputs: &KeyInputs, item: T) {
        let key = self.discipline.key(inputs);
        self.keys.insert(seq, key);
        self.entries.insert((key, seq), item);
    }

    /// The next item to run, without removing it.
    pub fn peek(&self) -> Option<(u64, &T)> {
        self.entries.iter().next().map(|((_, seq), t)| (*seq, t))
    }

    /// The queued item number `seq`.
    pub fn get(&self, seq: u64) -> Option<&T> {
        let key = self.keys.get(&seq)?;
        self.entries.get(&(*key, seq))
    }

    pub fn pop(&mut self) -> Option<(u64, T)> {
        let ((_, seq), t) = self.entries.pop_first()?;
        self.keys.remove(&seq);
        Some((seq, t))
    }

    /// Removes a queued item (its caller went away).
    pub fn remove(&mut self, seq: u64) -> Option<T> {
        let key = self.keys.remove(&seq)?;
        self.entries.remove(&(key, seq))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Items in the order they would run.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &T)> {
        self.entries.iter().map(|((_, seq), t)| (*seq, t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::ms;

    /// A fixed queue: (name, arrival ms, expected ms, iat ms, deadline ms).
    const QUEUE: [(&str, u64, u64, u64, Option<u64>); 5] = [
        ("long", 0, 900, 1_000, None),
        ("short", 10, 20, 50, Some(100)),
        ("new", 20, 0, 0, None),
        ("rare", 30, 200, 60_000, Some(1_000)),
        ("mid", 40, 100, 5_000, Some(150)),
    ];

    fn order(d: QueueDiscipline) -> Vec<&'static str> {
        let mut q = InvocationQueue::new(d);
        for (i, (name, arrival, expected, iat, deadline)) in QUEUE.iter().enumerate() {
            let k = KeyInputs {
                arrival: ms(*arrival),
                expected_us: ms(*expected),
                iat_us: ms(*iat),
                deadline_us: deadline.map(ms),
            };
            q.push(i as u64, &k, *name);
        }
        std::iter::from_fn(|| q.pop().map(|(_, n)| n)).collect()
    }

    #[test]
    fn each_discipline_dispatches_a_fixed_queue_in_its_order() {
        assert_eq!(
            order(QueueDiscipline::Fcfs),
            ["long", "short", "new", "rare", "mid"]
        );
        // Expected 900, 20, 0, 200, 100.
        assert_eq!(
            order(QueueDiscipline::Sjf),
            ["new", "short", "mid", "rare", "long"]
        );
        // arrival + expected: 900, 30, 20, 230, 140.
        assert_eq!(
            order(QueueDiscipline::Eedf),
            ["new", "short", "mid", "rare", "long"]
        );
        // Never seen before first (no IAT: the most unexpected), then the highest
        // inter-arrival time first: 60 000, 5 000, 1 000, 50.
        assert_eq!(
            order(QueueDiscipline::Rare),
            ["new", "rare", "mid", "long", "short"]
        );
        // Latest start: short 10+100−20 = 90, rare 30+1000−200 = 830, mid 40+150−100 = 90 (tie
        // with short: less work first, so short (20) before mid (100)); without deadlines, EEDF
        // keys: long 900, new 20.
        assert_eq!(
            order(QueueDiscipline::Srsf),
            ["new", "short", "mid", "rare", "long"]
        );
    }

    #[test]
    fn rare_puts_every_unseen_function_first_in_arrival_order() {
        let mut q = InvocationQueue::new(QueueDiscipline::Rare);
        let k = |arrival, iat_ms: u64| KeyInputs {
            arrival: ms(arrival),
            expected_us: ms(10),
            iat_us: ms(iat_ms),
            deadline_us: None,
        };
        q.push(0, &k(0, 3_600_000), "hourly");
        q.push(1, &k(1, 0), "first-a");
        q.push(2, &k(2, 1), "every-ms");
        q.push(3, &k(3, 0), "first-b");
        let got: Vec<_> = std::iter::from_fn(|| q.pop().map(|(_, n)| n)).collect();
        assert_eq!(got, ["first-a", "first-b", "hourly", "every-ms"]);
    }

    #[test]
    fn srsf_puts_tight_deadlines_before_short_jobs() {
        let mut q = InvocationQueue::new(QueueDiscipline::Srsf);
        let k = |arrival, expected, deadline: Option<u64>| KeyInputs {
            arrival: ms(arrival),
            expected_us: ms(expected),
            iat_us: 0,
            deadline_us: deadline.map(ms),
        };
        q.push(0, &k(0, 10, Some(1_000)), "loose-short"); // latest start 990
        q.push(1, &k(5, 400, Some(450)), "tight-long"); // latest start 55
        q.push(2, &k(6, 30, None), "no-deadline"); // 36, like EEDF
        let got: Vec<_> = std::iter::from_fn(|| q.pop().map(|(_, n)| n)).collect();
        assert_eq!(got, ["no-deadline", "tight-long", "loose-short"]);
    }

    #[test]
    fn equal_keys_keep_arrival_order_and_cancelled_items_leave() {
        let mut q = InvocationQueue::new(QueueDiscipline::Sjf);
        let k = KeyInputs {
            arrival: 0,
            expected_us: 5,
            iat_us: 0,
            deadline_us: None,
        };
        for seq in 0..4 {
            q.push(seq, &k, seq);
        }
        assert_eq!(q.remove(1), Some(1));
        assert_eq!(q.remove(1), None);
        assert_eq!(q.peek(), Some((0, &0)));
        let got: Vec<_> = std::iter::from_fn(|| q.pop().map(|(s, _)| s)).collect();
        assert_eq!(got, [0, 2, 3]);
        assert!(q.is_empty());
    }

    #[test]
    fn names_parse() {
        for d in QueueDiscipline::ALL {
            assert_eq!(d.name().parse::<QueueDiscipline>(), Ok(d));
        }
        assert!("lifo".parse::<QueueDiscipline>().is_err());
    }
}
