//! How the operations of a group run on a [`Communicator`] over raw host pointers (or, given a
//! stream, through [`stream`]): collectives and splits in issue order, then every send and
//! receive of the group together.

use super::ops::{
    coll_layout, p2p_check, refuse_overlaps, rooted_layout, Layout, Op, Reduction, Rooted,
    RootedLayout,
};
use super::stream;
use crate::device::raw::{At, Span};
use crate::{Communicator, Error, ReduceOp, Result};

/// Runs the operations of one group on `comm`: collectives and splits in issue order, then
/// every send and receive together (so that pairs never deadlock). `checked`: their device
/// buffers were found live memory of the call's device when they were issued (`validate`),
/// so a collective's are not asked of the driver again (a pointer query per buffer and call).
pub(crate) fn execute(comm: &Communicator, ops: Vec<Op>, checked: bool) -> Result<()> {
    let mut p2p = Vec::new();
    for op in ops {
        match op {
            Op::Send { .. } | Op::Recv { .. } => p2p.push(op),
            other => run_one(comm, other, checked)?,
        }
    }
    if !p2p.is_empty() {
        // SAFETY: the operations' buffers are the caller's, valid until the group completes
        // (NCCL's contract); device ones are checked before any copy.
        unsafe { stream::p2p_on_streams(comm, p2p, |ops| run_p2p(comm, ops)) }?;
    }
    Ok(())
}

fn run_one(comm: &Communicator, op: Op, checked: bool) -> Result<()> {
    let (rank, n) = (comm.rank(), comm.nranks());
    match op {
        Op::Coll {
            api,
            kind,
            send,
            recv,
            count,
            dtype,
            red,
            on,
        } => {
            let layout = coll_layout(api, kind, send, recv, count, dtype, rank, n)?;
            if let Some(on) = on {
                if !checked {
                    stream::check_layout(api, rank, &layout, on)?;
                }
                // SAFETY: the layout was checked against `on` (now, or when the call was
                // issued); NCCL's contract keeps the buffers (and a ncclScalarDevice scalar)
                // live and the call's alone until it completes.
                return unsafe { stream::run_coll(comm, api, kind, &layout, dtype, red, on) };
            }
            let op = match red {
                Reduction::Op(op) => op,
                Reduction::ScalarAt(p, d) => {
                    // SAFETY: the scalar's address was given to ncclRedOpCreatePreMulSum with
                    // ncclScalarDevice; NCCL's contract keeps it readable (host or device
                    // memory) while operations use it.
                    let v = unsafe { stream::read_scalar_host_call(p, d) }?;
                    ReduceOp::PreMulSum(v)
                }
            };
            match layout {
                Layout::Empty => Ok(()),
                Layout::InPlace { buf, len } => {
                    // SAFETY: `coll_layout` checked `buf` is non-NULL; the caller's in-place
                    // buffer holds `len` bytes and nothing else uses it until the call ends.
                    let buf = unsafe { std::slice::from_raw_parts_mut(buf, len) };
                    comm.raw_collective(kind, None, buf, count, dtype, op)
                }
                Layout::Apart {
                    send,
                    send_len,
                    recv,
                    recv_len,
                } => {
                    // SAFETY: a used buffer is non-NULL (checked) and holds the bytes NCCL's
                    // count says; the two do not overlap (checked); the caller keeps them
                    // valid and unused by others until the call ends.
                    let (s, r) = unsafe { (slice(send, send_len), slice_mut(recv, recv_len)) };
                    comm.raw_collective(kind, Some(s), r, count, dtype, op)
                }
            }
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
            let layout = rooted_layout(api, which, root, send, recv, count, dtype, rank, n)?;
            if let Some(on) = on {
                // Device buffers: checked, and the work queued on the stream before the call
                // waited for, before anything moves.
                stream::check_rooted(api, rank, &layout, on)?;
                stream::wait_stream(api, on)?;
            }
            comm.agree_on_root(api, header_kind(which), root, count, dtype)?;
            let ops = rooted_ops(which, root, rank, n, &layout);
            match on {
                // SAFETY: the layout's buffers were checked as live memory of the device just
                // above; a receive range overlaps no other range of the call (blocks of the
                // receive buffer, which overlaps the send buffer only in the exact in-place
                // layout, where the root's own block moves nowhere); NCCL's contract keeps
                // them the call's until it returns.
                Some(on) => unsafe {
                    let at: Vec<(bool, usize, At)> = ops
                        .iter()
                        .map(|&(send, peer, p, bytes)| {
                            let span = Span {
                                device: on.device,
                                addr: p as u64,
                                bytes,
                            };
                            (send, peer, At::Device(span))
                        })
                        .collect();
                    stream::device_spans(comm, on.device, &at)
                },
                None => {
                    let mut g = comm.group();
                    for &(is_send, peer, p, len) in &ops {
                        // SAFETY: as above, for host buffers: used buffers are non-NULL
                        // (`rooted_layout`) with the lengths NCCL's count gives.
                        unsafe {
                            if is_send {
                                g.send(slice(p, len), peer);
                            } else {
                                g.recv(slice_mut(p.cast_mut(), len), peer);
                            }
                        }
                    }
                    g.run()
                }
            }
        }
        Op::Split { color, key, child } => {
            let r = comm.split(color, key);
            match (child, r) {
                (Some(child), Ok(Some(c))) => {
                    child.finish_init(Ok(c));
                    Ok(())
                }
                (Some(child), Ok(None)) => {
                    let e = Error::internal("ncclCommSplit: the split made no communicator");
                    child.finish_init(Err(e.clone()));
                    Err(e)
                }
                (Some(child), Err(e)) => {
                    child.finish_init(Err(e.clone()));
                    Err(e)
                }
                (None, r) => r.map(drop),
            }
        }
        // SAFETY: as in `execute`.
        Op::Send { .. } | Op::Recv { .. } => unsafe {
            stream::p2p_on_streams(comm, vec![op], |ops| run_p2p(comm, ops))
        },
    }
}

/// The header kind of a gather's or scatter's agreement on its root.
pub(super) fn header_kind(which: Rooted) -> u8 {
    match which {
        Rooted::Gather => crate::wire::kind::GATHER,
        Rooted::Scatter => crate::wire::kind::SCATTER,
    }
}

/// The sends and receives of a gather or scatter on `rank`, as (send?, peer, address, bytes):
/// the root receives (gather) or sends (scatter) block `p` from or to rank `p`, and moves its
/// own block as a send to itself and a receive from itself, unless it is already in place;
/// every other rank sends its block to the root, or receives it from the root. None where the
/// blocks are empty.
pub(super) fn rooted_ops(
    which: Rooted,
    root: usize,
    rank: usize,
    nranks: usize,
    layout: &RootedLayout,
) -> Vec<(bool, usize, *const u8, usize)> {
    let &(send, _, recv, _, block, in_place) = layout;
    if block == 0 {
        return Vec::new();
    }
    let recv = recv.cast_const();
    let at = |base: *const u8, p: usize| base.wrapping_add(p * block);
    match (which, rank == root) {
        (Rooted::Gather, false) => vec![(true, root, send, block)],
        (Rooted::Scatter, false) => vec![(false, root, recv, block)],
        (Rooted::Gather, true) => {
            let mut ops = Vec::with_capacity(nranks + 1);
            if !in_place {
                ops.extend([
                    (true, root, send, block),
                    (false, root, at(recv, root), block),
                ]);
            }
            ops.extend(
                (0..nranks)
                    .filter(|&p| p != root)
                    .map(|p| (false, p, at(recv, p), block)),
            );
            ops
        }
        (Rooted::Scatter, true) => {
            let mut ops = Vec::with_capacity(nranks + 1);
            if !in_place {
                ops.extend([
                    (true, root, at(send, root), block),
                    (false, root, recv, block),
                ]);
            }
            ops.extend(
                (0..nranks)
                    .filter(|&p| p != root)
                    .map(|p| (true, p, at(send, p), block)),
            );
            ops
        }
    }
}

/// # Safety
/// `len == 0`, or `p` points to `len` readable bytes that nobody writes while the slice lives.
unsafe fn slice<'a>(p: *const u8, len: usize) -> &'a [u8] {
    if len == 0 {
        &[]
    } else {
        // SAFETY: guaranteed by the caller.
        unsafe { std::slice::from_raw_parts(p, len) }
    }
}

/// # Safety
/// `len == 0`, or `p` points to `len` writable bytes that nothing else uses while the slice
/// lives.
unsafe fn slice_mut<'a>(p: *mut u8, len: usize) -> &'a mut [u8] {
    if len == 0 {
        &mut []
    } else {
        // SAFETY: guaranteed by the caller.
        unsafe { std::slice::from_raw_parts_mut(p, len) }
    }
}

fn run_p2p(comm: &Communicator, ops: &[Op]) -> Result<()> {
    let n = comm.nranks();
    // (address, bytes, written) of every buffer, to refuse a receive overlapping anything.
    let mut spans: Vec<(*const u8, usize, bool)> = Vec::with_capacity(ops.len());
    for op in ops {
        match *op {
            Op::Send {
                buf,
                count,
                dtype,
                peer,
                ..
            } => spans.push((
                buf,
                p2p_check("ncclSend", "sendbuff", buf, count, dtype, peer, n)?,
                false,
            )),
            Op::Recv {
                buf,
                count,
                dtype,
                peer,
                ..
            } => spans.push((
                buf,
                p2p_check("ncclRecv", "recvbuff", buf, count, dtype, peer, n)?,
                true,
            )),
            _ => {}
        }
    }
    refuse_overlaps("buffers", &spans)?;
    let mut g = comm.group();
    for (op, &(p, len, _)) in ops.iter().zip(&spans) {
        match *op {
            // Buffers are non-NULL when `len > 0` (checked); a receive buffer overlaps no
            // other buffer of the group (checked above); the caller keeps them valid until
            // the group completes.
            Op::Send { peer, .. } => {
                // SAFETY: see above.
                g.send(unsafe { slice(p, len) }, peer);
            }
            Op::Recv { peer, buf, .. } => {
                // SAFETY: see above.
                g.recv(unsafe { slice_mut(buf, len) }, peer);
            }
            _ => {}
        }
    }
    g.run()
}
