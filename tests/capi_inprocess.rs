//! The NCCL C entry points (feature `capi`) called in-process, ranks as threads: non-blocking
//! init and progress, init inside a group, a failed peer, the config read by size and
//! version, and argument errors that name the argument and its value.
//!
//! Run with `cargo test -p ferroccl --features capi --test capi_inprocess`.
#![cfg(feature = "capi")]
// Configs are built as C code builds them: the initializer, then field by field.
#![allow(clippy::field_reassign_with_default)]

use std::ffi::{c_int, c_void, CStr};
use std::ptr::{null, null_mut};

use ferroccl::capi::*;

fn last_error() -> String {
    // SAFETY: ncclGetLastError returns a NUL-terminated string valid until the next failing
    // call on this thread.
    unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned()
}

fn unique_id() -> ncclUniqueId {
    let mut id = ncclUniqueId {
        internal: [0; NCCL_UNIQUE_ID_BYTES],
    };
    // SAFETY: `id` is writable.
    let rc = unsafe { ncclGetUniqueId(&mut id) };
    assert_eq!(rc, ncclSuccess, "{}", last_error());
    id
}

/// A send/receive handle for pointers crossing into test threads.
#[derive(Clone, Copy)]
struct Comm(ncclComm_t);
// SAFETY: handles are plain addresses the library looks up; any thread may pass them.
unsafe impl Send for Comm {}

fn init_threads(n: usize, blocking: bool) -> Vec<Comm> {
    let id = unique_id();
    let handles: Vec<_> = (0..n)
        .map(|r| {
            std::thread::spawn(move || {
                let mut comm = null_mut();
                let mut cfg = ncclConfig_t::default();
                cfg.blocking = c_int::from(blocking);
                // SAFETY: valid out-pointer and config.
                let rc = unsafe {
                    ncclCommInitRankConfig(&mut comm, n as c_int, id, r as c_int, &mut cfg)
                };
                if blocking {
                    assert_eq!(rc, ncclSuccess, "{}", last_error());
                } else {
                    assert_eq!(rc, ncclInProgress, "{}", last_error());
                }
                Comm(comm)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("init thread"))
        .collect()
}

fn wait_async(c: Comm) -> ncclResult_t {
    let mut state = ncclInProgress;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while state == ncclInProgress {
        assert!(std::time::Instant::now() < deadline, "still in progress");
        // SAFETY: valid handle and out-pointer.
        let rc = unsafe { ncclCommGetAsyncError(c.0, &mut state) };
        assert_eq!(rc, ncclSuccess);
        std::thread::yield_now();
    }
    state
}

#[test]
fn non_blocking_init_and_collectives_report_progress() {
    let comms = init_threads(3, false);
    for &c in &comms {
        assert_eq!(wait_async(c), ncclSuccess, "{}", last_error());
    }
    // One thread issues on all three non-blocking communicators; each runs in the background.
    let mut bufs: Vec<Vec<u64>> = (0..3)
        .map(|r| (0..50).map(|i| r * 1000 + i).collect())
        .collect();
    for (c, b) in comms.iter().zip(bufs.iter_mut()) {
        // SAFETY: `b` holds 50 u64 and lives until the operation is seen complete below.
        let rc = unsafe {
            ncclAllReduce(
                b.as_ptr().cast(),
                b.as_mut_ptr().cast(),
                50,
                ncclUint64,
                ncclSum,
                c.0,
                null_mut(),
            )
        };
        assert_eq!(rc, ncclInProgress);
    }
    for &c in &comms {
        assert_eq!(wait_async(c), ncclSuccess, "{}", last_error());
    }
    for b in &bufs {
        let want: Vec<u64> = (0..50).map(|i| 3000 + 3 * i).collect();
        assert_eq!(b, &want);
    }
    for c in comms {
        // SAFETY: a live handle, destroyed once.
        assert_eq!(unsafe { ncclCommDestroy(c.0) }, ncclSuccess);
    }
}

#[test]
fn init_rank_inside_a_group_from_one_thread() {
    let id = unique_id();
    let mut comms = [null_mut(); 3];
    // SAFETY: group calls with valid out-pointers; buffers outlive the group.
    unsafe {
        assert_eq!(ncclGroupStart(), ncclSuccess);
        for (r, c) in comms.iter_mut().enumerate() {
            assert_eq!(
                ncclCommInitRank(c, 3, id, r as c_int),
                ncclSuccess,
                "{}",
                last_error()
            );
        }
        assert_eq!(ncclGroupEnd(), ncclSuccess, "{}", last_error());
    }
    let mut data: Vec<[f32; 4]> = (0..3).map(|r| [r as f32, 1.0, -(r as f32), 0.5]).collect();
    // SAFETY: as above.
    unsafe {
        assert_eq!(ncclGroupStart(), ncclSuccess);
        for (c, d) in comms.iter().zip(data.iter_mut()) {
            let p = d.as_mut_ptr().cast::<c_void>();
            assert_eq!(
                ncclAllReduce(p, p, 4, ncclFloat, ncclMax, *c, null_mut()),
                ncclSuccess
            );
        }
        assert_eq!(ncclGroupEnd(), ncclSuccess, "{}", last_error());
    }
    for d in &data {
        assert_eq!(d, &[2.0, 1.0, 0.0, 0.5]);
    }
    for c in comms {
        // SAFETY: live handles.
        assert_eq!(unsafe { ncclCommDestroy(c) }, ncclSuccess);
    }
}

#[test]
fn failed_peer_is_a_remote_error_and_handles_are_checked() {
    let comms = init_threads(2, true);
    let (a, b) = (comms[0], comms[1]);
    // SAFETY: a live handle, aborted (and freed) once.
    assert_eq!(unsafe { ncclCommAbort(b.0) }, ncclSuccess);
    let mut buf = [1i32; 16];
    let p = buf.as_mut_ptr().cast::<c_void>();
    // SAFETY: `buf` holds 16 i32.
    let rc = unsafe { ncclAllReduce(p, p, 16, ncclInt32, ncclSum, a.0, null_mut()) };
    assert!(
        rc == ncclRemoteError || rc == ncclSystemError,
        "rc {rc}: {}",
        last_error()
    );
    let mut state = ncclSuccess;
    // SAFETY: live handle, valid out-pointer.
    let got = unsafe { ncclCommGetAsyncError(a.0, &mut state) };
    assert_eq!(got, ncclSuccess);
    assert_eq!(state, rc);
    // The aborted handle is gone: an error, not a crash. So is a made-up one.
    // SAFETY: the library never dereferences handles.
    let stale = unsafe { ncclAllReduce(p, p, 16, ncclInt32, ncclSum, b.0, null_mut()) };
    assert_eq!(stale, ncclInvalidArgument);
    assert!(
        last_error().contains("not a live communicator"),
        "{}",
        last_error()
    );
    let bogus = std::ptr::without_provenance_mut::<ncclComm>(0x1234);
    // SAFETY: as above.
    assert_eq!(unsafe { ncclCommDestroy(bogus) }, ncclInvalidArgument);
    // SAFETY: a live handle.
    assert_eq!(unsafe { ncclCommDestroy(a.0) }, ncclSuccess);
}

#[test]
fn config_is_read_by_size_and_version() {
    // NULL: defaults.
    // SAFETY: NULL and pointers to live configs of the stated size.
    unsafe {
        assert_eq!(
            read_config("t", null(), true).unwrap(),
            CommOptions { blocking: true }
        );
        let mut c = ncclConfig_t::default();
        c.blocking = 0;
        assert_eq!(
            read_config("t", &c, true).unwrap(),
            CommOptions { blocking: false }
        );
        // An older caller whose struct ends before `blocking`: the field keeps its default.
        c.size = std::mem::offset_of!(ncclConfig_t, blocking);
        assert_eq!(
            read_config("t", &c, true).unwrap(),
            CommOptions { blocking: true }
        );
        // A 2.14-era caller (no splitShare): garbage after its struct is never read.
        c = ncclConfig_t::default();
        c.size = std::mem::offset_of!(ncclConfig_t, splitShare);
        c.version = 21400;
        c.splitShare = 99;
        assert!(read_config("t", &c, true).is_ok());
        // A newer caller's larger struct: the known prefix is read.
        let mut big = [0u8; 256];
        let mut n = ncclConfig_t::default();
        n.size = big.len();
        n.blocking = 0;
        std::ptr::copy_nonoverlapping(
            (&n as *const ncclConfig_t).cast::<u8>(),
            big.as_mut_ptr(),
            size_of::<ncclConfig_t>(),
        );
        let r = read_config("t", big.as_ptr().cast(), true).unwrap();
        assert!(!r.blocking);
        // Bad magic and bad values name the field.
        c = ncclConfig_t::default();
        c.magic = 7;
        let e = read_config("ncclCommInitRankConfig", &c, true).unwrap_err();
        assert!(
            e.message().contains("magic") && e.message().contains("NCCL_CONFIG_INITIALIZER"),
            "{e}"
        );
        c = ncclConfig_t::default();
        c.blocking = 5;
        let e = read_config("t", &c, true).unwrap_err();
        assert!(e.message().contains("blocking is 5"), "{e}");
    }
}

#[test]
fn argument_errors_name_argument_and_value() {
    let comms = init_threads(1, true);
    let c = comms[0].0;
    let mut buf = [0f64; 8];
    let p = buf.as_mut_ptr().cast::<c_void>();
    // SAFETY: valid buffers and handle; bad arguments are rejected before any access.
    unsafe {
        assert_eq!(
            ncclBroadcast(p, p, 8, ncclDouble, 3, c, null_mut()),
            ncclInvalidArgument
        );
        assert!(
            last_error().contains("invalid root 3 (root must be 0..0)"),
            "{}",
            last_error()
        );
        assert_eq!(
            ncclAllReduce(p, p, usize::MAX / 2, ncclDouble, ncclSum, c, null_mut()),
            ncclInvalidArgument
        );
        assert!(last_error().contains("overflows"), "{}", last_error());
        // A non-NULL stream means device buffers: host memory is refused, or, without a
        // driver (this test does not choose the provider), the driver's error.
        let stream = std::ptr::without_provenance_mut::<c_void>(0x40);
        let r = ncclAllReduce(p, p, 8, ncclDouble, ncclSum, c, stream);
        let want = if r == ncclSystemError {
            "ncclAllReduce: device buffers need an NVIDIA driver"
        } else {
            assert_eq!(r, ncclInvalidArgument, "{}", last_error());
            "is host memory"
        };
        assert!(last_error().contains(want), "{}", last_error());
        let r = ncclSend(p, 8, ncclDouble, 0, c, stream);
        assert!(
            r == ncclSystemError || r == ncclInvalidArgument,
            "ncclSend of host memory on a stream: {r} {}",
            last_error()
        );
        assert!(last_error().starts_with("ncclSend"), "{}", last_error());
        // Overlapping buffers that are not the in-place layout.
        assert_eq!(
            ncclAllReduce(
                p,
                buf.as_mut_ptr().add(1).cast(),
                4,
                ncclDouble,
                ncclSum,
                c,
                null_mut()
            ),
            ncclInvalidArgument
        );
        assert!(last_error().contains("overlap"), "{}", last_error());
        // An error inside a group fails the group, which then runs nothing.
        assert_eq!(ncclGroupStart(), ncclSuccess);
        assert_eq!(
            ncclAllReduce(p, p, 8, 99, ncclSum, c, null_mut()),
            ncclInvalidArgument
        );
        assert_eq!(ncclGroupEnd(), ncclInvalidArgument);
        assert!(last_error().contains("data type 99"), "{}", last_error());
        // Pre-multiplied sum on one rank scales; its scalar is read at each call when
        // resident "on the device".
        let mut scalar = 2.5f64;
        let sp: *mut f64 = &mut scalar;
        let mut op = 0;
        assert_eq!(
            ncclRedOpCreatePreMulSum(&mut op, sp.cast(), ncclDouble, ncclScalarDevice, c),
            ncclSuccess
        );
        buf = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        assert_eq!(
            ncclAllReduce(p, p, 8, ncclDouble, op, c, null_mut()),
            ncclSuccess,
            "{}",
            last_error()
        );
        assert_eq!(buf, [2.5, 5.0, 7.5, 10.0, 12.5, 15.0, 17.5, 20.0]);
        sp.write(-1.0);
        assert_eq!(
            ncclAllReduce(p, p, 2, ncclDouble, op, c, null_mut()),
            ncclSuccess
        );
        assert_eq!(&buf[..2], &[-2.5, -5.0]);
        assert_eq!(
            ncclAllReduce(p, p, 2, ncclFloat, op, c, null_mut()),
            ncclInvalidArgument
        );
        assert!(
            last_error().contains("was made for data type 8"),
            "{}",
            last_error()
        );
        assert_eq!(ncclRedOpDestroy(op, c), ncclSuccess);
        assert_eq!(ncclRedOpDestroy(op, c), ncclInvalidArgument);
        assert_eq!(ncclRedOpDestroy(ncclSum, c), ncclInvalidArgument);
        // Error strings.
        let s = CStr::from_ptr(ncclGetErrorString(ncclRemoteError)).to_string_lossy();
        assert!(s.contains("remote"), "{s}");
        let s = CStr::from_ptr(ncclGetErrorString(1234)).to_string_lossy();
        assert!(s.contains("unknown"), "{s}");
        assert_eq!(ncclMemFree(p), ncclInvalidArgument);
        assert_eq!(ncclCommDestroy(c), ncclSuccess);
    }
}
