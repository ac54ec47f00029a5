//! Tensor memory as the worker thread sees it: an address and a byte length that the Python
//! layer vouches for until the operation's `done` callback runs.

/// A read-only byte range of a tensor.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    addr: usize,
    len: usize,
}

/// A writable byte range of a tensor.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SpanMut {
    addr: usize,
    len: usize,
}

impl Span {
    pub(crate) fn new(addr: usize, len: usize) -> Span {
        Span { addr, len }
    }

    /// # Safety
    /// `len == 0`, or `addr` points to `len` readable bytes that nobody writes while the slice
    /// lives.
    pub(crate) unsafe fn slice<'a>(self) -> &'a [u8] {
        if self.len == 0 || self.addr == 0 {
            &[]
        } else {
            // SAFETY: guaranteed by the caller.
            unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
        }
    }
}

impl SpanMut {
    pub(crate) fn new(addr: usize, len: usize) -> SpanMut {
        SpanMut { addr, len }
    }

    /// # Safety
    /// `len == 0`, or `addr` points to `len` writable bytes that nothing else uses while the
    /// slice lives.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice<'a>(self) -> &'a mut [u8] {
        if self.len == 0 || self.addr == 0 {
            &mut []
        } else {
            // SAFETY: guaranteed by the caller.
            unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) }
        }
    }
}
