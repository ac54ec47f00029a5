//! The cuda provider: receive slots in device memory from the plain allocator (`cuMemAlloc`:
//! CUDA IPC cannot export stream-ordered pool memory), exported with `cuIpcGetMemHandle` and
//! mapped by the peer with `cuIpcOpenMemHandle` (lazy peer access). Copies run on a stream of
//! each connection's own (`cuMemcpyAsync`, unified addressing: device or host sources), one
//! event per slot polled with `cuEventQuery`. A peer in this same process (ranks as threads)
//! uses the allocation's pointer directly, since a process cannot open its own IPC handle
//! (with peer access enabled from this rank's context when it is on another GPU).
//!
//! Built, not yet run on a GPU (see docs/P2P.md).

use std::sync::{Arc, Mutex, Weak};

use ferroccl_cuda::driver::{driver, Device, DevicePtr, Driver, Handle, IpcMemHandle};
use ferroccl_transport::{Error, ErrorKind, MemSpace, Payload, PayloadMut, Result};

fn cuda_err(what: &str, e: ferroccl_cuda::CudaError) -> Error {
    Error::new(ErrorKind::System, format!("p2p {what}: {e}"))
}

/// This rank's GPU: the driver, the device and its primary context.
#[derive(Debug)]
pub(crate) struct CudaDev {
    drv: &'static Driver,
    device: Device,
    /// The ordinal in this process.
    pub ordinal: u32,
    ctx: Handle,
    /// PCI bus id: names the GPU the same way in every process.
    pub bus_id: String,
}

// SAFETY: the context handle is a retained primary context, valid on any thread once made
// current there (`bind`); the driver is thread-safe.
unsafe impl Send for CudaDev {}
// SAFETY: as above.
unsafe impl Sync for CudaDev {}

impl CudaDev {
    /// Opens device `ordinal`; without a driver the error is [`ferroccl_cuda::DRIVER_MISSING`]'s
    /// (it names libcuda.so.1).
    /// `ordinal` `None`: device `local_rank` modulo the devices this process sees.
    pub fn open(ordinal: Option<u32>, local_rank: u32) -> std::result::Result<CudaDev, String> {
        let drv = driver().map_err(|e| e.to_string())?;
        let ordinal = match ordinal {
            Some(o) => o,
            None => {
                let n = drv.device_count().map_err(|e| e.to_string())?;
                if n == 0 {
                    return Err("this process sees no CUDA device".to_string());
                }
                local_rank % n
            }
        };
        let device = drv.device(ordinal).map_err(|e| e.to_string())?;
        let ctx = drv
            .bind_primary_context(device)
            .map_err(|e| e.to_string())?;
        let bus_id = drv.pci_bus_id(device).map_err(|e| e.to_string())?;
        Ok(CudaDev {
            drv,
            device,
            ordinal,
            ctx,
            bus_id,
        })
    }

    fn bind(&self) -> Result<()> {
        // SAFETY: `ctx` is the primary context retained in `open`, never released.
        unsafe { self.drv.set_current(self.ctx) }.map_err(|e| cuda_err("binding the context", e))
    }

    /// Whether this GPU can reach the GPU with PCI bus id `peer` (the same GPU, or peer
    /// access); `Err` says why not.
    pub fn can_reach(&self, peer: &str) -> std::result::Result<(), String> {
        if peer == self.bus_id {
            return Ok(());
        }
        let d = self.drv.device_by_pci_bus_id(peer).map_err(|e| {
            format!("GPU {peer} is not visible to this process (CUDA_VISIBLE_DEVICES?): {e}")
        })?;
        match self.drv.can_access_peer(self.device, d) {
            Ok(true) => Ok(()),
            Ok(false) => Err(format!(
                "GPU {} cannot access GPU {peer} (no NVLink or PCIe peer access)",
                self.bus_id
            )),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Allocations of this process by address, so that a peer thread of the same process finds
/// them (a process cannot open its own IPC handles).
static LOCAL: Mutex<Vec<(DevicePtr, Weak<DevAlloc>)>> = Mutex::new(Vec::new());

/// Device memory this rank owns (its receive slots).
#[derive(Debug)]
pub(crate) struct DevAlloc {
    dev: Arc<CudaDev>,
    /// Device address.
    pub ptr: DevicePtr,
    /// Bytes.
    pub len: usize,
    handle: IpcMemHandle,
}

impl DevAlloc {
    /// Allocates `len` bytes with `cuMemAlloc` and gets its IPC handle.
    pub fn new(dev: &Arc<CudaDev>, len: usize) -> Result<Arc<DevAlloc>> {
        dev.bind()?;
        let ptr = dev
            .drv
            .alloc(len)
            .map_err(|e| cuda_err("allocating receive slots", e))?;
        let handle = match dev.drv.ipc_handle(ptr) {
            Ok(h) => h,
            Err(e) => {
                // SAFETY: `ptr` is the fresh allocation above, used by nothing yet.
                let _ = unsafe { dev.drv.free(ptr) };
                return Err(cuda_err("exporting receive slots", e));
            }
        };
        let a = Arc::new(DevAlloc {
            dev: Arc::clone(dev),
            ptr,
            len,
            handle,
        });
        let mut local = LOCAL.lock().unwrap_or_else(|p| p.into_inner());
        local.retain(|(_, w)| w.strong_count() > 0);
        local.push((ptr, Arc::downgrade(&a)));
        Ok(a)
    }

    /// What a peer needs to map it: pid, address, length, IPC handle.
    pub fn export(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(EXPORT_LEN);
        v.extend_from_slice(&std::process::id().to_le_bytes());
        v.extend_from_slice(&process_token().to_le_bytes());
        v.extend_from_slice(&self.ptr.to_le_bytes());
        v.extend_from_slice(&(self.len as u64).to_le_bytes());
        v.extend_from_slice(&self.handle.0);
        v
    }
}

impl Drop for DevAlloc {
    fn drop(&mut self) {
        if self.dev.bind().is_ok() {
            // SAFETY: the allocation is freed once, here; every connection that copied into or
            // out of it synchronised its stream before releasing its reference.
            let _ = unsafe { self.dev.drv.free(self.ptr) };
        }
    }
}

/// Bytes of an exported allocation: pid, process token, address, length, IPC handle.
const EXPORT_LEN: usize = 4 + 8 + 8 + 8 + 64;

/// A random number that tells this process from every other one sharing the host's
/// `/dev/shm`: a pid alone does not (processes in other pid namespaces may have the same
/// one, and the same first device address), and a peer taken for a thread of this process
/// would be written through a local allocation instead of its own.
fn process_token() -> u64 {
    static TOKEN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TOKEN.get_or_init(|| {
        let mut b = [0u8; 8];
        // SAFETY: `b` is a writable buffer of 8 bytes.
        let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
        if n == 8 {
            return u64::from_le_bytes(b);
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        ferroccl_transport::hash64(&[
            &std::process::id().to_le_bytes(),
            &nanos.to_le_bytes(),
            &(&b as *const _ as usize).to_le_bytes(),
        ])
    })
}

/// A peer's receive slots, mapped here.
#[derive(Debug)]
pub(crate) enum DevPeer {
    /// Opened from an IPC handle; closed when dropped.
    Ipc {
        dev: Arc<CudaDev>,
        ptr: DevicePtr,
        len: usize,
    },
    /// An allocation of this same process.
    Local(Arc<DevAlloc>),
}

impl DevPeer {
    /// Maps what [`DevAlloc::export`] wrote, which must cover `need` bytes.
    pub fn open(dev: &Arc<CudaDev>, export: &[u8], need: usize) -> Result<DevPeer> {
        if export.len() != EXPORT_LEN {
            return Err(Error::remote(format!(
                "a cuda memory handle of {} bytes (expected {EXPORT_LEN})",
                export.len()
            )));
        }
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&export[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let pid = u32::from_le_bytes([export[0], export[1], export[2], export[3]]);
        let (token, ptr, len) = (u64_at(4), u64_at(12), u64_at(20) as usize);
        if len < need {
            return Err(Error::remote(format!(
                "the peer's receive slots hold {len} bytes, its ring needs {need}"
            )));
        }
        if pid == std::process::id() && token == process_token() {
            let local = LOCAL.lock().unwrap_or_else(|p| p.into_inner());
            let a = local
                .iter()
                .find(|(p, _)| *p == ptr)
                .and_then(|(_, w)| w.upgrade())
                .ok_or_else(|| {
                    Error::remote(format!(
                        "device allocation {ptr:#x} of this process is gone"
                    ))
                })?;
            if a.dev.ordinal != dev.ordinal {
                // Ranks as threads on two GPUs: without peer access enabled in this context,
                // the driver stages every copy into the peer's slots through host memory
                // (processes get it from cuIpcOpenMemHandle), which still works where the
                // device has all the peers it can have (the copies are only slower).
                dev.bind()?;
                // SAFETY: this device's context is current (bound above); the peer's is the
                // primary context its `CudaDev` retained and never releases.
                let enabled = unsafe { dev.drv.try_enable_peer_access(a.dev.ctx) }
                    .map_err(|e| cuda_err("enabling peer access to the peer's GPU", e))?;
                if !enabled {
                    ferroccl_transport::log_line!(
                        "ferroccl INFO P2P: cuda device {} has all the peers it can enable; \
                         copies to device {}'s slots are staged by the driver",
                        dev.ordinal,
                        a.dev.ordinal
                    );
                }
            }
            return Ok(DevPeer::Local(a));
        }
        let mut h = IpcMemHandle([0; 64]);
        h.0.copy_from_slice(&export[28..EXPORT_LEN]);
        dev.bind()?;
        let ptr = dev
            .drv
            .ipc_open(&h)
            .map_err(|e| cuda_err("opening the peer's receive slots", e))?;
        Ok(DevPeer::Ipc {
            dev: Arc::clone(dev),
            ptr,
            len,
        })
    }

    fn base(&self) -> (DevicePtr, usize) {
        match self {
            DevPeer::Ipc { ptr, len, .. } => (*ptr, *len),
            DevPeer::Local(a) => (a.ptr, a.len),
        }
    }
}

impl Drop for DevPeer {
    fn drop(&mut self) {
        if let DevPeer::Ipc { dev, ptr, .. } = self {
            if dev.bind().is_ok() {
                // SAFETY: opened once by `open`, closed once here; the connection that copied
                // into it synchronised its stream first.
                let _ = unsafe { dev.drv.ipc_close(*ptr) };
            }
        }
    }
}

/// Slots a copier reaches: this rank's (receiving) or a peer's (sending).
#[derive(Debug)]
pub(crate) enum DevSlots {
    /// This rank's.
    Own(Arc<DevAlloc>),
    /// A peer's.
    Peer(DevPeer),
}

impl DevSlots {
    fn base(&self) -> (DevicePtr, usize) {
        match self {
            DevSlots::Own(a) => (a.ptr, a.len),
            DevSlots::Peer(p) => p.base(),
        }
    }
}

/// One direction's copies: a stream and an event per slot.
#[derive(Debug)]
pub(crate) struct DevCopier {
    dev: Arc<CudaDev>,
    slots: DevSlots,
    stream: Handle,
    events: Vec<Handle>,
    busy: Vec<bool>,
    /// Per slot: [`DevCopier::in_flight`] has reported its finished copy once (reset when a
    /// copy is queued on it or its end is taken by [`DevCopier::done`]).
    told_done: Vec<std::cell::Cell<bool>>,
}

// SAFETY: the stream and events belong to this copier alone and are used by one thread at a
// time (the connection's); the driver is thread-safe.
unsafe impl Send for DevCopier {}

impl DevCopier {
    /// A copier over `slots` with one event per slot.
    pub fn new(dev: &Arc<CudaDev>, slots: DevSlots, nslots: usize) -> Result<DevCopier> {
        dev.bind()?;
        let stream = dev
            .drv
            .create_stream()
            .map_err(|e| cuda_err("creating a stream", e))?;
        let mut c = DevCopier {
            dev: Arc::clone(dev),
            slots,
            stream,
            events: Vec::with_capacity(nslots),
            busy: vec![false; nslots],
            told_done: (0..nslots).map(|_| std::cell::Cell::new(false)).collect(),
        };
        for _ in 0..nslots {
            let e = c
                .dev
                .drv
                .create_event()
                .map_err(|e| cuda_err("creating an event", e))?;
            c.events.push(e);
        }
        Ok(c)
    }

    fn slot_addr(&self, at: usize, n: usize) -> Result<DevicePtr> {
        let (base, len) = self.slots.base();
        if at.checked_add(n).is_none_or(|e| e > len) {
            return Err(Error::internal(format!(
                "p2p cuda provider: bytes {at}..{} past {len} bytes of slots",
                at.saturating_add(n)
            )));
        }
        Ok(base + at as u64)
    }

    fn copy(&mut self, slot: usize, dst: DevicePtr, src: DevicePtr, n: usize) -> Result<()> {
        if n == 0 {
            self.busy[slot] = false;
            return Ok(());
        }
        self.dev.bind()?;
        // SAFETY: both ranges were checked against their buffers (slots: the allocation or
        // mapping this copier holds; payload: the caller's slice or device reference, which
        // the connection contract keeps alive until the message completes, and `Drop`
        // synchronises the stream first); the ring protocol gives this side the slot.
        unsafe { self.dev.drv.copy_async(dst, src, n, self.stream) }
            .map_err(|e| cuda_err("queueing a copy", e))?;
        // SAFETY: the event and the stream were created in `new` and live until `Drop`.
        unsafe { self.dev.drv.record_event(self.events[slot], self.stream) }
            .map_err(|e| cuda_err("recording an event", e))?;
        self.busy[slot] = true;
        self.told_done[slot].set(false);
        Ok(())
    }

    /// Queues `src[off..off + n]` into byte `at` of the slots.
    pub fn put(
        &mut self,
        slot: usize,
        at: usize,
        src: &Payload<'_>,
        off: usize,
        n: usize,
    ) -> Result<()> {
        let from = payload_addr(src.mem(), off, n)?;
        let to = self.slot_addr(at, n)?;
        self.copy(slot, to, from, n)
    }

    /// Queues `n` bytes at byte `at` of the slots into `dst[off..off + n]`.
    pub fn get(
        &mut self,
        slot: usize,
        at: usize,
        dst: &mut PayloadMut<'_>,
        off: usize,
        n: usize,
    ) -> Result<()> {
        let to = payload_addr(dst.mem(), off, n)?;
        let from = self.slot_addr(at, n)?;
        self.copy(slot, to, from, n)
    }

    /// The `n` bytes at `at` of the slots, as device memory of this device.
    pub fn lend(&self, at: usize, n: usize) -> Result<Payload<'_>> {
        let addr = self.slot_addr(at, n)?;
        Ok(Payload::Device(ferroccl_transport::MemRef {
            space: ferroccl_transport::MemSpace::Cuda(self.dev.ordinal),
            addr: addr as usize,
            len: n,
        }))
    }

    /// Whether a queued copy is still running, or ended since the connection last took the
    /// ends of its copies: a copy that ends between a progress call and the waiter's choice to
    /// sleep rings no doorbell, and the rank would sleep up to its limit (100 ms) with bytes to
    /// publish. A finished copy counts once, so that the waiter polls once more; the events are
    /// asked, not only the flags: a message abandoned mid-way (an error, an abort) leaves its
    /// slots' flags set, and its copies, once done, must not keep a waiter polling until its
    /// deadline. An event the driver cannot answer for counts as done here; `done` reports the
    /// error.
    pub fn in_flight(&self) -> bool {
        if !self.busy.contains(&true) || self.dev.bind().is_err() {
            return false;
        }
        let mut any = false;
        for ((&busy, &e), told) in self.busy.iter().zip(&self.events).zip(&self.told_done) {
            if !busy {
                continue;
            }
            // SAFETY: the event was created in `new` and lives until `Drop`.
            match unsafe { self.dev.drv.event_done(e) } {
                Ok(false) => any = true,
                _ if !told.get() => {
                    told.set(true);
                    any = true;
                }
                _ => {}
            }
        }
        any
    }

    /// Whether the copy last queued for `slot` is done.
    pub fn done(&mut self, slot: usize) -> Result<bool> {
        if !self.busy[slot] {
            return Ok(true);
        }
        self.dev.bind()?;
        // SAFETY: the event was created in `new` and lives until `Drop`.
        let d = unsafe { self.dev.drv.event_done(self.events[slot]) }
            .map_err(|e| cuda_err("polling a copy", e))?;
        if d {
            self.busy[slot] = false;
            self.told_done[slot].set(false);
        }
        Ok(d)
    }
}

fn payload_addr(m: ferroccl_transport::MemRef, off: usize, n: usize) -> Result<DevicePtr> {
    if off.checked_add(n).is_none_or(|e| e > m.len) {
        return Err(Error::internal(format!(
            "p2p cuda provider: bytes {off}..{} past a {}-byte buffer",
            off.saturating_add(n),
            m.len
        )));
    }
    match m.space {
        MemSpace::Host | MemSpace::Cuda(_) => Ok((m.addr + off) as DevicePtr),
    }
}

impl Drop for DevCopier {
    fn drop(&mut self) {
        if self.dev.bind().is_err() {
            return;
        }
        // Queued copies finish before the slots and buffers they touch can go.
        // SAFETY: the stream was created in `new` and is destroyed below, after this.
        let _ = unsafe { self.dev.drv.sync_stream(self.stream) };
        for &e in &self.events {
            // SAFETY: created by `new`, destroyed once, its work synchronised above.
            let _ = unsafe { self.dev.drv.destroy_event(e) };
        }
        // SAFETY: created by `new`, destroyed once, its work synchronised above.
        let _ = unsafe { self.dev.drv.destroy_stream(self.stream) };
    }
}
