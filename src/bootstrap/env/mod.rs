//! Launcher detection: rank, number of ranks and store address from the environment a
//! launcher set up.
//!
//! [`detect`] looks at the launchers below in this order and uses the first one present.
//! Every rank must see the same launcher.
//!
//! | launcher | detected by | rank, nranks | local rank, local nranks | job id |
//! |---|---|---|---|---|
//! | `ferrorun` | `FERRO_RANK` or `FERRO_NRANKS` | `FERRO_RANK`, `FERRO_NRANKS` | `FERRO_LOCAL_RANK`, `FERRO_LOCAL_NRANKS` | `FERRO_JOB_ID` |
//! | torchrun | `RANK` and `WORLD_SIZE` | `RANK`, `WORLD_SIZE` | `LOCAL_RANK`, `LOCAL_WORLD_SIZE` | `TORCHELASTIC_RUN_ID` |
//! | SLURM (`srun`) | `SLURM_PROCID` and `SLURM_NTASKS` | `SLURM_PROCID`, `SLURM_NTASKS` | `SLURM_LOCALID`, `SLURM_NTASKS_PER_NODE` or this node's entry of `SLURM_STEP_TASKS_PER_NODE` / `SLURM_TASKS_PER_NODE` | `SLURM_JOB_ID.SLURM_STEP_ID` |
//! | Open MPI (`mpirun`) | `OMPI_COMM_WORLD_RANK` and `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_SIZE` | `PMIX_NAMESPACE`, `OMPI_MCA_orte_ess_jobid` or `OMPI_MCA_ess_base_jobid` |
//!
//! # The store address
//!
//! Rank 0 hosts ferroccl's TCP store ([`LaunchEnv::host_store`]); the other ranks connect to
//! [`LaunchEnv::store_addr`]. It is, in order:
//!
//! 1. `FERRO_STORE_ADDR` (`host:port`), if set;
//! 2. else `MASTER_ADDR` with port `FERRO_STORE_PORT` if set, else **`MASTER_PORT + 1`**
//!    (under torchrun an unset `MASTER_PORT` is 29500, torchrun's default, so the store takes
//!    29501).
//!
//! torchrun already runs its own c10d store on `MASTER_PORT`, so ferroccl never listens there:
//! by default its store takes the next port, `MASTER_PORT + 1`. If that port is taken on the
//! rank-0 host, set `FERRO_STORE_PORT` to a free one (the same on every rank).
//!
//! torchrun requires `MASTER_ADDR`; an unset `MASTER_PORT` is 29500, as torchrun takes it, and
//! one that is set must be a port number. Under SLURM and Open MPI either `FERRO_STORE_ADDR` or
//! `MASTER_ADDR` (with `MASTER_PORT` or `FERRO_STORE_PORT`) must be set, except that when every
//! rank runs on one host (`OMPI_COMM_WORLD_LOCAL_SIZE == OMPI_COMM_WORLD_SIZE`; under SLURM
//! all tasks on the node, or `SLURM_STEP_NUM_NODES` / `SLURM_JOB_NUM_NODES` / `SLURM_NNODES`
//! equal to 1) and no address is given, `store_addr` is `None` and the ranks share a job store ([`FileStore::new_for_job`](super::FileStore::new_for_job)) in
//! [`LaunchEnv::file_store_dir`], removed when the last rank is done.
//!
//! Host names (`MASTER_ADDR=localhost`, `FERRO_STORE_ADDR=node17:29600`) are resolved, IPv4
//! preferred, so that every rank and the hosting rank agree on one address family.
#![forbid(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use crate::{Error, Result};

/// Which launcher started this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Launcher {
    /// ferroccl's own launcher, `ferrorun` (`FERRO_*` variables).
    Ferro,
    /// PyTorch's `torchrun` (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, ...).
    Torchrun,
    /// SLURM's `srun` (`SLURM_PROCID`, ...).
    Slurm,
    /// Open MPI's `mpirun` (`OMPI_COMM_WORLD_*`).
    OpenMpi,
}

impl Launcher {
    /// The launcher's name as used in messages.
    pub fn name(self) -> &'static str {
        match self {
            Launcher::Ferro => "ferrorun",
            Launcher::Torchrun => "torchrun",
            Launcher::Slurm => "SLURM",
            Launcher::OpenMpi => "Open MPI",
        }
    }
}

/// What the launcher told this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    /// This process's rank.
    pub rank: usize,
    /// The number of ranks in the job.
    pub nranks: usize,
    /// The rank among the ranks on this host, if the launcher says.
    pub local_rank: Option<usize>,
    /// The number of ranks on this host, if the launcher says.
    pub local_nranks: Option<usize>,
    /// The TCP store's address; `None`: use a file store in [`file_store_dir`](Self::file_store_dir).
    pub store_addr: Option<SocketAddr>,
    /// Whether this process must run the TCP store server (rank 0, when there is an address).
    pub host_store: bool,
    /// An id shared by every rank of the job and distinct between jobs.
    pub job_id: String,
    /// Which launcher this came from.
    pub launcher: Launcher,
}

impl LaunchEnv {
    /// The directory for a [`FileStore`](super::FileStore) when there is no store address
    /// (all ranks on one host): `/tmp/ferroccl-<job id>`, with unusual characters of the job
    /// id replaced by `_`. Open it with [`FileStore::new_for_job`](super::FileStore::new_for_job):
    /// the directory then goes when the job's last rank drops its store, and one left by a
    /// killed job is swept by the next job store opened in `/tmp`.
    pub fn file_store_dir(&self) -> Option<PathBuf> {
        if self.store_addr.is_some() {
            return None;
        }
        let id: String = self
            .job_id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        Some(PathBuf::from(format!("/tmp/ferroccl-{id}")))
    }

    /// Where the hosting rank should bind its store server: every interface of the store
    /// address's family, on its port (the address itself may be a name that resolves to a
    /// loopback address on the hosting host). `None` unless [`host_store`](Self::host_store).
    pub fn store_bind_addr(&self) -> Option<SocketAddr> {
        let addr = self.store_addr.filter(|_| self.host_store)?;
        let any = match addr {
            SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        };
        Some(SocketAddr::new(any, addr.port()))
    }
}

/// Reads the launcher's variables from this process's environment (see the module docs).
/// `Ok(None)`: no known launcher started this process.
pub fn detect() -> Result<Option<LaunchEnv>> {
    detect_from(&|name| std::env::var(name).ok())
}

/// [`detect`] reading variables through `vars` instead of the process environment.
pub fn detect_from(vars: &dyn Fn(&str) -> Option<String>) -> Result<Option<LaunchEnv>> {
    let v = Vars { get: vars };
    if v.has("FERRO_RANK") || v.has("FERRO_NRANKS") {
        return ferro(&v).map(Some);
    }
    if v.has("RANK") && v.has("WORLD_SIZE") {
        return torchrun(&v).map(Some);
    }
    if v.has("SLURM_PROCID") && (v.has("SLURM_NTASKS") || v.has("SLURM_NPROCS")) {
        return slurm(&v).map(Some);
    }
    if v.has("OMPI_COMM_WORLD_RANK") && v.has("OMPI_COMM_WORLD_SIZE") {
        return open_mpi(&v).map(Some);
    }
    Ok(None)
}

fn ferro(v: &Vars<'_>) -> Result<LaunchEnv> {
    let l = Launcher::Ferro;
    let rank = v.required(l, "FERRO_RANK")?;
    let nranks = v.required(l, "FERRO_NRANKS")?;
    let local_rank = v.number(l, "FERRO_LOCAL_RANK")?;
    let local_nranks = v.number(l, "FERRO_LOCAL_NRANKS")?;
    let store = store_addr(v, l)?.ok_or_else(|| {
        Error::invalid_usage(
            "ferrorun environment: FERRO_RANK is set but FERRO_STORE_ADDR is not; set \
             FERRO_STORE_ADDR=<host of rank 0>:<free port> on every rank (ferrorun sets it)",
        )
    })?;
    let job_id = v
        .get("FERRO_JOB_ID")
        .unwrap_or_else(|| format!("ferro-{store}"));
    finish(
        l,
        rank,
        nranks,
        local_rank,
        local_nranks,
        Some(store),
        job_id,
    )
}

fn torchrun(v: &Vars<'_>) -> Result<LaunchEnv> {
    let l = Launcher::Torchrun;
    let rank = v.required(l, "RANK")?;
    let nranks = v.required(l, "WORLD_SIZE")?;
    let local_rank = v.number(l, "LOCAL_RANK")?;
    let local_nranks = v.number(l, "LOCAL_WORLD_SIZE")?;
    if !v.has("MASTER_ADDR") {
        return Err(Error::invalid_usage(
            "torchrun environment: RANK and WORLD_SIZE are set but MASTER_ADDR is not; \
             torchrun sets MASTER_ADDR (and MASTER_PORT, default 29500), set it when launching \
             otherwise",
        ));
    }
    let store = store_addr(v, l)?;
    let job_id = match v.get("TORCHELASTIC_RUN_ID").filter(|id| id != "none") {
        Some(id) => id,
        None => format!(
            "torchrun-{}-{}",
            v.get("MASTER_ADDR").unwrap_or_default(),
            v.get("MASTER_PORT")
                .unwrap_or_else(|| DEFAULT_MASTER_PORT.to_string())
        ),
    };
    finish(l, rank, nranks, local_rank, local_nranks, store, job_id)
}

fn slurm(v: &Vars<'_>) -> Result<LaunchEnv> {
    let l = Launcher::Slurm;
    let rank = v.required(l, "SLURM_PROCID")?;
    let nranks = match v.number(l, "SLURM_NTASKS")? {
        Some(n) => n,
        None => v.required(l, "SLURM_NPROCS")?,
    };
    let local_rank = v.number(l, "SLURM_LOCALID")?;
    let local_nranks = match v.number(l, "SLURM_NTASKS_PER_NODE") {
        Ok(Some(n)) => Some(n),
        // SLURM_NTASKS_PER_NODE may be absent or a list on heterogeneous jobs: use the
        // per-node lists instead.
        _ => {
            let node = v.number(l, "SLURM_NODEID")?;
            ["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"]
                .iter()
                .find_map(|name| v.get(name))
                .and_then(|list| tasks_on_node(&list, node))
        }
    };
    let store = store_addr(v, l)?;
    // One node (all tasks local, or SLURM says one node): a job store in /tmp, as under mpirun.
    let one_node = local_nranks == Some(nranks)
        || [
            "SLURM_STEP_NUM_NODES",
            "SLURM_JOB_NUM_NODES",
            "SLURM_NNODES",
        ]
        .iter()
        .find_map(|name| v.get(name))
        .is_some_and(|n| n.trim() == "1");
    if store.is_none() && !one_node {
        return Err(Error::invalid_usage(
            "SLURM environment: the tasks span several nodes, so ferroccl needs the address of \
             its store, hosted by rank 0; set FERRO_STORE_ADDR=<host of rank 0>:<free port> on \
             every rank (e.g. FERRO_STORE_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" \
             | head -n1):29600), or MASTER_ADDR=<host of rank 0> with MASTER_PORT (the store \
             uses MASTER_PORT+1) or FERRO_STORE_PORT",
        ));
    }
    let job = v.get("SLURM_JOB_ID").or_else(|| v.get("SLURM_JOBID"));
    let step = v.get("SLURM_STEP_ID").or_else(|| v.get("SLURM_STEPID"));
    let job_id = match (job, step) {
        (Some(job), Some(step)) => format!("slurm-{job}.{step}"),
        (Some(job), None) => format!("slurm-{job}"),
        // The tasks of a step on one node are children of the same slurmstepd.
        (None, _) => format!("slurm-ppid{}", std::os::unix::process::parent_id()),
    };
    finish(l, rank, nranks, local_rank, local_nranks, store, job_id)
}

fn open_mpi(v: &Vars<'_>) -> Result<LaunchEnv> {
    let l = Launcher::OpenMpi;
    let rank = v.required(l, "OMPI_COMM_WORLD_RANK")?;
    let nranks = v.required(l, "OMPI_COMM_WORLD_SIZE")?;
    let local_rank = v.number(l, "OMPI_COMM_WORLD_LOCAL_RANK")?;
    let local_nranks = v.number(l, "OMPI_COMM_WORLD_LOCAL_SIZE")?;
    let store = store_addr(v, l)?;
    if store.is_none() && local_nranks != Some(nranks) {
        return Err(Error::invalid_usage(format!(
            "Open MPI environment: the {nranks} ranks span several hosts \
             (OMPI_COMM_WORLD_LOCAL_SIZE={}), so ferroccl needs the address of its store, \
             hosted by rank 0; pass FERRO_STORE_ADDR=<host of rank 0>:<free port> to every rank \
             (mpirun -x FERRO_STORE_ADDR=...), or MASTER_ADDR with MASTER_PORT (the store uses \
             MASTER_PORT+1) or FERRO_STORE_PORT",
            local_nranks.map_or_else(|| "unset".to_string(), |n| n.to_string())
        )));
    }
    // Open MPI 4 (ORTE) sets OMPI_MCA_orte_ess_jobid; with PMIx (4.x and 5.x) PMIX_NAMESPACE
    // names the job; 5.x also sets OMPI_MCA_ess_base_jobid.
    let job_id = match [
        "PMIX_NAMESPACE",
        "OMPI_MCA_orte_ess_jobid",
        "OMPI_MCA_ess_base_jobid",
    ]
    .iter()
    .find_map(|name| v.get(name))
    {
        Some(id) => format!("ompi-{id}"),
        // Ranks on one host are children of the same mpirun.
        None => format!("ompi-ppid{}", std::os::unix::process::parent_id()),
    };
    finish(l, rank, nranks, local_rank, local_nranks, store, job_id)
}

/// Validates the numbers and assembles the result.
fn finish(
    launcher: Launcher,
    rank: usize,
    nranks: usize,
    local_rank: Option<usize>,
    local_nranks: Option<usize>,
    store_addr: Option<SocketAddr>,
    job_id: String,
) -> Result<LaunchEnv> {
    let names = launcher_names(launcher);
    let what = launcher.name();
    if nranks == 0 {
        return Err(Error::invalid_argument(format!(
            "{what} environment: {}=0, a job needs at least one rank",
            names.nranks
        )));
    }
    if rank >= nranks {
        return Err(Error::invalid_argument(format!(
            "{what} environment: {}={rank} is not below {}={nranks}",
            names.rank, names.nranks
        )));
    }
    if let (Some(lr), Some(ln)) = (local_rank, local_nranks) {
        if lr >= ln {
            return Err(Error::invalid_argument(format!(
                "{what} environment: {}={lr} is not below {}={ln}",
                names.local_rank, names.local_nranks
            )));
        }
    }
    if let Some(ln) = local_nranks {
        if ln == 0 || ln > nranks {
            return Err(Error::invalid_argument(format!(
                "{what} environment: {}={ln} must be between 1 and {}={nranks}",
                names.local_nranks, names.nranks
            )));
        }
    }
    Ok(LaunchEnv {
        rank,
        nranks,
        local_rank,
        local_nranks,
        host_store: store_addr.is_some() && rank == 0,
        store_addr,
        job_id,
        launcher,
    })
}

struct Names {
    rank: &'static str,
    nranks: &'static str,
    local_rank: &'static str,
    local_nranks: &'static str,
}

fn launcher_names(l: Launcher) -> Names {
    let (rank, nranks, local_rank, local_nranks) = match l {
        Launcher::Ferro => (
            "FERRO_RANK",
            "FERRO_NRANKS",
            "FERRO_LOCAL_RANK",
            "FERRO_LOCAL_NRANKS",
        ),
        Launcher::Torchrun => ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
        Launcher::Slurm => (
            "SLURM_PROCID",
            "SLURM_NTASKS",
            "SLURM_LOCALID",
            "local tasks (SLURM_*TASKS_PER_NODE)",
        ),
        Launcher::OpenMpi => (
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ),
    };
    Names {
        rank,
        nranks,
        local_rank,
        local_nranks,
    }
}

/// torchrun's `MASTER_PORT` when none is given.
const DEFAULT_MASTER_PORT: u16 = 29500;

/// The store address: `FERRO_STORE_ADDR`, else `MASTER_ADDR` on `FERRO_STORE_PORT` or
/// `MASTER_PORT + 1` (torchrun's default `MASTER_PORT`, 29500, when unset under torchrun);
/// `None` when neither address variable is set.
fn store_addr(v: &Vars<'_>, l: Launcher) -> Result<Option<SocketAddr>> {
    let what = l.name();
    if let Some(addr) = v.get("FERRO_STORE_ADDR") {
        return resolve_host_port(&addr).map(Some).map_err(|why| {
            Error::invalid_argument(format!(
                "{what} environment: FERRO_STORE_ADDR={addr:?}: {why} (expected host:port, \
                     e.g. node17:29600 or [fd00::3]:29600)"
            ))
        });
    }
    let Some(host) = v.get("MASTER_ADDR") else {
        return Ok(None);
    };
    let port = match v.get("FERRO_STORE_PORT") {
        Some(p) => parse_port(&p).ok_or_else(|| {
            Error::invalid_argument(format!(
                "{what} environment: FERRO_STORE_PORT={p:?} is not a port number (1-65535)"
            ))
        })?,
        None => {
            let master = match v.get("MASTER_PORT") {
                Some(p) => parse_port(&p).ok_or_else(|| {
                    Error::invalid_argument(format!(
                        "{what} environment: MASTER_PORT={p:?} is not a port number (1-65535)"
                    ))
                })?,
                None if l == Launcher::Torchrun => DEFAULT_MASTER_PORT,
                None => {
                    return Err(Error::invalid_usage(format!(
                        "{what} environment: MASTER_ADDR={host} is set but neither MASTER_PORT \
                         nor FERRO_STORE_PORT is; ferroccl's store listens on FERRO_STORE_PORT, \
                         or MASTER_PORT+1"
                    )));
                }
            };
            master.checked_add(1).ok_or_else(|| {
                Error::invalid_argument(format!(
                    "{what} environment: MASTER_PORT={master}: ferroccl's store listens on \
                     MASTER_PORT+1, which is past 65535; set FERRO_STORE_PORT to a free port"
                ))
            })?
        }
    };
    resolve(&host, port).map(Some).map_err(|why| {
        Error::invalid_argument(format!("{what} environment: MASTER_ADDR={host:?}: {why}"))
    })
}

fn parse_port(s: &str) -> Option<u16> {
    s.trim().parse::<u16>().ok().filter(|&p| p != 0)
}

/// Parses and resolves `host:port` (`[v6]:port` for IPv6 literals).
fn resolve_host_port(s: &str) -> std::result::Result<SocketAddr, String> {
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return (addr.port() != 0)
            .then_some(addr)
            .ok_or_else(|| "port 0".to_string());
    }
    let (host, port) = s.rsplit_once(':').ok_or("no port")?;
    let port = parse_port(port).ok_or_else(|| format!("port {port:?} is not 1-65535"))?;
    resolve(host, port)
}

/// Resolves `host` (a name or an IP literal, IPv6 optionally in brackets), IPv4 preferred.
fn resolve(host: &str, port: u16) -> std::result::Result<SocketAddr, String> {
    let bare = host.trim().trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    if bare.is_empty() {
        return Err("empty host".into());
    }
    let addrs: Vec<SocketAddr> = (bare, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve host name {bare:?}: {e}"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| format!("host name {bare:?} resolves to no address"))
}

/// This node's entry of a SLURM tasks-per-node list such as `2(x3),1` (= 2,2,2,1). Without a
/// node index, only a list with one distinct count answers.
fn tasks_on_node(list: &str, node: Option<usize>) -> Option<usize> {
    let mut counts = Vec::new();
    for part in list.split(',') {
        let part = part.trim();
        let (count, times) = match part.split_once("(x") {
            Some((c, rest)) => (c, rest.strip_suffix(')')?.parse::<usize>().ok()?),
            None => (part, 1),
        };
        let count = count.parse::<usize>().ok()?;
        // Guard against absurd repeat counts (more nodes than any machine has).
        if times > 1 << 20 || counts.len() + times > 1 << 20 {
            return None;
        }
        counts.extend(std::iter::repeat_n(count, times));
    }
    match node {
        Some(n) => counts.get(n).copied(),
        None => {
            let first = *counts.first()?;
            counts.iter().all(|&c| c == first).then_some(first)
        }
    }
}

/// Access to the variables, with parsing and messages.
struct Vars<'a> {
    get: &'a dyn Fn(&str) -> Option<String>,
}

impl Vars<'_> {
    /// The value of `name`, trimmed; unset and empty are the same.
    fn get(&self, name: &str) -> Option<String> {
        (self.get)(name)
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    }

    fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// `name` as a non-negative integer, `None` when unset.
    fn number(&self, l: Launcher, name: &str) -> Result<Option<usize>> {
        match self.get(name) {
            None => Ok(None),
            Some(s) => s.parse::<usize>().map(Some).map_err(|_| {
                Error::invalid_argument(format!(
                    "{} environment: {name}={s:?} is not a non-negative integer",
                    l.name()
                ))
            }),
        }
    }

    fn required(&self, l: Launcher, name: &str) -> Result<usize> {
        self.number(l, name)?.ok_or_else(|| {
            Error::invalid_usage(format!(
                "{} environment: {name} is not set (the launcher sets it on every rank)",
                l.name()
            ))
        })
    }
}

#[cfg(test)]
mod tests;
