//! Calls recorded into a CUDA graph: whether a caller's stream is being captured, host work
//! queued on it (a host node of the graph, run at each launch), and allocations made while a
//! capture is open.
//!
//! A captured call cannot wait on a flag of the library's own (a graph replays the value it
//! was recorded with) nor run on the library's threads (nothing tells them the graph ran). So
//! its staged work is a host function on the stream (`cuLaunchHostFunc`), which the driver
//! runs on a thread of its own each time the graph reaches it, between the copies in and the
//! copies back. That function must make no CUDA call: it runs marked as a stream job's work
//! ([`super::as_stream_job`]), so a driver call there is an error, not a deadlock.

use std::ffi::c_void;
use std::sync::Arc;

use super::{cuda, host_stream, Device, Provider};
use crate::Result;

/// What `cuStreamIsCapturing` says of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Capture {
    /// Not being captured: work queued on it runs.
    None,
    /// Being captured: work queued on it is recorded into the graph.
    Active,
    /// A capture that something invalidated and that has not ended yet.
    Invalidated,
}

impl Capture {
    fn from_status(status: u32) -> Capture {
        match status {
            0 => Capture::None,
            1 => Capture::Active,
            _ => Capture::Invalidated,
        }
    }
}

/// Host work a graph runs at each launch. The library keeps it (with the memory it uses)
/// while the graph may run it (`device::recorded`), and never after the communicator that
/// recorded it goes: a graph holding it must not be launched after that, as NCCL's contract
/// has it.
pub(crate) struct HostCall {
    run: Box<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for HostCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostCall")
    }
}

impl HostCall {
    pub(crate) fn new(run: impl Fn() + Send + Sync + 'static) -> Arc<HostCall> {
        Arc::new(HostCall { run: Box::new(run) })
    }

    /// Runs the work marked as a stream job's (no device call), never unwinding into the
    /// driver's thread.
    fn call(&self) {
        let run = std::panic::AssertUnwindSafe(|| super::as_stream_job(&self.run));
        if std::panic::catch_unwind(run).is_err() {
            ferroccl_transport::log_line!(
                "ferroccl WARN COLL: a call recorded into a CUDA graph panicked when the graph ran"
            );
        }
    }
}

/// The driver's entry for a [`HostCall`] (`CUhostFn`).
///
/// # Safety
/// `data` is `Arc::as_ptr` of a live [`HostCall`].
unsafe extern "C" fn run_host_call(data: *mut c_void) {
    // SAFETY: per the contract of `Device::queue_host_call`, which made `data`.
    let call = unsafe { &*(data as *const HostCall) };
    call.call();
}

/// What runs once a graph holding a recorded call is gone, with every executable graph made
/// from it and their launches (the destructor of a user object the graph owns). It runs on a
/// driver thread (the stand-in: whichever drops the graph's last hold) and must make no CUDA
/// call.
pub(crate) type Release = Box<dyn FnOnce() + Send + Sync>;

/// The driver's entry for a [`Release`] (a user object's destructor).
///
/// # Safety
/// `data` is `Box::into_raw` of a boxed [`Release`], and this is its one call.
unsafe extern "C" fn run_release(data: *mut c_void) {
    // SAFETY: per the contract of `Device::on_graph_release`, which made `data`.
    let release = unsafe { Box::from_raw(data.cast::<Release>()) };
    let run = std::panic::AssertUnwindSafe(|| super::as_stream_job(*release));
    if std::panic::catch_unwind(run).is_err() {
        ferroccl_transport::log_line!(
            "ferroccl WARN COLL: releasing a call recorded into a CUDA graph panicked"
        );
    }
}

impl Device {
    /// Hands `release` to the graph being captured on the caller's `stream`: it runs once
    /// that graph, every executable graph made from it and their launches are gone.
    /// `Ok(false)`, and `release` dropped unrun, where the driver cannot (it lacks the
    /// calls, or could not make the object): the caller then keeps what it would release.
    ///
    /// # Safety
    /// As [`Device::sync_stream`], `stream` not NULL and in an active capture.
    pub(crate) unsafe fn on_graph_release(
        self,
        stream: *mut c_void,
        release: Release,
    ) -> Result<bool> {
        match self.provider {
            Provider::Cuda => {
                let data = Box::into_raw(Box::new(release)).cast::<c_void>();
                // SAFETY: per the caller; `run_release` makes no CUDA call (it runs as a
                // stream job's work) and takes `data` back once.
                let r = unsafe { cuda::retain_in_capture(self.ordinal, stream, run_release, data) };
                if !matches!(r, Ok(true)) {
                    // SAFETY: the driver did not take `data` (no object destroys it): ours
                    // again, dropped unrun.
                    drop(unsafe { Box::from_raw(data.cast::<Release>()) });
                }
                r
            }
            Provider::Host => {
                host_stream::retain_in_capture(stream as usize, release).map(|()| true)
            }
        }
    }

    /// Whether the caller's `stream` of this device is being captured into a graph. A NULL
    /// stream is never (the legacy stream cannot be captured).
    ///
    /// # Safety
    /// As [`Device::sync_stream`].
    pub(crate) unsafe fn capture(self, stream: *mut c_void) -> Result<Capture> {
        if stream.is_null() {
            return Ok(Capture::None);
        }
        let status = match self.provider {
            // SAFETY: per the caller.
            Provider::Cuda => unsafe { cuda::capture_status(self.ordinal, stream) }?,
            Provider::Host => host_stream::capture_status(stream as usize),
        };
        Ok(Capture::from_status(status))
    }

    /// Queues `call` on the caller's `stream` of this device: it runs on a driver thread
    /// (the stand-in: whoever runs the stream) once the work before it is done, and the work
    /// after it waits for it; inside a capture it is recorded, and runs at every launch.
    ///
    /// # Safety
    /// As [`Device::sync_stream`], `stream` not NULL; `call` stays alive for every run (the
    /// caller keeps a clone until no graph holding it can be launched).
    pub(crate) unsafe fn queue_host_call(
        self,
        stream: *mut c_void,
        call: &Arc<HostCall>,
    ) -> Result<()> {
        match self.provider {
            Provider::Cuda => {
                let data = Arc::as_ptr(call).cast_mut().cast::<c_void>();
                // SAFETY: per the caller; `run_host_call` makes no CUDA call (the work runs
                // as a stream job's) and reads `data`, which the caller keeps alive.
                unsafe { cuda::queue_host_fn(self.ordinal, stream, run_host_call, data) }
            }
            Provider::Host => {
                let call = Arc::clone(call);
                let run: host_stream::Call = Arc::new(move || {
                    call.call();
                    Ok(())
                });
                host_stream::call(stream as usize, run);
                Ok(())
            }
        }
    }

    /// Relaxes this thread's capture interaction mode until [`Device::restore_capture_mode`]
    /// gets the mode it returns (the stand-in has none: 0).
    pub(crate) fn relax_capture_mode(self) -> Result<u32> {
        match self.provider {
            Provider::Cuda => cuda::exchange_capture_mode(
                self.ordinal,
                ferroccl_cuda::driver::CAPTURE_MODE_RELAXED,
            ),
            Provider::Host => Ok(0),
        }
    }

    /// Puts back the capture interaction mode [`Device::relax_capture_mode`] returned.
    pub(crate) fn restore_capture_mode(self, mode: u32) -> Result<()> {
        match self.provider {
            Provider::Cuda => cuda::exchange_capture_mode(self.ordinal, mode).map(drop),
            Provider::Host => Ok(()),
        }
    }

    /// Runs `f` (an allocation) so that a capture open on this thread or elsewhere is not
    /// invalidated by it: with this thread's capture interaction mode relaxed, as NCCL does
    /// for its allocations (`cuThreadExchangeStreamCaptureMode`). The stand-in needs nothing.
    pub(crate) fn capture_relaxed<T>(self, f: impl FnOnce() -> T) -> Result<T> {
        match self.provider {
            Provider::Cuda => cuda::capture_relaxed(self.ordinal, f),
            Provider::Host => Ok(f()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn a_host_call_recorded_in_a_stand_in_capture_runs_at_every_launch_only() {
        let dev = Device::new(Provider::Host, 0).unwrap();
        let h = 0x6a7b_0001usize;
        let stream = std::ptr::without_provenance_mut(h);
        let runs = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&runs);
        let call = HostCall::new(move || {
            r.fetch_add(1, Ordering::SeqCst);
        });
        host_stream::begin_capture(h).unwrap();
        // SAFETY: a stand-in stream needs no live handle.
        assert_eq!(unsafe { dev.capture(stream) }.unwrap(), Capture::Active);
        // SAFETY: as above; `call` outlives the launches below.
        unsafe { dev.queue_host_call(stream, &call) }.unwrap();
        let graph = host_stream::end_capture(h).unwrap();
        host_stream::synchronize(h).unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 0, "recorded, not run");
        for k in 1..=3 {
            host_stream::launch_graph(h, &graph).unwrap();
            host_stream::synchronize(h).unwrap();
            assert_eq!(runs.load(Ordering::SeqCst), k);
        }
        // SAFETY: as above.
        assert_eq!(unsafe { dev.capture(stream) }.unwrap(), Capture::None);
    }

    #[test]
    fn a_device_call_inside_a_host_call_is_refused_and_a_flag_wait_invalidates_the_capture() {
        let dev = Device::new(Provider::Host, 0).unwrap();
        let h = 0x6a7b_0002usize;
        let stream = std::ptr::without_provenance_mut(h);
        let refused = Arc::new(std::sync::Mutex::new(None));
        let r = Arc::clone(&refused);
        let call = HostCall::new(move || {
            *r.lock().unwrap() = Some(super::super::no_driver_here("a copy").is_err());
        });
        // SAFETY: a stand-in stream; `call` outlives the run below.
        unsafe { dev.queue_host_call(stream, &call) }.unwrap();
        host_stream::synchronize(h).unwrap();
        assert_eq!(*refused.lock().unwrap(), Some(true));

        host_stream::begin_capture(h).unwrap();
        let flag = Arc::new(std::sync::atomic::AtomicU32::new(0));
        host_stream::wait_flag(h, flag, 1);
        // SAFETY: a stand-in stream needs no live handle.
        let status = unsafe { dev.capture(stream) }.unwrap();
        assert_eq!(status, Capture::Invalidated);
        let e = host_stream::end_capture(h).unwrap_err();
        assert!(e.message().contains("completion flag"), "{e}");
        assert!(host_stream::synchronize(h).is_ok(), "nothing was queued");
    }

    #[test]
    fn a_release_handed_to_a_stand_in_capture_runs_once_the_graph_and_its_launches_are_gone() {
        let dev = Device::new(Provider::Host, 0).unwrap();
        let h = 0x6a7b_0003usize;
        let stream = std::ptr::without_provenance_mut(h);
        let released = Arc::new(AtomicUsize::new(0));
        let release = |r: &Arc<AtomicUsize>| -> Release {
            let r = Arc::clone(r);
            Box::new(move || {
                r.fetch_add(1, Ordering::SeqCst);
            })
        };
        // Not capturing: refused, and the release never runs.
        // SAFETY: a stand-in stream needs no live handle.
        assert!(unsafe { dev.on_graph_release(stream, release(&released)) }.is_err());
        host_stream::begin_capture(h).unwrap();
        // The graph's host call waits until `open` is set: its launch cannot end before.
        let open = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let o = Arc::clone(&open);
        let call = HostCall::new(move || {
            while !o.load(Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        });
        // SAFETY: as above; `call` outlives the launch (synchronized below).
        unsafe { dev.queue_host_call(stream, &call) }.unwrap();
        // SAFETY: as above.
        assert!(unsafe { dev.on_graph_release(stream, release(&released)) }.unwrap());
        let graph = host_stream::end_capture(h).unwrap();
        host_stream::launch_graph(h, &graph).unwrap();
        drop(graph);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(
            released.load(Ordering::SeqCst),
            0,
            "the launch has not ended"
        );
        open.store(true, Ordering::SeqCst);
        host_stream::synchronize(h).unwrap();
        assert_eq!(released.load(Ordering::SeqCst), 1);
        // A capture that ends invalidated releases what it was handed.
        host_stream::begin_capture(h).unwrap();
        // SAFETY: as above.
        assert!(unsafe { dev.on_graph_release(stream, release(&released)) }.unwrap());
        host_stream::launch(h, Box::new(|| Ok(())));
        assert!(host_stream::end_capture(h).is_err());
        assert_eq!(released.load(Ordering::SeqCst), 2);
    }
}
