//! `resnet_dataset DIR [TRAIN] [TEST] [SEED]`: writes a small CIFAR-10-format data set whose
//! classes are drawn in the images (a bar whose place and colour depend on the class), for
//! trying `resnet_ddp --data cifar10 --data-dir DIR` without downloading anything.

use std::path::PathBuf;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: resnet_dataset DIR [TRAIN=5000] [TEST=1000] [SEED=1]";
    let Some(dir) = args.first().filter(|a| !a.starts_with('-')) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let num = |i: usize, default: u64| -> u64 {
        args.get(i).map_or(default, |s| {
            s.parse().unwrap_or_else(|_| {
                eprintln!("resnet_dataset: {s:?} is not a number\n{usage}");
                std::process::exit(2)
            })
        })
    };
    let (train, test, seed) = (num(1, 5000) as usize, num(2, 1000) as usize, num(3, 1));
    let dir = PathBuf::from(dir);
    if let Err(e) = ferroccl_resnet::data::write_pattern_dataset(&dir, train, test, seed) {
        eprintln!("resnet_dataset: {e:#}");
        std::process::exit(1);
    }
    println!(
        "wrote {train} training and {test} test images to {}",
        dir.display()
    );
}
