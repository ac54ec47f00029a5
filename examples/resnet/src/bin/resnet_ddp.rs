//! `resnet_ddp`: data-parallel ResNet training on ferroccl (see `resnet_ddp --help`).

use clap::Parser;
use ferroccl_resnet::train::{run, Options};

fn main() {
    let opts = Options::parse();
    if let Err(e) = run(&opts) {
        eprintln!("resnet_ddp: {e:#}");
        std::process::exit(1);
    }
}
