//! The reduction kernels on one CUDA device: compiled with NVRTC for the device's architecture
//! on first use (cached per process, and on disk: [`cache_dir`]), loaded into the device's primary context
//! and launched on a stream of their own.
//!
//! Built, not yet run on a GPU: the CPU suite checks only that every entry returns the
//! no-driver error here, and `scripts/gpu-check.sh` runs the rest on a machine with a GPU.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use ferroccl_kernels::{DataType, ElemOp};

use crate::args::{kernel_name, RcArgs};
use crate::driver::{driver, Device, DevicePtr, Driver, Handle, ATTR_SM_COUNT};
use crate::error::{CudaError, CudaErrorKind, Result};
use crate::nvrtc::{compile_reduce_kernels, compile_reduce_kernels_ptx, Nvrtc};

/// Threads per block of every reduce-copy launch.
pub const BLOCK_THREADS: u32 = 512;

/// The directory of compiled kernels on disk, if any: `$FERROCCL_KERNEL_CACHE`, else
/// `$XDG_CACHE_HOME/ferroccl` or `~/.cache/ferroccl`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("FERROCCL_KERNEL_CACHE") {
        return Some(PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("ferroccl"))
}

/// A hash (FNV-1a) of the kernel sources and the compile options, so that a changed source
/// never finds a stale cached image.
fn source_hash() -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let opts = format!("{:?}", crate::nvrtc::OPTIONS);
    for b in crate::KERNEL_HEADER
        .bytes()
        .chain(crate::KERNEL_SOURCE.bytes())
        .chain(opts.bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The cached cubin of the reduction kernels for sm_`arch` in `dir`.
pub fn cache_file(dir: &Path, arch: u32) -> PathBuf {
    dir.join(format!("reduce-{:016x}-sm_{arch}.cubin", source_hash()))
}

/// The cached PTX of the reduction kernels for compute_`arch` in `dir`.
pub fn ptx_cache_file(dir: &Path, arch: u32) -> PathBuf {
    dir.join(format!("reduce-{:016x}-compute_{arch}.ptx", source_hash()))
}

/// Writes `bytes` to `f` whole, then renames, so a reader never sees half a file.
fn store(dir: &Path, f: &Path, bytes: &[u8]) -> Result<()> {
    let io = |e: std::io::Error| {
        CudaError::new(
            CudaErrorKind::Invalid,
            format!("kernel cache {}: {e}", f.display()),
        )
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let tmp = f.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(io)?;
    std::fs::rename(&tmp, f).map_err(io)
}

/// Compiles the reduction kernels for sm_`arch` with `nvrtc` and stores the cubin in `dir`.
pub fn compile_into_cache(nvrtc: &Nvrtc, dir: &Path, arch: u32) -> Result<Vec<u8>> {
    let (c, _warnings) = compile_reduce_kernels(nvrtc, arch)?;
    store(dir, &cache_file(dir, arch), &c)?;
    Ok(c)
}

/// Compiles the reduction kernels into PTX for compute_`arch` and stores it in `dir`: the
/// driver compiles it at load for GPUs newer than every cached cubin, where there is no NVRTC.
pub fn compile_ptx_into_cache(nvrtc: &Nvrtc, dir: &Path, arch: u32) -> Result<Vec<u8>> {
    let (p, _warnings) = compile_reduce_kernels_ptx(nvrtc, arch)?;
    store(dir, &ptx_cache_file(dir, arch), &p)?;
    Ok(p)
}

/// Whether `c` is a whole 64-bit ELF file as far as its headers say: `cuModuleLoadData` takes
/// no length, so a cached cubin cut short (a full disk, a killed writer) must not reach it.
pub fn is_whole_cubin(c: &[u8]) -> bool {
    let at = |o: usize, n: usize| -> Option<u64> {
        let b = c.get(o..o + n)?;
        Some(b.iter().rev().fold(0u64, |v, &x| v << 8 | u64::from(x)))
    };
    let table_fits = |off: usize, size: usize, count: usize| -> Option<bool> {
        let (off, size, count) = (at(off, 8)?, at(size, 2)?, at(count, 2)?);
        Some(off.checked_add(size.checked_mul(count)?)? <= c.len() as u64)
    };
    c.len() >= 64
        && c.starts_with(b"\x7fELF\x02\x01")
        && table_fits(0x20, 0x36, 0x38) == Some(true)
        && table_fits(0x28, 0x3a, 0x3c) == Some(true)
}

/// The image of the reduction kernels for a GPU of compute capability `arch`, for
/// `cuModuleLoadData`: from this process's cache; a cached cubin for sm_`arch`; NVRTC (then
/// cached in both; a disk cache that cannot be written only costs a compile); or, without an
/// NVRTC that can target `arch`, cached PTX of an older virtual architecture.
pub fn reduce_image(arch: u32) -> Result<Arc<Vec<u8>>> {
    static IMAGES: OnceLock<Mutex<HashMap<u32, Arc<Vec<u8>>>>> = OnceLock::new();
    let images = IMAGES.get_or_init(Default::default);
    let mut map = images.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = map.get(&arch) {
        return Ok(c.clone());
    }
    let dir = cache_dir();
    let read = |f: PathBuf| std::fs::read(f).ok();
    let cubin = dir
        .as_ref()
        .and_then(|d| read(cache_file(d, arch)))
        .filter(|c| is_whole_cubin(c));
    let image = match cubin {
        Some(c) => c,
        None => match Nvrtc::load_default() {
            Ok(nvrtc) if nvrtc.supports(arch) => match &dir {
                Some(d) => match compile_into_cache(&nvrtc, d, arch) {
                    Ok(c) => c,
                    Err(e) if e.kind() == CudaErrorKind::Invalid => {
                        compile_reduce_kernels(&nvrtc, arch)?.0
                    }
                    Err(e) => return Err(e),
                },
                None => compile_reduce_kernels(&nvrtc, arch)?.0,
            },
            found => {
                let ptx = dir.as_ref().and_then(|d| {
                    [90u32, 89, 86, 80, 75, 70]
                        .into_iter()
                        .filter(|&a| a <= arch)
                        .find_map(|a| read(ptx_cache_file(d, a)).filter(|p| p.last() == Some(&0)))
                });
                match (ptx, found) {
                    (Some(p), _) => p,
                    (None, Err(e)) => {
                        return Err(CudaError::new(
                            e.kind(),
                            format!("{e} (and no cached kernels for sm_{arch})"),
                        ))
                    }
                    (None, Ok(nvrtc)) => {
                        return Err(CudaError::new(
                            CudaErrorKind::Compile,
                            format!(
                                "NVRTC {}.{} ({}) cannot target sm_{arch} and no kernels for it \
                                 are cached; use the CUDA 12 NVRTC for this GPU",
                                nvrtc.version().0,
                                nvrtc.version().1,
                                nvrtc.path()
                            ),
                        ))
                    }
                }
            }
        },
    };
    let c = Arc::new(image);
    map.insert(arch, c.clone());
    Ok(c)
}

/// The kernels' module loaded on one device (in its primary context), once per process: every
/// [`DeviceKernels`] of the device shares it. Loading a module may wait for the device, so it
/// is done once, at a device's first use, not at every communicator's.
#[derive(Debug)]
struct Loaded {
    functions: HashMap<(DataType, ElemOp), Handle>,
}

// SAFETY: function handles of a module that stays loaded for the process; the driver lets
// any thread launch them with the context current.
unsafe impl Send for Loaded {}
// SAFETY: as above; nothing in it changes after loading.
unsafe impl Sync for Loaded {}

/// The module of device `ordinal`'s primary context (current on this thread), loaded at the
/// first call for the device and kept for the process.
fn loaded(driver: &'static Driver, ordinal: u32, arch: u32) -> Result<Arc<Loaded>> {
    static LOADED: Mutex<BTreeMap<u32, Arc<Loaded>>> = Mutex::new(BTreeMap::new());
    let mut map = LOADED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(l) = map.get(&ordinal) {
        return Ok(l.clone());
    }
    let image = reduce_image(arch)?;
    let mut module = std::ptr::null_mut();
    // SAFETY: the context is current; `image` is a complete cubin, or PTX text ending in NUL,
    // that outlives the call.
    driver.check("cuModuleLoadData", unsafe {
        (driver.module_load_data)(&mut module, image.as_ptr().cast())
    })?;
    let mut functions = HashMap::new();
    for dtype in DataType::ALL {
        for op in ElemOp::ALL {
            let name = CString::new(kernel_name(dtype, op)).expect("kernel names hold no NUL");
            let mut f = std::ptr::null_mut();
            // SAFETY: `module` is loaded; `name` is NUL-terminated; `f` is an out-pointer.
            driver.check("cuModuleGetFunction", unsafe {
                (driver.module_get_function)(&mut f, module, name.as_ptr())
            })?;
            functions.insert((dtype, op), f);
        }
    }
    let l = Arc::new(Loaded { functions });
    map.insert(ordinal, l.clone());
    Ok(l)
}

impl Drop for DeviceKernels {
    fn drop(&mut self) {
        // SAFETY: the stream was made in `new` and is destroyed once here; work still queued
        // on it runs to the end first (the driver releases it then), and events recorded on
        // it stay valid.
        let _ = self
            .bind()
            .and_then(|()| unsafe { self.driver.destroy_stream(self.stream) });
    }
}

/// The reduction kernels loaded on one device, with a stream of its own to launch them on.
#[derive(Debug)]
pub struct DeviceKernels {
    driver: &'static Driver,
    ordinal: u32,
    arch: u32,
    ctx: Handle,
    stream: Handle,
    loaded: Arc<Loaded>,
    grid_max: u32,
}

// SAFETY: CUDA driver handles (context, stream, functions) may be used from any thread once the
// context is made current there; every method below binds the context first.
unsafe impl Send for DeviceKernels {}
// SAFETY: as above; launches on one stream are ordered by the driver, which is thread-safe.
unsafe impl Sync for DeviceKernels {}

impl DeviceKernels {
    /// Loads the driver, picks device `ordinal`, compiles (or finds) the kernels for its
    /// architecture and creates a stream. Without a driver: the [`crate::DRIVER_MISSING`] error.
    pub fn new(ordinal: u32) -> Result<DeviceKernels> {
        let driver = driver()?;
        let device: Device = driver.device(ordinal)?;
        let arch = driver.arch(device)?;
        let ctx = driver.bind_primary_context(device)?;
        let loaded = loaded(driver, ordinal, arch)?;
        let mut stream = std::ptr::null_mut();
        // SAFETY: the context is current; flag 1 is CU_STREAM_NON_BLOCKING.
        driver.check("cuStreamCreate", unsafe {
            (driver.stream_create)(&mut stream, 1)
        })?;
        let sms = driver.attribute(device, ATTR_SM_COUNT)?.max(1) as u32;
        Ok(DeviceKernels {
            driver,
            ordinal,
            arch,
            ctx,
            stream,
            loaded,
            grid_max: sms * 4,
        })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The architecture the kernels were compiled for (`90` for sm_90).
    pub fn arch(&self) -> u32 {
        self.arch
    }

    /// The stream the kernels run on (`CUstream`).
    pub fn stream(&self) -> Handle {
        self.stream
    }

    /// The driver.
    pub fn driver(&self) -> &'static Driver {
        self.driver
    }

    /// Makes this device's context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        // SAFETY: `ctx` is the retained primary context of this device.
        unsafe { self.driver.set_current(self.ctx) }
    }

    /// Launches the reduce-copy of `dtype` and `op` on the stream; returns when it is queued.
    ///
    /// # Safety
    /// Every address in `args` must be device memory of this device (or memory it maps),
    /// readable (sources) or writable (destinations) for `args.count` elements of `dtype`
    /// until the stream has run the kernel; a destination is one of the sources or overlaps
    /// none of them.
    pub unsafe fn reduce_copy(&self, dtype: DataType, op: ElemOp, args: &RcArgs) -> Result<()> {
        // SAFETY: per this function's contract; the stream is this device's own.
        unsafe { self.reduce_copy_on(self.stream, dtype, op, args) }
    }

    /// [`DeviceKernels::reduce_copy`] on `stream`, a stream of this device's primary context
    /// (a caller's `cudaStream_t`) instead of the kernels' own.
    ///
    /// # Safety
    /// As for [`DeviceKernels::reduce_copy`], until `stream` has run the kernel; `stream` is
    /// a live stream of this device's primary context.
    pub unsafe fn reduce_copy_on(
        &self,
        stream: Handle,
        dtype: DataType,
        op: ElemOp,
        args: &RcArgs,
    ) -> Result<()> {
        if args.nsrc == 0
            || args.nsrc as usize > crate::MAX_SRCS
            || args.ndst as usize > crate::MAX_DSTS
        {
            return Err(CudaError::new(
                CudaErrorKind::Invalid,
                format!(
                    "reduce-copy: {} sources and {} destinations",
                    args.nsrc, args.ndst
                ),
            ));
        }
        if args.count == 0 {
            return Ok(());
        }
        self.bind()?;
        let f = self.loaded.functions[&(dtype, op)];
        let vectors = args.count.div_ceil((16 / dtype.size()) as u64);
        let blocks = vectors
            .div_ceil(u64::from(BLOCK_THREADS))
            .clamp(1, u64::from(self.grid_max)) as u32;
        let mut a = *args;
        let mut params = [(&mut a as *mut RcArgs).cast::<c_void>()];
        // SAFETY: `f` is a kernel of the loaded module taking one `struct ferro_rc_args` by
        // value; `params` points at a copy of it that lives until cuLaunchKernel returns (the
        // driver copies parameters at launch); the caller guarantees the addresses.
        self.driver.check("cuLaunchKernel", unsafe {
            (self.driver.launch_kernel)(
                f,
                blocks,
                1,
                1,
                BLOCK_THREADS,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    /// Queues a device-to-device copy of `len` bytes on the stream.
    ///
    /// # Safety
    /// `src` and `dst` must be device memory of `len` bytes each that do not overlap, live
    /// until the stream has run the copy.
    pub unsafe fn copy(&self, dst: DevicePtr, src: DevicePtr, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the caller guarantees both ranges.
        self.driver.check("cuMemcpyDtoDAsync", unsafe {
            (self.driver.memcpy_dtod_async)(dst, src, len, self.stream)
        })
    }

    /// Waits until everything queued on the stream has run.
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: the stream was created on this context and is never destroyed.
        self.driver.check("cuStreamSynchronize", unsafe {
            (self.driver.stream_synchronize)(self.stream)
        })
    }

    /// A mark at the current end of the stream (an event without timing): done once everything
    /// queued on the stream before it has run.
    pub fn mark(&self) -> Result<Mark> {
        self.bind()?;
        let event = self.driver.create_event()?;
        let mark = Mark {
            driver: self.driver,
            ctx: self.ctx,
            event,
        };
        // SAFETY: the event was just created in this context, the stream belongs to it, and
        // the context is current.
        unsafe { self.driver.record_event(event, self.stream) }?;
        Ok(mark)
    }

    /// Milliseconds the work that `f` queues on the stream takes on the device (two events).
    pub fn time(&self, f: impl FnOnce() -> Result<()>) -> Result<f32> {
        let drv = self.driver;
        self.bind()?;
        let (mut start, mut end) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: out-pointers; flags 0 (timing events); the context is current; the stream
        // belongs to this context.
        unsafe {
            drv.check("cuEventCreate", (drv.event_create)(&mut start, 0))?;
            drv.check("cuEventCreate", (drv.event_create)(&mut end, 0))?;
            drv.check("cuEventRecord", (drv.event_record)(start, self.stream))?;
        }
        f()?;
        let mut ms = 0f32;
        // SAFETY: both events were created above and recorded on this stream; destroyed once.
        unsafe {
            drv.check("cuEventRecord", (drv.event_record)(end, self.stream))?;
            drv.check("cuEventSynchronize", (drv.event_synchronize)(end))?;
            drv.check(
                "cuEventElapsedTime",
                (drv.event_elapsed)(&mut ms, start, end),
            )?;
            drv.check("cuEventDestroy", (drv.event_destroy)(start))?;
            drv.check("cuEventDestroy", (drv.event_destroy)(end))?;
        }
        Ok(ms)
    }
}

/// A point in a [`DeviceKernels`] stream ([`DeviceKernels::mark`]); the event goes with it.
#[derive(Debug)]
pub struct Mark {
    driver: &'static Driver,
    ctx: Handle,
    event: Handle,
}

// SAFETY: the event and the (retained primary) context are driver handles usable from any
// thread; every method makes the context current first.
unsafe impl Send for Mark {}

impl Mark {
    /// Whether the work queued before the mark has run (never blocks).
    pub fn done(&self) -> Result<bool> {
        // SAFETY: `ctx` is the retained primary context the event was made in; the event
        // lives until `Drop`.
        unsafe {
            self.driver.set_current(self.ctx)?;
            self.driver.event_done(self.event)
        }
    }

    /// Blocks until the work queued before the mark has run.
    pub fn wait(&self) -> Result<()> {
        // SAFETY: as in `done`.
        unsafe {
            self.driver.set_current(self.ctx)?;
            self.driver.sync_event(self.event)
        }
    }
}

impl Drop for Mark {
    fn drop(&mut self) {
        // SAFETY: as in `done`; the event is destroyed once, here (the driver destroys it
        // once the work before it is done, if it is still pending).
        unsafe {
            if self.driver.set_current(self.ctx).is_ok() {
                let _ = self.driver.destroy_event(self.event);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::is_whole_cubin as whole_elf;

    /// A 64-bit little-endian ELF header whose program and section header tables end at
    /// `ph_end` and `sh_end`.
    fn header(len: usize, ph: (u64, u16, u16), sh: (u64, u16, u16)) -> Vec<u8> {
        let mut c = vec![0u8; len];
        c[..6].copy_from_slice(b"\x7fELF\x02\x01");
        c[0x20..0x28].copy_from_slice(&ph.0.to_le_bytes());
        c[0x36..0x38].copy_from_slice(&ph.1.to_le_bytes());
        c[0x38..0x3a].copy_from_slice(&ph.2.to_le_bytes());
        c[0x28..0x30].copy_from_slice(&sh.0.to_le_bytes());
        c[0x3a..0x3c].copy_from_slice(&sh.1.to_le_bytes());
        c[0x3c..0x3e].copy_from_slice(&sh.2.to_le_bytes());
        c
    }

    #[test]
    fn a_cubin_cut_short_is_not_loaded() {
        // Program headers 64..176, section headers 1000..1640.
        let ok = header(1640, (64, 56, 2), (1000, 64, 10));
        assert!(whole_elf(&ok));
        assert!(
            !whole_elf(&ok[..1639]),
            "the section table runs past the end"
        );
        assert!(
            !whole_elf(&header(150, (64, 56, 2), (0, 64, 0))),
            "program table past the end"
        );
        assert!(!whole_elf(&ok[..40]), "shorter than the header");
        let mut elf32 = ok.clone();
        elf32[4] = 1;
        assert!(!whole_elf(&elf32), "a 32-bit ELF is no cubin");
        assert!(
            !whole_elf(&header(64, (u64::MAX, 56, 2), (0, 0, 0))),
            "an offset that overflows"
        );
    }
}
