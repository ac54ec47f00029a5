//! A stream-ordered device collective as stream jobs, one per slice of the call.
//!
//! The call is cut as the blocking form cuts it (`device_calls::cut`: element-wise
//! collectives in slices of `FERRO_DEVICE_SLICE_BYTES`, the blocked layouts by their larger
//! buffer's bytes, each slice's blocks staged one after another), so that ranks that
//! take the blocking form and ranks that take the stream-ordered one exchange the same
//! messages. The stream's arena holds the slices in flight (`SLICES_IN_FLIGHT` at most),
//! whatever the call's size: slice `k` lives in place `k mod` that many. On the caller's
//! stream, in this order: the first slices' copies in, each followed by its gate; then, per
//! slice, the wait for its job's flag, its copies back, and the copy in (and gate) of the slice
//! that takes its place next. The stream so copies later slices in while earlier slices'
//! collectives run, and copies earlier slices back while later ones run. The queue's thread
//! runs the jobs in order: job `k` waits for gate `k` only. The last job holds the buffers until
//! the stream has copied everything back.
//!
//! The Rust API's typed calls and the C ABI's stream calls both queue their slices here
//! ([`Communicator::queue_slices`]).

use std::collections::VecDeque;
use std::sync::Arc;

use ferroccl_kernels::Element;

use crate::coll::CollKind;
use crate::device::gate::Gate;
use crate::device::staging::Cut;
use crate::device::stream_queue::{landing, record_gates, StreamQueue, Work};
use crate::device::stream_stage::{RangeGroup, Staged, Window};
use crate::device::{Device, DeviceBuffer};
use crate::Result;

use super::call::header_kind;
use super::device_streams::{arena_bytes_at, arena_bytes_mut_at, Held};
use super::*;

/// One device collective on a stream, as [`Communicator::queue_slices`] cuts it: device
/// addresses and lengths in elements.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sliced {
    /// The device and the caller's stream of it.
    pub dev: Device,
    pub handle: usize,
    /// How the call is cut (`device_calls::cut`), and its element size.
    pub cut: Cut,
    pub es: usize,
    /// The send buffer's address and the elements the call reads of it (`None`: in place,
    /// or not read, as a broadcast's non-root).
    pub read: Option<(u64, usize)>,
    /// The receive buffer's address and length (in place: the one buffer, holding the larger
    /// of the input's and the output's blocks).
    pub recv: (u64, usize),
    /// In place: the receive buffer is read too.
    pub in_place: bool,
    /// Whether the receive buffer is written (not a reduce's non-root).
    pub written: bool,
}

/// What one slice's job works on: host addresses in the arena and lengths in bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SliceJob {
    /// The slice's count.
    pub count: usize,
    /// Its input (`None` in place; a length of 0 where the call reads nothing).
    pub input: Option<(usize, usize)>,
    /// Its output.
    pub output: (usize, usize),
}

impl Sliced {
    /// Bytes of the stream's arena the call takes: room for the slices in flight.
    pub(crate) fn arena_bytes(&self) -> usize {
        Window::bytes(self.place_bytes(), self.cut.in_flight())
    }

    /// Blocks the receive buffer holds.
    fn recv_blocks(&self) -> usize {
        if self.in_place {
            self.cut.in_blocks.max(self.cut.out_blocks)
        } else {
            self.cut.out_blocks
        }
    }

    /// Bytes one slice's place takes: its input's parts at a 256-byte boundary, then its
    /// output's.
    fn place_bytes(&self) -> usize {
        let (cut, es) = (self.cut, self.es);
        let in_len = self.read.map_or(0, |r| r.1);
        (cut.slice_elems(cut.in_blocks, in_len) * es).next_multiple_of(ALIGN_INPUT)
            + cut.slice_elems(self.recv_blocks(), self.recv.1) * es
    }
}

impl Communicator {
    /// The [`Sliced`] form of checked collective `kind` on these device buffers.
    fn sliced<T: Element>(
        &self,
        dev: Device,
        handle: usize,
        kind: CollKind,
        send: Option<&DeviceBuffer<T>>,
        recv: &DeviceBuffer<T>,
        count: usize,
    ) -> Sliced {
        let es = T::DTYPE.size();
        let is_root = kind.root() == Some(self.inner.rank);
        let send_read = !matches!(kind, CollKind::Broadcast { .. }) || is_root;
        Sliced {
            dev,
            handle,
            cut: super::device_calls::cut(&self.inner, kind, count, es),
            es,
            read: send.filter(|_| send_read).map(|s| (s.addr(), s.len())),
            recv: (recv.addr(), recv.len()),
            in_place: send.is_none(),
            written: !matches!(kind, CollKind::Reduce { .. }) || is_root,
        }
    }

    /// Bytes of the stream's arena [`Communicator::run_slices_on`] takes for this call.
    pub(super) fn slices_arena_bytes<T: Element>(
        &self,
        dev: Device,
        kind: CollKind,
        send: Option<&DeviceBuffer<T>>,
        recv: &DeviceBuffer<T>,
        count: usize,
    ) -> usize {
        self.sliced(dev, 0, kind, send, recv, count).arena_bytes()
    }

    /// Queues checked collective `kind` on the caller's stream `handle` of `dev` as jobs, one
    /// per slice.
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
    ) -> Result<()> {
        let call = self.sliced(dev, handle, kind, send, recv, count);
        let keep = (Held::of(recv), send.map(Held::of));
        let in_place = call.in_place;
        let job = |j: SliceJob| -> Work {
            let inner = Arc::clone(&self.inner);
            Box::new(move || {
                // SAFETY: the ranges are the arena copies of this slice of the buffers (0 bytes
                // where empty), which the stream filled before the gate the worker waited for,
                // and which no other job uses (a place is copied into again only after this
                // job's flag and copies back; a later call's copies in come after those too).
                let (input, output) = unsafe {
                    let output = arena_bytes_mut_at(j.output.0, j.output.1);
                    let input: Option<&[u8]> = match j.input {
                        None if in_place => None,
                        None => Some(&[]),
                        Some((at, n)) => Some(arena_bytes_at(at, n)),
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
                    j.count,
                    T::DTYPE,
                    op,
                )
            })
        };
        // SAFETY: both buffers are live device memory of `dev` (checked by the caller), held
        // by the last job (`keep`) until the stream has run every copy back; `handle` is the
        // caller's stream of `dev`.
        unsafe { self.queue_slices(&self.streams, &call, keep, job) }
    }

    /// Grows the arena of `call`'s stream in `queue` to what [`Communicator::queue_slices`]
    /// takes for it (nothing is copied), so that calls queued after it need no larger one.
    #[cfg(feature = "capi")]
    pub(crate) fn reserve_slices(&self, queue: &StreamQueue, call: &Sliced) -> Result<()> {
        let window = call.cut.in_flight();
        queue
            .window(call.dev, call.handle, call.place_bytes(), window)
            .map(drop)
    }

    /// Queues `call` on its stream as one job per slice of `queue` (this communicator's, or the
    /// C ABI's queue of it), `job` making each slice's work, the last job holding `keep` until
    /// the stream has copied every slice back (see [`Communicator::queue_rounds`]).
    ///
    /// # Safety
    /// The call's ranges are live device memory of `call.dev` that stays the call's until the
    /// stream has run past it (what `keep` holds, or NCCL's contract); `call.handle` is the
    /// caller's stream of that device.
    pub(crate) unsafe fn queue_slices<K: Send + 'static>(
        &self,
        queue: &StreamQueue,
        call: &Sliced,
        keep: K,
        mut job: impl FnMut(SliceJob) -> Work,
    ) -> Result<()> {
        let Sliced {
            dev,
            handle,
            cut,
            es,
            read,
            recv,
            in_place,
            written,
        } = *call;
        let recv_blocks = call.recv_blocks();
        // Device ranges (address, bytes) of slice `k`'s parts of a buffer.
        let parts = |k: usize, (addr, len): (u64, usize), blocks: usize| -> Vec<(u64, usize)> {
            cut.parts(k, blocks, len)
                .into_iter()
                .map(|(first, n)| (addr + (first * es) as u64, n * es))
                .collect()
        };
        // Slice `k` in its place: the input's parts first (out of place), one after another,
        // then the output's (read too in place).
        let groups = |k: usize| -> Vec<RangeGroup> {
            let input = RangeGroup {
                ranges: read.map_or(Vec::new(), |r| parts(k, r, cut.in_blocks)),
                read: true,
                written: false,
            };
            let output = RangeGroup {
                ranges: parts(k, recv, recv_blocks),
                read: in_place,
                written,
            };
            vec![input, output]
        };
        let rounds = Rounds {
            dev,
            handle,
            rounds: cut.slices.max(1),
            window: cut.in_flight(),
            place: call.place_bytes(),
        };
        let slice_job = |k: usize, st: &Staged| -> Work {
            let n_in = read.map_or(0, |r| cut.parts(k, cut.in_blocks, r.1).len());
            let bytes = |from: usize, to: usize| (from..to).map(|i| st.len_at(i)).sum();
            job(SliceJob {
                count: cut.range(k).len(),
                input: read.map(|_| (st.host_at(0).unwrap_or(0), bytes(0, n_in))),
                output: (st.host_at(n_in).unwrap_or(0), bytes(n_in, st.len())),
            })
        };
        // SAFETY: per this function's contract.
        unsafe { self.queue_rounds(queue, &rounds, groups, keep, slice_job) }
    }

    /// Queues a stream call of `r.rounds` rounds as one job each on the caller's stream, `r.window`
    /// rounds staged at once in places of `r.place` bytes of the stream's arena (round `k` in
    /// place `k mod window`): the first rounds' copies in, each followed by its gate; then, per
    /// round, the wait for its job's flag, its copies back, and the copies in (and gate) of the
    /// round that takes its place next. `groups(k)` gives round `k`'s device ranges, `job(k,
    /// staged)` its work on their arena copies; the last job holds `keep` until the stream has
    /// copied every round back. Cut short after some jobs were queued, the communicator fails
    /// (the jobs queued would leave the call half run, out of step with the peers) and the
    /// stream is waited for before the error returns.
    ///
    /// # Safety
    /// Every range `groups` gives is live device memory of `r.dev` that stays the call's until
    /// the stream has run past it (what `keep` holds, or NCCL's contract); `r.handle` is the
    /// caller's stream of that device.
    pub(crate) unsafe fn queue_rounds<K: Send + 'static>(
        &self,
        queue: &StreamQueue,
        r: &Rounds,
        groups: impl Fn(usize) -> Vec<RangeGroup>,
        keep: K,
        mut job: impl FnMut(usize, &Staged) -> Work,
    ) -> Result<()> {
        let Rounds {
            dev,
            handle,
            rounds,
            window,
            place,
        } = *r;
        let window = window.clamp(1, rounds.max(1));
        let room = queue.window(dev, handle, place, window)?;
        let stage = |k: usize| room.slice(k, &groups(k));
        // The copies in of round `k`, then its gate.
        let copy_in = |st: &Staged| -> Result<Vec<Gate>> {
            for i in (0..st.len()).filter(|&i| st.flags_at(i).0) {
                // SAFETY: per the caller for the device range, one the call reads; its place
                // is free: the round that had it before was copied back earlier on this
                // stream, and a call before this one copied its last round back before this
                // call's first copy in.
                unsafe { st.copy_range(i, true) }?;
            }
            record_gates(dev, &[handle])
        };
        let mut keep = Some(keep);
        let mut queued = 0usize;
        let mut issue = || -> Result<()> {
            let mut ahead = VecDeque::with_capacity(window);
            for k in 0..window {
                let staged = stage(k)?;
                let gate = copy_in(&staged)?;
                ahead.push_back((staged, gate));
            }
            for k in 0..rounds {
                let Some((st, gate)) = ahead.pop_front() else {
                    return Err(crate::Error::internal(format!(
                        "stream rounds: round {k} of {rounds} was never staged"
                    )));
                };
                let round = job(k, &st);
                // A round that fails fails the communicator: the rounds after it then fail at
                // once instead of running out of step with the peers.
                let inner = Arc::clone(&self.inner);
                let work: Work = Box::new(move || {
                    let r = round();
                    if let Err(e) = &r {
                        inner.fail_and_tell(e.clone());
                    }
                    r
                });
                // The last job waits, after its flag, until the stream has run every copy back
                // (they run in order), then lets the buffers go.
                let last = k + 1 == rounds;
                let (landed, after) = match if last { keep.take() } else { None } {
                    Some(h) => {
                        let (l, a) = landing(h);
                        (Some(l), Some(a))
                    }
                    None => (None, None),
                };
                queue.enqueue(dev, &[handle], gate, work, after)?;
                queued += 1;
                for i in (0..st.len()).filter(|&i| st.flags_at(i).1) {
                    // SAFETY: as for the copies in; the range is one the call writes, queued
                    // after this job's flag wait.
                    unsafe { st.copy_range(i, false) }?;
                }
                // The round that takes this place next is copied in after these copies back.
                if k + window < rounds {
                    let next = stage(k + window)?;
                    let gate = copy_in(&next)?;
                    ahead.push_back((next, gate));
                }
                if let Some(l) = landed {
                    let g = record_gates(dev, &[handle])?;
                    let _ = l.send(g);
                }
            }
            Ok(())
        };
        let Err(e) = issue() else {
            return Ok(());
        };
        if queued > 0 {
            self.inner.fail_and_tell(e.clone());
        }
        // SAFETY: `handle` is the caller's stream of `dev` (the caller's contract); every
        // flag it waits on belongs to a job already queued, which stores it.
        let _ = unsafe { dev.sync_stream(std::ptr::without_provenance_mut(handle)) };
        drop(keep);
        Err(e)
    }
}

/// A stream call in rounds ([`Communicator::queue_rounds`]): the device and the caller's
/// stream of it, how many rounds, how many staged at once, and the bytes of a round's place.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rounds {
    pub dev: Device,
    pub handle: usize,
    pub rounds: usize,
    pub window: usize,
    pub place: usize,
}

/// Where an output part starts after its slice's input part: the arena places every range
/// at a multiple of this ([`Window::slice`]).
pub(super) const ALIGN_INPUT: usize = 256;

#[cfg(test)]
mod tests {
    use crate::device::{Device, DeviceBuffer, DeviceStream, Provider};
    use crate::{Communicator, Config, ReduceOp};

    /// A call of many slices stages only the slices in flight in the stream's arena: 1021
    /// floats in 64-byte slices are 64 jobs, and the arena holds 4 places of one slice's input
    /// and output, not the call.
    #[test]
    fn the_arena_holds_the_slices_in_flight_not_the_call() {
        let dev = Device::new(Provider::Host, 0).unwrap();
        let config = Config {
            device_slice_bytes: Some(64),
            ..Config::default()
        };
        let comms = Communicator::local_group(2, config).unwrap();
        let count = 1021usize;
        let value = |r: usize, i: usize| (i * 3 + r * 5000) as f32;
        std::thread::scope(|sc| {
            for c in &comms {
                sc.spawn(move || {
                    c.set_device(dev).unwrap();
                    let r = c.rank();
                    let s = DeviceStream::new(dev).unwrap();
                    let mine: Vec<f32> = (0..count).map(|i| value(r, i)).collect();
                    let sum: Vec<f32> = (0..count).map(|i| value(0, i) + value(1, i)).collect();
                    let send = DeviceBuffer::from_host(dev, &mine).unwrap();
                    let mut out = DeviceBuffer::<f32>::new(dev, count).unwrap();
                    c.all_reduce_device_on(&send, &mut out, ReduceOp::Sum, &s)
                        .unwrap();
                    let mut buf = DeviceBuffer::from_host(dev, &mine).unwrap();
                    c.all_reduce_device_in_place_on(&mut buf, ReduceOp::Sum, &s)
                        .unwrap();
                    // Reduce to rank 1: rank 0's output is neither read nor written.
                    let mut red = DeviceBuffer::from_host(dev, &vec![-1.0f32; count]).unwrap();
                    c.reduce_device_on(&send, &mut red, ReduceOp::Sum, 1, &s)
                        .unwrap();
                    s.synchronize().unwrap();
                    assert_eq!(out.to_vec().unwrap(), sum, "rank {r}: out of place");
                    assert_eq!(buf.to_vec().unwrap(), sum, "rank {r}: in place");
                    let want = if r == 1 {
                        sum.clone()
                    } else {
                        vec![-1.0; count]
                    };
                    assert_eq!(red.to_vec().unwrap(), want, "rank {r}: reduce");
                    let arena = c.streams.arena_bytes();
                    // A place: 64 input bytes at a 256-byte boundary, then 64 output bytes.
                    assert!(arena <= 4 * 512, "rank {r}: arena of {arena} bytes");
                    assert!(c.async_error().is_none());
                });
            }
        });
    }
}
