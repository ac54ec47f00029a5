use super::*;
use crate::ErrorKind;
use std::thread;

#[test]
fn long_key_names_end_in_a_fixed_hash() {
    let name = file_name(&"a".repeat(300));
    assert_eq!(name.len(), MAX_NAME);
    assert!(name.ends_with("~ee7717eba7a17e21"), "{name}");
}

fn temp_store(name: &str) -> FileStore {
    let dir = std::env::temp_dir().join(format!(
        "ferroccl-test-{name}-{}-{}",
        std::process::id(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    FileStore::new(dir).unwrap()
}

#[test]
fn file_names_are_safe_and_distinct() {
    assert_eq!(file_name("rank3/addr"), "k-rank3%2Faddr");
    assert_eq!(file_name(".."), "k-%2E%2E");
    assert_ne!(file_name("a/b"), file_name("a%2Fb"));
    let long_a = "x".repeat(500) + "a";
    let long_b = "x".repeat(500) + "b";
    assert!(file_name(&long_a).len() <= MAX_NAME);
    assert_ne!(file_name(&long_a), file_name(&long_b));
}

#[test]
fn set_get_add() {
    let s = temp_store("basic");
    s.set("rank0/addr", b"10.1.2.3:4000").unwrap();
    s.set("../escape", b"stays inside").unwrap();
    assert_eq!(
        s.get("rank0/addr", Duration::ZERO).unwrap(),
        b"10.1.2.3:4000"
    );
    assert_eq!(s.get("../escape", Duration::ZERO).unwrap(), b"stays inside");
    s.set("rank0/addr", b"10.1.2.3:4001").unwrap();
    assert_eq!(
        s.get("rank0/addr", Duration::ZERO).unwrap(),
        b"10.1.2.3:4001"
    );
    assert_eq!(s.add("n", 7).unwrap(), 7);
    assert_eq!(s.add("n", -2).unwrap(), 5);
    assert_eq!(s.get("n", Duration::ZERO).unwrap(), b"5");
    // A second handle on the same directory sees the same values.
    let other = FileStore::new(s.dir()).unwrap();
    assert_eq!(other.add("n", 1).unwrap(), 6);
    // Nothing escaped the directory and no temporary files are left.
    let names: Vec<String> = fs::read_dir(s.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with(".lock"))
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(names.iter().all(|n| n.starts_with("k-")), "{names:?}");
    fs::remove_dir_all(s.dir()).unwrap();
}

#[test]
fn get_waits_for_a_later_set_and_times_out() {
    let s = temp_store("wait");
    let writer = s.clone();
    let t = thread::spawn(move || {
        thread::sleep(Duration::from_millis(50));
        writer.set("late", b"v-late").unwrap();
    });
    assert_eq!(s.get("late", Duration::from_secs(10)).unwrap(), b"v-late");
    t.join().unwrap();
    let start = Instant::now();
    let e = s.get("missing", Duration::from_millis(50)).unwrap_err();
    assert!(start.elapsed() >= Duration::from_millis(50));
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert!(e.message().contains("'missing'"), "{e}");
    assert!(e.message().contains(&s.dir().display().to_string()), "{e}");
    fs::remove_dir_all(s.dir()).unwrap();
}

#[test]
fn concurrent_adds_from_separate_handles_are_atomic() {
    let s = temp_store("add");
    let threads: Vec<_> = (0..4)
        .map(|i| {
            // Separate handles open separate lock descriptors, as separate processes do.
            let s = FileStore::new(s.dir()).unwrap();
            thread::spawn(move || {
                for _ in 0..50 {
                    s.add("c", i + 1).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // 50 * (1 + 2 + 3 + 4)
    assert_eq!(s.add("c", 0).unwrap(), 500);
    fs::remove_dir_all(s.dir()).unwrap();
}

/// A private parent directory for job store tests (its siblings are swept, /tmp's must not be).
fn temp_parent(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "ferroccl-jobstore-test-{name}-{}-{}",
        std::process::id(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    fs::create_dir_all(&d).unwrap();
    d
}

/// The pid of a child that has exited and been reaped: no process has it (until reused).
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    assert!(
        process_is_gone(pid),
        "pid {pid} of a reaped child still exists"
    );
    pid
}

/// A job store directory as processes `pids` would have left it: marked, with their
/// records (in this pid namespace unless `ns` says otherwise) and one key.
fn left_behind(dir: &Path, pids: &[u32], ns: u64) {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join(JOB_MARKER), b"").unwrap();
    fs::write(dir.join(LOCK_FILE), b"").unwrap();
    for pid in pids {
        fs::write(
            dir.join(format!("{USER_PREFIX}{pid}-0")),
            format!("pidns={ns}\n"),
        )
        .unwrap();
    }
    fs::write(dir.join(file_name("old/key")), b"stale").unwrap();
}

fn records(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = entry_names(dir)
        .unwrap()
        .into_iter()
        .filter(|n| n.starts_with(USER_PREFIX))
        .collect();
    names.sort();
    names
}

#[test]
fn a_job_store_goes_with_its_last_user_and_clones_share_a_record() {
    let parent = temp_parent("last");
    let dir = parent.join("ferroccl-job");
    let a = FileStore::new_for_job(&dir).unwrap();
    let b = FileStore::new_for_job(&dir).unwrap();
    assert!(a.is_job_store() && b.is_job_store());
    assert!(!FileStore::new(&dir).unwrap().is_job_store());
    assert_eq!(records(&dir).len(), 2);
    a.set("rank0/addr", b"a").unwrap();
    assert_eq!(b.add("n", 2).unwrap(), 2);
    let a2 = a.clone();
    drop(a);
    // The clone keeps a's record; b's keys and a's are still there.
    assert_eq!(records(&dir).len(), 2);
    drop(a2);
    assert_eq!(records(&dir).len(), 1);
    assert_eq!(b.get("rank0/addr", Duration::ZERO).unwrap(), b"a");
    assert_eq!(b.add("n", 1).unwrap(), 3);
    drop(b);
    assert!(!dir.exists(), "{} is still there", dir.display());
    // The parent was there before and is no job store: it stays.
    assert!(parent.exists());
    // The same directory can be used again.
    let c = FileStore::new_for_job(&dir).unwrap();
    assert!(matches!(c.get("n", Duration::ZERO), Err(e) if e.kind() == ErrorKind::Timeout));
    drop(c);
    assert!(!dir.exists());
    fs::remove_dir(&parent).unwrap();
}

#[test]
fn dead_users_records_and_keys_are_cleared_at_open() {
    let parent = temp_parent("dead");
    let dir = parent.join("ferroccl-job");
    let dead = dead_pid();
    left_behind(&dir, &[dead], pid_namespace());
    let s = FileStore::new_for_job(&dir).unwrap();
    let me = format!("{USER_PREFIX}{}-", std::process::id());
    let rs = records(&dir);
    assert!(rs.len() == 1 && rs[0].starts_with(&me), "{rs:?}");
    let e = s.get("old/key", Duration::ZERO).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    drop(s);
    assert!(!dir.exists());
    fs::remove_dir(&parent).unwrap();
}

#[test]
fn keys_of_a_live_user_survive_another_users_open() {
    let parent = temp_parent("live");
    let dir = parent.join("ferroccl-job");
    let dead = dead_pid();
    // A live process of this namespace (not this one), a dead one, and a dead-looking pid
    // of another pid namespace (which says nothing here).
    let alive = std::os::unix::process::parent_id();
    left_behind(&dir, &[alive, dead], pid_namespace());
    fs::write(
        dir.join(format!("{USER_PREFIX}{dead}-7")),
        format!("pidns={}\n", pid_namespace() ^ 1),
    )
    .unwrap();
    let s = FileStore::new_for_job(&dir).unwrap();
    assert_eq!(s.get("old/key", Duration::ZERO).unwrap(), b"stale");
    let rs = records(&dir);
    assert_eq!(rs.len(), 3, "{rs:?}");
    assert!(rs.contains(&format!("{USER_PREFIX}{alive}-0")), "{rs:?}");
    assert!(rs.contains(&format!("{USER_PREFIX}{dead}-7")), "{rs:?}");
    drop(s);
    // The other users' records keep the directory.
    assert_eq!(records(&dir).len(), 2);
    assert!(dir.join(file_name("old/key")).exists());
    fs::remove_dir_all(&parent).unwrap();
}

#[test]
fn a_directory_with_other_files_is_never_a_job_store_nor_removed() {
    let parent = temp_parent("user");
    let dir = parent.join("ferroccl-mine");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("notes.txt"), b"mine").unwrap();
    let e = FileStore::new_for_job(&dir).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidUsage, "{e}");
    assert!(e.message().contains("'notes.txt'"), "{e}");
    assert!(e.message().contains(&dir.display().to_string()), "{e}");
    // A plain store shares it, and leaves everything when dropped.
    let s = FileStore::new(&dir).unwrap();
    s.set("k", b"v").unwrap();
    drop(s);
    // Nor does a job store opened beside it sweep it.
    let beside = FileStore::new_for_job(parent.join("ferroccl-job")).unwrap();
    drop(beside);
    assert_eq!(fs::read(dir.join("notes.txt")).unwrap(), b"mine");
    assert_eq!(fs::read(dir.join(file_name("k"))).unwrap(), b"v");
    assert!(fs::symlink_metadata(dir.join(JOB_MARKER)).is_err());
    assert_eq!(
        entry_names(&parent).unwrap(),
        vec!["ferroccl-mine".to_string()]
    );
    fs::remove_dir_all(&parent).unwrap();
}

#[test]
fn stale_job_stores_beside_a_new_one_are_swept() {
    let parent = temp_parent("sweep");
    let dead = dead_pid();
    let ns = pid_namespace();
    let stale = parent.join("ferroccl-stale");
    left_behind(&stale, &[dead], ns);
    // Marked but never recorded: its opener died in between.
    let unrecorded = parent.join("ferroccl-unrecorded");
    left_behind(&unrecorded, &[], ns);
    let live = parent.join("ferroccl-live");
    left_behind(&live, &[std::os::unix::process::parent_id()], ns);
    let foreign = parent.join("ferroccl-foreign-ns");
    left_behind(&foreign, &[dead], ns ^ 1);
    // A stale job store under another name prefix is not looked at.
    let other = parent.join("elsewhere");
    left_behind(&other, &[dead], ns);
    let s = FileStore::new_for_job(parent.join("ferroccl-new")).unwrap();
    assert!(!stale.exists());
    assert!(!unrecorded.exists());
    for kept in [&live, &foreign, &other] {
        assert!(
            kept.join(file_name("old/key")).exists(),
            "{}",
            kept.display()
        );
    }
    drop(s);
    let mut left = entry_names(&parent).unwrap();
    left.sort();
    assert_eq!(left, ["elsewhere", "ferroccl-foreign-ns", "ferroccl-live"]);
    fs::remove_dir_all(&parent).unwrap();
}

#[test]
fn concurrent_opens_and_drops_never_lose_a_live_users_keys() {
    let parent = temp_parent("race");
    let dir = parent.join("ferroccl-job");
    for round in 0..20 {
        let ts: Vec<_> = (0..4)
            .map(|t| {
                let dir = dir.clone();
                thread::spawn(move || {
                    let s = FileStore::new_for_job(&dir).unwrap();
                    let key = format!("r{round}/t{t}");
                    s.set(&key, b"x").unwrap();
                    assert_eq!(s.get(&key, Duration::ZERO).unwrap(), b"x");
                    s.add("arrived", 1).unwrap();
                })
            })
            .collect();
        for t in ts {
            t.join().unwrap();
        }
        assert!(!dir.exists(), "round {round}: {:?}", entry_names(&dir));
    }
    // Overlapping users: each sees every key written while it was there.
    let first = FileStore::new_for_job(&dir).unwrap();
    first.set("early", b"1").unwrap();
    let ts: Vec<_> = (0..4)
        .map(|t| {
            let dir = dir.clone();
            thread::spawn(move || {
                let s = FileStore::new_for_job(&dir).unwrap();
                assert_eq!(s.get("early", Duration::ZERO).unwrap(), b"1", "thread {t}");
            })
        })
        .collect();
    for t in ts {
        t.join().unwrap();
    }
    assert_eq!(first.get("early", Duration::ZERO).unwrap(), b"1");
    drop(first);
    assert!(!dir.exists());
    fs::remove_dir(&parent).unwrap();
}
