//! Reduction as its own axis: every element-wise step the executor and the communicator take.
//!
//! | step                 | [`Reducer`] method           | used for                              |
//! |----------------------|------------------------------|---------------------------------------|
//! | `dst = a op b`       | [`Reducer::reduce`]          | receive-reduce out of place            |
//! | `dst = dst op src`   | [`Reducer::reduce_inplace`]  | receive-reduce in place                |
//! | `dst = src * factor` | [`Reducer::scale_into`]      | pre-multiplied sums (`PreMulSum`)      |
//! | `buf = buf / n`      | [`Reducer::divide`]          | `Avg`'s divide by the number of ranks  |
//! | `dst = src`          | [`Reducer::copy`]            | a schedule's local copies              |
//! | `dsts = op(srcs)`    | [`Reducer::queue_many`]      | collectives between ranks' buffers (device), with the stream steps below |
//!
//! Operands are typed memory ([`Payload`] / [`PayloadMut`]: host slices, or a device
//! [`ferroccl_transport::MemRef`]), so that each implementation says which [`MemSpace`]s it
//! serves and rejects the others with an error rather than touching memory it cannot reach.
//! [`HostReducer`] runs the host SIMD kernels of `ferroccl-kernels`; `CudaReducer` (cuda.rs)
//! runs the NVRTC-compiled kernels of `ferroccl-cuda` on device memory. The executor and the communicator call kernels only through a reducer.

mod cuda;
mod host;

use std::fmt;

use ferroccl_kernels::{DataType, ElemOp};
use ferroccl_transport::{Fence, MemRef, MemSpace, Payload, PayloadMut, Result};

pub(crate) use cuda::{peer_reach, CudaReducer};
pub(crate) use host::HostReducer;

/// Element-wise steps on typed memory. Every method checks that its operands lie in a space it
/// serves ([`Reducer::serves`]) and have the lengths the step needs, and returns an error
/// otherwise; none of them blocks on a peer.
pub(crate) trait Reducer: Send + Sync + fmt::Debug {
    /// Name for errors and logs (`host`, `cuda`).
    fn name(&self) -> &'static str;

    /// Whether operands in `space` may be handed to this reducer.
    fn serves(&self, space: MemSpace) -> bool;

    /// `dst[i] = a[i] op b[i]`; all three the same length, a multiple of the element size.
    fn reduce(
        &self,
        dtype: DataType,
        op: ElemOp,
        dst: PayloadMut<'_>,
        a: Payload<'_>,
        b: Payload<'_>,
    ) -> Result<()>;

    /// `dst[i] = dst[i] op src[i]`.
    fn reduce_inplace(
        &self,
        dtype: DataType,
        op: ElemOp,
        dst: PayloadMut<'_>,
        src: Payload<'_>,
    ) -> Result<()>;

    /// `dst[i] = src[i] * factor` (pre-multiplied sums; integers round the factor toward zero).
    fn scale_into(
        &self,
        dtype: DataType,
        dst: PayloadMut<'_>,
        src: Payload<'_>,
        factor: f64,
    ) -> Result<()>;

    /// `buf[i] = buf[i] / n` (`Avg` over `n` ranks; integers truncate toward zero).
    fn divide(&self, dtype: DataType, buf: PayloadMut<'_>, n: u64) -> Result<()>;

    /// `dst = src`, same length.
    fn copy(&self, dst: PayloadMut<'_>, src: Payload<'_>) -> Result<()>;

    /// [`Reducer::reduce`] (`dst = a op b`), or [`Reducer::reduce_inplace`] where `a` is
    /// `None` (`dst = dst op b`), for a transport's lent memory `b`
    /// (`Connection::recv_lent_device`): where [`queued_reductions`] is on, it may return
    /// before the work is done, with a fence that says when it is ([`Reducer::queue`]);
    /// `None`: done.
    fn reduce_queued(
        &self,
        dtype: DataType,
        op: ElemOp,
        dst: PayloadMut<'_>,
        a: Option<Payload<'_>>,
        b: Payload<'_>,
    ) -> Result<Option<Box<dyn Fence>>> {
        if queued_reductions() {
            self.queue(dtype, op, dst, a, b)
        } else {
            reduce_now(self, dtype, op, dst, a, b).map(|()| None)
        }
    }

    /// Whether [`Reducer::queue_many`] and the stream steps after it run (device reducers: one
    /// reduce-copy kernel on a stream, events).
    fn reduces_many(&self) -> bool {
        false
    }

    /// Whether a [`Reducer::queue_many`] on device memory `from` may also read and write
    /// memory `to`: the same memory, or another device of this process that `from`'s device
    /// reaches directly (CUDA peer access). A property of the process's devices: every reducer
    /// of the process gives the same answer for a pair, every time (the ranks of a collective
    /// between their buffers each ask it of every pair and must agree).
    fn reaches(&self, from: MemSpace, to: MemSpace) -> bool {
        from == to
    }

    /// Whether device memory `m` of this reducer's device is reachable from another device
    /// wherever [`Reducer::reaches`] says that device reaches this one: CUDA peer access covers
    /// memory of `cuMemAlloc`, not memory of a pool or mapped with `cuMemMap` (PyTorch's
    /// expandable segments), which a kernel of another device cannot read.
    fn peer_mappable(&self, _m: MemRef) -> bool {
        true
    }

    /// Queues `dst[i] = src_0[i] op src_1[i] op ...` for every `dst` in `dsts`, in one pass,
    /// every source first multiplied by `premul` where given, on stream `on` (a caller's
    /// stream of this reducer's device; `None`: the reducer's own), and returns once it is
    /// queued: the destinations hold it once the stream has run it ([`Reducer::synchronize`],
    /// or a [`Reducer::mark`] after it). All operands the same length; a destination may be a
    /// source (the same memory, not overlapping otherwise): every element of every source is
    /// read before that element is written. At most 8 sources and 8 destinations, each on
    /// this reducer's device or one it [`Reducer::reaches`]; the caller keeps them live until
    /// the stream has run it. Reducers without it refuse, as they refuse the steps below.
    fn queue_many(
        &self,
        on: Option<usize>,
        dtype: DataType,
        op: ElemOp,
        dsts: &[MemRef],
        srcs: &[MemRef],
        premul: Option<f64>,
    ) -> Result<()> {
        let _ = (on, dtype, op, dsts, srcs, premul);
        Err(no_streams(self.name()))
    }

    /// Queues `buf[i] = buf[i] / n` (as [`Reducer::divide`]) on stream `on` (`None`: the
    /// reducer's own) and returns once it is queued: `Avg`'s divide of a call ordered on a
    /// stream, after its shares.
    fn queue_divide(&self, on: Option<usize>, dtype: DataType, buf: MemRef, n: u64) -> Result<()> {
        let _ = (on, dtype, buf, n);
        Err(no_streams(self.name()))
    }

    /// Records this reducer's mark `which` at the current end of stream `on` (`None`: its own),
    /// replacing where it was recorded before: another rank's stream can then be made to wait
    /// for the work queued before it ([`Reducer::wait_mark`], with any reducer of this process).
    fn mark(&self, on: Option<usize>, which: MarkUse) -> Result<Mark> {
        let _ = (on, which);
        Err(no_streams(self.name()))
    }

    /// Makes work queued on stream `on` (`None`: the reducer's own) after this call wait for
    /// `mark` (recorded by any reducer of this process, on any stream); [`NO_MARK`] waits for
    /// nothing. Does not block the host.
    fn wait_mark(&self, on: Option<usize>, mark: Mark) -> Result<()> {
        let _ = (on, mark);
        Err(no_streams(self.name()))
    }

    /// Makes this reducer's two marks waitable from other processes too (interprocess events,
    /// made at the first call and never destroyed, as the marks are not), and returns the
    /// words another process's reducer opens them from ([`Reducer::open_marks`]).
    fn share_marks(&self) -> Result<SharedMarkWords> {
        Err(no_shared(self.name()))
    }

    /// Opens the shared marks of a reducer of another process from its words, or of another
    /// reducer of this process (a rank of this process among others' ranks).
    fn open_marks(&self, words: &SharedMarkWords) -> Result<PeerMarks> {
        let _ = words;
        Err(no_shared(self.name()))
    }

    /// Records shared mark `which` ([`Reducer::share_marks`]) at the current end of stream
    /// `on` (`None`: its own), replacing where it was recorded before; returns the word that
    /// names this record to a waiter of another process (never 0).
    fn mark_shared(&self, on: Option<usize>, which: MarkUse) -> Result<u64> {
        let _ = (on, which);
        Err(no_shared(self.name()))
    }

    /// Makes work queued on stream `on` (`None`: the reducer's own) after this call wait for
    /// the record `word` of another process's shared mark `which` (opened as `peer`), which
    /// was made before this call. Does not block the host.
    fn wait_shared(
        &self,
        on: Option<usize>,
        peer: &PeerMarks,
        which: MarkUse,
        word: u64,
    ) -> Result<()> {
        let _ = (on, peer, which, word);
        Err(no_shared(self.name()))
    }

    /// Marks the current end of stream `on` (`None`: the reducer's own) as what
    /// [`Reducer::settle_shared`] waits for: after a call's share, its `Done` record and its
    /// waits for the other ranks' marks, so that a settled rank's streams hold no wait for
    /// another rank's marks.
    fn mark_settled(&self, on: Option<usize>) -> Result<()> {
        let _ = on;
        Ok(())
    }

    /// Lets go of the shared marks ([`Reducer::share_marks`]) and of the other ranks' it
    /// opened (`peers`) once no stream of any rank can wait for them: every rank settled, and
    /// the ranks agreed on that after (the last window's deregistration). A later share makes
    /// new ones.
    fn release_shared(&self, peers: &[Option<PeerMarks>]) -> Result<()> {
        let _ = peers;
        Ok(())
    }

    /// Waits on the host until every stream with a settle point of this reducer
    /// ([`Reducer::mark_settled`]) has got to its last (every share queued before, and its
    /// waits for the other ranks, are done); an error after `limit` (a stream held by another
    /// process's mark that never comes).
    fn settle_shared(&self, limit: std::time::Duration) -> Result<()> {
        let _ = limit;
        Ok(())
    }

    /// [`Reducer::synchronize`], an error after `limit` instead of waiting on (a stream that
    /// waits for another process's mark).
    fn synchronize_within(&self, on: Option<usize>, limit: std::time::Duration) -> Result<()> {
        let _ = limit;
        self.synchronize(on)
    }

    /// Waits until stream `on` (`None`: the reducer's own) has run everything queued on it.
    fn synchronize(&self, on: Option<usize>) -> Result<()> {
        let _ = on;
        Err(no_streams(self.name()))
    }

    /// Lets `held` go once stream `on` has run the work queued on it so far (what keeps a
    /// stream-ordered call's buffers alive); returns at once.
    fn release_after(&self, on: usize, held: Box<dyn std::any::Any + Send>) -> Result<()> {
        let _ = (on, held);
        Err(no_streams(self.name()))
    }

    /// [`Reducer::reduce_queued`]'s queued form. The default runs it to the end; the CUDA
    /// reducer queues the kernel and returns a mark of its stream.
    fn queue(
        &self,
        dtype: DataType,
        op: ElemOp,
        dst: PayloadMut<'_>,
        a: Option<Payload<'_>>,
        b: Payload<'_>,
    ) -> Result<Option<Box<dyn Fence>>> {
        reduce_now(self, dtype, op, dst, a, b).map(|()| None)
    }
}

/// A point of a stream that another stream can be made to wait for (an event recorded
/// there): two words whose meaning is the reducer's that recorded it.
pub(crate) type Mark = [u64; 2];

/// The mark that waits for nothing (a call whose buffers were ready when it was made).
pub(crate) const NO_MARK: Mark = [0, 0];

/// Which of a reducer's marks: each is one event, recorded again by every call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MarkUse {
    /// The end of the work the caller queued before a call.
    Ready,
    /// The end of a rank's share of a call.
    Done,
}

/// Words of a reducer's shared marks ([`Reducer::share_marks`]): two 64-byte handles.
pub(crate) const SHARED_MARK_WORDS: usize = 16;

/// What another process opens a reducer's shared marks from.
pub(crate) type SharedMarkWords = [u64; SHARED_MARK_WORDS];

/// Another process's shared marks, opened here ([`Reducer::open_marks`]): what they are is
/// the opening reducer's.
pub(crate) struct PeerMarks(pub Box<dyn std::any::Any + Send + Sync>);

impl std::fmt::Debug for PeerMarks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerMarks")
    }
}

fn no_shared(name: &str) -> ferroccl_transport::Error {
    ferroccl_transport::Error::new(
        ferroccl_transport::ErrorKind::Unsupported,
        format!("the {name} reducer has no marks another process can wait for"),
    )
}

fn no_streams(name: &str) -> ferroccl_transport::Error {
    ferroccl_transport::Error::internal(format!(
        "the {name} reducer does not reduce many buffers in one pass on a stream"
    ))
}

/// The checks every [`Reducer::queue_many`] makes before touching memory: 1 to 8 sources,
/// 1 to 8 destinations, one length for all, a whole number of `dtype` elements. Returns that
/// length in bytes; `who` names the reducer in the error.
pub(crate) fn many_len(
    who: &str,
    dtype: DataType,
    dsts: &[MemRef],
    srcs: &[MemRef],
) -> Result<usize> {
    let (ns, nd) = (srcs.len(), dsts.len());
    if !(1..=ferroccl_cuda::MAX_SRCS).contains(&ns) || !(1..=ferroccl_cuda::MAX_DSTS).contains(&nd)
    {
        return Err(ferroccl_transport::Error::internal(format!(
            "{who}: {ns} sources and {nd} destinations in one reduce-copy (1 to {} each)",
            ferroccl_cuda::MAX_SRCS
        )));
    }
    let len = srcs[0].len;
    if let Some(m) = srcs.iter().chain(dsts).find(|m| m.len != len) {
        return Err(ferroccl_transport::Error::internal(format!(
            "{who}: operand lengths differ ({len} and {} bytes)",
            m.len
        )));
    }
    if !len.is_multiple_of(dtype.size()) {
        return Err(ferroccl_transport::Error::internal(format!(
            "{who}: {len} bytes is not a whole number of {dtype} elements"
        )));
    }
    Ok(len)
}

/// [`Reducer::reduce_queued`]'s work, run to the end.
pub(crate) fn reduce_now<R: Reducer + ?Sized>(
    r: &R,
    dtype: DataType,
    op: ElemOp,
    dst: PayloadMut<'_>,
    a: Option<Payload<'_>>,
    b: Payload<'_>,
) -> Result<()> {
    match a {
        Some(a) => r.reduce(dtype, op, dst, a, b),
        None => r.reduce_inplace(dtype, op, dst, b),
    }
}

/// `FERRO_P2P_QUEUED_REDUCE=1`: reductions straight from the p2p transport's slots are queued
/// on the reducer's stream and not waited for; each slot goes back to its sender once its
/// kernel is done, so the rank drives its sends and its next slots meanwhile. Off by default
/// (read once per process).
pub(crate) fn queued_reductions() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("FERRO_P2P_QUEUED_REDUCE").is_ok_and(|v| v.trim() == "1"))
}
