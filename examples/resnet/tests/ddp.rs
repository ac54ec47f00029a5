//! `resnet_ddp` as real processes, ranks started by hand with ferroccl's launcher environment:
//! N ranks equal one rank with the whole batch, a short run learns the generated data set, a
//! checkpoint written on 2 ranks resumes on 1, and a dying rank fails the others promptly.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tch::Tensor;

const BIN: &str = env!("CARGO_BIN_EXE_resnet_ddp");

/// A small, quick network: ResNet-18's layout with 8 channels in the first stage.
const SMALL: &[&str] = &["--arch", "resnet18", "--width", "8", "--threads", "1"];

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferroccl-resnet-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `nranks` processes of `resnet_ddp args`, one per rank.
fn spawn(nranks: usize, args: &[String], job: &str) -> Vec<Child> {
    let port = free_port();
    (0..nranks)
        .map(|r| {
            Command::new(BIN)
                .args(args)
                .env("FERRO_RANK", r.to_string())
                .env("FERRO_NRANKS", nranks.to_string())
                .env("FERRO_LOCAL_RANK", r.to_string())
                .env("FERRO_LOCAL_NRANKS", nranks.to_string())
                .env("FERRO_STORE_ADDR", format!("127.0.0.1:{port}"))
                .env(
                    "FERRO_JOB_ID",
                    format!("{job}-{}-{port}", std::process::id()),
                )
                .env("FERRO_TIMEOUT", "120")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect()
}

/// Runs a job to the end; panics with every rank's output unless all succeed. Returns rank 0's
/// standard output.
fn run(nranks: usize, args: &[String], job: &str) -> String {
    let outs: Vec<Output> = spawn(nranks, args, job)
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let dump = || {
        outs.iter()
            .enumerate()
            .map(|(r, o)| {
                format!(
                    "--- rank {r} ({}):\n{}{}",
                    o.status,
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                )
            })
            .collect::<String>()
    };
    assert!(outs.iter().all(|o| o.status.success()), "{}", dump());
    String::from_utf8_lossy(&outs[0].stdout).into_owned()
}

fn args(list: &[&str]) -> Vec<String> {
    SMALL.iter().chain(list).map(|s| s.to_string()).collect()
}

fn dataset(dir: &Path, train: usize, test: usize) {
    ferroccl_resnet::data::write_pattern_dataset(dir, train, test, 7).unwrap();
}

/// A CIFAR-10-format set of random pixels and labels: every pixel of every image its own value.
///
/// The equivalence test needs it. The patterned set's bars are constant, so a convolution gives
/// one value along a whole bar; where that value lies within rounding of zero, the summation
/// order (which follows each rank's batch size) decides for the whole bar at once whether the
/// ReLU after it passes gradient, and one such flip moved weights by 0.1 % in a step while runs
/// without one agreed to 5e-7.
fn noise_dataset(dir: &Path, train: usize, test: usize) {
    use ferroccl_resnet::data::{SplitMix64, CIFAR_RECORD};
    std::fs::create_dir_all(dir).unwrap();
    let mut rng = SplitMix64::new(11);
    for (name, n) in [("data_batch_1.bin", train), ("test_batch.bin", test)] {
        let bytes: Vec<u8> = (0..n * CIFAR_RECORD)
            .map(|i| {
                let bound = if i % CIFAR_RECORD == 0 { 10 } else { 256 };
                rng.below(bound) as u8
            })
            .collect();
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

/// The `loss step N value` lines of a run.
fn step_losses(out: &str) -> Vec<(usize, f64)> {
    out.lines()
        .filter_map(|l| l.strip_prefix("loss step "))
        .map(|l| {
            let mut it = l.split_whitespace();
            (
                it.next().unwrap().parse().unwrap(),
                it.next().unwrap().parse().unwrap(),
            )
        })
        .collect()
}

fn result_json(out: &str) -> serde_json::Value {
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("no RESULT in:\n{out}"));
    serde_json::from_str(line).unwrap()
}

fn load(path: &Path) -> Vec<(String, Tensor)> {
    let mut v = Tensor::load_multi(path).unwrap();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

#[test]
fn n_ranks_with_batch_b_over_n_equal_one_rank_with_batch_b() {
    let dir = scratch("equiv");
    // 100 images in global batches of 24: four full steps and a last one of 4 images.
    noise_dataset(&dir.join("data"), 100, 8);
    let common = |ckpt: &Path, lr: &str| {
        args(&[
            "--data",
            "cifar10",
            "--data-dir",
            dir.join("data").to_str().unwrap(),
            "--global-batch",
            "24",
            "--epochs",
            "1",
            "--bn",
            "frozen",
            "--lr",
            lr,
            "--base-batch",
            "24",
            // Two buckets, so more than one allreduce per step crosses the ranks.
            "--bucket-mb",
            "0.1",
            "--checkpoint",
            ckpt.to_str().unwrap(),
        ])
    };
    run(1, &common(&dir.join("one.ot"), "0.2"), "equiv1");
    // 2 ranks read 12 images a step, then 2 and 2; 3 ranks 8, then 2, 1 and 1; 5 ranks 5, 5,
    // 5, 5 and 4, then 1, 1, 1, 1 and nothing: unequal shares, and a rank with an empty batch.
    run(2, &common(&dir.join("two.ot"), "0.2"), "equiv2");
    run(3, &common(&dir.join("three.ot"), "0.2"), "equiv3");
    run(5, &common(&dir.join("five.ot"), "0.2"), "equiv5");
    let one = load(&dir.join("one.ot"));
    for other in ["two.ot", "three.ot", "five.ot"] {
        let many = load(&dir.join(other));
        assert_eq!(one.len(), many.len());
        let mut moved = 0.0f64;
        for ((na, a), (nb, b)) in one.iter().zip(&many) {
            assert_eq!(na, nb);
            if !na.starts_with("model.") {
                continue;
            }
            let diff = (a - b).abs().max().double_value(&[]);
            let scale = a.abs().max().double_value(&[]).max(1e-3);
            assert!(
                diff <= 1e-4 * scale + 1e-6,
                "{other}: {na} differs by {diff} (scale {scale})"
            );
            moved += a.abs().sum(tch::Kind::Double).double_value(&[]);
        }
        assert!(moved > 0.0);
    }
    // The weights did change in those steps (the comparison is not of two untouched models).
    let fresh = dir.join("fresh.ot");
    run(1, &common(&fresh, "0"), "equiv0");
    let untouched = load(&fresh);
    let changed = one
        .iter()
        .zip(&untouched)
        .filter(|((n, _), _)| n.starts_with("model.") && n.ends_with("weight"))
        .any(|((_, a), (_, b))| (a - b).abs().max().double_value(&[]) > 1e-4);
    assert!(
        changed,
        "three steps at lr 0.2 left every weight where it was"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn short_real_data_run_on_two_ranks_beats_chance_clearly() {
    let dir = scratch("learn");
    dataset(&dir.join("data"), 1200, 300);
    let out = run(
        2,
        &args(&[
            "--data",
            "cifar10",
            "--data-dir",
            dir.join("data").to_str().unwrap(),
            "--batch-size",
            "32",
            "--epochs",
            "3",
            "--lr",
            "0.05",
            "--base-batch",
            "64",
            "--warmup-epochs",
            "1",
            "--decay",
            "cosine",
            "--compress",
            "bf16",
        ]),
        "learn",
    );
    let r = result_json(&out);
    let acc = r["eval_acc"].as_f64().unwrap();
    // Ten classes: chance is 10 %.
    assert!(acc >= 0.5, "held-out accuracy {acc} after 3 epochs:\n{out}");
    assert_eq!(r["nranks"], 2);
    assert_eq!(r["wire"], "bf16");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("epoch ")).count(),
        3,
        "{out}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn checkpoint_from_two_ranks_resumes_on_one_with_the_same_losses() {
    let dir = scratch("resume");
    dataset(&dir.join("data"), 96, 16);
    let base = |extra: &[&str]| {
        let mut a = args(&[
            "--data",
            "cifar10",
            "--data-dir",
            dir.join("data").to_str().unwrap(),
            "--global-batch",
            "16",
            "--epochs",
            "2",
            "--bn",
            "frozen",
            "--lr",
            "0.05",
            "--base-batch",
            "16",
            "--log-every",
            "1",
        ]);
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let ckpt = dir.join("ckpt-{epoch}.ot");
    let both = run(
        2,
        &base(&["--checkpoint", ckpt.to_str().unwrap()]),
        "resume2",
    );
    let resumed = run(
        1,
        &base(&["--resume", dir.join("ckpt-1.ot").to_str().unwrap()]),
        "resume1",
    );
    assert!(resumed.contains("resumed from"), "{resumed}");
    let full = step_losses(&both);
    let tail = step_losses(&resumed);
    // 96 images, global batch 16: 6 steps per epoch; the resumed run does steps 7..12.
    assert_eq!(full.len(), 12, "{both}");
    assert_eq!(
        tail.iter().map(|s| s.0).collect::<Vec<_>>(),
        (7..=12).collect::<Vec<_>>(),
        "{resumed}"
    );
    for ((sa, a), (sb, b)) in full[6..].iter().zip(&tail) {
        assert_eq!(sa, sb);
        assert!(
            (a - b).abs() <= 1e-4 * a.abs().max(1.0),
            "step {sa}: {a} on 2 ranks, {b} resumed on 1"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_rank_dying_mid_epoch_fails_the_others_naming_it() {
    let args = args(&[
        "--data",
        "synthetic",
        "--image-size",
        "16",
        "--batch-size",
        "4",
        "--steps",
        "100000",
        "--log-every",
        "1",
    ]);
    let mut children = spawn(3, &args, "death");
    // Wait until training is under way, then kill rank 1.
    let stdout = children[0].stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("progress step 5") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(120))
        .expect("rank 0 never reached step 5");
    children[1].kill().unwrap();
    let killed_at = Instant::now();
    for r in [0, 2] {
        let child = &mut children[r];
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(
                killed_at.elapsed() < Duration::from_secs(60),
                "rank {r} still running 60 s after rank 1 died"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(!status.success(), "rank {r} exited 0 although rank 1 died");
        let mut err = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
        assert!(
            err.contains("resnet_ddp:") && err.contains("rank 1"),
            "rank {r} did not name rank 1:\n{err}"
        );
    }
    let _ = children[1].wait();
}
