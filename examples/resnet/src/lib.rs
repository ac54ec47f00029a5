//! Data-parallel ResNet training on ferroccl, with libtorch through `tch`: the end-to-end proof
//! that the library carries a real training job.
//!
//! | module | what it holds |
//! |---|---|
//! | [`model`] | ResNet-18/34/50 (torchvision's layers and names) as stages, with the small-image stem |
//! | [`data`] | synthetic batches, CIFAR-10 binary files, image folders, the distributed sampler |
//! | [`ddp`] | rank 0's state to every rank; gradients averaged in buckets that overlap backward |
//! | [`optim`] | SGD with momentum and weight decay; linear scaling, warm-up, step or cosine decay |
//! | [`checkpoint`] | model, momentum and progress in one file, resumable on any number of ranks |
//! | [`train`] | the `resnet_ddp` program: options, the step, evaluation, reports |
//!
//! ```no_run
//! use clap::Parser;
//! // Under `ferrorun -n 2 -- ...` each process is one rank; alone, it trains on one.
//! let opts = ferroccl_resnet::train::Options::parse_from([
//!     "resnet_ddp", "--arch", "resnet18", "--image-size", "32", "--data", "synthetic", "--steps", "50",
//! ]);
//! ferroccl_resnet::train::run(&opts)?;
//! # Ok::<(), anyhow::Error>(())
//! ```

pub mod checkpoint;
pub mod data;
pub mod ddp;
pub mod model;
pub mod optim;
pub mod train;
