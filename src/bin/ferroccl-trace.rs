//! ferroccl-trace: joins the per-rank timelines that `FERRO_TRACE_FILE` writes into one file
//! that Perfetto (ui.perfetto.dev) and `chrome://tracing` open, one row per rank.
//!
//!   ferroccl-trace merge trace-0.json trace-1.json ... -o all.json

use std::process::ExitCode;

const USAGE: &str = "\
usage: ferroccl-trace merge FILE... -o OUT

Joins the Chrome trace event files that FERRO_TRACE_FILE=trace-%r.json writes (one per rank)
into OUT, which Perfetto (ui.perfetto.dev) and chrome://tracing open with one row per rank.

  merge FILE...   the ranks' trace files (a file a dead rank left unclosed is read too)
  -o OUT          where to write the merged trace (- for standard output)
  -h, --help      this text
  -V, --version   the version";

fn run(args: &[String]) -> Result<(), String> {
    match args.first().map(String::as_str) {
        Some("-h" | "--help") => {
            println!("{USAGE}");
            return Ok(());
        }
        Some("-V" | "--version") => {
            println!("ferroccl-trace {}", env!("CARGO_PKG_VERSION"));
            return Ok(());
        }
        Some("merge") => {}
        Some(other) => return Err(format!("unknown command {other:?}\n\n{USAGE}")),
        None => return Err(USAGE.to_string()),
    }
    let mut inputs = Vec::new();
    let mut out = None;
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => out = Some(it.next().ok_or("-o needs a file name")?.clone()),
            f => inputs.push(f.to_string()),
        }
    }
    let out = out.ok_or_else(|| format!("merge: -o OUT is missing\n\n{USAGE}"))?;
    if inputs.is_empty() {
        return Err(format!("merge: no input files\n\n{USAGE}"));
    }
    let texts = inputs
        .iter()
        .map(|f| std::fs::read_to_string(f).map_err(|e| format!("reading {f}: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let merged = ferroccl::trace::merge(&texts);
    let events = merged.lines().filter(|l| l.starts_with('{')).count();
    if out == "-" {
        print!("{merged}");
    } else {
        std::fs::write(&out, merged).map_err(|e| format!("writing {out}: {e}"))?;
        eprintln!(
            "ferroccl-trace: {events} events from {} files -> {out}",
            inputs.len()
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferroccl-trace: {e}");
            ExitCode::from(2)
        }
    }
}
