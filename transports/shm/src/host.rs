//! Which ranks share a host: a hash of what makes a host a host for shared memory.

use std::os::unix::fs::MetadataExt;

/// FNV-1a over `parts`, each followed by a separator.
pub(crate) fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The nsfs inode of one of this process's namespaces (`net`, `pid`), or 0 if unreadable.
pub fn namespace_inode(kind: &str) -> u64 {
    std::fs::metadata(format!("/proc/self/ns/{kind}"))
        .map(|m| m.ino())
        .unwrap_or(0)
}

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
        Some(s) => fnv(&[b"ferroccl-host-override", s.as_bytes()]),
        None => fnv(&[b"ferroccl-host", host_description().as_bytes()]),
    }
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
        assert_ne!(namespace_inode("net"), 0);
    }

    #[test]
    fn host_id_values_are_fixed() {
        assert_eq!(host_id(Some("node7")), 0x014f_f27e_2ddc_0f90);
    }
}
