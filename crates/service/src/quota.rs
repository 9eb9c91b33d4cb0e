//! Per-namespace quotas: how many invocations a namespace may have in flight and how fast it may
//! start new ones, plus the worker's fair share (no namespace holds all of a worker's slots, nor
//! all of its sandbox memory, while another namespace has functions there). Over a limit the caller gets 429 with `Retry-After`
//! at once, before anything is queued, so one tenant's flood or long sleeps cost another nothing.

use crate::error::ApiError;
use axum::http::StatusCode;
use dashmap::DashMap;
use hearth_api::ErrorCode;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// One namespace's limits; 0 means unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QuotaLimits {
    /// Invocations in flight (sync and async) at once.
    pub concurrency: u32,
    /// Sustained invocations started per second.
    pub rate_per_s: f64,
    /// Invocations that may start at once above the rate (0: the rate, at least 1).
    pub burst: u32,
}

impl QuotaLimits {
    /// Range checks for the config.
    pub fn check(&self, what: &str) -> Result<(), String> {
        if !(self.rate_per_s.is_finite() && (0.0..=1e9).contains(&self.rate_per_s)) {
            return Err(format!(
                "{what}.rate_per_s must be between 0 and 1e9, got {}",
                self.rate_per_s
            ));
        }
        Ok(())
    }

    fn burst(&self) -> f64 {
        if self.burst > 0 {
            f64::from(self.burst)
        } else {
            self.rate_per_s.ceil().max(1.0)
        }
    }
}

/// Checks a whole quota section of a config.
pub fn check_quotas(
    default: &QuotaLimits,
    per_ns: &BTreeMap<String, QuotaLimits>,
) -> Result<(), String> {
    default.check("quota")?;
    for (ns, q) in per_ns {
        if !hearth_api::namespace::valid_namespace(ns) {
            return Err(format!("quotas: {ns:?} is not a namespace name"));
        }
        q.check(&format!("quotas.{ns}"))?;
    }
    Ok(())
}

/// A token bucket.
struct Bucket {
    tokens: f64,
    at: Instant,
}

struct NamespaceState {
    in_flight: AtomicU32,
    /// MiB of sandbox memory its admitted invocations use.
    memory_mb: AtomicU64,
    bucket: Mutex<Bucket>,
}

/// Why a namespace's invocation was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuotaError {
    #[error("namespace {namespace:?} already has {limit} invocations in flight, its quota")]
    Concurrency { namespace: String, limit: u32 },
    #[error(
        "namespace {namespace:?} is over its rate quota of {rate_per_s} invocations per second"
    )]
    Rate {
        namespace: String,
        rate_per_s: f64,
        retry_after_s: u32,
    },
    #[error("namespace {namespace:?} already holds {limit} of this worker's invocation slots, its fair share while other namespaces have functions here")]
    FairShare { namespace: String, limit: u32 },
    #[error(
        "namespace {namespace:?} already holds {held_mb} MiB of this worker's sandbox memory; \
         another {needed_mb} MiB would pass its share of {limit_mb} MiB \
         (namespace_memory_share) while other namespaces have functions here"
    )]
    MemoryShare {
        namespace: String,
        held_mb: u64,
        needed_mb: u64,
        limit_mb: u64,
    },
}

impl QuotaError {
    /// 429 with `Retry-After`.
    pub fn api_error(&self) -> ApiError {
        let (code, retry) = match self {
            QuotaError::Concurrency { .. } => (ErrorCode::QuotaConcurrency, 1),
            QuotaError::Rate { retry_after_s, .. } => (ErrorCode::QuotaRate, *retry_after_s),
            QuotaError::FairShare { .. } | QuotaError::MemoryShare { .. } => {
                (ErrorCode::FairShare, 1)
            }
        };
        let mut e = ApiError::new(StatusCode::TOO_MANY_REQUESTS, code, self.to_string());
        e.retry_after_s = Some(retry);
        e
    }
}

/// Holds one in-flight slot of a namespace, and the memory its invocation uses, until dropped.
pub struct QuotaGuard {
    state: Arc<NamespaceState>,
    memory_mb: u64,
}

impl Drop for QuotaGuard {
    fn drop(&mut self) {
        self.state.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.state
            .memory_mb
            .fetch_sub(self.memory_mb, Ordering::AcqRel);
    }
}

/// What one invocation claims of a worker's sandbox memory, for the namespaces' memory share.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryClaim {
    /// The function's `memory_mb`.
    pub mb: u64,
    /// The most MiB the namespace's invocations may use at once here (None: no bound).
    pub share_mb: Option<u64>,
}

/// The quotas of one service.
pub struct Quotas {
    default: QuotaLimits,
    per_ns: BTreeMap<String, QuotaLimits>,
    state: DashMap<String, Arc<NamespaceState>>,
}

impl Quotas {
    pub fn new(default: QuotaLimits, per_ns: BTreeMap<String, QuotaLimits>) -> Self {
        Quotas {
            default,
            per_ns,
            state: DashMap::new(),
        }
    }

    fn limits(&self, ns: &str) -> &QuotaLimits {
        self.per_ns.get(ns).unwrap_or(&self.default)
    }

    fn state(&self, ns: &str, now: Instant) -> Arc<NamespaceState> {
        if let Some(s) = self.state.get(ns) {
            return Arc::clone(&s);
        }
        let burst = self.limits(ns).burst();
        Arc::clone(&self.state.entry(ns.to_string()).or_insert_with(|| {
            Arc::new(NamespaceState {
                in_flight: AtomicU32::new(0),
                memory_mb: AtomicU64::new(0),
                bucket: Mutex::new(Bucket {
                    tokens: burst,
                    at: now,
                }),
            })
        }))
    }

    /// Admits one invocation of namespace `ns`, holding a slot until the guard drops; `share`
    /// is the most slots the namespace may hold here (the worker's fair share), if any.
    pub fn admit(
        &self,
        ns: &str,
        share: Option<u32>,
        now: Instant,
    ) -> Result<QuotaGuard, QuotaError> {
        self.admit_call(ns, share, MemoryClaim::default(), now)
    }

    /// [`Self::admit`] of an invocation that uses `memory` of a worker's sandbox memory: over
    /// the namespace's memory share it is refused, unless the namespace holds none (a function
    /// larger than the share still runs, one call at a time).
    pub fn admit_call(
        &self,
        ns: &str,
        share: Option<u32>,
        memory: MemoryClaim,
        now: Instant,
    ) -> Result<QuotaGuard, QuotaError> {
        let limits = *self.limits(ns);
        let st = self.state(ns, now);
        let quota_cap = if limits.concurrency == 0 {
            u32::MAX
        } else {
            limits.concurrency
        };
        let cap = quota_cap.min(share.unwrap_or(u32::MAX));
        let before = st.in_flight.fetch_add(1, Ordering::AcqRel);
        let held_mb = st.memory_mb.fetch_add(memory.mb, Ordering::AcqRel);
        // Dropped on every refusal below, which gives back the slot and the memory.
        let guard = QuotaGuard {
            state: Arc::clone(&st),
            memory_mb: memory.mb,
        };
        if before >= cap {
            return Err(if share.is_some_and(|s| s < quota_cap) {
                QuotaError::FairShare {
                    namespace: ns.to_string(),
                    limit: cap,
                }
            } else {
                QuotaError::Concurrency {
                    namespace: ns.to_string(),
                    limit: cap,
                }
            });
        }
        if let Some(limit_mb) = memory.share_mb {
            if held_mb > 0 && held_mb.saturating_add(memory.mb) > limit_mb {
                return Err(QuotaError::MemoryShare {
                    namespace: ns.to_string(),
                    held_mb,
                    needed_mb: memory.mb,
                    limit_mb,
                });
            }
        }
        if limits.rate_per_s > 0.0 {
            let mut b = st.bucket.lock();
            let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
            b.tokens = (b.tokens + elapsed * limits.rate_per_s).min(limits.burst());
            b.at = now;
            if b.tokens < 1.0 {
                let wait = (1.0 - b.tokens) / limits.rate_per_s;
                return Err(QuotaError::Rate {
                    namespace: ns.to_string(),
                    rate_per_s: limits.rate_per_s,
                    retry_after_s: wait.ceil().clamp(1.0, 3600.0) as u32,
                });
            }
            b.tokens -= 1.0;
        }
        Ok(guard)
    }

    /// Invocations of `ns` in flight now.
    pub fn in_flight(&self, ns: &str) -> u32 {
        self.state
            .get(ns)
            .map_or(0, |s| s.in_flight.load(Ordering::Acquire))
    }
}

/// The share of a worker's sandbox memory budget one namespace's invocations may hold while
/// `namespaces` have functions on it: `share` of it, at least 1 MiB; none while a single
/// namespace is there.
pub fn memory_share(budget_mb: u64, namespaces: usize, share: f64) -> Option<u64> {
    (namespaces >= 2).then(|| ((budget_mb as f64 * share).ceil() as u64).max(1))
}

/// The fair share of a worker's `slots` one namespace may hold while `namespaces` have functions
/// on it: `share` of them, at least one; none while a single namespace is there.
pub fn fair_share(slots: u32, namespaces: usize, share: f64) -> Option<u32> {
    (namespaces >= 2).then(|| ((f64::from(slots) * share).ceil() as u32).clamp(1, slots.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_concurrency_quota_refuses_beyond_it_and_frees_on_drop() {
        let q = Quotas::new(
            QuotaLimits::default(),
            BTreeMap::from([(
                "a".to_string(),
                QuotaLimits {
                    concurrency: 2,
                    ..Default::default()
                },
            )]),
        );
        let now = Instant::now();
        let g1 = q.admit("a", None, now).unwrap();
        let _g2 = q.admit("a", None, now).unwrap();
        let e = q.admit("a", None, now).err().unwrap();
        assert!(matches!(e, QuotaError::Concurrency { limit: 2, .. }));
        assert_eq!(e.api_error().status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.api_error().retry_after_s, Some(1));
        // Another namespace is not affected; a freed slot is usable again.
        let _other: Vec<_> = (0..10).map(|_| q.admit("b", None, now).unwrap()).collect();
        drop(g1);
        assert!(q.admit("a", None, now).is_ok());
        assert_eq!(q.in_flight("a"), 1);
    }

    #[test]
    fn a_rate_quota_refills_over_time_and_says_when_to_retry() {
        let q = Quotas::new(
            QuotaLimits {
                rate_per_s: 2.0,
                burst: 2,
                ..Default::default()
            },
            BTreeMap::new(),
        );
        let t0 = Instant::now();
        drop(q.admit("a", None, t0).unwrap());
        drop(q.admit("a", None, t0).unwrap());
        match q.admit("a", None, t0).err().unwrap() {
            QuotaError::Rate { retry_after_s, .. } => assert_eq!(retry_after_s, 1),
            e => panic!("{e:?}"),
        }
        assert!(q.admit("a", None, t0 + Duration::from_millis(500)).is_ok());
    }

    #[test]
    fn the_memory_share_caps_one_namespace_but_never_its_first_call() {
        let q = Quotas::new(QuotaLimits::default(), BTreeMap::new());
        let now = Instant::now();
        assert_eq!(memory_share(1000, 1, 0.5), None);
        let share_mb = memory_share(1000, 2, 0.5);
        assert_eq!(share_mb, Some(500));
        let big = MemoryClaim { mb: 400, share_mb };
        let first = q.admit_call("a", None, big, now).unwrap();
        match q.admit_call("a", None, big, now) {
            Err(e @ QuotaError::MemoryShare { .. }) => {
                assert_eq!(e.api_error().code, ErrorCode::FairShare);
                assert!(e.to_string().contains("namespace_memory_share"), "{e}");
            }
            other => panic!("{:?}", other.map(|_| ())),
        }
        // Another namespace is not held back by A's memory.
        let b = q.admit_call("b", None, big, now).unwrap();
        // A smaller call that fits A's share still runs; the refusal gave its memory back.
        let small = q
            .admit_call("a", None, MemoryClaim { mb: 100, share_mb }, now)
            .unwrap();
        drop((first, small, b));
        // A function larger than the share runs one call at a time.
        let huge = MemoryClaim { mb: 900, share_mb };
        let one = q.admit_call("a", None, huge, now).unwrap();
        assert!(q.admit_call("a", None, huge, now).is_err());
        drop(one);
        assert!(q.admit_call("a", None, huge, now).is_ok());
    }

    #[test]
    fn the_fair_share_caps_one_namespace_only_when_others_are_there() {
        assert_eq!(fair_share(4, 1, 0.5), None);
        assert_eq!(fair_share(4, 2, 0.5), Some(2));
        assert_eq!(fair_share(1, 3, 0.5), Some(1));
        assert_eq!(fair_share(5, 2, 0.5), Some(3));
        let q = Quotas::new(QuotaLimits::default(), BTreeMap::new());
        let now = Instant::now();
        let _held: Vec<_> = (0..2)
            .map(|_| q.admit("a", Some(2), now).unwrap())
            .collect();
        assert!(matches!(
            q.admit("a", Some(2), now).err().unwrap(),
            QuotaError::FairShare { limit: 2, .. }
        ));
        assert!(q.admit("b", Some(2), now).is_ok());
    }
}
