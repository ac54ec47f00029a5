//! Per-op checks of one rank's schedule: spans in bounds, valid peers, copies and
//! receive-reduces of equal lengths that alias wholly or not at all, no forbidden writes (2.),
//! and no two communication ops of a step touching the same memory with a write (3.).

use std::ops::Range;

use super::layout::Layout;
use super::{locate, peer_of};
use crate::coll::{BufKind, CollArgs, CollKind, Op, Schedule};

fn overlap(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}

/// Per-op checks of one rank's schedule (2.) and the conflict check within steps (3.).
pub(super) fn check_ops(
    args: &CollArgs,
    nranks: usize,
    s: &Schedule,
    lay: &Layout,
) -> Result<(), String> {
    let r = s.rank;
    let non_root_reduce = matches!(args.kind, CollKind::Reduce { root } if root != r);
    let user = lay.user..lay.scratch_base;
    let mut accesses: Vec<Access> = Vec::new();
    for (t, step) in s.steps.iter().enumerate() {
        accesses.clear();
        for (i, op) in step.ops.iter().enumerate() {
            let at = || locate(r, t, i, op);
            let (src, dst) = match *op {
                Op::Send { src, .. } => (Some(src), None),
                Op::Recv { dst, .. } => (None, Some(dst)),
                Op::RecvReduce { src, dst, .. } | Op::Copy { src, dst } => (Some(src), Some(dst)),
            };
            for span in src.iter().chain(dst.iter()) {
                if !lay.in_bounds(span) {
                    let (_, len) = lay.base_len(span.buf);
                    return Err(format!(
                        "{}: span out of bounds (buffer has {len} elements)",
                        at()
                    ));
                }
            }
            if let Some(peer) = peer_of(op) {
                if peer >= nranks || peer == r {
                    return Err(format!("{}: invalid peer {peer}", at()));
                }
            }
            if let (Some(a), Some(b)) = (src, dst) {
                if a.len != b.len {
                    return Err(format!(
                        "{}: source has {} elements, destination {}",
                        at(),
                        a.len,
                        b.len
                    ));
                }
                let (fa, fb) = (lay.flat(&a), lay.flat(&b));
                if fa != fb && overlap(&fa, &fb) {
                    return Err(format!(
                        "{}: source and destination partially overlap",
                        at()
                    ));
                }
            }
            if matches!(op, Op::RecvReduce { .. }) && !args.kind.reduces() {
                return Err(format!(
                    "{}: reduction in a collective that does not reduce",
                    at()
                ));
            }
            if let Some(d) = dst {
                let fd = lay.flat(&d);
                if !args.in_place && d.buf == BufKind::Input {
                    return Err(format!("{}: writes the input buffer", at()));
                }
                if non_root_reduce && overlap(&fd, &user) {
                    return Err(format!(
                        "{}: a rank other than the root writes a user buffer",
                        at()
                    ));
                }
            }
            if peer_of(op).is_some() {
                if let Some(a) = src {
                    accesses.push(Access::new(lay.flat(&a), false, i));
                }
                if let Some(d) = dst {
                    let fd = lay.flat(&d);
                    if let Some(last) = accesses.last_mut() {
                        // A receive-reduce in place reads and writes the same memory.
                        if last.op == i && last.range == fd {
                            last.write = true;
                            continue;
                        }
                    }
                    accesses.push(Access::new(fd, true, i));
                }
            }
        }
        if let Some((a, b)) = find_conflict(&mut accesses) {
            return Err(format!(
                "{} conflicts with {}: same memory in one step",
                locate(r, t, a, &step.ops[a]),
                locate(r, t, b, &step.ops[b])
            ));
        }
    }
    Ok(())
}

/// One memory access of a communication op.
#[derive(Debug, Clone)]
struct Access {
    range: Range<usize>,
    write: bool,
    op: usize,
}

impl Access {
    fn new(range: Range<usize>, write: bool, op: usize) -> Self {
        Access { range, write, op }
    }
}

/// Furthest end reached by one op, and by the best other op: enough to tell whether some op
/// other than a given one reaches past a point.
#[derive(Debug, Clone, Copy, Default)]
struct TopTwo {
    first: Option<(usize, usize)>,
    second: Option<(usize, usize)>,
}

impl TopTwo {
    fn add(&mut self, op: usize, end: usize) {
        match (self.first, self.second) {
            (Some((o, e)), _) if o == op => self.first = Some((o, e.max(end))),
            (Some((_, e)), _) if end <= e => match self.second {
                Some((o2, e2)) if o2 == op => self.second = Some((o2, e2.max(end))),
                Some((_, e2)) if end <= e2 => {}
                _ => self.second = Some((op, end)),
            },
            (first, _) => {
                self.second = first;
                self.first = Some((op, end));
            }
        }
    }

    /// An op other than `op` whose accesses reach past `start`.
    fn other_past(&self, op: usize, start: usize) -> Option<usize> {
        [self.first, self.second]
            .into_iter()
            .flatten()
            .find(|&(o, _)| o != op)
            .filter(|&(_, e)| e > start)
            .map(|(o, _)| o)
    }
}

/// Two ops of a step that touch the same memory with at least one write, if any.
fn find_conflict(acc: &mut [Access]) -> Option<(usize, usize)> {
    acc.sort_unstable_by_key(|a| a.range.start);
    let mut any = TopTwo::default();
    let mut writes = TopTwo::default();
    for a in acc.iter().filter(|a| !a.range.is_empty()) {
        let seen = if a.write { &any } else { &writes };
        if let Some(other) = seen.other_past(a.op, a.range.start) {
            return Some((other.min(a.op), other.max(a.op)));
        }
        any.add(a.op, a.range.end);
        if a.write {
            writes.add(a.op, a.range.end);
        }
    }
    None
}
