//! Which host each rank runs on, and the environment it gets.

use std::net::SocketAddr;

/// `FERRO_RANK`: the rank, 0..nranks.
pub const ENV_RANK: &str = "FERRO_RANK";
/// `FERRO_NRANKS`: the number of ranks in the job.
pub const ENV_NRANKS: &str = "FERRO_NRANKS";
/// `FERRO_LOCAL_RANK`: the rank among the ranks on its host.
pub const ENV_LOCAL_RANK: &str = "FERRO_LOCAL_RANK";
/// `FERRO_LOCAL_NRANKS`: the number of ranks on its host.
pub const ENV_LOCAL_NRANKS: &str = "FERRO_LOCAL_NRANKS";
/// `FERRO_STORE_ADDR`: `ip:port` where rank 0 hosts the rendezvous store.
pub const ENV_STORE_ADDR: &str = "FERRO_STORE_ADDR";
/// `FERRO_JOB_ID`: unique per launch.
pub const ENV_JOB_ID: &str = "FERRO_JOB_ID";
/// `FERRO_HOST`: the network namespace a rank runs in (set only when ranks run in namespaces).
pub const ENV_HOST: &str = "FERRO_HOST";

/// Where one rank runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankPlacement {
    /// The rank.
    pub rank: usize,
    /// Ranks in the job.
    pub nranks: usize,
    /// Rank among the ranks on the same host.
    pub local_rank: usize,
    /// Ranks on the same host.
    pub local_nranks: usize,
    /// The network namespace standing in for its host; `None` runs here.
    pub host: Option<String>,
}

/// Places `nranks` ranks round-robin on `hosts` (rank `i` on `hosts[i % len]`); with no hosts,
/// every rank runs here and they all share one host.
pub fn place_ranks(nranks: usize, hosts: &[String]) -> Vec<RankPlacement> {
    let nhosts = hosts.len().max(1);
    (0..nranks)
        .map(|rank| {
            let host = rank % nhosts;
            RankPlacement {
                rank,
                nranks,
                local_rank: rank / nhosts,
                // Ranks host, host + nhosts, ... below nranks.
                local_nranks: (nranks - host).div_ceil(nhosts),
                host: hosts.get(host).cloned(),
            }
        })
        .collect()
}

/// A unique id for one launch: the launcher's pid and the time in nanoseconds.
pub fn new_job_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}-{nanos}", std::process::id())
}

/// The `FERRO_*` environment of the rank at `placement`.
pub fn rank_env(
    placement: &RankPlacement,
    store_addr: SocketAddr,
    job_id: &str,
) -> Vec<(&'static str, String)> {
    let mut env = vec![
        (ENV_RANK, placement.rank.to_string()),
        (ENV_NRANKS, placement.nranks.to_string()),
        (ENV_LOCAL_RANK, placement.local_rank.to_string()),
        (ENV_LOCAL_NRANKS, placement.local_nranks.to_string()),
        (ENV_STORE_ADDR, store_addr.to_string()),
        (ENV_JOB_ID, job_id.to_string()),
    ];
    if let Some(host) = &placement.host {
        env.push((ENV_HOST, host.clone()));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn no_hosts_means_one_local_host() {
        let p = place_ranks(3, &[]);
        assert_eq!(p.len(), 3);
        for (i, r) in p.iter().enumerate() {
            assert_eq!(
                (r.rank, r.nranks, r.local_rank, r.local_nranks),
                (i, 3, i, 3)
            );
            assert_eq!(r.host, None);
        }
    }

    #[test]
    fn round_robin_over_hosts() {
        let p = place_ranks(5, &hosts(&["a", "b"]));
        let got: Vec<(usize, usize, &str)> = p
            .iter()
            .map(|r| {
                (
                    r.local_rank,
                    r.local_nranks,
                    r.host.as_deref().unwrap_or("-"),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 3, "a"),
                (0, 2, "b"),
                (1, 3, "a"),
                (1, 2, "b"),
                (2, 3, "a")
            ]
        );
    }

    #[test]
    fn local_ranks_are_consistent_for_every_shape() {
        let names = hosts(&["h0", "h1", "h2", "h3", "h4"]);
        for nhosts in 1..=names.len() {
            for nranks in 1..=17 {
                let p = place_ranks(nranks, &names[..nhosts]);
                for host in &names[..nhosts] {
                    let on_host: Vec<&RankPlacement> = p
                        .iter()
                        .filter(|r| r.host.as_deref() == Some(host.as_str()))
                        .collect();
                    for (i, r) in on_host.iter().enumerate() {
                        assert_eq!(r.local_rank, i, "nranks {nranks} nhosts {nhosts} {r:?}");
                        assert_eq!(r.local_nranks, on_host.len(), "{r:?}");
                    }
                }
                assert_eq!(
                    p.iter().map(|r| r.rank).collect::<Vec<_>>(),
                    (0..nranks).collect::<Vec<_>>()
                );
            }
        }
    }

    #[test]
    fn environment() {
        let p = &place_ranks(4, &hosts(&["x", "y"]))[3];
        let addr: SocketAddr = "10.1.2.3:4567".parse().unwrap();
        let env = rank_env(p, addr, "77-123");
        assert_eq!(
            env,
            vec![
                ("FERRO_RANK", "3".to_string()),
                ("FERRO_NRANKS", "4".to_string()),
                ("FERRO_LOCAL_RANK", "1".to_string()),
                ("FERRO_LOCAL_NRANKS", "2".to_string()),
                ("FERRO_STORE_ADDR", "10.1.2.3:4567".to_string()),
                ("FERRO_JOB_ID", "77-123".to_string()),
                ("FERRO_HOST", "y".to_string()),
            ]
        );
        let local = rank_env(&place_ranks(1, &[])[0], addr, "j");
        assert!(local.iter().all(|(k, _)| *k != "FERRO_HOST"));
    }

    #[test]
    fn job_ids_differ() {
        let a = new_job_id();
        std::thread::sleep(std::time::Duration::from_millis(1));
        let b = new_job_id();
        assert_ne!(a, b);
        assert!(a.starts_with(&format!("{}-", std::process::id())));
    }
}
