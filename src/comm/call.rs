//! One collective call: its arguments checked, then run on the engine.

use ferroccl_kernels::DataType;
use ferroccl_transport::{MemRef, MemSpace, PayloadMut};

use crate::coll::{CollArgs, CollKind};
use crate::exec::{DeviceArena, Engine, Memory, OpContext};
use crate::wire::{self, kind};
use crate::{Error, Result};

use super::*;

pub(super) fn header_kind(k: CollKind) -> u8 {
    match k {
        CollKind::AllReduce => kind::ALL_REDUCE,
        CollKind::Broadcast { .. } => kind::BROADCAST,
        CollKind::Reduce { .. } => kind::REDUCE,
        CollKind::AllGather => kind::ALL_GATHER,
        CollKind::ReduceScatter => kind::REDUCE_SCATTER,
        CollKind::AllToAll => kind::ALL_TO_ALL,
    }
}

/// A checked collective call, ready to run.
#[derive(Debug, Clone, Copy)]
pub(super) struct Call {
    name: &'static str,
    hkind: u8,
    args: CollArgs,
    dtype: DataType,
    op: ReduceOp,
    rank: usize,
    nranks: usize,
}

impl Call {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn check(
        inner: &Inner,
        name: &'static str,
        hkind: u8,
        kind: CollKind,
        send_len: Option<usize>,
        recv_len: usize,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<Call> {
        let (rank, n) = (inner.rank, inner.nranks);
        let bad = |what: String| {
            Err(Error::invalid_argument(format!(
                "{name} on rank {rank}: {what}"
            )))
        };
        if let Some(root) = kind.root() {
            if root >= n {
                return bad(format!("invalid root {root} (root must be 0..{})", n - 1));
            }
        }
        if let ReduceOp::PreMulSum(f) = op {
            if !f.is_finite() && kind.reduces() {
                return bad(format!("pre-multiplied sum scalar {f} is not finite"));
            }
        }
        let es = dtype.size();
        let total = |elems: usize| elems.checked_mul(n).and_then(|x| x.checked_mul(es));
        let Some(_) = total(count) else {
            return bad(format!("count {count} x {n} ranks overflows"));
        };
        let (in_len, out_len) = kind.buffer_lens(count, n);
        let (in_b, out_b) = (in_len * es, out_len * es);
        let is_root = kind.root() == Some(rank);
        match send_len {
            None => {
                let need = in_b.max(out_b);
                let reduce_nonroot = matches!(kind, CollKind::Reduce { .. }) && !is_root;
                if recv_len != need && !(reduce_nonroot && recv_len == in_b) {
                    return bad(format!(
                        "in-place buffer has {} elements, {} x {dtype} needed",
                        recv_len / es,
                        need / es
                    ));
                }
            }
            Some(s) => {
                let send_used = !matches!(kind, CollKind::Broadcast { .. }) || is_root;
                if send_used && s != in_b {
                    return bad(format!(
                        "send buffer has {} elements, {} x {dtype} needed",
                        s / es,
                        in_len
                    ));
                }
                let recv_used = !matches!(kind, CollKind::Reduce { .. }) || is_root;
                if recv_used && recv_len != out_b {
                    return bad(format!(
                        "receive buffer has {} elements, {} x {dtype} needed",
                        recv_len / es,
                        out_len
                    ));
                }
            }
        }
        if let Some(e) = inner.failed_error() {
            return Err(e);
        }
        Ok(Call {
            name,
            hkind,
            args: CollArgs {
                kind,
                count,
                in_place: send_len.is_none(),
            },
            dtype,
            op,
            rank,
            nranks: n,
        })
    }

    pub(super) fn run(
        &self,
        e: &mut Engine,
        seq: u64,
        mem: Memory,
        check_root: bool,
    ) -> Result<()> {
        self.run_in(e, seq, mem, check_root, None)
    }

    /// [`Call::run`] on buffers in `mem.space` (device memory needs `arena`; see
    /// [`Engine::run_collective_in`]).
    #[inline]
    pub(super) fn run_in(
        &self,
        e: &mut Engine,
        seq: u64,
        mem: Memory,
        check_root: bool,
        arena: Option<&mut (dyn DeviceArena + 'static)>,
    ) -> Result<()> {
        self.run_first_in(e, seq, mem, check_root, arena, None)
            .map(|_| ())
    }

    /// The buffers a rank does not use pointed at nothing (out of place: a broadcast's input
    /// off the root, a reduce's output off the root).
    fn unused_emptied(&self, mut mem: Memory) -> Memory {
        let is_root = self.args.kind.root() == Some(self.rank);
        if !mem.in_place {
            if matches!(self.args.kind, CollKind::Broadcast { .. }) && !is_root {
                mem.input_len = 0;
            }
            if matches!(self.args.kind, CollKind::Reduce { .. }) && !is_root {
                mem.output_len = 0;
            }
        }
        mem
    }

    /// [`Call::run_in`] for the first slice of a call cut into slices, `whole` the whole call
    /// and its buffers: the whole call is offered between the ranks' buffers
    /// ([`Engine::offer_whole`]); `Ok(true)` where it ran so, every slice of it done (`Avg`'s
    /// divide too), `Ok(false)` where this slice ran alone.
    pub(super) fn run_first_in(
        &self,
        e: &mut Engine,
        seq: u64,
        mem: Memory,
        check_root: bool,
        mut arena: Option<&mut (dyn DeviceArena + 'static)>,
        whole: Option<(&Call, Memory)>,
    ) -> Result<bool> {
        let reduces = self.args.kind.reduces();
        let ctx = OpContext {
            name: self.name,
            seq,
            rank: self.rank,
            kind: self.hkind,
            dtype: self.dtype,
            op: if reduces {
                self.op.code()
            } else {
                wire::op::NONE
            },
            count: self.args.count as u64,
            root: self.args.kind.root().map_or(u32::MAX, |r| r as u32),
        };
        let mem = self.unused_emptied(mem);
        let whole = whole.map(|(c, m)| (c, c.unused_emptied(m)));
        let premul = match self.op {
            ReduceOp::PreMulSum(f) if reduces => Some(f),
            _ => None,
        };
        if let Some(root) = self.args.kind.root().filter(|_| check_root) {
            e.agree_on_root(root, &ctx)?;
        }
        if let Some((c, m)) = whole {
            e.offer_whole(c.args.count, m);
        }
        let r = e.run_collective_in(
            &self.args,
            self.dtype,
            self.op.elem_op(),
            premul,
            mem,
            &ctx,
            arena.as_deref_mut(),
        );
        // Asked whatever the result: an offer no collective took is forgotten here.
        let ran_whole = e.ran_whole();
        r?;
        match whole {
            Some((c, m)) if ran_whole => c.divide_if_avg(e, m, arena)?,
            _ => self.divide_if_avg(e, mem, arena)?,
        }
        Ok(ran_whole)
    }

    /// `Avg`'s divide of this rank's output after the collective.
    fn divide_if_avg(
        &self,
        e: &mut Engine,
        mem: Memory,
        arena: Option<&mut (dyn DeviceArena + 'static)>,
    ) -> Result<()> {
        let reduces = self.args.kind.reduces();
        let is_root = self.args.kind.root() == Some(self.rank);
        if self.op == ReduceOp::Avg && reduces {
            let es = self.dtype.size();
            let (_, out_len) = self.args.kind.buffer_lens(self.args.count, self.nranks);
            let out_off = if mem.in_place {
                self.args
                    .kind
                    .in_place_offsets(self.args.count, self.rank)
                    .1
            } else {
                0
            };
            let writes = !matches!(self.args.kind, CollKind::Reduce { .. }) || is_root;
            if writes && out_len > 0 && mem.space != MemSpace::Host {
                let out = MemRef {
                    space: mem.space,
                    addr: mem.output as usize + out_off * es,
                    len: out_len * es,
                };
                let reducer = arena
                    .as_deref()
                    .map_or_else(|| e.shared_reducer(), |a| a.reducer());
                let n = self.nranks as u64;
                // A call still ordered on a stream (it went between the buffers and queued
                // its shares there) divides there too, after them.
                match arena.as_deref().and_then(|a| a.call_stream()) {
                    Some(on) => reducer.queue_divide(Some(on), self.dtype, out, n)?,
                    None => reducer.divide(self.dtype, PayloadMut::Device(out), n)?,
                }
            } else if writes && out_len > 0 {
                // SAFETY: the output (at `out_off` in the one buffer when in place) holds
                // `out_len` elements: `Call::check` verified the buffer lengths, and the
                // caller holds the buffer for the whole call.
                let out = unsafe {
                    std::slice::from_raw_parts_mut(mem.output.add(out_off * es), out_len * es)
                };
                e.reducer()
                    .divide(self.dtype, PayloadMut::Host(out), self.nranks as u64)?;
            }
        }
        Ok(())
    }
}
