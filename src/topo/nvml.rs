//! NVML loaded at run time (`dlopen` of `libnvidia-ml.so.1`): each GPU's compute capability
//! and its active NVLinks with their remote ends, to complete what sysfs detection found.
//! Nothing links against NVML at build time; a missing library or driver is an error that
//! detection ignores (the topology is then PCI only), never a panic.
//!
//! [`complete`] is pure: it adds what [`query`] returned to a detected tree, so its logic is
//! tested without a GPU.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};

use super::xml::Elem;

/// Most NVLinks per GPU NVML reports (`NVML_NVLINK_MAX_LINKS`).
const MAX_LINKS: c_uint = 18;

/// What NVML says of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuLinks {
    /// The GPU's PCI bus id (`0000:18:00.0`).
    pub busid: String,
    /// Compute capability as NCCL writes it (`90`).
    pub sm: Option<u32>,
    /// Active NVLinks grouped by remote end: (remote bus id, link count).
    pub links: Vec<(String, u32)>,
}

/// `nvmlPciInfo_t` (`busIdLegacy`, domain, bus, device, ids, `busId`).
#[repr(C)]
struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

type Device = *mut c_void;
type InitFn = unsafe extern "C" fn() -> c_int;
type ByBusFn = unsafe extern "C" fn(*const c_char, *mut Device) -> c_int;
type CapFn = unsafe extern "C" fn(Device, *mut c_int, *mut c_int) -> c_int;
type StateFn = unsafe extern "C" fn(Device, c_uint, *mut c_int) -> c_int;
type RemoteFn = unsafe extern "C" fn(Device, c_uint, *mut PciInfo) -> c_int;

/// The library names tried, in order.
const NAMES: [&str; 2] = ["libnvidia-ml.so.1", "libnvidia-ml.so"];

/// Asks NVML about the GPUs at `busids`. Fails when the library or driver is missing.
pub fn query(busids: &[String]) -> Result<Vec<GpuLinks>, String> {
    let lib = Lib::open()?;
    let init: InitFn = lib.sym("nvmlInit_v2")?;
    let by_bus: ByBusFn = lib.sym("nvmlDeviceGetHandleByPciBusId_v2")?;
    let cap: CapFn = lib.sym("nvmlDeviceGetCudaComputeCapability")?;
    let state: StateFn = lib.sym("nvmlDeviceGetNvLinkState")?;
    let remote: RemoteFn = lib.sym("nvmlDeviceGetNvLinkRemotePciInfo_v2")?;
    let shutdown: InitFn = lib.sym("nvmlShutdown")?;
    // SAFETY: `init` is NVML's `nvmlInit_v2`, which takes no arguments.
    let rc = unsafe { init() };
    if rc != 0 {
        return Err(format!(
            "nvmlInit_v2 returned {rc} (is the NVIDIA driver loaded?)"
        ));
    }
    let mut out = Vec::new();
    for busid in busids {
        let Ok(c) = CString::new(busid.as_str()) else {
            continue;
        };
        let mut dev: Device = std::ptr::null_mut();
        // SAFETY: `c` is a NUL-terminated string and `dev` a valid place for the handle.
        if unsafe { by_bus(c.as_ptr(), &mut dev) } != 0 {
            continue;
        }
        let (mut major, mut minor) = (0 as c_int, 0 as c_int);
        // SAFETY: `dev` is a handle NVML returned; both outputs are valid ints.
        let sm =
            (unsafe { cap(dev, &mut major, &mut minor) } == 0).then(|| (major * 10 + minor) as u32);
        let mut links: Vec<(String, u32)> = Vec::new();
        for link in 0..MAX_LINKS {
            let mut active: c_int = 0;
            // SAFETY: as above; NVML returns an error for a link the GPU does not have.
            if unsafe { state(dev, link, &mut active) } != 0 || active == 0 {
                continue;
            }
            // SAFETY: PciInfo is plain data for which all zero bytes are valid.
            let mut pci: PciInfo = unsafe { std::mem::zeroed() };
            // SAFETY: `pci` has the layout of `nvmlPciInfo_t`, which NVML fills.
            if unsafe { remote(dev, link, &mut pci) } != 0 {
                continue;
            }
            pci.bus_id[31] = 0;
            // SAFETY: the last byte of the array was just set to NUL.
            let raw = unsafe { CStr::from_ptr(pci.bus_id.as_ptr()) };
            let target = normalise(&raw.to_string_lossy());
            match links.iter_mut().find(|(t, _)| *t == target) {
                Some(e) => e.1 += 1,
                None => links.push((target, 1)),
            }
        }
        out.push(GpuLinks {
            busid: busid.clone(),
            sm,
            links,
        });
    }
    // SAFETY: `nvmlShutdown` takes no arguments and pairs with the successful init above.
    unsafe { shutdown() };
    Ok(out)
}

/// `00000000:18:00.0` → `0000:18:00.0`, lower case.
fn normalise(busid: &str) -> String {
    let b = busid.trim().to_ascii_lowercase();
    match b.rsplit_once(':').and_then(|(head, f)| {
        let (dom, bus) = head.rsplit_once(':')?;
        Some(format!("{:0>4}:{bus}:{f}", dom.trim_start_matches('0')))
    }) {
        Some(s) if s.len() == 12 => s,
        _ => b,
    }
}

/// Adds NVML's answers to a detected tree: each `<gpu>` found gets `sm` and one `<nvlink>`
/// per remote end (`tclass` 0x030200 when the remote end is one of the tree's GPUs, else
/// 0x068000: an NVSwitch).
pub fn complete(tree: &mut Elem, gpus: &[GpuLinks]) {
    let gpu_ids: Vec<String> = gpus.iter().map(|g| g.busid.clone()).collect();
    visit(tree, &mut |pci| {
        let Some(busid) = pci.attr("busid").map(str::to_ascii_lowercase) else {
            return;
        };
        let Some(info) = gpus.iter().find(|g| g.busid == busid) else {
            return;
        };
        let Some(gpu) = pci.children.iter_mut().find(|c| c.name == "gpu") else {
            return;
        };
        if let Some(sm) = info.sm {
            gpu.set("sm", sm.to_string());
        }
        gpu.children.retain(|c| c.name != "nvlink");
        for (target, count) in &info.links {
            let tclass = if gpu_ids.contains(target) {
                "0x030200"
            } else {
                "0x068000"
            };
            gpu.children.push(
                Elem::new("nvlink")
                    .with("target", target.as_str())
                    .with("count", count.to_string())
                    .with("tclass", tclass),
            );
        }
    });
}

fn visit(e: &mut Elem, f: &mut dyn FnMut(&mut Elem)) {
    if e.name == "pci" {
        f(e);
    }
    for c in &mut e.children {
        visit(c, f);
    }
}

/// A library opened with `dlopen`, closed on drop.
struct Lib(*mut c_void);

impl Lib {
    fn open() -> Result<Lib, String> {
        for name in NAMES {
            let Ok(c) = CString::new(name) else { continue };
            // SAFETY: `c` is a NUL-terminated file name; dlopen has no other precondition.
            let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if !h.is_null() {
                return Ok(Lib(h));
            }
        }
        Err(format!(
            "NVML not found (tried {}; check LD_LIBRARY_PATH and the NVIDIA driver)",
            NAMES.join(", ")
        ))
    }

    /// The function `name`, typed as `T` (a function pointer type matching NVML's header).
    fn sym<T: Copy>(&self, name: &str) -> Result<T, String> {
        let c = CString::new(name).map_err(|_| format!("bad symbol name {name:?}"))?;
        // SAFETY: `self.0` is a live handle from dlopen and `c` a NUL-terminated name.
        let p = unsafe { libc::dlsym(self.0, c.as_ptr()) };
        if p.is_null() {
            return Err(format!("NVML has no {name} (driver too old?)"));
        }
        if std::mem::size_of::<T>() != std::mem::size_of::<*mut c_void>() {
            return Err(format!("{name}: not a function pointer type"));
        }
        // SAFETY: `T` is a function pointer type of pointer size (checked above) whose
        // signature is NVML's for `name`; `p` is that function's address.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
    }
}

impl Drop for Lib {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from dlopen and no function of it is called after this.
        unsafe { libc::dlclose(self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_are_normalised() {
        assert_eq!(normalise("00000000:18:00.0"), "0000:18:00.0");
        assert_eq!(normalise("0000:AB:00.0"), "0000:ab:00.0");
        assert_eq!(normalise("00000001:18:00.0"), "0001:18:00.0");
    }

    #[test]
    fn without_nvml_query_is_an_error_not_a_panic() {
        // This machine has no NVIDIA driver; where one exists the answer is a list.
        match query(&["0000:18:00.0".to_string()]) {
            Err(e) => assert!(e.contains("libnvidia-ml.so.1") || e.contains("nvml"), "{e}"),
            Ok(list) => assert!(list.len() <= 1),
        }
    }

    #[test]
    fn complete_adds_sm_and_links() {
        let text = "<system><cpu numaid=\"0\"><pci busid=\"0000:01:00.0\"><gpu dev=\"0\"/></pci><pci busid=\"0000:02:00.0\"><gpu dev=\"1\"/></pci></cpu></system>";
        let mut tree = crate::topo::xml::parse(text).unwrap();
        let gpus = [
            GpuLinks {
                busid: "0000:01:00.0".into(),
                sm: Some(80),
                links: vec![("0000:02:00.0".into(), 4), ("0000:c1:00.0".into(), 2)],
            },
            GpuLinks {
                busid: "0000:02:00.0".into(),
                sm: Some(80),
                links: vec![("0000:01:00.0".into(), 4)],
            },
        ];
        complete(&mut tree, &gpus);
        let hw = crate::topo::Hardware::from_xml(tree, "test").unwrap();
        let g = hw.topo.gpus();
        assert_eq!(hw.topo.nodes[g[0]].sm, 80);
        assert_eq!(hw.paths.gbps(g[0], g[1]), 80.0);
        assert_eq!(hw.topo.count(crate::topo::model::NodeKind::NvSwitch), 1);
    }
}
