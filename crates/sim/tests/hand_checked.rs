//! A scenario small enough to work out by hand: two functions, one worker with one CPU,
//! processor sharing, a cold start's init delay, a queued invocation and a warm reuse.

mod common;

use common::{function, workload};
use hearth_core::balance::BalanceKind;
use hearth_core::time::ms;
use hearth_core::{ColdReason, RegulatorConfig};
use hearth_sim::{simulate, Collect, End, Record};

#[test]
fn completion_times_follow_processor_sharing_on_one_cpu() {
    // a: 100 ms of work, 50 ms init; b: 50 ms of work, no init. Concurrency limit 2.
    let w = workload(
        vec![function("a", 100, 50, 128), function("b", 50, 0, 128)],
        &[(0, 0), (ms(10), 1), (ms(20), 1), (ms(300), 0)],
    );
    let mut config = common::cluster(1, 1, BalanceKind::RoundRobin, 1);
    config.regulator = RegulatorConfig::Fixed(2);
    let mut out = Collect::default();
    let stats = simulate(&w, &config, &mut out).unwrap();
    // By hand:
    //  0      a#0 arrives, cold: init until 50.
    //  10     b#1 arrives, cold with no init: runs alone on the CPU (50 ms of work).
    //  20     b#2 arrives: 2 running = the limit, so it waits in the queue.
    //  50     a#0 starts executing; b#1 has 10 ms of work left; both now at rate 1/2.
    //  70     b#1 done (10 ms of work in 20 ms). b#2 leaves the queue (waited 50 ms) and runs
    //         warm on b's sandbox; a#0 has done 10 of 100.
    //  170    b#2 done (50 ms of work at rate 1/2); a#0 has done 60, 40 left, now alone.
    //  210    a#0 done: executed 160 ms of wall time.
    //  300    a#3 arrives: warm (a's sandbox is idle), alone: done at 400.
    let done = |id, end_ms, cold, queue_ms, init_ms, exec_ms| Record {
        id,
        function: if id == 0 || id == 3 { 0 } else { 1 },
        worker: Some(0),
        scheduled_us: [0, ms(10), ms(20), ms(300)][id as usize],
        end_us: ms(end_ms),
        end: End::Done {
            cold,
            queue_us: ms(queue_ms),
            init_us: ms(init_ms),
            exec_us: ms(exec_ms),
        },
    };
    assert_eq!(
        out.records,
        [
            done(1, 70, Some(ColdReason::New), 0, 0, 60),
            done(2, 170, None, 50, 0, 100),
            done(0, 210, Some(ColdReason::New), 0, 50, 160),
            done(3, 400, None, 0, 0, 100),
        ]
    );
    assert_eq!((stats.completed, stats.dropped, stats.cold), (4, 0, 2));
    assert_eq!(stats.end_us, ms(400));
}

#[test]
fn with_enough_cpus_nothing_stretches() {
    // The same arrivals on 4 CPUs with no limit to speak of: every invocation takes its own
    // time (plus init when cold).
    let w = workload(
        vec![function("a", 100, 50, 128), function("b", 50, 0, 128)],
        &[(0, 0), (ms(10), 1), (ms(20), 1), (ms(300), 0)],
    );
    let config = common::cluster(1, 4, BalanceKind::RoundRobin, 1);
    let mut out = Collect::default();
    simulate(&w, &config, &mut out).unwrap();
    let e2e: Vec<(u32, u64)> = out.records.iter().map(|r| (r.id, r.e2e_us())).collect();
    // b#2 finds b's only sandbox busy: a concurrent cold start (no init for b).
    assert_eq!(e2e, [(1, ms(50)), (2, ms(50)), (0, ms(150)), (3, ms(100))]);
}

#[test]
fn an_execution_past_its_timeout_is_killed_and_its_sandbox_not_reused() {
    // a: 100 ms of work, 50 ms init, timeout 80 ms (always too slow); b: 60 ms, timeout 100 ms
    // (in time alone, not when it shares the CPU); c: 200 ms, no timeout. 1 CPU, limit 2.
    let mut a = function("a", 100, 50, 128);
    a.timeout_us = Some(ms(80));
    let mut b = function("b", 60, 0, 128);
    b.timeout_us = Some(ms(100));
    let w = workload(
        vec![a, b, function("c", 200, 0, 128)],
        &[(0, 0), (ms(300), 2), (ms(300), 1), (ms(700), 1)],
    );
    let mut config = common::cluster(1, 1, BalanceKind::RoundRobin, 1);
    config.regulator = RegulatorConfig::Fixed(2);
    let mut out = Collect::default();
    let stats = simulate(&w, &config, &mut out).unwrap();
    // By hand:
    //  0      a#0 cold: init until 50, executes from 50; the timeout (exec only, as the worker
    //         times the handler) kills it at 130.
    //  300    c#1 and b#2 arrive, both cold (new), both at rate 1/2 on the one CPU.
    //  400    b#2 has done 50 of its 60 ms: killed at its 100 ms timeout. c#1 has done 50.
    //  550    c#1 done: its last 150 alone (exec 250).
    //  700    b#3: b's sandbox was destroyed, not kept warm: cold again; 60 alone, done at 760.
    let rec = |id: u32, function, end_ms, end| Record {
        id,
        function,
        worker: Some(0),
        scheduled_us: w.arrivals[id as usize].at_us,
        end_us: ms(end_ms),
        end,
    };
    let new = Some(ColdReason::New);
    let timed_out = |init_ms, exec_ms| End::TimedOut {
        cold: new,
        queue_us: 0,
        init_us: ms(init_ms),
        exec_us: ms(exec_ms),
    };
    let done = |exec_ms| End::Done {
        cold: new,
        queue_us: 0,
        init_us: 0,
        exec_us: ms(exec_ms),
    };
    assert_eq!(
        out.records,
        [
            rec(0, 0, 130, timed_out(50, 80)),
            rec(2, 1, 400, timed_out(0, 100)),
            rec(1, 2, 550, done(250)),
            rec(3, 1, 760, done(60)),
        ]
    );
    assert_eq!(
        (stats.completed, stats.timed_out, stats.dropped, stats.cold),
        (2, 2, 0, 2)
    );
    // In the results format, as the load generator records the worker's 504.
    let row = hearth_sim::record::result_row(&w, &out.records[0]);
    assert_eq!((row.status, row.cold), (504, false));
    assert_eq!(
        row.error,
        "timeout: a did not finish within its timeout of 80 ms; its sandbox was killed"
    );
}
