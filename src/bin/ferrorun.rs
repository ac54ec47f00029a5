//! `ferrorun`: start N ranks of a program on this machine, optionally in network namespaces
//! that stand in for hosts. Run `ferrorun --help` for the options.
//!
//! ```text
//! ferrorun -n 4 -- ./my_training_step --steps 10
//! ferrorun -n 4 --netns ferro0,ferro1 --timeout 60 -- ./allreduce_perf
//! ```

#[path = "../launch/mod.rs"]
mod launch;

use std::process::ExitCode;

use launch::args::{parse_args, Command, USAGE};
use launch::supervise::{prepare, resolve_program, run};

/// Exit status for a bad command line.
const EXIT_USAGE: u8 = 2;
/// Exit status when the program to launch does not exist (as in shells).
const EXIT_NOT_FOUND: u8 = 127;

fn main() -> ExitCode {
    let config = match parse_args(std::env::args_os().skip(1)) {
        Ok(Command::Help) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(Command::Launch(config)) => config,
        Err(e) => {
            let first_line = USAGE.lines().next().unwrap_or_default();
            eprintln!(
                "ferrorun: {}\n{first_line}\n(`ferrorun --help` for details)",
                e.message()
            );
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if let Err(e) = resolve_program(&config.program) {
        eprintln!("ferrorun: {}", e.message());
        return ExitCode::from(EXIT_NOT_FOUND);
    }
    let job = match prepare(config) {
        Ok(job) => job,
        Err(e) => {
            eprintln!("ferrorun: {}", e.message());
            return ExitCode::FAILURE;
        }
    };
    match run(&job) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("ferrorun: {}", e.message());
            ExitCode::FAILURE
        }
    }
}
