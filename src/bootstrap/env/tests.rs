use super::*;
use crate::ErrorKind;
use std::collections::HashMap;

fn detect_with(pairs: &[(&str, &str)]) -> Result<Option<LaunchEnv>> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    detect_from(&|name| map.get(name).cloned())
}

fn ok(pairs: &[(&str, &str)]) -> LaunchEnv {
    detect_with(pairs).unwrap().unwrap()
}

fn err(pairs: &[(&str, &str)]) -> Error {
    detect_with(pairs).unwrap_err()
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

#[test]
fn nothing_set_is_none() {
    assert_eq!(detect_with(&[]).unwrap(), None);
    assert_eq!(detect_with(&[("RANK", "1")]).unwrap(), None);
    assert_eq!(detect_with(&[("HOME", "/root")]).unwrap(), None);
}

#[test]
fn ferrorun() {
    let e = ok(&[
        ("FERRO_RANK", "2"),
        ("FERRO_NRANKS", "4"),
        ("FERRO_LOCAL_RANK", "0"),
        ("FERRO_LOCAL_NRANKS", "2"),
        ("FERRO_STORE_ADDR", "10.1.1.1:31000"),
        ("FERRO_JOB_ID", "job-77"),
        // torchrun variables too: FERRO_* wins.
        ("RANK", "3"),
        ("WORLD_SIZE", "8"),
    ]);
    assert_eq!(
        e,
        LaunchEnv {
            rank: 2,
            nranks: 4,
            local_rank: Some(0),
            local_nranks: Some(2),
            store_addr: Some(sa("10.1.1.1:31000")),
            host_store: false,
            job_id: "job-77".into(),
            launcher: Launcher::Ferro,
        }
    );
    assert_eq!(e.file_store_dir(), None);
    assert_eq!(e.store_bind_addr(), None);
    let r0 = ok(&[
        ("FERRO_RANK", "0"),
        ("FERRO_NRANKS", "1"),
        ("FERRO_STORE_ADDR", "[::1]:31001"),
    ]);
    assert!(r0.host_store);
    assert_eq!(r0.store_addr, Some(sa("[::1]:31001")));
    assert_eq!(r0.store_bind_addr(), Some(sa("[::]:31001")));
    assert_eq!(r0.job_id, "ferro-[::1]:31001");
    let r0 = ok(&[
        ("FERRO_RANK", "0"),
        ("FERRO_NRANKS", "2"),
        ("FERRO_STORE_ADDR", "localhost:31002"),
    ]);
    assert_eq!(r0.store_addr, Some(sa("127.0.0.1:31002")));
    assert_eq!(r0.store_bind_addr(), Some(sa("0.0.0.0:31002")));
}

#[test]
fn ferrorun_errors_name_the_variable() {
    let e = err(&[("FERRO_RANK", "1"), ("FERRO_STORE_ADDR", "h:1")]);
    assert_eq!(e.kind(), ErrorKind::InvalidUsage);
    assert!(e.message().contains("FERRO_NRANKS"), "{e}");
    let e = err(&[("FERRO_RANK", "1"), ("FERRO_NRANKS", "2")]);
    assert_eq!(e.kind(), ErrorKind::InvalidUsage);
    assert!(e.message().contains("FERRO_STORE_ADDR"), "{e}");
    let e = err(&[
        ("FERRO_RANK", "two"),
        ("FERRO_NRANKS", "4"),
        ("FERRO_STORE_ADDR", "127.0.0.1:5"),
    ]);
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("FERRO_RANK=\"two\""), "{e}");
    let e = err(&[
        ("FERRO_RANK", "4"),
        ("FERRO_NRANKS", "4"),
        ("FERRO_STORE_ADDR", "127.0.0.1:5"),
    ]);
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(
        e.message()
            .contains("FERRO_RANK=4 is not below FERRO_NRANKS=4"),
        "{e}"
    );
    let e = err(&[
        ("FERRO_RANK", "0"),
        ("FERRO_NRANKS", "4"),
        ("FERRO_LOCAL_RANK", "2"),
        ("FERRO_LOCAL_NRANKS", "2"),
        ("FERRO_STORE_ADDR", "127.0.0.1:5"),
    ]);
    assert!(e.message().contains("FERRO_LOCAL_RANK=2"), "{e}");
    for bad in ["127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000", ":5"] {
        let e = err(&[
            ("FERRO_RANK", "0"),
            ("FERRO_NRANKS", "1"),
            ("FERRO_STORE_ADDR", bad),
        ]);
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad}: {e}");
        assert!(e.message().contains("FERRO_STORE_ADDR"), "{e}");
    }
}

#[test]
fn torchrun_store_takes_the_next_port() {
    let vars = [
        ("RANK", "0"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "0"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("MASTER_ADDR", "10.0.0.9"),
        ("MASTER_PORT", "29500"),
    ];
    let e = ok(&vars);
    assert_eq!(e.launcher, Launcher::Torchrun);
    assert_eq!((e.rank, e.nranks), (0, 8));
    assert_eq!((e.local_rank, e.local_nranks), (Some(0), Some(4)));
    assert_eq!(e.store_addr, Some(sa("10.0.0.9:29501")));
    assert!(e.host_store);
    assert_eq!(e.store_bind_addr(), Some(sa("0.0.0.0:29501")));
    assert_eq!(e.job_id, "torchrun-10.0.0.9-29500");
    // FERRO_STORE_PORT moves it; TORCHELASTIC_RUN_ID names the job.
    let mut more = vars.to_vec();
    more.extend([
        ("FERRO_STORE_PORT", "31337"),
        ("TORCHELASTIC_RUN_ID", "run-abc"),
        ("RANK", "5"),
    ]);
    let mut map: HashMap<&str, &str> = HashMap::new();
    map.extend(more);
    let pairs: Vec<(&str, &str)> = map.into_iter().collect();
    let e = ok(&pairs);
    assert_eq!(e.rank, 5);
    assert!(!e.host_store);
    assert_eq!(e.store_addr, Some(sa("10.0.0.9:31337")));
    assert_eq!(e.job_id, "run-abc");
    // Host names resolve.
    let e = ok(&[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "localhost"),
        ("MASTER_PORT", "29400"),
        ("TORCHELASTIC_RUN_ID", "none"),
    ]);
    assert_eq!(e.store_addr, Some(sa("127.0.0.1:29401")));
    assert_eq!(e.job_id, "torchrun-localhost-29400");
}

#[test]
fn torchrun_master_port_defaults_to_29500() {
    let e = ok(&[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "10.0.0.9"),
    ]);
    assert_eq!(e.launcher, Launcher::Torchrun);
    assert_eq!(e.store_addr, Some(sa("10.0.0.9:29501")));
    assert_eq!(e.job_id, "torchrun-10.0.0.9-29500");
    // The same job as when torchrun's default is spelled out.
    let spelled = ok(&[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "10.0.0.9"),
        ("MASTER_PORT", "29500"),
    ]);
    assert_eq!(
        (spelled.store_addr, spelled.job_id),
        (e.store_addr, e.job_id)
    );
    // FERRO_STORE_PORT still wins.
    let e = ok(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "10.0.0.9"),
        ("FERRO_STORE_PORT", "31337"),
    ]);
    assert_eq!(e.store_addr, Some(sa("10.0.0.9:31337")));
    // A MASTER_PORT that is set must be a port number.
    for bad in ["0", "65536", "x29500"] {
        let e = err(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "10.0.0.9"),
            ("MASTER_PORT", bad),
        ]);
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad:?}: {e}");
        assert!(
            e.message().contains(&format!("MASTER_PORT={bad:?}")),
            "{bad:?}: {e}"
        );
    }
}

#[test]
fn torchrun_errors() {
    let e = err(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "1")]);
    assert_eq!(e.kind(), ErrorKind::InvalidUsage);
    assert!(e.message().contains("MASTER_ADDR"), "{e}");
    let e = err(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "65535"),
    ]);
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("MASTER_PORT=65535"), "{e}");
    assert!(e.message().contains("FERRO_STORE_PORT"), "{e}");
    let e = err(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "http"),
    ]);
    assert!(e.message().contains("MASTER_PORT=\"http\""), "{e}");
    let e = err(&[
        ("RANK", "2"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "1000"),
    ]);
    assert!(
        e.message().contains("RANK=2 is not below WORLD_SIZE=2"),
        "{e}"
    );
    let e = err(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "0"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "1000"),
    ]);
    assert!(e.message().contains("WORLD_SIZE=0"), "{e}");
    let e = err(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "no-such-host.invalid"),
        ("MASTER_PORT", "1000"),
    ]);
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("no-such-host.invalid"), "{e}");
}

#[test]
fn slurm() {
    let base = [
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "7"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_NODEID", "2"),
        ("SLURM_TASKS_PER_NODE", "2(x3),1"),
        ("SLURM_JOB_ID", "4242"),
        ("SLURM_STEP_ID", "3"),
    ];
    let e = err(&base);
    assert_eq!(e.kind(), ErrorKind::InvalidUsage);
    assert!(e.message().contains("FERRO_STORE_ADDR"), "{e}");
    assert!(e.message().contains("MASTER_ADDR"), "{e}");

    let mut with_addr = base.to_vec();
    with_addr.push(("FERRO_STORE_ADDR", "192.168.1.10:29600"));
    let e = ok(&with_addr);
    assert_eq!(e.launcher, Launcher::Slurm);
    assert_eq!((e.rank, e.nranks), (5, 7));
    assert_eq!((e.local_rank, e.local_nranks), (Some(1), Some(2)));
    assert_eq!(e.store_addr, Some(sa("192.168.1.10:29600")));
    assert!(!e.host_store);
    assert_eq!(e.job_id, "slurm-4242.3");

    let mut with_master = base.to_vec();
    with_master.extend([("MASTER_ADDR", "192.168.1.11"), ("MASTER_PORT", "29500")]);
    assert_eq!(ok(&with_master).store_addr, Some(sa("192.168.1.11:29501")));

    let mut master_no_port = base.to_vec();
    master_no_port.push(("MASTER_ADDR", "192.168.1.11"));
    let e = err(&master_no_port);
    assert_eq!(e.kind(), ErrorKind::InvalidUsage);
    assert!(e.message().contains("MASTER_PORT"), "{e}");
    master_no_port.push(("FERRO_STORE_PORT", "30000"));
    assert_eq!(
        ok(&master_no_port).store_addr,
        Some(sa("192.168.1.11:30000"))
    );

    // The last node runs one task; SLURM_NTASKS_PER_NODE wins when set.
    let mut last = with_addr.clone();
    last.retain(|(k, _)| *k != "SLURM_NODEID" && *k != "SLURM_LOCALID");
    last.extend([("SLURM_NODEID", "3"), ("SLURM_LOCALID", "0")]);
    assert_eq!(ok(&last).local_nranks, Some(1));
    last.push(("SLURM_NTASKS_PER_NODE", "3"));
    assert_eq!(ok(&last).local_nranks, Some(3));

    // One node, no address: a job store in /tmp, named after the job and step.
    let one = [
        ("SLURM_PROCID", "2"),
        ("SLURM_NTASKS", "3"),
        ("SLURM_LOCALID", "2"),
        ("SLURM_NODEID", "0"),
        ("SLURM_TASKS_PER_NODE", "3"),
        ("SLURM_JOB_ID", "77"),
        ("SLURM_STEP_ID", "0"),
    ];
    let e = ok(&one);
    assert_eq!(e.store_addr, None);
    assert!(!e.host_store);
    assert_eq!(e.local_nranks, Some(3));
    assert_eq!(
        e.file_store_dir(),
        Some(std::path::PathBuf::from("/tmp/ferroccl-slurm-77.0"))
    );
    // Without per-node task counts, SLURM saying one node is enough.
    let mut nodes = one.to_vec();
    nodes.retain(|(k, _)| *k != "SLURM_TASKS_PER_NODE");
    assert!(err(&nodes).message().contains("several nodes"));
    nodes.push(("SLURM_STEP_NUM_NODES", "1"));
    assert_eq!(ok(&nodes).store_addr, None);

    let mut bad = with_addr.clone();
    bad.retain(|(k, _)| *k != "SLURM_NTASKS");
    bad.push(("SLURM_NTASKS", "-1"));
    let e = err(&bad);
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("SLURM_NTASKS=\"-1\""), "{e}");
}

#[test]
fn tasks_per_node_lists() {
    assert_eq!(tasks_on_node("4", None), Some(4));
    assert_eq!(tasks_on_node("2(x3),1", Some(0)), Some(2));
    assert_eq!(tasks_on_node("2(x3),1", Some(3)), Some(1));
    assert_eq!(tasks_on_node("2(x3),1", Some(4)), None);
    assert_eq!(tasks_on_node("2(x3),1", None), None);
    assert_eq!(tasks_on_node("3(x2)", None), Some(3));
    assert_eq!(tasks_on_node("x(3", Some(0)), None);
    assert_eq!(tasks_on_node("1(x99999999999)", Some(0)), None);
}

#[test]
fn open_mpi_one_host_uses_a_file_store() {
    let e = ok(&[
        ("OMPI_COMM_WORLD_RANK", "0"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
        ("OMPI_MCA_orte_ess_jobid", "3236233217"),
    ]);
    assert_eq!(e.launcher, Launcher::OpenMpi);
    assert_eq!(e.store_addr, None);
    assert!(!e.host_store);
    assert_eq!(e.store_bind_addr(), None);
    assert_eq!(e.job_id, "ompi-3236233217");
    assert_eq!(
        e.file_store_dir(),
        Some(PathBuf::from("/tmp/ferroccl-ompi-3236233217"))
    );
    let e = ok(&[
        ("OMPI_COMM_WORLD_RANK", "3"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
        ("PMIX_NAMESPACE", "prterun-host/12@1"),
        ("OMPI_MCA_orte_ess_jobid", "99"),
    ]);
    assert_eq!(e.job_id, "ompi-prterun-host/12@1");
    assert_eq!(
        e.file_store_dir(),
        Some(PathBuf::from("/tmp/ferroccl-ompi-prterun-host_12_1"))
    );
}

#[test]
fn open_mpi_across_hosts_needs_an_address() {
    let base = [
        ("OMPI_COMM_WORLD_RANK", "0"),
        ("OMPI_COMM_WORLD_SIZE", "8"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
    ];
    let e = err(&base);
    assert_eq!(e.kind(), ErrorKind::InvalidUsage);
    assert!(e.message().contains("FERRO_STORE_ADDR"), "{e}");
    assert!(e.message().contains("LOCAL_SIZE=4"), "{e}");
    let mut with_addr = base.to_vec();
    with_addr.push(("FERRO_STORE_ADDR", "10.2.0.1:29600"));
    let e = ok(&with_addr);
    assert_eq!(e.store_addr, Some(sa("10.2.0.1:29600")));
    assert!(e.host_store);
    assert_eq!(e.file_store_dir(), None);
    let mut bad = base.to_vec();
    bad[3] = ("OMPI_COMM_WORLD_LOCAL_SIZE", "9");
    bad.push(("FERRO_STORE_ADDR", "10.2.0.1:29600"));
    let e = err(&bad);
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("OMPI_COMM_WORLD_LOCAL_SIZE=9"), "{e}");
}

#[test]
fn precedence_is_ferro_torchrun_slurm_ompi() {
    let all = [
        ("SLURM_PROCID", "1"),
        ("SLURM_NTASKS", "2"),
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ("FERRO_STORE_ADDR", "127.0.0.1:4000"),
    ];
    assert_eq!(ok(&all).launcher, Launcher::Slurm);
    assert_eq!(ok(&all[2..]).launcher, Launcher::OpenMpi);
    let mut t = all.to_vec();
    t.extend([
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "5000"),
    ]);
    let e = ok(&t);
    assert_eq!(e.launcher, Launcher::Torchrun);
    // FERRO_STORE_ADDR overrides MASTER_ADDR for torchrun too.
    assert_eq!(e.store_addr, Some(sa("127.0.0.1:4000")));
    t.extend([("FERRO_RANK", "1"), ("FERRO_NRANKS", "2")]);
    assert_eq!(ok(&t).launcher, Launcher::Ferro);
}
