//! Topology: what ferroccl knows of where ranks run and of the hardware under them.
//!
//! | piece | what it is |
//! |---|---|
//! | [`host_id`] / [`host_description`] | which ranks share a host (machine id, host name, network namespace) |
//! | `local_position` | a rank's local rank and local nranks, from every rank's host id |
//! | [`iface`] | which local address other hosts can reach this one on (`FERRO_SOCKET_IFNAME`) |
//! | [`Topology`] | the host of every rank, as the hierarchical and tree algorithms see it |
//! | [`xml`] | NCCL's topology XML, read (with line-numbered errors) and written |
//! | [`model`] | CPUs, PCI switches, GPUs, NICs, NVSwitch and their links, from that tree |
//! | [`paths`] | the best path between any two nodes: NCCL's path type and bottleneck bandwidth |
//! | [`search`] | rings and trees per channel that follow the hardware, each GPU's nearest NIC |
//! | [`sysfs`] | detection from `/sys` (or any root, for tests) |
//! | [`merge`] | a partial topology file completed with what detection found |
//! | [`nvml`] | NVLink state and compute capability from NVML, loaded at run time when present |
//! | [`tune`] | the tuner's link table from the channels and NICs found |
//! | [`Hardware`] | all of it for one host: load, detect, dump, search, `nvidia-smi topo -m` matrix |
//!
//! ```
//! use ferroccl::topo::Hardware;
//!
//! let text = r#"<system version="1">
//!   <cpu numaid="0" vendor="GenuineIntel" familyid="6" modelid="143">
//!     <pci busid="0000:01:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
//!       <gpu dev="0" sm="80"><nvlink target="0000:02:00.0" count="4" tclass="0x030200"/></gpu>
//!     </pci>
//!     <pci busid="0000:02:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
//!       <gpu dev="1" sm="80"><nvlink target="0000:01:00.0" count="4" tclass="0x030200"/></gpu>
//!     </pci>
//!   </cpu>
//! </system>"#;
//! let hw = Hardware::parse(text, "example").unwrap();
//! let s = hw.search();
//! assert_eq!(s.channels[0].ring, vec![0, 1]);
//! assert!(hw.matrix().contains("NV4"));
//! ```
//!
//! Host identity reads `/etc/machine-id`, the host name and the network namespace, [`iface`]
//! lists the interfaces, [`sysfs`] reads `/sys` and [`nvml`] (the one module with `unsafe`:
//! `dlopen` and NVML calls) asks the driver; everything else is pure.

mod hardware;
mod host;
pub mod iface;
mod layout;
pub mod merge;
pub mod model;
pub mod nvml;
pub mod paths;
pub mod search;
pub mod sysfs;
pub mod tune;
pub mod xml;

pub(crate) use hardware::at_init;
pub use hardware::Hardware;
pub(crate) use host::local_position;
pub use host::{host_description, host_id};
pub use layout::Topology;
