//! The conformance suite with ranks spread over network namespaces that stand in for hosts
//! (`ferrorun --netns`), so every byte between ranks on different hosts crosses a veth pair and
//! a bridge instead of loopback.
//!
//! Each test builds its hosts with `common::netns::NetnsHosts` and is skipped (with a printed
//! reason) only where namespaces cannot be built here.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use common::child::{self, algo_env, expected_cases, ferrorun_self, field, sweep_named, ALGOS};
use common::conformance::run_sweep;
use common::netns::{netns_available, NetnsHosts};
use ferroccl::Communicator;

/// Per-job limit (ferrorun's `--timeout`).
const JOB_LIMIT: Duration = Duration::from_secs(240);

/// The IPv4 address this process uses to reach `store` (no packet is sent).
fn route_ip(store: SocketAddr) -> Ipv4Addr {
    let s = UdpSocket::bind("0.0.0.0:0").expect("bind udp");
    s.connect(store).expect("route to the store");
    match s.local_addr().expect("local_addr").ip() {
        std::net::IpAddr::V4(ip) => ip,
        other => panic!("expected an IPv4 route to {store}, got {other}"),
    }
}

/// The network namespace this process is in, as a number (the nsfs inode).
fn netns_inode() -> u64 {
    let link = std::fs::read_link("/proc/self/ns/net").expect("read /proc/self/ns/net");
    let s = link.to_string_lossy();
    s.strip_prefix("net:[")
        .and_then(|r| r.strip_suffix(']'))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected /proc/self/ns/net link {s:?}"))
}

/// A rank placed in a namespace: reports where it is, gathers where everyone is, then runs the
/// sweep named by `FERRO_TEST_SWEEP`.
#[test]
fn child_netns_conformance() {
    if !child::is_role("netns") {
        return;
    }
    let host: String = child::env_var("FERRO_HOST");
    let store: SocketAddr = child::env_var("FERRO_STORE_ADDR");
    let ip = route_ip(store);
    let ns = netns_inode();
    let comm = Communicator::from_env().expect("from_env");
    let (r, n) = (comm.rank(), comm.nranks());
    println!("WHERE rank={r} host={host} ip={ip} netns={ns}");
    // Everyone's (ip, namespace), gathered over the namespaces' network itself.
    let mut all = vec![0u64; 2 * n];
    comm.all_gather(&[u64::from(u32::from(ip)), ns], &mut all)
        .expect("all_gather");
    let table: Vec<String> = all
        .chunks(2)
        .map(|p| format!("{}/{}", Ipv4Addr::from(p[0] as u32), p[1]))
        .collect();
    println!("GATHERED rank={r} all={}", table.join(","));

    let sweep = sweep_named(&child::env_var::<String>(child::SWEEP_VAR));
    let start = Instant::now();
    match run_sweep(&comm, &sweep, 5000 + n as u64) {
        Ok(cases) => println!(
            "CASES rank={r} nranks={n} cases={cases} secs={:.1}",
            start.elapsed().as_secs_f64()
        ),
        Err(e) => panic!("host {host}: {e}"),
    }
    comm.destroy().expect("destroy");
}

/// Runs `nranks` ranks over `nhosts` hosts (rank `r` on host `r % nhosts`) with the sweep
/// `sweep`, and checks placement, addresses and case counts.
fn over_hosts(test: &str, nhosts: usize, nranks: usize, sweep: &str) {
    if let Err(why) = netns_available() {
        println!("skipped: {test}: {why}");
        return;
    }
    let hosts = NetnsHosts::up(nhosts).expect("build namespace hosts");
    let env = [
        (child::SWEEP_VAR, sweep.to_string()),
        ("FERRO_TIMEOUT", "60".to_string()),
    ];
    over_built_hosts(test, &hosts, nranks, sweep, &env);
}

/// [`over_hosts`] on hosts already built, with the job's environment `env` (which names the
/// sweep).
fn over_built_hosts(
    test: &str,
    hosts: &NetnsHosts,
    nranks: usize,
    sweep: &str,
    env: &[(&str, String)],
) -> child::Finished {
    let nhosts = hosts.len();
    let mut env = env.to_vec();
    if !env.iter().any(|(k, _)| *k == "FERRO_DEBUG") {
        env.push(("FERRO_DEBUG", "INFO".to_string()));
    }
    let out = ferrorun_self(
        nranks,
        Some(&hosts.netns_arg()),
        "child_netns_conformance",
        "netns",
        &env,
        JOB_LIMIT,
    );
    assert!(out.success(), "{test}: {}", out.dump());
    if let Some((_, algo)) = env.iter().find(|(k, _)| *k == "FERRO_ALGO") {
        child::assert_algo_used(&out, algo);
    }

    // Where each rank ran, as it saw it.
    let mut ns_of = BTreeMap::new();
    let mut ip_of = BTreeMap::new();
    for l in out.tagged("WHERE ") {
        let r: usize = field(&l, "rank");
        let h = r % nhosts;
        assert_eq!(field::<String>(&l, "host"), hosts.name(h), "{l}");
        assert_eq!(field::<Ipv4Addr>(&l, "ip"), hosts.addr(h), "{l}");
        ns_of.insert(r, field::<u64>(&l, "netns"));
        ip_of.insert(r, field::<Ipv4Addr>(&l, "ip"));
    }
    assert_eq!(ns_of.len(), nranks, "{}", out.dump());
    for a in 0..nranks {
        for b in 0..nranks {
            let same_host = a % nhosts == b % nhosts;
            assert_eq!(
                ns_of[&a] == ns_of[&b],
                same_host,
                "ranks {a}, {b}: {ns_of:?}"
            );
            assert_eq!(
                ip_of[&a] == ip_of[&b],
                same_host,
                "ranks {a}, {b}: {ip_of:?}"
            );
        }
    }

    // The communicator listens on its host's address, not on loopback.
    let mut listening = BTreeSet::new();
    for l in out.tagged("ferroccl rank ") {
        let Some(rest) = l.strip_prefix("ferroccl rank ") else {
            continue;
        };
        let Some((rank, info)) = rest.split_once(" INIT:") else {
            continue;
        };
        let r: usize = rank.parse().expect("rank in INIT line");
        let addr: SocketAddr = info
            .split_once("listening on ")
            .and_then(|(_, a)| a.split(',').next())
            .and_then(|a| a.trim().parse().ok())
            .unwrap_or_else(|| panic!("no listen address in {l:?}"));
        assert_eq!(addr.ip(), hosts.addr(r % nhosts), "{l}");
        listening.insert(r);
    }
    assert_eq!(listening, (0..nranks).collect(), "{}", out.dump());

    // The table gathered across hosts matches what every rank said about itself.
    let want: Vec<String> = (0..nranks)
        .map(|r| format!("{}/{}", ip_of[&r], ns_of[&r]))
        .collect();
    let gathered = out.tagged("GATHERED ");
    assert_eq!(gathered.len(), nranks, "{}", out.dump());
    for l in &gathered {
        assert_eq!(field::<String>(l, "all"), want.join(","), "{l}");
    }

    let cases = expected_cases(&sweep_named(sweep));
    let lines = out.tagged("CASES ");
    assert_eq!(lines.len(), nranks, "{}", out.dump());
    for l in &lines {
        assert_eq!(field::<usize>(l, "cases"), cases, "{l}");
    }
    println!(
        "{test}: {nranks} ranks on {nhosts} hosts, {cases} cases per rank in {:.1} s",
        out.took.as_secs_f64()
    );
    out
}

#[test]
fn two_hosts_two_ranks_each() {
    over_hosts("two_hosts_two_ranks_each", 2, 4, "small");
}

#[test]
fn three_hosts_one_rank_each() {
    over_hosts("three_hosts_one_rank_each", 3, 3, "small");
}

#[test]
fn four_hosts_two_ranks_each_reduced_sweep() {
    over_hosts("four_hosts_two_ranks_each_reduced_sweep", 4, 8, "reduced");
}

/// Every algorithm forced in turn (`FERRO_ALGO`), through the collectives it implements, on 4
/// hosts of 2 ranks (shared memory inside a host, TCP across; ranks placed round-robin, so a
/// host's ranks are not consecutive).
#[test]
fn four_hosts_two_ranks_each_every_algorithm() {
    let test = "four_hosts_two_ranks_each_every_algorithm";
    if let Err(why) = netns_available() {
        println!("skipped: {test}: {why}");
        return;
    }
    let hosts = NetnsHosts::up(4).expect("build namespace hosts");
    for algo in ALGOS {
        let sweep = format!("algo-{algo}");
        over_built_hosts(
            &format!("{test} FERRO_ALGO={algo}"),
            &hosts,
            8,
            &sweep,
            &algo_env(algo),
        );
    }
}

/// Messages across hosts delayed by `FERRO_LINK_DELAY_US` (shared memory inside hosts is
/// not): every algorithm still gives exact results, and exactly the TCP links are delayed.
#[test]
fn four_hosts_with_link_delay_every_algorithm() {
    let test = "four_hosts_with_link_delay_every_algorithm";
    if let Err(why) = netns_available() {
        println!("skipped: {test}: {why}");
        return;
    }
    let hosts = NetnsHosts::up(4).expect("build namespace hosts");
    for algo in ALGOS {
        let sweep = format!("delay-{algo}");
        let mut env = algo_env(algo);
        env[0].1.clone_from(&sweep);
        env.push(("FERRO_LINK_DELAY_US", "300".to_string()));
        let out = over_built_hosts(
            &format!("{test} FERRO_ALGO={algo}"),
            &hosts,
            8,
            &sweep,
            &env,
        );
        let lines: Vec<String> = out
            .tagged("ferroccl rank ")
            .into_iter()
            .filter(|l| l.contains(" TRANSPORT: "))
            .collect();
        assert_eq!(lines.len(), 8, "{}", out.dump());
        for l in &lines {
            let peers = l.split_once("peers ").map_or("", |(_, p)| p);
            for entry in peers.split(", ") {
                let delayed = entry.contains("(+300 us delay)");
                assert_eq!(delayed, entry.contains(":tcp"), "{l}");
            }
        }
    }
}

/// `FERRO_TUNE=measure` on 4 hosts of 2 ranks: rank 0 logs the calibration of both links in
/// use, and with the tuner choosing for every size the whole reduced sweep stays exact.
#[test]
fn four_hosts_two_ranks_each_measured_tuning() {
    let test = "four_hosts_two_ranks_each_measured_tuning";
    if let Err(why) = netns_available() {
        println!("skipped: {test}: {why}");
        return;
    }
    let hosts = NetnsHosts::up(4).expect("build namespace hosts");
    let env = [
        (child::SWEEP_VAR, "reduced".to_string()),
        ("FERRO_TIMEOUT", "60".to_string()),
        ("FERRO_TUNE", "measure".to_string()),
    ];
    let out = over_built_hosts(test, &hosts, 8, "reduced", &env);
    let lines = out.tagged("TUNING: calibrated ");
    assert_eq!(lines.len(), 1, "{}", out.dump());
    let l = &lines[0];
    // Host 0 holds ranks 0 and 4 (round-robin placement): they measure shared memory; rank 0
    // and rank 1 (host 1) measure TCP.
    assert!(l.contains("shm ") && l.contains("(ranks 0 and 4)"), "{l}");
    assert!(l.contains("tcp ") && l.contains("(ranks 0 and 1)"), "{l}");
}

#[test]
fn two_hosts_large_counts() {
    over_hosts("two_hosts_large_counts", 2, 4, "large");
}

/// Two hosts with two ranks each: shared memory between the ranks of a host, TCP between hosts
/// (as logged per peer with `FERRO_DEBUG=INFO`), and the whole sweep passes over the mix.
#[test]
fn two_hosts_two_ranks_each_mix_shared_memory_and_tcp() {
    let test = "two_hosts_two_ranks_each_mix_shared_memory_and_tcp";
    if let Err(why) = netns_available() {
        println!("skipped: {test}: {why}");
        return;
    }
    let (nhosts, nranks) = (2, 4);
    let hosts = NetnsHosts::up(nhosts).expect("build namespace hosts");
    let out = ferrorun_self(
        nranks,
        Some(&hosts.netns_arg()),
        "child_netns_conformance",
        "netns",
        &[
            (child::SWEEP_VAR, "reduced".to_string()),
            ("FERRO_TIMEOUT", "60".to_string()),
            ("FERRO_DEBUG", "INFO".to_string()),
        ],
        JOB_LIMIT,
    );
    assert!(out.success(), "{test}: {}", out.dump());
    let mut seen = BTreeSet::new();
    for l in out.tagged("ferroccl rank ") {
        let Some((rank, info)) = l
            .strip_prefix("ferroccl rank ")
            .and_then(|r| r.split_once(" TRANSPORT: "))
        else {
            continue;
        };
        let r: usize = rank.parse().expect("rank in TRANSPORT line");
        // Rank r runs on host r % nhosts; local rank in rank order on that host.
        assert!(
            info.starts_with(&format!("local rank {} of 2 ", r / nhosts)),
            "{l}"
        );
        let peers = info.split_once("peers ").map_or("", |(_, p)| p);
        for entry in peers.split(", ") {
            let (p, how) = entry.split_once(':').expect("peer:transport");
            let p: usize = p.parse().expect("peer rank");
            let want = if p % nhosts == r % nhosts {
                "shm"
            } else {
                "tcp"
            };
            assert!(how.starts_with(want), "rank {r} to {p}: {l}");
        }
        seen.insert(r);
    }
    assert_eq!(seen, (0..nranks).collect(), "{}", out.dump());
    let cases = expected_cases(&sweep_named("reduced"));
    let lines = out.tagged("CASES ");
    assert_eq!(lines.len(), nranks, "{}", out.dump());
    for l in &lines {
        assert_eq!(field::<usize>(l, "cases"), cases, "{l}");
    }
}
