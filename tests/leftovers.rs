//! What ranks killed mid-job leave on the host, and who removes it: shared-memory segments not
//! yet unlinked (swept by the next rank that creates a segment in the same directory), and job
//! store directories (swept by the next job store opened beside them, or in them).
//!
//! Each test works in a private directory, so that it never races other jobs on this host.
//! The test binary runs itself as the killed processes (see `common::child`).

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::child::{self, self_command, Finished, Running};
use ferroccl::bootstrap::{FileStore, Store};
use ferroccl_transport_shm::{segment_name, OwnSegment};

/// Variable naming the directory a child works in.
const DIR_VAR: &str = "FERRO_TEST_LEFTOVER_DIR";
/// How long a child may take (it normally takes milliseconds).
const CHILD_LIMIT: Duration = Duration::from_secs(60);
/// Communicator id of the segments these tests create.
const COMM_ID: u64 = 0x1ef7_0e55;

fn private_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "ferroccl-leftovers-{tag}-{}-{}",
        std::process::id(),
        segment_name(0, 0)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The segment files in `dir` whose names say process `pid` created them.
fn segments_of(dir: &Path, pid: u32) -> Vec<String> {
    let mark = format!("-p{pid}-");
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("ferroccl-") && n.contains(&mark))
        .collect()
}

/// Kills this process with SIGKILL: nothing is unlinked, no destructor runs.
fn die() -> ! {
    // SAFETY: kill(2) on this process's own pid; no memory is involved.
    unsafe {
        libc::kill(
            libc::pid_t::try_from(std::process::id()).unwrap(),
            libc::SIGKILL,
        )
    };
    unreachable!("SIGKILL did not stop the process");
}

/// Creates a segment as rank 1 of a two-rank communicator would (a ring for rank 0), then
/// either is killed at once (`segment-then-die`) or waits to be killed (`segment-then-wait`).
#[test]
fn child_segment_owner() {
    let die_now = child::is_role("segment-then-die");
    if !die_now && !child::is_role("segment-then-wait") {
        return;
    }
    let dir: PathBuf = child::env_var(DIR_VAR);
    let name = segment_name(COMM_ID, 1);
    let seg = OwnSegment::create(&dir, &name, COMM_ID, 1, &[0], 1 << 20).unwrap();
    if die_now {
        die();
    }
    std::thread::sleep(CHILD_LIMIT);
    drop(seg);
}

fn owner(role: &str, dir: &Path) -> Running {
    Running::spawn(self_command(
        "child_segment_owner",
        role,
        &[(DIR_VAR, dir.display().to_string())],
    ))
}

fn assert_killed(out: &Finished) {
    let signal = out.status.and_then(|s| s.signal());
    assert_eq!(signal, Some(libc::SIGKILL), "{}", out.dump());
}

#[test]
fn a_killed_ranks_segment_is_removed_by_the_next_segment_created_and_a_live_ones_is_not() {
    let dir = private_dir("shm");
    // The live owner first: creating a segment sweeps, so it must not see the dead one's.
    let alive = owner("segment-then-wait", &dir);
    let alive_pid = alive.id();
    let start = Instant::now();
    while segments_of(&dir, alive_pid).is_empty() {
        assert!(
            start.elapsed() < CHILD_LIMIT,
            "the waiting owner made no segment"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    let dead = owner("segment-then-die", &dir);
    let dead_pid = dead.id();
    let out = dead.finish(CHILD_LIMIT);
    assert_killed(&out);
    assert_eq!(segments_of(&dir, dead_pid).len(), 1, "{}", out.dump());
    assert_eq!(segments_of(&dir, alive_pid).len(), 1);

    let mut seg =
        OwnSegment::create(&dir, &segment_name(COMM_ID, 0), COMM_ID, 0, &[1], 1 << 20).unwrap();
    assert_eq!(seg.swept(), 1);
    assert_eq!(segments_of(&dir, dead_pid), Vec::<String>::new());
    assert_eq!(segments_of(&dir, alive_pid).len(), 1);
    seg.unlink();

    // Once killed, the waiting owner's segment goes the same way.
    // SAFETY: kill(2) on the pid of our own unreaped child; no memory is involved.
    unsafe { libc::kill(libc::pid_t::try_from(alive_pid).unwrap(), libc::SIGKILL) };
    assert_killed(&alive.finish(CHILD_LIMIT));
    let mut seg =
        OwnSegment::create(&dir, &segment_name(COMM_ID, 0), COMM_ID, 0, &[1], 1 << 20).unwrap();
    assert_eq!(seg.swept(), 1);
    seg.unlink();
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    std::fs::remove_dir(&dir).unwrap();
}

/// Opens a job store in the directory it is given, sets a key, then either is killed at once
/// (`store-then-die`) or waits to be killed (`store-then-wait`).
#[test]
fn child_job_store_user() {
    let die_now = child::is_role("store-then-die");
    if !die_now && !child::is_role("store-then-wait") {
        return;
    }
    let dir: PathBuf = child::env_var(DIR_VAR);
    let store = FileStore::new_for_job(&dir).unwrap();
    store.set("rank0/addr", b"127.0.0.1:1").unwrap();
    if die_now {
        die();
    }
    std::thread::sleep(CHILD_LIMIT);
    drop(store);
}

fn store_user(role: &str, dir: &Path) -> Running {
    Running::spawn(self_command(
        "child_job_store_user",
        role,
        &[(DIR_VAR, dir.display().to_string())],
    ))
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn a_killed_jobs_store_directory_is_swept_and_a_live_jobs_is_not() {
    let parent = private_dir("store");
    let (dead_dir, live_dir) = (parent.join("ferroccl-dead"), parent.join("ferroccl-live"));
    let alive = store_user("store-then-wait", &live_dir);
    let start = Instant::now();
    while !names_in(&parent).contains(&"ferroccl-live".to_string())
        || !names_in(&live_dir).iter().any(|n| n.starts_with("k-"))
    {
        assert!(start.elapsed() < CHILD_LIMIT, "the waiting user set no key");
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = store_user("store-then-die", &dead_dir).finish(CHILD_LIMIT);
    assert_killed(&out);
    // The leftover is real: the killed job's directory, its record and its key.
    let left = names_in(&dead_dir);
    assert!(left.iter().any(|n| n.starts_with(".user-")), "{left:?}");
    assert!(left.iter().any(|n| n.starts_with("k-")), "{left:?}");

    let store = FileStore::new_for_job(parent.join("ferroccl-next")).unwrap();
    assert_eq!(names_in(&parent), ["ferroccl-live", "ferroccl-next"]);
    drop(store);
    assert_eq!(names_in(&parent), ["ferroccl-live"]);

    // SAFETY: kill(2) on the pid of our own unreaped child; no memory is involved.
    unsafe { libc::kill(libc::pid_t::try_from(alive.id()).unwrap(), libc::SIGKILL) };
    assert_killed(&alive.finish(CHILD_LIMIT));
    // Opened again, the dead job's directory holds nothing of it: the key is gone.
    let store = FileStore::new_for_job(&live_dir).unwrap();
    let e = store
        .get("rank0/addr", Duration::from_millis(10))
        .unwrap_err();
    assert!(e.message().contains("rank0/addr"), "{e}");
    drop(store);
    assert_eq!(names_in(&parent), Vec::<String>::new());
    std::fs::remove_dir(&parent).unwrap();
}
