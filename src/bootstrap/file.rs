//! A store in a directory, for ranks that are processes on one host (or share a file system).
//!
//! Each key is one file, `k-<encoded key>`: bytes other than ASCII letters, digits, `-` and `_`
//! are written `%XX`, and very long keys are shortened and suffixed with a hash of the whole key.
//! A value is written to a temporary file and renamed over the key's file, so a reader sees
//! either the old or the new value, never a partial one. [`Store::get`] polls for the file with
//! short sleeps. [`Store::add`] holds an exclusive `flock` on the directory's `.lock` file while
//! it reads, updates and replaces the counter, so it is atomic across processes.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::{add_to_counter, Store};
use crate::{Error, Result};

/// Encoded names longer than this are shortened (file names may have at most 255 bytes).
const MAX_NAME: usize = 160;
/// The first and the longest pause between two looks for a key's file.
const POLL_FIRST: Duration = Duration::from_millis(1);
const POLL_MAX: Duration = Duration::from_millis(20);

/// A store kept as files in one directory.
#[derive(Debug, Clone)]
pub struct FileStore {
    dir: PathBuf,
}

impl FileStore {
    /// A store in `dir`, created (with its parents) if missing. Ranks using the same
    /// directory share the store; keys already there (from an earlier job) are visible, so use
    /// a directory per job.
    pub fn new(dir: impl Into<PathBuf>) -> Result<FileStore> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|e| {
            Error::io(
                format_args!("file store: creating directory {}", dir.display()),
                &e,
            )
        })?;
        Ok(FileStore { dir })
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
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let tmp = self.dir.join(format!(
            ".tmp-{}-{}-{nanos}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let context = || format!("file store set of key '{key}' in {}", self.dir.display());
        let written = File::create(&tmp)
            .and_then(|mut f| f.write_all(value))
            .and_then(|()| fs::rename(&tmp, path));
        written.map_err(|e| {
            let _ = fs::remove_file(&tmp);
            Error::io(context(), &e)
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
        let lock_path = self.dir.join(".lock");
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
        loop {
            // SAFETY: the descriptor belongs to `file`, which outlives this call; flock takes
            // no pointers.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                return Ok(FlockGuard { file });
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
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
        name.push_str(&format!("~{:016x}", fnv1a(key.as_bytes())));
    }
    name
}

/// 64-bit FNV-1a hash.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;
    use std::thread;

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
}
