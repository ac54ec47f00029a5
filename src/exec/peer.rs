//! Allreduce straight between the ranks' device buffers: where every rank of a communicator is
//! a thread of one process, their device buffers are memory of one address space, and each
//! rank can reduce its share of the elements from every rank's input and write the result into
//! every rank's output itself, in one reduce-copy kernel (the reducer's
//! [`Reducer::reduce_many`]), instead of passing pieces from slot to slot along a ring.
//!
//! Per call (an allreduce of at least [`PEER_MIN_BYTES`] on a communicator where
//! [`Engine::set_peer_direct`] was turned on, the same on every rank):
//!
//! 1. **Offer.** One allreduce (max) of a few words through the small-message lanes (up to
//!    five ranks): a key of the rank's process, memory space and pre-multiplication factor
//!    and the key's complement (so that max gives the least key too; a rank that cannot take
//!    part, not holding device buffers of a reducer that reduces many buffers in one pass,
//!    offers two all-ones words, which no key matches), and its input and output addresses in
//!    its own words. Every rank gets the same words, so every rank reaches the same verdict:
//!    one key, and no rank's buffers overlap another's (in place, a rank's input is its
//!    output). Otherwise every rank runs the schedule as before: so do ranks whose
//!    pre-multiplied sums have factors of their own (one kernel scales every source alike).
//! 2. **Reduce.** Rank `r` reduces elements `chunk(r)` of the `n` inputs into the `n`
//!    outputs and waits for it. In place this is safe: every rank reads and writes only its
//!    own chunk of each buffer, and the kernel reads an element of every source before it
//!    writes that element.
//! 3. **Done.** One more lane allreduce (max) of a status word: no rank returns while another
//!    may still be writing its output or reading its input, and a rank whose kernel failed is
//!    named by all of them (the outputs are then incomplete, and every rank says so).
//!
//! Traffic: each rank reads `n` chunks and writes `n` chunks of `S / n` bytes, `2 × S` per
//! rank and `2 × n × S` in all, against the `9 × S` of the two-rank ring on the p2p
//! transport's slots (copy into the peer's slot, reduce from it, copy the result over, copy it
//! out). No host round trip per piece: two lane exchanges and one launch a call.

use std::ops::Range;

use ferroccl_kernels::{DataType, ElemOp};
use ferroccl_transport::{Error, MemRef, MemSpace, Result};

use super::{Engine, Memory, OpContext};
use crate::coll::{CollArgs, CollKind};
use crate::reduce::Reducer;

/// The smallest allreduce that goes straight between the buffers. Smaller ones stay on the
/// lanes (up to 96 bytes) or the schedules; this is also larger than the offer itself, which
/// runs as an allreduce of its own and must not come back here.
pub(crate) const PEER_MIN_BYTES: usize = 256;

/// Most ranks: one source and one destination per rank in one reduce-copy.
pub(crate) const PEER_MAX_RANKS: usize = ferroccl_cuda::MAX_SRCS;

/// A chunk starts at a multiple of this many bytes of its buffers, so that buffers aligned
/// alike keep the kernel on 16-byte vectors.
const CHUNK_ALIGN: usize = 64;

/// The engine's state for allreduces straight between the buffers.
#[derive(Debug, Default)]
pub(super) struct Peer {
    /// Tried at all: every rank a thread of this process, and asked for.
    on: bool,
    /// Calls that ran so.
    calls: u64,
}

/// Words of the offer: key, !key, then input and output of each rank.
const HEAD: usize = 2;

/// This process's part of the key: random per process, so that ranks of two processes (which
/// `set_peer_direct` should have kept apart already) never agree on one.
fn process_token() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static TOKEN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TOKEN.get_or_init(|| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish()
    })
}

/// The key of memory `space` in this process, for a call pre-multiplied by `premul`: never
/// all ones (the word of a rank that cannot take part).
fn key_of(space: MemSpace, premul: Option<f64>) -> u64 {
    let code: u64 = match space {
        MemSpace::Host => 0,
        MemSpace::Cuda(n) => 1 + u64::from(n),
    };
    let factor = premul.map_or(u64::MAX, f64::to_bits);
    ferroccl_transport::hash64(&[
        &process_token().to_le_bytes(),
        &code.to_le_bytes(),
        &factor.to_le_bytes(),
    ]) >> 1
}

/// Elements of `count` that rank `r` of `n` reduces: equal shares, each starting on a multiple
/// of [`CHUNK_ALIGN`] bytes of `es`-byte elements; the last ones may be short or empty.
pub(crate) fn chunk(count: usize, n: usize, r: usize, es: usize) -> Range<usize> {
    let align = (CHUNK_ALIGN / es.max(1)).max(1);
    let per = count.div_ceil(n.max(1)).div_ceil(align) * align;
    let start = (r * per).min(count);
    start..(start + per).min(count)
}

/// Whether the `n` ranks' buffers `(input, output)` of `bytes` each are apart: every distinct
/// buffer overlaps no other (a rank in place names one buffer twice).
pub(crate) fn apart(bufs: &[(usize, usize)], bytes: usize) -> bool {
    let mut regions: Vec<usize> = Vec::with_capacity(2 * bufs.len());
    for &(i, o) in bufs {
        regions.push(o);
        if i != o {
            regions.push(i);
        }
    }
    let overlap = |a: usize, b: usize| a < b.saturating_add(bytes) && b < a.saturating_add(bytes);
    regions
        .iter()
        .enumerate()
        .all(|(k, &a)| regions[k + 1..].iter().all(|&b| !overlap(a, b)))
}

impl Engine {
    /// Lets allreduces of device buffers go straight between the ranks' buffers. Turned on
    /// only where every rank is a thread of this process (the same on every rank) and the
    /// communicator has at most [`PEER_MAX_RANKS`] ranks.
    pub(crate) fn set_peer_direct(&mut self, on: bool) {
        self.peer.on = on && (2..=PEER_MAX_RANKS).contains(&self.nranks);
    }

    /// Allreduces that went straight between the ranks' buffers.
    pub(crate) fn peer_calls(&self) -> u64 {
        self.peer.calls
    }

    /// Whether allreduce `args` of `es`-byte elements is offered straight between the
    /// buffers: the same answer on every rank, whatever its buffers.
    pub(super) fn peer_fits(&self, args: &CollArgs, es: usize) -> bool {
        self.peer.on
            && matches!(args.kind, CollKind::AllReduce)
            && args.count * es >= PEER_MIN_BYTES
            && self.tuning.probe.is_none()
            && self.tuning.overrides == crate::plan::Overrides::default()
    }

    /// Offers allreduce `args` straight between the ranks' buffers (see the module); `Ok(true)`
    /// when it ran so, `Ok(false)` when the ranks agreed to run the schedule instead.
    /// `reducer`: the reducer of this rank's device arena, for device buffers.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn peer_all_reduce(
        &mut self,
        args: &CollArgs,
        dtype: DataType,
        op: ElemOp,
        premul: Option<f64>,
        mem: &Memory,
        ctx: &OpContext,
        reducer: Option<&dyn Reducer>,
    ) -> Result<bool> {
        let (n, me, es) = (self.nranks, self.rank, dtype.size());
        let bytes = args.count * es;
        let input = if mem.in_place {
            mem.output as usize
        } else {
            mem.input as usize
        };
        let able = mem.space != MemSpace::Host
            && reducer.is_some_and(|r| r.reduces_many() && r.serves(mem.space))
            && mem.output_len >= bytes
            && (mem.in_place || mem.input_len >= bytes);
        let key = key_of(mem.space, premul);
        let mut words = vec![0u64; HEAD + 2 * n];
        (words[0], words[1]) = if able {
            (key, !key)
        } else {
            (u64::MAX, u64::MAX)
        };
        words[HEAD + 2 * me] = input as u64;
        words[HEAD + 2 * me + 1] = mem.output as u64;
        self.max_words(&mut words, ctx)?;
        let bufs: Vec<(usize, usize)> = (0..n)
            .map(|k| {
                (
                    words[HEAD + 2 * k] as usize,
                    words[HEAD + 2 * k + 1] as usize,
                )
            })
            .collect();
        if words[0] != !words[1] || !apart(&bufs, bytes) {
            return Ok(false);
        }
        let Some(reducer) = reducer else {
            return Err(Error::internal(format!(
                "{}: agreed to reduce straight between the buffers without a reducer",
                ctx.label()
            )));
        };
        let mine = chunk(args.count, n, me, es);
        let result = if mine.is_empty() {
            Ok(())
        } else {
            let at = |addr: usize| MemRef {
                space: mem.space,
                addr: addr + mine.start * es,
                len: mine.len() * es,
            };
            let srcs: Vec<MemRef> = bufs.iter().map(|&(i, _)| at(i)).collect();
            let dsts: Vec<MemRef> = bufs.iter().map(|&(_, o)| at(o)).collect();
            crate::profile::phase(crate::profile::Phase::Reduce);
            let r = reducer.reduce_many(dtype, op, &dsts, &srcs, premul);
            crate::profile::phase(crate::profile::Phase::Drive);
            r
        };
        let mut status = [u64::from(result.is_err()) * (me as u64 + 1)];
        self.max_words(&mut status, ctx)?;
        result.map_err(|e| e.context(ctx.label()))?;
        if status[0] != 0 {
            return Err(Error::remote(format!(
                "{}: rank {} failed its share of the allreduce straight between the ranks' \
                 buffers; this rank's result is incomplete",
                ctx.label(),
                status[0] - 1
            )));
        }
        self.peer.calls += 1;
        Ok(true)
    }

    /// `words = max over the ranks of words`, in place, as an allreduce of host memory under
    /// `ctx` (through the lanes where it fits them).
    fn max_words(&mut self, words: &mut [u64], ctx: &OpContext) -> Result<()> {
        let args = CollArgs {
            kind: CollKind::AllReduce,
            count: words.len(),
            in_place: true,
        };
        let mem = Memory::host(None, ferroccl_kernels::as_bytes_mut(words));
        self.run_collective(&args, DataType::Uint64, ElemOp::Max, None, mem, ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_element_once_and_start_aligned() {
        for es in [1usize, 2, 4, 8] {
            for n in 2..=PEER_MAX_RANKS {
                for count in [0usize, 1, 7, 63, 64, 65, 257, 1031, 4099, 1 << 16] {
                    let mut next = 0;
                    for r in 0..n {
                        let c = chunk(count, n, r, es);
                        assert_eq!(c.start, next.min(count), "{count} {n} {r} {es}");
                        if !c.is_empty() && c.end < count {
                            assert_eq!((c.start * es) % CHUNK_ALIGN, 0);
                        }
                        next = c.end;
                    }
                    assert_eq!(next, count, "{count} elements of {es} bytes over {n} ranks");
                }
            }
        }
        // Equal shares where the count allows: 2 ranks of 1 MiB of f32.
        assert_eq!(chunk(1 << 18, 2, 1, 4), (1 << 17)..(1 << 18));
    }

    #[test]
    fn buffers_apart_or_not() {
        let b = 1024;
        // Out of place, all apart.
        assert!(apart(&[(0, 4096), (8192, 12288)], b));
        // In place: a rank's input is its output.
        assert!(apart(&[(0, 0), (4096, 4096)], b));
        // Two ranks on one buffer.
        assert!(!apart(&[(0, 0), (0, 0)], b));
        // A rank's output overlaps another's input by one byte.
        assert!(!apart(&[(0, 4096), (4096 + b - 1, 8192)], b));
        // A rank's input overlaps its own output without being it.
        assert!(!apart(&[(0, 512), (8192, 8192)], b));
        // Touching is not overlapping.
        assert!(apart(&[(0, b), (2 * b, 3 * b)], b));
    }

    #[test]
    fn keys_differ_by_space_and_factor() {
        let key = |n: u32, f: Option<f64>| key_of(MemSpace::Cuda(n), f);
        assert_ne!(key(0, None), key(1, None));
        assert_ne!(key(0, None), key_of(MemSpace::Host, None));
        assert_eq!(key(3, None), key(3, None));
        assert_ne!(key(0, Some(0.5)), key(0, Some(0.25)));
        assert_ne!(key(0, Some(1.0)), key(0, None));
        assert_eq!(key(0, Some(0.5)), key(0, Some(0.5)));
        // The offer's words of a rank that cannot take part match no key.
        assert_ne!(key(0, None), u64::MAX);
        assert_ne!(!key(0, None), 0);
    }
}
