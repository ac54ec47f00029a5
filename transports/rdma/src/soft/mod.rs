//! The software verbs provider: **test tooling**, never chosen automatically
//! (`FERRO_IB_PROVIDER=soft` selects it). It runs the RDMA protocol between threads of one
//! process and between processes of one host, keeping what reliable-connected verbs promise:
//!
//! - work requests on a queue pair take effect in order (each WRITE is carried out when it is
//!   posted; its immediate is queued at the peer after its bytes have landed);
//! - the local key and the peer's remote key and bounds are checked before a byte moves: a bad
//!   rkey completes with a remote access error (and fails both queue pairs), never a write;
//! - a peer process that is gone or a peer queue pair that is destroyed or failed completes the
//!   work request with "transport retry count exceeded";
//! - a queue pair in the error state completes every later work request, and every receive it
//!   holds, as flushed;
//! - a completion queue that overflows is an error, and fails its queue pairs;
//! - faults can be injected ([`Faults`], `FERRO_IB_SOFT_FAULTS`): drop a completion, fail a
//!   registration, corrupt an rkey, end the process at a chosen work request.
//!
//! Bytes move with a plain copy inside a process and with `process_vm_writev` across processes
//! (which needs ptrace permission over the peer: same user with `kernel.yama.ptrace_scope` 0,
//! or root). Each process has one segment in `/dev/shm` with its memory-region table, its
//! queue pairs' inbound immediates and a futex doorbell that writers ring.

mod seg;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use ferroccl_transport::Doorbell;

use crate::verbs::{
    MemoryRegion, PortAddr, QpAttrs, QpEndpoint, VResult, Verbs, VerbsError, Wc, WcOpcode,
    WcStatus, WriteWr,
};
use seg::{CopyError, Segment, IN_DEPTH, MR_SLOTS, QP_SLOTS};

/// Queue-pair states, as stored in the segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
enum QpState {
    Free = 0,
    Init = 1,
    Rts = 3,
    Error = 4,
}

impl QpState {
    fn load(w: &AtomicU32) -> QpState {
        match w.load(Ordering::Acquire) {
            1 => QpState::Init,
            3 => QpState::Rts,
            4 => QpState::Error,
            _ => QpState::Free,
        }
    }
}

/// Faults to inject, each at the `n`-th event of its kind in the device (counting from 1;
/// 0: never). `FERRO_IB_SOFT_FAULTS=drop_completion=3,fail_reg=2,corrupt_rkey=5,exit_at=40`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// The n-th signalled send completion is lost (the sender waits for it until its
    /// deadline).
    pub drop_completion: u64,
    /// The n-th memory registration fails.
    pub fail_reg: u64,
    /// The n-th RDMA WRITE carries a corrupted rkey (a remote access error).
    pub corrupt_rkey: u64,
    /// The process ends (exit status 137, as if killed) at its n-th posted WRITE: its peers
    /// see a dead peer.
    pub exit_at: u64,
}

impl Faults {
    /// Parses `FERRO_IB_SOFT_FAULTS` syntax: `name=n` items separated by commas.
    pub fn parse(s: &str) -> Result<Faults, String> {
        let mut f = Faults::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| format!("FERRO_IB_SOFT_FAULTS: '{item}' is not name=n"))?;
            let n: u64 = v
                .trim()
                .parse()
                .map_err(|_| format!("FERRO_IB_SOFT_FAULTS: '{v}' in '{item}' is not a count"))?;
            match k.trim() {
                "drop_completion" => f.drop_completion = n,
                "fail_reg" => f.fail_reg = n,
                "corrupt_rkey" => f.corrupt_rkey = n,
                "exit_at" => f.exit_at = n,
                other => {
                    return Err(format!(
                        "FERRO_IB_SOFT_FAULTS: unknown fault '{other}' (expected \
                         drop_completion, fail_reg, corrupt_rkey or exit_at)"
                    ))
                }
            }
        }
        Ok(f)
    }
}

/// Counters of the events faults are injected at.
#[derive(Debug, Default)]
struct Counters {
    completions: AtomicU64,
    regs: AtomicU64,
    writes: AtomicU64,
}

#[derive(Debug)]
struct Alloc {
    free: Vec<usize>,
    generation: u32,
}

impl Alloc {
    fn new(n: usize) -> Alloc {
        Alloc {
            free: (0..n).rev().collect(),
            generation: 0,
        }
    }
}

/// What the device's regions, queue pairs and completion queues share.
#[derive(Debug)]
struct Inner {
    seg: Arc<Segment>,
    nonce: u64,
    mrs: Mutex<Alloc>,
    qps: Mutex<Alloc>,
    /// Peers' segments, by (pid, nonce).
    peers: Mutex<HashMap<(u32, u64), Arc<Segment>>>,
    faults: Mutex<Faults>,
    counters: Counters,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Segments made in this process (one per device).
static NONCE: AtomicU64 = AtomicU64::new(1);
/// The device the transport shares within the process.
static SHARED: Mutex<Weak<SoftDevice>> = Mutex::new(Weak::new());

/// The software device (one port, `soft0` port 1).
#[derive(Debug)]
pub struct SoftDevice {
    inner: Arc<Inner>,
}

impl SoftDevice {
    /// A device of its own, with a segment of its own (tests that inject faults).
    pub fn new() -> VResult<SoftDevice> {
        let nonce = NONCE.fetch_add(1, Ordering::Relaxed);
        let seg = Segment::create(nonce).map_err(|e| {
            VerbsError::new(
                "soft device open",
                format!("cannot create its shared-memory segment: {e}"),
            )
        })?;
        let faults = match std::env::var("FERRO_IB_SOFT_FAULTS") {
            Ok(s) => Faults::parse(&s).map_err(|e| VerbsError::new("soft device open", e))?,
            Err(_) => Faults::default(),
        };
        Ok(SoftDevice {
            inner: Arc::new(Inner {
                seg: Arc::new(seg),
                nonce,
                mrs: Mutex::new(Alloc::new(MR_SLOTS)),
                qps: Mutex::new(Alloc::new(QP_SLOTS)),
                peers: Mutex::new(HashMap::new()),
                faults: Mutex::new(faults),
                counters: Counters::default(),
            }),
        })
    }

    /// The device every transport of this process shares (created on first use, removed with
    /// the last user).
    pub fn shared() -> VResult<Arc<SoftDevice>> {
        let mut s = lock(&SHARED);
        if let Some(d) = s.upgrade() {
            return Ok(d);
        }
        let d = Arc::new(SoftDevice::new()?);
        *s = Arc::downgrade(&d);
        Ok(d)
    }

    /// Replaces the faults to inject (counters keep counting from where they are).
    pub fn set_faults(&self, f: Faults) {
        *lock(&self.inner.faults) = f;
    }

    fn faults(&self) -> Faults {
        *lock(&self.inner.faults)
    }
}

impl Inner {
    /// The segment of the port at `gid` (this process's own, or a peer's, mapped once).
    fn peer_seg(&self, gid: &[u8; 16]) -> VResult<(u32, Arc<Segment>)> {
        let (pid, nonce) = decode_gid(gid).ok_or_else(|| {
            VerbsError::new(
                "ibv_modify_qp",
                "the peer's GID is not a software-verbs port",
            )
        })?;
        if pid == std::process::id() && nonce == self.nonce {
            return Ok((pid, Arc::clone(&self.seg)));
        }
        let mut peers = lock(&self.peers);
        if let Some(s) = peers.get(&(pid, nonce)) {
            return Ok((pid, Arc::clone(s)));
        }
        let s = Arc::new(Segment::open(pid, nonce).map_err(|e| {
            VerbsError::new(
                "ibv_modify_qp",
                format!("cannot map process {pid}'s software-verbs segment: {e}"),
            )
        })?);
        peers.insert((pid, nonce), Arc::clone(&s));
        Ok((pid, s))
    }
}

/// The GID of process `pid`'s segment `nonce`: pid, nonce, "soft".
fn encode_gid(pid: u32, nonce: u64) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[..4].copy_from_slice(&pid.to_le_bytes());
    g[4..12].copy_from_slice(&nonce.to_le_bytes());
    g[12..].copy_from_slice(b"soft");
    g
}

fn decode_gid(g: &[u8; 16]) -> Option<(u32, u64)> {
    if &g[12..] != b"soft" {
        return None;
    }
    let pid = u32::from_le_bytes([g[0], g[1], g[2], g[3]]);
    let mut n = [0u8; 8];
    n.copy_from_slice(&g[4..12]);
    Some((pid, u64::from_le_bytes(n)))
}

/// A registered region of the software device.
#[derive(Debug)]
pub struct SoftMr {
    inner: Arc<Inner>,
    slot: usize,
    key: u32,
}

impl MemoryRegion for SoftMr {
    fn lkey(&self) -> u32 {
        self.key
    }
    fn rkey(&self) -> u32 {
        self.key
    }
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        let s = &self.inner.seg.layout().mrs[self.slot];
        s.rkey.store(0, Ordering::Release);
        lock(&self.inner.mrs).free.push(self.slot);
    }
}

/// Looks up `key` in `seg`'s region table: whether `addr..addr+len` lies inside it.
fn key_covers(seg: &Segment, key: u32, addr: u64, len: usize) -> bool {
    let idx = (key & 0xfff) as usize;
    let s = &seg.layout().mrs[idx];
    if key == 0 || s.rkey.load(Ordering::Acquire) != key {
        return false;
    }
    let (a, l) = (
        s.addr.load(Ordering::Relaxed),
        s.len.load(Ordering::Relaxed),
    );
    addr >= a && addr.checked_add(len as u64).is_some_and(|end| end <= a + l)
}

/// A receive queue and the inbound immediates of one queue pair, kept with its completion
/// queue so that polling can match them.
#[derive(Debug)]
struct RecvSide {
    slot: usize,
    qpn: u32,
    posted: VecDeque<u64>,
    /// Send work requests not yet reported by a polled completion.
    sq_used: usize,
}

#[derive(Debug)]
struct CqState {
    entries: VecDeque<Wc>,
    depth: usize,
    overflowed: bool,
    qps: Vec<RecvSide>,
}

/// A completion queue of the software device.
#[derive(Debug)]
pub struct SoftCq {
    state: Arc<Mutex<CqState>>,
}

/// A reliable-connected queue pair of the software device.
#[derive(Debug)]
pub struct SoftQp {
    inner: Arc<Inner>,
    cq: Arc<Mutex<CqState>>,
    slot: usize,
    qpn: u32,
    max_send: usize,
    /// The peer: its process, its segment, its queue pair number.
    remote: Option<(u32, Arc<Segment>, u32)>,
}

impl SoftQp {
    fn state_word(&self) -> &AtomicU32 {
        &self.inner.seg.layout().qps[self.slot].state
    }

    fn fail(&self) {
        self.state_word()
            .store(QpState::Error as u32, Ordering::Release);
    }
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        let s = &self.inner.seg.layout().qps[self.slot];
        s.qpn.store(0, Ordering::Release);
        s.state.store(QpState::Free as u32, Ordering::Release);
        lock(&self.cq).qps.retain(|q| q.qpn != self.qpn);
        lock(&self.inner.qps).free.push(self.slot);
    }
}

impl CqState {
    /// Queues a completion; past the depth the queue overflows and its queue pairs fail.
    fn push(&mut self, wc: Wc, seg: &Segment) {
        if self.entries.len() >= self.depth {
            self.overflowed = true;
            for q in &self.qps {
                seg.layout().qps[q.slot]
                    .state
                    .store(QpState::Error as u32, Ordering::Release);
            }
            return;
        }
        self.entries.push_back(wc);
    }
}

/// The software device's doorbell: the futex word in its segment that writers bump.
#[derive(Debug)]
pub struct SoftBell(Arc<Segment>);

impl Doorbell for SoftBell {
    fn seq(&self) -> u32 {
        self.0.layout().bell.load(Ordering::Acquire)
    }

    fn wait(&self, seen: u32, timeout: Duration) {
        let l = self.0.layout();
        l.waiters.fetch_add(1, Ordering::AcqRel);
        if l.bell.load(Ordering::Acquire) == seen {
            seg::futex_wait(&l.bell, seen, timeout);
        }
        l.waiters.fetch_sub(1, Ordering::AcqRel);
    }

    fn identity(&self) -> usize {
        &self.0.layout().bell as *const AtomicU32 as usize
    }
}

impl Verbs for SoftDevice {
    type Mr = SoftMr;
    type Cq = SoftCq;
    type Qp = SoftQp;

    fn device(&self) -> &str {
        "soft0"
    }

    fn port(&self) -> u8 {
        1
    }

    fn port_addr(&self) -> PortAddr {
        PortAddr {
            lid: 0,
            gid: encode_gid(std::process::id(), self.inner.nonce),
        }
    }

    fn reg_mr(&self, addr: usize, len: usize) -> VResult<SoftMr> {
        let n = self.inner.counters.regs.fetch_add(1, Ordering::Relaxed) + 1;
        if self.faults().fail_reg == n {
            return Err(VerbsError::new(
                "ibv_reg_mr",
                format!("cannot register {len} bytes at {addr:#x}: out of memory (injected fault)"),
            ));
        }
        let (slot, key) = {
            let mut a = lock(&self.inner.mrs);
            let slot = a.free.pop().ok_or_else(|| {
                VerbsError::new(
                    "ibv_reg_mr",
                    format!("all {MR_SLOTS} memory regions of soft0 are in use"),
                )
            })?;
            a.generation = a.generation % 0xf_ffff + 1;
            (slot, (a.generation << 12) | slot as u32)
        };
        let s = &self.inner.seg.layout().mrs[slot];
        s.addr.store(addr as u64, Ordering::Relaxed);
        s.len.store(len as u64, Ordering::Relaxed);
        s.rkey.store(key, Ordering::Release);
        Ok(SoftMr {
            inner: Arc::clone(&self.inner),
            slot,
            key,
        })
    }

    fn create_cq(&self, depth: usize) -> VResult<SoftCq> {
        Ok(SoftCq {
            state: Arc::new(Mutex::new(CqState {
                entries: VecDeque::with_capacity(depth),
                depth: depth.max(1),
                overflowed: false,
                qps: Vec::new(),
            })),
        })
    }

    fn create_qp(&self, cq: &SoftCq, attrs: &QpAttrs) -> VResult<SoftQp> {
        let (slot, qpn) = {
            let mut a = lock(&self.inner.qps);
            let slot = a.free.pop().ok_or_else(|| {
                VerbsError::new(
                    "ibv_create_qp",
                    format!("all {QP_SLOTS} queue pairs of soft0 are in use"),
                )
            })?;
            a.generation = a.generation % 0xff_ffff + 1;
            (slot, (a.generation << 8) | slot as u32)
        };
        let s = &self.inner.seg.layout().qps[slot];
        s.head.store(0, Ordering::Relaxed);
        s.tail.store(0, Ordering::Relaxed);
        s.state.store(QpState::Init as u32, Ordering::Relaxed);
        s.qpn.store(qpn, Ordering::Release);
        lock(&cq.state).qps.push(RecvSide {
            slot,
            qpn,
            posted: VecDeque::new(),
            sq_used: 0,
        });
        Ok(SoftQp {
            inner: Arc::clone(&self.inner),
            cq: Arc::clone(&cq.state),
            slot,
            qpn,
            max_send: attrs.max_send_wr.max(1) as usize,
            remote: None,
        })
    }

    fn qp_num(&self, qp: &SoftQp) -> u32 {
        qp.qpn
    }

    fn connect_qp(
        &self,
        qp: &mut SoftQp,
        remote: &QpEndpoint,
        _psn: u32,
        _attrs: &QpAttrs,
    ) -> VResult<()> {
        if QpState::load(qp.state_word()) != QpState::Init {
            return Err(VerbsError::new(
                "ibv_modify_qp",
                format!("queue pair {:#x} is not in the INIT state", qp.qpn),
            ));
        }
        let (pid, seg) = self.inner.peer_seg(&remote.port.gid)?;
        qp.remote = Some((pid, seg, remote.qpn));
        qp.state_word()
            .store(QpState::Rts as u32, Ordering::Release);
        Ok(())
    }

    fn post_write(&self, qp: &mut SoftQp, wr: &WriteWr) -> VResult<()> {
        let faults = self.faults();
        let nth = self.inner.counters.writes.fetch_add(1, Ordering::Relaxed) + 1;
        if faults.exit_at == nth {
            crate::log(format_args!(
                "soft0: injected fault: process {} ends at its write #{nth}",
                std::process::id()
            ));
            // SAFETY: _exit ends the process at once, as a crash would; nothing of this
            // process runs afterwards.
            unsafe { libc::_exit(137) };
        }
        let mut cq = lock(&qp.cq);
        let side =
            cq.qps.iter_mut().find(|q| q.qpn == qp.qpn).ok_or_else(|| {
                VerbsError::new("ibv_post_send", "queue pair without its CQ entry")
            })?;
        if side.sq_used >= qp.max_send {
            return Err(VerbsError::new(
                "ibv_post_send",
                format!(
                    "send queue of queue pair {:#x} is full ({} work requests outstanding)",
                    qp.qpn, qp.max_send
                ),
            ));
        }
        let state = QpState::load(qp.state_word());
        let status = match state {
            QpState::Error => WcStatus::Flushed,
            QpState::Rts => self.execute(qp, wr, faults, nth),
            _ => {
                return Err(VerbsError::new(
                    "ibv_post_send",
                    format!("queue pair {:#x} is not ready to send", qp.qpn),
                ))
            }
        };
        if status != WcStatus::Success {
            qp.fail();
        }
        if !(wr.signaled || status != WcStatus::Success) {
            return Ok(());
        }
        let side = cq.qps.iter_mut().find(|q| q.qpn == qp.qpn);
        if let Some(s) = side {
            s.sq_used += 1;
        }
        let c = self
            .inner
            .counters
            .completions
            .fetch_add(1, Ordering::Relaxed)
            + 1;
        if faults.drop_completion == c {
            crate::log(format_args!(
                "soft0: injected fault: completion #{c} (work request {:#x}) is dropped",
                wr.wr_id
            ));
            return Ok(());
        }
        let wc = Wc {
            wr_id: wr.wr_id,
            status,
            opcode: WcOpcode::Write,
            byte_len: wr.len as u32,
            imm: 0,
            qpn: qp.qpn,
        };
        cq.push(wc, &self.inner.seg);
        drop(cq);
        if status != WcStatus::Success {
            self.inner.seg.ring();
        }
        Ok(())
    }

    fn post_recv(&self, qp: &mut SoftQp, wr_id: u64) -> VResult<()> {
        let mut cq = lock(&qp.cq);
        let side =
            cq.qps.iter_mut().find(|q| q.qpn == qp.qpn).ok_or_else(|| {
                VerbsError::new("ibv_post_recv", "queue pair without its CQ entry")
            })?;
        side.posted.push_back(wr_id);
        Ok(())
    }

    fn poll_cq(&self, cq: &mut SoftCq, max: usize, out: &mut Vec<Wc>) -> VResult<usize> {
        let mut st = lock(&cq.state);
        if st.overflowed {
            return Err(VerbsError::new(
                "ibv_poll_cq",
                format!(
                    "the completion queue overflowed (more than {} completions outstanding); \
                     its queue pairs are in the error state",
                    st.depth
                ),
            ));
        }
        let mut n = 0;
        while n < max {
            let Some(wc) = st.entries.pop_front() else {
                break;
            };
            if let Some(s) = st.qps.iter_mut().find(|q| q.qpn == wc.qpn) {
                s.sq_used = s.sq_used.saturating_sub(1);
            }
            out.push(wc);
            n += 1;
        }
        let layout = self.inner.seg.layout();
        for side in st.qps.iter_mut() {
            let slot = &layout.qps[side.slot];
            let failed = QpState::load(&slot.state) == QpState::Error;
            // Immediates that landed before the queue pair failed complete first; the
            // receives left over are flushed.
            while n < max {
                let tail = slot.tail.load(Ordering::Relaxed);
                let ready = slot.head.load(Ordering::Acquire) > tail;
                if !(failed || ready) {
                    break;
                }
                let Some(wr_id) = side.posted.pop_front() else {
                    break;
                };
                let wc = if !ready {
                    Wc {
                        wr_id,
                        status: WcStatus::Flushed,
                        opcode: WcOpcode::RecvImm,
                        byte_len: 0,
                        imm: 0,
                        qpn: side.qpn,
                    }
                } else {
                    let e = &slot.ring[tail as usize % IN_DEPTH];
                    let wc = Wc {
                        wr_id,
                        status: WcStatus::Success,
                        opcode: WcOpcode::RecvImm,
                        byte_len: e.len.load(Ordering::Relaxed),
                        imm: e.imm.load(Ordering::Relaxed),
                        qpn: side.qpn,
                    };
                    slot.tail.store(tail + 1, Ordering::Release);
                    wc
                };
                out.push(wc);
                n += 1;
            }
        }
        Ok(n)
    }

    fn set_error(&self, qp: &mut SoftQp) {
        qp.fail();
        self.inner.seg.ring();
    }

    fn doorbell(&self) -> Option<Arc<dyn Doorbell>> {
        Some(Arc::new(SoftBell(Arc::clone(&self.inner.seg))))
    }
}

impl SoftDevice {
    /// Carries out one WRITE on a queue pair in RTS; the completion status.
    fn execute(&self, qp: &SoftQp, wr: &WriteWr, faults: Faults, nth: u64) -> WcStatus {
        let Some((pid, rseg, rqpn)) = qp.remote.as_ref() else {
            return WcStatus::LocalQpOp;
        };
        if wr.len > 0 && !key_covers(&self.inner.seg, wr.lkey, wr.local_addr as u64, wr.len) {
            return WcStatus::LocalProtection;
        }
        let rslot = (rqpn & 0xff) as usize;
        let rq = &rseg.layout().qps[rslot % QP_SLOTS];
        let peer_ok = (*pid == std::process::id() || seg::pid_alive(*pid))
            && rq.qpn.load(Ordering::Acquire) == *rqpn
            && matches!(QpState::load(&rq.state), QpState::Init | QpState::Rts);
        if !peer_ok {
            return WcStatus::RetryExceeded;
        }
        let mut rkey = wr.rkey;
        if faults.corrupt_rkey == nth {
            rkey ^= 0x00ab_c000;
            crate::log(format_args!(
                "soft0: injected fault: write #{nth} carries rkey {rkey:#x} instead of {:#x}",
                wr.rkey
            ));
        }
        if wr.len > 0 && !key_covers(rseg, rkey, wr.remote_addr, wr.len) {
            // The responder fails too, as a real one does on a remote access error.
            rq.state.store(QpState::Error as u32, Ordering::Release);
            rseg.ring();
            return WcStatus::RemoteAccess;
        }
        // SAFETY: the source lies in a region this process registered (checked above against
        // the lkey); the destination lies in a region the peer registered and advertised
        // (checked above against its rkey). Registration is the promise that both stay
        // allocated until deregistered, which the protocol does only after its last use.
        match unsafe { seg::copy_to(*pid, wr.remote_addr, wr.local_addr, wr.len) } {
            Ok(()) => {}
            Err(CopyError::Gone) => return WcStatus::RetryExceeded,
            Err(CopyError::Fault) => return WcStatus::RemoteAccess,
            Err(CopyError::Denied) => {
                crate::log(format_args!(
                    "soft0: process_vm_writev into process {pid} was refused: cross-process \
                     writes need ptrace permission (root, or kernel.yama.ptrace_scope=0)"
                ));
                return WcStatus::RemoteAccess;
            }
        }
        if let Some(imm) = wr.imm {
            let head = rq.head.load(Ordering::Relaxed);
            if head - rq.tail.load(Ordering::Acquire) >= IN_DEPTH as u64 {
                return WcStatus::RnrRetryExceeded;
            }
            let e = &rq.ring[head as usize % IN_DEPTH];
            e.imm.store(imm, Ordering::Relaxed);
            e.len.store(wr.len as u32, Ordering::Relaxed);
            rq.head.store(head + 1, Ordering::Release);
        }
        if wr.imm.is_some() || wr.len > 0 {
            rseg.ring();
        }
        WcStatus::Success
    }
}

#[cfg(test)]
mod tests;
