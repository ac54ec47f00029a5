//! The verbs interface the protocol runs on: the few calls of libibverbs that NCCL's IB
//! transport uses (memory regions, completion queues, reliable-connected queue pairs, RDMA
//! WRITE and WRITE_WITH_IMM, receives for immediates, polling), behind a trait with two
//! providers: the software one of [`crate::soft`] (test tooling) and the real one of
//! [`crate::real`] (libibverbs, loaded at run time).

use std::fmt;
use std::sync::Arc;

use ferroccl_transport::Doorbell;

/// Where a port is on the fabric: what the peer's queue pair is told at RTR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PortAddr {
    /// InfiniBand local identifier (0 on RoCE and in the software provider).
    pub lid: u16,
    /// Global identifier (RoCE v2: derived from the interface's address; the software
    /// provider puts its process id and segment number here).
    pub gid: [u8; 16],
}

/// One end of a reliable connection, as the other end needs it at RTR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpEndpoint {
    /// The port the queue pair lives on.
    pub port: PortAddr,
    /// Queue pair number.
    pub qpn: u32,
    /// Initial packet sequence number.
    pub psn: u32,
    /// Path MTU in bytes (256..4096).
    pub mtu: u32,
}

/// What a queue pair is created and connected with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttrs {
    /// Send queue depth (work requests outstanding at once).
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// GID index (RoCE v2; `FERRO_IB_GID_INDEX`).
    pub gid_index: u8,
    /// Traffic class (`FERRO_IB_TC`).
    pub traffic_class: u8,
    /// Service level (`FERRO_IB_SL`).
    pub service_level: u8,
    /// ACK timeout exponent (4.096 µs × 2^timeout; NCCL's default 20 is about 4 s).
    pub timeout: u8,
    /// Transport retries before a work request fails with
    /// [`WcStatus::RetryExceeded`].
    pub retry_cnt: u8,
}

/// An RDMA WRITE, with or without an immediate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Source address (inside a region registered with `lkey`).
    pub local_addr: usize,
    /// Bytes.
    pub len: usize,
    /// The source region's local key.
    pub lkey: u32,
    /// Destination in the peer.
    pub remote_addr: u64,
    /// The destination region's remote key.
    pub rkey: u32,
    /// `Some`: WRITE_WITH_IMM, which consumes a receive at the peer and completes there with
    /// this value.
    pub imm: Option<u32>,
    /// Whether a completion is generated on this side.
    pub signaled: bool,
}

/// What a completion reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcOpcode {
    /// One of this side's RDMA WRITEs.
    Write,
    /// A peer's WRITE_WITH_IMM consumed one of this side's receives.
    RecvImm,
}

/// A work completion's status, with libibverbs' numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WcStatus {
    /// It worked.
    Success,
    /// A work request's length exceeds what the queue allows.
    LocalLength,
    /// A local queue pair operation error.
    LocalQpOp,
    /// The local key or bounds were refused.
    LocalProtection,
    /// The queue pair was in the error state: outstanding work requests are flushed.
    Flushed,
    /// The peer refused the remote key or bounds.
    RemoteAccess,
    /// The peer could not carry out the operation.
    RemoteOperation,
    /// No acknowledgement after every retry: the peer or the link is down.
    RetryExceeded,
    /// The peer had no receive posted after every retry.
    RnrRetryExceeded,
    /// Anything else (the number libibverbs reported).
    Other(u32),
}

impl WcStatus {
    /// The status in words, with what it usually means.
    pub fn words(self) -> String {
        match self {
            WcStatus::Success => "success".into(),
            WcStatus::LocalLength => {
                "local length error — a work request exceeds its queue's limits".into()
            }
            WcStatus::LocalQpOp => "local queue pair operation error".into(),
            WcStatus::LocalProtection => {
                "local protection error — the source is not inside a registered region".into()
            }
            WcStatus::Flushed => "work request flushed — the queue pair had already failed".into(),
            WcStatus::RemoteAccess => {
                "remote access error — the peer refused the memory key or the bounds".into()
            }
            WcStatus::RemoteOperation => "remote operation error".into(),
            WcStatus::RetryExceeded => {
                "transport retry count exceeded — the peer or the link is down".into()
            }
            WcStatus::RnrRetryExceeded => {
                "receiver-not-ready retry count exceeded — the peer posted no receive".into()
            }
            WcStatus::Other(n) => format!("verbs completion status {n}"),
        }
    }

    /// The status of libibverbs' `enum ibv_wc_status` value `n`.
    pub fn from_ibv(n: u32) -> WcStatus {
        match n {
            0 => WcStatus::Success,
            1 => WcStatus::LocalLength,
            2 => WcStatus::LocalQpOp,
            4 => WcStatus::LocalProtection,
            5 => WcStatus::Flushed,
            10 => WcStatus::RemoteAccess,
            11 => WcStatus::RemoteOperation,
            12 => WcStatus::RetryExceeded,
            13 => WcStatus::RnrRetryExceeded,
            n => WcStatus::Other(n),
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.words())
    }
}

/// A work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wc {
    /// The work request's id (for receives: the id it was posted with).
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// Which kind of work completed.
    pub opcode: WcOpcode,
    /// Bytes the peer wrote (receives).
    pub byte_len: u32,
    /// The immediate (receives).
    pub imm: u32,
    /// The queue pair it belongs to.
    pub qpn: u32,
}

/// A verbs call that failed outright (not a completion with an error status).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerbsError {
    /// The call (`ibv_reg_mr`, `ibv_post_send`, ...).
    pub call: &'static str,
    /// Why, in words.
    pub why: String,
}

impl VerbsError {
    /// `call` failed because `why`.
    pub fn new(call: &'static str, why: impl Into<String>) -> VerbsError {
        VerbsError {
            call,
            why: why.into(),
        }
    }
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {}", self.call, self.why)
    }
}

/// Result of a verbs call.
pub type VResult<T> = std::result::Result<T, VerbsError>;

/// A registered memory region's keys.
pub trait MemoryRegion: Send + Sync + fmt::Debug {
    /// The key local work requests name it by.
    fn lkey(&self) -> u32;
    /// The key a peer names it by.
    fn rkey(&self) -> u32;
}

/// One opened device port and its protection domain: what the protocol needs from verbs.
/// Queue pairs and completion queues are created on it; every call but [`Verbs::poll_cq`]
/// and the posts is a setup-time call.
pub trait Verbs: Send + Sync + fmt::Debug + Sized + 'static {
    /// A registered region; deregistered when dropped.
    type Mr: MemoryRegion + 'static;
    /// A completion queue; destroyed when dropped.
    type Cq: Send + fmt::Debug;
    /// A reliable-connected queue pair; destroyed when dropped.
    type Qp: Send + fmt::Debug;

    /// The device's name (`mlx5_0`; `soft0` for the software provider).
    fn device(&self) -> &str;
    /// The port number (from 1).
    fn port(&self) -> u8;
    /// The port's fabric address.
    fn port_addr(&self) -> PortAddr;

    /// Registers `len` bytes at `addr` of this process for local reads and remote writes.
    fn reg_mr(&self, addr: usize, len: usize) -> VResult<Self::Mr>;

    /// A completion queue of `depth` entries.
    fn create_cq(&self, depth: usize) -> VResult<Self::Cq>;

    /// A reliable-connected queue pair completing on `cq`, in the INIT state.
    fn create_qp(&self, cq: &Self::Cq, attrs: &QpAttrs) -> VResult<Self::Qp>;

    /// The queue pair's number.
    fn qp_num(&self, qp: &Self::Qp) -> u32;

    /// Moves `qp` to RTR then RTS towards `remote`, starting its own sends at `psn`.
    fn connect_qp(
        &self,
        qp: &mut Self::Qp,
        remote: &QpEndpoint,
        psn: u32,
        attrs: &QpAttrs,
    ) -> VResult<()>;

    /// Posts an RDMA WRITE (with immediate where `wr.imm` is set).
    fn post_write(&self, qp: &mut Self::Qp, wr: &WriteWr) -> VResult<()>;

    /// Posts a receive for a peer's WRITE_WITH_IMM (no scatter list: immediates only).
    fn post_recv(&self, qp: &mut Self::Qp, wr_id: u64) -> VResult<()>;

    /// Moves completions from `cq` to `out` (at most `max`); returns how many.
    fn poll_cq(&self, cq: &mut Self::Cq, max: usize, out: &mut Vec<Wc>) -> VResult<usize>;

    /// Moves `qp` to the error state (its outstanding work requests are flushed).
    fn set_error(&self, qp: &mut Self::Qp);

    /// What a rank waiting on this device's completions sleeps on, where the provider has one.
    fn doorbell(&self) -> Option<Arc<dyn Doorbell>>;
}
