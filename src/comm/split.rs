//! Splitting a communicator into sub-communicators.

use std::sync::atomic::Ordering;
use std::time::Instant;

use ferroccl_kernels::DataType;

use crate::coll::CollKind;
use crate::{Error, Result};

use super::*;

impl Communicator {
    /// Splits into sub-communicators: ranks passing the same `color` form one, ordered by
    /// `key` (then by rank). A rank passing `None` takes part but gets no communicator.
    /// Every rank must call it.
    pub fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Communicator>> {
        let inner = &self.inner;
        let n = inner.nranks;
        let mut mine = [0u8; 16];
        mine[..8].copy_from_slice(&color.map_or(-1i64, i64::from).to_le_bytes());
        mine[8..].copy_from_slice(&key.to_le_bytes());
        let mut all = vec![0u8; 16 * n];
        self.raw_collective(
            CollKind::AllGather,
            Some(&mine),
            &mut all,
            16,
            DataType::Uint8,
            ReduceOp::Sum,
        )?;
        let entry = |r: usize| {
            let mut c = [0u8; 8];
            let mut k = [0u8; 8];
            c.copy_from_slice(&all[16 * r..16 * r + 8]);
            k.copy_from_slice(&all[16 * r + 8..16 * r + 16]);
            (i64::from_le_bytes(c), i64::from_le_bytes(k))
        };
        let my_color = color.map_or(-1, i64::from);
        let mut members: Vec<usize> = (0..n)
            .filter(|&r| my_color >= 0 && entry(r).0 == my_color)
            .collect();
        members.sort_by_key(|&r| (entry(r).1, r));
        let new_rank = members.iter().position(|&r| r == inner.rank);
        let split_no = inner.splits.fetch_add(1, Ordering::Relaxed);
        let id = hash64(&[
            &inner.id.to_le_bytes(),
            &split_no.to_le_bytes(),
            &my_color.to_le_bytes(),
        ]);
        // The members' hosts are known from the parent: no exchange needed for them.
        let descs: Vec<ferroccl_transport::RankDesc> =
            members.iter().map(|&r| inner.descs[r]).collect();
        let deadline = Instant::now() + inner.config.timeout;
        let mut ex = ParentExchange {
            comm: self,
            members: &members,
        };
        let Some(new_rank) = new_rank else {
            // Not a member: take part in the members' exchanges with nothing to say.
            for _ in 0..mesh::ROUNDS {
                mesh::Exchange::allgather(&mut ex, "", &[])?;
            }
            return Ok(None);
        };
        let (mut trs, order) = init::transports_for(&inner.config, inner.listen_ip);
        let setup = ferroccl_transport::SetupCtx {
            rank: new_rank,
            nranks: members.len(),
            comm_id: id,
            ranks: &descs,
            deadline,
        };
        let mesh = mesh::connect_mesh(
            &setup,
            &mut trs,
            &order,
            &mut ex,
            &init::mesh_options(&inner.config),
        )
        .map_err(|e| e.context(format!("split on rank {}", inner.rank)))?;
        let child = Self::from_parts(
            new_rank,
            members.len(),
            id,
            inner.config.clone(),
            inner.listen_ip,
            mesh,
            descs,
            inner.store.clone(),
            None,
        );
        // The links are the parent's: so are their measured costs (FERRO_TUNE=measure).
        let parent = self.inner.engine.lock().unwrap_or_else(|p| p.into_inner());
        child
            .inner
            .engine
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .inherit_calibration(&parent);
        drop(parent);
        Ok(Some(child))
    }
}

/// Setup exchange through the parent communicator: an allgather over every parent rank (a
/// non-member contributes nothing), returned by rank of the new communicator.
struct ParentExchange<'a> {
    comm: &'a Communicator,
    /// Parent rank of each new rank.
    members: &'a [usize],
}

impl mesh::Exchange for ParentExchange<'_> {
    fn allgather(&mut self, _round: &str, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let n = self.comm.inner.nranks;
        let len = (mine.len() as u64).to_le_bytes();
        let mut lens = vec![0u8; 8 * n];
        self.comm.raw_collective(
            CollKind::AllGather,
            Some(&len),
            &mut lens,
            8,
            DataType::Uint8,
            ReduceOp::Sum,
        )?;
        let len_of = |r: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&lens[8 * r..8 * r + 8]);
            usize::try_from(u64::from_le_bytes(w)).unwrap_or(usize::MAX)
        };
        let width = (0..n).map(len_of).max().unwrap_or(0);
        if width > 1 << 20 {
            return Err(Error::internal(format!(
                "split: a rank sent {width} bytes of setup data"
            )));
        }
        let mut padded = vec![0u8; width];
        padded[..mine.len()].copy_from_slice(mine);
        let mut all = vec![0u8; width * n];
        self.comm.raw_collective(
            CollKind::AllGather,
            Some(&padded),
            &mut all,
            width,
            DataType::Uint8,
            ReduceOp::Sum,
        )?;
        Ok(self
            .members
            .iter()
            .map(|&r| all[width * r..width * r + len_of(r)].to_vec())
            .collect())
    }
}
