//! Reduction throughput on 64 MiB buffers.
//!
//! Throughput convention: **bytes of memory traffic**, i.e. bytes read plus bytes written.
//! `dst += src` over N-byte buffers counts 3N (read dst, read src, write dst); `dst = a + b`
//! counts 3N; `copy_from_slice` counts 2N (read, write). So the GB/s printed for a kernel and
//! for the copy are directly comparable as memory bandwidth. (For NCCL-style "algorithm
//! bandwidth" of an in-place reduce, divide the kernel figure by 3.)
//!
//! Groups:
//! * `f32_sum_64MiB`: f32 sum per ISA and the scalar reference, beside `copy_from_slice`.
//! * `sum_64MiB`: sum for a few other types.
//! * `dtype_op_8MiB`: every data type × op on 8 MiB buffers, beside `copy_from_slice` on the
//!   same buffers (`memcpy`), with short measurement times.
//! * `fp8_sum_8MiB`: fp8 e4m3 / e5m2 sum per ISA (`portable` is the element-by-element
//!   conversion through f32 that x86 used before it had fp8 kernels).
//!
//! Run: `cargo bench -p ferroccl-kernels --bench reduce` (a filter such as `dtype_op` runs
//! one group).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ferroccl_kernels::simd::{self, Isa};
use ferroccl_kernels::{as_bytes, as_bytes_mut, reference, DataType, ElemOp};

const BYTES: usize = 64 << 20;

fn f32_buffers() -> (Vec<f32>, Vec<f32>) {
    let n = BYTES / 4;
    let a: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 0.5).collect();
    let b: Vec<f32> = (0..n).map(|i| (i % 777) as f32 * 0.25).collect();
    (a, b)
}

fn bench_f32_sum(c: &mut Criterion) {
    let (mut a, b) = f32_buffers();
    let mut g = c.benchmark_group("f32_sum_64MiB");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));

    g.throughput(Throughput::Bytes(2 * BYTES as u64));
    g.bench_function("copy_from_slice", |bench| {
        bench.iter(|| as_bytes_mut(&mut a).copy_from_slice(black_box(as_bytes(&b))))
    });

    g.throughput(Throughput::Bytes(3 * BYTES as u64));
    g.bench_function("reduce_inplace", |bench| {
        bench.iter(|| {
            ferroccl_kernels::reduce_inplace(
                DataType::Float32,
                ElemOp::Sum,
                as_bytes_mut(&mut a),
                black_box(as_bytes(&b)),
            )
        })
    });
    for isa in Isa::supported() {
        g.bench_function(format!("reduce_inplace/{}", isa.name()), |bench| {
            bench.iter(|| {
                simd::reduce_inplace_with(
                    isa,
                    DataType::Float32,
                    ElemOp::Sum,
                    as_bytes_mut(&mut a),
                    black_box(as_bytes(&b)),
                )
            })
        });
    }
    g.bench_function("reduce_inplace/reference", |bench| {
        bench.iter(|| {
            reference::reduce_inplace(
                DataType::Float32,
                ElemOp::Sum,
                as_bytes_mut(&mut a),
                black_box(as_bytes(&b)),
            )
        })
    });

    let mut out = vec![0f32; a.len()];
    g.bench_function("reduce_3buf", |bench| {
        bench.iter(|| {
            ferroccl_kernels::reduce(
                DataType::Float32,
                ElemOp::Sum,
                as_bytes_mut(&mut out),
                black_box(as_bytes(&a)),
                black_box(as_bytes(&b)),
            )
        })
    });
    g.finish();
}

fn bench_other_dtypes(c: &mut Criterion) {
    let mut g = c.benchmark_group("sum_64MiB");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Bytes(3 * BYTES as u64));
    for dtype in [
        DataType::Float16,
        DataType::Bfloat16,
        DataType::Float64,
        DataType::Int32,
    ] {
        let mut a: Vec<u8> = (0..BYTES).map(|i| (i % 61) as u8).collect();
        let b: Vec<u8> = (0..BYTES).map(|i| (i % 53) as u8).collect();
        g.bench_function(dtype.name(), |bench| {
            bench.iter(|| {
                ferroccl_kernels::reduce_inplace(dtype, ElemOp::Sum, &mut a, black_box(&b))
            })
        });
    }
    g.finish();
}

/// Every data type × op on 8 MiB buffers (`out = a op b`, 3 × 8 MiB of traffic); the copy
/// between the same buffers (2 × 8 MiB) is the yardstick.
fn bench_dtype_op(c: &mut Criterion) {
    const SMALL: usize = 8 << 20;
    let mut g = c.benchmark_group("dtype_op_8MiB");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_millis(300));
    // Byte patterns that are valid, finite values in every type.
    // `out = a op b` with fixed inputs, so repeated products never drift into subnormals.
    let a: Vec<u8> = (0..SMALL).map(|i| (i % 61) as u8 & 0x3f).collect();
    let b: Vec<u8> = (0..SMALL).map(|i| (i % 53) as u8 & 0x3f).collect();
    let mut out = vec![0u8; SMALL];
    g.throughput(Throughput::Bytes(2 * SMALL as u64));
    g.bench_function("memcpy", |bench| {
        bench.iter(|| out.copy_from_slice(black_box(&a)))
    });
    g.throughput(Throughput::Bytes(3 * SMALL as u64));
    for dtype in DataType::ALL {
        for op in ElemOp::ALL {
            g.bench_function(format!("{}/{}", dtype.name(), op.name()), |bench| {
                bench.iter(|| {
                    ferroccl_kernels::reduce(dtype, op, &mut out, black_box(&a), black_box(&b))
                })
            });
        }
    }
    g.finish();
}

/// fp8 sum per instruction-set level on 8 MiB buffers (`out = a + b`, 3 × 8 MiB of traffic).
fn bench_fp8(c: &mut Criterion) {
    const SMALL: usize = 8 << 20;
    let mut g = c.benchmark_group("fp8_sum_8MiB");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_secs(1));
    // Every code, NaNs and subnormals included, in an order that pairs them differently.
    let a: Vec<u8> = (0..SMALL).map(|i| (i * 7) as u8).collect();
    let b: Vec<u8> = (0..SMALL).map(|i| (i * 13 + i / 256) as u8).collect();
    let mut out = vec![0u8; SMALL];
    g.throughput(Throughput::Bytes(3 * SMALL as u64));
    for dtype in [DataType::Float8E4M3, DataType::Float8E5M2] {
        for isa in Isa::supported() {
            g.bench_function(format!("{}/{}", dtype.name(), isa.name()), |bench| {
                bench.iter(|| {
                    simd::reduce_with(
                        isa,
                        dtype,
                        ElemOp::Sum,
                        &mut out,
                        black_box(&a),
                        black_box(&b),
                    )
                })
            });
        }
    }
    g.finish();
}

criterion_group!(
    benches,
    bench_f32_sum,
    bench_other_dtypes,
    bench_dtype_op,
    bench_fp8
);
criterion_main!(benches);
