//! Topology: what ferroccl knows of where ranks run — which share a host, each rank's place on
//! it, the network interface to use — and the view the algorithms plan with.
//!
//! Pure code except host identity, which reads `/etc/machine-id`, the host name and the
//! network namespace.

pub use ferroccl_transport_shm::{host_description, host_id};

/// This rank's position on its host: (local rank, local nranks), from every rank's host id.
pub(crate) fn local_position(rank: usize, hosts: &[u64]) -> (usize, usize) {
    let me = hosts.get(rank).copied().unwrap_or(0);
    let local_rank = hosts[..rank.min(hosts.len())]
        .iter()
        .filter(|&&h| h == me)
        .count();
    let local_nranks = hosts.iter().filter(|&&h| h == me).count();
    (local_rank, local_nranks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_positions_follow_rank_order_per_host() {
        let hosts = [7, 9, 7, 7, 9];
        assert_eq!(local_position(0, &hosts), (0, 3));
        assert_eq!(local_position(2, &hosts), (1, 3));
        assert_eq!(local_position(3, &hosts), (2, 3));
        assert_eq!(local_position(1, &hosts), (0, 2));
        assert_eq!(local_position(4, &hosts), (1, 2));
    }
}
