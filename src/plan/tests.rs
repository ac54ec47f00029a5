//! The tuner's choices as data, the cost formulas on hand-computed cases, and the rule parser.

use super::*;

fn model_with(intra: Link, inter: Link) -> CostModel {
    CostModel {
        intra,
        inter,
        ..CostModel::default()
    }
}

#[test]
fn choices_as_data() {
    use Algorithm::*;
    let ar = CollKind::AllReduce;
    let bc = CollKind::Broadcast { root: 0 };
    let tcp = model_with(Link::Shm, Link::Tcp);
    let rdma = model_with(Link::Nvlink, Link::Rdma);
    // (model, nranks, ranks per host, collective, bytes, expected)
    let table: &[(&CostModel, usize, usize, CollKind, usize, Algorithm)] = &[
        (&tcp, 8, 8, ar, 64, RecursiveDoubling),
        (&tcp, 8, 8, ar, 64 << 10, Rabenseifner),
        // 4 MiB slices (the default cap): Rabenseifner's first halves take more rounds than
        // the ring's 8 MiB blocks.
        (&tcp, 8, 8, ar, 64 << 20, Ring),
        // Not a power of two: folding costs two full-vector messages, the ring wins large.
        (&tcp, 12, 12, ar, 64 << 10, Rabenseifner),
        (&tcp, 12, 12, ar, 64 << 20, Ring),
        (&tcp, 1024, 8, ar, 64, RecursiveDoubling),
        (&tcp, 1024, 8, ar, 4 << 20, Rabenseifner),
        (&tcp, 16384, 8, ar, 2 << 10, RecursiveDoubling),
        (&tcp, 16384, 8, ar, 64 << 20, Rabenseifner),
        // Uneven hosts: Rabenseifner's partners are anywhere; hierarchical keeps to the NIC.
        (&tcp, 24, 7, ar, 64 << 20, Hierarchical),
        (&rdma, 256, 8, ar, 4, RecursiveDoubling),
        (&tcp, 64, 8, bc, 64, Binomial),
        (&tcp, 64, 8, bc, 256 << 20, Chain),
        (&tcp, 4, 1, CollKind::AllToAll, 1000, Pairwise),
    ];
    for &(m, n, k, kind, bytes, want) in table {
        let topo = Topology::uniform(n, k);
        let c = m.choose(kind, bytes, &topo, &Overrides::default());
        assert_eq!(
            c.algo,
            want,
            "{} {n} ranks x {k}/host {bytes} B over {}: {c}",
            kind.name(),
            m.inter.name()
        );
        assert_eq!(c.reason, "cost model");
    }
}

#[test]
fn cheapest_wins_on_a_custom_table() {
    // Costless bandwidth: only steps count, so the fewest steps win at any size.
    let mut m = CostModel::default();
    for l in Link::ALL {
        m.calibrate(l, 10.0, 1e12).unwrap();
    }
    let topo = Topology::uniform(32, 4);
    let c = m.choose(CollKind::AllReduce, 1 << 20, &topo, &Overrides::default());
    assert_eq!(c.algo, Algorithm::RecursiveDoubling, "{c}");
    // Costless latency: bandwidth-optimal algorithms win.
    for l in Link::ALL {
        m.calibrate(l, 0.0, 1.0).unwrap();
    }
    let flat = Topology::single_host(32);
    let c = m.choose(CollKind::AllReduce, 1 << 20, &flat, &Overrides::default());
    assert!(
        matches!(c.algo, Algorithm::Ring | Algorithm::Hierarchical),
        "{c}"
    );
}

#[test]
fn ring_cost_is_the_alpha_beta_formula() {
    let m = model_with(Link::Tcp, Link::Tcp);
    let topo = Topology::single_host(4);
    // 4 ranks, 4000 bytes, one round: 2 * 3 * (25 us + 1000 B / 1250 B/us).
    let t = m.cost(Algorithm::Ring, CollKind::AllReduce, 4000, &topo, 1 << 20);
    assert!((t - 6.0 * (25.0 + 0.8)).abs() < 1e-9, "{t}");
    // Two rounds when the slice holds half of each chunk: twice the latency.
    let t = m.cost(Algorithm::Ring, CollKind::AllReduce, 4000, &topo, 500);
    assert!((t - 6.0 * (50.0 + 0.8)).abs() < 1e-9, "{t}");
    let t = m.cost(
        Algorithm::RecursiveDoubling,
        CollKind::AllReduce,
        4000,
        &topo,
        1 << 20,
    );
    assert!((t - 2.0 * (25.0 + 3.2)).abs() < 1e-9, "{t}");
    assert!(m
        .cost(Algorithm::Tree, CollKind::AllGather, 10, &topo, 1 << 20)
        .is_infinite());
}

#[test]
fn costs_grow_with_size_and_ranks() {
    let m = CostModel::default();
    for algo in [
        Algorithm::Ring,
        Algorithm::Tree,
        Algorithm::RecursiveDoubling,
        Algorithm::Hierarchical,
    ] {
        let mut last = 0.0;
        for bytes in [1usize, 1 << 10, 1 << 20, 1 << 30] {
            let t = m.cost(
                algo,
                CollKind::AllReduce,
                bytes,
                &Topology::uniform(64, 8),
                1 << 20,
            );
            assert!(t > last, "{algo} {bytes}: {t} <= {last}");
            last = t;
        }
        let small = m.cost(
            algo,
            CollKind::AllReduce,
            4096,
            &Topology::uniform(16, 8),
            1 << 20,
        );
        let big = m.cost(
            algo,
            CollKind::AllReduce,
            4096,
            &Topology::uniform(4096, 8),
            1 << 20,
        );
        assert!(big > small, "{algo}");
    }
}

#[test]
fn overrides_force_the_choice() {
    let m = CostModel::default();
    let topo = Topology::uniform(64, 8);
    let o = Overrides::parse("ring").unwrap();
    let c = m.choose(CollKind::AllReduce, 8, &topo, &o);
    assert_eq!(
        (c.algo, c.reason.as_str()),
        (Algorithm::Ring, "FERRO_ALGO=ring")
    );
    // Not implemented for broadcast: the model decides.
    let c = m.choose(CollKind::Broadcast { root: 1 }, 8, &topo, &o);
    assert_eq!(c.reason, "cost model");
    let o = Overrides::parse("allreduce=rd:0-8K;tree:8K-1M;ring:1M-max, broadcast=chain:0-max")
        .unwrap();
    let cases = [
        (0, Algorithm::RecursiveDoubling),
        (8191, Algorithm::RecursiveDoubling),
        (8192, Algorithm::Tree),
        ((1 << 20) - 1, Algorithm::Tree),
        (1 << 20, Algorithm::Ring),
        (1 << 40, Algorithm::Ring),
    ];
    for (bytes, want) in cases {
        let c = m.choose(CollKind::AllReduce, bytes, &topo, &o);
        assert_eq!(c.algo, want, "{bytes}: {c}");
        assert!(c.reason.starts_with("rule allreduce="), "{c}");
    }
    let c = m.choose(CollKind::Broadcast { root: 0 }, 1, &topo, &o);
    assert_eq!(c.algo, Algorithm::Chain);
    let c = m.choose(CollKind::AllGather, 1, &topo, &o);
    assert_eq!(c.reason, "cost model");
}

#[test]
fn rule_errors_name_the_token() {
    let bad = [
        ("allreduce=rd:0-8X", "'8X'"),
        ("allreduce=rdx:0-8K", "'rdx'"),
        ("allreduse=rd:0-8K", "'allreduse'"),
        ("allreduce=rd", "'rd'"),
        ("allreduce=rd:8K", "'8K'"),
        ("allreduce=rd:8K-8K", "'8K-8K'"),
        (
            "broadcast=ring:0-max",
            "'ring' does not implement broadcast",
        ),
        ("tre", "'tre'"),
    ];
    for (s, needle) in bad {
        let e = Overrides::parse(s).unwrap_err();
        assert!(e.contains(needle), "{s}: {e}");
    }
    assert_eq!(Overrides::parse("  ").unwrap(), Overrides::default());
}

#[test]
fn calibrate_replaces_constants_and_refuses_nonsense() {
    let mut m = CostModel::default();
    m.calibrate(Link::Tcp, 40.0, 2.5).unwrap();
    assert_eq!(
        m.link(Link::Tcp),
        LinkCost {
            alpha_us: 40.0,
            beta_gbps: 2.5
        }
    );
    assert!(m
        .calibrate(Link::Shm, f64::NAN, 1.0)
        .unwrap_err()
        .contains("NaN"));
    assert!(m
        .calibrate(Link::Shm, 1.0, 0.0)
        .unwrap_err()
        .contains("bandwidth 0"));
}

#[test]
fn corrections_interpolate_on_log_scales_and_clamp() {
    let c = Correction {
        collective: "all_reduce",
        algo: Algorithm::Ring,
        points: vec![(1 << 10, 1.0), (1 << 20, 4.0)],
    };
    assert_eq!(c.factor(1), 1.0);
    assert_eq!(c.factor(1 << 10), 1.0);
    assert_eq!(c.factor(1 << 30), 4.0);
    // Halfway in log(bytes) is halfway in log(factor): 2.
    assert!(
        (c.factor(1 << 15) - 2.0).abs() < 1e-9,
        "{}",
        c.factor(1 << 15)
    );
    let empty = Correction {
        points: Vec::new(),
        ..c
    };
    assert_eq!(empty.factor(4096), 1.0);
}

#[test]
fn correct_keeps_points_sorted_replaces_and_refuses_nonsense() {
    let ar = CollKind::AllReduce;
    let mut m = CostModel::default();
    m.correct(ar, Algorithm::Tree, 1 << 20, 2.0).unwrap();
    m.correct(ar, Algorithm::Tree, 1 << 10, 0.5).unwrap();
    m.correct(ar, Algorithm::Tree, 1 << 20, 3.0).unwrap();
    assert_eq!(m.corrections.len(), 1);
    assert_eq!(
        m.corrections[0].points,
        vec![(1 << 10, 0.5), (1 << 20, 3.0)]
    );
    assert_eq!(m.correction(Algorithm::Tree, ar, 1 << 30), 3.0);
    // Another collective or algorithm is not corrected.
    assert_eq!(
        m.correction(Algorithm::Tree, CollKind::AllGather, 1 << 30),
        1.0
    );
    assert_eq!(m.correction(Algorithm::Ring, ar, 1 << 30), 1.0);
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let e = m.correct(ar, Algorithm::Ring, 64, bad).unwrap_err();
        assert!(
            e.contains("all_reduce ring at 64 B") && e.contains("bad factor"),
            "{e}"
        );
    }
}

#[test]
fn measured_corrections_change_the_choice() {
    // 4 hosts x 2 ranks over TCP: the formulas pick Rabenseifner for large messages, where
    // the hierarchical algorithm was measured faster on a shaped network.
    let ar = CollKind::AllReduce;
    let topo = Topology::uniform(8, 2);
    let mut m = CostModel::default();
    let before = m.choose(ar, 64 << 20, &topo, &Overrides::default());
    assert_eq!(before.algo, Algorithm::Rabenseifner, "{before}");
    let hier = m.best_slice(Algorithm::Hierarchical, ar, 8 << 20, &topo).0;
    let rhd = m.best_slice(Algorithm::Rabenseifner, ar, 8 << 20, &topo).0;
    // Measured: hier 10 % faster than rhd at 8 MiB.
    m.correct(ar, Algorithm::Hierarchical, 8 << 20, 0.9 * rhd / hier)
        .unwrap();
    m.correct(ar, Algorithm::Rabenseifner, 8 << 20, 1.0)
        .unwrap();
    let after = m.choose(ar, 64 << 20, &topo, &Overrides::default());
    assert_eq!(after.algo, Algorithm::Hierarchical, "{after}");
    // The prediction is the corrected one.
    let want = m.best_slice(Algorithm::Hierarchical, ar, 64 << 20, &topo).0 * 0.9 * rhd / hier;
    assert!(
        (after.predicted_us - want).abs() < 1e-6 * want,
        "{after} vs {want}"
    );
    // Small messages keep the formula's choice (no correction measured there for rd).
    let small = m.choose(ar, 64, &topo, &Overrides::default());
    assert_eq!(small.algo, Algorithm::RecursiveDoubling, "{small}");
    // A forced algorithm still wins.
    let forced = m.choose(ar, 64 << 20, &topo, &Overrides::parse("rhd").unwrap());
    assert_eq!(forced.algo, Algorithm::Rabenseifner);
}

#[test]
fn choices_render_as_rules_that_parse_back_to_the_same_choices() {
    let ar = CollKind::AllReduce;
    let topo = Topology::uniform(8, 2);
    let mut m = CostModel::default();
    let hier = m.best_slice(Algorithm::Hierarchical, ar, 8 << 20, &topo).0;
    let rhd = m.best_slice(Algorithm::Rabenseifner, ar, 8 << 20, &topo).0;
    m.correct(ar, Algorithm::Hierarchical, 8 << 20, 0.5 * rhd / hier)
        .unwrap();
    let rules = m.as_rules(ar, &topo, 8, 1 << 30);
    assert!(rules.starts_with("allreduce=rd:0-"), "{rules}");
    assert!(rules.ends_with("-max"), "{rules}");
    assert!(rules.contains("hier:"), "{rules}");
    let parsed = Overrides::parse(&rules).unwrap();
    let plain = CostModel::default();
    let mut bytes = 8;
    while bytes <= 1 << 30 {
        let want = m.choose(ar, bytes, &topo, &Overrides::default()).algo;
        let got = plain.choose(ar, bytes, &topo, &parsed).algo;
        assert_eq!(got, want, "{bytes} B with {rules}");
        bytes *= 2;
    }
    assert_eq!(size_label(3 << 20), "3M");
    assert_eq!(size_label(1536), "1536");
    assert_eq!(size_label(0), "0");
}

#[test]
fn slices_stay_within_the_cap_and_the_tree_pipelines() {
    use Algorithm::*;
    let ar = CollKind::AllReduce;
    let topo = Topology::uniform(32, 8);
    let m = CostModel::default();
    assert_eq!(m.max_slice, DEFAULT_MAX_SLICE);
    // The tree's pipeline pays for its extra steps: 1 MiB goes in several chunks.
    let (_, tree) = m.best_slice(Tree, ar, 1 << 20, &topo);
    assert!(tree < 1 << 20, "tree slice {tree}");
    let forced = Overrides {
        algo: Some(Tree),
        rules: Vec::new(),
    };
    assert_eq!(m.choose(ar, 1 << 20, &topo, &forced).slice_bytes, tree);
    // Without a pipeline, fewer rounds are cheaper: the ring takes the cap, never more.
    assert_eq!(m.best_slice(Ring, ar, 64 << 20, &topo).1, DEFAULT_MAX_SLICE);
    // A cap between the candidates is itself a candidate; one below them all is the only one.
    for cap in [3 << 20, 16 << 10] {
        let m = CostModel {
            max_slice: cap,
            ..CostModel::default()
        };
        for algo in Algorithm::ALL.into_iter().filter(|a| a.supports(ar)) {
            for bytes in [4 << 10, 1 << 20, 64 << 20] {
                let (t, slice) = m.best_slice(algo, ar, bytes, &topo);
                assert!(slice <= cap, "{algo} {bytes} B: slice {slice} over {cap}");
                assert!(t > 0.0, "{algo} {bytes} B");
            }
        }
        assert_eq!(m.best_slice(Ring, ar, 64 << 20, &topo).1, cap);
    }
}

#[test]
fn beyond_the_largest_measurement_no_algorithm_gains_per_byte() {
    // 4 hosts x 2 ranks over TCP, measured at 8 MiB (above the 4 MiB slice cap): the tree
    // 5 % slower than the hierarchical algorithm. The tree's pipeline takes larger slices
    // for larger messages, so its formula grows more slowly than linearly; scaled by its
    // factor alone it would overtake at 64 MiB what was measured faster.
    use Algorithm::*;
    let ar = CollKind::AllReduce;
    let topo = Topology::uniform(8, 2);
    let mut m = CostModel::default();
    let p = 8 << 20;
    let big = 64 << 20;
    let formula = |m: &CostModel, a, b| m.best_slice(a, ar, b, &topo).0;
    let (tree_p, hier_p) = (formula(&m, Tree, p), formula(&m, Hierarchical, p));
    m.correct(ar, Hierarchical, p, 1.0).unwrap();
    // Measured: tree 1.05 x hier at P.
    m.correct(ar, Tree, p, 1.05 * hier_p / tree_p).unwrap();
    let factor_only = |a, f: f64| formula(&m, a, big) * f;
    let (tree_f, hier_f) = (
        factor_only(Tree, 1.05 * hier_p / tree_p),
        factor_only(Hierarchical, 1.0),
    );
    assert!(
        tree_f < hier_f,
        "the premise: by factors alone the tree would win ({tree_f} vs {hier_f})"
    );
    let only = |a| Overrides {
        algo: Some(a),
        rules: Vec::new(),
    };
    let tree = m.choose(ar, big, &topo, &only(Tree));
    assert!(
        (tree.predicted_us - 1.05 * hier_p * 8.0).abs() < 1e-6 * tree.predicted_us,
        "{tree}"
    );
    let c = m.choose(ar, big, &topo, &Overrides::default());
    assert_ne!(c.algo, Tree, "{c}");
    // At and below P the factors alone hold.
    let at_p = m.choose(ar, p, &topo, &only(Tree));
    assert!((at_p.predicted_us - 1.05 * hier_p).abs() < 1e-6 * at_p.predicted_us);
    // Below the slice cap nothing is extrapolated linearly: a latency-bound measurement
    // at 8 KiB says nothing about bandwidth.
    let mut small = CostModel::default();
    small.correct(ar, Ring, 8 << 10, 2.0).unwrap();
    let (t, _) = small.corrected_cost(Ring, ar, big, &topo);
    assert!((t - 2.0 * formula(&small, Ring, big)).abs() < 1e-6 * t);
}
