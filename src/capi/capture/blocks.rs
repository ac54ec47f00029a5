//! The blocked collectives of a recorded call (all-gather, reduce-scatter, all-to-all) that
//! the blocking form cuts into device slices: slice `k` is elements `Cut::range(k)` of every
//! block, run as a collective of that many elements on the slice's blocks placed one after
//! another (`device::staging::Cut`). A recorded call runs on the arena's copies of whole
//! buffers, where a slice's blocks lie apart; so at each launch its host function gathers
//! each slice's input blocks into scratch memory of its own (host memory, allocated when the
//! call is recorded), runs the slices' collectives there, and scatters their output blocks
//! back into the arena. Every rank then exchanges the messages of the blocking form, whichever
//! form it takes.

use std::sync::Mutex;

use super::super::ops::Op;
use crate::device::staging::Cut;
use crate::Communicator;

/// One blocked collective of the call cut into slices, and where its slices' blocks go in
/// the scratch memory (bytes from its start; `None`: its side is one block, used in place).
#[derive(Debug)]
struct Blocked {
    index: usize,
    cut: Cut,
    es: usize,
    input: Option<usize>,
    output: Option<usize>,
}

/// The blocked collectives of a recorded call that are cut into slices, with their scratch.
#[derive(Debug, Default)]
pub(super) struct Blocks {
    list: Vec<Blocked>,
    scratch: Mutex<Vec<u8>>,
}

impl Blocks {
    /// The collectives at the indices `colls` of `ops` (staged in the arena) whose blocked
    /// layout `comm` cuts into device slices.
    pub(super) fn plan(comm: &Communicator, ops: &[Op], colls: &[usize]) -> Blocks {
        let mut list = Vec::new();
        let mut bytes = 0;
        for &index in colls {
            let Some(&Op::Coll {
                kind, count, dtype, ..
            }) = ops.get(index)
            else {
                continue;
            };
            if kind.is_elementwise() {
                continue;
            }
            let es = dtype.size();
            let cut = comm.device_cut(kind, count, es);
            if cut.slices <= 1 {
                continue;
            }
            let mut side = |blocks: usize| {
                (blocks > 1).then(|| {
                    let at = bytes;
                    bytes += blocks * count * es;
                    at
                })
            };
            let input = side(cut.in_blocks);
            let output = side(cut.out_blocks);
            list.push(Blocked {
                index,
                cut,
                es,
                input,
                output,
            });
        }
        Blocks {
            list,
            scratch: Mutex::new(vec![0; bytes]),
        }
    }

    /// Runs `ops` through `run` with each cut collective replaced by its slices' collectives
    /// on the scratch memory: its input blocks gathered there before, its output blocks
    /// scattered into the arena after (also where `run` fails: the caller then marks the
    /// outputs). The other operations are passed as they are; `run` also gets where the
    /// staged ones among them (`colls`, indices into `ops`) now are.
    pub(super) fn run<R>(
        &self,
        ops: Vec<Op>,
        colls: &[usize],
        run: impl FnOnce(Vec<Op>, Vec<usize>) -> R,
    ) -> R {
        if self.list.is_empty() {
            return run(ops, colls.to_vec());
        }
        let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        let base = scratch.as_mut_ptr();
        let mut out = Vec::with_capacity(ops.len());
        let mut staged = Vec::with_capacity(colls.len());
        let mut outputs = Vec::with_capacity(self.list.len());
        for (i, op) in ops.into_iter().enumerate() {
            match self.list.iter().find(|b| b.index == i) {
                Some(b) => outputs.push((b, b.slices(op, base, &mut out))),
                None => {
                    if colls.contains(&i) {
                        staged.push(out.len());
                    }
                    out.push(op);
                }
            }
        }
        let r = run(out, staged);
        for (b, recv) in outputs {
            b.scatter(base, recv);
        }
        r
    }
}

impl Blocked {
    /// Gathers the input blocks of `op` (this collective) into the scratch at `base` and
    /// pushes its slices' collectives onto `out`; returns its output in the arena.
    fn slices(&self, op: Op, base: *mut u8, out: &mut Vec<Op>) -> *mut u8 {
        let Op::Coll {
            api,
            kind,
            send,
            recv,
            dtype,
            red,
            on,
            ..
        } = op
        else {
            out.push(op);
            return std::ptr::null_mut();
        };
        self.set_input(send.cast_mut(), base);
        // Slice `k` of a side of several blocks lies at `blocks * range(k).start` elements in
        // the scratch ([`Blocked::each_part`]); of a side of one block, in the arena itself.
        for k in 0..self.cut.slices {
            let r = self.cut.range(k);
            let at = |side: Option<usize>, buf: *const u8, blocks: usize| match side {
                Some(s) => base
                    .wrapping_add(s + blocks * r.start * self.es)
                    .cast_const(),
                None => buf.wrapping_add(r.start * self.es),
            };
            out.push(Op::Coll {
                api,
                kind,
                send: at(self.input, send, self.cut.in_blocks),
                recv: at(self.output, recv, self.cut.out_blocks).cast_mut(),
                count: r.len(),
                dtype,
                red,
                on,
            });
        }
        recv
    }

    /// Copies each slice's input blocks from the arena's `send` into their place in the
    /// scratch at `base` (nothing where the input is one block).
    fn set_input(&self, send: *mut u8, base: *mut u8) {
        let Some(at) = self.input else { return };
        if send.is_null() {
            return;
        }
        self.each_part(self.cut.in_blocks, |arena, scratch, len| {
            // SAFETY: both ranges lie in the arena's send buffer and the scratch (see
            // `slices`), which do not overlap, and nothing else touches them meanwhile.
            unsafe { std::ptr::copy_nonoverlapping(send.add(arena), base.add(at + scratch), len) };
        });
    }

    /// Copies each slice's output blocks from the scratch at `base` into the arena's `recv`
    /// (nothing where the output is one block).
    fn scatter(&self, base: *mut u8, recv: *mut u8) {
        let Some(at) = self.output else { return };
        if recv.is_null() {
            return;
        }
        self.each_part(self.cut.out_blocks, |arena, scratch, len| {
            // SAFETY: as in `set_input`, the other way.
            unsafe { std::ptr::copy_nonoverlapping(base.add(at + scratch), recv.add(arena), len) };
        });
    }

    /// Calls `f(arena offset, scratch offset, bytes)` for each block of each slice of a side
    /// holding `blocks` blocks: block `j` of slice `k` is elements `j * count + range(k)` of
    /// the buffer and lies at `(blocks * range(k).start + j * range(k).len())` elements in
    /// the scratch.
    fn each_part(&self, blocks: usize, mut f: impl FnMut(usize, usize, usize)) {
        let es = self.es;
        for k in 0..self.cut.slices {
            let r = self.cut.range(k);
            for j in 0..blocks {
                let arena = (j * self.cut.count + r.start) * es;
                let scratch = (blocks * r.start + j * r.len()) * es;
                f(arena, scratch, r.len() * es);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capi::ops::Reduction;
    use crate::coll::CollKind;
    use crate::device::staging::slices_in_flight;
    use crate::{DataType, ReduceOp};

    /// An all-to-all of 3 ranks, 5 one-byte elements a block, cut into slices of 3 and 2
    /// elements: each slice's blocks are gathered side by side before `run`, which sees one
    /// collective a slice, and scattered back after.
    #[test]
    fn a_cut_collective_runs_in_slices_on_its_blocks_gathered_and_scattered_back() {
        let (n, count) = (3, 5);
        let cut = Cut {
            count,
            slices: 2,
            in_blocks: n,
            out_blocks: n,
            window: slices_in_flight(2, 0),
        };
        let blocks = Blocks {
            list: vec![Blocked {
                index: 1,
                cut,
                es: 1,
                input: Some(0),
                output: Some(n * count),
            }],
            scratch: Mutex::new(vec![0; 2 * n * count]),
        };
        // Element i of the send buffer holds i; the output starts as 0xee.
        let send: Vec<u8> = (0..(n * count) as u8).collect();
        let mut recv = vec![0xee_u8; n * count];
        let coll = |send: *const u8, recv: *mut u8, count| Op::Coll {
            api: "ncclAlltoAll",
            kind: CollKind::AllToAll,
            send,
            recv,
            count,
            dtype: DataType::Uint8,
            red: Reduction::Op(ReduceOp::Sum),
            on: None,
        };
        let other = coll(std::ptr::null(), std::ptr::null_mut(), 7);
        let ops = vec![other, coll(send.as_ptr(), recv.as_mut_ptr(), count)];
        let seen = blocks.run(ops, &[0, 1], |ops, staged| {
            // The other operation as it was, then the two slices; only it is still staged.
            assert_eq!(ops.len(), 3);
            assert_eq!(staged, vec![0]);
            let mut counts = Vec::new();
            for (k, op) in ops[1..].iter().enumerate() {
                let &Op::Coll {
                    send, recv, count, ..
                } = op
                else {
                    panic!("slice {k} is not a collective");
                };
                let r = cut.range(k);
                assert_eq!(count, r.len());
                // SAFETY: the slice's n blocks of `count` elements lie side by side in the
                // scratch, which `run` holds until this returns.
                let (input, output) = unsafe {
                    (
                        std::slice::from_raw_parts(send, n * count),
                        std::slice::from_raw_parts_mut(recv, n * count),
                    )
                };
                for j in 0..n {
                    for e in 0..count {
                        // Block j of the slice is elements r of block j of the buffer.
                        assert_eq!(input[j * count + e] as usize, j * 5 + r.start + e);
                        // The collective's output: 100 + block * 10 + element of the call.
                        output[j * count + e] = (100 + j * 10 + r.start + e) as u8;
                    }
                }
                counts.push(count);
            }
            counts
        });
        assert_eq!(seen, vec![3, 2]);
        let want: Vec<u8> = (0..n * count)
            .map(|i| (100 + (i / count) * 10 + i % count) as u8)
            .collect();
        assert_eq!(recv, want, "every output block scattered back in place");
    }
}
