//! The `ferrorun` command line.

use std::ffi::{OsStr, OsString};
use std::time::Duration;

use ferroccl_transport::{Error, Result};

/// Most ranks one launch may start.
pub const MAX_NRANKS: usize = 4096;

/// The text `ferrorun --help` prints.
pub const USAGE: &str = "\
usage: ferrorun -n N [--netns NS0,...] [--bind core|none] [--timeout SECS] [--no-prefix] -- PROGRAM [ARGS...]

Starts N ranks of PROGRAM on this machine and waits for them.

options:
  -n, --nranks N     number of ranks to start (1..4096)
  --netns LIST       comma-separated network namespaces; rank i runs in LIST[i % len]
                     (each namespace is one host; see scripts/netns.sh)
  --bind core|none   core: pin rank i (all its threads) to the (i mod C)-th of the C CPUs
                     ferrorun may run on, as `mpirun --bind-to core` does; none (default):
                     the kernel places the ranks
  --timeout SECS     stop every rank and exit 124 after SECS seconds
  --no-prefix        print the ranks' output lines without the `[RANK] ` prefix
  -h, --help         print this help

environment of each rank:
  FERRO_RANK, FERRO_NRANKS             rank and number of ranks in the job
  FERRO_LOCAL_RANK, FERRO_LOCAL_NRANKS rank within its host, ranks on that host
  FERRO_STORE_ADDR                     ip:port where rank 0 hosts the rendezvous store
  FERRO_JOB_ID                         unique per launch
  FERRO_HOST                           namespace name (only with --netns)

exit status: 0 when every rank exits 0; otherwise the first failing rank's status (128+signal
when it was killed), 124 on --timeout, 128+signal when ferrorun itself is interrupted,
2 for a bad command line, 127 when PROGRAM is not found.
";

/// What one launch runs.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchConfig {
    /// Number of ranks to start (at least 1).
    pub nranks: usize,
    /// Network namespaces standing in for hosts; empty runs every rank here.
    pub netns: Vec<String>,
    /// Stop everything after this long.
    pub timeout: Option<Duration>,
    /// Prefix every output line with `[RANK] `.
    pub prefix: bool,
    /// Pin each rank to one CPU (`--bind core`).
    pub bind: bool,
    /// The program every rank runs.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Print [`USAGE`] and exit 0.
    Help,
    /// Start the job.
    Launch(LaunchConfig),
}

fn bad(message: String) -> Error {
    Error::invalid_argument(message)
}

/// Parses the arguments after the program name.
///
/// Errors (kind `InvalidArgument`) name the offending flag or value.
pub fn parse_args<I>(args: I) -> Result<Command>
where
    I: IntoIterator<Item = OsString>,
{
    let mut args = args.into_iter();
    let mut nranks: Option<usize> = None;
    let mut netns: Vec<String> = Vec::new();
    let mut timeout: Option<Duration> = None;
    let mut prefix = true;
    let mut bind = false;
    let mut program: Option<OsString> = None;

    while let Some(arg) = args.next() {
        if arg == "--" {
            program = args.next();
            break;
        }
        let Some(text) = arg.to_str() else {
            // Not a flag we know (flags are ASCII): the program itself.
            program = Some(arg);
            break;
        };
        if !text.starts_with('-') || text == "-" {
            program = Some(arg);
            break;
        }
        let (flag, inline) = match text.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(value.to_string())),
            _ => (text, None),
        };
        let mut value = |name: &str| -> Result<String> {
            if let Some(value) = inline.clone() {
                return Ok(value);
            }
            match args.next() {
                Some(v) => v
                    .into_string()
                    .map_err(|v| bad(format!("{name}: value {v:?} is not valid UTF-8"))),
                None => Err(bad(format!("{name} needs a value"))),
            }
        };
        match flag {
            "-h" | "--help" => return Ok(Command::Help),
            "-n" | "--nranks" | "-np" => nranks = Some(parse_nranks(flag, &value(flag)?)?),
            "--netns" => netns = parse_netns(&value(flag)?)?,
            "--timeout" => timeout = Some(parse_timeout(&value(flag)?)?),
            "--bind" => bind = parse_bind(&value(flag)?)?,
            "--no-prefix" if inline.is_none() => prefix = false,
            _ => {
                // `-n4` style.
                if let Some(count) = flag.strip_prefix("-n").filter(|s| !s.starts_with('-')) {
                    if !count.is_empty() && count.bytes().all(|b| b.is_ascii_digit()) {
                        nranks = Some(parse_nranks("-n", count)?);
                        continue;
                    }
                }
                return Err(bad(format!("unknown option '{text}'")));
            }
        }
    }

    let nranks = nranks.ok_or_else(|| bad("missing -n N (number of ranks)".to_string()))?;
    let program = program
        .filter(|p| !p.is_empty())
        .ok_or_else(|| bad("missing program to run (after `--`)".to_string()))?;
    Ok(Command::Launch(LaunchConfig {
        nranks,
        netns,
        timeout,
        prefix,
        bind,
        program,
        args: args.collect(),
    }))
}

fn parse_nranks(flag: &str, value: &str) -> Result<usize> {
    let n: usize = value
        .parse()
        .map_err(|_| bad(format!("{flag}: '{value}' is not a rank count")))?;
    if n == 0 || n > MAX_NRANKS {
        return Err(bad(format!(
            "{flag}: rank count {n} out of range (must be 1..{MAX_NRANKS})"
        )));
    }
    Ok(n)
}

fn parse_netns(value: &str) -> Result<Vec<String>> {
    let names: Vec<String> = value.split(',').map(str::to_string).collect();
    for (i, name) in names.iter().enumerate() {
        let valid = !name.is_empty()
            && name != "."
            && name != ".."
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !valid {
            return Err(bad(format!(
                "--netns: bad namespace name '{name}' at position {i} in '{value}' \
                 (use letters, digits, '-', '_', '.')"
            )));
        }
        if names[..i].contains(name) {
            return Err(bad(format!(
                "--netns: namespace '{name}' listed twice in '{value}'"
            )));
        }
    }
    Ok(names)
}

fn parse_bind(value: &str) -> Result<bool> {
    match value {
        "core" => Ok(true),
        "none" => Ok(false),
        _ => Err(bad(format!("--bind: '{value}' is not core or none"))),
    }
}

fn parse_timeout(value: &str) -> Result<Duration> {
    let secs: f64 = value
        .parse()
        .map_err(|_| bad(format!("--timeout: '{value}' is not a number of seconds")))?;
    if !secs.is_finite() || secs <= 0.0 || secs > 1e9 {
        return Err(bad(format!(
            "--timeout: {value} seconds out of range (must be > 0)"
        )));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Whether `program` names a file path rather than a command to look up in `PATH`.
pub fn is_path(program: &OsStr) -> bool {
    program.as_encoded_bytes().contains(&b'/')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Command> {
        parse_args(args.iter().map(OsString::from))
    }

    fn launch(args: &[&str]) -> LaunchConfig {
        match parse(args) {
            Ok(Command::Launch(config)) => config,
            other => panic!("{args:?} parsed as {other:?}"),
        }
    }

    #[test]
    fn full_command_line() {
        let c = launch(&[
            "-n",
            "5",
            "--netns",
            "h0,h1",
            "--timeout",
            "2.5",
            "--no-prefix",
            "--bind",
            "core",
            "--",
            "prog",
            "-n",
            "7",
        ]);
        assert_eq!(c.nranks, 5);
        assert_eq!(c.netns, vec!["h0".to_string(), "h1".to_string()]);
        assert_eq!(c.timeout, Some(Duration::from_millis(2500)));
        assert!(!c.prefix);
        assert!(c.bind);
        assert_eq!(c.program, OsString::from("prog"));
        assert_eq!(c.args, vec![OsString::from("-n"), OsString::from("7")]);
    }

    #[test]
    fn inline_values_and_no_separator() {
        let c = launch(&["--nranks=3", "--netns=a", "-n7", "sh", "-c", "x"]);
        assert!(!c.bind);
        assert!(!launch(&["--bind=core", "--bind=none", "-n1", "x"]).bind);
        assert_eq!(c.nranks, 7);
        assert_eq!(c.netns, vec!["a".to_string()]);
        assert!(c.prefix);
        assert_eq!(c.timeout, None);
        assert_eq!(c.program, OsString::from("sh"));
        assert_eq!(c.args.len(), 2);
    }

    #[test]
    fn help() {
        assert_eq!(parse(&["--help"]), Ok(Command::Help));
        assert_eq!(parse(&["-n", "2", "-h", "--", "x"]), Ok(Command::Help));
    }

    #[test]
    fn errors_name_the_problem() {
        let cases: &[(&[&str], &str)] = &[
            (&["-n", "0", "--", "x"], "rank count 0 out of range"),
            (&["-n", "4097", "--", "x"], "rank count 4097"),
            (&["-n", "two", "--", "x"], "'two' is not a rank count"),
            (&["-n"], "-n needs a value"),
            (
                &["--bogus", "-n", "2", "--", "x"],
                "unknown option '--bogus'",
            ),
            (
                &["--no-prefix=1", "-n", "2", "x"],
                "unknown option '--no-prefix=1'",
            ),
            (&["-n", "2"], "missing program"),
            (&["-n", "2", "--"], "missing program"),
            (&["--", "x"], "missing -n N"),
            (
                &["-n", "2", "--netns", "a,,b", "x"],
                "bad namespace name '' at position 1",
            ),
            (
                &["-n", "2", "--netns", "a/b", "x"],
                "bad namespace name 'a/b'",
            ),
            (&["-n", "2", "--netns", "a,b,a", "x"], "'a' listed twice"),
            (
                &["-n", "2", "--timeout", "0", "x"],
                "--timeout: 0 seconds out of range",
            ),
            (
                &["-n", "2", "--timeout", "-3", "x"],
                "--timeout: -3 seconds",
            ),
            (
                &["-n", "2", "--timeout", "soon", "x"],
                "'soon' is not a number",
            ),
            (
                &["-n", "2", "--bind", "socket", "x"],
                "--bind: 'socket' is not core or none",
            ),
            (&["-n", "2", "--bind"], "--bind needs a value"),
        ];
        for (args, want) in cases {
            match parse(args) {
                Err(e) => assert!(
                    e.to_string().contains(want),
                    "{args:?}: error '{e}' does not contain '{want}'"
                ),
                Ok(c) => panic!("{args:?} parsed as {c:?}, wanted an error containing '{want}'"),
            }
        }
    }

    #[test]
    fn path_detection() {
        assert!(is_path(OsStr::new("./a.out")));
        assert!(is_path(OsStr::new("/bin/sh")));
        assert!(!is_path(OsStr::new("sh")));
    }
}
