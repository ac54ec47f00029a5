//! Checkable input data: every element of every rank gets its own value, chosen so that the
//! reduction over ranks is exact in every data type, for every op, in any order.
//!
//! Values are integers. For each data type, `L` is the largest magnitude such that every
//! integer in `[-L, L]` is exact (and, for integer types, cannot overflow):
//! int8 127, uint8 255, int32/uint32 their maximum, 64-bit types 2^53, half 2048,
//! bfloat16 256, float 2^24, double 2^53, fp8 e4m3 16, fp8 e5m2 8.
//!
//! | op        | values                                                                  |
//! |-----------|-------------------------------------------------------------------------|
//! | sum       | `k = min(nranks, L)` ranks contribute to each element (which ones rotates with the index), each with a magnitude ≤ `L / k`: every partial sum stays within `[-L, L]` |
//! | mulsum    | as sum with `L / 2`, since odd ranks multiply by 2 ([`PerfOp::premul_scalar`]) |
//! | avg       | `w(i)` plus per-pair offsets `+d`/`-d` on ranks 2j, 2j+1 that cancel: the sum is `nranks * w(i)`, so the average is exact; magnitudes ≤ `L / nranks` |
//! | prod      | ±1 or ±2 (unsigned types: 1 or 2), with at most `t` factors of 2 per element, `2^t` exact |
//! | max, min  | anything in `[-L, L]` (unsigned: `[0, L]`)                              |
//! | copy      | (collectives without reduction) as max                                  |
//!
//! Integers are compared byte for byte; floating-point results by value (so `-0 == +0`).

use crate::codec;
use crate::coll::{Coll, Layout, PerfOp};
use ferroccl::DataType;

/// The largest magnitude `L` with every integer in `[-L, L]` exact in `dtype`.
pub const fn exact_limit(dtype: DataType) -> i64 {
    match dtype {
        DataType::Int8 => 127,
        DataType::Uint8 => 255,
        DataType::Int32 => i32::MAX as i64,
        DataType::Uint32 => u32::MAX as i64,
        DataType::Int64 | DataType::Uint64 | DataType::Float64 => 1 << 53,
        DataType::Float16 => 2048,
        DataType::Bfloat16 => 256,
        DataType::Float32 => 1 << 24,
        DataType::Float8E4M3 => 16,
        DataType::Float8E5M2 => 8,
    }
}

/// The largest `t` with `2^t` exact in `dtype` (products of ±2 factors).
pub const fn max_pow2(dtype: DataType) -> u32 {
    match dtype {
        DataType::Int8 => 6,
        DataType::Uint8 => 7,
        DataType::Int32 => 30,
        DataType::Uint32 => 31,
        DataType::Int64 | DataType::Uint64 | DataType::Float64 | DataType::Float32 => 52,
        DataType::Bfloat16 => 52,
        DataType::Float16 | DataType::Float8E5M2 => 15,
        DataType::Float8E4M3 => 8,
    }
}

/// A 64-bit mix of (seed, rank, index): the source of every value.
fn mix(seed: u64, rank: usize, index: usize) -> u64 {
    let mut x = (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (rank as u64 + 1).wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
        ^ seed.wrapping_mul(0x1656_67B1_9E37_79F9);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 32)
}

/// A value in `[-c, c]` (signed) or `[0, c]` (unsigned) from `h`.
fn spread(h: u64, c: i64, signed: bool) -> i64 {
    if c <= 0 {
        return 0;
    }
    if signed {
        (h % (2 * c as u64 + 1)) as i64 - c
    } else {
        (h % (c as u64 + 1)) as i64
    }
}

/// What the inputs of one test are: the data type, the reduction (or `None` for collectives
/// that only move data), nranks and a seed that changes between validation passes, so stale
/// results of an earlier pass do not look right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataSpec {
    /// Element type.
    pub dtype: DataType,
    /// Reduction, or `None` for data movement only.
    pub op: Option<PerfOp>,
    /// Number of ranks contributing.
    pub nranks: usize,
    /// Varies the values.
    pub seed: u64,
}

impl DataSpec {
    /// Inputs for a reduction `op` over `nranks` ranks.
    pub fn reduction(dtype: DataType, op: PerfOp, nranks: usize) -> Self {
        DataSpec {
            dtype,
            op: Some(op),
            nranks: nranks.max(1),
            seed: 0,
        }
    }

    /// Inputs for a collective that only moves data.
    pub fn copy(dtype: DataType, nranks: usize) -> Self {
        DataSpec {
            dtype,
            op: None,
            nranks: nranks.max(1),
            seed: 0,
        }
    }

    /// Inputs for `coll` (a reduction with `op` if `coll` reduces).
    pub fn for_coll(coll: Coll, dtype: DataType, op: PerfOp, nranks: usize) -> Self {
        if coll.reduces() {
            Self::reduction(dtype, op, nranks)
        } else {
            Self::copy(dtype, nranks)
        }
    }

    /// The same inputs with another seed.
    pub fn with_seed(self, seed: u64) -> Self {
        DataSpec { seed, ..self }
    }

    fn signed(&self) -> bool {
        codec::is_signed(self.dtype)
    }

    /// The value of element `index` of `rank`'s input (for reduce_scatter and alltoall the
    /// index runs over the whole send buffer).
    pub fn value(&self, rank: usize, index: usize) -> i64 {
        let l = exact_limit(self.dtype);
        let n = self.nranks;
        let h = mix(self.seed, rank, index);
        let signed = self.signed();
        match self.op {
            None | Some(PerfOp::Max) | Some(PerfOp::Min) => spread(h, l, signed),
            Some(op @ (PerfOp::Sum | PerfOp::PreMulSum)) => {
                let l = if op == PerfOp::PreMulSum { l / 2 } else { l };
                let k = n.min(l as usize).max(1);
                if (rank + index) % n < k {
                    spread(h, l / k as i64, signed)
                } else {
                    0
                }
            }
            Some(PerfOp::Avg) => self.avg_value(rank, index),
            Some(PerfOp::Prod) => {
                let t = (max_pow2(self.dtype) as usize).min(n);
                let two = (rank + 2 * index) % n < t && h & 1 == 1;
                let magnitude = if two { 2 } else { 1 };
                if signed && (h >> 1).is_multiple_of(3) {
                    -magnitude
                } else {
                    magnitude
                }
            }
        }
    }

    fn avg_value(&self, rank: usize, index: usize) -> i64 {
        let l = exact_limit(self.dtype);
        let n = self.nranks;
        let signed = self.signed();
        let c = l / n as i64;
        // Pair j = ranks 2j and 2j+1 (a last odd rank has no partner and no offset).
        let pair = rank / 2;
        let has_partner = rank ^ 1 < n;
        let d_sign = if rank.is_multiple_of(2) { 1 } else { -1 };
        let hp = mix(self.seed ^ 0xA5A5, pair, index);
        if c == 0 {
            // More ranks than exact integers: one pair per element carries +d/-d, the
            // average is 0.
            if !signed || !has_partner || pair != index % (n / 2).max(1) {
                return 0;
            }
            return d_sign * (1 + (hp % l as u64) as i64);
        }
        let w = spread(mix(self.seed ^ 0x5A5A, 0, index), c / 2, signed);
        if !has_partner {
            return w;
        }
        let dmax = if signed { c - w.abs() } else { w.min(c - w) };
        w + d_sign * spread(hp, dmax, false)
    }

    /// The reduction of element `index` over all ranks, exactly (0 for data movement).
    pub fn reduced(&self, index: usize) -> i64 {
        let n = self.nranks;
        let vals = (0..n).map(|r| i128::from(self.value(r, index)));
        let v = match self.op {
            None => 0,
            Some(PerfOp::Sum) => vals.sum(),
            Some(PerfOp::PreMulSum) => (0..n)
                .map(|r| i128::from(self.value(r, index)) * i128::from(PerfOp::premul_scalar(r)))
                .sum(),
            Some(PerfOp::Avg) => vals.sum::<i128>() / n as i128,
            Some(PerfOp::Prod) => vals.product(),
            Some(PerfOp::Max) => vals.max().unwrap_or(0),
            Some(PerfOp::Min) => vals.min().unwrap_or(0),
        };
        // Bounded by the exact limit (<= 2^53) by construction.
        v as i64
    }

    /// Writes the values of `rank`'s elements `start..` into `out` (one element per
    /// `dtype.size()` bytes).
    pub fn fill(&self, rank: usize, start: usize, out: &mut [u8]) {
        let es = self.dtype.size();
        for (j, elem) in out.chunks_exact_mut(es).enumerate() {
            codec::encode_int(self.dtype, i128::from(self.value(rank, start + j)), elem);
        }
    }

    /// Writes the reductions of elements `start..` into `out`.
    pub fn fill_reduced(&self, start: usize, out: &mut [u8]) {
        let es = self.dtype.size();
        for (j, elem) in out.chunks_exact_mut(es).enumerate() {
            codec::encode_int(self.dtype, i128::from(self.reduced(start + j)), elem);
        }
    }
}

/// Where one rank's buffers for a test are.
#[derive(Debug)]
pub struct TestBuffers<'a> {
    /// Out of place: the send buffer, `layout.send_count` elements.
    pub send: &'a mut [u8],
    /// Out of place: the receive buffer, `layout.recv_count` elements. In place: the one
    /// buffer, `layout.inplace_count()` elements.
    pub recv: &'a mut [u8],
    /// Receives the expected content of the checked output region, `layout.recv_count`
    /// elements.
    pub expected: &'a mut [u8],
}

/// The byte range of the output region of `rank` that validation checks (nccl-tests'
/// `recvInplaceOffset * rank` in place, the start of the receive buffer otherwise).
pub fn output_range(
    layout: &Layout,
    elem_size: usize,
    rank: usize,
    in_place: bool,
) -> std::ops::Range<usize> {
    let start = if in_place {
        layout.recv_inplace_offset * rank * elem_size
    } else {
        0
    };
    start..start + layout.recv_count * elem_size
}

/// Initializes `rank`'s buffers for one test of `coll` and writes what validation expects.
///
/// The receive buffer is zeroed first (in place: the whole buffer, then the input is
/// written at `send_inplace_offset * rank`). Ranks that receive nothing (non-roots of
/// reduce and gather) expect their output region unchanged.
///
/// # Panics
/// If a buffer is shorter than `layout` says.
pub fn prepare(
    coll: Coll,
    spec: &DataSpec,
    layout: &Layout,
    rank: usize,
    root: usize,
    in_place: bool,
    bufs: TestBuffers<'_>,
) {
    let es = spec.dtype.size();
    let n = spec.nranks;
    let send_len = layout.send_count * es;
    let TestBuffers {
        send,
        recv,
        expected,
    } = bufs;
    if in_place {
        let total = layout.inplace_count() * es;
        recv[..total].fill(0);
        let at = layout.send_inplace_offset * rank * es;
        spec.fill(rank, 0, &mut recv[at..at + send_len]);
    } else {
        spec.fill(rank, 0, &mut send[..send_len]);
        recv[..layout.recv_count * es].fill(0);
    }
    let expected = &mut expected[..layout.recv_count * es];
    expected.copy_from_slice(&recv[output_range(layout, es, rank, in_place)]);

    let block = layout.param_count;
    let block_bytes = block * es;
    match coll {
        Coll::AllReduce => spec.fill_reduced(0, expected),
        Coll::Reduce => {
            if rank == root {
                spec.fill_reduced(0, expected);
            }
        }
        Coll::ReduceScatter => spec.fill_reduced(rank * block, expected),
        Coll::Broadcast => spec.fill(root, 0, expected),
        Coll::SendRecv => spec.fill((rank + n - 1) % n, 0, expected),
        Coll::Scatter => spec.fill(root, rank * block, expected),
        Coll::AllGather | Coll::HyperCube | Coll::Gather => {
            if coll != Coll::Gather || rank == root {
                for (p, out) in expected.chunks_exact_mut(block_bytes.max(1)).enumerate() {
                    spec.fill(p, 0, out);
                }
            }
        }
        Coll::AllToAll => {
            for (p, out) in expected.chunks_exact_mut(block_bytes.max(1)).enumerate() {
                spec.fill(p, rank * block, out);
            }
        }
    }
}

/// The number of elements of `got` that differ from `expected`: integers byte for byte,
/// floating-point numbers by value (NaN is always wrong, `-0 == +0`).
pub fn count_wrong(dtype: DataType, got: &[u8], expected: &[u8]) -> u64 {
    let es = dtype.size();
    let mut wrong = got.len().abs_diff(expected.len()) as u64 / es as u64;
    for (g, e) in got.chunks_exact(es).zip(expected.chunks_exact(es)) {
        let ok = if dtype.is_float() {
            codec::decode(dtype, g) == codec::decode(dtype, e)
        } else {
            g == e
        };
        wrong += u64::from(!ok);
    }
    wrong
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_ops() -> impl Iterator<Item = Option<PerfOp>> {
        std::iter::once(None).chain(PerfOp::ALL.into_iter().map(Some))
    }

    /// Applies `op` in f64, as a reduction in some order would.
    fn step(op: PerfOp, acc: f64, v: f64) -> f64 {
        match op {
            PerfOp::Sum | PerfOp::Avg | PerfOp::PreMulSum => acc + v,
            PerfOp::Prod => acc * v,
            PerfOp::Max => acc.max(v),
            PerfOp::Min => acc.min(v),
        }
    }

    fn representable(dtype: DataType, v: f64) -> bool {
        let mut b = [0u8; 8];
        let in_range = match dtype {
            DataType::Int8 => (-128.0..=127.0).contains(&v),
            DataType::Uint8 => (0.0..=255.0).contains(&v),
            DataType::Int32 => (-2147483648.0..=2147483647.0).contains(&v),
            DataType::Uint32 => (0.0..=4294967295.0).contains(&v),
            DataType::Uint64 => v >= 0.0,
            _ => true,
        };
        in_range && codec::encode(dtype, v, &mut b)
    }

    /// Every dtype x op x nranks 1..8: inputs, every partial reduction in two orders, and the
    /// expected value are exactly representable, and the f64 simulation equals `reduced`.
    #[test]
    fn reductions_are_exact_for_every_dtype_op_and_nranks() {
        for dtype in DataType::ALL {
            for op in PerfOp::ALL {
                for n in 1..=8 {
                    for seed in [0, 7] {
                        let spec = DataSpec::reduction(dtype, op, n).with_seed(seed);
                        for i in 0..300 {
                            let scaled: Vec<f64> = (0..n)
                                .map(|r| {
                                    let v = spec.value(r, i) as f64;
                                    assert!(representable(dtype, v), "{dtype} {op} n={n} v={v}");
                                    let s = if op == PerfOp::PreMulSum {
                                        f64::from(PerfOp::premul_scalar(r))
                                    } else {
                                        1.0
                                    };
                                    assert!(representable(dtype, v * s), "{dtype} {op} {v}*{s}");
                                    v * s
                                })
                                .collect();
                            for order in [false, true] {
                                let mut it: Box<dyn Iterator<Item = &f64>> = if order {
                                    Box::new(scaled.iter().rev())
                                } else {
                                    Box::new(scaled.iter())
                                };
                                let mut acc = *it.next().unwrap();
                                for v in it {
                                    acc = step(op, acc, *v);
                                    assert!(
                                        representable(dtype, acc),
                                        "{dtype} {op} n={n} i={i}: partial {acc}"
                                    );
                                }
                                if op == PerfOp::Avg {
                                    assert_eq!(acc % n as f64, 0.0, "{dtype} avg n={n} i={i}");
                                    acc /= n as f64;
                                }
                                assert_eq!(acc, spec.reduced(i) as f64, "{dtype} {op} n={n} i={i}");
                                assert!(representable(dtype, acc));
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn values_vary_with_rank_and_index() {
        for dtype in DataType::ALL {
            for op in all_ops() {
                let spec = DataSpec {
                    dtype,
                    op,
                    nranks: 4,
                    seed: 1,
                };
                let vals: Vec<i64> = (0..256).map(|i| spec.value(1, i)).collect();
                let distinct: std::collections::BTreeSet<_> = vals.iter().collect();
                assert!(distinct.len() >= 2, "{dtype} {op:?}: {vals:?}");
                let other: Vec<i64> = (0..256).map(|i| spec.value(2, i)).collect();
                assert_ne!(vals, other, "{dtype} {op:?}: ranks 1 and 2 equal");
                let reseeded: Vec<i64> = (0..256).map(|i| spec.with_seed(2).value(1, i)).collect();
                assert_ne!(vals, reseeded, "{dtype} {op:?}: seed ignored");
            }
        }
        // Wide types get many distinct values.
        let spec = DataSpec::reduction(DataType::Float32, PerfOp::Sum, 8);
        let distinct: std::collections::BTreeSet<_> = (0..1000).map(|i| spec.value(3, i)).collect();
        assert!(distinct.len() > 900);
    }

    #[test]
    fn large_nranks_stay_exact() {
        for dtype in [DataType::Float8E5M2, DataType::Float8E4M3, DataType::Int8] {
            for op in PerfOp::ALL {
                for n in [9, 17, 64, 200] {
                    let spec = DataSpec::reduction(dtype, op, n);
                    for i in 0..64 {
                        let r = spec.reduced(i) as f64;
                        assert!(representable(dtype, r), "{dtype} {op} n={n}: {r}");
                        let mut acc = 0.0f64;
                        for rank in 0..n {
                            let s = if op == PerfOp::PreMulSum {
                                f64::from(PerfOp::premul_scalar(rank))
                            } else {
                                1.0
                            };
                            if matches!(op, PerfOp::Sum | PerfOp::Avg | PerfOp::PreMulSum) {
                                acc += spec.value(rank, i) as f64 * s;
                                assert!(representable(dtype, acc), "{dtype} {op} n={n}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn prepare_all_reduce_out_of_place() {
        let spec = DataSpec::reduction(DataType::Int32, PerfOp::Sum, 3);
        let layout = Coll::AllReduce.layout(10, 4, 3);
        let (mut send, mut recv, mut exp) = (vec![0xAA; 40], vec![0xAA; 40], vec![0; 40]);
        prepare(
            Coll::AllReduce,
            &spec,
            &layout,
            1,
            0,
            false,
            TestBuffers {
                send: &mut send,
                recv: &mut recv,
                expected: &mut exp,
            },
        );
        assert!(recv.iter().all(|b| *b == 0));
        for i in 0..10 {
            let got = codec::decode_int(DataType::Int32, &send[i * 4..]).unwrap();
            assert_eq!(got, i128::from(spec.value(1, i)));
            let want = codec::decode_int(DataType::Int32, &exp[i * 4..]).unwrap();
            let sum: i64 = (0..3).map(|r| spec.value(r, i)).sum();
            assert_eq!(want, i128::from(sum));
        }
        assert_eq!(count_wrong(DataType::Int32, &exp, &exp), 0);
        assert_eq!(
            count_wrong(DataType::Int32, &recv, &exp),
            10 - (0..10).filter(|i| spec.reduced(*i) == 0).count() as u64
        );
    }

    #[test]
    fn prepare_in_place_layouts() {
        // all_gather in place, rank 2 of 4: input sits in block 2 of the output buffer.
        let n = 4;
        let spec = DataSpec::copy(DataType::Float32, n);
        let layout = Coll::AllGather.layout(64, 4, n);
        assert_eq!(layout.param_count, 16);
        let mut recv = vec![0xFF; 256];
        let mut exp = vec![0; 256];
        prepare(
            Coll::AllGather,
            &spec,
            &layout,
            2,
            0,
            true,
            TestBuffers {
                send: &mut [],
                recv: &mut recv,
                expected: &mut exp,
            },
        );
        let mut block = vec![0u8; 64];
        spec.fill(2, 0, &mut block);
        assert_eq!(&recv[128..192], &block[..]);
        assert!(recv[..128].iter().all(|b| *b == 0));
        assert_eq!(&exp[128..192], &block[..]);
        spec.fill(0, 0, &mut block);
        assert_eq!(&exp[..64], &block[..]);

        // reduce_scatter in place, rank 1 of 2: checked region is block 1.
        let spec = DataSpec::reduction(DataType::Float64, PerfOp::Max, 2);
        let layout = Coll::ReduceScatter.layout(8, 8, 2);
        assert_eq!(output_range(&layout, 8, 1, true), 32..64);
        let mut recv = vec![0; 64];
        let mut exp = vec![0; 32];
        prepare(
            Coll::ReduceScatter,
            &spec,
            &layout,
            1,
            0,
            true,
            TestBuffers {
                send: &mut [],
                recv: &mut recv,
                expected: &mut exp,
            },
        );
        for j in 0..4 {
            let want = spec.value(0, 4 + j).max(spec.value(1, 4 + j)) as f64;
            assert_eq!(codec::decode(DataType::Float64, &exp[j * 8..]), want);
        }

        // reduce in place on a non-root: the buffer must stay as the input.
        let spec = DataSpec::reduction(DataType::Uint8, PerfOp::Sum, 2);
        let layout = Coll::Reduce.layout(5, 1, 2);
        let mut recv = vec![0; 5];
        let mut exp = vec![0; 5];
        prepare(
            Coll::Reduce,
            &spec,
            &layout,
            1,
            0,
            true,
            TestBuffers {
                send: &mut [],
                recv: &mut recv,
                expected: &mut exp,
            },
        );
        assert_eq!(recv, exp);
    }

    #[test]
    fn count_wrong_compares_floats_by_value() {
        let mut a = [0u8; 4];
        let mut b = [0u8; 4];
        codec::encode(DataType::Float32, 0.0, &mut a);
        codec::encode(DataType::Float32, -0.0, &mut b);
        assert_ne!(a, b);
        assert_eq!(count_wrong(DataType::Float32, &a, &b), 0);
        codec::encode(DataType::Float32, f64::NAN, &mut a);
        assert_eq!(count_wrong(DataType::Float32, &a, &a), 1);
        assert_eq!(count_wrong(DataType::Int8, &[1, 2, 3], &[1, 0, 3]), 1);
        assert_eq!(count_wrong(DataType::Int8, &[1, 2], &[1, 2, 3]), 1);
    }
}
