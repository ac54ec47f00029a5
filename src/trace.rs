//! A timeline of each rank's collectives, in the Chrome trace event format that Perfetto and
//! `chrome://tracing` open.
//!
//! `FERRO_TRACE_FILE=trace-%r.json` turns it on: every communicator writes one file (`%r`:
//! its rank, `%p`: the process id; a second communicator of the same rank in one process
//! writes `<name>.1`, `<name>.2`, ...). Each collective is one complete event (`"ph": "X"`):
//!
//! | field | meaning |
//! |---|---|
//! | `name` | the collective (`all_reduce`, `broadcast`, ...) |
//! | `pid`, `tid` | the rank, 0 |
//! | `ts`, `dur` | start, microseconds since the Unix epoch (comparable across the processes of one machine), and duration |
//! | `args.seq` | the communicator's sequence number of the call |
//! | `args.bytes` | count × element size, as the caller gave them |
//! | `args.algorithm` | the schedule it ran (`ring`, `tree`, ...) |
//! | `args.wait_us` | per peer: microseconds of the steps that waited for that peer's data (or, for steps that only send, for it to take ours) |
//! | `args.transport` | per peer in `wait_us`: the link joining them (`shm`, `tcp`, ...) |
//!
//! The file is an array, one event per line, closed when the communicator is dropped; `ferroccl-trace
//! merge` joins the ranks' files into one view. When the variable is unset the executor
//! checks one `Option` per call and does nothing else.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The variable naming the trace file.
pub const TRACE_VAR: &str = "FERRO_TRACE_FILE";

/// Paths this process writes, so that two communicators never share one.
static OPEN: LazyLock<Mutex<HashSet<PathBuf>>> = LazyLock::new(|| Mutex::new(HashSet::new()));

/// One collective, as the executor saw it.
#[derive(Debug, Clone)]
pub(crate) struct Record<'a> {
    pub name: &'a str,
    pub seq: u64,
    pub bytes: usize,
    pub algorithm: String,
    pub start: Instant,
    pub end: Instant,
    /// Per peer: nanoseconds of steps waiting for it (0: not waited for).
    pub wait_ns: &'a [u64],
    /// Per peer: the link's name.
    pub links: &'a [String],
}

/// The trace file of one communicator.
#[derive(Debug)]
pub(crate) struct Tracer {
    out: BufWriter<File>,
    path: PathBuf,
    rank: usize,
    /// The same moment as an `Instant` and in microseconds since the Unix epoch.
    epoch: Instant,
    epoch_unix_us: f64,
    events: usize,
}

/// `pattern` with `%r` replaced by `rank` and `%p` by the process id.
pub(crate) fn expand(pattern: &str, rank: usize) -> PathBuf {
    PathBuf::from(
        pattern
            .replace("%r", &rank.to_string())
            .replace("%p", &std::process::id().to_string()),
    )
}

impl Tracer {
    /// The tracer `FERRO_TRACE_FILE` asks for, if any. A file that cannot be created is
    /// reported once on stderr and tracing stays off (a trace never fails a job).
    pub(crate) fn from_env(rank: usize) -> Option<Box<Tracer>> {
        let pattern = std::env::var(TRACE_VAR)
            .ok()
            .filter(|p| !p.trim().is_empty())?;
        let base = expand(pattern.trim(), rank);
        let path = {
            let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
            let mut path = base.clone();
            let mut n = 0;
            while open.contains(&path) {
                n += 1;
                path = PathBuf::from(format!("{}.{n}", base.display()));
            }
            open.insert(path.clone());
            path
        };
        match Tracer::create(&path, rank) {
            Ok(t) => Some(Box::new(t)),
            Err(e) => {
                ferroccl_transport::log_line!(
                    "ferroccl rank {rank} WARN: {TRACE_VAR}: cannot write {}: {e}; no trace",
                    path.display()
                );
                None
            }
        }
    }

    fn create(path: &Path, rank: usize) -> std::io::Result<Tracer> {
        let mut out = BufWriter::new(File::create(path)?);
        let epoch = Instant::now();
        let epoch_unix_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64() * 1e6)
            .unwrap_or(0.0);
        write!(
            out,
            "[\n{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{rank},\"tid\":0,\"args\":{{\"name\":\"rank {rank}\"}}}}"
        )?;
        Ok(Tracer {
            out,
            path: path.to_path_buf(),
            rank,
            epoch,
            epoch_unix_us,
            events: 0,
        })
    }

    fn micros(&self, t: Instant) -> f64 {
        let since = t.saturating_duration_since(self.epoch).as_secs_f64() * 1e6;
        self.epoch_unix_us + since
    }

    /// Appends one collective.
    pub(crate) fn record(&mut self, r: &Record<'_>) {
        let ts = self.micros(r.start);
        let dur = r.end.saturating_duration_since(r.start).as_secs_f64() * 1e6;
        let mut waits = String::new();
        let mut links = String::new();
        for (peer, &ns) in r.wait_ns.iter().enumerate().filter(|(_, &ns)| ns > 0) {
            let sep = if waits.is_empty() { "" } else { "," };
            let _ = write!(waits, "{sep}\"{peer}\":{:.3}", ns as f64 / 1e3);
            let name = r.links.get(peer).map_or("", String::as_str);
            let _ = write!(links, "{sep}\"{peer}\":\"{name}\"");
        }
        let line = format!(
            ",\n{{\"name\":\"{}\",\"cat\":\"collective\",\"ph\":\"X\",\"pid\":{},\"tid\":0,\"ts\":{ts:.3},\"dur\":{dur:.3},\"args\":{{\"seq\":{},\"bytes\":{},\"algorithm\":\"{}\",\"wait_us\":{{{waits}}},\"transport\":{{{links}}}}}}}",
            r.name, self.rank, r.seq, r.bytes, r.algorithm
        );
        if self.out.write_all(line.as_bytes()).is_ok() {
            self.events += 1;
        }
        // Keep what is written readable if the process dies: flush every few events.
        if self.events.is_multiple_of(64) {
            let _ = self.out.flush();
        }
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        let _ = self.out.write_all(b"\n]\n");
        let _ = self.out.flush();
        OPEN.lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.path);
    }
}

/// Joins the events of several trace files (each an array, possibly left unclosed by a rank
/// that died) into one array. Lines that are not events are dropped.
pub fn merge(inputs: &[String]) -> String {
    let mut out = String::from("[");
    let mut first = true;
    for text in inputs {
        for line in text.lines() {
            let l = line.trim().trim_end_matches(',');
            if !(l.starts_with('{') && l.ends_with('}')) {
                continue;
            }
            out.push_str(if first { "\n" } else { ",\n" });
            out.push_str(l);
            first = false;
        }
    }
    out.push_str("\n]\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_one_line_each_and_merge() {
        let dir = std::env::temp_dir().join(format!("ferro-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t-0.json");
        let mut t = Tracer::create(&path, 0).unwrap();
        let start = Instant::now();
        let links: Vec<String> = ["", "shm", "", "tcp"].map(String::from).to_vec();
        t.record(&Record {
            name: "all_reduce",
            seq: 3,
            bytes: 4096,
            algorithm: "ring".into(),
            start,
            end: start + std::time::Duration::from_micros(250),
            wait_ns: &[0, 1500, 0, 20_000],
            links: &links,
        });
        drop(t);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with("[\n{") && text.ends_with("\n]\n"),
            "{text}"
        );
        let ev = text.lines().find(|l| l.contains("all_reduce")).unwrap();
        assert!(ev.contains("\"dur\":250.000"), "{ev}");
        assert!(
            ev.contains("\"wait_us\":{\"1\":1.500,\"3\":20.000}"),
            "{ev}"
        );
        assert!(
            ev.contains("\"transport\":{\"1\":\"shm\",\"3\":\"tcp\"}"),
            "{ev}"
        );
        // An unclosed file (a rank that died) merges too.
        let unclosed = text.trim_end().trim_end_matches(']').to_string();
        let merged = merge(&[text.clone(), unclosed]);
        assert_eq!(merged.matches("all_reduce").count(), 2);
        assert!(merged.starts_with("[\n{") && merged.ends_with("}\n]\n"));
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(expand("x-%r.json", 7), PathBuf::from("x-7.json"));
    }
}
