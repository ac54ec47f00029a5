//! libibverbs, loaded at run time: the exported functions the provider calls, and the inline
//! ones of verbs.h (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`) reproduced as calls
//! through the context's operation table.
//!
//! Structures are passed as byte buffers laid out at the offsets of rdma-core's verbs.h
//! (x86-64 and aarch64 LP64; checked against rdma-core 44's header with `offsetof`): the ABI of
//! these structures has been stable since libibverbs 1.1 (the `IBVERBS_1.1` symbol version),
//! which every rdma-core release keeps.

use std::ffi::{c_char, c_int, c_void, CStr};

/// Offsets into `struct ibv_context` of the operations verbs.h calls inline.
pub(crate) const CTX_OPS_POLL_CQ: usize = 96;
pub(crate) const CTX_OPS_POST_SEND: usize = 208;
pub(crate) const CTX_OPS_POST_RECV: usize = 216;
/// `struct ibv_qp`: `context` at 0, `qp_num` at 52.
pub(crate) const QP_NUM: usize = 52;
/// `struct ibv_mr`: `lkey` at 36, `rkey` at 40.
pub(crate) const MR_LKEY: usize = 36;
pub(crate) const MR_RKEY: usize = 40;

/// `struct ibv_send_wr` (128 bytes).
pub(crate) mod send_wr {
    pub const SIZE: usize = 128;
    pub const WR_ID: usize = 0;
    pub const SG_LIST: usize = 16;
    pub const NUM_SGE: usize = 24;
    pub const OPCODE: usize = 28;
    pub const SEND_FLAGS: usize = 32;
    pub const IMM_DATA: usize = 36;
    pub const REMOTE_ADDR: usize = 40;
    pub const RKEY: usize = 48;
}

/// `struct ibv_recv_wr` (32 bytes): `wr_id`, `next`, `sg_list`, `num_sge`.
pub(crate) const RECV_WR_SIZE: usize = 32;

/// `struct ibv_wc` (48 bytes).
pub(crate) mod wc {
    pub const SIZE: usize = 48;
    pub const WR_ID: usize = 0;
    pub const STATUS: usize = 8;
    pub const OPCODE: usize = 12;
    pub const BYTE_LEN: usize = 20;
    pub const IMM_DATA: usize = 24;
    pub const QP_NUM: usize = 28;
}

/// `struct ibv_qp_init_attr` (64 bytes).
pub(crate) mod qp_init {
    pub const SIZE: usize = 64;
    pub const SEND_CQ: usize = 8;
    pub const RECV_CQ: usize = 16;
    pub const MAX_SEND_WR: usize = 32;
    pub const MAX_RECV_WR: usize = 36;
    pub const MAX_SEND_SGE: usize = 40;
    pub const MAX_RECV_SGE: usize = 44;
    pub const QP_TYPE: usize = 52;
}

/// `struct ibv_qp_attr` (144 bytes) and its `ah_attr` (at 56) with `grh` (at 56).
pub(crate) mod qp_attr {
    pub const SIZE: usize = 144;
    pub const QP_STATE: usize = 0;
    pub const PATH_MTU: usize = 8;
    pub const RQ_PSN: usize = 20;
    pub const SQ_PSN: usize = 24;
    pub const DEST_QP_NUM: usize = 28;
    pub const ACCESS_FLAGS: usize = 32;
    pub const DGID: usize = 56;
    pub const SGID_INDEX: usize = 56 + 20;
    pub const HOP_LIMIT: usize = 56 + 21;
    pub const TRAFFIC_CLASS: usize = 56 + 22;
    pub const DLID: usize = 56 + 24;
    pub const SL: usize = 56 + 26;
    pub const IS_GLOBAL: usize = 56 + 29;
    pub const AH_PORT_NUM: usize = 56 + 30;
    pub const PKEY_INDEX: usize = 120;
    pub const MAX_RD_ATOMIC: usize = 126;
    pub const MAX_DEST_RD_ATOMIC: usize = 127;
    pub const MIN_RNR_TIMER: usize = 128;
    pub const PORT_NUM: usize = 129;
    pub const TIMEOUT: usize = 130;
    pub const RETRY_CNT: usize = 131;
    pub const RNR_RETRY: usize = 132;
}

/// `struct ibv_port_attr` (52 bytes).
pub(crate) mod port_attr {
    pub const SIZE: usize = 52;
    pub const STATE: usize = 0;
    pub const ACTIVE_MTU: usize = 8;
    pub const LID: usize = 34;
    pub const LINK_LAYER: usize = 46;
}

pub(crate) const QPT_RC: u32 = 2;
pub(crate) const QPS_INIT: u32 = 1;
pub(crate) const QPS_RTR: u32 = 2;
pub(crate) const QPS_RTS: u32 = 3;
pub(crate) const QPS_ERR: u32 = 6;
pub(crate) const WR_RDMA_WRITE: u32 = 0;
pub(crate) const WR_RDMA_WRITE_WITH_IMM: u32 = 1;
pub(crate) const SEND_SIGNALED: u32 = 2;
pub(crate) const WC_RECV_RDMA_WITH_IMM: u32 = 129;
pub(crate) const ACCESS_LOCAL_WRITE: c_int = 1;
pub(crate) const ACCESS_REMOTE_WRITE: c_int = 2;
pub(crate) const PORT_ACTIVE: u32 = 4;
pub(crate) const LINK_LAYER_ETHERNET: u8 = 2;

/// `ibv_modify_qp` attribute masks.
pub(crate) mod mask {
    pub const STATE: i32 = 1;
    pub const ACCESS_FLAGS: i32 = 8;
    pub const PKEY_INDEX: i32 = 16;
    pub const PORT: i32 = 32;
    pub const AV: i32 = 128;
    pub const PATH_MTU: i32 = 256;
    pub const TIMEOUT: i32 = 512;
    pub const RETRY_CNT: i32 = 1024;
    pub const RNR_RETRY: i32 = 2048;
    pub const RQ_PSN: i32 = 4096;
    pub const MAX_QP_RD_ATOMIC: i32 = 8192;
    pub const MIN_RNR_TIMER: i32 = 32768;
    pub const SQ_PSN: i32 = 65536;
    pub const MAX_DEST_RD_ATOMIC: i32 = 131_072;
    pub const DEST_QPN: i32 = 1_048_576;
}

/// A structure as bytes, aligned for any of its fields.
#[repr(C, align(8))]
pub(crate) struct Raw<const N: usize>(pub [u8; N]);

impl<const N: usize> Raw<N> {
    pub(crate) fn zeroed() -> Self {
        Raw([0; N])
    }
    pub(crate) fn put_u8(&mut self, off: usize, v: u8) {
        self.0[off] = v;
    }
    pub(crate) fn put_u16(&mut self, off: usize, v: u16) {
        self.0[off..off + 2].copy_from_slice(&v.to_ne_bytes());
    }
    pub(crate) fn put_u32(&mut self, off: usize, v: u32) {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
    }
    pub(crate) fn put_u64(&mut self, off: usize, v: u64) {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
    }
    pub(crate) fn u8_at(&self, off: usize) -> u8 {
        self.0[off]
    }
    pub(crate) fn u16_at(&self, off: usize) -> u16 {
        u16::from_ne_bytes([self.0[off], self.0[off + 1]])
    }
    pub(crate) fn u32_at(&self, off: usize) -> u32 {
        let mut w = [0u8; 4];
        w.copy_from_slice(&self.0[off..off + 4]);
        u32::from_ne_bytes(w)
    }
    pub(crate) fn u64_at(&self, off: usize) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&self.0[off..off + 8]);
        u64::from_ne_bytes(w)
    }
    pub(crate) fn ptr(&mut self) -> *mut c_void {
        self.0.as_mut_ptr() as *mut c_void
    }
}

type P = *mut c_void;

/// The exported functions of libibverbs the provider calls.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lib {
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut P,
    pub free_device_list: unsafe extern "C" fn(*mut P),
    pub get_device_name: unsafe extern "C" fn(P) -> *const c_char,
    pub open_device: unsafe extern "C" fn(P) -> P,
    pub close_device: unsafe extern "C" fn(P) -> c_int,
    pub query_port: unsafe extern "C" fn(P, u8, P) -> c_int,
    pub query_gid: unsafe extern "C" fn(P, u8, c_int, P) -> c_int,
    pub alloc_pd: unsafe extern "C" fn(P) -> P,
    pub dealloc_pd: unsafe extern "C" fn(P) -> c_int,
    pub reg_mr: unsafe extern "C" fn(P, P, usize, c_int) -> P,
    pub dereg_mr: unsafe extern "C" fn(P) -> c_int,
    pub create_cq: unsafe extern "C" fn(P, c_int, P, P, c_int) -> P,
    pub destroy_cq: unsafe extern "C" fn(P) -> c_int,
    pub create_qp: unsafe extern "C" fn(P, P) -> P,
    pub destroy_qp: unsafe extern "C" fn(P) -> c_int,
    pub modify_qp: unsafe extern "C" fn(P, P, c_int) -> c_int,
}

/// The operations verbs.h calls through `context->ops`.
pub(crate) type PollCq = unsafe extern "C" fn(P, c_int, P) -> c_int;
pub(crate) type PostSend = unsafe extern "C" fn(P, P, *mut P) -> c_int;
pub(crate) type PostRecv = unsafe extern "C" fn(P, P, *mut P) -> c_int;

/// Loads libibverbs.so.1 and resolves [`Lib`]; the error says what is missing.
pub(crate) fn load() -> Result<Lib, String> {
    // SAFETY: dlopen with a constant NUL-terminated name; the handle is kept for the life of
    // the process (libibverbs and its providers expect to stay loaded).
    let lib = unsafe {
        libc::dlopen(
            c"libibverbs.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        )
    };
    if lib.is_null() {
        // SAFETY: dlerror returns a thread-local message or NULL.
        let err = unsafe { libc::dlerror() };
        return Err(if err.is_null() {
            "dlopen failed".to_string()
        } else {
            // SAFETY: a non-NULL dlerror result is a NUL-terminated string.
            unsafe { CStr::from_ptr(err) }
                .to_string_lossy()
                .into_owned()
        });
    }
    let sym = |name: &CStr| -> Result<P, String> {
        // SAFETY: `lib` is a live handle and `name` is NUL-terminated.
        let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
        if p.is_null() {
            Err(format!("libibverbs.so.1 has no {}", name.to_string_lossy()))
        } else {
            Ok(p)
        }
    };
    macro_rules! f {
        ($name:literal, $t:ty) => {
            // SAFETY: the symbol is libibverbs' exported function of that name, whose C
            // signature (verbs.h) is `$t`.
            unsafe { std::mem::transmute::<P, $t>(sym($name)?) }
        };
    }
    Ok(Lib {
        get_device_list: f!(
            c"ibv_get_device_list",
            unsafe extern "C" fn(*mut c_int) -> *mut P
        ),
        free_device_list: f!(c"ibv_free_device_list", unsafe extern "C" fn(*mut P)),
        get_device_name: f!(
            c"ibv_get_device_name",
            unsafe extern "C" fn(P) -> *const c_char
        ),
        open_device: f!(c"ibv_open_device", unsafe extern "C" fn(P) -> P),
        close_device: f!(c"ibv_close_device", unsafe extern "C" fn(P) -> c_int),
        query_port: f!(c"ibv_query_port", unsafe extern "C" fn(P, u8, P) -> c_int),
        query_gid: f!(
            c"ibv_query_gid",
            unsafe extern "C" fn(P, u8, c_int, P) -> c_int
        ),
        alloc_pd: f!(c"ibv_alloc_pd", unsafe extern "C" fn(P) -> P),
        dealloc_pd: f!(c"ibv_dealloc_pd", unsafe extern "C" fn(P) -> c_int),
        reg_mr: f!(c"ibv_reg_mr", unsafe extern "C" fn(P, P, usize, c_int) -> P),
        dereg_mr: f!(c"ibv_dereg_mr", unsafe extern "C" fn(P) -> c_int),
        create_cq: f!(
            c"ibv_create_cq",
            unsafe extern "C" fn(P, c_int, P, P, c_int) -> P
        ),
        destroy_cq: f!(c"ibv_destroy_cq", unsafe extern "C" fn(P) -> c_int),
        create_qp: f!(c"ibv_create_qp", unsafe extern "C" fn(P, P) -> P),
        destroy_qp: f!(c"ibv_destroy_qp", unsafe extern "C" fn(P) -> c_int),
        modify_qp: f!(c"ibv_modify_qp", unsafe extern "C" fn(P, P, c_int) -> c_int),
    })
}

/// The operation at `offset` of `context->ops`.
///
/// # Safety
///
/// `ctx` must be a live `struct ibv_context *` and `offset` one of the `CTX_OPS_*` offsets,
/// whose slot holds a function of type `F` (a function pointer type).
pub(crate) unsafe fn ctx_op<F: Copy>(ctx: P, offset: usize) -> Option<F> {
    // SAFETY: the caller's contract; the slot is a nullable function pointer, which has the
    // size and representation of `Option<F>`.
    unsafe { *((ctx as *const u8).add(offset) as *const Option<F>) }
}

/// The device names of a device list.
///
/// # Safety
///
/// `list` must come from `ibv_get_device_list` (with `n` entries) and not be freed yet.
pub(crate) unsafe fn names(lib: &Lib, list: *mut P, n: c_int) -> Vec<String> {
    (0..n.max(0) as usize)
        .filter_map(|i| {
            // SAFETY: the caller's contract: `i < n` entries of a live list.
            let d = unsafe { *list.add(i) };
            // SAFETY: `d` is a device of the list; the name lives as long as the list.
            let p = unsafe { (lib.get_device_name)(d) };
            // SAFETY: a non-NULL name is NUL-terminated.
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        })
        .collect()
}
