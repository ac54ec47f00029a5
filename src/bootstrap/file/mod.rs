//! A store in a directory, for ranks that are processes on one host (or share a file system).
//!
//! Each key is one file, `k-<encoded key>`: bytes other than ASCII letters, digits, `-` and `_`
//! are written `%XX`, and very long keys are shortened and suffixed with a hash of the whole key.
//! A value is written to a temporary file and renamed over the key's file, so a reader sees
//! either the old or the new value, never a partial one. [`Store::get`] polls for the file with
//! short sleeps. [`Store::add`] holds an exclusive `flock` on the directory's `.lock` file while
//! it reads, updates and replaces the counter, so it is atomic across processes.
//!
//! ## Job stores
//!
//! [`FileStore::new`] never removes anything. [`FileStore::new_for_job`] opens a directory that
//! belongs to one job and goes away with it, also when the job's ranks were killed. Beside the
//! keys such a directory holds:
//!
//! | file | what it is |
//! |---|---|
//! | `.ferroccl-job-store` | marks the directory as a job store's: no other directory is ever removed |
//! | `.user-<pid>-<n>` | one per open job store (shared by its clones): its process, and that process's pid namespace |
//! | `.lock` | the `flock` that orders joining, leaving and [`Store::add`] |
//!
//! **Invariant.** Every key in a job store's directory was written by a process whose user
//! record was in the directory while it wrote: a store records itself before
//! [`new_for_job`](FileStore::new_for_job) returns it, and removes its record only when its last
//! clone is dropped, after which it writes nothing. A record is removed only by its own store or
//! by another process that holds the lock and finds the record's pid gone (`kill(pid, 0)` fails
//! with `ESRCH`) in its own pid namespace; a record from another pid namespace, or whose pid
//! was reused, counts as live. So a directory with no record of a live process holds nothing
//! that anyone still needs, and whoever finds it so, holding the lock, clears it: a process
//! joining removes the stale keys and records before recording itself; a store leaving (its
//! last clone dropped) removes the whole directory.
//!
//! Joining and leaving hold the `.lock` flock throughout, so two ranks opening at once are
//! ordered: the first marks the directory and records itself, the second finds a live record
//! and keeps the keys. The last user removes the keys, records and marker, then `.lock`, then
//! the directory. A process that was waiting on that lock checks, once it holds it, that its
//! `.lock` is still the file at that path, and starts over (creating the directory anew) if not.
//!
//! Job stores whose ranks were all killed are removed by the next [`new_for_job`](FileStore::new_for_job)
//! in the same parent directory: it also sweeps the marked directories beside its own whose
//! names begin with `ferroccl-` and that no live process uses.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferroccl_transport::fnv1a64;

use super::{add_to_counter, Store};
use crate::{Error, Result};

/// Encoded names longer than this are shortened (file names may have at most 255 bytes).
const MAX_NAME: usize = 160;
/// The first and the longest pause between two looks for a key's file.
const POLL_FIRST: Duration = Duration::from_millis(1);
const POLL_MAX: Duration = Duration::from_millis(20);

/// How key files' names begin.
const KEY_PREFIX: &str = "k-";
/// How temporary files' names begin (renamed over a key's file once written).
const TMP_PREFIX: &str = ".tmp-";
/// The lock file ordering `add` and, in a job store, joining and leaving.
const LOCK_FILE: &str = ".lock";
/// Marks a job store's directory; only marked directories are ever removed.
const JOB_MARKER: &str = ".ferroccl-job-store";
/// How user records' names begin (`.user-<pid>-<n>`).
const USER_PREFIX: &str = ".user-";
/// Stale job stores beside a new one are swept only when their names begin so.
const SWEPT_PREFIX: &str = "ferroccl-";
/// How often opening a job store starts over because the directory was removed meanwhile.
const JOIN_ATTEMPTS: usize = 100;

/// A store kept as files in one directory.
///
/// Clones share the directory and, for a job store, its user record (see the module docs):
/// the record goes when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct FileStore {
    dir: PathBuf,
    /// A job store's user record in `dir`; `None` for a store made by [`FileStore::new`].
    user: Option<Arc<JobUser>>,
}

/// A job store's record of its process in the directory. Dropping it leaves the job: the
/// record goes, and the directory too when no live user is left.
#[derive(Debug)]
struct JobUser {
    dir: PathBuf,
    record: PathBuf,
}

impl Drop for JobUser {
    fn drop(&mut self) {
        // Best effort: what cannot be removed now is swept by a later job store's opening.
        let _ = leave_job_dir(&self.dir, Some(&self.record));
    }
}

impl FileStore {
    /// A store in `dir`, created (with its parents) if missing. Ranks using the same
    /// directory share the store; keys already there (from an earlier job) are visible, so use
    /// a directory per job. Nothing is ever removed: see [`new_for_job`](Self::new_for_job) for
    /// a directory that goes away with the job.
    pub fn new(dir: impl Into<PathBuf>) -> Result<FileStore> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|e| {
            Error::io(
                format_args!("file store: creating directory {}", dir.display()),
                &e,
            )
        })?;
        Ok(FileStore { dir, user: None })
    }

    /// A store in `dir`, a directory of the job's own, created (with its parents) if missing,
    /// and removed when the last process using it drops its store (all clones), or, if those
    /// processes were killed, by the next process that opens it or opens a job store beside it.
    /// Keys that an earlier job left there, with no live process using it, are removed now.
    /// See the module docs for the protocol and its invariant.
    ///
    /// A directory that already exists must be a job store's (or empty): one that holds other
    /// files is an `InvalidUsage` error naming one of them, and is left untouched.
    pub fn new_for_job(dir: impl Into<PathBuf>) -> Result<FileStore> {
        let dir = dir.into();
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent).map_err(|e| {
                Error::io(
                    format_args!(
                        "file store for a job in {}: creating directory {}",
                        dir.display(),
                        parent.display()
                    ),
                    &e,
                )
            })?;
        }
        let lock = lock_job_dir(&dir, true, true)
            .map_err(|e| {
                Error::io(
                    format_args!(
                        "file store for a job: locking {}",
                        dir.join(LOCK_FILE).display()
                    ),
                    &e,
                )
            })?
            .ok_or_else(|| {
                Error::internal(format!(
                    "file store for a job: {} vanished while being opened",
                    dir.display()
                ))
            })?;
        let record = join_job_dir(&dir)?;
        let user = Arc::new(JobUser {
            dir: dir.clone(),
            record,
        });
        drop(lock);
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            sweep_stale_job_dirs(parent, &dir);
        }
        Ok(FileStore {
            dir,
            user: Some(user),
        })
    }

    /// Whether this is a job store (made by [`new_for_job`](Self::new_for_job)), whose
    /// directory goes away with its last user.
    pub fn is_job_store(&self) -> bool {
        self.user.is_some()
    }

    /// The directory holding the store.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn key_path(&self, key: &str) -> PathBuf {
        self.dir.join(file_name(key))
    }

    /// Writes `value` to `path` atomically: a temporary file in the same directory, renamed.
    fn write_atomic(&self, key: &str, path: &Path, value: &[u8]) -> Result<()> {
        write_atomic_in(&self.dir, path, value).map_err(|e| {
            Error::io(
                format_args!("file store set of key '{key}' in {}", self.dir.display()),
                &e,
            )
        })
    }

    /// Reads the value of `key`, `None` when it is not set yet.
    fn try_read(&self, key: &str, path: &Path) -> Result<Option<Vec<u8>>> {
        match fs::read(path) {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(
                format_args!("file store get of key '{key}' from {}", path.display()),
                &e,
            )),
        }
    }
}

impl Store for FileStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.write_atomic(key, &self.key_path(key), value)
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let path = self.key_path(key);
        let start = Instant::now();
        let mut pause = POLL_FIRST;
        loop {
            if let Some(v) = self.try_read(key, &path)? {
                return Ok(v);
            }
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(Error::timeout(format!(
                    "file store get of key '{key}' from {}: nobody set it within {timeout:?}",
                    self.dir.display()
                )));
            }
            std::thread::sleep(pause.min(left));
            pause = (pause * 2).min(POLL_MAX);
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let lock_path = self.dir.join(LOCK_FILE);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| {
                Error::io(
                    format_args!(
                        "file store add to key '{key}': opening {}",
                        lock_path.display()
                    ),
                    &e,
                )
            })?;
        let _guard = FlockGuard::lock(&lock).map_err(|e| {
            Error::io(
                format_args!(
                    "file store add to key '{key}': flock {}",
                    lock_path.display()
                ),
                &e,
            )
        })?;
        let path = self.key_path(key);
        let current = self.try_read(key, &path)?;
        let (new, text) = add_to_counter(key, current.as_deref(), delta)?;
        self.write_atomic(key, &path, &text)?;
        Ok(new)
    }
}

/// An exclusive `flock` on a file, released on drop (and by the kernel when the file closes).
struct FlockGuard<'a> {
    file: &'a File,
}

impl<'a> FlockGuard<'a> {
    fn lock(file: &'a File) -> io::Result<FlockGuard<'a>> {
        flock_exclusive(file)?;
        Ok(FlockGuard { file })
    }
}

/// Takes an exclusive `flock` on `file`, waiting for it; it holds until unlocked or until the
/// file (every descriptor of this open) is closed.
fn flock_exclusive(file: &File) -> io::Result<()> {
    loop {
        // SAFETY: the descriptor belongs to `file`, which outlives this call; flock takes no
        // pointers.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Writes `value` to `path` (in `dir`) atomically: a temporary file in `dir`, renamed.
fn write_atomic_in(dir: &Path, path: &Path, value: &[u8]) -> io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = dir.join(format!(
        "{TMP_PREFIX}{}-{}-{nanos}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let written = File::create(&tmp)
        .and_then(|mut f| f.write_all(value))
        .and_then(|()| fs::rename(&tmp, path));
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

/// Opens and locks `dir/.lock`, creating the directory (`make_dir`) and the lock file
/// (`make_lock`) when missing. Once the lock is held, checks that the file locked is still the
/// one at that path: the last user of a job store removes it, holding the lock, just before it
/// removes the directory. If it is not, starts over when `make_dir`, else returns `None`, as
/// when the directory (or, without `make_lock`, the lock file) is missing. The lock holds
/// until the returned file is dropped.
fn lock_job_dir(dir: &Path, make_dir: bool, make_lock: bool) -> io::Result<Option<File>> {
    let lock_path = dir.join(LOCK_FILE);
    for _ in 0..JOIN_ATTEMPTS {
        if make_dir {
            match fs::create_dir(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        let file = match OpenOptions::new()
            .write(true)
            .create(make_lock)
            .truncate(false)
            .open(&lock_path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound && make_dir => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        flock_exclusive(&file)?;
        let held = file.metadata()?;
        let linked = match fs::symlink_metadata(&lock_path) {
            Ok(m) => m.ino() == held.ino() && m.dev() == held.dev(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => return Err(e),
        };
        if linked {
            return Ok(Some(file));
        }
        if !make_dir {
            return Ok(None);
        }
    }
    Err(io::Error::other(format!(
        "the directory was removed {JOIN_ATTEMPTS} times while this process waited for its lock"
    )))
}

/// Joins the job store in `dir` (its lock held by the caller): marks the directory if it is new
/// (or empty), removes the records of dead users and, if no live user is left, the keys they
/// wrote, then records this process. Returns the record's path.
fn join_job_dir(dir: &Path) -> Result<PathBuf> {
    let fail = |what: String, e: &io::Error| {
        Error::io(
            format_args!("file store for a job in {}: {what}", dir.display()),
            e,
        )
    };
    let marker = dir.join(JOB_MARKER);
    if fs::symlink_metadata(&marker).is_err() {
        let names = entry_names(dir).map_err(|e| fail("listing the directory".into(), &e))?;
        if let Some(other) = names.iter().find(|n| *n != LOCK_FILE) {
            return Err(Error::invalid_usage(format!(
                "file store for a job in {}: the directory already holds '{other}' and is not a \
                 job store's; give the job a directory of its own (FileStore::new shares an \
                 existing directory and never removes it)",
                dir.display()
            )));
        }
        fs::write(&marker, b"ferroccl job store\n")
            .map_err(|e| fail(format!("writing {}", marker.display()), &e))?;
    }
    let live = prune_job_users(dir).map_err(|e| fail("removing dead users' records".into(), &e))?;
    if live == 0 {
        remove_job_files(dir).map_err(|e| fail("removing stale keys".into(), &e))?;
    }
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let record = dir.join(format!(
        "{USER_PREFIX}{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    write_atomic_in(
        dir,
        &record,
        format!("pidns={}\n", pid_namespace()).as_bytes(),
    )
    .map_err(|e| fail(format!("writing {}", record.display()), &e))?;
    Ok(record)
}

/// Leaves the job store in `dir`: removes `record` (if any), then, if no live user is left,
/// the whole directory. Returns whether it removed the directory. A directory that is not a
/// job store's, or holds files that the store did not write, is never removed.
fn leave_job_dir(dir: &Path, record: Option<&Path>) -> io::Result<bool> {
    let Some(_lock) = lock_job_dir(dir, false, record.is_some())? else {
        return Ok(false);
    };
    if let Some(record) = record {
        remove_present(record)?;
    }
    let marker = dir.join(JOB_MARKER);
    if fs::symlink_metadata(&marker).is_err() || prune_job_users(dir)? > 0 {
        return Ok(false);
    }
    if remove_job_files(dir)? {
        return Ok(false);
    }
    remove_present(&marker)?;
    remove_present(&dir.join(LOCK_FILE))?;
    // A process that opened the lock file after it went has made a new one: the directory is
    // then not empty and stays, and that process adopts it.
    Ok(fs::remove_dir(dir).is_ok())
}

/// Removes the job store directories beside `own` in `parent` (names beginning `ferroccl-`,
/// marked as job stores) that no live process uses. Best effort; returns how many went.
fn sweep_stale_job_dirs(parent: &Path, own: &Path) -> usize {
    let Ok(entries) = fs::read_dir(parent) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let is_candidate = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(SWEPT_PREFIX))
            && entry.file_type().is_ok_and(|t| t.is_dir());
        let path = entry.path();
        if !is_candidate || path == own || fs::symlink_metadata(path.join(JOB_MARKER)).is_err() {
            continue;
        }
        if leave_job_dir(&path, None).unwrap_or(false) {
            removed += 1;
        }
    }
    removed
}

/// Removes the user records in `dir` whose process is gone; returns how many live ones remain.
fn prune_job_users(dir: &Path) -> io::Result<usize> {
    let my_ns = pid_namespace();
    let mut live = 0;
    for name in entry_names(dir)? {
        let Some(rest) = name.strip_prefix(USER_PREFIX) else {
            continue;
        };
        let path = dir.join(&name);
        let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
        // A record in another pid namespace (or unreadable) says nothing here: it counts as live.
        let same_ns = fs::read_to_string(&path).ok().is_some_and(|text| {
            text.trim().strip_prefix("pidns=") == Some(my_ns.to_string().as_str())
        });
        match pid {
            Some(pid) if my_ns != 0 && same_ns && process_is_gone(pid) => remove_present(&path)?,
            _ => live += 1,
        }
    }
    Ok(live)
}

/// Removes the keys, temporary files and user records in `dir`; returns whether anything else
/// (besides the marker and the lock file) is there.
fn remove_job_files(dir: &Path) -> io::Result<bool> {
    let mut others = false;
    for name in entry_names(dir)? {
        if [KEY_PREFIX, TMP_PREFIX, USER_PREFIX]
            .iter()
            .any(|p| name.starts_with(p))
        {
            remove_present(&dir.join(&name))?;
        } else if name != JOB_MARKER && name != LOCK_FILE {
            others = true;
        }
    }
    Ok(others)
}

/// The names in `dir` (lossily decoded: job store files are ASCII).
fn entry_names(dir: &Path) -> io::Result<Vec<String>> {
    fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect()
}

/// Removes the file at `path`; one that is already gone is no error.
fn remove_present(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// This process's pid namespace (the nsfs inode), or 0 when unreadable.
fn pid_namespace() -> u64 {
    fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

/// Whether no process with id `pid` exists in this pid namespace (`kill(pid, 0)` fails with
/// `ESRCH`; `EPERM` means it exists). Ids that are not positive `pid_t`s count as present:
/// `kill` would read them as process groups.
fn process_is_gone(pid: u32) -> bool {
    match libc::pid_t::try_from(pid) {
        Ok(pid) if pid > 0 => {
            // SAFETY: kill(2) with signal 0 sends nothing and only checks that the process
            // exists; it takes no pointers.
            let rc = unsafe { libc::kill(pid, 0) };
            rc != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        }
        _ => false,
    }
}

impl Drop for FlockGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: the descriptor belongs to `self.file`, borrowed for the guard's lifetime.
        // A failure here is harmless: closing the file releases the lock anyway.
        unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// The file name for `key`: `k-` and the key with unsafe bytes written `%XX`.
fn file_name(key: &str) -> String {
    let mut name = String::with_capacity(key.len() + 2);
    name.push_str("k-");
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            name.push(char::from(b));
        } else {
            name.push_str(&format!("%{b:02X}"));
        }
    }
    if name.len() > MAX_NAME {
        // Every character is ASCII, so any byte index is a char boundary.
        name.truncate(MAX_NAME - 17);
        name.push_str(&format!("~{:016x}", fnv1a64(key.as_bytes())));
    }
    name
}

#[cfg(test)]
mod tests;
