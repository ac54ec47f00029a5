//! Doorbells: one futex word per rank in its own segment, bumped by peers.
//!
//! Waiter (the rank that owns the bell): reads `word` (Acquire) before checking its rings; if
//! nothing moved, increments `sleepers`, issues a SeqCst fence, and sleeps in `FUTEX_WAIT` only
//! while `word` still equals what it read. Notifier (a peer that changed a ring): bumps `word`
//! (Release, after its ring update), issues a SeqCst fence, and calls `FUTEX_WAKE` only if
//! `sleepers` is non-zero. The two fences order "announce sleep, re-read word" against "bump
//! word, read sleepers": at least one side sees the other, so a wake-up is never lost (checked
//! under loom in `ring.rs`), and a rank nobody waits for costs its peers no system call.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use ferroccl_transport::Doorbell;

use crate::segment::Mapping;
use crate::sync::{fence, AtomicU32, Ordering};

/// A doorbell in a shared mapping: a pointer to its two words and the mapping that holds them.
pub struct Bell {
    word: *const AtomicU32,
    sleepers: *const AtomicU32,
    _map: Arc<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for Bell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bell").field("word", &self.word).finish()
    }
}

// SAFETY: the pointers are into `_map`, which lives as long as the bell; the words are atomics.
unsafe impl Send for Bell {}
// SAFETY: as above; every access is atomic.
unsafe impl Sync for Bell {}

impl Bell {
    /// The bell whose words are at byte offsets `word` and `sleepers` of `map`.
    pub(crate) fn new(map: Arc<Mapping>, word: usize, sleepers: usize) -> Bell {
        assert!(word + 4 <= map.len() && sleepers + 4 <= map.len() && word.is_multiple_of(4));
        Bell {
            word: map.at(word).cast(),
            sleepers: map.at(sleepers).cast(),
            _map: map,
        }
    }

    /// A bell over two words of another shared mapping (another transport's segment), kept
    /// mapped by `keep`.
    ///
    /// # Safety
    /// `word` and `sleepers` point to 4-aligned words that stay mapped, shared and writable
    /// while `keep` lives, and are only ever accessed atomically.
    pub unsafe fn from_raw(
        word: *const AtomicU32,
        sleepers: *const AtomicU32,
        keep: Arc<dyn Any + Send + Sync>,
    ) -> Bell {
        Bell {
            word,
            sleepers,
            _map: keep,
        }
    }

    fn word(&self) -> &AtomicU32 {
        // SAFETY: in bounds and 4-aligned (checked in `new`), mapped while `self` lives; any
        // bit pattern is a valid AtomicU32.
        unsafe { &*self.word }
    }

    fn sleepers(&self) -> &AtomicU32 {
        // SAFETY: as for `word`.
        unsafe { &*self.sleepers }
    }

    /// Tells the owner that something changed: bumps the word and wakes it if it sleeps.
    pub fn ring(&self) {
        // Release: the ring update that preceded this is visible to whoever reads the new value.
        self.word().fetch_add(1, Ordering::Release);
        // SeqCst fence: orders the bump before the read of `sleepers` (see the module docs).
        fence(Ordering::SeqCst);
        if self.sleepers().load(Ordering::Relaxed) != 0 {
            futex_wake(self.word());
        }
    }
}

impl Doorbell for Bell {
    fn identity(&self) -> usize {
        self.word() as *const _ as usize
    }

    fn seq(&self) -> u32 {
        // Acquire: pairs with the notifiers' Release bumps.
        self.word().load(Ordering::Acquire)
    }

    fn wait(&self, seen: u32, timeout: Duration) {
        // Relaxed + fence: the fence orders this announcement before the re-read below.
        self.sleepers().fetch_add(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if self.word().load(Ordering::Relaxed) == seen {
            futex_wait(self.word(), seen, timeout);
        }
        self.sleepers().fetch_sub(1, Ordering::Relaxed);
    }
}

fn futex_wait(word: &AtomicU32, seen: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(3600) as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: FUTEX_WAIT (shared: the word may be mapped by several processes) reads the u32 at
    // `word`, a live, aligned atomic; `ts` outlives the call. Spurious returns are fine.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            seen,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the address of the live, aligned word as a key.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}
