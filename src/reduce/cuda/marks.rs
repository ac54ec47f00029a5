//! The CUDA reducer's shared marks: its two marks as interprocess events
//! (`CU_EVENT_INTERPROCESS`), which a stream of another process waits for after opening them
//! (`cuIpcGetEventHandle`, `cuIpcOpenEventHandle`). A wait queued on such an event waits for
//! its last record in the owner's process at the time of the wait, as with any event; the
//! callers order records and waits by their exchanges (`exec::peer`).
//!
//! Neither the events made here nor the ones opened are destroyed: a rank of another process
//! may queue a wait on this process's event after this rank left the call, and a wait queued
//! on an opened event must not outlive the owner's event (CUDA leaves that undefined).

use ferroccl_cuda::driver::{Handle, IpcEventHandle};
use ferroccl_transport::{Error, Result};

use super::{convert, CudaReducer, NAME};
use crate::reduce::{MarkUse, PeerMarks, SharedMarkWords, SHARED_MARK_WORDS};

/// The interprocess events of a reducer (none yet: zeros) and their handles.
#[derive(Debug, Default)]
pub(super) struct SharedEvents {
    events: [usize; 2],
    handles: SharedMarkWords,
    /// Whether `Done` was recorded (its plain event then follows each record).
    done_recorded: bool,
}

/// Another process's events, opened here.
struct Opened([usize; 2]);

impl CudaReducer {
    pub(super) fn share_marks_now(&self) -> Result<SharedMarkWords> {
        let (k, _) = self.on(None)?;
        let mut sh = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        if sh.events[0] == 0 || sh.events[1] == 0 {
            let mut handles = [0u64; SHARED_MARK_WORDS];
            for (i, ev) in sh.events.iter_mut().enumerate() {
                let (e, h) = k.driver().create_ipc_event().map_err(|e| convert(&e))?;
                *ev = e as usize;
                for (j, w) in h.0.chunks_exact(8).enumerate() {
                    handles[8 * i + j] = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
                }
            }
            sh.handles = handles;
        }
        Ok(sh.handles)
    }

    pub(super) fn open_marks_now(&self, words: &SharedMarkWords) -> Result<PeerMarks> {
        let (k, _) = self.on(None)?;
        let mut opened = [0usize; 2];
        for (i, ev) in opened.iter_mut().enumerate() {
            let mut h = IpcEventHandle([0; 64]);
            for (j, w) in words[8 * i..8 * i + 8].iter().enumerate() {
                h.0[8 * j..8 * j + 8].copy_from_slice(&w.to_le_bytes());
            }
            *ev = k.driver().ipc_open_event(&h).map_err(|e| convert(&e))? as usize;
        }
        Ok(PeerMarks(Box::new(Opened(opened))))
    }

    pub(super) fn mark_shared_now(&self, on: Option<usize>, which: MarkUse) -> Result<u64> {
        let (k, stream) = self.on(on)?;
        let mut sh = self.shared.lock().unwrap_or_else(|p| p.into_inner());
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
        if which == MarkUse::Done {
            // The plain event after it, which this process can wait for on the host.
            let plain = self.event(k, MarkUse::Done)?;
            // SAFETY: as above, for the reducer's plain event.
            unsafe { k.driver().record_event(plain, stream) }.map_err(|e| convert(&e))?;
            sh.done_recorded = true;
        }
        Ok(1)
    }

    pub(super) fn wait_shared_now(
        &self,
        on: Option<usize>,
        peer: &PeerMarks,
        which: MarkUse,
    ) -> Result<()> {
        let Some(Opened(events)) = peer.0.downcast_ref::<Opened>() else {
            return Err(Error::internal(format!(
                "{NAME}: another reducer's opened marks"
            )));
        };
        let (k, stream) = self.on(on)?;
        // SAFETY: an event opened here from another process's interprocess event, never
        // destroyed; the driver lets a stream wait for it.
        unsafe {
            k.driver()
                .stream_wait(stream, events[which as usize] as Handle)
        }
        .map_err(|e| convert(&e))
    }

    pub(super) fn settle_shared_now(&self) -> Result<()> {
        if !self
            .shared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .done_recorded
        {
            return Ok(());
        }
        let (k, _) = self.on(None)?;
        let plain = self.event(k, MarkUse::Done)?;
        // SAFETY: the reducer's live plain event, recorded after its last shared `Done`.
        unsafe { k.driver().sync_event(plain) }.map_err(|e| convert(&e))
    }
}
