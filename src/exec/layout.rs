//! Resolving a schedule's spans to the call's memory, bounds checked.

use ferroccl_transport::{MemRef, MemSpace, Result};

use super::step::{OpContext, RawOp};
use super::Memory;
use crate::coll::{BufKind, Op, Span};

/// Resolves spans to memory.
pub(super) struct Layout {
    pub(super) es: usize,
    /// Scratch bytes.
    pub(super) scratch_len: usize,
    pub(super) in_off: usize,
    pub(super) out_off: usize,
    pub(super) mem: Memory,
    pub(super) scratch: *mut u8,
}

impl Layout {
    /// Start pointer and byte length of `span`, after checking it lies in its buffer.
    pub(super) fn resolve(&self, span: &Span, ctx: &OpContext) -> Result<(*mut u8, usize)> {
        let (limit, base, off) = match span.buf {
            BufKind::Input if self.mem.in_place => {
                (self.mem.output_len, self.mem.output, self.in_off)
            }
            BufKind::Input => (self.mem.input_len, self.mem.input as *mut u8, 0),
            BufKind::Output => (self.mem.output_len, self.mem.output, self.out_off),
            BufKind::Scratch => (self.scratch_len, self.scratch, 0),
        };
        let start = (off + span.offset) * self.es;
        let len = span.len * self.es;
        if start + len > limit {
            return Err(ferroccl_transport::Error::internal(format!(
                "{}: schedule span {:?} {}..{} lies outside the buffer of {} bytes",
                ctx.label(),
                span.buf,
                span.offset,
                span.end(),
                limit
            )));
        }
        // `start + len <= limit`, the length of the buffer (caller-checked) or of the
        // engine's scratch; device addresses are only carried, never dereferenced here.
        Ok((base.wrapping_add(start), len))
    }

    /// `span` as memory of the call's space.
    fn mem_ref(&self, span: &Span, ctx: &OpContext) -> Result<MemRef> {
        let (p, len) = self.resolve(span, ctx)?;
        Ok(MemRef {
            space: self.mem.space,
            addr: p as usize,
            len,
        })
    }

    pub(super) fn raw_op(&self, op: &Op, ctx: &OpContext) -> Result<RawOp> {
        if self.mem.space != MemSpace::Host {
            return self.device_op(op, ctx);
        }
        Ok(match *op {
            Op::Send { peer, src } => {
                let (p, len) = self.resolve(&src, ctx)?;
                RawOp::Send {
                    peer,
                    ptr: p,
                    len,
                    header: ctx.header(len),
                }
            }
            Op::Recv { peer, dst } => {
                let (p, len) = self.resolve(&dst, ctx)?;
                RawOp::Recv {
                    peer,
                    ptr: p,
                    len,
                    header: ctx.header(len),
                }
            }
            Op::RecvReduce { peer, src, dst } => {
                let (s, len) = self.resolve(&src, ctx)?;
                let (d, _) = self.resolve(&dst, ctx)?;
                RawOp::RecvReduce {
                    peer,
                    src: s,
                    dst: d,
                    len,
                    header: ctx.header(len),
                }
            }
            Op::Copy { .. } => {
                return Err(ferroccl_transport::Error::internal(
                    "copy is not a communication op",
                ))
            }
        })
    }

    /// [`Layout::raw_op`] on device memory: the transports move it themselves; a receive-reduce
    /// lands in a stage buffer the engine assigns (`stage` names only its length here).
    fn device_op(&self, op: &Op, ctx: &OpContext) -> Result<RawOp> {
        Ok(match *op {
            Op::Send { peer, src } => {
                let mem = self.mem_ref(&src, ctx)?;
                RawOp::SendDevice {
                    peer,
                    mem,
                    header: ctx.header(mem.len),
                }
            }
            Op::Recv { peer, dst } => {
                let mem = self.mem_ref(&dst, ctx)?;
                RawOp::RecvDevice {
                    peer,
                    mem,
                    header: ctx.header(mem.len),
                }
            }
            Op::RecvReduce { peer, src, dst } => {
                let src = self.mem_ref(&src, ctx)?;
                let dst = self.mem_ref(&dst, ctx)?;
                RawOp::RecvReduceDevice {
                    peer,
                    src,
                    dst,
                    stage: MemRef {
                        space: self.mem.space,
                        addr: 0,
                        len: src.len,
                    },
                    header: ctx.header(src.len),
                }
            }
            Op::Copy { .. } => {
                return Err(ferroccl_transport::Error::internal(
                    "copy is not a communication op",
                ))
            }
        })
    }
}
