//! The host build of `ferro_reduce.h`: the kernels' element logic and reduce-copy loop compiled
//! as plain C, so the CPU test suite checks them against the Rust reference (and the GPU check
//! has the same loop on the CPU side).

use ferroccl_kernels::{DataType, ElemOp};

use crate::args::RcArgs;

mod ffi {
    use crate::args::RcArgs;

    extern "C" {
        pub fn ferro_host_reduce_copy(dtype: u32, op: u32, a: *const RcArgs, nthreads: u64) -> i32;
        pub fn ferro_host_f16_to_f32(h: u16) -> f32;
        pub fn ferro_host_f32_to_f16(f: f32) -> u16;
        pub fn ferro_host_bf16_to_f32(h: u16) -> f32;
        pub fn ferro_host_f32_to_bf16(f: f32) -> u16;
        pub fn ferro_host_e4m3_to_f32(c: u8) -> f32;
        pub fn ferro_host_f32_to_e4m3(f: f32) -> u8;
        pub fn ferro_host_e5m2_to_f32(c: u8) -> f32;
        pub fn ferro_host_f32_to_e5m2(f: f32) -> u8;
        #[cfg(test)]
        pub fn ferro_host_rc_args_size() -> u64;
    }
}

/// Runs the reduce-copy of `dtype` and `op` on host memory as `nthreads` grid-stride threads of
/// the CUDA kernel would (one after another).
///
/// # Safety
/// Every source address in `args` must be readable and every destination writable for
/// `args.count` elements of `dtype`; a destination must either be one of the sources or
/// overlap none of them, and no two destinations may overlap.
pub unsafe fn reduce_copy(dtype: DataType, op: ElemOp, args: &RcArgs, nthreads: u64) {
    assert!(nthreads > 0, "reduce-copy: nthreads must be at least 1");
    // SAFETY: the caller guarantees the addresses (see above); `args` is a valid `RcArgs`,
    // which has the C struct's layout (checked by `args_layout_matches_c`); the C code reads
    // only the first nsrc/ndst addresses, each for `count` elements.
    let rc = unsafe { ffi::ferro_host_reduce_copy(dtype as u32, op as u32, args, nthreads) };
    assert_eq!(rc, 0, "reduce-copy: no host kernel for {dtype} {op:?}");
}

macro_rules! conversions {
    ($($(#[$doc:meta])* $name:ident($arg:ty) -> $ret:ty = $ffi:ident;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(v: $arg) -> $ret {
                // SAFETY: a pure function of its argument, no pointers.
                unsafe { ffi::$ffi(v) }
            }
        )*
    };
}

conversions! {
    /// `ferro_f16_to_f32` of the header.
    f16_to_f32(u16) -> f32 = ferro_host_f16_to_f32;
    /// `ferro_f32_to_f16` of the header.
    f32_to_f16(f32) -> u16 = ferro_host_f32_to_f16;
    /// `ferro_bf16_to_f32` of the header.
    bf16_to_f32(u16) -> f32 = ferro_host_bf16_to_f32;
    /// `ferro_f32_to_bf16` of the header.
    f32_to_bf16(f32) -> u16 = ferro_host_f32_to_bf16;
    /// `ferro_e4m3_to_f32` of the header.
    e4m3_to_f32(u8) -> f32 = ferro_host_e4m3_to_f32;
    /// `ferro_f32_to_e4m3` of the header.
    f32_to_e4m3(f32) -> u8 = ferro_host_f32_to_e4m3;
    /// `ferro_e5m2_to_f32` of the header.
    e5m2_to_f32(u8) -> f32 = ferro_host_e5m2_to_f32;
    /// `ferro_f32_to_e5m2` of the header.
    f32_to_e5m2(f32) -> u8 = ferro_host_f32_to_e5m2;
}

#[cfg(test)]
mod tests {
    #[test]
    fn args_layout_matches_c() {
        // SAFETY: a pure function, no arguments.
        let c = unsafe { super::ffi::ferro_host_rc_args_size() };
        assert_eq!(c as usize, std::mem::size_of::<super::RcArgs>());
    }
}
