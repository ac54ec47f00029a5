//! Every transport ferroccl has, one line each: the registry the selection loop
//! ([`super::mesh`]) and `FERRO_TRANSPORTS` draw from. A new transport is its own crate plus
//! one line here.

use std::net::IpAddr;

use ferroccl_transport::Transport;
use ferroccl_transport_mem::MemTransport;
use ferroccl_transport_p2p::{P2pConfig, P2pTransport};
use ferroccl_transport_rdma::RdmaTransport;
use ferroccl_transport_shm::{ShmConfig, ShmTransport};
use ferroccl_transport_tcp::{TcpConfig, TcpTransport};

use super::config::{Config, DebugLevel};

/// What a transport is built from.
#[derive(Debug)]
pub(crate) struct Settings<'a> {
    pub config: &'a Config,
    /// The address this rank's sockets listen on.
    pub ip: IpAddr,
}

impl Settings<'_> {
    fn shm(&self) -> ShmConfig {
        let c = self.config;
        ShmConfig {
            ring_bytes: c.shm_ring_bytes,
            cma: c.shm_cma,
            cma_min: c.shm_cma_min,
            mapped_min: c.shm_mapped_min,
            dir: c.shm_dir.clone(),
            ..ShmConfig::default()
        }
    }

    fn tcp(&self) -> TcpConfig {
        TcpConfig {
            nstreams: self.config.nstreams,
            ..TcpConfig::default()
        }
    }

    /// The p2p transport's settings: its `FERRO_P2P_*` variables, the slots' device from the
    /// communicator's settings where `FERRO_P2P_DEVICE` did not name one.
    fn p2p(&self) -> std::result::Result<P2pConfig, String> {
        P2pConfig::from_env().map(|mut c| {
            c.device = c.device.or(self.config.p2p_device);
            c
        })
    }

    fn verbose(&self) -> bool {
        self.config.debug >= DebugLevel::Info
    }
}

/// A registry entry: name, whether it is tried by default, constructor.
type Entry = (&'static str, bool, fn(&Settings) -> Box<dyn Transport>);

/// The transports, in the default order of preference.
const REGISTRY: &[Entry] = &[
    ("shm", true, |s| {
        Box::new(ShmTransport::new(s.shm(), s.verbose()))
    }),
    ("tcp", true, |s| Box::new(TcpTransport::new(s.tcp(), s.ip))),
    ("mem", false, |_| Box::new(MemTransport::new())),
    // Not tried by default until the libibverbs provider has passed scripts/rdma-check.sh on
    // hardware (`FERRO_TRANSPORTS=shm,rdma,tcp` opts in); the software provider
    // (FERRO_IB_PROVIDER=soft) is test tooling, only used when named.
    ("rdma", false, |s| {
        Box::new(RdmaTransport::from_env(s.verbose()))
    }),
    // GPU peer-to-peer (CUDA IPC): opt-in (`FERRO_TRANSPORTS=p2p,shm,tcp` puts it first). Tried
    // by default, it would make stream calls block and move host buffers through device memory
    // (docs/P2P.md). `FERRO_P2P_PROVIDER=host` is test tooling, only used when named.
    ("p2p", false, |s| {
        Box::new(P2pTransport::new(s.p2p(), s.verbose()))
    }),
];

/// Other names `FERRO_TRANSPORTS` accepts.
const ALIASES: &[(&str, &str)] = &[("socket", "tcp")];

/// The names of the transports tried by default, in order.
pub(crate) fn defaults() -> Vec<String> {
    REGISTRY
        .iter()
        .filter(|e| e.1)
        .map(|e| e.0.to_string())
        .collect()
}

/// Every transport's name, in registry order.
pub(crate) fn names() -> Vec<&'static str> {
    REGISTRY.iter().map(|e| e.0).collect()
}

/// The registry name of `word` (case and aliases aside), if it names a transport.
pub(crate) fn canonical(word: &str) -> Option<&'static str> {
    let w = word.trim().to_ascii_lowercase();
    let w = ALIASES
        .iter()
        .find(|a| a.0 == w)
        .map_or(w.as_str(), |a| a.1);
    REGISTRY.iter().map(|e| e.0).find(|n| *n == w)
}

/// The transports of `names` (in that order, unknown names skipped), each with its place in
/// the registry (the order in which transports connect on every rank).
pub(crate) fn build(names: &[String], s: &Settings) -> (Vec<Box<dyn Transport>>, Vec<usize>) {
    names
        .iter()
        .filter_map(|n| REGISTRY.iter().position(|e| e.0 == n))
        .map(|i| ((REGISTRY[i].2)(s), i))
        .unzip()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_p2p_slots_go_on_the_communicators_device() {
        if std::env::var_os("FERRO_P2P_DEVICE").is_some() {
            return; // it names the device itself, over the settings
        }
        let config = Config {
            p2p_device: Some(5),
            ..Config::default()
        };
        let s = Settings {
            config: &config,
            ip: IpAddr::from([127, 0, 0, 1]),
        };
        assert_eq!(s.p2p().unwrap().device, Some(5));
        let unset = Config::default();
        let s = Settings {
            config: &unset,
            ip: IpAddr::from([127, 0, 0, 1]),
        };
        assert_eq!(s.p2p().unwrap().device, None, "the local-rank default");
    }
}
