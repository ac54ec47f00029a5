//! The real verbs provider: libibverbs loaded at run time (`dlopen`), so that building needs
//! no rdma-core. `ibv_post_send`, `ibv_post_recv` and `ibv_poll_cq` are inline functions of
//! verbs.h that call through the context's operation table; [`ffi`] reproduces those calls
//! and the structure layouts.
//!
//! **Not yet run on hardware**: no machine of this project has an HCA. The layouts are
//! checked against rdma-core's header; `scripts/rdma-check.sh` is the check for the first
//! machine that has one.

mod ffi;

use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::time::Duration;

use ferroccl_transport::Doorbell;

use crate::hca::HcaFilter;
use crate::verbs::{
    MemoryRegion, PortAddr, QpAttrs, QpEndpoint, VResult, Verbs, VerbsError, Wc, WcOpcode,
    WcStatus, WriteWr,
};
use ffi::{mask, qp_attr, qp_init, send_wr, Lib, Raw};

/// What a probe of libibverbs found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// The library is not installed (or not on the loader's path).
    NoLibrary(String),
    /// The library loaded; these devices exist (maybe none).
    Devices(Vec<String>),
}

impl Probe {
    /// Why the real provider is not offered, in one line (for a probe without devices).
    pub fn why_not(&self) -> String {
        match self {
            Probe::NoLibrary(e) => {
                format!("no libibverbs.so.1 ({e}; install rdma-core, or check LD_LIBRARY_PATH)")
            }
            Probe::Devices(d) if d.is_empty() => {
                "libibverbs found no RDMA device on this host".to_string()
            }
            Probe::Devices(d) => format!("libibverbs found {}", d.join(", ")),
        }
    }
}

/// Loads libibverbs and lists its devices.
pub fn probe() -> Probe {
    let lib = match ffi::load() {
        Ok(l) => l,
        Err(e) => return Probe::NoLibrary(e),
    };
    let mut n: c_int = 0;
    // SAFETY: ibv_get_device_list writes the count and returns a list freed below.
    let list = unsafe { (lib.get_device_list)(&mut n) };
    if list.is_null() {
        return Probe::Devices(Vec::new());
    }
    // SAFETY: `list` is live with `n` entries until freed right after.
    let names = unsafe { ffi::names(&lib, list, n) };
    // SAFETY: freed once.
    unsafe { (lib.free_device_list)(list) };
    Probe::Devices(names)
}

fn errno_words(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// An opened device port with its protection domain.
#[derive(Debug)]
pub struct RealDevice {
    lib: Lib,
    ctx: *mut c_void,
    pd: *mut c_void,
    name: String,
    port: u8,
    addr: PortAddr,
    /// `enum ibv_mtu` of the port (1: 256 .. 5: 4096).
    mtu: u32,
    ethernet: bool,
    gid_index: u8,
}

// SAFETY: libibverbs contexts, protection domains, regions, CQs and QPs may be used from any
// thread (its documented thread safety); each CQ and QP is driven by one connection at a time
// (`&mut` in the Verbs calls).
unsafe impl Send for RealDevice {}
// SAFETY: as above; the shared calls (registration, creation) are thread-safe in libibverbs.
unsafe impl Sync for RealDevice {}

impl RealDevice {
    /// Opens the first active port that `hca` accepts, with GID `gid_index`; the error says
    /// in one line what is missing.
    pub fn open(hca: &HcaFilter, gid_index: u8) -> Result<RealDevice, String> {
        let lib = ffi::load().map_err(|e| Probe::NoLibrary(e).why_not())?;
        let mut n: c_int = 0;
        // SAFETY: ibv_get_device_list writes the count; the list is freed below.
        let list = unsafe { (lib.get_device_list)(&mut n) };
        if list.is_null() || n == 0 {
            return Err(Probe::Devices(Vec::new()).why_not());
        }
        // SAFETY: live list of `n` entries.
        let names = unsafe { ffi::names(&lib, list, n) };
        let mut seen = Vec::new();
        let mut found = None;
        'dev: for (i, name) in names.iter().enumerate() {
            // SAFETY: entry `i < n` of the live list.
            let dev = unsafe { *list.add(i) };
            // SAFETY: opening a listed device; closed below unless kept.
            let ctx = unsafe { (lib.open_device)(dev) };
            if ctx.is_null() {
                seen.push(format!("{name}: cannot open"));
                continue;
            }
            for port in 1u8..=4 {
                let mut pa = Raw::<{ ffi::port_attr::SIZE }>::zeroed();
                // SAFETY: a live context and a zeroed ibv_port_attr-sized buffer.
                if unsafe { (lib.query_port)(ctx, port, pa.ptr()) } != 0 {
                    break;
                }
                let state = pa.u32_at(ffi::port_attr::STATE);
                if state != ffi::PORT_ACTIVE || !hca.accepts(name, port) {
                    seen.push(format!("{name} port {port}: state {state}"));
                    continue;
                }
                found = Some((name.clone(), ctx, port, pa));
                break 'dev;
            }
            // SAFETY: opened above, not kept.
            unsafe { (lib.close_device)(ctx) };
        }
        // SAFETY: freed once; the names were copied.
        unsafe { (lib.free_device_list)(list) };
        let Some((name, ctx, port, pa)) = found else {
            return Err(format!(
                "libibverbs found no active port that FERRO_IB_HCA accepts ({})",
                seen.join(", ")
            ));
        };
        let ethernet = pa.u8_at(ffi::port_attr::LINK_LAYER) == ffi::LINK_LAYER_ETHERNET;
        let mut gid = [0u8; 16];
        // SAFETY: a live context and a 16-byte buffer for `union ibv_gid`.
        let rc = unsafe {
            (lib.query_gid)(
                ctx,
                port,
                c_int::from(gid_index),
                gid.as_mut_ptr() as *mut c_void,
            )
        };
        if rc != 0 && ethernet {
            // SAFETY: opened above, not kept.
            unsafe { (lib.close_device)(ctx) };
            return Err(format!(
                "{name} port {port}: no GID at FERRO_IB_GID_INDEX={gid_index}"
            ));
        }
        // SAFETY: a live context.
        let pd = unsafe { (lib.alloc_pd)(ctx) };
        if pd.is_null() {
            let e = errno_words("ibv_alloc_pd");
            // SAFETY: opened above, not kept.
            unsafe { (lib.close_device)(ctx) };
            return Err(format!("{name} port {port}: {e}"));
        }
        Ok(RealDevice {
            lib,
            ctx,
            pd,
            name,
            port,
            addr: PortAddr {
                lid: pa.u16_at(ffi::port_attr::LID),
                gid,
            },
            mtu: pa.u32_at(ffi::port_attr::ACTIVE_MTU),
            ethernet,
            gid_index,
        })
    }
}

impl Drop for RealDevice {
    fn drop(&mut self) {
        // SAFETY: the PD and context were made in `open`; every region, CQ and QP holds an
        // Arc of this device, so none is left when it drops.
        unsafe {
            (self.lib.dealloc_pd)(self.pd);
            (self.lib.close_device)(self.ctx);
        }
    }
}

/// A registered region of a real device.
#[derive(Debug)]
pub struct RealMr {
    dev: Arc<RealDevice>,
    mr: *mut c_void,
    lkey: u32,
    rkey: u32,
}

// SAFETY: an ibv_mr is used only through its keys and deregistered once, from any thread.
unsafe impl Send for RealMr {}
// SAFETY: as above.
unsafe impl Sync for RealMr {}

impl MemoryRegion for RealMr {
    fn lkey(&self) -> u32 {
        self.lkey
    }
    fn rkey(&self) -> u32 {
        self.rkey
    }
}

impl Drop for RealMr {
    fn drop(&mut self) {
        // SAFETY: registered in `reg_mr`, deregistered once.
        unsafe { (self.dev.lib.dereg_mr)(self.mr) };
    }
}

/// A completion queue of a real device.
#[derive(Debug)]
pub struct RealCq {
    dev: Arc<RealDevice>,
    cq: *mut c_void,
}

// SAFETY: a CQ is polled by one connection at a time (`&mut`).
unsafe impl Send for RealCq {}

impl Drop for RealCq {
    fn drop(&mut self) {
        // SAFETY: created in `create_cq`; its QPs were destroyed first (the connection's field
        // order).
        unsafe { (self.dev.lib.destroy_cq)(self.cq) };
    }
}

/// A reliable-connected queue pair of a real device.
#[derive(Debug)]
pub struct RealQp {
    dev: Arc<RealDevice>,
    qp: *mut c_void,
    qpn: u32,
}

// SAFETY: a QP is posted to by one connection at a time (`&mut`).
unsafe impl Send for RealQp {}

impl Drop for RealQp {
    fn drop(&mut self) {
        // SAFETY: created in `create_qp`, destroyed once.
        unsafe { (self.dev.lib.destroy_qp)(self.qp) };
    }
}

fn mtu_enum(bytes: u32) -> u32 {
    match bytes {
        0..=256 => 1,
        257..=512 => 2,
        513..=1024 => 3,
        1025..=2048 => 4,
        _ => 5,
    }
}

fn mtu_bytes(e: u32) -> u32 {
    128 << e.clamp(1, 5)
}

impl RealDevice {
    fn modify(&self, qp: &RealQp, attr: &mut Raw<{ qp_attr::SIZE }>, m: i32) -> VResult<()> {
        // SAFETY: a live QP and an ibv_qp_attr-sized buffer with the fields of `m` set.
        let rc = unsafe { (self.lib.modify_qp)(qp.qp, attr.ptr(), m) };
        if rc != 0 {
            return Err(VerbsError::new(
                "ibv_modify_qp",
                format!(
                    "queue pair {:#x}: {}",
                    qp.qpn,
                    std::io::Error::from_raw_os_error(rc)
                ),
            ));
        }
        Ok(())
    }
}

/// The real device as the protocol uses it: one port, shared by the transport's connections.
#[derive(Debug, Clone)]
pub struct RealPort(pub Arc<RealDevice>);

/// A doorbell for a provider without one: waiting is polling with short sleeps (the
/// completion channel is not used yet).
#[derive(Debug)]
struct PollBell;

impl Doorbell for PollBell {
    fn seq(&self) -> u32 {
        0
    }
    fn wait(&self, _seen: u32, timeout: Duration) {
        std::thread::sleep(timeout.min(Duration::from_micros(50)));
    }
    fn identity(&self) -> usize {
        0x1b
    }
}

impl Verbs for RealPort {
    type Mr = RealMr;
    type Cq = RealCq;
    type Qp = RealQp;

    fn device(&self) -> &str {
        &self.0.name
    }

    fn port(&self) -> u8 {
        self.0.port
    }

    fn port_addr(&self) -> PortAddr {
        self.0.addr
    }

    fn reg_mr(&self, addr: usize, len: usize) -> VResult<RealMr> {
        let d = &self.0;
        // SAFETY: registering caller memory for local and remote writes; the caller keeps it
        // allocated while the region lives (the Region's contract).
        let mr = unsafe {
            (d.lib.reg_mr)(
                d.pd,
                addr as *mut c_void,
                len,
                ffi::ACCESS_LOCAL_WRITE | ffi::ACCESS_REMOTE_WRITE,
            )
        };
        if mr.is_null() {
            return Err(VerbsError::new(
                "ibv_reg_mr",
                errno_words(&format!("{len} bytes at {addr:#x}")),
            ));
        }
        // SAFETY: a live ibv_mr; lkey and rkey are u32 fields at these offsets.
        let (lkey, rkey) = unsafe {
            (
                *((mr as *const u8).add(ffi::MR_LKEY) as *const u32),
                *((mr as *const u8).add(ffi::MR_RKEY) as *const u32),
            )
        };
        Ok(RealMr {
            dev: Arc::clone(d),
            mr,
            lkey,
            rkey,
        })
    }

    fn create_cq(&self, depth: usize) -> VResult<RealCq> {
        let d = &self.0;
        let n = c_int::try_from(depth).unwrap_or(c_int::MAX);
        // SAFETY: a live context; no channel, no completion vector.
        let cq =
            unsafe { (d.lib.create_cq)(d.ctx, n, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        if cq.is_null() {
            return Err(VerbsError::new(
                "ibv_create_cq",
                errno_words(&format!("{depth} entries")),
            ));
        }
        Ok(RealCq {
            dev: Arc::clone(d),
            cq,
        })
    }

    fn create_qp(&self, cq: &RealCq, attrs: &QpAttrs) -> VResult<RealQp> {
        let d = &self.0;
        let mut ia = Raw::<{ qp_init::SIZE }>::zeroed();
        ia.put_u64(qp_init::SEND_CQ, cq.cq as u64);
        ia.put_u64(qp_init::RECV_CQ, cq.cq as u64);
        ia.put_u32(qp_init::MAX_SEND_WR, attrs.max_send_wr);
        ia.put_u32(qp_init::MAX_RECV_WR, attrs.max_recv_wr);
        ia.put_u32(qp_init::MAX_SEND_SGE, 1);
        ia.put_u32(qp_init::MAX_RECV_SGE, 1);
        ia.put_u32(qp_init::QP_TYPE, ffi::QPT_RC);
        // SAFETY: a live PD and an ibv_qp_init_attr-sized buffer (zeroed: no SRQ, no inline
        // data, sq_sig_all 0).
        let qp = unsafe { (d.lib.create_qp)(d.pd, ia.ptr()) };
        if qp.is_null() {
            return Err(VerbsError::new(
                "ibv_create_qp",
                errno_words("reliable connected"),
            ));
        }
        // SAFETY: a live ibv_qp; qp_num is a u32 at this offset.
        let qpn = unsafe { *((qp as *const u8).add(ffi::QP_NUM) as *const u32) };
        let q = RealQp {
            dev: Arc::clone(d),
            qp,
            qpn,
        };
        let mut a = Raw::<{ qp_attr::SIZE }>::zeroed();
        a.put_u32(qp_attr::QP_STATE, ffi::QPS_INIT);
        a.put_u16(qp_attr::PKEY_INDEX, 0);
        a.put_u8(qp_attr::PORT_NUM, d.port);
        a.put_u32(
            qp_attr::ACCESS_FLAGS,
            (ffi::ACCESS_LOCAL_WRITE | ffi::ACCESS_REMOTE_WRITE) as u32,
        );
        d.modify(
            &q,
            &mut a,
            mask::STATE | mask::PKEY_INDEX | mask::PORT | mask::ACCESS_FLAGS,
        )?;
        Ok(q)
    }

    fn qp_num(&self, qp: &RealQp) -> u32 {
        qp.qpn
    }

    fn connect_qp(
        &self,
        qp: &mut RealQp,
        remote: &QpEndpoint,
        psn: u32,
        attrs: &QpAttrs,
    ) -> VResult<()> {
        let d = &self.0;
        let mut a = Raw::<{ qp_attr::SIZE }>::zeroed();
        a.put_u32(qp_attr::QP_STATE, ffi::QPS_RTR);
        a.put_u32(qp_attr::PATH_MTU, d.mtu.min(mtu_enum(remote.mtu)));
        a.put_u32(qp_attr::DEST_QP_NUM, remote.qpn);
        a.put_u32(qp_attr::RQ_PSN, remote.psn);
        a.put_u8(qp_attr::MAX_DEST_RD_ATOMIC, 1);
        a.put_u8(qp_attr::MIN_RNR_TIMER, 12);
        a.put_u16(qp_attr::DLID, remote.port.lid);
        a.put_u8(qp_attr::SL, attrs.service_level);
        a.put_u8(qp_attr::AH_PORT_NUM, d.port);
        if d.ethernet || remote.port.lid == 0 {
            // RoCE (and IB across subnets): route by GID.
            a.put_u8(qp_attr::IS_GLOBAL, 1);
            a.0[qp_attr::DGID..qp_attr::DGID + 16].copy_from_slice(&remote.port.gid);
            a.put_u8(qp_attr::SGID_INDEX, d.gid_index);
            a.put_u8(qp_attr::HOP_LIMIT, 255);
            a.put_u8(qp_attr::TRAFFIC_CLASS, attrs.traffic_class);
        }
        d.modify(
            qp,
            &mut a,
            mask::STATE
                | mask::AV
                | mask::PATH_MTU
                | mask::DEST_QPN
                | mask::RQ_PSN
                | mask::MAX_DEST_RD_ATOMIC
                | mask::MIN_RNR_TIMER,
        )?;
        let mut a = Raw::<{ qp_attr::SIZE }>::zeroed();
        a.put_u32(qp_attr::QP_STATE, ffi::QPS_RTS);
        a.put_u8(qp_attr::TIMEOUT, attrs.timeout);
        a.put_u8(qp_attr::RETRY_CNT, attrs.retry_cnt);
        a.put_u8(qp_attr::RNR_RETRY, 7);
        a.put_u32(qp_attr::SQ_PSN, psn);
        a.put_u8(qp_attr::MAX_RD_ATOMIC, 1);
        d.modify(
            qp,
            &mut a,
            mask::STATE
                | mask::TIMEOUT
                | mask::RETRY_CNT
                | mask::RNR_RETRY
                | mask::SQ_PSN
                | mask::MAX_QP_RD_ATOMIC,
        )
    }

    fn post_write(&self, qp: &mut RealQp, wr: &WriteWr) -> VResult<()> {
        let mut sge = Raw::<16>::zeroed();
        sge.put_u64(0, wr.local_addr as u64);
        sge.put_u32(8, wr.len as u32);
        sge.put_u32(12, wr.lkey);
        let mut w = Raw::<{ send_wr::SIZE }>::zeroed();
        w.put_u64(send_wr::WR_ID, wr.wr_id);
        w.put_u64(send_wr::SG_LIST, sge.ptr() as u64);
        w.put_u32(send_wr::NUM_SGE, u32::from(wr.len > 0));
        let op = match wr.imm {
            Some(_) => ffi::WR_RDMA_WRITE_WITH_IMM,
            None => ffi::WR_RDMA_WRITE,
        };
        w.put_u32(send_wr::OPCODE, op);
        w.put_u32(
            send_wr::SEND_FLAGS,
            if wr.signaled { ffi::SEND_SIGNALED } else { 0 },
        );
        // imm_data is big-endian on the wire and in the structure.
        w.put_u32(send_wr::IMM_DATA, wr.imm.unwrap_or(0).to_be());
        w.put_u64(send_wr::REMOTE_ADDR, wr.remote_addr);
        w.put_u32(send_wr::RKEY, wr.rkey);
        let mut bad: *mut c_void = std::ptr::null_mut();
        // SAFETY: the context is live; POST_SEND is `ops.post_send`'s offset.
        let f = unsafe { ffi::ctx_op::<ffi::PostSend>(self.0.ctx, ffi::CTX_OPS_POST_SEND) }
            .ok_or_else(|| VerbsError::new("ibv_post_send", "the provider has no post_send"))?;
        // SAFETY: what verbs.h's inline ibv_post_send does: a live QP, one work request (next
        // NULL) whose scatter entry outlives the call (the provider copies it into the queue).
        let rc = unsafe { f(qp.qp, w.ptr(), &mut bad) };
        if rc != 0 {
            return Err(VerbsError::new(
                "ibv_post_send",
                format!(
                    "queue pair {:#x}: {}",
                    qp.qpn,
                    std::io::Error::from_raw_os_error(rc)
                ),
            ));
        }
        Ok(())
    }

    fn post_recv(&self, qp: &mut RealQp, wr_id: u64) -> VResult<()> {
        let mut w = Raw::<{ ffi::RECV_WR_SIZE }>::zeroed();
        w.put_u64(0, wr_id);
        let mut bad: *mut c_void = std::ptr::null_mut();
        // SAFETY: the context is live; POST_RECV is `ops.post_recv`'s offset.
        let f = unsafe { ffi::ctx_op::<ffi::PostRecv>(self.0.ctx, ffi::CTX_OPS_POST_RECV) }
            .ok_or_else(|| VerbsError::new("ibv_post_recv", "the provider has no post_recv"))?;
        // SAFETY: a live QP and one receive request without scatter entries (immediates only).
        let rc = unsafe { f(qp.qp, w.ptr(), &mut bad) };
        if rc != 0 {
            return Err(VerbsError::new(
                "ibv_post_recv",
                format!(
                    "queue pair {:#x}: {}",
                    qp.qpn,
                    std::io::Error::from_raw_os_error(rc)
                ),
            ));
        }
        Ok(())
    }

    fn poll_cq(&self, cq: &mut RealCq, max: usize, out: &mut Vec<Wc>) -> VResult<usize> {
        const BATCH: usize = 32;
        let mut wcs: [Raw<{ ffi::wc::SIZE }>; BATCH] = std::array::from_fn(|_| Raw::zeroed());
        let n = max.min(BATCH) as c_int;
        // SAFETY: the context is live; POLL_CQ is `ops.poll_cq`'s offset.
        let f = unsafe { ffi::ctx_op::<ffi::PollCq>(self.0.ctx, ffi::CTX_OPS_POLL_CQ) }
            .ok_or_else(|| VerbsError::new("ibv_poll_cq", "the provider has no poll_cq"))?;
        // SAFETY: what verbs.h's inline ibv_poll_cq does: a live CQ and room for `n` ibv_wc
        // (the array is contiguous, each element exactly sizeof(struct ibv_wc)).
        let got = unsafe { f(cq.cq, n, wcs.as_mut_ptr() as *mut c_void) };
        if got < 0 {
            return Err(VerbsError::new(
                "ibv_poll_cq",
                format!("{}", std::io::Error::from_raw_os_error(-got)),
            ));
        }
        for w in wcs.iter().take(got as usize) {
            let status = WcStatus::from_ibv(w.u32_at(ffi::wc::STATUS));
            let wr_id = w.u64_at(ffi::wc::WR_ID);
            // The opcode is valid only on success; receives carry small ids (the protocol's).
            let recv = if status == WcStatus::Success {
                w.u32_at(ffi::wc::OPCODE) == ffi::WC_RECV_RDMA_WITH_IMM
            } else {
                wr_id >> 56 == 0
            };
            out.push(Wc {
                wr_id,
                status,
                opcode: if recv {
                    WcOpcode::RecvImm
                } else {
                    WcOpcode::Write
                },
                byte_len: w.u32_at(ffi::wc::BYTE_LEN),
                imm: u32::from_be(w.u32_at(ffi::wc::IMM_DATA)),
                qpn: w.u32_at(ffi::wc::QP_NUM),
            });
        }
        Ok(got as usize)
    }

    fn set_error(&self, qp: &mut RealQp) {
        let mut a = Raw::<{ qp_attr::SIZE }>::zeroed();
        a.put_u32(qp_attr::QP_STATE, ffi::QPS_ERR);
        let _ = self.0.modify(qp, &mut a, mask::STATE);
    }

    fn doorbell(&self) -> Option<Arc<dyn Doorbell>> {
        Some(Arc::new(PollBell))
    }
}

impl RealPort {
    /// Path MTU in bytes.
    pub fn mtu_bytes(&self) -> u32 {
        mtu_bytes(self.0.mtu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_reports_in_one_line() {
        let p = probe();
        let why = p.why_not();
        assert!(!why.contains('\n') && !why.is_empty(), "{why}");
        eprintln!("real verbs provider: {why}");
    }

    #[test]
    fn mtus() {
        assert_eq!(mtu_enum(4096), 5);
        assert_eq!(mtu_enum(1024), 3);
        assert_eq!(mtu_bytes(5), 4096);
        assert_eq!(mtu_bytes(1), 256);
    }

    #[test]
    fn raw_fields_land_at_their_offsets() {
        let mut r = Raw::<{ send_wr::SIZE }>::zeroed();
        r.put_u64(send_wr::REMOTE_ADDR, 0x1122_3344_5566_7788);
        r.put_u32(send_wr::RKEY, 0xaabb_ccdd);
        assert_eq!(r.u64_at(40), 0x1122_3344_5566_7788);
        assert_eq!(r.u32_at(48), 0xaabb_ccdd);
        assert_eq!(std::mem::align_of::<Raw<8>>(), 8);
    }
}
