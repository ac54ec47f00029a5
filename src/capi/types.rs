//! The C types of `nccl.h`, with NCCL 2.19's names and values. `include/nccl.h` declares the
//! same; `tests/capi.rs` compiles a C program against it and compares.
//!
//! Enumerations crossing the boundary are plain `c_int`s with constants, not Rust enums: a C
//! caller may pass any integer, and an out-of-range value must be an error, not undefined
//! behaviour.

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `NCCL_MAJOR`.
pub const NCCL_MAJOR: c_int = 2;
/// `NCCL_MINOR`: the NCCL release whose API this library implements.
pub const NCCL_MINOR: c_int = 19;
/// `NCCL_PATCH`.
pub const NCCL_PATCH: c_int = 3;
/// `NCCL_VERSION_CODE`: `NCCL_VERSION(2, 19, 3)` = 2 × 10000 + 19 × 100 + 3.
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

/// `ncclConfig_t` as of NCCL 2.19 (`ncclConfig_v21700`). Later NCCL releases append fields;
/// the library reads only the prefix the caller's `size` and `version` say it has.
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
    /// Accepted, no effect (only TCP exists).
    pub netName: *const c_char,
    /// Accepted, no effect (NCCL 2.18 and later).
    pub splitShare: c_int,
}

impl Default for ncclConfig_t {
    /// `NCCL_CONFIG_INITIALIZER`.
    fn default() -> Self {
        ncclConfig_t {
            size: std::mem::size_of::<ncclConfig_t>(),
            magic: NCCL_API_MAGIC,
            version: NCCL_VERSION_CODE as c_uint,
            blocking: NCCL_CONFIG_UNDEF_INT,
            cgaClusterSize: NCCL_CONFIG_UNDEF_INT,
            minCTAs: NCCL_CONFIG_UNDEF_INT,
            maxCTAs: NCCL_CONFIG_UNDEF_INT,
            netName: std::ptr::null(),
            splitShare: NCCL_CONFIG_UNDEF_INT,
        }
    }
}
