//! Sweeps of every algorithm through the checker, and broken schedules the checker must reject.

use super::*;

const OPTS: AlgoOptions = AlgoOptions { slice: 1024 };

fn args(kind: CollKind, count: usize, in_place: bool) -> CollArgs {
    CollArgs {
        kind,
        count,
        in_place,
    }
}

fn schedules(a: &CollArgs, n: usize, opts: &AlgoOptions) -> Vec<Schedule> {
    (0..n).map(|r| build(a, r, n, opts)).collect()
}

/// Awkward counts for `n` ranks: empty, smaller than, around and not divisible by `n`, primes,
/// and one large enough to need several rounds or slices.
fn counts(n: usize) -> Vec<usize> {
    let mut c = vec![0, 1, n - 1, n, n + 1, 7, 97, 1009, 10_007];
    c.sort_unstable();
    c.dedup();
    c
}

fn roots(n: usize) -> Vec<usize> {
    let mut r = vec![0, n / 2, n - 1];
    r.dedup();
    r
}

/// Checks `kinds` for every nranks in `ranks` and every count; for the collectives whose
/// buffers are `count * nranks` long, counts are scaled down so the sweep stays fast.
fn sweep(kinds: &dyn Fn(usize) -> Vec<CollKind>, ranks: std::ops::RangeInclusive<usize>) {
    let mut checker = Checker::new();
    for n in ranks {
        for kind in kinds(n) {
            let per_rank = matches!(
                kind,
                CollKind::AllGather | CollKind::ReduceScatter | CollKind::AllToAll
            );
            for count in counts(n) {
                let count = if per_rank && count * n > 40_000 {
                    count / n + 3
                } else {
                    count
                };
                for in_place in [false, true] {
                    let a = args(kind, count, in_place);
                    if let Err(e) = checker.check(&a, n, &OPTS) {
                        panic!("{e}");
                    }
                }
            }
        }
    }
}

#[test]
fn sweep_all_reduce() {
    sweep(&|_| vec![CollKind::AllReduce], 1..=64);
}

#[test]
fn sweep_reduce_scatter() {
    sweep(&|_| vec![CollKind::ReduceScatter], 1..=64);
}

#[test]
fn sweep_all_gather() {
    sweep(&|_| vec![CollKind::AllGather], 1..=64);
}

#[test]
fn sweep_broadcast() {
    sweep(
        &|n| {
            roots(n)
                .into_iter()
                .map(|root| CollKind::Broadcast { root })
                .collect()
        },
        1..=64,
    );
}

#[test]
fn sweep_reduce() {
    sweep(
        &|n| {
            roots(n)
                .into_iter()
                .map(|root| CollKind::Reduce { root })
                .collect()
        },
        1..=64,
    );
}

#[test]
fn sweep_all_to_all() {
    sweep(&|_| vec![CollKind::AllToAll], 1..=64);
}

fn all_kinds(n: usize) -> Vec<CollKind> {
    let mut k = vec![
        CollKind::AllReduce,
        CollKind::ReduceScatter,
        CollKind::AllGather,
        CollKind::AllToAll,
    ];
    for root in roots(n) {
        k.push(CollKind::Broadcast { root });
        k.push(CollKind::Reduce { root });
    }
    k
}

fn max_message(scheds: &[Schedule]) -> usize {
    scheds
        .iter()
        .flat_map(|s| s.ops())
        .filter_map(|op| match *op {
            Op::Send { src, .. } => Some(src.len),
            Op::Recv { dst, .. } | Op::RecvReduce { dst, .. } => Some(dst.len),
            Op::Copy { .. } => None,
        })
        .max()
        .unwrap_or(0)
}

#[test]
fn small_slices_are_correct_and_bound_every_message() {
    for slice in [0, 1, 2, 3, 5, 16] {
        let opts = AlgoOptions { slice };
        for n in 1..=9 {
            for kind in all_kinds(n) {
                for count in [0, 1, 2, n + 1, 17, 40, 101] {
                    for in_place in [false, true] {
                        let a = args(kind, count, in_place);
                        if let Err(e) = check(&a, n, &opts) {
                            panic!("slice {slice}: {e}");
                        }
                        let longest = max_message(&schedules(&a, n, &opts));
                        assert!(
                            longest <= slice.max(1),
                            "{a:?} nranks {n}: message of {longest} > slice {slice}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn large_count_is_cut_into_slices() {
    let opts = AlgoOptions { slice: 100 };
    for kind in all_kinds(4) {
        let a = args(kind, 1000, false);
        check(&a, 4, &opts).unwrap();
        let scheds = schedules(&a, 4, &opts);
        assert_eq!(max_message(&scheds), 100, "{kind:?}");
        // Several rounds: far more steps than a single pass needs.
        assert!(
            scheds[1].steps.len() >= 10,
            "{kind:?}: {} steps",
            scheds[1].steps.len()
        );
    }
}

#[test]
fn ring_all_reduce_shape() {
    let n = 5;
    let a = args(CollKind::AllReduce, 23, false);
    for r in 0..n {
        let s = build(&a, r, n, &OPTS);
        assert_eq!(s.steps.len(), 2 * (n - 1));
        assert_eq!(s.scratch, 0);
        assert_eq!(s.peers(), {
            let mut p = vec![(r + 1) % n, (r + n - 1) % n];
            p.sort_unstable();
            p
        });
        // No copy out of place: the first step sends straight from the input.
        assert!(s.ops().all(|op| !matches!(op, Op::Copy { .. })));
        assert!(matches!(
            s.steps[0].ops[0],
            Op::Send {
                src: Span {
                    buf: BufKind::Input,
                    ..
                },
                ..
            }
        ));
        for step in &s.steps {
            assert_eq!(step.ops.len(), 2);
        }
    }
}

#[test]
fn single_rank_is_one_copy_or_nothing() {
    for kind in all_kinds(1) {
        let s = build(&args(kind, 10, false), 0, 1, &OPTS);
        assert_eq!(s.steps.len(), 1);
        assert_eq!(
            s.steps[0].ops,
            vec![Op::Copy {
                src: Span::new(BufKind::Input, 0, 10),
                dst: Span::new(BufKind::Output, 0, 10),
            }]
        );
        assert!(build(&args(kind, 10, true), 0, 1, &OPTS).steps.is_empty());
    }
}

#[test]
fn zero_count_has_no_communication() {
    for n in [2, 3, 8] {
        for kind in all_kinds(n) {
            for in_place in [false, true] {
                for r in 0..n {
                    let s = build(&args(kind, 0, in_place), r, n, &OPTS);
                    assert!(s.peers().is_empty(), "{kind:?}");
                }
            }
        }
    }
}

#[test]
fn reduce_scatter_out_of_place_uses_scratch_not_input() {
    let a = args(CollKind::ReduceScatter, 10, false);
    let s = build(&a, 2, 5, &OPTS);
    assert_eq!(s.scratch, 20);
    for op in s.ops() {
        if let Op::Recv { dst, .. } | Op::RecvReduce { dst, .. } = op {
            assert_ne!(dst.buf, BufKind::Input);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Broken schedules.

fn expect_err(a: &CollArgs, n: usize, scheds: &[Schedule], needle: &str) {
    match check_schedules(a, n, scheds) {
        Ok(()) => panic!("broken schedule accepted, expected error containing {needle:?}"),
        Err(e) => assert!(e.contains(needle), "error {e:?} lacks {needle:?}"),
    }
}

/// Correct schedules for a 4-rank out-of-place all_reduce of 10 elements.
fn ring4() -> (CollArgs, Vec<Schedule>) {
    let a = args(CollKind::AllReduce, 10, false);
    let s = schedules(&a, 4, &OPTS);
    check_schedules(&a, 4, &s).unwrap();
    (a, s)
}

#[test]
fn catches_dropped_op() {
    let (a, mut s) = ring4();
    s[1].steps[5].ops.remove(0); // the last send
    expect_err(
        &a,
        4,
        &s,
        "rank 2 receives 6 messages from rank 1, which sends 5",
    );
    let (a, mut s) = ring4();
    s[2].steps[5].ops.remove(1); // the last recv
    expect_err(
        &a,
        4,
        &s,
        "rank 1 sends 6 messages to rank 2, which receives 5",
    );
}

#[test]
fn catches_dropped_matched_pair() {
    // Dropping both ends keeps the matching consistent: the result is wrong instead.
    let (a, mut s) = ring4();
    s[0].steps[1].ops.remove(0);
    s[1].steps[1].ops.remove(1);
    expect_err(
        &a,
        4,
        &s,
        "rank 1 step 2 op 0 (send output[8..10] to rank 2): sends uninitialized",
    );
}

#[test]
fn catches_swapped_peer() {
    let (a, mut s) = ring4();
    if let Op::Send { peer, .. } = &mut s[0].steps[0].ops[0] {
        *peer = 3;
    }
    expect_err(
        &a,
        4,
        &s,
        "all_reduce(count=10, out of place, nranks=4): message 0 from rank 0 to rank 1",
    );
}

#[test]
fn catches_self_peer() {
    let (a, mut s) = ring4();
    if let Op::Send { peer, .. } = &mut s[0].steps[0].ops[0] {
        *peer = 0;
    }
    expect_err(
        &a,
        4,
        &s,
        "rank 0 step 0 op 0 (send input[0..3] to rank 0): invalid peer 0",
    );
}

#[test]
fn catches_shortened_span() {
    let (a, mut s) = ring4();
    if let Op::Send { src, .. } = &mut s[0].steps[0].ops[0] {
        src.len -= 1;
    }
    expect_err(&a, 4, &s, "sends 2 elements but");
}

#[test]
fn catches_shortened_matched_spans() {
    // Both ends shortened: lengths agree, but one output element is never written.
    let (a, mut s) = ring4();
    let Op::Send { src, .. } = &mut s[3].steps[5].ops[0] else {
        panic!("expected a send");
    };
    src.len -= 1;
    let Op::Recv { dst, .. } = &mut s[0].steps[5].ops[1] else {
        panic!("expected a recv");
    };
    dst.len -= 1;
    expect_err(&a, 4, &s, "rank 0: output[");
    expect_err(
        &a,
        4,
        &s,
        "holds input[7] of ranks {0,2,3}, expected input[7] of all ranks",
    );
}

#[test]
fn catches_out_of_bounds() {
    let (a, mut s) = ring4();
    if let Op::RecvReduce { dst, src, .. } = &mut s[0].steps[0].ops[1] {
        dst.offset = 9;
        src.offset = 9;
    }
    expect_err(&a, 4, &s, "out of bounds (buffer has 10 elements)");
}

#[test]
fn catches_duplicated_recv_reduce() {
    // Rank 0 sends the same chunk twice and rank 1 reduces it twice.
    let (a, mut s) = ring4();
    let send = s[0].steps[0].ops[0];
    s[0].steps.insert(1, Step { ops: vec![send] });
    let rr = s[1].steps[0].ops[1];
    let Op::RecvReduce { peer, dst, .. } = rr else {
        panic!("expected a recv_reduce");
    };
    s[1].steps.insert(
        1,
        Step {
            ops: vec![Op::RecvReduce {
                peer,
                src: dst,
                dst,
            }],
        },
    );
    expect_err(&a, 4, &s, "counts a rank twice");
}

#[test]
fn catches_mixed_elements() {
    let (a, mut s) = ring4();
    if let Op::RecvReduce { src, .. } = &mut s[1].steps[0].ops[1] {
        src.offset += 3;
    }
    expect_err(&a, 4, &s, "combines different elements");
}

#[test]
fn catches_deadlock() {
    // Two ranks that both receive before they send never get going with rendezvous sends.
    let a = args(CollKind::Broadcast { root: 0 }, 4, true);
    let span = Span::new(BufKind::Output, 0, 4);
    let mk = |rank: usize| Schedule {
        rank,
        nranks: 2,
        scratch: 0,
        steps: vec![
            Step {
                ops: vec![Op::Recv {
                    peer: 1 - rank,
                    dst: span,
                }],
            },
            Step {
                ops: vec![Op::Send {
                    peer: 1 - rank,
                    src: span,
                }],
            },
        ],
    };
    expect_err(&a, 2, &[mk(0), mk(1)], "deadlock");
}

#[test]
fn catches_conflict_within_step() {
    let (a, mut s) = ring4();
    // Receive into the chunk that is being sent in the same step.
    let Op::Send { src, .. } = s[2].steps[4].ops[0] else {
        panic!("expected a send");
    };
    let Op::Recv { dst, .. } = &mut s[2].steps[4].ops[1] else {
        panic!("expected a recv");
    };
    dst.offset = src.offset;
    expect_err(&a, 4, &s, "conflicts with");
}

#[test]
fn catches_write_to_input() {
    let a = args(CollKind::AllGather, 6, false);
    let mut s = schedules(&a, 3, &OPTS);
    if let Op::Recv { dst, .. } = &mut s[1].steps[0].ops[2] {
        dst.buf = BufKind::Input;
    }
    expect_err(&a, 3, &s, "writes the input buffer");
}

#[test]
fn catches_uninitialized_read() {
    // A non-root rank of a broadcast has no meaningful input.
    let a = args(CollKind::Broadcast { root: 0 }, 5, false);
    let mut s = schedules(&a, 3, &OPTS);
    for op in s[1].steps.iter_mut().flat_map(|st| st.ops.iter_mut()) {
        if let Op::Send { src, .. } = op {
            src.buf = BufKind::Input;
        }
    }
    expect_err(&a, 3, &s, "sends uninitialized element");
}

#[test]
fn catches_reduce_non_root_writing_output() {
    let a = args(CollKind::Reduce { root: 0 }, 5, false);
    let mut s = schedules(&a, 3, &OPTS);
    // Rank 2 is the middle of the chain 1 -> 2 -> 0.
    for st in &mut s[2].steps {
        for op in &mut st.ops {
            if let Op::RecvReduce { dst, .. } = op {
                dst.buf = BufKind::Output;
            }
            if let Op::Send { src, .. } = op {
                src.buf = BufKind::Output;
            }
        }
    }
    expect_err(&a, 3, &s, "rank other than the root writes a user buffer");
}

#[test]
fn catches_wrong_routing_in_all_to_all() {
    let a = args(CollKind::AllToAll, 3, false);
    let mut s = schedules(&a, 3, &OPTS);
    // Rank 0 sends its block for rank 2 to rank 1 and vice versa (offsets swapped).
    for st in &mut s[0].steps {
        for op in &mut st.ops {
            if let Op::Send { src, .. } = op {
                src.offset = if src.offset == 3 { 6 } else { 3 };
            }
        }
    }
    expect_err(
        &a,
        3,
        &s,
        "output[0] holds input[6] of ranks {0}, expected input[3]",
    );
}

#[test]
fn catches_bad_arguments() {
    let a = args(CollKind::Reduce { root: 4 }, 5, false);
    let e = check(&a, 4, &OPTS).unwrap_err();
    assert!(e.contains("invalid root 4 (root must be 0..3)"), "{e}");
    let e = check(&args(CollKind::AllReduce, 5, false), 65, &OPTS).unwrap_err();
    assert!(e.contains("nranks 65"), "{e}");
    let (a, s) = ring4();
    expect_err(&a, 4, &s[..3], "3 schedules for 4 ranks");
}
