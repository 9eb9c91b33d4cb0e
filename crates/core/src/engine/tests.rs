//! Engine tests: admission, the queue disciplines end to end, memory waits, cancellation,
//! bypass and the regulator, with explicit times.

use super::*;
use crate::bypass::BypassConfig;
use crate::policy::keepalive::KeepAliveConfig;
use crate::regulator::AimdConfig;
use crate::time::{ms, secs};

fn config(queue: QueueDiscipline, limit: u32) -> EngineConfig {
    EngineConfig {
        pool: PoolConfig {
            memory_budget_mb: 4096,
            free_buffer_mb: 0,
            keepalive: KeepAliveConfig::default(),
            generic: crate::pool::GenericConfig::OFF,
            proactive_mb: 0,
        },
        queue,
        max_queue: 100,
        regulator: RegulatorConfig::Fixed(limit),
        bypass: BypassConfig::default(),
        cpus: 2,
        load_source: LoadSource::External,
        warm_wait: false,
    }
}

/// What became of an arriving invocation, as the tests read it.
#[derive(Debug)]
enum Admission {
    Run(Run),
    Queued(InvocationId),
    Rejected(Reject),
}

/// An invocation arrives: its Run or Reject is the first action of the call (then the pool's
/// actions it caused, which are dropped here); no action for it means it was queued.
fn admit(e: &mut WorkerEngine, now: Micros, a: Arrival<'_>) -> Admission {
    let id = e.on_invocation(now, a);
    let actions: Vec<EngineAction> = std::iter::from_fn(|| e.poll_action()).collect();
    let mine = |a: &EngineAction| match a {
        EngineAction::Run(r) => r.invocation == id,
        EngineAction::Reject { invocation, .. } => *invocation == id,
        _ => false,
    };
    assert!(
        actions.iter().skip(1).all(|a| !mine(a)),
        "the arrival's own action comes first: {actions:?}"
    );
    match actions.into_iter().next() {
        Some(EngineAction::Run(r)) if r.invocation == id => Admission::Run(r),
        Some(EngineAction::Reject { invocation, reason }) if invocation == id => {
            Admission::Rejected(reason)
        }
        _ => Admission::Queued(id),
    }
}

fn arrive(e: &mut WorkerEngine, now: Micros, f: &str) -> Admission {
    admit(
        e,
        now,
        Arrival {
            function: f,
            memory_mb: 128,
            deadline_us: None,
            drop_late: false,
        },
    )
}

fn run_of(a: Admission) -> Run {
    match a {
        Admission::Run(r) => r,
        other => panic!("expected to run, got {other:?}"),
    }
}

fn queued(a: Admission) -> InvocationId {
    match a {
        Admission::Queued(id) => id,
        other => panic!("expected to queue, got {other:?}"),
    }
}

fn done(exec: Micros) -> Completion {
    Completion {
        exec_us: Some(exec),
        init_us: Some(ms(100)),
        reusable: true,
    }
}

fn runs(e: &mut WorkerEngine) -> Vec<Run> {
    std::iter::from_fn(|| e.poll_action())
        .filter_map(|a| match a {
            EngineAction::Run(r) => Some(r),
            _ => None,
        })
        .collect()
}

/// Teaches the engine that `f` runs for `exec` warm (one cold run, then one warm run).
fn learn(e: &mut WorkerEngine, t: &mut Micros, f: &str, exec: Micros) {
    for _ in 0..2 {
        let r = run_of(arrive(e, *t, f));
        *t += exec;
        e.on_completed(*t, &r, done(exec));
        *t += 1;
    }
    assert_eq!(e.function_characteristics(f).unwrap().warm_us(), exec);
}

/// With concurrency 1: a long function runs; another long one and a short one queue behind it.
/// Returns which of the two queued ones started first when the running one finished.
fn first_after_long(discipline: QueueDiscipline) -> Arc<str> {
    let mut e = WorkerEngine::new(config(discipline, 1));
    let mut t = 0;
    learn(&mut e, &mut t, "long", ms(1000));
    learn(&mut e, &mut t, "short", ms(10));
    let running = run_of(arrive(&mut e, t, "long"));
    queued(arrive(&mut e, t + 1, "long"));
    queued(arrive(&mut e, t + 2, "short"));
    assert_eq!(e.stats().queue_length, 2);
    e.on_completed(t + ms(1000), &running, done(ms(1000)));
    let started = runs(&mut e);
    assert_eq!(started.len(), 1, "the limit is 1");
    let arrived = if &*started[0].function == "long" {
        1
    } else {
        2
    };
    assert_eq!(started[0].queued_us, ms(1000) - arrived);
    started[0].function.clone()
}

#[test]
fn sjf_runs_a_short_function_queued_behind_a_long_one_first() {
    assert_eq!(&*first_after_long(QueueDiscipline::Sjf), "short");
    assert_eq!(&*first_after_long(QueueDiscipline::Eedf), "short");
    assert_eq!(&*first_after_long(QueueDiscipline::Fcfs), "long");
}

#[test]
fn eedf_spreads_a_burst_of_one_function_with_its_cold_time() {
    // f: warm 50 ms, cold 450 ms (init 400); g: warm 300 ms. One idle sandbox of f.
    let mut e = WorkerEngine::new(config(QueueDiscipline::Eedf, 1));
    let mut t = 0;
    let r = run_of(arrive(&mut e, t, "f"));
    e.on_completed(
        t + ms(450),
        &r,
        Completion {
            exec_us: Some(ms(50)),
            init_us: Some(ms(400)),
            reusable: true,
        },
    );
    t += ms(451);
    let r = run_of(arrive(&mut e, t, "f"));
    t += ms(50);
    e.on_completed(t, &r, done(ms(50)));
    learn(&mut e, &mut t, "g", ms(300));
    // Occupy the single slot, then queue f, f, g at the same instant.
    let blocker = run_of(arrive(&mut e, t, "g"));
    let f1 = queued(arrive(&mut e, t, "f")); // one idle f sandbox: warm, key t + 50
    let f2 = queued(arrive(&mut e, t, "f")); // it is spoken for: cold, key t + 450
    let g = queued(arrive(&mut e, t, "g")); // key t + 300
    let mut order = Vec::new();
    let mut next = blocker;
    for _ in 0..3 {
        t += ms(500);
        e.on_completed(t, &next, done(ms(10)));
        next = runs(&mut e).pop().unwrap();
        order.push(next.invocation);
    }
    assert_eq!(order, [f1, g, f2], "the second f waits behind g");
}

#[test]
fn a_full_queue_rejects() {
    let mut c = config(QueueDiscipline::Fcfs, 1);
    c.max_queue = 2;
    let mut e = WorkerEngine::new(c);
    run_of(arrive(&mut e, 0, "f"));
    queued(arrive(&mut e, 1, "f"));
    queued(arrive(&mut e, 2, "f"));
    assert!(matches!(
        arrive(&mut e, 3, "f"),
        Admission::Rejected(Reject::QueueFull { length: 2 })
    ));
}

#[test]
fn an_invocation_without_memory_waits_for_running_ones_then_runs_warm() {
    let mut c = config(QueueDiscipline::Fcfs, 4);
    c.pool.memory_budget_mb = 256;
    let mut e = WorkerEngine::new(c);
    let big = |e: &mut WorkerEngine, t| {
        admit(
            e,
            t,
            Arrival {
                function: "big",
                memory_mb: 200,
                deadline_us: None,
                drop_late: false,
            },
        )
    };
    let first = run_of(big(&mut e, 0));
    let second = queued(big(&mut e, 10));
    assert!(runs(&mut e).is_empty());
    e.on_completed(ms(100), &first, done(ms(99)));
    let r = runs(&mut e);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].invocation, second);
    assert_eq!(r[0].cold, None, "it reuses the sandbox the first one left");
    assert_eq!(r[0].queued_us, ms(100) - 10);
    // More than the whole budget: rejected at once.
    assert!(matches!(
        admit(
            &mut e,
            ms(200),
            Arrival {
                function: "huge",
                memory_mb: 300,
                deadline_us: None,
                drop_late: false
            }
        ),
        Admission::Rejected(Reject::TooLarge {
            needed_mb: 300,
            budget_mb: 256
        })
    ));
}

#[test]
fn an_invocation_waits_for_memory_held_by_a_starting_prewarm() {
    let mut c = config(QueueDiscipline::Fcfs, 4);
    c.pool.memory_budget_mb = 256;
    let mut e = WorkerEngine::new(c);
    let (ids, no_mem) = e.prewarm(0, "p", 200, 1);
    assert_eq!((ids.len(), no_mem), (1, 0));
    // The prewarm holds 200 MiB while starting; "q" needs 100: it waits for the prewarm.
    let q = admit(
        &mut e,
        1,
        Arrival {
            function: "q",
            memory_mb: 100,
            deadline_us: None,
            drop_late: false,
        },
    );
    let q = queued(q);
    // The prewarm fails: memory comes back and q runs.
    e.on_prewarm_failed(2, ids[0]);
    let r = runs(&mut e);
    assert_eq!(r[0].invocation, q);
}

#[test]
fn a_cancelled_invocation_leaves_the_queue_and_an_abandoned_run_frees_its_sandbox() {
    let mut e = WorkerEngine::new(config(QueueDiscipline::Fcfs, 1));
    let running = run_of(arrive(&mut e, 0, "f"));
    let gone = queued(arrive(&mut e, 1, "f"));
    let stays = queued(arrive(&mut e, 2, "g"));
    assert!(e.on_cancel(3, gone));
    assert!(!e.on_cancel(4, gone));
    e.on_completed(10, &running, done(9));
    let r = runs(&mut e).pop().unwrap();
    assert_eq!(r.invocation, stays);
    // Its caller left before it started: the reserved cold sandbox is dropped and the slot
    // returns.
    e.on_abandoned(11, &r);
    assert_eq!(e.stats().running, 0);
    assert_eq!(e.pool().stats().memory_running_mb, 0);
    assert_eq!(e.pool().idle_count("f"), 1);
}

#[test]
fn short_known_functions_bypass_the_queue_while_the_load_is_low() {
    let mut c = config(QueueDiscipline::Fcfs, 1);
    c.bypass = BypassConfig {
        threshold_us: ms(5),
        max_load: 0.8,
    };
    let mut e = WorkerEngine::new(c);
    let mut t = 0;
    learn(&mut e, &mut t, "tiny", ms(1));
    learn(&mut e, &mut t, "slow", ms(100));
    let _slow = run_of(arrive(&mut e, t, "slow"));
    queued(arrive(&mut e, t, "slow"));
    let tiny = run_of(arrive(&mut e, t, "tiny"));
    assert!(tiny.bypass);
    assert_eq!(e.stats().running_bypass, 1);
    e.on_completed(t + ms(1), &tiny, done(ms(1)));
    e.on_load(t + ms(2), 0.9);
    let again = arrive(&mut e, t + ms(3), "tiny");
    assert!(
        matches!(again, Admission::Queued(_)),
        "load too high: {again:?}"
    );
}

#[test]
fn aimd_raises_the_limit_with_the_simulated_load_of_idle_time() {
    let mut c = config(QueueDiscipline::Fcfs, 1);
    c.regulator = RegulatorConfig::Aimd(AimdConfig {
        max: 6,
        ..AimdConfig::default()
    });
    c.load_source = LoadSource::Simulated;
    let mut e = WorkerEngine::new(c);
    assert_eq!(e.stats().limit, 2, "starts at the CPUs");
    let mut now = 0;
    while let Some(t) = e.next_timeout().filter(|t| *t <= secs(60)) {
        now = t;
        e.on_timeout(now);
    }
    assert!(now >= secs(55));
    assert_eq!(
        e.stats().limit,
        6,
        "no load: additive increase up to the max"
    );
    // Saturate it: 12 long invocations on 2 CPUs push the load over the threshold.
    let runs0: Vec<_> = (0..12).map(|_| arrive(&mut e, now, "spin")).collect();
    assert_eq!(
        runs0
            .iter()
            .filter(|a| matches!(a, Admission::Run(_)))
            .count(),
        6
    );
    while let Some(t) = e.next_timeout().filter(|t| *t <= now + secs(120)) {
        e.on_timeout(t);
    }
    assert!(e.normalized_load() > 1.0, "{}", e.normalized_load());
    assert!(
        e.stats().limit < 6,
        "cut on congestion: {}",
        e.stats().limit
    );
}

#[test]
fn completions_teach_cold_and_warm_times_and_the_pool_its_costs() {
    let mut c = config(QueueDiscipline::Fcfs, 4);
    c.pool.keepalive = KeepAliveConfig::new(crate::policy::keepalive::KeepAliveKind::Landlord);
    let mut e = WorkerEngine::new(c);
    let r = run_of(arrive(&mut e, 0, "f"));
    assert_eq!(r.cold, Some(ColdReason::New));
    e.on_completed(
        ms(130),
        &r,
        Completion {
            exec_us: Some(ms(30)),
            init_us: Some(ms(100)),
            reusable: true,
        },
    );
    let ch = e.function_characteristics("f").unwrap();
    assert_eq!((ch.cold_us(), ch.warm_us()), (ms(130), 0));
    let r = run_of(arrive(&mut e, ms(200), "f"));
    assert_eq!(r.cold, None);
    e.on_completed(ms(230), &r, done(ms(30)));
    let ch = e.function_characteristics("f").unwrap();
    assert_eq!((ch.warm_us(), ch.init_us()), (ms(30), ms(100)));
    // Landlord's credit of the idle sandbox is its init cost (100 ms).
    assert_eq!(e.pool().credit("f"), Some(100.0));
    let rep = e.characteristics("f", ms(300)).unwrap();
    assert_eq!(rep.invocations, 2);
    assert_eq!(rep.iat_ewma_ms, 200.0);
}

#[test]
fn shutdown_rejects_the_queue_and_new_arrivals() {
    let mut e = WorkerEngine::new(config(QueueDiscipline::Fcfs, 1));
    let r = run_of(arrive(&mut e, 0, "f"));
    let q = queued(arrive(&mut e, 1, "f"));
    e.shutdown();
    let rejected: Vec<_> = std::iter::from_fn(|| e.poll_action())
        .filter_map(|a| match a {
            EngineAction::Reject { invocation, reason } => Some((invocation, reason)),
            _ => None,
        })
        .collect();
    assert_eq!(rejected, vec![(q, Reject::ShuttingDown)]);
    assert!(matches!(
        arrive(&mut e, 2, "f"),
        Admission::Rejected(Reject::ShuttingDown)
    ));
    e.on_completed(3, &r, done(2));
    let destroyed: Vec<_> = std::iter::from_fn(|| e.poll_action()).collect();
    assert!(
        matches!(
            destroyed.as_slice(),
            [EngineAction::Destroy {
                reason: DestroyReason::Retired | DestroyReason::Shutdown,
                ..
            }]
        ),
        "{destroyed:?}"
    );
}

#[test]
fn cheap_accessors_agree_with_the_stats() {
    let mut c = config(QueueDiscipline::Fcfs, 1);
    c.bypass = BypassConfig {
        threshold_us: ms(50),
        max_load: 1.0,
    };
    let mut e = WorkerEngine::new(c);
    let mut t = 0;
    learn(&mut e, &mut t, "short", ms(10));
    learn(&mut e, &mut t, "long", ms(1000));
    let _long = run_of(arrive(&mut e, t, "long"));
    queued(arrive(&mut e, t + 1, "long"));
    let short = run_of(arrive(&mut e, t + 2, "short"));
    assert!(short.bypass);
    let s = e.stats();
    assert_eq!((e.queue_length(), e.running()), (1, 2));
    assert_eq!(
        (s.queue_length, s.running + s.running_bypass),
        (e.queue_length(), e.running())
    );
}

mod warm_waits {
    use super::*;

    fn engine() -> WorkerEngine {
        let mut c = config(QueueDiscipline::Fcfs, 16);
        c.warm_wait = true;
        WorkerEngine::new(c)
    }

    fn drain(e: &mut WorkerEngine) -> Vec<EngineAction> {
        std::iter::from_fn(|| e.poll_action()).collect()
    }

    fn runs(actions: &[EngineAction]) -> Vec<&Run> {
        actions
            .iter()
            .filter_map(|a| match a {
                EngineAction::Run(r) => Some(r),
                _ => None,
            })
            .collect()
    }

    fn done(e: &mut WorkerEngine, now: Micros, r: &Run, exec: Micros, init: Option<Micros>) {
        e.on_completed(
            now,
            r,
            Completion {
                exec_us: Some(exec),
                init_us: init,
                reusable: true,
            },
        );
    }

    /// A function that runs 1 ms warm and 100 ms cold, learned from one cold and one warm run;
    /// returns the engine with one sandbox of it busy since `t`.
    fn busy_function(t: Micros) -> (WorkerEngine, Run) {
        let mut e = engine();
        let Admission::Run(r) = arrive(&mut e, 0, "f") else {
            panic!("runs")
        };
        assert!(r.cold.is_some());
        done(&mut e, ms(100), &r, ms(1), Some(ms(99)));
        let Admission::Run(r) = arrive(&mut e, ms(200), "f") else {
            panic!("runs")
        };
        assert!(r.cold.is_none());
        done(&mut e, ms(201), &r, ms(1), None);
        drain(&mut e);
        let Admission::Run(busy) = arrive(&mut e, t, "f") else {
            panic!("runs")
        };
        assert!(busy.cold.is_none(), "its warm sandbox");
        drain(&mut e);
        (e, busy)
    }

    #[test]
    fn a_call_that_finds_every_sandbox_busy_waits_when_one_frees_sooner_than_a_cold_start() {
        let (mut e, busy) = busy_function(ms(300));
        // The busy one ends in about 1 ms; a cold start takes 100: wait.
        let waiting = arrive(&mut e, ms(300) + 200, "f");
        assert!(matches!(waiting, Admission::Queued(_)), "{waiting:?}");
        assert_eq!(e.stats().warm_waiting, 1);
        // The busy sandbox frees: the waiter gets it, warm, and no sandbox was started.
        done(&mut e, ms(301), &busy, ms(1), None);
        let actions = drain(&mut e);
        let started = runs(&actions);
        assert_eq!(started.len(), 1, "{actions:?}");
        assert!(started[0].cold.is_none());
        assert_eq!(started[0].sandbox, busy.sandbox);
        let s = e.stats();
        assert_eq!((s.warm_waiting, s.warm_waits_avoided), (0, 1));
    }

    #[test]
    fn a_waiter_whose_busy_sandbox_fails_starts_one_at_once() {
        let (mut e, busy) = busy_function(ms(300));
        assert!(matches!(arrive(&mut e, ms(300), "f"), Admission::Queued(_)));
        // The busy sandbox crashes: nothing will free for the waiter, so it starts now rather
        // than at its give-up time (100 ms later).
        e.on_completed(
            ms(301),
            &busy,
            Completion {
                exec_us: None,
                init_us: None,
                reusable: false,
            },
        );
        let actions = drain(&mut e);
        let started = runs(&actions);
        assert_eq!(started.len(), 1, "{actions:?}");
        assert!(started[0].cold.is_some());
        assert_eq!(e.stats().warm_waiting, 0);
    }

    #[test]
    fn a_wait_that_runs_out_starts_a_sandbox_after_all() {
        let (mut e, _busy) = busy_function(ms(300));
        assert!(matches!(arrive(&mut e, ms(300), "f"), Admission::Queued(_)));
        let deadline = e.next_timeout().expect("a give-up time");
        // It waits as long as a cold start (100 ms) would take, no longer.
        assert_eq!(deadline, ms(400), "{deadline}");
        e.on_timeout(deadline);
        let actions = drain(&mut e);
        let started = runs(&actions);
        assert_eq!(started.len(), 1, "{actions:?}");
        assert!(started[0].cold.is_some(), "it starts one now");
        assert_eq!(e.stats().warm_waits_gave_up, 1);
    }

    #[test]
    fn no_wait_when_a_cold_start_is_sooner_or_nothing_is_known() {
        // Unknown function: start at once, as before.
        let mut e = engine();
        assert!(matches!(arrive(&mut e, 0, "g"), Admission::Run(_)));
        assert!(matches!(arrive(&mut e, 1, "g"), Admission::Run(_)));
        // One busy sandbox freeing in 1 ms, a 1 ms warm run, a 100 ms cold start: the k-th
        // waiter expects to wait (k + 1) ms plus its run, so 98 wait and the 99th starts one.
        let (mut e, _busy) = busy_function(ms(300));
        for k in 0..98 {
            let a = arrive(&mut e, ms(300), "f");
            assert!(matches!(a, Admission::Queued(_)), "waiter {k}: {a:?}");
        }
        assert!(matches!(arrive(&mut e, ms(300), "f"), Admission::Run(r) if r.cold.is_some()));
        // Off: the old behaviour.
        let mut c = config(QueueDiscipline::Fcfs, 16);
        c.warm_wait = false;
        let mut e = WorkerEngine::new(c);
        let Admission::Run(r) = arrive(&mut e, 0, "f") else {
            panic!()
        };
        done(&mut e, ms(100), &r, ms(1), Some(ms(99)));
        let Admission::Run(_) = arrive(&mut e, ms(200), "f") else {
            panic!()
        };
        assert!(matches!(arrive(&mut e, ms(200), "f"), Admission::Run(r) if r.cold.is_some()));
    }

    /// The burst of issue 13: 4 prewarmed sandboxes, 16 calls at once to a function never run
    /// yet. The prewarms' start time is its known cold cost; its warm time is unknown, so the
    /// 12 callers that find every sandbox busy wait (at most a millisecond each) instead of
    /// starting 12 sandboxes, and the busy ones, freeing within microseconds, serve them all.
    #[test]
    fn a_burst_on_prewarmed_sandboxes_waits_for_them_instead_of_starting_twelve() {
        let mut e = engine();
        let (ids, _) = e.prewarm(0, "noop", 128, 4);
        for id in &ids {
            e.on_sandbox_ready(ms(50), *id, Some(ms(50)));
        }
        drain(&mut e);
        let t = ms(100);
        let mut running = Vec::new();
        let mut waiting = 0;
        for _ in 0..16 {
            match arrive(&mut e, t, "noop") {
                Admission::Run(r) => {
                    assert!(
                        r.cold.is_none(),
                        "only the prewarmed ones run now: {r:?} {:?}",
                        e.stats()
                    );
                    running.push(r);
                }
                Admission::Queued(_) => waiting += 1,
                Admission::Rejected(r) => panic!("{r:?}"),
            }
        }
        assert_eq!((running.len(), waiting), (4, 12));
        let mut now = t;
        let mut served = 0;
        while let Some(r) = running.pop() {
            now += 45;
            done(&mut e, now, &r, 45, None);
            for next in runs(&drain(&mut e)) {
                assert!(next.cold.is_none(), "a waiter got a freed sandbox");
                served += 1;
                running.push(next.clone());
            }
        }
        assert_eq!(served, 12);
        let s = e.stats();
        assert_eq!((s.warm_waits_avoided, s.warm_waits_gave_up), (12, 0));
        assert_eq!(
            s.pool.functions[0].1.warm, 4,
            "no sandbox beyond the prewarmed four"
        );
    }

    #[test]
    fn a_waiter_whose_caller_leaves_is_forgotten_and_shutdown_rejects_waiters() {
        let (mut e, _busy) = busy_function(ms(300));
        let Admission::Queued(id) = arrive(&mut e, ms(300), "f") else {
            panic!()
        };
        assert!(e.on_cancel(ms(300), id));
        assert_eq!(e.stats().warm_waiting, 0);
        assert!(!matches!(e.next_timeout(), Some(t) if t <= ms(400)));
        let Admission::Queued(id) = arrive(&mut e, ms(300), "f") else {
            panic!()
        };
        e.shutdown();
        let actions = drain(&mut e);
        assert!(actions.iter().any(|a| matches!(a,
            EngineAction::Reject { invocation, reason: Reject::ShuttingDown } if *invocation == id)));
    }
}

fn arrive_by(e: &mut WorkerEngine, now: Micros, f: &str, mb: u64, deadline: Micros) -> Admission {
    admit(
        e,
        now,
        Arrival {
            function: f,
            memory_mb: mb,
            deadline_us: Some(deadline),
            drop_late: false,
        },
    )
}

/// SRSF computes remaining slack when a slot frees, with the work each needs then: `b` was
/// queued while its only sandbox was busy (a cold start expected: latest start at +50 ms, before
/// `a`'s +140 ms), but by dispatch its sandbox is idle, so it needs a warm run only and has more
/// slack left (100 ms) than `a` (90 ms). A key frozen at enqueue ran `b` first.
#[test]
fn srsf_uses_the_slack_left_at_dispatch_not_a_guess_frozen_at_enqueue() {
    let mut e = WorkerEngine::new(config(QueueDiscipline::Srsf, 1));
    let mut t = 0;
    learn(&mut e, &mut t, "a", ms(10)); // warm 10 ms, cold 110 ms
    learn(&mut e, &mut t, "b", ms(50)); // warm 50 ms, cold 150 ms
    let running = run_of(arrive(&mut e, t, "b"));
    let t0 = t;
    queued(arrive_by(&mut e, t0, "a", 128, ms(150)));
    queued(arrive_by(&mut e, t0, "b", 128, ms(200)));
    e.on_completed(t0 + ms(50), &running, done(ms(50)));
    let next = runs(&mut e);
    assert_eq!(next.len(), 1, "{next:?}");
    assert_eq!(&*next[0].function, "a");
    assert!(next[0].cold.is_none());
}

/// An invocation that waits for memory blocks nothing behind it: with a CPU slot free, the one
/// that fits starts even though the one that does not has less slack, both when it arrives and
/// when it was already queued.
#[test]
fn srsf_never_blocks_behind_an_invocation_waiting_for_memory() {
    let mut cfg = config(QueueDiscipline::Srsf, 3);
    cfg.pool.memory_budget_mb = 256;
    let mut e = WorkerEngine::new(cfg);
    let first = run_of(arrive_by(&mut e, 0, "small", 128, ms(1_000)));
    let big = queued(arrive_by(&mut e, 1, "big", 256, ms(100)));
    let small = run_of(arrive_by(&mut e, 2, "small", 128, ms(1_000)));
    assert_eq!(e.queue_length(), 1, "only big waits");
    // A third small queues (no memory left); when the first ends, its idle sandbox serves the
    // third at once, past big, which still does not fit.
    let third = queued(arrive_by(&mut e, 3, "small", 128, ms(1_000)));
    e.on_completed(ms(5), &first, done(ms(5)));
    let next = runs(&mut e);
    assert_eq!(next.len(), 1, "{next:?}");
    assert_eq!((next[0].invocation, next[0].cold), (third, None));
    e.on_completed(ms(6), &small, done(ms(5)));
    assert!(runs(&mut e).is_empty(), "big needs both sandboxes' memory");
    e.on_completed(ms(7), &next[0], done(ms(1)));
    let next = runs(&mut e);
    assert_eq!(next.len(), 1, "{next:?}");
    assert_eq!(next[0].invocation, big);
    assert!(next[0].cold.is_some());
}

// Dropping late work (`Hearth-Drop-Late`).

fn arrive_late(
    e: &mut WorkerEngine,
    now: Micros,
    f: &str,
    deadline: Micros,
    drop: bool,
) -> Admission {
    admit(
        e,
        now,
        Arrival {
            function: f,
            memory_mb: 128,
            deadline_us: Some(deadline),
            drop_late: drop,
        },
    )
}

/// With concurrency 1, a long invocation holds the slot while three queue behind it: a drop-late
/// one whose 100 ms deadline passes while it waits, an identical one that did not ask to drop,
/// and a drop-late one with a deadline long enough. When the slot frees at 500 ms, the first is
/// rejected as late (by 400 ms) and never runs; the other two run in turn.
fn a_queued_invocation_past_its_deadline_is_dropped_only_if_asked(discipline: QueueDiscipline) {
    let mut e = WorkerEngine::new(config(discipline, 1));
    let long = run_of(arrive(&mut e, 0, "long"));
    let dropped = queued(arrive_late(&mut e, 0, "f", ms(100), true));
    let kept = queued(arrive_late(&mut e, 0, "f", ms(100), false));
    let in_time = queued(arrive_late(&mut e, 0, "f", secs(10), true));
    e.on_completed(ms(500), &long, done(ms(500)));
    let actions: Vec<EngineAction> = std::iter::from_fn(|| e.poll_action()).collect();
    assert!(
        actions.contains(&EngineAction::Reject {
            invocation: dropped,
            reason: Reject::Late {
                late_by_us: ms(400)
            },
        }),
        "{actions:?}"
    );
    let started: Vec<InvocationId> = actions
        .iter()
        .filter_map(|a| match a {
            EngineAction::Run(r) => Some(r.invocation),
            _ => None,
        })
        .collect();
    assert_eq!(started, [kept], "the late one without drop_late still runs");
    let kept_run = actions
        .iter()
        .find_map(|a| match a {
            EngineAction::Run(r) => Some(r.clone()),
            _ => None,
        })
        .unwrap();
    e.on_completed(ms(600), &kept_run, done(ms(100)));
    let next = runs(&mut e);
    assert_eq!(
        next.iter().map(|r| r.invocation).collect::<Vec<_>>(),
        [in_time],
        "a drop-late invocation still in time runs"
    );
    assert_eq!(e.queue_length(), 0);
}

#[test]
fn fcfs_drops_a_queued_drop_late_invocation_past_its_deadline_and_runs_the_others() {
    a_queued_invocation_past_its_deadline_is_dropped_only_if_asked(QueueDiscipline::Fcfs);
}

#[test]
fn srsf_drops_a_queued_drop_late_invocation_past_its_deadline_and_runs_the_others() {
    a_queued_invocation_past_its_deadline_is_dropped_only_if_asked(QueueDiscipline::Srsf);
}

/// An invocation that arrives with no deadline left (a controller spent it all) is refused at
/// once when it asked to drop late work, and admitted as before when it did not.
#[test]
fn an_arrival_with_no_deadline_left_is_dropped_at_once_only_if_asked() {
    for discipline in [QueueDiscipline::Fcfs, QueueDiscipline::Srsf] {
        let mut e = WorkerEngine::new(config(discipline, 1));
        assert!(
            matches!(
                arrive_late(&mut e, 0, "f", 0, true),
                Admission::Rejected(Reject::Late { late_by_us: 0 })
            ),
            "{discipline:?}"
        );
        run_of(arrive_late(&mut e, 1, "f", 0, false));
    }
}

/// A parked warm-wait waiter is an invocation that has not started either: one that asked to
/// drop late work and whose deadline passed while it waited is refused when a sandbox frees.
#[test]
fn a_warm_waiter_past_its_deadline_is_dropped_if_asked() {
    let mut c = config(QueueDiscipline::Fcfs, 4);
    c.warm_wait = true;
    let mut e = WorkerEngine::new(c);
    let mut t = 0;
    // Cold start 100 ms + 10 ms; warm 10 ms: a waiter expects its sandbox sooner than a cold one.
    learn(&mut e, &mut t, "f", ms(10));
    let busy = run_of(arrive(&mut e, t, "f"));
    let waiter = queued(arrive_late(&mut e, t + 1, "f", ms(1), true));
    assert_eq!(e.stats().warm_waiting, 1, "it waits for the busy sandbox");
    e.on_completed(t + ms(10), &busy, done(ms(10)));
    let actions: Vec<EngineAction> = std::iter::from_fn(|| e.poll_action()).collect();
    assert!(
        actions.iter().any(|a| matches!(a, EngineAction::Reject {
            invocation, reason: Reject::Late { late_by_us } } if *invocation == waiter && *late_by_us == ms(9) - 1)),
        "{actions:?}"
    );
    assert!(!actions.iter().any(|a| matches!(a, EngineAction::Run(_))));
}

// Proactive sandboxes (Atoll §4.3) through the engine.

fn pro_config(budget: u64, proactive_mb: u64) -> EngineConfig {
    let mut c = config(QueueDiscipline::Fcfs, 4);
    c.pool.memory_budget_mb = budget;
    c.pool.proactive_mb = proactive_mb;
    c
}

fn pro_stats(e: &WorkerEngine, f: &str) -> crate::pool::FunctionPoolStats {
    e.stats().pool.function(f).cloned().unwrap_or_default()
}

#[test]
fn an_arrival_runs_warm_on_a_proactive_sandbox_that_then_returns_to_the_pool() {
    let mut e = WorkerEngine::new(pro_config(1024, 256));
    let sb = e.proactive_create(0, "f", 128).expect("room");
    assert_eq!(pro_stats(&e, "f").proactive_starting, 1);
    e.on_sandbox_ready(ms(1), sb, Some(ms(50)));
    let run = run_of(arrive(&mut e, ms(2), "f"));
    assert_eq!((run.sandbox, run.cold), (sb, None));
    assert_eq!(pro_stats(&e, "f").proactive_busy, 1);
    e.on_completed(ms(3), &run, done(ms(1)));
    let s = pro_stats(&e, "f");
    assert_eq!((s.proactive_idle, s.warm), (1, 0));
    let pool = e.stats().pool;
    assert_eq!(
        (pool.proactive_pool_mb, pool.memory_proactive_mb),
        (256, 128)
    );
    // Long after any keep-alive window it is still there.
    e.on_timeout(secs(3600));
    let run = run_of(arrive(&mut e, secs(3600), "f"));
    assert_eq!((run.sandbox, run.cold), (sb, None));
    e.pool().check_invariants().expect("consistent");
}

#[test]
fn a_queued_invocation_starts_on_a_proactive_sandbox_when_it_is_unmarked() {
    // 384 MiB: 256 proactive, 128 for one reactive sandbox.
    let mut e = WorkerEngine::new(pro_config(384, 256));
    let sb = e.proactive_create(0, "f", 128).expect("room");
    e.on_sandbox_ready(0, sb, None);
    assert_eq!(e.proactive_soft_evict("f"), Some(sb));
    let g = run_of(arrive(&mut e, ms(1), "g"));
    assert!(g.cold.is_some());
    // f's only sandbox is soft and the reactive memory is held by g: f waits.
    let id = queued(arrive(&mut e, ms(2), "f"));
    assert_eq!(e.proactive_unmark(ms(3), "f"), Some(sb));
    let started = runs(&mut e);
    assert_eq!(started.len(), 1);
    assert_eq!(
        (started[0].invocation, started[0].sandbox, started[0].cold),
        (id, sb, None)
    );
    e.pool().check_invariants().expect("consistent");
}

#[test]
fn proactive_evict_emits_destroy_and_creation_is_refused_when_full_or_shutting_down() {
    let mut e = WorkerEngine::new(pro_config(1024, 128));
    let sb = e.proactive_create(0, "f", 128).expect("room");
    assert_eq!(
        e.proactive_create(0, "g", 128),
        Err(ProactiveError::PoolFull {
            needed_mb: 128,
            free_mb: 0
        })
    );
    e.on_sandbox_ready(0, sb, None);
    assert_eq!(
        e.proactive_evict(ms(1), "f"),
        Some(ProactiveEvicted::Now(sb))
    );
    assert_eq!(
        e.poll_action(),
        Some(EngineAction::Destroy {
            sandbox: sb,
            reason: DestroyReason::Evicted
        })
    );
    assert_eq!(e.proactive_evict(ms(1), "f"), None);
    e.shutdown();
    assert_eq!(
        e.proactive_create(ms(2), "f", 64),
        Err(ProactiveError::ShuttingDown)
    );
}

#[test]
fn an_invocation_larger_than_the_reactive_part_is_too_large_without_a_proactive_sandbox() {
    let mut e = WorkerEngine::new(pro_config(512, 256));
    let big = Arrival {
        function: "f",
        memory_mb: 384,
        deadline_us: None,
        drop_late: false,
    };
    match admit(&mut e, 0, big) {
        Admission::Rejected(Reject::TooLarge {
            needed_mb: 384,
            budget_mb: 256,
        }) => {}
        other => panic!("expected too large, got {other:?}"),
    }
    // A proactive sandbox of the function may still serve it.
    let mut e = WorkerEngine::new(pro_config(512, 512));
    let sb = e.proactive_create(0, "f", 384).expect("room");
    e.on_sandbox_ready(0, sb, None);
    let run = run_of(admit(&mut e, ms(1), big));
    assert_eq!((run.sandbox, run.cold), (sb, None));
}

/// The engine hands the driver each generic sandbox's key and memory, and a cold start of a
/// function of a layer specializes only a sandbox of that layer.
#[test]
fn generic_sandboxes_come_with_their_key_and_a_run_takes_its_own() {
    let mut c = config(QueueDiscipline::Fcfs, 8);
    c.pool.generic = crate::pool::GenericConfig {
        max: 4,
        min: 1,
        memory_mb: 64,
        window_us: secs(30),
    };
    let mut e = WorkerEngine::new(c);
    e.set_generic_key("np", None, Some("sha256:np"));
    e.on_timeout(0);
    let mut made = Vec::new();
    while let Some(a) = e.poll_action() {
        if let EngineAction::CreateGeneric {
            sandbox,
            key,
            memory_mb,
        } = a
        {
            made.push((sandbox, key, memory_mb));
        }
    }
    // At start only the default key's floor: bare, 64 MiB.
    assert_eq!(made.len(), 1);
    assert!(made[0].1.is_default() && made[0].2 == 64);
    e.on_generic_ready(ms(1), made[0].0);
    let arrival = |f| Arrival {
        function: f,
        memory_mb: 512,
        deadline_us: None,
        drop_late: false,
    };
    let first = e.on_invocation(ms(2), arrival("np"));
    let mut runs = Vec::new();
    let mut layered = Vec::new();
    while let Some(a) = e.poll_action() {
        match a {
            EngineAction::Run(r) => runs.push(r),
            EngineAction::CreateGeneric {
                sandbox,
                key,
                memory_mb,
            } => layered.push((sandbox, key, memory_mb)),
            _ => {}
        }
    }
    // The bare sandbox is not the layer's: created from nothing; the layer's pool refills
    // with a sandbox that reserves its function's memory.
    assert_eq!(runs.len(), 1);
    assert_eq!((runs[0].invocation, runs[0].generic), (first, None));
    assert_eq!(layered.len(), 1, "{layered:?}");
    assert_eq!(layered[0].1.layer.as_deref(), Some("sha256:np"));
    assert_eq!(layered[0].2, 512);
    assert_eq!(e.generic_key_of(layered[0].0), Some(&layered[0].1));
    e.on_generic_ready(ms(3), layered[0].0);
    e.set_generic_key("np2", None, Some("sha256:np"));
    let _ = e.on_invocation(ms(4), arrival("np2"));
    let run = std::iter::from_fn(|| e.poll_action())
        .find_map(|a| match a {
            EngineAction::Run(r) => Some(r),
            _ => None,
        })
        .unwrap();
    assert_eq!(run.generic, Some(layered[0].0));
}
