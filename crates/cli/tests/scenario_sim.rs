//! The same scenarios through a live `hearth worker --backend sim` and through the simulator
//! (`common::scenario`): both must decide the same, call by call. Each scenario is also checked
//! against the decisions worked out by hand, so a change that moves both alike is noticed too.

mod common;

use common::scenario::{Call, Decisions, Function, Outcome, Scenario, Settings};
use hearth_core::KeepAliveKind;

const fn call(at_ms: u64, function: &'static str) -> Call {
    Call { at_ms, function }
}

const fn function(name: &'static str, exec_ms: u64, init_ms: u64) -> Function {
    Function {
        name,
        memory_mb: 128,
        exec_ms,
        init_ms,
        timeout_ms: None,
    }
}

/// TTL keep-alive of 1 s with room for three sandboxes: a concurrent cold start, evictions in
/// LRU order under memory pressure, a keep-alive window that ends, a cold start because of an
/// eviction and one because of an expiry, a warm start. Every idle sandbox's expiry and every
/// eviction is at least 150 ms from the call that depends on it.
const TTL_PRESSURE: Scenario = Scenario {
    name: "ttl_pressure",
    settings: Settings {
        memory_mb: 384,
        free_buffer_mb: 0,
        cpus: 4,
        concurrency: 4,
        queue: "fcfs",
        keepalive: "ttl",
        keepalive_ttl_s: 1,
    },
    functions: &[
        function("a", 200, 100),
        function("b", 200, 100),
        function("c", 200, 100),
        function("d", 200, 100),
    ],
    calls: &[
        call(0, "a"),    // 0: new; runs to 300, idle until 1300
        call(100, "a"),  // 1: concurrent (a's sandbox busy); idle 400 → 1400
        call(600, "b"),  // 2: new; idle 900 → 1900. Memory full.
        call(1000, "c"), // 3: new, evicts an idle `a` (least recently used)
        call(1650, "a"), // 4: the other `a` expired at 1300/1400: expired
        call(1750, "d"), // 5: new, evicts b (idle since 900; c since 1300)
        call(2450, "b"), // 6: evicted (c expired at 2300: room without evicting)
        call(2600, "a"), // 7: warm (idle since 1950)
    ],
};

/// One invocation at a time, shortest job first, GDSF keep-alive with room for two sandboxes,
/// and a function that runs past its timeout. Init times (and so GDSF's costs) and execution
/// times (SJF's expected times) are far apart.
const SJF_GDSF_TIMEOUT: Scenario = Scenario {
    name: "sjf_gdsf_timeout",
    settings: Settings {
        memory_mb: 256,
        free_buffer_mb: 0,
        cpus: 4,
        concurrency: 1,
        queue: "sjf",
        keepalive: "gdsf",
        keepalive_ttl_s: 600,
    },
    functions: &[
        function("costly", 100, 300),
        function("cheap", 150, 20),
        function("long", 400, 60),
        Function {
            timeout_ms: Some(200),
            ..function("hang", 1000, 0)
        },
    ],
    calls: &[
        // Learn the times.
        call(0, "costly"),   // 0: new, 0–400
        call(500, "costly"), // 1: warm, –600
        call(700, "cheap"),  // 2: new, –870 (memory now full)
        call(950, "cheap"),  // 3: warm, –1100
        call(1200, "long"),  // 4: new, evicts cheap (the lowest cost), –1660
        // long runs; three calls queue behind it in the order cheap, costly, long.
        call(1700, "long"),   // 5: warm, –2100
        call(1750, "cheap"),  // 6: queued; runs third, evicted
        call(1800, "costly"), // 7: queued; runs first, warm
        call(1850, "long"),   // 8: queued; runs last, evicted
        // A run past its timeout, twice: its sandbox is never reused.
        call(3300, "hang"), // 9: timeout at 3500
        call(3700, "hang"), // 10: timeout at 3900
    ],
};

fn ran(cold: Option<&str>, queued: bool) -> Outcome {
    Outcome::Ran {
        cold: cold.map(str::to_string),
        queued,
    }
}

fn check(s: &Scenario, expected: &Decisions) {
    let sim = s.simulate();
    assert_eq!(
        &sim,
        expected,
        "scenario {}: the simulator's decisions are not the ones worked out by hand\n{}",
        s.name,
        s.table(&sim, "sim", expected, "by hand")
    );
    s.assert_live_matches_sim();
}

fn ttl_pressure_expected() -> Decisions {
    let new = || ran(Some("new"), false);
    Decisions {
        outcomes: vec![
            new(),
            ran(Some("concurrent"), false),
            new(),
            new(),
            ran(Some("expired"), false),
            new(),
            ran(Some("evicted"), false),
            ran(None, false),
        ],
        run_order: (0..8).collect(),
        evicted: 2,
    }
}

#[test]
fn ttl_expiry_and_lru_eviction_decide_alike_live_and_simulated() {
    check(&TTL_PRESSURE, &ttl_pressure_expected());
}

#[test]
fn sjf_order_gdsf_evictions_and_a_timeout_decide_alike_live_and_simulated() {
    let (new, warm) = (ran(Some("new"), false), ran(None, false));
    let expected = Decisions {
        outcomes: vec![
            new.clone(),
            warm.clone(),
            new.clone(),
            warm.clone(),
            new,
            warm,
            // Shortest first once long#5 is done: costly (100 ms, warm), cheap (150 ms; its
            // sandbox evicted at #4), long (400 ms; evicted to make room for cheap: GDSF keeps
            // costly, whose cold start costs 300 ms).
            ran(Some("evicted"), true),
            ran(None, true),
            ran(Some("evicted"), true),
            Outcome::TimedOut,
            Outcome::TimedOut,
        ],
        run_order: vec![0, 1, 2, 3, 4, 5, 7, 6, 8],
        // cheap at #4, long at #6, cheap at #8, one at #9; none at #10 (#9's sandbox was
        // destroyed when it timed out, not kept).
        evicted: 4,
    };
    check(&SJF_GDSF_TIMEOUT, &expected);
}

/// The harness can fail: a simulator whose keep-alive policy differs from the worker's decides
/// differently on the TTL scenario (no expiry under LRU).
#[test]
fn a_different_keepalive_policy_in_the_simulator_is_noticed() {
    let mut config = TTL_PRESSURE.sim_config();
    config.keepalive.kind = KeepAliveKind::Lru;
    assert_ne!(TTL_PRESSURE.simulate_with(&config), ttl_pressure_expected());
}
