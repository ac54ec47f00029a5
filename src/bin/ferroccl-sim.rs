//! `ferroccl-sim`: predicts collective times on a modelled cluster by running the real
//! schedules, and prints them in the perf tools' table layout.
//!
//! ```text
//! ferroccl-sim --ranks 16384 --ranks-per-host 8 [--op allreduce] [--algo auto|all|ring,tree,...]
//!              [-b 8] [-e 128M] [-f 4] [--intra shm] [--inter tcp] [--nic-gbps X]
//!              [--slice BYTES] [--slow HOST=FACTOR] [--placement host-major|round-robin]
//!              [--reduce-gbps X] [--eager BYTES] [--nic-burst BYTES] [--calls N]
//!              [--ranks-per-core F] [--wake-us W] [--cache BYTES --mem-gbps X]
//!              [--topology FILE] [--hosts N] [-h|--help] [-V|--version]
//! ```
//!
//! `--ranks-per-core F` and `--wake-us W`: ranks that share cores (`F` > 1) run their copies,
//! reductions and shared-memory transfers `F` times slower, and every message costs
//! `(1 - 1/F) * W` microseconds more (default: a core per rank).
//!
//! `--cache BYTES` and `--mem-gbps X`: a call whose send and receive buffers, over the ranks
//! of a host, reach the cache size is memory-bound: each rank's copies and shared-memory
//! transfers then run at no more than `X` GB/s (default: no memory term).
//!
//! `--calls N`: time per call of `N` back-to-back calls after the first, as a benchmark loop
//! measures it (default 1: one call on idle links).
//!
//! `--nic-gbps X`: each host's NIC bandwidth, each way (default: the inter link's); messages
//! across hosts queue for it. `--nic-burst BYTES`: the NIC is a token-bucket shaper holding
//! that many bytes (default 0: none), as Linux `tbf` and cloud instances' burst bandwidth are.
//!
//! `--eager BYTES`: messages up to this size leave their sender without waiting for the
//! receiver (default [`DEFAULT_EAGER_BYTES`], 64 KiB; 0: every message is a rendezvous).
//!
//! `--slice BYTES`: the most bytes one message carries, as `FERRO_SLICE_BYTES` (default 4 MiB);
//! every algorithm runs with the slice the tuner gives it up to that (smaller where pipelining
//! pays, as for the tree).
//!
//! Placement: `host-major` (default) puts ranks `h*K .. (h+1)*K` on host `h`; `round-robin`
//! puts rank `r` on host `r % hosts` (as `ferrorun --netns` does).
//!
//! `--reduce-gbps X`: bytes of received data a rank reduces per second, in GB/s; every message
//! that lands in a receive-and-reduce op holds its receiver `bytes / X` longer. Default
//! [`DEFAULT_REDUCE_GBPS`] (half the 10 GB/s copy bandwidth); `0` or `inf` makes reductions
//! free (the pure alpha-beta model).
//!
//! A topology file holds lines `key value...` (`#` starts a comment): `ranks N`,
//! `ranks_per_host K`, `intra LINK`, `inter LINK`, `link LINK ALPHA_US BETA_GBPS`,
//! `nic_gbps X`, `nic_burst BYTES`, `ranks_per_core F`, `wake_us W`, `cache BYTES`,
//! `mem_gbps X`, `reduce GBPS` (as `--reduce-gbps`), `eager BYTES`, `slow HOST FACTOR`,
//! `placement host-major|round-robin`. Options and lines apply in order, later ones win.
//!
//! `--topology` also takes an NCCL topology XML file (as `ferroccl-topo` reads): one host of
//! that machine, a rank per GPU, the intra-host link's bandwidth from the channels found over
//! its GPUs and the inter-host link and NIC bandwidth from the NICs they use; reductions are
//! free (GPUs reduce at memory bandwidth). `--hosts N`
//! then sets the ranks to N hosts' worth, so `--topology dgx-h100.xml --hosts 16` predicts 16
//! such machines.
#![forbid(unsafe_code)]

use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use ferroccl::coll::{AlgoOptions, Algorithm, CollArgs, CollKind, Topology};
use ferroccl::plan::{CostModel, Link, LinkCost, Overrides};
use ferroccl::sim::{
    busbw_factor, simulate_calls, Cluster, DEFAULT_COPY_GBPS, DEFAULT_EAGER_BYTES,
    DEFAULT_REDUCE_GBPS,
};
use ferroccl::topo::Hardware;

struct Opts {
    ranks: usize,
    per_host: usize,
    op: CollKind,
    algos: Option<Vec<Algorithm>>,
    all: bool,
    begin: usize,
    end: usize,
    factor: usize,
    model: CostModel,
    slow: Vec<(usize, f64)>,
    round_robin: bool,
    reduce_gbps: f64,
    eager_bytes: usize,
    nic_burst_bytes: usize,
    calls: usize,
    ranks_per_core: f64,
    wake_us: f64,
    cache_bytes: usize,
    mem_gbps: f64,
    /// `--hosts N`: ranks become N times the ranks per host, after every other option.
    hosts: Option<usize>,
    /// What an NCCL topology file given to `--topology` described, for the header.
    machine: Option<String>,
}

impl Default for Opts {
    /// What `ferroccl-sim` runs without flags.
    fn default() -> Self {
        Opts {
            ranks: 16,
            per_host: 8,
            op: CollKind::AllReduce,
            algos: None,
            all: false,
            begin: 8,
            end: 128 << 20,
            factor: 4,
            model: CostModel::default(),
            slow: Vec::new(),
            round_robin: false,
            reduce_gbps: DEFAULT_REDUCE_GBPS,
            eager_bytes: DEFAULT_EAGER_BYTES,
            nic_burst_bytes: 0,
            calls: 1,
            ranks_per_core: 1.0,
            wake_us: 0.0,
            cache_bytes: 0,
            mem_gbps: 0.0,
            hosts: None,
            machine: None,
        }
    }
}

fn parse_placement(v: &str) -> Result<bool, String> {
    match v {
        "host-major" => Ok(false),
        "round-robin" => Ok(true),
        _ => Err(format!(
            "unknown placement '{v}' (expected host-major or round-robin)"
        )),
    }
}

fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (d, m) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1usize << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    d.parse::<usize>()
        .ok()
        .and_then(|v| v.checked_mul(m))
        .ok_or_else(|| format!("bad size '{s}'"))
}

fn parse_op(s: &str) -> Result<CollKind, String> {
    Ok(match s.replace('_', "").as_str() {
        "allreduce" => CollKind::AllReduce,
        "allgather" => CollKind::AllGather,
        "reducescatter" => CollKind::ReduceScatter,
        "broadcast" => CollKind::Broadcast { root: 0 },
        "reduce" => CollKind::Reduce { root: 0 },
        "alltoall" => CollKind::AllToAll,
        _ => return Err(format!("unknown --op '{s}'")),
    })
}

fn num<T: std::str::FromStr>(v: &str, what: &str) -> Result<T, String> {
    v.parse().map_err(|_| format!("bad {what} '{v}'"))
}

/// A reduction bandwidth in GB/s: positive, `inf`, or `0` for free reductions.
fn parse_reduce_gbps(v: &str, what: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(x) if x >= 0.0 => Ok(x),
        _ => Err(format!(
            "bad {what} '{v}' (GB/s: a positive number, or 0 for free reductions)"
        )),
    }
}

fn apply_file(o: &mut Opts, path: &str) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("--topology {path}: {e}"))?;
    if text.trim_start().starts_with('<') {
        return apply_machine(o, path, &text);
    }
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let w: Vec<&str> = line.split_whitespace().collect();
        let mut apply = || -> Result<(), String> {
            match (w[0], w.len()) {
                ("ranks", 2) => o.ranks = num(w[1], "ranks")?,
                ("ranks_per_host", 2) => o.per_host = num(w[1], "ranks_per_host")?,
                ("intra", 2) => o.model.intra = Link::parse(w[1])?,
                ("inter", 2) => o.model.inter = Link::parse(w[1])?,
                ("nic_gbps", 2) => o.model.nic_gbps = Some(num(w[1], "nic_gbps")?),
                ("link", 4) => o.model.calibrate(
                    Link::parse(w[1])?,
                    num(w[2], "alpha")?,
                    num(w[3], "beta")?,
                )?,
                ("reduce", 2) => o.reduce_gbps = parse_reduce_gbps(w[1], "reduce bandwidth")?,
                ("eager", 2) => o.eager_bytes = parse_size(w[1])?,
                ("nic_burst", 2) => o.nic_burst_bytes = parse_size(w[1])?,
                ("ranks_per_core", 2) => o.ranks_per_core = num(w[1], "ranks_per_core")?,
                ("wake_us", 2) => o.wake_us = num(w[1], "wake_us")?,
                ("cache", 2) => o.cache_bytes = parse_size(w[1])?,
                ("mem_gbps", 2) => o.mem_gbps = num(w[1], "mem_gbps")?,
                ("slow", 3) => o.slow.push((num(w[1], "host")?, num(w[2], "factor")?)),
                ("placement", 2) => o.round_robin = parse_placement(w[1])?,
                _ => return Err(format!("cannot read '{line}'")),
            }
            Ok(())
        };
        apply().map_err(|e| format!("{path}:{}: {e}", i + 1))?;
    }
    Ok(())
}

/// An NCCL topology XML file: one host of that machine. Its GPUs give the ranks per host
/// (one rank per GPU), the channels found over them the intra-host bandwidth and the NICs
/// the GPUs use the inter-host link and the host's NIC bandwidth (see
/// `ferroccl::topo::tune::apply`); what the file does not know keeps its value.
fn apply_machine(o: &mut Opts, path: &str, text: &str) -> Result<(), String> {
    let hw = Hardware::parse(text, &format!("file {path}"))
        .map_err(|e| format!("--topology {}", e.message()))?;
    let s = hw.search();
    if !s.gpus.is_empty() {
        o.per_host = s.gpus.len();
        // GPUs reduce at memory bandwidth (TB/s), far above any link: free, as `--reduce-gbps 0`.
        o.reduce_gbps = 0.0;
    }
    ferroccl::topo::tune::apply(&mut o.model, &hw, &s);
    o.machine = Some(format!(
        "{}: {}, {} channel(s) of {:.1} GB/s",
        path,
        hw.summary(),
        s.channels.len(),
        s.channels.first().map_or(0.0, |c| c.gbps)
    ));
    Ok(())
}

fn parse_args() -> Result<Opts, Stop> {
    let mut o = Opts::default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let flag = args[i].as_str();
        if flag == "-h" || flag == "--help" {
            return Err(Stop::Help);
        }
        if flag == "-V" || flag == "--version" {
            return Err(Stop::Version);
        }
        let v = args
            .get(i + 1)
            .ok_or_else(|| Stop::Bad(format!("{flag} needs a value")))?
            .as_str();
        match flag {
            "--ranks" | "-n" => o.ranks = num(v, "--ranks")?,
            "--ranks-per-host" | "-k" => o.per_host = num(v, "--ranks-per-host")?,
            "--op" => o.op = parse_op(v)?,
            "--algo" => match v {
                "auto" => o.algos = None,
                "all" => o.all = true,
                _ => {
                    o.algos = Some(
                        v.split(',')
                            .map(str::parse)
                            .collect::<Result<Vec<Algorithm>, String>>()?,
                    )
                }
            },
            "-b" | "--minbytes" => o.begin = parse_size(v)?,
            "-e" | "--maxbytes" => o.end = parse_size(v)?,
            "-f" | "--stepfactor" => o.factor = num(v, "-f")?,
            "--intra" => o.model.intra = Link::parse(v)?,
            "--inter" => o.model.inter = Link::parse(v)?,
            "--nic-gbps" => o.model.nic_gbps = Some(num(v, "--nic-gbps")?),
            "--reduce-gbps" => o.reduce_gbps = parse_reduce_gbps(v, "--reduce-gbps")?,
            "--slice" => {
                let n = parse_size(v)?;
                if n == 0 {
                    return Err(Stop::Bad("--slice must be at least 1 byte".to_string()));
                }
                o.model.max_slice = n;
            }
            "--eager" => o.eager_bytes = parse_size(v)?,
            "--nic-burst" => o.nic_burst_bytes = parse_size(v)?,
            "--calls" => o.calls = num(v, "--calls")?,
            "--ranks-per-core" => o.ranks_per_core = num(v, "--ranks-per-core")?,
            "--wake-us" => o.wake_us = num(v, "--wake-us")?,
            "--cache" => o.cache_bytes = parse_size(v)?,
            "--mem-gbps" => o.mem_gbps = num(v, "--mem-gbps")?,
            "--slow" => {
                let (h, f) = v
                    .split_once('=')
                    .ok_or_else(|| Stop::Bad(format!("bad --slow '{v}'")))?;
                o.slow.push((num(h, "host")?, num(f, "factor")?));
            }
            "--placement" => o.round_robin = parse_placement(v)?,
            "--topology" => apply_file(&mut o, v)?,
            "--hosts" => o.hosts = Some(num(v, "--hosts")?),
            _ => return Err(Stop::Bad(format!("unknown option '{flag}'"))),
        }
        i += 2;
    }
    if let Some(h) = o.hosts {
        o.ranks = o.per_host.saturating_mul(h);
    }
    if o.ranks == 0 || o.per_host == 0 || o.factor < 2 || o.calls == 0 {
        return Err(Stop::Bad(
            "--ranks, --ranks-per-host and --calls must be positive and -f at least 2".into(),
        ));
    }
    Ok(o)
}

/// Why [`parse_args`] returned no options.
#[derive(Debug)]
enum Stop {
    /// `-h` / `--help`.
    Help,
    /// `-V` / `--version`.
    Version,
    /// A bad option, with the message.
    Bad(String),
}

impl From<String> for Stop {
    fn from(e: String) -> Self {
        Stop::Bad(e)
    }
}

/// The usage text: every flag with its meaning, units and default.
fn usage() -> String {
    format!(
        "USAGE: ferroccl-sim [options]
Predicts collective times on a modelled cluster by running ferroccl's schedules, and prints
them in the perf tools' table layout. Sizes take K, M or G suffixes (powers of 1024).

\t[-n,--ranks <N>] ranks in the cluster (default: 16)
\t[-k,--ranks-per-host <K>] ranks per host (default: 8)
\t[--op <allreduce/allgather/reducescatter/broadcast/reduce/alltoall>] collective (default: allreduce)
\t[--algo <auto/all/NAME,...>] auto: the tuner's choice; all: every algorithm for the op; or a list of
\t        ring, tree, rd, rhd, hier, binomial, chain, pairwise (default: auto)
\t[-b,--minbytes <bytes>] smallest size (default: 8)
\t[-e,--maxbytes <bytes>] largest size (default: 128M)
\t[-f,--stepfactor <factor>] size multiplier between rows, at least 2 (default: 4)
\t[--intra <shm/tcp/rdma/nvlink>] link between ranks of one host (default: shm)
\t[--inter <shm/tcp/rdma/nvlink>] link between hosts (default: tcp)
\t[--nic-gbps <GB/s>] each host's NIC bandwidth, each way; cross-host messages queue for it
\t        (default: the inter link's bandwidth)
\t[--nic-burst <bytes>] the NIC as a token-bucket shaper holding this many bytes (default: 0, none)
\t[--reduce-gbps <GB/s>] bytes of received data a rank reduces per second; 0 or inf: free
\t        (default: {reduce})
\t[--eager <bytes>] messages up to this size leave without waiting for the receiver; 0: every
\t        message is a rendezvous (default: {eager})
\t[--slice <bytes>] most bytes one message carries, as FERRO_SLICE_BYTES (default: 4M)
\t[--calls <N>] time per call of N back-to-back calls after the first (default: 1)
\t[--ranks-per-core <F>] ranks sharing a core: copies, reductions and shm transfers F times
\t        slower (default: 1)
\t[--wake-us <us>] with --ranks-per-core F > 1, each message costs (1 - 1/F) * W us more (default: 0)
\t[--cache <bytes>] buffers per host from which a call is memory-bound (default: 0, no memory term)
\t[--mem-gbps <GB/s>] with --cache, a memory-bound rank's copy rate (default: 0, no memory term)
\t[--slow <HOST=FACTOR>] host HOST runs FACTOR (>= 1) times slower; repeatable (default: none)
\t[--placement <host-major/round-robin>] host-major: ranks h*K..(h+1)*K on host h; round-robin:
\t        rank r on host r % hosts (default: host-major)
\t[--topology <file>] lines `key value...` (# starts a comment): ranks N, ranks_per_host K,
\t        intra LINK, inter LINK, link LINK ALPHA_US BETA_GBPS, nic_gbps X, nic_burst BYTES,
\t        ranks_per_core F, wake_us W, cache BYTES, mem_gbps X, reduce GBPS, eager BYTES,
\t        slow HOST FACTOR, placement host-major|round-robin; or an NCCL topology XML file
\t        (one host of a machine: a rank per GPU, links from its channels and NICs)
\t[--hosts <N>] N hosts: ranks = N x ranks per host, applied after every other option
\t[-V,--version] print the version and exit
\t[-h,--help] print this text and exit
Options and topology lines apply in order; later ones win.
",
        reduce = format_args!("{DEFAULT_REDUCE_GBPS} GB/s"),
        eager = format_args!("{} K", DEFAULT_EAGER_BYTES >> 10),
    )
}

/// A link's cost as a reader wants it: `1.0 us, 6.0 GB/s`.
fn show_link(c: &LinkCost) -> String {
    // Whole numbers keep one decimal; others print as given (1.25, not 1.2).
    let show = |x: f64| {
        if x.fract() == 0.0 {
            format!("{x:.1}")
        } else {
            format!("{x}")
        }
    };
    format!("{} us, {} GB/s", show(c.alpha_us), show(c.beta_gbps))
}

fn main() -> ExitCode {
    let o = match parse_args() {
        Ok(o) => o,
        Err(Stop::Help) => {
            print!("{}", usage());
            return ExitCode::SUCCESS;
        }
        Err(Stop::Version) => {
            println!("ferroccl-sim {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Err(Stop::Bad(e)) => {
            eprintln!("ferroccl-sim: {e}");
            eprint!("{}", usage());
            return ExitCode::from(2);
        }
    };
    match run(&o) {
        // A reader that stopped early (`ferroccl-sim ... | head`) is not a failure.
        Ok(()) | Err(Failure::Closed) => ExitCode::SUCCESS,
        Err(Failure::Msg(e)) => {
            eprintln!("ferroccl-sim: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Why [`run`] stopped early.
#[derive(Debug)]
enum Failure {
    /// Bad options or a simulation error.
    Msg(String),
    /// Standard output was closed by its reader.
    Closed,
}

impl From<String> for Failure {
    fn from(e: String) -> Self {
        Failure::Msg(e)
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            Failure::Closed
        } else {
            Failure::Msg(format!("writing the table: {e}"))
        }
    }
}

fn run(o: &Opts) -> Result<(), Failure> {
    let mut topo = Topology::uniform(o.ranks, o.per_host);
    let nhosts = topo.nhosts();
    if o.round_robin {
        topo = Topology {
            host_of: (0..o.ranks).map(|r| r % nhosts).collect(),
        };
    }
    let mut slowdown = vec![1.0; nhosts];
    for &(h, f) in &o.slow {
        if h >= nhosts || f.is_nan() || f < 1.0 {
            return Err(format!("--slow {h}={f}: host must be < {nhosts}, factor >= 1").into());
        }
        slowdown[h] = f;
    }
    let cluster = Cluster {
        topo: topo.clone(),
        intra: o.model.link(o.model.intra),
        inter: o.model.link(o.model.inter),
        nic_gbps: o.model.nic_gbps,
        copy_gbps: DEFAULT_COPY_GBPS,
        reduce_gbps: o.reduce_gbps,
        eager_bytes: o.eager_bytes,
        nic_burst_bytes: o.nic_burst_bytes,
        ranks_per_core: o.ranks_per_core,
        wake_us: o.wake_us,
        cache_bytes: o.cache_bytes,
        mem_gbps: o.mem_gbps,
        slowdown,
    };
    let elem = 4;
    let started = Instant::now();
    let mut out = std::io::stdout().lock();
    if let Some(m) = &o.machine {
        writeln!(out, "# machine {m}")?;
    }
    writeln!(
        out,
        "# ferroccl-sim: {} ranks, {} per host ({} hosts), intra {}: {}, inter {}: {}, \
         reduce {}, eager up to {} B, NIC burst {} B, {}{}{}{}",
        o.ranks,
        o.per_host,
        nhosts,
        o.model.intra.name(),
        show_link(&cluster.intra),
        o.model.inter.name(),
        show_link(&cluster.inter),
        if cluster.reduce_gbps > 0.0 && cluster.reduce_gbps.is_finite() {
            format!("{} GB/s", cluster.reduce_gbps)
        } else {
            "free".to_string()
        },
        cluster.eager_bytes,
        cluster.nic_burst_bytes,
        o.op.name(),
        if cluster.ranks_per_core > 1.0 {
            format!(
                ", {} ranks per core (wake-up {} us)",
                cluster.ranks_per_core, cluster.wake_us
            )
        } else {
            String::new()
        },
        if cluster.cache_bytes > 0 && cluster.mem_gbps > 0.0 {
            format!(
                ", memory-bound from {} B of buffers per host at {} GB/s a rank",
                cluster.cache_bytes, cluster.mem_gbps
            )
        } else {
            String::new()
        },
        if o.calls > 1 {
            format!(
                ", time per call of {} back to back after the first",
                o.calls
            )
        } else {
            String::new()
        }
    )?;
    writeln!(
        out,
        "# {:>10} {:>12} {:>6} {:>6} {:>5} {:>9} {:>12} {:>8} {:>8} {:>6}  slice",
        "size", "count", "type", "redop", "root", "algo", "time", "algbw", "busbw", "#wrong",
    )?;
    writeln!(
        out,
        "# {:>10} {:>12} {:>6} {:>6} {:>5} {:>9} {:>12} {:>8} {:>8} {:>6}",
        "(B)", "(elements)", "", "", "", "", "(us)", "(GB/s)", "(GB/s)", ""
    )?;
    let per_rank = matches!(
        o.op,
        CollKind::AllGather | CollKind::ReduceScatter | CollKind::AllToAll
    );
    let mut size = o.begin.max(elem);
    while size <= o.end {
        // nccl-tests sizes: the whole buffer for all_gather / reduce_scatter / all_to_all.
        let count = if per_rank {
            (size / elem / o.ranks).max(1)
        } else {
            size / elem
        };
        let bytes = count * elem;
        // Forced algorithms run with the slice the tuner gives them, as the executor does.
        let with_slice = |a: Algorithm| (a, o.model.best_slice(a, o.op, bytes, &topo).1);
        let algos: Vec<(Algorithm, usize)> = if o.all {
            Algorithm::ALL
                .into_iter()
                .filter(|a| a.supports(o.op))
                .map(with_slice)
                .collect()
        } else if let Some(list) = &o.algos {
            list.iter().copied().map(with_slice).collect()
        } else {
            let c = o.model.choose(o.op, bytes, &topo, &Overrides::default());
            vec![(c.algo, c.slice_bytes)]
        };
        for (algo, slice_bytes) in algos {
            let slice = (slice_bytes / elem).max(1);
            let args = CollArgs {
                kind: o.op,
                count,
                in_place: false,
            };
            let shown = if per_rank { bytes * o.ranks } else { bytes };
            let shown_count = if per_rank { count * o.ranks } else { count };
            let root = o.op.root().map_or(-1, |r| r as i64);
            let redop = if o.op.reduces() { "sum" } else { "none" };
            let opts = AlgoOptions { slice };
            match simulate_calls(&cluster, &args, elem, algo, &opts, None, o.calls) {
                Ok(r) => {
                    let algbw = shown as f64 / r.time_us / 1e3;
                    let busbw = algbw * busbw_factor(o.op, o.ranks);
                    writeln!(
        out,
                        "  {:>10} {:>12} {:>6} {:>6} {:>5} {:>9} {:>12.1} {:>8.3} {:>8.3} {:>6}  {}",
                        shown, shown_count, "float", redop, root, algo.name(), r.time_us, algbw,
                        busbw, "N/A", slice * elem
                    )?;
                }
                Err(e) => writeln!(out, "  {shown:>10} {shown_count:>12} {algo}: {e}")?,
            }
        }
        size = match size.checked_mul(o.factor) {
            Some(s) => s,
            None => break,
        };
    }
    writeln!(
        out,
        "# simulated in {:.1} s",
        started.elapsed().as_secs_f64()
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> Opts {
        Opts {
            end: 8,
            ..Opts::default()
        }
    }

    #[test]
    fn reduce_bandwidth_values() {
        assert_eq!(parse_reduce_gbps("5.12", "x"), Ok(5.12));
        assert_eq!(parse_reduce_gbps("0", "x"), Ok(0.0));
        assert_eq!(parse_reduce_gbps("inf", "x"), Ok(f64::INFINITY));
        for bad in ["-1", "NaN", "fast", ""] {
            let e = parse_reduce_gbps(bad, "--reduce-gbps").unwrap_err();
            assert!(e.contains("--reduce-gbps") && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn topology_file_reduce_line() {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("ferroccl-sim-reduce-{}.txt", std::process::id()));
        let p = path.to_str().unwrap();
        std::fs::write(&path, "ranks 4\n# comment\nreduce 2.5 # GB/s\n").unwrap();
        let mut o = opts();
        apply_file(&mut o, p).unwrap();
        assert_eq!((o.ranks, o.reduce_gbps), (4, 2.5));
        std::fs::write(&path, "ranks 4\nreduce -3\n").unwrap();
        let e = apply_file(&mut opts(), p).unwrap_err();
        assert!(e.contains(&format!("{p}:2:")) && e.contains("-3"), "{e}");
        std::fs::write(&path, "reduce 1 2\n").unwrap();
        let e = apply_file(&mut opts(), p).unwrap_err();
        assert!(
            e.contains(&format!("{p}:1:")) && e.contains("cannot read"),
            "{e}"
        );
        std::fs::remove_file(&path).unwrap();
    }
}
