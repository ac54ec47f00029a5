//! Calls recorded into a CUDA graph: a collective, a gather or scatter, or a group of them and
//! of sends and receives, made with a stream that is being captured (`cuStreamBeginCapture`)
//! is recorded into the graph and runs each time the graph is launched, as NCCL's calls do.
//!
//! What the graph holds, per communicator and call (or group):
//! 1. copies of the device ranges the call reads into an arena of pinned host memory of its
//!    own, allocated when the call is recorded (with the thread's capture mode relaxed, as
//!    NCCL allocates, so that the allocation leaves the capture intact);
//! 2. a host function (`cuLaunchHostFunc`) that runs the call on the arena as a call on host
//!    buffers, exactly as a stream job does (`device::stream_queue`);
//! 3. copies of the ranges it writes back from the arena.
//!
//! Nothing runs when the call is made: the graph's launches run it, as often as they come, in
//! the stream's order. Calls of the communicator made on the same stream (before a launch or
//! after it) are ordered with it by the stream; calls on other streams must be ordered with
//! the launches by the program (events), as with NCCL: two that run at once reach the ranks in
//! an order that may differ, and the ranks then fail naming each other's call, or wait until
//! the deadline. A rank may record a call that another rank makes on a stream that is
//! not being captured, or in the blocking form: every form exchanges the same messages (the
//! collective is cut as the blocking form cuts it). The arena and the host function are kept
//! until the graph is gone (handed to it as a user object, `device::recorded`), or else until
//! the communicator goes (`ncclCommDestroy`); a graph holding a call must not be launched
//! after that (NCCL's contract).
//!
//! Where a launch's call fails (a peer gone, the deadline), its outputs are filled with ones
//! (0xff bytes: NaN in every floating type), so a result that was not made is not mistaken
//! for one, and the error becomes the communicator's (`ncclCommGetAsyncError`; later calls
//! fail with it), as a stream job's does.
//!
//! Refused with `ncclInvalidUsage`, the capture left intact (nothing was queued): calls of a
//! communicator whose host function would have to call the driver (the p2p transport), or
//! whose process holds several communicators on the GPU ([`Communicator::capture_refusal`]);
//! page-locked host buffers; a group whose operations are not all on the one stream being
//! captured; splits; and a capture that was invalidated before the call. An all-gather,
//! reduce-scatter or all-to-all that the blocking form cuts into device slices is run in the
//! same slices, its blocks gathered into scratch memory and scattered back (`blocks`).

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

mod blocks;

use self::blocks::Blocks;
use super::comm::Shared;
use super::error::guard;
use super::group::{op_names, point_at_arenas, slice_colls, stream_of, stream_spans};
use super::ops::{read_scalar, Op, Reduction};
use super::run::execute;
use super::types::*;
use crate::device::graph::{Capture, HostCall};
use crate::device::host_stream;
use crate::device::stream_stage::Span;
use crate::device::Device;
use crate::{Communicator, Error, ReduceOp, Result};

/// Whether the caller's `stream` is being captured (an invalidated capture is an error).
///
/// # Safety
/// `stream` is the caller's stream of `device`, per the NCCL contract, or a special handle.
pub(super) unsafe fn status(
    api: &str,
    shared: &Shared,
    device: Device,
    stream: cudaStream_t,
) -> Result<bool> {
    // SAFETY: per the caller.
    match unsafe { device.capture(stream.cast()) }? {
        Capture::None => Ok(false),
        Capture::Active => {
            relax(device)?;
            Ok(true)
        }
        Capture::Invalidated => Err(Error::invalid_usage(format!(
            "{}: stream {stream:p} is in a capture into a CUDA graph that was invalidated \
             before this call (by an earlier call that a capture does not allow); end it \
             (cudaStreamEndCapture) and capture again",
            who(api, shared)
        ))),
    }
}

thread_local! {
    /// Set while an NCCL call on a stream being captured runs on this thread: the device and
    /// the capture interaction mode the thread had before the call relaxed it.
    static RELAXED: Cell<Option<(Device, u32)>> = const { Cell::new(None) };
}

/// Relaxes this thread's capture interaction mode for the rest of the NCCL call being made
/// (until [`restore_mode`], which the C ABI's `guard` calls as every call returns): its
/// pointer queries and allocations must not invalidate the capture the program opened, as
/// NCCL relaxes the mode around its own.
fn relax(device: Device) -> Result<()> {
    if RELAXED.get().is_none() {
        let before = device.relax_capture_mode()?;
        RELAXED.set(Some((device, before)));
    }
    Ok(())
}

/// Puts back the capture interaction mode [`relax`] changed, if it did.
pub(crate) fn restore_mode() {
    if let Some((device, mode)) = RELAXED.take() {
        if let Err(e) = device.restore_capture_mode(mode) {
            ferroccl_transport::log_line!("ferroccl WARN COLL: restoring the capture mode: {e}");
        }
    }
}

/// The call and its rank, as errors name them.
fn who(api: &str, shared: &Shared) -> String {
    match shared.try_ready() {
        Some(Ok(c)) => format!("{api} on rank {}", c.rank()),
        _ => format!("{api} (communicator not ready)"),
    }
}

/// The error of a call that cannot be recorded into the graph being captured on `stream`.
pub(super) fn refuse(api: &str, shared: &Shared, stream: usize, why: &str) -> Error {
    Error::invalid_usage(format!(
        "{}: stream 0x{stream:x} is being captured into a CUDA graph, and this call cannot be \
         recorded into it: {why}; nothing was recorded (the capture goes on), make the call \
         outside the capture",
        who(api, shared)
    ))
}

/// A batch that will be recorded: its device, stream and device ranges.
#[derive(Debug)]
pub(super) struct Recorded {
    device: Device,
    stream: usize,
    spans: Vec<Span>,
}

/// Whether the batch `ops` of `shared` is made on a stream being captured; if so, what to
/// record, or why it cannot be. `checked`: the operations' arguments were checked when they
/// were issued.
pub(super) fn plan(shared: &Shared, ops: &[Op], checked: bool) -> Result<Option<Recorded>> {
    let Some((api, on)) = ops.iter().find_map(captured) else {
        return Ok(None);
    };
    let stream = on.stream;
    // Inside a group, the calls' own relaxation ended as they returned: this is
    // `ncclGroupEnd`'s.
    relax(on.device)?;
    let refused = |why: &str| Err(refuse(api, shared, stream, why));
    for op in ops {
        match stream_of(op) {
            Some(o) if o.stream == stream && o.captured => {}
            _ if matches!(op, Op::Split { .. }) => {
                return refused("ncclCommSplit inside the group is not recorded");
            }
            _ => {
                return refused(
                    "its group holds operations that are not on the stream being captured",
                )
            }
        }
    }
    let comm = shared.wait_ready()?;
    if comm.device() != Some(on.device) {
        comm.set_device(on.device)?;
    }
    if let Some(why) = comm.capture_refusal(on.device) {
        return refused(why);
    }
    let mut by_stream = stream_spans(shared, on.device, ops, checked)?;
    let spans = by_stream.pop().map(|(_, s)| s).unwrap_or_default();
    Ok(Some(Recorded {
        device: on.device,
        stream,
        spans,
    }))
}

/// Records the batch `ops` of `shared` into the graph being captured (the module docs).
pub(super) fn record(shared: &Arc<Shared>, mut ops: Vec<Op>, rec: Recorded) -> Result<()> {
    let Recorded {
        device,
        stream,
        spans,
    } = rec;
    // SAFETY: every range was checked as live memory of `device` when its call was made, and
    // NCCL's contract keeps it the operation's whenever the graph runs it; `stream` is the
    // caller's stream of that device.
    let (staged, arena) = unsafe { shared.streams.stage_captured(device, stream, &spans) }?;
    let outputs = staged.written_copies();
    let staged = [(stream, staged)];
    let colls = point_at_arenas(&mut ops, &staged);
    let blocks = Blocks::plan(&*shared.wait_ready()?, &ops, &colls);
    let names = op_names(&ops);
    let what = names.clone();
    let ops = Mutex::new(ops);
    // The host function holds the communicator weakly: the communicator keeps the function.
    let weak = Arc::downgrade(shared);
    let call = HostCall::new(move || {
        let Some(s) = weak.upgrade() else {
            return;
        };
        let ops: Vec<Op> = ops
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(resolve_scalar)
            .collect();
        // No wait for the communicator's queued stream jobs here: one queued on this stream
        // after the launch waits for this call, which would then wait for it. The stream
        // orders the jobs queued on it before the launch (their flag waits come first).
        let run = |comm: &Communicator| {
            blocks.run(ops, &colls, |ops, colls| {
                execute(comm, slice_colls(comm, ops, &colls), true)
            })
        };
        let comm = s.wait_ready();
        let Err(e) = comm.as_ref().map_err(Clone::clone).and_then(|c| run(c)) else {
            return;
        };
        for &(host, len) in &outputs {
            // SAFETY: the arena's copy of a written range, which lives as long as the
            // communicator (kept by its queue), and which nothing else uses while the graph
            // runs this call.
            unsafe { std::ptr::write_bytes(host as *mut u8, 0xff, len) };
        }
        let rank = comm.map_or_else(|_| String::from("?"), |c| c.rank().to_string());
        let e = e.context(&names).append(format!(
            "rank {rank}; the operation was recorded into a CUDA graph and ran at a launch of \
             it, whose outputs were filled with ones"
        ));
        ferroccl_transport::log_line!("ferroccl WARN COLL: {e}");
        s.streams.record_failure(e);
    });
    let handle = std::ptr::without_provenance_mut(stream);
    // SAFETY: the caller's stream of `device`; the queue keeps `call` until the graph is gone
    // (below) or the communicator goes, which NCCL's contract makes outlive the launches.
    unsafe { device.queue_host_call(handle, &call) }?;
    let release = shared.streams.keep_captured(call, arena);
    // SAFETY: as for the staging above; the arena is kept with the call.
    unsafe { staged[0].1.copy_back() }?;
    // The call is in the graph now: where it cannot be tied to the graph, its memory is kept
    // until the communicator goes, and the call still succeeds.
    // SAFETY: the caller's stream of `device`, in the active capture this call is recorded
    // into.
    match unsafe { device.on_graph_release(handle, release) } {
        Ok(true) => {}
        Ok(false) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                ferroccl_transport::log_line!(
                    "ferroccl INFO COLL: this CUDA driver cannot tie a recorded call to its \
                     graph (cuUserObjectCreate, cuGraphRetainUserObject): the memory of calls \
                     recorded into graphs is kept until their communicator is destroyed"
                )
            });
        }
        Err(e) => ferroccl_transport::log_line!(
            "ferroccl WARN COLL: {}: the call is recorded, but its memory is kept until the \
             communicator is destroyed: {e}",
            what
        ),
    }
    Ok(())
}

/// The stream of `op` and whether it is being captured, with the call's name.
fn captured(op: &Op) -> Option<(&'static str, super::stream::OnStream)> {
    let api: &'static str = match *op {
        Op::Coll { api, .. } | Op::Rooted { api, .. } => api,
        Op::Send { .. } => "ncclSend",
        Op::Recv { .. } => "ncclRecv",
        Op::Split { .. } => return None,
    };
    stream_of(op).filter(|o| o.captured).map(|o| (api, o))
}

/// `op` with a pre-multiplied sum's scalar read now from where it was staged: a host function
/// makes no device call, and the graph's copies in brought a device scalar to the arena.
fn resolve_scalar(op: &Op) -> Op {
    let mut op = op.clone();
    if let Op::Coll { red, .. } = &mut op {
        if let Reduction::ScalarAt(p, d) = *red {
            // SAFETY: the arena's copy of a device scalar, or a host scalar that NCCL's
            // contract keeps readable while operations use it.
            *red = Reduction::Op(ReduceOp::PreMulSum(unsafe { read_scalar(p, d) }));
        }
    }
    op
}

/// Pinned bytes `comm` holds for calls recorded into CUDA graphs: `*live` for calls a graph
/// may still run, `*spare` for calls whose graphs are gone, freed by the communicator's next
/// call that is not recorded (either may be NULL). Not part of NCCL's API: a diagnostic, and
/// how the test programs check that a destroyed graph gives its memory back.
///
/// # Safety
/// `comm` is a live communicator; `live` and `spare` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferrocclCommRecordedBytes(
    comm: ncclComm_t,
    live: *mut usize,
    spare: *mut usize,
) -> ncclResult_t {
    const API: &str = "ferrocclCommRecordedBytes";
    guard(API, || {
        let shared = super::comm::lookup(API, comm)?;
        let b = shared.streams.recorded_bytes();
        // SAFETY: each is NULL or writable, per the caller.
        unsafe {
            if !live.is_null() {
                *live = b.live;
            }
            if !spare.is_null() {
                *spare = b.spare;
            }
        }
        Ok(ncclSuccess)
    })
}

/// The stand-in provider's device for a test hook; the cuda provider has the driver's calls.
fn stand_in(api: &str) -> Result<()> {
    let dev = super::stream::hook_device(api)?;
    if dev.provider() == crate::device::Provider::Host {
        return Ok(());
    }
    Err(Error::invalid_usage(format!(
        "{api}: a test hook of the host stand-in (FERRO_DEVICE_PROVIDER=host); with a CUDA \
         driver use its own graph calls (cuStreamBeginCapture, cuGraphLaunch)"
    )))
}

/// Begins a capture of the host stand-in's `stream` (its model of `cudaStreamBeginCapture`).
/// Not part of NCCL's API: the test programs' graph calls over the stand-in.
///
/// # Safety
/// None beyond the C ABI's: `stream` is only a number.
#[no_mangle]
pub unsafe extern "C" fn ferrocclStreamBeginCapture(stream: cudaStream_t) -> ncclResult_t {
    const API: &str = "ferrocclStreamBeginCapture";
    guard(API, || {
        stand_in(API)?;
        host_stream::begin_capture(stream as usize)?;
        Ok(ncclSuccess)
    })
}

/// Ends the capture of the stand-in's `stream` into `*graph` (the model of
/// `cudaStreamEndCapture`; an invalidated capture is an error and no graph). Not part of
/// NCCL's API.
///
/// # Safety
/// `graph` is writable.
#[no_mangle]
pub unsafe extern "C" fn ferrocclStreamEndCapture(
    stream: cudaStream_t,
    graph: *mut *mut c_void,
) -> ncclResult_t {
    const API: &str = "ferrocclStreamEndCapture";
    guard(API, || {
        stand_in(API)?;
        if graph.is_null() {
            return Err(Error::invalid_argument(format!("{API}: graph is NULL")));
        }
        let g = host_stream::end_capture(stream as usize)?;
        // SAFETY: checked non-NULL; writable per the caller.
        unsafe { *graph = Box::into_raw(Box::new(g)).cast() };
        Ok(ncclSuccess)
    })
}

/// The capture status of the stand-in's `stream` into `*status` (the model of
/// `cudaStreamIsCapturing`: 0 none, 1 active, 2 invalidated). Not part of NCCL's API.
///
/// # Safety
/// `status` is writable.
#[no_mangle]
pub unsafe extern "C" fn ferrocclStreamIsCapturing(
    stream: cudaStream_t,
    status: *mut c_int,
) -> ncclResult_t {
    const API: &str = "ferrocclStreamIsCapturing";
    guard(API, || {
        stand_in(API)?;
        if status.is_null() {
            return Err(Error::invalid_argument(format!("{API}: status is NULL")));
        }
        let s = host_stream::capture_status(stream as usize);
        // SAFETY: checked non-NULL; writable per the caller.
        unsafe { *status = c_int::try_from(s).unwrap_or(2) };
        Ok(ncclSuccess)
    })
}

/// Queues the stand-in `graph`'s copies and host calls on `stream` (the model of
/// `cudaGraphLaunch`). Not part of NCCL's API.
///
/// # Safety
/// `graph` came from [`ferrocclStreamEndCapture`] and was not destroyed.
#[no_mangle]
pub unsafe extern "C" fn ferrocclGraphLaunch(
    graph: *mut c_void,
    stream: cudaStream_t,
) -> ncclResult_t {
    const API: &str = "ferrocclGraphLaunch";
    guard(API, || {
        stand_in(API)?;
        if graph.is_null() {
            return Err(Error::invalid_argument(format!("{API}: graph is NULL")));
        }
        // SAFETY: per the caller, a live graph made by `ferrocclStreamEndCapture`.
        let g = unsafe { &*graph.cast::<host_stream::Graph>() };
        host_stream::launch_graph(stream as usize, g)?;
        Ok(ncclSuccess)
    })
}

/// Destroys a stand-in `graph` (NULL: nothing). Not part of NCCL's API.
///
/// # Safety
/// `graph` came from [`ferrocclStreamEndCapture`] and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ferrocclGraphDestroy(graph: *mut c_void) -> ncclResult_t {
    const API: &str = "ferrocclGraphDestroy";
    guard(API, || {
        if !graph.is_null() {
            // SAFETY: per the caller, made by `Box::into_raw` in `ferrocclStreamEndCapture`.
            drop(unsafe { Box::from_raw(graph.cast::<host_stream::Graph>()) });
        }
        Ok(ncclSuccess)
    })
}
