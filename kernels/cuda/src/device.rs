//! The reduction kernels on one CUDA device: compiled with NVRTC for the device's architecture
//! on first use (cached per process, and on disk: [`cache_dir`]), loaded into the device's primary context
//! and launched on a stream of their own.
//!
//! Built, not yet run on a GPU: the CPU suite checks only that every entry returns the
//! no-driver error here, and `scripts/gpu-check.sh` runs the rest on a machine with a GPU.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use ferroccl_kernels::{DataType, ElemOp};

use crate::args::{kernel_name, RcArgs};
use crate::driver::{driver, Device, DevicePtr, Driver, Handle, ATTR_SM_COUNT};
use crate::error::{CudaError, CudaErrorKind, Result};
use crate::nvrtc::{compile_reduce_kernels, Nvrtc};

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

/// The cached cubin of the reduction kernels for sm_`arch` in `dir`: its name holds a hash
/// (FNV-1a) of the kernel sources and the compile options, so a changed source never finds a
/// stale cubin.
pub fn cache_file(dir: &Path, arch: u32) -> PathBuf {
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
    dir.join(format!("reduce-{h:016x}-sm_{arch}.cubin"))
}

/// Compiles the reduction kernels for sm_`arch` with `nvrtc` and stores the cubin in `dir`
/// (written whole, then renamed, so a reader never sees half a file).
pub fn compile_into_cache(nvrtc: &Nvrtc, dir: &Path, arch: u32) -> Result<Vec<u8>> {
    let (c, _warnings) = compile_reduce_kernels(nvrtc, arch)?;
    let f = cache_file(dir, arch);
    let io = |e: std::io::Error| {
        CudaError::new(
            CudaErrorKind::Invalid,
            format!("kernel cache {}: {e}", f.display()),
        )
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let tmp = f.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, &c).map_err(io)?;
    std::fs::rename(&tmp, &f).map_err(io)?;
    Ok(c)
}

/// The cubin of the reduction kernels for sm_`arch`: from this process's cache, the disk cache,
/// or NVRTC (then stored in both; a disk cache that cannot be written only costs a compile).
pub fn reduce_cubin(arch: u32) -> Result<Arc<Vec<u8>>> {
    static CUBINS: OnceLock<Mutex<HashMap<u32, Arc<Vec<u8>>>>> = OnceLock::new();
    let cubins = CUBINS.get_or_init(Default::default);
    let mut map = cubins.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = map.get(&arch) {
        return Ok(c.clone());
    }
    let dir = cache_dir();
    let cached = dir
        .as_ref()
        .and_then(|d| std::fs::read(cache_file(d, arch)).ok())
        .filter(|c| c.starts_with(b"\x7fELF"));
    let cubin = match cached {
        Some(c) => c,
        None => {
            let nvrtc = Nvrtc::load_default()?;
            if !nvrtc.supports(arch) {
                return Err(CudaError::new(
                    CudaErrorKind::Compile,
                    format!(
                        "NVRTC {}.{} ({}) cannot target sm_{arch}; use the CUDA 12 NVRTC for this GPU",
                        nvrtc.version().0,
                        nvrtc.version().1,
                        nvrtc.path()
                    ),
                ));
            }
            match &dir {
                Some(d) => match compile_into_cache(&nvrtc, d, arch) {
                    Ok(c) => c,
                    Err(e) if e.kind() == CudaErrorKind::Invalid => {
                        compile_reduce_kernels(&nvrtc, arch)?.0
                    }
                    Err(e) => return Err(e),
                },
                None => compile_reduce_kernels(&nvrtc, arch)?.0,
            }
        }
    };
    let c = Arc::new(cubin);
    map.insert(arch, c.clone());
    Ok(c)
}

/// The reduction kernels loaded on one device, with a stream to launch them on.
#[derive(Debug)]
pub struct DeviceKernels {
    driver: &'static Driver,
    ordinal: u32,
    arch: u32,
    ctx: Handle,
    stream: Handle,
    functions: HashMap<(DataType, ElemOp), Handle>,
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
        let cubin = reduce_cubin(arch)?;
        let mut module = std::ptr::null_mut();
        // SAFETY: the context is current; `cubin` is a complete cubin image that outlives the call.
        driver.check("cuModuleLoadData", unsafe {
            (driver.module_load_data)(&mut module, cubin.as_ptr().cast())
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
            functions,
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
        self.driver.check("cuCtxSetCurrent", unsafe {
            (self.driver.ctx_set_current)(self.ctx)
        })
    }

    /// Launches the reduce-copy of `dtype` and `op` on the stream; returns when it is queued.
    ///
    /// # Safety
    /// Every address in `args` must be device memory of this device (or memory it maps),
    /// readable (sources) or writable (destinations) for `args.count` elements of `dtype`
    /// until the stream has run the kernel; a destination is one of the sources or overlaps
    /// none of them.
    pub unsafe fn reduce_copy(&self, dtype: DataType, op: ElemOp, args: &RcArgs) -> Result<()> {
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
        let f = self.functions[&(dtype, op)];
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
                self.stream,
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
