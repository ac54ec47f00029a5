//! The one 64-bit hash of the project (FNV-1a): communicator ids, host ids, store magics,
//! file names. Not a cryptographic hash; it only has to spread values that differ.

const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0100_0000_01b3;

fn feed(h: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

/// FNV-1a over `parts`, each followed by a separator byte, so that `["ab", "c"]` and
/// `["a", "bc"]` hash differently.
pub fn hash64(parts: &[&[u8]]) -> u64 {
    parts.iter().fold(OFFSET, |h, p| feed(feed(h, p), &[0xff]))
}

/// Plain FNV-1a over one byte string.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    feed(OFFSET, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        // FNV-1a of "a" is a published test vector.
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b""), OFFSET);
        assert_ne!(hash64(&[b"ab", b"c"]), hash64(&[b"a", b"bc"]));
        assert_eq!(hash64(&[b"x"]), feed(fnv1a64(b"x"), &[0xff]));
    }
}
