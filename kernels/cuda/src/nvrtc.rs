//! NVRTC, NVIDIA's run-time CUDA compiler, loaded at run time: compiles the kernel sources for
//! one architecture into a cubin. Needs no GPU and no driver.
//!
//! Where it is searched: the colon-separated paths of `FERROCCL_NVRTC_LIBS` (what
//! `scripts/nvrtc-env.sh` prints), else `libnvrtc.so.13`, `libnvrtc.so.12` and `libnvrtc.so` on
//! the loader's path.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr;

use crate::dl::Library;
use crate::error::{CudaError, CudaErrorKind, Result};

type Program = *mut c_void;
type Status = c_int;

/// The environment variable listing NVRTC libraries to use (colon separated paths).
pub const NVRTC_LIBS_ENV: &str = "FERROCCL_NVRTC_LIBS";

/// Library names tried when [`NVRTC_LIBS_ENV`] is unset.
pub const DEFAULT_NAMES: [&str; 3] = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

/// The NVRTC options every kernel is compiled with: no contraction of a multiply and an add
/// into one rounding (the reference rounds twice), IEEE division and denormals.
pub const OPTIONS: [&str; 4] = [
    "--fmad=false",
    "--prec-div=true",
    "--ftz=false",
    "--std=c++11",
];

/// What a compile produces.
#[derive(Debug, Clone, Copy)]
enum Output {
    /// Machine code for one architecture (`sm_XX`).
    Cubin,
    /// PTX for a virtual architecture (`compute_XX`), compiled by the driver at load.
    Ptx,
}

/// One NVRTC library.
#[derive(Debug)]
pub struct Nvrtc {
    lib: Library,
    version: (i32, i32),
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> Status,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> Status,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    log: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    cubin_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    cubin: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    ptx_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    ptx: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    destroy: unsafe extern "C" fn(*mut Program) -> Status,
    error_string: unsafe extern "C" fn(Status) -> *const c_char,
}

/// The NVRTC libraries named by [`NVRTC_LIBS_ENV`], or the default names (one entry listing them).
pub fn candidates() -> Vec<Vec<String>> {
    match std::env::var(NVRTC_LIBS_ENV) {
        Ok(v) if !v.trim().is_empty() => v
            .split(':')
            .filter(|s| !s.is_empty())
            .map(|s| vec![s.to_string()])
            .collect(),
        _ => vec![DEFAULT_NAMES.iter().map(|s| s.to_string()).collect()],
    }
}

fn missing(searched: &[String], why: &str) -> CudaError {
    CudaError::new(
        CudaErrorKind::NvrtcMissing,
        format!(
            "CUDA kernels need NVRTC ({} not found: {why}); install it with scripts/nvrtc-env.sh \
             and set {NVRTC_LIBS_ENV}, or put libnvrtc on LD_LIBRARY_PATH",
            searched.join(", ")
        ),
    )
}

impl Nvrtc {
    /// The first library of `names` that loads.
    pub fn load(names: &[String]) -> Result<Nvrtc> {
        let lib = Library::open(names).map_err(|why| missing(names, &why))?;
        let sym_err = |e: String| missing(names, &e);
        // SAFETY: each type below is the C signature of the NVRTC function of that name
        // (nvrtc.h, unchanged from CUDA 11 to 13).
        let n = unsafe {
            let version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> Status =
                lib.function("nvrtcVersion").map_err(sym_err)?;
            let mut v = (0, 0);
            version(&mut v.0, &mut v.1);
            Nvrtc {
                version: v,
                create: lib.function("nvrtcCreateProgram").map_err(sym_err)?,
                compile: lib.function("nvrtcCompileProgram").map_err(sym_err)?,
                log_size: lib.function("nvrtcGetProgramLogSize").map_err(sym_err)?,
                log: lib.function("nvrtcGetProgramLog").map_err(sym_err)?,
                cubin_size: lib.function("nvrtcGetCUBINSize").map_err(sym_err)?,
                cubin: lib.function("nvrtcGetCUBIN").map_err(sym_err)?,
                ptx_size: lib.function("nvrtcGetPTXSize").map_err(sym_err)?,
                ptx: lib.function("nvrtcGetPTX").map_err(sym_err)?,
                destroy: lib.function("nvrtcDestroyProgram").map_err(sym_err)?,
                error_string: lib.function("nvrtcGetErrorString").map_err(sym_err)?,
                lib,
            }
        };
        Ok(n)
    }

    /// The first library found the default way (see the module docs).
    pub fn load_default() -> Result<Nvrtc> {
        let mut last = None;
        for names in candidates() {
            match Nvrtc::load(&names) {
                Ok(n) => return Ok(n),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| missing(&[], "nothing to search")))
    }

    /// Where it was loaded from.
    pub fn path(&self) -> &str {
        &self.lib.name
    }

    /// NVRTC's version (major, minor): 12.x or 13.x.
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    /// Whether this NVRTC can target compute capability `arch` (`70` for sm_70): CUDA 13
    /// dropped everything before sm_75.
    pub fn supports(&self, arch: u32) -> bool {
        !(self.version.0 >= 13 && arch < 75)
    }

    fn status(&self, call: &str, s: Status) -> Result<()> {
        if s == 0 {
            return Ok(());
        }
        // SAFETY: nvrtcGetErrorString returns a static NUL-terminated string for any status.
        let msg = unsafe { CStr::from_ptr((self.error_string)(s)) }.to_string_lossy();
        Err(CudaError::new(
            CudaErrorKind::Compile,
            format!("{call} failed: {msg} ({s})"),
        ))
    }

    /// Compiles `source` (named `name`, with `headers` as `(include name, text)`) for sm_`arch`
    /// into a cubin. A compile error returns NVRTC's log; warnings are returned beside the cubin.
    pub fn compile(
        &self,
        name: &str,
        source: &str,
        headers: &[(&str, &str)],
        arch: u32,
    ) -> Result<(Vec<u8>, String)> {
        self.compile_to(name, source, headers, arch, Output::Cubin)
    }

    /// Compiles like [`Nvrtc::compile`] into PTX for compute_`arch` (NUL-terminated text), which
    /// the driver compiles for any newer GPU when it loads it.
    pub fn compile_ptx(
        &self,
        name: &str,
        source: &str,
        headers: &[(&str, &str)],
        arch: u32,
    ) -> Result<(Vec<u8>, String)> {
        self.compile_to(name, source, headers, arch, Output::Ptx)
    }

    fn compile_to(
        &self,
        name: &str,
        source: &str,
        headers: &[(&str, &str)],
        arch: u32,
        output: Output,
    ) -> Result<(Vec<u8>, String)> {
        let cstr = |s: &str| {
            CString::new(s).map_err(|_| {
                CudaError::new(CudaErrorKind::Invalid, format!("{s:.40}: holds a NUL byte"))
            })
        };
        let src = cstr(source)?;
        let cname = cstr(name)?;
        let htext = headers
            .iter()
            .map(|(_, t)| cstr(t))
            .collect::<Result<Vec<_>>>()?;
        let hname = headers
            .iter()
            .map(|(n, _)| cstr(n))
            .collect::<Result<Vec<_>>>()?;
        let htext_p: Vec<*const c_char> = htext.iter().map(|c| c.as_ptr()).collect();
        let hname_p: Vec<*const c_char> = hname.iter().map(|c| c.as_ptr()).collect();
        let target = match output {
            Output::Cubin => format!("sm_{arch}"),
            Output::Ptx => format!("compute_{arch}"),
        };
        let mut opts = vec![cstr(&format!("--gpu-architecture={target}"))?];
        for o in OPTIONS {
            opts.push(cstr(o)?);
        }
        let opts_p: Vec<*const c_char> = opts.iter().map(|c| c.as_ptr()).collect();

        let mut prog: Program = ptr::null_mut();
        // SAFETY: every pointer is a live NUL-terminated string (owned above, alive until the
        // end of this function); the header arrays have `headers.len()` entries each.
        let s = unsafe {
            (self.create)(
                &mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                headers.len() as c_int,
                htext_p.as_ptr(),
                hname_p.as_ptr(),
            )
        };
        self.status("nvrtcCreateProgram", s)?;
        // SAFETY: `prog` was created above; the options array holds `opts_p.len()` live strings.
        let compiled = unsafe { (self.compile)(prog, opts_p.len() as c_int, opts_p.as_ptr()) };
        let log = self.program_log(prog);
        let result = if compiled != 0 {
            Err(CudaError::new(
                CudaErrorKind::Compile,
                format!(
                    "NVRTC {}.{} ({}) could not compile {name} for {target}:\n{log}",
                    self.version.0,
                    self.version.1,
                    self.path()
                ),
            ))
        } else {
            self.program_output(prog, output).map(|c| (c, log))
        };
        // SAFETY: `prog` is live and destroyed once.
        unsafe { (self.destroy)(&mut prog) };
        result
    }

    fn program_log(&self, prog: Program) -> String {
        let mut n = 0usize;
        // SAFETY: `prog` is live; `n` is a valid out-pointer.
        if unsafe { (self.log_size)(prog, &mut n) } != 0 || n == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; n];
        // SAFETY: `buf` holds the `n` bytes NVRTC said the log needs (with its NUL).
        if unsafe { (self.log)(prog, buf.as_mut_ptr().cast()) } != 0 {
            return String::new();
        }
        String::from_utf8_lossy(&buf)
            .trim_end_matches('\0')
            .trim()
            .to_string()
    }

    fn program_output(&self, prog: Program, output: Output) -> Result<Vec<u8>> {
        let (size_fn, get_fn, what) = match output {
            Output::Cubin => (self.cubin_size, self.cubin, "nvrtcGetCUBIN"),
            Output::Ptx => (self.ptx_size, self.ptx, "nvrtcGetPTX"),
        };
        let mut n = 0usize;
        // SAFETY: `prog` is live and compiled; `n` is a valid out-pointer.
        self.status(what, unsafe { size_fn(prog, &mut n) })?;
        let mut buf = vec![0u8; n];
        // SAFETY: `buf` holds the `n` bytes NVRTC said the output needs (PTX: with its NUL).
        self.status(what, unsafe { get_fn(prog, buf.as_mut_ptr().cast()) })?;
        Ok(buf)
    }
}

/// Compiles the reduction kernels (`ferro_reduce.cu` with `ferro_reduce.h`) for sm_`arch`.
pub fn compile_reduce_kernels(nvrtc: &Nvrtc, arch: u32) -> Result<(Vec<u8>, String)> {
    nvrtc.compile(
        "ferro_reduce.cu",
        crate::KERNEL_SOURCE,
        &[("ferro_reduce.h", crate::KERNEL_HEADER)],
        arch,
    )
}

/// Compiles the reduction kernels into PTX for compute_`arch` (see [`Nvrtc::compile_ptx`]).
pub fn compile_reduce_kernels_ptx(nvrtc: &Nvrtc, arch: u32) -> Result<(Vec<u8>, String)> {
    nvrtc.compile_ptx(
        "ferro_reduce.cu",
        crate::KERNEL_SOURCE,
        &[("ferro_reduce.h", crate::KERNEL_HEADER)],
        arch,
    )
}
