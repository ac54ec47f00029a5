//! The reduce-copy argument block and the names of the kernels.

use ferroccl_kernels::{DataType, ElemOp};

/// Most sources one reduce-copy combines (`FERRO_RC_MAX_SRCS`).
pub const MAX_SRCS: usize = 8;
/// Most destinations one reduce-copy writes (`FERRO_RC_MAX_DSTS`).
pub const MAX_DSTS: usize = 8;

/// `struct ferro_rc_args` of `ferro_reduce.h`: one reduce-copy,
/// `dst[k][i] = post(pre(src[0][i]) op pre(src[1][i]) op ...)` for every destination `k`.
///
/// Addresses are plain numbers (device addresses for the CUDA kernels, host addresses for the
/// host build); whoever launches a reduce-copy answers for them (see the `unsafe` launchers).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RcArgs {
    /// Source addresses; the first `nsrc` are used.
    pub src: [u64; MAX_SRCS],
    /// Destination addresses; the first `ndst` are used.
    pub dst: [u64; MAX_DSTS],
    /// Elements per buffer.
    pub count: u64,
    /// Pre-multiplication factor, see [`factor_bits`].
    pub factor: u64,
    /// Divisor, see [`divisor_bits`].
    pub divisor: u64,
    /// Number of sources, `1..=MAX_SRCS`.
    pub nsrc: u32,
    /// Number of destinations, `0..=MAX_DSTS`.
    pub ndst: u32,
    /// Bit `s`: multiply source `s` by the factor before combining (pre-multiplied sums).
    pub scale_mask: u32,
    /// Non-zero: divide the result by the divisor (average).
    pub post_divide: u32,
}

impl RcArgs {
    /// A reduce-copy of `count` elements from `srcs` into `dsts`, neither scaled nor divided.
    ///
    /// # Panics
    /// If `srcs` is empty or longer than [`MAX_SRCS`], or `dsts` longer than [`MAX_DSTS`].
    pub fn new(srcs: &[u64], dsts: &[u64], count: u64) -> RcArgs {
        assert!(
            !srcs.is_empty() && srcs.len() <= MAX_SRCS,
            "reduce-copy: {} sources (1..={MAX_SRCS})",
            srcs.len()
        );
        assert!(
            dsts.len() <= MAX_DSTS,
            "reduce-copy: {} destinations (0..={MAX_DSTS})",
            dsts.len()
        );
        let mut a = RcArgs {
            count,
            nsrc: srcs.len() as u32,
            ndst: dsts.len() as u32,
            ..RcArgs::default()
        };
        a.src[..srcs.len()].copy_from_slice(srcs);
        a.dst[..dsts.len()].copy_from_slice(dsts);
        a
    }

    /// Multiplies the sources in `mask` by `factor` (converted for `dtype`, see [`factor_bits`]).
    pub fn with_scale(mut self, dtype: DataType, mask: u32, factor: f64) -> RcArgs {
        self.scale_mask = mask;
        self.factor = factor_bits(dtype, factor);
        self
    }

    /// Divides the result by `n` (converted for `dtype`, see [`divisor_bits`]).
    pub fn with_divide(mut self, dtype: DataType, n: u64) -> RcArgs {
        self.post_divide = 1;
        self.divisor = divisor_bits(dtype, n);
        self
    }
}

/// The factor word for `dtype`, converted as `ferroccl_kernels::scale` converts it: integers
/// round toward zero (`factor as i64`, wrapped into the type by the kernel), f64 keeps it, every
/// other float type multiplies in f32 (`factor as f32`).
pub fn factor_bits(dtype: DataType, factor: f64) -> u64 {
    if !dtype.is_float() {
        (factor as i64) as u64
    } else if dtype == DataType::Float64 {
        factor.to_bits()
    } else {
        u64::from((factor as f32).to_bits())
    }
}

/// The divisor word for `dtype`, as `ferroccl_kernels::divide` converts `n`: integers divide by
/// `n`, f64 by `n as f64`, every other float type by `n as f32`.
pub fn divisor_bits(dtype: DataType, n: u64) -> u64 {
    if !dtype.is_float() {
        n
    } else if dtype == DataType::Float64 {
        (n as f64).to_bits()
    } else {
        u64::from((n as f32).to_bits())
    }
}

/// The kernel for `dtype` and `op`: `ferro_reduce_copy_<op>_<dtype>` (`ferro_reduce_copy_sum_f32`).
pub fn kernel_name(dtype: DataType, op: ElemOp) -> String {
    format!("ferro_reduce_copy_{}_{dtype}", op.name())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_block_is_168_bytes() {
        assert_eq!(std::mem::size_of::<RcArgs>(), 168);
        assert_eq!(std::mem::align_of::<RcArgs>(), 8);
    }

    #[test]
    fn names_and_words() {
        assert_eq!(
            kernel_name(DataType::Float32, ElemOp::Sum),
            "ferro_reduce_copy_sum_f32"
        );
        assert_eq!(
            kernel_name(DataType::Float8E4M3, ElemOp::Min),
            "ferro_reduce_copy_min_fp8e4m3"
        );
        assert_eq!(factor_bits(DataType::Int8, -2.7), (-2i64) as u64);
        assert_eq!(
            factor_bits(DataType::Bfloat16, 0.5),
            0.5f32.to_bits() as u64
        );
        assert_eq!(divisor_bits(DataType::Float64, 3), 3.0f64.to_bits());
        assert_eq!(divisor_bits(DataType::Uint32, 3), 3);
    }

    #[test]
    #[should_panic(expected = "0 sources")]
    fn no_source_is_refused() {
        RcArgs::new(&[], &[1], 4);
    }
}
