//! ferroccl's RDMA transport (InfiniBand / RoCE), after NCCL's IB transport (`net_ib`).
//!
//! | item | what it is |
//! |---|---|
//! | [`RdmaTransport`] | setup: queue pairs per peer, their numbers and keys in the connect handle |
//! | [`RdmaConnection`] | one peer pair: headers, clear-to-send FIFO, striped RDMA writes with immediates |
//! | [`Verbs`] | the few verbs calls the protocol makes; two providers |
//! | [`SoftDevice`] | the software provider: **test tooling**, in-process and across processes of one host |
//! | [`real`] | the libibverbs provider, loaded at run time (not yet run on hardware) |
//! | [`RdmaConfig`] | `FERRO_IB_*` settings; [`HcaFilter`] parses `FERRO_IB_HCA` |
//!
//! The protocol is in [`RdmaConnection`]'s module docs and `docs/RDMA.md`. The software
//! provider is never chosen automatically: `FERRO_IB_PROVIDER=soft` selects it, and logs and
//! connection descriptions name it as test tooling.
//!
//! # Example
//!
//! 1. A connected pair over the software provider, one message each way:
//!
//! ```
//! use ferroccl_transport::{Connection, Header, Payload, PayloadMut, Progress};
//! use ferroccl_transport_rdma::{soft_pair, RdmaConfig};
//!
//! let (mut a, mut b) = soft_pair(0, 1, &RdmaConfig::default()).unwrap();
//! let msg = vec![7u8; 100_000];
//! let h = Header { len: msg.len() as u64, ..Header::default() };
//! let (mut sp, mut rp) = (Progress::default(), Progress::default());
//! let (mut rh, mut got) = (Header::default(), vec![0u8; msg.len()]);
//! let (mut sent, mut recvd) = (false, false);
//! while !(sent && recvd) {
//!     if !sent {
//!         sent = a.send(&h, Payload::Host(&msg), &mut sp).unwrap();
//!     }
//!     if !recvd {
//!         recvd = b.recv(&mut rh, PayloadMut::Host(&mut got), &mut rp).unwrap();
//!     }
//! }
//! assert_eq!((rh, got), (h, msg));
//! ```

#![warn(missing_docs)]

mod conn;
mod ctrl;
mod hca;
mod proto;
pub mod real;
mod setup;
pub mod soft;
pub mod verbs;

pub use conn::RdmaConnection;
pub use hca::HcaFilter;
pub use setup::{soft_pair, soft_pair_on, RdmaTransport};
pub use soft::{Faults, SoftDevice};
pub use verbs::{Verbs, WcStatus};

use verbs::QpAttrs;

/// Which verbs provider runs the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// libibverbs (the default).
    Verbs,
    /// The software provider (test tooling; only when asked for).
    Soft,
}

/// Settings of the RDMA transport, each with its environment variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaConfig {
    /// `FERRO_IB_PROVIDER`: `verbs` (default) or `soft`.
    pub provider: Provider,
    /// `FERRO_IB_QPS_PER_CONN`: queue pairs per connection, 1..8 (NCCL's default is 1).
    pub qps_per_conn: usize,
    /// `FERRO_IB_HCA`: devices and ports to use or exclude (NCCL_IB_HCA syntax).
    pub hca: HcaFilter,
    /// `FERRO_IB_GID_INDEX`: the GID index (RoCE v2).
    pub gid_index: u8,
    /// `FERRO_IB_TC`: traffic class.
    pub traffic_class: u8,
    /// `FERRO_IB_SL`: service level.
    pub service_level: u8,
    /// `FERRO_IB_TIMEOUT`: ACK timeout exponent (NCCL's default 20).
    pub timeout: u8,
    /// `FERRO_IB_RETRY_CNT`: transport retries (NCCL's default 7).
    pub retry_cnt: u8,
    /// `FERRO_IB_CHUNK`: bytes of one payload write (default 512 KiB).
    pub chunk: usize,
    /// `FERRO_IB_EAGER`: largest payload sent inline with its header (default 8 KiB, at least
    /// 1 KiB: a small message must go out before its receiver looks, as on every transport).
    pub eager: usize,
    /// `FERRO_IB_KEEPALIVE_MS`: how long a waiting end stays silent before it probes the
    /// peer (default 1000 ms).
    pub keepalive_ms: u64,
    /// Send queue depth per queue pair.
    pub sq_depth: u32,
    /// Receive queue depth per queue pair.
    pub rq_depth: u32,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            provider: Provider::Soft,
            qps_per_conn: 2,
            hca: HcaFilter::default(),
            gid_index: 0,
            traffic_class: 0,
            service_level: 0,
            timeout: 20,
            retry_cnt: 7,
            chunk: 512 << 10,
            eager: 8 << 10,
            keepalive_ms: 1000,
            sq_depth: 128,
            rq_depth: 128,
        }
    }
}

fn env_num<T>(name: &str, lo: T, hi: T, default: T) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
{
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(v) => match v.trim().parse::<T>() {
            Ok(n) if n >= lo && n <= hi => Ok(n),
            _ => Err(format!("{name}={v} is not a number in {lo}..={hi}")),
        },
    }
}

impl RdmaConfig {
    /// The settings of the environment; a bad value is an error naming the variable.
    /// Without `FERRO_IB_PROVIDER` the provider is libibverbs and one queue pair per
    /// connection, as NCCL.
    pub fn from_env() -> Result<RdmaConfig, String> {
        let d = RdmaConfig::default();
        let provider = match std::env::var("FERRO_IB_PROVIDER").as_deref().map(str::trim) {
            Err(_) | Ok("") | Ok("verbs") => Provider::Verbs,
            Ok("soft") => Provider::Soft,
            Ok(other) => {
                return Err(format!(
                    "FERRO_IB_PROVIDER={other} is not a provider (verbs, or soft: the software \
                     provider for tests)"
                ))
            }
        };
        Ok(RdmaConfig {
            provider,
            qps_per_conn: env_num("FERRO_IB_QPS_PER_CONN", 1, ferroccl_transport::MAX_PARTS, 1)?,
            hca: HcaFilter::parse(&std::env::var("FERRO_IB_HCA").unwrap_or_default())?,
            gid_index: env_num("FERRO_IB_GID_INDEX", 0, 255, d.gid_index)?,
            traffic_class: env_num("FERRO_IB_TC", 0, 255, d.traffic_class)?,
            service_level: env_num("FERRO_IB_SL", 0, 15, d.service_level)?,
            timeout: env_num("FERRO_IB_TIMEOUT", 1, 31, d.timeout)?,
            retry_cnt: env_num("FERRO_IB_RETRY_CNT", 0, 7, d.retry_cnt)?,
            chunk: env_num("FERRO_IB_CHUNK", 4096, 1 << 30, d.chunk)?,
            eager: env_num("FERRO_IB_EAGER", 1024, 64 << 10, d.eager)?,
            keepalive_ms: env_num("FERRO_IB_KEEPALIVE_MS", 10, 3_600_000, d.keepalive_ms)?,
            sq_depth: d.sq_depth,
            rq_depth: d.rq_depth,
        })
    }

    fn qp_attrs(&self) -> QpAttrs {
        QpAttrs {
            max_send_wr: self.sq_depth,
            max_recv_wr: self.rq_depth,
            gid_index: self.gid_index,
            traffic_class: self.traffic_class,
            service_level: self.service_level,
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
        }
    }
}

/// Writes a log line of the transport (subsystem NET).
pub(crate) fn log(args: std::fmt::Arguments<'_>) {
    ferroccl_transport::log::write_line(format_args!(
        "ferroccl pid {} NET/rdma: {args}",
        std::process::id()
    ));
}

#[cfg(test)]
mod tests;
