//! This process's namespaces: a segment records its owner's pid namespace, so that a peer's pid
//! is only trusted (liveness, cross-memory attach, the sweep) inside the same one.

use std::os::unix::fs::MetadataExt;

/// The nsfs inode of one of this process's namespaces (`net`, `pid`), or 0 if unreadable.
pub fn namespace_inode(kind: &str) -> u64 {
    std::fs::metadata(format!("/proc/self/ns/{kind}"))
        .map(|m| m.ino())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_are_readable() {
        assert_ne!(namespace_inode("net"), 0);
        assert_ne!(namespace_inode("pid"), 0);
        assert_eq!(namespace_inode("net"), namespace_inode("net"));
        assert_eq!(namespace_inode("no-such-namespace"), 0);
    }
}
