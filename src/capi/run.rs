//! How the operations of a group run on a [`Communicator`] over raw host pointers (or, given a
//! stream, through [`stream`]): collectives and splits in issue order, then every send and
//! receive of the group together.

use super::ops::{
    coll_layout, p2p_check, refuse_overlaps, rooted_layout, Layout, Op, Reduction, Rooted,
};
use super::stream;
use crate::{Communicator, Error, ReduceOp, Result};

/// Runs the operations of one group on `comm`: collectives and splits in issue order, then
/// every send and receive together (so that pairs never deadlock).
pub(crate) fn execute(comm: &Communicator, ops: Vec<Op>) -> Result<()> {
    let mut p2p = Vec::new();
    for op in ops {
        match op {
            Op::Send { .. } | Op::Recv { .. } => p2p.push(op),
            other => run_one(comm, other)?,
        }
    }
    if !p2p.is_empty() {
        // SAFETY: the operations' buffers are the caller's, valid until the group completes
        // (NCCL's contract); device ones are checked before any copy.
        unsafe { stream::p2p_on_streams(comm, p2p, |ops| run_p2p(comm, ops)) }?;
    }
    Ok(())
}

fn run_one(comm: &Communicator, op: Op) -> Result<()> {
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
                stream::check_layout(api, rank, &layout, on)?;
                // SAFETY: the layout was just checked against `on`; NCCL's contract keeps the
                // buffers (and a ncclScalarDevice scalar) live and the call's alone until it
                // completes.
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
            on: Some(on),
        } => {
            let layout = rooted_layout(api, which, root, send, recv, count, dtype, rank, n)?;
            // SAFETY: the layout's buffers are the caller's, valid until the call completes
            // (NCCL's contract); they are checked against `on` before any copy.
            unsafe {
                stream::rooted_on_stream(api, rank, &layout, on, |send, recv| {
                    let host = Op::Rooted {
                        api,
                        which,
                        root,
                        send,
                        recv,
                        count,
                        dtype,
                        on: None,
                    };
                    run_one(comm, host)
                })
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
            on: None,
        } => {
            let (send, send_len, recv, recv_len, block, in_place) =
                rooted_layout(api, which, root, send, recv, count, dtype, rank, n)?;
            let hkind = match which {
                Rooted::Gather => crate::wire::kind::GATHER,
                Rooted::Scatter => crate::wire::kind::SCATTER,
            };
            comm.agree_on_root(api, hkind, root, count, dtype)?;
            if block == 0 {
                return Ok(());
            }
            // Used buffers are non-NULL with the lengths NCCL's count gives, and overlap only
            // in the exact in-place layout, where the root's own block is not copied (so the
            // two slices are never both made). The caller keeps them valid until the call ends.
            let mut g = comm.group();
            match (which, rank == root) {
                (Rooted::Gather, true) => {
                    // SAFETY: see above.
                    let r = unsafe { slice_mut(recv, recv_len) };
                    if !in_place {
                        // SAFETY: see above; not in place, so no overlap with `r`.
                        let s = unsafe { slice(send, send_len) };
                        r[root * block..(root + 1) * block].copy_from_slice(s);
                    }
                    for (p, chunk) in r.chunks_mut(block).enumerate() {
                        if p != root {
                            g.recv(chunk, p);
                        }
                    }
                    g.run()
                }
                (Rooted::Scatter, true) => {
                    // SAFETY: see above.
                    let s = unsafe { slice(send, send_len) };
                    if !in_place {
                        // SAFETY: see above; not in place, so no overlap with `s`.
                        let r = unsafe { slice_mut(recv, recv_len) };
                        r.copy_from_slice(&s[root * block..(root + 1) * block]);
                    }
                    for (p, chunk) in s.chunks(block).enumerate() {
                        if p != root {
                            g.send(chunk, p);
                        }
                    }
                    g.run()
                }
                (Rooted::Gather, false) => {
                    // SAFETY: see above.
                    g.send(unsafe { slice(send, send_len) }, root);
                    g.run()
                }
                (Rooted::Scatter, false) => {
                    // SAFETY: see above.
                    g.recv(unsafe { slice_mut(recv, recv_len) }, root);
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
