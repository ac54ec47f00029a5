//! Windows: device buffers registered with every rank of a communicator whose ranks are
//! processes of one host ([`crate::Communicator::register_window`], `ncclCommWindowRegister`).
//! Registration is collective, so every rank holds the same list, in the same order, of every
//! rank's window: where it lies in its owner's process, and where this process mapped it
//! (CUDA IPC). A collective whose buffers lie in windows can then go straight between the
//! ranks' buffers (`peer.rs`) although they live in other address spaces: the offer names a
//! window and an offset instead of an address, and every rank reads the same list.
//!
//! Deregistration is collective too: every rank unmaps its mappings of the window before any
//! rank returns, so no rank frees memory that another still maps (CUDA leaves a free of
//! exported memory undefined while another process holds it open).
//!
//! **Shared marks.** At the first registration where every rank holds a reducer that can,
//! the ranks also exchange their reducers' marks as interprocess events
//! ([`Reducer::share_marks`]) and each opens every other's (ranks that are threads of one
//! process among others' too: the reducer opens its own process's as they are, which CUDA
//! does not open as another process's): calls ordered on a stream
//! can then go between the buffers too, each stream waiting for the others' marks as between
//! threads. Whether they were exchanged is agreed like the window, the same on every rank.
//! Before a window's mappings go (deregistration, or the communicator's end) the rank waits
//! for its last share ([`Reducer::settle_shared`]), which may still read them. With the last
//! window's deregistration, where every rank settled, the marks go too
//! ([`Reducer::release_shared`]: on CUDA the events are destroyed); a later registration
//! exchanges new ones.

use std::sync::Arc;

use ferroccl_kernels::{DataType, ElemOp};
use ferroccl_transport::{Error, MemSpace, Result};

use super::{Engine, Memory, OpContext};
use crate::coll::{CollArgs, CollKind};
use crate::device::ipc::{Exported, Mapping};
use crate::reduce::{PeerMarks, Reducer, SHARED_MARK_WORDS};

/// One rank's buffer of a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WinRank {
    /// Its process's key (ranks of one process may hold overlapping buffers; ranks of two
    /// processes never do, whatever their addresses).
    pub process: u64,
    /// Where it starts in its owner's process, and its length.
    pub addr: u64,
    pub len: usize,
    /// Where it starts in this process.
    pub here: u64,
    /// Its memory as this process sees it.
    pub space: MemSpace,
}

/// A window: every rank's buffer, the same list on every rank.
#[derive(Debug)]
pub(crate) struct Window {
    /// Every rank exported its buffer and every rank mapped every other's: agreed at
    /// registration, the same on every rank.
    pub usable: bool,
    pub ranks: Vec<WinRank>,
    /// This process's mappings of the other ranks' buffers, unmapped when the window is
    /// dropped (after every share that used them is done: shares are waited for in the call).
    pub _mappings: Vec<Mapping>,
    /// This rank's buffer where the window owns it (a scratch window, `peer/staged.rs`),
    /// freed after the mappings go.
    pub owned: Option<Owned>,
}

/// Memory a window owns ([`Window::owned`]): dropped to free it.
pub(crate) struct Owned {
    _keep: Box<dyn std::any::Any + Send>,
}

impl Owned {
    /// Owns `keep` until dropped.
    pub fn new(keep: Box<dyn std::any::Any + Send>) -> Owned {
        Owned { _keep: keep }
    }
}

impl std::fmt::Debug for Owned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Owned")
    }
}

/// A communicator's scratch window (`peer/staged.rs`): device memory of its own on every
/// rank, registered at its first device collective, through which calls on buffers in no
/// window go between the ranks' GPUs.
#[derive(Debug, Default)]
pub(crate) enum Scratch {
    /// Not asked for (`FERRO_DEVICE_SCRATCH_BYTES` 0).
    #[default]
    Off,
    /// Asked for, this many bytes a rank; made at the first call where every rank can.
    Wanted(usize),
    /// Registered on every rank (usable or not: the same on every rank).
    Held(Window),
}

/// The windows of a communicator, by their place in the order of registration (the same on
/// every rank); a deregistered window leaves its place empty.
#[derive(Debug, Default)]
pub(crate) struct Windows {
    list: Vec<Option<Window>>,
    /// The ranks' shared marks, where they were exchanged (see the module).
    pub marks: Option<Arc<SharedMarks>>,
    /// How long the last shares are waited for when the windows go (the engine's deadline).
    pub limit: std::time::Duration,
    /// The warnings of registration already logged ([`Said`]): each once per communicator
    /// (a program that registers every buffer would log one line per buffer).
    said: u8,
    /// The communicator's own scratch window, where asked for.
    pub scratch: Scratch,
}

/// A warning of registration, logged once per communicator.
#[derive(Debug, Clone, Copy)]
enum Said {
    /// A window carries no collective.
    Unusable = 1,
    /// This rank's marks cannot be shared.
    NoMarks = 2,
}

/// How long a failed communicator's windows wait for this rank's last shares before unmapping
/// (a share waiting for a rank that is gone never runs, and so never reads them).
pub(crate) const FAILED_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// Every other rank's shared marks, opened by this rank's reducer.
#[derive(Debug)]
pub(crate) struct SharedMarks {
    /// The reducer that shared this rank's marks and opened the others': calls through
    /// windows on a stream use it and no other.
    pub reducer: Arc<dyn Reducer>,
    /// By rank (`None`: this rank).
    pub peers: Vec<Option<PeerMarks>>,
}

impl Drop for Windows {
    fn drop(&mut self) {
        // Shares queued on a stream may still read the mappings dropped after this.
        if let Some(m) = &self.marks {
            if let Err(e) = m.reducer.settle_shared(self.limit) {
                ferroccl_transport::log_line!(
                    "ferroccl WARN P2P: waiting for this rank's last shares through windows \
                     before unmapping them: {e}"
                );
            }
        }
    }
}

/// Bits of an offer word that hold the offset in a window; the window's place plus one lies
/// above them, below the top bit.
pub(crate) const OFFSET_BITS: u32 = 48;
const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;
/// The most windows a communicator holds at once in the offer's words.
pub(crate) const MAX_WINDOWS: usize = (1 << (63 - OFFSET_BITS)) - 2;

impl Windows {
    /// Adds a window at the lowest free place (every rank frees and fills the same places in
    /// the same order, so the place is the same on every rank); returns the place.
    pub fn add(&mut self, w: Window) -> usize {
        match self.list.iter().position(Option::is_none) {
            Some(p) => {
                self.list[p] = Some(w);
                p
            }
            None => {
                self.list.push(Some(w));
                self.list.len() - 1
            }
        }
    }

    /// Takes the window at `place` out (`None`: never registered, or taken before); empty
    /// places at the end are let go.
    pub fn take(&mut self, place: usize) -> Option<Window> {
        let w = self.list.get_mut(place).and_then(Option::take);
        while self.list.last().is_some_and(Option::is_none) {
            self.list.pop();
        }
        w
    }

    /// Whether warning `what` was not logged before (and now counts as logged).
    fn first_time(&mut self, what: Said) -> bool {
        let first = self.said & what as u8 == 0;
        self.said |= what as u8;
        first
    }

    /// Windows held.
    pub fn len(&self) -> usize {
        self.list.iter().flatten().count()
    }

    /// Whether some window can carry a collective: where none can, calls are not offered.
    pub fn any_usable(&self) -> bool {
        self.list.iter().flatten().any(|w| w.usable)
    }

    /// The offer word of `[addr, addr + len)` of rank `me`: its usable window's place plus one
    /// above [`OFFSET_BITS`], the offset below. `None`: in no usable window (or past the words'
    /// room). A buffer of length 0 lies in any window that holds its start.
    pub fn word_of(&self, me: usize, addr: u64, len: usize) -> Option<u64> {
        self.list.iter().enumerate().find_map(|(place, w)| {
            let w = w.as_ref().filter(|w| w.usable)?;
            let r = w.ranks.get(me)?;
            let off = addr.checked_sub(r.addr)?;
            let fits = off.checked_add(len as u64)? <= r.len as u64;
            (fits && place < MAX_WINDOWS && off <= OFFSET_MASK)
                .then(|| (place as u64 + 1) << OFFSET_BITS | off)
        })
    }

    /// Rank `k`'s buffer at offer word `word` (its top bit ignored) for `len` bytes: where it
    /// lies in its owner's process, where in this one, its memory here and its process. `None`
    /// where the word names no usable window, or the range runs past rank `k`'s buffer: the
    /// same answer on every rank, which all hold the same list.
    pub fn resolve(&self, k: usize, word: u64, len: usize) -> Option<(u64, u64, MemSpace, u64)> {
        let place = ((word & !(1 << 63)) >> OFFSET_BITS).checked_sub(1)? as usize;
        let off = word & OFFSET_MASK;
        let w = self.list.get(place)?.as_ref().filter(|w| w.usable)?;
        let r = w.ranks.get(k)?;
        (off.checked_add(len as u64)? <= r.len as u64)
            .then(|| (r.addr + off, r.here + off, r.space, r.process))
    }
}

/// Words of a rank's record in the exchange at registration: whether it exported its buffer
/// (bit 0) and its shared marks (bit 1), its process, the buffer's start and length, the
/// allocation's start, the handle (8), and the shared marks' words.
const RECORD: usize = 13 + SHARED_MARK_WORDS;
/// Where the shared marks' words start in a record.
const MARKS_AT: usize = 13;

/// What a rank brings to a window's registration: its buffer, and, where it could export it,
/// the export.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Offered {
    pub addr: u64,
    pub len: usize,
    pub export: Option<Exported>,
}

/// How this process maps another process's export and sees memory: made by the caller, who
/// knows the device provider.
pub(crate) trait Mapper {
    /// Maps `handle` here.
    fn map(&self, handle: &[u8; 64]) -> Result<Mapping>;
    /// The memory holding `[addr, addr + len)` here (`None`: no device memory).
    fn space(&self, addr: u64, len: usize) -> Option<MemSpace>;
    /// Whether a kernel on memory `from`'s device reaches memory `to` (the reducers'
    /// `reaches`: one device, or peer access), for ranks of this process, whose buffers are
    /// not mapped (a mapping of another process's memory reaches it by being made).
    fn reaches(&self, from: MemSpace, to: MemSpace) -> bool;
}

impl Engine {
    /// Registers a window on every rank (see the module): the ranks' records are gathered,
    /// each rank maps every other process's buffer, and the ranks agree whether every mapping
    /// was made; the window then takes the next place on every rank. `Ok(None)` where this
    /// communicator does not exchange windows ([`Engine::set_peer_windows`]; nothing is
    /// exchanged). A window some rank could not export or map is kept unusable, so that
    /// places stay alike on every rank; why is logged on the rank that failed.
    pub(crate) fn register_window(
        &mut self,
        mine: Offered,
        mapper: &dyn Mapper,
        reducer: Option<Arc<dyn Reducer>>,
        ctx: &OpContext,
    ) -> Result<Option<usize>> {
        if !self.peer_windows() {
            return Ok(None);
        }
        if self.window_count() >= MAX_WINDOWS {
            // The same count on every rank: every rank keeps this one local.
            ferroccl_transport::log_line!(
                "ferroccl WARN P2P: {}: this communicator holds {MAX_WINDOWS} windows, the most \
                 it exchanges; this one carries no collective",
                ctx.label()
            );
            return Ok(None);
        }
        let w = self.exchange_window(mine, mapper, reducer, ctx)?;
        Ok(self.add_window(w))
    }

    /// Registration's exchange ([`Engine::register_window`]) of one window, which the caller
    /// keeps (the same on every rank).
    pub(super) fn exchange_window(
        &mut self,
        mine: Offered,
        mapper: &dyn Mapper,
        reducer: Option<Arc<dyn Reducer>>,
        ctx: &OpContext,
    ) -> Result<Window> {
        let (n, me) = (self.nranks, self.rank);
        let mut words = vec![0u64; RECORD * n];
        let rec = &mut words[RECORD * me..RECORD * (me + 1)];
        rec[1] = super::peer::process_token();
        (rec[2], rec[3]) = (mine.addr, mine.len as u64);
        if let Some(e) = mine.export {
            rec[0] = 1;
            rec[4] = e.base;
            for (i, w) in e.handle.chunks_exact(8).enumerate() {
                rec[5 + i] = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
            }
        }
        // The shared marks, until they were exchanged once.
        let wants_marks = self.peer_marks().is_none();
        if let Some(r) = reducer.as_ref().filter(|_| wants_marks) {
            match r.share_marks() {
                Ok(m) => {
                    rec[0] |= 2;
                    rec[MARKS_AT..].copy_from_slice(&m);
                }
                Err(e) if self.said_first(Said::NoMarks) => ferroccl_transport::log_line!(
                    "ferroccl WARN P2P: {}: this rank's marks cannot be shared with other \
                     processes ({e}): calls through windows on a stream wait for their \
                     streams (said once per communicator)",
                    ctx.label()
                ),
                Err(_) => {}
            }
        }
        let args = CollArgs {
            kind: CollKind::AllGather,
            count: RECORD,
            in_place: true,
        };
        let mem = Memory::host(None, ferroccl_kernels::as_bytes_mut(&mut words));
        self.unoffered(|e| e.run_collective(&args, DataType::Uint64, ElemOp::Sum, None, mem, ctx))?;
        let rec = |k: usize| &words[RECORD * k..RECORD * (k + 1)];
        let everyone = (0..n).all(|k| rec(k)[0] & 1 == 1);
        let mut mappings = Vec::new();
        let mut ranks = Vec::with_capacity(n);
        let mut failed = None;
        let mine_here = mapper.space(rec(me)[2], rec(me)[3] as usize);
        for k in 0..n {
            let r = rec(k);
            let (process, addr, len) = (r[1], r[2], r[3] as usize);
            let mut here = addr;
            if everyone && k != me && process != rec(me)[1] {
                let mut handle = [0u8; 64];
                for (i, w) in r[5..MARKS_AT].iter().enumerate() {
                    handle[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
                }
                match mapper.map(&handle) {
                    Ok(m) => {
                        here = m.addr().wrapping_add(addr.wrapping_sub(r[4]));
                        mappings.push(m);
                    }
                    Err(e) => failed = failed.or(Some(format!("mapping rank {k}'s buffer: {e}"))),
                }
            }
            let space = mapper.space(here, len);
            if everyone && failed.is_none() {
                match (space, mine_here) {
                    (None, _) => {
                        failed = Some(format!(
                            "rank {k}'s buffer at 0x{here:x} is not device memory here"
                        ))
                    }
                    (Some(s), Some(m)) if process == rec(me)[1] && !mapper.reaches(m, s) => {
                        failed = Some(format!(
                            "rank {k}'s device does not reach this rank's (no peer access)"
                        ))
                    }
                    _ => {}
                }
            }
            ranks.push(WinRank {
                process,
                addr,
                len,
                here,
                space: space.unwrap_or(MemSpace::Host),
            });
        }
        if let Some(why) = failed.as_ref().filter(|_| self.said_first(Said::Unusable)) {
            ferroccl_transport::log_line!(
                "ferroccl WARN P2P: {}: the window is registered, but collectives on it take the \
                 schedule: {why} (said once per communicator: later windows that carry no \
                 collective are not logged)",
                ctx.label()
            );
        }
        // Every rank shared its marks: each opens the others' (a rank of this process lends
        // its own, which the reducer tells by their words).
        let mut marks = None;
        let mut marks_failed = false;
        if let (true, true, Some(r)) = (wants_marks, (0..n).all(|k| rec(k)[0] & 2 != 0), reducer) {
            let mut peers = Vec::with_capacity(n);
            for k in 0..n {
                let words = rec(k)[MARKS_AT..]
                    .try_into()
                    .unwrap_or([0; SHARED_MARK_WORDS]);
                match (k != me).then(|| r.open_marks(&words)).transpose() {
                    Ok(p) => peers.push(p),
                    Err(e) => {
                        ferroccl_transport::log_line!(
                            "ferroccl WARN P2P: {}: rank {k}'s marks not opened ({e}): calls \
                             through windows on a stream wait for their streams",
                            ctx.label()
                        );
                        marks_failed = true;
                        break;
                    }
                }
            }
            marks = Some(Arc::new(SharedMarks { reducer: r, peers }));
        }
        let mut status =
            [u64::from(failed.is_some()) | u64::from(marks.is_none() || marks_failed) << 1];
        self.max_words(&mut status, ctx)?;
        let usable = everyone && status[0] & 1 == 0;
        if status[0] & 2 == 0 {
            self.set_peer_marks(marks);
        }
        if !usable {
            mappings.clear();
        }
        Ok(Window {
            usable,
            ranks,
            _mappings: mappings,
            owned: None,
        })
    }

    /// Waits on the host for this rank's last shares queued on a stream through windows or
    /// the scratch windows (their settle points): a process that leaves with them queued
    /// takes its streams with it, and the other ranks' shares wait for marks that never come.
    pub(crate) fn settle_peer_shares(&self) -> Result<()> {
        match self.peer_marks() {
            Some(m) => m.reducer.settle_shared(self.wait.timeout),
            None => Ok(()),
        }
    }

    /// Whether registration's warning `what` is logged now: the first time on this
    /// communicator ([`Windows::first_time`]).
    fn said_first(&mut self, what: Said) -> bool {
        self.windows_mut().is_some_and(|w| w.first_time(what))
    }

    /// Deregisters the window at `place` on every rank: each rank unmaps its mappings of it,
    /// then every rank waits for every other, so that no rank frees its buffer while another
    /// process still maps it. A place this rank does not hold still takes part, then is an
    /// error.
    pub(crate) fn deregister_window(&mut self, place: usize, ctx: &OpContext) -> Result<()> {
        let w = self.take_window(place);
        let held = w.is_some();
        let marks = self.peer_marks();
        // This rank's shares on a stream may still read the mappings (and its streams wait
        // for the other ranks' marks until they are settled).
        let settled = match (held, &marks) {
            (true, Some(m)) => m.reducer.settle_shared(self.wait.timeout),
            _ => Ok(()),
        };
        drop(w);
        // The shared marks go with the last window where every rank lets them go: each has
        // settled, so once all are past this exchange no stream waits for any of them.
        // (Not while the scratch window is held: calls on a stream through it use the marks.)
        let scratch_held = self
            .peer_windows_ref()
            .is_some_and(|ws| matches!(ws.scratch, Scratch::Held(_)));
        let release =
            held && marks.is_some() && self.window_count() == 0 && !scratch_held && settled.is_ok();
        let mut words = [u64::from(!release), u64::from(release)];
        self.max_words(&mut words, ctx)?;
        if let (Some(m), [0, 1]) = (marks, words) {
            self.release_marks(&m, "with the last window", ctx);
        }
        settled.map_err(|e| e.context(ctx.label()))?;
        if held {
            Ok(())
        } else {
            Err(Error::invalid_argument(format!(
                "{}: no window at place {place} (never registered, or deregistered before)",
                ctx.label()
            )))
        }
    }

    /// Lets go of the shared marks `m` (every rank settled and agreed): no stream of any rank
    /// waits for them any more.
    fn release_marks(&mut self, m: &SharedMarks, with: &str, ctx: &OpContext) {
        self.set_peer_marks(None);
        if let Err(e) = m.reducer.release_shared(&m.peers) {
            ferroccl_transport::log_line!(
                "ferroccl WARN P2P: {}: letting go of the shared marks {with}: {e}",
                ctx.label()
            );
        }
    }

    /// Whether the scratch window is held and usable: the same on every rank.
    pub(crate) fn scratch_held(&self) -> bool {
        self.peer_windows_ref()
            .is_some_and(|ws| matches!(&ws.scratch, Scratch::Held(w) if w.usable))
    }

    /// Lets go of the scratch window at the communicator's end (`finalize`, `destroy`; every
    /// rank takes part where [`Engine::scratch_held`]). Another process's copies out of this
    /// rank's scratch stay queued on its stream until that process settles, so a rank frees
    /// its scratch only once every rank has: each waits for its own last shares, unmaps the
    /// others' scratch, then every rank waits for every other; where all settled, each frees
    /// its scratch, and with no window left, the shared marks go too. Where a rank did not
    /// settle or take part (the deadline, a rank gone), the scratch is no longer used but
    /// stays allocated until the communicator drops (logged). Later calls take the schedule.
    pub(crate) fn end_scratch(&mut self, ctx: &OpContext) -> Result<()> {
        let marks = self.peer_marks();
        let settled = self.settle_peer_shares();
        let ok = settled.is_ok();
        if let Some(Scratch::Held(w)) = self.windows_mut().map(|ws| &mut ws.scratch) {
            // No call uses it from here; the mappings go once nothing of this rank reads them.
            w.usable = false;
            if ok {
                w._mappings.clear();
            }
        }
        let mut words = [u64::from(!ok), u64::from(ok)];
        let agreed = self.max_words(&mut words, ctx);
        match (&agreed, words) {
            (Ok(()), [0, 1]) => {
                if let Some(ws) = self.windows_mut() {
                    ws.scratch = Scratch::Off;
                }
                if let (Some(m), 0) = (marks, self.window_count()) {
                    self.release_marks(&m, "with the scratch window", ctx);
                }
            }
            _ => ferroccl_transport::log_line!(
                "ferroccl WARN P2P: {}: not every rank settled its last calls through the \
                 scratch windows ({}): this rank keeps its scratch allocated until the \
                 communicator drops",
                ctx.label(),
                match (&settled, &agreed) {
                    (Err(e), _) | (_, Err(e)) => e.to_string(),
                    _ => "another rank's did not".to_string(),
                }
            ),
        }
        settled.and(agreed).map_err(|e| e.context(ctx.label()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(usable: bool, ranks: &[(u64, u64, usize, u64)]) -> Window {
        Window {
            usable,
            ranks: ranks
                .iter()
                .map(|&(process, addr, len, here)| WinRank {
                    process,
                    addr,
                    len,
                    here,
                    space: MemSpace::Cuda(0),
                })
                .collect(),
            _mappings: Vec::new(),
            owned: None,
        }
    }

    #[test]
    fn each_warning_of_registration_is_said_once() {
        let mut ws = Windows::default();
        assert!(ws.first_time(Said::Unusable));
        assert!(!ws.first_time(Said::Unusable));
        assert!(ws.first_time(Said::NoMarks), "another warning");
        assert!(!ws.first_time(Said::NoMarks));
    }

    #[test]
    fn words_name_a_window_and_an_offset_that_every_rank_resolves_alike() {
        let mut ws = Windows::default();
        assert!(!ws.any_usable());
        // Rank 0's buffers at 0x1000 (4 KiB) and 0x8000 (1 KiB), rank 1's at the same
        // addresses of its own process, mapped here at 0x50000 and 0x60000.
        let a = ws.add(window(
            true,
            &[(1, 0x1000, 4096, 0x1000), (2, 0x1000, 4096, 0x50000)],
        ));
        let b = ws.add(window(
            true,
            &[(1, 0x8000, 1024, 0x8000), (2, 0x1000, 1024, 0x60000)],
        ));
        assert_eq!((a, b), (0, 1));
        assert!(ws.any_usable());
        let w = ws.word_of(0, 0x1100, 256).unwrap();
        assert_eq!(w, 1 << OFFSET_BITS | 0x100);
        assert_eq!(
            ws.resolve(1, w, 256),
            Some((0x1100, 0x50100, MemSpace::Cuda(0), 2))
        );
        assert_eq!(
            ws.resolve(0, w, 256),
            Some((0x1100, 0x1100, MemSpace::Cuda(0), 1))
        );
        // The in-place bit above is ignored.
        assert_eq!(ws.resolve(1, w | 1 << 63, 256).map(|r| r.1), Some(0x50100));
        // Past rank 1's buffer in the second window (1 KiB).
        let w2 = ws.word_of(0, 0x8000, 1024).unwrap();
        assert_eq!(w2 >> OFFSET_BITS, 2);
        assert!(ws.resolve(1, w2, 1024).is_some());
        assert_eq!(ws.resolve(1, w2 + 1, 1024), None);
        // Outside every window, or running past one.
        assert_eq!(ws.word_of(0, 0x1000 + 4000, 200), None);
        assert_eq!(ws.word_of(0, 0x20000, 1), None);
        // A word of no window.
        assert_eq!(ws.resolve(0, 0x100, 1), None);
        assert_eq!(ws.resolve(0, 9 << OFFSET_BITS, 1), None);
        // A taken window leaves its place empty; later places keep theirs.
        assert!(ws.take(0).is_some());
        assert!(ws.take(0).is_none());
        assert_eq!(ws.word_of(0, 0x1100, 1), None);
        assert_eq!(ws.resolve(0, w2, 8).map(|r| r.0), Some(0x8000));
        assert_eq!(ws.len(), 1);
        // An unusable window carries nothing; it takes the free place 0.
        let c = ws.add(window(
            false,
            &[(1, 0x30000, 64, 0x30000), (2, 0, 64, 0x70000)],
        ));
        assert_eq!(c, 0);
        assert_eq!(ws.word_of(0, 0x30000, 8), None);
        assert!(ws.any_usable());
        ws.take(1);
        assert!(!ws.any_usable());
        assert_eq!(ws.len(), 1);
        ws.take(0);
        assert_eq!(
            (ws.len(), ws.list.len()),
            (0, 0),
            "empty places at the end are let go"
        );
        // Places fill from the lowest free one.
        for k in 0..3 {
            assert_eq!(ws.add(window(true, &[(1, 0, 8, 0), (2, 0, 8, 0)])), k);
        }
        ws.take(1);
        assert_eq!(ws.add(window(true, &[(1, 0, 8, 0), (2, 0, 8, 0)])), 1);
    }
}
