//! The host reducer: SIMD kernels of `ferroccl-kernels` on host memory.

use ferroccl_kernels::{DataType, ElemOp};
use ferroccl_transport::{Error, MemSpace, Payload, PayloadMut, Result};

use super::Reducer;

/// Reduces host memory with the CPU's SIMD kernels (scalar where the CPU has none).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct HostReducer;

const NAME: &str = "host reducer";

fn unserved(space: MemSpace) -> Error {
    Error::internal(format!(
        "{NAME}: cannot reach {space} memory (a reducer serving that space must run this step)"
    ))
}

/// The host bytes of a read operand.
fn host(p: Payload<'_>) -> Result<&[u8]> {
    match p {
        Payload::Host(b) => Ok(b),
        Payload::Device(m) => Err(unserved(m.space)),
    }
}

/// The host bytes of a written operand.
fn host_mut(p: PayloadMut<'_>) -> Result<&mut [u8]> {
    match p {
        PayloadMut::Host(b) => Ok(b),
        PayloadMut::Device(m) => Err(unserved(m.space)),
    }
}

/// Checks that every operand length equals `len` and is a whole number of `dtype` elements.
fn check_lens(dtype: Option<DataType>, len: usize, others: &[usize]) -> Result<()> {
    if others.iter().any(|&l| l != len) {
        return Err(Error::internal(format!(
            "{NAME}: operand lengths differ ({len} and {others:?} bytes)"
        )));
    }
    if let Some(d) = dtype {
        if !len.is_multiple_of(d.size()) {
            return Err(Error::internal(format!(
                "{NAME}: {len} bytes is not a whole number of {d} elements"
            )));
        }
    }
    Ok(())
}

impl Reducer for HostReducer {
    fn name(&self) -> &'static str {
        "host"
    }

    fn serves(&self, space: MemSpace) -> bool {
        space == MemSpace::Host
    }

    fn reduce(
        &self,
        dtype: DataType,
        op: ElemOp,
        dst: PayloadMut<'_>,
        a: Payload<'_>,
        b: Payload<'_>,
    ) -> Result<()> {
        let (dst, a, b) = (host_mut(dst)?, host(a)?, host(b)?);
        check_lens(Some(dtype), dst.len(), &[a.len(), b.len()])?;
        ferroccl_kernels::reduce(dtype, op, dst, a, b);
        Ok(())
    }

    fn reduce_inplace(
        &self,
        dtype: DataType,
        op: ElemOp,
        dst: PayloadMut<'_>,
        src: Payload<'_>,
    ) -> Result<()> {
        let (dst, src) = (host_mut(dst)?, host(src)?);
        check_lens(Some(dtype), dst.len(), &[src.len()])?;
        ferroccl_kernels::reduce_inplace(dtype, op, dst, src);
        Ok(())
    }

    fn scale_into(
        &self,
        dtype: DataType,
        dst: PayloadMut<'_>,
        src: Payload<'_>,
        factor: f64,
    ) -> Result<()> {
        let (dst, src) = (host_mut(dst)?, host(src)?);
        check_lens(Some(dtype), dst.len(), &[src.len()])?;
        ferroccl_kernels::scale_into(dtype, dst, src, factor);
        Ok(())
    }

    fn divide(&self, dtype: DataType, buf: PayloadMut<'_>, n: u64) -> Result<()> {
        let buf = host_mut(buf)?;
        check_lens(Some(dtype), buf.len(), &[])?;
        if n == 0 {
            return Err(Error::internal(format!("{NAME}: divide by 0 ranks")));
        }
        ferroccl_kernels::divide(dtype, buf, n);
        Ok(())
    }

    fn copy(&self, dst: PayloadMut<'_>, src: Payload<'_>) -> Result<()> {
        let (dst, src) = (host_mut(dst)?, host(src)?);
        check_lens(None, dst.len(), &[src.len()])?;
        dst.copy_from_slice(src);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroccl_kernels::{as_bytes, as_bytes_mut};
    use ferroccl_transport::MemRef;

    #[test]
    fn host_steps_match_the_kernels() {
        let r = HostReducer;
        let a = [1.0f32, 2.0, 3.0];
        let b = [10.0f32, 20.0, 30.0];
        let mut d = [0.0f32; 3];
        let f32_ = DataType::Float32;
        r.reduce(
            f32_,
            ElemOp::Sum,
            PayloadMut::Host(as_bytes_mut(&mut d)),
            Payload::Host(as_bytes(&a)),
            Payload::Host(as_bytes(&b)),
        )
        .unwrap();
        assert_eq!(d, [11.0, 22.0, 33.0]);
        r.reduce_inplace(
            f32_,
            ElemOp::Max,
            PayloadMut::Host(as_bytes_mut(&mut d)),
            Payload::Host(as_bytes(&[12.0f32, 0.0, 40.0])),
        )
        .unwrap();
        assert_eq!(d, [12.0, 22.0, 40.0]);
        r.scale_into(
            f32_,
            PayloadMut::Host(as_bytes_mut(&mut d)),
            Payload::Host(as_bytes(&a)),
            0.5,
        )
        .unwrap();
        assert_eq!(d, [0.5, 1.0, 1.5]);
        let mut i = [7i32, -7, 9];
        r.divide(DataType::Int32, PayloadMut::Host(as_bytes_mut(&mut i)), 2)
            .unwrap();
        assert_eq!(i, [3, -3, 4]);
        r.copy(
            PayloadMut::Host(as_bytes_mut(&mut d)),
            Payload::Host(as_bytes(&b)),
        )
        .unwrap();
        assert_eq!(d, b);
    }

    #[test]
    fn host_rejects_device_memory_and_bad_lengths() {
        let r = HostReducer;
        assert!(r.serves(MemSpace::Host) && !r.serves(MemSpace::Cuda(0)));
        let dev = MemRef {
            space: MemSpace::Cuda(0),
            addr: 0x1000,
            len: 8,
        };
        let mut d = [0u8; 8];
        let e = r
            .reduce_inplace(
                DataType::Float32,
                ElemOp::Sum,
                PayloadMut::Host(&mut d),
                Payload::Device(dev),
            )
            .unwrap_err();
        assert!(e.message().contains("cuda"), "{e}");
        let e = r
            .reduce_inplace(
                DataType::Float32,
                ElemOp::Sum,
                PayloadMut::Host(&mut d[..6]),
                Payload::Host(&[0u8; 6]),
            )
            .unwrap_err();
        assert!(e.message().contains("whole number"), "{e}");
        assert!(r
            .divide(DataType::Float32, PayloadMut::Host(&mut d), 0)
            .is_err());
    }
}
