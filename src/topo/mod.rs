//! Topology: what ferroccl knows of where ranks run, and the view the algorithms plan with.
//!
//! | piece | what it is |
//! |---|---|
//! | [`host_id`] / [`host_description`] | which ranks share a host (machine id, host name, network namespace) |
//! | `local_position` | a rank's local rank and local nranks, from every rank's host id |
//! | [`iface`] | which local address other hosts can reach this one on (`FERRO_SOCKET_IFNAME`) |
//! | [`Topology`] | the host of every rank, as the hierarchical and tree algorithms see it |
//!
//! To come here, as NCCL's `graph/` has them: NUMA nodes, PCI switches, GPUs and NICs and the
//! paths between them (NVLink, PCIe, network), reading and writing NCCL's topology XML, and
//! from these the rings, trees and transport choice of a communicator.
//!
//! Host identity reads `/etc/machine-id`, the host name and the network namespace, and
//! [`iface`] lists the interfaces; everything else is pure.

mod host;
pub mod iface;
mod layout;

pub(crate) use host::local_position;
pub use host::{host_description, host_id};
pub use layout::Topology;
