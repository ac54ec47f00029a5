//! Who is in a communicator: each rank number is claimed by exactly one process, and the
//! communicator's identity includes a random value that only its members know.
//!
//! Ranks that share a store and a job id (two jobs started by hand on one address, two
//! torchrun-style environments on one `MASTER_ADDR:MASTER_PORT`, two programs given one
//! `NCCL_COMM_ID`) would otherwise join one communicator and compute wrong results. The
//! protocol, under the key prefix `ferroccl/<id>`:
//!
//! 1. **Claim.** Each rank adds 1 to `claim/<rank>` and records who it is (host and pid) under
//!    `who/<rank>/<n>`. A process whose add returns more than 1 is a second claimant: it fails
//!    at once, naming both processes, and publishes nothing else.
//! 2. **Nonce.** The first claimant of rank 0 draws a random 64-bit nonce and sets `nonce`;
//!    every rank reads it. The communicator id becomes `hash(id, nonce)`: every later key,
//!    connection handshake and shared-memory segment carries it, so a process of another job
//!    that reaches this job's ports is turned away.
//! 3. **Confirm.** After connecting, each rank reads its claim counter again and adds its verdict
//!    to a counter (`1`, plus `2^32` when its rank was claimed twice); the last rank to arrive
//!    publishes the total and every rank checks it. So a duplicate that arrives while the
//!    communicator forms fails every rank's init, not only its own.
//!
//! A second claimant that arrives after every rank has confirmed fails alone; the communicator
//! that formed keeps the processes that claimed first.

use std::time::{Duration, Instant};

use super::hash64;
use crate::bootstrap::Store;
use crate::{Error, Result};

/// How long a second claimant waits to learn who claimed the rank first (for its message).
const WHO_WAIT: Duration = Duration::from_secs(1);
/// How long a rank 0 whose init failed at the confirmation keeps the store it may host for
/// the other ranks' last reads.
const LINGER: Duration = Duration::from_secs(3);
/// One rank's verdict in the confirm counter: ranks count in the low 32 bits, ranks that found
/// their number claimed twice in the high bits.
const DUPLICATE: i64 = 1 << 32;

/// This process's claim on a rank number.
#[derive(Debug)]
pub(super) struct Claim {
    /// The communicator id every connection and key uses from now on.
    pub comm_id: u64,
    base: String,
    rank: usize,
    me: String,
}

/// `host NAME pid PID`, naming this process in messages other ranks read.
fn whoami() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "?".to_string());
    format!("host {host} pid {}", std::process::id())
}

fn text(v: &[u8]) -> String {
    String::from_utf8_lossy(v).into_owned()
}

fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

fn claimed_twice(rank: usize, first: &str, second: &str, me: &str) -> Error {
    Error::invalid_usage(format!(
        "init on rank {rank}: rank {rank} is claimed by two processes, {first} and {second} \
         (this process is {me}); two jobs share one rendezvous address and job id, or two \
         processes were started with the same rank: give each job its own store address \
         (FERRO_STORE_ADDR, MASTER_PORT, NCCL_COMM_ID) or FERRO_JOB_ID"
    ))
}

/// Step 1 and 2: claims `rank` of the communicator `id` on `store` and learns the nonce.
pub(super) fn claim(store: &dyn Store, id: u64, rank: usize, deadline: Instant) -> Result<Claim> {
    let base = format!("ferroccl/{id:016x}");
    let me = whoami();
    let n = store.add(&format!("{base}/claim/{rank}"), 1)?;
    store.set(&format!("{base}/who/{rank}/{n}"), me.as_bytes())?;
    if n > 1 {
        let first = store
            .get(
                &format!("{base}/who/{rank}/1"),
                left(deadline).min(WHO_WAIT),
            )
            .map(|v| text(&v))
            .unwrap_or_else(|_| "another process".to_string());
        return Err(claimed_twice(rank, &first, &me, &me));
    }
    let key = format!("{base}/nonce");
    let nonce = if rank == 0 {
        let v = super::random_u64();
        store.set(&key, format!("{v:016x}").as_bytes())?;
        v
    } else {
        let v = store.get(&key, left(deadline))?;
        u64::from_str_radix(&text(&v), 16).map_err(|_| {
            Error::internal(format!(
                "init on rank {rank}: rank 0 published a bad nonce {:?}",
                text(&v)
            ))
        })?
    };
    Ok(Claim {
        comm_id: hash64(&[&id.to_le_bytes(), &nonce.to_le_bytes()]),
        base,
        rank,
        me,
    })
}

/// Waits for the confirmation total of `sid` and fails if any rank was claimed twice.
fn verdict_of(store: &dyn Store, sid: &str, rank: usize, deadline: Instant) -> Result<()> {
    let v = store.get(&format!("{sid}/verdict"), left(deadline))?;
    let total: i64 = text(&v).parse().map_err(|_| {
        Error::internal(format!(
            "init on rank {rank}: a bad confirmation total {:?}",
            text(&v)
        ))
    })?;
    let twice = total >> 32;
    if twice > 0 {
        return Err(Error::invalid_usage(format!(
            "init on rank {rank}: {twice} rank number(s) of this communicator were claimed by two \
             processes while it formed (two jobs on one rendezvous address and job id?); their \
             ranks' errors name the processes"
        )));
    }
    Ok(())
}

/// Step 3: after connecting, checks that no rank of the communicator was claimed twice.
pub(super) fn confirm(
    store: &dyn Store,
    claim: &Claim,
    nranks: usize,
    deadline: Instant,
) -> Result<()> {
    let (base, rank) = (&claim.base, claim.rank);
    let claims = store.add(&format!("{base}/claim/{rank}"), 0)?;
    let verdict = if claims > 1 { 1 + DUPLICATE } else { 1 };
    let sid = format!("{base}/{:016x}", claim.comm_id);
    let total = store.add(&format!("{sid}/confirmed"), verdict)?;
    if total & (DUPLICATE - 1) == nranks as i64 {
        store.set(&format!("{sid}/verdict"), total.to_string().as_bytes())?;
    }
    let outcome = if claims > 1 {
        let second = store
            .get(
                &format!("{base}/who/{rank}/2"),
                left(deadline).min(WHO_WAIT),
            )
            .map(|v| text(&v))
            .unwrap_or_else(|_| "another process".to_string());
        Err(claimed_twice(rank, &claim.me, &second, &claim.me))
    } else {
        verdict_of(store, &sid, rank, deadline)
    };
    // No rank leaves init before every rank has read what it needs from the store: a rank that
    // left at once could fail its first call (a mismatch is found within microseconds), or
    // fail here, and end its process, taking down the store it hosts while a slower rank still
    // reads the verdict or the other claimant's name there.
    let read = store.add(&format!("{sid}/read"), 1).and_then(|read| {
        if read == nranks as i64 {
            store.set(&format!("{sid}/all_read"), b"1")?;
        }
        Ok(())
    });
    if let Err(e) = outcome {
        if rank == 0 {
            // Rank 0 may host the store: it lingers (bounded) for the others' reads.
            let _ = store.get(&format!("{sid}/all_read"), left(deadline).min(LINGER));
        }
        // The reason, not a store that went away meanwhile.
        return Err(e);
    }
    read?;
    store
        .get(&format!("{sid}/all_read"), left(deadline))
        .map_err(|e| {
            e.context(format!(
                "init on rank {rank}: waiting for every rank to confirm"
            ))
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::MemoryStore;
    use crate::ErrorKind;

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    #[test]
    fn every_rank_learns_one_nonce() {
        let store = MemoryStore::new();
        let c0 = claim(&store, 7, 0, soon()).unwrap();
        let c1 = claim(&store, 7, 1, soon()).unwrap();
        assert_eq!(c0.comm_id, c1.comm_id);
        assert_ne!(c0.comm_id, 7);
        // Another store with the same id gets another nonce, so another communicator id.
        let other = MemoryStore::new();
        assert_ne!(claim(&other, 7, 0, soon()).unwrap().comm_id, c0.comm_id);
        std::thread::scope(|s| {
            let t = s.spawn(|| confirm(&store, &c1, 2, soon()));
            confirm(&store, &c0, 2, soon()).unwrap();
            t.join().unwrap().unwrap();
        });
    }

    #[test]
    fn a_second_claimant_fails_at_once_naming_both() {
        let store = MemoryStore::new();
        claim(&store, 9, 0, soon()).unwrap();
        claim(&store, 9, 1, soon()).unwrap();
        // Give the first claimant a recognisable name.
        store
            .set("ferroccl/0000000000000009/who/1/1", b"host a pid 1")
            .unwrap();
        let e = claim(&store, 9, 1, soon()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidUsage);
        assert!(
            e.message().contains("rank 1 is claimed by two processes"),
            "{e}"
        );
        assert!(e.message().contains("host a pid 1"), "{e}");
        assert!(
            e.message().contains(&format!("pid {}", std::process::id())),
            "{e}"
        );
    }

    #[test]
    fn a_duplicate_while_forming_fails_every_rank() {
        let store = MemoryStore::new();
        let c0 = claim(&store, 11, 0, soon()).unwrap();
        let c1 = claim(&store, 11, 1, soon()).unwrap();
        // A second process claims rank 1 before the communicator confirmed.
        assert!(claim(&store, 11, 1, soon()).is_err());
        let e1 = confirm(&store, &c1, 2, soon()).unwrap_err();
        assert!(e1.message().contains("claimed by two processes"), "{e1}");
        // The last rank to confirm learns of the duplicate it never saw itself.
        let e0 = confirm(&store, &c0, 2, soon()).unwrap_err();
        assert_eq!(e0.kind(), ErrorKind::InvalidUsage);
        assert!(e0.message().contains("1 rank number(s)"), "{e0}");
    }

    #[test]
    fn rank_0_failing_at_the_confirmation_stays_until_the_others_have_read() {
        let store = MemoryStore::new();
        let c0 = claim(&store, 12, 0, soon()).unwrap();
        let c1 = claim(&store, 12, 1, soon()).unwrap();
        // A second process claims rank 1 and is slow to leave its name.
        let who = format!("{}/who/1/2", c0.base);
        store.add(&format!("{}/claim/1", c0.base), 1).unwrap();
        let read = format!("{}/{:016x}/read", c0.base, c0.comm_id);
        std::thread::scope(|s| {
            let t = s.spawn(|| confirm(&store, &c1, 2, soon()));
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(300));
                store.set(&who, b"host b pid 2").unwrap();
            });
            // Rank 0 (which may host the store) fails at once, but leaves only after rank 1
            // has read the name.
            let e0 = confirm(&store, &c0, 2, soon()).unwrap_err();
            assert!(e0.message().contains("1 rank number(s)"), "{e0}");
            assert_eq!(store.add(&read, 0).unwrap(), 2);
            let e1 = t.join().unwrap().unwrap_err();
            assert!(e1.message().contains("host b pid 2"), "{e1}");
        });
    }
}
