/*
 * ferroccl reduction: the element-wise arithmetic of every data type and the reduce-copy loop.
 *
 * One source for two builds:
 *   - CUDA C++ (ferro_reduce.cu, compiled at run time with NVRTC): the kernels call these
 *     functions per element;
 *   - plain C on the host (the ferroccl-cuda crate's build), which the CPU test suite checks bit
 *     for bit against the Rust reference in ferroccl-kernels.
 * It needs no CUDA header: 16- and 8-bit floats are converted bit by bit here, with the same
 * rounding as the Rust reference (round to nearest, ties to even; fp8 e4m3 saturates to +-448,
 * e5m2 overflows to infinity; a NaN keeps its sign and becomes quiet).
 *
 * Arithmetic (as in ferroccl-kernels' crate docs):
 *   - integers: sum and prod wrap; max and min as usual;
 *   - floats: max and min are IEEE 754-2019 maximum/minimum (a NaN operand is the result, the
 *     first one if both are NaN; -0 < +0); f16, bf16 and fp8 convert to f32, combine, round back;
 *   - pre-multiplied sum: integers multiply (wrapping) by the factor already rounded toward
 *     zero and wrapped into the type; f32 and narrower multiply in f32, f64 in f64;
 *   - average: integers divide truncating toward zero by n; floats divide in f32 (f64 for f64).
 *
 * Build with floating-point contraction off (host: -ffp-contract=off; NVRTC: --fmad=false), so
 * that a multiply followed by an add rounds twice, as the reference does.
 */
#ifndef FERRO_REDUCE_H
#define FERRO_REDUCE_H

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define FERRO_DEVICE 1
#define FERRO_FN static __device__ __forceinline__
#else
#define FERRO_FN static inline
#endif

#if defined(__CUDACC_RTC__)
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
typedef unsigned long long uintptr_t;
#else
#include <stdint.h>
#include <string.h>
#endif

/* ---------------------------------------------------------------- bit casts */

FERRO_FN uint32_t ferro_f32_bits(float f) {
#ifdef FERRO_DEVICE
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

FERRO_FN float ferro_f32_from(uint32_t u) {
#ifdef FERRO_DEVICE
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

FERRO_FN uint64_t ferro_f64_bits(double f) {
#ifdef FERRO_DEVICE
    return (uint64_t)__double_as_longlong(f);
#else
    uint64_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

FERRO_FN double ferro_f64_from(uint64_t u) {
#ifdef FERRO_DEVICE
    return __longlong_as_double((long long)u);
#else
    double f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* ---------------------------------------------------------------- f16 */

FERRO_FN float ferro_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1fu) {
        /* Infinity, or a NaN made quiet with its payload kept. */
        return ferro_f32_from(sign | 0x7f800000u | (man ? 0x00400000u | (man << 13) : 0u));
    }
    if (exp == 0u) {
        /* Zero or subnormal: man * 2^-24, exact in f32. */
        return ferro_f32_from(sign | ferro_f32_bits((float)man * 5.9604644775390625e-8f));
    }
    return ferro_f32_from(sign | ((exp + 112u) << 23) | (man << 13));
}

FERRO_FN uint16_t ferro_f32_to_f16(float f) {
    uint32_t x = ferro_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t exp = x & 0x7f800000u;
    uint32_t man = x & 0x007fffffu;
    int32_t hexp;
    if (exp == 0x7f800000u) {
        return (uint16_t)(sign | 0x7c00u | (man ? 0x0200u : 0u) | (man >> 13));
    }
    hexp = (int32_t)(exp >> 23) - 127 + 15;
    if (hexp >= 0x1f) {
        return (uint16_t)(sign | 0x7c00u);
    }
    if (hexp <= 0) {
        uint32_t m, hm, round;
        if (14 - hexp > 24) {
            return (uint16_t)sign;
        }
        m = man | 0x00800000u;
        hm = m >> (14 - hexp);
        round = 1u << (13 - hexp);
        if ((m & round) != 0u && (m & (3u * round - 1u)) != 0u) {
            hm += 1u;
        }
        return (uint16_t)(sign | hm);
    }
    {
        uint32_t h = sign | ((uint32_t)hexp << 10) | (man >> 13);
        /* Ties to even; a carry out of the mantissa moves into the exponent. */
        if ((man & 0x1000u) != 0u && (man & 0x2fffu) != 0u) {
            h += 1u;
        }
        return (uint16_t)h;
    }
}

/* ---------------------------------------------------------------- bf16 */

FERRO_FN float ferro_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h;
    if ((h & 0x7fffu) > 0x7f80u) {
        u |= 0x0040u;
    }
    return ferro_f32_from(u << 16);
}

FERRO_FN uint16_t ferro_f32_to_bf16(float f) {
    uint32_t x = ferro_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((x >> 16) | 0x0040u);
    }
    if ((x & 0x8000u) != 0u && (x & 0x17fffu) != 0u) {
        return (uint16_t)((x >> 16) + 1u);
    }
    return (uint16_t)(x >> 16);
}

/* ---------------------------------------------------------------- fp8 */

/* One fp8 layout: 1 sign bit, 7 - mant exponent bits, mant mantissa bits. */
struct ferro_fp8_format {
    uint32_t mant;       /* mantissa bits */
    int32_t bias;        /* exponent bias */
    uint32_t max_finite; /* largest finite magnitude code */
    uint32_t overflow;   /* magnitude code an overflowing value becomes */
    uint32_t nan;        /* canonical NaN magnitude code */
    int ieee_special;    /* all-ones exponent codes are infinity / NaN */
};

FERRO_FN uint8_t ferro_fp8_encode(struct ferro_fp8_format fmt, float f) {
    uint32_t bits = ferro_f32_bits(f);
    uint32_t sign = (bits >> 24) & 0x80u;
    uint32_t abs = bits & 0x7fffffffu;
    uint32_t code;
    if (abs > 0x7f800000u) {
        return (uint8_t)(sign | fmt.nan);
    }
    if ((int32_t)(abs >> 23) >= 127 + 1 - fmt.bias) {
        /* Round the f32 pattern to `mant` bits, ties to even; a carry moves into the exponent. */
        uint32_t shift = 23u - fmt.mant;
        uint32_t rounded = abs + ((1u << (shift - 1u)) - 1u) + ((abs >> shift) & 1u);
        uint32_t rebias = (uint32_t)(127 - fmt.bias) << fmt.mant;
        code = (rounded >> shift) - rebias;
        if (code > fmt.max_finite) {
            code = fmt.overflow;
        }
    } else {
        /* Subnormal: count quanta of 2^(1 - bias - mant); the scaling is exact, so is the split
           into whole and fraction; round the quanta to nearest even. */
        float q = ferro_f32_from(abs) *
                  ferro_f32_from((uint32_t)(127 + fmt.bias - 1 + (int32_t)fmt.mant) << 23);
        uint32_t whole = (uint32_t)q;
        float frac = q - (float)whole;
        if (frac > 0.5f || (frac == 0.5f && (whole & 1u) != 0u)) {
            whole += 1u;
        }
        code = whole;
    }
    return (uint8_t)(sign | code);
}

FERRO_FN float ferro_fp8_decode(struct ferro_fp8_format fmt, uint8_t c) {
    uint32_t sign = (uint32_t)(c >> 7) << 31;
    uint32_t mag = c & 0x7fu;
    uint32_t exp = mag >> fmt.mant;
    uint32_t man = mag & ((1u << fmt.mant) - 1u);
    uint32_t all_ones = (1u << (7u - fmt.mant)) - 1u;
    float m;
    if (fmt.ieee_special && exp == all_ones) {
        return ferro_f32_from(sign | (man == 0u ? 0x7f800000u : 0x7fc00000u));
    }
    if (!fmt.ieee_special && mag == fmt.nan) {
        return ferro_f32_from(sign | 0x7fc00000u);
    }
    if (exp == 0u) {
        float quantum = ferro_f32_from((uint32_t)(127 + 1 - fmt.bias - (int32_t)fmt.mant) << 23);
        m = (float)man * quantum;
    } else {
        m = ferro_f32_from(((exp - (uint32_t)fmt.bias + 127u) << 23) | (man << (23u - fmt.mant)));
    }
    return ferro_f32_from(sign | ferro_f32_bits(m));
}

FERRO_FN struct ferro_fp8_format ferro_e4m3(void) {
    struct ferro_fp8_format f = {3u, 7, 0x7eu, 0x7eu, 0x7fu, 0};
    return f;
}

FERRO_FN struct ferro_fp8_format ferro_e5m2(void) {
    struct ferro_fp8_format f = {2u, 15, 0x7bu, 0x7cu, 0x7eu, 1};
    return f;
}

FERRO_FN float ferro_e4m3_to_f32(uint8_t c) { return ferro_fp8_decode(ferro_e4m3(), c); }
FERRO_FN uint8_t ferro_f32_to_e4m3(float f) { return ferro_fp8_encode(ferro_e4m3(), f); }
FERRO_FN float ferro_e5m2_to_f32(uint8_t c) { return ferro_fp8_decode(ferro_e5m2(), c); }
FERRO_FN uint8_t ferro_f32_to_e5m2(float f) { return ferro_fp8_encode(ferro_e5m2(), f); }

/* ---------------------------------------------------------------- IEEE maximum / minimum */

FERRO_FN float ferro_max_f32(float a, float b) {
    if (a != a) return a;
    if (b != b) return b;
    if (a == b) return ferro_f32_from(ferro_f32_bits(a) & ferro_f32_bits(b)); /* +0 wins */
    return a > b ? a : b;
}

FERRO_FN float ferro_min_f32(float a, float b) {
    if (a != a) return a;
    if (b != b) return b;
    if (a == b) return ferro_f32_from(ferro_f32_bits(a) | ferro_f32_bits(b)); /* -0 wins */
    return a < b ? a : b;
}

FERRO_FN double ferro_max_f64(double a, double b) {
    if (a != a) return a;
    if (b != b) return b;
    if (a == b) return ferro_f64_from(ferro_f64_bits(a) & ferro_f64_bits(b));
    return a > b ? a : b;
}

FERRO_FN double ferro_min_f64(double a, double b) {
    if (a != a) return a;
    if (b != b) return b;
    if (a == b) return ferro_f64_from(ferro_f64_bits(a) | ferro_f64_bits(b));
    return a < b ? a : b;
}

/* ---------------------------------------------------------------- per-type operations
 *
 * For each type DT (element storage T): ferro_{sum,prod,max,min}_DT(T, T) -> T,
 * ferro_mul_DT(T, factor) -> T, ferro_div_DT(T, divisor) -> T, and ferro_factor_DT /
 * ferro_divisor_DT, which read the factor and divisor from the 64-bit words the host fills in
 * (integers: the factor as the element type, the divisor as u64 n; f32 and narrower: f32 bits
 * in the low word; f64: f64 bits).
 */

#define FERRO_INT_TYPE(DT, T, UT)                                                           \
    FERRO_FN T ferro_sum_##DT(T a, T b) { return (T)(UT)((UT)a + (UT)b); }                  \
    FERRO_FN T ferro_prod_##DT(T a, T b) { return (T)(UT)((UT)a * (UT)b); }                 \
    FERRO_FN T ferro_max_##DT(T a, T b) { return a > b ? a : b; }                           \
    FERRO_FN T ferro_min_##DT(T a, T b) { return a < b ? a : b; }                           \
    FERRO_FN T ferro_factor_##DT(uint64_t w) { return (T)(UT)w; }                           \
    FERRO_FN T ferro_mul_##DT(T a, T f) { return ferro_prod_##DT(a, f); }                   \
    FERRO_FN uint64_t ferro_divisor_##DT(uint64_t w) { return w; }

FERRO_INT_TYPE(i8, int8_t, uint8_t)
FERRO_INT_TYPE(u8, uint8_t, uint8_t)
FERRO_INT_TYPE(i32, int32_t, uint32_t)
FERRO_INT_TYPE(u32, uint32_t, uint32_t)
FERRO_INT_TYPE(i64, int64_t, uint64_t)
FERRO_INT_TYPE(u64, uint64_t, uint64_t)

#define FERRO_I64_MAX 0x7fffffffffffffffull

/* Truncating division by n >= 1; a divisor beyond i64 leaves 0 for the narrow types. */
FERRO_FN int8_t ferro_div_i8(int8_t a, uint64_t n) {
    return n > FERRO_I64_MAX ? (int8_t)0 : (int8_t)((int64_t)a / (int64_t)n);
}
FERRO_FN uint8_t ferro_div_u8(uint8_t a, uint64_t n) { return (uint8_t)((uint64_t)a / n); }
FERRO_FN int32_t ferro_div_i32(int32_t a, uint64_t n) {
    return n > FERRO_I64_MAX ? 0 : (int32_t)((int64_t)a / (int64_t)n);
}
FERRO_FN uint32_t ferro_div_u32(uint32_t a, uint64_t n) { return (uint32_t)((uint64_t)a / n); }
FERRO_FN int64_t ferro_div_i64(int64_t a, uint64_t n) {
    if (n <= FERRO_I64_MAX) return a / (int64_t)n;
    /* n >= 2^63: only i64::MIN / 2^63 is non-zero. */
    return (a == (int64_t)(-FERRO_I64_MAX - 1) && n == FERRO_I64_MAX + 1u) ? -1 : 0;
}
FERRO_FN uint64_t ferro_div_u64(uint64_t a, uint64_t n) { return a / n; }

FERRO_FN float ferro_sum_f32(float a, float b) { return a + b; }
FERRO_FN float ferro_prod_f32(float a, float b) { return a * b; }
FERRO_FN float ferro_max_f32v(float a, float b) { return ferro_max_f32(a, b); }
FERRO_FN float ferro_min_f32v(float a, float b) { return ferro_min_f32(a, b); }
FERRO_FN float ferro_factor_f32(uint64_t w) { return ferro_f32_from((uint32_t)w); }
FERRO_FN float ferro_mul_f32(float a, float f) { return a * f; }
FERRO_FN float ferro_divisor_f32(uint64_t w) { return ferro_f32_from((uint32_t)w); }
FERRO_FN float ferro_div_f32(float a, float d) { return a / d; }

FERRO_FN double ferro_sum_f64(double a, double b) { return a + b; }
FERRO_FN double ferro_prod_f64(double a, double b) { return a * b; }
FERRO_FN double ferro_max_f64v(double a, double b) { return ferro_max_f64(a, b); }
FERRO_FN double ferro_min_f64v(double a, double b) { return ferro_min_f64(a, b); }
FERRO_FN double ferro_factor_f64(uint64_t w) { return ferro_f64_from(w); }
FERRO_FN double ferro_mul_f64(double a, double f) { return a * f; }
FERRO_FN double ferro_divisor_f64(uint64_t w) { return ferro_f64_from(w); }
FERRO_FN double ferro_div_f64(double a, double d) { return a / d; }

/* Narrow floats: convert to f32, compute, round back, element by element. */
#define FERRO_NARROW_TYPE(DT, T, TO, FROM)                                                  \
    FERRO_FN T ferro_sum_##DT(T a, T b) { return FROM(TO(a) + TO(b)); }                     \
    FERRO_FN T ferro_prod_##DT(T a, T b) { return FROM(TO(a) * TO(b)); }                    \
    FERRO_FN T ferro_max_##DT(T a, T b) { return FROM(ferro_max_f32(TO(a), TO(b))); }       \
    FERRO_FN T ferro_min_##DT(T a, T b) { return FROM(ferro_min_f32(TO(a), TO(b))); }       \
    FERRO_FN float ferro_factor_##DT(uint64_t w) { return ferro_f32_from((uint32_t)w); }    \
    FERRO_FN T ferro_mul_##DT(T a, float f) { return FROM(TO(a) * f); }                     \
    FERRO_FN float ferro_divisor_##DT(uint64_t w) { return ferro_f32_from((uint32_t)w); }   \
    FERRO_FN T ferro_div_##DT(T a, float d) { return FROM(TO(a) / d); }

FERRO_NARROW_TYPE(f16, uint16_t, ferro_f16_to_f32, ferro_f32_to_f16)
FERRO_NARROW_TYPE(bf16, uint16_t, ferro_bf16_to_f32, ferro_f32_to_bf16)
FERRO_NARROW_TYPE(fp8e4m3, uint8_t, ferro_e4m3_to_f32, ferro_f32_to_e4m3)
FERRO_NARROW_TYPE(fp8e5m2, uint8_t, ferro_e5m2_to_f32, ferro_f32_to_e5m2)

/* ---------------------------------------------------------------- reduce-copy
 *
 * dst[k][i] = post(pre_0(src[0][i]) op pre_1(src[1][i]) op ... ) for every destination k, where
 * pre_s multiplies by the factor when bit s of scale_mask is set (pre-multiplied sums) and post
 * divides by the divisor when post_divide is set (average). Sources combine left to right. A
 * destination may be one of the sources (in place) but must not overlap any other way.
 *
 * Pointers may have any alignment. When every pointer has the same offset modulo 16 and that
 * offset is a whole number of elements, a head of single elements brings them to 16 bytes and
 * the body moves 16-byte vectors, FERRO_RC_UNROLL(size) per thread per round; otherwise every
 * element is moved alone (byte loads where an element is not aligned to its size). Thread
 * `tid` of `nthreads` takes every nthreads-th element or vector (a grid-stride loop), so any
 * launch shape covers any count, and every element is reduced by exactly one thread.
 */

#define FERRO_RC_MAX_SRCS 8
#define FERRO_RC_MAX_DSTS 8
/* 16-byte vectors per thread per round: more for wide elements, whose arithmetic is cheap,
   fewer for narrow floats, whose conversions make the loop long already. */
#define FERRO_RC_UNROLL(size) ((size) >= 8 ? 4 : (size) >= 2 ? 2 : 1)

/* The argument block of one reduce-copy (168 bytes; mirrored by the Rust `RcArgs`). */
struct ferro_rc_args {
    uint64_t src[FERRO_RC_MAX_SRCS]; /* addresses of the sources */
    uint64_t dst[FERRO_RC_MAX_DSTS]; /* addresses of the destinations */
    uint64_t count;                  /* elements */
    uint64_t factor;                 /* pre-multiplication factor (see ferro_factor_DT) */
    uint64_t divisor;                /* divisor (see ferro_divisor_DT) */
    uint32_t nsrc;                   /* 1 ..= FERRO_RC_MAX_SRCS */
    uint32_t ndst;                   /* 0 ..= FERRO_RC_MAX_DSTS */
    uint32_t scale_mask;             /* bit s: multiply source s by the factor */
    uint32_t post_divide;            /* non-zero: divide the result by the divisor */
};

#ifdef FERRO_DEVICE
typedef uint4 ferro_v16;
#else
typedef struct {
    uint64_t w[2];
} ferro_v16;
#endif

FERRO_FN ferro_v16 ferro_zero_v16(void) {
#ifdef FERRO_DEVICE
    return make_uint4(0u, 0u, 0u, 0u);
#else
    ferro_v16 v = {{0u, 0u}};
    return v;
#endif
}

/* Copies n bytes one at a time (elements that are not aligned to their size). */
FERRO_FN void ferro_copy_bytes(unsigned char* d, const unsigned char* s, uint32_t n) {
    uint32_t i;
    for (i = 0; i < n; i++) d[i] = s[i];
}

/* Loads one 16-byte vector from a 16-byte aligned address. */
FERRO_FN ferro_v16 ferro_load_v16(uint64_t addr) {
#ifdef FERRO_DEVICE
    return *(const ferro_v16*)addr;
#else
    ferro_v16 v;
    memcpy(&v, (const void*)(uintptr_t)addr, sizeof v);
    return v;
#endif
}

FERRO_FN void ferro_store_v16(uint64_t addr, ferro_v16 v) {
#ifdef FERRO_DEVICE
    *(ferro_v16*)addr = v;
#else
    memcpy((void*)(uintptr_t)addr, &v, sizeof v);
#endif
}

/*
 * FERRO_RC_DEFINE(OP, DT, T, FT, DIVT) defines
 *   void ferro_rc_OP_DT(struct ferro_rc_args a, uint64_t tid, uint64_t nthreads)
 * with OPF the element function (ferro_OP_DT), T the storage type, FT the factor type and DIVT
 * the divisor type.
 */
#define FERRO_RC_DEFINE(OP, DT, T, OPF, FT, DIVT)                                               \
    FERRO_FN T ferro_rc_load_##OP##_##DT(uint64_t addr) {                                       \
        T v;                                                                                    \
        if (addr % sizeof(T) == 0u) {                                                           \
            v = *(const T*)(uintptr_t)addr;                                                     \
        } else {                                                                                \
            ferro_copy_bytes((unsigned char*)&v, (const unsigned char*)(uintptr_t)addr,         \
                             (uint32_t)sizeof(T));                                              \
        }                                                                                       \
        return v;                                                                               \
    }                                                                                           \
    FERRO_FN void ferro_rc_store_##OP##_##DT(uint64_t addr, T v) {                              \
        if (addr % sizeof(T) == 0u) {                                                           \
            *(T*)(uintptr_t)addr = v;                                                           \
        } else {                                                                                \
            ferro_copy_bytes((unsigned char*)(uintptr_t)addr, (const unsigned char*)&v,         \
                             (uint32_t)sizeof(T));                                              \
        }                                                                                       \
    }                                                                                           \
    /* One element, any alignment. */                                                           \
    FERRO_FN void ferro_rc_one_##OP##_##DT(const struct ferro_rc_args* a, FT f, DIVT d,         \
                                           uint64_t i) {                                        \
        uint32_t s, k;                                                                          \
        T acc = ferro_rc_load_##OP##_##DT(a->src[0] + i * sizeof(T));                           \
        if (a->scale_mask & 1u) acc = ferro_mul_##DT(acc, f);                                   \
        for (s = 1; s < a->nsrc; s++) {                                                         \
            T x = ferro_rc_load_##OP##_##DT(a->src[s] + i * sizeof(T));                         \
            if ((a->scale_mask >> s) & 1u) x = ferro_mul_##DT(x, f);                            \
            acc = OPF(acc, x);                                                                  \
        }                                                                                       \
        if (a->post_divide) acc = ferro_div_##DT(acc, d);                                       \
        for (k = 0; k < a->ndst; k++) ferro_rc_store_##OP##_##DT(a->dst[k] + i * sizeof(T), acc); \
    }                                                                                           \
    FERRO_FN void ferro_rc_##OP##_##DT(struct ferro_rc_args a, uint64_t tid, uint64_t nthreads) { \
        enum { EPV = 16 / sizeof(T), U = FERRO_RC_UNROLL(sizeof(T)) };                         \
        typedef union {                                                                         \
            ferro_v16 v;                                                                        \
            T e[EPV];                                                                           \
        } vec_t;                                                                                \
        FT f = ferro_factor_##DT(a.factor);                                                     \
        DIVT d = ferro_divisor_##DT(a.divisor);                                                 \
        uint64_t n = a.count, head = n, nvec = 0, j, v;                                         \
        uint32_t s, k, u, e;                                                                    \
        uint64_t mis = a.src[0] % 16u;                                                          \
        int same = (mis % sizeof(T)) == 0u;                                                     \
        if (a.nsrc == 0u || a.nsrc > FERRO_RC_MAX_SRCS || a.ndst > FERRO_RC_MAX_DSTS) return;   \
        for (s = 1; s < a.nsrc; s++) same = same && (a.src[s] % 16u == mis);                    \
        for (k = 0; k < a.ndst; k++) same = same && (a.dst[k] % 16u == mis);                    \
        if (same) {                                                                             \
            head = mis == 0u ? 0u : (16u - mis) / sizeof(T);                                    \
            if (head > n) head = n;                                                             \
            nvec = (n - head) / EPV;                                                            \
        }                                                                                       \
        for (v = tid; v < nvec; v += nthreads * U) {                                            \
            vec_t acc[U], x[U];                                                                 \
            uint64_t base = (head + v * EPV) * sizeof(T);                                       \
            uint64_t step = nthreads * 16u;                                                     \
            for (u = 0; u < U; u++)                                                             \
                acc[u].v = v + u * nthreads < nvec ? ferro_load_v16(a.src[0] + base + u * step)     \
                                                   : ferro_zero_v16();                          \
            if (a.scale_mask & 1u)                                                              \
                for (u = 0; u < U; u++)                                                         \
                    for (e = 0; e < EPV; e++) acc[u].e[e] = ferro_mul_##DT(acc[u].e[e], f);     \
            for (s = 1; s < a.nsrc; s++) {                                                      \
                for (u = 0; u < U; u++)                                                         \
                    x[u].v = v + u * nthreads < nvec ? ferro_load_v16(a.src[s] + base + u * step) \
                                                     : ferro_zero_v16();                        \
                if ((a.scale_mask >> s) & 1u)                                                   \
                    for (u = 0; u < U; u++)                                                     \
                        for (e = 0; e < EPV; e++) x[u].e[e] = ferro_mul_##DT(x[u].e[e], f);     \
                for (u = 0; u < U; u++)                                                         \
                    for (e = 0; e < EPV; e++) acc[u].e[e] = OPF(acc[u].e[e], x[u].e[e]);        \
            }                                                                                   \
            if (a.post_divide)                                                                  \
                for (u = 0; u < U; u++)                                                         \
                    for (e = 0; e < EPV; e++) acc[u].e[e] = ferro_div_##DT(acc[u].e[e], d);     \
            for (k = 0; k < a.ndst; k++)                                                        \
                for (u = 0; u < U; u++)                                                         \
                    if (v + u * nthreads < nvec) ferro_store_v16(a.dst[k] + base + u * step, acc[u].v); \
        }                                                                                       \
        /* The head and the tail, one element at a time: scalar index j is element j of the     \
           head, or element j - head of the tail. */                                            \
        for (j = tid; j < n - nvec * EPV; j += nthreads)                                        \
            ferro_rc_one_##OP##_##DT(&a, f, d, j < head ? j : j + nvec * EPV);                  \
    }

/* Every op for one type. */
#define FERRO_RC_TYPE(DT, T, FT, DIVT, MAXF, MINF)                 \
    FERRO_RC_DEFINE(sum, DT, T, ferro_sum_##DT, FT, DIVT)          \
    FERRO_RC_DEFINE(prod, DT, T, ferro_prod_##DT, FT, DIVT)        \
    FERRO_RC_DEFINE(max, DT, T, MAXF, FT, DIVT)                    \
    FERRO_RC_DEFINE(min, DT, T, MINF, FT, DIVT)

FERRO_RC_TYPE(i8, int8_t, int8_t, uint64_t, ferro_max_i8, ferro_min_i8)
FERRO_RC_TYPE(u8, uint8_t, uint8_t, uint64_t, ferro_max_u8, ferro_min_u8)
FERRO_RC_TYPE(i32, int32_t, int32_t, uint64_t, ferro_max_i32, ferro_min_i32)
FERRO_RC_TYPE(u32, uint32_t, uint32_t, uint64_t, ferro_max_u32, ferro_min_u32)
FERRO_RC_TYPE(i64, int64_t, int64_t, uint64_t, ferro_max_i64, ferro_min_i64)
FERRO_RC_TYPE(u64, uint64_t, uint64_t, uint64_t, ferro_max_u64, ferro_min_u64)
FERRO_RC_TYPE(f16, uint16_t, float, float, ferro_max_f16, ferro_min_f16)
FERRO_RC_TYPE(f32, float, float, float, ferro_max_f32v, ferro_min_f32v)
FERRO_RC_TYPE(f64, double, double, double, ferro_max_f64v, ferro_min_f64v)
FERRO_RC_TYPE(bf16, uint16_t, float, float, ferro_max_bf16, ferro_min_bf16)
FERRO_RC_TYPE(fp8e4m3, uint8_t, float, float, ferro_max_fp8e4m3, ferro_min_fp8e4m3)
FERRO_RC_TYPE(fp8e5m2, uint8_t, float, float, ferro_max_fp8e5m2, ferro_min_fp8e5m2)

/*
 * FERRO_FOR_EACH_KERNEL(X) calls X(OP, DT, dtype number, op number) for every kernel; the dtype
 * and op numbers are NCCL's (ncclDataType_t; sum 0, prod 1, max 2, min 3).
 */
#define FERRO_FOR_EACH_OP(X, DT, N) X(sum, DT, N, 0) X(prod, DT, N, 1) X(max, DT, N, 2) X(min, DT, N, 3)
#define FERRO_FOR_EACH_KERNEL(X)                                                                \
    FERRO_FOR_EACH_OP(X, i8, 0) FERRO_FOR_EACH_OP(X, u8, 1) FERRO_FOR_EACH_OP(X, i32, 2)        \
    FERRO_FOR_EACH_OP(X, u32, 3) FERRO_FOR_EACH_OP(X, i64, 4) FERRO_FOR_EACH_OP(X, u64, 5)      \
    FERRO_FOR_EACH_OP(X, f16, 6) FERRO_FOR_EACH_OP(X, f32, 7) FERRO_FOR_EACH_OP(X, f64, 8)      \
    FERRO_FOR_EACH_OP(X, bf16, 9) FERRO_FOR_EACH_OP(X, fp8e4m3, 10)                             \
    FERRO_FOR_EACH_OP(X, fp8e5m2, 11)

#endif /* FERRO_REDUCE_H */
