//! Typed memory: where a buffer lives, references to it, and registered regions.
//!
//! The executor describes every buffer it hands a transport as a [`MemRef`] (space, address,
//! length). Host memory travels as a slice ([`Payload::Host`]); memory a host thread cannot
//! read (a CUDA device buffer) travels as its [`MemRef`] alone ([`Payload::Device`]), and only a
//! transport whose [`Spaces`] accept that space may be given it. Transports that move bytes
//! straight into or out of a buffer (RDMA memory regions, CUDA IPC handles) register it first:
//! [`Region`] is the handle, [`RegCache`] keeps one per buffer and connection for as long as the
//! communicator uses it.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// Where a buffer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum MemSpace {
    /// Memory of this process that the CPU reads and writes.
    #[default]
    Host,
    /// Memory of CUDA device `n` (its ordinal in this process).
    Cuda(u32),
}

impl fmt::Display for MemSpace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemSpace::Host => f.write_str("host"),
            MemSpace::Cuda(n) => write!(f, "cuda device {n}"),
        }
    }
}

/// A reference to `len` bytes at `addr` in `space`. Plain data: it grants no access by itself;
/// whoever turns it into a slice or a device pointer answers for the memory being live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MemRef {
    /// Where the bytes are.
    pub space: MemSpace,
    /// Address of the first byte.
    pub addr: usize,
    /// Length in bytes.
    pub len: usize,
}

impl MemRef {
    /// Host memory from `ptr` for `len` bytes.
    pub fn host(ptr: *const u8, len: usize) -> MemRef {
        MemRef {
            space: MemSpace::Host,
            addr: ptr as usize,
            len,
        }
    }

    /// One past the last byte.
    pub fn end(&self) -> usize {
        self.addr.saturating_add(self.len)
    }

    /// Bytes `off..off + len` of it, clamped to its end (the same space).
    pub fn sub(&self, off: usize, len: usize) -> MemRef {
        let off = off.min(self.len);
        MemRef {
            space: self.space,
            addr: self.addr + off,
            len: len.min(self.len - off),
        }
    }

    /// Whether every byte of `other` lies in `self` (same space).
    pub fn contains(&self, other: &MemRef) -> bool {
        self.space == other.space && other.addr >= self.addr && other.end() <= self.end()
    }

    /// Whether `self` and `other` share a byte (same space).
    pub fn overlaps(&self, other: &MemRef) -> bool {
        self.space == other.space && self.addr < other.end() && other.addr < self.end()
    }
}

/// The memory spaces a transport reads and writes directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Spaces {
    /// Host memory.
    pub host: bool,
    /// CUDA device memory.
    pub cuda: bool,
    /// The one CUDA device whose memory it carries, where it is tied to one (the device its
    /// receive slots live on, which a reduction straight from them runs on); `None`: any.
    pub cuda_device: Option<u32>,
}

impl Spaces {
    /// Host memory only.
    pub const HOST: Spaces = Spaces {
        host: true,
        cuda: false,
        cuda_device: None,
    };

    /// Whether `space` is one of them.
    pub fn accepts(self, space: MemSpace) -> bool {
        match space {
            MemSpace::Host => self.host,
            MemSpace::Cuda(n) => self.cuda && self.cuda_device.is_none_or(|d| d == n),
        }
    }
}

/// An outgoing message's payload.
#[derive(Debug, Clone, Copy)]
pub enum Payload<'a> {
    /// Host bytes.
    Host(&'a [u8]),
    /// Bytes in a space the CPU may not read; only for transports that accept the space.
    Device(MemRef),
}

impl<'a> Payload<'a> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Payload::Host(b) => b.len(),
            Payload::Device(m) => m.len,
        }
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where it is.
    pub fn mem(&self) -> MemRef {
        match self {
            Payload::Host(b) => MemRef::host(b.as_ptr(), b.len()),
            Payload::Device(m) => *m,
        }
    }

    /// The host bytes, or an error naming `transport` for any other space.
    pub fn host(self, transport: &str) -> crate::Result<&'a [u8]> {
        match self {
            Payload::Host(b) => Ok(b),
            Payload::Device(m) => Err(unsupported(transport, m.space)),
        }
    }
}

/// An incoming message's destination.
#[derive(Debug)]
pub enum PayloadMut<'a> {
    /// Host bytes.
    Host(&'a mut [u8]),
    /// Bytes in a space the CPU may not write; only for transports that accept the space.
    Device(MemRef),
}

impl<'a> PayloadMut<'a> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            PayloadMut::Host(b) => b.len(),
            PayloadMut::Device(m) => m.len,
        }
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where it is.
    pub fn mem(&self) -> MemRef {
        match self {
            PayloadMut::Host(b) => MemRef::host(b.as_ptr(), b.len()),
            PayloadMut::Device(m) => *m,
        }
    }

    /// The host bytes, or an error naming `transport` for any other space.
    pub fn host(self, transport: &str) -> crate::Result<&'a mut [u8]> {
        match self {
            PayloadMut::Host(b) => Ok(b),
            PayloadMut::Device(m) => Err(unsupported(transport, m.space)),
        }
    }
}

fn unsupported(transport: &str, space: MemSpace) -> crate::Error {
    crate::Error::internal(format!(
        "the {transport} transport cannot reach {space} memory (the executor must stage it \
         through host memory)"
    ))
}

/// A registered buffer: what a transport needs to move bytes into or out of it directly (an
/// RDMA memory region and its keys, a CUDA IPC handle). Cloning shares it; the transport's
/// resources (`keep`) are released when the last clone is dropped.
#[derive(Clone)]
pub struct Region {
    mem: MemRef,
    key: u64,
    keep: Arc<dyn Any + Send + Sync>,
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("mem", &self.mem)
            .field("key", &self.key)
            .finish()
    }
}

impl Region {
    /// A region over `mem` with the transport's `key` (what the peer names it by) and the
    /// resources that must live as long as it (`keep`).
    pub fn new(mem: MemRef, key: u64, keep: impl Any + Send + Sync) -> Region {
        Region {
            mem,
            key,
            keep: Arc::new(keep),
        }
    }

    /// The registered memory.
    pub fn mem(&self) -> MemRef {
        self.mem
    }

    /// The transport's key for it.
    pub fn key(&self) -> u64 {
        self.key
    }

    /// The transport's resources, if they are a `T`.
    pub fn resources<T: Any>(&self) -> Option<&T> {
        self.keep.downcast_ref::<T>()
    }

    /// Clones alive, this one included (tests of registration lifetime).
    pub fn holders(&self) -> usize {
        Arc::strong_count(&self.keep)
    }
}

/// Registered regions of one communicator, per connection, keyed by address range: a buffer
/// used call after call is registered once. Bounded: past `capacity` entries the oldest is
/// dropped (its region is released once no message uses it).
#[derive(Debug)]
pub struct RegCache {
    entries: BTreeMap<(usize, MemSpace, usize), (Region, u64)>,
    capacity: usize,
    clock: u64,
}

impl RegCache {
    /// An empty cache holding at most `capacity` regions.
    pub fn new(capacity: usize) -> RegCache {
        RegCache {
            entries: BTreeMap::new(),
            capacity: capacity.max(1),
            clock: 0,
        }
    }

    /// The region of connection `conn` that covers `mem`, if one is cached.
    pub fn get(&mut self, conn: usize, mem: &MemRef) -> Option<&Region> {
        self.clock += 1;
        let now = self.clock;
        let (_, (region, used)) = self
            .entries
            .range_mut(..=(conn, mem.space, mem.addr))
            .next_back()
            .filter(|((c, _, _), (r, _))| *c == conn && r.mem().contains(mem))?;
        *used = now;
        Some(region)
    }

    /// Caches `region` for connection `conn`, dropping cached regions it overlaps and, past
    /// the capacity, the least recently used one.
    pub fn insert(&mut self, conn: usize, region: Region) {
        let m = region.mem();
        self.entries
            .retain(|(c, _, _), (r, _)| *c != conn || !r.mem().overlaps(&m));
        if self.entries.len() >= self.capacity {
            if let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| *k)
            {
                self.entries.remove(&oldest);
            }
        }
        self.clock += 1;
        self.entries
            .insert((conn, m.space, m.addr), (region, self.clock));
    }

    /// Drops every cached region that overlaps `mem` (its owner is about to free it).
    pub fn forget(&mut self, mem: &MemRef) {
        self.entries.retain(|_, (r, _)| !r.mem().overlaps(mem));
    }

    /// Number of cached regions.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(addr: usize, len: usize) -> MemRef {
        MemRef {
            space: MemSpace::Host,
            addr,
            len,
        }
    }

    #[test]
    fn ranges() {
        let a = host(100, 50);
        assert!(a.contains(&host(100, 50)));
        assert!(a.contains(&host(120, 0)));
        assert!(!a.contains(&host(140, 11)));
        assert!(a.overlaps(&host(149, 10)));
        assert!(!a.overlaps(&host(150, 10)));
        let dev = MemRef {
            space: MemSpace::Cuda(0),
            ..a
        };
        assert!(!a.contains(&dev) && !a.overlaps(&dev));
        assert!(Spaces::HOST.accepts(MemSpace::Host));
        assert!(!Spaces::HOST.accepts(MemSpace::Cuda(1)));
        let gpu1 = Spaces {
            host: true,
            cuda: true,
            cuda_device: Some(1),
        };
        assert!(gpu1.accepts(MemSpace::Cuda(1)) && gpu1.accepts(MemSpace::Host));
        assert!(!gpu1.accepts(MemSpace::Cuda(0)), "another GPU's memory");
        let any = Spaces {
            cuda_device: None,
            ..gpu1
        };
        assert!(any.accepts(MemSpace::Cuda(0)) && any.accepts(MemSpace::Cuda(3)));
    }

    #[test]
    fn payload_spaces() {
        let b = [1u8, 2, 3];
        assert_eq!(Payload::Host(&b).host("tcp").unwrap(), &b);
        let d = MemRef {
            space: MemSpace::Cuda(2),
            addr: 4096,
            len: 8,
        };
        let e = Payload::Device(d).host("tcp").unwrap_err();
        assert!(
            e.message().contains("tcp") && e.message().contains("cuda device 2"),
            "{e}"
        );
        assert_eq!(Payload::Device(d).len(), 8);
    }

    #[test]
    fn cache_finds_covering_region_per_connection() {
        let mut c = RegCache::new(8);
        c.insert(1, Region::new(host(1000, 100), 7, ()));
        assert_eq!(c.get(1, &host(1010, 20)).map(Region::key), Some(7));
        assert!(c.get(1, &host(1090, 20)).is_none(), "runs past the end");
        assert!(c.get(2, &host(1010, 20)).is_none(), "another connection");
        assert!(c.get(1, &host(900, 20)).is_none());
        // A new registration over part of the old one replaces it.
        c.insert(1, Region::new(host(1050, 200), 8, ()));
        assert_eq!(c.len(), 1);
        assert_eq!(c.get(1, &host(1100, 10)).map(Region::key), Some(8));
        c.forget(&host(1200, 1));
        assert!(c.is_empty());
    }

    #[test]
    fn cache_releases_regions_it_drops() {
        let mut c = RegCache::new(2);
        let r = Region::new(host(0, 10), 1, String::from("mr"));
        assert_eq!(r.resources::<String>().map(String::as_str), Some("mr"));
        c.insert(0, r.clone());
        assert_eq!(r.holders(), 2);
        c.insert(0, Region::new(host(100, 10), 2, ()));
        let _ = c.get(0, &host(100, 1));
        c.insert(0, Region::new(host(200, 10), 3, ()));
        assert_eq!(c.len(), 2);
        assert_eq!(r.holders(), 1, "the least recently used region was dropped");
        assert!(c.get(0, &host(200, 5)).is_some() && c.get(0, &host(100, 5)).is_some());
    }
}
