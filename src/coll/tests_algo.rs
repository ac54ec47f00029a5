//! Sweeps of the algorithms of [`build_with`] through the checker, over rank counts, host
//! layouts and awkward counts.

use super::*;

fn args(kind: CollKind, count: usize, in_place: bool) -> CollArgs {
    CollArgs {
        kind,
        count,
        in_place,
    }
}

/// Host layouts for `n` ranks: one host, one rank per host, 4 per host (the last one short),
/// 2 per host, and uneven hosts of 3, 1, 2, 3, 1, 2, ... ranks.
fn layouts(n: usize) -> Vec<Topology> {
    let mut uneven = Vec::with_capacity(n);
    let sizes = [3, 1, 2];
    let (mut host, mut left) = (0, sizes[0]);
    for _ in 0..n {
        if left == 0 {
            host += 1;
            left = sizes[host % 3];
        }
        uneven.push(host);
        left -= 1;
    }
    let mut v = vec![
        Topology::single_host(n),
        Topology::uniform(n, 1),
        Topology::uniform(n, 4),
        Topology::uniform(n, 2),
        Topology { host_of: uneven },
    ];
    v.dedup();
    v
}

fn counts(n: usize) -> Vec<usize> {
    let mut c = vec![0, 1, n - 1, n, n + 1, 13, 97, 10_007];
    c.sort_unstable();
    c.dedup();
    c
}

/// Checks `algo` for `kinds(n)` over `ranks`, every layout, count and placement. Slices are
/// small for the larger counts so that rounds and pipelining are exercised too.
fn sweep(
    algo: Algorithm,
    kinds: &dyn Fn(usize) -> Vec<CollKind>,
    ranks: impl Iterator<Item = usize>,
) {
    let mut checker = Checker::new();
    let topology_free = matches!(algo, Algorithm::RecursiveDoubling | Algorithm::Binomial);
    for n in ranks {
        let mut topos = layouts(n);
        if topology_free {
            topos.truncate(1);
        }
        for topo in topos {
            for kind in kinds(n) {
                let per_rank = matches!(kind, CollKind::AllGather | CollKind::ReduceScatter);
                if algo == Algorithm::Hierarchical && per_rank && !topo.is_uniform() {
                    let a = args(kind, 5, false);
                    let e = build_with(&a, 0, n, &AlgoOptions { slice: 4 }, algo, &topo);
                    assert!(e.is_err() || n == 1, "{topo:?}");
                    continue;
                }
                for count in counts(n) {
                    let count = if per_rank && count * n > 4_000 {
                        count / n + 3
                    } else {
                        count
                    };
                    let slice = if count > 1000 { 997 } else { 4 };
                    let opts = AlgoOptions { slice };
                    for in_place in [false, true] {
                        let a = args(kind, count, in_place);
                        let scheds = build_all(&a, n, &opts, algo, &topo)
                            .unwrap_or_else(|e| panic!("{algo}: {e}"));
                        if let Err(e) = checker.check_schedules(&a, n, &scheds) {
                            panic!("{algo} on {:?}: {e}", topo.hosts());
                        }
                        let longest = scheds
                            .iter()
                            .flat_map(|s| s.ops())
                            .filter_map(|op| match *op {
                                Op::Send { src, .. } => Some(src.len),
                                _ => None,
                            })
                            .max()
                            .unwrap_or(0);
                        assert!(longest <= slice, "{algo}: message {longest} > {slice}");
                    }
                }
            }
        }
    }
}

fn some_ranks() -> impl Iterator<Item = usize> {
    (1..=17).chain([24, 31, 32, 33, 48, 63, 64])
}

fn rooted(n: usize, f: fn(usize) -> CollKind) -> Vec<CollKind> {
    let mut r = vec![0, n / 2, n - 1];
    r.dedup();
    r.into_iter().map(f).collect()
}

#[test]
fn sweep_tree_all_reduce() {
    sweep(
        Algorithm::Tree,
        &|_| vec![CollKind::AllReduce],
        some_ranks(),
    );
}

#[test]
fn sweep_recursive_doubling_all_reduce() {
    sweep(
        Algorithm::RecursiveDoubling,
        &|_| vec![CollKind::AllReduce],
        1..=64,
    );
}

#[test]
fn sweep_rabenseifner_all_reduce() {
    sweep(
        Algorithm::Rabenseifner,
        &|_| vec![CollKind::AllReduce],
        some_ranks(),
    );
}

#[test]
fn sweep_rabenseifner_all_reduce_one_host() {
    // Every rank count 1..64 on one host; `sweep_rabenseifner_all_reduce` adds the other
    // host layouts (the host-by-host renumbering) on a subset of rank counts.
    let mut checker = Checker::new();
    for n in 1..=64 {
        let topo = Topology::single_host(n);
        for count in counts(n) {
            let opts = AlgoOptions {
                slice: if count > 1000 { 997 } else { 4 },
            };
            for in_place in [false, true] {
                let a = args(CollKind::AllReduce, count, in_place);
                let scheds = build_all(&a, n, &opts, Algorithm::Rabenseifner, &topo).unwrap();
                if let Err(e) = checker.check_schedules(&a, n, &scheds) {
                    panic!("rhd on {n} ranks, count {count}: {e}");
                }
            }
        }
    }
}

#[test]
fn rabenseifner_keeps_the_largest_exchange_inside_a_host() {
    // Round-robin placement: hosts {0, 4}, {1, 5}, {2, 6}, {3, 7}.
    let topo = Topology {
        host_of: (0..8).map(|r| r % 4).collect(),
    };
    let opts = AlgoOptions { slice: 1 << 20 };
    let a = args(CollKind::AllReduce, 800, false);
    for r in 0..8 {
        let s = build_with(&a, r, 8, &opts, Algorithm::Rabenseifner, &topo).unwrap();
        let first = s.steps[0].ops.iter().find_map(|op| match *op {
            Op::Send { peer, src } => Some((peer, src.len)),
            _ => None,
        });
        assert_eq!(first, Some(((r + 4) % 8, 400)), "rank {r}");
    }
}

#[test]
fn sweep_hierarchical_all_reduce() {
    sweep(
        Algorithm::Hierarchical,
        &|_| vec![CollKind::AllReduce],
        some_ranks(),
    );
}

#[test]
fn sweep_hierarchical_gather_scatter() {
    sweep(
        Algorithm::Hierarchical,
        &|_| vec![CollKind::AllGather, CollKind::ReduceScatter],
        (1..=12).chain([16, 30, 32, 64]),
    );
}

#[test]
fn sweep_hierarchical_rooted() {
    sweep(
        Algorithm::Hierarchical,
        &|n| {
            let mut k = rooted(n, |root| CollKind::Broadcast { root });
            k.extend(rooted(n, |root| CollKind::Reduce { root }));
            k
        },
        some_ranks(),
    );
}

#[test]
fn sweep_binomial() {
    sweep(
        Algorithm::Binomial,
        &|n| {
            let mut k = rooted(n, |root| CollKind::Broadcast { root });
            k.extend(rooted(n, |root| CollKind::Reduce { root }));
            k
        },
        1..=64,
    );
}

#[test]
fn defaults_match_build() {
    let opts = AlgoOptions { slice: 7 };
    for n in [1, 2, 5] {
        let topo = Topology::uniform(n, 2);
        for kind in [
            CollKind::AllReduce,
            CollKind::AllGather,
            CollKind::ReduceScatter,
            CollKind::AllToAll,
            CollKind::Broadcast { root: n - 1 },
            CollKind::Reduce { root: 0 },
        ] {
            let a = args(kind, 30, false);
            let algo = Algorithm::default_for(kind);
            for r in 0..n {
                assert_eq!(
                    build_with(&a, r, n, &opts, algo, &topo).unwrap(),
                    build(&a, r, n, &opts)
                );
            }
        }
    }
}

#[test]
fn unsupported_and_bad_arguments_are_errors() {
    let opts = AlgoOptions { slice: 8 };
    let topo = Topology::uniform(4, 2);
    let a = args(CollKind::AllToAll, 3, false);
    let e = build_with(&a, 0, 4, &opts, Algorithm::Tree, &topo).unwrap_err();
    assert!(e.contains("all_to_all") && e.contains("tree"), "{e}");
    let a = args(CollKind::AllReduce, 3, false);
    let e = build_with(&a, 0, 5, &opts, Algorithm::Ring, &topo).unwrap_err();
    assert!(e.contains("4 ranks") && e.contains('5'), "{e}");
    let e = build_with(&a, 4, 4, &opts, Algorithm::Ring, &topo).unwrap_err();
    assert!(e.contains("rank 4"), "{e}");
    let a = args(CollKind::Broadcast { root: 9 }, 3, false);
    let e = build_with(&a, 0, 4, &opts, Algorithm::Binomial, &topo).unwrap_err();
    assert!(e.contains("root 9"), "{e}");
    let uneven = Topology {
        host_of: vec![0, 0, 0, 1],
    };
    let a = args(CollKind::AllGather, 3, false);
    let e = build_with(&a, 0, 4, &opts, Algorithm::Hierarchical, &uneven).unwrap_err();
    assert!(e.contains("[3, 1]"), "{e}");
}

#[test]
fn names_round_trip_and_bad_names_are_named() {
    for a in Algorithm::ALL {
        assert_eq!(a.name().parse::<Algorithm>().unwrap(), a);
    }
    assert_eq!(
        "RD".parse::<Algorithm>().unwrap(),
        Algorithm::RecursiveDoubling
    );
    assert_eq!(
        "rabenseifner".parse::<Algorithm>().unwrap(),
        Algorithm::Rabenseifner
    );
    let e = "rign".parse::<Algorithm>().unwrap_err();
    assert!(e.contains("'rign'") && e.contains("ring"), "{e}");
}

#[test]
fn recursive_doubling_takes_log_steps() {
    let opts = AlgoOptions { slice: 1 << 20 };
    let a = args(CollKind::AllReduce, 1000, false);
    let topo = Topology::single_host(16);
    let s = build_with(&a, 5, 16, &opts, Algorithm::RecursiveDoubling, &topo).unwrap();
    assert_eq!(s.steps.len(), 4);
    // 12 ranks: 8 exchange (3 steps), plus a fold and an unfold step for the odd ranks < 8.
    let topo = Topology::single_host(12);
    let s = build_with(&a, 3, 12, &opts, Algorithm::RecursiveDoubling, &topo).unwrap();
    assert_eq!(s.steps.len(), 3 + 2);
    let s = build_with(&a, 2, 12, &opts, Algorithm::RecursiveDoubling, &topo).unwrap();
    assert_eq!(s.steps.len(), 2);
}

#[test]
fn binomial_takes_log_steps() {
    let opts = AlgoOptions { slice: 1 << 20 };
    let topo = Topology::single_host(13);
    let a = args(CollKind::Broadcast { root: 3 }, 100, true);
    let steps = (0..13)
        .map(|r| {
            build_with(&a, r, 13, &opts, Algorithm::Binomial, &topo)
                .unwrap()
                .steps
                .len()
        })
        .max();
    assert_eq!(steps, Some(4));
}

#[test]
fn double_tree_hosts_are_leaf_in_one_tree_interior_in_the_other() {
    for h in [2, 4, 6, 8, 16, 64] {
        let [t0, t1] = tree::host_trees(h);
        let interior = |t: &[Option<usize>]| {
            let mut has_child = vec![false; h];
            for p in t.iter().flatten() {
                has_child[*p] = true;
            }
            has_child
        };
        assert_eq!(t0.iter().filter(|p| p.is_none()).count(), 1);
        assert_eq!(t1.iter().filter(|p| p.is_none()).count(), 1);
        let (i0, i1) = (interior(&t0), interior(&t1));
        let both = (0..h).filter(|&x| i0[x] && i1[x]).count();
        assert!(both <= 1, "{h} hosts: {both} interior in both trees");
    }
}

#[test]
fn hierarchical_all_reduce_crosses_hosts_only_between_equal_local_ranks() {
    let opts = AlgoOptions { slice: 64 };
    let topo = Topology::uniform(12, 4);
    let a = args(CollKind::AllReduce, 1000, false);
    for r in 0..12 {
        let s = build_with(&a, r, 12, &opts, Algorithm::Hierarchical, &topo).unwrap();
        for p in s.peers() {
            assert!(
                topo.same_host(r, p) || p % 4 == r % 4,
                "rank {r} talks to {p}"
            );
        }
    }
}

#[test]
fn rabenseifner_halves_then_doubles() {
    let opts = AlgoOptions { slice: 1 << 20 };
    let a = args(CollKind::AllReduce, 1600, false);
    let topo = Topology::single_host(16);
    let s = build_with(&a, 5, 16, &opts, Algorithm::Rabenseifner, &topo).unwrap();
    // 4 halving and 4 doubling steps; the first halving sends half, the last a sixteenth.
    assert_eq!(s.steps.len(), 8);
    let sent: Vec<usize> = s
        .steps
        .iter()
        .map(|st| {
            st.ops
                .iter()
                .map(|op| match *op {
                    Op::Send { src, .. } => src.len,
                    _ => 0,
                })
                .sum()
        })
        .collect();
    assert_eq!(sent, vec![800, 400, 200, 100, 100, 200, 400, 800]);
    // The largest exchange is with the nearest partner.
    let first_peer = s.steps[0].ops.iter().find_map(|op| match *op {
        Op::Send { peer, .. } => Some(peer),
        _ => None,
    });
    assert_eq!(first_peer, Some(4));
    // 12 ranks: 8 exchange, odd ranks below 8 also fold and unfold.
    let topo = Topology::single_host(12);
    let s = build_with(&a, 3, 12, &opts, Algorithm::Rabenseifner, &topo).unwrap();
    assert_eq!(s.steps.len(), 2 * 3 + 2);
    let s = build_with(&a, 2, 12, &opts, Algorithm::Rabenseifner, &topo).unwrap();
    assert_eq!(s.steps.len(), 2);
}

#[test]
fn rabenseifner_build_all_matches_build_with() {
    let opts = AlgoOptions { slice: 7 };
    for n in [2, 5, 12] {
        for topo in layouts(n) {
            let a = args(CollKind::AllReduce, 100, true);
            let all = build_all(&a, n, &opts, Algorithm::Rabenseifner, &topo).unwrap();
            for (r, s) in all.iter().enumerate() {
                let one = build_with(&a, r, n, &opts, Algorithm::Rabenseifner, &topo).unwrap();
                assert_eq!(*s, one, "rank {r} of {n} on {:?}", topo.hosts());
            }
        }
    }
}
