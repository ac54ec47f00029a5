//! The text nccl-tests prints, line for line: the preamble, the device list, the two-level
//! column header, one row per size (out-of-place block, then in-place block), the footer.
//!
//! ```text
//! #                                                              out-of-place                       in-place
//! #       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
//! #        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
//!      1048576        262144     float     sum      -1   224.82    4.66    8.75       0   235.74    4.45    8.34       0
//! ```

use crate::args::Args;
use crate::coll::Coll;
use std::io::{self, Write};

/// The version of the perf tools, printed in the first line.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// One timed measurement (one block of a row).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measure {
    /// Time per call in microseconds, combined over ranks as `-a` says.
    pub time_us: f64,
    /// Algorithm bandwidth, GB/s.
    pub algbw: f64,
    /// Bus bandwidth, GB/s.
    pub busbw: f64,
    /// Wrong elements summed over ranks, or `None` when not checked (`N/A`).
    pub wrong: Option<u64>,
}

/// One row: a size with its out-of-place and in-place measurements.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Size column: `max(send, recv)` bytes.
    pub bytes: usize,
    /// Count column: the collective's `count` argument.
    pub count: usize,
    /// Type column (`float`, `bfloat16`, ...).
    pub type_name: &'static str,
    /// Reduction column (`sum`, ..., `none` for collectives without reduction).
    pub redop: &'static str,
    /// Root column (-1 for collectives without root).
    pub root: i64,
    /// Out-of-place block.
    pub out_of_place: Measure,
    /// In-place block.
    pub in_place: Measure,
    /// The algorithm that ran (ferroccl's tuner or `FERRO_ALGO`): a last column after
    /// nccl-tests' thirteen, absent where the backend names none.
    pub algo: Option<String>,
}

/// Formats `value` right-aligned in `width` columns with 2 decimals, falling back to 1, 0,
/// then exponent notation when it does not fit (nccl-tests' `getFloatStr`).
pub fn float_cell(value: f64, width: usize) -> String {
    for prec in [2, 1, 0] {
        let s = format!("{value:>width$.prec$}");
        if s.len() <= width {
            return s;
        }
    }
    let s = c_exp(value, if width >= 7 { 1 } else { 0 });
    format!("{s:>width$}")
}

/// C's `%.{prec}e`: mantissa, `e`, sign, at least two exponent digits.
fn c_exp(value: f64, prec: usize) -> String {
    let s = format!("{value:.prec$e}");
    match s.split_once('e') {
        Some((mantissa, exp)) => {
            let (sign, digits) = match exp.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', exp),
            };
            format!("{mantissa}e{sign}{digits:0>2}")
        }
        None => s,
    }
}

/// C's `%g` (6 significant digits, trailing zeros removed).
pub fn fmt_g(value: f64) -> String {
    if value == 0.0 {
        return if value.is_sign_negative() { "-0" } else { "0" }.to_string();
    }
    if !value.is_finite() {
        return if value.is_nan() {
            "nan".to_string()
        } else if value > 0.0 {
            "inf".to_string()
        } else {
            "-inf".to_string()
        };
    }
    const P: i32 = 6;
    // The exponent after rounding to P significant digits.
    let sci = format!("{value:.5e}");
    let exp: i32 = sci
        .split_once('e')
        .and_then(|(_, e)| e.parse().ok())
        .unwrap_or(0);
    if (-4..P).contains(&exp) {
        let decimals = (P - 1 - exp).max(0) as usize;
        strip_zeros(&format!("{value:.decimals$}"))
    } else {
        let s = c_exp(value, (P - 1) as usize);
        match s.split_once('e') {
            Some((m, e)) => format!("{}e{e}", strip_zeros(m)),
            None => s,
        }
    }
}

fn strip_zeros(s: &str) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s.to_string()
    }
}

/// The device line of one rank, as nccl-tests prints it:
/// `#  Rank  0 Group  0 Pid   1234 on       host device  0 [cpu] host memory`.
pub fn device_line(
    rank: usize,
    group: usize,
    pid: u32,
    host: &str,
    device: usize,
    what: &str,
) -> String {
    format!("#  Rank {rank:2} Group {group:2} Pid {pid:6} on {host:>10} device {device:2} {what}")
}

/// Writes the lines before the device list: version, test name, parameters, notes.
pub fn write_preamble(out: &mut dyn Write, coll: Coll, args: &Args) -> io::Result<()> {
    let (step, step_kind) = args.step_display();
    writeln!(
        out,
        "# ferroccl-perf version {VERSION} (nccl-tests compatible output)"
    )?;
    writeln!(out, "# Collective test starting: {}", coll.program_name())?;
    writeln!(
        out,
        "# nThread {} nGpus 1 minBytes {} maxBytes {} step: {step}({step_kind}) warmup iters: {} \
         iters: {} agg iters: {} validation: {} graph: 0 unalign: {}",
        args.nthreads,
        args.min_bytes,
        args.max_bytes,
        args.warmup_iters,
        args.iters,
        args.agg_iters,
        args.check,
        args.unalign
    )?;
    match args.blocking {
        1 => writeln!(out, "# Blocking Enabled: wait and barrier after each inner iteration (-m) ")?,
        2 => writeln!(out, "# Blocking Enabled: wait after each inner iteration (-m), no barrier ")?,
        3 => writeln!(
            out,
            "# Blocking Enabled: wait and barrier after each outer iteration (-n); time excludes barrier "
        )?,
        _ => {}
    }
    if args.parallel_init {
        writeln!(
            out,
            "# Parallel Init Enabled: threads call into NcclInitRank concurrently "
        )?;
    }
    if !args.ignored.is_empty() {
        writeln!(out, "# Ignored (GPU only): {}", args.ignored.join(" "))?;
    }
    writeln!(out, "#")
}

/// Writes `# Using devices` and one line per rank.
pub fn write_devices(out: &mut dyn Write, lines: &[String]) -> io::Result<()> {
    writeln!(out, "# Using devices")?;
    for line in lines {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// Writes `#` and the three column-header lines.
pub fn write_column_header(out: &mut dyn Write, cputime: bool) -> io::Result<()> {
    let t = if cputime { "cputime" } else { "time" };
    writeln!(out, "#")?;
    writeln!(
        out,
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       in-place          ",
        "", "", "", "", ""
    )?;
    writeln!(
        out,
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} ",
        "size", "count", "type", "redop", "root", t, "algbw", "busbw", "#wrong", t, "algbw", "busbw", "#wrong"
    )?;
    writeln!(
        out,
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} ",
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
    )
}

/// The start of a row: size, count, type, redop, root.
pub fn row_prefix(bytes: usize, count: usize, type_name: &str, redop: &str, root: i64) -> String {
    format!("{bytes:>12}  {count:>12}  {type_name:>8}  {redop:>6}  {root:>6}")
}

/// One block of a row: time, algbw, busbw, #wrong.
pub fn measure_cells(m: &Measure) -> String {
    let time = float_cell(m.time_us, 7);
    let alg = float_cell(m.algbw, 6);
    let bus = float_cell(m.busbw, 6);
    match m.wrong {
        Some(w) => format!("  {time:>7}  {alg:>6}  {bus:>6}  {:>6}", fmt_g(w as f64)),
        None => format!("  {time:>7}  {alg:>6}  {bus:>6}    N/A"),
    }
}

/// The last cell of a row: the algorithm that ran; empty where none is named, so the row
/// keeps nccl-tests' thirteen columns.
pub fn algo_cell(algo: Option<&str>) -> String {
    algo.map_or(String::new(), |a| format!("  {a:>8}"))
}

/// A whole row, without the newline.
pub fn row_line(row: &Row) -> String {
    format!(
        "{}{}{}{}",
        row_prefix(row.bytes, row.count, row.type_name, row.redop, row.root),
        measure_cells(&row.out_of_place),
        measure_cells(&row.in_place),
        algo_cell(row.algo.as_deref())
    )
}

/// Writes the footer: failed checks, average bus bandwidth (with the verdict when a
/// minimum is set) and the closing lines.
pub fn write_footer(
    out: &mut dyn Write,
    errors: u64,
    avg_busbw: f64,
    min_busbw: Option<f64>,
    coll: Coll,
) -> io::Result<()> {
    let verdict = if errors == 0 { "OK" } else { "FAILED" };
    writeln!(out, "# {:<20} : {errors} {verdict}", "Out of bounds values")?;
    let bw_verdict = match min_busbw {
        None => "",
        Some(min) if avg_busbw < min * 0.9 => "FAILED",
        Some(_) => "OK",
    };
    writeln!(
        out,
        "# {:<20} : {} {bw_verdict}",
        "Avg bus bandwidth",
        fmt_g(avg_busbw)
    )?;
    writeln!(out, "#")?;
    writeln!(out, "# Collective test concluded: {}", coll.program_name())?;
    writeln!(out, "#")?;
    writeln!(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_cells_fall_back_like_nccl_tests() {
        assert_eq!(float_cell(63.734, 7), "  63.73");
        assert_eq!(float_cell(1690.544, 7), "1690.54");
        assert_eq!(float_cell(12516.04, 7), "12516.0");
        assert_eq!(float_cell(108861.2, 7), " 108861");
        assert_eq!(float_cell(12345678.0, 7), "1.2e+07");
        assert_eq!(float_cell(0.0, 6), "  0.00");
        assert_eq!(float_cell(233.004, 6), "233.00");
        assert_eq!(float_cell(1233.0, 6), "1233.0");
        assert_eq!(float_cell(123456.0, 6), "123456");
        assert_eq!(float_cell(1234567.0, 6), " 1e+06");
    }

    #[test]
    fn g_format() {
        assert_eq!(fmt_g(19.16172), "19.1617");
        assert_eq!(fmt_g(0.0), "0");
        assert_eq!(fmt_g(233.168), "233.168");
        assert_eq!(fmt_g(4.0), "4");
        assert_eq!(fmt_g(123456.0), "123456");
        assert_eq!(fmt_g(1234567.0), "1.23457e+06");
        assert_eq!(fmt_g(0.0001234), "0.0001234");
        assert_eq!(fmt_g(0.00001234), "1.234e-05");
        assert_eq!(fmt_g(999999.5), "1e+06");
        assert_eq!(fmt_g(1.5), "1.5");
        assert_eq!(fmt_g(f64::NAN), "nan");
    }

    /// The whole output for fixed timings, against text laid out by C's printf with
    /// nccl-tests' format strings.
    #[test]
    fn golden_table() {
        let args = Args::parse(["-b", "8", "-e", "32", "-f", "2", "-G", "1"]).unwrap();
        let m = |time_us, algbw, busbw, wrong| Measure {
            time_us,
            algbw,
            busbw,
            wrong,
        };
        let rows = [
            (
                8,
                2,
                m(10.5, 0.000762, 0.001524, Some(0)),
                m(9.87, 0.00081, 0.00162, Some(0)),
            ),
            (
                16,
                4,
                m(12345.678, 0.0013, 0.0026, Some(3)),
                m(99999.95, 1234.5, 2469.0, Some(0)),
            ),
            (
                32,
                8,
                m(123456.0, 0.00026, 0.00052, Some(0)),
                m(7.0, 123456.7, 1234567.0, None),
            ),
        ];
        let mut out = Vec::new();
        write_preamble(&mut out, Coll::AllReduce, &args).unwrap();
        let devices = [
            device_line(0, 0, 4242, "node-a", 0, "[cpu] host memory"),
            device_line(1, 0, 4243, "node-a", 0, "[cpu] host memory"),
        ];
        write_devices(&mut out, &devices).unwrap();
        write_column_header(&mut out, false).unwrap();
        for (bytes, count, oop, ip) in rows {
            let row = Row {
                bytes,
                count,
                type_name: "float",
                redop: "sum",
                root: -1,
                out_of_place: oop,
                in_place: ip,
                algo: None,
            };
            writeln!(out, "{}", row_line(&row)).unwrap();
        }
        write_footer(&mut out, 1, 617.4341, None, Coll::AllReduce).unwrap();
        let expected = format!(
            "\
# ferroccl-perf version {VERSION} (nccl-tests compatible output)
# Collective test starting: all_reduce_perf
# nThread 1 nGpus 1 minBytes 8 maxBytes 32 step: 2(factor) warmup iters: 1 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0
# Ignored (GPU only): -G 1
#
# Using devices
#  Rank  0 Group  0 Pid   4242 on     node-a device  0 [cpu] host memory
#  Rank  1 Group  0 Pid   4243 on     node-a device  0 [cpu] host memory
#
#                                                              out-of-place                       in-place         \x20
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong\x20
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)        \x20
           8             2     float     sum      -1    10.50    0.00    0.00       0     9.87    0.00    0.00       0
          16             4     float     sum      -1  12345.7    0.00    0.00       3  99999.9  1234.5  2469.0       0
          32             8     float     sum      -1   123456    0.00    0.00       0     7.00  123457   1e+06    N/A
# Out of bounds values : 1 FAILED
# Avg bus bandwidth    : 617.434\x20
#
# Collective test concluded: all_reduce_perf
#

"
        );
        let got = String::from_utf8(out).unwrap();
        for (g, e) in got.lines().zip(expected.lines()) {
            assert_eq!(g, e);
        }
        assert_eq!(got, expected);
    }

    #[test]
    fn cputime_label_and_bandwidth_verdicts() {
        let mut out = Vec::new();
        write_column_header(&mut out, true).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.matches("cputime").count(), 2);
        for (min, verdict) in [(Some(10.0), "OK"), (Some(12.0), "FAILED"), (None, "")] {
            let mut out = Vec::new();
            write_footer(&mut out, 0, 10.0, min, Coll::Broadcast).unwrap();
            let text = String::from_utf8(out).unwrap();
            assert!(text.starts_with("# Out of bounds values : 0 OK\n"));
            assert!(
                text.contains(&format!("# Avg bus bandwidth    : 10 {verdict}\n")),
                "{text}"
            );
            assert!(text.contains("# Collective test concluded: broadcast_perf\n"));
        }
    }

    #[test]
    fn device_line_layout() {
        assert_eq!(
            device_line(0, 0, 11565, "gpu-1-1", 3, "[cpu] host memory"),
            "#  Rank  0 Group  0 Pid  11565 on    gpu-1-1 device  3 [cpu] host memory"
        );
    }
}
