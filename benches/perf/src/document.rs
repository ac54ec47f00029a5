//! The `-J` JSON document, in nccl-tests' layout (version 3), and the file it goes to.

use crate::args::Args;
use crate::coll::Coll;
use crate::json::{self, Json};
use crate::report::{self, Measure};
use crate::run::Summary;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

/// Opens the JSON file like nccl-tests: never overwrites, tries `path`, `path.0`, `path.1`...
pub(crate) fn open_json(path: &Path) -> std::io::Result<(File, PathBuf)> {
    let mut candidate = path.to_path_buf();
    for i in 0..1000 {
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&candidate)
        {
            Ok(f) => return Ok((f, candidate)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                candidate = PathBuf::from(format!("{}.{i}", path.display()));
            }
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        "no free file name",
    ))
}

fn measure_json(m: &Measure, cputime: bool) -> Json {
    Json::object([
        (
            if cputime { "cpu_time" } else { "time" },
            Json::Num(m.time_us),
        ),
        ("alg_bw", Json::Num(m.algbw)),
        ("bus_bw", Json::Num(m.busbw)),
        (
            "nwrong",
            m.wrong.map_or(Json::Null, |w| Json::Num(w as f64)),
        ),
    ])
}

/// The `-J` document (nccl-tests' layout, version 3).
pub fn json_document(
    coll: Coll,
    args: &Args,
    devices: &[String],
    summary: &Summary,
    start_time: &str,
) -> Json {
    let (step, kind) = args.step_display();
    let config = Json::object([
        ("nthreads", Json::Int(args.nthreads as i64)),
        ("ngpus", Json::Int(1)),
        ("minimum_bytes", Json::Int(args.min_bytes as i64)),
        ("maximum_bytes", Json::Int(args.max_bytes as i64)),
        (
            if kind == "factor" {
                "step_factor"
            } else {
                "step_bytes"
            },
            Json::Int(step as i64),
        ),
        ("warmup_iters", Json::Int(args.warmup_iters as i64)),
        ("iterations", Json::Int(args.iters as i64)),
        ("aggregated_iterations", Json::Int(args.agg_iters as i64)),
        ("validation", Json::Int(args.check as i64)),
        ("graph", Json::Int(0)),
        ("blocking_collectives", Json::Bool(args.blocking != 0)),
        ("parallel_init", Json::Bool(args.parallel_init)),
        (
            "devices",
            Json::List(
                devices
                    .iter()
                    .map(|d| Json::str(d.trim_start_matches("#  ")))
                    .collect(),
            ),
        ),
    ]);
    let results = summary
        .rows
        .iter()
        .map(|r| {
            Json::object([
                ("size", Json::Int(r.bytes as i64)),
                ("count", Json::Int(r.count as i64)),
                ("type", Json::str(r.type_name)),
                ("redop", Json::str(r.redop)),
                ("root", Json::str(format!("{:6}", r.root))),
                (
                    "out_of_place",
                    measure_json(&r.out_of_place, args.report_cputime),
                ),
                ("in_place", measure_json(&r.in_place, args.report_cputime)),
                ("actual_iterations", Json::Int(args.iters as i64)),
                ("experiment_name", Json::str(coll.program_name())),
            ])
        })
        .collect();
    Json::object([
        ("version", Json::Int(3)),
        ("start_time", Json::str(start_time)),
        (
            "tool",
            Json::str(format!("ferroccl-perf {}", report::VERSION)),
        ),
        (
            "args",
            Json::List(args.argv.iter().map(Json::str).collect()),
        ),
        ("config", config),
        ("results", Json::List(results)),
        (
            "out_of_bounds",
            Json::object([
                ("count", Json::Int(summary.errors as i64)),
                ("okay", Json::Bool(summary.errors == 0)),
            ]),
        ),
        (
            "average_bus_bandwidth",
            Json::object([
                ("bandwidth", Json::Num(summary.avg_busbw)),
                (
                    "okay",
                    summary.bw_ok.map_or(Json::str("unchecked"), Json::Bool),
                ),
            ]),
        ),
        ("end_time", Json::str(json::now_utc())),
    ])
}
