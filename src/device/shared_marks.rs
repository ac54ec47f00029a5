//! The host stand-in's shared marks: the model of CUDA's interprocess events
//! (`CU_EVENT_INTERPROCESS`), which a stream of another process waits for.
//!
//! A reducer's shared marks are one small stand-in allocation (a memory file, exported and
//! mapped as the stand-in's device memory is) holding, per mark, the sequence number of the
//! last record its stream has reached, and the highest one a waiter of any process asked for.
//! Recording queues a job that stores the record's number when the stream gets there; a wait
//! is a stream entry that waits until the number reaches the record's.
//!
//! Stand-in streams run only when waited for ([`super::host_stream`]): in one process the
//! waiter runs the other stream itself, which a stream of another process cannot. So a waiter
//! that cannot go on asks (the "asked" word), and each process that shared marks runs a
//! thread that runs its streams up to the records asked for: another process's wait gets a
//! stream exactly as far as a wait of this process would, and no further. (With eager
//! streams the records are stored as early as the stream gets there anyway.)

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use super::host_stream::{self, Flag};
use super::ipc::Mapping;
use super::{host, Provider};
use crate::reduce::{MarkUse, PeerMarks, SharedMarkWords, SHARED_MARK_WORDS};
use crate::{Error, Result};

/// Bytes of the allocation: per mark, the number reached and the number asked for.
const BYTES: usize = 64;

/// Where the words of mark `which` lie from the allocation's start: reached, asked.
fn offsets(which: MarkUse) -> (usize, usize) {
    let i = which as usize;
    (4 * i, 8 + 4 * i)
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
    /// The stream and position just past the last `Done` store.
    last_done: Option<(usize, u64)>,
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
        let at = host_stream::record(h);
        let reached = self.addr + offsets(which).0 as u64;
        host_stream::launch(
            h,
            Box::new(move || {
                word(reached).store(seq, Ordering::Release);
                Ok(())
            }),
        );
        st.pending[i].push_back((seq, h, at));
        if which == MarkUse::Done {
            st.last_done = Some((h, at + 1));
        }
        u64::from(seq)
    }

    /// Runs the stream of the last `Done` record up to it.
    pub(crate) fn settle(&self) -> Result<()> {
        let last = lock(&self.state).last_done;
        match last {
            Some((h, upto)) if !host_stream::gone(h) => host_stream::run_to(h, upto),
            _ => Ok(()),
        }
    }

    /// Runs the streams up to the records asked for; whether any was.
    fn serve_asked(&self) -> bool {
        let mut served = false;
        for which in [MarkUse::Ready, MarkUse::Done] {
            let (reached, asked) = offsets(which);
            let asked = word(self.addr + asked as u64).load(Ordering::Acquire);
            loop {
                let next = {
                    let mut st = lock(&self.state);
                    let q = &mut st.pending[which as usize];
                    match q.front() {
                        Some(&(seq, ..)) if host_stream::reached(asked, seq) => q.pop_front(),
                        _ => None,
                    }
                };
                let Some((seq, h, at)) = next else { break };
                served = true;
                // A stream forgotten meanwhile: a GPU finishes its work by itself.
                if host_stream::gone(h) || host_stream::run_to(h, at + 1).is_err() {
                    word(self.addr + reached as u64).fetch_max(seq, Ordering::AcqRel);
                }
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
}

impl Flag for Awaited {
    fn value(&self) -> u32 {
        word(self.peer.mapping.addr() + offsets(self.which).0 as u64).load(Ordering::Acquire)
    }

    fn ask(&self, target: u32) {
        let asked = word(self.peer.mapping.addr() + offsets(self.which).1 as u64);
        let mut cur = asked.load(Ordering::Acquire);
        while !host_stream::reached(cur, target) {
            match asked.compare_exchange_weak(cur, target, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
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

/// Queues on stand-in stream `h` a wait for record `seq` of mark `which` of `peer`.
pub(crate) fn wait(h: usize, peer: &PeerMarks, which: MarkUse, seq: u64) -> Result<()> {
    let Some(opened) = peer.0.downcast_ref::<Arc<Opened>>() else {
        return Err(Error::internal(
            "host stand-in reducer: another reducer's opened marks",
        ));
    };
    let flag = Arc::new(Awaited {
        peer: Arc::clone(opened),
        which,
    });
    host_stream::wait_flag(h, flag, seq as u32);
    Ok(())
}
