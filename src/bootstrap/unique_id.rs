//! [`UniqueId`]: 128 bytes that tell every rank where the job's store is, as NCCL's
//! `ncclUniqueId` does. The root creates it (starting the store server), sends the bytes to the
//! other ranks by any means (MPI, a file, the framework's own store) and each rank connects.
//!
//! Layout (all other bytes zero):
//!
//! | bytes | content |
//! |---|---|
//! | 0..4 | `FRID` |
//! | 4 | format version, 1 |
//! | 5 | address family: 4 or 6 |
//! | 6..8 | store port, big-endian |
//! | 8..16 | job magic, little-endian, never 0 |
//! | 16..32 | IP address (IPv4 in the first 4 bytes) |
//! | 32..36 | IPv6 scope id, little-endian |
//! | 36..40 | FNV-1a (32-bit) of bytes 0..36, little-endian |

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::time::Duration;

use super::tcp::{TcpStore, TcpStoreServer};
use crate::topo::iface::{interface_addresses, select_address, SOCKET_IFNAME_ENV};
use crate::{Error, Result};

const MARKER: [u8; 4] = *b"FRID";
const FORMAT_VERSION: u8 = 1;
const CHECKED_LEN: usize = 36;
const USED_LEN: usize = 40;

/// Where a job's store is and the job's random magic, in 128 bytes (NCCL's `ncclUniqueId`).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId {
    bytes: [u8; 128],
}

impl UniqueId {
    /// An id naming the store at `addr` with job magic `magic` (0 is replaced by 1: the
    /// store protocol reads 0 as "any job").
    pub fn new(addr: SocketAddr, magic: u64) -> UniqueId {
        let mut b = [0u8; 128];
        b[..4].copy_from_slice(&MARKER);
        b[4] = FORMAT_VERSION;
        b[6..8].copy_from_slice(&addr.port().to_be_bytes());
        b[8..16].copy_from_slice(&magic.max(1).to_le_bytes());
        match addr {
            SocketAddr::V4(a) => {
                b[5] = 4;
                b[16..20].copy_from_slice(&a.ip().octets());
            }
            SocketAddr::V6(a) => {
                b[5] = 6;
                b[16..32].copy_from_slice(&a.ip().octets());
                b[32..36].copy_from_slice(&a.scope_id().to_le_bytes());
            }
        }
        let sum = fnv1a32(&b[..CHECKED_LEN]);
        b[CHECKED_LEN..USED_LEN].copy_from_slice(&sum.to_le_bytes());
        UniqueId { bytes: b }
    }

    /// Starts a store server on `bind` and returns an id naming it, with a fresh random magic.
    ///
    /// If `bind` has an unspecified IP (`0.0.0.0`, `::`), the id carries a local address other
    /// hosts can reach, chosen by `FERRO_SOCKET_IFNAME` (see [`iface`](crate::topo::iface)). Keep
    /// the server alive until every rank has connected and the job no longer needs the store.
    pub fn create(bind: SocketAddr) -> Result<(UniqueId, TcpStoreServer)> {
        let magic = random_magic()?;
        let server = TcpStoreServer::bind_with_magic(bind, magic)?;
        let local = server.local_addr();
        let ip = if local.ip().is_unspecified() {
            let spec = std::env::var(SOCKET_IFNAME_ENV).ok();
            select_address(&interface_addresses()?, spec.as_deref(), bind.is_ipv4())
                .map_err(|e| e.context(format_args!("unique id for store bound to {bind}")))?
        } else {
            local.ip()
        };
        Ok((
            UniqueId::new(SocketAddr::new(ip, local.port()), magic),
            server,
        ))
    }

    /// Reads an id from its bytes, checking that they are one.
    pub fn from_bytes(bytes: [u8; 128]) -> Result<UniqueId> {
        let bad = |why: &str| {
            Err(Error::invalid_argument(format!(
                "unique id: {why} (bytes start {:02x?}); pass the bytes the root's \
                 UniqueId::create returned, unchanged",
                &bytes[..8]
            )))
        };
        if bytes[..4] != MARKER {
            return bad("not a ferroccl unique id");
        }
        if bytes[4] != FORMAT_VERSION {
            return bad(&format!(
                "format version {} (this ferroccl reads {FORMAT_VERSION})",
                bytes[4]
            ));
        }
        let mut sum = [0u8; 4];
        sum.copy_from_slice(&bytes[CHECKED_LEN..USED_LEN]);
        if u32::from_le_bytes(sum) != fnv1a32(&bytes[..CHECKED_LEN]) {
            return bad("checksum mismatch, the bytes were damaged");
        }
        if bytes[USED_LEN..].iter().any(|&b| b != 0) {
            return bad("reserved bytes are not zero");
        }
        let id = UniqueId { bytes };
        if !matches!(bytes[5], 4 | 6) {
            return bad(&format!("address family {}", bytes[5]));
        }
        if id.addr().port() == 0 || id.magic() == 0 {
            return bad("port or magic is 0");
        }
        Ok(id)
    }

    /// The 128 bytes.
    pub fn as_bytes(&self) -> &[u8; 128] {
        &self.bytes
    }

    /// The address of the job's store.
    pub fn addr(&self) -> SocketAddr {
        let b = &self.bytes;
        let port = u16::from_be_bytes([b[6], b[7]]);
        if b[5] == 6 {
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&b[16..32]);
            let mut scope = [0u8; 4];
            scope.copy_from_slice(&b[32..36]);
            SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(ip),
                port,
                0,
                u32::from_le_bytes(scope),
            ))
        } else {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::new(b[16], b[17], b[18], b[19])), port)
        }
    }

    /// The job's random magic; the store rejects clients presenting another (connect with
    /// [`connect`](Self::connect) to present it).
    pub fn magic(&self) -> u64 {
        let mut m = [0u8; 8];
        m.copy_from_slice(&self.bytes[8..16]);
        u64::from_le_bytes(m)
    }

    /// Connects to the store this id names, retrying until `timeout` passes.
    pub fn connect(&self, timeout: Duration) -> Result<TcpStore> {
        TcpStore::connect_with_magic(self.addr(), self.magic(), timeout)
    }
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UniqueId")
            .field("addr", &self.addr())
            .field("magic", &format_args!("{:#018x}", self.magic()))
            .finish()
    }
}

/// A random non-zero 64-bit magic from the kernel.
fn random_magic() -> Result<u64> {
    loop {
        let mut buf = [0u8; 8];
        let mut filled = 0;
        while filled < buf.len() {
            let rest = &mut buf[filled..];
            // SAFETY: `rest` is a live, writable buffer of `rest.len()` bytes.
            let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
            if n < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(Error::io("unique id: getrandom", &err));
            }
            // `n` is non-negative here and at most `rest.len()`.
            filled += n.unsigned_abs();
        }
        let magic = u64::from_le_bytes(buf);
        if magic != 0 {
            return Ok(magic);
        }
    }
}

/// 32-bit FNV-1a hash: the checksum of the `UniqueId` wire format (bytes 36..40), a field of
/// four bytes, so it is not the project's 64-bit `hash64`; changing it would change the format.
fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::Store;
    use crate::ErrorKind;

    #[test]
    fn is_128_bytes() {
        assert_eq!(std::mem::size_of::<UniqueId>(), 128);
        assert_eq!(std::mem::align_of::<UniqueId>(), 1);
    }

    #[test]
    fn round_trips_v4_and_v6() {
        let v4: SocketAddr = "10.20.30.40:29501".parse().unwrap();
        let id = UniqueId::new(v4, 0xfeed_f00d_0bad_cafe);
        let back = UniqueId::from_bytes(*id.as_bytes()).unwrap();
        assert_eq!(back, id);
        assert_eq!(back.addr(), v4);
        assert_eq!(back.magic(), 0xfeed_f00d_0bad_cafe);

        let v6 = SocketAddr::V6(SocketAddrV6::new(
            "fe80::1:2:3:4".parse().unwrap(),
            40000,
            0,
            3,
        ));
        let id = UniqueId::new(v6, 77);
        let back = UniqueId::from_bytes(*id.as_bytes()).unwrap();
        assert_eq!(back.addr(), v6);
        assert_eq!(back.magic(), 77);
        assert_eq!(UniqueId::new(v4, 0).magic(), 1);
    }

    #[test]
    fn rejects_garbage() {
        let id = UniqueId::new("10.0.0.1:1234".parse().unwrap(), 99);
        let reject = |b: [u8; 128]| {
            let e = UniqueId::from_bytes(b).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            e.message().to_owned()
        };
        assert!(reject([0u8; 128]).contains("not a ferroccl unique id"));
        let noise: [u8; 128] = std::array::from_fn(|i| (i * 37 + 11) as u8);
        reject(noise);
        let mut b = *id.as_bytes();
        b[4] = 9;
        assert!(reject(b).contains("version 9"));
        for i in [5, 6, 10, 17, 39] {
            let mut b = *id.as_bytes();
            b[i] ^= 0x40;
            assert!(reject(b).contains("checksum"), "byte {i}");
        }
        let mut b = *id.as_bytes();
        b[100] = 1;
        assert!(reject(b).contains("reserved"));
    }

    #[test]
    fn random_magics_differ() {
        let a = random_magic().unwrap();
        let b = random_magic().unwrap();
        assert_ne!(a, 0);
        assert_ne!(a, b);
    }

    #[test]
    fn create_serves_the_store_it_names() {
        let (id, server) = UniqueId::create("127.0.0.1:0".parse().unwrap()).unwrap();
        assert_eq!(id.addr(), server.local_addr());
        assert_eq!(id.magic(), server.job_magic());
        let copy = UniqueId::from_bytes(*id.as_bytes()).unwrap();
        let a = copy.connect(Duration::from_secs(5)).unwrap();
        let b = id.connect(Duration::from_secs(5)).unwrap();
        a.set("hello", b"from a").unwrap();
        assert_eq!(b.get("hello", Duration::from_secs(5)).unwrap(), b"from a");
        // A stale id of another job is turned away by the store.
        let other = UniqueId::new(id.addr(), id.magic() ^ 1);
        let e = other.connect(Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidUsage);
    }

    #[test]
    fn create_on_any_address_names_a_concrete_one() {
        let (id, server) = UniqueId::create("0.0.0.0:0".parse().unwrap()).unwrap();
        assert!(id.addr().is_ipv4());
        assert!(!id.addr().ip().is_unspecified());
        assert_eq!(id.addr().port(), server.local_addr().port());
        let s = id.connect(Duration::from_secs(5)).unwrap();
        assert_eq!(s.add("n", 4).unwrap(), 4);
    }
}
