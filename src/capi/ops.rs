//! Operations issued through the C API and their argument checks; `run.rs` runs them on a
//! communicator over raw host pointers.

use std::ffi::c_int;
use std::sync::Arc;

use ferroccl_kernels::{DataType, Fp8E4M3, Fp8E5M2};

use super::comm::Shared;
use super::stream::{self, OnStream};
use super::types::*;
use crate::coll::CollKind;
use crate::{Error, ReduceOp, Result};

/// A pre-multiplied sum made by `ncclRedOpCreatePreMulSum`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PreMul {
    /// The element type the operation was made for.
    pub dtype: DataType,
    /// Where the scalar is.
    pub scalar: Scalar,
}

/// The scalar of a pre-multiplied sum.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Scalar {
    /// Read when the operation was made.
    Value(f64),
    /// Read from this address each time an operation runs (`ncclScalarDevice`).
    At(*const u8),
}

// SAFETY: the address is only read, while an operation using it runs; NCCL's contract makes
// the caller keep it valid until the operation is destroyed.
unsafe impl Send for Scalar {}

/// The reduction of a collective.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Reduction {
    /// A built-in operation, or a pre-multiplied sum with its scalar known.
    Op(ReduceOp),
    /// A pre-multiplied sum whose scalar is read when it runs.
    ScalarAt(*const u8, DataType),
}

/// Reads one element of `dtype` at `p` as `f64`.
///
/// # Safety
/// `p` points to a readable element of `dtype` (any alignment).
pub(crate) unsafe fn read_scalar(p: *const u8, dtype: DataType) -> f64 {
    let mut b = [0u8; 8];
    // SAFETY: the caller guarantees `dtype.size()` (at most 8) readable bytes at `p`.
    unsafe { std::ptr::copy_nonoverlapping(p, b.as_mut_ptr(), dtype.size()) };
    let b2 = [b[0], b[1]];
    let b4 = [b[0], b[1], b[2], b[3]];
    match dtype {
        DataType::Int8 => f64::from(b[0] as i8),
        DataType::Uint8 => f64::from(b[0]),
        DataType::Int32 => f64::from(i32::from_ne_bytes(b4)),
        DataType::Uint32 => f64::from(u32::from_ne_bytes(b4)),
        DataType::Int64 => i64::from_ne_bytes(b) as f64,
        DataType::Uint64 => u64::from_ne_bytes(b) as f64,
        DataType::Float16 => half::f16::from_ne_bytes(b2).to_f64(),
        DataType::Bfloat16 => half::bf16::from_ne_bytes(b2).to_f64(),
        DataType::Float32 => f64::from(f32::from_ne_bytes(b4)),
        DataType::Float64 => f64::from_ne_bytes(b),
        DataType::Float8E4M3 => f64::from(Fp8E4M3::from_bits(b[0]).to_f32()),
        DataType::Float8E5M2 => f64::from(Fp8E5M2::from_bits(b[0]).to_f32()),
    }
}

/// A collective with a root that ferroccl builds from sends and receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rooted {
    /// The root receives every rank's block, in rank order.
    Gather,
    /// The root sends block `p` to rank `p`.
    Scatter,
}

/// One operation issued on a communicator, waiting to run.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    /// A collective ferroccl runs as one schedule.
    Coll {
        api: &'static str,
        kind: CollKind,
        send: *const u8,
        recv: *mut u8,
        count: usize,
        dtype: DataType,
        red: Reduction,
        /// A non-NULL stream: the buffers are device memory (`super::stream`).
        on: Option<OnStream>,
    },
    /// Gather or scatter, from point-to-point operations.
    Rooted {
        api: &'static str,
        which: Rooted,
        root: usize,
        send: *const u8,
        recv: *mut u8,
        count: usize,
        dtype: DataType,
        on: Option<OnStream>,
    },
    /// `ncclSend`.
    Send {
        buf: *const u8,
        count: usize,
        dtype: DataType,
        peer: usize,
        on: Option<OnStream>,
    },
    /// `ncclRecv`.
    Recv {
        buf: *mut u8,
        count: usize,
        dtype: DataType,
        peer: usize,
        on: Option<OnStream>,
    },
    /// `ncclCommSplit`: makes `child` ready (or failed); `None` for `NCCL_SPLIT_NOCOLOR`.
    Split {
        color: Option<u32>,
        key: i64,
        child: Option<Arc<Shared>>,
    },
}

// SAFETY: the pointers are the caller's buffers, which NCCL's contract keeps valid and
// untouched by the caller until the operation completes (its call returns, or
// ncclCommGetAsyncError stops reporting ncclInProgress); the thread that runs the operation is
// the only one using them meanwhile.
unsafe impl Send for Op {}

fn invalid(api: &str, what: impl std::fmt::Display) -> Error {
    Error::invalid_argument(format!("{api}: {what}"))
}

/// The data type with NCCL code `v`.
pub(crate) fn dtype_arg(api: &str, v: ncclDataType_t) -> Result<DataType> {
    DataType::from_nccl(i64::from(v)).ok_or_else(|| {
        invalid(
            api,
            format!(
                "invalid data type {v} (valid: 0..{}, see ncclDataType_t)",
                ncclNumTypes - 1
            ),
        )
    })
}

/// The reduction with NCCL code `op` on `shared`, for elements of `dtype`.
pub(crate) fn reduction_arg(
    api: &str,
    shared: &Shared,
    op: ncclRedOp_t,
    dtype: DataType,
) -> Result<Reduction> {
    let fixed = match op {
        ncclSum => ReduceOp::Sum,
        ncclProd => ReduceOp::Prod,
        ncclMax => ReduceOp::Max,
        ncclMin => ReduceOp::Min,
        ncclAvg => ReduceOp::Avg,
        _ => {
            let made = usize::try_from(op - ncclNumOps)
                .ok()
                .and_then(|i| shared.redops.lock().ok()?.get(i).copied().flatten());
            let Some(p) = made else {
                return Err(invalid(
                    api,
                    format!(
                        "invalid reduction operation {op} (built-in: 0..{}; others come from \
                         ncclRedOpCreatePreMulSum on this communicator)",
                        ncclNumOps - 1
                    ),
                ));
            };
            if p.dtype != dtype {
                return Err(invalid(
                    api,
                    format!(
                        "reduction operation {op} was made for data type {} but the call uses {}",
                        p.dtype as c_int, dtype as c_int
                    ),
                ));
            }
            return Ok(match p.scalar {
                Scalar::Value(f) => Reduction::Op(ReduceOp::PreMulSum(f)),
                Scalar::At(ptr) => Reduction::ScalarAt(ptr, dtype),
            });
        }
    };
    Ok(Reduction::Op(fixed))
}

/// A root or peer argument.
pub(crate) fn rank_arg(api: &str, what: &str, v: c_int) -> Result<usize> {
    usize::try_from(v).map_err(|_| invalid(api, format!("invalid {what} {v} (must be >= 0)")))
}

fn check_rank(api: &str, what: &str, v: usize, nranks: usize) -> Result<()> {
    if v >= nranks {
        return Err(invalid(
            api,
            format!("invalid {what} {v} ({what} must be 0..{})", nranks - 1),
        ));
    }
    Ok(())
}

/// `count × mult` elements of `dtype` in bytes, if that fits a buffer.
fn bytes_of(api: &str, count: usize, mult: usize, dtype: DataType) -> Result<usize> {
    count
        .checked_mul(mult)
        .and_then(|n| n.checked_mul(dtype.size()))
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| {
            invalid(
                api,
                format!(
                    "count {count} x {mult} elements of {} bytes overflows the address space",
                    dtype.size()
                ),
            )
        })
}

/// The buffers of the sends and receives among `ops`: (address, bytes, written).
pub(crate) fn p2p_spans(ops: &[Op]) -> Vec<(*const u8, usize, bool)> {
    ops.iter()
        .filter_map(|op| match *op {
            Op::Send {
                buf, count, dtype, ..
            } => Some((buf, count * dtype.size(), false)),
            Op::Recv {
                buf, count, dtype, ..
            } => Some((buf.cast_const(), count * dtype.size(), true)),
            _ => None,
        })
        .collect()
}

/// Refuses a group of sends and receives where a receive buffer overlaps another buffer of
/// the group: `spans` are each buffer's (address, bytes, written), `what` names them
/// ("buffers", "device buffers").
pub(crate) fn refuse_overlaps(what: &str, spans: &[(*const u8, usize, bool)]) -> Result<()> {
    for (i, a) in spans.iter().enumerate() {
        for b in &spans[i + 1..] {
            if (a.2 || b.2) && overlaps(a.0, a.1, b.0, b.1) {
                return Err(Error::invalid_argument(format!(
                    "ncclGroupEnd: {what} {:p} ({} bytes) and {:p} ({} bytes) of one group \
                     overlap and one of them is a receive buffer",
                    a.0, a.1, b.0, b.1
                )));
            }
        }
    }
    Ok(())
}

pub(crate) fn overlaps(a: *const u8, alen: usize, b: *const u8, blen: usize) -> bool {
    let (a, b) = (a as usize, b as usize);
    alen > 0 && blen > 0 && a < b.saturating_add(blen) && b < a.saturating_add(alen)
}

fn non_null(api: &str, name: &str, p: *const u8) -> Result<()> {
    if p.is_null() {
        return Err(invalid(api, format!("{name} is NULL")));
    }
    Ok(())
}

/// How a collective uses its buffers on one rank, after the checks.
#[derive(Debug)]
pub(crate) enum Layout {
    /// Nothing to do (count 0).
    Empty,
    /// One buffer (`send: None` to ferroccl).
    InPlace { buf: *mut u8, len: usize },
    /// Separate buffers; a length of 0 means the buffer is not used on this rank.
    Apart {
        send: *const u8,
        send_len: usize,
        recv: *mut u8,
        recv_len: usize,
    },
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn coll_layout(
    api: &str,
    kind: CollKind,
    send: *const u8,
    recv: *mut u8,
    count: usize,
    dtype: DataType,
    rank: usize,
    nranks: usize,
) -> Result<Layout> {
    if let Some(root) = kind.root() {
        check_rank(api, "root", root, nranks)?;
    }
    bytes_of(api, count, nranks, dtype)?;
    if count == 0 {
        return Ok(Layout::Empty);
    }
    let es = dtype.size();
    let (in_len, out_len) = kind.buffer_lens(count, nranks);
    let (in_b, out_b) = (in_len * es, out_len * es);
    let is_root = kind.root() == Some(rank);
    let send_used = !matches!(kind, CollKind::Broadcast { .. }) || is_root;
    let recv_used = !matches!(kind, CollKind::Reduce { .. }) || is_root;
    if send_used {
        non_null(api, "sendbuff", send)?;
    }
    if recv_used {
        non_null(api, "recvbuff", recv)?;
    }
    let (s, r) = (send as usize, recv as usize);
    let in_place = match kind {
        CollKind::AllGather => s == r.wrapping_add(rank * count * es),
        CollKind::ReduceScatter => r == s.wrapping_add(rank * count * es),
        _ => s == r && !send.is_null(),
    };
    if in_place {
        let (buf, len) = match kind {
            CollKind::ReduceScatter => (send.cast_mut(), in_b),
            CollKind::Reduce { .. } if !is_root => (recv, in_b),
            _ => (recv, in_b.max(out_b)),
        };
        return Ok(Layout::InPlace { buf, len });
    }
    let send_len = if send_used { in_b } else { 0 };
    let recv_len = if recv_used { out_b } else { 0 };
    if overlaps(send, send_len, recv, recv_len) {
        return Err(invalid(
            api,
            format!(
                "sendbuff {send:p} ({send_len} bytes) and recvbuff {recv:p} ({recv_len} bytes) \
                 overlap without being the in-place layout"
            ),
        ));
    }
    Ok(Layout::Apart {
        send,
        send_len,
        recv,
        recv_len,
    })
}

/// Checks `op` for a communicator of `nranks` ranks on which this is `rank`.
pub(crate) fn validate(op: &Op, rank: usize, nranks: usize) -> Result<()> {
    match *op {
        Op::Coll {
            api,
            kind,
            send,
            recv,
            count,
            dtype,
            on,
            ..
        } => {
            let layout = coll_layout(api, kind, send, recv, count, dtype, rank, nranks)?;
            on.map_or(Ok(()), |on| stream::check_layout(api, rank, &layout, on))
        }
        Op::Rooted {
            api,
            which,
            root,
            send,
            recv,
            count,
            dtype,
            on,
        } => {
            let l = rooted_layout(api, which, root, send, recv, count, dtype, rank, nranks)?;
            on.map_or(Ok(()), |on| stream::check_rooted(api, rank, &l, on))
        }
        Op::Send {
            buf,
            count,
            dtype,
            peer,
            on,
        } => {
            let b = p2p_check("ncclSend", "sendbuff", buf, count, dtype, peer, nranks)?;
            on.map_or(Ok(()), |on| {
                stream::check_span("ncclSend", rank, "sendbuff", buf, b, on)
            })
        }
        Op::Recv {
            buf,
            count,
            dtype,
            peer,
            on,
        } => {
            let b = p2p_check("ncclRecv", "recvbuff", buf, count, dtype, peer, nranks)?;
            on.map_or(Ok(()), |on| {
                stream::check_span("ncclRecv", rank, "recvbuff", buf, b, on)
            })
        }
        Op::Split { .. } => Ok(()),
    }
}

pub(crate) fn p2p_check(
    api: &str,
    name: &str,
    buf: *const u8,
    count: usize,
    dtype: DataType,
    peer: usize,
    nranks: usize,
) -> Result<usize> {
    check_rank(api, "peer", peer, nranks)?;
    let b = bytes_of(api, count, 1, dtype)?;
    if b > 0 {
        non_null(api, name, buf)?;
    }
    Ok(b)
}

/// Buffers of a gather or scatter on one rank: `(send, send bytes, recv, recv bytes, block
/// bytes, whether the root's own block is already in place)`.
pub(crate) type RootedLayout = (*const u8, usize, *mut u8, usize, usize, bool);

#[allow(clippy::too_many_arguments)]
pub(crate) fn rooted_layout(
    api: &str,
    which: Rooted,
    root: usize,
    send: *const u8,
    recv: *mut u8,
    count: usize,
    dtype: DataType,
    rank: usize,
    nranks: usize,
) -> Result<RootedLayout> {
    check_rank(api, "root", root, nranks)?;
    let all = bytes_of(api, count, nranks, dtype)?;
    let block = count * dtype.size();
    let is_root = rank == root;
    let (send_len, recv_len) = match (which, is_root) {
        (Rooted::Gather, true) => (block, all),
        (Rooted::Gather, false) => (block, 0),
        (Rooted::Scatter, true) => (all, block),
        (Rooted::Scatter, false) => (0, block),
    };
    if count == 0 {
        return Ok((send, 0, recv, 0, 0, true));
    }
    if send_len > 0 {
        non_null(api, "sendbuff", send)?;
    }
    if recv_len > 0 {
        non_null(api, "recvbuff", recv)?;
    }
    let own = root * block;
    let in_place = is_root
        && match which {
            Rooted::Gather => send as usize == (recv as usize).wrapping_add(own),
            Rooted::Scatter => recv as usize == (send as usize).wrapping_add(own),
        };
    if !in_place && overlaps(send, send_len, recv, recv_len) {
        return Err(invalid(
            api,
            format!(
                "sendbuff {send:p} and recvbuff {recv:p} overlap without being the in-place layout"
            ),
        ));
    }
    Ok((send, send_len, recv, recv_len, block, in_place))
}
