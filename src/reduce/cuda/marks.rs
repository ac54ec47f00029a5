//! The CUDA reducer's shared marks: its two marks as interprocess events
//! (`CU_EVENT_INTERPROCESS`), which a stream of another process waits for after opening them
//! (`cuIpcGetEventHandle`, `cuIpcOpenEventHandle`). A wait queued on such an event waits for
//! its last record in the owner's process at the time of the wait, as with any event; the
//! callers order records and waits by their exchanges (`exec::peer`).
//!
//! The events live as long as the communicator holds windows: a rank of another process may
//! queue a wait on this process's event after this rank left the call, and a wait queued on an
//! opened event must not outlive the owner's event (CUDA leaves that undefined). A rank's
//! settle point on a stream comes after its waits for the other ranks' done marks
//! ([`CudaReducer::mark_settled_now`]), so once every rank has settled and they have
//! exchanged (the last window's deregistration) no stream holds a wait for any of them, and
//! each rank destroys its own and closes those it opened ([`CudaReducer::release_shared_now`]);
//! a later registration makes new ones. A communicator that ends still holding windows keeps
//! them (a rank may be gone, so nothing is agreed).
//!
//! Ranks of one process (threads, beside ranks of other processes) take each other's events
//! as they are: CUDA does not open an interprocess event in the process that made it, so
//! every event made here is kept in a list of this process's own, by handle, and opening one
//! of those hands the event itself (a stream waits for an event of another context of this
//! process as for one of its own).
//!
//! Host waits here poll with a deadline instead of blocking in the driver: a stream that waits
//! for another process's mark waits forever where that process failed or left mid-call.

use std::time::{Duration, Instant};

use ferroccl_cuda::device::DeviceKernels;
use ferroccl_cuda::driver::{Handle, IpcEventHandle};
use ferroccl_transport::{Error, Result};

use super::{convert, CudaReducer, NAME};
use crate::reduce::{MarkUse, PeerMarks, SharedMarkWords, SHARED_MARK_WORDS};

/// The interprocess events of a reducer (none yet: zeros) and their handles.
#[derive(Debug, Default)]
pub(super) struct SharedEvents {
    events: [usize; 2],
    handles: SharedMarkWords,
    /// Per stream with a settle point: the stream, a plain event recorded after the call's
    /// `Done` record and its waits for the other ranks' (kept for the next call on the stream;
    /// destroyed with the marks), and whether it was recorded since the last settle.
    done: Vec<(usize, usize, bool)>,
    /// A plain event for host waits with a deadline ([`CudaReducer::synchronize_within_now`]).
    sync: usize,
}

/// Another rank's events: opened here, or this process's own (`true`: not opened here, so
/// not closed here either).
struct Opened([usize; 2], [bool; 2]);

/// The interprocess events made in this process and not destroyed, by their handles' words.
static OWN: std::sync::Mutex<Vec<([u64; 8], usize)>> = std::sync::Mutex::new(Vec::new());

/// The event of this process whose handle's words are `words`, if it made one.
fn own_event(words: &[u64]) -> Option<usize> {
    let own = OWN.lock().unwrap_or_else(|p| p.into_inner());
    own.iter().find(|(h, _)| h[..] == *words).map(|&(_, e)| e)
}

/// How long a host wait yields between polls (as the driver's own synchronize spins and
/// yields) before it sleeps between them: a blocking call's wait for its share is on its hot
/// path, where a sleep would overshoot the kernel's end.
const YIELDING: Duration = Duration::from_millis(100);

/// Waits on the host until `ev`'s last record is reached, polling; an error after `limit`.
fn wait_within(k: &DeviceKernels, ev: Handle, limit: Duration, what: &str) -> Result<()> {
    let t0 = Instant::now();
    loop {
        // SAFETY: `ev` is a live plain event of this reducer.
        if unsafe { k.driver().event_done(ev) }.map_err(|e| convert(&e))? {
            return Ok(());
        }
        if t0.elapsed() > limit {
            return Err(Error::timeout(format!(
                "{NAME}: {what} did not finish within {} s (a stream waits for a mark of \
                 another process that never came: that process failed, or left mid-call)",
                limit.as_secs_f64()
            )));
        }
        if t0.elapsed() < YIELDING {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl CudaReducer {
    pub(super) fn share_marks_now(&self) -> Result<SharedMarkWords> {
        let (k, _) = self.on(None)?;
        let mut sh = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        if sh.events[0] == 0 || sh.events[1] == 0 {
            let mut handles = [0u64; SHARED_MARK_WORDS];
            for (i, ev) in sh.events.iter_mut().enumerate() {
                if *ev != 0 {
                    continue;
                }
                let (e, h) = k.driver().create_ipc_event().map_err(|e| convert(&e))?;
                *ev = e as usize;
                let mut words = [0u64; 8];
                for (j, w) in h.0.chunks_exact(8).enumerate() {
                    words[j] = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
                }
                handles[8 * i..8 * i + 8].copy_from_slice(&words);
                OWN.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((words, e as usize));
            }
            for (i, w) in handles.iter().enumerate() {
                if *w != 0 {
                    sh.handles[i] = *w;
                }
            }
        }
        Ok(sh.handles)
    }

    pub(super) fn open_marks_now(&self, words: &SharedMarkWords) -> Result<PeerMarks> {
        let (k, _) = self.on(None)?;
        let mut opened = [0usize; 2];
        let mut own = [false; 2];
        for (i, ev) in opened.iter_mut().enumerate() {
            if let Some(e) = own_event(&words[8 * i..8 * i + 8]) {
                (*ev, own[i]) = (e, true);
                continue;
            }
            let mut h = IpcEventHandle([0; 64]);
            for (j, w) in words[8 * i..8 * i + 8].iter().enumerate() {
                h.0[8 * j..8 * j + 8].copy_from_slice(&w.to_le_bytes());
            }
            *ev = k.driver().ipc_open_event(&h).map_err(|e| convert(&e))? as usize;
        }
        Ok(PeerMarks(Box::new(Opened(opened, own))))
    }

    pub(super) fn mark_shared_now(&self, on: Option<usize>, which: MarkUse) -> Result<u64> {
        let (k, stream) = self.on(on)?;
        let sh = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        let ev = sh.events[which as usize];
        if ev == 0 {
            return Err(Error::internal(format!(
                "{NAME} (cuda device {}): a shared mark recorded before it was shared",
                self.ordinal
            )));
        }
        // SAFETY: `ev` is this reducer's live interprocess event; `stream` a live stream of
        // the bound context (the kernels' own, or the caller's of this device).
        unsafe { k.driver().record_event(ev as Handle, stream) }.map_err(|e| convert(&e))?;
        Ok(1)
    }

    /// Records the settle point of stream `on`: a plain event after everything queued there
    /// so far (a call's share, its `Done` record and its waits for the other ranks'), which
    /// [`CudaReducer::settle_shared_now`] waits for on the host.
    pub(super) fn mark_settled_now(&self, on: Option<usize>) -> Result<()> {
        let (k, stream) = self.on(on)?;
        let mut sh = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        let at = match sh.done.iter().position(|d| d.0 == stream as usize) {
            Some(i) => i,
            None => {
                let plain = k.driver().create_event().map_err(|e| convert(&e))?;
                sh.done.push((stream as usize, plain as usize, false));
                sh.done.len() - 1
            }
        };
        let plain = sh.done[at].1 as Handle;
        // SAFETY: a live plain event of this reducer; `stream` a live stream of the bound
        // context (the kernels' own, or the caller's of this device).
        unsafe { k.driver().record_event(plain, stream) }.map_err(|e| convert(&e))?;
        sh.done[at].2 = true;
        Ok(())
    }

    /// Destroys this reducer's interprocess events, settle points and host-wait event (made
    /// again when needed) and closes the other
    /// ranks' events it opened (`peers`; those of this process's other ranks are theirs to
    /// destroy): every rank settled, and they agreed after that (see the module). The next
    /// share makes new events. Every event is let go even where one fails; the first error
    /// is returned.
    pub(super) fn release_shared_now(&self, peers: &[Option<PeerMarks>]) -> Result<()> {
        let (k, _) = self.on(None)?;
        let mut gone: Vec<usize> = Vec::new();
        {
            let mut sh = self.shared.lock().unwrap_or_else(|p| p.into_inner());
            let mine: Vec<usize> = sh.events.iter().copied().filter(|&e| e != 0).collect();
            OWN.lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|(_, e)| !mine.contains(e));
            gone.extend(mine);
            gone.extend(sh.done.drain(..).map(|d| d.1));
            gone.extend(
                [std::mem::take(&mut sh.sync)]
                    .into_iter()
                    .filter(|&e| e != 0),
            );
            sh.events = [0; 2];
            sh.handles = [0; SHARED_MARK_WORDS];
        }
        for p in peers.iter().flatten() {
            if let Some(Opened(events, own)) = p.0.downcast_ref::<Opened>() {
                gone.extend(
                    (0..2)
                        .filter(|&i| !own[i] && events[i] != 0)
                        .map(|i| events[i]),
                );
            }
        }
        let mut released = Ok(());
        for ev in gone {
            // SAFETY: an event of this reducer (or opened by it) that no stream waits for and
            // nothing records any more (see the module); destroyed once: the lists it was in
            // were emptied above.
            let r = unsafe { k.driver().destroy_event(ev as Handle) };
            released = released.and(r.map_err(|e| convert(&e)));
        }
        released
    }

    pub(super) fn wait_shared_now(
        &self,
        on: Option<usize>,
        peer: &PeerMarks,
        which: MarkUse,
    ) -> Result<()> {
        let Some(Opened(events, _)) = peer.0.downcast_ref::<Opened>() else {
            return Err(Error::internal(format!(
                "{NAME}: another reducer's opened marks"
            )));
        };
        let (k, stream) = self.on(on)?;
        // SAFETY: an event opened here from another process's interprocess event (or this
        // process's own), destroyed only once no stream can wait for it (see the module); the
        // driver lets a stream wait for it.
        unsafe {
            k.driver()
                .stream_wait(stream, events[which as usize] as Handle)
        }
        .map_err(|e| convert(&e))
    }

    pub(super) fn settle_shared_now(&self, limit: Duration) -> Result<()> {
        let recorded: Vec<Handle> = {
            let mut sh = self.shared.lock().unwrap_or_else(|p| p.into_inner());
            sh.done
                .iter_mut()
                .filter_map(|d| std::mem::take(&mut d.2).then_some(d.1 as Handle))
                .collect()
        };
        if recorded.is_empty() {
            return Ok(());
        }
        let (k, _) = self.on(None)?;
        let mut settled = Ok(());
        for ev in recorded {
            settled = settled.and(wait_within(k, ev, limit, "a share through windows"));
        }
        settled
    }

    pub(super) fn synchronize_within_now(&self, on: Option<usize>, limit: Duration) -> Result<()> {
        let (k, stream) = self.on(on)?;
        let ev = {
            let mut sh = self.shared.lock().unwrap_or_else(|p| p.into_inner());
            if sh.sync == 0 {
                sh.sync = k.driver().create_event().map_err(|e| convert(&e))? as usize;
            }
            sh.sync as Handle
        };
        // SAFETY: a live plain event of this reducer; `stream` a live stream of the bound
        // context. Calls of a communicator are ordered, so no other thread records it between
        // this record and the wait below.
        unsafe { k.driver().record_event(ev, stream) }.map_err(|e| convert(&e))?;
        wait_within(k, ev, limit, "a stream through windows")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_events_are_told_by_their_handles_words() {
        let words = [0x5eed_0000_0000_0001u64, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(own_event(&words), None);
        OWN.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((words, 0xe0e0));
        assert_eq!(own_event(&words), Some(0xe0e0));
        let mut other = words;
        other[7] = 9;
        assert_eq!(own_event(&other), None, "another process's handle");
    }
}
