//! The NCCL C ABI (feature `capi`): the header against the Rust definitions (and against
//! NVIDIA's header when a copy is at hand) and the exports of `libnccl.so.2`. The C programs
//! run as processes are in `capi_programs.rs`, the entry points called in-process in
//! `capi_inprocess.rs`.
//!
//! Run with `cargo test -p ferroccl --features capi --test capi`. The shared library comes
//! from `FERROCCL_CAPI_LIB_DIR` (where `scripts/build-capi.sh` put it) or is built by this
//! test into `<target>/capi-cdylib`. NVIDIA's header is looked for in
//! `FERROCCL_NVIDIA_NCCL_INCLUDE`, then `/tmp/ncclwheel/nvidia/nccl/include` (from
//! `pip download --no-deps nvidia-nccl-cu12`, unzipped).
#![cfg(feature = "capi")]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use common::capi::{gcc, lib_dir, nvidia_flags, nvidia_include, our_include, ROOT};
use ferroccl::capi::*;

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
