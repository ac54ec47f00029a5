//! Command-line flags of the perf tools, with nccl-tests' names, meanings and defaults.
//!
//! Short flags take their value attached or as the next argument (`-b8`, `-b 8`); long
//! flags take `--name=value` or `--name value`. Sizes accept `K`, `M`, `G` suffixes
//! (powers of 1024, fractions allowed: `1.5K` = 1536); integers accept `0x` hex.
//! Flags that only make sense on GPUs (`-G`, `-R`, `-y`, `-x`, `-D`, `-V`, `-M`, `-g` above 1)
//! are accepted, listed in [`Args::ignored`] and reported as ignored in the output.

use crate::coll::PerfOp;
use ferroccl::DataType;
use std::fmt;
use std::path::PathBuf;

/// How the per-rank iteration times are combined into the one reported (`-a`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Average {
    /// Rank 0's time.
    Rank0 = 0,
    /// The mean over ranks (the default).
    Mean = 1,
    /// The minimum over ranks.
    Min = 2,
    /// The maximum over ranks.
    Max = 3,
}

/// Which roots rooted collectives run with (`-r`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootSel {
    /// One root.
    Rank(usize),
    /// Every rank in turn (`-r all` or `-r -1`).
    All,
}

/// Parsed flags. [`Args::default`] holds nccl-tests' defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Args {
    /// `-t`: ranks (threads) per process.
    pub nthreads: usize,
    /// `-g`: GPUs per thread as given; host ranks use one buffer each, so values above 1 are
    /// ignored (and listed in [`Args::ignored`]).
    pub ngpus: usize,
    /// `-b`: smallest size in bytes (default 32 MiB).
    pub min_bytes: usize,
    /// `-e`: largest size in bytes (default 32 MiB).
    pub max_bytes: usize,
    /// `-i`: increment between sizes when `step_factor <= 1` (default 1 MiB).
    pub step_bytes: usize,
    /// `-f`: multiply the size by this when above 1 (default 1: step by `step_bytes`).
    pub step_factor: usize,
    /// `-n`: timed iterations per size (default 20).
    pub iters: usize,
    /// `-m`: calls per timed iteration (default 1).
    pub agg_iters: usize,
    /// `-w`: warm-up iterations at the largest and the smallest size (default 1, as
    /// nccl-tests since 2.17; older versions used 5).
    pub warmup_iters: usize,
    /// `-N`: how many times to run the whole sweep; 0 runs until killed (default 1).
    pub run_cycles: usize,
    /// `-p`: initialize communicators of one process's threads concurrently.
    pub parallel_init: bool,
    /// `-c`: validation passes per size and placement; 0 disables checking (default 1).
    pub check: usize,
    /// `-o`: ops to run (default `[sum]`; `all` = every op).
    pub ops: Vec<PerfOp>,
    /// `-d`: data types to run (default `[float]`; `all` = every type).
    pub dtypes: Vec<DataType>,
    /// `-r`: root of rooted collectives (default 0).
    pub root: RootSel,
    /// `-z`: 0 = no extra synchronization; 1 = barrier after each call; 2 = wait after each
    /// call (host calls always complete before returning); 3 = barrier after each
    /// iteration of `-m` calls, excluded from the time.
    pub blocking: u32,
    /// `-T`: seconds before a stuck collective is an error (0 = the communicator's
    /// default). The communicator glue applies it.
    pub timeout_s: u64,
    /// `-C`: label the time column `cputime` (host calls: the same clock).
    pub report_cputime: bool,
    /// `-a`: how per-rank times are combined.
    pub average: Average,
    /// `-u`: offset, in bytes, of the buffers from their allocation (tests misaligned
    /// buffers; default 0).
    pub unalign: usize,
    /// `-J`: also write the results as JSON to this file (rank 0).
    pub json_path: Option<PathBuf>,
    /// Flags accepted but without effect on host buffers, as given (`-G 1`).
    pub ignored: Vec<String>,
    /// The arguments as given (recorded in the JSON output).
    pub argv: Vec<String>,
    /// `-B 1` / `--device_buffers 1` (ferroccl's own flag; nccl-tests always uses device
    /// buffers): allocate the send and receive buffers on the device of
    /// `FERRO_DEVICE_PROVIDER` (default `cuda`) and run the device collectives. Off (host
    /// buffers) by default.
    pub device_buffers: bool,
    /// `-B 2`: device buffers as `-B 1`, and the collectives ordered on a stream, as NCCL
    /// programs call them: each call returns once queued, and a timed block of calls ends
    /// when the stream has run them all (nccl-tests' timing). Point-to-point patterns
    /// (send/recv, gather, scatter, hypercube) keep the blocking calls.
    pub stream_ordered: bool,
    /// `-R 1` / `-R 2` (nccl-tests' buffer registration): host buffers in shared memory
    /// ([`ferroccl::SharedBuf`]), which the shared-memory transport lets peers on the host
    /// read without copying them through its rings; with `-B`, the device buffers registered
    /// as windows of the communicator (`Communicator::register_window`: ranks that are
    /// processes of one host then take collectives straight between their buffers). Default 0.
    pub local_register: u32,
    /// Minimum average bus bandwidth in GB/s (nccl-tests' `NCCL_TESTS_MIN_BW`): below 90 %
    /// of it the run fails. Not a flag: see [`min_bw_from_env`].
    pub min_busbw: Option<f64>,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            nthreads: 1,
            ngpus: 1,
            min_bytes: 32 << 20,
            max_bytes: 32 << 20,
            step_bytes: 1 << 20,
            step_factor: 1,
            iters: 20,
            agg_iters: 1,
            warmup_iters: 1,
            run_cycles: 1,
            parallel_init: false,
            check: 1,
            ops: vec![PerfOp::Sum],
            dtypes: vec![DataType::Float32],
            root: RootSel::Rank(0),
            blocking: 0,
            timeout_s: 0,
            report_cputime: false,
            average: Average::Mean,
            unalign: 0,
            json_path: None,
            ignored: Vec::new(),
            argv: Vec::new(),
            device_buffers: false,
            stream_ordered: false,
            local_register: 0,
            min_busbw: None,
        }
    }
}

/// Why parsing stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgsError {
    /// `-h`/`--help`: print the usage and exit 0.
    Help,
    /// A bad flag or value: print the message and the usage, exit 2.
    Invalid(String),
}

impl ArgsError {
    /// The exit code nccl-tests-style tools use: 0 for help, 2 for a bad command line.
    pub fn exit_code(&self) -> i32 {
        match self {
            ArgsError::Help => 0,
            ArgsError::Invalid(_) => 2,
        }
    }

    /// What to print: the error (if any) followed by the usage of `program`.
    pub fn report(&self, program: &str) -> String {
        match self {
            ArgsError::Help => usage(program),
            ArgsError::Invalid(msg) => format!("{program}: {msg}\n{}", usage(program)),
        }
    }
}

impl fmt::Display for ArgsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgsError::Help => f.write_str("help requested"),
            ArgsError::Invalid(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for ArgsError {}

/// One flag: short name, long name, and whether it only matters on GPUs.
struct Flag {
    short: char,
    long: &'static str,
    gpu_only: bool,
}

const FLAGS: &[Flag] = &[
    flag('t', "nthreads"),
    flag('g', "ngpus"),
    flag('b', "minbytes"),
    flag('e', "maxbytes"),
    flag('i', "stepbytes"),
    flag('f', "stepfactor"),
    flag('n', "iters"),
    flag('m', "agg_iters"),
    flag('w', "warmup_iters"),
    flag('N', "run_cycles"),
    flag('p', "parallel_init"),
    flag('c', "check"),
    flag('o', "op"),
    flag('d', "datatype"),
    flag('r', "root"),
    flag('z', "blocking"),
    gpu('y', "stream_null"),
    flag('T', "timeout"),
    gpu('G', "cudagraph"),
    flag('C', "report_cputime"),
    gpu('S', "report_timestamps"),
    flag('J', "output_file"),
    flag('a', "average"),
    flag('R', "local_register"),
    gpu('x', "cta_policy"),
    gpu('D', "device_implementation"),
    gpu('V', "device_cta_count"),
    gpu('M', "memory_report"),
    flag('u', "unalign"),
    flag('B', "device_buffers"),
];

const fn flag(short: char, long: &'static str) -> Flag {
    Flag {
        short,
        long,
        gpu_only: false,
    }
}

const fn gpu(short: char, long: &'static str) -> Flag {
    Flag {
        short,
        long,
        gpu_only: true,
    }
}

/// The usage text, listing every flag as nccl-tests does.
pub fn usage(program: &str) -> String {
    format!(
        "USAGE: {program} \n\t\
[-t,--nthreads <num threads>] \n\t\
[-g,--ngpus <gpus per thread>] (ignored above 1: host buffers) \n\t\
[-b,--minbytes <min size in bytes>] \n\t\
[-e,--maxbytes <max size in bytes>] \n\t\
[-i,--stepbytes <increment size>] \n\t\
[-f,--stepfactor <increment factor>] \n\t\
[-n,--iters <iteration count>] \n\t\
[-m,--agg_iters <aggregated iteration count>] \n\t\
[-w,--warmup_iters <warmup iteration count>] \n\t\
[-N,--run_cycles <cycle count> run & print each cycle (default: 1; 0=infinite)] \n\t\
[-p,--parallel_init <0/1>] \n\t\
[-c,--check <check iteration count>] \n\t\
[-o,--op <sum/prod/min/max/avg/mulsum/all>] \n\t\
[-d,--datatype <nccltype/all>] \n\t\
[-r,--root <root/all>] \n\t\
[-z,--blocking <0/1/2/3>] \n\t\
[-y,--stream_null <0/1>] (ignored: GPU only) \n\t\
[-T,--timeout <time in seconds>] \n\t\
[-G,--cudagraph <num graph launches>] (ignored: GPU only) \n\t\
[-C,--report_cputime <0/1>] \n\t\
[-S,--report_timestamps <0/1>] (ignored) \n\t\
[-J,--output_file <file> write results as JSON to this file] \n\t\
[-a,--average <0/1/2/3> report average iteration time <0=RANK0/1=AVG/2=MIN/3=MAX>] \n\t\
[-R,--local_register <0/1/2> 1 or 2: host buffers in shared memory, read by peers without a copy; with -B, device buffers registered as windows] \n\t\
[-x,--cta_policy <0/1/2>] (ignored: GPU only) \n\t\
[-D,--device_implementation <n>] (ignored: GPU only) \n\t\
[-V,--device_cta_count <n>] (ignored: GPU only) \n\t\
[-M,--memory_report <0/1>] (ignored: GPU only) \n\t\
[-u,--unalign <bytes> offset buffers from their allocation] \n\t\
[-B,--device_buffers <0/1/2> buffers on the device of FERRO_DEVICE_PROVIDER, 2: calls ordered on a stream (default: 0, host)] \n\t\
[-h,--help]\n"
    )
}

/// Parses a size: a number (fractions allowed) with an optional `K`/`M`/`G` suffix, powers
/// of 1024, optionally followed by `B` or `iB` (`8`, `1.5K`, `128M`, `1GiB`).
pub fn parse_size(s: &str) -> Option<usize> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let value: f64 = num.parse().ok()?;
    let suffix = suffix.trim_start();
    let (unit, rest) = match suffix.chars().next() {
        None => (1.0, ""),
        Some(c) => {
            let unit = match c.to_ascii_uppercase() {
                'K' => 1024.0,
                'M' => 1024.0 * 1024.0,
                'G' => 1024.0 * 1024.0 * 1024.0,
                'B' if suffix.len() == 1 => 1.0,
                _ => return None,
            };
            (unit, &suffix[1..])
        }
    };
    if !matches!(rest, "" | "B" | "b" | "iB" | "ib") {
        return None;
    }
    let bytes = value * unit;
    (bytes.is_finite() && bytes >= 0.0 && bytes < usize::MAX as f64).then_some(bytes as usize)
}

/// Parses an integer as `strtol(s, NULL, 0)` would for well-formed input: decimal or `0x`
/// hex, optional sign.
fn parse_i64(s: &str) -> Option<i64> {
    let t = s.trim();
    let (neg, t) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let v = if let Some(hex) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        i64::from_str_radix(hex, 16).ok()?
    } else {
        t.parse::<i64>().ok()?
    };
    Some(if neg { -v } else { v })
}

/// The average bus bandwidth threshold from `NCCL_TESTS_MIN_BW` (GB/s), if set and valid.
pub fn min_bw_from_env() -> Option<f64> {
    std::env::var("NCCL_TESTS_MIN_BW")
        .ok()
        .and_then(|v| v.trim().parse().ok())
}

impl Args {
    /// Parses the arguments after the program name.
    pub fn parse<I, S>(argv: I) -> Result<Args, ArgsError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let argv: Vec<String> = argv.into_iter().map(|s| s.as_ref().to_string()).collect();
        let mut args = Args {
            argv: argv.clone(),
            ..Args::default()
        };
        let mut i = 0;
        while i < argv.len() {
            let arg = &argv[i];
            i += 1;
            if arg == "-h" || arg == "--help" {
                return Err(ArgsError::Help);
            }
            let (flag, inline) = if let Some(long) = arg.strip_prefix("--") {
                if long.is_empty() {
                    if let Some(extra) = argv.get(i) {
                        return Err(invalid(format!("unexpected argument '{extra}'")));
                    }
                    break;
                }
                let (name, value) = match long.split_once('=') {
                    Some((n, v)) => (n, Some(v.to_string())),
                    None => (long, None),
                };
                let flag = FLAGS
                    .iter()
                    .find(|f| f.long == name)
                    .ok_or_else(|| invalid(format!("invalid option '--{name}'")))?;
                (flag, value)
            } else if let Some(short) = arg.strip_prefix('-').filter(|s| !s.is_empty()) {
                let mut chars = short.chars();
                let c = chars.next().unwrap_or('-');
                let flag = FLAGS
                    .iter()
                    .find(|f| f.short == c)
                    .ok_or_else(|| invalid(format!("invalid option '-{c}'")))?;
                let rest: String = chars.collect();
                (flag, (!rest.is_empty()).then_some(rest))
            } else {
                return Err(invalid(format!("unexpected argument '{arg}'")));
            };
            let value = match inline {
                Some(v) => v,
                None => {
                    let v = argv.get(i).ok_or_else(|| {
                        invalid(format!(
                            "option '-{}' (--{}) requires a value",
                            flag.short, flag.long
                        ))
                    })?;
                    i += 1;
                    v.clone()
                }
            };
            args.apply(flag, &value)?;
        }
        args.validate()?;
        Ok(args)
    }

    fn apply(&mut self, flag: &Flag, value: &str) -> Result<(), ArgsError> {
        let name = flag.long;
        let size = || {
            parse_size(value)
                .ok_or_else(|| invalid(format!("invalid size specified for '{name}': '{value}'")))
        };
        let int = |min: i64, max: i64| -> Result<i64, ArgsError> {
            match parse_i64(value) {
                Some(v) if (min..=max).contains(&v) => Ok(v),
                _ => Err(invalid(format!(
                    "invalid value for '{name}': '{value}' (expected an integer in {min}..={max})"
                ))),
            }
        };
        let count = |min: i64| -> Result<usize, ArgsError> { Ok(int(min, i64::MAX)? as usize) };
        if flag.gpu_only {
            int(i64::MIN, i64::MAX)?;
            self.ignored.push(format!("-{} {value}", flag.short));
            return Ok(());
        }
        match flag.short {
            't' => self.nthreads = count(1)?,
            'g' => {
                self.ngpus = count(1)?;
                if self.ngpus > 1 {
                    self.ignored.push(format!("-g {value}"));
                }
            }
            'b' => self.min_bytes = size()?,
            'e' => self.max_bytes = size()?,
            'i' => self.step_bytes = size()?,
            'f' => self.step_factor = count(0)?,
            'n' => self.iters = count(1)?,
            'm' => self.agg_iters = count(1)?,
            'w' => self.warmup_iters = count(0)?,
            'N' => self.run_cycles = count(0)?,
            'p' => self.parallel_init = int(0, 1)? == 1,
            'c' => self.check = count(0)?,
            'o' => {
                self.ops = if value.eq_ignore_ascii_case("all") {
                    PerfOp::ALL.to_vec()
                } else {
                    vec![PerfOp::parse(value).ok_or_else(|| {
                        invalid(format!(
                            "invalid op '{value}' (expected sum, prod, min, max, avg, mulsum or all)"
                        ))
                    })?]
                }
            }
            'd' => {
                self.dtypes = if value.eq_ignore_ascii_case("all") {
                    DataType::ALL.to_vec()
                } else {
                    vec![DataType::parse(value).ok_or_else(|| {
                        invalid(format!(
                            "invalid datatype '{value}' (expected int8, uint8, int32, uint32, \
                             int64, uint64, half, float, double, bfloat16, f8e4m3, f8e5m2 or all)"
                        ))
                    })?]
                }
            }
            'r' => {
                self.root = if value.eq_ignore_ascii_case("all") || value.trim() == "-1" {
                    RootSel::All
                } else {
                    RootSel::Rank(count(0)?)
                }
            }
            'z' => self.blocking = int(0, 3)? as u32,
            'T' => self.timeout_s = count(0)? as u64,
            'C' => self.report_cputime = int(0, 1)? == 1,
            'a' => {
                self.average = match int(0, 3)? {
                    0 => Average::Rank0,
                    1 => Average::Mean,
                    2 => Average::Min,
                    _ => Average::Max,
                }
            }
            'u' => self.unalign = size()?,
            'B' => {
                let b = int(0, 2)?;
                self.device_buffers = b >= 1;
                self.stream_ordered = b == 2;
            }
            'R' => self.local_register = int(0, 2)? as u32,
            'J' => {
                if value.is_empty() {
                    return Err(invalid("empty file name for 'output_file'".into()));
                }
                self.json_path = Some(PathBuf::from(value));
            }
            other => return Err(invalid(format!("invalid option '-{other}'"))),
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), ArgsError> {
        if self.min_bytes > self.max_bytes {
            return Err(invalid(format!(
                "invalid sizes for 'minbytes' and 'maxbytes': {} > {}",
                self.min_bytes, self.max_bytes
            )));
        }
        if self.step_factor <= 1 && self.step_bytes == 0 && self.min_bytes < self.max_bytes {
            return Err(invalid(
                "'stepbytes' is 0 and 'stepfactor' is at most 1: the sizes would never grow".into(),
            ));
        }
        if self.step_factor > 1 && self.min_bytes == 0 && self.max_bytes > 0 {
            return Err(invalid(
                "'minbytes' is 0 with a 'stepfactor': the sizes would never grow".into(),
            ));
        }
        Ok(())
    }

    /// The step as the parameter line prints it: `(value, "factor" | "bytes")`.
    pub fn step_display(&self) -> (usize, &'static str) {
        if self.step_factor > 1 {
            (self.step_factor, "factor")
        } else {
            (self.step_bytes, "bytes")
        }
    }
}

fn invalid(msg: String) -> ArgsError {
    ArgsError::Invalid(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Args, ArgsError> {
        Args::parse(s.split_whitespace())
    }

    #[test]
    fn defaults_match_nccl_tests() {
        let a = parse("").unwrap();
        assert_eq!(a.min_bytes, 33_554_432);
        assert_eq!(a.max_bytes, 33_554_432);
        assert_eq!(a.step_bytes, 1_048_576);
        assert_eq!(a.step_factor, 1);
        assert_eq!(a.iters, 20);
        assert_eq!(a.warmup_iters, 1);
        assert_eq!(a.agg_iters, 1);
        assert_eq!(a.check, 1);
        assert_eq!(a.ops, vec![PerfOp::Sum]);
        assert_eq!(a.dtypes, vec![DataType::Float32]);
        assert_eq!(a.root, RootSel::Rank(0));
        assert_eq!(a.average, Average::Mean);
        assert_eq!(a.step_display(), (1_048_576, "bytes"));
        assert!(a.ignored.is_empty());
    }

    #[test]
    fn the_usual_command_line() {
        let a = parse("-b 8 -e 128M -f 2 -g 1").unwrap();
        assert_eq!(a.min_bytes, 8);
        assert_eq!(a.max_bytes, 128 << 20);
        assert_eq!(a.step_factor, 2);
        assert_eq!(a.step_display(), (2, "factor"));
        assert_eq!(a.ngpus, 1);
        assert!(a.ignored.is_empty());
        assert_eq!(a.argv, ["-b", "8", "-e", "128M", "-f", "2", "-g", "1"]);
    }

    #[test]
    fn device_buffers_flag() {
        assert!(!parse("").unwrap().device_buffers);
        assert!(parse("-B 1").unwrap().device_buffers);
        assert!(parse("--device_buffers=1").unwrap().device_buffers);
        assert!(!parse("-B 0").unwrap().device_buffers);
        let b2 = parse("-B 2").unwrap();
        assert!(b2.device_buffers && b2.stream_ordered);
        assert!(!parse("-B 1").unwrap().stream_ordered);
        assert!(parse("-B 3").is_err());
        let a = parse("-G 1").unwrap();
        assert!(!a.device_buffers, "-G is nccl-tests' --cudagraph, ignored");
        assert_eq!(a.ignored, ["-G 1"]);
    }

    #[test]
    fn sizes_and_forms() {
        assert_eq!(parse_size("8"), Some(8));
        assert_eq!(parse_size("1K"), Some(1024));
        assert_eq!(parse_size("1k"), Some(1024));
        assert_eq!(parse_size("1.5K"), Some(1536));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("1G"), Some(1 << 30));
        assert_eq!(parse_size("1GiB"), Some(1 << 30));
        assert_eq!(parse_size("64KB"), Some(65536));
        assert_eq!(parse_size("10B"), Some(10));
        assert_eq!(parse_size("1T"), None);
        assert_eq!(parse_size("abc"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("1Kx"), None);
        let a = parse("-b8 --maxbytes=1K --stepbytes 16 -n5 -w 0 -c 0 -a 3 -z 1").unwrap();
        assert_eq!((a.min_bytes, a.max_bytes, a.step_bytes), (8, 1024, 16));
        assert_eq!((a.iters, a.warmup_iters, a.check), (5, 0, 0));
        assert_eq!(a.average, Average::Max);
        assert_eq!(a.blocking, 1);
        let a = parse("-o all -d all -r all -N 0 -m 4 -t 2 -T 30 -C 1 -u 4 -J out.json").unwrap();
        assert_eq!(a.ops, PerfOp::ALL.to_vec());
        assert_eq!(a.dtypes, DataType::ALL.to_vec());
        assert_eq!(a.root, RootSel::All);
        assert_eq!(
            (a.run_cycles, a.agg_iters, a.nthreads, a.timeout_s),
            (0, 4, 2, 30)
        );
        assert!(a.report_cputime);
        assert_eq!(a.unalign, 4);
        assert_eq!(a.json_path, Some(PathBuf::from("out.json")));
        let a = parse("-o mulsum -d bfloat16 -r 3 -n 0x10").unwrap();
        assert_eq!(a.ops, vec![PerfOp::PreMulSum]);
        assert_eq!(a.dtypes, vec![DataType::Bfloat16]);
        assert_eq!(a.root, RootSel::Rank(3));
        assert_eq!(a.iters, 16);
        assert_eq!(parse("-r -1").unwrap().root, RootSel::All);
        assert_eq!(parse("-d half").unwrap().dtypes, vec![DataType::Float16]);
        assert_eq!(
            parse("-d f8e4m3").unwrap().dtypes,
            vec![DataType::Float8E4M3]
        );
    }

    #[test]
    fn gpu_only_flags_are_recorded() {
        let a = parse("-G 1 -R 2 -g 4 -y 1 --cta_policy=1").unwrap();
        assert_eq!(a.ignored, ["-G 1", "-g 4", "-y 1", "-x 1"]);
        assert_eq!(a.local_register, 2);
        assert_eq!(parse("").unwrap().local_register, 0);
        assert_eq!(parse("--local_register=1").unwrap().local_register, 1);
        assert!(parse("-R 3").is_err());
        assert_eq!(a.ngpus, 4);
    }

    #[test]
    fn errors() {
        let cases = [
            ("-q 1", "invalid option '-q'"),
            ("--bogus 1", "invalid option '--bogus'"),
            ("-b", "requires a value"),
            ("-b 1X", "invalid size specified for 'minbytes'"),
            (
                "-b 2K -e 1K",
                "invalid sizes for 'minbytes' and 'maxbytes': 2048 > 1024",
            ),
            ("-n 0", "invalid value for 'iters'"),
            ("-n abc", "invalid value for 'iters'"),
            ("-a 4", "invalid value for 'average'"),
            ("-o xor", "invalid op 'xor'"),
            ("-d float128", "invalid datatype 'float128'"),
            ("-b 0 -e 8 -f 2", "never grow"),
            ("-b 0 -e 8 -i 0", "never grow"),
            ("stray", "unexpected argument 'stray'"),
            ("-G x", "invalid value for 'cudagraph'"),
        ];
        for (line, want) in cases {
            match parse(line) {
                Err(e @ ArgsError::Invalid(_)) => {
                    assert!(e.to_string().contains(want), "{line}: {e}");
                    assert_eq!(e.exit_code(), 2);
                    let report = e.report("all_reduce_perf");
                    assert!(report.starts_with("all_reduce_perf: "), "{report}");
                    assert!(report.contains("USAGE: all_reduce_perf"), "{report}");
                }
                other => panic!("{line}: {other:?}"),
            }
        }
        assert_eq!(parse("-h").unwrap_err(), ArgsError::Help);
        assert_eq!(parse("-b 8 --help").unwrap_err().exit_code(), 0);
        // A single size with step 0 is fine: the sweep has one size.
        assert!(parse("-b 8 -e 8 -i 0").is_ok());
    }
}
