//! The collectives and point-to-point calls: argument checks, then an operation issued on
//! the communicator (queued inside a group, run now outside one).

use std::ffi::{c_int, c_void};

use super::api::issuing;
use super::comm::lookup;
use super::error::guard;
use super::group;
use super::ops::{dtype_arg, rank_arg, reduction_arg, Op, Reduction, Rooted};
use super::stream::stream_arg;
use super::types::*;
use crate::coll::CollKind;
use crate::ReduceOp;

#[allow(clippy::too_many_arguments)]
pub(super) fn collective(
    api: &'static str,
    kind: impl FnOnce(usize) -> CollKind,
    root: Option<c_int>,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: Option<ncclRedOp_t>,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    guard(api, || {
        issuing(|| {
            let shared = lookup(api, comm)?;
            let on = stream_arg(api, &shared, stream, &[send, recv.cast_const()])?;
            let dtype = dtype_arg(api, datatype)?;
            let red = match op {
                Some(op) => reduction_arg(api, &shared, op, dtype)?,
                None => Reduction::Op(ReduceOp::Sum),
            };
            let root = match root {
                Some(r) => rank_arg(api, "root", r)?,
                None => 0,
            };
            let op = Op::Coll {
                api,
                kind: kind(root),
                send: send.cast(),
                recv: recv.cast(),
                count,
                dtype,
                red,
                on,
            };
            group::issue(api, &shared, op)
        })
    })
}

nccl_api! {
    /// Every rank's `recvbuff` becomes the reduction of all ranks' `sendbuff` (`count`
    /// elements; in place when the two are equal).
    fn ncclAllReduce / pncclAllReduce(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: ncclDataType_t,
        op: ncclRedOp_t,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        collective("ncclAllReduce", |_| CollKind::AllReduce, None, sendbuff, recvbuff, count, datatype, Some(op), comm, stream)
    }
}

nccl_api! {
    /// The root's `recvbuff` becomes the reduction of all ranks' `sendbuff` (`recvbuff` is
    /// not used elsewhere).
    fn ncclReduce / pncclReduce(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: ncclDataType_t,
        op: ncclRedOp_t,
        root: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        collective("ncclReduce", |root| CollKind::Reduce { root }, Some(root), sendbuff, recvbuff, count, datatype, Some(op), comm, stream)
    }
}

nccl_api! {
    /// Every rank's `recvbuff` becomes the root's `sendbuff` (`sendbuff` is read on the root
    /// only).
    fn ncclBroadcast / pncclBroadcast(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: ncclDataType_t,
        root: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        collective("ncclBroadcast", |root| CollKind::Broadcast { root }, Some(root), sendbuff, recvbuff, count, datatype, None, comm, stream)
    }
}

nccl_api! {
    /// In-place broadcast: every rank's `buff` becomes the root's.
    fn ncclBcast / pncclBcast(
        buff: *mut c_void,
        count: usize,
        datatype: ncclDataType_t,
        root: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        collective("ncclBcast", |root| CollKind::Broadcast { root }, Some(root), buff, buff, count, datatype, None, comm, stream)
    }
}

nccl_api! {
    /// `recvbuff` (`nranks × sendcount` elements) becomes every rank's `sendbuff`, in rank
    /// order (in place when `sendbuff == recvbuff + rank × sendcount`).
    fn ncclAllGather / pncclAllGather(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        sendcount: usize,
        datatype: ncclDataType_t,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        collective("ncclAllGather", |_| CollKind::AllGather, None, sendbuff, recvbuff, sendcount, datatype, None, comm, stream)
    }
}

nccl_api! {
    /// `recvbuff` (`recvcount` elements) becomes block `rank` of the reduction of all ranks'
    /// `sendbuff` (`nranks × recvcount`; in place when `recvbuff == sendbuff + rank ×
    /// recvcount`).
    fn ncclReduceScatter / pncclReduceScatter(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        recvcount: usize,
        datatype: ncclDataType_t,
        op: ncclRedOp_t,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        collective("ncclReduceScatter", |_| CollKind::ReduceScatter, None, sendbuff, recvbuff, recvcount, datatype, Some(op), comm, stream)
    }
}

nccl_api! {
    /// Block `p` (`count` elements) of `sendbuff` goes to rank `p`, which stores it as block
    /// `rank` of its `recvbuff`.
    fn ncclAlltoAll / pncclAlltoAll(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: ncclDataType_t,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        collective("ncclAlltoAll", |_| CollKind::AllToAll, None, sendbuff, recvbuff, count, datatype, None, comm, stream)
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn rooted(
    api: &'static str,
    which: Rooted,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    guard(api, || {
        issuing(|| {
            let shared = lookup(api, comm)?;
            let on = stream_arg(api, &shared, stream, &[send, recv.cast_const()])?;
            let dtype = dtype_arg(api, datatype)?;
            let root = rank_arg(api, "root", root)?;
            let op = Op::Rooted {
                api,
                which,
                root,
                send: send.cast(),
                recv: recv.cast(),
                count,
                dtype,
                on,
            };
            group::issue(api, &shared, op)
        })
    })
}

nccl_api! {
    /// The root's `recvbuff` (`nranks × count`) receives every rank's `sendbuff` (`count`), in
    /// rank order.
    fn ncclGather / pncclGather(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: ncclDataType_t,
        root: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        rooted("ncclGather", Rooted::Gather, sendbuff, recvbuff, count, datatype, root, comm, stream)
    }
}

nccl_api! {
    /// Rank `p`'s `recvbuff` (`count`) receives block `p` of the root's `sendbuff`.
    fn ncclScatter / pncclScatter(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: ncclDataType_t,
        root: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        rooted("ncclScatter", Rooted::Scatter, sendbuff, recvbuff, count, datatype, root, comm, stream)
    }
}

#[allow(clippy::too_many_arguments)]
fn p2p(
    api: &'static str,
    send: bool,
    buf: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    guard(api, || {
        issuing(|| {
            let shared = lookup(api, comm)?;
            let on = stream_arg(api, &shared, stream, &[buf.cast_const()])?;
            let dtype = dtype_arg(api, datatype)?;
            let peer = rank_arg(api, "peer", peer)?;
            let op = if send {
                Op::Send {
                    buf: buf.cast_const().cast(),
                    count,
                    dtype,
                    peer,
                    on,
                }
            } else {
                Op::Recv {
                    buf: buf.cast(),
                    count,
                    dtype,
                    peer,
                    on,
                }
            };
            group::issue(api, &shared, op)
        })
    })
}

nccl_api! {
    /// Sends `count` elements to `peer`, which calls `ncclRecv`. Inside a group, all sends and
    /// receives run together.
    fn ncclSend / pncclSend(
        sendbuff: *const c_void,
        count: usize,
        datatype: ncclDataType_t,
        peer: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        p2p("ncclSend", true, sendbuff.cast_mut(), count, datatype, peer, comm, stream)
    }
}

nccl_api! {
    /// Receives `count` elements from `peer`.
    fn ncclRecv / pncclRecv(
        recvbuff: *mut c_void,
        count: usize,
        datatype: ncclDataType_t,
        peer: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        p2p("ncclRecv", false, recvbuff, count, datatype, peer, comm, stream)
    }
}
