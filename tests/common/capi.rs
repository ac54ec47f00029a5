//! Helpers of the C ABI tests (feature `capi`): `libnccl.so.2` built once per test binary (or
//! taken from `FERROCCL_CAPI_LIB_DIR`), NVIDIA's header when a copy is at hand, and C programs
//! compiled with gcc and run with the library on `LD_LIBRARY_PATH`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub const ROOT: &str = env!("CARGO_MANIFEST_DIR");

pub fn target_dir() -> PathBuf {
    // <target>/<profile>/deps/<test binary>
    let exe = std::env::current_exe().expect("test binary path");
    exe.ancestors().nth(3).expect("target dir").to_path_buf()
}

/// The directory holding `libnccl.so.2`, building it if needed (once per test binary).
pub fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(d) = std::env::var_os("FERROCCL_CAPI_LIB_DIR") {
            let d = PathBuf::from(d);
            assert!(d.join("libnccl.so.2").exists(), "no libnccl.so.2 in {d:?}");
            return d;
        }
        let target = target_dir().join("capi-cdylib");
        let cargo = option_env!("CARGO").unwrap_or("cargo");
        let out = Command::new(cargo)
            .current_dir(ROOT)
            .args([
                "rustc",
                "-p",
                "ferroccl",
                "--features",
                "capi",
                "--lib",
                "--crate-type",
                "cdylib",
                "--quiet",
                "--target-dir",
            ])
            .arg(&target)
            .args(["--", "-C", "link-arg=-Wl,-soname,libnccl.so.2"])
            .output()
            .expect("running cargo rustc");
        assert!(
            out.status.success(),
            "building the cdylib failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let dir = target.join("debug");
        std::fs::copy(dir.join("libferroccl.so"), dir.join("libnccl.so.2")).expect("copy .so");
        let link = dir.join("libnccl.so");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("libnccl.so.2", &link).expect("symlink libnccl.so");
        dir
    })
}

pub fn nvidia_include() -> Option<PathBuf> {
    let from_list = std::env::var("FERROCCL_NVIDIA_INCLUDES")
        .ok()
        .and_then(|l| {
            l.split(':')
                .map(PathBuf::from)
                .find(|d| d.join("nccl.h").exists())
        });
    let candidates = [
        from_list,
        std::env::var_os("FERROCCL_NVIDIA_NCCL_INCLUDE").map(PathBuf::from),
        Some(PathBuf::from("/tmp/ncclwheel/nvidia/nccl/include")),
    ];
    let found = candidates
        .into_iter()
        .flatten()
        .find(|d| d.join("nccl.h").exists());
    if found.is_none() && std::env::var_os("FERROCCL_REQUIRE_NVIDIA_HEADER").is_some() {
        panic!("NVIDIA's nccl.h is required (FERROCCL_REQUIRE_NVIDIA_HEADER) but was not found");
    }
    found
}

/// Compiler flags for NVIDIA's header: the real CUDA headers when `FERROCCL_NVIDIA_INCLUDES`
/// lists them (`scripts/nvidia-headers.sh`), else a minimal stand-in for `cuda_runtime.h`.
pub fn nvidia_flags(inc: &Path) -> Vec<String> {
    let mut flags = vec![format!("-I{}", inc.display())];
    match std::env::var("FERROCCL_NVIDIA_INCLUDES") {
        Ok(list)
            if list
                .split(':')
                .any(|d| Path::new(d).join("cuda_runtime.h").exists()) =>
        {
            flags.extend(list.split(':').map(|d| format!("-I{d}")));
        }
        _ => flags.push(format!("-I{ROOT}/tests/c/cuda_stub")),
    }
    flags
}

pub fn out_dir() -> PathBuf {
    let d = target_dir().join("capi-c-tests");
    std::fs::create_dir_all(&d).expect("creating the C test dir");
    d
}

/// Compiles `tests/c/<src>` (or `<src>` from the repository root when it has a `/`) into
/// `<name>` with `flags`; links against libnccl when `link`. The program is written under a
/// name of its own and then renamed into place: tests that build the same program run at
/// once, and one must not run it while another rewrites it ("Permission denied").
pub fn gcc(src: &str, name: &str, flags: &[&str], link: bool) -> PathBuf {
    static BUILDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let exe = out_dir().join(name);
    let k = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = out_dir().join(format!(".{name}.{}.{k}", std::process::id()));
    let mut cmd = Command::new("gcc");
    cmd.args(["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O1"])
        .args(flags)
        .arg(if src.contains('/') {
            Path::new(ROOT).join(src)
        } else {
            Path::new(ROOT).join("tests/c").join(src)
        })
        .arg("-o")
        .arg(&tmp);
    if link {
        cmd.arg("-L").arg(lib_dir()).arg("-lnccl");
    }
    let out = cmd
        .output()
        .expect("gcc must be installed for the C ABI tests");
    assert!(
        out.status.success(),
        "gcc {src} ({flags:?}) failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&tmp, &exe).expect("moving the built program into place");
    exe
}

pub fn our_include() -> String {
    format!("-I{ROOT}/include")
}

pub fn run_c(exe: &Path, args: &[&str], env: &[(&str, &str)]) {
    let out = Command::new("timeout")
        .arg("180")
        .arg(exe)
        .args(args)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("FERRO_TIMEOUT", "30")
        .envs(env.iter().copied())
        .output()
        .expect("running a C test program");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{exe:?} {args:?} failed:\n{text}");
}
