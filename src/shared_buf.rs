//! [`SharedBuf`]: host buffers in shared memory, which the shared-memory transport hands to
//! the other ranks of the host without copying them through its rings.

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

use ferroccl_kernels::{as_bytes, from_bytes, from_bytes_mut, Element};
use ferroccl_transport_shm::SharedMem;

use crate::Result;

/// A host buffer of `T` in shared memory: use it like a `Vec<T>` of fixed length.
///
/// Collectives and sends on ordinary slices work unchanged; when the slice lies in a
/// `SharedBuf` and the peer is a rank on the same host, the shared-memory transport lets the
/// peer read it straight from this buffer (for messages of at least `FERRO_SHM_MAPPED_MIN`
/// bytes, default 512 KiB) instead of copying it through its ring first. That saves one pass
/// over memory per byte sent: a 2-rank allreduce of two `SharedBuf`s moves what two threads of
/// one process would. This is what NCCL's registered buffers (`ncclMemAlloc` with
/// `ncclCommRegister`) are for on GPUs.
///
/// A send from a `SharedBuf` completes when the peer has read it, not when the bytes are in
/// the ring: two ranks that each [`send`](crate::Communicator::send) to the other before
/// they receive need a [`Group`](crate::Group), as in NCCL (the same holds for any message
/// larger than the ring). The asynchronous calls take a `SharedBuf` like a `Vec`.
///
/// ```
/// use ferroccl::{Communicator, Config, ReduceOp, SharedBuf};
///
/// let comms = Communicator::local_group(2, Config::default()).unwrap();
/// std::thread::scope(|s| {
///     for comm in &comms {
///         s.spawn(move || {
///             let grads = SharedBuf::from_slice(&vec![1.0f32; 1 << 16]).unwrap();
///             let mut sum = SharedBuf::<f32>::zeroed(1 << 16).unwrap();
///             comm.all_reduce(&grads, &mut sum, ReduceOp::Sum).unwrap();
///             assert!(sum.iter().all(|&x| x == 2.0));
///         });
///     }
/// });
/// ```
pub struct SharedBuf<T: Element> {
    mem: SharedMem,
    _t: PhantomData<T>,
}

impl<T: Element> SharedBuf<T> {
    /// `len` elements, all bits zero.
    pub fn zeroed(len: usize) -> Result<SharedBuf<T>> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            crate::Error::invalid_argument(format!("SharedBuf of {len} elements: too large"))
        })?;
        Ok(SharedBuf {
            mem: SharedMem::new(bytes)?,
            _t: PhantomData,
        })
    }

    /// A copy of `src`.
    pub fn from_slice(src: &[T]) -> Result<SharedBuf<T>> {
        let mut b = SharedBuf::zeroed(src.len())?;
        b.mem.as_mut_slice().copy_from_slice(as_bytes(src));
        Ok(b)
    }
}

impl<T: Element> Deref for SharedBuf<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        from_bytes(self.mem.as_slice()).expect("a shared buffer is page aligned")
    }
}

impl<T: Element> DerefMut for SharedBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        from_bytes_mut(self.mem.as_mut_slice()).expect("a shared buffer is page aligned")
    }
}

impl<T: Element> AsRef<[T]> for SharedBuf<T> {
    fn as_ref(&self) -> &[T] {
        self
    }
}

impl<T: Element> AsMut<[T]> for SharedBuf<T> {
    fn as_mut(&mut self) -> &mut [T] {
        self
    }
}

impl<T: Element> fmt::Debug for SharedBuf<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SharedBuf<{:?}>({} elements)", T::DTYPE, self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_buffer_reads_and_writes_like_a_slice() {
        let mut b = SharedBuf::<u64>::zeroed(1000).unwrap();
        assert_eq!(b.len(), 1000);
        assert!(b.iter().all(|&x| x == 0));
        b[999] = 7;
        assert_eq!(b[999], 7);
        let c = SharedBuf::from_slice(&[1.5f64, 2.5]).unwrap();
        assert_eq!(&c[..], &[1.5, 2.5]);
        assert!(SharedBuf::<u8>::zeroed(0).unwrap().is_empty());
        assert!(SharedBuf::<u64>::zeroed(usize::MAX).is_err());
        assert!(format!("{c:?}").contains("2 elements"));
        let mut d = c;
        d.as_mut()[0] = 9.0;
        assert_eq!(d.as_ref(), &[9.0, 2.5]);
    }
}
