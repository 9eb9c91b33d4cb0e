//! Behaviour tests for the GPU scheduler, dispatch and model.

use super::*;
use crate::time::Micros;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

fn cfg(policy: GpuPolicy) -> GpuSchedConfig {
    GpuSchedConfig {
        policy,
        t: 100.0,
        d: 1,
        d_max: 4,
        dynamic_d: false,
        fixed_ttl_us: Some(1_000_000_000),
        containers_per_gpu: 4,
        gpus: vec![GpuSpec { memory_mb: 1_000 }],
        ..GpuSchedConfig::default()
    }
}

fn sched(config: GpuSchedConfig) -> GpuScheduler {
    GpuScheduler::new(config).unwrap()
}

fn arrive(s: &mut GpuScheduler, now: Micros, f: &str, mb: u64) -> GpuInvocationId {
    s.on_arrival(
        now,
        GpuArrival {
            function: f,
            weight: 1.0,
            gpu_memory_mb: mb,
        },
    )
    .unwrap()
}

fn drain(s: &mut GpuScheduler) -> Vec<GpuAction> {
    std::iter::from_fn(|| s.poll_action()).collect()
}

#[derive(Debug, Clone, PartialEq)]
struct D {
    id: GpuInvocationId,
    function: String,
    gpu: usize,
    container: ContainerId,
    start: Start,
}

fn dispatches(actions: &[GpuAction]) -> Vec<D> {
    actions
        .iter()
        .filter_map(|a| match a {
            GpuAction::Dispatch {
                function,
                placement: p,
            } => Some(D {
                id: p.invocation,
                function: function.to_string(),
                gpu: p.gpu,
                container: p.container,
                start: p.start,
            }),
            _ => None,
        })
        .collect()
}

fn done(s: &mut GpuScheduler, now: Micros, id: GpuInvocationId, exec_us: Micros) {
    let c = GpuCompletion {
        exec_us: Some(exec_us),
        reusable: true,
        device_memory_mb: None,
    };
    s.on_completed(now, id, c).unwrap();
}

fn flow(s: &GpuScheduler, f: &str) -> GpuFlowStatus {
    s.status()
        .flows
        .into_iter()
        .find(|x| x.function == f)
        .unwrap()
}

#[test]
fn vt_advances_by_tau_over_weight() {
    let mut s = sched(cfg(GpuPolicy::MqfqSticky));
    let a = s
        .on_arrival(
            0,
            GpuArrival {
                function: "f",
                weight: 2.0,
                gpu_memory_mb: 10,
            },
        )
        .unwrap();
    // Unseen function: τ = default 1 s, weight 2 ⇒ +0.5.
    assert_eq!(flow(&s, "f").vt, 0.5);
    done(&mut s, 10, a, 4_000_000);
    s.on_arrival(
        20,
        GpuArrival {
            function: "f",
            weight: 2.0,
            gpu_memory_mb: 10,
        },
    )
    .unwrap();
    // τ is now the measured 4 s ⇒ +2.
    assert_eq!(flow(&s, "f").vt, 2.5);

    let mut u = sched(GpuSchedConfig {
        uniform_cost: true,
        ..cfg(GpuPolicy::MqfqSticky)
    });
    let a = u
        .on_arrival(
            0,
            GpuArrival {
                function: "f",
                weight: 4.0,
                gpu_memory_mb: 10,
            },
        )
        .unwrap();
    done(&mut u, 10, a, 9_000_000);
    u.on_arrival(
        20,
        GpuArrival {
            function: "f",
            weight: 4.0,
            gpu_memory_mb: 10,
        },
    )
    .unwrap();
    assert_eq!(
        flow(&u, "f").vt,
        0.5,
        "classical FQ: 1/w per dispatch whatever τ is"
    );
}

#[test]
fn flow_ahead_by_more_than_t_is_throttled_until_global_vt_catches_up() {
    let mut s = sched(GpuSchedConfig {
        t: 1.0,
        default_exec_us: 2_000_000,
        ..cfg(GpuPolicy::MqfqSticky)
    });
    // b is active first; a joins at Global_VT (2) with three queued.
    let b1 = arrive(&mut s, 0, "b", 100);
    let _a = [
        arrive(&mut s, 1, "a", 100),
        arrive(&mut s, 2, "a", 100),
        arrive(&mut s, 3, "a", 100),
    ];
    let b2 = arrive(&mut s, 4, "b", 100);
    drain(&mut s);
    done(&mut s, 10, b1, 2_000_000);
    let first = dispatches(&drain(&mut s));
    assert_eq!(first[0].function, "a", "longest queue first");
    // a is now 2 s of service ahead of b (VT 4 vs Global_VT 2) with T = 1: throttled.
    assert_eq!(flow(&s, "a").state, FlowState::Throttled);
    done(&mut s, 20, first[0].id, 2_000_000);
    let acts = drain(&mut s);
    // Its container's memory goes to the host while it is throttled, and b runs although a's
    // queue is longer.
    assert!(acts.contains(&GpuAction::Swap {
        container: first[0].container,
        gpu: 0
    }));
    let next = dispatches(&acts);
    assert_eq!(next.iter().map(|d| d.id).collect::<Vec<_>>(), vec![b2]);
    // b's dispatch moved Global_VT up to 4: a is active again, and runs next.
    assert_eq!(flow(&s, "a").state, FlowState::Active);
    done(&mut s, 30, b2, 2_000_000);
    let next = dispatches(&drain(&mut s));
    assert_eq!(next[0].function, "a");
}

#[test]
fn an_empty_flow_kept_active_by_its_ttl_does_not_throttle_busy_flows() {
    // `rare` ran once and stays Active for its (long) TTL with nothing queued; `busy` then runs
    // far ahead of rare's VT. Counting rare in Global_VT would throttle busy behind a flow with
    // nothing to dispatch and leave the GPU idle for the whole TTL.
    let mut s = sched(GpuSchedConfig {
        t: 1.0,
        ..cfg(GpuPolicy::MqfqSticky)
    });
    let rare = arrive(&mut s, 0, "rare", 10);
    drain(&mut s);
    done(&mut s, 1_000_000, rare, 1_000_000);
    assert_eq!(flow(&s, "rare").state, FlowState::Active, "kept by its TTL");
    let ids: Vec<_> = (0..6)
        .map(|i| arrive(&mut s, 2_000_000 + i, "busy", 10))
        .collect();
    let mut now = 3_000_000;
    let mut ran = Vec::new();
    for _ in 0..ids.len() {
        let next = dispatches(&drain(&mut s));
        assert_eq!(
            next.len(),
            1,
            "the GPU must not idle with busy's work queued: {ran:?}"
        );
        ran.push(next[0].id);
        now += 1_000_000;
        done(&mut s, now, next[0].id, 1_000_000);
    }
    assert_eq!(ran, ids);
    assert_eq!(flow(&s, "rare").state, FlowState::Active);
}

#[test]
fn a_flow_idle_within_its_ttl_rejoins_at_global_vt_without_banked_credit() {
    let mut s = sched(GpuSchedConfig {
        t: 1.0,
        ..cfg(GpuPolicy::MqfqSticky)
    });
    let a = arrive(&mut s, 0, "a", 10);
    drain(&mut s);
    done(&mut s, 1_000_000, a, 1_000_000);
    let b: Vec<_> = (0..4)
        .map(|i| arrive(&mut s, 1_000_001 + i, "b", 10))
        .collect();
    let mut now = 2_000_000;
    for id in &b {
        assert_eq!(dispatches(&drain(&mut s))[0].id, *id);
        now += 1_000_000;
        done(&mut s, now, *id, 1_000_000);
    }
    // a idled (Active, within its TTL) while b earned VT 4; a comes back at Global_VT, not at
    // its old VT of 1.
    let vt_b = flow(&s, "b").vt;
    arrive(&mut s, now + 1, "a", 10);
    let vt_a = flow(&s, "a").vt;
    assert!(
        vt_a >= vt_b - 1e-9,
        "a at {vt_a} would bank credit below Global_VT {vt_b}"
    );
}

#[test]
fn sticky_tie_break_prefers_fewest_in_flight_and_longest_queue_wins() {
    let mut s = sched(GpuSchedConfig {
        d: 2,
        ..cfg(GpuPolicy::MqfqSticky)
    });
    let _a = arrive(&mut s, 0, "a", 10); // a has one in flight (VT 1)
    let c = arrive(&mut s, 1, "c", 10); // both tokens used
    for t in 2..4 {
        arrive(&mut s, t, "a", 10);
    }
    for t in 4..6 {
        arrive(&mut s, t, "b", 10);
    }
    drain(&mut s);
    // Equal queues (2, 2) and equal VT; the name would pick a, in-flight picks b.
    assert_eq!(flow(&s, "a").vt, flow(&s, "b").vt);
    done(&mut s, 10, c, 1_000_000);
    let d = dispatches(&drain(&mut s));
    assert_eq!(d[0].function, "b");

    // With D = 1 the in-flight count plays no part: the name (equal VT) decides.
    let mut s = sched(GpuSchedConfig {
        d: 1,
        ..cfg(GpuPolicy::MqfqSticky)
    });
    let c = arrive(&mut s, 0, "c", 10);
    arrive(&mut s, 1, "b", 10);
    arrive(&mut s, 2, "a", 10);
    arrive(&mut s, 3, "a", 10);
    arrive(&mut s, 4, "b", 10);
    arrive(&mut s, 5, "b", 10);
    drain(&mut s);
    done(&mut s, 10, c, 1_000_000);
    // b has the longest queue (3 vs 2): longest first.
    assert_eq!(dispatches(&drain(&mut s))[0].function, "b");
}

#[test]
fn empty_flow_stays_active_for_alpha_times_iat_then_swaps_out() {
    let mut s = sched(GpuSchedConfig {
        fixed_ttl_us: None,
        alpha: 1.5,
        ..cfg(GpuPolicy::MqfqSticky)
    });
    let a = arrive(&mut s, 0, "f", 100);
    done(&mut s, 500, a, 500);
    let b = arrive(&mut s, 1_000, "f", 100); // IAT 1 ms ⇒ TTL 1.5 ms
    let container = dispatches(&drain(&mut s))[0].container;
    done(&mut s, 2_000, b, 500);
    drain(&mut s);
    assert_eq!(flow(&s, "f").ttl_us, 1_500);
    assert_eq!(s.next_timeout(), Some(3_500));
    s.on_timeout(3_499);
    assert_eq!(flow(&s, "f").state, FlowState::Active);
    assert!(drain(&mut s).is_empty());
    s.on_timeout(3_500);
    assert_eq!(flow(&s, "f").state, FlowState::Inactive);
    assert_eq!(drain(&mut s), vec![GpuAction::Swap { container, gpu: 0 }]);
    assert_eq!(s.next_timeout(), None);

    // A returning flow is prefetched; dispatched in the same event, its memory is still on
    // the way (host-warm). Once there, the next one runs warm.
    let c = arrive(&mut s, 4_000, "f", 100);
    let acts = drain(&mut s);
    assert_eq!(acts[0], GpuAction::Prefetch { container, gpu: 0 });
    assert_eq!(dispatches(&acts)[0].start, Start::HostWarm);
    done(&mut s, 4_500, c, 500);
    arrive(&mut s, 4_600, "f", 100);
    assert_eq!(dispatches(&drain(&mut s))[0].start, Start::Warm);

    // A fixed TTL overrides α × IAT.
    let mut s = sched(GpuSchedConfig {
        fixed_ttl_us: Some(7),
        ..cfg(GpuPolicy::MqfqSticky)
    });
    let a = arrive(&mut s, 0, "f", 100);
    arrive(&mut s, 1_000_000, "f", 100);
    done(&mut s, 10, a, 10);
    assert_eq!(flow(&s, "f").ttl_us, 7);
}

#[test]
fn first_arrival_has_ttl_zero_and_swaps_at_completion() {
    let mut s = sched(GpuSchedConfig {
        fixed_ttl_us: None,
        ..cfg(GpuPolicy::MqfqSticky)
    });
    let a = arrive(&mut s, 0, "f", 100);
    let container = dispatches(&drain(&mut s))[0].container;
    done(&mut s, 10, a, 10);
    assert_eq!(flow(&s, "f").state, FlowState::Inactive);
    assert_eq!(drain(&mut s), vec![GpuAction::Swap { container, gpu: 0 }]);
}

fn pagings(actions: &[GpuAction]) -> Vec<GpuPaging> {
    actions
        .iter()
        .filter_map(|a| match a {
            GpuAction::Dispatch { placement, .. } => Some(placement.paging),
            _ => None,
        })
        .collect()
}

fn moves_memory(a: &GpuAction) -> bool {
    matches!(a, GpuAction::Prefetch { .. } | GpuAction::Swap { .. })
}

#[test]
fn prefetch_swap_charges_a_dispatch_only_its_own_bulk_prefetch() {
    // Room made by swapping costs the dispatch nothing (the swap is asynchronous).
    let mut s = sched(GpuSchedConfig {
        d: 2,
        ..cfg(GpuPolicy::MqfqSticky)
    });
    let a = arrive(&mut s, 0, "a", 600);
    drain(&mut s);
    arrive(&mut s, 1, "b", 600);
    done(&mut s, 10, a, 10);
    let acts = drain(&mut s);
    assert!(matches!(acts[0], GpuAction::Swap { .. }));
    assert_eq!(pagings(&acts), vec![GpuPaging::default()]);
    // A host-warm start moves its own memory in bulk, nothing else.
    let mut s = sched(GpuSchedConfig {
        fixed_ttl_us: None,
        ..cfg(GpuPolicy::MqfqSticky)
    });
    let a = arrive(&mut s, 0, "f", 100);
    done(&mut s, 10, a, 10);
    drain(&mut s);
    arrive(&mut s, 20, "f", 100);
    let acts = drain(&mut s);
    assert_eq!(dispatches(&acts)[0].start, Start::HostWarm);
    assert_eq!(
        pagings(&acts),
        vec![GpuPaging {
            prefetch_mb: 100,
            ..GpuPaging::default()
        }]
    );
    assert_eq!(s.status().counters.evictions, 0);
}

#[test]
fn prefetch_only_never_swaps_and_charges_on_demand_eviction_to_the_dispatch() {
    let mut s = sched(GpuSchedConfig {
        memory: GpuMemoryPolicy::PrefetchOnly,
        d: 2,
        fixed_ttl_us: None, // first arrivals: TTL 0, so flows go inactive at completion
        ..cfg(GpuPolicy::MqfqSticky)
    });
    let a = arrive(&mut s, 0, "a", 600);
    drain(&mut s);
    let b = arrive(&mut s, 1, "b", 600);
    assert!(drain(&mut s).is_empty(), "still gated on device memory");
    done(&mut s, 10, a, 10);
    assert_eq!(flow(&s, "a").state, FlowState::Inactive);
    let acts = drain(&mut s);
    assert!(
        !acts.iter().any(moves_memory),
        "no proactive swap: {acts:?}"
    );
    let d = dispatches(&acts);
    assert_eq!((d[0].id, d[0].start), (b, Start::Cold));
    assert_eq!(
        pagings(&acts),
        vec![GpuPaging {
            evict_mb: 600,
            ..GpuPaging::default()
        }],
        "the driver evicted a's 600 MiB for b, on b's critical path"
    );
    done(&mut s, 20, b, 10);
    assert!(drain(&mut s).is_empty());
    assert_eq!(s.status().gpus[0].memory_resident_mb, 600);
    // a comes back: no room to prefetch at activation, so it is prefetched at dispatch and
    // b's memory is evicted for it.
    arrive(&mut s, 30, "a", 600);
    let acts = drain(&mut s);
    assert!(!acts.iter().any(moves_memory), "{acts:?}");
    assert_eq!(dispatches(&acts)[0].start, Start::HostWarm);
    assert_eq!(
        pagings(&acts),
        vec![GpuPaging {
            prefetch_mb: 600,
            fault_in_mb: 0,
            evict_mb: 600,
        }]
    );
    let c = s.status().counters;
    assert_eq!((c.swaps, c.evictions), (0, 2));
}

#[test]
fn uvm_oversubscribes_never_moves_memory_itself_and_faults_in_what_lru_evicted() {
    let mut s = sched(GpuSchedConfig {
        memory: GpuMemoryPolicy::Uvm,
        d: 2,
        fixed_ttl_us: None,
        ..cfg(GpuPolicy::MqfqSticky)
    });
    let mut all = Vec::new();
    let a = arrive(&mut s, 0, "a", 600);
    let b = arrive(&mut s, 1, "b", 600);
    let acts = drain(&mut s);
    all.extend(acts.clone());
    assert_eq!(
        dispatches(&acts).len(),
        2,
        "600 + 600 MiB on a 1000 MiB device run together under UVM"
    );
    assert_eq!(s.status().gpus[0].memory_resident_mb, 1_200);
    done(&mut s, 10, a, 10);
    done(&mut s, 11, b, 10);
    all.extend(drain(&mut s));
    // The driver could keep only one: a, least recently used, went to the host.
    let a2 = arrive(&mut s, 20, "a", 600);
    let acts = drain(&mut s);
    all.extend(acts.clone());
    assert_eq!(dispatches(&acts)[0].start, Start::HostWarm);
    assert_eq!(
        pagings(&acts),
        vec![GpuPaging {
            prefetch_mb: 0,
            fault_in_mb: 600,
            evict_mb: 600,
        }],
        "a faults its pages in and evicts b's"
    );
    done(&mut s, 30, a2, 10);
    all.extend(drain(&mut s));
    // a is resident now: warm, nothing moves.
    arrive(&mut s, 40, "a", 600);
    let acts = drain(&mut s);
    all.extend(acts.clone());
    assert_eq!(dispatches(&acts)[0].start, Start::Warm);
    assert_eq!(pagings(&acts), vec![GpuPaging::default()]);
    assert!(!all.iter().any(moves_memory), "{all:?}");
    let c = s.status().counters;
    assert_eq!((c.swaps, c.prefetches), (0, 0));
}

fn run_order(policy: GpuPolicy, functions: &[&str]) -> Vec<GpuInvocationId> {
    let mut s = sched(cfg(policy));
    let mut order = Vec::new();
    for (t, f) in functions.iter().enumerate() {
        arrive(&mut s, t as Micros, f, 10);
    }
    let mut now = 100;
    loop {
        let d = dispatches(&drain(&mut s));
        if d.is_empty() {
            break;
        }
        for x in d {
            order.push(x.id);
            now += 10;
            done(&mut s, now, x.id, 10);
        }
    }
    order
}

#[test]
fn fcfs_runs_in_arrival_order_and_batch_drains_the_oldest_flow() {
    let arrivals = ["a", "b", "a", "c", "b", "a"];
    let ids = |v: &[u64]| v.iter().map(|&i| GpuInvocationId(i)).collect::<Vec<_>>();
    assert_eq!(
        run_order(GpuPolicy::Fcfs, &arrivals),
        ids(&[1, 2, 3, 4, 5, 6])
    );
    // a's flow was drained by #1 alone; b then holds the oldest (2) and is drained whole
    // (2, 5), then a (3, 6), then c.
    assert_eq!(
        run_order(GpuPolicy::Batch, &arrivals),
        ids(&[1, 2, 5, 3, 6, 4])
    );
}

#[test]
fn fixed_d_caps_running_invocations() {
    let mut s = sched(GpuSchedConfig {
        d: 2,
        ..cfg(GpuPolicy::MqfqSticky)
    });
    for t in 0..5 {
        arrive(&mut s, t, &format!("f{t}"), 10);
    }
    assert_eq!(dispatches(&drain(&mut s)).len(), 2);
    s.on_utilization(10, 0, 0.1).unwrap();
    assert_eq!(s.status().gpus[0].d, 2, "dynamic D is off");
    assert!(drain(&mut s).is_empty());
}

#[test]
fn a_cancelled_queued_invocation_never_runs_and_frees_its_queue_slot() {
    let mut s = sched(GpuSchedConfig {
        max_queue: 2,
        ..cfg(GpuPolicy::MqfqSticky)
    });
    let first = arrive(&mut s, 0, "f", 10);
    let second = arrive(&mut s, 1, "g", 10);
    let third = arrive(&mut s, 2, "h", 10);
    assert_eq!(
        dispatches(&drain(&mut s)).len(),
        1,
        "D = 1: one runs, two wait"
    );
    assert!(
        s.on_arrival(
            3,
            GpuArrival {
                function: "k",
                weight: 1.0,
                gpu_memory_mb: 10
            }
        )
        .is_err(),
        "the queue is full"
    );
    assert!(s.on_cancel(4, second));
    assert!(!s.on_cancel(5, second), "already gone");
    assert!(!s.on_cancel(5, first), "running, not queued");
    assert_eq!(s.status().queued, 1);
    arrive(&mut s, 6, "k", 10);
    done(&mut s, 10, first, 5);
    let mut ran = Vec::new();
    for t in 0..4 {
        let next = dispatches(&drain(&mut s));
        for d in &next {
            ran.push(d.id);
            done(&mut s, 20 + t, d.id, 5);
        }
    }
    assert!(!ran.contains(&second), "{ran:?}");
    assert!(ran.contains(&third), "{ran:?}");
}

#[test]
fn dynamic_d_follows_utilization_within_bounds() {
    let mut s = sched(GpuSchedConfig {
        d: 2,
        d_max: 3,
        dynamic_d: true,
        ..cfg(GpuPolicy::Fcfs)
    });
    for _ in 0..5 {
        s.on_utilization(0, 0, 0.2).unwrap();
    }
    assert_eq!(
        s.status().gpus[0].d,
        3,
        "raised by one per sample, up to d_max"
    );
    for _ in 0..5 {
        s.on_utilization(0, 0, 0.95).unwrap();
    }
    assert_eq!(
        s.status().gpus[0].d,
        1,
        "lowered by one per sample, not below 1"
    );
    s.on_utilization(0, 0, 0.9).unwrap();
    assert_eq!(s.status().gpus[0].d, 1, "at the threshold D stays");
    assert_eq!(
        s.on_utilization(0, 1, 0.5),
        Err(GpuEventError::UnknownGpu(1))
    );
    assert!(matches!(
        s.on_utilization(0, 0, f64::NAN),
        Err(GpuEventError::BadUtilization(_))
    ));
    assert!(s.on_utilization(0, 0, 1.5).is_err());
}

#[test]
fn tracked_utilization_holds_back_a_herd_until_the_next_sample() {
    let mut s = sched(GpuSchedConfig {
        d: 4,
        d_max: 8,
        dynamic_d: true,
        util_threshold: 0.5,
        ..cfg(GpuPolicy::MqfqSticky)
    });
    for t in 0..6 {
        arrive(&mut s, t, &format!("f{t}"), 10);
    }
    // 1/4 per dispatch: two dispatches reach 0.5 and the other two tokens wait.
    let first = dispatches(&drain(&mut s));
    assert_eq!(first.len(), 2);
    assert_eq!(s.status().gpus[0].tracked_util, 0.5);
    // A sample shows headroom: D rises to 5 and two more go (0.1 + 2 × 0.2 = 0.5).
    s.on_utilization(200_000, 0, 0.1).unwrap();
    assert_eq!(dispatches(&drain(&mut s)).len(), 2);
    assert_eq!(s.status().gpus[0].running, 4);
}

#[test]
fn alone_on_its_gpu_an_invocation_runs_whatever_the_tracked_utilization() {
    let mut s = sched(GpuSchedConfig {
        d: 2,
        dynamic_d: true,
        ..cfg(GpuPolicy::MqfqSticky)
    });
    s.on_utilization(0, 0, 1.0).unwrap(); // D falls to 1; tracked 1.0 ≥ 0.9
    arrive(&mut s, 1, "f", 10);
    assert_eq!(dispatches(&drain(&mut s)).len(), 1);
}

#[test]
fn dispatch_waits_for_device_memory_and_swaps_idle_containers_for_room() {
    let mut s = sched(GpuSchedConfig {
        d: 2,
        ..cfg(GpuPolicy::MqfqSticky)
    });
    let a = arrive(&mut s, 0, "a", 600);
    let ca = dispatches(&drain(&mut s))[0].container;
    let b = arrive(&mut s, 1, "b", 600);
    assert!(
        drain(&mut s).is_empty(),
        "600 + 600 MiB do not fit 1000 MiB"
    );
    done(&mut s, 10, a, 10);
    let acts = drain(&mut s);
    assert_eq!(
        acts[0],
        GpuAction::Swap {
            container: ca,
            gpu: 0
        }
    );
    let d = dispatches(&acts);
    assert_eq!((d[0].id, d[0].start), (b, Start::Cold));
    let st = s.status().gpus[0].clone();
    assert_eq!((st.memory_resident_mb, st.memory_used_mb), (600, 600));
}

#[test]
fn shim_reported_memory_replaces_the_declared_size() {
    let mut s = sched(GpuSchedConfig {
        d: 2,
        ..cfg(GpuPolicy::MqfqSticky)
    });
    let a = arrive(&mut s, 0, "a", 100);
    drain(&mut s);
    let c = GpuCompletion {
        exec_us: Some(5),
        reusable: true,
        device_memory_mb: Some(700),
    };
    s.on_completed(10, a, c).unwrap();
    assert_eq!(s.status().gpus[0].memory_resident_mb, 700);
    // b (400) does not fit beside a's 700 MiB: a's idle container is swapped for it.
    arrive(&mut s, 20, "b", 400);
    let acts = drain(&mut s);
    assert!(matches!(acts[0], GpuAction::Swap { .. }));
    assert_eq!(s.status().gpus[0].memory_resident_mb, 400);
    // A report beyond the device destroys the container.
    let b = dispatches(&acts)[0].id;
    let c = GpuCompletion {
        exec_us: Some(5),
        reusable: true,
        device_memory_mb: Some(5_000),
    };
    s.on_completed(30, b, c).unwrap();
    assert!(drain(&mut s).iter().any(|a| matches!(
        a,
        GpuAction::Destroy {
            reason: GpuDestroyReason::TooLarge,
            ..
        }
    )));
}

#[test]
fn warm_host_warm_and_cold_starts() {
    // FCFS swaps after every completion: the second run is host-warm in the same container.
    let mut s = sched(cfg(GpuPolicy::Fcfs));
    let a = arrive(&mut s, 0, "f", 100);
    let first = dispatches(&drain(&mut s))[0].clone();
    assert_eq!(first.start, Start::Cold);
    done(&mut s, 10, a, 10);
    assert_eq!(
        drain(&mut s),
        vec![GpuAction::Swap {
            container: first.container,
            gpu: 0
        }]
    );
    arrive(&mut s, 20, "f", 100);
    let second = dispatches(&drain(&mut s))[0].clone();
    assert_eq!(
        (second.start, second.container),
        (Start::HostWarm, first.container)
    );

    // MQFQ keeps an active flow's memory on the device: warm.
    let mut s = sched(cfg(GpuPolicy::MqfqSticky));
    let a = arrive(&mut s, 0, "f", 100);
    let first = dispatches(&drain(&mut s))[0].clone();
    done(&mut s, 10, a, 10);
    assert!(drain(&mut s).is_empty());
    arrive(&mut s, 20, "f", 100);
    let second = dispatches(&drain(&mut s))[0].clone();
    assert_eq!(
        (second.start, second.container),
        (Start::Warm, first.container)
    );
    let c = s.status().counters;
    assert_eq!((c.dispatched_cold, c.dispatched_warm), (1, 1));
}

#[test]
fn container_cap_evicts_the_least_recently_used_idle_container() {
    let mut s = sched(GpuSchedConfig {
        containers_per_gpu: 2,
        ..cfg(GpuPolicy::MqfqSticky)
    });
    let mut containers = Vec::new();
    for (t, f) in [(0, "a"), (100, "b")] {
        let id = arrive(&mut s, t, f, 10);
        containers.push(dispatches(&drain(&mut s))[0].container);
        done(&mut s, t + 10, id, 10);
    }
    arrive(&mut s, 200, "c", 10);
    let acts = drain(&mut s);
    assert_eq!(
        acts[0],
        GpuAction::Destroy {
            container: containers[0],
            gpu: 0,
            reason: GpuDestroyReason::PoolFull
        }
    );
    assert_eq!(dispatches(&acts)[0].start, Start::Cold);
    assert_eq!(s.status().gpus[0].containers, 2);
}

#[test]
fn container_cap_prefers_inactive_flows_containers() {
    let mut s = sched(GpuSchedConfig {
        containers_per_gpu: 2,
        fixed_ttl_us: None,
        alpha: 1.0,
        ..cfg(GpuPolicy::MqfqSticky)
    });
    let run = |s: &mut GpuScheduler, at: Micros, f: &str| {
        let id = arrive(s, at, f, 10);
        let c = dispatches(&drain(s))[0].container;
        done(s, at + 10, id, 10);
        c
    };
    // a: IAT 100 ms ⇒ TTL 100 ms, last used at 100 010.
    run(&mut s, 0, "a");
    let ca = run(&mut s, 100_000, "a");
    // b: IAT 100 µs ⇒ TTL 100 µs, last used later (100 210) but soon inactive.
    run(&mut s, 100_100, "b");
    let cb = run(&mut s, 100_200, "b");
    s.on_timeout(100_400);
    drain(&mut s);
    assert_eq!(flow(&s, "b").state, FlowState::Inactive);
    assert_eq!(flow(&s, "a").state, FlowState::Active);
    // At the cap, b's container goes although a's was used less recently.
    arrive(&mut s, 100_500, "c", 10);
    let acts = drain(&mut s);
    assert_eq!(
        acts[0],
        GpuAction::Destroy {
            container: cb,
            gpu: 0,
            reason: GpuDestroyReason::PoolFull
        }
    );
    assert!(!acts
        .iter()
        .any(|x| matches!(x, GpuAction::Destroy { container, .. } if *container == ca)));
}

#[test]
fn new_function_goes_to_the_emptier_gpu_and_sticks() {
    let mut s = sched(GpuSchedConfig {
        gpus: vec![GpuSpec { memory_mb: 4_000 }, GpuSpec { memory_mb: 8_000 }],
        ..cfg(GpuPolicy::MqfqSticky)
    });
    // Equal free tokens: the GPU with more free memory.
    let a = arrive(&mut s, 0, "a", 100);
    assert_eq!(dispatches(&drain(&mut s))[0].gpu, 1);
    // GPU 1's token is taken: b goes to GPU 0.
    let b = arrive(&mut s, 1, "b", 100);
    assert_eq!(dispatches(&drain(&mut s))[0].gpu, 0);
    done(&mut s, 10, b, 10);
    // a's container on GPU 1 is busy; GPU 0 is free, but a waits for its home GPU.
    let a2 = arrive(&mut s, 11, "a", 100);
    assert!(dispatches(&drain(&mut s)).is_empty());
    done(&mut s, 20, a, 10);
    let d = dispatches(&drain(&mut s));
    assert_eq!((d[0].id, d[0].gpu, d[0].start), (a2, 1, Start::Warm));
    assert_eq!(flow(&s, "a").home_gpu, Some(1));
    // Each device counts its own container: b's idle one on 0, a's busy one on 1.
    let g = s.gauges();
    let per_gpu: Vec<_> = g
        .gpus
        .iter()
        .map(|d| (d.containers, d.containers_idle, d.memory_used_mb))
        .collect();
    assert_eq!(per_gpu, [(1, 1, 0), (1, 0, 100)]);
}

#[test]
fn function_without_containers_on_its_home_moves_to_a_free_gpu() {
    let mut s = sched(GpuSchedConfig {
        gpus: vec![GpuSpec { memory_mb: 1_000 }, GpuSpec { memory_mb: 1_000 }],
        ..cfg(GpuPolicy::MqfqSticky)
    });
    let a = arrive(&mut s, 0, "a", 100);
    drain(&mut s);
    s.on_failed(5, a).unwrap(); // a's only container is gone
    drain(&mut s);
    let b = arrive(&mut s, 6, "b", 100); // b takes GPU 0 (tie: lowest index)
    assert_eq!(dispatches(&drain(&mut s))[0].gpu, 0);
    arrive(&mut s, 7, "a", 100);
    assert_eq!(dispatches(&drain(&mut s))[0].gpu, 1);
    let _ = b;
}

#[test]
fn failure_frees_container_memory_and_token_and_the_next_runs_cold() {
    let mut s = sched(cfg(GpuPolicy::MqfqSticky));
    let a = arrive(&mut s, 0, "f", 300);
    let first = dispatches(&drain(&mut s))[0].clone();
    let b = arrive(&mut s, 1, "f", 300);
    assert!(drain(&mut s).is_empty());
    s.on_failed(10, a).unwrap();
    let acts = drain(&mut s);
    assert_eq!(
        acts[0],
        GpuAction::Destroy {
            container: first.container,
            gpu: 0,
            reason: GpuDestroyReason::Failed
        }
    );
    let d = dispatches(&acts);
    assert_eq!((d[0].id, d[0].start), (b, Start::Cold));
    assert_ne!(d[0].container, first.container);
    let st = s.status().gpus[0].clone();
    assert_eq!(
        (st.running, st.memory_resident_mb, st.containers),
        (1, 300, 1)
    );
    assert_eq!(s.on_failed(11, a), Err(GpuEventError::UnknownInvocation(a)));
}

#[test]
fn arrivals_are_refused_for_bad_input_and_full_queues_and_shutdown_rejects_queued() {
    let mut s = sched(GpuSchedConfig {
        max_queue: 1,
        ..cfg(GpuPolicy::MqfqSticky)
    });
    let too_big = s.on_arrival(
        0,
        GpuArrival {
            function: "f",
            weight: 1.0,
            gpu_memory_mb: 1_001,
        },
    );
    assert_eq!(
        too_big,
        Err(GpuReject::TooLarge {
            needed_mb: 1_001,
            largest_mb: 1_000
        })
    );
    let bad_w = s.on_arrival(
        0,
        GpuArrival {
            function: "f",
            weight: f64::NAN,
            gpu_memory_mb: 1,
        },
    );
    assert_eq!(bad_w, Err(GpuReject::BadWeight));
    let long = "x".repeat(300);
    let bad_f = s.on_arrival(
        0,
        GpuArrival {
            function: &long,
            weight: 1.0,
            gpu_memory_mb: 1,
        },
    );
    assert_eq!(bad_f, Err(GpuReject::BadFunction));
    arrive(&mut s, 0, "f", 10); // runs
    let queued = arrive(&mut s, 1, "f", 10);
    let full = s.on_arrival(
        2,
        GpuArrival {
            function: "f",
            weight: 1.0,
            gpu_memory_mb: 1,
        },
    );
    assert_eq!(full, Err(GpuReject::QueueFull { length: 1 }));
    drain(&mut s);
    s.shutdown();
    assert_eq!(
        drain(&mut s),
        vec![GpuAction::Reject {
            invocation: queued,
            reason: GpuReject::ShuttingDown
        }]
    );
    let late = s.on_arrival(
        3,
        GpuArrival {
            function: "f",
            weight: 1.0,
            gpu_memory_mb: 1,
        },
    );
    assert_eq!(late, Err(GpuReject::ShuttingDown));
}

#[test]
fn bad_config_values_are_rejected_naming_the_field() {
    let ok = GpuSchedConfig::default();
    assert_eq!(ok.check(), Ok(()));
    let cases: Vec<(GpuSchedConfig, &str)> = vec![
        (
            GpuSchedConfig {
                t: -1.0,
                ..ok.clone()
            },
            "t must",
        ),
        (
            GpuSchedConfig {
                t: f64::INFINITY,
                ..ok.clone()
            },
            "t must",
        ),
        (
            GpuSchedConfig {
                alpha: f64::NAN,
                ..ok.clone()
            },
            "alpha",
        ),
        (GpuSchedConfig { d: 0, ..ok.clone() }, "d must"),
        (
            GpuSchedConfig {
                d: 7,
                d_max: 6,
                ..ok.clone()
            },
            "d must",
        ),
        (
            GpuSchedConfig {
                d_max: 65,
                d: 2,
                ..ok.clone()
            },
            "d_max",
        ),
        (
            GpuSchedConfig {
                util_threshold: 0.0,
                ..ok.clone()
            },
            "util_threshold",
        ),
        (
            GpuSchedConfig {
                util_threshold: 1.5,
                ..ok.clone()
            },
            "util_threshold",
        ),
        (
            GpuSchedConfig {
                containers_per_gpu: 0,
                ..ok.clone()
            },
            "containers_per_gpu",
        ),
        (
            GpuSchedConfig {
                max_queue: 0,
                ..ok.clone()
            },
            "max_queue",
        ),
        (
            GpuSchedConfig {
                default_exec_us: 0,
                ..ok.clone()
            },
            "default_exec_us",
        ),
        (
            GpuSchedConfig {
                fixed_ttl_us: Some(u64::MAX),
                ..ok.clone()
            },
            "fixed_ttl_us",
        ),
        (
            GpuSchedConfig {
                gpus: vec![],
                ..ok.clone()
            },
            "gpus must",
        ),
        (
            GpuSchedConfig {
                gpus: vec![GpuSpec { memory_mb: 1 }; 17],
                ..ok.clone()
            },
            "gpus must",
        ),
        (
            GpuSchedConfig {
                gpus: vec![GpuSpec { memory_mb: 0 }],
                ..ok.clone()
            },
            "gpus[0].memory_mb",
        ),
    ];
    for (config, field) in cases {
        let err = config.check().unwrap_err().to_string();
        assert!(err.contains(field), "{err:?} should name {field}");
        assert!(GpuScheduler::new(config).is_err());
    }
    assert_eq!(
        "mqfq-sticky".parse::<GpuPolicy>(),
        Ok(GpuPolicy::MqfqSticky)
    );
    assert_eq!("batch".parse::<GpuPolicy>(), Ok(GpuPolicy::Batch));
    assert_eq!(GpuPolicy::Fcfs.to_string(), "fcfs");
    assert!("lifo".parse::<GpuPolicy>().is_err());
}

#[test]
fn status_serializes() {
    let mut s = sched(cfg(GpuPolicy::MqfqSticky));
    arrive(&mut s, 0, "f", 10);
    let json = serde_json::to_value(s.status()).unwrap();
    assert_eq!(json["policy"], "mqfq-sticky");
    assert_eq!(json["flows"][0]["state"], "active");
    assert_eq!(json["counters"]["dispatched_cold"], 1);
}

// ---- CPU/GPU dispatch ----

#[test]
fn dispatch_explores_unmeasured_sides_then_uses_speedup_and_top_fraction() {
    let mut d = CpuGpuDispatch::new(DispatchConfig::default()).unwrap();
    assert_eq!(
        d.choose("new"),
        Device::Gpu,
        "nothing measured: try the GPU"
    );
    d.record("new", Device::Gpu, 100).unwrap();
    assert_eq!(d.choose("new"), Device::Cpu, "then the CPU");
    d.record("new", Device::Cpu, 1_000).unwrap();
    assert_eq!(d.speedup("new"), Some(10.0));
    assert_eq!(d.choose("new"), Device::Gpu);

    // Four functions with speedups 20, 10 (new), 5, 2: the top half (2 slots) go to the GPU,
    // and 2 is below min_speedup anyway.
    d.seed_speedup("x20", 20.0).unwrap();
    d.seed_speedup("x5", 5.0).unwrap();
    d.seed_speedup("x2", 2.0).unwrap();
    assert_eq!(d.choose("x20"), Device::Gpu);
    assert_eq!(d.choose("new"), Device::Gpu);
    assert_eq!(
        d.choose("x5"),
        Device::Cpu,
        "speedup ≥ 3 but not in the top half"
    );
    assert_eq!(d.choose("x2"), Device::Cpu);

    // Measurements on both sides override a seed.
    d.record("x2", Device::Cpu, 3_000).unwrap();
    d.record("x2", Device::Gpu, 100).unwrap();
    assert_eq!(d.speedup("x2"), Some(30.0));
    assert_eq!(d.choose("x2"), Device::Gpu);
    assert_eq!(d.choose("new"), Device::Cpu, "pushed out of the top half");

    assert!(d.seed_speedup("y", f64::NAN).is_err());
    let bad = DispatchConfig {
        gpu_fraction: 1.5,
        ..DispatchConfig::default()
    };
    assert!(CpuGpuDispatch::new(bad)
        .unwrap_err()
        .to_string()
        .contains("gpu_fraction"));
}

#[test]
fn dispatch_min_speedup_applies_even_to_the_best_function() {
    let mut d = CpuGpuDispatch::new(DispatchConfig {
        min_speedup: 3.0,
        gpu_fraction: 1.0,
    })
    .unwrap();
    d.seed_speedup("slow", 2.9).unwrap();
    assert_eq!(d.choose("slow"), Device::Cpu);
}

// ---- simulated GPU ----

#[test]
fn sim_model_stretches_with_concurrency_and_caps_utilization() {
    let m = SimGpuModel::default();
    assert_eq!(m.exec_us(1_000_000, 1), 1_000_000);
    assert_eq!(m.exec_us(1_000_000, 0), 1_000_000);
    assert_eq!(
        m.exec_us(1_000_000, 6),
        2_000_000,
        "Fig. 6.12: D = 6 doubles execution"
    );
    assert_eq!(m.prefetch_us(12_000), 1_000_000);
    assert_eq!(m.utilization(&[0.3, 0.4]), 0.7);
    assert_eq!(m.utilization(&[0.7, 0.7, f64::NAN]), 1.0);
    assert!(SimGpuModel {
        pcie_mb_per_s: 0.0,
        ..m
    }
    .check()
    .is_err());
    assert!(SimGpuModel {
        interference: -0.1,
        ..m
    }
    .check()
    .is_err());
    assert_eq!(m.check(), Ok(()));
}

#[test]
fn memory_policy_reads_as_kebab_case_and_defaults_to_prefetch_swap() {
    let read = |v: serde_json::Value| serde_json::from_value::<GpuSchedConfig>(v);
    assert_eq!(
        read(serde_json::json!({})).unwrap().memory,
        GpuMemoryPolicy::PrefetchSwap
    );
    for p in GpuMemoryPolicy::ALL {
        let c = read(serde_json::json!({ "memory": p.as_str() })).unwrap();
        assert_eq!(c.memory, p);
    }
    assert!(read(serde_json::json!({ "memory": "madvise" })).is_err());
}

#[test]
fn on_demand_paging_is_slower_than_prefetch_and_calibrated_on_fig_6_4() {
    let m = SimGpuModel::default();
    assert!(m.fault_in_us(1_536) > m.prefetch_us(1_536));
    assert_eq!(m.evict_us(12_000), 1_000_000);
    // Fig. 6.4: stock UVM, each FFT run faulting in and evicting 1.5 GB, is 40 % over
    // Table 6.1's 0.897 s.
    let extra = (m.fault_in_us(1_536) + m.evict_us(1_536)) as f64 / 897_000.0;
    assert!((extra - 0.40).abs() < 0.01, "{extra}");
    let p = GpuPaging {
        prefetch_mb: 1_200,
        fault_in_mb: 660,
        evict_mb: 2_400,
    };
    assert_eq!(m.paging_us(&p), 100_000 + 100_000 + 200_000);
    assert_eq!(m.paging_us(&GpuPaging::default()), 0);
    for e in [0.0, 1.5, f64::NAN] {
        let bad = SimGpuModel {
            uvm_fault_efficiency: e,
            ..m
        };
        assert!(bad.check().is_err(), "{e}");
    }
}

// ---- invariants over random event sequences ----

#[derive(Debug, Clone)]
enum Op {
    Arrive {
        f: u8,
        mb: u64,
    },
    Complete {
        k: usize,
        reusable: bool,
        report: Option<u64>,
    },
    Fail {
        k: usize,
    },
    Util {
        gpu: usize,
        util: f64,
    },
    Wait {
        us: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..5, 50u64..800).prop_map(|(f, mb)| Op::Arrive { f, mb }),
        3 => (0usize..8, any::<bool>(), proptest::option::of(50u64..1_200))
            .prop_map(|(k, reusable, report)| Op::Complete { k, reusable, report }),
        1 => (0usize..8).prop_map(|k| Op::Fail { k }),
        1 => (0usize..2, 0.0f64..=1.0).prop_map(|(gpu, util)| Op::Util { gpu, util }),
        1 => (1u64..5_000).prop_map(|us| Op::Wait { us }),
    ]
}

struct Harness {
    s: GpuScheduler,
    now: Micros,
    running: Vec<GpuInvocationId>,
    fate: BTreeMap<GpuInvocationId, u32>,
    issued: BTreeSet<GpuInvocationId>,
}

impl Harness {
    fn settle(&mut self, cap: u32, uvm: bool) {
        let actions = drain(&mut self.s);
        let mut dispatched_on = BTreeSet::new();
        for a in &actions {
            match a {
                GpuAction::Dispatch { placement: p, .. } => {
                    *self.fate.entry(p.invocation).or_default() += 1;
                    self.running.push(p.invocation);
                    dispatched_on.insert(p.gpu);
                }
                GpuAction::Reject { invocation, .. } => {
                    *self.fate.entry(*invocation).or_default() += 1;
                }
                _ => {}
            }
        }
        let st = self.s.status();
        for g in &st.gpus {
            // UVM oversubscribes by design; the others never count more than the device.
            assert!(uvm || g.memory_resident_mb <= g.memory_total_mb, "{g:?}");
            assert!(g.memory_used_mb <= g.memory_resident_mb, "{g:?}");
            assert!(g.containers <= cap, "{g:?}");
            if dispatched_on.contains(&g.index) {
                assert!(g.running <= g.d, "{g:?}");
            }
        }
        assert_eq!(st.queued, st.flows.iter().map(|f| f.queued).sum::<usize>());
        let g = self.s.gauges();
        assert_eq!((g.queued, &g.gpus), (st.queued, &st.gpus));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    #[test]
    fn invariants_hold_and_everything_queued_eventually_runs(
        policy in prop_oneof![Just(GpuPolicy::MqfqSticky), Just(GpuPolicy::Fcfs), Just(GpuPolicy::Batch)],
        memory in prop_oneof![Just(GpuMemoryPolicy::PrefetchSwap), Just(GpuMemoryPolicy::PrefetchOnly), Just(GpuMemoryPolicy::Uvm)],
        dynamic in any::<bool>(),
        ttl in proptest::option::of(0u64..3_000),
        t in 0.0f64..3.0,
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        let config = GpuSchedConfig {
            policy,
            memory,
            t,
            d: 2,
            d_max: 3,
            dynamic_d: dynamic,
            fixed_ttl_us: ttl,
            containers_per_gpu: 2,
            max_queue: 20,
            default_exec_us: 1_000,
            gpus: vec![GpuSpec { memory_mb: 1_000 }, GpuSpec { memory_mb: 1_500 }],
            ..GpuSchedConfig::default()
        };
        let mut h = Harness {
            s: GpuScheduler::new(config).unwrap(),
            now: 0,
            running: Vec::new(),
            fate: BTreeMap::new(),
            issued: BTreeSet::new(),
        };
        for op in ops {
            h.now += 1;
            match op {
                Op::Arrive { f, mb } => {
                    let name = format!("f{f}");
                    let a = GpuArrival { function: &name, weight: 1.0 + f64::from(f), gpu_memory_mb: mb };
                    if let Ok(id) = h.s.on_arrival(h.now, a) {
                        h.issued.insert(id);
                    }
                }
                Op::Complete { k, reusable, report } if !h.running.is_empty() => {
                    let id = h.running.remove(k % h.running.len());
                    let c = GpuCompletion { exec_us: Some(k as u64 * 100), reusable, device_memory_mb: report };
                    h.s.on_completed(h.now, id, c).unwrap();
                }
                Op::Fail { k } if !h.running.is_empty() => {
                    let id = h.running.remove(k % h.running.len());
                    h.s.on_failed(h.now, id).unwrap();
                }
                Op::Util { gpu, util } => h.s.on_utilization(h.now, gpu, util).unwrap(),
                Op::Wait { us } => {
                    h.now += us;
                    h.s.on_timeout(h.now);
                }
                _ => {}
            }
            h.settle(2, memory == GpuMemoryPolicy::Uvm);
        }
        // Drain: complete whatever runs, let timers fire; everything queued must run.
        for _ in 0..1_000 {
            if h.running.is_empty() && h.s.status().queued == 0 {
                break;
            }
            h.now += 100;
            if let Some(id) = h.running.pop() {
                h.s.on_completed(h.now, id, GpuCompletion { exec_us: Some(100), reusable: true, device_memory_mb: None }).unwrap();
            } else {
                let at = h.s.next_timeout().unwrap_or(h.now).max(h.now);
                h.now = at;
                h.s.on_timeout(h.now);
            }
            h.settle(2, memory == GpuMemoryPolicy::Uvm);
        }
        prop_assert_eq!(h.s.status().queued, 0);
        prop_assert!(h.running.is_empty());
        for id in &h.issued {
            prop_assert_eq!(h.fate.get(id).copied(), Some(1), "{:?}", id);
        }
        prop_assert_eq!(h.fate.len(), h.issued.len());
    }
}
