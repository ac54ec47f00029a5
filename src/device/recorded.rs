//! What calls recorded into CUDA graphs keep (`capi::capture`): each one's host function and
//! pinned arena, for as long as a graph holding the call may still run it.
//!
//! A recorded call hands its graph a [`Release`] (a user object's destructor: see
//! `device::graph`); the driver runs it once the graph, every executable graph made from it
//! and their launches are gone. It only notes the call's number: it runs on a driver thread
//! and may make no CUDA call. The next call of the communicator then lets the call go: its
//! arena becomes a spare, which a later recording of the same size or smaller takes instead
//! of allocating, and which a call that is not being recorded frees (with the thread's
//! capture mode relaxed, so that a capture open elsewhere is left intact). No memory is freed
//! while a call is being recorded. Where the driver cannot hand the graph a destructor, the
//! call is kept until the communicator goes, as NCCL's contract allows (no graph holding a
//! call is launched after that).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::graph::{HostCall, Release};
use super::staging::Pinned;
use super::Device;
use crate::Result;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One recorded call's host function and arena.
#[derive(Debug)]
struct Kept {
    id: u64,
    _call: Arc<HostCall>,
    arena: Pinned,
}

#[derive(Debug, Default)]
struct Live {
    next: u64,
    calls: Vec<Kept>,
    /// Arenas of calls whose graphs are gone.
    spare: Vec<Pinned>,
}

/// Pinned bytes held for recorded calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RecordedBytes {
    /// Arenas of calls a graph may still run.
    pub(crate) live: usize,
    /// Arenas of calls whose graphs are gone, not freed yet.
    pub(crate) spare: usize,
}

/// The recorded calls of one communicator.
#[derive(Debug, Default)]
pub(crate) struct Recorded {
    live: Mutex<Live>,
    /// The numbers of calls whose graphs are gone (written by their [`Release`]s).
    released: Arc<Mutex<Vec<u64>>>,
    /// Set when something may be freed: a release ran, or spares were left.
    dirty: Arc<AtomicBool>,
}

impl Recorded {
    /// Moves the calls whose graphs are gone to the spares.
    fn reap(&self, live: &mut Live) {
        let gone = std::mem::take(&mut *lock(&self.released));
        if gone.is_empty() {
            return;
        }
        let (freed, kept): (Vec<Kept>, Vec<Kept>) = std::mem::take(&mut live.calls)
            .into_iter()
            .partition(|k| gone.contains(&k.id));
        live.calls = kept;
        live.spare.extend(freed.into_iter().map(|k| k.arena));
    }

    /// An arena of at least `need` bytes of `device` for a call being recorded: the smallest
    /// spare that holds it, else a new one. Frees nothing (a capture is open).
    pub(crate) fn arena(&self, device: Device, need: usize) -> Result<Pinned> {
        let mut live = lock(&self.live);
        self.reap(&mut live);
        let fits = live
            .spare
            .iter()
            .enumerate()
            .filter(|(_, p)| p.device() == device && p.raw().1 >= need)
            .min_by_key(|(_, p)| p.raw().1)
            .map(|(i, _)| i);
        let taken = fits.map(|i| live.spare.swap_remove(i));
        if !live.spare.is_empty() {
            self.dirty.store(true, Ordering::Release);
        }
        drop(live);
        match taken {
            Some(p) => Ok(p),
            None => Pinned::new(device, need),
        }
    }

    /// Keeps `call` and its `arena` until the [`Release`] returned runs (or this goes).
    pub(crate) fn keep(&self, call: Arc<HostCall>, arena: Pinned) -> Release {
        let mut live = lock(&self.live);
        let id = live.next;
        live.next += 1;
        live.calls.push(Kept {
            id,
            _call: call,
            arena,
        });
        let released = Arc::clone(&self.released);
        let dirty = Arc::clone(&self.dirty);
        Box::new(move || {
            lock(&released).push(id);
            dirty.store(true, Ordering::Release);
        })
    }

    /// Frees the arenas of calls whose graphs are gone. For calls not being recorded: one
    /// atomic load where there is nothing to free.
    pub(crate) fn free_spares(&self) {
        if !self.dirty.load(Ordering::Acquire) || !self.dirty.swap(false, Ordering::AcqRel) {
            return;
        }
        let spare = {
            let mut live = lock(&self.live);
            self.reap(&mut live);
            std::mem::take(&mut live.spare)
        };
        // The capture mode is the thread's: relaxed once for every arena.
        let Some(device) = spare.first().map(Pinned::device) else {
            return;
        };
        if let Err(e) = device.capture_relaxed(|| drop(spare)) {
            ferroccl_transport::log_line!(
                "ferroccl WARN COLL: freeing the arenas of calls recorded into CUDA graphs: {e}"
            );
        }
    }

    /// Pinned bytes held for recorded calls now (the calls released so far counted as
    /// spares).
    pub(crate) fn bytes(&self) -> RecordedBytes {
        let mut live = lock(&self.live);
        self.reap(&mut live);
        RecordedBytes {
            live: live.calls.iter().map(|k| k.arena.raw().1).sum(),
            spare: live.spare.iter().map(|p| p.raw().1).sum(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Provider;

    #[test]
    fn a_released_call_leaves_a_spare_that_the_smallest_fitting_recording_takes() {
        let dev = Device::new(Provider::Host, 0).unwrap();
        let r = Recorded::default();
        let call = || HostCall::new(|| {});
        let small = r.keep(call(), r.arena(dev, 512).unwrap());
        let large = r.keep(call(), r.arena(dev, 4096).unwrap());
        let live = |live, spare| RecordedBytes { live, spare };
        assert_eq!(r.bytes(), live(4608, 0));
        // Nothing to free while both graphs live.
        r.free_spares();
        assert_eq!(r.bytes(), live(4608, 0));
        large();
        small();
        assert_eq!(r.bytes(), live(0, 4608));
        // A recording of 300 bytes takes the 512-byte spare, not the larger one.
        let again = r.arena(dev, 300).unwrap();
        assert_eq!(again.raw().1, 512);
        let _kept = r.keep(call(), again);
        assert_eq!(r.bytes(), live(512, 4096));
        // A call not recorded frees the spare; the live call's arena stays.
        r.free_spares();
        assert_eq!(r.bytes(), live(512, 0));
        // No spare large enough: a new arena.
        assert_eq!(r.arena(dev, 8192).unwrap().raw().1, 8192);
    }
}
