//! Control memory: the small buffers a peer writes into with RDMA (the header ring, the
//! clear-to-send FIFO) and the staging slots their writes are sent from. A peer's writes land
//! while this side holds the buffer, so it is raw memory read and written by copies, never
//! through a Rust reference that would promise no one else writes it.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

/// A zeroed, page-aligned buffer of `len` bytes at a fixed address.
#[derive(Debug)]
pub(crate) struct CtrlBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is plain memory owned by this value; every access copies through raw
// pointers within bounds (below), so moving the owner to another thread is sound.
unsafe impl Send for CtrlBuf {}
// SAFETY: shared access only reads or writes through raw-pointer copies; concurrent writers
// are the peers of the RDMA protocol, which keeps them to slots no one reads at the time.
unsafe impl Sync for CtrlBuf {}

impl CtrlBuf {
    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len.max(1), 4096).expect("control buffer layout")
    }

    /// A zeroed buffer of `len` bytes.
    pub(crate) fn new(len: usize) -> CtrlBuf {
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { alloc_zeroed(Self::layout(len)) };
        let ptr =
            NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(Self::layout(len)));
        CtrlBuf { ptr, len }
    }

    /// Its address.
    pub(crate) fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// Its length.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Copies `out.len()` bytes from offset `off`.
    pub(crate) fn read(&self, off: usize, out: &mut [u8]) {
        assert!(off + out.len() <= self.len, "control read out of bounds");
        // SAFETY: in bounds (checked); `out` is a distinct Rust buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), out.as_mut_ptr(), out.len())
        };
    }

    /// Copies `data` to offset `off`.
    pub(crate) fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len, "control write out of bounds");
        // SAFETY: in bounds (checked); `data` is a distinct Rust buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(off), data.len())
        };
    }
}

impl Drop for CtrlBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.len)) };
    }
}
