//! Starting the ranks, forwarding their output, and stopping the job.
//!
//! Each rank runs in a process group of its own, so stopping a rank also stops whatever it
//! started (a shell's children). Its stdout and stderr are read line by line on two threads and
//! written whole, with a `[RANK] ` prefix, to the launcher's stdout and stderr. The main thread
//! polls for exits: the first rank that fails (non-zero status or a signal) stops the job with
//! SIGTERM to every rank, then SIGKILL after [`KILL_GRACE`].

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ferroccl_transport::{Error, Result};

use super::args::{is_path, LaunchConfig};
use super::placement::{new_job_id, place_ranks, rank_env, RankPlacement};
use super::store_addr::{netns_path, store_addr};

/// How long ranks get between SIGTERM and SIGKILL when the job is stopped.
pub const KILL_GRACE: Duration = Duration::from_secs(3);

/// How often the launcher checks for exited ranks, signals and the deadline.
const POLL: Duration = Duration::from_millis(10);

/// How long output still in flight may take to arrive after the last rank exited.
const DRAIN: Duration = Duration::from_secs(2);

/// Stack size of the output threads (two per rank); they hold little beyond a line buffer.
const FORWARDER_STACK: usize = 64 * 1024;

/// Exit status when `--timeout` expires (as timeout(1)).
pub const EXIT_TIMEOUT: u8 = 124;

/// A job ready to start.
#[derive(Debug, Clone)]
pub struct Job {
    /// The command line.
    pub config: LaunchConfig,
    /// Where each rank runs, indexed by rank.
    pub placements: Vec<RankPlacement>,
    /// `FERRO_STORE_ADDR`.
    pub store_addr: SocketAddr,
    /// `FERRO_JOB_ID`.
    pub job_id: String,
    /// With `--bind core`: the CPUs the launcher may run on, in order; rank `i` gets
    /// `cpus[i % cpus.len()]`. Empty: no binding.
    pub cpus: Vec<usize>,
}

/// The CPUs this process may run on (its affinity mask), in order.
fn allowed_cpus() -> Result<Vec<usize>> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity writes at most `size_of::<cpu_set_t>()` bytes into `set`.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(Error::io(
            "--bind core: reading this process's CPU affinity",
            &std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: `set` is initialised and every index is below CPU_SETSIZE.
    let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect();
    if cpus.is_empty() {
        return Err(Error::invalid_argument(
            "--bind core: this process may run on no CPU".to_string(),
        ));
    }
    Ok(cpus)
}

/// Finds `program` as the launcher would run it: a path as given, or a name searched in `PATH`.
///
/// The error (kind `InvalidArgument`) says where it looked.
pub fn resolve_program(program: &OsStr) -> Result<PathBuf> {
    let shown = program.to_string_lossy();
    if is_path(program) {
        let path = Path::new(program);
        return if is_executable(path) {
            Ok(path.to_path_buf())
        } else if path.exists() {
            Err(Error::invalid_argument(format!(
                "program '{shown}' is not an executable file"
            )))
        } else {
            Err(Error::invalid_argument(format!(
                "program '{shown}' not found (no such file)"
            )))
        };
    }
    let search = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&search)
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "program '{shown}' not found in PATH ({})",
                search.to_string_lossy()
            ))
        })
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Places the ranks, checks that every namespace exists, and picks the store address.
pub fn prepare(config: LaunchConfig) -> Result<Job> {
    for name in &config.netns {
        netns_path(name)?;
    }
    if !config.netns.is_empty() {
        resolve_program(OsStr::new("ip")).map_err(|e| {
            Error::invalid_argument(format!(
                "--netns needs iproute2's `ip` to enter namespaces: {}",
                e.message()
            ))
        })?;
    }
    let placements = place_ranks(config.nranks, &config.netns);
    let store_addr = store_addr(config.netns.first().map(String::as_str))?;
    let cpus = if config.bind {
        allowed_cpus()?
    } else {
        Vec::new()
    };
    Ok(Job {
        config,
        placements,
        store_addr,
        job_id: new_job_id(),
        cpus,
    })
}

/// The last signal the launcher received (SIGINT, SIGTERM or SIGHUP), and how many so far.
static LAST_SIGNAL: AtomicI32 = AtomicI32::new(0);
static SIGNAL_COUNT: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_signal(signal: libc::c_int) {
    // Only atomic stores: async-signal-safe.
    LAST_SIGNAL.store(signal, Ordering::SeqCst);
    SIGNAL_COUNT.fetch_add(1, Ordering::SeqCst);
}

/// Catches SIGINT, SIGTERM and SIGHUP so the main loop can forward them to the ranks.
fn catch_signals() -> Result<()> {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the handler only
        // performs atomic stores, which are async-signal-safe, and has the signature the kernel
        // calls for a handler without SA_SIGINFO.
        let rc = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut())
        };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            return Err(Error::io(
                format!("sigaction({})", signal_name(signal)),
                &err,
            ));
        }
    }
    Ok(())
}

/// One started rank.
#[derive(Debug)]
struct RankProcess {
    rank: usize,
    child: Child,
    /// Its process group (the child's pid).
    pgid: libc::pid_t,
    /// Set once reaped.
    status: Option<ExitStatus>,
    /// Output streams not yet at end of file: while any is open, something in the group may
    /// still be alive even after the rank itself exited.
    open_streams: Arc<AtomicUsize>,
}

impl RankProcess {
    fn may_have_live_processes(&self) -> bool {
        self.status.is_none() || self.open_streams.load(Ordering::SeqCst) > 0
    }
}

/// Sends `signal` to the process group of every rank that may still have live processes.
fn signal_ranks(ranks: &[RankProcess], signal: libc::c_int) {
    for r in ranks.iter().filter(|r| r.may_have_live_processes()) {
        // SAFETY: kill has no memory-safety preconditions. The group id is the pid of a child we
        // started with its own group; while the child is unreaped, or its pipes are held open by
        // members of the group, that id cannot name anyone else's group.
        unsafe {
            libc::kill(-r.pgid, signal);
        }
    }
}

/// Why the job is being stopped.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// A rank failed; the launcher exits with this status.
    Failure(u8),
    /// `--timeout` passed.
    Timeout,
    /// The launcher received this signal.
    Signal(libc::c_int),
}

impl Stop {
    fn exit_code(self) -> u8 {
        match self {
            Stop::Failure(code) => code,
            Stop::Timeout => EXIT_TIMEOUT,
            Stop::Signal(signal) => exit_code_for_signal(signal),
        }
    }
}

fn exit_code_for_signal(signal: libc::c_int) -> u8 {
    u8::try_from(128 + signal).unwrap_or(u8::MAX)
}

/// The launcher's exit status for a rank that ended with `status` (non-zero for any failure).
fn failure_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).ok().filter(|&c| c != 0).unwrap_or(1),
        (None, Some(signal)) => exit_code_for_signal(signal),
        (None, None) => 1,
    }
}

/// `exited with status 3`, `was killed by signal 9 (SIGKILL)`.
fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!(
            "was killed by signal {signal} ({}){}",
            signal_name(signal),
            if status.core_dumped() {
                ", core dumped"
            } else {
                ""
            }
        ),
        (None, None) => format!("ended with {status}"),
    }
}

fn signal_name(signal: libc::c_int) -> &'static str {
    match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        _ => "signal",
    }
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("{n} {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// Copies `reader` to stdout or stderr one whole line at a time, each line starting with
/// `prefix`; a last line without a newline gets one.
fn forward_lines(reader: impl Read, to_stderr: bool, prefix: &[u8]) {
    let mut reader = BufReader::with_capacity(64 * 1024, reader);
    let mut line = Vec::with_capacity(256);
    loop {
        line.clear();
        line.extend_from_slice(prefix);
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => return,
            Ok(_) => {
                if line.last() != Some(&b'\n') {
                    line.push(b'\n');
                }
                // A closed stdout must not stop the draining: a rank blocked on a full pipe
                // would never exit. Write errors are therefore ignored.
                let _ = if to_stderr {
                    let mut out = std::io::stderr().lock();
                    out.write_all(&line).and_then(|()| out.flush())
                } else {
                    let mut out = std::io::stdout().lock();
                    out.write_all(&line).and_then(|()| out.flush())
                };
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// Starts a thread forwarding `reader`; it decrements `open` and reports on `done` at the end.
fn spawn_forwarder(
    reader: impl Read + Send + 'static,
    to_stderr: bool,
    prefix: Vec<u8>,
    open: Arc<AtomicUsize>,
    done: mpsc::Sender<()>,
    name: String,
) -> Result<()> {
    std::thread::Builder::new()
        .name(name.clone())
        .stack_size(FORWARDER_STACK)
        .spawn(move || {
            forward_lines(reader, to_stderr, &prefix);
            open.fetch_sub(1, Ordering::SeqCst);
            let _ = done.send(());
        })
        .map(drop)
        .map_err(|e| Error::io(format!("starting output thread {name}"), &e))
}

/// The command that runs one rank.
fn rank_command(job: &Job, placement: &RankPlacement, program: &Path) -> Command {
    let config = &job.config;
    let mut command = match &placement.host {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns.as_str()]).arg(&config.program);
            c
        }
        None => {
            let mut c = Command::new(program);
            c.arg0(&config.program);
            c
        }
    };
    command
        .args(&config.args)
        .envs(rank_env(placement, job.store_addr, &job.job_id))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let launcher = std::process::id() as libc::pid_t;
    // The CPU this rank is pinned to (`--bind core`), as a set built before the fork.
    let pin = (!job.cpus.is_empty()).then(|| {
        let cpu = job.cpus[placement.rank % job.cpus.len()];
        // SAFETY: a zeroed cpu_set_t is a valid empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `cpu` is below CPU_SETSIZE (it came from a set of that size).
        unsafe { libc::CPU_SET(cpu, &mut set) };
        set
    });
    // SAFETY: the hook runs in the forked child before exec and calls only prctl, getppid and
    // sched_setaffinity, which are async-signal-safe system calls, and allocates nothing.
    unsafe {
        command.pre_exec(move || {
            // Die with the launcher. The death signal is tied to the thread that forked, so
            // `run` must be called from a thread that lives for the whole job.
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // The launcher may have died before the death signal was armed.
            if libc::getppid() != launcher {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            // Before exec, so every thread the program starts inherits the mask.
            if let Some(set) = &pin {
                if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    command
}

/// Starts one rank and its two output threads.
fn start_rank(
    job: &Job,
    placement: &RankPlacement,
    program: &Path,
    done: &mpsc::Sender<()>,
) -> Result<RankProcess> {
    let rank = placement.rank;
    let child = rank_command(job, placement, program).spawn().map_err(|e| {
        let shown = job.config.program.to_string_lossy();
        match &placement.host {
            Some(ns) => Error::io(
                format!("starting rank {rank} ('{shown}' in namespace '{ns}')"),
                &e,
            ),
            None => Error::io(format!("starting rank {rank} ('{shown}')"), &e),
        }
    })?;
    let pgid = child.id() as libc::pid_t;
    let open_streams = Arc::new(AtomicUsize::new(2));
    let prefix = if job.config.prefix {
        format!("[{rank}] ").into_bytes()
    } else {
        Vec::new()
    };
    let mut process = RankProcess {
        rank,
        pgid,
        status: None,
        open_streams: Arc::clone(&open_streams),
        child,
    };
    let stdout = process.child.stdout.take();
    let stderr = process.child.stderr.take();
    let started = (|| {
        if let Some(out) = stdout {
            spawn_forwarder(
                out,
                false,
                prefix.clone(),
                Arc::clone(&open_streams),
                done.clone(),
                format!("rank{rank}-out"),
            )?;
        }
        if let Some(err) = stderr {
            spawn_forwarder(
                err,
                true,
                prefix,
                Arc::clone(&open_streams),
                done.clone(),
                format!("rank{rank}-err"),
            )?;
        }
        Ok(())
    })();
    if let Err(e) = started {
        signal_ranks(std::slice::from_ref(&process), libc::SIGKILL);
        let _ = process.child.wait();
        return Err(e);
    }
    Ok(process)
}

/// Runs the job to the end and returns the launcher's exit status.
///
/// Must be called from a thread that outlives the job (the main thread): the ranks' death
/// signal fires when the thread that started them ends.
pub fn run(job: &Job) -> Result<u8> {
    catch_signals()?;
    let program = if job.config.netns.is_empty() {
        resolve_program(&job.config.program)?
    } else {
        PathBuf::from("ip")
    };
    let started_at = Instant::now();
    let deadline = job.config.timeout.map(|t| started_at + t);
    let (done_tx, done_rx) = mpsc::channel();

    let mut ranks: Vec<RankProcess> = Vec::with_capacity(job.placements.len());
    for placement in &job.placements {
        match start_rank(job, placement, &program, &done_tx) {
            Ok(r) => ranks.push(r),
            Err(e) => {
                stop_started(&mut ranks);
                return Err(e);
            }
        }
    }
    drop(done_tx);

    let stop = supervise(&mut ranks, deadline);

    // Collect output still in flight; processes left behind in a failed job's groups get a
    // final SIGKILL if they hold the pipes open past the drain time.
    let expected = 2 * ranks.len();
    let mut drained = 0;
    let mut drain_until = Instant::now() + DRAIN;
    let mut killed_leftovers = false;
    while drained < expected {
        let now = Instant::now();
        if now >= drain_until {
            if stop.is_none() || killed_leftovers {
                break;
            }
            signal_ranks(&ranks, libc::SIGKILL);
            killed_leftovers = true;
            drain_until = now + Duration::from_millis(500);
            continue;
        }
        match done_rx.recv_timeout(drain_until - now) {
            Ok(()) => drained += 1,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    Ok(stop.map_or(0, Stop::exit_code))
}

/// Kills and reaps the ranks started so far (when a later one could not start).
fn stop_started(ranks: &mut [RankProcess]) {
    signal_ranks(ranks, libc::SIGKILL);
    for r in ranks.iter_mut() {
        let _ = r.child.wait();
    }
}

/// Waits until every rank has exited, stopping the job on the first failure, on `deadline`, or
/// on a signal to the launcher. Returns why it stopped, `None` when every rank exited 0.
fn supervise(ranks: &mut [RankProcess], deadline: Option<Instant>) -> Option<Stop> {
    let mut stop: Option<(Stop, Instant)> = None;
    let mut sigkill_sent = false;
    // Counted from 0, not from now: a signal that arrived while the ranks were starting (after
    // `catch_signals`) must still be forwarded.
    let mut signals_seen = 0;
    loop {
        for i in 0..ranks.len() {
            if ranks[i].status.is_some() {
                continue;
            }
            let status = match ranks[i].child.try_wait() {
                Ok(Some(status)) => status,
                Ok(None) => continue,
                Err(e) => {
                    ferroccl_transport::log_line!(
                        "ferrorun: waiting for rank {}: {e}",
                        ranks[i].rank
                    );
                    ExitStatus::from_raw(1 << 8)
                }
            };
            ranks[i].status = Some(status);
            if !status.success() && stop.is_none() {
                let others = ranks.iter().filter(|r| r.status.is_none()).count();
                let rank = ranks[i].rank;
                if others > 0 {
                    ferroccl_transport::log_line!(
                        "ferrorun: rank {rank} {}; stopping the other {}",
                        describe(status),
                        plural(others, "rank")
                    );
                } else {
                    ferroccl_transport::log_line!("ferrorun: rank {rank} {}", describe(status));
                }
                signal_ranks(ranks, libc::SIGTERM);
                stop = Some((Stop::Failure(failure_code(status)), Instant::now()));
            }
        }
        let running: Vec<usize> = ranks
            .iter()
            .filter(|r| r.status.is_none())
            .map(|r| r.rank)
            .collect();
        if running.is_empty() {
            return stop.map(|(s, _)| s);
        }

        let signals = SIGNAL_COUNT.load(Ordering::SeqCst);
        if signals != signals_seen {
            signals_seen = signals;
            let signal = LAST_SIGNAL.load(Ordering::SeqCst);
            if stop.is_none() {
                ferroccl_transport::log_line!(
                    "ferrorun: received {}; forwarding it to {}",
                    signal_name(signal),
                    plural(running.len(), "rank")
                );
                signal_ranks(ranks, signal);
                stop = Some((Stop::Signal(signal), Instant::now()));
            } else if !sigkill_sent {
                ferroccl_transport::log_line!(
                    "ferrorun: received {} again; killing {}",
                    signal_name(signal),
                    plural(running.len(), "rank")
                );
                signal_ranks(ranks, libc::SIGKILL);
                sigkill_sent = true;
            }
        }

        let now = Instant::now();
        if let (Some(deadline), None) = (deadline, stop) {
            if now >= deadline {
                ferroccl_transport::log_line!(
                    "ferrorun: timeout; stopping {}",
                    plural(running.len(), "running rank")
                );
                signal_ranks(ranks, libc::SIGTERM);
                stop = Some((Stop::Timeout, now));
            }
        }
        if let Some((_, since)) = stop {
            if !sigkill_sent && now.duration_since(since) >= KILL_GRACE {
                let list: Vec<String> = running.iter().map(usize::to_string).collect();
                ferroccl_transport::log_line!(
                    "ferrorun: {} still alive {} s after SIGTERM (rank {}); sending SIGKILL",
                    plural(running.len(), "rank"),
                    KILL_GRACE.as_secs(),
                    list.join(", ")
                );
                signal_ranks(ranks, libc::SIGKILL);
                sigkill_sent = true;
            }
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_described_and_mapped() {
        let exited = ExitStatus::from_raw(3 << 8);
        assert_eq!(describe(exited), "exited with status 3");
        assert_eq!(failure_code(exited), 3);
        let killed = ExitStatus::from_raw(libc::SIGKILL);
        assert_eq!(describe(killed), "was killed by signal 9 (SIGKILL)");
        assert_eq!(failure_code(killed), 137);
        assert_eq!(Stop::Timeout.exit_code(), 124);
        assert_eq!(Stop::Signal(libc::SIGINT).exit_code(), 130);
        assert_eq!(Stop::Failure(7).exit_code(), 7);
    }

    #[test]
    fn resolves_programs() {
        assert!(resolve_program(OsStr::new("sh")).is_ok());
        let missing = resolve_program(OsStr::new("ferro-no-such-program")).unwrap_err();
        assert!(
            missing
                .message()
                .contains("'ferro-no-such-program' not found in PATH"),
            "{missing}"
        );
        let missing = resolve_program(OsStr::new("/nonexistent/prog")).unwrap_err();
        assert!(
            missing.message().contains("not found (no such file)"),
            "{missing}"
        );
        let not_exec = resolve_program(OsStr::new("/etc/passwd")).unwrap_err();
        assert!(
            not_exec.message().contains("not an executable file"),
            "{not_exec}"
        );
    }

    #[test]
    fn plurals() {
        assert_eq!(plural(1, "rank"), "1 rank");
        assert_eq!(plural(3, "rank"), "3 ranks");
    }
}
