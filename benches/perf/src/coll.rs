//! The collectives the perf tools measure, the reduction ops they name, and how a byte size
//! becomes buffer lengths for each collective (nccl-tests' `getCollByteCount`).

use std::fmt;

/// A collective measured by one of the `*_perf` tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Coll {
    /// Every rank ends with the reduction of all inputs (`all_reduce_perf`).
    AllReduce,
    /// Every rank ends with every rank's input, in rank order (`all_gather_perf`).
    AllGather,
    /// Every rank ends with the root's input (`broadcast_perf`).
    Broadcast,
    /// The root ends with the reduction of all inputs (`reduce_perf`).
    Reduce,
    /// Rank r ends with block r of the reduction of all inputs (`reduce_scatter_perf`).
    ReduceScatter,
    /// Rank r sends block p of its input to rank p and receives rank p's block r into
    /// block p (`alltoall_perf`).
    AllToAll,
    /// Ring shift: rank r sends its buffer to rank r+1 and receives from rank r-1, modulo
    /// nranks (`sendrecv_perf`).
    SendRecv,
    /// The root ends with every rank's input, in rank order (`gather_perf`).
    Gather,
    /// Rank r ends with block r of the root's input (`scatter_perf`).
    Scatter,
    /// An all-gather done as log2(nranks) pairwise exchanges; needs a power-of-two nranks
    /// (`hypercube_perf`).
    HyperCube,
}

impl Coll {
    /// Every collective.
    pub const ALL: [Coll; 10] = [
        Coll::AllReduce,
        Coll::AllGather,
        Coll::Broadcast,
        Coll::Reduce,
        Coll::ReduceScatter,
        Coll::AllToAll,
        Coll::SendRecv,
        Coll::Gather,
        Coll::Scatter,
        Coll::HyperCube,
    ];

    /// Short name (`all_reduce`, `alltoall`, ...), as in the nccl-tests program names.
    pub const fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::AllGather => "all_gather",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::AllToAll => "alltoall",
            Coll::SendRecv => "sendrecv",
            Coll::Gather => "gather",
            Coll::Scatter => "scatter",
            Coll::HyperCube => "hypercube",
        }
    }

    /// The program name nccl-tests gives this tool (`all_reduce_perf`, ...).
    pub fn program_name(self) -> String {
        format!("{}_perf", self.name())
    }

    /// Parses a name with or without the `_perf` suffix; underscores are optional
    /// (`allreduce`, `all_reduce_perf`, `all_to_all`).
    pub fn parse(s: &str) -> Option<Coll> {
        let s = s.to_ascii_lowercase();
        let s = s.strip_suffix("_perf").unwrap_or(&s);
        let squashed: String = s.chars().filter(|c| *c != '_' && *c != '-').collect();
        Coll::ALL
            .into_iter()
            .find(|c| c.name().replace('_', "") == squashed)
            .or_else(|| (squashed == "alltoall" || squashed == "a2a").then_some(Coll::AllToAll))
    }

    /// Whether the collective reduces (and so has a reduction op column).
    pub const fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::Reduce | Coll::ReduceScatter)
    }

    /// Whether the collective has a root (and so loops over roots with `-r all`).
    pub const fn rooted(self) -> bool {
        matches!(
            self,
            Coll::Broadcast | Coll::Reduce | Coll::Gather | Coll::Scatter
        )
    }

    /// Whether the collective can run with `nranks` ranks (hypercube needs a power of two).
    pub const fn supports_nranks(self, nranks: usize) -> bool {
        match self {
            Coll::HyperCube => nranks.is_power_of_two(),
            _ => nranks > 0,
        }
    }

    /// Buffer lengths, in elements, for a test of `count = bytes / elem_size` elements, with
    /// nccl-tests' rounding: per-rank blocks of all_gather, reduce_scatter, alltoall, gather
    /// and scatter are rounded down to a multiple of 16 bytes; hypercube's to a multiple of
    /// 4 elements.
    pub fn layout(self, count: usize, elem_size: usize, nranks: usize) -> Layout {
        let nranks = nranks.max(1);
        // Elements per 16-byte line (every element size divides 16).
        let line = (16 / elem_size.clamp(1, 16)).max(1);
        let block = (count / nranks) / line * line;
        match self {
            Coll::AllReduce | Coll::Broadcast | Coll::Reduce | Coll::SendRecv => Layout {
                send_count: count,
                recv_count: count,
                param_count: count,
                send_inplace_offset: 0,
                recv_inplace_offset: 0,
            },
            Coll::AllGather | Coll::Gather => Layout {
                send_count: block,
                recv_count: block * nranks,
                param_count: block,
                send_inplace_offset: block,
                recv_inplace_offset: 0,
            },
            Coll::HyperCube => {
                let base = count / (4 * nranks) * 4;
                Layout {
                    send_count: base,
                    recv_count: base * nranks,
                    param_count: base,
                    send_inplace_offset: base,
                    recv_inplace_offset: 0,
                }
            }
            Coll::ReduceScatter | Coll::Scatter => Layout {
                send_count: block * nranks,
                recv_count: block,
                param_count: block,
                send_inplace_offset: 0,
                recv_inplace_offset: block,
            },
            Coll::AllToAll => Layout {
                send_count: block * nranks,
                recv_count: block * nranks,
                param_count: block,
                send_inplace_offset: 0,
                recv_inplace_offset: 0,
            },
        }
    }
}

impl fmt::Display for Coll {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Buffer lengths of one test, in elements (nccl-tests' `getCollByteCount`).
///
/// In place, one buffer of `max(send_count, recv_count)` elements holds both: the input
/// starts at element `send_inplace_offset * rank` and the output at
/// `recv_inplace_offset * rank` (NCCL's in-place layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Layout {
    /// Elements in each rank's send buffer.
    pub send_count: usize,
    /// Elements in each rank's receive buffer.
    pub recv_count: usize,
    /// The `count` argument of the collective call (NCCL's meaning: per-rank block for
    /// all_gather, reduce_scatter, alltoall, gather, scatter).
    pub param_count: usize,
    /// In place, the input of rank r starts at element `send_inplace_offset * r`.
    pub send_inplace_offset: usize,
    /// In place, the output of rank r starts at element `recv_inplace_offset * r`.
    pub recv_inplace_offset: usize,
}

impl Layout {
    /// Elements of the single in-place buffer.
    pub fn inplace_count(&self) -> usize {
        self.send_count.max(self.recv_count)
    }

    /// The size column of the table: `max(send, recv)` in bytes.
    pub fn reported_bytes(&self, elem_size: usize) -> usize {
        self.inplace_count() * elem_size
    }

    /// The buffer lengths of a call with NCCL's `count` (the inverse of [`Coll::layout`]'s
    /// rounding: what a communicator needs to check the buffers it is given).
    pub fn for_call(coll: Coll, count: usize, nranks: usize) -> Layout {
        let n = nranks.max(1);
        match coll {
            Coll::AllReduce | Coll::Broadcast | Coll::Reduce | Coll::SendRecv => Layout {
                send_count: count,
                recv_count: count,
                param_count: count,
                send_inplace_offset: 0,
                recv_inplace_offset: 0,
            },
            Coll::AllGather | Coll::Gather | Coll::HyperCube => Layout {
                send_count: count,
                recv_count: count * n,
                param_count: count,
                send_inplace_offset: count,
                recv_inplace_offset: 0,
            },
            Coll::ReduceScatter | Coll::Scatter => Layout {
                send_count: count * n,
                recv_count: count,
                param_count: count,
                send_inplace_offset: 0,
                recv_inplace_offset: count,
            },
            Coll::AllToAll => Layout {
                send_count: count * n,
                recv_count: count * n,
                param_count: count,
                send_inplace_offset: 0,
                recv_inplace_offset: 0,
            },
        }
    }
}

/// A reduction op as the perf tools name it (`-o`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PerfOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Sum divided by nranks.
    Avg,
    /// Sum of each rank's input multiplied by that rank's scalar
    /// ([`PerfOp::premul_scalar`]).
    PreMulSum,
}

impl PerfOp {
    /// Every op, in nccl-tests' order (the order of `-o all`).
    pub const ALL: [PerfOp; 6] = [
        PerfOp::Sum,
        PerfOp::Prod,
        PerfOp::Max,
        PerfOp::Min,
        PerfOp::Avg,
        PerfOp::PreMulSum,
    ];

    /// Name as nccl-tests prints it in the `redop` column (`mulsum` for the pre-multiplied
    /// sum).
    pub const fn name(self) -> &'static str {
        match self {
            PerfOp::Sum => "sum",
            PerfOp::Prod => "prod",
            PerfOp::Max => "max",
            PerfOp::Min => "min",
            PerfOp::Avg => "avg",
            PerfOp::PreMulSum => "mulsum",
        }
    }

    /// Parses `sum`, `prod`, `max`, `min`, `avg`, `mulsum` or `premulsum` (any case).
    pub fn parse(s: &str) -> Option<PerfOp> {
        let op = match s.to_ascii_lowercase().as_str() {
            "sum" => PerfOp::Sum,
            "prod" | "product" => PerfOp::Prod,
            "max" => PerfOp::Max,
            "min" => PerfOp::Min,
            "avg" | "average" => PerfOp::Avg,
            "mulsum" | "premulsum" | "premul_sum" => PerfOp::PreMulSum,
            _ => return None,
        };
        Some(op)
    }

    /// The element-wise op the reduction is built on: avg and the pre-multiplied sum are a
    /// sum plus a scaling pass.
    pub const fn elem_op(self) -> ferroccl::ElemOp {
        match self {
            PerfOp::Sum | PerfOp::Avg | PerfOp::PreMulSum => ferroccl::ElemOp::Sum,
            PerfOp::Prod => ferroccl::ElemOp::Prod,
            PerfOp::Max => ferroccl::ElemOp::Max,
            PerfOp::Min => ferroccl::ElemOp::Min,
        }
    }

    /// The scalar rank `rank` multiplies its input by for [`PerfOp::PreMulSum`]: 1 on even
    /// ranks, 2 on odd ranks (exact in every data type).
    pub const fn premul_scalar(rank: usize) -> u8 {
        1 + (rank % 2) as u8
    }
}

impl fmt::Display for PerfOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        for c in Coll::ALL {
            assert_eq!(Coll::parse(c.name()), Some(c));
            assert_eq!(Coll::parse(&c.program_name()), Some(c));
        }
        assert_eq!(Coll::parse("allreduce"), Some(Coll::AllReduce));
        assert_eq!(Coll::parse("all_to_all"), Some(Coll::AllToAll));
        assert_eq!(Coll::parse("reduce-scatter"), Some(Coll::ReduceScatter));
        assert_eq!(Coll::parse("allgatherv"), None);
        for op in PerfOp::ALL {
            assert_eq!(PerfOp::parse(op.name()), Some(op));
        }
        assert_eq!(PerfOp::parse("premulsum"), Some(PerfOp::PreMulSum));
        assert_eq!(PerfOp::parse("xor"), None);
    }

    #[test]
    fn layouts_follow_nccl_tests() {
        // all_reduce: everything is `count`.
        let l = Coll::AllReduce.layout(1000, 4, 3);
        assert_eq!(
            (l.send_count, l.recv_count, l.param_count),
            (1000, 1000, 1000)
        );
        // all_gather with floats, 3 ranks, 1000 elements: 333 per rank rounded down to a
        // multiple of 4 floats (16 bytes) = 332.
        let l = Coll::AllGather.layout(1000, 4, 3);
        assert_eq!(
            l,
            Layout {
                send_count: 332,
                recv_count: 996,
                param_count: 332,
                send_inplace_offset: 332,
                recv_inplace_offset: 0
            }
        );
        assert_eq!(l.reported_bytes(4), 3984);
        // reduce_scatter with doubles: 1000/3 = 333 -> multiple of 2 = 332.
        let l = Coll::ReduceScatter.layout(1000, 8, 3);
        assert_eq!(
            (
                l.send_count,
                l.recv_count,
                l.param_count,
                l.recv_inplace_offset
            ),
            (996, 332, 332, 332)
        );
        // alltoall with int8: 1000/8 = 125 -> multiple of 16 = 112.
        let l = Coll::AllToAll.layout(1000, 1, 8);
        assert_eq!((l.send_count, l.recv_count, l.param_count), (896, 896, 112));
        // scatter mirrors reduce_scatter, gather mirrors all_gather.
        assert_eq!(
            Coll::Scatter.layout(77, 2, 2),
            Coll::ReduceScatter.layout(77, 2, 2)
        );
        assert_eq!(
            Coll::Gather.layout(77, 2, 2),
            Coll::AllGather.layout(77, 2, 2)
        );
        // hypercube: count/(4n)*4.
        let l = Coll::HyperCube.layout(1000, 4, 4);
        assert_eq!((l.send_count, l.recv_count), (248, 992));
        // Tiny sizes give empty blocks rather than dividing by zero.
        assert_eq!(Coll::AllGather.layout(2, 4, 8).recv_count, 0);
        assert_eq!(Coll::AllGather.layout(2, 4, 0).param_count, 0);
    }

    #[test]
    fn classification() {
        assert!(Coll::Reduce.reduces() && Coll::Reduce.rooted());
        assert!(!Coll::AllGather.reduces() && !Coll::AllGather.rooted());
        assert!(Coll::HyperCube.supports_nranks(8) && !Coll::HyperCube.supports_nranks(6));
        assert_eq!(PerfOp::premul_scalar(0), 1);
        assert_eq!(PerfOp::premul_scalar(3), 2);
    }
}
