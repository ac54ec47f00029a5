//! The collective calls: typed and untyped, blocking and asynchronous.

use std::sync::Arc;

use ferroccl_kernels::{as_bytes, as_bytes_mut, DataType, Element};

use crate::coll::CollKind;
use crate::exec::Memory;
use crate::wire::kind;
use crate::{Error, Result};

use super::*;

impl Communicator {
    /// Waits until every rank has called `barrier`.
    pub fn barrier(&self) -> Result<()> {
        let mut b = [1u8];
        self.run_blocking(
            "barrier",
            kind::BARRIER,
            CollKind::AllReduce,
            None,
            &mut b,
            1,
            DataType::Uint8,
            ReduceOp::Max,
        )
    }

    /// Checks that every rank names the same `root` for a rooted operation that is built from
    /// sends and receives (gather, scatter: header kind `hkind`), before any of its data moves.
    /// A mismatch fails the call on every rank.
    #[cfg(feature = "capi")]
    pub(crate) fn agree_on_root(
        &self,
        name: &'static str,
        hkind: u8,
        root: usize,
        count: usize,
        dtype: DataType,
    ) -> Result<()> {
        let inner = &self.inner;
        if root >= inner.nranks {
            return Err(Error::invalid_argument(format!(
                "{name} on rank {}: invalid root {root} (root must be 0..{})",
                inner.rank,
                inner.nranks - 1
            )));
        }
        if let Some(e) = inner.failed_error() {
            return Err(e);
        }
        if !inner.config.check_root {
            return Ok(());
        }
        inner.execute_next(true, |e, seq| {
            let ctx = crate::exec::OpContext {
                name,
                seq,
                rank: inner.rank,
                kind: hkind,
                dtype,
                op: crate::wire::op::NONE,
                count: count as u64,
                root: root as u32,
            };
            e.agree_on_root(root, &ctx)
        })
    }

    // ----- collectives on untyped buffers -----

    /// Runs collective `kind` on byte buffers holding `dtype` elements, `count` as NCCL counts
    /// it (see [`CollKind::buffer_lens`]). `send: None` means in place: `recv` is the one
    /// buffer, laid out as NCCL lays out in-place calls. For `broadcast`, `send` is read on the
    /// root only; for `reduce`, `recv` is written on the root only (elsewhere it may be empty).
    /// `op` is ignored by collectives that do not reduce.
    pub fn raw_collective(
        &self,
        kind: CollKind,
        send: Option<&[u8]>,
        recv: &mut [u8],
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        self.run_blocking(
            kind.name(),
            header_kind(kind),
            kind,
            send,
            recv,
            count,
            dtype,
            op,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn run_blocking(
        &self,
        name: &'static str,
        hkind: u8,
        kind: CollKind,
        send: Option<&[u8]>,
        recv: &mut [u8],
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let _call = crate::profile::call();
        // Stream jobs queued earlier run first, on every rank alike.
        self.streams.drain_if_used();
        blocking_on(&self.inner, name, hkind, kind, send, recv, count, dtype, op)
    }

    // ----- typed collectives -----

    /// Every rank's `recv` becomes the reduction (`op`) of all ranks' `send`.
    ///
    /// ```
    /// use ferroccl::{Communicator, Config, ReduceOp};
    /// let comms = Communicator::local_group(2, Config::default()).unwrap();
    /// std::thread::scope(|s| {
    ///     for c in &comms {
    ///         s.spawn(move || {
    ///             let send = [c.rank() as f32 + 1.0; 4];
    ///             let mut recv = [0f32; 4];
    ///             c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
    ///             assert_eq!(recv, [3.0; 4]);
    ///         });
    ///     }
    /// });
    /// ```
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        self.raw_collective(
            CollKind::AllReduce,
            Some(as_bytes(send)),
            as_bytes_mut(recv),
            send.len(),
            T::DTYPE,
            op,
        )
    }

    /// [`Communicator::all_reduce`] in place.
    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let n = buf.len();
        self.raw_collective(
            CollKind::AllReduce,
            None,
            as_bytes_mut(buf),
            n,
            T::DTYPE,
            op,
        )
    }

    /// Every rank's `buf` becomes the root's `buf`.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let n = buf.len();
        self.raw_collective(
            CollKind::Broadcast { root },
            None,
            as_bytes_mut(buf),
            n,
            T::DTYPE,
            ReduceOp::Sum,
        )
    }

    /// Every rank's `recv` becomes the root's `send` (`send` is read on the root only).
    pub fn broadcast_from<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        root: usize,
    ) -> Result<()> {
        let n = recv.len();
        self.raw_collective(
            CollKind::Broadcast { root },
            Some(as_bytes(send)),
            as_bytes_mut(recv),
            n,
            T::DTYPE,
            ReduceOp::Sum,
        )
    }

    /// The root's `recv` becomes the reduction of all ranks' `send` (`recv` is ignored, and may
    /// be empty, elsewhere).
    pub fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.raw_collective(
            CollKind::Reduce { root },
            Some(as_bytes(send)),
            as_bytes_mut(recv),
            send.len(),
            T::DTYPE,
            op,
        )
    }

    /// [`Communicator::reduce`] in place: the root's `buf` becomes the result; other ranks'
    /// `buf` is left as it was.
    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let n = buf.len();
        self.raw_collective(
            CollKind::Reduce { root },
            None,
            as_bytes_mut(buf),
            n,
            T::DTYPE,
            op,
        )
    }

    /// `recv` (of `nranks × send.len()` elements) becomes every rank's `send`, in rank order.
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.raw_collective(
            CollKind::AllGather,
            Some(as_bytes(send)),
            as_bytes_mut(recv),
            send.len(),
            T::DTYPE,
            ReduceOp::Sum,
        )
    }

    /// [`Communicator::all_gather`] in place: this rank's input is block `rank` of `buf`.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let count = self.block_count("all_gather", buf.len())?;
        self.raw_collective(
            CollKind::AllGather,
            None,
            as_bytes_mut(buf),
            count,
            T::DTYPE,
            ReduceOp::Sum,
        )
    }

    /// `recv` becomes block `rank` (of `recv.len()` elements) of the reduction of all ranks'
    /// `send` (of `nranks × recv.len()` elements).
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let n = recv.len();
        self.raw_collective(
            CollKind::ReduceScatter,
            Some(as_bytes(send)),
            as_bytes_mut(recv),
            n,
            T::DTYPE,
            op,
        )
    }

    /// [`Communicator::reduce_scatter`] in place: the result lands in block `rank` of `buf`.
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let count = self.block_count("reduce_scatter", buf.len())?;
        self.raw_collective(
            CollKind::ReduceScatter,
            None,
            as_bytes_mut(buf),
            count,
            T::DTYPE,
            op,
        )
    }

    /// Block `p` of `send` goes to rank `p`, which stores it as block `rank` of its `recv`.
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let count = self.block_count("all_to_all", send.len())?;
        self.raw_collective(
            CollKind::AllToAll,
            Some(as_bytes(send)),
            as_bytes_mut(recv),
            count,
            T::DTYPE,
            ReduceOp::Sum,
        )
    }

    /// [`Communicator::all_to_all`] in place.
    pub fn all_to_all_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let count = self.block_count("all_to_all", buf.len())?;
        self.raw_collective(
            CollKind::AllToAll,
            None,
            as_bytes_mut(buf),
            count,
            T::DTYPE,
            ReduceOp::Sum,
        )
    }

    fn block_count(&self, name: &str, len: usize) -> Result<usize> {
        let n = self.inner.nranks;
        if !len.is_multiple_of(n) {
            return Err(Error::invalid_argument(format!(
                "{name} on rank {}: buffer of {len} elements is not a multiple of nranks {n}",
                self.inner.rank
            )));
        }
        Ok(len / n)
    }

    /// Sends `buf` to `peer` (which calls [`Communicator::recv`]).
    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        let mut g = self.group();
        g.send(buf, peer);
        g.run()
    }

    /// Receives from `peer` into `buf`, whose length must equal what `peer` sends.
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        let mut g = self.group();
        g.recv(buf, peer);
        g.run()
    }

    /// Starts a group of sends and receives that run together when [`Group::run`] is called
    /// (NCCL's `ncclGroupStart`/`ncclGroupEnd`): pairs inside one group never deadlock.
    pub fn group(&self) -> Group<'_> {
        Group::new(self)
    }

    // ----- asynchronous collectives -----

    fn submit<B: Send + 'static>(
        &self,
        call: Call,
        in_place: bool,
        mut bufs: B,
        ptrs: fn(&mut B) -> (*const u8, usize, *mut u8, usize),
    ) -> Result<Work<B>> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        // Stream jobs queued earlier take their turns first, on every rank alike.
        self.streams.drain_if_used();
        let ticket = self.inner.ticket();
        let inner = Arc::clone(&self.inner);
        let job = Box::new(move || {
            let (ip, il, op, ol) = ptrs(&mut bufs);
            let mem = Memory {
                input: ip,
                input_len: il,
                output: op,
                output_len: ol,
                in_place,
                space: ferroccl_transport::MemSpace::Host,
            };
            let r = inner.execute(ticket, |e| {
                let seq = e.next_seq();
                call.run(e, seq, mem, inner.config.check_root)
            });
            let _ = tx.send((r, bufs));
        });
        match self.worker()?.as_ref() {
            Some(w) => w.submit(job)?,
            None => return Err(Error::internal("no progress thread")),
        }
        Ok(Work::new(rx))
    }

    /// [`Communicator::all_reduce_in_place`] on the progress thread: returns at once; the
    /// buffer comes back from [`Work::wait`] holding the result.
    pub fn all_reduce_async<T: Element, B: AsMut<[T]> + Send + 'static>(
        &self,
        mut buf: B,
        op: ReduceOp,
    ) -> Result<Work<B>> {
        let n = buf.as_mut().len();
        let call = Call::check(
            &self.inner,
            "all_reduce",
            kind::ALL_REDUCE,
            CollKind::AllReduce,
            None,
            n * T::DTYPE.size(),
            n,
            T::DTYPE,
            op,
        )?;
        self.submit(call, true, buf, |b| {
            let s = as_bytes_mut(b.as_mut());
            (s.as_ptr(), 0, s.as_mut_ptr(), s.len())
        })
    }

    /// [`Communicator::broadcast`] on the progress thread.
    pub fn broadcast_async<T: Element, B: AsMut<[T]> + Send + 'static>(
        &self,
        mut buf: B,
        root: usize,
    ) -> Result<Work<B>> {
        let n = buf.as_mut().len();
        let k = CollKind::Broadcast { root };
        let call = Call::check(
            &self.inner,
            "broadcast",
            kind::BROADCAST,
            k,
            None,
            n * T::DTYPE.size(),
            n,
            T::DTYPE,
            ReduceOp::Sum,
        )?;
        self.submit(call, true, buf, |b| {
            let s = as_bytes_mut(b.as_mut());
            (s.as_ptr(), 0, s.as_mut_ptr(), s.len())
        })
    }

    /// [`Communicator::all_gather`] on the progress thread; `(send, recv)` come back.
    pub fn all_gather_async<
        T: Element,
        S: AsRef<[T]> + Send + 'static,
        R: AsMut<[T]> + Send + 'static,
    >(
        &self,
        send: S,
        mut recv: R,
    ) -> Result<Work<(S, R)>> {
        let n = send.as_ref().len();
        let es = T::DTYPE.size();
        let call = Call::check(
            &self.inner,
            "all_gather",
            kind::ALL_GATHER,
            CollKind::AllGather,
            Some(n * es),
            recv.as_mut().len() * es,
            n,
            T::DTYPE,
            ReduceOp::Sum,
        )?;
        self.submit(call, false, (send, recv), |(s, r)| {
            let s = as_bytes(s.as_ref());
            let r = as_bytes_mut(r.as_mut());
            (s.as_ptr(), s.len(), r.as_mut_ptr(), r.len())
        })
    }

    /// [`Communicator::reduce_scatter`] on the progress thread; `(send, recv)` come back.
    pub fn reduce_scatter_async<
        T: Element,
        S: AsRef<[T]> + Send + 'static,
        R: AsMut<[T]> + Send + 'static,
    >(
        &self,
        send: S,
        mut recv: R,
        op: ReduceOp,
    ) -> Result<Work<(S, R)>> {
        let n = recv.as_mut().len();
        let es = T::DTYPE.size();
        let call = Call::check(
            &self.inner,
            "reduce_scatter",
            kind::REDUCE_SCATTER,
            CollKind::ReduceScatter,
            Some(send.as_ref().len() * es),
            n * es,
            n,
            T::DTYPE,
            op,
        )?;
        self.submit(call, false, (send, recv), |(s, r)| {
            let s = as_bytes(s.as_ref());
            let r = as_bytes_mut(r.as_mut());
            (s.as_ptr(), s.len(), r.as_mut_ptr(), r.len())
        })
    }
}

/// A blocking collective on `inner` (the body of `Communicator::raw_collective`, which the
/// stream jobs call on the queue's thread).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn blocking_on(
    inner: &Inner,
    name: &'static str,
    hkind: u8,
    kind: CollKind,
    send: Option<&[u8]>,
    recv: &mut [u8],
    count: usize,
    dtype: DataType,
    op: ReduceOp,
) -> Result<()> {
    let call = Call::check(
        inner,
        name,
        hkind,
        kind,
        send.map(<[u8]>::len),
        recv.len(),
        count,
        dtype,
        op,
    )?;
    let mem = Memory::host(send, recv);
    inner.execute_next(true, |e, seq| {
        call.run(e, seq, mem, inner.config.check_root)
    })
}
