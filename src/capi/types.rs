//! The C types of `nccl.h`, with NCCL 2.32's names and values. `include/nccl.h` declares the
//! same; `tests/capi.rs` compiles a C program against it and compares.
//!
//! Enumerations crossing the boundary are plain `c_int`s with constants, not Rust enums: a C
//! caller may pass any integer, and an out-of-range value must be an error, not undefined
//! behaviour.

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `NCCL_MAJOR`.
pub const NCCL_MAJOR: c_int = 2;
/// `NCCL_MINOR`: the NCCL release whose API this library implements.
pub const NCCL_MINOR: c_int = 32;
/// `NCCL_PATCH`.
pub const NCCL_PATCH: c_int = 3;
/// `NCCL_VERSION_CODE`: `NCCL_VERSION(2, 32, 3)` = 2 × 10000 + 32 × 100 + 3.
pub const NCCL_VERSION_CODE: c_int = NCCL_MAJOR * 10000 + NCCL_MINOR * 100 + NCCL_PATCH;

/// `NCCL_UNIQUE_ID_BYTES`.
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: 128 opaque bytes (ferroccl's [`UniqueId`](crate::bootstrap::UniqueId)).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    /// The bytes.
    pub internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

impl std::fmt::Debug for ncclUniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let head: Vec<u8> = self.internal[..16].iter().map(|&b| b as u8).collect();
        write!(f, "ncclUniqueId({head:02x?}...)")
    }
}

impl ncclUniqueId {
    /// The id as bytes.
    pub fn to_bytes(&self) -> [u8; NCCL_UNIQUE_ID_BYTES] {
        self.internal.map(|b| b as u8)
    }

    /// An id holding `bytes`.
    pub fn from_bytes(bytes: &[u8; NCCL_UNIQUE_ID_BYTES]) -> ncclUniqueId {
        ncclUniqueId {
            internal: bytes.map(|b| b as c_char),
        }
    }
}

/// The object behind `ncclComm_t`. C code only ever holds pointers to it; the library looks
/// the pointer up in its table of live communicators and never dereferences it.
#[derive(Debug)]
pub struct ncclComm {
    /// Makes the type non-empty, so every communicator has its own address.
    pub(crate) _serial: u64,
}

/// `ncclComm_t`.
pub type ncclComm_t = *mut ncclComm;

/// `cudaStream_t` (`struct CUstream_st*`). Only NULL (host buffers) is accepted here.
pub type cudaStream_t = *mut c_void;

/// `ncclResult_t`.
pub type ncclResult_t = c_int;
/// Success.
pub const ncclSuccess: ncclResult_t = 0;
/// A CUDA call failed.
pub const ncclUnhandledCudaError: ncclResult_t = 1;
/// The operating system refused something (socket, memory, thread).
pub const ncclSystemError: ncclResult_t = 2;
/// A bug in the library.
pub const ncclInternalError: ncclResult_t = 3;
/// A bad argument.
pub const ncclInvalidArgument: ncclResult_t = 4;
/// A call not allowed in this state.
pub const ncclInvalidUsage: ncclResult_t = 5;
/// A peer failed or the network did.
pub const ncclRemoteError: ncclResult_t = 6;
/// A non-blocking operation is still running.
pub const ncclInProgress: ncclResult_t = 7;
/// A deadline passed while waiting for a peer (`FERRO_TIMEOUT`).
pub const ncclTimeout: ncclResult_t = 8;
/// Number of result codes.
pub const ncclNumResults: ncclResult_t = 9;

/// `ncclDataType_t` (values are [`DataType`](crate::DataType)'s discriminants).
pub type ncclDataType_t = c_int;
/// `int8_t`.
pub const ncclInt8: ncclDataType_t = 0;
/// Alias of `ncclInt8`.
pub const ncclChar: ncclDataType_t = 0;
/// `uint8_t`.
pub const ncclUint8: ncclDataType_t = 1;
/// `int32_t`.
pub const ncclInt32: ncclDataType_t = 2;
/// Alias of `ncclInt32`.
pub const ncclInt: ncclDataType_t = 2;
/// `uint32_t`.
pub const ncclUint32: ncclDataType_t = 3;
/// `int64_t`.
pub const ncclInt64: ncclDataType_t = 4;
/// `uint64_t`.
pub const ncclUint64: ncclDataType_t = 5;
/// IEEE half.
pub const ncclFloat16: ncclDataType_t = 6;
/// Alias of `ncclFloat16`.
pub const ncclHalf: ncclDataType_t = 6;
/// `float`.
pub const ncclFloat32: ncclDataType_t = 7;
/// Alias of `ncclFloat32`.
pub const ncclFloat: ncclDataType_t = 7;
/// `double`.
pub const ncclFloat64: ncclDataType_t = 8;
/// Alias of `ncclFloat64`.
pub const ncclDouble: ncclDataType_t = 8;
/// bfloat16.
pub const ncclBfloat16: ncclDataType_t = 9;
/// fp8 e4m3.
pub const ncclFloat8e4m3: ncclDataType_t = 10;
/// fp8 e5m2.
pub const ncclFloat8e5m2: ncclDataType_t = 11;
/// Number of data types.
pub const ncclNumTypes: ncclDataType_t = 12;

/// `ncclRedOp_t`: the five built-in operations, then operations made by
/// `ncclRedOpCreatePreMulSum` (from `ncclNumOps` up).
pub type ncclRedOp_t = c_int;
/// Sum.
pub const ncclSum: ncclRedOp_t = 0;
/// Product.
pub const ncclProd: ncclRedOp_t = 1;
/// Maximum.
pub const ncclMax: ncclRedOp_t = 2;
/// Minimum.
pub const ncclMin: ncclRedOp_t = 3;
/// Average.
pub const ncclAvg: ncclRedOp_t = 4;
/// Number of built-in operations; the first value of a user-made operation.
pub const ncclNumOps: ncclRedOp_t = 5;
/// Largest value an operation may have (the enum is `int`-sized).
pub const ncclMaxRedOp: ncclRedOp_t = 0x7fff_ffff;

/// `ncclScalarResidence_t`: where `ncclRedOpCreatePreMulSum`'s scalar lives.
pub type ncclScalarResidence_t = c_int;
/// The scalar is in (device) memory, read when each operation runs; host memory here.
pub const ncclScalarDevice: ncclScalarResidence_t = 0;
/// The scalar is read once, when the operation is created.
pub const ncclScalarHostImmediate: ncclScalarResidence_t = 1;

/// `NCCL_CONFIG_UNDEF_INT`: a field left at its default.
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// `NCCL_API_MAGIC`: `ncclConfig_t::magic` of an initialized config.
pub const NCCL_API_MAGIC: c_uint = 0xcafe_beef;
/// `NCCL_SPLIT_NOCOLOR`: a rank passing it to `ncclCommSplit` gets no communicator.
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;

/// `ncclConfig_t` as of NCCL 2.32 (`ncclConfig_v23100`). A caller built against an older
/// header passes a shorter struct; the library reads only the prefix the caller's `size` says
/// it has. Fields after `blocking` are accepted and have no effect (they tune CUDA kernels,
/// NVLink and network features ferroccl does not have).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclConfig_t {
    /// `sizeof(ncclConfig_t)` as the caller compiled it.
    pub size: usize,
    /// [`NCCL_API_MAGIC`].
    pub magic: c_uint,
    /// The caller's `NCCL_VERSION_CODE`.
    pub version: c_uint,
    /// 1 (default): calls complete before returning; 0: they return `ncclInProgress` and run
    /// in the background.
    pub blocking: c_int,
    /// Accepted, no effect (no CUDA).
    pub cgaClusterSize: c_int,
    /// Accepted, no effect.
    pub minCTAs: c_int,
    /// Accepted, no effect.
    pub maxCTAs: c_int,
    /// Accepted, no effect.
    pub netName: *const c_char,
    /// Accepted, no effect (NCCL 2.18 and later).
    pub splitShare: c_int,
    /// Accepted, no effect.
    pub trafficClass: c_int,
    /// Accepted, no effect.
    pub commName: *const c_char,
    /// Accepted, no effect.
    pub collnetEnable: c_int,
    /// Accepted, no effect.
    pub CTAPolicy: c_int,
    /// Accepted, no effect (`ncclCommShrink` never shares the parent's connections).
    pub shrinkShare: c_int,
    /// Accepted, no effect.
    pub nvlsCTAs: c_int,
    /// Accepted, no effect.
    pub nChannelsPerNetPeer: c_int,
    /// Accepted, no effect.
    pub nvlinkCentricSched: c_int,
    /// Accepted, no effect.
    pub graphUsageMode: c_int,
    /// Accepted, no effect.
    pub numRmaCtx: c_int,
    /// Accepted, no effect.
    pub maxP2pPeers: c_int,
    /// Accepted, no effect.
    pub graphStreamOrdering: c_int,
    /// Accepted, no effect.
    pub launchOrderImplicit: c_int,
    /// Accepted, no effect.
    pub numRmaSig: c_int,
    /// Accepted, no effect.
    pub rmaEagerInit: c_int,
    /// Accepted, no effect.
    pub hostCftMode: c_int,
    /// Accepted, no effect.
    pub nvlsHostMode: c_int,
}

impl Default for ncclConfig_t {
    /// `NCCL_CONFIG_INITIALIZER`.
    fn default() -> Self {
        const U: c_int = NCCL_CONFIG_UNDEF_INT;
        ncclConfig_t {
            size: std::mem::size_of::<ncclConfig_t>(),
            magic: NCCL_API_MAGIC,
            version: NCCL_VERSION_CODE as c_uint,
            blocking: U,
            cgaClusterSize: U,
            minCTAs: U,
            maxCTAs: U,
            netName: std::ptr::null(),
            splitShare: U,
            trafficClass: U,
            commName: std::ptr::null(),
            collnetEnable: U,
            CTAPolicy: U,
            shrinkShare: U,
            nvlsCTAs: U,
            nChannelsPerNetPeer: U,
            nvlinkCentricSched: U,
            graphUsageMode: U,
            numRmaCtx: U,
            maxP2pPeers: U,
            graphStreamOrdering: U,
            launchOrderImplicit: U,
            numRmaSig: U,
            rmaEagerInit: U,
            hostCftMode: U,
            nvlsHostMode: U,
        }
    }
}

/// `ncclConfigExt_t`: one vendor option of a per-call config (a list through `next`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclConfigExt_t {
    /// The next option, or NULL.
    pub next: *mut ncclConfigExt_t,
    /// `key.vendorId`.
    pub vendorId: c_int,
    /// `key.optionId`.
    pub optionId: c_int,
    /// The value (`int`, `const char*` or `void*`), as a pointer-sized word.
    pub val: *mut c_void,
}

/// `ncclCollConfig_t` (`ncclCollConfig_v23200`): options of one `nccl*Config` collective.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclCollConfig_t {
    /// `sizeof(ncclCollConfig_t)` as the caller compiled it.
    pub size: usize,
    /// [`NCCL_API_MAGIC`].
    pub magic: c_uint,
    /// The caller's `NCCL_VERSION_CODE`.
    pub version: c_uint,
    /// Vendor options; ferroccl reads none (as NCCL's library).
    pub ext: *mut ncclConfigExt_t,
    /// Accepted, no effect.
    pub minCTAs: c_int,
    /// Accepted, no effect.
    pub maxCTAs: c_int,
    /// Accepted, no effect.
    pub nvlsCTAs: c_int,
    /// Accepted, no effect.
    pub cgaClusterSize: c_int,
    /// Algorithm names this call may use (ferroccl's: `ring`, `tree`, ...); NULL or "" for
    /// the tuner's choice.
    pub algSelection: *const c_char,
    /// 1 (default): a selection that cannot run the call is an error; 0: fall back.
    pub forceAlgSelection: c_int,
    /// Accepted, no effect.
    pub CTAPolicy: c_int,
    /// Accepted, no effect (no profiler plugins).
    pub userProfilerTag: u64,
    /// `cudaEvent_t`: must be NULL (no CUDA).
    pub launchCompletionEvent: *mut c_void,
}

impl Default for ncclCollConfig_t {
    /// `NCCL_COLLCONFIG_INITIALIZER`.
    fn default() -> Self {
        const U: c_int = NCCL_CONFIG_UNDEF_INT;
        ncclCollConfig_t {
            size: std::mem::size_of::<ncclCollConfig_t>(),
            magic: NCCL_API_MAGIC,
            version: NCCL_VERSION_CODE as c_uint,
            ext: std::ptr::null_mut(),
            minCTAs: U,
            maxCTAs: U,
            nvlsCTAs: U,
            cgaClusterSize: U,
            algSelection: std::ptr::null(),
            forceAlgSelection: 1,
            CTAPolicy: U,
            userProfilerTag: 0,
            launchCompletionEvent: std::ptr::null_mut(),
        }
    }
}

/// `NCCL_SIM_INFO_INITIALIZER`'s magic.
pub const NCCL_SIM_INFO_MAGIC: c_uint = 0x7468_5283;

/// `ncclSimInfo_t` (`ncclSimInfo_v22200`): what `ncclGroupSimulateEnd` answers.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclSimInfo_t {
    /// `sizeof(ncclSimInfo_t)`.
    pub size: usize,
    /// [`NCCL_SIM_INFO_MAGIC`].
    pub magic: c_uint,
    /// The caller's `NCCL_VERSION_CODE`.
    pub version: c_uint,
    /// Estimated time of the group, in microseconds.
    pub estimatedTime: f32,
}

impl Default for ncclSimInfo_t {
    /// `NCCL_SIM_INFO_INITIALIZER`.
    fn default() -> Self {
        ncclSimInfo_t {
            size: std::mem::size_of::<ncclSimInfo_t>(),
            magic: NCCL_SIM_INFO_MAGIC,
            version: NCCL_VERSION_CODE as c_uint,
            estimatedTime: -1.0,
        }
    }
}

/// `ncclWaitSignalDesc_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclWaitSignalDesc_t {
    /// Signals to wait for.
    pub opCnt: c_int,
    /// From this peer.
    pub peer: c_int,
    /// Signal index.
    pub sigIdx: c_int,
    /// Context.
    pub ctx: c_int,
}

/// `ncclEncryptionConfig_t` (`ncclEncryptionConfig_v23200`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclEncryptionConfig_t {
    /// `sizeof(ncclEncryptionConfig_t)`.
    pub size: usize,
    /// [`NCCL_API_MAGIC`].
    pub magic: c_uint,
    /// The caller's `NCCL_VERSION_CODE`.
    pub version: c_uint,
    /// `NCCL_ENCRYPTION_MODE_NONE` (0) or `NCCL_ENCRYPTION_MODE_PSK` (1).
    pub mode: c_int,
    /// The pre-shared key.
    pub psk: *const c_char,
}

/// `ncclWindow_t`: a registered window; C holds only its address, which the library looks up.
#[derive(Debug)]
pub struct ncclWindow_vidmem {
    /// Makes the type non-empty, so every window has its own address.
    pub(crate) _serial: u64,
}

/// `ncclWindow_t`.
pub type ncclWindow_t = *mut ncclWindow_vidmem;

/// `ncclParamHandle_t`: a bound parameter (an index into the library's table, plus one).
pub type ncclParamHandle_t = *mut c_void;

/// `ncclCommMemStat_t`.
pub type ncclCommMemStat_t = c_int;
/// GPU memory that can be suspended (bytes).
pub const ncclStatGpuMemSuspend: ncclCommMemStat_t = 0;
/// Whether GPU memory is suspended.
pub const ncclStatGpuMemSuspended: ncclCommMemStat_t = 1;
/// GPU memory that cannot be suspended (bytes).
pub const ncclStatGpuMemPersist: ncclCommMemStat_t = 2;
/// All GPU memory the library tracks (bytes).
pub const ncclStatGpuMemTotal: ncclCommMemStat_t = 3;

/// `NCCL_WIN_*` flags `ncclCommWindowRegister` knows.
pub const NCCL_WIN_KNOWN_FLAGS: c_int = 0x0f;
/// `NCCL_SHRINK_ABORT`: abort the parent's operations before shrinking.
pub const NCCL_SHRINK_ABORT: c_int = 0x01;
/// `NCCL_SUSPEND_MEM`.
pub const NCCL_SUSPEND_MEM: c_int = 0x01;
