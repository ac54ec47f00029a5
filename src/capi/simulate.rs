//! `ncclGroupSimulateEnd`: ends a group without running it and answers with ferroccl's own
//! estimate of its time, from the tuner's cost model (src/plan: alpha-beta per link, with
//! the corrections `FERRO_TUNE=measure` measured), for the algorithm each call would run.
//!
//! Operations of one communicator run one after another, so their times add up; the
//! sends and receives of a group run together (the slowest counts); communicators run at
//! the same time (the slowest counts). Gather and scatter are the root's messages, one after
//! another. The time is in microseconds.

use super::error::guard;
use super::group;
use super::ops::Op;
use super::types::*;
use crate::{Communicator, Error, Result};

/// Estimated microseconds of `ops` on `comm`.
fn estimate(comm: &Communicator, ops: &[Op]) -> f64 {
    let mut serial = 0.0;
    let mut p2p: f64 = 0.0;
    for op in ops {
        match *op {
            Op::Coll {
                kind, count, dtype, ..
            } => serial += comm.estimate_us(kind, count, dtype),
            Op::Rooted {
                root, count, dtype, ..
            } => {
                let block = count * dtype.size();
                let rank = comm.rank();
                serial += if rank == root {
                    (0..comm.nranks())
                        .filter(|&p| p != root)
                        .map(|p| comm.estimate_p2p_us(p, block))
                        .sum()
                } else {
                    comm.estimate_p2p_us(root, block)
                };
            }
            Op::Send {
                count, dtype, peer, ..
            }
            | Op::Recv {
                count, dtype, peer, ..
            } => {
                p2p = p2p.max(comm.estimate_p2p_us(peer, count * dtype.size()));
            }
            Op::Split { .. } => {}
        }
    }
    serial + p2p
}

fn simulate_end() -> Result<Option<f64>> {
    let Some(batches) = group::end_without_running()? else {
        return Ok(None);
    };
    let mut worst: f64 = 0.0;
    for (shared, ops) in &batches {
        // A communicator initialized inside the group is waited for, as ncclGroupEnd would.
        let comm = shared.wait_ready()?;
        worst = worst.max(estimate(&comm, ops));
    }
    Ok(Some(worst))
}

nccl_api! {
    /// Ends the group without running its operations and writes their estimated time
    /// (microseconds) to `simInfo->estimatedTime`.
    fn ncclGroupSimulateEnd / pncclGroupSimulateEnd(sim_info: *mut ncclSimInfo_t) -> ncclResult_t {
        const API: &str = "ncclGroupSimulateEnd";
        guard(API, || {
            super::api::check_out(API, "simInfo", sim_info)?;
            // SAFETY: non-NULL; the caller's struct starts with the 16-byte size/magic/version.
            let (size, magic) = unsafe { ((*sim_info).size, (*sim_info).magic) };
            let need = std::mem::size_of::<ncclSimInfo_t>();
            if magic != NCCL_SIM_INFO_MAGIC || size < need {
                // The group still ends, as NCCL's does, so the thread is not left inside it.
                let _ = group::end_without_running();
                return Err(Error::invalid_argument(format!(
                    "{API}: simInfo has size {size} and magic {magic:#x} (expected at least \
                     {need} and {NCCL_SIM_INFO_MAGIC:#x}); initialize it with \
                     NCCL_SIM_INFO_INITIALIZER"
                )));
            }
            if let Some(us) = simulate_end()? {
                // SAFETY: checked: the caller's struct is at least our size.
                unsafe { (*sim_info).estimatedTime = us as f32 };
            }
            Ok(ncclSuccess)
        })
    }
}
