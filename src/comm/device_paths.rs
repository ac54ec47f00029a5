//! The two paths of a checked device collective: straight on the device buffers (every
//! connection carries device memory; the whole call first offered between the ranks'
//! buffers) or staged through pinned host memory, both in the slices every rank cuts alike
//! (`device_calls::cut`).

use ferroccl_kernels::{as_bytes, as_bytes_mut, Element};

use crate::coll::CollKind;
use crate::device::direct::DirectArena;
use crate::device::staging::slice_range;
use crate::device::{Device, DeviceBuffer};
use crate::exec::Memory;
use crate::{Error, Result};

use super::device_calls::{cut, DeviceState};
use super::*;

/// Runs a checked device collective on the device buffers themselves: every connection
/// carries device memory, the schedule's copies and reductions run on the device through
/// `arena`'s reducer, and nothing passes through host memory. Slice by slice as the staged
/// path cuts it.
pub(super) fn direct<T: Element>(
    inner: &Inner,
    arena: &mut DirectArena,
    kind: CollKind,
    send: Option<&DeviceBuffer<T>>,
    recv: &mut DeviceBuffer<T>,
    count: usize,
    op: ReduceOp,
) -> Result<()> {
    let es = T::DTYPE.size();
    let is_root = kind.root() == Some(inner.rank);
    let send_read = !matches!(kind, CollKind::Broadcast { .. }) || is_root;
    let in_len = send.filter(|_| send_read).map_or(0, |s| s.len());
    let out_len = recv.len();
    let slices = cut(inner, kind, count, es).slices;
    if slices > 1 && !kind.is_elementwise() {
        // `cuts_blocks` keeps the blocked layouts whole where this path can be taken.
        return Err(Error::internal(format!(
            "{} on rank {}: {slices} slices of a blocked layout on the device path",
            kind.name(),
            inner.rank
        )));
    }
    let range = |len: usize, k: usize| slice_range(count, slices, len, k);
    let (name, hkind) = (kind.name(), header_kind(kind));
    let space = recv.device().space();
    let memory = |ri: std::ops::Range<usize>, ro: std::ops::Range<usize>| {
        let out = recv.addr() as usize + ro.start * es;
        Memory {
            input: send.map_or(out, |s| s.addr() as usize + ri.start * es) as *const u8,
            input_len: ri.len() * es,
            output: out as *mut u8,
            output_len: ro.len() * es,
            in_place: send.is_none(),
            space,
        }
    };
    // The whole call, offered at the first slice between the ranks' buffers (where every
    // rank takes that path, the other slices are then done).
    let whole = if slices > 1 {
        let call = Call::check(
            inner,
            name,
            hkind,
            kind,
            send.map(|_| in_len * es),
            out_len * es,
            count,
            T::DTYPE,
            op,
        )?;
        Some((call, memory(0..in_len, 0..out_len)))
    } else {
        None
    };
    for k in 0..slices {
        let (ri, ro) = (range(in_len, k), range(out_len, k));
        let call = Call::check(
            inner,
            name,
            hkind,
            kind,
            send.map(|_| ri.len() * es),
            ro.len() * es,
            range(count, k).len(),
            T::DTYPE,
            op,
        )?;
        let mem = memory(ri, ro);
        let arena = &mut *arena;
        let first = whole.as_ref().filter(|_| k == 0).map(|(c, m)| (c, *m));
        let mut ran_whole = false;
        inner.execute_next(true, |e, seq| {
            let check_root = inner.config.check_root;
            let r = call.run_first_in(e, seq, mem, check_root, Some(arena), first);
            // A call may have registered the scratch window (and shared the marks).
            inner
                .windows_in_order
                .store(e.windows_in_order(), std::sync::atomic::Ordering::Release);
            ran_whole = r?;
            Ok(())
        })?;
        if ran_whole {
            break;
        }
    }
    Ok(())
}

/// Runs a checked device collective: stages through the communicator's pinned staging, runs
/// the host collective slice by slice (or whole), stages back. Called on the caller's thread
/// by the blocking calls (the stream-ordered ones stage through the stream's arena instead:
/// `device::stream_stage`).
#[allow(clippy::too_many_arguments)]
pub(super) fn staged<T: Element>(
    inner: &Inner,
    state: &Mutex<DeviceState>,
    dev: Device,
    kind: CollKind,
    send: Option<&DeviceBuffer<T>>,
    recv: &mut DeviceBuffer<T>,
    count: usize,
    op: ReduceOp,
) -> Result<()> {
    let rank = inner.rank;
    let es = T::DTYPE.size();
    let is_root = kind.root() == Some(rank);
    let send_read = !matches!(kind, CollKind::Broadcast { .. }) || is_root;
    let recv_written = !matches!(kind, CollKind::Reduce { .. }) || is_root;
    let in_len = send.filter(|_| send_read).map_or(0, |s| s.len());
    // Slice by slice, each slice's copies overlapping the transfers of the others.
    let cut = cut(inner, kind, count, es);
    let out_blocks = if send.is_none() {
        cut.in_blocks.max(cut.out_blocks)
    } else {
        cut.out_blocks
    };
    let mut st = lock(state);
    let staging = Communicator::staging(&mut st, dev)?;
    staging.reserve(
        cut.staged(cut.in_blocks, in_len) * es,
        cut.staged(out_blocks, recv.len()) * es,
    )?;
    staging.pipeline(
        send,
        recv,
        send_read,
        recv_written,
        cut,
        |count, input, output| {
            let input = input.map(|i| as_bytes(i));
            let (name, hkind) = (kind.name(), header_kind(kind));
            let output = as_bytes_mut(output);
            super::calls::blocking_on(inner, name, hkind, kind, input, output, count, T::DTYPE, op)
        },
    )
}
