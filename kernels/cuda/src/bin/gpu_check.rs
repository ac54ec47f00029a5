//! `ferro-gpu-check`: the reduction kernels on a real GPU against the Rust reference, and their
//! bandwidth beside a device-to-device copy. Run by `scripts/gpu-check.sh`; exits 1 on any wrong
//! element, 2 when there is no usable GPU (the reason is printed).
//!
//! Options: `--device N` (default 0), `--bw-mib M` (buffer size of the bandwidth run, default
//! 256; 0 skips it), `--iters N` (bandwidth repetitions, default 20).
//!
//! `ferro-gpu-check --build-cache DIR` runs on a machine without a GPU: it compiles the kernels
//! with NVRTC for every checked architecture into DIR, so a GPU machine without NVRTC can run
//! them (`FERROCCL_KERNEL_CACHE=DIR`), and PTX of the oldest architecture, which the driver
//! compiles at load for GPUs newer than every cubin.

use std::process::ExitCode;

use ferroccl_cuda::check::{cases, expected, same_element, values, Case, Rng, COUNTS};
use ferroccl_cuda::device::{
    cache_file, compile_into_cache, compile_ptx_into_cache, ptx_cache_file, DeviceKernels,
};
use ferroccl_cuda::driver::{driver, DevicePtr, Driver};
use ferroccl_cuda::nvrtc::Nvrtc;
use ferroccl_cuda::{CudaError, RcArgs, CHECKED_ARCHS};
use ferroccl_kernels::{DataType, ElemOp};

struct Options {
    build_cache: Option<String>,
    device: u32,
    bw_mib: usize,
    iters: u32,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        build_cache: None,
        device: 0,
        bw_mib: 256,
        iters: 20,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or(format!("{name} needs a number"))
        };
        match a.as_str() {
            "--build-cache" => {
                o.build_cache = Some(args.next().ok_or("--build-cache needs a directory")?)
            }
            "--device" => o.device = value("--device")? as u32,
            "--bw-mib" => o.bw_mib = value("--bw-mib")? as usize,
            "--iters" => o.iters = value("--iters")?.max(1) as u32,
            _ => return Err(format!("unknown option {a}")),
        }
    }
    Ok(o)
}

/// A device allocation freed on drop.
struct DevBuf<'a> {
    driver: &'a Driver,
    ptr: DevicePtr,
}

impl<'a> DevBuf<'a> {
    fn new(driver: &'a Driver, len: usize) -> Result<DevBuf<'a>, CudaError> {
        Ok(DevBuf {
            driver,
            ptr: driver.alloc(len + 32)?,
        })
    }
}

impl Drop for DevBuf<'_> {
    fn drop(&mut self) {
        // SAFETY: allocated by `new`, freed once; every use synchronised before the drop.
        let _ = unsafe { self.driver.free(self.ptr) };
    }
}

/// Runs one case on the device; returns the number of wrong elements (printing the first).
fn run_case(
    k: &DeviceKernels,
    dtype: DataType,
    case: &Case,
    count: usize,
    off: usize,
    rng: &mut Rng,
) -> Result<u64, CudaError> {
    let d = k.driver();
    let size = dtype.size();
    let len = count * size;
    let srcs: Vec<Vec<u8>> = (0..case.nsrc)
        .map(|s| values(dtype, count, s, rng))
        .collect();
    let want = expected(dtype, case, &srcs);
    let sbufs = (0..case.nsrc)
        .map(|_| DevBuf::new(d, len))
        .collect::<Result<Vec<_>, _>>()?;
    let first_dst = case.in_place;
    let dbufs = (first_dst..case.ndst)
        .map(|_| DevBuf::new(d, len))
        .collect::<Result<Vec<_>, _>>()?;
    for (b, s) in sbufs.iter().zip(&srcs) {
        // SAFETY: each allocation holds len + 32 bytes; off < 16.
        unsafe { d.upload(b.ptr + off as u64, s)? };
    }
    let src_addrs: Vec<u64> = sbufs.iter().map(|b| b.ptr + off as u64).collect();
    let mut dst_addrs = src_addrs[..first_dst].to_vec();
    dst_addrs.extend(dbufs.iter().map(|b| b.ptr + off as u64));
    let mut args = RcArgs::new(&src_addrs, &dst_addrs, count as u64);
    if case.scale_mask != 0 {
        args = args.with_scale(dtype, case.scale_mask, case.factor);
    }
    if case.divide {
        args = args.with_divide(dtype, case.nsrc as u64);
    }
    // SAFETY: every address is inside a live allocation of len + 32 bytes; destinations are
    // distinct allocations or exactly the source of their index; synchronised below before any buffer is freed.
    unsafe { k.reduce_copy(dtype, case.op, &args)? };
    k.synchronize()?;
    let mut wrong = 0u64;
    let mut got = vec![0u8; len];
    for (i, &addr) in dst_addrs.iter().enumerate() {
        // SAFETY: `addr` points at len bytes of a live allocation.
        unsafe { d.download(&mut got, addr)? };
        for e in 0..count {
            let (g, w) = (&got[e * size..][..size], &want[e * size..][..size]);
            if !same_element(dtype, case, g, w) {
                if wrong == 0 {
                    println!(
                        "WRONG {dtype} {case:?} count {count} offset {off} destination {i} \
                         element {e}: got {g:02x?}, want {w:02x?}"
                    );
                }
                wrong += 1;
            }
        }
    }
    Ok(wrong)
}

fn correctness(k: &DeviceKernels) -> Result<u64, CudaError> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut wrong = 0;
    let mut runs = 0;
    for dtype in DataType::ALL {
        let mut dtype_wrong = 0;
        for case in cases() {
            for &count in COUNTS.iter().chain([(1 << 20) + 3].iter()) {
                for off in [0, dtype.size() % 16, 1] {
                    dtype_wrong += run_case(k, dtype, &case, count, off, &mut rng)?;
                    runs += 1;
                }
            }
        }
        println!(
            "# kernels {dtype:>8}: {} ({} cases x {} counts x 3 offsets)",
            if dtype_wrong == 0 {
                "ok".to_string()
            } else {
                format!("{dtype_wrong} WRONG elements")
            },
            cases().len(),
            COUNTS.len() + 1
        );
        wrong += dtype_wrong;
    }
    println!("# kernels: {runs} runs, {wrong} wrong elements");
    Ok(wrong)
}

/// GB/s of `bytes` moved per iteration over `ms` for `iters` iterations.
fn gbps(bytes: usize, iters: u32, ms: f32) -> f64 {
    bytes as f64 * f64::from(iters) / (f64::from(ms) * 1e-3) / 1e9
}

fn bandwidth(k: &DeviceKernels, mib: usize, iters: u32) -> Result<(), CudaError> {
    let d = k.driver();
    let len = mib << 20;
    let (a, b, c) = (
        DevBuf::new(d, len)?,
        DevBuf::new(d, len)?,
        DevBuf::new(d, len)?,
    );
    let copy = |_: ()| -> Result<(), CudaError> {
        for _ in 0..iters {
            // SAFETY: distinct live allocations of len bytes; synchronised by the timing.
            unsafe { k.copy(c.ptr, a.ptr, len)? };
        }
        Ok(())
    };
    copy(())?; // warm-up
    k.synchronize()?;
    let ms = k.time(|| copy(()))?;
    let copy_rate = gbps(2 * len, iters, ms);
    println!("# bandwidth {mib} MiB: device-to-device copy {copy_rate:.1} GB/s (read + written)");
    for dtype in [DataType::Float32, DataType::Bfloat16] {
        let args = RcArgs::new(&[a.ptr, b.ptr], &[c.ptr], (len / dtype.size()) as u64);
        let run = || -> Result<(), CudaError> {
            for _ in 0..iters {
                // SAFETY: three live allocations of len bytes; synchronised by the timing.
                unsafe { k.reduce_copy(dtype, ElemOp::Sum, &args)? };
            }
            Ok(())
        };
        run()?;
        k.synchronize()?;
        let ms = k.time(run)?;
        let rate = gbps(3 * len, iters, ms);
        println!(
            "# bandwidth {mib} MiB: {dtype} dst = a + b {rate:.1} GB/s (read + written), {:.0} % of copy (target >= 90 %)",
            100.0 * rate / copy_rate
        );
    }
    Ok(())
}

/// Compiles the kernels for every checked architecture into `dir` (no GPU needed).
fn build_cache(dir: &std::path::Path) -> ExitCode {
    let nvrtc = match Nvrtc::load_default() {
        Ok(n) => n,
        Err(e) => {
            eprintln!("ferro-gpu-check: {e}");
            return ExitCode::from(2);
        }
    };
    for arch in CHECKED_ARCHS {
        match compile_into_cache(&nvrtc, dir, arch) {
            Ok(c) => println!(
                "# compiled sm_{arch} with NVRTC {}.{}: {} ({} KiB)",
                nvrtc.version().0,
                nvrtc.version().1,
                cache_file(dir, arch).display(),
                c.len() / 1024
            ),
            Err(e) => {
                eprintln!("ferro-gpu-check: {e}");
                return ExitCode::from(1);
            }
        }
    }
    // PTX of the oldest architecture this NVRTC targets, for GPUs newer than every cubin.
    let ptx_arch = if nvrtc.supports(70) { 70 } else { 75 };
    match compile_ptx_into_cache(&nvrtc, dir, ptx_arch) {
        Ok(p) => println!(
            "# compiled compute_{ptx_arch} PTX: {} ({} KiB)",
            ptx_cache_file(dir, ptx_arch).display(),
            p.len() / 1024
        ),
        Err(e) => {
            eprintln!("ferro-gpu-check: {e}");
            return ExitCode::from(1);
        }
    }
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    let o = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("ferro-gpu-check: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(dir) = &o.build_cache {
        return build_cache(std::path::Path::new(dir));
    }
    let run = || -> Result<u64, CudaError> {
        let d = driver()?;
        let dev = d.device(o.device)?;
        println!(
            "# device {}: {} (sm_{}), driver CUDA {}, libcuda {}",
            o.device,
            d.name(dev)?,
            d.arch(dev)?,
            d.version()?,
            d.path()
        );
        let k = DeviceKernels::new(o.device)?;
        let wrong = correctness(&k)?;
        if o.bw_mib > 0 {
            bandwidth(&k, o.bw_mib, o.iters)?;
        }
        Ok(wrong)
    };
    match run() {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(1),
        Err(e) => {
            eprintln!("ferro-gpu-check: {e}");
            ExitCode::from(2)
        }
    }
}
