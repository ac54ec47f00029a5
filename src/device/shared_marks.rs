//! The host stand-in's shared marks: the model of CUDA's interprocess events
//! (`CU_EVENT_INTERPROCESS`), which a stream of another process waits for.
//!
//! A reducer's shared marks are one small stand-in allocation (a memory file, exported and
//! mapped as the stand-in's device memory is) holding, per mark, the number of its last record
//! and two rings of slots, one slot per record number modulo [`RING`]: which records their
//! streams have reached, and which records a waiter of some process asked for. Recording
//! queues a job that writes the record's number in its slot when the stream gets there; a wait
//! is a stream entry that holds until the slot says so. (Records of one mark on several
//! streams are reached in any order; each slot tells its own record, as a CUDA wait is for
//! one record.)
//!
//! Stand-in streams run only when waited for ([`super::host_stream`]): in one process the
//! waiter runs the other stream itself, which a stream of another process cannot. So a waiter
//! that cannot go on asks (the record's slot in the second ring), and each process that
//! shared marks runs a thread that runs its streams up to the records asked for: another
//! process's wait gets a stream exactly as far as a wait of this process would, and no
//! further. (With eager
//! streams the records are stored as early as the stream gets there anyway.)

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use super::host_stream::{self, Flag};
use super::ipc::Mapping;
use super::{host, Provider};
use crate::reduce::{MarkUse, PeerMarks, SharedMarkWords, SHARED_MARK_WORDS};
use crate::{Error, Result};

/// Records of one mark a ring tells apart.
const RING: u64 = 256;

/// Bytes of the allocation: per mark, the number of the last record (in the first 64 bytes),
/// then the rings of slots: records reached, records asked for.
const BYTES: usize = 64 + 4 * 4 * RING as usize;

/// Where the number of mark `which`'s last record lies from the allocation's start.
fn recorded_at(which: MarkUse) -> u64 {
    4 * which as u64
}

/// Where the slot of record `seq` of mark `which` lies from the allocation's start: in the
/// ring of records reached, or of records asked for (`asked`).
fn slot_at(which: MarkUse, seq: u32, asked: bool) -> u64 {
    let ring = 2 * u64::from(asked) + which as u64;
    64 + 4 * RING * ring + 4 * (u64::from(seq) % RING)
}

/// The word at `addr`, which lies in a live stand-in allocation or mapping, aligned.
fn word<'a>(addr: u64) -> &'a AtomicU32 {
    // SAFETY: callers pass an aligned address inside an allocation of this module (never
    // freed) or a mapping that the reference's holder keeps alive; every access is atomic.
    unsafe { &*(addr as *const AtomicU32) }
}

/// A record not yet asked for: its number, its stream and where in the stream its store is.
type Pending = (u32, usize, u64);

/// One reducer's shared marks (made once, never freed: as CUDA events, they outlive every
/// wait another process may still queue).
#[derive(Debug)]
pub(crate) struct OwnMarks {
    addr: u64,
    handle: [u8; 64],
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    next: [u32; 2],
    pending: [VecDeque<Pending>; 2],
    /// Per stream, the position just past its last `Done` store.
    last_done: HashMap<usize, u64>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Every process's shared marks, which its thread serves.
static OWNED: Mutex<Vec<Arc<OwnMarks>>> = Mutex::new(Vec::new());

impl OwnMarks {
    /// Makes the marks of a reducer of stand-in device `ordinal`.
    pub(crate) fn new(ordinal: u32) -> Result<Arc<OwnMarks>> {
        let addr = host::alloc(ordinal, BYTES)?;
        let (_, _, handle) = host::export(addr, BYTES)?;
        let me = Arc::new(OwnMarks {
            addr,
            handle,
            state: Mutex::default(),
        });
        lock(&OWNED).push(Arc::clone(&me));
        serve();
        Ok(me)
    }

    /// The words another process opens them from.
    pub(crate) fn words(&self) -> SharedMarkWords {
        let mut w = [0u64; SHARED_MARK_WORDS];
        for (i, c) in self.handle.chunks_exact(8).enumerate() {
            w[i] = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
        }
        w
    }

    /// Records mark `which` at the end of stand-in stream `h`: returns the record's number.
    pub(crate) fn record(&self, h: usize, which: MarkUse) -> u64 {
        let mut st = lock(&self.state);
        let i = which as usize;
        st.next[i] = st.next[i].wrapping_add(1).max(1);
        let seq = st.next[i];
        let slot = self.addr + slot_at(which, seq, false);
        // As CUDA's record, the record is the event's latest from the call on.
        word(self.addr + recorded_at(which)).store(seq, Ordering::Release);
        let at = host_stream::launch_at(
            h,
            Box::new(move || {
                word(slot).store(seq, Ordering::Release);
                Ok(())
            }),
        );
        st.pending[i].push_back((seq, h, at));
        if which == MarkUse::Done {
            st.last_done.insert(h, at + 1);
        }
        u64::from(seq)
    }

    /// Records the settle point of stand-in stream `h`: its end now (after a call's waits for
    /// the other ranks' marks and its copies out of their scratch), which [`OwnMarks::settle`]
    /// runs it to, as the CUDA reducer's settle event.
    pub(crate) fn settle_point(&self, h: usize) {
        let at = host_stream::launch_at(h, Box::new(|| Ok(())));
        lock(&self.state).last_done.insert(h, at + 1);
    }

    /// Runs every stream with a `Done` record or a settle point up to its last one, and
    /// forgets them.
    pub(crate) fn settle(&self) -> Result<()> {
        let last = std::mem::take(&mut lock(&self.state).last_done);
        let mut settled = Ok(());
        for (h, upto) in last {
            if !host_stream::gone(h) {
                settled = settled.and(host_stream::run_to(h, upto));
            }
        }
        settled
    }

    /// Runs the streams towards the records asked for, as far as each can go now (one stream
    /// held by a wait must not keep the others from going on: the thread serves every
    /// process's asks); whether any record was reached.
    fn serve_asked(&self) -> bool {
        let mut served = false;
        for which in [MarkUse::Ready, MarkUse::Done] {
            // Exactly the records asked for (a GPU runs each stream by itself; a lazy stand-in
            // stream runs as far as a wait needs, and no further).
            let slot = |seq: u32, asked: bool| {
                let v = word(self.addr + slot_at(which, seq, asked)).load(Ordering::Acquire);
                host_stream::reached(v, seq)
            };
            let todo: Vec<Pending> = {
                let mut st = lock(&self.state);
                // Records their streams reached anyway (nobody had to ask) are let go.
                st.pending[which as usize].retain(|&(seq, ..)| !slot(seq, false));
                st.pending[which as usize]
                    .iter()
                    .copied()
                    .filter(|&(seq, ..)| slot(seq, true))
                    .collect()
            };
            let mut done = Vec::new();
            for (seq, h, at) in todo {
                // A stream forgotten meanwhile: a GPU finishes its work by itself. (A stream
                // whose job failed goes on past it, as the stand-in's streams do.)
                if host_stream::gone(h) {
                    word(self.addr + slot_at(which, seq, false)).store(seq, Ordering::Release);
                    done.push(seq);
                } else if host_stream::advance(h, at + 1) {
                    done.push(seq);
                }
            }
            if !done.is_empty() {
                served = true;
                lock(&self.state).pending[which as usize].retain(|p| !done.contains(&p.0));
            }
        }
        served
    }
}

/// Starts the thread that runs this process's streams as far as other processes ask.
fn serve() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("ferroccl-standin-marks".into())
            .spawn(|| loop {
                let all: Vec<Arc<OwnMarks>> = lock(&OWNED).iter().map(Arc::clone).collect();
                let mut served = false;
                for m in &all {
                    served |= m.serve_asked();
                }
                if !served {
                    std::thread::sleep(Duration::from_micros(50));
                }
            });
        // Without it another process's waits run into the stand-in's time limit.
        drop(spawned);
    });
}

/// Another process's shared marks, mapped here.
#[derive(Debug)]
struct Opened {
    mapping: Mapping,
}

/// A wait for record `seq` of mark `which` of another process's marks.
struct Awaited {
    peer: Arc<Opened>,
    which: MarkUse,
    seq: u32,
}

impl Flag for Awaited {
    /// The record's slot: its number once reached (a later one, [`RING`] records on, once
    /// that is).
    fn value(&self) -> u32 {
        let at = slot_at(self.which, self.seq, false);
        word(self.peer.mapping.addr() + at).load(Ordering::Acquire)
    }

    fn ask(&self, target: u32) {
        let at = slot_at(self.which, target, true);
        word(self.peer.mapping.addr() + at).store(target, Ordering::Release);
    }
}

/// Opens another process's shared marks from their words, for a reducer of stand-in device
/// `ordinal`.
pub(crate) fn open(ordinal: u32, words: &SharedMarkWords) -> Result<PeerMarks> {
    let mut handle = [0u8; 64];
    for (i, w) in words[..8].iter().enumerate() {
        handle[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
    }
    let mapping = Mapping::open(Provider::Host, ordinal, &handle)?;
    Ok(PeerMarks(Box::new(Arc::new(Opened { mapping }))))
}

/// Queues on stand-in stream `h` a wait for record `seq` of mark `which` of `peer`, which must
/// be its latest record: CUDA's wait is for the latest, so a record made since (an ordering
/// the callers' exchanges rule out) would make a GPU wait for another point.
pub(crate) fn wait(h: usize, peer: &PeerMarks, which: MarkUse, seq: u64) -> Result<()> {
    let Some(opened) = peer.0.downcast_ref::<Arc<Opened>>() else {
        return Err(Error::internal(
            "host stand-in reducer: another reducer's opened marks",
        ));
    };
    let latest = word(opened.mapping.addr() + recorded_at(which)).load(Ordering::Acquire);
    if u64::from(latest) != seq {
        return Err(Error::internal(format!(
            "host stand-in reducer: a wait for record {seq} of another process's {which:?} \
             mark, recorded again since (its latest is {latest})"
        )));
    }
    let flag = Arc::new(Awaited {
        peer: Arc::clone(opened),
        which,
        seq: seq as u32,
    });
    host_stream::wait_flag(h, flag, seq as u32);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::stream::next_host_handle;

    /// A wait for another "process's" record (this process's marks opened again, as another
    /// process opens them) holds its stream until the recording stream gets there, which the
    /// lazy stand-in runs only when asked: the serving thread runs it exactly that far.
    #[test]
    fn a_wait_holds_until_the_recording_stream_gets_there_which_runs_when_asked() {
        let own = OwnMarks::new(0).unwrap();
        let peer = open(0, &own.words()).unwrap();
        let (a, b) = (next_host_handle(), next_host_handle());
        let ran = Arc::new(AtomicU32::new(0));
        let job = |v: u32| {
            let ran = Arc::clone(&ran);
            Box::new(move || {
                ran.store(v, Ordering::Release);
                Ok(())
            })
        };
        host_stream::launch(a, job(1));
        let seq = own.record(a, MarkUse::Ready);
        host_stream::launch(a, job(2));
        wait(b, &peer, MarkUse::Ready, seq).unwrap();
        host_stream::synchronize(b).unwrap();
        // Stream `a` ran to the record, not past it (eager streams ran it all at once).
        if !host_stream::eager() {
            assert_eq!(ran.load(Ordering::Acquire), 1);
            assert_eq!(host_stream::pending(a), 1);
        }
        host_stream::synchronize(a).unwrap();
        assert_eq!(ran.load(Ordering::Acquire), 2);
    }

    /// Records of one mark on two streams are reached in any order, each wait for its own;
    /// a wait for a record that is no longer the mark's latest is refused (CUDA would wait for
    /// the later one).
    #[test]
    fn records_on_two_streams_each_tell_their_own_and_a_stale_wait_is_refused() {
        let own = OwnMarks::new(0).unwrap();
        let peer = open(0, &own.words()).unwrap();
        let (a, b, c) = (next_host_handle(), next_host_handle(), next_host_handle());
        let first = own.record(a, MarkUse::Done);
        let e = wait(c, &peer, MarkUse::Done, first + 1).unwrap_err();
        assert!(e.message().contains("recorded again since"), "{e}");
        wait(c, &peer, MarkUse::Done, first).unwrap();
        let second = own.record(b, MarkUse::Done);
        let e = wait(c, &peer, MarkUse::Done, first).unwrap_err();
        assert!(e.message().contains("its latest is"), "{e}");
        // Stream `b` reaches the second record; the first (on `a`) is still not reached.
        host_stream::synchronize(b).unwrap();
        let at = |seq: u64| own.addr + slot_at(MarkUse::Done, seq as u32, false);
        assert_eq!(word(at(second)).load(Ordering::Acquire), second as u32);
        if !host_stream::eager() {
            assert_ne!(word(at(first)).load(Ordering::Acquire), first as u32);
        }
        // `c` waits for the first record: asking runs `a` there.
        host_stream::synchronize(c).unwrap();
        assert_eq!(word(at(first)).load(Ordering::Acquire), first as u32);
        // Settling runs every stream with a `Done` record to its last.
        own.settle().unwrap();
        assert_eq!(host_stream::pending(a) + host_stream::pending(b), 0);
    }
}
