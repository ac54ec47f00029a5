//! Log lines written whole.
//!
//! `eprintln!` may split one line into several writes, so the lines of ranks that share one
//! stderr (a launcher's pipe, a terminal) can interleave mid-line. [`write_line`] formats the
//! line first and hands it to the kernel in one `write`, which a pipe keeps whole up to
//! `PIPE_BUF` (4096) bytes.

use std::fmt;
use std::io::Write;

/// Writes `args` and a newline to stderr in one `write` call (errors are ignored: a log line
/// must never fail an operation).
pub fn write_line(args: fmt::Arguments<'_>) {
    let mut line = fmt::format(args);
    line.push('\n');
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// `eprintln!`, but the line reaches stderr in one `write` (see [`write_line`]).
#[macro_export]
macro_rules! log_line {
    ($($arg:tt)*) => {
        $crate::log::write_line(format_args!($($arg)*))
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_like_eprintln() {
        // Only checks that the macro expands and formats; the single write is std's
        // `write_all` on an unbuffered stderr with one buffer.
        crate::log_line!("ferroccl rank {} TEST: {}", 3, "a line");
    }
}
