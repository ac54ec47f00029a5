//! Where the buffers of each rank lie in the checker's flat symbolic memory.

use std::ops::Range;

use crate::coll::{BufKind, CollArgs, Span};

/// Where the buffers of one rank lie in the flat symbolic memory: from `user`, out of place
/// `[input | output | scratch]`, in place `[user buffer | scratch]`.
#[derive(Debug, Clone)]
pub(super) struct Layout {
    pub(super) user: usize,
    pub(super) in_base: usize,
    pub(super) in_len: usize,
    pub(super) out_base: usize,
    pub(super) out_len: usize,
    pub(super) scratch_base: usize,
    pub(super) scratch_len: usize,
}

impl Layout {
    pub(super) fn new(
        args: &CollArgs,
        rank: usize,
        nranks: usize,
        scratch: usize,
        user: usize,
    ) -> Self {
        let (in_len, out_len) = args.kind.buffer_lens(args.count, nranks);
        let (in_off, out_off, user_len) = if args.in_place {
            let (i, o) = args.kind.in_place_offsets(args.count, rank);
            (i, o, (i + in_len).max(o + out_len))
        } else {
            (0, in_len, in_len + out_len)
        };
        Layout {
            user,
            in_base: user + in_off,
            in_len,
            out_base: user + out_off,
            out_len,
            scratch_base: user + user_len,
            scratch_len: scratch,
        }
    }

    /// One past this rank's last element.
    pub(super) fn end(&self) -> usize {
        self.scratch_base + self.scratch_len
    }

    pub(super) fn base_len(&self, buf: BufKind) -> (usize, usize) {
        match buf {
            BufKind::Input => (self.in_base, self.in_len),
            BufKind::Output => (self.out_base, self.out_len),
            BufKind::Scratch => (self.scratch_base, self.scratch_len),
        }
    }

    /// The flat range of an in-bounds span.
    pub(super) fn flat(&self, s: &Span) -> Range<usize> {
        let start = self.base_len(s.buf).0 + s.offset;
        start..start + s.len
    }

    pub(super) fn in_bounds(&self, s: &Span) -> bool {
        s.offset
            .checked_add(s.len)
            .is_some_and(|end| end <= self.base_len(s.buf).1)
    }
}
