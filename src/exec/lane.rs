//! Tiny allreduces through the connections' small-message lanes.
//!
//! Where every rank reaches every other over a transport with a lane (shared memory), and
//! the ranks agreed at setup on the largest size ([`crate::Config::small_lane_bytes`]), an
//! allreduce of that size or less is one exchange: each rank writes its input, with the
//! operation's header fields, into a box of every peer, waits for every peer's box, checks
//! each header against its own, and reduces the inputs in rank order (the same order on every
//! rank, so every rank gets the same bits). No schedule is planned and nothing goes through
//! the ordered streams: one cache-line hand-off per peer instead of several.
//!
//! A peer that is not in the same exchange shows in one of two ways: its box holds another
//! operation's header (a clear mismatch error, as from the stream), or its stream holds a
//! message (another operation, or a failure notice): the executor then reads that message's
//! header the usual way, which produces the same errors as any step would. Waiting follows the
//! step driver: spin, yield, the doorbell; the deadline, abort and dead-peer detection. A
//! timeline (`FERRO_TRACE_FILE`) names these calls' algorithm `lane`.

use std::sync::atomic::Ordering;

use ferroccl_kernels::DataType;
use ferroccl_kernels::ElemOp;
use ferroccl_transport::{Error, ErrorKind, Header, LaneTake, Payload, PayloadMut, Result};

use ferroccl_transport::{MemRef, MemSpace};

use super::step::{check_header, OpState, RawOp, MAX_SLEEP};
use super::wait::{SysWaiter, Waiter, Waiting};
use super::{DeviceArena, Engine, Memory, OpContext};
use crate::coll::{CollArgs, CollKind};

/// Most ranks an exchange serves: each rank writes and reads `nranks - 1` boxes.
pub(crate) const LANE_MAX_RANKS: usize = 8;

/// Room for one lane message (at least any lane's capacity).
const ROOM: usize = 128;

/// An aligned buffer for one rank's input, so reductions see aligned elements.
#[repr(C, align(16))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slot([u8; ROOM]);

impl Default for Slot {
    fn default() -> Self {
        Slot([0; ROOM])
    }
}

/// The engine's lane state: the agreed size limit and the next message number.
#[derive(Debug, Default)]
pub(crate) struct Lanes {
    /// Largest allreduce (bytes) that runs through the lanes; 0: none.
    pub bytes: usize,
    /// Number of the next lane message (the same on every rank: one per lane exchange).
    next: u64,
    /// Every rank's input of the current exchange, kept between calls so that a call neither
    /// allocates nor clears them (taken out during a call; an error drops them).
    slots: Option<Box<[Slot; LANE_MAX_RANKS]>>,
}

impl Lanes {
    /// Makes room for an exchange's inputs now, so that no call allocates them.
    pub(crate) fn reserve(&mut self) {
        self.slots.get_or_insert_with(Box::default);
    }
}

/// The check words a lane message carries: the header fields of the operation.
fn tag_of(h: &Header) -> [u64; 3] {
    [
        u64::from(h.kind)
            | u64::from(h.dtype) << 8
            | u64::from(h.op) << 16
            | (h.len & 0xff) << 24
            | u64::from(h.root) << 32,
        h.seq,
        h.count,
    ]
}

/// The header a lane message's check words describe.
fn header_of(tag: [u64; 3]) -> Header {
    Header {
        kind: tag[0] as u8,
        dtype: (tag[0] >> 8) as u8,
        op: (tag[0] >> 16) as u8,
        len: (tag[0] >> 24) & 0xff,
        root: (tag[0] >> 32) as u32,
        seq: tag[1],
        count: tag[2],
    }
}

impl Engine {
    /// Whether the allreduce `args` of `esize`-byte elements runs through the lanes.
    pub(crate) fn lane_fits(&self, args: &CollArgs, esize: usize, premul: bool) -> bool {
        let bytes = args.count * esize;
        matches!(args.kind, CollKind::AllReduce)
            && !premul
            && bytes > 0
            && bytes <= self.lanes.bytes.min(ROOM)
            && (2..=LANE_MAX_RANKS).contains(&self.nranks)
            && self.tuning.probe.is_none()
            && self.tuning.overrides == crate::plan::Overrides::default()
    }

    /// Whether collective `args` on `mem` runs through the lanes: an allreduce that
    /// [`Engine::lane_fits`], on host buffers the engine's reducer reaches, or on device
    /// buffers with their arena (copied over and back by [`Engine::lane_all_reduce`]). The same answer on every rank
    /// whatever its buffers, so that ranks with host and with device buffers meet.
    pub(crate) fn takes_lane(
        &self,
        args: &CollArgs,
        esize: usize,
        premul: Option<f64>,
        mem: &Memory,
        arena: bool,
    ) -> bool {
        let reach = if mem.space == MemSpace::Host {
            !arena && self.reducer.serves(MemSpace::Host)
        } else {
            arena
        };
        reach && self.lane_fits(args, esize, premul.is_some())
    }

    /// Runs an allreduce that [`Engine::lane_fits`] as one lane exchange. Device buffers
    /// (with their `arena`) are read into this rank's slot and written from the result through
    /// the arena; the lane itself carries host bytes.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn lane_all_reduce(
        &mut self,
        args: &CollArgs,
        dtype: DataType,
        op: ElemOp,
        mem: &Memory,
        ctx: &OpContext,
        waits: Option<&mut [u64]>,
        mut arena: Option<&mut (dyn DeviceArena + 'static)>,
    ) -> Result<()> {
        let bytes = args.count * dtype.size();
        let (src, src_len) = if mem.in_place {
            (mem.output as *const u8, mem.output_len)
        } else {
            (mem.input, mem.input_len)
        };
        if src_len < bytes || mem.output_len < bytes || bytes > ROOM {
            return Err(Error::internal(format!(
                "{}: buffers of {src_len} and {} bytes for {bytes} bytes (a lane holds {ROOM})",
                ctx.label(),
                mem.output_len
            )));
        }
        let device = |addr: usize, len: usize| MemRef {
            space: mem.space,
            addr,
            len,
        };
        let mut slots = self.lanes.slots.take().unwrap_or_default();
        let mine = &mut slots[self.rank].0[..bytes];
        match arena.as_deref_mut() {
            Some(a) if mem.space != MemSpace::Host => a
                .download(mine, device(src as usize, src_len))
                .map_err(|e| e.context(ctx.label()))?,
            _ => {
                // SAFETY: `src` holds at least `bytes` readable bytes (checked above against
                // the length the caller vouched for), and nothing writes it during the call.
                mine.copy_from_slice(unsafe { std::slice::from_raw_parts(src, bytes) });
            }
        }
        let want = ctx.header(bytes);
        let tag = tag_of(&want);
        let n = self.lanes.next;
        let me = self.rank;
        for p in (0..self.nranks).filter(|&p| p != me) {
            self.lane_of(p, ctx)?
                .put(n, tag, &slots[me].0[..bytes])
                .map_err(|e| e.context(ctx.label()))?;
        }
        self.lane_wait(n, &want, &mut slots, ctx, waits)?;
        self.lanes.next += 1;
        // Every rank reduces in rank order, so every rank gets the same bits.
        let (first, rest) = slots[..self.nranks].split_at_mut(1);
        let acc = &mut first[0].0[..bytes];
        for s in rest.iter() {
            self.reducer.reduce_inplace(
                dtype,
                op,
                PayloadMut::Host(acc),
                Payload::Host(&s.0[..bytes]),
            )?;
        }
        match arena {
            Some(a) if mem.space != MemSpace::Host => a
                .upload(device(mem.output as usize, mem.output_len), acc)
                .map_err(|e| e.context(ctx.label()))?,
            _ => {
                // SAFETY: `output` holds at least `bytes` writable bytes (checked above); the
                // input was copied out before, so an in-place call may overwrite it.
                let out = unsafe { std::slice::from_raw_parts_mut(mem.output, bytes) };
                out.copy_from_slice(acc);
            }
        }
        self.lanes.slots = Some(slots);
        Ok(())
    }

    fn lane_of(
        &mut self,
        peer: usize,
        ctx: &OpContext,
    ) -> Result<&mut dyn ferroccl_transport::SmallLane> {
        self.conns
            .get_mut(peer)
            .and_then(Option::as_mut)
            .and_then(|c| c.lane())
            .ok_or_else(|| {
                Error::internal(format!(
                    "{}: no small-message lane to rank {peer}",
                    ctx.label()
                ))
            })
    }

    /// Waits for message `n` from every peer into `slots`, checking each one's header. With
    /// `waits`, adds to each peer's entry the nanoseconds until its message arrived.
    fn lane_wait(
        &mut self,
        n: u64,
        want: &Header,
        slots: &mut [Slot; LANE_MAX_RANKS],
        ctx: &OpContext,
        mut waits: Option<&mut [u64]>,
    ) -> Result<()> {
        let bytes = want.len as usize;
        let mut pending: u32 = (0..self.nranks)
            .filter(|&p| p != self.rank)
            .fold(0, |m, p| m | 1 << p);
        // Where the peers have cores of their own, their boxes usually land within a few
        // polls: those polls read no clock (two clock reads cost as much as the hand-off).
        // A traced call, and a rank whose peers share its core, go to the timed loop at once.
        if waits.is_none() && self.waits.policy.spins_first() {
            for _ in 0..FAST_POLLS / (self.nranks as u32 - 1).max(1) {
                if let Err(p) =
                    take_boxes(&mut self.conns, n, want, bytes, slots, &mut pending, ctx)?
                {
                    return Err(self.lane_stray(p, want, ctx));
                }
                if pending == 0 {
                    self.waits.policy.resumed(std::time::Duration::ZERO);
                    return Ok(());
                }
                std::hint::spin_loop();
            }
        }
        let mut waiter = SysWaiter::new(self.bell.as_deref(), &mut self.waits);
        let began = waiter.now();
        let mut last_progress = began;
        let mut idle_since = None;
        loop {
            waiter.arm();
            let before = pending;
            let arrived =
                match take_boxes(&mut self.conns, n, want, bytes, slots, &mut pending, ctx)? {
                    Ok(a) => a,
                    Err(p) => return Err(self.lane_stray(p, want, ctx)),
                };
            if let Some(w) = waits.as_deref_mut() {
                if arrived != 0 {
                    // At least 1 ns: the peer was waited for, however briefly.
                    let ns = (waiter.now().duration_since(began).as_nanos() as u64).max(1);
                    for (p, e) in w.iter_mut().enumerate() {
                        if arrived & (1 << p) != 0 {
                            *e += ns;
                        }
                    }
                }
            }
            if pending != before {
                if let Some(idle) = idle_since.take() {
                    let now = waiter.now();
                    waiter.resumed(now.duration_since(idle));
                }
                if pending == 0 {
                    return Ok(());
                }
                last_progress = waiter.now();
                continue;
            }
            if self.abort.load(Ordering::Relaxed) {
                return Err(Error::new(
                    ErrorKind::Aborted,
                    format!("{}: the communicator was aborted", ctx.label()),
                ));
            }
            let now = waiter.now();
            let idle = *idle_since.get_or_insert(now);
            let idle_for = now.duration_since(idle);
            if idle_for < self.wait.spin {
                waiter.pause(idle_for);
                continue;
            }
            let quiet = now.duration_since(last_progress);
            if quiet >= self.wait.timeout {
                let who: Vec<String> = (0..self.nranks)
                    .filter(|&p| pending & (1 << p) != 0)
                    .map(|p| {
                        self.conns[p]
                            .as_ref()
                            .map_or_else(|| format!("rank {p}"), |c| c.peer().to_string())
                    })
                    .collect();
                return Err(Error::timeout(format!(
                    "{}: no progress for {:.1} s while waiting for the small-message lane of {} \
                     (FERRO_TIMEOUT sets the limit)",
                    ctx.label(),
                    self.wait.timeout.as_secs_f64(),
                    who.join(", ")
                )));
            }
            // The awaited peers as receive ops, in the engine's op and state storage (reserved
            // at setup, so sleeping allocates nothing); emptied again before the next pass.
            let ops = &mut self.raw.0;
            ops.clear();
            ops.extend(
                (0..self.nranks)
                    .filter(|&p| pending & (1 << p) != 0)
                    .map(|peer| RawOp::Recv {
                        peer,
                        ptr: std::ptr::null_mut(),
                        len: 0,
                        header: *want,
                    }),
            );
            self.states.clear();
            self.states.resize_with(ops.len(), OpState::default);
            let waiting = Waiting {
                conns: &self.conns,
                ops: &self.raw.0,
                st: &self.states,
            };
            waiter.sleep(
                &waiting,
                self.wait.timeout.saturating_sub(quiet).min(MAX_SLEEP),
            );
            self.raw.0.clear();
        }
    }

    /// The error for a peer whose stream holds a message while this rank waits in the lane:
    /// the message's header is read as any step reads one, which names a failure notice, or
    /// the operation the peer is in, the way every other mismatch is named.
    fn lane_stray(&mut self, peer: usize, want: &Header, ctx: &OpContext) -> Error {
        let mut sink = [0u8; ROOM];
        let len = (want.len as usize).min(ROOM);
        let op = RawOp::Recv {
            peer,
            ptr: sink.as_mut_ptr(),
            len,
            header: *want,
        };
        match self.run_step(&[op], DataType::Uint8, ElemOp::Sum, ctx) {
            Err(e) => e,
            Ok(()) => Error::internal(format!(
                "{}: rank {peer} sent this operation through its stream, not the small-message \
                 lane the ranks agreed on",
                ctx.label()
            ))
            .with_peer(peer),
        }
    }
}

/// Box polls (one per peer per pass) before a lane wait reads the clock: a poll of an
/// unchanged box is a cached read of ~15 ns here, so this many take a few microseconds,
/// less than the pure spin of a wait that does read it, whatever the rank count.
const FAST_POLLS: u32 = 512;

/// Takes message `n` from the lane of every peer in `pending` whose box holds it, into its
/// slot, checking its header against `want`; clears those peers from `pending` and returns
/// them as a mask, or `Err(peer)` for a peer whose stream holds a message instead.
fn take_boxes(
    conns: &mut [Option<super::Conn>],
    n: u64,
    want: &Header,
    bytes: usize,
    slots: &mut [Slot; LANE_MAX_RANKS],
    pending: &mut u32,
    ctx: &OpContext,
) -> Result<std::result::Result<u32, usize>> {
    let mut arrived = 0;
    for (p, slot) in slots.iter_mut().enumerate().take(conns.len()) {
        if *pending & (1 << p) == 0 {
            continue;
        }
        let lane = conns
            .get_mut(p)
            .and_then(Option::as_mut)
            .and_then(|c| c.lane())
            .ok_or_else(|| {
                Error::internal(format!(
                    "{}: no small-message lane to rank {p}",
                    ctx.label()
                ))
            })?;
        match lane
            .take(n, &mut slot.0[..bytes])
            .map_err(|e| e.context(ctx.label()))?
        {
            LaneTake::Arrived(tag) => {
                check_header(ctx, p, &header_of(tag), want)?;
                *pending &= !(1 << p);
                arrived |= 1 << p;
            }
            LaneTake::Empty => {}
            LaneTake::Stream => return Ok(Err(p)),
        }
    }
    Ok(Ok(arrived))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_words_carry_every_header_field() {
        let h = Header {
            kind: 3,
            dtype: 9,
            op: 4,
            seq: 1 << 40 | 17,
            count: 1 << 50 | 5,
            root: u32::MAX,
            len: 96,
        };
        assert_eq!(header_of(tag_of(&h)), h);
        let other = Header { root: 7, ..h };
        assert_ne!(tag_of(&other), tag_of(&h));
    }
}
