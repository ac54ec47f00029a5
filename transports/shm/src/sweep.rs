//! Removing the segments of ranks that died before unlinking them.
//!
//! An owner unlinks its segment once every peer mapped it; a rank killed before that (during
//! init, say) leaves the file, and its rings' memory, in the directory. Before a rank creates
//! its own segment, [`sweep_dead_segments`] removes those whose owner is gone.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::host::namespace_inode;
use crate::segment::header_owner;
use crate::{segment_owner_pid, SEGMENT_PREFIX};

/// How long a segment file may stay without a complete header before its creator counts as
/// dead: creating and filling in a header takes milliseconds (seconds under heavy load).
pub(crate) const UNWRITTEN_GRACE: Duration = Duration::from_secs(10);

/// Removes the segment files in `dir` whose owner process is gone and returns how many it
/// removed. One `readdir`; only names that begin with [`SEGMENT_PREFIX`] are opened. Best
/// effort: a directory or file that cannot be read is left as it is.
///
/// A file is removed only when its name is one [`segment_name`](crate::segment_name) makes
/// (`ferroccl-<id>-r<rank>-p<pid>-<nonce>`), it is a regular file, its owner is not this
/// process, and either
///
/// - its header is complete (magic written), names the pid in the name, the owner's pid
///   namespace is this process's (a pid from another namespace says nothing here, so such files
///   stay), and `kill(pid, 0)` fails with `ESRCH` (`EPERM` means alive); or
/// - its header is not complete, the file is more than 10 s old (its creator died between
///   creating and filling it in; one being filled in right now is younger), and the pid in its
///   name is gone. Such a file carries no pid namespace, but no peer can use it either:
///   [`PeerSegment::open`](crate::PeerSegment::open) refuses a header without magic.
///
/// A pid reused by an unrelated process makes a dead owner look alive: the file stays, never
/// the other way round.
pub fn sweep_dead_segments(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let me = std::process::id();
    let my_pid_ns = namespace_inode("pid");
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str().filter(|n| n.starts_with(SEGMENT_PREFIX)) else {
            continue;
        };
        let Some(pid) = segment_owner_pid(name) else {
            continue;
        };
        if pid == me || !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let path = entry.path();
        if owner_is_gone(&path, pid, my_pid_ns) && std::fs::remove_file(&path).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Whether the owner of the segment file at `path`, whose name says `name_pid`, is gone.
fn owner_is_gone(path: &Path, name_pid: u32, my_pid_ns: u64) -> bool {
    let Ok(file) = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    else {
        return false;
    };
    match header_owner(&file) {
        Ok(Some((pid, pid_ns))) => {
            my_pid_ns != 0 && pid_ns == my_pid_ns && pid == u64::from(name_pid) && is_gone(name_pid)
        }
        Ok(None) => older_than(&file, UNWRITTEN_GRACE) && is_gone(name_pid),
        Err(_) => false,
    }
}

/// Whether `file` was last modified more than `age` ago.
fn older_than(file: &File, age: Duration) -> bool {
    file.metadata()
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .is_some_and(|d| d > age)
}

/// Whether no process with id `pid` exists in this pid namespace (`kill(pid, 0)` fails with
/// `ESRCH`). Pids that are not positive `pid_t`s count as present: `kill` would read them as
/// process groups.
fn is_gone(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill(2) with signal 0 sends nothing and only checks that the process exists; it
    // takes no pointers.
    let rc = unsafe { libc::kill(pid, 0) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::write_test_header;
    use crate::{segment_name, OwnSegment};
    use std::path::PathBuf;

    fn tmp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "ferroccl-sweep-test-{tag}-{}-{}",
            std::process::id(),
            segment_name(1, 0)
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// The pid of a child that has exited and been reaped: no process has it (until reused).
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(is_gone(pid), "pid {pid} of a reaped child still exists");
        pid
    }

    /// A segment name as owner `pid` would make it.
    fn name_of(pid: u32) -> String {
        segment_name(0xabc, 3).replace(&format!("-p{}-", std::process::id()), &format!("-p{pid}-"))
    }

    /// Plants a segment file in `dir` named as `name_pid`'s, with a header naming `header`
    /// (`None`: an empty file, header not written).
    fn plant(dir: &Path, name_pid: u32, header: Option<(u32, u64)>) -> PathBuf {
        let path = dir.join(name_of(name_pid));
        let file = File::create(&path).unwrap();
        if let Some((pid, ns)) = header {
            write_test_header(&file, u64::from(pid), ns).unwrap();
        }
        path
    }

    fn age(path: &Path, by: Duration) {
        let file = OpenOptions::new().write(true).open(path).unwrap();
        file.set_modified(SystemTime::now() - by).unwrap();
    }

    #[test]
    fn names_parse_only_when_made_by_segment_name() {
        let me = std::process::id();
        assert_eq!(segment_owner_pid(&segment_name(u64::MAX, 12)), Some(me));
        assert_eq!(
            segment_owner_pid("ferroccl-00000000000000ab-r0-p42-0000beef"),
            Some(42)
        );
        for other in [
            "ferroccl-00000000000000ab-r0-p42-0000beef-x",
            "ferroccl-00000000000000ab-r0-p42",
            "ferroccl-00000000000000ab-rx-p42-0000beef",
            "ferroccl-00000000000000ab-r0-42-0000beef",
            "ferroccl-000000000000ab-r0-p42-0000beef",
            "ferroccl-00000000000000ab-r0-p-0000beef",
            "ferroccl-test-dir",
            "other-00000000000000ab-r0-p42-0000beef",
        ] {
            assert_eq!(segment_owner_pid(other), None, "{other}");
        }
    }

    #[test]
    fn only_segments_of_dead_owners_in_this_pid_namespace_are_removed() {
        let dir = tmp_dir("owners");
        let ns = namespace_inode("pid");
        assert_ne!(ns, 0, "no pid namespace inode in /proc/self/ns/pid");
        let dead = dead_pid();
        let me = std::process::id();
        let alive = std::os::unix::process::parent_id();
        let dead_seg = plant(&dir, dead, Some((dead, ns)));
        let own_seg = plant(&dir, me, Some((me, ns)));
        let alive_seg = plant(&dir, alive, Some((alive, ns)));
        let foreign_ns = plant(&dir, dead, Some((dead, ns ^ 1)));
        // The header must name the pid in the name.
        let mismatched = plant(&dir, dead, Some((alive, ns)));
        let unrelated = dir.join("ferroccl-notes.txt");
        std::fs::write(&unrelated, b"not a segment").unwrap();
        assert_eq!(sweep_dead_segments(&dir), 1);
        assert!(!dead_seg.exists());
        for kept in [&own_seg, &alive_seg, &foreign_ns, &mismatched, &unrelated] {
            assert!(kept.exists(), "{} was removed", kept.display());
        }
        assert_eq!(sweep_dead_segments(&dir), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_segment_without_its_header_waits_out_the_grace_period() {
        let dir = tmp_dir("unwritten");
        let dead = dead_pid();
        let young = plant(&dir, dead, None);
        assert_eq!(sweep_dead_segments(&dir), 0);
        assert!(young.exists(), "a segment being created was removed");
        // Old and still without a header: its creator died; but only if the name's pid is gone.
        let alive = plant(&dir, std::os::unix::process::parent_id(), None);
        age(&young, UNWRITTEN_GRACE * 2);
        age(&alive, UNWRITTEN_GRACE * 2);
        assert_eq!(sweep_dead_segments(&dir), 1);
        assert!(!young.exists());
        assert!(alive.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn creating_a_segment_sweeps_first_and_says_how_many() {
        let dir = tmp_dir("create");
        let ns = namespace_inode("pid");
        let stale: Vec<PathBuf> = (0..2)
            .map(|_| {
                let d = dead_pid();
                plant(&dir, d, Some((d, ns)))
            })
            .collect();
        let mut seg = OwnSegment::create(&dir, &segment_name(5, 0), 5, 0, &[1], 4096).unwrap();
        assert_eq!(seg.swept(), 2);
        assert!(stale.iter().all(|p| !p.exists()));
        assert!(dir.join(seg.name()).exists());
        seg.unlink();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_directory_sweeps_nothing() {
        assert_eq!(
            sweep_dead_segments(Path::new("/nonexistent/ferroccl-sweep")),
            0
        );
    }
}
