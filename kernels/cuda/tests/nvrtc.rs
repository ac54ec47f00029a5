//! Every kernel source compiles with NVRTC for sm_70, sm_80, sm_86, sm_89 and sm_90, with each
//! NVRTC library installed (CUDA 12 and CUDA 13 from PyPI's wheels, see
//! `scripts/nvrtc-env.sh`), and every kernel is in the result. Compile only: no GPU, no driver.
//!
//! Without NVRTC the test fails when `FERROCCL_REQUIRE_NVRTC=1` or `CI` is set (as
//! `scripts/test.sh` does); elsewhere it says what to install and passes.

use ferroccl_cuda::nvrtc::{candidates, compile_reduce_kernels, Nvrtc, NVRTC_LIBS_ENV};
use ferroccl_cuda::{kernel_name, CudaErrorKind, CHECKED_ARCHS};
use ferroccl_kernels::{DataType, ElemOp};

fn required() -> bool {
    std::env::var("FERROCCL_REQUIRE_NVRTC").is_ok_and(|v| v == "1")
        || std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// The NVRTC libraries to check; None (after saying why) when there are none and none are required.
fn libraries() -> Option<Vec<Nvrtc>> {
    let mut found = Vec::new();
    let mut why = Vec::new();
    for names in candidates() {
        match Nvrtc::load(&names) {
            Ok(n) => found.push(n),
            Err(e) => why.push(e.to_string()),
        }
    }
    if !why.is_empty() && required() {
        panic!(
            "NVRTC is required here and missing: {}\n(run `eval \"$(scripts/nvrtc-env.sh)\"`, \
             which installs PyPI's NVRTC wheels and sets {NVRTC_LIBS_ENV})",
            why.join("\n")
        );
    }
    if found.is_empty() {
        eprintln!(
            "NVRTC COMPILE CHECK NOT RUN: no NVRTC library ({}).\nRun `eval \"$(scripts/nvrtc-env.sh)\"` \
             to install it (PyPI wheels, no GPU needed); CI requires it.",
            why.join("; ")
        );
        return None;
    }
    Some(found)
}

#[test]
fn every_kernel_compiles_for_every_checked_arch() {
    let Some(libs) = libraries() else { return };
    let majors: Vec<i32> = libs.iter().map(|n| n.version().0).collect();
    if required() {
        assert!(
            majors.contains(&12) && majors.contains(&13),
            "CUDA 12 and 13 NVRTC are both required, found {majors:?}"
        );
    }
    let jobs: Vec<(&Nvrtc, u32)> = libs
        .iter()
        .flat_map(|n| CHECKED_ARCHS.iter().map(move |&a| (n, a)))
        .collect();
    // Two compiles at a time: each takes seconds and the machines that run this have few cores.
    let results: Vec<_> = jobs
        .chunks(2)
        .flat_map(|pair| {
            std::thread::scope(|s| {
                let hs: Vec<_> = pair
                    .iter()
                    .map(|&(n, arch)| s.spawn(move || (n, arch, compile_reduce_kernels(n, arch))))
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for arch in CHECKED_ARCHS {
        assert!(
            results
                .iter()
                .any(|(n, a, r)| *a == arch && n.supports(arch) && r.is_ok()),
            "no NVRTC compiled the kernels for sm_{arch}"
        );
    }
    for (n, arch, r) in results {
        let v = n.version();
        if !n.supports(arch) {
            // CUDA 13 dropped sm_70: the compile must fail with NVRTC's reason, not succeed oddly.
            let e = r.expect_err("NVRTC 13 compiled for sm_70, which it no longer supports");
            assert_eq!(e.kind(), CudaErrorKind::Compile);
            eprintln!(
                "NVRTC {}.{}: sm_{arch} not supported (as expected)",
                v.0, v.1
            );
            continue;
        }
        let (cubin, log) = r.unwrap_or_else(|e| panic!("{e}"));
        assert!(
            ferroccl_cuda::device::is_whole_cubin(&cubin),
            "NVRTC {v:?} sm_{arch}: not a whole ELF cubin (what the disk cache accepts)"
        );
        for dtype in DataType::ALL {
            for op in ElemOp::ALL {
                let name = kernel_name(dtype, op);
                assert!(
                    cubin
                        .windows(name.len() + 1)
                        .any(|w| w[..name.len()] == *name.as_bytes() && w[name.len()] == 0),
                    "NVRTC {v:?} sm_{arch}: kernel {name} missing from the cubin"
                );
            }
        }
        eprintln!(
            "NVRTC {}.{} ({}): sm_{arch} ok, {} KiB{}",
            v.0,
            v.1,
            n.path(),
            cubin.len() / 1024,
            if log.is_empty() {
                String::new()
            } else {
                format!(", log: {log}")
            }
        );
    }
}

#[test]
fn a_compile_error_is_reported_with_the_log() {
    let Some(libs) = libraries() else { return };
    for n in &libs {
        let e = n
            .compile(
                "broken.cu",
                "extern \"C\" __global__ void k() { undefined_name(); }",
                &[],
                80,
            )
            .expect_err("a broken kernel compiled");
        assert_eq!(e.kind(), CudaErrorKind::Compile);
        assert!(e.message().contains("undefined_name"), "{e}");
        assert!(e.message().contains("sm_80"), "{e}");
    }
}
