//! Matching the sends and receives of all ranks into messages (4.).

use super::locate;
use crate::coll::{Op, Schedule};

/// (unused for copies): `partners[rank][step][op]`.
pub(super) type Partners = Vec<Vec<Vec<(usize, usize)>>>;

/// FIFO matching per ordered pair of ranks (4.).
pub(super) fn match_messages(n: usize, scheds: &[Schedule]) -> Result<Partners, String> {
    // (step, op, len) of the sends from a to b at index a * n + b, and of the receives at b
    // from a at the same index.
    let mut sends: Vec<Vec<(usize, usize, usize)>> = vec![Vec::new(); n * n];
    let mut recvs: Vec<Vec<(usize, usize, usize)>> = vec![Vec::new(); n * n];
    let mut partners: Partners = Vec::with_capacity(n);
    for s in scheds {
        let r = s.rank;
        for (t, step) in s.steps.iter().enumerate() {
            for (i, op) in step.ops.iter().enumerate() {
                match *op {
                    Op::Send { peer, src } => sends[r * n + peer].push((t, i, src.len)),
                    Op::Recv { peer, dst } | Op::RecvReduce { peer, dst, .. } => {
                        recvs[peer * n + r].push((t, i, dst.len))
                    }
                    Op::Copy { .. } => {}
                }
            }
        }
        partners.push(
            s.steps
                .iter()
                .map(|st| vec![(usize::MAX, usize::MAX); st.ops.len()])
                .collect(),
        );
    }
    for a in 0..n {
        for b in 0..n {
            let (ss, rs) = (&sends[a * n + b], &recvs[a * n + b]);
            for (k, (&(st, si, sl), &(rt, ri, rl))) in ss.iter().zip(rs).enumerate() {
                if sl != rl {
                    return Err(format!(
                        "message {k} from rank {a} to rank {b}: {} sends {sl} elements but {} \
                         receives {rl}",
                        locate(a, st, si, &scheds[a].steps[st].ops[si]),
                        locate(b, rt, ri, &scheds[b].steps[rt].ops[ri])
                    ));
                }
                partners[a][st][si] = (b, rt);
                partners[b][rt][ri] = (a, st);
            }
            if ss.len() > rs.len() {
                let (t, i, _) = ss[rs.len()];
                return Err(format!(
                    "rank {a} sends {} messages to rank {b}, which receives {}; first unmatched: \
                     {}",
                    ss.len(),
                    rs.len(),
                    locate(a, t, i, &scheds[a].steps[t].ops[i])
                ));
            }
            if rs.len() > ss.len() {
                let (t, i, _) = rs[ss.len()];
                return Err(format!(
                    "rank {b} receives {} messages from rank {a}, which sends {}; first \
                     unmatched: {}",
                    rs.len(),
                    ss.len(),
                    locate(b, t, i, &scheds[b].steps[t].ops[i])
                ));
            }
        }
    }
    Ok(partners)
}
