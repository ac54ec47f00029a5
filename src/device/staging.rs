//! Pinned host staging: how device data crosses the host-only transports (shm, TCP).
//!
//! A communicator keeps one [`Staging`] per bound device: a stream and two page-locked host
//! buffers (input and output), grown to the largest need seen and reused afterwards, so calls
//! after the first of their size allocate nothing. A collective cut into slices needs room for
//! [`SLICES_IN_FLIGHT`] slices, whatever its size; one staged whole needs its buffers' size. A device collective copies its device input
//! into the input buffer (device to host, on the stream), runs the host schedule on the
//! staging buffers, then copies the output buffer back (host to device): [`Staging::pipeline`]
//! does so in slices whose copies overlap the other slices' transfers (element-wise
//! collectives), or in one piece (the others). A group's sends and receives stage their
//! buffers piece by piece, the pieces of one round one after another in the input and output
//! buffers ([`Staging::pipeline_spans`], in `spans`). Completion is synchronous: every call
//! waits for its copies before returning.

use std::ops::Range;

use ferroccl_kernels::Element;

use super::{cuda, host, Device, DeviceBuffer, Provider};
use crate::{Error, Result};

mod spans;
pub(crate) use spans::{piece_range, pieces, RoundViews, Span};

/// Page-locked host memory (plain heap memory with the host stand-in), zeroed at allocation,
/// freed on drop.
#[derive(Debug)]
pub(crate) struct Pinned {
    device: Device,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the memory is owned by this value alone; it is host memory any thread may touch.
unsafe impl Send for Pinned {}

impl Pinned {
    pub(crate) fn new(device: Device, len: usize) -> Result<Pinned> {
        let ptr = match device.provider {
            Provider::Cuda => cuda::alloc_pinned(device.ordinal, len)?,
            Provider::Host => host::alloc_pinned(len)?,
        };
        // SAFETY: just allocated with at least `len` writable bytes; zeroed so that the slices
        // below never expose uninitialised memory.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        Ok(Pinned { device, ptr, len })
    }

    /// The start of the memory and its length in bytes.
    pub(crate) fn raw(&self) -> (*mut u8, usize) {
        (self.ptr, self.len)
    }

    /// The device whose driver allocated it.
    #[cfg_attr(not(feature = "capi"), allow(dead_code))]
    pub(crate) fn device(&self) -> Device {
        self.device
    }

    /// The first `n` (`<= len`) bytes as elements of `T`.
    fn typed<T: Element>(&mut self, n: usize) -> &mut [T] {
        assert!(
            n * T::DTYPE.size() <= self.len,
            "staging checked by reserve"
        );
        // SAFETY: `ptr` holds `len` initialised bytes owned by `self` (borrowed mutably), is
        // aligned to at least 256 bytes (every element type's alignment divides it), and every
        // bit pattern is a valid `T` (plain numeric element types).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.cast::<T>(), n) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let r = match self.device.provider {
            // SAFETY: allocated in `new`; freed once, here; every copy queued on it completed
            // before the call that queued it returned.
            Provider::Cuda => unsafe { cuda::free_pinned(self.device.ordinal, self.ptr) },
            Provider::Host => {
                // SAFETY: as above, with the length it was allocated with.
                unsafe { host::free_pinned(self.ptr, self.len) };
                Ok(())
            }
        };
        if let Err(e) = r {
            ferroccl_transport::log_line!("ferroccl WARN DEVICE: freeing staging memory: {e}");
        }
    }
}

/// A stream of the provider.
#[derive(Debug)]
enum Stream {
    Cuda(cuda::Stream),
    Host(host::Queue),
}

impl Stream {
    fn new(device: Device) -> Result<Stream> {
        super::no_driver_here("a staging stream")?;
        Ok(match device.provider {
            Provider::Cuda => Stream::Cuda(cuda::Stream::new(device.ordinal)?),
            Provider::Host => Stream::Host(host::Queue::default()),
        })
    }

    /// # Safety
    /// `src` device memory of the stream's device, `dst` host memory, both live for `len`
    /// bytes until [`Stream::synchronize`] returns.
    unsafe fn download(&mut self, dst: *mut u8, src: u64, len: usize) -> Result<()> {
        super::no_driver_here("a staging copy")?;
        match self {
            // SAFETY: per the caller.
            Stream::Cuda(s) => unsafe { s.download(dst, src, len) },
            Stream::Host(q) => {
                // SAFETY: per the caller.
                unsafe { q.copy(dst, src as *const u8, len) };
                Ok(())
            }
        }
    }

    /// # Safety
    /// `src` host memory, `dst` device memory of the stream's device, both live for `len`
    /// bytes until [`Stream::synchronize`] returns.
    unsafe fn upload(&mut self, dst: u64, src: *const u8, len: usize) -> Result<()> {
        super::no_driver_here("a staging copy")?;
        match self {
            // SAFETY: per the caller.
            Stream::Cuda(s) => unsafe { s.upload(dst, src, len) },
            Stream::Host(q) => {
                // SAFETY: per the caller.
                unsafe { q.copy(dst as *mut u8, src, len) };
                Ok(())
            }
        }
    }

    fn mark(&mut self, k: usize) -> Result<()> {
        match self {
            Stream::Cuda(s) => s.mark(k),
            Stream::Host(q) => {
                q.mark(k);
                Ok(())
            }
        }
    }

    fn wait_mark(&mut self, k: usize) -> Result<()> {
        match self {
            Stream::Cuda(s) => s.wait_mark(k),
            Stream::Host(q) => q.wait_mark(k),
        }
    }

    fn synchronize(&mut self) -> Result<()> {
        match self {
            Stream::Cuda(s) => s.synchronize(),
            Stream::Host(q) => {
                q.synchronize();
                Ok(())
            }
        }
    }
}

/// Which staging buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// The collective's input (a device send buffer, staged in).
    Input,
    /// The collective's output (a device receive buffer, staged out; in place: both).
    Output,
}

/// A communicator's staging for one device: a stream and two pinned buffers, cached.
#[derive(Debug)]
pub(crate) struct Staging {
    // Declared first: dropped (synchronized and destroyed) before the buffers it copies.
    stream: Stream,
    device: Device,
    input: Option<Pinned>,
    output: Option<Pinned>,
    /// Buffers replaced by larger ones, freed when the staging drops (see `reserve`).
    retired: Vec<Pinned>,
    /// Pinned allocations made so far (for the no-per-call-allocation test).
    allocations: u64,
}

impl Staging {
    /// Staging for `device`: its stream now, buffers at the first call.
    pub(crate) fn new(device: Device) -> Result<Staging> {
        Ok(Staging {
            stream: Stream::new(device)?,
            device,
            input: None,
            output: None,
            retired: Vec::new(),
            allocations: 0,
        })
    }

    /// The device it serves.
    pub(crate) fn device(&self) -> Device {
        self.device
    }

    /// Pinned allocations made so far.
    pub(crate) fn allocations(&self) -> u64 {
        self.allocations
    }

    /// Bytes of pinned memory held now (the buffers, and those replaced by larger ones).
    pub(crate) fn bytes(&self) -> usize {
        let held = self.input.iter().chain(&self.output).chain(&self.retired);
        held.map(|p| p.len).sum()
    }

    fn slot(&mut self, s: Slot) -> &mut Option<Pinned> {
        match s {
            Slot::Input => &mut self.input,
            Slot::Output => &mut self.output,
        }
    }

    /// Makes the buffers hold at least `input` and `output` bytes (kept if large enough,
    /// else replaced by one of the next power of two). Call before staging anything in.
    pub(crate) fn reserve(&mut self, input: usize, output: usize) -> Result<()> {
        for (s, need) in [(Slot::Input, input), (Slot::Output, output)] {
            let device = self.device;
            let cur = self.slot(s).as_ref().map_or(0, |p| p.len);
            if need > cur {
                let p = Pinned::new(device, need.next_power_of_two())?;
                // Not freed here: freeing page-locked memory synchronizes the whole device,
                // which waits for any caller's stream held at a stream job's flag, and that
                // job may need a rank this thread has yet to drive. Kept until the staging
                // drops (at most as much again as the largest buffer).
                if let Some(old) = self.slot(s).replace(p) {
                    self.retired.push(old);
                }
                self.allocations += 1;
            }
        }
        Ok(())
    }

    fn checked(&mut self, s: Slot, bytes: usize) -> Result<*mut u8> {
        match self.slot(s) {
            Some(p) if p.len >= bytes => Ok(p.ptr),
            // Aligned for every element type (at most 8 bytes); never dereferenced.
            _ if bytes == 0 => Ok(std::ptr::NonNull::<u64>::dangling().as_ptr().cast()),
            _ => Err(Error::internal(format!(
                "device staging: {s:?} buffer not reserved for {bytes} bytes"
            ))),
        }
    }

    /// Copies `src` (device) into the start of staging buffer `s` and waits for the copy.
    pub(crate) fn stage_in<T: Element>(&mut self, s: Slot, src: &DeviceBuffer<T>) -> Result<()> {
        self.same_device(src.device)?;
        let dst = self.checked(s, src.bytes())?;
        // SAFETY: `dst` holds at least `src.bytes()` bytes (reserved) owned by `self`, and
        // `src` owns that many bytes of device memory of this stream's device; both stay
        // borrowed until the synchronize below returns.
        unsafe { self.stream.download(dst, src.addr, src.bytes())? };
        self.stream.synchronize()
    }

    /// Copies the start of staging buffer `s` into `dst` (device) and waits for the copy.
    pub(crate) fn stage_out<T: Element>(
        &mut self,
        s: Slot,
        dst: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        self.same_device(dst.device)?;
        let src = self.checked(s, dst.bytes())?;
        // SAFETY: as in `stage_in`, with the direction reversed; `dst` is borrowed mutably.
        unsafe { self.stream.upload(dst.addr, src, dst.bytes())? };
        self.stream.synchronize()
    }

    /// The staging buffers as `input` and `output` elements of `T` (both reserved).
    pub(crate) fn buffers<T: Element>(
        &mut self,
        input: usize,
        output: usize,
    ) -> Result<(&mut [T], &mut [T])> {
        let es = T::DTYPE.size();
        self.checked(Slot::Input, input * es)?;
        self.checked(Slot::Output, output * es)?;
        let i = match &mut self.input {
            Some(p) => p.typed(input),
            None => &mut [],
        };
        let o = match &mut self.output {
            Some(p) => p.typed(output),
            None => &mut [],
        };
        Ok((i, o))
    }

    /// Runs one collective through the staging buffers, cut as `cut` says, the slices'
    /// copies overlapping the work on the others. The staging holds [`SLICES_IN_FLIGHT`]
    /// slices at most ([`Cut::staged`]), whatever the call's size: slice `k` lives in place `k
    /// mod` that many. The device-to-host copies of the first slices are queued at once, each
    /// followed by a mark; slice `k` waits only for its own mark, runs `run(count_k, input,
    /// output)` on the host, queues its host-to-device copies and then the copies in of the
    /// slice that takes its place next (the stream runs them in that order), so the copies in
    /// and out of the other slices proceed while `run` moves slice `k` over the transports.
    ///
    /// `src: None` is in place: `dst` (holding the larger of the input's and the output's
    /// blocks) is read into the output buffer. Otherwise `src` is read into the input buffer
    /// when `read`. `dst` is written back when `write`. `run` gets slice `k`'s blocks one
    /// after another ([`Cut::parts`]; the whole buffers for one slice), and `None` as input in
    /// place. Buffers must be reserved first ([`Cut::staged`] elements of each). Returns after
    /// every queued copy has completed, also when `run` fails (or panics).
    pub(crate) fn pipeline<T: Element>(
        &mut self,
        src: Option<&DeviceBuffer<T>>,
        dst: &mut DeviceBuffer<T>,
        read: bool,
        write: bool,
        cut: Cut,
        mut run: impl FnMut(usize, Option<&[T]>, &mut [T]) -> Result<()>,
    ) -> Result<()> {
        let es = T::DTYPE.size();
        let slices = cut.slices.max(1);
        if let Some(s) = src {
            self.same_device(s.device)?;
        }
        self.same_device(dst.device)?;
        let in_place = src.is_none();
        let in_len = if in_place {
            0
        } else {
            src.filter(|_| read).map_or(0, DeviceBuffer::len)
        };
        let out_len = dst.len();
        let in_blocks = cut.in_blocks;
        let out_blocks = if in_place {
            cut.in_blocks.max(cut.out_blocks)
        } else {
            cut.out_blocks
        };
        let in_ptr = self.checked(Slot::Input, cut.staged(in_blocks, in_len) * es)?;
        let out_ptr = self.checked(Slot::Output, cut.staged(out_blocks, out_len) * es)?;
        let window = cut.in_flight();
        let (read_ptr, read_addr, read_len, read_blocks) = match src {
            None => (out_ptr, dst.addr, out_len, out_blocks),
            Some(s) if read => (in_ptr, s.addr, in_len, in_blocks),
            Some(_) => (in_ptr, 0, 0, in_blocks),
        };
        let dst_addr = dst.addr;
        // Queues slice `k`'s copies in, then its mark.
        let copy_in = |stream: &mut Stream, k: usize| -> Result<()> {
            let mut at = cut.place(k, read_blocks);
            for (first, n) in cut.parts(k, read_blocks, read_len) {
                // SAFETY: `read_ptr + at` lies in the room for slice `k`'s place (reserved
                // for `Cut::staged`, checked above; a place holds a slice's parts) and the
                // device buffer holds `read_len` elements, the part among them (it is `src`
                // or `dst`, borrowed for this call); every queued copy completes before this
                // function returns (synchronize below, on every path).
                unsafe {
                    stream.download(
                        read_ptr.add(at * es),
                        read_addr + (first * es) as u64,
                        n * es,
                    )?
                };
                at += n;
            }
            stream.mark(k % window)
        };
        self.guarded(|stream| {
            crate::profile::phase(crate::profile::Phase::Stage);
            for k in 0..window {
                copy_in(stream, k)?;
            }
            for k in 0..slices {
                crate::profile::phase(crate::profile::Phase::Stage);
                stream.wait_mark(k % window)?;
                let in_n: usize = cut.parts(k, in_blocks, in_len).iter().map(|p| p.1).sum();
                let out_parts = cut.parts(k, out_blocks, out_len);
                let out_n: usize = out_parts.iter().map(|p| p.1).sum();
                let (in_at, out_at) = (cut.place(k, in_blocks), cut.place(k, out_blocks));
                let input: Option<&[T]> = match (in_place, in_n) {
                    (true, _) => None,
                    (false, 0) => Some(&[]),
                    // SAFETY: the range lies in the reserved buffer (slice `k`'s place);
                    // slice `k`'s downloads have completed (its mark was waited for), no
                    // other queued copy touches its place (the slices in flight have places
                    // of their own, and the slice that takes this place next is copied in
                    // only after this slice's uploads, which are queued only after `run`
                    // returns and the slices are dropped).
                    (false, n) => Some(unsafe {
                        std::slice::from_raw_parts(in_ptr.add(in_at * es).cast::<T>(), n)
                    }),
                };
                let output: &mut [T] = if out_n == 0 {
                    &mut []
                } else {
                    // SAFETY: as above.
                    unsafe {
                        std::slice::from_raw_parts_mut(out_ptr.add(out_at * es).cast::<T>(), out_n)
                    }
                };
                run(cut.range(k).len(), input, output)?;
                crate::profile::phase(crate::profile::Phase::Stage);
                if write {
                    let mut at = out_at;
                    for (first, n) in out_parts {
                        // SAFETY: `dst` holds `out_len` elements, the part among them, and is
                        // borrowed mutably for this call; the staging range stays untouched
                        // until this upload has run (the next copy into this place is queued
                        // after it on the same stream).
                        unsafe {
                            stream.upload(
                                dst_addr + (first * es) as u64,
                                out_ptr.add(at * es),
                                n * es,
                            )?
                        };
                        at += n;
                    }
                }
                if k + window < slices {
                    copy_in(stream, k + window)?;
                }
            }
            Ok(())
        })
    }

    /// Runs `body` with the stream, then waits for every copy it queued, also when it fails
    /// or panics (the copies may use memory the caller frees after): `body`'s error first,
    /// then the wait's.
    fn guarded(&mut self, body: impl FnOnce(&mut Stream) -> Result<()>) -> Result<()> {
        let stream = &mut self.stream;
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(stream)));
        let synced = self.stream.synchronize();
        match r {
            Ok(r) => r.and(synced),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    fn same_device(&self, d: Device) -> Result<()> {
        if d != self.device {
            return Err(Error::internal(format!(
                "device staging for {} given a buffer on {d}",
                self.device
            )));
        }
        Ok(())
    }
}

/// How many slices of a device collective are staged at once: the pinned memory a call
/// takes is this many slices (of `FERRO_DEVICE_SLICE_BYTES`), not the call's size, and while
/// one slice moves over the transports the copies of the others proceed.
pub(crate) const SLICES_IN_FLIGHT: usize = 4;

/// The bytes of one buffer's slices in flight that a call cut into slices larger than 4 MiB
/// keeps to: [`SLICES_IN_FLIGHT`] slices of 4 MiB.
pub(crate) const WINDOW_BYTES: usize = SLICES_IN_FLIGHT * (4 << 20);

/// How many of a call's `slices`, of about `slice_bytes` each, are staged at once:
/// [`SLICES_IN_FLIGHT`] at most, fewer for slices larger than 4 MiB (their places take about
/// [`WINDOW_BYTES`] of each buffer: 64 MiB slices, 2 places, 256 MiB of a stream's arena out
/// of place, within what stays in stream order), and never fewer than 2, so that a slice's
/// copies still overlap another's transfer.
pub(crate) fn slices_in_flight(slices: usize, slice_bytes: usize) -> usize {
    let most = (WINDOW_BYTES / slice_bytes.max(1)).clamp(2, SLICES_IN_FLIGHT);
    slices.clamp(1, most)
}

/// How a device collective is cut into slices, the same on every path: `count` elements per
/// block, `slices` slices, and how many blocks of `count` its input and its output hold (1,
/// or nranks for the blocked layouts: all_gather's output, reduce_scatter's input,
/// all_to_all's both). Slice `k` is elements [`slice_range`] `k` of every block; a slice's
/// blocks are staged one after another, the layout of the collective of that slice's count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cut {
    pub count: usize,
    pub slices: usize,
    pub in_blocks: usize,
    pub out_blocks: usize,
    /// Slices staged at once ([`slices_in_flight`]): a rank's own choice, which its peers do
    /// not see.
    pub window: usize,
}

impl Cut {
    /// The call whole, element-wise buffers (`count` elements each).
    #[cfg(test)]
    pub(crate) fn elementwise(count: usize, slices: usize) -> Cut {
        Cut {
            count,
            slices,
            in_blocks: 1,
            out_blocks: 1,
            window: slices_in_flight(slices, 0),
        }
    }

    /// Elements of each block in slice `k` (the slice's count).
    pub(crate) fn range(&self, k: usize) -> Range<usize> {
        slice_range(self.count, self.slices, self.count, k)
    }

    /// Slice `k`'s parts of a buffer of `len` elements holding `blocks` blocks: (first
    /// element, elements) in the buffer, in staging order. One slice: the whole buffer.
    pub(crate) fn parts(&self, k: usize, blocks: usize, len: usize) -> Vec<(usize, usize)> {
        if self.slices <= 1 {
            return vec![(0, len)];
        }
        let r = self.range(k);
        (0..blocks)
            .map(|b| {
                let start = (b * self.count + r.start).min(len);
                let end = (b * self.count + r.end).min(len);
                (start, end - start)
            })
            .filter(|&(_, n)| n > 0)
            .collect()
    }

    /// Where slice `k` of a buffer holding `blocks` blocks starts in its staging, in elements:
    /// slices in flight at once have places of their own, one after another, and a later slice
    /// takes the place of the slice [`slices_in_flight`] before it.
    pub(crate) fn place(&self, k: usize, blocks: usize) -> usize {
        if self.slices <= 1 {
            return 0;
        }
        (k % self.in_flight()) * blocks * self.per()
    }

    /// The most elements one slice of a buffer of `len` elements holding `blocks` blocks
    /// stages.
    pub(crate) fn slice_elems(&self, blocks: usize, len: usize) -> usize {
        if self.slices <= 1 {
            return len;
        }
        (blocks * self.per()).min(len)
    }

    /// The staging elements a buffer of `len` elements holding `blocks` blocks takes: the
    /// whole buffer for one slice, else the places of the slices in flight (clipped to the
    /// buffer).
    pub(crate) fn staged(&self, blocks: usize, len: usize) -> usize {
        if self.slices <= 1 {
            return len;
        }
        (self.in_flight() * blocks * self.per()).min(len)
    }

    /// Slices staged at once (one place each).
    pub(crate) fn in_flight(&self) -> usize {
        self.window.clamp(1, self.slices.max(1))
    }

    fn per(&self) -> usize {
        self.count.div_ceil(self.slices.max(1)).max(1)
    }
}

/// Elements of slice `k` of a buffer of `len` elements, when a call of `count` elements is cut
/// into `slices`: the whole buffer for one slice; otherwise `k * per .. (k + 1) * per` with
/// `per = count / slices` rounded up, clipped to `len`. Staged and direct device collectives
/// both cut calls this way, so their messages are the same.
pub(crate) fn slice_range(count: usize, slices: usize, len: usize, k: usize) -> Range<usize> {
    if slices <= 1 {
        return 0..len;
    }
    let per = count.div_ceil(slices).max(1);
    (k * per).min(len)..((k + 1) * per).min(len)
}

#[cfg(test)]
mod tests;
