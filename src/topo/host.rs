//! Host identity: which ranks share a host, as a hash of what makes a host a host for shared
//! memory (machine id, host name, network namespace).

use ferroccl_transport::hash64;
use ferroccl_transport_shm::namespace_inode;

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// What the host id is made of, as text (for logs): machine id (or boot id), host name and
/// network namespace.
pub fn host_description() -> String {
    let mut machine = read_trimmed("/etc/machine-id");
    if machine.is_empty() {
        machine = read_trimmed("/proc/sys/kernel/random/boot_id");
    }
    let hostname = read_trimmed("/proc/sys/kernel/hostname");
    format!(
        "machine {machine}, hostname {hostname}, netns {}",
        namespace_inode("net")
    )
}

/// This process's host id. Ranks with equal ids share memory; ranks in different network
/// namespaces (ferrorun `--netns`) count as different hosts. `override_id` (`FERRO_HOST_ID`)
/// replaces the detection.
pub fn host_id(override_id: Option<&str>) -> u64 {
    match override_id {
        Some(s) => hash64(&[b"ferroccl-host-override", s.as_bytes()]),
        None => hash64(&[b"ferroccl-host", host_description().as_bytes()]),
    }
}

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
    fn host_id_is_stable_and_overridable() {
        assert_eq!(host_id(None), host_id(None));
        assert_ne!(host_id(None), 0);
        assert_eq!(host_id(Some("a")), host_id(Some("a")));
        assert_ne!(host_id(Some("a")), host_id(Some("b")));
        assert_ne!(host_id(Some("a")), host_id(None));
        assert!(host_description().contains("netns "));
    }

    #[test]
    fn host_id_values_are_fixed() {
        // Computed by the hash this module used before it moved here; ids must not change.
        assert_eq!(host_id(Some("node7")), 0x014f_f27e_2ddc_0f90);
    }

    #[test]
    fn host_description_names_its_parts() {
        let d = host_description();
        assert!(d.starts_with("machine "), "{d}");
        assert!(d.contains(", hostname "), "{d}");
        assert!(
            d.ends_with(&format!("netns {}", namespace_inode("net"))),
            "{d}"
        );
    }

    #[test]
    fn local_positions_follow_rank_order_per_host() {
        let hosts = [7, 9, 7, 7, 9];
        assert_eq!(local_position(0, &hosts), (0, 3));
        assert_eq!(local_position(2, &hosts), (1, 3));
        assert_eq!(local_position(3, &hosts), (2, 3));
        assert_eq!(local_position(1, &hosts), (0, 2));
        assert_eq!(local_position(4, &hosts), (1, 2));
    }

    #[test]
    fn local_position_of_one_rank_per_host_or_one_host() {
        let spread = [1, 2, 3, 4];
        assert!((0..4).all(|r| local_position(r, &spread) == (0, 1)));
        let packed = [5; 4];
        assert!((0..4).all(|r| local_position(r, &packed) == (r, 4)));
    }

    #[test]
    fn local_position_outside_the_table_is_not_a_panic() {
        assert_eq!(local_position(0, &[]), (0, 0));
        assert_eq!(local_position(3, &[7, 9]), (0, 0));
    }
}
