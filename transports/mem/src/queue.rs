//! A bounded byte queue: a ring over a fixed `Vec<u8>`.

/// Bytes in flight in one direction, oldest first, at most `buf.len()` of them.
#[derive(Debug)]
pub(crate) struct ByteQueue {
    buf: Vec<u8>,
    /// Index of the oldest byte.
    head: usize,
    /// Bytes queued: `head..head+len` (wrapping) hold them.
    len: usize,
}

impl ByteQueue {
    /// An empty queue holding at most `cap` bytes.
    pub(crate) fn new(cap: usize) -> ByteQueue {
        ByteQueue {
            buf: vec![0; cap],
            head: 0,
            len: 0,
        }
    }

    /// Bytes queued.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes that fit.
    pub(crate) fn free(&self) -> usize {
        self.buf.len() - self.len
    }

    /// Appends as much of `src` as fits; returns how much did.
    pub(crate) fn push(&mut self, src: &[u8]) -> usize {
        let cap = self.buf.len();
        let n = src.len().min(self.free());
        let tail = (self.head + self.len) % cap.max(1);
        let first = n.min(cap - tail);
        self.buf[tail..tail + first].copy_from_slice(&src[..first]);
        self.buf[..n - first].copy_from_slice(&src[first..n]);
        self.len += n;
        n
    }

    /// Moves the oldest bytes into `dst`, as many as it holds or are queued; returns how many.
    pub(crate) fn pop(&mut self, dst: &mut [u8]) -> usize {
        let cap = self.buf.len();
        let n = dst.len().min(self.len);
        let first = n.min(cap - self.head);
        dst[..first].copy_from_slice(&self.buf[self.head..self.head + first]);
        dst[first..n].copy_from_slice(&self.buf[..n - first]);
        self.head = (self.head + n) % cap.max(1);
        self.len -= n;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::ByteQueue;

    #[test]
    fn wraps_and_keeps_order() {
        let mut q = ByteQueue::new(10);
        assert_eq!(q.push(&[1, 2, 3, 4, 5, 6, 7]), 7);
        let mut out = [0u8; 5];
        assert_eq!(q.pop(&mut out), 5);
        assert_eq!(out, [1, 2, 3, 4, 5]);
        // Wraps past the end of the buffer.
        assert_eq!(q.push(&[8, 9, 10, 11, 12, 13, 14, 15, 16]), 8);
        assert_eq!(q.free(), 0);
        let mut all = [0u8; 12];
        assert_eq!(q.pop(&mut all), 10);
        assert_eq!(&all[..10], &[6, 7, 8, 9, 10, 11, 12, 13, 14, 15]);
        assert_eq!(q.len(), 0);
    }
}
