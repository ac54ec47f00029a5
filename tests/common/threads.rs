//! Ranks as threads of the test process, each with its own configuration, meeting on one
//! in-memory store.

use std::sync::Arc;

use ferroccl::bootstrap::{MemoryStore, Store};
use ferroccl::{Communicator, Config};

/// Starts `configs.len()` ranks as threads (rank `r` with `configs[r]`) of a communicator
/// with id `id` (mixed with this process's id) and returns each rank's init result.
pub fn init_all(configs: Vec<Config>, id: u64) -> Vec<ferroccl::Result<Communicator>> {
    let n = configs.len();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let id = id ^ u64::from(std::process::id()) << 16 ^ n as u64;
    let hs: Vec<_> = configs
        .into_iter()
        .enumerate()
        .map(|(r, cfg)| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || Communicator::init(store, r, n, id, cfg))
        })
        .collect();
    hs.into_iter()
        .map(|h| h.join().expect("init thread"))
        .collect()
}

/// As [`init_all`], panicking on any rank's init error.
pub fn group(configs: Vec<Config>, id: u64) -> Vec<Communicator> {
    init_all(configs, id)
        .into_iter()
        .map(|c| c.expect("init"))
        .collect()
}

/// Runs `f` on every rank's thread at once; the results in rank order.
pub fn on_all<R: Send>(comms: &[Communicator], f: impl Fn(&Communicator) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    })
}
