//! Connecting every pair of ranks: the one selection loop over the transports of
//! [`super::transports`], and the exchange it runs through (the store at init, the parent
//! communicator in `split`).
//!
//! Three rounds, every rank in step (see `ferroccl_transport::setup`):
//! 1. each transport decides, per peer, whether it can join the pair and listens for those it
//!    can; every rank publishes one card with its transports' names, in its order of
//!    preference, and connect handles;
//! 2. each transport attaches the peers' handles; every rank publishes, per transport, which
//!    peers it attached;
//! 3. each pair takes the first transport in the lower rank's order that both ends attached,
//!    and the transports connect their pairs, in the fixed order of the registry on every rank.
//!
//! Every decline is kept with its reason: `FERRO_DEBUG=INFO` logs them, and a pair that no
//! transport can join fails init with all of them.

use std::time::Duration;

use ferroccl_transport::{Connection, Properties, RankDesc, SetupCtx, Transport};

use super::config::DebugLevel;
use crate::exec::Conn;
use crate::{Error, Result};

/// How ranks exchange setup bytes: every rank passes its bytes and gets every rank's, by rank.
pub(crate) trait Exchange {
    /// All ranks' `mine`, by rank (this rank's included).
    fn allgather(&mut self, round: &str, mine: &[u8]) -> Result<Vec<Vec<u8>>>;
}

/// Exchanges [`connect_mesh`] runs (cards, attachments, lanes), so that ranks not joining a
/// new communicator (a split's non-members) can take part in the same number.
pub(crate) const ROUNDS: usize = 3;

/// What connecting needs besides the transports.
#[derive(Debug)]
pub(crate) struct MeshOptions {
    pub debug: DebugLevel,
    /// One-way delay added to connections across hosts (`FERRO_LINK_DELAY_US`).
    pub link_delay: Duration,
    /// The largest allreduce this rank lets run through the small-message lanes.
    pub small_lane_bytes: usize,
    /// What decides how device collectives are cut into slices, which every rank must see the
    /// same (`FERRO_DEVICE_SLICE_BYTES`, 0 where unset; whether `p2p` is tried).
    pub device_cut: (u64, bool),
    /// Whether collectives are offered straight between the ranks' buffers
    /// (`FERRO_DEVICE_PEER`), which every rank must see the same: a rank that offers waits for
    /// an offer that a rank that does not would never make.
    pub device_peer: bool,
    /// Whether unregistered device buffers go through scratch windows
    /// (`FERRO_DEVICE_SCRATCH_BYTES` not 0): every rank alike, checked here.
    pub device_scratch: bool,
}

/// The connections of one rank and the transport chosen for each peer.
#[derive(Debug)]
pub(crate) struct Mesh {
    pub conns: Vec<Option<Conn>>,
    pub transports: Vec<Option<&'static str>>,
    /// This rank's connect handle per transport that listened (for logs).
    pub handles: Vec<(&'static str, Vec<u8>)>,
    /// The largest allreduce that runs through the small-message lanes, agreed by every rank
    /// (0: none does).
    pub lane_bytes: usize,
}

/// One rank's card of round 1: for each transport, in order of preference, its name and
/// handle (`None`: it declined every peer).
fn encode_card(entries: &[(&str, Option<&[u8]>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, handle) in entries {
        out.push(name.len() as u8);
        out.extend_from_slice(name.as_bytes());
        match handle {
            Some(h) => {
                out.extend_from_slice(&(h.len() as u32).to_le_bytes());
                out.extend_from_slice(h);
            }
            None => out.extend_from_slice(&u32::MAX.to_le_bytes()),
        }
    }
    out
}

type Card = Vec<(String, Option<Vec<u8>>)>;

fn decode_card(b: &[u8], rank: usize) -> Result<Card> {
    let bad = || {
        Error::internal(format!(
            "setup: rank {rank} sent a malformed transport card"
        ))
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let n = usize::from(b[i]);
        let name = b.get(i + 1..i + 1 + n).ok_or_else(bad)?;
        i += 1 + n;
        let len = b.get(i..i + 4).ok_or_else(bad)?;
        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]);
        i += 4;
        let handle = if len == u32::MAX {
            None
        } else {
            let h = b.get(i..i + len as usize).ok_or_else(bad)?;
            i += len as usize;
            Some(h.to_vec())
        };
        out.push((String::from_utf8_lossy(name).into_owned(), handle));
    }
    Ok(out)
}

/// Connects this rank (`ctx.rank`) to every other rank with `transports` (in this rank's
/// order of preference; `registry_order[i]` is transport `i`'s place in the registry).
pub(crate) fn connect_mesh(
    ctx: &SetupCtx,
    transports: &mut [Box<dyn Transport>],
    registry_order: &[usize],
    ex: &mut dyn Exchange,
    opts: &MeshOptions,
) -> Result<Mesh> {
    let (rank, nranks) = (ctx.rank, ctx.nranks);
    let nt = transports.len();
    // Why each transport declined each peer.
    let mut why: Vec<Vec<Option<String>>> = vec![vec![None; nranks]; nt];
    // Round 1: decide, listen, publish handles.
    let mut handles: Vec<Option<Vec<u8>>> = Vec::with_capacity(nt);
    let mut listening = vec![false; nt];
    for (t, tr) in transports.iter_mut().enumerate() {
        let mut peers = Vec::new();
        for p in (0..nranks).filter(|&p| p != rank) {
            match tr.can_connect(ctx, p) {
                Ok(()) => peers.push(p),
                Err(e) => why[t][p] = Some(e),
            }
        }
        if peers.is_empty() {
            handles.push(None);
            continue;
        }
        match tr.listen(ctx, &peers) {
            Ok(h) => {
                listening[t] = true;
                handles.push(Some(h));
            }
            Err(e) => {
                if opts.debug >= DebugLevel::Warn {
                    ferroccl_transport::log_line!(
                        "ferroccl rank {rank} WARN: {} is unavailable for {} peer(s): {}",
                        tr.name(),
                        peers.len(),
                        e.message()
                    );
                }
                for &p in &peers {
                    why[t][p] = Some(format!("unavailable on rank {rank}: {}", e.message()));
                }
                handles.push(None);
            }
        }
    }
    let entries: Vec<(&str, Option<&[u8]>)> = transports
        .iter()
        .zip(&handles)
        .map(|(tr, h)| (tr.name(), h.as_deref()))
        .collect();
    let cards = ex.allgather("cards", &encode_card(&entries))?;
    let cards: Vec<Card> = cards
        .iter()
        .enumerate()
        .map(|(r, c)| decode_card(c, r))
        .collect::<Result<_>>()?;
    // Round 2: attach the peers' handles, publish which peers each transport attached.
    let words = nranks.div_ceil(8);
    let mut attached = vec![vec![false; nranks]; nt];
    let mut bitmaps = vec![0u8; nt * words];
    for (t, tr) in transports.iter_mut().enumerate() {
        if !listening[t] {
            continue;
        }
        for p in 0..nranks {
            if p == rank || why[t][p].is_some() {
                continue;
            }
            let theirs = cards[p].iter().find(|(n, _)| n == tr.name());
            let r = match theirs {
                None => Err(format!("rank {p} does not use {}", tr.name())),
                Some((_, None)) => Err(format!("rank {p} offers no {} handle", tr.name())),
                Some((_, Some(h))) => tr.attach(ctx, p, h),
            };
            match r {
                Ok(()) => {
                    attached[t][p] = true;
                    bitmaps[t * words + p / 8] |= 1 << (p % 8);
                }
                Err(e) => why[t][p] = Some(e),
            }
        }
    }
    // The bitmaps go out as a card (transport name, bitmap), decoded once.
    let entries: Vec<(&str, Option<&[u8]>)> = transports
        .iter()
        .enumerate()
        .map(|(t, tr)| (tr.name(), Some(&bitmaps[t * words..(t + 1) * words])))
        .collect();
    let all = ex.allgather("attached", &encode_card(&entries))?;
    let mut attached_me = vec![vec![false; nranks]; nt];
    for (p, b) in all.iter().enumerate().filter(|&(p, _)| p != rank) {
        for (name, bits) in decode_card(b, p)? {
            let bit = bits.and_then(|b| b.get(rank / 8).map(|w| w & (1 << (rank % 8)) != 0));
            if let Some(t) = transports.iter().position(|tr| tr.name() == name) {
                attached_me[t][p] = bit.unwrap_or(false);
            }
        }
    }
    // Round 3: choose per pair (the lower rank's order), then connect in registry order.
    let mut choice: Vec<Option<usize>> = vec![None; nranks];
    for p in (0..nranks).filter(|&p| p != rank) {
        let both = |t: usize| attached[t][p] && attached_me[t][p];
        for t in 0..nt {
            if attached[t][p] && !attached_me[t][p] {
                why[t][p].get_or_insert_with(|| format!("rank {p} could not attach it"));
            }
        }
        choice[p] = if rank < p {
            (0..nt).find(|&t| both(t))
        } else {
            // The lower rank's order of preference, from its card.
            cards[p]
                .iter()
                .filter_map(|(n, _)| transports.iter().position(|tr| tr.name() == n))
                .find(|&t| both(t))
        };
        if choice[p].is_none() {
            let reasons: Vec<String> = transports
                .iter()
                .enumerate()
                .map(|(t, tr)| {
                    let w = why[t][p].as_deref().unwrap_or("not chosen");
                    format!("{}: {w}", tr.name())
                })
                .collect();
            let names: Vec<&str> = transports.iter().map(|t| t.name()).collect();
            return Err(Error::invalid_usage(format!(
                "rank {rank}: no transport of FERRO_TRANSPORTS={} can reach rank {p} ({})",
                names.join(","),
                reasons.join("; ")
            )));
        }
    }
    let mut conns: Vec<Option<Conn>> = (0..nranks).map(|_| None).collect();
    let mut order: Vec<usize> = (0..nt).collect();
    order.sort_by_key(|&t| registry_order[t]);
    for t in order {
        if !listening[t] {
            continue;
        }
        let peers: Vec<usize> = (0..nranks).filter(|&p| choice[p] == Some(t)).collect();
        let tr = &mut transports[t];
        let props = tr.properties();
        let name = tr.name();
        let made = tr
            .connect(ctx, &peers)
            .map_err(|e| e.context(format!("{name} setup on rank {rank}")))?;
        for c in made {
            let p = c.peer().rank;
            if choice.get(p) != Some(&Some(t)) || conns[p].is_some() {
                return Err(Error::internal(format!(
                    "{name} setup on rank {rank}: a connection to unexpected rank {p}"
                )));
            }
            let c = delayed(c, ctx, p, opts)?;
            conns[p] = Some(Conn::new(c, props));
        }
    }
    for p in (0..nranks).filter(|&p| p != rank) {
        if conns[p].is_none() {
            let t = choice[p].map_or("none", |t| transports[t].name());
            return Err(Error::internal(format!(
                "{t} setup on rank {rank}: no connection to rank {p}"
            )));
        }
    }
    if opts.debug >= DebugLevel::Info {
        log_mesh(ctx, transports, &choice, &conns, &why);
    }
    let handles = transports
        .iter()
        .zip(handles)
        .filter_map(|(tr, h)| Some((tr.name(), h?)))
        .collect();
    let lane_bytes = agree_on_lanes(ex, &mut conns, opts, ctx.rank)?;
    Ok(Mesh {
        lane_bytes,
        handles,
        transports: choice
            .iter()
            .map(|c| c.map(|t| transports[t].name()))
            .collect(),
        conns,
    })
}

/// The largest allreduce every rank can run through small-message lanes: each rank offers the
/// least of its limit and its connections' lane capacities (0 where a connection has no lane),
/// and all take the least offer, so that every rank makes the same choice for every call.
fn agree_on_lanes(
    ex: &mut dyn Exchange,
    conns: &mut [Option<Conn>],
    opts: &MeshOptions,
    rank: usize,
) -> Result<usize> {
    let mine = conns
        .iter_mut()
        .flatten()
        .map(Conn::lane_capacity)
        .fold(opts.small_lane_bytes, usize::min);
    let mine = u32::try_from(mine).unwrap_or(u32::MAX);
    let (slice, p2p) = opts.device_cut;
    let mut card = mine.to_le_bytes().to_vec();
    card.extend_from_slice(&slice.to_le_bytes());
    card.push(u8::from(p2p) | u8::from(opts.device_peer) << 1 | u8::from(opts.device_scratch) << 2);
    let all = ex.allgather("lanes", &card)?;
    // A little-endian number of `n` bytes at `at`, where the card holds them.
    let word = |b: &[u8], at: usize, n: usize| {
        b.get(at..at + n)
            .map(|w| w.iter().rev().fold(0u64, |a, &x| a << 8 | u64::from(x)))
    };
    let mut least = mine;
    for (peer, b) in all.iter().enumerate() {
        least = least.min(word(b, 0, 4).map_or(0, |w| w as u32));
        if let (Some(slice), Some(f)) = (word(b, 4, 8), word(b, 12, 1)) {
            let theirs = (slice, f & 1 != 0);
            if theirs != opts.device_cut {
                return Err(cut_mismatch(rank, opts.device_cut, peer, theirs));
            }
            if (f & 4 != 0) != opts.device_scratch {
                let say = |on: bool| if on { "set" } else { "0 or unset" };
                return Err(Error::invalid_usage(format!(
                    "init on rank {rank}: rank {rank} has FERRO_DEVICE_SCRATCH_BYTES {} but rank \
                     {peer} has it {}; every rank must set it (any size) or none, since it \
                     decides whether device collectives are offered through scratch windows",
                    say(opts.device_scratch),
                    say(f & 4 != 0)
                )));
            }
            if (f & 2 != 0) != opts.device_peer {
                let say = |on: bool| if on { "1" } else { "0" };
                return Err(Error::invalid_usage(format!(
                    "init on rank {rank}: rank {rank} has FERRO_DEVICE_PEER={} but rank {peer} \
                     has FERRO_DEVICE_PEER={}; every rank must set it alike, since it decides \
                     whether collectives are offered straight between the ranks' buffers",
                    say(opts.device_peer),
                    say(f & 2 != 0)
                )));
            }
        }
    }
    Ok(least as usize)
}

/// The error of ranks that would cut device collectives differently (their slices would not
/// match, the calls would fail mid-way or hang).
fn cut_mismatch(rank: usize, mine: (u64, bool), peer: usize, theirs: (u64, bool)) -> Error {
    let say = |(slice, p2p): (u64, bool)| {
        let slice = if slice == 0 {
            "unset".to_string()
        } else {
            slice.to_string()
        };
        format!(
            "FERRO_DEVICE_SLICE_BYTES={slice} with p2p {}",
            if p2p { "tried" } else { "not tried" }
        )
    };
    Error::invalid_usage(format!(
        "init on rank {rank}: rank {rank} has {} but rank {peer} has {}; every rank must set \
         FERRO_DEVICE_SLICE_BYTES alike (or none) and list p2p in FERRO_TRANSPORTS alike, \
         which decide how device collectives are cut into slices",
        say(mine),
        say(theirs)
    ))
}

/// Wraps a connection across hosts in the link delay of `FERRO_LINK_DELAY_US` (test and
/// benchmark tooling). Both ends see the same host ids, so both wrap or neither does.
fn delayed(
    c: Box<dyn Connection>,
    ctx: &SetupCtx,
    peer: usize,
    opts: &MeshOptions,
) -> Result<Box<dyn Connection>> {
    if opts.link_delay.is_zero() || ctx.same_host(peer) {
        return Ok(c);
    }
    Ok(Box::new(ferroccl_transport_testkit::Delayed::new(
        c,
        opts.link_delay,
    )?))
}

fn log_mesh(
    ctx: &SetupCtx,
    transports: &[Box<dyn Transport>],
    choice: &[Option<usize>],
    conns: &[Option<Conn>],
    why: &[Vec<Option<String>>],
) {
    let rank = ctx.rank;
    let hosts: Vec<u64> = ctx.ranks.iter().map(|d| d.host).collect();
    let (lr, ln) = crate::topo::local_position(rank, &hosts);
    let list: Vec<String> = (0..ctx.nranks)
        .filter(|&p| p != rank)
        .map(|p| {
            let extra = conns[p]
                .as_ref()
                .map(Conn::describe)
                .filter(|d| !d.is_empty())
                .map(|d| format!(" ({d})"))
                .unwrap_or_default();
            let name = choice[p].map_or("none", |t| transports[t].name());
            format!("{p}:{name}{extra}")
        })
        .collect();
    ferroccl_transport::log_line!(
        "ferroccl rank {rank} TRANSPORT: local rank {lr} of {ln} on host {:016x}; peers {}",
        ctx.ranks[rank].host,
        if list.is_empty() {
            "none".to_string()
        } else {
            list.join(", ")
        }
    );
    // Why earlier transports declined a peer, once per transport and reason.
    for (t, tr) in transports.iter().enumerate() {
        let mut seen: Vec<(&str, Vec<usize>)> = Vec::new();
        for p in (0..ctx.nranks).filter(|&p| p != rank) {
            // Only transports this rank preferred to the one chosen.
            let earlier = choice[p].is_some_and(|c| t < c);
            if let (true, Some(w)) = (earlier, why[t][p].as_deref()) {
                match seen.iter_mut().find(|(r, _)| *r == w) {
                    Some((_, v)) => v.push(p),
                    None => seen.push((w, vec![p])),
                }
            }
        }
        for (w, peers) in seen {
            let list: Vec<String> = peers.iter().map(usize::to_string).collect();
            ferroccl_transport::log_line!(
                "ferroccl rank {rank} SETUP: {} declined rank(s) {}: {w}",
                tr.name(),
                list.join(",")
            );
        }
    }
}

/// This rank's description for setup.
pub(crate) fn describe_self(host: u64) -> RankDesc {
    RankDesc {
        host,
        pid: std::process::id(),
    }
}

/// The transports' properties as the tuner sees them: the link of the first transport that
/// joins two ranks of one host, and of two hosts (from the configuration alone, so that every
/// rank's tuner agrees).
pub(crate) fn tuner_links(
    transports: &[Box<dyn Transport>],
) -> (Option<Properties>, Option<Properties>) {
    let ranks = [
        RankDesc { host: 1, pid: 1 },
        RankDesc { host: 1, pid: 2 },
        RankDesc { host: 2, pid: 3 },
    ];
    let ctx = SetupCtx {
        rank: 0,
        nranks: 3,
        comm_id: 0,
        ranks: &ranks,
        deadline: std::time::Instant::now(),
    };
    let first = |peer| {
        transports
            .iter()
            .find(|t| t.can_connect(&ctx, peer).is_ok())
            .map(|t| t.properties())
    };
    (first(1), first(2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cards_round_trip() {
        let c = encode_card(&[("shm", Some(b"seg-1")), ("tcp", None), ("x", Some(b""))]);
        let d = decode_card(&c, 3).unwrap();
        assert_eq!(
            d,
            vec![
                ("shm".to_string(), Some(b"seg-1".to_vec())),
                ("tcp".to_string(), None),
                ("x".to_string(), Some(Vec::new())),
            ]
        );
        let e = decode_card(&c[..c.len() - 1], 3).unwrap_err();
        assert!(e.message().contains("rank 3"), "{e}");
    }
}
