//! Joining a communicator: through a store, a launcher's environment, a unique id, or as
//! threads of this process.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use crate::bootstrap::{self, MemoryStore, Store};
use crate::exec::{Engine, WaitPolicy};
use crate::{Error, Result};

use super::*;

/// Setup exchange through the store: round `r`'s bytes of rank `p` under
/// `<prefix>/setup/<round>/<p>`.
pub(super) struct StoreExchange<'a> {
    pub store: &'a dyn Store,
    pub prefix: &'a str,
    pub rank: usize,
    pub nranks: usize,
    pub deadline: Instant,
}

impl mesh::Exchange for StoreExchange<'_> {
    fn allgather(&mut self, round: &str, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let key = |p: usize| format!("{}/setup/{round}/{p}", self.prefix);
        self.store.set(&key(self.rank), mine)?;
        (0..self.nranks)
            .map(|p| {
                if p == self.rank {
                    Ok(mine.to_vec())
                } else {
                    let left = self.deadline.saturating_duration_since(Instant::now());
                    self.store.get(&key(p), left)
                }
            })
            .collect()
    }
}

/// The transports of `config`, listening on `ip`, with their places in the registry.
pub(super) fn transports_for(
    config: &Config,
    ip: IpAddr,
) -> (Vec<Box<dyn ferroccl_transport::Transport>>, Vec<usize>) {
    transports::build(&config.transports, &transports::Settings { config, ip })
}

/// The selection loop's options from `config`.
pub(super) fn mesh_options(config: &Config) -> mesh::MeshOptions {
    mesh::MeshOptions {
        debug: config.debug,
        link_delay: config.link_delay,
        small_lane_bytes: config.small_lane_bytes,
        device_cut: (
            config.device_slice_bytes.map_or(0, |b| b as u64),
            config.tries_p2p(),
        ),
        device_peer: config.device_peer,
        device_scratch: config.device_scratch_bytes > 0,
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
            Some(spec) => crate::topo::iface::pick_address(Some(spec))?,
            None => store.local_ip().unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        };
        let prefix = format!("ferroccl/{id:016x}");
        let host = crate::topo::host_id(config.host_id.as_deref());
        store.set(
            &format!("{prefix}/nranks/{rank}"),
            nranks.to_string().as_bytes(),
        )?;
        store.set(
            &format!("{prefix}/host/{rank}"),
            format!("{host:016x}:{}", std::process::id()).as_bytes(),
        )?;
        let left = || deadline.saturating_duration_since(Instant::now());
        // Every rank's host and process, after checking that it runs with the same nranks.
        let mut descs = vec![mesh::describe_self(host); nranks];
        for (peer, d) in descs.iter_mut().enumerate() {
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
            let parsed = s.split_once(':').and_then(|(h, p)| {
                Some(ferroccl_transport::RankDesc {
                    host: u64::from_str_radix(h, 16).ok()?,
                    pid: p.parse().ok()?,
                })
            });
            *d = parsed.ok_or_else(|| {
                Error::internal(format!("init: rank {peer} published a bad host id {s:?}"))
            })?;
        }
        let (mut trs, order) = transports_for(&config, ip);
        let setup = ferroccl_transport::SetupCtx {
            rank,
            nranks,
            comm_id: id,
            ranks: &descs,
            deadline,
        };
        let mut ex = StoreExchange {
            store: &*store,
            prefix: &prefix,
            rank,
            nranks,
            deadline,
        };
        let mesh = mesh::connect_mesh(&setup, &mut trs, &order, &mut ex, &mesh_options(&config))
            .map_err(ctx)?;
        rendezvous::confirm(&*store, &claim, nranks, deadline)?;
        if config.debug >= DebugLevel::Info {
            let nshm = mesh
                .transports
                .iter()
                .filter(|t| **t == Some("shm"))
                .count();
            let listening = mesh
                .handles
                .iter()
                .find(|(name, _)| *name == "tcp")
                .map_or(ip.to_string(), |(_, h)| {
                    String::from_utf8_lossy(h).into_owned()
                });
            ferroccl_transport::log_line!(
                "ferroccl rank {rank} INIT: {nranks} ranks, id {id:016x}, listening on {listening}, TCP with {} stream(s) per peer, shared memory with {nshm} peer(s)",
                config.nstreams
            );
        }
        crate::topo::at_init(&config, rank, &descs)?;
        let measure = config.tune_measure;
        let comm = Self::from_parts(
            rank,
            nranks,
            id,
            config,
            ip,
            mesh,
            descs,
            Some(store),
            server.map(Arc::new),
        );
        if measure {
            comm.calibrate()?;
        }
        Ok(comm)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn from_parts(
        rank: usize,
        nranks: usize,
        id: u64,
        config: Config,
        listen_ip: IpAddr,
        mesh: mesh::Mesh,
        descs: Vec<ferroccl_transport::RankDesc>,
        store: Option<Arc<dyn Store>>,
        server: Option<Arc<bootstrap::TcpStoreServer>>,
    ) -> Communicator {
        let aborted = Arc::new(AtomicBool::new(false));
        let lane_bytes = mesh.lane_bytes;
        let mut engine = Engine::new(
            rank,
            nranks,
            mesh.conns,
            WaitPolicy {
                spin: config.spin,
                timeout: config.timeout,
            },
            Arc::clone(&aborted),
            config.slice_bytes,
            tuning(&config, &descs, listen_ip),
        );
        engine.set_lane_bytes(lane_bytes);
        // Every rank knows every rank's host and process, so all decide alike.
        let one_process = descs
            .iter()
            .all(|d| d.host == descs[rank].host && d.pid == descs[rank].pid);
        engine.set_peer_direct(config.device_peer && one_process && config.tries_p2p());
        let one_host = descs.iter().all(|d| d.host == descs[rank].host);
        engine.set_peer_windows(config.device_peer && one_host && config.tries_p2p());
        engine.set_peer_scratch(config.device_scratch_bytes);
        let device_transport = engine.carries_device_memory();
        let peer_direct = engine.peer_direct();
        let peer_windows = engine.peer_windows();
        let windows_in_order = engine.windows_in_order().into();
        Communicator {
            inner: Arc::new(Inner {
                rank,
                nranks,
                id,
                config,
                listen_ip,
                engine: Mutex::new(engine),
                failed: Mutex::new(None),
                has_failed: AtomicBool::new(false),
                told: AtomicBool::new(false),
                aborted,
                next_ticket: AtomicU64::new(0),
                order: Mutex::new(()),
                serving: AtomicU64::new(0),
                turn_waiters: AtomicUsize::new(0),
                turn: Condvar::new(),
                splits: AtomicU64::new(0),
                groups: AtomicU64::new(0),
                store,
                store_server: server,
                hosts: descs.iter().map(|d| d.host).collect(),
                descs,
                transports: mesh.transports,
                device_transport,
                peer_direct,
                peer_windows,
                windows_in_order,
            }),
            worker: Mutex::new(None),
            device: Arc::default(),
            streams: Default::default(),
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
        Self::local_group_with(vec![config; nranks])
    }

    /// As [`Communicator::local_group`], rank `r` with `configs[r]` (ranks may differ in
    /// their own settings, such as [`Config::p2p_device`]).
    pub fn local_group_with(configs: Vec<Config>) -> Result<Vec<Communicator>> {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let id = random_u64();
        let nranks = configs.len();
        let handles: Vec<_> = configs
            .into_iter()
            .enumerate()
            .map(|(r, config)| {
                let store = Arc::clone(&store);
                std::thread::Builder::new()
                    .name(format!("ferroccl-init-{r}"))
                    .spawn(move || Communicator::init(store, r, nranks, id, config))
            })
            .collect();
        join_inits(handles)
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

/// The tuner of a communicator whose ranks are `descs`.
fn tuning(
    config: &Config,
    descs: &[ferroccl_transport::RankDesc],
    ip: IpAddr,
) -> crate::exec::Tuning {
    let mut seen: Vec<u64> = Vec::new();
    let host_of = descs
        .iter()
        .map(|d| d.host)
        .map(|h| match seen.iter().position(|x| *x == h) {
            Some(i) => i,
            None => {
                seen.push(h);
                seen.len() - 1
            }
        })
        .collect();
    let mut model = crate::plan::CostModel {
        max_slice: config.slice_bytes.max(64),
        ..crate::plan::CostModel::default()
    };
    // The links of the transports that join ranks of one host and of two hosts, from the
    // configuration alone (every rank's tuner must agree).
    let (intra, inter) = mesh::tuner_links(&transports_for(config, ip).0);
    if let Some(p) = intra {
        model.intra = p.link;
    }
    if let Some(p) = inter {
        model.inter = p.link;
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
