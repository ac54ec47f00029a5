//! The simulator against hand-computed alpha-beta costs (with and without the reduction
//! term), its two modes against each other, and its behaviour at scale.

use super::*;

const LINK: LinkCost = LinkCost {
    alpha_us: 10.0,
    beta_gbps: 1.0,
};

/// Reductions are free here (pure alpha-beta) unless a test sets `reduce_gbps`, and every
/// message is a rendezvous unless a test sets `eager_bytes`.
fn cluster(topo: Topology) -> Cluster {
    Cluster {
        topo,
        intra: LINK,
        inter: LinkCost {
            alpha_us: 50.0,
            beta_gbps: 0.5,
        },
        nic_gbps: None,
        nic_burst_bytes: 0,
        ranks_per_core: 1.0,
        wake_us: 0.0,
        cache_bytes: 0,
        mem_gbps: 0.0,
        copy_gbps: 10.0,
        reduce_gbps: 0.0,
        eager_bytes: 0,
        slowdown: Vec::new(),
    }
}

fn all_reduce(count: usize) -> CollArgs {
    CollArgs {
        kind: CollKind::AllReduce,
        count,
        in_place: true,
    }
}

const BIG: AlgoOptions = AlgoOptions { slice: 1 << 30 };

fn time(c: &Cluster, a: &CollArgs, algo: Algorithm, sym: Option<bool>) -> f64 {
    simulate(c, a, 4, algo, &BIG, sym).unwrap().time_us
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[test]
fn ring_matches_hand_computed_cost() {
    // 4 ranks, 4000 floats: 6 steps of 1000 floats (4000 B at 1000 B/us) after 10 us each.
    let c = cluster(Topology::single_host(4));
    let t = time(&c, &all_reduce(4000), Algorithm::Ring, Some(false));
    assert!(close(t, 6.0 * (10.0 + 4.0)), "{t}");
    // Two hosts of two: every step waits for the slower link (50 us + 4000 B at 500 B/us);
    // the NIC carries one flow per host.
    let c = cluster(Topology::uniform(4, 2));
    let t = time(&c, &all_reduce(4000), Algorithm::Ring, Some(false));
    assert!(close(t, 6.0 * (50.0 + 8.0)), "{t}");
}

#[test]
fn tree_matches_hand_computed_cost() {
    // Two hosts of one rank: each tree moves its half up in slot 0 and down in slot 1, both
    // trees at once: 2 x (50 + 4000 B / 500 B/us).
    let c = cluster(Topology::uniform(2, 1));
    let t = time(&c, &all_reduce(2000), Algorithm::Tree, Some(false));
    assert!(close(t, 2.0 * (50.0 + 8.0)), "{t}");
    // One host of three: chains 0-1-2 and 2-1-0; the middle rank receives one chunk per slot,
    // so the two halves take 5 slots of (10 + 4000 B / 1000 B/us).
    let c = cluster(Topology::single_host(3));
    let t = time(&c, &all_reduce(2000), Algorithm::Tree, Some(false));
    assert!(close(t, 5.0 * (10.0 + 4.0)), "{t}");
}

#[test]
fn recursive_doubling_and_binomial_match_hand_computed_cost() {
    let c = cluster(Topology::single_host(8));
    let mut a = all_reduce(1000);
    a.in_place = false;
    let t = time(&c, &a, Algorithm::RecursiveDoubling, Some(false));
    assert!(close(t, 3.0 * (10.0 + 4.0)), "{t}");
    // In place, the third exchange lands in scratch and a copy (4000 B at 10 GB/s) follows.
    let t = time(
        &c,
        &all_reduce(1000),
        Algorithm::RecursiveDoubling,
        Some(false),
    );
    assert!(close(t, 3.0 * (10.0 + 4.0) + 0.4), "{t}");
    let a = CollArgs {
        kind: CollKind::Broadcast { root: 5 },
        count: 1000,
        in_place: true,
    };
    let t = time(&c, &a, Algorithm::Binomial, Some(false));
    assert!(close(t, 3.0 * (10.0 + 4.0)), "{t}");
}

#[test]
fn rabenseifner_matches_hand_computed_cost() {
    // 4 ranks, 4000 floats: halving moves 2000 then 1000 floats, doubling 1000 then 2000,
    // each step one message each way at once: 4 x 10 us + (8000 + 4000 + 4000 + 8000) B at
    // 1000 B/us.
    let c = cluster(Topology::single_host(4));
    let mut a = all_reduce(4000);
    a.in_place = false;
    let t = time(&c, &a, Algorithm::Rabenseifner, Some(false));
    assert!(close(t, 4.0 * 10.0 + 24.0), "{t}");
    // 6 ranks: ranks 0 and 2 fold into 1 and 3 first and get the result back last, two
    // full-vector messages (16000 B) around the 4-rank exchange.
    let c = cluster(Topology::single_host(6));
    let t = time(&c, &a, Algorithm::Rabenseifner, Some(false));
    assert!(close(t, 2.0 * (10.0 + 16.0) + 4.0 * 10.0 + 24.0), "{t}");
}

#[test]
fn pieces_to_one_peer_share_its_link() {
    // 2 ranks, 4000 floats in slices of 500: each step sends 2000 floats as 4 pieces of
    // 2000 B; they follow each other on the link (4 x 2 us) after one latency (10 us).
    let c = cluster(Topology::single_host(2));
    let mut a = all_reduce(4000);
    a.in_place = false;
    let opts = AlgoOptions { slice: 500 };
    let t = simulate(&c, &a, 4, Algorithm::Rabenseifner, &opts, Some(false))
        .unwrap()
        .time_us;
    assert!(close(t, 2.0 * (10.0 + 8.0)), "{t}");
}

/// The call of `count` elements and its symmetric-mode time, after checking that the full
/// mode predicts the same.
fn full_equals_symmetric(
    c: &Cluster,
    algo: Algorithm,
    kind: CollKind,
    count: usize,
) -> (CollArgs, f64) {
    let a = CollArgs {
        kind,
        count,
        in_place: false,
    };
    let full = time(c, &a, algo, Some(false));
    let sym = time(c, &a, algo, Some(true));
    // The all-to-all's ranks of a host cross to different hosts at once; which of them a NIC
    // serves first depends on the order the simulator meets them, which the modes do not
    // share.
    let agree = if algo == Algorithm::Pairwise {
        (full - sym).abs() <= 0.01 * full
    } else {
        close(full, sym)
    };
    assert!(agree, "{algo} {}: full {full} sym {sym}", kind.name());
    (a, sym)
}

#[test]
fn symmetric_mode_agrees_with_full_mode() {
    let c = cluster(Topology::uniform(64, 8));
    for (algo, kind, count) in [
        (Algorithm::Ring, CollKind::AllReduce, 64 * 100),
        (Algorithm::Hierarchical, CollKind::AllReduce, 64 * 100),
        (Algorithm::Hierarchical, CollKind::AllGather, 100),
        (Algorithm::Hierarchical, CollKind::ReduceScatter, 100),
        (Algorithm::Ring, CollKind::AllGather, 100),
        (Algorithm::Pairwise, CollKind::AllToAll, 10),
    ] {
        full_equals_symmetric(&c, algo, kind, count);
    }
    let e = simulate(&c, &all_reduce(10), 4, Algorithm::Tree, &BIG, Some(true)).unwrap_err();
    assert!(e.contains("symmetric"), "{e}");
}

#[test]
fn a_straggler_slows_the_call() {
    let mut c = cluster(Topology::uniform(16, 4));
    let a = all_reduce(16_000);
    let base = time(&c, &a, Algorithm::Ring, Some(false));
    c.slowdown = vec![1.0, 1.0, 3.0, 1.0];
    let slow = time(&c, &a, Algorithm::Ring, Some(false));
    assert!(slow > 2.0 * base, "{slow} vs {base}");
}

/// Every algorithm with an all_reduce schedule.
const ALL_REDUCE_ALGOS: [Algorithm; 5] = [
    Algorithm::Ring,
    Algorithm::Hierarchical,
    Algorithm::RecursiveDoubling,
    Algorithm::Rabenseifner,
    Algorithm::Tree,
];

#[test]
fn monotonic_and_sane_at_scale() {
    let c = cluster(Topology::uniform(2048, 8));
    let opts = AlgoOptions { slice: 1 << 18 };
    for algo in ALL_REDUCE_ALGOS {
        let mut last = 0.0;
        for count in [1usize, 1 << 10, 1 << 16, 1 << 20] {
            let r = simulate(&c, &all_reduce(count), 4, algo, &opts, None).unwrap();
            assert!(r.time_us > last, "{algo} {count}: {} <= {last}", r.time_us);
            // Never faster than moving the bytes once over the NIC, never absurdly slow.
            let floor = (count * 4) as f64 / (c.inter.beta_gbps * 1e3);
            assert!(r.time_us >= floor, "{algo} {count}: {}", r.time_us);
            assert!(r.time_us < 1e9, "{algo} {count}: {}", r.time_us);
            last = r.time_us;
        }
    }
    // Small messages: latency algorithms beat the ring by far at this scale.
    let rd = time(&c, &all_reduce(8), Algorithm::RecursiveDoubling, None);
    let ring = time(&c, &all_reduce(8), Algorithm::Ring, None);
    assert!(rd * 50.0 < ring, "rd {rd} ring {ring}");
}

#[test]
fn free_reduction_leaves_alpha_beta_costs_unchanged() {
    // Zero, negative, infinite and NaN reduction bandwidths all mean free reductions.
    for g in [0.0, -1.0, f64::INFINITY, f64::NAN] {
        let mut c = cluster(Topology::single_host(4));
        c.reduce_gbps = g;
        let t = time(&c, &all_reduce(4000), Algorithm::Ring, Some(false));
        assert!(close(t, 6.0 * (10.0 + 4.0)), "{g}: {t}");
        let mut c = cluster(Topology::uniform(4, 2));
        c.reduce_gbps = g;
        let t = time(&c, &all_reduce(4000), Algorithm::Ring, Some(false));
        assert!(close(t, 6.0 * (50.0 + 8.0)), "{g}: {t}");
    }
}

#[test]
fn reduction_adds_hand_computed_time() {
    // 2 ranks, 4000 floats: the reduce-scatter step moves 2000 floats (10 us + 8000 B at
    // 1000 B/us) and then reduces them (8000 B at 2 GB/s = 4 us); the all-gather step only
    // moves them.
    let mut c = cluster(Topology::single_host(2));
    c.reduce_gbps = 2.0;
    let t = time(&c, &all_reduce(4000), Algorithm::Ring, Some(false));
    assert!(close(t, (10.0 + 8.0 + 4.0) + (10.0 + 8.0)), "{t}");
    // 4 ranks: three reduce-scatter steps of 1000 floats each gain 4000 B at 2 GB/s = 2 us.
    let mut c = cluster(Topology::single_host(4));
    c.reduce_gbps = 2.0;
    let t = time(&c, &all_reduce(4000), Algorithm::Ring, Some(false));
    assert!(close(t, 6.0 * (10.0 + 4.0) + 3.0 * 2.0), "{t}");
    // Two hosts of one rank, the second 3x slow: the message and its reduction both take the
    // slowdown: 2 x 3 x (50 + 8000 B at 500 B/us) + 3 x 4 us.
    let mut c = cluster(Topology::uniform(2, 1));
    c.reduce_gbps = 2.0;
    c.slowdown = vec![1.0, 3.0];
    let t = time(&c, &all_reduce(4000), Algorithm::Ring, Some(false));
    assert!(close(t, 2.0 * 3.0 * (50.0 + 16.0) + 3.0 * 4.0), "{t}");
    // Binomial reduce to rank 0 of 8: the root receives and reduces the whole vector in each
    // of 3 steps: 3 x (10 + 4000 B at 1000 B/us + 4000 B at 2 GB/s).
    let mut c = cluster(Topology::single_host(8));
    c.reduce_gbps = 2.0;
    let a = CollArgs {
        kind: CollKind::Reduce { root: 0 },
        count: 1000,
        in_place: true,
    };
    let t = time(&c, &a, Algorithm::Binomial, Some(false));
    assert!(close(t, 3.0 * (10.0 + 4.0 + 2.0)), "{t}");
}

#[test]
fn the_sender_does_not_wait_for_the_reduction() {
    // Tree all_reduce of 1000 floats (halves of 2000 B) on hosts {0, 1} and {2}; reductions at
    // 2 GB/s take 1 us. Across hosts a message takes 50 + 2000 B at 500 B/us = 54 us: ranks 0
    // and 1 both cross, but never at once, so each has the whole NIC. Inside host 0 a message
    // takes 10 + 2 = 12 us. Rank 2 sends its half to rank 1 (0..54) and is free at 54 while
    // rank 1 reduces until 55; rank 0 sends the other reduced half to rank 2 (54..108), which
    // reduces it (until 109) and sends it back (109..163); ranks 0 and 1 swap halves
    // (163..175) and rank 1 sends its half to rank 2 (175..229). Free reductions: 1 us less;
    // a sender that waited would end later.
    let topo = Topology::uniform(3, 2);
    let a = all_reduce(1000);
    let mut c = cluster(topo);
    let free = time(&c, &a, Algorithm::Tree, Some(false));
    assert!(close(free, 228.0), "{free}");
    c.reduce_gbps = 2.0;
    let t = time(&c, &a, Algorithm::Tree, Some(false));
    assert!(close(t, 229.0), "{t}");
}

#[test]
fn only_reducing_receives_pay_the_reduction() {
    // all_gather and broadcast receive without reducing: the reduction bandwidth is irrelevant.
    let free = cluster(Topology::uniform(8, 2));
    let mut slow = free.clone();
    slow.reduce_gbps = 0.01;
    for (algo, kind) in [
        (Algorithm::Ring, CollKind::AllGather),
        (Algorithm::Binomial, CollKind::Broadcast { root: 3 }),
        (Algorithm::Pairwise, CollKind::AllToAll),
    ] {
        let a = CollArgs {
            kind,
            count: 1000,
            in_place: false,
        };
        let (f, s) = (time(&free, &a, algo, None), time(&slow, &a, algo, None));
        assert!(close(s, f), "{algo} {}: {s} vs {f}", kind.name());
    }
}

#[test]
fn reduction_slows_large_all_reduces_monotonically() {
    let base = cluster(Topology::uniform(16, 4));
    let a = all_reduce(1 << 20);
    for algo in ALL_REDUCE_ALGOS {
        let free = time(&base, &a, algo, Some(false));
        let mut last = free;
        for g in [1000.0, 100.0, 10.0, 1.0, 0.1] {
            let mut c = base.clone();
            c.reduce_gbps = g;
            let t = time(&c, &a, algo, Some(false));
            assert!(t >= last, "{algo} at {g} GB/s: {t} < {last}");
            last = t;
        }
        // Every algorithm has some rank reduce at least 15/16 of the 4 MiB on its critical
        // path (the ring exactly that): 39.3 ms at 0.1 GB/s. The ring's reductions add to
        // its transfers (one flow per NIC, every step waits for the last one); elsewhere
        // ranks crossing at once queue for their NIC, and one rank's reduction overlaps
        // another's turn there.
        let floor = 15.0 / 16.0 * (1 << 22) as f64 / 100.0;
        let bound = if algo == Algorithm::Ring {
            free + floor
        } else {
            free.max(floor)
        };
        assert!(last >= 0.999 * bound, "{algo}: {last} vs {free}");
    }
}

#[test]
fn symmetric_mode_agrees_with_full_mode_with_reductions() {
    // The hierarchical all_reduce exchanges with the image of a rank on other hosts: that
    // branch counts the reduction too.
    let mut c = cluster(Topology::uniform(64, 8));
    c.reduce_gbps = 2.0;
    for (algo, kind, count) in [
        (Algorithm::Ring, CollKind::AllReduce, 64 * 100),
        (Algorithm::Hierarchical, CollKind::AllReduce, 64 * 100),
        (Algorithm::Hierarchical, CollKind::ReduceScatter, 100),
        (Algorithm::Ring, CollKind::ReduceScatter, 100),
    ] {
        let (a, sym) = full_equals_symmetric(&c, algo, kind, count);
        let mut free = c.clone();
        free.reduce_gbps = 0.0;
        let before = time(&free, &a, algo, Some(true));
        assert!(sym > before, "{algo} {}: {sym} vs {before}", kind.name());
    }
}

#[test]
fn eager_messages_do_not_wait_for_their_receiver() {
    // 4 hosts x 2 ranks, placed round-robin as `ferrorun --netns` does.
    let topo = Topology {
        host_of: (0..8).map(|r| r % 4).collect(),
    };
    let rendezvous = Cluster {
        reduce_gbps: 5.0,
        ..cluster(topo)
    };
    let eager = Cluster {
        eager_bytes: usize::MAX,
        ..rendezvous.clone()
    };
    let opts = AlgoOptions { slice: 1 << 14 };
    for algo in ALL_REDUCE_ALGOS {
        for count in [2usize, 1000, 65_537] {
            let a = all_reduce(count);
            let run = |c: &Cluster| {
                simulate(c, &a, 4, algo, &opts, Some(false))
                    .unwrap()
                    .time_us
            };
            // More buffering never makes a call slower.
            let mut last = run(&rendezvous);
            for limit in [64, 4 << 10, 64 << 10, usize::MAX] {
                let c = Cluster {
                    eager_bytes: limit,
                    ..rendezvous.clone()
                };
                let t = run(&c);
                assert!(
                    t <= last * (1.0 + 1e-12),
                    "{algo} {count}: eager up to {limit} B took {t}, less buffering {last}"
                );
                last = t;
            }
        }
    }
    // With one rank per host, the ring runs in lockstep: every receiver is already waiting,
    // eager changes nothing. With two ranks of a host (round-robin), they take turns on its
    // NIC, the second's receiver waits, and eager helps.
    let a = all_reduce(4000);
    let ring = |c: &Cluster| time(c, &a, Algorithm::Ring, Some(false));
    assert!(ring(&eager) < ring(&rendezvous));
    let one_per_host = |c: &Cluster| Cluster {
        topo: Topology::uniform(4, 1),
        ..c.clone()
    };
    assert!(close(
        ring(&one_per_host(&eager)),
        ring(&one_per_host(&rendezvous))
    ));
    // The tree's ranks reach their steps at different times (a leaf sends up at once while
    // its parent still waits for its other child): eager is strictly faster there.
    let tree = |c: &Cluster| time(c, &all_reduce(2), Algorithm::Tree, Some(false));
    assert!(
        tree(&eager) < tree(&rendezvous),
        "{} vs {}",
        tree(&eager),
        tree(&rendezvous)
    );
}

#[test]
fn ranks_crossing_at_once_take_turns_on_the_nic() {
    // 2 hosts x 2 ranks placed round-robin: every hop of the ring crosses, and both ranks of
    // a host send across in every step. Each of the 3 all_gather steps: 50 us + two pieces
    // of 2000 B through the NIC one after the other (2 x 4 us); the first piece is copied in
    // place (2000 B at 10 GB/s).
    let c = cluster(Topology {
        host_of: vec![0, 1, 0, 1],
    });
    let a = CollArgs {
        kind: CollKind::AllGather,
        count: 500,
        in_place: false,
    };
    let t = time(&c, &a, Algorithm::Ring, Some(false));
    assert!(close(t, 3.0 * (50.0 + 8.0) + 0.2), "{t}");
    // Host-major, one rank of each host crosses: 50 + 4 us per step.
    let c = cluster(Topology::uniform(4, 2));
    let t = time(&c, &a, Algorithm::Ring, Some(false));
    assert!(close(t, 3.0 * (50.0 + 4.0) + 0.2), "{t}");
}

#[test]
fn a_calendar_finds_the_first_gap_that_fits() {
    let mut c = Calendar::default();
    assert_eq!(c.fit(5.0, 10.0), 5.0);
    c.book(10.0, 5.0); // [10, 15)
    c.book(20.0, 5.0); // [20, 25)
    assert_eq!(c.fit(0.0, 10.0), 0.0);
    assert_eq!(c.fit(0.0, 11.0), 25.0);
    assert_eq!(c.fit(12.0, 5.0), 15.0);
    assert_eq!(c.fit(12.0, 6.0), 25.0);
    assert_eq!(c.fit(-3.0, 1.0), 0.0);
    // Touching intervals merge into one.
    c.book(15.0, 5.0);
    assert_eq!(c.busy.len(), 1);
    assert_eq!(c.fit(11.0, 1.0), 25.0);
    c.book(0.0, 10.0);
    assert_eq!(c.busy.len(), 1);
    assert_eq!(c.busy.get(&key(0.0)), Some(&25.0));
}

/// One rank on each of two hosts; rank 0 broadcasts 2000 B (4 us through the 500 B/us NIC).
fn one_message(c: &Cluster, calls: usize) -> f64 {
    let a = CollArgs {
        kind: CollKind::Broadcast { root: 0 },
        count: 500,
        in_place: true,
    };
    simulate_calls(c, &a, 4, Algorithm::Binomial, &BIG, Some(false), calls)
        .unwrap()
        .time_us
}

#[test]
fn a_token_bucket_nic_lets_a_burst_through_then_its_rate() {
    let mut c = cluster(Topology::uniform(2, 1));
    assert!(close(one_message(&c, 1), 50.0 + 4.0));
    // A bucket of 1000 B: the bytes are through 1000 B / 500 B/us = 2 us earlier.
    c.nic_burst_bytes = 1000;
    assert!(close(one_message(&c, 1), 50.0 + 2.0));
    // A bucket larger than the message: as fast as a copy (2000 B at 10 GB/s).
    c.nic_burst_bytes = 1 << 20;
    assert!(close(one_message(&c, 1), 50.0 + 0.2));
}

#[test]
fn back_to_back_calls_drain_the_bucket() {
    // Eager: the root sends its next call's message as soon as the last one's bytes are
    // through, so the calls queue at the NIC. With a 1000 B bucket the first message is
    // through at 2 us, then one every 4 us (the NIC's rate): per call 4 us after the first.
    let mut c = cluster(Topology::uniform(2, 1));
    c.eager_bytes = usize::MAX;
    c.nic_burst_bytes = 1000;
    assert!(close(one_message(&c, 1), 52.0));
    assert!(close(one_message(&c, 4), 4.0), "{}", one_message(&c, 4));
    // Lockstep calls (rendezvous: the root waits for the receiver each time) take a single
    // call's time each, and the bucket refills during each call's latency.
    c.eager_bytes = 0;
    assert!(close(one_message(&c, 4), 52.0), "{}", one_message(&c, 4));
    // The ring on one host runs in lockstep: calls back to back cost one call each.
    let c = cluster(Topology::single_host(4));
    let a = all_reduce(4000);
    let one = simulate_calls(&c, &a, 4, Algorithm::Ring, &BIG, Some(false), 1).unwrap();
    let three = simulate_calls(&c, &a, 4, Algorithm::Ring, &BIG, Some(false), 3).unwrap();
    assert!(close(three.time_us, one.time_us), "{three:?} vs {one:?}");
}

#[test]
fn ranks_sharing_cores_pay_wake_ups_and_share_the_cpu() {
    // 2 ranks, 4000 floats, reductions at 2 GB/s; 2 ranks per core and 10 us to wake a rank:
    // every message costs 10 + (1 - 1/2) x 10 us of latency, and its 8000 B copy through
    // shared memory (8 us) and the reduction (4 us) take twice as long.
    let mut c = cluster(Topology::single_host(2));
    c.reduce_gbps = 2.0;
    c.wake_us = 10.0;
    let alone = time(&c, &all_reduce(4000), Algorithm::Ring, Some(false));
    assert!(close(alone, (10.0 + 8.0 + 4.0) + (10.0 + 8.0)), "{alone}");
    c.ranks_per_core = 2.0;
    let t = time(&c, &all_reduce(4000), Algorithm::Ring, Some(false));
    assert!(close(t, (15.0 + 16.0 + 8.0) + (15.0 + 16.0)), "{t}");
    // Between hosts the wire is not the CPU: only the wake-up is added.
    let mut c = cluster(Topology::uniform(2, 1));
    c.wake_us = 10.0;
    c.ranks_per_core = 4.0;
    let t = time(&c, &all_reduce(4000), Algorithm::Ring, Some(false));
    assert!(close(t, 2.0 * (50.0 + 7.5 + 16.0)), "{t}");
}

#[test]
fn calls_whose_buffers_reach_the_cache_run_at_the_memory_rate() {
    // 2 ranks, 4000 floats in place: 16000 B of buffers per rank, 32000 B on the host.
    // Alone: 10 + 8 us for each 8000 B message and 4 us to reduce it at 2 GB/s.
    let mut c = cluster(Topology::single_host(2));
    c.reduce_gbps = 2.0;
    c.mem_gbps = 0.5;
    c.cache_bytes = 32_001;
    let fits = time(&c, &all_reduce(4000), Algorithm::Ring, Some(false));
    assert!(close(fits, (10.0 + 8.0 + 4.0) + (10.0 + 8.0)), "{fits}");
    // At the cache size each 8000 B transfer runs at 0.5 GB/s; the reduction, of data that
    // has just landed, keeps its 2 GB/s.
    c.cache_bytes = 32_000;
    let t = time(&c, &all_reduce(4000), Algorithm::Ring, Some(false));
    assert!(close(t, (10.0 + 16.0 + 4.0) + (10.0 + 16.0)), "{t}");
    // A memory rate above the CPU's changes nothing: it is a cap.
    c.mem_gbps = 4.0;
    let t = time(&c, &all_reduce(4000), Algorithm::Ring, Some(false));
    assert!(close(t, fits), "{t}");
    // Sharing cores halves the CPU rates first (transfers 0.5 GB/s, the reduction 1 GB/s),
    // then the cap applies to the transfers; the wake-up adds 5 us a message.
    c.mem_gbps = 0.25;
    c.ranks_per_core = 2.0;
    c.wake_us = 10.0;
    let t = time(&c, &all_reduce(4000), Algorithm::Ring, Some(false));
    assert!(close(t, (15.0 + 32.0 + 8.0) + (15.0 + 32.0)), "{t}");
    // Between hosts the wire is not the memory bus: one rank per host, nothing changes.
    let mut c = cluster(Topology::uniform(2, 1));
    c.mem_gbps = 0.01;
    c.cache_bytes = 1;
    let t = time(&c, &all_reduce(4000), Algorithm::Ring, Some(false));
    assert!(close(t, 2.0 * (50.0 + 16.0)), "{t}");
}

#[test]
fn a_loop_of_calls_overlaps_where_the_ring_leaves_ranks_idle() {
    // One float on a ring of 4 (one host, 10 us a hop, bytes free, every message eager): only
    // chunk 0 is non-empty, and it crosses 6 hops in a row, 0-1-2-3 reducing and 3-0-1-2
    // gathering: one call takes 60 us. Rank 0 is done at 40 us and starts the next call while
    // ranks 1 and 2 still forward the last one, so back to back each call takes 40 us (rank 2
    // finishes them at 60, 100, 140 us), as a benchmark loop measures it.
    let c = Cluster {
        intra: LinkCost {
            alpha_us: 10.0,
            beta_gbps: f64::INFINITY,
        },
        eager_bytes: usize::MAX,
        ..cluster(Topology::single_host(4))
    };
    let a = all_reduce(1);
    let per_call = |calls| {
        simulate_calls(&c, &a, 4, Algorithm::Ring, &BIG, Some(false), calls)
            .unwrap()
            .time_us
    };
    assert!(close(per_call(1), 60.0), "{}", per_call(1));
    assert!(close(per_call(3), 40.0), "{}", per_call(3));
    assert!(close(per_call(6), 40.0), "{}", per_call(6));
    // With every chunk non-empty, every rank is busy in every step: no overlap.
    let full = all_reduce(4);
    let t1 = simulate_calls(&c, &full, 4, Algorithm::Ring, &BIG, Some(false), 1).unwrap();
    let t3 = simulate_calls(&c, &full, 4, Algorithm::Ring, &BIG, Some(false), 3).unwrap();
    assert!(
        close(t1.time_us, 60.0) && close(t3.time_us, 60.0),
        "{t1:?} {t3:?}"
    );
}
