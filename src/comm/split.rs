//! Splitting a communicator into sub-communicators.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Instant;

use ferroccl_kernels::DataType;
use ferroccl_transport_tcp::TcpEndpoint;

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
        let is_member = my_color >= 0;
        let new_rank = members.iter().position(|&r| r == inner.rank);
        let split_no = inner.splits.fetch_add(1, Ordering::Relaxed);
        let id = hash64(&[
            &inner.id.to_le_bytes(),
            &split_no.to_le_bytes(),
            &my_color.to_le_bytes(),
        ]);
        // The members' hosts are known from the parent: no exchange needed for them.
        let hosts: Vec<u64> = members.iter().map(|&r| inner.hosts[r]).collect();
        let deadline = Instant::now() + inner.config.timeout;
        let mc =
            new_rank.map(|nr| mesh_config(&inner.config, nr, members.len(), id, &hosts, deadline));
        // Members listen on a new endpoint and create their segments, and share the address
        // and segment name through the parent.
        let endpoint = if is_member {
            Some(TcpEndpoint::listen(inner.listen_ip)?)
        } else {
            None
        };
        let own = mc.as_ref().and_then(mesh::create_segment);
        const ADDR_LEN: usize = 64;
        const SEG_LEN: usize = 96;
        const CARD_LEN: usize = ADDR_LEN + SEG_LEN;
        let mut my_card = [0u8; CARD_LEN];
        if let Some(ep) = &endpoint {
            let s = ep.addr().to_string();
            my_card[..s.len()].copy_from_slice(s.as_bytes());
        }
        if let Some(seg) = &own {
            let n = seg.name().as_bytes();
            if n.len() <= SEG_LEN {
                my_card[ADDR_LEN..ADDR_LEN + n.len()].copy_from_slice(n);
            }
        }
        let mut cards = vec![0u8; CARD_LEN * n];
        self.raw_collective(
            CollKind::AllGather,
            Some(&my_card),
            &mut cards,
            CARD_LEN,
            DataType::Uint8,
            ReduceOp::Sum,
        )?;
        let text = |old: usize, from: usize, len: usize| -> String {
            let raw = &cards[CARD_LEN * old + from..CARD_LEN * old + from + len];
            let end = raw.iter().position(|&b| b == 0).unwrap_or(len);
            String::from_utf8_lossy(&raw[..end]).into_owned()
        };
        let mapped = match &mc {
            Some(mc) => {
                let name_of = |new_peer: usize| -> Result<Option<String>> {
                    Ok(Some(text(members[new_peer], ADDR_LEN, SEG_LEN)).filter(|s| !s.is_empty()))
                };
                mesh::map_segments(mc, own.as_ref(), &name_of)?
            }
            None => Vec::new(),
        };
        // Which parent ranks' segments each rank mapped, as a bitmap over parent ranks.
        let bitmap_len = n.div_ceil(8);
        let mut my_bits = vec![0u8; bitmap_len];
        for new_peer in mesh::mapped_ranks(&mapped) {
            let old = members[new_peer];
            my_bits[old / 8] |= 1 << (old % 8);
        }
        let mut bits = vec![0u8; bitmap_len * n];
        self.raw_collective(
            CollKind::AllGather,
            Some(&my_bits),
            &mut bits,
            bitmap_len,
            DataType::Uint8,
            ReduceOp::Sum,
        )?;
        let (Some(endpoint), Some(mc)) = (endpoint, mc) else {
            return Ok(None);
        };
        let me = inner.rank;
        let peer_mapped_me = |new_peer: usize| -> Result<bool> {
            let old = members[new_peer];
            Ok(bits[bitmap_len * old + me / 8] & (1 << (me % 8)) != 0)
        };
        let addr_of = |new_peer: usize| -> Result<SocketAddr> {
            let old = members[new_peer];
            let s = text(old, 0, ADDR_LEN);
            s.parse()
                .map_err(|_| Error::internal(format!("split: rank {old} sent a bad address {s:?}")))
        };
        let mesh = mesh::connect_all(&mc, &endpoint, &addr_of, own, mapped, &peer_mapped_me)
            .map_err(|e| e.context(format!("split on rank {}", inner.rank)))?;
        let child = Self::from_parts(
            mc.rank,
            members.len(),
            id,
            inner.config.clone(),
            inner.listen_ip,
            mesh,
            hosts.clone(),
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
