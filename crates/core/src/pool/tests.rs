//! Pool tests: the TTL baseline, then each keep-alive policy with hand-computed expectations.

use super::*;
use crate::time::{ms, secs};
use generic::GenericConfig;

fn pool(budget: u64, buffer: u64) -> SandboxPool {
    SandboxPool::new(PoolConfig {
        memory_budget_mb: budget,
        free_buffer_mb: buffer,
        keepalive: KeepAliveConfig {
            ttl: secs(10),
            ..KeepAliveConfig::default()
        },
        generic: GenericConfig::OFF,
        proactive_mb: 0,
    })
}

fn pool_with(kind: KeepAliveKind, budget: u64) -> SandboxPool {
    SandboxPool::new(PoolConfig {
        memory_budget_mb: budget,
        free_buffer_mb: 0,
        keepalive: KeepAliveConfig::new(kind),
        generic: GenericConfig::OFF,
        proactive_mb: 0,
    })
}

/// Runs one cold invocation of `f` from `start` to `end`, with init cost `cost_ms`.
fn run_cold(
    p: &mut SandboxPool,
    f: &str,
    mb: u64,
    cost_ms: u64,
    start: Micros,
    end: Micros,
) -> SandboxId {
    let (id, _) = cold(p.acquire(start, f, mb));
    p.set_cost(f, ms(cost_ms));
    p.release(end, id, true);
    id
}

fn evicted(actions: &[PoolAction]) -> Vec<SandboxId> {
    actions
        .iter()
        .filter_map(|a| match a {
            PoolAction::Destroy {
                sandbox,
                reason: DestroyReason::Evicted,
            } => Some(*sandbox),
            _ => None,
        })
        .collect()
}

fn cold(a: Acquire) -> (SandboxId, ColdReason) {
    match a {
        Acquire::Cold {
            sandbox, reason, ..
        } => (sandbox, reason),
        other => panic!("expected a cold start, got {other:?}"),
    }
}

fn drain(p: &mut SandboxPool) -> Vec<PoolAction> {
    std::iter::from_fn(|| p.poll_action()).collect()
}

#[test]
fn warm_reuse_and_concurrent_cold_starts() {
    let mut p = pool(1024, 0);
    let (a, why) = cold(p.acquire(0, "f", 128));
    assert_eq!(why, ColdReason::New);
    p.release(ms(5), a, true);
    assert_eq!(p.acquire(ms(6), "f", 128), Acquire::Warm(a));
    // `a` is busy, so a second concurrent invocation needs its own sandbox.
    let (b, why) = cold(p.acquire(ms(7), "f", 128));
    assert_eq!(why, ColdReason::Concurrent);
    assert_ne!(a, b);
    let s = p.stats();
    assert_eq!((s.memory_running_mb, s.memory_warm_mb), (256, 0));
    p.release(ms(8), a, true);
    p.release(ms(9), b, true);
    // The most recently used idle sandbox is reused first.
    assert_eq!(p.acquire(ms(10), "f", 128), Acquire::Warm(b));
    assert!(drain(&mut p).is_empty());
}

#[test]
fn memory_pressure_evicts_least_recently_used_and_says_so() {
    // Budget 512 MiB = four 128 MiB sandboxes. a, b, c, d idle from t = 1, 2, 3, 4 ms.
    let mut p = pool(512, 0);
    let mut ids = HashMap::new();
    for (i, f) in ["a", "b", "c", "d"].iter().enumerate() {
        let (id, _) = cold(p.acquire(0, f, 128));
        ids.insert(*f, id);
        p.release(ms(i as u64 + 1), id, true);
    }
    // A fifth function at t = 10 ms must evict the LRU sandbox: a's (idle since 1 ms).
    let (_e, why) = cold(p.acquire(ms(10), "e", 128));
    assert_eq!(why, ColdReason::New);
    assert_eq!(
        drain(&mut p),
        vec![PoolAction::Destroy {
            sandbox: ids["a"],
            reason: DestroyReason::Evicted
        }]
    );
    // a comes back 30 ms later: cold, evicted 30 ms ago; this evicts b (idle since 2 ms).
    let (_, why) = cold(p.acquire(ms(40), "a", 128));
    assert_eq!(why, ColdReason::Evicted { ago_us: ms(30) });
    assert_eq!(
        drain(&mut p),
        vec![PoolAction::Destroy {
            sandbox: ids["b"],
            reason: DestroyReason::Evicted
        }]
    );
    let s = p.stats();
    assert_eq!((s.memory_running_mb, s.memory_warm_mb), (256, 256));
}

#[test]
fn no_memory_when_busy_sandboxes_fill_the_budget_and_nothing_is_evicted() {
    let mut p = pool(300, 0);
    let (a, _) = cold(p.acquire(0, "a", 128));
    let (b, _) = cold(p.acquire(0, "b", 128));
    p.release(ms(1), b, true); // b idle: 128 warm, 128 running, 44 free
    assert_eq!(
        p.acquire(ms(2), "c", 256),
        Acquire::NoMemory {
            needed_mb: 256,
            free_mb: 44
        }
    );
    assert!(
        drain(&mut p).is_empty(),
        "a failed reservation evicts nothing"
    );
    // 128 fits once b's idle sandbox is evicted.
    let (_, _) = cold(p.acquire(ms(3), "c", 128));
    assert_eq!(drain(&mut p).len(), 1);
    p.release(ms(4), a, true);
}

#[test]
fn ttl_expires_idle_sandboxes_exactly_at_the_deadline() {
    let mut p = pool(1024, 0);
    let (a, _) = cold(p.acquire(0, "f", 128));
    p.release(ms(100), a, true);
    assert_eq!(p.next_timeout(), Some(ms(100) + secs(10)));
    p.on_timeout(ms(100) + secs(10) - 1);
    assert!(drain(&mut p).is_empty());
    p.on_timeout(ms(100) + secs(10));
    assert_eq!(
        drain(&mut p),
        vec![PoolAction::Destroy {
            sandbox: a,
            reason: DestroyReason::Expired
        }]
    );
    assert_eq!(p.next_timeout(), None);
    let (_, why) = cold(p.acquire(ms(100) + secs(12), "f", 128));
    assert_eq!(why, ColdReason::Expired { ago_us: secs(2) });
}

#[test]
fn background_eviction_keeps_the_free_buffer() {
    let mut p = pool(512, 128);
    for (i, f) in ["a", "b", "c", "d"].iter().enumerate() {
        let (id, _) = cold(p.acquire(0, f, 128));
        p.release(ms(i as u64), id, true);
    }
    p.on_timeout(ms(5));
    let actions = drain(&mut p);
    assert_eq!(actions.len(), 1, "one eviction restores 128 MiB free");
    assert_eq!(p.stats().memory_warm_mb, 384);
}

#[test]
fn failed_sandboxes_are_destroyed_not_reused() {
    let mut p = pool(1024, 0);
    let (a, _) = cold(p.acquire(0, "f", 128));
    p.release(ms(1), a, false);
    assert_eq!(
        drain(&mut p),
        vec![PoolAction::Destroy {
            sandbox: a,
            reason: DestroyReason::Failed
        }]
    );
    assert_eq!(p.stats().memory_running_mb, 0);
    let (b, _) = cold(p.acquire(ms(2), "f", 128));
    assert_ne!(a, b);
    p.on_start_failed(b);
    assert_eq!(p.sandbox_count(), 0);
    assert_eq!(p.stats(), pool(1024, 0).stats());
}

#[test]
fn retire_destroys_idle_now_and_busy_when_done() {
    let mut p = pool(1024, 0);
    let (a, _) = cold(p.acquire(0, "f", 128));
    let (b, _) = cold(p.acquire(0, "f", 128));
    p.release(ms(1), a, true);
    p.retire("f");
    assert_eq!(
        drain(&mut p),
        vec![PoolAction::Destroy {
            sandbox: a,
            reason: DestroyReason::Retired
        }]
    );
    // The new version never reuses b, even though b finishes fine.
    let (c, why) = cold(p.acquire(ms(2), "f", 128));
    assert_eq!(why, ColdReason::New);
    p.release(ms(3), b, true);
    assert_eq!(
        drain(&mut p),
        vec![PoolAction::Destroy {
            sandbox: b,
            reason: DestroyReason::Retired
        }]
    );
    p.release(ms(4), c, true);
    assert_eq!(p.acquire(ms(5), "f", 128), Acquire::Warm(c));
    let s = p.stats();
    assert_eq!((s.memory_running_mb, s.memory_warm_mb), (128, 0));
}

#[test]
fn prewarm_uses_free_memory_only_and_becomes_warm_when_ready() {
    let mut p = pool(256, 0);
    let w = p.prewarm(0, "f", 128).unwrap();
    let (_, why) = cold(p.acquire(ms(1), "f", 128));
    assert_eq!(why, ColdReason::PrewarmMiss);
    assert_eq!(p.prewarm(ms(2), "f", 128), Err(0), "prewarm never evicts");
    p.on_sandbox_ready(ms(3), w);
    assert_eq!(p.acquire(ms(4), "f", 128), Acquire::Warm(w));
}

#[test]
fn shutdown_destroys_everything_idle_and_busy_on_release() {
    let mut p = pool(1024, 0);
    let (a, _) = cold(p.acquire(0, "f", 128));
    let (b, _) = cold(p.acquire(0, "g", 128));
    p.release(ms(1), a, true);
    p.shutdown();
    assert_eq!(
        drain(&mut p),
        vec![PoolAction::Destroy {
            sandbox: a,
            reason: DestroyReason::Shutdown
        }]
    );
    p.release(ms(2), b, true);
    assert_eq!(drain(&mut p).len(), 1);
    assert_eq!(p.sandbox_count(), 0);
}

#[test]
fn gdsf_worked_example() {
    // Budget 300 MiB; every function but e uses 100 MiB. Priority = clock + freq × cost / size,
    // with cost in ms and size in MiB; the clock becomes the evicted priority (max of a batch).
    //
    //  t   event                     priorities after (clock)          evicted
    //  1-2 a cold, cost 200          a = 0 + 1·200/100 = 2     (0)
    //  3-4 b cold, cost 50           b = 0 + 1·50/100 = 0.5    (0)
    //  5-6 a warm (freq 2)           a = 0 + 2·200/100 = 4     (0)
    //  7-8 c cold, cost 100          c = 0 + 1·100/100 = 1     (0)     memory now full
    //  9   d cold: evict the lowest  b (0.5) goes              (0.5)   b
    //  10  d released, cost 300      d = 0.5 + 1·300/100 = 3.5
    //  11  b again (freq was reset)  c (1) goes                (1)     c
    //  12  b released                b = 1 + 1·50/100 = 1.5
    //  13  e, 200 MiB, needs two     b (1.5) then d (3.5)      (3.5)   b, d
    //  14  e released, cost 1000     e = 3.5 + 1·1000/200 = 8.5
    //  15  c again                   a (4) < e (8.5): a goes   (4)     a
    let mut p = pool_with(KeepAliveKind::Gdsf, 300);
    let a = run_cold(&mut p, "a", 100, 200, 1, 2);
    let b = run_cold(&mut p, "b", 100, 50, 3, 4);
    assert_eq!(p.acquire(5, "a", 100), Acquire::Warm(a));
    p.release(6, a, true);
    let c = run_cold(&mut p, "c", 100, 100, 7, 8);
    assert!(drain(&mut p).is_empty());
    let d = run_cold(&mut p, "d", 100, 300, 9, 10);
    assert_eq!(evicted(&drain(&mut p)), vec![b]);
    assert_eq!(p.policy().clock(), 0.5);
    let (b2, why) = cold(p.acquire(11, "b", 100));
    assert_eq!(why, ColdReason::Evicted { ago_us: 2 });
    assert_eq!(evicted(&drain(&mut p)), vec![c]);
    assert_eq!(p.policy().clock(), 1.0);
    p.release(12, b2, true);
    let (e, _) = cold(p.acquire(13, "e", 200));
    assert_eq!(evicted(&drain(&mut p)), vec![b2, d]);
    assert_eq!(p.policy().clock(), 3.5);
    p.set_cost("e", ms(1000));
    p.release(14, e, true);
    let (_, why) = cold(p.acquire(15, "c", 100));
    assert_eq!(why, ColdReason::Evicted { ago_us: 4 });
    assert_eq!(evicted(&drain(&mut p)), vec![a]);
    assert_eq!(p.policy().clock(), 4.0);
}

#[test]
fn landlord_charges_rent_in_proportion_to_size() {
    // cost/size: a = 100/100 = 1, b = 150/50 = 3, c = 300/150 = 2 (ms per MiB). Credits start
    // at the init cost; an eviction charges every idle sandbox rent = size × the lowest
    // credit/size, and the sandboxes left with no credit go.
    let mut p = pool_with(KeepAliveKind::Landlord, 300);
    let a = run_cold(&mut p, "a", 100, 100, 1, 2);
    run_cold(&mut p, "b", 50, 150, 3, 4);
    let c = run_cold(&mut p, "c", 150, 300, 5, 6);
    assert_eq!(p.credit("a"), Some(100.0));
    assert_eq!(p.credit("b"), Some(150.0));
    assert_eq!(p.credit("c"), Some(300.0));
    // d (100 MiB, cost 50) needs room: rent 1 ms/MiB; a's credit (100 − 100·1) is 0.
    let d = run_cold(&mut p, "d", 100, 50, 7, 8);
    assert_eq!(evicted(&drain(&mut p)), vec![a]);
    assert_eq!(p.credit("b"), Some(150.0 - 50.0));
    assert_eq!(p.credit("c"), Some(300.0 - 150.0));
    assert_eq!(p.credit("d"), Some(50.0));
    // A use restores b's full credit.
    let b = match p.acquire(9, "b", 50) {
        Acquire::Warm(b) => b,
        other => panic!("{other:?}"),
    };
    p.release(10, b, true);
    assert_eq!(p.credit("b"), Some(150.0));
    // e needs 150 MiB: rent 0.5 (d's 50/100) evicts d, then rent 0.5 (c's 75/150) evicts c.
    run_cold(&mut p, "e", 150, 30, 11, 12);
    assert_eq!(evicted(&drain(&mut p)), vec![d, c]);
    assert_eq!(p.credit("b"), Some(150.0 - 25.0 - 25.0));
}

#[test]
fn lfu_evicts_the_least_frequent_and_breaks_ties_by_recency() {
    let mut p = pool_with(KeepAliveKind::Lfu, 300);
    let a = run_cold(&mut p, "a", 100, 10, 1, 2);
    let b = run_cold(&mut p, "b", 100, 10, 3, 4);
    let c = run_cold(&mut p, "c", 100, 10, 5, 6);
    for t in [7, 9] {
        assert_eq!(p.acquire(t, "a", 100), Acquire::Warm(a));
        p.release(t + 1, a, true);
    }
    // freq: a 3, b 1, c 1; b and c tie, b is older.
    run_cold(&mut p, "d", 100, 10, 11, 12);
    assert_eq!(evicted(&drain(&mut p)), vec![b]);
    run_cold(&mut p, "e", 100, 10, 13, 14);
    assert_eq!(evicted(&drain(&mut p)), vec![c]);
}

#[test]
fn caching_policies_keep_idle_sandboxes_until_memory_is_needed() {
    for kind in [
        KeepAliveKind::Lru,
        KeepAliveKind::Gdsf,
        KeepAliveKind::Lfu,
        KeepAliveKind::Landlord,
    ] {
        let mut p = pool_with(kind, 1024);
        run_cold(&mut p, "a", 128, 10, 0, 1);
        assert_eq!(p.next_timeout(), None, "{kind}");
        p.on_timeout(secs(100_000));
        assert!(drain(&mut p).is_empty(), "{kind}");
        assert_eq!(p.idle_count("a"), 1);
    }
}

#[test]
fn hist_unloads_a_regular_function_and_prewarms_it_before_its_next_arrival() {
    const MIN: Micros = secs(60);
    let mut p = pool_with(KeepAliveKind::Hist, 1024);
    // Arrivals every 10 minutes, each running 1 s.
    let mut last = None;
    for i in 0..5u64 {
        let t = i * 10 * MIN;
        p.on_arrival(t, "f", 128);
        let id = match p.acquire(t, "f", 128) {
            Acquire::Cold { sandbox, .. } => sandbox,
            Acquire::Warm(id) => id,
            other => panic!("{other:?}"),
        };
        p.release(t + secs(1), id, true);
        last = Some(t + secs(1));
        if i == 4 {
            break;
        }
        // Run the timers up to just before the next arrival.
        while let Some(next) = p.next_timeout().filter(|n| *n < t + 10 * MIN) {
            p.on_timeout(next);
            for a in drain(&mut p) {
                if let PoolAction::Prewarm { sandbox, .. } = a {
                    p.on_sandbox_ready(next, sandbox);
                }
            }
        }
    }
    let end = last.unwrap();
    // Every gap is 10 min (bucket 10): head = 10 min → pre-warm 0.9 × 10 = 9 min after the
    // arrival; tail = the bucket's end, 11 min → keep-alive 1.1 × 11 = 12.1 min after it (the
    // gaps are measured arrival to arrival, so the windows count from the arrival). No init
    // time was learned (the pool's cost is 0), so the pre-warm starts at the window's head.
    let arrived = end - secs(1);
    assert_eq!(p.idle_count("f"), 0, "unloaded right after the run");
    assert!(matches!(
        drain(&mut p).as_slice(),
        [PoolAction::Destroy {
            reason: DestroyReason::Expired,
            ..
        }]
    ));
    assert_eq!(p.next_timeout(), Some(arrived + 9 * MIN));
    p.on_timeout(arrived + 9 * MIN);
    let actions = drain(&mut p);
    let sb = match actions.as_slice() {
        [PoolAction::Prewarm { sandbox, function }] if &**function == "f" => *sandbox,
        other => panic!("expected one pre-warm, got {other:?}"),
    };
    p.on_sandbox_ready(arrived + 9 * MIN + ms(80), sb);
    assert_eq!(p.idle_count("f"), 1);
    assert_eq!(p.next_timeout(), Some(arrived + 121 * MIN / 10));
    // The next arrival at the usual time is warm.
    assert_eq!(
        p.acquire(end + 10 * MIN - secs(1), "f", 128),
        Acquire::Warm(sb)
    );
}

#[test]
fn hist_uses_the_generic_ttl_until_the_function_is_predictable() {
    let mut p = pool_with(KeepAliveKind::Hist, 1024);
    p.on_arrival(0, "f", 128);
    let id = run_cold(&mut p, "f", 128, 10, 0, secs(1));
    assert_eq!(p.next_timeout(), Some(secs(1) + secs(2 * 3600)));
    p.on_timeout(secs(1) + secs(2 * 3600));
    assert_eq!(
        drain(&mut p),
        vec![PoolAction::Destroy {
            sandbox: id,
            reason: DestroyReason::Expired
        }]
    );
}

fn generic_pool(budget: u64, min: u32, max: u32) -> SandboxPool {
    SandboxPool::new(PoolConfig {
        memory_budget_mb: budget,
        free_buffer_mb: 0,
        keepalive: KeepAliveConfig {
            ttl: secs(600),
            ..KeepAliveConfig::default()
        },
        generic: GenericConfig {
            max,
            min,
            memory_mb: 32,
            window_us: secs(10),
        },
        proactive_mb: 0,
    })
}

fn created(actions: &[PoolAction]) -> Vec<SandboxId> {
    actions
        .iter()
        .filter_map(|a| match a {
            PoolAction::CreateGeneric { sandbox, .. } => Some(*sandbox),
            _ => None,
        })
        .collect()
}

fn destroyed(actions: &[PoolAction]) -> Vec<SandboxId> {
    actions
        .iter()
        .filter_map(|a| match a {
            PoolAction::Destroy { sandbox, .. } => Some(*sandbox),
            _ => None,
        })
        .collect()
}

/// Fills the pool to its floor at start-up and makes every creation ready.
fn fill(p: &mut SandboxPool, now: Micros) -> Vec<SandboxId> {
    assert_eq!(
        p.next_timeout(),
        Some(0),
        "below its floor: a timer at once"
    );
    p.on_timeout(now);
    let ids = created(&drain(p));
    for id in &ids {
        p.on_generic_ready(now, *id);
    }
    ids
}

#[test]
fn a_cold_start_specializes_a_ready_generic_sandbox_and_the_pool_refills() {
    let mut p = generic_pool(1024, 1, 4);
    let g = fill(&mut p, 0);
    assert_eq!(g.len(), 1);
    assert_eq!(p.stats().memory_generic_mb, 32);
    let (sandbox, generic) = match p.acquire(ms(1), "f", 128) {
        Acquire::Cold {
            sandbox, generic, ..
        } => (sandbox, generic),
        other => panic!("{other:?}"),
    };
    assert_eq!(generic, Some(g[0]));
    assert_ne!(
        sandbox, g[0],
        "the specialized sandbox is the function's, under a new id"
    );
    // The generic's memory became part of the function's reservation; one more is being made.
    let s = p.stats();
    assert_eq!((s.memory_running_mb, s.memory_generic_mb), (128, 32));
    let again = created(&drain(&mut p));
    assert_eq!(again.len(), 1);
    assert!(!p.is_generic(sandbox) && p.is_generic(again[0]));
    // A second concurrent cold start finds none ready yet: from nothing.
    match p.acquire(ms(2), "f", 128) {
        Acquire::Cold { generic: None, .. } => {}
        other => panic!("{other:?}"),
    }
    let s = p.stats().generic;
    assert_eq!((s.taken, s.missed, s.target), (1, 1, 2));
    p.check_invariants().unwrap();
}

#[test]
fn the_pool_grows_with_recent_cold_starts_and_shrinks_to_its_floor() {
    let mut p = generic_pool(4096, 1, 3);
    fill(&mut p, 0);
    for i in 0..5 {
        let _ = p.acquire(ms(1 + i), &format!("f{i}"), 64);
    }
    let made = created(&drain(&mut p));
    // Five cold starts in the window, capped at three held.
    assert_eq!(p.stats().generic.target, 3);
    assert_eq!(made.len(), 3);
    for id in &made {
        p.on_generic_ready(ms(50), *id);
    }
    assert!(drain(&mut p).is_empty());
    // Once the cold starts leave the window, the pool shrinks back to one.
    let t = p.next_timeout().expect("the target shrinks later");
    assert!(t > secs(10) && t <= secs(10) + ms(10), "{t}");
    p.on_timeout(secs(11));
    let gone = destroyed(&drain(&mut p));
    assert_eq!(gone.len(), 2);
    assert!(gone.iter().all(|g| made.contains(g)));
    assert_eq!(p.stats().generic.ready, 1);
    assert_eq!(p.stats().memory_generic_mb, 32);
    assert_eq!(p.next_timeout(), None, "nothing left to do");
    p.check_invariants().unwrap();
}

#[test]
fn a_refill_never_evicts_and_backs_off_when_memory_is_short() {
    let mut p = generic_pool(256, 1, 2);
    // `a` runs and stays warm (128 MiB); the pool makes one generic sandbox (32) meanwhile.
    run_cold(&mut p, "a", 128, 10, 0, ms(1));
    let g = created(&drain(&mut p));
    assert_eq!(g.len(), 1);
    p.on_generic_ready(ms(1), g[0]);
    // `b` specializes it (96): two cold starts lately, so the pool aims at two, but only 32
    // MiB are free and `a`'s warm sandbox is not evicted for a refill.
    match p.acquire(ms(2), "b", 96) {
        Acquire::Cold { generic, .. } => assert_eq!(generic, Some(g[0])),
        other => panic!("{other:?}"),
    }
    let actions = drain(&mut p);
    assert_eq!(created(&actions).len(), 1);
    assert!(evicted(&actions).is_empty());
    assert_eq!(p.idle_count("a"), 1);
    assert_eq!(p.free_mb(), 0);
    // Backed off: no busy timer loop while memory is short.
    let t = p.next_timeout().expect("a retry later");
    assert!(t >= ms(2) + secs(1), "{t}");
    p.check_invariants().unwrap();
}

#[test]
fn a_failed_generic_start_frees_its_memory_and_waits_before_a_retry() {
    let mut p = generic_pool(1024, 1, 2);
    p.on_timeout(0);
    let g = created(&drain(&mut p));
    p.on_generic_failed(ms(5), g[0]);
    assert_eq!(p.stats().memory_generic_mb, 0);
    assert_eq!(p.stats().generic.failed, 1);
    assert_eq!(p.next_timeout(), Some(ms(5) + secs(1)));
    p.on_timeout(ms(500));
    assert!(created(&drain(&mut p)).is_empty());
    p.on_timeout(ms(5) + secs(1));
    assert_eq!(created(&drain(&mut p)).len(), 1);
    p.check_invariants().unwrap();
}

#[test]
fn no_memory_puts_the_generic_sandbox_back() {
    let mut p = generic_pool(160, 1, 1);
    let g = fill(&mut p, 0);
    // 128 + the generic's 32 fit; 200 never does.
    match p.acquire(ms(1), "big", 200) {
        Acquire::NoMemory { .. } => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(p.stats().generic.ready, 1);
    assert_eq!(p.stats().memory_generic_mb, 32);
    match p.acquire(ms(2), "f", 128) {
        Acquire::Cold { generic, .. } => assert_eq!(generic, Some(g[0])),
        other => panic!("{other:?}"),
    }
    p.check_invariants().unwrap();
}

#[test]
fn shutdown_destroys_generic_sandboxes_ready_and_in_the_making() {
    let mut p = generic_pool(1024, 2, 2);
    p.on_timeout(0);
    let g = created(&drain(&mut p));
    assert_eq!(g.len(), 2);
    p.on_generic_ready(ms(1), g[0]);
    p.shutdown();
    assert_eq!(destroyed(&drain(&mut p)), vec![g[0]]);
    p.on_generic_ready(ms(2), g[1]);
    assert_eq!(destroyed(&drain(&mut p)), vec![g[1]]);
    assert_eq!(p.stats().memory_generic_mb, 0);
    p.check_invariants().unwrap();
}

// Proactive sandboxes (Atoll §4.3).

/// A TTL pool (10 s) with a `proactive_mb` proactive pool inside `budget`.
fn pro_pool(budget: u64, proactive_mb: u64) -> SandboxPool {
    SandboxPool::new(PoolConfig {
        memory_budget_mb: budget,
        free_buffer_mb: 0,
        keepalive: KeepAliveConfig {
            ttl: secs(10),
            ..KeepAliveConfig::default()
        },
        generic: GenericConfig::OFF,
        proactive_mb,
    })
}

/// Creates a proactive sandbox of `f` and reports it ready.
fn pro_ready(p: &mut SandboxPool, now: Micros, f: &str, mb: u64) -> SandboxId {
    let id = p
        .proactive_create(now, f, mb)
        .expect("room in the proactive pool");
    p.on_sandbox_ready(now, id);
    p.check_invariants().expect("consistent");
    id
}

fn fn_stats(p: &SandboxPool, f: &str) -> FunctionPoolStats {
    p.stats().function(f).cloned().unwrap_or_default()
}

#[test]
fn proactive_create_is_bounded_by_the_proactive_pool() {
    let mut p = pro_pool(1024, 256);
    let a = p.proactive_create(0, "f", 128).expect("fits");
    assert_eq!(fn_stats(&p, "f").proactive_starting, 1);
    let _b = p.proactive_create(0, "g", 128).expect("fits");
    assert_eq!(
        p.proactive_create(0, "f", 64),
        Err(ProactiveError::PoolFull {
            needed_mb: 64,
            free_mb: 0
        })
    );
    // Nothing was evicted for it, and the reactive side keeps its 768 MiB untouched.
    assert!(drain(&mut p).is_empty());
    assert_eq!(p.free_mb(), 768);
    let s = p.stats();
    assert_eq!((s.proactive_pool_mb, s.memory_proactive_mb), (256, 256));
    // A failed start gives its room back.
    p.on_start_failed(a);
    assert_eq!(p.proactive_free_mb(), 128);
    p.check_invariants().expect("consistent");
    assert_eq!(
        pro_pool(1024, 0).proactive_create(0, "f", 64),
        Err(ProactiveError::Disabled)
    );
}

#[test]
fn acquire_prefers_an_idle_proactive_sandbox_and_it_returns_to_the_proactive_pool() {
    let mut p = pro_pool(1024, 256);
    let (r, _) = cold(p.acquire(0, "f", 128));
    p.release(ms(1), r, true);
    let pro = pro_ready(&mut p, ms(2), "f", 128);
    assert_eq!(p.idle_count("f"), 2);
    // The reactive sandbox is the more recent, but the proactive one goes first.
    assert_eq!(p.acquire(ms(3), "f", 128), Acquire::Warm(pro));
    assert_eq!(fn_stats(&p, "f").proactive_busy, 1);
    assert_eq!(p.acquire(ms(4), "f", 128), Acquire::Warm(r));
    p.release(ms(5), pro, true);
    p.check_invariants().expect("consistent");
    let s = fn_stats(&p, "f");
    assert_eq!((s.proactive_idle, s.warm, s.running), (1, 0, 1));
    // Reactive memory accounting does not include it.
    assert_eq!(p.stats().memory_warm_mb, 0);
    assert_eq!(p.acquire(ms(6), "f", 128), Acquire::Warm(pro));
}

#[test]
fn a_proactive_sandbox_survives_keep_alive_expiry_and_memory_pressure() {
    // 512 MiB: 128 proactive, 384 for reactive sandboxes.
    let mut p = pro_pool(512, 128);
    let (r, _) = cold(p.acquire(0, "f", 128));
    p.release(ms(1), r, true);
    let pro = pro_ready(&mut p, ms(1), "f", 128);
    // Keep-alive (10 s) ends for the reactive one only.
    p.on_timeout(secs(60));
    assert_eq!(
        drain(&mut p),
        vec![PoolAction::Destroy {
            sandbox: r,
            reason: DestroyReason::Expired
        }]
    );
    assert_eq!(p.next_timeout(), None, "no timer for a proactive sandbox");
    // Memory pressure: three 128 MiB reactive sandboxes of other functions fill the reactive
    // part; a fourth finds it full and evicts a reactive idle one, never the proactive one.
    let mut idle = Vec::new();
    for (i, f) in ["a", "b", "c"].iter().enumerate() {
        let (id, _) = cold(p.acquire(secs(61), f, 128));
        p.release(secs(61) + ms(i as u64), id, true);
        idle.push(id);
    }
    let (_d, _) = cold(p.acquire(secs(62), "d", 128));
    assert_eq!(evicted(&drain(&mut p)), vec![idle[0]]);
    let _ = cold(p.acquire(secs(63), "e", 128));
    let _ = cold(p.acquire(secs(63), "g", 128));
    assert_eq!(evicted(&drain(&mut p)), vec![idle[1], idle[2]]);
    // With every reactive sandbox busy, a cold start is refused rather than take its memory.
    assert_eq!(
        p.acquire(secs(63), "h", 128),
        Acquire::NoMemory {
            needed_mb: 128,
            free_mb: 0
        }
    );
    assert_eq!(p.acquire(secs(64), "f", 128), Acquire::Warm(pro));
    p.check_invariants().expect("consistent");
}

#[test]
fn reactive_cold_starts_cannot_use_the_proactive_pool() {
    let mut p = pro_pool(512, 256);
    let (a, _) = cold(p.acquire(0, "a", 256));
    assert_eq!(
        p.acquire(0, "b", 128),
        Acquire::NoMemory {
            needed_mb: 128,
            free_mb: 0
        }
    );
    // The empty proactive pool is still whole for the controller.
    let _ = pro_ready(&mut p, 0, "b", 256);
    p.release(ms(1), a, true);
    p.check_invariants().expect("consistent");
    // A proactive pool as large as the whole budget leaves reactive sandboxes nothing.
    let mut p = pro_pool(256, 256);
    assert!(matches!(p.acquire(0, "a", 64), Acquire::NoMemory { .. }));
    assert!(PoolConfig {
        proactive_mb: 512,
        ..p.config().clone()
    }
    .validate()
    .is_err());
    assert!(p.config().validate().is_ok());
}

#[test]
fn soft_evicted_sandboxes_are_not_acquired_until_unmarked() {
    let mut p = pro_pool(1024, 256);
    let pro = pro_ready(&mut p, 0, "f", 128);
    assert_eq!(p.proactive_soft_evict("f"), Some(pro));
    assert_eq!(p.proactive_soft_evict("f"), None, "nothing left to mark");
    assert_eq!(p.idle_count("f"), 0);
    assert_eq!(fn_stats(&p, "f").proactive_soft, 1);
    let (c, why) = cold(p.acquire(ms(1), "f", 128));
    assert_ne!(c, pro);
    assert_eq!(why, ColdReason::New);
    // Still exempt from keep-alive while soft, and its memory still counts.
    p.on_timeout(secs(600));
    assert_eq!(p.proactive_used_mb(), 128);
    assert_eq!(p.proactive_unmark("f"), Some(pro));
    assert_eq!(p.proactive_unmark("f"), None);
    assert_eq!(p.acquire(secs(601), "f", 128), Acquire::Warm(pro));
    p.check_invariants().expect("consistent");
}

#[test]
fn a_busy_proactive_sandbox_marked_soft_becomes_soft_when_its_run_ends() {
    let mut p = pro_pool(1024, 256);
    let pro = pro_ready(&mut p, 0, "f", 128);
    assert_eq!(p.acquire(ms(1), "f", 128), Acquire::Warm(pro));
    assert_eq!(p.proactive_soft_evict("f"), Some(pro));
    assert_eq!(p.is_soft(pro), Some(true));
    p.release(ms(2), pro, true);
    assert_eq!(fn_stats(&p, "f").proactive_soft, 1);
    assert_eq!(p.idle_count("f"), 0);
    // A pending mark can be cancelled before the run ends.
    assert_eq!(p.proactive_unmark("f"), Some(pro));
    assert_eq!(p.acquire(ms(3), "f", 128), Acquire::Warm(pro));
    assert_eq!(p.proactive_soft_evict("f"), Some(pro));
    assert_eq!(p.proactive_unmark("f"), Some(pro));
    p.release(ms(4), pro, true);
    assert_eq!(fn_stats(&p, "f").proactive_idle, 1);
    p.check_invariants().expect("consistent");
}

#[test]
fn proactive_evict_prefers_soft_then_idle_then_marks_busy() {
    let mut p = pro_pool(1024, 512);
    let a = pro_ready(&mut p, 0, "f", 128);
    let b = pro_ready(&mut p, ms(1), "f", 128);
    let c = pro_ready(&mut p, ms(2), "f", 128);
    // `a` is the least recently used: soft-evict it; then `c` goes busy.
    assert_eq!(p.proactive_soft_evict("f"), Some(a));
    assert_eq!(p.acquire(ms(3), "f", 128), Acquire::Warm(c));
    assert_eq!(
        p.proactive_evict(ms(4), "f"),
        Some(ProactiveEvicted::Now(a))
    );
    assert_eq!(
        p.proactive_evict(ms(4), "f"),
        Some(ProactiveEvicted::Now(b))
    );
    assert_eq!(
        drain(&mut p),
        [a, b]
            .iter()
            .map(|s| PoolAction::Destroy {
                sandbox: *s,
                reason: DestroyReason::Evicted
            })
            .collect::<Vec<_>>()
    );
    assert_eq!(p.proactive_used_mb(), 128);
    assert_eq!(
        p.proactive_evict(ms(5), "f"),
        Some(ProactiveEvicted::WhenDone(c))
    );
    assert_eq!(p.proactive_evict(ms(5), "f"), None, "already marked");
    assert!(drain(&mut p).is_empty(), "not destroyed while in use");
    p.release(ms(6), c, true);
    assert_eq!(
        drain(&mut p),
        vec![PoolAction::Destroy {
            sandbox: c,
            reason: DestroyReason::Evicted
        }]
    );
    assert_eq!(p.proactive_used_mb(), 0);
    assert_eq!(p.sandbox_count(), 0);
    p.check_invariants().expect("consistent");
}

#[test]
fn proactive_sandboxes_are_destroyed_on_retire_and_shutdown() {
    let mut p = pro_pool(1024, 512);
    let idle = pro_ready(&mut p, 0, "f", 128);
    let soft = pro_ready(&mut p, 0, "f", 128);
    assert_eq!(p.proactive_soft_evict("f"), Some(idle));
    let busy = pro_ready(&mut p, 0, "f", 128);
    assert_eq!(p.acquire(ms(1), "f", 128), Acquire::Warm(busy));
    let starting = p.proactive_create(ms(1), "f", 128).expect("fits");
    p.retire("f");
    let mut gone = destroyed(&drain(&mut p));
    gone.sort();
    assert_eq!(gone, vec![idle, soft]);
    p.check_invariants().expect("consistent");
    // The retired busy and starting ones are destroyed when done, never reused.
    p.release(ms(2), busy, true);
    p.on_sandbox_ready(ms(2), starting);
    assert_eq!(destroyed(&drain(&mut p)), vec![busy, starting]);
    assert_eq!(p.proactive_used_mb(), 0);
    // Shutdown: idle and soft proactive sandboxes go with the rest.
    let a = pro_ready(&mut p, ms(3), "g", 128);
    let b = pro_ready(&mut p, ms(3), "g", 128);
    assert_eq!(p.proactive_soft_evict("g"), Some(a));
    p.shutdown();
    let actions = drain(&mut p);
    assert_eq!(actions.len(), 2);
    assert!(actions.iter().all(|x| matches!(
        x,
        PoolAction::Destroy {
            sandbox,
            reason: DestroyReason::Shutdown
        } if *sandbox == a || *sandbox == b
    )));
    assert_eq!(p.sandbox_count(), 0);
    p.check_invariants().expect("consistent");
}

#[test]
fn a_failed_proactive_run_frees_its_room() {
    let mut p = pro_pool(1024, 128);
    let pro = pro_ready(&mut p, 0, "f", 128);
    assert_eq!(p.acquire(ms(1), "f", 128), Acquire::Warm(pro));
    p.release(ms(2), pro, false);
    assert_eq!(
        drain(&mut p),
        vec![PoolAction::Destroy {
            sandbox: pro,
            reason: DestroyReason::Failed
        }]
    );
    assert_eq!(p.proactive_free_mb(), 128);
    p.check_invariants().expect("consistent");
}

#[test]
fn a_budget_cut_evicts_idle_sandboxes_only_and_waits_for_running_ones() {
    let mut p = pool_with(KeepAliveKind::Lru, 1024);
    // Two busy (a, b) and two idle (c older than d), 256 MiB each.
    let (a, _) = cold(p.acquire(0, "a", 256));
    let (b, _) = cold(p.acquire(1, "b", 256));
    let c = run_cold(&mut p, "c", 256, 10, 2, 3);
    let d = run_cold(&mut p, "d", 256, 10, 4, 5);
    drain(&mut p);
    // Cut to 768: one idle sandbox goes, the least recently used.
    assert_eq!(p.set_memory_budget(6, 768), 768);
    assert_eq!(evicted(&drain(&mut p)), [c]);
    assert_eq!(p.idle_sandboxes(), [d]);
    p.check_invariants().unwrap();
    // Cut to 256, below the 512 MiB running: every idle one goes, the busy ones stay.
    p.set_memory_budget(7, 256);
    assert_eq!(evicted(&drain(&mut p)), [d]);
    assert_eq!(p.over_budget_mb(), 256);
    assert_eq!(p.stats().memory_running_mb, 512);
    p.check_invariants().unwrap();
    // Nothing new starts while over, not even a small one.
    assert!(matches!(p.acquire(8, "e", 64), Acquire::NoMemory { .. }));
    // a ends: its sandbox is destroyed rather than kept (still over with it).
    p.release(9, a, true);
    assert_eq!(evicted(&drain(&mut p)), [a]);
    assert_eq!(p.over_budget_mb(), 0);
    // b ends: it fits now and stays warm.
    p.release(10, b, true);
    assert!(drain(&mut p).is_empty());
    assert_eq!(p.idle_sandboxes(), [b]);
    p.check_invariants().unwrap();
    // Growing makes room at once, without touching b.
    p.set_memory_budget(11, 1024);
    let (_, why) = cold(p.acquire(12, "e", 512));
    assert_eq!(why, ColdReason::New);
    assert!(drain(&mut p).is_empty());
    assert_eq!(p.acquire(13, "b", 256), Acquire::Warm(b));
    p.check_invariants().unwrap();
}

#[test]
fn a_budget_cut_never_goes_under_the_proactive_pool() {
    let mut p = SandboxPool::new(PoolConfig {
        memory_budget_mb: 1024,
        free_buffer_mb: 0,
        keepalive: KeepAliveConfig::default(),
        generic: GenericConfig::OFF,
        proactive_mb: 256,
    });
    assert_eq!(p.set_memory_budget(0, 100), 256);
    assert_eq!(p.reactive_budget_mb(), 0);
    p.check_invariants().unwrap();
}

/// Creations of generic sandboxes with their keys and memory.
fn created_keyed(actions: &[PoolAction]) -> Vec<(SandboxId, GenericKey, u64)> {
    actions
        .iter()
        .filter_map(|a| match a {
            PoolAction::CreateGeneric {
                sandbox,
                key,
                memory_mb,
            } => Some((*sandbox, key.clone(), *memory_mb)),
            _ => None,
        })
        .collect()
}

fn generic_of(a: Acquire) -> Option<SandboxId> {
    match a {
        Acquire::Cold { generic, .. } => generic,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_cold_start_takes_a_generic_sandbox_of_its_own_key_only() {
    let mut p = generic_pool(4096, 1, 4);
    let bare = fill(&mut p, 0);
    assert_eq!(bare.len(), 1);
    p.set_generic_key("np", None, Some("sha256:layer"));
    // The default key's ready sandbox would not have numpy: the cold start makes its own.
    assert_eq!(generic_of(p.acquire(ms(1), "np", 256)), None);
    let made = created_keyed(&drain(&mut p));
    let layer = GenericKey::new(None, Some("sha256:layer"));
    // One pre-imported sandbox for the layer, reserving what its function needs (its
    // imports live in it before the function does), never less than a bare one.
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!((made[0].1.clone(), made[0].2), (layer.clone(), 256));
    assert_eq!(p.generic_key_of(made[0].0), Some(&layer));
    p.on_generic_ready(ms(2), made[0].0);
    assert_eq!(p.stats().memory_generic_mb, 32 + 256);
    assert_eq!(p.stats().generic.keys, 2);
    // A second function of the same layer takes it; a plain one takes the bare one.
    p.set_generic_key("np2", None, Some("sha256:layer"));
    assert_eq!(generic_of(p.acquire(ms(3), "np2", 128)), Some(made[0].0));
    assert_eq!(generic_of(p.acquire(ms(4), "plain", 64)), Some(bare[0]));
    // Another runtime is another key, even with the same layer.
    p.set_generic_key("other", Some("sha256:rt"), Some("sha256:layer"));
    let _ = drain(&mut p);
    assert_eq!(generic_of(p.acquire(ms(5), "other", 64)), None);
    p.check_invariants().unwrap();
}

#[test]
fn a_function_back_on_the_default_key_takes_bare_sandboxes_again() {
    let mut p = generic_pool(4096, 1, 2);
    let bare = fill(&mut p, 0);
    p.set_generic_key("f", None, Some("sha256:l"));
    p.set_generic_key("f", None, None);
    assert_eq!(generic_of(p.acquire(ms(1), "f", 64)), Some(bare[0]));
    // Saying the default key of an unknown function interns nothing.
    p.set_generic_key("never-invoked", None, None);
    assert!(p.function_of(SandboxId(999)).is_none());
    p.check_invariants().unwrap();
}

#[test]
fn keys_drain_after_their_window_and_only_the_default_key_keeps_its_floor() {
    let mut p = generic_pool(4096, 1, 8);
    fill(&mut p, 0);
    for (i, f) in ["a", "b"].iter().enumerate() {
        p.set_generic_key(f, None, Some(&format!("sha256:{f}")));
        let _ = p.acquire(ms(1 + i as u64), f, 128);
    }
    let made = created_keyed(&drain(&mut p));
    assert_eq!(made.len(), 2, "{made:?}");
    for (id, ..) in &made {
        p.on_generic_ready(ms(10), *id);
    }
    assert_eq!(p.stats().generic.ready, 3);
    // The window passes with no cold start: both layer keys drain and are forgotten; the
    // default key keeps its one.
    let t = p.next_timeout().expect("the layer keys shrink later");
    assert!(t > secs(10) && t <= secs(10) + ms(10), "{t}");
    p.on_timeout(secs(11));
    let gone = destroyed(&drain(&mut p));
    assert_eq!(gone.len(), 2);
    assert!(made.iter().all(|(id, ..)| gone.contains(id)));
    let s = p.stats();
    assert_eq!(
        (s.generic.ready, s.generic.keys, s.memory_generic_mb),
        (1, 1, 32)
    );
    assert_eq!(p.next_timeout(), None);
    p.check_invariants().unwrap();
}

#[test]
fn all_keys_together_hold_at_most_max_and_a_refill_never_evicts() {
    // Room for `w` warm (512) and a few generic sandboxes.
    let mut p = generic_pool(1024, 0, 3);
    run_cold(&mut p, "w", 512, 10, 0, ms(1));
    let _ = drain(&mut p);
    for i in 0..5 {
        let f = format!("f{i}");
        p.set_generic_key(&f, None, Some(&format!("sha256:{i}")));
        let id = match p.acquire(ms(2 + i), &f, 64) {
            Acquire::Cold { sandbox, .. } => sandbox,
            other => panic!("{other:?}"),
        };
        p.release(ms(3 + i), id, false);
        p.check_invariants().unwrap();
    }
    let actions = drain(&mut p);
    let made = created_keyed(&actions);
    assert!(evicted(&actions).is_empty(), "a refill evicted");
    assert_eq!(p.idle_count("w"), 1);
    assert!(made.len() <= 3, "{made:?}");
    assert!(p.stats().generic.creating + p.stats().generic.ready <= 3);
    p.check_invariants().unwrap();
}

#[test]
fn a_key_short_of_memory_backs_off_while_another_key_refills() {
    // The default key's 32 fits, the layer's 256 does not once `w` is warm and `np` runs.
    let mut p = generic_pool(400, 1, 4);
    run_cold(&mut p, "w", 100, 10, 0, ms(1));
    let _ = drain(&mut p);
    p.set_generic_key("np", None, Some("sha256:l"));
    let _ = p.acquire(ms(2), "np", 256);
    let actions = drain(&mut p);
    // 400 − 100 (w) − 32 (the bare one made with `w`) − 256 (np running) = 12: the layer's
    // sandbox (256) waits; nothing is evicted for it.
    assert!(created_keyed(&actions).is_empty(), "{actions:?}");
    assert!(evicted(&actions).is_empty());
    assert_eq!(p.stats().generic.ready + p.stats().generic.creating, 1);
    let t = p.next_timeout().expect("a retry later");
    assert!(t >= ms(2) + secs(1), "{t}");
    // Once `np` ends and its sandbox is gone, the retry makes the layer's sandbox.
    p.on_timeout(ms(2) + secs(1));
    assert!(
        created_keyed(&drain(&mut p)).is_empty(),
        "np still holds its memory"
    );
    p.check_invariants().unwrap();
}

#[test]
fn the_default_keys_floor_is_its_own_whatever_the_other_keys_want() {
    let mut p = generic_pool(8192, 1, 2);
    let bare = fill(&mut p, 0);
    // The bare one is taken; two layers each want one: only max − min = 1 place is theirs.
    assert_eq!(generic_of(p.acquire(ms(1), "plain", 64)), Some(bare[0]));
    for f in ["a", "b", "c"] {
        p.set_generic_key(f, None, Some(f));
        let _ = p.acquire(ms(2), f, 64);
    }
    let made = created_keyed(&drain(&mut p));
    let layered = made.iter().filter(|(_, k, _)| !k.is_default()).count();
    let default = made.iter().filter(|(_, k, _)| k.is_default()).count();
    assert_eq!((default, layered), (1, 1), "{made:?}");
    assert!(!p.generic.wants_refill());
    assert_eq!(
        p.next_timeout().map(|t| t > ms(2)),
        Some(true),
        "no busy timer"
    );
    p.check_invariants().unwrap();
}
