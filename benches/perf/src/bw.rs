//! Algorithm and bus bandwidth, with nccl-tests' conventions.
//!
//! `algbw = bytes / time`, where `bytes` is the data one rank's call is about:
//!
//! | collective                                   | bytes                     | busbw factor |
//! |----------------------------------------------|---------------------------|--------------|
//! | all_reduce                                   | count * size              | 2(n-1)/n     |
//! | all_gather, reduce_scatter, alltoall, gather, scatter | count * size * n | (n-1)/n      |
//! | broadcast, reduce, sendrecv                  | count * size              | 1            |
//! | hypercube                                    | count * size * (n-1)      | 1            |
//!
//! `count` is the collective's `count` argument ([`crate::Layout::param_count`]) and `n`
//! is nranks. Bandwidths are in GB/s (10^9 bytes per second).

use crate::coll::Coll;

/// Algorithm and bus bandwidth of one measurement, in GB/s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bandwidth {
    /// Bytes the call is about, divided by the time.
    pub algbw: f64,
    /// `algbw` times the collective's bus factor: comparable to the link speed.
    pub busbw: f64,
}

/// The factor turning algorithm bandwidth into bus bandwidth for `coll` on `nranks` ranks.
pub fn bus_factor(coll: Coll, nranks: usize) -> f64 {
    let n = nranks as f64;
    match coll {
        Coll::AllReduce => 2.0 * (n - 1.0) / n,
        Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll | Coll::Gather | Coll::Scatter => {
            (n - 1.0) / n
        }
        Coll::Broadcast | Coll::Reduce | Coll::SendRecv | Coll::HyperCube => 1.0,
    }
}

/// The bytes algbw is computed from, for a call with `count` (NCCL's meaning) elements of
/// `elem_size` bytes.
pub fn alg_bytes(coll: Coll, count: usize, elem_size: usize, nranks: usize) -> f64 {
    let bytes = (count * elem_size) as f64;
    match coll {
        Coll::AllReduce | Coll::Broadcast | Coll::Reduce | Coll::SendRecv => bytes,
        Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll | Coll::Gather | Coll::Scatter => {
            bytes * nranks as f64
        }
        Coll::HyperCube => bytes * nranks.saturating_sub(1) as f64,
    }
}

/// Bandwidths for one call of `coll` taking `seconds` (nccl-tests' `getBw`).
pub fn bandwidth(
    coll: Coll,
    count: usize,
    elem_size: usize,
    seconds: f64,
    nranks: usize,
) -> Bandwidth {
    let algbw = alg_bytes(coll, count, elem_size, nranks) / 1.0e9 / seconds;
    Bandwidth {
        algbw,
        busbw: algbw * bus_factor(coll, nranks),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_reduce_matches_nccl_tests_row() {
        // A published nccl-tests row: 16 ranks, 134217728 bytes of float, 5853.77 us ->
        // algbw 22.93, busbw 42.99.
        let bw = bandwidth(Coll::AllReduce, 33_554_432, 4, 5853.77e-6, 16);
        assert_eq!(format!("{:.2} {:.2}", bw.algbw, bw.busbw), "22.93 42.99");
    }

    #[test]
    fn factors_per_collective() {
        for n in 1..=8 {
            let nf = n as f64;
            assert_eq!(bus_factor(Coll::AllReduce, n), 2.0 * (nf - 1.0) / nf);
            for c in [
                Coll::AllGather,
                Coll::ReduceScatter,
                Coll::AllToAll,
                Coll::Gather,
                Coll::Scatter,
            ] {
                assert_eq!(bus_factor(c, n), (nf - 1.0) / nf, "{c} n={n}");
                assert_eq!(alg_bytes(c, 10, 4, n), 40.0 * nf, "{c} n={n}");
            }
            for c in [
                Coll::Broadcast,
                Coll::Reduce,
                Coll::SendRecv,
                Coll::HyperCube,
            ] {
                assert_eq!(bus_factor(c, n), 1.0, "{c} n={n}");
            }
            assert_eq!(alg_bytes(Coll::Broadcast, 10, 4, n), 40.0);
            assert_eq!(alg_bytes(Coll::HyperCube, 10, 4, n), 40.0 * (nf - 1.0));
        }
    }

    #[test]
    fn all_gather_counts_every_rank_block() {
        // 8 ranks, 1 MiB per rank in 1 ms: 8 MiB / 1 ms = 8.388608 GB/s algbw; busbw 7/8 of it.
        let bw = bandwidth(Coll::AllGather, 262_144, 4, 1e-3, 8);
        assert!((bw.algbw - 8.388608).abs() < 1e-9);
        assert!((bw.busbw - 8.388608 * 7.0 / 8.0).abs() < 1e-9);
    }
}
