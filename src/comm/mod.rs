//! The communicator: a group of ranks that run collectives together.

mod calibrate;
mod config;
mod group;
mod mesh;
mod rendezvous;
mod work;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ferroccl_kernels::{as_bytes, as_bytes_mut, DataType, ElemOp, Element};
use ferroccl_transport_shm::ShmConfig;
use ferroccl_transport_tcp::{TcpConfig, TcpEndpoint};

use crate::bootstrap::{self, MemoryStore, Store};
use crate::coll::{CollArgs, CollKind};
use crate::exec::{kind, Engine, Memory, OpContext, WaitPolicy};
use crate::{Error, ErrorKind, Result};

pub use config::{parse_size, Config, DebugLevel, Transport};
pub use group::Group;
pub use work::Work;

use work::Worker;

/// A reduction operation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ReduceOp {
    /// Sum (wrapping for integers).
    Sum,
    /// Product (wrapping for integers).
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Sum divided by the number of ranks (integer division for integer types).
    Avg,
    /// Each rank's input multiplied by this rank's scalar, then summed (NCCL's
    /// `ncclRedOpCreatePreMulSum`). For integer types the scalar is truncated to an integer.
    PreMulSum(f64),
}

impl ReduceOp {
    /// The element-wise op the algorithms apply.
    pub fn elem_op(self) -> ElemOp {
        match self {
            ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PreMulSum(_) => ElemOp::Sum,
            ReduceOp::Prod => ElemOp::Prod,
            ReduceOp::Max => ElemOp::Max,
            ReduceOp::Min => ElemOp::Min,
        }
    }

    /// NCCL's code for the op (`ncclSum` = 0 ... `ncclAvg` = 4; 5 for pre-multiplied sums).
    pub fn code(self) -> u8 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Max => 2,
            ReduceOp::Min => 3,
            ReduceOp::Avg => 4,
            ReduceOp::PreMulSum(_) => 5,
        }
    }

    /// Name as nccl-tests prints it.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
            ReduceOp::PreMulSum(_) => "premulsum",
        }
    }
}

/// Issue order: tickets handed out at issue, served in order.
#[derive(Debug, Default)]
struct Order {
    next_ticket: u64,
    serving: u64,
    next_seq: u64,
}

#[derive(Debug)]
struct Inner {
    rank: usize,
    nranks: usize,
    id: u64,
    config: Config,
    listen_ip: IpAddr,
    engine: Mutex<Engine>,
    failed: Mutex<Option<Error>>,
    aborted: Arc<AtomicBool>,
    order: Mutex<Order>,
    turn: Condvar,
    splits: AtomicU64,
    groups: AtomicU64,
    /// The rendezvous store, kept to tell peers why this rank failed (and to learn why they did).
    store: Option<Arc<dyn Store>>,
    /// Keeps a rendezvous store this rank hosts alive as long as the communicator.
    _store_server: Option<bootstrap::TcpStoreServer>,
    /// Host id of every rank (equal ids: one host).
    hosts: Vec<u64>,
    /// Transport chosen for each peer (None for this rank).
    transports: Vec<Option<Transport>>,
}

/// A group of `nranks` ranks that run collectives together; this process's handle is one rank.
///
/// Calls from several threads are allowed and are ordered: every operation, blocking or
/// asynchronous, runs in the order it was issued. A failed operation fails the communicator:
/// every later call returns the same error.
#[derive(Debug)]
pub struct Communicator {
    inner: Arc<Inner>,
    worker: Mutex<Option<Worker>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// FNV-1a, to turn job names into communicator ids.
pub(crate) fn hash64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Connection settings of rank `rank` of a communicator `id` whose ranks live on `hosts`.
fn mesh_config<'a>(
    config: &'a Config,
    rank: usize,
    nranks: usize,
    id: u64,
    hosts: &'a [u64],
    deadline: Instant,
) -> mesh::MeshConfig<'a> {
    mesh::MeshConfig {
        rank,
        nranks,
        comm_id: id,
        hosts,
        transports: &config.transports,
        tcp: TcpConfig {
            nstreams: config.nstreams,
            ..TcpConfig::default()
        },
        shm: ShmConfig {
            ring_bytes: config.shm_ring_bytes,
            cma: config.shm_cma,
            cma_min: config.shm_cma_min,
            dir: config.shm_dir.clone(),
            ..ShmConfig::default()
        },
        debug: config.debug,
        deadline,
        link_delay: config.link_delay,
    }
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: `b` is a writable 8-byte buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 8, 0) };
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    if n == 8 {
        u64::from_le_bytes(b) ^ t
    } else {
        hash64(&[&t.to_le_bytes(), &std::process::id().to_le_bytes()])
    }
}

impl Communicator {
    /// Joins a communicator of `nranks` ranks as `rank`, meeting the others through `store`.
    /// Every rank passes the same `id` (any number the ranks agree on; it keeps communicators
    /// that share a store apart). An `id` names one communicator on a store: each rank number
    /// may be claimed once, and a second claimant fails, as does every rank of a communicator
    /// that a duplicate reached while it formed (see `rendezvous` in the source). The
    /// connections carry `id` combined with a random value drawn by rank 0.
    pub fn init(
        store: Arc<dyn Store>,
        rank: usize,
        nranks: usize,
        id: u64,
        config: Config,
    ) -> Result<Communicator> {
        Self::init_inner(store, rank, nranks, id, config, None)
    }

    fn init_inner(
        store: Arc<dyn Store>,
        rank: usize,
        nranks: usize,
        id: u64,
        config: Config,
        server: Option<bootstrap::TcpStoreServer>,
    ) -> Result<Communicator> {
        if nranks == 0 || rank >= nranks {
            return Err(Error::invalid_argument(format!(
                "init: rank {rank} is not in 0..{nranks}"
            )));
        }
        if let Some(a) = &config.algo {
            crate::plan::Overrides::parse(a).map_err(|e| {
                Error::invalid_argument(format!("init on rank {rank}: algorithm rules {a:?}: {e}"))
            })?;
        }
        let deadline = Instant::now() + config.timeout;
        let ctx = |e: Error| e.context(format!("init on rank {rank}"));
        let claim = rendezvous::claim(&*store, id, rank, deadline)?;
        let id = claim.comm_id;
        let ip = match &config.socket_ifname {
            Some(spec) => bootstrap::iface::pick_address(Some(spec))?,
            None => store.local_ip().unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        };
        let endpoint =
            TcpEndpoint::listen(ip).map_err(|e| e.context(format!("init on rank {rank}")))?;
        let prefix = format!("ferroccl/{id:016x}");
        let host = ferroccl_transport_shm::host_id(config.host_id.as_deref());
        store.set(
            &format!("{prefix}/addr/{rank}"),
            endpoint.addr().to_string().as_bytes(),
        )?;
        store.set(
            &format!("{prefix}/nranks/{rank}"),
            nranks.to_string().as_bytes(),
        )?;
        store.set(
            &format!("{prefix}/host/{rank}"),
            format!("{host:016x}").as_bytes(),
        )?;
        let left = || deadline.saturating_duration_since(Instant::now());
        // Every rank's host, after checking that it runs with the same nranks.
        let mut hosts = vec![host; nranks];
        for (peer, h) in hosts.iter_mut().enumerate() {
            if peer == rank {
                continue;
            }
            let n = store.get(&format!("{prefix}/nranks/{peer}"), left())?;
            if n != nranks.to_string().as_bytes() {
                return Err(Error::invalid_usage(format!(
                    "init: rank {peer} was started with nranks {}, rank {rank} with {nranks}",
                    String::from_utf8_lossy(&n)
                )));
            }
            let v = store.get(&format!("{prefix}/host/{peer}"), left())?;
            let s = String::from_utf8_lossy(&v);
            *h = u64::from_str_radix(&s, 16).map_err(|_| {
                Error::internal(format!("init: rank {peer} published a bad host id {s:?}"))
            })?;
        }
        let addr_of = |peer: usize| -> Result<SocketAddr> {
            let v = store.get(&format!("{prefix}/addr/{peer}"), left())?;
            let s = String::from_utf8_lossy(&v);
            s.parse().map_err(|_| {
                Error::internal(format!("init: rank {peer} published a bad address {s:?}"))
            })
        };
        let mc = mesh_config(&config, rank, nranks, id, &hosts, deadline);
        let own = mesh::create_segment(&mc);
        store.set(
            &format!("{prefix}/shmseg/{rank}"),
            own.as_ref().map_or("", |s| s.name()).as_bytes(),
        )?;
        let name_of = |peer: usize| -> Result<Option<String>> {
            let v = store.get(&format!("{prefix}/shmseg/{peer}"), left())?;
            Ok(Some(String::from_utf8_lossy(&v).into_owned()).filter(|s| !s.is_empty()))
        };
        let mapped = mesh::map_segments(&mc, own.as_ref(), &name_of).map_err(ctx)?;
        let list: Vec<String> = mesh::mapped_ranks(&mapped)
            .iter()
            .map(usize::to_string)
            .collect();
        store.set(
            &format!("{prefix}/shmmapped/{rank}"),
            list.join(",").as_bytes(),
        )?;
        let peer_mapped_me = |peer: usize| -> Result<bool> {
            let v = store.get(&format!("{prefix}/shmmapped/{peer}"), left())?;
            let me = rank.to_string();
            Ok(String::from_utf8_lossy(&v).split(',').any(|r| r == me))
        };
        let mesh = mesh::connect_all(&mc, &endpoint, &addr_of, own, mapped, &peer_mapped_me)
            .map_err(ctx)?;
        rendezvous::confirm(&*store, &claim, nranks, deadline)?;
        if config.debug >= DebugLevel::Info {
            let nshm = mesh
                .transports
                .iter()
                .filter(|t| **t == Some(Transport::Shm))
                .count();
            ferroccl_transport::log_line!(
                "ferroccl rank {rank} INIT: {nranks} ranks, id {id:016x}, listening on {}, TCP with {} stream(s) per peer, shared memory with {nshm} peer(s)",
                endpoint.addr(),
                config.nstreams
            );
        }
        let measure = config.tune_measure;
        let comm = Self::from_parts(
            rank,
            nranks,
            id,
            config,
            ip,
            mesh,
            hosts,
            Some(store),
            server,
        );
        if measure {
            comm.calibrate()?;
        }
        Ok(comm)
    }

    #[allow(clippy::too_many_arguments)]
    fn from_parts(
        rank: usize,
        nranks: usize,
        id: u64,
        config: Config,
        listen_ip: IpAddr,
        mesh: mesh::Mesh,
        hosts: Vec<u64>,
        store: Option<Arc<dyn Store>>,
        server: Option<bootstrap::TcpStoreServer>,
    ) -> Communicator {
        let aborted = Arc::new(AtomicBool::new(false));
        let engine = Engine::new(
            rank,
            nranks,
            mesh.conns,
            WaitPolicy {
                spin: config.spin,
                timeout: config.timeout,
            },
            Arc::clone(&aborted),
            config.slice_bytes,
            tuning(&config, &hosts),
        );
        Communicator {
            inner: Arc::new(Inner {
                rank,
                nranks,
                id,
                config,
                listen_ip,
                engine: Mutex::new(engine),
                failed: Mutex::new(None),
                aborted,
                order: Mutex::new(Order::default()),
                turn: Condvar::new(),
                splits: AtomicU64::new(0),
                groups: AtomicU64::new(0),
                store,
                _store_server: server,
                hosts,
                transports: mesh.transports,
            }),
            worker: Mutex::new(None),
        }
    }

    /// Joins the job this process was launched into, reading the launcher's environment:
    /// `ferrorun` (`FERRO_*`), torchrun, SLURM or Open MPI (see [`bootstrap::env`]).
    pub fn from_env() -> Result<Communicator> {
        let config = Config::from_env()?;
        let env = bootstrap::env::detect()?.ok_or_else(|| {
            Error::invalid_usage(
                "from_env: no launcher environment found (set FERRO_RANK, FERRO_NRANKS and \
                 FERRO_STORE_ADDR, or start under ferrorun, torchrun, srun or mpirun)",
            )
        })?;
        Self::from_launch_env(&env, config)
    }

    /// Joins the job described by `env` (see [`bootstrap::env::detect`]).
    pub fn from_launch_env(
        env: &bootstrap::env::LaunchEnv,
        config: Config,
    ) -> Result<Communicator> {
        let mut v = Self::from_launch_env_threads(env, config, 1)?;
        v.pop()
            .ok_or_else(|| Error::internal("from_env: no communicator was created"))
    }

    /// Joins the job described by `env` with `threads` ranks in this process: process `p` of
    /// `P` holds ranks `p × threads .. (p + 1) × threads` of `P × threads` (as nccl-tests' `-t`).
    /// Element `t` of the result is rank `p × threads + t`.
    pub fn from_launch_env_threads(
        env: &bootstrap::env::LaunchEnv,
        config: Config,
        threads: usize,
    ) -> Result<Vec<Communicator>> {
        let threads = threads.max(1);
        let id = hash64(&[b"ferroccl-job", env.job_id.as_bytes()]);
        // The store serves only clients that present the job's magic (never 0: "open").
        let magic = hash64(&[b"ferroccl-store", env.job_id.as_bytes()]) | 1;
        let (store, server): (Arc<dyn Store>, Option<bootstrap::TcpStoreServer>) = match env
            .store_addr
        {
            Some(addr) => {
                let server = if env.host_store {
                    let bind = env.store_bind_addr().unwrap_or(addr);
                    Some(
                        bootstrap::TcpStoreServer::bind_with_magic(bind, magic).map_err(|e| {
                            e.context(format!(
                                "rank {} hosts the rendezvous store at {bind}",
                                env.rank
                            ))
                        })?,
                    )
                } else {
                    None
                };
                let store = bootstrap::TcpStore::connect_with_magic(addr, magic, config.timeout)?;
                // No store request outlives FERRO_TIMEOUT (60 s by default otherwise).
                store.set_request_timeout(config.timeout);
                (Arc::new(store), server)
            }
            None => {
                let dir = env.file_store_dir().ok_or_else(|| {
                        Error::invalid_usage(
                            "from_env: no rendezvous address (set FERRO_STORE_ADDR or MASTER_ADDR/MASTER_PORT)",
                        )
                    })?;
                (Arc::new(bootstrap::FileStore::new_for_job(dir)?), None)
            }
        };
        let nranks = env.nranks * threads;
        let first = env.rank * threads;
        let mut server = server;
        if threads == 1 {
            return Ok(vec![Self::init_inner(
                store, first, nranks, id, config, server,
            )?]);
        }
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let store = Arc::clone(&store);
                let config = config.clone();
                let server = if t == 0 { server.take() } else { None };
                std::thread::Builder::new()
                    .name(format!("ferroccl-init-{}", first + t))
                    .spawn(move || Self::init_inner(store, first + t, nranks, id, config, server))
            })
            .collect();
        join_inits(handles)
    }

    /// Joins the communicator named by a [`bootstrap::UniqueId`] (NCCL's path: one rank
    /// creates the id, hands its 128 bytes to the others out of band, all call this).
    pub fn from_unique_id(
        uid: &bootstrap::UniqueId,
        rank: usize,
        nranks: usize,
        config: Config,
    ) -> Result<Communicator> {
        let store = uid.connect(config.timeout)?;
        store.set_request_timeout(config.timeout);
        Self::init(Arc::new(store), rank, nranks, uid.magic(), config)
    }

    /// Creates `nranks` communicators whose ranks are threads of this process (in-memory
    /// rendezvous, TCP over loopback). Element `r` of the result is rank `r`.
    pub fn local_group(nranks: usize, config: Config) -> Result<Vec<Communicator>> {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let id = random_u64();
        let handles: Vec<_> = (0..nranks)
            .map(|r| {
                let store = Arc::clone(&store);
                let config = config.clone();
                std::thread::Builder::new()
                    .name(format!("ferroccl-init-{r}"))
                    .spawn(move || Communicator::init(store, r, nranks, id, config))
            })
            .collect();
        join_inits(handles)
    }

    /// This rank, in `0..nranks()`.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// Ranks in the communicator.
    pub fn nranks(&self) -> usize {
        self.inner.nranks
    }

    /// This rank's host id: ranks with equal ids share a host (machine id, host name and
    /// network namespace, or `FERRO_HOST_ID`).
    pub fn host_id(&self) -> u64 {
        self.inner.hosts[self.inner.rank]
    }

    /// This rank's position among the ranks of its host, in rank order (`0..local_nranks()`).
    pub fn local_rank(&self) -> usize {
        mesh::local_position(self.inner.rank, &self.inner.hosts).0
    }

    /// Ranks of this communicator on this rank's host (this one included).
    pub fn local_nranks(&self) -> usize {
        mesh::local_position(self.inner.rank, &self.inner.hosts).1
    }

    /// The transport connecting this rank with `peer`; `None` for this rank itself or a rank
    /// out of range.
    pub fn transport(&self, peer: usize) -> Option<Transport> {
        self.inner.transports.get(peer).copied().flatten()
    }

    /// The cost model this rank's tuner uses, when `FERRO_TUNE=measure` calibrated it at init
    /// (every rank holds the same figures); `None` while it runs on the documented defaults.
    pub fn calibrated_model(&self) -> Option<crate::plan::CostModel> {
        let engine = self.inner.engine.lock().unwrap_or_else(|p| p.into_inner());
        engine.calibrated_model().cloned()
    }

    /// The algorithm a `kind` call of `count` elements of `dtype` runs on this communicator
    /// (the tuner's pick or `FERRO_ALGO`'s), as logged at `FERRO_DEBUG=DEBUG`.
    pub fn algorithm_for(
        &self,
        kind: CollKind,
        count: usize,
        dtype: DataType,
    ) -> crate::coll::Algorithm {
        let args = CollArgs {
            kind,
            count,
            in_place: false,
        };
        let engine = self.inner.engine.lock().unwrap_or_else(|p| p.into_inner());
        engine.algorithm_for(&args, dtype.size())
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The first error this communicator hit, if any (NCCL's `ncclCommGetAsyncError`).
    pub fn async_error(&self) -> Option<Error> {
        lock(&self.inner.failed).clone()
    }

    /// Aborts: every operation in flight or queued fails promptly with an `Aborted` error,
    /// connections are closed so peers notice at once, and every later call fails. Returns
    /// without waiting for peers.
    pub fn abort(&self) {
        self.inner.aborted.store(true, Ordering::SeqCst);
        let e = Error::new(
            ErrorKind::Aborted,
            format!("rank {}: the communicator was aborted", self.inner.rank),
        );
        self.inner.fail(e.clone());
        if let Ok(mut engine) = self.inner.engine.try_lock() {
            engine.notify_failure(&e, 0);
            engine.shutdown_all();
        }
        // abort() returns at once: the report finishes (or not) on its own thread.
        self.inner.publish_failure(&e, Duration::ZERO);
    }

    /// Waits for every queued operation, then closes the connections. Returns the
    /// communicator's error if it failed.
    pub fn destroy(self) -> Result<()> {
        let t = self.inner.ticket(false).0;
        let r = self.inner.execute(t, |e| {
            e.shutdown_all();
            Ok(())
        });
        match self.async_error() {
            Some(e) if e.kind() != ErrorKind::Aborted => Err(e),
            _ => r.or(Ok(())),
        }
    }

    fn worker(&self) -> Result<MutexGuard<'_, Option<Worker>>> {
        let mut w = lock(&self.worker);
        if w.is_none() {
            *w = Some(Worker::start(self.inner.rank)?);
        }
        Ok(w)
    }

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

    /// Waits until every rank has called `barrier`.
    pub fn barrier(&self) -> Result<()> {
        let mut b = [1u8];
        self.run_blocking(
            "barrier",
            kind::BARRIER,
            CollKind::AllReduce,
            None,
            &mut b,
            1,
            DataType::Uint8,
            ReduceOp::Max,
        )
    }

    /// Checks that every rank names the same `root` for a rooted operation that is built from
    /// sends and receives (gather, scatter: header kind `hkind`), before any of its data moves.
    /// A mismatch fails the call on every rank.
    #[cfg(feature = "capi")]
    pub(crate) fn agree_on_root(
        &self,
        name: &'static str,
        hkind: u8,
        root: usize,
        count: usize,
        dtype: DataType,
    ) -> Result<()> {
        let inner = &self.inner;
        if root >= inner.nranks {
            return Err(Error::invalid_argument(format!(
                "{name} on rank {}: invalid root {root} (root must be 0..{})",
                inner.rank,
                inner.nranks - 1
            )));
        }
        if let Some(e) = inner.failed_error() {
            return Err(e);
        }
        if !inner.config.check_root {
            return Ok(());
        }
        let (ticket, seq) = inner.ticket(true);
        let ctx = OpContext {
            name,
            seq,
            rank: inner.rank,
            kind: hkind,
            dtype,
            op: 0xff,
            count: count as u64,
            root: root as u32,
        };
        inner.execute(ticket, |e| e.agree_on_root(root, &ctx))
    }

    // ----- collectives on untyped buffers -----

    /// Runs collective `kind` on byte buffers holding `dtype` elements, `count` as NCCL counts
    /// it (see [`CollKind::buffer_lens`]). `send: None` means in place: `recv` is the one
    /// buffer, laid out as NCCL lays out in-place calls. For `broadcast`, `send` is read on the
    /// root only; for `reduce`, `recv` is written on the root only (elsewhere it may be empty).
    /// `op` is ignored by collectives that do not reduce.
    pub fn raw_collective(
        &self,
        kind: CollKind,
        send: Option<&[u8]>,
        recv: &mut [u8],
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        self.run_blocking(
            kind.name(),
            header_kind(kind),
            kind,
            send,
            recv,
            count,
            dtype,
            op,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn run_blocking(
        &self,
        name: &'static str,
        hkind: u8,
        kind: CollKind,
        send: Option<&[u8]>,
        recv: &mut [u8],
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let inner = &self.inner;
        let call = Call::check(
            inner,
            name,
            hkind,
            kind,
            send.map(<[u8]>::len),
            recv.len(),
            count,
            dtype,
            op,
        )?;
        let (ticket, seq) = inner.ticket(true);
        let mem = Memory {
            input: send.map_or(recv.as_ptr(), <[u8]>::as_ptr),
            input_len: send.map_or(0, <[u8]>::len),
            output: recv.as_mut_ptr(),
            output_len: recv.len(),
            in_place: send.is_none(),
        };
        inner.execute(ticket, |e| call.run(e, seq, mem, inner.config.check_root))
    }

    // ----- typed collectives -----

    /// Every rank's `recv` becomes the reduction (`op`) of all ranks' `send`.
    ///
    /// ```
    /// use ferroccl::{Communicator, Config, ReduceOp};
    /// let comms = Communicator::local_group(2, Config::default()).unwrap();
    /// std::thread::scope(|s| {
    ///     for c in &comms {
    ///         s.spawn(move || {
    ///             let send = [c.rank() as f32 + 1.0; 4];
    ///             let mut recv = [0f32; 4];
    ///             c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
    ///             assert_eq!(recv, [3.0; 4]);
    ///         });
    ///     }
    /// });
    /// ```
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        self.raw_collective(
            CollKind::AllReduce,
            Some(as_bytes(send)),
            as_bytes_mut(recv),
            send.len(),
            T::DTYPE,
            op,
        )
    }

    /// [`Communicator::all_reduce`] in place.
    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let n = buf.len();
        self.raw_collective(
            CollKind::AllReduce,
            None,
            as_bytes_mut(buf),
            n,
            T::DTYPE,
            op,
        )
    }

    /// Every rank's `buf` becomes the root's `buf`.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let n = buf.len();
        self.raw_collective(
            CollKind::Broadcast { root },
            None,
            as_bytes_mut(buf),
            n,
            T::DTYPE,
            ReduceOp::Sum,
        )
    }

    /// Every rank's `recv` becomes the root's `send` (`send` is read on the root only).
    pub fn broadcast_from<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        root: usize,
    ) -> Result<()> {
        let n = recv.len();
        self.raw_collective(
            CollKind::Broadcast { root },
            Some(as_bytes(send)),
            as_bytes_mut(recv),
            n,
            T::DTYPE,
            ReduceOp::Sum,
        )
    }

    /// The root's `recv` becomes the reduction of all ranks' `send` (`recv` is ignored, and may
    /// be empty, elsewhere).
    pub fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.raw_collective(
            CollKind::Reduce { root },
            Some(as_bytes(send)),
            as_bytes_mut(recv),
            send.len(),
            T::DTYPE,
            op,
        )
    }

    /// [`Communicator::reduce`] in place: the root's `buf` becomes the result; other ranks'
    /// `buf` is left as it was.
    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let n = buf.len();
        self.raw_collective(
            CollKind::Reduce { root },
            None,
            as_bytes_mut(buf),
            n,
            T::DTYPE,
            op,
        )
    }

    /// `recv` (of `nranks × send.len()` elements) becomes every rank's `send`, in rank order.
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.raw_collective(
            CollKind::AllGather,
            Some(as_bytes(send)),
            as_bytes_mut(recv),
            send.len(),
            T::DTYPE,
            ReduceOp::Sum,
        )
    }

    /// [`Communicator::all_gather`] in place: this rank's input is block `rank` of `buf`.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let count = self.block_count("all_gather", buf.len())?;
        self.raw_collective(
            CollKind::AllGather,
            None,
            as_bytes_mut(buf),
            count,
            T::DTYPE,
            ReduceOp::Sum,
        )
    }

    /// `recv` becomes block `rank` (of `recv.len()` elements) of the reduction of all ranks'
    /// `send` (of `nranks × recv.len()` elements).
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let n = recv.len();
        self.raw_collective(
            CollKind::ReduceScatter,
            Some(as_bytes(send)),
            as_bytes_mut(recv),
            n,
            T::DTYPE,
            op,
        )
    }

    /// [`Communicator::reduce_scatter`] in place: the result lands in block `rank` of `buf`.
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let count = self.block_count("reduce_scatter", buf.len())?;
        self.raw_collective(
            CollKind::ReduceScatter,
            None,
            as_bytes_mut(buf),
            count,
            T::DTYPE,
            op,
        )
    }

    /// Block `p` of `send` goes to rank `p`, which stores it as block `rank` of its `recv`.
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let count = self.block_count("all_to_all", send.len())?;
        self.raw_collective(
            CollKind::AllToAll,
            Some(as_bytes(send)),
            as_bytes_mut(recv),
            count,
            T::DTYPE,
            ReduceOp::Sum,
        )
    }

    /// [`Communicator::all_to_all`] in place.
    pub fn all_to_all_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let count = self.block_count("all_to_all", buf.len())?;
        self.raw_collective(
            CollKind::AllToAll,
            None,
            as_bytes_mut(buf),
            count,
            T::DTYPE,
            ReduceOp::Sum,
        )
    }

    fn block_count(&self, name: &str, len: usize) -> Result<usize> {
        let n = self.inner.nranks;
        if !len.is_multiple_of(n) {
            return Err(Error::invalid_argument(format!(
                "{name} on rank {}: buffer of {len} elements is not a multiple of nranks {n}",
                self.inner.rank
            )));
        }
        Ok(len / n)
    }

    /// Sends `buf` to `peer` (which calls [`Communicator::recv`]).
    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        let mut g = self.group();
        g.send(buf, peer);
        g.run()
    }

    /// Receives from `peer` into `buf`, whose length must equal what `peer` sends.
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        let mut g = self.group();
        g.recv(buf, peer);
        g.run()
    }

    /// Starts a group of sends and receives that run together when [`Group::run`] is called
    /// (NCCL's `ncclGroupStart`/`ncclGroupEnd`): pairs inside one group never deadlock.
    pub fn group(&self) -> Group<'_> {
        Group::new(self)
    }

    // ----- asynchronous collectives -----

    fn submit<B: Send + 'static>(
        &self,
        call: Call,
        in_place: bool,
        mut bufs: B,
        ptrs: fn(&mut B) -> (*const u8, usize, *mut u8, usize),
    ) -> Result<Work<B>> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let (ticket, seq) = self.inner.ticket(true);
        let inner = Arc::clone(&self.inner);
        let job = Box::new(move || {
            let (ip, il, op, ol) = ptrs(&mut bufs);
            let mem = Memory {
                input: ip,
                input_len: il,
                output: op,
                output_len: ol,
                in_place,
            };
            let r = inner.execute(ticket, |e| call.run(e, seq, mem, inner.config.check_root));
            let _ = tx.send((r, bufs));
        });
        match self.worker()?.as_ref() {
            Some(w) => w.submit(job)?,
            None => return Err(Error::internal("no progress thread")),
        }
        Ok(Work::new(rx))
    }

    /// [`Communicator::all_reduce_in_place`] on the progress thread: returns at once; the
    /// buffer comes back from [`Work::wait`] holding the result.
    pub fn all_reduce_async<T: Element, B: AsMut<[T]> + Send + 'static>(
        &self,
        mut buf: B,
        op: ReduceOp,
    ) -> Result<Work<B>> {
        let n = buf.as_mut().len();
        let call = Call::check(
            &self.inner,
            "all_reduce",
            kind::ALL_REDUCE,
            CollKind::AllReduce,
            None,
            n * T::DTYPE.size(),
            n,
            T::DTYPE,
            op,
        )?;
        self.submit(call, true, buf, |b| {
            let s = as_bytes_mut(b.as_mut());
            (s.as_ptr(), 0, s.as_mut_ptr(), s.len())
        })
    }

    /// [`Communicator::broadcast`] on the progress thread.
    pub fn broadcast_async<T: Element, B: AsMut<[T]> + Send + 'static>(
        &self,
        mut buf: B,
        root: usize,
    ) -> Result<Work<B>> {
        let n = buf.as_mut().len();
        let k = CollKind::Broadcast { root };
        let call = Call::check(
            &self.inner,
            "broadcast",
            kind::BROADCAST,
            k,
            None,
            n * T::DTYPE.size(),
            n,
            T::DTYPE,
            ReduceOp::Sum,
        )?;
        self.submit(call, true, buf, |b| {
            let s = as_bytes_mut(b.as_mut());
            (s.as_ptr(), 0, s.as_mut_ptr(), s.len())
        })
    }

    /// [`Communicator::all_gather`] on the progress thread; `(send, recv)` come back.
    pub fn all_gather_async<
        T: Element,
        S: AsRef<[T]> + Send + 'static,
        R: AsMut<[T]> + Send + 'static,
    >(
        &self,
        send: S,
        mut recv: R,
    ) -> Result<Work<(S, R)>> {
        let n = send.as_ref().len();
        let es = T::DTYPE.size();
        let call = Call::check(
            &self.inner,
            "all_gather",
            kind::ALL_GATHER,
            CollKind::AllGather,
            Some(n * es),
            recv.as_mut().len() * es,
            n,
            T::DTYPE,
            ReduceOp::Sum,
        )?;
        self.submit(call, false, (send, recv), |(s, r)| {
            let s = as_bytes(s.as_ref());
            let r = as_bytes_mut(r.as_mut());
            (s.as_ptr(), s.len(), r.as_mut_ptr(), r.len())
        })
    }

    /// [`Communicator::reduce_scatter`] on the progress thread; `(send, recv)` come back.
    pub fn reduce_scatter_async<
        T: Element,
        S: AsRef<[T]> + Send + 'static,
        R: AsMut<[T]> + Send + 'static,
    >(
        &self,
        send: S,
        mut recv: R,
        op: ReduceOp,
    ) -> Result<Work<(S, R)>> {
        let n = recv.as_mut().len();
        let es = T::DTYPE.size();
        let call = Call::check(
            &self.inner,
            "reduce_scatter",
            kind::REDUCE_SCATTER,
            CollKind::ReduceScatter,
            Some(send.as_ref().len() * es),
            n * es,
            n,
            T::DTYPE,
            op,
        )?;
        self.submit(call, false, (send, recv), |(s, r)| {
            let s = as_bytes(s.as_ref());
            let r = as_bytes_mut(r.as_mut());
            (s.as_ptr(), s.len(), r.as_mut_ptr(), r.len())
        })
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Let queued work finish (or fail), then stop the progress thread.
        drop(lock(&self.worker).take());
        lock(&self.inner.engine).shutdown_all();
    }
}

type InitHandle = std::io::Result<std::thread::JoinHandle<Result<Communicator>>>;

/// Collects communicators initialised on threads, in order; the first error wins.
fn join_inits(handles: Vec<InitHandle>) -> Result<Vec<Communicator>> {
    let mut out = Vec::with_capacity(handles.len());
    let mut first_err = None;
    for h in handles {
        match h {
            Err(e) => {
                first_err.get_or_insert(Error::io("starting an init thread", &e));
            }
            Ok(h) => match h.join() {
                Ok(Ok(c)) => out.push(c),
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(Error::internal("an init thread panicked"));
                }
            },
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// The tuner of a communicator whose ranks live on `hosts`.
fn tuning(config: &Config, hosts: &[u64]) -> crate::exec::Tuning {
    let mut seen: Vec<u64> = Vec::new();
    let host_of = hosts
        .iter()
        .map(|h| match seen.iter().position(|x| x == h) {
            Some(i) => i,
            None => {
                seen.push(*h);
                seen.len() - 1
            }
        })
        .collect();
    let mut model = crate::plan::CostModel {
        max_slice: config.slice_bytes.max(64),
        ..crate::plan::CostModel::default()
    };
    if !config.transports.contains(&Transport::Shm) {
        model.intra = crate::plan::Link::Tcp;
    }
    // Config::from_lookup validated the rules; a Config built by hand may hold bad ones.
    let overrides = config
        .algo
        .as_deref()
        .and_then(|a| crate::plan::Overrides::parse(a).ok())
        .unwrap_or_default();
    crate::exec::Tuning {
        model,
        topo: crate::coll::Topology { host_of },
        overrides,
        debug: config.debug >= DebugLevel::Debug,
        calibrated: false,
        probe: None,
    }
}

fn header_kind(k: CollKind) -> u8 {
    match k {
        CollKind::AllReduce => kind::ALL_REDUCE,
        CollKind::Broadcast { .. } => kind::BROADCAST,
        CollKind::Reduce { .. } => kind::REDUCE,
        CollKind::AllGather => kind::ALL_GATHER,
        CollKind::ReduceScatter => kind::REDUCE_SCATTER,
        CollKind::AllToAll => kind::ALL_TO_ALL,
    }
}

/// A checked collective call, ready to run.
#[derive(Debug, Clone, Copy)]
struct Call {
    name: &'static str,
    hkind: u8,
    args: CollArgs,
    dtype: DataType,
    op: ReduceOp,
    rank: usize,
    nranks: usize,
}

impl Call {
    #[allow(clippy::too_many_arguments)]
    fn check(
        inner: &Inner,
        name: &'static str,
        hkind: u8,
        kind: CollKind,
        send_len: Option<usize>,
        recv_len: usize,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<Call> {
        let (rank, n) = (inner.rank, inner.nranks);
        let bad = |what: String| {
            Err(Error::invalid_argument(format!(
                "{name} on rank {rank}: {what}"
            )))
        };
        if let Some(root) = kind.root() {
            if root >= n {
                return bad(format!("invalid root {root} (root must be 0..{})", n - 1));
            }
        }
        if let ReduceOp::PreMulSum(f) = op {
            if !f.is_finite() && kind.reduces() {
                return bad(format!("pre-multiplied sum scalar {f} is not finite"));
            }
        }
        let es = dtype.size();
        let total = |elems: usize| elems.checked_mul(n).and_then(|x| x.checked_mul(es));
        let Some(_) = total(count) else {
            return bad(format!("count {count} x {n} ranks overflows"));
        };
        let (in_len, out_len) = kind.buffer_lens(count, n);
        let (in_b, out_b) = (in_len * es, out_len * es);
        let is_root = kind.root() == Some(rank);
        match send_len {
            None => {
                let need = in_b.max(out_b);
                let reduce_nonroot = matches!(kind, CollKind::Reduce { .. }) && !is_root;
                if recv_len != need && !(reduce_nonroot && recv_len == in_b) {
                    return bad(format!(
                        "in-place buffer has {} elements, {} x {dtype} needed",
                        recv_len / es,
                        need / es
                    ));
                }
            }
            Some(s) => {
                let send_used = !matches!(kind, CollKind::Broadcast { .. }) || is_root;
                if send_used && s != in_b {
                    return bad(format!(
                        "send buffer has {} elements, {} x {dtype} needed",
                        s / es,
                        in_len
                    ));
                }
                let recv_used = !matches!(kind, CollKind::Reduce { .. }) || is_root;
                if recv_used && recv_len != out_b {
                    return bad(format!(
                        "receive buffer has {} elements, {} x {dtype} needed",
                        recv_len / es,
                        out_len
                    ));
                }
            }
        }
        if let Some(e) = lock(&inner.failed).clone() {
            return Err(e);
        }
        Ok(Call {
            name,
            hkind,
            args: CollArgs {
                kind,
                count,
                in_place: send_len.is_none(),
            },
            dtype,
            op,
            rank,
            nranks: n,
        })
    }

    fn run(&self, e: &mut Engine, seq: u64, mut mem: Memory, check_root: bool) -> Result<()> {
        let reduces = self.args.kind.reduces();
        let ctx = OpContext {
            name: self.name,
            seq,
            rank: self.rank,
            kind: self.hkind,
            dtype: self.dtype,
            op: if reduces { self.op.code() } else { 0xff },
            count: self.args.count as u64,
            root: self.args.kind.root().map_or(u32::MAX, |r| r as u32),
        };
        let is_root = self.args.kind.root() == Some(self.rank);
        if !mem.in_place {
            // Buffers a rank does not use may be empty: point them at nothing.
            if matches!(self.args.kind, CollKind::Broadcast { .. }) && !is_root {
                mem.input_len = 0;
            }
            if matches!(self.args.kind, CollKind::Reduce { .. }) && !is_root {
                mem.output_len = 0;
            }
        }
        let premul = match self.op {
            ReduceOp::PreMulSum(f) if reduces => Some(f),
            _ => None,
        };
        if let Some(root) = self.args.kind.root().filter(|_| check_root) {
            e.agree_on_root(root, &ctx)?;
        }
        e.run_collective(&self.args, self.dtype, self.op.elem_op(), premul, mem, &ctx)?;
        if self.op == ReduceOp::Avg && reduces {
            let es = self.dtype.size();
            let (_, out_len) = self.args.kind.buffer_lens(self.args.count, self.nranks);
            let out_off = if mem.in_place {
                self.args
                    .kind
                    .in_place_offsets(self.args.count, self.rank)
                    .1
            } else {
                0
            };
            let writes = !matches!(self.args.kind, CollKind::Reduce { .. }) || is_root;
            if writes && out_len > 0 {
                // SAFETY: the output (at `out_off` in the one buffer when in place) holds
                // `out_len` elements: `Call::check` verified the buffer lengths, and the
                // caller holds the buffer for the whole call.
                let out = unsafe {
                    std::slice::from_raw_parts_mut(mem.output.add(out_off * es), out_len * es)
                };
                ferroccl_kernels::divide(self.dtype, out, self.nranks as u64);
            }
        }
        Ok(())
    }
}

/// How long a rank that lost a peer's connection looks in the store for the peer's reason.
const EXPLAIN_WAIT: Duration = Duration::from_millis(300);
/// How long a failing rank tries to leave its reason in the store (whose host may be gone).
const PUBLISH_WAIT: Duration = Duration::from_secs(1);

/// Runs `f` on a thread of its own and waits at most `limit` for its result: a store request
/// on a failure path must not outlive the deadline, whatever the store's own timeouts (its host
/// may be stopped or cut off). A request still running then finishes unobserved.
fn bounded<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    std::thread::Builder::new()
        .name("ferroccl-report".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .ok()?;
    rx.recv_timeout(limit).ok()
}

impl Inner {
    /// Takes the next ticket (and, for collectives, sequence number).
    fn ticket(&self, collective: bool) -> (u64, u64) {
        let mut o = lock(&self.order);
        let t = o.next_ticket;
        o.next_ticket += 1;
        let seq = if collective {
            o.next_seq += 1;
            o.next_seq
        } else {
            0
        };
        (t, seq)
    }

    fn failed_error(&self) -> Option<Error> {
        lock(&self.failed).clone()
    }

    /// Records the first failure.
    fn fail(&self, e: Error) {
        let mut f = lock(&self.failed);
        if f.is_none() {
            if self.config.debug >= DebugLevel::Warn && e.kind() != ErrorKind::Aborted {
                ferroccl_transport::log_line!("ferroccl rank {} WARN: {e}", self.rank);
            }
            *f = Some(e);
        }
    }

    /// Runs `f` on the engine when `ticket`'s turn comes; failures fail the communicator.
    fn execute(&self, ticket: u64, f: impl FnOnce(&mut Engine) -> Result<()>) -> Result<()> {
        struct Turn<'a>(&'a Inner, u64);
        impl Drop for Turn<'_> {
            fn drop(&mut self) {
                let mut o = lock(&self.0.order);
                o.serving = self.1 + 1;
                self.0.turn.notify_all();
            }
        }
        {
            let mut o = lock(&self.order);
            while o.serving != ticket {
                o = self.turn.wait(o).unwrap_or_else(|p| p.into_inner());
            }
        }
        let _turn = Turn(self, ticket);
        if let Some(e) = lock(&self.failed).clone() {
            return Err(e);
        }
        let mut engine = lock(&self.engine);
        match f(&mut engine) {
            Ok(()) => Ok(()),
            Err(e) => {
                // Peers hear of it first, over the connections (a failure notice where one can
                // be written, then the close), and only then through the store, whose host may
                // be the rank that failed.
                let e = self.explain(e);
                self.fail(e.clone());
                engine.notify_failure(&e, 0);
                engine.shutdown_all();
                drop(engine);
                self.publish_failure(&e, PUBLISH_WAIT);
                Err(e)
            }
        }
    }

    fn failure_key(&self, rank: usize) -> String {
        format!("ferroccl/{:016x}/failed/{rank}", self.id)
    }

    /// Tells peers, through the store, why this rank is about to close its connections.
    fn publish_failure(&self, e: &Error, wait: Duration) {
        if let Some(store) = &self.store {
            let (store, key, why) = (
                Arc::clone(store),
                self.failure_key(self.rank),
                e.message().to_string(),
            );
            let _ = bounded(wait, move || store.set(&key, why.as_bytes()));
        }
    }

    /// A lost connection to a peer that failed on purpose: add the peer's own reason, which
    /// names the rank that really failed.
    fn explain(&self, e: Error) -> Error {
        let (Some(peer), Some(store)) = (e.peer(), &self.store) else {
            return e;
        };
        if e.kind() != ErrorKind::Remote || e.origin().is_some() {
            return e;
        }
        let (store, key) = (Arc::clone(store), self.failure_key(peer));
        let limit = EXPLAIN_WAIT + Duration::from_millis(200);
        match bounded(limit, move || store.get(&key, EXPLAIN_WAIT)) {
            Some(Ok(why)) => e.append(format!(
                "rank {peer} had failed: {}",
                String::from_utf8_lossy(&why)
            )),
            _ => e,
        }
    }
}
