//! The driver end to end, with ranks as threads ([`local_group`]).

use ferroccl::{DataType, Result};
use ferroccl_perf::local::{local_group, LocalComm};
use ferroccl_perf::run::gather_lines;
use ferroccl_perf::{run_perf, Args, Coll, Layout, PerfComm, PerfOp, Summary};

/// Runs `coll` on `n` thread ranks, each wrapped by `wrap`; returns every rank's summary
/// and rank 0's output.
fn run_group_with<C, F>(
    n: usize,
    coll: Coll,
    args: &Args,
    wrap: F,
) -> (Vec<Result<Summary>>, String)
where
    C: PerfComm + Send,
    F: Fn(LocalComm) -> C + Sync,
{
    std::thread::scope(|s| {
        let handles: Vec<_> = local_group(n)
            .into_iter()
            .map(|comm| {
                let wrap = &wrap;
                s.spawn(move || {
                    let comm = wrap(comm);
                    let mut out = Vec::new();
                    let r = run_perf(&comm, coll, args, &mut out);
                    (r, String::from_utf8(out).unwrap())
                })
            })
            .collect();
        let mut results = Vec::new();
        let mut text = String::new();
        for (i, h) in handles.into_iter().enumerate() {
            let (r, out) = h.join().unwrap();
            if i == 0 {
                text = out;
            } else {
                assert!(out.is_empty(), "rank {i} printed: {out}");
            }
            results.push(r);
        }
        (results, text)
    })
}

fn run_group(n: usize, coll: Coll, args: &Args) -> (Vec<Summary>, String) {
    let (results, text) = run_group_with(n, coll, args, |c| c);
    let summaries = results
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| panic!("{coll} n={n}: {e}\n{text}")))
        .collect();
    (summaries, text)
}

fn args(s: &str) -> Args {
    Args::parse(s.split_whitespace()).unwrap()
}

#[test]
fn every_collective_validates_on_1_to_4_ranks() {
    let a = args("-b 4 -e 1K -f 4 -n 2 -w 1 -d all");
    for coll in Coll::ALL {
        for n in 1..=4 {
            let (summaries, text) = run_group(n, coll, &a);
            if !coll.supports_nranks(n) {
                assert!(text.contains(&format!("nRanks {n} is not a power of 2, skipping")));
                assert!(summaries[0].rows.is_empty());
                continue;
            }
            let s = &summaries[0];
            assert!(s.success(), "{coll} n={n}\n{text}");
            assert_eq!(s.wrong_elements, 0);
            // 5 sizes (4, 16, 64, 256, 1024) per data type.
            assert_eq!(s.rows.len(), 5 * DataType::ALL.len(), "{coll} n={n}");
            for row in &s.rows {
                assert_eq!(row.out_of_place.wrong, Some(0), "{coll} n={n} {row:?}");
                assert_eq!(row.in_place.wrong, Some(0), "{coll} n={n} {row:?}");
                assert!(row.out_of_place.time_us > 0.0);
                assert_eq!(row.root, if coll.rooted() { 0 } else { -1 });
                assert_eq!(row.redop, if coll.reduces() { "sum" } else { "none" });
            }
            for other in &summaries[1..] {
                assert_eq!(other.rows.len(), s.rows.len());
                assert_eq!(other.errors, 0);
                assert_eq!(other.avg_busbw, s.avg_busbw);
            }
            assert!(text.contains(&format!(
                "# Collective test starting: {}",
                coll.program_name()
            )));
            assert!(text.contains("# Out of bounds values : 0 OK\n"), "{text}");
            assert_eq!(text.matches("#  Rank ").count(), n);
        }
    }
}

#[test]
fn every_op_and_type_on_reducing_collectives() {
    let a = args("-b 64 -e 4K -f 8 -n 1 -w 0 -o all -d all -c 2");
    for coll in [Coll::AllReduce, Coll::ReduceScatter, Coll::Reduce] {
        for n in [2, 3, 5] {
            let (summaries, text) = run_group(n, coll, &a);
            let s = &summaries[0];
            assert!(s.success(), "{coll} n={n}\n{text}");
            assert_eq!(
                s.rows.len(),
                3 * PerfOp::ALL.len() * DataType::ALL.len(),
                "{coll} n={n}"
            );
            for op in PerfOp::ALL {
                assert!(s.rows.iter().any(|r| r.redop == op.name()));
            }
        }
    }
}

#[test]
fn all_roots_of_rooted_collectives() {
    let a = args("-b 256 -e 256 -n 1 -r all -d int32");
    for coll in [Coll::Broadcast, Coll::Reduce, Coll::Gather, Coll::Scatter] {
        let (summaries, text) = run_group(3, coll, &a);
        let roots: Vec<i64> = summaries[0].rows.iter().map(|r| r.root).collect();
        assert_eq!(roots, [0, 1, 2], "{coll}\n{text}");
        assert!(summaries[0].success());
    }
    let (results, _) = run_group_with(2, Coll::Broadcast, &args("-b 8 -e 8 -r 5"), |c| c);
    for r in results {
        let e = r.unwrap_err();
        assert!(
            e.to_string().contains("invalid root 5 (root must be 0..1)"),
            "{e}"
        );
    }
}

/// Flips one byte of rank 1's output of every call with more than 64 bytes.
struct Corrupting(LocalComm);

impl PerfComm for Corrupting {
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn nranks(&self) -> usize {
        self.0.nranks()
    }
    fn run(
        &self,
        coll: Coll,
        send: Option<&[u8]>,
        recv: &mut [u8],
        count: usize,
        dtype: DataType,
        op: PerfOp,
        root: usize,
    ) -> Result<()> {
        self.0.run(coll, send, recv, count, dtype, op, root)?;
        if self.rank() == 1 && recv.len() > 64 {
            recv[5] ^= 0x40;
        }
        Ok(())
    }
    fn barrier(&self) -> Result<()> {
        self.0.barrier()
    }
    fn allreduce_f64(&self, v: f64, max: bool) -> Result<f64> {
        self.0.allreduce_f64(v, max)
    }
}

#[test]
fn wrong_results_are_counted_and_fail_the_run() {
    let a = args("-b 32 -e 512 -f 4 -n 1 -w 0");
    let (results, text) = run_group_with(2, Coll::AllReduce, &a, Corrupting);
    let summaries: Vec<Summary> = results.into_iter().map(|r| r.unwrap()).collect();
    let s = &summaries[0];
    // Sizes 32 (untouched: 32 bytes), 128 and 512: one wrong float each, in both placements.
    let wrong: Vec<(Option<u64>, Option<u64>)> = s
        .rows
        .iter()
        .map(|r| (r.out_of_place.wrong, r.in_place.wrong))
        .collect();
    assert_eq!(
        wrong,
        [(Some(0), Some(0)), (Some(1), Some(1)), (Some(1), Some(1))]
    );
    assert_eq!(s.wrong_elements, 4);
    assert_eq!(s.errors, 4);
    assert!(!s.success());
    assert_eq!(s.exit_code(), 1);
    assert!(
        text.contains("# Out of bounds values : 4 FAILED\n"),
        "{text}"
    );
    assert_eq!(summaries[1].errors, 4);
}

#[test]
fn no_check_prints_na() {
    let (summaries, text) = run_group(2, Coll::AllGather, &args("-b 1K -e 1K -c 0"));
    let row = &summaries[0].rows[0];
    assert_eq!((row.out_of_place.wrong, row.in_place.wrong), (None, None));
    assert!(summaries[0].success());
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("1024"))
        .unwrap();
    assert!(line.ends_with("    N/A"), "{line}");
    assert_eq!(line.matches("N/A").count(), 2);
    assert!(text.contains("validation: 0"));
}

#[test]
fn table_rows_have_nccl_tests_columns() {
    let (summaries, text) = run_group(4, Coll::AllGather, &args("-b 8 -e 128 -f 2 -n 1"));
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(rows.len(), 5, "{text}");
    for (line, row) in rows.iter().zip(&summaries[0].rows) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(fields.len(), 13, "{line}");
        assert_eq!(fields[0], row.bytes.to_string());
        assert_eq!(fields[1], row.count.to_string());
        assert_eq!(&fields[2..5], ["float", "none", "-1"]);
        assert_eq!((fields[8], fields[12]), ("0", "0"));
        // Widths: 12 + 2 + 12 + 2 + 8 + 2 + 6 + 2 + 6, then 2 blocks of 2+7+2+6+2+6+2+6.
        assert_eq!(line.len(), 52 + 2 * 33, "{line}");
    }
    // 4 ranks of float: blocks are multiples of 4 floats, so 8..32 bytes give nothing.
    let sizes: Vec<usize> = summaries[0].rows.iter().map(|r| r.bytes).collect();
    assert_eq!(sizes, [0, 0, 0, 64, 128]);
}

#[test]
fn options_that_change_the_loop() {
    for flags in [
        "-b 64 -e 256 -f 2 -n 3 -m 2 -z 1 -a 0",
        "-b 64 -e 256 -f 2 -n 2 -z 3 -a 2",
        "-b 64 -e 256 -i 64 -n 2 -z 2 -a 3 -u 3",
        "-b 64 -e 128 -f 2 -n 1 -N 3",
    ] {
        let a = args(flags);
        let (summaries, text) = run_group(3, Coll::AllReduce, &a);
        assert!(summaries[0].success(), "{flags}\n{text}");
        let expected_rows = crate_sizes(&a).len() * a.run_cycles.max(1);
        assert_eq!(summaries[0].rows.len(), expected_rows, "{flags}");
    }
}

fn crate_sizes(a: &Args) -> Vec<usize> {
    ferroccl_perf::sizes::sweep_args(a)
}

#[test]
fn json_output_is_written_and_never_overwrites() {
    let dir = std::env::temp_dir().join(format!("ferroccl-perf-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("out.json");
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(dir.join("out.json.0"));
    let flags = format!("-b 64 -e 128 -f 2 -n 1 -J {}", path.display());
    let a = args(&flags);
    let (_, text) = run_group(2, Coll::AllReduce, &a);
    assert!(text.starts_with(&format!("# Writing JSON output to {}\n", path.display())));
    let doc = std::fs::read_to_string(&path).unwrap();
    assert!(doc.starts_with("{\"version\":3,"), "{doc}");
    assert!(doc.contains("\"args\":[\"-b\",\"64\""));
    assert!(doc.contains("\"results\":[{\"size\":64,\"count\":16,\"type\":\"float\",\"redop\":\"sum\",\"root\":\"    -1\",\"out_of_place\":{\"time\":"));
    assert!(doc.contains("\"nwrong\":0.0"));
    assert!(doc.contains("\"out_of_bounds\":{\"count\":0,\"okay\":true}"));
    assert!(doc.contains("\"okay\":\"unchecked\""));
    assert_eq!(
        doc.matches("\"experiment_name\":\"all_reduce_perf\"")
            .count(),
        2
    );
    // A second run picks the next free name.
    let (_, text) = run_group(1, Coll::AllReduce, &a);
    assert!(
        text.contains(&format!("# Writing JSON output to {}.0\n", path.display())),
        "{text}"
    );
    assert!(dir.join("out.json.0").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn min_bandwidth_fails_the_run() {
    let mut a = args("-b 64 -e 64 -n 1");
    a.min_busbw = Some(1.0e12);
    let (summaries, text) = run_group(2, Coll::AllReduce, &a);
    assert_eq!(summaries[0].bw_ok, Some(false));
    assert_eq!(summaries[0].exit_code(), 1);
    assert!(
        text.contains("FAILED\n#\n# Collective test concluded"),
        "{text}"
    );
}

#[test]
fn device_lines_are_gathered_in_rank_order() {
    let lines: Vec<Vec<String>> = std::thread::scope(|s| {
        let handles: Vec<_> = local_group(3)
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    let line = format!("rank {} says {}", c.rank(), "x".repeat(c.rank() * 5));
                    gather_lines(&c, &line).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let want = [
        "rank 0 says ",
        "rank 1 says xxxxx",
        "rank 2 says xxxxxxxxxx",
    ];
    for l in lines {
        assert_eq!(l, want);
    }
}

#[test]
fn call_layout_inverts_the_size_layout() {
    for coll in Coll::ALL {
        for n in 1..=8 {
            for es in [1, 2, 4, 8] {
                for count in [0, 1, 17, 1000, 4096] {
                    let l = coll.layout(count, es, n);
                    assert_eq!(
                        Layout::for_call(coll, l.param_count, n),
                        l,
                        "{coll} n={n} es={es}"
                    );
                }
            }
        }
    }
}
