//! The single-producer / single-consumer byte ring at the heart of the shared-memory transport.
//!
//! A ring is a control block ([`RingCtl`]) and `capacity` data bytes (a power of two). Two
//! counters count bytes ever moved: `head` (written only by the producer) and `tail` (written
//! only by the consumer). Bytes `tail..head` (taken modulo the capacity) hold data; the rest is
//! free. Neither counter wraps in practice (2^64 bytes).
//!
//! Orderings, each also stated beside its access:
//! - producer: `tail.load(Acquire)` before overwriting free bytes, so that the consumer's reads
//!   of those bytes (made before its `tail.store(Release)`) are finished; then copies the data;
//!   then `head.store(Release)`, publishing the bytes.
//! - consumer: `head.load(Acquire)` before reading, so that the producer's writes of those bytes
//!   are visible; copies them out; then `tail.store(Release)`, handing the space back.
//! - each side reads its own counter `Relaxed`: only it writes that counter.
//!
//! The data bytes are reached through [`Storage`], so that under loom every byte access is a
//! tracked cell and a missing ordering shows up as a data race in the model check.

use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// A cache line of its own for one counter, so that producer and consumer do not bounce one line.
#[repr(C, align(64))]
#[derive(Debug)]
pub(crate) struct Padded<T>(pub T);

/// The control block of one ring. In shared memory it is `repr(C)` and zero-initialised (all
/// zeros is its valid initial state).
#[repr(C)]
#[derive(Debug)]
pub(crate) struct RingCtl {
    /// Bytes ever written by the producer.
    pub head: Padded<AtomicU64>,
    /// Bytes ever read by the consumer.
    pub tail: Padded<AtomicU64>,
    /// Connection-level flags (see the connection module): closed by either side, cross-memory
    /// attach allowed / denied, shared-buffer reads denied.
    pub flags: Padded<[AtomicU32; 5]>,
    /// Cross-memory attach and shared buffers: payload bytes the consumer has read from the
    /// producer's memory, ever.
    pub cma_acked: Padded<AtomicU64>,
}

impl RingCtl {
    /// A fresh control block (for tests and loom; shared memory starts zeroed instead).
    #[cfg(any(test, loom))]
    pub fn new() -> RingCtl {
        RingCtl {
            head: Padded(AtomicU64::new(0)),
            tail: Padded(AtomicU64::new(0)),
            flags: Padded([
                AtomicU32::new(0),
                AtomicU32::new(0),
                AtomicU32::new(0),
                AtomicU32::new(0),
                AtomicU32::new(0),
            ]),
            cma_acked: Padded(AtomicU64::new(0)),
        }
    }
}

/// The data bytes of a ring.
///
/// # Safety
/// Implementations must copy exactly the given range; the ring protocol guarantees that the
/// producer writes only free bytes and the consumer reads only filled ones.
pub(crate) unsafe trait Storage {
    /// Capacity in bytes (a power of two).
    fn capacity(&self) -> usize;

    /// Copies `src` to bytes `off..off + src.len()` (no wrap: the caller splits).
    ///
    /// # Safety
    /// The range is in bounds and no one else accesses it during the call.
    unsafe fn write_at(&self, off: usize, src: &[u8]);

    /// Copies bytes `off..off + dst.len()` to `dst` (no wrap).
    ///
    /// # Safety
    /// The range is in bounds and no one writes it during the call.
    unsafe fn read_at(&self, off: usize, dst: &mut [u8]);
}

/// The producer's end of a ring. Only one may exist per ring (see [`Producer::new`]).
#[derive(Debug)]
pub(crate) struct Producer<'a, S: Storage> {
    ctl: &'a RingCtl,
    data: &'a S,
}

/// The consumer's end of a ring. Only one may exist per ring (see [`Consumer::new`]).
#[derive(Debug)]
pub(crate) struct Consumer<'a, S: Storage> {
    ctl: &'a RingCtl,
    data: &'a S,
}

impl<'a, S: Storage> Producer<'a, S> {
    /// The producer end of the ring `ctl` + `data`.
    ///
    /// # Safety
    /// At most one producer of this ring writes at any time (in any process).
    pub unsafe fn new(ctl: &'a RingCtl, data: &'a S) -> Self {
        Producer { ctl, data }
    }

    /// Free bytes now.
    #[cfg_attr(loom, allow(dead_code))]
    pub fn free(&self) -> usize {
        // Relaxed: only this side writes `head`.
        let head = self.ctl.head.0.load(Ordering::Relaxed);
        // Acquire: pairs with the consumer's Release store of `tail`.
        let tail = self.ctl.tail.0.load(Ordering::Acquire);
        self.data.capacity() - (head - tail) as usize
    }

    /// Writes as much of `src` as fits; returns the bytes written (0 when full).
    pub fn write(&self, src: &[u8]) -> usize {
        let cap = self.data.capacity();
        // Relaxed: only this side writes `head`.
        let head = self.ctl.head.0.load(Ordering::Relaxed);
        // Acquire: the consumer's reads of the bytes it handed back happen before we overwrite them.
        let tail = self.ctl.tail.0.load(Ordering::Acquire);
        let free = cap - (head - tail) as usize;
        let n = free.min(src.len());
        if n == 0 {
            return 0;
        }
        let off = (head as usize) & (cap - 1);
        let first = n.min(cap - off);
        // SAFETY: bytes head..head+n are free (n <= free) and only this producer writes them;
        // `off + first <= cap` and the rest starts at 0 with `n - first <= cap - first`.
        unsafe {
            self.data.write_at(off, &src[..first]);
            if n > first {
                self.data.write_at(0, &src[first..n]);
            }
        }
        // Release: publishes the bytes just written to the consumer's Acquire load of `head`.
        self.ctl.head.0.store(head + n as u64, Ordering::Release);
        n
    }
}

impl<'a, S: Storage> Consumer<'a, S> {
    /// The consumer end of the ring `ctl` + `data`.
    ///
    /// # Safety
    /// At most one consumer of this ring reads at any time (in any process).
    pub unsafe fn new(ctl: &'a RingCtl, data: &'a S) -> Self {
        Consumer { ctl, data }
    }

    /// Whether any byte is ready to read now.
    #[cfg_attr(loom, allow(dead_code))]
    pub fn has_data(&self) -> bool {
        // Acquire: pairs with the producer's Release store of `head`, so that what the
        // producer wrote before it is visible to the caller.
        let head = self.ctl.head.0.load(Ordering::Acquire);
        // Relaxed: only this side writes `tail`.
        head != self.ctl.tail.0.load(Ordering::Relaxed)
    }

    /// Bytes ready to read now.
    #[cfg(all(test, not(loom)))]
    pub fn available(&self) -> usize {
        // Acquire: pairs with the producer's Release store of `head`.
        let head = self.ctl.head.0.load(Ordering::Acquire);
        // Relaxed: only this side writes `tail`.
        let tail = self.ctl.tail.0.load(Ordering::Relaxed);
        (head - tail) as usize
    }

    /// Reads up to `dst.len()` bytes; returns the bytes read (0 when empty).
    pub fn read(&self, dst: &mut [u8]) -> usize {
        let cap = self.data.capacity();
        // Acquire: the producer's writes of the bytes up to `head` are visible.
        let head = self.ctl.head.0.load(Ordering::Acquire);
        // Relaxed: only this side writes `tail`.
        let tail = self.ctl.tail.0.load(Ordering::Relaxed);
        let n = ((head - tail) as usize).min(dst.len());
        if n == 0 {
            return 0;
        }
        let off = (tail as usize) & (cap - 1);
        let first = n.min(cap - off);
        // SAFETY: bytes tail..tail+n are filled (n <= head - tail) and the producer does not
        // touch them until `tail` moves past them; ranges as in `Producer::write`.
        unsafe {
            self.data.read_at(off, &mut dst[..first]);
            if n > first {
                self.data.read_at(0, &mut dst[first..n]);
            }
        }
        // Release: our reads of these bytes happen before the producer's Acquire load of `tail`
        // lets it overwrite them.
        self.ctl.tail.0.store(tail + n as u64, Ordering::Release);
        n
    }
}

#[cfg(not(loom))]
impl<'a> Consumer<'a, RawStorage> {
    /// The filled bytes from the consumer's position, at most `max`, up to the end of the
    /// ring's memory (a view never wraps: the bytes after the wrap come in the next view). The
    /// producer leaves them alone until [`Consumer::release`] hands them back.
    ///
    /// # Safety
    /// The caller stops using the view before it releases any of its bytes.
    pub unsafe fn filled(&self, max: usize) -> &'a [u8] {
        let cap = self.data.capacity();
        // Acquire: the producer's writes of the bytes up to `head` are visible.
        let head = self.ctl.head.0.load(Ordering::Acquire);
        // Relaxed: only this side writes `tail`.
        let tail = self.ctl.tail.0.load(Ordering::Relaxed);
        let off = (tail as usize) & (cap - 1);
        let n = ((head - tail) as usize).min(max).min(cap - off);
        // SAFETY: bytes tail..tail+n are filled and in bounds (`off + n <= cap`); the producer
        // writes them again only after `tail` moves past them, which the caller does after its
        // last use of the view; the mapping outlives `'a`.
        unsafe { std::slice::from_raw_parts(self.data.base.add(off), n) }
    }

    /// Hands `n` bytes (no more than the last [`Consumer::filled`] view held) back to the
    /// producer.
    pub fn release(&self, n: usize) {
        // Relaxed: only this side writes `tail`.
        let tail = self.ctl.tail.0.load(Ordering::Relaxed);
        // Release: the caller's reads of these bytes happen before the producer's Acquire
        // load of `tail` lets it overwrite them.
        self.ctl.tail.0.store(tail + n as u64, Ordering::Release);
    }
}

/// Ring data in ordinary (or shared) memory behind a raw pointer.
#[cfg(not(loom))]
#[derive(Debug)]
pub(crate) struct RawStorage {
    base: *mut u8,
    cap: usize,
}

#[cfg(not(loom))]
impl RawStorage {
    /// Data bytes `base..base + cap`.
    ///
    /// # Safety
    /// The range stays mapped and writable while this value lives; `cap` is a power of two.
    pub unsafe fn new(base: *mut u8, cap: usize) -> Self {
        debug_assert!(cap.is_power_of_two());
        RawStorage { base, cap }
    }
}

// SAFETY: `RawStorage` is a pointer into a mapping that outlives it; concurrent access is ruled
// by the ring protocol, which keeps the producer's and consumer's ranges disjoint.
#[cfg(not(loom))]
unsafe impl Send for RawStorage {}
// SAFETY: as above.
#[cfg(not(loom))]
unsafe impl Sync for RawStorage {}

// SAFETY: copies exactly the requested, in-bounds ranges.
#[cfg(not(loom))]
unsafe impl Storage for RawStorage {
    fn capacity(&self) -> usize {
        self.cap
    }

    unsafe fn write_at(&self, off: usize, src: &[u8]) {
        debug_assert!(off + src.len() <= self.cap);
        // SAFETY: in bounds (caller) and the source is a distinct, live slice.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.base.add(off), src.len()) }
    }

    unsafe fn read_at(&self, off: usize, dst: &mut [u8]) {
        debug_assert!(off + dst.len() <= self.cap);
        // SAFETY: in bounds (caller) and the destination is a distinct, live slice.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(off), dst.as_mut_ptr(), dst.len()) }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn bytes_wrap_around_and_arrive_in_order() {
        let mut buf = vec![0u8; 16];
        let ctl = RingCtl::new();
        // SAFETY: `buf` outlives the storage; 16 is a power of two.
        let data = unsafe { RawStorage::new(buf.as_mut_ptr(), 16) };
        // SAFETY: one producer and one consumer, on this thread.
        let (p, c) = unsafe { (Producer::new(&ctl, &data), Consumer::new(&ctl, &data)) };
        let src: Vec<u8> = (0..100).map(|i| (i * 7 + 3) as u8).collect();
        let mut got = Vec::new();
        let mut sent = 0;
        let mut step = 1;
        while got.len() < src.len() {
            let end = (sent + step).min(src.len());
            sent += p.write(&src[sent..end]);
            assert!(p.free() <= 16);
            let mut tmp = [0u8; 5];
            let n = c.read(&mut tmp[..(step % 5) + 1]);
            got.extend_from_slice(&tmp[..n]);
            step = step % 11 + 1;
        }
        assert_eq!(got, src);
        assert_eq!(c.available(), 0);
        assert_eq!(p.free(), 16);
    }

    /// Producer and consumer on two threads over plain memory; under miri
    /// (`cargo +nightly miri test -p ferroccl-transport-shm --lib ring::`) its data-race
    /// detector checks the orderings on the real `RawStorage` copies.
    #[test]
    fn two_threads_stream_through_a_small_ring() {
        let mut buf = vec![0u8; 64];
        let ctl = RingCtl::new();
        // SAFETY: `buf` outlives the storage (the scope below ends first); 64 is a power of two.
        let data = unsafe { RawStorage::new(buf.as_mut_ptr(), 64) };
        let n = if cfg!(miri) { 300 } else { 100_000 };
        let src: Vec<u8> = (0..n).map(|i| (i * 13 + 5) as u8).collect();
        let mut got = Vec::with_capacity(n);
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: the only producer.
                let p = unsafe { Producer::new(&ctl, &data) };
                let mut sent = 0;
                while sent < src.len() {
                    sent += p.write(&src[sent..(sent + 23).min(src.len())]);
                    std::thread::yield_now();
                }
            });
            // SAFETY: the only consumer.
            let c = unsafe { Consumer::new(&ctl, &data) };
            while got.len() < n {
                let mut tmp = [0u8; 17];
                let k = c.read(&mut tmp);
                got.extend_from_slice(&tmp[..k]);
                std::thread::yield_now();
            }
        });
        assert_eq!(got, src);
    }

    #[test]
    fn full_ring_refuses_more() {
        let mut buf = vec![0u8; 8];
        let ctl = RingCtl::new();
        // SAFETY: as above.
        let data = unsafe { RawStorage::new(buf.as_mut_ptr(), 8) };
        // SAFETY: as above.
        let (p, c) = unsafe { (Producer::new(&ctl, &data), Consumer::new(&ctl, &data)) };
        assert_eq!(p.write(&[1, 2, 3, 4, 5, 6]), 6);
        assert_eq!(p.write(&[7, 8, 9, 10]), 2);
        assert_eq!(p.write(&[11]), 0);
        let mut out = [0u8; 3];
        assert_eq!(c.read(&mut out), 3);
        assert_eq!(out, [1, 2, 3]);
        assert_eq!(p.write(&[9, 10, 11, 12]), 3);
        let mut rest = [0u8; 16];
        assert_eq!(c.read(&mut rest), 8);
        assert_eq!(&rest[..8], &[4, 5, 6, 7, 8, 9, 10, 11]);
    }
}

#[cfg(loom)]
mod loom_tests {
    //! Model checks: `RUSTFLAGS="--cfg loom" cargo test -p ferroccl-transport-shm --release --lib`.
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;

    /// Ring bytes as loom cells, so that every byte access is checked for races.
    struct Cells(Vec<UnsafeCell<u8>>);

    // SAFETY: copies exactly the requested, in-bounds ranges, through loom's tracked cells.
    unsafe impl Storage for Cells {
        fn capacity(&self) -> usize {
            self.0.len()
        }
        unsafe fn write_at(&self, off: usize, src: &[u8]) {
            for (i, &b) in src.iter().enumerate() {
                // SAFETY: loom checks that no one else accesses the cell concurrently.
                self.0[off + i].with_mut(|p| unsafe { *p = b });
            }
        }
        unsafe fn read_at(&self, off: usize, dst: &mut [u8]) {
            for (i, d) in dst.iter_mut().enumerate() {
                // SAFETY: as above.
                *d = self.0[off + i].with(|p| unsafe { *p });
            }
        }
    }

    struct Shared {
        ctl: RingCtl,
        data: Cells,
    }

    /// A producer streams 6 distinct bytes through a 4-byte ring in pieces of up to 3 while a
    /// consumer reads them in pieces of up to 2: every byte arrives once, in order, with no race.
    #[test]
    fn ring_delivers_in_order_without_races() {
        loom::model(|| {
            let s = Arc::new(Shared {
                ctl: RingCtl::new(),
                data: Cells((0..4).map(|_| UnsafeCell::new(0)).collect()),
            });
            let s2 = Arc::clone(&s);
            let t = loom::thread::spawn(move || {
                // SAFETY: the only producer.
                let p = unsafe { Producer::new(&s2.ctl, &s2.data) };
                let src = [11u8, 22, 33, 44, 55, 66];
                let mut sent = 0;
                while sent < src.len() {
                    let n = p.write(&src[sent..(sent + 3).min(src.len())]);
                    if n == 0 {
                        loom::thread::yield_now();
                    }
                    sent += n;
                }
            });
            // SAFETY: the only consumer.
            let c = unsafe { Consumer::new(&s.ctl, &s.data) };
            let mut got = Vec::new();
            while got.len() < 6 {
                let mut b = [0u8; 2];
                let n = c.read(&mut b);
                if n == 0 {
                    loom::thread::yield_now();
                }
                got.extend_from_slice(&b[..n]);
            }
            t.join().unwrap();
            assert_eq!(got, [11, 22, 33, 44, 55, 66]);
        });
    }

    /// The doorbell handshake (see `bell.rs`): a waiter that saw no progress and a notifier that
    /// made progress can never both miss each other, so a wake-up is never lost.
    #[test]
    fn doorbell_never_loses_a_wakeup() {
        use crate::sync::fence;
        loom::model(|| {
            let ctl = Arc::new(RingCtl::new());
            // flags[0]: the bell; flags[1]: sleepers; head: the "progress" the waiter checks.
            let c2 = Arc::clone(&ctl);
            let t = loom::thread::spawn(move || {
                // Notifier: make progress, bump the bell, then look for sleepers.
                c2.head.0.store(1, Ordering::Release);
                c2.flags.0[0].fetch_add(1, Ordering::Release);
                fence(Ordering::SeqCst);
                c2.flags.0[1].load(Ordering::Relaxed) != 0
            });
            // Waiter: read the bell, check progress, announce sleep, re-read the bell.
            let seen = ctl.flags.0[0].load(Ordering::Acquire);
            let progressed = ctl.head.0.load(Ordering::Acquire) != 0;
            let mut slept_through = false;
            if !progressed {
                ctl.flags.0[1].fetch_add(1, Ordering::Relaxed);
                fence(Ordering::SeqCst);
                // The futex compares the bell with `seen` and sleeps only if equal.
                let would_sleep = ctl.flags.0[0].load(Ordering::Relaxed) == seen;
                slept_through = would_sleep;
            }
            let notifier_saw_sleeper = t.join().unwrap();
            // If the waiter went to sleep, the notifier must have seen it and will wake it.
            assert!(!slept_through || notifier_saw_sleeper);
        });
    }
}
