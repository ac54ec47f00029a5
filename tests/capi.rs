//! The NCCL C ABI (feature `capi`): the header against the Rust definitions (and against
//! NVIDIA's header when a copy is at hand), the exports of `libnccl.so.2`, C programs built
//! against the header and run as 1, 2 and 3 processes, and the entry points called in-process.
//!
//! Run with `cargo test -p ferroccl --features capi --test capi`. The shared library comes
//! from `FERROCCL_CAPI_LIB_DIR` (where `scripts/build-capi.sh` put it) or is built by this
//! test into `<target>/capi-cdylib`. NVIDIA's header is looked for in
//! `FERROCCL_NVIDIA_NCCL_INCLUDE`, then `/tmp/ncclwheel/nvidia/nccl/include` (from
//! `pip download --no-deps nvidia-nccl-cu12`, unzipped).
#![cfg(feature = "capi")]
// Configs are built as C code builds them: the initializer, then field by field.
#![allow(clippy::field_reassign_with_default)]

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void, CStr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::ptr::{null, null_mut};
use std::sync::OnceLock;

use ferroccl::capi::*;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn target_dir() -> PathBuf {
    // <target>/<profile>/deps/<test binary>
    let exe = std::env::current_exe().expect("test binary path");
    exe.ancestors().nth(3).expect("target dir").to_path_buf()
}

/// The directory holding `libnccl.so.2`, building it if needed (once per test run).
fn lib_dir() -> &'static Path {
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

fn nvidia_include() -> Option<PathBuf> {
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
fn nvidia_flags(inc: &Path) -> Vec<String> {
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

fn out_dir() -> PathBuf {
    let d = target_dir().join("capi-c-tests");
    std::fs::create_dir_all(&d).expect("creating the C test dir");
    d
}

/// Compiles `tests/c/<src>` (or `<src>` from the repository root when it has a `/`) into
/// `<name>` with `flags`; links against libnccl when `link`.
fn gcc(src: &str, name: &str, flags: &[&str], link: bool) -> PathBuf {
    let exe = out_dir().join(name);
    let mut cmd = Command::new("gcc");
    cmd.args(["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O1"])
        .args(flags)
        .arg(if src.contains('/') {
            Path::new(ROOT).join(src)
        } else {
            Path::new(ROOT).join("tests/c").join(src)
        })
        .arg("-o")
        .arg(&exe);
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
    exe
}

fn our_include() -> String {
    format!("-I{ROOT}/include")
}

fn run_c(exe: &Path, args: &[&str], env: &[(&str, &str)]) {
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

fn parse_facts(text: &str) -> BTreeMap<String, i64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn rust_facts() -> BTreeMap<String, i64> {
    let c = ncclConfig_t::default();
    let mut m: BTreeMap<String, i64> = BTreeMap::new();
    let mut put = |k: &str, v: i64| {
        m.insert(k.to_string(), v);
    };
    put("sizeof(ncclUniqueId)", size_of::<ncclUniqueId>() as i64);
    put("NCCL_UNIQUE_ID_BYTES", NCCL_UNIQUE_ID_BYTES as i64);
    put("sizeof(ncclResult_t)", size_of::<ncclResult_t>() as i64);
    put("sizeof(ncclDataType_t)", size_of::<ncclDataType_t>() as i64);
    put("sizeof(ncclRedOp_t)", size_of::<ncclRedOp_t>() as i64);
    for (k, v) in [
        ("ncclSuccess", ncclSuccess),
        ("ncclUnhandledCudaError", ncclUnhandledCudaError),
        ("ncclSystemError", ncclSystemError),
        ("ncclInternalError", ncclInternalError),
        ("ncclInvalidArgument", ncclInvalidArgument),
        ("ncclInvalidUsage", ncclInvalidUsage),
        ("ncclRemoteError", ncclRemoteError),
        ("ncclInProgress", ncclInProgress),
        ("ncclTimeout", ncclTimeout),
        ("ncclInt8", ncclInt8),
        ("ncclChar", ncclChar),
        ("ncclUint8", ncclUint8),
        ("ncclInt32", ncclInt32),
        ("ncclInt", ncclInt),
        ("ncclUint32", ncclUint32),
        ("ncclInt64", ncclInt64),
        ("ncclUint64", ncclUint64),
        ("ncclFloat16", ncclFloat16),
        ("ncclHalf", ncclHalf),
        ("ncclFloat32", ncclFloat32),
        ("ncclFloat", ncclFloat),
        ("ncclFloat64", ncclFloat64),
        ("ncclDouble", ncclDouble),
        ("ncclBfloat16", ncclBfloat16),
        ("ncclFloat8e4m3", ncclFloat8e4m3),
        ("ncclFloat8e5m2", ncclFloat8e5m2),
        ("ncclNumTypes", ncclNumTypes),
        ("ncclSum", ncclSum),
        ("ncclProd", ncclProd),
        ("ncclMax", ncclMax),
        ("ncclMin", ncclMin),
        ("ncclAvg", ncclAvg),
        ("ncclNumOps", ncclNumOps),
        ("ncclMaxRedOp", ncclMaxRedOp),
        ("ncclScalarDevice", ncclScalarDevice),
        ("ncclScalarHostImmediate", ncclScalarHostImmediate),
        ("NCCL_CONFIG_UNDEF_INT", NCCL_CONFIG_UNDEF_INT),
        ("NCCL_SPLIT_NOCOLOR", NCCL_SPLIT_NOCOLOR),
    ] {
        put(k, i64::from(v));
    }
    // Element types are ferroccl's DataType discriminants.
    for d in ferroccl::DataType::ALL {
        assert_eq!(
            ferroccl::DataType::from_nccl(d as i64),
            Some(d),
            "DataType {d:?}"
        );
    }
    assert_eq!(ferroccl::DataType::Bfloat16 as i32, ncclBfloat16);
    assert_eq!(ferroccl::DataType::Float8E5M2 as i32, ncclFloat8e5m2);
    for (k, off) in [
        ("size", std::mem::offset_of!(ncclConfig_t, size)),
        ("magic", std::mem::offset_of!(ncclConfig_t, magic)),
        ("version", std::mem::offset_of!(ncclConfig_t, version)),
        ("blocking", std::mem::offset_of!(ncclConfig_t, blocking)),
        (
            "cgaClusterSize",
            std::mem::offset_of!(ncclConfig_t, cgaClusterSize),
        ),
        ("minCTAs", std::mem::offset_of!(ncclConfig_t, minCTAs)),
        ("maxCTAs", std::mem::offset_of!(ncclConfig_t, maxCTAs)),
        ("netName", std::mem::offset_of!(ncclConfig_t, netName)),
        ("splitShare", std::mem::offset_of!(ncclConfig_t, splitShare)),
        (
            "trafficClass",
            std::mem::offset_of!(ncclConfig_t, trafficClass),
        ),
        ("commName", std::mem::offset_of!(ncclConfig_t, commName)),
        (
            "collnetEnable",
            std::mem::offset_of!(ncclConfig_t, collnetEnable),
        ),
        (
            "shrinkShare",
            std::mem::offset_of!(ncclConfig_t, shrinkShare),
        ),
        (
            "nvlsHostMode",
            std::mem::offset_of!(ncclConfig_t, nvlsHostMode),
        ),
    ] {
        put(&format!("offsetof_{k}"), off as i64);
    }
    put("c.magic", i64::from(c.magic));
    put("c.blocking", i64::from(c.blocking));
    put("c.netName == NULL", i64::from(c.netName.is_null()));
    put("sizeof(ncclConfig_t)", size_of::<ncclConfig_t>() as i64);
    put("NCCL_VERSION_CODE", i64::from(NCCL_VERSION_CODE));
    put(
        "sizeof(ncclCollConfig_t)",
        size_of::<ncclCollConfig_t>() as i64,
    );
    put(
        "offsetof(ncclCollConfig_t, algSelection)",
        std::mem::offset_of!(ncclCollConfig_t, algSelection) as i64,
    );
    put(
        "offsetof(ncclCollConfig_t, userProfilerTag)",
        std::mem::offset_of!(ncclCollConfig_t, userProfilerTag) as i64,
    );
    put(
        "offsetof(ncclCollConfig_t, launchCompletionEvent)",
        std::mem::offset_of!(ncclCollConfig_t, launchCompletionEvent) as i64,
    );
    put("sizeof(ncclSimInfo_t)", size_of::<ncclSimInfo_t>() as i64);
    put(
        "offsetof(ncclSimInfo_t, estimatedTime)",
        std::mem::offset_of!(ncclSimInfo_t, estimatedTime) as i64,
    );
    put(
        "sizeof(ncclConfigExt_t)",
        size_of::<ncclConfigExt_t>() as i64,
    );
    put(
        "sizeof(ncclWaitSignalDesc_t)",
        size_of::<ncclWaitSignalDesc_t>() as i64,
    );
    put(
        "sizeof(ncclEncryptionConfig_t)",
        size_of::<ncclEncryptionConfig_t>() as i64,
    );
    put("ncclStatGpuMemTotal", i64::from(ncclStatGpuMemTotal));
    put("NCCL_SHRINK_ABORT", i64::from(NCCL_SHRINK_ABORT));
    put("NCCL_SUSPEND_MEM", i64::from(NCCL_SUSPEND_MEM));
    let cc = ncclCollConfig_t::default();
    put("cc.forceAlgSelection", i64::from(cc.forceAlgSelection));
    put("cc.magic", i64::from(cc.magic));
    put("si.magic", i64::from(ncclSimInfo_t::default().magic));
    // Only in our header.
    put("NCCL_VERSION(2, 19, 3)", 21903);
    put("c.size", c.size as i64);
    put("c.version", i64::from(c.version));
    put("c.splitShare", i64::from(c.splitShare));
    m
}

#[test]
fn header_agrees_with_rust_definitions() {
    let exe = gcc(
        "abi.c",
        "abi_ours",
        &[&our_include(), "-DFERROCCL_ABI_FULL"],
        false,
    );
    let out = Command::new(&exe).output().expect("running abi");
    let c = parse_facts(&String::from_utf8_lossy(&out.stdout));
    let rust = rust_facts();
    assert_eq!(c.len(), rust.len(), "facts printed: {c:?}");
    for (k, v) in &rust {
        assert_eq!(
            c.get(k),
            Some(v),
            "{k}: header says {:?}, Rust {v}",
            c.get(k)
        );
    }
    // C++ sees the same header.
    let out = Command::new("g++")
        .args(["-fsyntax-only", "-Wall", "-x", "c++", &our_include()])
        .arg(Path::new(ROOT).join("include/nccl.h"))
        .output()
        .expect("g++");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn header_agrees_with_nvidia_header() {
    let Some(inc) = nvidia_include() else {
        eprintln!("NVIDIA's nccl.h not found: skipping the comparison");
        return;
    };
    let flags = nvidia_flags(&inc);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let exe = gcc("abi.c", "abi_nvidia", &flags, false);
    let out = Command::new(&exe).output().expect("running abi");
    let nvidia = parse_facts(&String::from_utf8_lossy(&out.stdout));
    let rust = rust_facts();
    assert!(nvidia.len() > 40, "{nvidia:?}");
    for (k, v) in &nvidia {
        assert_eq!(rust.get(k), Some(v), "{k}: NVIDIA's header says {v}");
    }
    // Every function we declare is declared by NVIDIA with the same parameter types.
    let theirs = prototypes(&std::fs::read_to_string(inc.join("nccl.h")).expect("read"));
    let ours =
        prototypes(&std::fs::read_to_string(Path::new(ROOT).join("include/nccl.h")).expect("read"));
    assert!(ours.len() >= 140, "{} prototypes", ours.len());
    // ... and every function NVIDIA declares, we declare (and so export, see below).
    for name in theirs.keys() {
        assert!(
            ours.contains_key(name),
            "{name} is in NVIDIA's header but not ours"
        );
    }
    for (name, params) in &ours {
        let Some(t) = theirs.get(name) else {
            panic!("{name} is not in NVIDIA's header");
        };
        assert_eq!(params, t, "parameter types of {name}");
    }
}

/// Function name -> normalized parameter types, from a header's prototypes.
fn prototypes(header: &str) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    // Join lines and drop comments, then read `ncclResult_t name(...)` / `const char* name(...)`.
    let mut text = String::new();
    let mut in_macro = false;
    for line in header.lines() {
        // Preprocessor lines, with their continuations, declare nothing.
        if in_macro || line.trim_start().starts_with('#') {
            in_macro = line.trim_end().ends_with('\\');
            continue;
        }
        let l = line.split("//").next().unwrap_or("");
        text.push_str(l);
        text.push(' ');
    }
    while let Some(a) = text.find("/*") {
        let b = text[a..].find("*/").map_or(text.len(), |b| a + b + 2);
        text.replace_range(a..b, " ");
    }
    for stmt in text.split(';') {
        let s = stmt.trim();
        let Some(open) = s.find('(') else { continue };
        let head = &s[..open];
        let name = head
            .split_whitespace()
            .last()
            .unwrap_or("")
            .trim_start_matches('*');
        if !(name.starts_with("nccl") || name.starts_with("pnccl")) || !s.ends_with(')') {
            continue;
        }
        if !(head.contains("ncclResult_t") || head.contains("char")) {
            continue;
        }
        let params = &s[open + 1..s.len() - 1];
        let types: Vec<String> = params
            .split(',')
            .map(|p| {
                let p = p.replace('*', " * ");
                let mut words: Vec<&str> = p.split_whitespace().collect();
                // Drop the parameter name (the last word, unless it is the type itself).
                if words.len() > 1 && !matches!(*words.last().unwrap_or(&""), "*") {
                    words.pop();
                }
                words.join(" ")
            })
            .filter(|t| !t.is_empty() && t != "void")
            .collect();
        out.insert(name.to_string(), types);
    }
    out
}

#[test]
fn library_exports_every_function_with_the_nccl_soname() {
    let so = lib_dir().join("libnccl.so.2");
    let out = Command::new("readelf")
        .arg("-d")
        .arg(&so)
        .output()
        .expect("readelf");
    let dynamic = String::from_utf8_lossy(&out.stdout);
    assert!(
        dynamic.contains("Library soname: [libnccl.so.2]"),
        "SONAME missing:\n{dynamic}"
    );
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&so)
        .output()
        .expect("nm");
    let syms = String::from_utf8_lossy(&out.stdout);
    let exported: std::collections::BTreeSet<&str> = syms
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .collect();
    let header = std::fs::read_to_string(Path::new(ROOT).join("include/nccl.h")).expect("read");
    let declared = prototypes(&header);
    for name in declared.keys() {
        assert!(
            exported.contains(name.as_str()),
            "{name} is declared but not exported"
        );
    }
    for required in [
        "ncclGetVersion",
        "ncclGetUniqueId",
        "ncclCommInitRank",
        "ncclCommInitAll",
        "ncclCommInitRankConfig",
        "ncclCommSplit",
        "ncclCommFinalize",
        "ncclCommDestroy",
        "ncclCommAbort",
        "ncclCommGetAsyncError",
        "ncclCommCount",
        "ncclCommCuDevice",
        "ncclCommUserRank",
        "ncclGetErrorString",
        "ncclGetLastError",
        "ncclRedOpCreatePreMulSum",
        "ncclRedOpDestroy",
        "ncclReduce",
        "ncclBcast",
        "ncclBroadcast",
        "ncclAllReduce",
        "ncclReduceScatter",
        "ncclAllGather",
        "ncclSend",
        "ncclRecv",
        "ncclGroupStart",
        "ncclGroupEnd",
        "ncclCommRegister",
        "ncclCommDeregister",
        "ncclMemAlloc",
        "ncclMemFree",
        "ncclAlltoAll",
        "ncclGather",
        "ncclScatter",
    ] {
        assert!(exported.contains(required), "{required} not exported");
        let p = format!("p{required}");
        assert!(exported.contains(p.as_str()), "{p} not exported");
        assert!(
            declared.contains_key(required) && declared.contains_key(&p),
            "{required}"
        );
    }
}

#[test]
fn c_program_runs_every_collective_on_1_2_3_processes() {
    let exe = gcc("collectives.c", "collectives", &[&our_include()], true);
    for n in ["1", "2", "3"] {
        run_c(&exe, &[n], &[]);
    }
}

/// `tests/c/streams.c` on the host stand-in: device buffers with a non-NULL stream on 1-3
/// processes, one thread driving 3 communicators through groups, and the no-driver errors.
#[test]
fn c_program_runs_collectives_on_streams_and_device_buffers() {
    let exe = gcc("streams.c", "streams", &[&our_include()], true);
    let host = [("FERRO_DEVICE_PROVIDER", "host")];
    for n in ["1", "2", "3"] {
        run_c(&exe, &[n], &host);
    }
    run_c(&exe, &["3", "all"], &host);
    run_c(
        &exe,
        &["1", "nodriver"],
        &[
            ("FERRO_DEVICE_PROVIDER", "cuda"),
            ("FERROCCL_CUDA_DRIVER", "/nonexistent/libcuda.so.1"),
        ],
    );
    let Some(inc) = nvidia_include() else {
        eprintln!("NVIDIA's nccl.h not found: skipping the build against it");
        return;
    };
    let flags = nvidia_flags(&inc);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let exe = gcc("streams.c", "streams_nvidia", &flags, true);
    run_c(&exe, &["2"], &host);
    run_c(&exe, &["2", "all"], &host);
}

/// `tests/c/async.c` on the host stand-in: calls with a stream return at once and complete in
/// stream order; several communicators driven from one thread without a group; a failing
/// queued collective releases its stream and is reported; abort and destroy. Built against
/// our header with the CUDA runtime stub (for `cudaStreamSynchronize`), and against NVIDIA's.
#[test]
fn c_program_completes_stream_calls_in_stream_order() {
    let stub = format!("-I{ROOT}/tests/c/cuda_stub");
    let exe = gcc("async.c", "async", &[&our_include(), &stub], true);
    let host = ("FERRO_DEVICE_PROVIDER", "host");
    // A blocking call would wait for the other communicators until FERRO_TIMEOUT and fail.
    run_c(&exe, &["3", "nogroup"], &[host, ("FERRO_TIMEOUT", "5")]);
    run_c(&exe, &["2", "nogroup"], &[host, ("FERRO_TIMEOUT", "5")]);
    run_c(&exe, &["2", "mismatch"], &[host, ("FERRO_TIMEOUT", "20")]);
    run_c(&exe, &["2", "abort"], &[host, ("FERRO_TIMEOUT", "20")]);
    run_c(&exe, &["2", "destroy"], &[host, ("FERRO_TIMEOUT", "20")]);
    let Some(inc) = nvidia_include() else {
        eprintln!("NVIDIA's nccl.h not found: skipping the build against it");
        return;
    };
    let flags = nvidia_flags(&inc);
    if !flags.iter().any(|f| f.ends_with("tests/c/cuda_stub")) {
        eprintln!("real CUDA headers: async.c needs the stub's cudaStreamSynchronize; skipping");
        return;
    }
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let exe = gcc("async.c", "async_nvidia", &flags, true);
    run_c(&exe, &["3", "nogroup"], &[host, ("FERRO_TIMEOUT", "5")]);
}

#[test]
fn c_program_with_nccl_comm_id_and_init_all() {
    let exe = gcc(
        "collectives.c",
        "collectives_commid",
        &[&our_include()],
        true,
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let id = format!("127.0.0.1:{port}");
    run_c(&exe, &["3", "commid"], &[("NCCL_COMM_ID", &id)]);
    run_c(&exe, &["3", "all"], &[]);
    run_c(&exe, &["2", "mismatch"], &[]);
    run_c(&exe, &["3", "mismatch"], &[]);
    run_c(&exe, &["3", "rootmismatch"], &[]);
    run_c(&exe, &["2", "timeout"], &[("FERRO_TIMEOUT", "2")]);
}

#[test]
fn c_program_calls_every_new_function_and_shrinks_after_a_death() {
    let exe = gcc("api232.c", "api232", &[&our_include()], true);
    run_c(&exe, &["3"], &[]);
    run_c(&exe, &["4"], &[("NCCL_SHM_DISABLE", "1")]);
    let Some(inc) = nvidia_include() else {
        eprintln!("NVIDIA's nccl.h not found: skipping the build against it");
        return;
    };
    let mut flags = nvidia_flags(&inc);
    flags.push("-DNCCL_OS_LINUX".into());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let exe = gcc("api232.c", "api232_nvidia", &flags, true);
    run_c(&exe, &["3"], &[]);
}

#[test]
fn every_function_of_nvidias_header_is_exported() {
    let Some(inc) = nvidia_include() else {
        eprintln!("NVIDIA's nccl.h not found: skipping");
        return;
    };
    let theirs = prototypes(&std::fs::read_to_string(inc.join("nccl.h")).expect("read"));
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib_dir().join("libnccl.so.2"))
        .output()
        .expect("nm");
    let syms = String::from_utf8_lossy(&out.stdout);
    let exported: std::collections::BTreeSet<&str> = syms
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .collect();
    // The two functions returning void are not in `prototypes`.
    let mut names: Vec<String> = theirs.keys().cloned().collect();
    for v in ["ncclParamDumpAll", "ncclResetDebugInit"] {
        names.push(v.into());
        names.push(format!("p{v}"));
    }
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !exported.contains(n.as_str()))
        .collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");
    assert!(names.len() >= 146, "{} names", names.len());
}

#[test]
fn c_example_links_ferroccl_in_place_of_nccl() {
    let exe = gcc(
        "examples/c/allreduce.c",
        "allreduce_example",
        &[&our_include()],
        true,
    );
    run_c(&exe, &["3"], &[]);
}

#[test]
fn c_program_built_against_nvidia_header() {
    let Some(inc) = nvidia_include() else {
        eprintln!("NVIDIA's nccl.h not found: skipping");
        return;
    };
    let flags = nvidia_flags(&inc);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let exe = gcc("collectives.c", "collectives_nvidia", &flags, true);
    run_c(&exe, &["2"], &[]);
    run_c(&exe, &["3"], &[]);
    run_c(&exe, &["2", "all"], &[]);
    run_c(&exe, &["3", "mismatch"], &[]);
}

// ----- in-process calls -----

fn last_error() -> String {
    // SAFETY: ncclGetLastError returns a NUL-terminated string valid until the next failing
    // call on this thread.
    unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned()
}

fn unique_id() -> ncclUniqueId {
    let mut id = ncclUniqueId {
        internal: [0; NCCL_UNIQUE_ID_BYTES],
    };
    // SAFETY: `id` is writable.
    let rc = unsafe { ncclGetUniqueId(&mut id) };
    assert_eq!(rc, ncclSuccess, "{}", last_error());
    id
}

/// A send/receive handle for pointers crossing into test threads.
#[derive(Clone, Copy)]
struct Comm(ncclComm_t);
// SAFETY: handles are plain addresses the library looks up; any thread may pass them.
unsafe impl Send for Comm {}

fn init_threads(n: usize, blocking: bool) -> Vec<Comm> {
    let id = unique_id();
    let handles: Vec<_> = (0..n)
        .map(|r| {
            std::thread::spawn(move || {
                let mut comm = null_mut();
                let mut cfg = ncclConfig_t::default();
                cfg.blocking = c_int::from(blocking);
                // SAFETY: valid out-pointer and config.
                let rc = unsafe {
                    ncclCommInitRankConfig(&mut comm, n as c_int, id, r as c_int, &mut cfg)
                };
                if blocking {
                    assert_eq!(rc, ncclSuccess, "{}", last_error());
                } else {
                    assert_eq!(rc, ncclInProgress, "{}", last_error());
                }
                Comm(comm)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("init thread"))
        .collect()
}

fn wait_async(c: Comm) -> ncclResult_t {
    let mut state = ncclInProgress;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while state == ncclInProgress {
        assert!(std::time::Instant::now() < deadline, "still in progress");
        // SAFETY: valid handle and out-pointer.
        let rc = unsafe { ncclCommGetAsyncError(c.0, &mut state) };
        assert_eq!(rc, ncclSuccess);
        std::thread::yield_now();
    }
    state
}

#[test]
fn non_blocking_init_and_collectives_report_progress() {
    let comms = init_threads(3, false);
    for &c in &comms {
        assert_eq!(wait_async(c), ncclSuccess, "{}", last_error());
    }
    // One thread issues on all three non-blocking communicators; each runs in the background.
    let mut bufs: Vec<Vec<u64>> = (0..3)
        .map(|r| (0..50).map(|i| r * 1000 + i).collect())
        .collect();
    for (c, b) in comms.iter().zip(bufs.iter_mut()) {
        // SAFETY: `b` holds 50 u64 and lives until the operation is seen complete below.
        let rc = unsafe {
            ncclAllReduce(
                b.as_ptr().cast(),
                b.as_mut_ptr().cast(),
                50,
                ncclUint64,
                ncclSum,
                c.0,
                null_mut(),
            )
        };
        assert_eq!(rc, ncclInProgress);
    }
    for &c in &comms {
        assert_eq!(wait_async(c), ncclSuccess, "{}", last_error());
    }
    for b in &bufs {
        let want: Vec<u64> = (0..50).map(|i| 3000 + 3 * i).collect();
        assert_eq!(b, &want);
    }
    for c in comms {
        // SAFETY: a live handle, destroyed once.
        assert_eq!(unsafe { ncclCommDestroy(c.0) }, ncclSuccess);
    }
}

#[test]
fn init_rank_inside_a_group_from_one_thread() {
    let id = unique_id();
    let mut comms = [null_mut(); 3];
    // SAFETY: group calls with valid out-pointers; buffers outlive the group.
    unsafe {
        assert_eq!(ncclGroupStart(), ncclSuccess);
        for (r, c) in comms.iter_mut().enumerate() {
            assert_eq!(
                ncclCommInitRank(c, 3, id, r as c_int),
                ncclSuccess,
                "{}",
                last_error()
            );
        }
        assert_eq!(ncclGroupEnd(), ncclSuccess, "{}", last_error());
    }
    let mut data: Vec<[f32; 4]> = (0..3).map(|r| [r as f32, 1.0, -(r as f32), 0.5]).collect();
    // SAFETY: as above.
    unsafe {
        assert_eq!(ncclGroupStart(), ncclSuccess);
        for (c, d) in comms.iter().zip(data.iter_mut()) {
            let p = d.as_mut_ptr().cast::<c_void>();
            assert_eq!(
                ncclAllReduce(p, p, 4, ncclFloat, ncclMax, *c, null_mut()),
                ncclSuccess
            );
        }
        assert_eq!(ncclGroupEnd(), ncclSuccess, "{}", last_error());
    }
    for d in &data {
        assert_eq!(d, &[2.0, 1.0, 0.0, 0.5]);
    }
    for c in comms {
        // SAFETY: live handles.
        assert_eq!(unsafe { ncclCommDestroy(c) }, ncclSuccess);
    }
}

#[test]
fn failed_peer_is_a_remote_error_and_handles_are_checked() {
    let comms = init_threads(2, true);
    let (a, b) = (comms[0], comms[1]);
    // SAFETY: a live handle, aborted (and freed) once.
    assert_eq!(unsafe { ncclCommAbort(b.0) }, ncclSuccess);
    let mut buf = [1i32; 16];
    let p = buf.as_mut_ptr().cast::<c_void>();
    // SAFETY: `buf` holds 16 i32.
    let rc = unsafe { ncclAllReduce(p, p, 16, ncclInt32, ncclSum, a.0, null_mut()) };
    assert!(
        rc == ncclRemoteError || rc == ncclSystemError,
        "rc {rc}: {}",
        last_error()
    );
    let mut state = ncclSuccess;
    // SAFETY: live handle, valid out-pointer.
    let got = unsafe { ncclCommGetAsyncError(a.0, &mut state) };
    assert_eq!(got, ncclSuccess);
    assert_eq!(state, rc);
    // The aborted handle is gone: an error, not a crash. So is a made-up one.
    // SAFETY: the library never dereferences handles.
    let stale = unsafe { ncclAllReduce(p, p, 16, ncclInt32, ncclSum, b.0, null_mut()) };
    assert_eq!(stale, ncclInvalidArgument);
    assert!(
        last_error().contains("not a live communicator"),
        "{}",
        last_error()
    );
    let bogus = std::ptr::without_provenance_mut::<ncclComm>(0x1234);
    // SAFETY: as above.
    assert_eq!(unsafe { ncclCommDestroy(bogus) }, ncclInvalidArgument);
    // SAFETY: a live handle.
    assert_eq!(unsafe { ncclCommDestroy(a.0) }, ncclSuccess);
}

#[test]
fn config_is_read_by_size_and_version() {
    // NULL: defaults.
    // SAFETY: NULL and pointers to live configs of the stated size.
    unsafe {
        assert_eq!(
            read_config("t", null(), true).unwrap(),
            CommOptions { blocking: true }
        );
        let mut c = ncclConfig_t::default();
        c.blocking = 0;
        assert_eq!(
            read_config("t", &c, true).unwrap(),
            CommOptions { blocking: false }
        );
        // An older caller whose struct ends before `blocking`: the field keeps its default.
        c.size = std::mem::offset_of!(ncclConfig_t, blocking);
        assert_eq!(
            read_config("t", &c, true).unwrap(),
            CommOptions { blocking: true }
        );
        // A 2.14-era caller (no splitShare): garbage after its struct is never read.
        c = ncclConfig_t::default();
        c.size = std::mem::offset_of!(ncclConfig_t, splitShare);
        c.version = 21400;
        c.splitShare = 99;
        assert!(read_config("t", &c, true).is_ok());
        // A newer caller's larger struct: the known prefix is read.
        let mut big = [0u8; 256];
        let mut n = ncclConfig_t::default();
        n.size = big.len();
        n.blocking = 0;
        std::ptr::copy_nonoverlapping(
            (&n as *const ncclConfig_t).cast::<u8>(),
            big.as_mut_ptr(),
            size_of::<ncclConfig_t>(),
        );
        let r = read_config("t", big.as_ptr().cast(), true).unwrap();
        assert!(!r.blocking);
        // Bad magic and bad values name the field.
        c = ncclConfig_t::default();
        c.magic = 7;
        let e = read_config("ncclCommInitRankConfig", &c, true).unwrap_err();
        assert!(
            e.message().contains("magic") && e.message().contains("NCCL_CONFIG_INITIALIZER"),
            "{e}"
        );
        c = ncclConfig_t::default();
        c.blocking = 5;
        let e = read_config("t", &c, true).unwrap_err();
        assert!(e.message().contains("blocking is 5"), "{e}");
    }
}

#[test]
fn argument_errors_name_argument_and_value() {
    let comms = init_threads(1, true);
    let c = comms[0].0;
    let mut buf = [0f64; 8];
    let p = buf.as_mut_ptr().cast::<c_void>();
    // SAFETY: valid buffers and handle; bad arguments are rejected before any access.
    unsafe {
        assert_eq!(
            ncclBroadcast(p, p, 8, ncclDouble, 3, c, null_mut()),
            ncclInvalidArgument
        );
        assert!(
            last_error().contains("invalid root 3 (root must be 0..0)"),
            "{}",
            last_error()
        );
        assert_eq!(
            ncclAllReduce(p, p, usize::MAX / 2, ncclDouble, ncclSum, c, null_mut()),
            ncclInvalidArgument
        );
        assert!(last_error().contains("overflows"), "{}", last_error());
        // A non-NULL stream means device buffers: host memory is refused, or, without a
        // driver (this test does not choose the provider), the driver's error.
        let stream = std::ptr::without_provenance_mut::<c_void>(0x40);
        let r = ncclAllReduce(p, p, 8, ncclDouble, ncclSum, c, stream);
        let want = if r == ncclSystemError {
            "ncclAllReduce: device buffers need an NVIDIA driver"
        } else {
            assert_eq!(r, ncclInvalidArgument, "{}", last_error());
            "is host memory"
        };
        assert!(last_error().contains(want), "{}", last_error());
        let r = ncclSend(p, 8, ncclDouble, 0, c, stream);
        assert!(
            r == ncclSystemError || r == ncclInvalidArgument,
            "ncclSend of host memory on a stream: {r} {}",
            last_error()
        );
        assert!(last_error().starts_with("ncclSend"), "{}", last_error());
        // Overlapping buffers that are not the in-place layout.
        assert_eq!(
            ncclAllReduce(
                p,
                buf.as_mut_ptr().add(1).cast(),
                4,
                ncclDouble,
                ncclSum,
                c,
                null_mut()
            ),
            ncclInvalidArgument
        );
        assert!(last_error().contains("overlap"), "{}", last_error());
        // An error inside a group fails the group, which then runs nothing.
        assert_eq!(ncclGroupStart(), ncclSuccess);
        assert_eq!(
            ncclAllReduce(p, p, 8, 99, ncclSum, c, null_mut()),
            ncclInvalidArgument
        );
        assert_eq!(ncclGroupEnd(), ncclInvalidArgument);
        assert!(last_error().contains("data type 99"), "{}", last_error());
        // Pre-multiplied sum on one rank scales; its scalar is read at each call when
        // resident "on the device".
        let mut scalar = 2.5f64;
        let sp: *mut f64 = &mut scalar;
        let mut op = 0;
        assert_eq!(
            ncclRedOpCreatePreMulSum(&mut op, sp.cast(), ncclDouble, ncclScalarDevice, c),
            ncclSuccess
        );
        buf = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        assert_eq!(
            ncclAllReduce(p, p, 8, ncclDouble, op, c, null_mut()),
            ncclSuccess,
            "{}",
            last_error()
        );
        assert_eq!(buf, [2.5, 5.0, 7.5, 10.0, 12.5, 15.0, 17.5, 20.0]);
        sp.write(-1.0);
        assert_eq!(
            ncclAllReduce(p, p, 2, ncclDouble, op, c, null_mut()),
            ncclSuccess
        );
        assert_eq!(&buf[..2], &[-2.5, -5.0]);
        assert_eq!(
            ncclAllReduce(p, p, 2, ncclFloat, op, c, null_mut()),
            ncclInvalidArgument
        );
        assert!(
            last_error().contains("was made for data type 8"),
            "{}",
            last_error()
        );
        assert_eq!(ncclRedOpDestroy(op, c), ncclSuccess);
        assert_eq!(ncclRedOpDestroy(op, c), ncclInvalidArgument);
        assert_eq!(ncclRedOpDestroy(ncclSum, c), ncclInvalidArgument);
        // Error strings.
        let s = CStr::from_ptr(ncclGetErrorString(ncclRemoteError)).to_string_lossy();
        assert!(s.contains("remote"), "{s}");
        let s = CStr::from_ptr(ncclGetErrorString(1234)).to_string_lossy();
        assert!(s.contains("unknown"), "{s}");
        assert_eq!(ncclMemFree(p), ncclInvalidArgument);
        assert_eq!(ncclCommDestroy(c), ncclSuccess);
    }
}
