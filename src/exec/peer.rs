//! Collectives straight between the ranks' device buffers: where every rank of a communicator
//! is a thread of one process, their device buffers are memory of one address space, and each
//! rank can reduce or copy its share of the data from the other ranks' buffers into theirs
//! itself, in one reduce-copy kernel (the reducer's [`Reducer::queue_many`]; an all_to_all
//! makes one copy per rank), instead of passing pieces from slot to slot along a ring. What
//! each rank does is its [`share`]: for an allreduce, chunk `r` of the elements, from every
//! input into every output.
//!
//! Per call (any collective with elements, all_to_all only out of place, on a
//! communicator where [`Engine::set_peer_direct`] was turned on, the same on every rank; before
//! the small-message lanes, which a tiny allreduce takes where the ranks do not agree to this):
//!
//! 1. **Offer.** One allreduce (max) of a few words through the small-message lanes (up to
//!    five ranks): a key of the rank's process, memory space and pre-multiplication factor
//!    and the key's complement (so that max gives the least key too; a rank that cannot take
//!    part, not holding device buffers of a reducer that reduces many buffers in one pass,
//!    offers two all-ones words, which no key matches), and where its input and output start,
//!    in its own words, and its ready mark: where the call is ordered on the caller's stream
//!    ([`DeviceArena::call_stream`]), an event at the end of the work queued there before the
//!    call (a blocking call's buffers are ready: no mark). Every rank gets the same words, so
//!    every rank reaches the same verdict: one key, and no rank's buffers overlapping
//!    another's (in place, a rank's input and output are blocks of one buffer). Otherwise
//!    every rank runs the schedule as before (a call on a stream first waits for it,
//!    [`DeviceArena::settle`]): so do ranks whose pre-multiplied sums have factors of their
//!    own (one kernel scales every source alike).
//! 2. **Share.** Rank `r` queues, on the call's stream (a blocking call: the reducer's own),
//!    waits for the other ranks' ready marks, its share, and its done mark; a blocking rank
//!    instead waits for its share on the host and offers no done mark (none to record or to
//!    wait for where every rank blocks: two driver calls less a call). In place this is
//!    safe: a rank writes only its own chunk or block of each buffer, which no other rank
//!    reads, and the kernel reads an element of every source before it writes that element.
//! 3. **Done.** One more lane allreduce (max) of a status word and every rank's done mark;
//!    each rank's stream then waits for the other ranks' done marks, so that no stream goes
//!    past the call while another rank may still be writing its output or reading its input
//!    (a blocking call waits for its stream here, where it waited for one). A rank that failed
//!    to queue its share is named by all of them (the outputs are then incomplete, and every
//!    rank says so).
//!
//! The exchanges order the marks' re-records: a rank records its ready mark again only after
//! the status exchange of the call before (every rank has queued its waits for it by then), its
//! done mark only after the next offer (likewise). A call on a stream returns once this is
//! queued; a kernel that fails afterwards shows on the stream, as CUDA's asynchronous errors do.
//!
//! Ranks that are processes of one host take the same steps for buffers in windows
//! (`windows.rs`): the offer names window places and offsets instead of addresses, and the
//! marks are the reducers' shared marks (interprocess events, exchanged at registration; the
//! ranks of a call on a stream offer `[SHARED, record]`). Host waits that may hang on another
//! process's mark poll with the engine's deadline.
//!
//! A call cut into device slices offers the whole call at its first slice
//! ([`Engine::offer_whole`]); where every rank agrees, the whole call runs here and its other
//! slices are done. The offer's allreduce carries the call's header, so ranks whose calls do
//! not match fail there, before any share touches another rank's buffers.
//!
//! Traffic of an allreduce: each rank reads `n` chunks and writes `n` chunks of `S / n` bytes,
//! `2 × S` per rank and `2 × n × S` in all, against the `9 × S` of the two-rank ring on the p2p
//! transport's slots (copy into the peer's slot, reduce from it, copy the result over, copy it
//! out). No host round trip per piece: two lane exchanges, one launch and a few event records
//! and waits a call.

use std::sync::Arc;

use ferroccl_kernels::{DataType, ElemOp};
use ferroccl_transport::{Error, MemRef, MemSpace, Result};

use super::windows::{SharedMarks, Window, Windows};
use super::{DeviceArena, Engine, Memory, OpContext};
use crate::coll::{CollArgs, CollKind};
use crate::reduce::{Mark, MarkUse, Reducer, NO_MARK};

mod shares;
mod staged;

use shares::{apart, reach_all, resolve_all, share, used};

/// Most ranks: one source and one destination per rank in one reduce-copy.
pub(crate) const PEER_MAX_RANKS: usize = ferroccl_cuda::MAX_SRCS;

/// The engine's state for collectives straight between the buffers.
#[derive(Debug, Default)]
pub(super) struct Peer {
    /// Tried at all: every rank a thread of this process, and asked for.
    on: bool,
    /// Ranks of several processes of one host, asked for: their windows, through which their
    /// buffers are offered instead of by address ([`Engine::set_peer_windows`]).
    windows: Option<Windows>,
    /// Calls that ran so.
    calls: u64,
    /// In an offer, a status exchange or another exchange of the engine's own (the root
    /// agreement): those allreduces of host words are never offered.
    busy: bool,
    /// The whole of a call cut into slices, offered at its first slice instead of the slice
    /// ([`Engine::offer_whole`]).
    whole: Option<Whole>,
    /// The count of the whole call the last collective ran, where it ran one offered so.
    ran_whole: Option<usize>,
    /// The stream of the last call through the scratch windows (`Some(None)`: a blocking
    /// one), where one ran (`staged.rs`).
    last_staged: Option<Option<usize>>,
}

/// A whole call offered at its first slice: its count, and its [`Memory`] as plain numbers
/// (kept between calls of the engine, which moves between threads).
#[derive(Debug, Clone, Copy)]
pub(super) struct Whole {
    count: usize,
    input: usize,
    input_len: usize,
    output: usize,
    output_len: usize,
    in_place: bool,
    space: MemSpace,
}

impl Whole {
    fn memory(&self) -> Memory {
        Memory {
            input: self.input as *const u8,
            input_len: self.input_len,
            output: self.output as *mut u8,
            output_len: self.output_len,
            in_place: self.in_place,
            space: self.space,
        }
    }
}

/// The key every rank offers where it can make the scratch window and it is wanted
/// (`staged.rs`); never a key of [`key_in`] (whose top bit is clear).
const SETUP_KEY: u64 = 0xfe5c_7a7c_5e70_0001;
const NOT_SETUP_KEY: u64 = !SETUP_KEY;

/// What every round of a call between the buffers shares: the reducer and stream it queues
/// on, the reduction, every rank's memory here, and the collective (for errors).
pub(super) struct Round<'a> {
    pub reducer: &'a dyn Reducer,
    pub on: Option<usize>,
    pub ops: (DataType, ElemOp, Option<f64>),
    pub spaces: &'a [MemSpace],
    pub kind: CollKind,
}

/// The first word of a shared mark in an offer (the second names the record).
const SHARED: u64 = 1;

/// Words of the offer: key, !key, then [`PER_RANK`] of each rank.
const HEAD: usize = 2;
/// A rank's words of the offer: its input, its output, its ready mark (two words).
const PER_RANK: usize = 4;
/// Bits of an offer's address word that hold the address: user and device addresses lie below
/// 2^57 (five-level paging's user space; CUDA's unified addresses), and the bits above carry
/// the rank's device (input word) and whether it is in place (output word).
const ADDR_BITS: u32 = 57;
const ADDR_MASK: u64 = (1 << ADDR_BITS) - 1;
/// The highest device ordinal an offer carries (six bits above the input's address).
const MAX_ORDINAL: u32 = 63;
/// The bit of a rank's output word that says it is in place.
const IN_PLACE: u64 = 1 << 63;
/// The bit of a rank's input word (by address) that says some buffer of its is not memory
/// that another device's peer access reaches ([`Reducer::peer_mappable`]): then every rank
/// must be on one device.
const NOT_PLAIN: u64 = 1 << 63;

/// This process's part of the key: random per process, so that ranks of two processes (which
/// `set_peer_direct` should have kept apart already) never agree on one. The process id is
/// hashed in at every call, so the children of a `fork` (which inherit the random part) differ.
pub(super) fn process_token() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static SEED: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    let mut h = SEED.get_or_init(Default::default).build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}

/// The key of memory `space` in this process, for a call of `count` elements pre-multiplied by
/// `premul`: never all ones (the word of a rank that cannot take part). Devices of one process
/// share a key: whether one reaches another is asked of the reducer once the devices are
/// known. The count is in it because a whole call is offered under its first slice's header,
/// which two calls of different counts may share.
fn key_of(space: MemSpace, count: usize, premul: Option<f64>) -> u64 {
    key_in(&process_token().to_le_bytes(), space, count, premul)
}

/// The key of a call through windows ([`Engine::set_peer_windows`]): as [`key_of`], with no
/// process in it (the ranks are of several processes) and never equal to a key of
/// [`key_of`]'s.
fn key_of_windows(space: MemSpace, count: usize, premul: Option<f64>) -> u64 {
    key_in(b"windows", space, count, premul)
}

/// The key of a call through the scratch windows (`staged.rs`): as [`key_of_windows`], never
/// equal to one of its keys, so that every rank goes through its scratch or none does.
fn key_of_scratch(space: MemSpace, count: usize, premul: Option<f64>) -> u64 {
    key_in(b"scratch", space, count, premul)
}

/// A key of `scope` (a process, or windows), memory `space`, `count` and `premul`.
fn key_in(scope: &[u8], space: MemSpace, count: usize, premul: Option<f64>) -> u64 {
    let code: u64 = match space {
        MemSpace::Host => 0,
        MemSpace::Cuda(_) => 1,
    };
    let factor = premul.map_or(u64::MAX, f64::to_bits);
    ferroccl_transport::hash64(&[
        scope,
        &code.to_le_bytes(),
        &(count as u64).to_le_bytes(),
        &factor.to_le_bytes(),
    ]) >> 1
}

impl Engine {
    /// Lets collectives of device buffers go straight between the ranks' buffers. Turned on
    /// only where every rank is a thread of this process (the same on every rank) and the
    /// communicator has at most [`PEER_MAX_RANKS`] ranks.
    pub(crate) fn set_peer_direct(&mut self, on: bool) {
        self.peer.on = on && (2..=PEER_MAX_RANKS).contains(&self.nranks);
    }

    /// Whether collectives of device buffers are offered straight between the ranks' buffers
    /// by address ([`Engine::set_peer_direct`]; not through windows).
    pub(crate) fn peer_direct(&self) -> bool {
        self.peer.on
    }

    /// Lets collectives of device buffers in windows go straight between the ranks' buffers
    /// where the ranks are processes of one host (the same on every rank): see
    /// `windows.rs`. Not where every rank is a thread of this process (that offers by
    /// address: [`Engine::set_peer_direct`]), nor beyond [`PEER_MAX_RANKS`] ranks.
    pub(crate) fn set_peer_windows(&mut self, on: bool) {
        let limit = self.wait.timeout;
        self.peer.windows = (on && !self.peer.on && (2..=PEER_MAX_RANKS).contains(&self.nranks))
            .then(|| {
                let mut ws = Windows::default();
                ws.limit = limit;
                ws
            });
    }

    /// Whether windows are exchanged at registration ([`Engine::set_peer_windows`]).
    pub(crate) fn peer_windows(&self) -> bool {
        self.peer.windows.is_some()
    }

    /// Adds a window registered on every rank; its place (the same on every rank). `None`
    /// where windows are not exchanged, or too many are held.
    pub(crate) fn add_window(&mut self, w: Window) -> Option<usize> {
        Some(self.peer.windows.as_mut()?.add(w))
    }

    /// The ranks' shared marks, where windows are exchanged and the marks were
    /// (`windows.rs`).
    pub(crate) fn peer_marks(&self) -> Option<Arc<SharedMarks>> {
        self.peer.windows.as_ref()?.marks.clone()
    }

    /// Whether calls through windows on a stream are offered: the ranks shared their marks and
    /// some window can carry a call (the same on every rank); or the scratch window is wanted,
    /// which the offer of such a call makes (the call itself then waits for its stream and
    /// takes the schedule).
    pub(crate) fn windows_in_order(&self) -> bool {
        (self.peer_marks().is_some() && self.offered()) || self.scratch_wanted().is_some()
    }

    /// Shortens the wait for this rank's last shares through windows when they go
    /// ([`super::windows::FAILED_SETTLE`]): the communicator failed, and a share may wait for a rank that is
    /// gone.
    pub(super) fn windows_failed(&mut self) {
        if let Some(ws) = self.peer.windows.as_mut() {
            ws.limit = ws.limit.min(super::windows::FAILED_SETTLE);
        }
    }

    /// Keeps the shared marks every rank opened (registration agreed on them).
    pub(super) fn set_peer_marks(&mut self, marks: Option<Arc<SharedMarks>>) {
        if let Some(ws) = self.peer.windows.as_mut() {
            ws.marks = marks;
        }
    }

    /// The windows, where they are exchanged.
    pub(super) fn peer_windows_ref(&self) -> Option<&Windows> {
        self.peer.windows.as_ref()
    }

    /// The windows, where they are exchanged.
    pub(super) fn windows_mut(&mut self) -> Option<&mut Windows> {
        self.peer.windows.as_mut()
    }

    /// Windows held ([`Engine::add_window`]).
    pub(crate) fn window_count(&self) -> usize {
        self.peer.windows.as_ref().map_or(0, Windows::len)
    }

    /// Takes the window at `place` out, to be dropped once every rank is past it.
    pub(crate) fn take_window(&mut self, place: usize) -> Option<Window> {
        self.peer.windows.as_mut()?.take(place)
    }

    /// Whether collectives are offered at all: by address, or through windows where some
    /// window can carry one (the same on every rank: registration is collective).
    fn offered(&self) -> bool {
        self.peer.on
            || self
                .peer
                .windows
                .as_ref()
                .is_some_and(|ws| ws.any_usable() || ws.scratch_offered())
    }

    /// Collectives that went straight between the ranks' buffers.
    pub(crate) fn peer_calls(&self) -> u64 {
        self.peer.calls
    }

    /// Makes the next collective, the first slice of a call cut into slices, offer the whole
    /// call (`count` elements in `mem`) instead of the slice: where every rank agrees, the
    /// whole call runs between the buffers in one share per rank, and
    /// [`Engine::ran_whole`] says so (the other slices are then done); otherwise the slice
    /// runs as before. Ranks that never make this offer (they stage) offer nothing for the
    /// slice either, so every rank still exchanges the same words.
    pub(crate) fn offer_whole(&mut self, count: usize, mem: Memory) {
        if self.offered() {
            self.peer.whole = Some(Whole {
                count,
                input: mem.input as usize,
                input_len: mem.input_len,
                output: mem.output as usize,
                output_len: mem.output_len,
                in_place: mem.in_place,
                space: mem.space,
            });
        }
    }

    /// Whether the collective since [`Engine::offer_whole`] ran the whole call; forgets an
    /// offer no collective took.
    pub(crate) fn ran_whole(&mut self) -> bool {
        self.peer.whole = None;
        self.peer.ran_whole.take().is_some()
    }

    /// The count of the whole call the last collective ran, where it ran one
    /// ([`Engine::offer_whole`]; until [`Engine::ran_whole`] is asked).
    pub(super) fn whole_count(&self) -> Option<usize> {
        self.peer.ran_whole
    }

    /// The whole call offered for the coming collective, taken (only one collective sees it).
    pub(super) fn take_whole(&mut self) -> Option<Whole> {
        self.peer.whole.take()
    }

    /// Whether collective `args` is offered straight between the buffers: the same answer
    /// on every rank, whatever its buffers.
    pub(super) fn peer_fits(&self, args: &CollArgs) -> bool {
        self.offered()
            && !self.peer.busy
            && args.count > 0
            && self.tuning.probe.is_none()
            && self.tuning.overrides == crate::plan::Overrides::default()
    }

    /// Offers collective `args` straight between the ranks' buffers (see the module), or
    /// the whole call it is the first slice of (`whole`: its count and buffers);
    /// `Ok(true)` when it ran so, `Ok(false)` when the ranks agreed to run the schedule
    /// instead. `arena`: this rank's device arena (its reducer, and the caller's stream where
    /// the call is ordered on one), for device buffers.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn peer_collective(
        &mut self,
        args: &CollArgs,
        dtype: DataType,
        op: ElemOp,
        premul: Option<f64>,
        mem: &Memory,
        ctx: &OpContext,
        arena: Option<&mut (dyn DeviceArena + 'static)>,
        whole: Option<Whole>,
    ) -> Result<bool> {
        let on = arena.as_deref().and_then(|a| a.call_stream());
        let device = arena.as_deref().map(|a| a.reducer());
        let reducer = device.as_deref();
        let (n, me, es, kind) = (self.nranks, self.rank, dtype.size(), args.kind);
        let whole_mem = whole.map(|w| w.memory());
        let mem = whole_mem.as_ref().unwrap_or(mem);
        let args = &CollArgs {
            count: whole.map_or(args.count, |w| w.count),
            ..*args
        };
        // Where this rank's input and output start (in place, blocks of the one buffer).
        let (in_off, out_off) = if mem.in_place {
            kind.in_place_offsets(args.count, me)
        } else {
            (0, 0)
        };
        let (base, base_len) = if mem.in_place {
            (mem.output as usize, mem.output_len)
        } else {
            (mem.input as usize, mem.input_len)
        };
        let mine = (base + in_off * es, mem.output as usize + out_off * es);
        let (in_used, out_used) = used(kind, args.count, n, me, es);
        let room = |off: usize, used: usize, len: usize| used == 0 || off * es + used <= len;
        let ordinal = match mem.space {
            MemSpace::Cuda(o) if o <= MAX_ORDINAL => o,
            _ => 0,
        };
        // Through windows (ranks of several processes): the buffers are offered by window
        // place and offset, and the marks are the shared ones (`windows.rs`), of the reducer
        // that shared them: a rank whose call has another does not take part.
        let across = self.peer.windows.is_some();
        let shared = self.peer_marks();
        let shared = shared.as_deref();
        let same_reducer = match (shared, reducer) {
            (Some(m), Some(r)) => {
                std::ptr::addr_eq(Arc::as_ptr(&m.reducer), r as *const dyn Reducer)
            }
            _ => false,
        };
        let mut able = mem.space == MemSpace::Cuda(ordinal)
            && (mine.0 | mine.1) as u64 & !ADDR_MASK == 0
            && reducer.is_some_and(|r| r.reduces_many() && r.serves(mem.space))
            && room(in_off, in_used, base_len)
            && room(out_off, out_used, mem.output_len)
            && (shared.is_none() || same_reducer);
        // The scratch window wanted and not made yet: every rank that could use it says so,
        // and where all can, all make it now (this call takes the schedule).
        let setup = across.then(|| self.scratch_wanted()).flatten();
        let can_setup = setup.is_some() && able && arena.is_some();
        if setup.is_some() {
            able = false;
        }
        let windows = self.peer.windows.as_ref();
        let in_window = |addr: usize, len: usize| match (len, windows) {
            (0, _) => Some(0),
            (_, Some(ws)) => ws.word_of(me, addr as u64, len),
            (_, None) => None,
        };
        let win_words = (in_window(mine.0, in_used), in_window(mine.1, out_used));
        let in_windows = win_words.0.is_some() && win_words.1.is_some();
        // Buffers in no window go through the scratch windows (`staged.rs`): the part of the
        // input the others read (of the first piece) is copied into this rank's scratch now,
        // before the ready mark (on a stream, only where that mark can be shared).
        let staging = across && able && !in_windows && (on.is_none() || shared.is_some());
        let (scratch, plan) = match reducer.filter(|_| staging) {
            Some(r) => {
                let call = staged::Call {
                    args,
                    dtype,
                    op,
                    mem,
                    mine,
                    used: (in_used, out_used),
                    on,
                };
                self.stage_in(&call, r, ctx)
            }
            None => (None, None),
        };
        // A call ordered on a stream offers where the work queued before it ends, so that the
        // other ranks' shares wait for it (a blocking call's buffers are ready now). A rank
        // that cannot mark its stream does not take part; through windows, nor one without
        // shared marks (a stream of another process cannot wait for this one's own events).
        let ready = match (able, on, reducer) {
            (true, Some(_), Some(r)) if across => match shared {
                Some(_) => r.mark_shared(on, MarkUse::Ready).map(|w| [SHARED, w]),
                None => Err(Error::internal("no shared marks")),
            },
            (true, Some(_), Some(r)) => r.mark(on, MarkUse::Ready),
            _ => Ok(NO_MARK),
        }
        .unwrap_or_else(|_| {
            able = false;
            NO_MARK
        });
        if across {
            able &= in_windows || plan.is_some();
        }
        let key = match (across, plan.is_some()) {
            (true, true) => key_of_scratch(mem.space, args.count, premul),
            (true, false) => key_of_windows(mem.space, args.count, premul),
            (false, _) => key_of(mem.space, args.count, premul),
        };
        let mut words = vec![0u64; HEAD + PER_RANK * n];
        (words[0], words[1]) = match (able, can_setup) {
            (true, _) => (key, !key),
            (false, true) => (SETUP_KEY, !SETUP_KEY),
            (false, false) => (u64::MAX, u64::MAX),
        };
        // Above the addresses: the input's word carries the rank's device, the output's
        // whether the rank is in place.
        let at = HEAD + PER_RANK * me;
        (words[at], words[at + 1]) = match (across, win_words) {
            (true, _) if plan.is_some() => (0, 0),
            (true, (Some(i), Some(o))) => (i, o),
            (true, _) => (0, 0),
            (false, _) => {
                let plain = |addr: usize, len: usize| {
                    reducer.is_some_and(|r| {
                        r.peer_mappable(MemRef {
                            space: mem.space,
                            addr,
                            len,
                        })
                    })
                };
                let not_plain = able && !(plain(mine.0, in_used) && plain(mine.1, out_used));
                (
                    mine.0 as u64 & ADDR_MASK
                        | u64::from(ordinal) << ADDR_BITS
                        | u64::from(not_plain) << 63,
                    mine.1 as u64 & ADDR_MASK,
                )
            }
        };
        words[at + 1] |= u64::from(mem.in_place) << 63;
        words[at + 2..at + 4].copy_from_slice(&ready);
        self.max_words(&mut words, ctx)?;
        if let (Some(bytes), [SETUP_KEY, NOT_SETUP_KEY, ..], Some(a), Some(r)) =
            (setup, &words[..], arena, device.as_ref())
        {
            self.make_scratch(bytes, a, Arc::clone(r), ctx)?;
            return Ok(false);
        }
        let word = |k: usize, w: usize| words[HEAD + PER_RANK * k + w];
        let lens: Vec<(usize, usize)> = (0..n).map(|k| used(kind, args.count, n, k, es)).collect();
        let in_place: Vec<bool> = (0..n).map(|k| word(k, 1) & IN_PLACE != 0).collect();
        let any_in_place = in_place.iter().any(|&p| p);
        let one_key = words[0] == !words[1];
        // Every rank's buffers here, their memory here, and, to tell overlaps, where they lie
        // in their owners' processes and which process that is.
        let (bufs, spaces, verdict) = match self.peer.windows.as_ref() {
            // Every rank offered the scratch key: the plan names this rank's buffers and the
            // scratch windows only.
            _ if one_key && plan.is_some() => {
                (Vec::new(), scratch.clone().unwrap_or_default(), true)
            }
            None => {
                let bufs: Vec<(usize, usize)> = (0..n)
                    .map(|k| {
                        (
                            (word(k, 0) & ADDR_MASK) as usize,
                            (word(k, 1) & ADDR_MASK) as usize,
                        )
                    })
                    .collect();
                let spaces: Vec<MemSpace> = (0..n)
                    .map(|k| MemSpace::Cuda((word(k, 0) >> ADDR_BITS) as u32 & MAX_ORDINAL))
                    .collect();
                // Buffers apart, and every rank's device reaching every other's (a property
                // of this process's devices, so the same answer on every rank), with buffers
                // that peer access covers where the devices differ.
                let one_device = spaces.iter().all(|&s| s == spaces[0]);
                let plain = (0..n).all(|k| word(k, 0) & NOT_PLAIN == 0);
                let ok = one_key
                    && apart(&bufs, &lens, &in_place, &[0; PEER_MAX_RANKS][..n])
                    && reducer.is_some_and(|r| reach_all(r, &spaces))
                    && (one_device || plain);
                (bufs, spaces, ok)
            }
            // Every rank resolves the same words against the same windows. A mapping made at
            // registration reaches its memory (no reach check); ranks of two processes never
            // overlap, whatever their addresses.
            Some(ws) => match one_key.then(|| resolve_all(ws, &lens, word)).flatten() {
                Some((bufs, own, spaces, processes)) => {
                    let ok = apart(&own, &lens, &in_place, &processes);
                    (bufs, spaces, ok)
                }
                None => (Vec::new(), Vec::new(), false),
            },
        };
        // The verdict holds one key (so every rank is able, and holds a reducer).
        let Some(reducer) = reducer.filter(|_| verdict) else {
            return Ok(false);
        };
        let round = Round {
            reducer,
            on,
            ops: (dtype, op, premul),
            spaces: &spaces,
            kind,
        };
        let ready: Vec<Mark> = (0..n).map(|k| [word(k, 2), word(k, 3)]).collect();
        match plan.filter(|_| one_key) {
            // Through the scratch windows, piece by piece.
            Some(staged) => self.scratch_rounds(&round, staged, ready, ctx)?,
            None => match share(kind, args.count, n, me, es, &bufs, any_in_place) {
                Some(todo) => self.share_round(&round, &todo, &[], &ready, ctx)?,
                None => return Ok(false),
            },
        }
        self.peer.calls += 1;
        self.peer.ran_whole = whole.map(|w| w.count);
        Ok(true)
    }

    /// One round of a call between the buffers (see the module): waits for the other ranks'
    /// `ready` marks, this rank's shares `todo`, its done mark, the status exchange, the waits
    /// for the others' done marks, the copies `copy_out` (through the scratch windows), the
    /// settle point (through windows, on a stream); a blocking rank waits for all of it.
    fn share_round(
        &mut self,
        round: &Round<'_>,
        todo: &[shares::Share],
        copy_out: &[shares::Share],
        ready: &[Mark],
        ctx: &OpContext,
    ) -> Result<()> {
        // A wait on the host for a stream that may wait for another process's mark ends in an
        // error at the engine's deadline.
        let (n, me, limit) = (self.nranks, self.rank, self.wait.timeout);
        let (reducer, on, spaces, kind) = (round.reducer, round.on, round.spaces, round.kind);
        let (dtype, op, _) = round.ops;
        let across = self.peer.windows.is_some();
        let shared = self.peer_marks();
        let shared = shared.as_deref();
        // Queued on the call's stream (a blocking call: the reducer's own): after the other
        // ranks' ready marks, this rank's share, then its done mark.
        crate::profile::phase(crate::profile::Phase::Reduce);
        // Waits for rank `k`'s mark `which` (a blocking rank's NO_MARK: nothing); through
        // windows, its shared mark (every rank that takes part there holds them).
        let wait_for = |k: usize, which: MarkUse, mark: Mark| match (mark, shared) {
            (NO_MARK, _) => Ok(false),
            (_, None) => reducer.wait_mark(on, mark).map(|()| true),
            (_, Some(m)) => match m.peers.get(k).and_then(Option::as_ref) {
                Some(p) => reducer.wait_shared(on, p, which, mark[1]).map(|()| true),
                None => Err(Error::internal(format!(
                    "rank {k}'s shared marks are not open"
                ))),
            },
        };
        let queued = (|| {
            // Whether the share waits for another rank's ready mark (through windows: another
            // process's, which may never come).
            let mut waits_ready = false;
            for k in (0..n).filter(|&k| k != me) {
                waits_ready |= wait_for(k, MarkUse::Ready, ready[k])?;
            }
            staged::queue_shares(reducer, on, round.ops, todo, spaces)?;
            match (across, on) {
                // A blocking rank's share is done before the status exchange (it offers no
                // mark, and so needs none recorded or waited for where every rank blocks);
                // the wait has a deadline only where the share waits for another process.
                (_, None) => match across && waits_ready {
                    true => reducer.synchronize_within(None, limit),
                    false => reducer.synchronize(None),
                }
                .map(|()| NO_MARK),
                (true, Some(_)) => reducer.mark_shared(on, MarkUse::Done).map(|w| [SHARED, w]),
                (false, _) => reducer.mark(on, MarkUse::Done),
            }
        })();
        crate::profile::phase(crate::profile::Phase::Drive);
        let mut status = vec![0u64; 1 + 2 * n];
        match &queued {
            Ok(done) => status[1 + 2 * me..3 + 2 * me].copy_from_slice(done),
            Err(_) => {
                // Part of the share may be queued (an all_to_all's first copies) and write
                // other ranks' outputs, which they will not wait for: it is done before this
                // rank says it failed (the stream waits only for marks recorded already).
                let _ = reducer.synchronize_within(on, limit);
                status[0] = me as u64 + 1;
            }
        }
        if let Err(e) = self.max_words(&mut status, ctx) {
            // The exchange failed (a peer gone, the deadline): this rank's share may be
            // queued and reach other ranks' buffers; it is done before the error returns.
            let _ = reducer.synchronize_within(on, limit);
            return Err(e);
        }
        // No rank's stream goes past the call before every share that reads its input or
        // writes its output is done (the shares that were queued: a rank that failed to queue
        // its own still waits for the others'); a blocking call waits for that here.
        // Every wait is queued even where one fails (the first error is returned).
        let mut settled: Result<()> = Ok(());
        let mut waits = false;
        for k in (0..n).filter(|&k| k != me) {
            let mark = [status[1 + 2 * k], status[2 + 2 * k]];
            match wait_for(k, MarkUse::Done, mark) {
                Ok(w) => waits |= w,
                Err(e) => settled = settled.and(Err(e)),
            }
        }
        // Through the scratch windows: the chunks the others reduced, copied out of their
        // scratch (where every share was queued; a blocking rank then waits for them too).
        if status[0] == 0 && queued.is_ok() && !copy_out.is_empty() {
            let ops = (dtype, op, None);
            settled = settled.and(staged::queue_shares(reducer, on, ops, copy_out, spaces));
            waits = true;
        }
        // Through windows on a stream: the settle point after those waits and copies (queued
        // even where the share failed), which the windows' last deregistration, and a call
        // through the scratch windows on another stream, wait for (`windows.rs`, `staged.rs`).
        if let (true, Some(_)) = (across, on) {
            settled = settled.and(reducer.mark_settled(on));
        }
        // (A blocking rank's own share was waited for before the status exchange already: it
        // waits again only for the shares of ranks on a stream.)
        if on.is_none() {
            let synced = match (across, waits) {
                (_, false) => Ok(()),
                (false, true) => reducer.synchronize(None),
                (true, true) => reducer.synchronize_within(None, limit),
            };
            settled = settled.and(synced);
        }
        queued.map_err(|e| e.context(ctx.label()))?;
        settled.map_err(|e: Error| e.context(ctx.label()))?;
        if status[0] != 0 {
            return Err(Error::remote(format!(
                "{}: rank {} failed to queue its share of the {} straight between the ranks' \
                 buffers; this rank's result is incomplete",
                ctx.label(),
                status[0] - 1,
                kind.name()
            )));
        }
        Ok(())
    }

    /// `words = max over the ranks of words`, in place, as an allreduce of host memory under
    /// `ctx` (through the lanes where it fits them).
    pub(super) fn max_words(&mut self, words: &mut [u64], ctx: &OpContext) -> Result<()> {
        let args = CollArgs {
            kind: CollKind::AllReduce,
            count: words.len(),
            in_place: true,
        };
        let mem = Memory::host(None, ferroccl_kernels::as_bytes_mut(words));
        self.unoffered(|e| e.run_collective(&args, DataType::Uint64, ElemOp::Max, None, mem, ctx))
    }

    /// Runs `f`, an exchange of the engine's own on host words, without offering its
    /// collectives between the ranks' buffers (they would only be declined, at the cost of an
    /// exchange each).
    pub(super) fn unoffered<R>(&mut self, f: impl FnOnce(&mut Engine) -> R) -> R {
        let was = std::mem::replace(&mut self.peer.busy, true);
        let r = f(self);
        self.peer.busy = was;
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_differ_by_kind_of_memory_count_and_factor_not_by_device() {
        let key = |n: u32, f: Option<f64>| key_of(MemSpace::Cuda(n), 64, f);
        // Devices of one process share a key; whether they reach each other is asked apart.
        assert_eq!(key(0, None), key(1, None));
        assert_ne!(key(0, None), key_of(MemSpace::Host, 64, None));
        assert_ne!(key(0, None), key_of(MemSpace::Cuda(0), 65, None));
        assert_eq!(key(3, None), key(3, None));
        assert_ne!(key(0, Some(0.5)), key(0, Some(0.25)));
        assert_ne!(key(0, Some(1.0)), key(0, None));
        assert_eq!(key(0, Some(0.5)), key(0, Some(0.5)));
        // Through windows: no process in the key, and never a process's key.
        let win = |f: Option<f64>| key_of_windows(MemSpace::Cuda(0), 64, f);
        assert_ne!(win(None), key(0, None));
        assert_eq!(win(None), key_of_windows(MemSpace::Cuda(2), 64, None));
        assert_ne!(win(None), key_of_windows(MemSpace::Cuda(0), 65, None));
        assert_ne!(win(Some(0.5)), win(None));
        // The offer's words of a rank that cannot take part match no key.
        assert_ne!(key(0, None), u64::MAX);
        assert_ne!(!key(0, None), 0);
    }
}
