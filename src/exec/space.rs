//! The memory-space axis of a collective: what a call on device memory borrows from its
//! communicator ([`DeviceArena`]), and the element-wise context of one call ([`Run`]) that
//! sends every copy and reduction to the reducer of the call's space.

use std::sync::Arc;

use ferroccl_kernels::{DataType, ElemOp};
use ferroccl_transport::{Error, MemRef, MemSpace, Payload, PayloadMut, Result};

use super::OpContext;
use crate::reduce::Reducer;

/// What a collective on device memory needs besides the engine: the reducer that reaches the
/// device, and device buffers for the engine's own use (scratch, received slices awaiting
/// their reduction, a pre-multiplied input). The communicator owns it; the engine borrows it
/// for one call.
pub(crate) trait DeviceArena: Send {
    /// The reducer for the device's memory.
    fn reducer(&self) -> Arc<dyn Reducer>;

    /// Device memory of at least `bytes` for `use_`, live until the arena drops; the same
    /// memory for the same use while no larger one is asked for.
    fn buffer(&mut self, use_: ArenaUse, bytes: usize) -> Result<MemRef>;

    /// Copies `dst.len()` bytes of the device's memory at `src` to the host; returns once they
    /// are there (a tiny allreduce through the small-message lanes reads its input so).
    fn download(&mut self, dst: &mut [u8], src: MemRef) -> Result<()>;

    /// Copies `src` to the device's memory at `dst`; returns once it is there.
    fn upload(&mut self, dst: MemRef, src: &[u8]) -> Result<()>;

    /// The caller's stream the call running now is ordered on (its handle), until
    /// [`DeviceArena::settle`]; `None` for a blocking call, whose buffers are ready now.
    fn call_stream(&self) -> Option<usize> {
        None
    }

    /// Waits until the caller's stream has run the work queued on it before the call, and
    /// makes the rest of the call a blocking one (the schedule reads and writes the buffers
    /// from now on); nothing for a blocking call.
    fn settle(&mut self) -> Result<()> {
        Ok(())
    }

    /// A new allocation of `bytes` of the device's memory for the communicator's scratch
    /// window (`peer/staged.rs`), exported for other processes: what this rank offers at its
    /// registration, how this process maps the others' (for work on this device), and the
    /// allocation, freed when dropped. An error where the device's memory cannot be
    /// exported.
    fn scratch(&mut self, bytes: usize) -> Result<ScratchAlloc> {
        let _ = bytes;
        Err(Error::internal("this device arena makes no scratch window"))
    }
}

/// What [`DeviceArena::scratch`] returns.
pub(crate) struct ScratchAlloc {
    pub offered: super::Offered,
    pub mapper: Box<dyn super::Mapper>,
    pub owned: super::windows::Owned,
}

/// What an arena buffer is for (each use has its own buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ArenaUse {
    /// The schedule's scratch.
    Scratch,
    /// A scaled copy of the input (pre-multiplied sums).
    PreMul,
    /// Bytes of one receive-reduce of a step, by its index in the step.
    Stage(usize),
    /// A copy whose source and destination overlap goes through it.
    Bounce,
}

/// One collective's element-wise context: its reducer, its device arena (device memory) and
/// what it reduces.
pub(super) struct Run<'r, 'a> {
    pub(super) reducer: &'r dyn Reducer,
    pub(super) arena: Option<&'a mut (dyn DeviceArena + 'static)>,
    pub(super) dtype: DataType,
    pub(super) op: ElemOp,
    pub(super) ctx: &'r OpContext,
}

impl Run<'_, '_> {
    /// A schedule's local copy of `n` bytes from `s` to `d` (addresses in `space`; the
    /// ranges may overlap).
    pub(super) fn copy(&mut self, space: MemSpace, s: *mut u8, d: *mut u8, n: usize) -> Result<()> {
        if s == d || n == 0 {
            return Ok(());
        }
        if space != MemSpace::Host {
            let (s, d) = (
                MemRef {
                    space,
                    addr: s as usize,
                    len: n,
                },
                MemRef {
                    space,
                    addr: d as usize,
                    len: n,
                },
            );
            if !s.overlaps(&d) {
                return self.reducer.copy(PayloadMut::Device(d), Payload::Device(s));
            }
            // Device copies may not overlap: through a bounce buffer.
            let a = self
                .arena
                .as_deref_mut()
                .ok_or_else(|| Error::internal(format!("{}: no device arena", self.ctx.label())))?;
            let b = a.buffer(ArenaUse::Bounce, n)?.sub(0, n);
            self.reducer
                .copy(PayloadMut::Device(b), Payload::Device(s))?;
            return self.reducer.copy(PayloadMut::Device(d), Payload::Device(b));
        }
        let (su, du) = (s as usize, d as usize);
        if su < du + n && du < su + n {
            // SAFETY: both ranges are in bounds (the layout resolved them); `copy` allows the
            // overlap that two slices could not express.
            unsafe { std::ptr::copy(s, d, n) };
            return Ok(());
        }
        // SAFETY: both ranges are in bounds (the layout resolved them), disjoint (checked
        // above), and no other reference to them is live here.
        let (s, d) = unsafe {
            (
                std::slice::from_raw_parts(s, n),
                std::slice::from_raw_parts_mut(d, n),
            )
        };
        self.reducer.copy(PayloadMut::Host(d), Payload::Host(s))
    }
}
