//! Generic sandboxes in the simulator (issue 13): a cold start that finds a ready generic
//! sandbox pays its function's init minus the sandbox creation time; the pool changes the cost
//! of cold starts, not their number, and it never takes memory a refill would have to evict for.

mod common;

use common::{function, workload};
use hearth_core::balance::BalanceKind;
use hearth_core::pool::GenericConfig;
use hearth_core::time::{ms, secs};
use hearth_core::Micros;
use hearth_sim::config::GENERIC_CREATE_US as GENERIC_CREATE;
use hearth_sim::{simulate, Collect, End, Record, SimConfig, SimStats};

/// The pool the keep-alive experiment and the worker's defaults use.
const POOL: GenericConfig = GenericConfig {
    max: 4,
    min: 1,
    memory_mb: 64,
    window_us: 30_000_000,
};

/// `n` distinct functions (10 ms of work, 100 ms init, 128 MiB), each invoked once, `gap_ms`
/// apart from 1 s on, then the first `again` of them once more (warm if still kept).
fn one_shot_functions(n: u32, gap_ms: u64, again: u32) -> hearth_sim::Workload {
    let functions = (0..n)
        .map(|i| function(&format!("f{i}"), 10, 100, 128))
        .collect();
    let mut arrivals: Vec<(u64, u32)> = (0..n)
        .map(|i| (secs(1) + ms(gap_ms) * u64::from(i), i))
        .collect();
    let later = secs(1) + ms(gap_ms) * u64::from(n) + secs(1);
    arrivals.extend((0..again).map(|i| (later + ms(gap_ms) * u64::from(i), i)));
    workload(functions, &arrivals)
}

fn run(w: &hearth_sim::Workload, config: &SimConfig) -> (SimStats, Vec<Record>) {
    let mut out = Collect::default();
    let stats = simulate(w, config, &mut out).unwrap();
    out.records.sort_by_key(|r| r.id);
    (stats, out.records)
}

fn init_of(r: &Record) -> Option<Micros> {
    match r.end {
        End::Done { init_us, .. } => Some(init_us),
        _ => None,
    }
}

fn cluster(memory_mb: u64, generic: GenericConfig) -> SimConfig {
    SimConfig {
        memory_mb,
        free_buffer_mb: 0,
        generic,
        ..common::cluster(1, 4, BalanceKind::RoundRobin, 1)
    }
}

#[test]
fn generic_sandboxes_cut_each_cold_start_by_the_creation_time() {
    assert_eq!(SimConfig::default().generic_create_us, GENERIC_CREATE);
    let w = one_shot_functions(30, 500, 5);
    // Memory enough for every sandbox and the whole pool: nothing is evicted or dropped.
    let (off, off_records) = run(&w, &cluster(8192, GenericConfig::OFF));
    let (on, on_records) = run(&w, &cluster(8192, POOL));
    for s in [&off, &on] {
        assert_eq!((s.completed, s.dropped, s.evicted), (35, 0, 0), "{s:?}");
    }
    // The same cold starts (the 30 first invocations), and the 5 repeats warm either way.
    assert_eq!(off.cold, 30);
    assert_eq!(on.cold, off.cold);
    let cold_ids = |rs: &[Record]| -> Vec<u32> {
        rs.iter()
            .filter(|r| matches!(r.end, End::Done { cold: Some(_), .. }))
            .map(|r| r.id)
            .collect()
    };
    assert_eq!(cold_ids(&on_records), cold_ids(&off_records));

    // Off: every cold start pays the full 100 ms. On: those that specialized a ready generic
    // sandbox pay 100 − 40 ms, the others the full init; nothing else.
    assert!(off_records
        .iter()
        .all(|r| init_of(r) == Some(if r.id < 30 { ms(100) } else { 0 })));
    let specialized = on_records
        .iter()
        .filter(|r| init_of(r) == Some(ms(100) - GENERIC_CREATE))
        .count() as u64;
    let full = on_records
        .iter()
        .filter(|r| init_of(r) == Some(ms(100)))
        .count() as u64;
    assert_eq!(specialized + full, 30, "{on_records:?}");
    // The pool holds one from the start (min 1) and refills in 40 ms, far less than the 500 ms
    // between cold starts: every one finds a ready sandbox.
    assert_eq!(specialized, 30);
    let total = |rs: &[Record]| rs.iter().filter_map(init_of).sum::<Micros>();
    assert_eq!(
        total(&off_records) - total(&on_records),
        specialized * GENERIC_CREATE
    );
    // The saving reaches the caller: each specialized cold start ends 40 ms sooner.
    for (a, b) in off_records.iter().zip(&on_records) {
        let saved = if init_of(b) == Some(ms(60)) {
            GENERIC_CREATE
        } else {
            0
        };
        assert_eq!(a.e2e_us() - b.e2e_us(), saved, "{a:?} {b:?}");
    }
}

#[test]
fn cold_starts_faster_than_the_pool_refills_miss_it() {
    // 20 cold starts 5 ms apart: a refill takes 40 ms, so most find the pool empty and pay the
    // full init; the count of cold starts is the same and the saving is exactly 40 ms for each
    // that found one.
    let w = one_shot_functions(20, 5, 0);
    let (off, off_records) = run(&w, &cluster(8192, GenericConfig::OFF));
    let (on, on_records) = run(&w, &cluster(8192, POOL));
    assert_eq!((off.cold, on.cold, on.dropped), (20, 20, 0));
    let specialized = on_records
        .iter()
        .filter(|r| init_of(r) == Some(ms(60)))
        .count() as u64;
    assert!(
        (1..20).contains(&specialized),
        "some found a generic sandbox, not all: {specialized}"
    );
    let total = |rs: &[Record]| rs.iter().filter_map(init_of).sum::<Micros>();
    assert_eq!(
        total(&off_records) - total(&on_records),
        specialized * GENERIC_CREATE
    );
}

#[test]
fn a_tight_budget_drops_nothing_more_with_the_pool() {
    // 512 MiB for 128 MiB sandboxes of 30 functions invoked in turn: the idle sandboxes fill
    // the memory and cold starts evict them. A refill uses free memory only, so the pool gets
    // a sandbox only where one fits beside the kept ones; a cold start takes the generic
    // sandbox's 64 MiB into its own reservation and evicts idle sandboxes for the rest.
    let w = one_shot_functions(30, 500, 30);
    let (off, _) = run(&w, &cluster(512, GenericConfig::OFF));
    let (on, on_records) = run(&w, &cluster(512, POOL));
    assert_eq!(off.dropped, 0, "{off:?}");
    assert_eq!(on.dropped, 0, "{on:?}");
    assert_eq!(on.completed, 60);
    assert!(off.evicted > 0, "the budget is tight: {off:?}");
    // Every invocation of the second round is cold either way (each function's sandbox was
    // evicted long before), so the pool adds no cold start here.
    assert_eq!((off.cold, on.cold), (60, 60));
    assert!(
        on_records.iter().any(|r| init_of(r) == Some(ms(60))),
        "the pool still serves cold starts in a tight budget"
    );
}

#[test]
fn a_generic_sandbox_being_made_never_costs_an_invocation_its_memory() {
    // 192 MiB, one function of 160 MiB, a generic sandbox of 64 MiB being made (from t = 0
    // until 40 ms) when the invocation arrives at 10 ms: only 128 MiB are free and nothing runs,
    // but the generic sandbox's memory comes back, so the invocation waits for it (it was
    // refused for memory before) and then specializes it.
    let w = workload(vec![function("big", 10, 100, 160)], &[(ms(10), 0)]);
    let (off, _) = run(&w, &cluster(192, GenericConfig::OFF));
    assert_eq!((off.completed, off.dropped), (1, 0));
    let (on, on_records) = run(&w, &cluster(192, POOL));
    assert_eq!((on.completed, on.dropped), (1, 0), "{on_records:?}");
    assert_eq!(init_of(&on_records[0]), Some(ms(60)));
    // Once the generic sandbox is ready, the same invocation specializes it at once.
    let w = workload(vec![function("big", 10, 100, 160)], &[(ms(50), 0)]);
    let (on, on_records) = run(&w, &cluster(192, POOL));
    assert_eq!((on.completed, on.dropped), (1, 0));
    assert_eq!(init_of(&on_records[0]), Some(ms(60)));
}

/// Ready generic sandboxes beyond the one a cold start takes are reclaimed for its memory before
/// any warm sandbox is evicted: they are remade for the price of a creation.
#[test]
fn ready_generic_sandboxes_give_way_to_a_cold_start_that_needs_their_memory() {
    // 320 MiB; three ready generic sandboxes (three cold starts of small functions raised the
    // target), then a function of 256 MiB: it takes one and reclaims the others.
    let w = workload(
        vec![
            function("a", 10, 100, 16),
            function("b", 10, 100, 16),
            function("c", 10, 100, 16),
            function("big", 10, 100, 256),
        ],
        &[(ms(0), 0), (ms(1), 1), (ms(2), 2), (ms(2_000), 3)],
    );
    let (on, records) = run(&w, &cluster(320, POOL));
    assert_eq!((on.completed, on.dropped), (4, 0), "{records:?}");
}

/// `n` functions of `layer` (10 ms of work, 300 ms init of which `import_ms` import its
/// modules, 128 MiB), each invoked once, 500 ms apart from 1 s on.
fn layered(n: u32, layer: Option<&str>, import_ms: u64) -> Vec<hearth_sim::SimFunction> {
    (0..n)
        .map(|i| {
            let mut f = function(&format!("{}{i}", layer.unwrap_or("bare")), 10, 300, 128);
            f.layer = layer.map(std::sync::Arc::from);
            f.import_us = ms(import_ms);
            f
        })
        .collect()
}

/// Issue 32: a cold start that takes a pre-imported generic sandbox of its layer pays only the
/// specialization (init − creation − import); a bare generic one pays init − creation; a fresh
/// one all of it. A key's pool fills from that key's own cold starts only.
#[test]
fn a_preimported_sandbox_of_the_layer_saves_the_import_too() {
    let arrivals: Vec<(u64, u32)> = (0..10).map(|i| (secs(1) + ms(500) * i, i as u32)).collect();
    // With a layer: the first cold start of the key finds no sandbox of it (the default key's
    // ready one is not its own) and pays the full 300 ms; the key's pool then refills (40 ms +
    // 200 ms of import, well within the 500 ms gap) and every later one pays 300 − 40 − 200.
    let w = workload(layered(10, Some("L"), 200), &arrivals);
    let (stats, records) = run(&w, &cluster(8192, POOL));
    assert_eq!((stats.completed, stats.dropped, stats.cold), (10, 0, 10));
    let inits: Vec<Micros> = records.iter().filter_map(init_of).collect();
    assert_eq!(inits[0], ms(300), "{inits:?}");
    assert!(
        inits[1..]
            .iter()
            .all(|i| *i == ms(300) - GENERIC_CREATE - ms(200)),
        "{inits:?}"
    );
    // The same functions without a layer: bare generic sandboxes, only the creation saved.
    let w = workload(layered(10, None, 200), &arrivals);
    let (_, records) = run(&w, &cluster(8192, POOL));
    assert!(
        records
            .iter()
            .filter_map(init_of)
            .all(|i| i == ms(300) - GENERIC_CREATE),
        "{records:?}"
    );
    // Pool off: every cold start pays it all.
    let w = workload(layered(10, Some("L"), 200), &arrivals);
    let (_, records) = run(&w, &cluster(8192, GenericConfig::OFF));
    assert!(records.iter().filter_map(init_of).all(|i| i == ms(300)));
}

#[test]
fn layers_never_share_their_preimported_sandboxes() {
    // Two layers, alternating: each key's pool fills from its own cold starts, so after the
    // first of each, both find their own; a third layer seen once pays the full init.
    let mut fs = layered(5, Some("L"), 200);
    fs.extend(layered(5, Some("M"), 100));
    fs.extend(layered(1, Some("N"), 250));
    let mut arrivals: Vec<(u64, u32)> = (0..5)
        .flat_map(|i| {
            let t = secs(1) + ms(1_000) * i;
            [(t, i as u32), (t + ms(500), 5 + i as u32)]
        })
        .collect();
    arrivals.push((secs(20), 10));
    let w = workload(fs, &arrivals);
    let (stats, records) = run(&w, &cluster(8192, POOL));
    assert_eq!((stats.completed, stats.cold), (11, 11));
    let init = |id: u32| init_of(records.iter().find(|r| r.id == id).unwrap()).unwrap();
    // Arrival order: L0 M0 L1 M1 ... ; record ids follow arrivals.
    assert_eq!((init(0), init(1)), (ms(300), ms(300)));
    for k in 1..5 {
        assert_eq!(init(2 * k), ms(300) - GENERIC_CREATE - ms(200), "L{k}");
        assert_eq!(init(2 * k + 1), ms(300) - GENERIC_CREATE - ms(100), "M{k}");
    }
    assert_eq!(init(10), ms(300), "a layer seen once has no pool yet");
}

#[test]
fn an_import_longer_than_the_init_is_refused() {
    let mut f = function("f", 10, 100, 128);
    f.layer = Some("L".into());
    f.import_us = ms(101);
    let w = workload(vec![f], &[(0, 0)]);
    let mut out = Collect::default();
    let err = simulate(&w, &cluster(8192, POOL), &mut out).unwrap_err();
    assert!(err.to_string().contains("import_us"), "{err}");
}
