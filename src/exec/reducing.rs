//! The reductions of a step's receive-reduces, between the profile's reduce phase markers:
//! host bytes as they land ([`reduce_range`]), device pieces from a stage or from a
//! transport's lent memory ([`reduce_piece`]).

use ferroccl_kernels::{DataType, ElemOp};
use ferroccl_transport::{Fence, MemRef, Payload, PayloadMut, Result};

use crate::profile::{self, Phase};
use crate::reduce::Reducer;

/// Reduces `incoming`, bytes `from..from + incoming.len()` of a receive-reduce's message, with
/// the same bytes of `src` into `dst`.
pub(super) fn reduce_range(
    reducer: &dyn Reducer,
    dtype: DataType,
    op: ElemOp,
    src: *const u8,
    dst: *mut u8,
    incoming: &[u8],
    from: usize,
) -> Result<()> {
    profile::phase(Phase::Reduce);
    let r = reduce_bytes(reducer, dtype, op, src, dst, incoming, from);
    profile::phase(Phase::Drive);
    r
}

/// What a device receive-reduce reduces with.
#[derive(Clone, Copy)]
pub(super) struct With<'a> {
    pub reducer: &'a dyn Reducer,
    pub dtype: DataType,
    pub op: ElemOp,
}

/// Reduces `piece`, bytes `from..from + piece.len()` of a device receive-reduce's message
/// (in the transport's memory or a stage), with the same bytes of `src` into `dst`. `lent`:
/// the piece is a transport's own memory, lent (`Connection::recv_lent_device`), and the
/// reducer may queue the work and return the fence the transport waits for before it reuses
/// that memory ([`Reducer::reduce_queued`]); otherwise the work is done when this returns.
pub(super) fn reduce_piece(
    w: With<'_>,
    src: MemRef,
    dst: MemRef,
    from: usize,
    piece: Payload<'_>,
    lent: bool,
) -> Result<Option<Box<dyn Fence>>> {
    let n = piece.len();
    let d = PayloadMut::Device(dst.sub(from, n));
    let a = (src != dst).then(|| Payload::Device(src.sub(from, n)));
    profile::phase(Phase::Reduce);
    let r = if lent {
        w.reducer.reduce_queued(w.dtype, w.op, d, a, piece)
    } else {
        crate::reduce::reduce_now(w.reducer, w.dtype, w.op, d, a, piece).map(|()| None)
    };
    profile::phase(Phase::Drive);
    r
}

/// [`reduce_range`]'s work, outside the profile's reduce phase markers.
#[inline(always)]
fn reduce_bytes(
    reducer: &dyn Reducer,
    dtype: DataType,
    op: ElemOp,
    src: *const u8,
    dst: *mut u8,
    incoming: &[u8],
    from: usize,
) -> Result<()> {
    let n = incoming.len();
    if std::ptr::eq(src, dst) {
        // SAFETY: `dst..dst+len` is writable for the call and used by no other op of the step;
        // `from + n <= len`.
        let d = unsafe { std::slice::from_raw_parts_mut(dst.add(from), n) };
        reducer.reduce_inplace(dtype, op, PayloadMut::Host(d), Payload::Host(incoming))
    } else {
        // SAFETY: as above; `src` is a different, readable range of the same length that no op
        // of this step writes.
        let (d, s) = unsafe {
            (
                std::slice::from_raw_parts_mut(dst.add(from), n),
                std::slice::from_raw_parts(src.add(from), n),
            )
        };
        reducer.reduce(
            dtype,
            op,
            PayloadMut::Host(d),
            Payload::Host(s),
            Payload::Host(incoming),
        )
    }
}
