//! A stream-ordered device collective as stream jobs, one per slice of the call.
//!
//! The call is cut as the blocking form cuts it (`device_calls::slices`: element-wise
//! collectives in slices of `FERRO_DEVICE_SLICE_BYTES`, the others whole), so that ranks that
//! take the blocking form and ranks that take the stream-ordered one exchange the same
//! messages. On the caller's stream, in this order: every slice's copies in, each followed by
//! its gate; then, per slice, the wait for its job's flag and its copies back. The stream so
//! copies later slices in while earlier slices' collectives run, and copies earlier slices back
//! while later ones run. The queue's thread runs the jobs in order: job `k` waits for gate `k`
//! only. The last job holds the buffers until the stream has copied everything back.

use std::ops::Range;
use std::sync::Arc;

use ferroccl_kernels::Element;

use crate::coll::CollKind;
use crate::device::staging::slice_range;
use crate::device::stream_queue::{landing, record_gates};
use crate::device::stream_stage::Span;
use crate::device::{Device, DeviceBuffer};
use crate::Result;

use super::call::header_kind;
use super::device_streams::Held;
use super::*;

impl Communicator {
    /// Queues checked collective `kind` on the caller's stream `handle` of `dev` as `slices`
    /// jobs; `spans` are the call's ranges (read and written) as staged through the arena.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_slices_on<T: Element>(
        &self,
        dev: Device,
        kind: CollKind,
        send: Option<&DeviceBuffer<T>>,
        recv: &mut DeviceBuffer<T>,
        count: usize,
        op: ReduceOp,
        handle: usize,
        spans: &[Span],
        slices: usize,
    ) -> Result<()> {
        let es = T::DTYPE.size();
        let is_root = kind.root() == Some(self.inner.rank);
        let send_read = !matches!(kind, CollKind::Broadcast { .. }) || is_root;
        let recv_written = !matches!(kind, CollKind::Reduce { .. }) || is_root;
        let in_place = send.is_none();
        let read = send.filter(|_| send_read);
        let (in_len, out_len) = (read.map_or(0, |s| s.len()), recv.len());
        let range = |len: usize, k: usize| slice_range(count, slices, len, k);
        let part = |addr: u64, r: &Range<usize>| (addr + (r.start * es) as u64, r.len() * es);
        // SAFETY: both buffers are live device memory of `dev` (checked by the caller), held
        // by the last job until the stream has run every copy back; `handle` is a stream of
        // `dev`.
        let st = unsafe { self.streams.place(dev, handle, spans) }?;
        let recv_at = st.host_of(recv.addr()).unwrap_or(0);
        let send_at = read.map(|s| st.host_of(s.addr()).unwrap_or(0));
        let mut holds = Some((Held::of(recv), send.map(Held::of)));
        let mut queued = 0usize;
        let mut queue = || -> Result<()> {
            let mut gates = Vec::with_capacity(slices);
            for k in 0..slices {
                let mut parts = Vec::with_capacity(2);
                if in_place {
                    parts.push(part(recv.addr(), &range(out_len, k)));
                }
                if let Some(s) = read {
                    parts.push(part(s.addr(), &range(in_len, k)));
                }
                // SAFETY: as for the placing above; the parts lie in the ranges the call reads.
                unsafe { st.copy_in(&parts) }?;
                gates.push(record_gates(dev, &[handle])?);
            }
            for (k, gate) in gates.into_iter().enumerate() {
                let (ri, ro) = (range(in_len, k), range(out_len, k));
                let count_k = range(count, k).len();
                let output_at = recv_at + ro.start * es;
                let input_at = send_at.map(|a| a + ri.start * es);
                let (in_n, out_n) = (ri.len(), ro.len());
                let inner = Arc::clone(&self.inner);
                let work = Box::new(move || {
                    let run = || {
                        // SAFETY: `output_at` and `input_at` are the arena copies of this slice of
                        // the buffers (`out_n` and `in_n` elements, 0 where empty), which the
                        // stream filled before the gate the worker waited for, and which no other
                        // job uses (the slices are disjoint; the stream copies a later call in
                        // only after this job's flag and copies back).
                        let (input, output) = unsafe {
                            let output: &mut [u8] = if out_n == 0 {
                                &mut []
                            } else {
                                std::slice::from_raw_parts_mut(output_at as *mut u8, out_n * es)
                            };
                            let input: Option<&[u8]> = match (in_n, input_at) {
                                (_, None) if in_place => None,
                                (0, _) | (_, None) => Some(&[]),
                                (n, Some(at)) => {
                                    Some(std::slice::from_raw_parts(at as *const u8, n * es))
                                }
                            };
                            (input, output)
                        };
                        super::calls::blocking_on(
                            &inner,
                            kind.name(),
                            header_kind(kind),
                            kind,
                            input,
                            output,
                            count_k,
                            T::DTYPE,
                            op,
                        )
                    };
                    let r = run();
                    if let Err(e) = &r {
                        inner.fail(e.clone());
                    }
                    r
                });
                // The last job waits, after its flag, until the stream has run every copy back
                // (they run in order), then lets the buffers go: host access and `Drop` wait.
                let last = k + 1 == slices;
                let (landed, after) = match if last { holds.take() } else { None } {
                    Some(h) => {
                        let (l, a) = landing(h);
                        (Some(l), Some(a))
                    }
                    None => (None, None),
                };
                self.streams.enqueue(dev, &[handle], gate, work, after)?;
                queued += 1;
                let mut parts = Vec::with_capacity(1);
                if recv_written {
                    parts.push(part(recv.addr(), &ro));
                }
                // SAFETY: as for the placing above; the parts lie in the range the call writes,
                // queued after this job's flag wait.
                unsafe { st.copy_back_parts(&parts) }?;
                if let Some(l) = landed {
                    let g = record_gates(dev, &[handle])?;
                    let _ = l.send(g);
                }
            }
            Ok(())
        };
        let Err(e) = queue() else {
            return Ok(());
        };
        // Cut short: the slices queued would leave the call half run, out of step with the
        // peers, so the communicator fails (its queued jobs end promptly). The stream may still
        // copy from and into the buffers: it is waited for before the caller gets them back.
        if queued > 0 {
            self.inner.fail(e.clone());
        }
        // SAFETY: `handle` is the caller's stream of `dev` (the caller's contract); every
        // flag it waits on belongs to a job already queued, which stores it.
        let _ = unsafe { dev.sync_stream(std::ptr::without_provenance_mut(handle)) };
        drop(holds);
        Err(e)
    }
}
