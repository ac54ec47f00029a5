/*
 * ferroccl reduction kernels: one reduce-copy kernel per data type and op, compiled at run time
 * with NVRTC (`--fmad=false`, for the device's architecture). The element logic and the loop
 * are in ferro_reduce.h, which the CPU test suite also builds on the host.
 *
 * Kernel names: ferro_reduce_copy_<op>_<dtype>, op in {sum, prod, max, min}, dtype in {i8, u8,
 * i32, u32, i64, u64, f16, f32, f64, bf16, fp8e4m3, fp8e5m2}. Each takes one struct
 * ferro_rc_args by value; pre-multiplied sums and averages are sum with scale_mask and
 * post_divide set, a scale or divide alone is one source. Launch any grid: the loop is
 * grid-stride.
 */
#include "ferro_reduce.h"

#define FERRO_KERNEL(OP, DT, N, O)                                                        \
    extern "C" __global__ void ferro_reduce_copy_##OP##_##DT(struct ferro_rc_args a) {    \
        uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;                   \
        ferro_rc_##OP##_##DT(a, tid, (uint64_t)gridDim.x * blockDim.x);                   \
    }

FERRO_FOR_EACH_KERNEL(FERRO_KERNEL)
