//! Staging of a stream job that leaves the queue's thread no driver call.
//!
//! A call made with a stream becomes, on the caller's stream and in this order: copies of the
//! device ranges it reads into pinned host memory (the stream's *arena*), a gate (a word the
//! stream writes once the copies are done), the wait on the communicator's completion flag,
//! and copies of the ranges it writes back from the arena. Everything is queued by the
//! caller's thread during the call. The queue's thread waits for the gate by polling host
//! memory, runs the operation on the arena as on host buffers, and stores the flag, so it
//! never calls the driver: on a GPU, a driver call there blocked while the program's thread
//! was in a synchronous legacy-stream copy that itself waited for the job (docs/CUDA.md, "On
//! a GPU").
//!
//! Jobs on one stream share its arena: the stream runs a job's copies in only after the
//! previous job's flag and copies back, so the previous job is done with it. A larger job
//! replaces the arena; the old one is kept until the queue drops (a queued copy may still use
//! it, and freeing page-locked memory synchronizes the device).

use super::staging::Pinned;
use super::Device;
use crate::Result;

/// A range of device memory an operation reads (copied in before it) and/or writes (copied
/// back after it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    pub addr: u64,
    pub len: usize,
    pub read: bool,
    pub written: bool,
}

/// Device ranges staged one after another as one host buffer ([`Window::slice`]): whether
/// they are read (copied in before the job) and written (copied back after it).
#[derive(Debug, Clone, Default)]
pub(crate) struct RangeGroup {
    pub ranges: Vec<(u64, usize)>,
    pub read: bool,
    pub written: bool,
}

/// Where the arena places each range, for one stream.
#[derive(Debug)]
pub(crate) struct Staged {
    device: Device,
    stream: usize,
    /// Merged ranges: device start, length, host address, read, written.
    spans: Vec<(u64, usize, usize, bool, bool)>,
}

/// Alignment of every range in an arena (any element type, 16-byte vector loads).
const ALIGN: usize = 256;

impl Staged {
    /// The host copy of device address `addr`, where a staged range holds it.
    #[cfg(any(feature = "capi", test))]
    pub(crate) fn host_of(&self, addr: u64) -> Option<usize> {
        self.spans
            .iter()
            .find(|&&(start, len, ..)| addr >= start && addr < start + len as u64)
            .map(|&(start, _, host, ..)| host + (addr - start) as usize)
    }

    /// The arena address of staged range `i` (in the order they were placed).
    pub(crate) fn host_at(&self, i: usize) -> Option<usize> {
        self.spans.get(i).map(|s| s.2)
    }

    /// The bytes of staged range `i` (0 past the last).
    pub(crate) fn len_at(&self, i: usize) -> usize {
        self.spans.get(i).map_or(0, |s| s.1)
    }

    /// How many ranges are staged.
    pub(crate) fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether staged range `i` is read (copied in before the job) and written (copied back
    /// after it).
    pub(crate) fn flags_at(&self, i: usize) -> (bool, bool) {
        self.spans.get(i).map_or((false, false), |s| (s.3, s.4))
    }

    /// Queues on the stream the copy of staged range `i` whole: into the arena when
    /// `into_arena`, else back to device memory.
    ///
    /// # Safety
    /// The range is live device memory of the stream's device that the call owns until the
    /// stream has run the copy; into the arena, the range's place is not in use by a job or a
    /// queued copy (the slice that had it was copied back earlier on this stream); back, the
    /// copy is queued after the job's flag wait. The arena lives until the queue drops.
    pub(crate) unsafe fn copy_range(&self, i: usize, into_arena: bool) -> Result<()> {
        let Some(&(dev, len, host, ..)) = self.spans.get(i) else {
            return Err(crate::Error::internal(format!(
                "stream staging: no staged range {i}"
            )));
        };
        if len == 0 {
            return Ok(());
        }
        let (dst, src) = if into_arena {
            (host as *mut u8, dev as *const u8)
        } else {
            (dev as *mut u8, host as *const u8)
        };
        let stream = std::ptr::without_provenance_mut(self.stream);
        // SAFETY: per the caller; the host range lies in the arena (placed for `len` bytes).
        unsafe { self.device.copy_on_stream(stream, dst, src, len) }
    }

    /// Queues on the stream the copies of the written ranges back to device memory (after the
    /// job's flag wait, which the caller queued first).
    ///
    /// # Safety
    /// The ranges are still the call's device memory (NCCL's contract), and the arena lives
    /// until the stream has run the copies (arenas are kept until the queue drops).
    pub(crate) unsafe fn copy_back(&self) -> Result<()> {
        let stream = std::ptr::without_provenance_mut(self.stream);
        for &(dev, len, host, _, written) in &self.spans {
            if written && len > 0 {
                // SAFETY: per the caller.
                unsafe {
                    self.device
                        .copy_on_stream(stream, dev as *mut u8, host as *const u8, len)
                }?;
            }
        }
        Ok(())
    }

    /// The arena's copies of the written ranges: host address and length of each.
    #[cfg(feature = "capi")]
    pub(crate) fn written_copies(&self) -> Vec<(usize, usize)> {
        self.spans
            .iter()
            .filter(|&&(.., written)| written)
            .map(|&(_, len, host, ..)| (host, len))
            .collect()
    }
}

/// Places for the slices of one call in flight in a stream's arena ([`Arenas::window`]).
#[derive(Debug)]
pub(crate) struct Window {
    device: Device,
    stream: usize,
    base: usize,
    /// Bytes per place (a multiple of `ALIGN`).
    place: usize,
    places: usize,
}

impl Window {
    /// Bytes a window of `places` places for `place` bytes each takes in an arena.
    pub(crate) fn bytes(place: usize, places: usize) -> usize {
        place.next_multiple_of(ALIGN) * places
    }

    /// Slice `k`'s ranges placed in place `k mod places`: `groups` of (device address, bytes)
    /// ranges, each group's ranges back to back (a slice's blocks, as one host buffer), each
    /// group at an `ALIGN` boundary, with whether the group is read (copied in) and written
    /// (copied back); at most the place's bytes in all. The ranges keep their order
    /// ([`Staged::host_at`]). Slice `k + places` takes the same place: its copies in must be
    /// queued after slice `k`'s copies back.
    pub(crate) fn slice(&self, k: usize, groups: &[RangeGroup]) -> Result<Staged> {
        let start = self.base + (k % self.places) * self.place;
        let end = start + self.place;
        let mut host = start;
        let mut spans = Vec::new();
        for g in groups {
            host = start + (host - start).next_multiple_of(ALIGN);
            for &(addr, len) in &g.ranges {
                if host + len > end {
                    return Err(crate::Error::internal(format!(
                        "stream staging: slice {k} needs more than its place of {} bytes",
                        self.place
                    )));
                }
                spans.push((addr, len, host, g.read, g.written));
                host += len;
            }
        }
        Ok(Staged {
            device: self.device,
            stream: self.stream,
            spans,
        })
    }
}

/// `spans` sorted, empty ones dropped, overlapping ones joined (touching ones are not: they
/// may be two allocations, which one driver copy cannot span).
fn merge(spans: &[Span]) -> Vec<Span> {
    let mut sorted: Vec<Span> = spans.iter().copied().filter(|s| s.len > 0).collect();
    sorted.sort_by_key(|s| s.addr);
    let mut merged: Vec<Span> = Vec::new();
    for s in sorted {
        match merged.last_mut() {
            Some(m) if s.addr < m.addr + m.len as u64 => {
                let end = (m.addr + m.len as u64).max(s.addr + s.len as u64);
                m.len = (end - m.addr) as usize;
                m.read |= s.read;
                m.written |= s.written;
            }
            _ => merged.push(s),
        }
    }
    merged
}

/// Bytes of a stream's arena that staging `spans` takes (what [`Arenas::stage`] needs).
#[cfg(feature = "capi")]
pub(crate) fn arena_bytes(spans: &[Span]) -> usize {
    placed_bytes(&merge(spans))
}

/// Bytes that `merged` ranges take in an arena, each placed at an `ALIGN` boundary.
fn placed_bytes(merged: &[Span]) -> usize {
    merged.iter().map(|s| s.len.next_multiple_of(ALIGN)).sum()
}

/// The arenas of one communicator's stream jobs, by stream.
#[derive(Debug, Default)]
pub(crate) struct Arenas {
    by_stream: Vec<(usize, Pinned)>,
    /// Arenas replaced by larger ones (see the module docs).
    retired: Vec<Pinned>,
}

/// Places `merged` ranges one after another from `base` and queues on `stream` the copies of
/// the ranges read.
///
/// # Safety
/// As for [`Arenas::stage`]; `base` holds [`placed_bytes`] of `merged` and lives until the
/// stream has run the job's copies back.
unsafe fn place(device: Device, stream: usize, base: *mut u8, merged: Vec<Span>) -> Result<Staged> {
    let mut out = Staged {
        device,
        stream,
        spans: Vec::with_capacity(merged.len()),
    };
    let handle = std::ptr::without_provenance_mut(stream);
    let mut at = 0;
    for s in merged {
        let host = base as usize + at;
        if s.read {
            // SAFETY: per the caller for the device range; the host range lies in the arena.
            unsafe { device.copy_on_stream(handle, host as *mut u8, s.addr as *const u8, s.len) }?;
        }
        out.spans.push((s.addr, s.len, host, s.read, s.written));
        at += s.len.next_multiple_of(ALIGN);
    }
    Ok(out)
}

impl Arenas {
    /// Places `spans` in the arena of `stream` (grown if needed; overlapping ranges share one
    /// copy, ranges that only touch do not: they may be two allocations, which one driver copy
    /// cannot span) and queues on the stream the copies of the ranges read.
    ///
    /// # Safety
    /// Every span is live device memory of `device` (checked by the caller) that the call
    /// owns until the stream has run its copies back; `stream` is the caller's stream of
    /// `device`.
    pub(crate) unsafe fn stage(
        &mut self,
        device: Device,
        stream: usize,
        spans: &[Span],
    ) -> Result<Staged> {
        let merged = merge(spans);
        let base = self.arena(device, stream, placed_bytes(&merged))?;
        // SAFETY: per the caller; the arena holds the merged ranges (sized above) and lives
        // until the queue drops.
        unsafe { place(device, stream, base, merged) }
    }

    /// As [`Arenas::stage`], in an arena of its own that `arena(bytes)` gives (at least
    /// `bytes`), which nothing else uses while a graph may run the call: a call recorded into
    /// a CUDA graph, whose copies and host call run at each launch of the graph, whenever that
    /// is (`device::recorded` keeps the arena).
    ///
    /// # Safety
    /// As for [`Arenas::stage`]; the arena lives as long as a graph may run the copies.
    pub(crate) unsafe fn stage_captured(
        device: Device,
        stream: usize,
        spans: &[Span],
        arena: impl FnOnce(usize) -> Result<Pinned>,
    ) -> Result<(Staged, Pinned)> {
        let merged = merge(spans);
        let arena = arena(placed_bytes(&merged).max(ALIGN))?;
        // SAFETY: per the caller; the arena holds the merged ranges (it was asked for them).
        let staged = unsafe { place(device, stream, arena.raw().0, merged) }?;
        Ok((staged, arena))
    }

    /// Room for `places` places of `place` bytes each in the arena of `stream` (grown if
    /// needed): a call cut into slices stages the slices in flight there, a slice at a time
    /// ([`Window::slice`]).
    pub(crate) fn window(
        &mut self,
        device: Device,
        stream: usize,
        place: usize,
        places: usize,
    ) -> Result<Window> {
        let place = place.next_multiple_of(ALIGN);
        let base = self.arena(device, stream, place * places)? as usize;
        Ok(Window {
            device,
            stream,
            base,
            place,
            places,
        })
    }

    /// Bytes of every arena, the outgrown ones too.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        let live = self.by_stream.iter().map(|(_, p)| p.raw().1);
        live.chain(self.retired.iter().map(|p| p.raw().1)).sum()
    }

    /// The arena of `stream`, at least `need` bytes.
    fn arena(&mut self, device: Device, stream: usize, need: usize) -> Result<*mut u8> {
        let i = self.by_stream.iter().position(|(s, _)| *s == stream);
        if let Some(i) = i {
            let (ptr, len) = self.by_stream[i].1.raw();
            if len >= need {
                return Ok(ptr);
            }
        }
        // With the thread's capture mode relaxed: a capture open on another thread must not
        // be invalidated by this allocation (`Device::capture_relaxed`).
        let len = need.max(ALIGN).next_power_of_two();
        let p = device.capture_relaxed(|| Pinned::new(device, len))??;
        let ptr = p.raw().0;
        match i {
            Some(i) => {
                let old = std::mem::replace(&mut self.by_stream[i].1, p);
                self.retired.push(old);
            }
            None => self.by_stream.push((stream, p)),
        }
        Ok(ptr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{host_stream, DeviceBuffer, Provider};

    #[test]
    fn overlapping_ranges_share_a_copy_and_addresses_keep_their_offsets() {
        let dev = Device::new(Provider::Host, 0).unwrap();
        let src = DeviceBuffer::from_host(dev, &[1u8, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        let a = src.addr();
        let stream = 0x5e_0001;
        let mut arenas = Arenas::default();
        let spans = [
            Span {
                addr: a + 4,
                len: 4,
                read: false,
                written: true,
            },
            Span {
                addr: a,
                len: 6,
                read: true,
                written: false,
            },
        ];
        // SAFETY: both ranges lie in `src`, which outlives the stream's run below.
        let st = unsafe { arenas.stage(dev, stream, &spans) }.unwrap();
        assert_eq!(st.spans.len(), 1, "merged into one range");
        let h = st.host_of(a).unwrap();
        assert_eq!(st.host_of(a + 5), Some(h + 5));
        assert_eq!(st.host_of(a + 8), None);
        // The copy in runs when the stand-in stream is run.
        host_stream::run_to(stream, host_stream::record(stream)).unwrap();
        // SAFETY: `h` is the arena's copy of the 8 bytes, which the stream just wrote.
        let got = unsafe { std::slice::from_raw_parts(h as *const u8, 8) };
        assert_eq!(got, &[1, 2, 3, 4, 5, 6, 7, 8]);
    }

    #[test]
    fn touching_ranges_keep_copies_of_their_own() {
        // An out-of-place call's send and receive buffers can be two allocations back to back
        // (4 MiB each on a GPU); one copy across both is refused by the driver.
        let dev = Device::new(Provider::Host, 0).unwrap();
        let src = DeviceBuffer::from_host(dev, &[1u8, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        let a = src.addr();
        let stream = 0x5e_0002;
        let mut arenas = Arenas::default();
        let spans = [
            Span {
                addr: a,
                len: 4,
                read: true,
                written: false,
            },
            Span {
                addr: a + 4,
                len: 4,
                read: false,
                written: true,
            },
        ];
        // SAFETY: both ranges lie in `src`, which outlives the stream's run below.
        let st = unsafe { arenas.stage(dev, stream, &spans) }.unwrap();
        assert_eq!(st.spans.len(), 2, "one copy per range");
        host_stream::run_to(stream, host_stream::record(stream)).unwrap();
        let h = st.host_of(a).unwrap();
        // SAFETY: the arena's copy of the 4 bytes read, which the stream just wrote.
        let got = unsafe { std::slice::from_raw_parts(h as *const u8, 4) };
        assert_eq!(got, &[1, 2, 3, 4]);
        assert_ne!(
            st.host_of(a + 4),
            Some(h + 4),
            "placed apart from the first range"
        );
    }
}
