//! Shrinking a communicator after ranks failed: the survivors build a new communicator
//! without them, meeting through the parent's store (no launcher, and no message to or from
//! the excluded ranks, so a dead rank cannot make it hang).

use std::time::Instant;

use crate::{Error, ErrorKind, Result};

use super::*;

impl Communicator {
    /// Builds a communicator of every rank not in `exclude`, renumbered in rank order (rank
    /// `r` becomes `r` minus the excluded ranks below it). Every surviving rank calls it with
    /// the same list; excluded ranks do not call it.
    ///
    /// It works on a failed or aborted communicator (that is what it is for): the survivors
    /// exchange their connection handles through the store this communicator was created
    /// with, never over its connections. The store's host must be alive (rank 0's process
    /// under `torchrun`-style launches and unique ids; the file store under `mpirun` and
    /// one-node `srun`). A survivor that does not call `shrink` makes the others fail after
    /// `FERRO_TIMEOUT`, with an error, instead of waiting forever.
    pub fn shrink(&self, exclude: &[usize]) -> Result<Communicator> {
        let inner = &self.inner;
        let (rank, n) = (inner.rank, inner.nranks);
        let mut excluded = exclude.to_vec();
        excluded.sort_unstable();
        excluded.dedup();
        if let Some(&bad) = excluded.iter().find(|&&r| r >= n) {
            return Err(Error::invalid_argument(format!(
                "shrink on rank {rank}: excluded rank {bad} is not in 0..{n}"
            )));
        }
        if excluded.binary_search(&rank).is_ok() {
            return Err(Error::invalid_argument(format!(
                "shrink on rank {rank}: this rank is in the exclude list {excluded:?}; only \
                 surviving ranks call shrink"
            )));
        }
        let survivors: Vec<usize> = (0..n)
            .filter(|r| excluded.binary_search(r).is_err())
            .collect();
        let new_rank = survivors
            .iter()
            .position(|&r| r == rank)
            .ok_or_else(|| Error::internal("shrink: this rank is not a survivor"))?;
        let store = inner.store.clone().ok_or_else(|| {
            Error::new(
                ErrorKind::Unsupported,
                format!("shrink on rank {rank}: the communicator has no store to meet through"),
            )
        })?;
        // Every survivor derives the same id: the parent's, how many splits and shrinks the
        // parent saw, and who is left out.
        let shrink_no = inner
            .splits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut words: Vec<u8> = Vec::with_capacity(8 * excluded.len());
        for r in &excluded {
            words.extend_from_slice(&(*r as u64).to_le_bytes());
        }
        let id = hash64(&[
            b"shrink",
            &inner.id.to_le_bytes(),
            &shrink_no.to_le_bytes(),
            &words,
        ]);
        let m = survivors.len();
        let descs: Vec<ferroccl_transport::RankDesc> =
            survivors.iter().map(|&r| inner.descs[r]).collect();
        let deadline = Instant::now() + inner.config.timeout;
        let prefix = format!("ferroccl/{id:016x}");
        let mut ex = init::StoreExchange {
            store: &*store,
            prefix: &prefix,
            rank: new_rank,
            nranks: m,
            deadline,
        };
        let (mut trs, order) = init::transports_for(&inner.config, inner.listen_ip);
        let setup = ferroccl_transport::SetupCtx {
            rank: new_rank,
            nranks: m,
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
        .map_err(|e| {
            e.context(format!(
                "shrink on rank {rank} (new rank {new_rank} of {m}, excluding {excluded:?})"
            ))
        })?;
        if inner.config.debug >= DebugLevel::Info {
            ferroccl_transport::log_line!(
                "ferroccl rank {rank} INIT: shrunk to {m} ranks (excluding {excluded:?}), now rank {new_rank}, id {id:016x}"
            );
        }
        let child = Self::from_parts(
            new_rank,
            m,
            id,
            inner.config.clone(),
            inner.listen_ip,
            mesh,
            descs,
            Some(store),
            inner.store_server.clone(),
        );
        // Measured link costs still hold; an engine busy with a stuck call is not waited for.
        if let Ok(parent) = inner.engine.try_lock() {
            lock(&child.inner.engine).inherit_calibration(&parent);
        }
        Ok(child)
    }

    /// Registers `len` bytes of host memory at `addr` with every connection whose transport
    /// needs registration (RDMA memory regions, IPC handles); the regions keep the
    /// registration alive until they are dropped. Transports that move bytes through their
    /// own buffers (shm, TCP) need none, and the list is empty.
    pub fn register_host(
        &self,
        addr: *const u8,
        len: usize,
    ) -> Result<Vec<ferroccl_transport::Region>> {
        let mem = ferroccl_transport::MemRef::host(addr, len);
        lock(&self.inner.engine)
            .register_all(mem)
            .map_err(|e| e.context(format!("registering {len} bytes at {addr:p}")))
    }

    /// The tuner's estimate, in microseconds, of a `kind` call of `count` elements of `dtype`
    /// on this communicator: the cost model (alpha-beta per link, with measured corrections
    /// under `FERRO_TUNE=measure`) for the algorithm the call would run.
    pub fn estimate_us(&self, kind: CollKind, count: usize, dtype: DataType) -> f64 {
        let algo = self.algorithm_for(kind, count, dtype);
        let engine = lock(&self.inner.engine);
        let (model, topo) = engine.model();
        model
            .corrected_cost(algo, kind, count * dtype.size(), topo)
            .0
    }

    /// The cost model's time, in microseconds, for one message of `bytes` to or from `peer`
    /// over the link that joins them.
    pub fn estimate_p2p_us(&self, peer: usize, bytes: usize) -> f64 {
        let engine = lock(&self.inner.engine);
        let Some(link) = engine.link_to(peer) else {
            return 0.0;
        };
        engine.model().0.link(link).time_us(bytes as f64)
    }
}
