/*
 * Host build of ferro_reduce.h for the CPU test suite: the same element functions and the same
 * reduce-copy loop the CUDA kernels run, driven by a loop over simulated threads.
 */
#include "../ferro_reduce.h"

/* Runs the reduce-copy of (dtype, op) as `nthreads` grid-stride threads would, one after
   another. Returns 0, or -1 for a dtype or op number that has no kernel. */
int ferro_host_reduce_copy(uint32_t dtype, uint32_t op, const struct ferro_rc_args* a,
                           uint64_t nthreads) {
    uint64_t t;
#define FERRO_HOST_CASE(OP, DT, N, O)                                   \
    if (dtype == (N) && op == (O)) {                                    \
        for (t = 0; t < nthreads; t++) ferro_rc_##OP##_##DT(*a, t, nthreads); \
        return 0;                                                       \
    }
    FERRO_FOR_EACH_KERNEL(FERRO_HOST_CASE)
#undef FERRO_HOST_CASE
    return -1;
}

/* The conversions, for exhaustive checks against the Rust types. */
float ferro_host_f16_to_f32(uint16_t h) { return ferro_f16_to_f32(h); }
uint16_t ferro_host_f32_to_f16(float f) { return ferro_f32_to_f16(f); }
float ferro_host_bf16_to_f32(uint16_t h) { return ferro_bf16_to_f32(h); }
uint16_t ferro_host_f32_to_bf16(float f) { return ferro_f32_to_bf16(f); }
float ferro_host_e4m3_to_f32(uint8_t c) { return ferro_e4m3_to_f32(c); }
uint8_t ferro_host_f32_to_e4m3(float f) { return ferro_f32_to_e4m3(f); }
float ferro_host_e5m2_to_f32(uint8_t c) { return ferro_e5m2_to_f32(c); }
uint8_t ferro_host_f32_to_e5m2(float f) { return ferro_f32_to_e5m2(f); }

/* sizeof(struct ferro_rc_args), so the Rust mirror can check its layout. */
uint64_t ferro_host_rc_args_size(void) { return sizeof(struct ferro_rc_args); }
