//! The data path allocates nothing once a size has been seen: 2-rank allreduce over threads,
//! on shared memory and on TCP, at 8 B and 1 MiB, counted per calling thread by a counting
//! global allocator (so that other threads of the process do not pollute the count).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use ferroccl::bootstrap::{MemoryStore, Store};
use ferroccl::{Communicator, Config, ReduceOp};

/// The system allocator, counting allocations on the thread that makes them.
struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn bump() {
    // During thread teardown the counter may be gone; those allocations are not measured.
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so the
// `GlobalAlloc` contract holds as it does for `System`; counting touches only a const-initialised
// thread-local `Cell`, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: forwarded unchanged; the caller upholds `alloc_zeroed`'s contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        bump();
        // SAFETY: forwarded unchanged; the caller upholds `realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged; `ptr` came from `System` through this allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn allocs_here() -> u64 {
    ALLOCS.with(Cell::get)
}

/// Starts 2 ranks as threads on one in-memory store, with transport `transport` only.
fn pair(transport: &str, tag: u64) -> Vec<Communicator> {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let id = 0xa110_c000 ^ (u64::from(std::process::id()) << 20) ^ tag;
    let hs: Vec<_> = (0..2)
        .map(|r| {
            let store = Arc::clone(&store);
            let cfg = Config {
                timeout: Duration::from_secs(60),
                transports: vec![transport.into()],
                ..Config::default()
            };
            std::thread::spawn(move || Communicator::init(store, r, 2, id, cfg))
        })
        .collect();
    hs.into_iter()
        .map(|h| h.join().expect("init thread").expect("init"))
        .collect()
}

/// Allocations each rank's calling thread made during `calls` allreduces of `bytes` bytes,
/// after warming up; also checks every result.
fn allocs_per_rank(transport: &str, tag: u64, bytes: usize, calls: usize) -> Vec<u64> {
    let comms = pair(transport, tag);
    let count = bytes / 4;
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let mut buf = vec![0f32; count];
                    let run = |buf: &mut Vec<f32>| {
                        buf.iter_mut().for_each(|x| *x = (c.rank() + 1) as f32);
                        c.all_reduce_in_place(buf, ReduceOp::Sum)
                            .expect("allreduce");
                        assert!(buf.iter().all(|&x| x == 3.0), "wrong sum");
                    };
                    for _ in 0..10 {
                        run(&mut buf);
                    }
                    let before = allocs_here();
                    for _ in 0..calls {
                        run(&mut buf);
                    }
                    allocs_here() - before
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    })
}

fn assert_no_allocs(transport: &str, tag: u64) {
    for (bytes, calls) in [(8, 500), (1 << 20, 20)] {
        let per_rank = allocs_per_rank(transport, tag ^ bytes as u64, bytes, calls);
        assert_eq!(
            per_rank,
            [0, 0],
            "{transport}, {bytes} B: allocations per rank during {calls} calls"
        );
    }
}

#[test]
fn shm_allreduce_allocates_nothing_per_call() {
    assert_no_allocs("shm", 1);
}

#[test]
fn tcp_allreduce_allocates_nothing_per_call() {
    assert_no_allocs("tcp", 2);
}
