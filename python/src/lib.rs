//! `ferroccl._ferroccl`: the native half of the `ferroccl` Python package.
//!
//! | concept | item |
//! |---|---|
//! | a communicator driven from Python | [`Comm`] |
//! | the rendezvous id rank 0 creates and publishes through PyTorch's store | [`create_unique_id`], [`StoreServer`] |
//! | ferroccl's errors in Python | `ferroccl.Error` (a `RuntimeError`) |
//!
//! Operations run in issue order, each either queued on the communicator's own worker thread (the
//! call returns at once; the worker calls the given `done(error_or_None)` with the GIL held when
//! the operation ends) or, through the `*_now` methods the Python layer uses for small messages, on
//! the calling thread with the GIL released, but only when nothing is queued or running (otherwise
//! they do nothing and say so). Running on the calling thread spares the two thread hand-offs (each
//! a context switch when every core is busy) that dominate a small operation. Tensors reach Rust as
//! address, byte length, element count and dtype name; the Python layer checks them (contiguous,
//! CPU, sizes) and keeps them alive until `done` runs (or the `*_now` call returns). This crate
//! does not link libtorch.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::Sender;
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use ferroccl::bootstrap::{TcpStoreServer, UniqueId};
use ferroccl::coll::CollKind;
use ferroccl::{Communicator, Config, DataType, ReduceOp};

mod device;
mod mem;

create_exception!(
    _ferroccl,
    Error,
    PyRuntimeError,
    "An error from ferroccl (operation, sequence number, rank, peer in the message)."
);

fn to_py(e: ferroccl::Error) -> PyErr {
    Error::new_err(e.to_string())
}

/// The dtype names the Python layer passes (torch's names without `torch.`).
fn dtype_of(name: &str) -> PyResult<DataType> {
    Ok(match name {
        "int8" => DataType::Int8,
        "uint8" | "bool" => DataType::Uint8,
        "int32" => DataType::Int32,
        "uint32" => DataType::Uint32,
        "int64" => DataType::Int64,
        "uint64" => DataType::Uint64,
        "float16" => DataType::Float16,
        "float32" => DataType::Float32,
        "float64" => DataType::Float64,
        "bfloat16" => DataType::Bfloat16,
        "float8_e4m3fn" => DataType::Float8E4M3,
        "float8_e5m2" => DataType::Float8E5M2,
        other => {
            return Err(PyValueError::new_err(format!(
                "ferroccl: unsupported dtype {other}"
            )))
        }
    })
}

fn op_of(name: &str, scalar: f64) -> PyResult<ReduceOp> {
    Ok(match name {
        "sum" => ReduceOp::Sum,
        "product" => ReduceOp::Prod,
        "max" => ReduceOp::Max,
        "min" => ReduceOp::Min,
        "avg" => ReduceOp::Avg,
        "premul_sum" => ReduceOp::PreMulSum(scalar),
        other => {
            return Err(PyValueError::new_err(format!(
                "ferroccl: unsupported reduce op {other}"
            )))
        }
    })
}

fn kind_of(name: &str, root: usize) -> PyResult<CollKind> {
    Ok(match name {
        "all_reduce" => CollKind::AllReduce,
        "broadcast" => CollKind::Broadcast { root },
        "reduce" => CollKind::Reduce { root },
        "all_gather" => CollKind::AllGather,
        "reduce_scatter" => CollKind::ReduceScatter,
        "all_to_all" => CollKind::AllToAll,
        other => {
            return Err(PyValueError::new_err(format!(
                "ferroccl: unknown collective {other}"
            )))
        }
    })
}

/// A rendezvous store server hosted by rank 0; keep it as long as the communicator.
#[pyclass(module = "ferroccl._ferroccl")]
#[derive(Debug)]
pub struct StoreServer {
    _server: TcpStoreServer,
}

/// Starts a store server on an ephemeral port of every interface and returns its 128-byte
/// unique id with the server.
#[pyfunction]
pub fn create_unique_id(py: Python<'_>) -> PyResult<(Py<PyBytes>, StoreServer)> {
    let bind = std::net::SocketAddr::from(([0, 0, 0, 0], 0));
    let (id, server) = UniqueId::create(bind).map_err(to_py)?;
    Ok((
        PyBytes::new(py, id.as_bytes()).unbind(),
        StoreServer { _server: server },
    ))
}

/// What the worker thread runs.
type Job = Box<dyn FnOnce(&Communicator) -> ferroccl::Result<()> + Send>;

/// One communicator with its worker thread.
#[pyclass(module = "ferroccl._ferroccl")]
#[derive(Debug)]
pub struct Comm {
    comm: Arc<Communicator>,
    tx: Option<Sender<(Job, Py<PyAny>)>>,
    /// Jobs queued or running on the worker (it counts down after each `done` returns) plus
    /// the one running on a calling thread, if any.
    pending: Arc<AtomicUsize>,
    /// Held while an operation runs, by the worker or a calling thread: an operation queued by
    /// another Python thread while one runs on a calling thread waits for it.
    running: Arc<Mutex<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The worker thread's id (its callbacks must not wait for the worker).
    worker: std::thread::ThreadId,
    rank: usize,
    nranks: usize,
}

#[pymethods]
impl Comm {
    /// Joins the communicator named by `unique_id` as `rank` of `nranks`; `timeout` (seconds)
    /// bounds setup and every later wait in which no byte moves. `device`: this rank's CUDA
    /// device, where its p2p receive slots go unless `FERRO_P2P_DEVICE` names another.
    #[new]
    #[pyo3(signature = (unique_id, rank, nranks, timeout, device=None))]
    fn new(
        py: Python<'_>,
        unique_id: &[u8],
        rank: usize,
        nranks: usize,
        timeout: f64,
        device: Option<u32>,
    ) -> PyResult<Comm> {
        let bytes: [u8; 128] = unique_id.try_into().map_err(|_| {
            PyValueError::new_err(format!(
                "ferroccl: a unique id has 128 bytes, got {}",
                unique_id.len()
            ))
        })?;
        let id = UniqueId::from_bytes(bytes).map_err(to_py)?;
        let mut config = Config::from_env().map_err(to_py)?;
        if timeout.is_finite() && timeout > 0.0 {
            config.timeout = Duration::from_secs_f64(timeout);
        }
        config.p2p_device = config.p2p_device.or(device);
        let comm = py
            .allow_threads(|| Communicator::from_unique_id(&id, rank, nranks, config))
            .map_err(to_py)?;
        let comm = Arc::new(comm);
        let (tx, rx) = crossbeam_channel::unbounded::<(Job, Py<PyAny>)>();
        let c = Arc::clone(&comm);
        let pending = Arc::new(AtomicUsize::new(0));
        let left = Arc::clone(&pending);
        let running = Arc::new(Mutex::new(()));
        let busy = Arc::clone(&running);
        let thread = std::thread::Builder::new()
            .name(format!("ferroccl-py-{rank}"))
            .spawn(move || {
                for (job, done) in rx {
                    let r = {
                        let _turn = busy.lock().unwrap_or_else(|e| e.into_inner());
                        run_job(job, &c, rank)
                    };
                    Python::with_gil(|py| call_done(py, &done, r));
                    left.fetch_sub(1, Ordering::Release);
                }
            })
            .map_err(|e| PyRuntimeError::new_err(format!("ferroccl: worker thread: {e}")))?;
        Ok(Comm {
            comm,
            tx: Some(tx),
            pending,
            running,
            worker: thread.thread().id(),
            thread: Some(thread),
            rank,
            nranks,
        })
    }

    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    #[getter]
    fn nranks(&self) -> usize {
        self.nranks
    }

    /// The CUDA device of this rank's p2p receive slots, where one was named (`device`,
    /// `FERRO_P2P_DEVICE`).
    #[getter]
    fn p2p_device(&self) -> Option<u32> {
        self.comm.config().p2p_device
    }

    /// The transport to `peer` (`"shm"`, `"tcp"`), `None` for this rank.
    fn transport(&self, peer: usize) -> Option<&'static str> {
        self.comm.transport(peer)
    }

    /// Queues collective `kind` (`all_reduce`, `broadcast`, `reduce`, `all_gather`,
    /// `reduce_scatter`, `all_to_all`) on buffers given by address and byte length; `send_ptr`
    /// `None` means in place. `count` is NCCL's count for the collective.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (kind, send_ptr, send_len, recv_ptr, recv_len, count, dtype, op, root, scalar, done))]
    fn collective(
        &self,
        py: Python<'_>,
        kind: &str,
        send_ptr: Option<usize>,
        send_len: usize,
        recv_ptr: usize,
        recv_len: usize,
        count: usize,
        dtype: &str,
        op: &str,
        root: usize,
        scalar: f64,
        done: Py<PyAny>,
    ) -> PyResult<()> {
        let job = coll_job(
            kind, send_ptr, send_len, recv_ptr, recv_len, count, dtype, op, root, scalar,
        )?;
        self.submit(py, job, done)
    }

    /// Runs collective `kind` (arguments as for `collective`) on this thread with the GIL
    /// released if nothing is queued or running: returns `True` when it ran and succeeded,
    /// raises `ferroccl.Error` when it ran and failed, and returns `False`, doing nothing,
    /// when earlier operations are still queued or running.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (kind, send_ptr, send_len, recv_ptr, recv_len, count, dtype, op, root, scalar))]
    fn collective_now(
        &self,
        py: Python<'_>,
        kind: &str,
        send_ptr: Option<usize>,
        send_len: usize,
        recv_ptr: usize,
        recv_len: usize,
        count: usize,
        dtype: &str,
        op: &str,
        root: usize,
        scalar: f64,
    ) -> PyResult<bool> {
        if !self.idle() {
            return Ok(false);
        }
        let job = coll_job(
            kind, send_ptr, send_len, recv_ptr, recv_len, count, dtype, op, root, scalar,
        )?;
        self.run_now(py, job)
    }

    /// Queues a group of sends and receives that run together: `ops` holds
    /// `(is_send, address, byte length, peer)`.
    fn p2p(
        &self,
        py: Python<'_>,
        ops: Vec<(bool, usize, usize, usize)>,
        done: Py<PyAny>,
    ) -> PyResult<()> {
        self.submit(
            py,
            Box::new(move |c| {
                let mut g = c.group();
                for &(is_send, addr, len, peer) in &ops {
                    // SAFETY: as for `collective`; the Python layer never passes a receive
                    // buffer that overlaps another buffer of the group.
                    unsafe {
                        if is_send {
                            g.send::<u8>(mem::Span::new(addr, len).slice(), peer);
                        } else {
                            g.recv::<u8>(mem::SpanMut::new(addr, len).slice(), peer);
                        }
                    }
                }
                g.run()
            }),
            done,
        )
    }

    /// Queues collective `kind` on device memory (CUDA tensors: arguments as for
    /// `collective`, addresses on device `device`) on the caller's stream `stream` of that
    /// device, as NCCL does: returns once queued; later work on the stream sees the result.
    /// Issued on this thread (the GIL released) after the worker's queued operations, so issue
    /// order holds; an error in the arguments is raised now, one in the run later
    /// (`async_error`, and every later operation fails with it).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (kind, send_ptr, send_len, recv_ptr, recv_len, dtype, op, root, scalar, device, stream))]
    fn collective_on_stream(
        &self,
        py: Python<'_>,
        kind: &str,
        send_ptr: Option<u64>,
        send_len: usize,
        recv_ptr: u64,
        recv_len: usize,
        dtype: &str,
        op: &str,
        root: usize,
        scalar: f64,
        device: u32,
        stream: usize,
    ) -> PyResult<()> {
        let kind = kind_of(kind, root)?;
        let dtype = dtype_of(dtype)?;
        let op = op_of(op, scalar)?;
        let send = send_ptr.map(|addr| device::DevSpan {
            addr,
            len: send_len,
        });
        let recv = device::DevSpan {
            addr: recv_ptr,
            len: recv_len,
        };
        let on = device::On { device, stream };
        self.run_in_order(
            py,
            Box::new(move |c| {
                // SAFETY: the Python layer passes the memory of contiguous tensors on `device`
                // that it keeps alive until this returns, `recv` overlapping no send tensor;
                // afterwards only work on the caller's stream uses it (`device::view`).
                unsafe { device::collective(c, kind, send, recv, dtype, op, on) }
            }),
        )
    }

    /// Queues a group of sends and receives of device memory (`ops` as for `p2p`) on the
    /// caller's stream `stream` of device `device` (as `collective_on_stream`).
    fn p2p_on_stream(
        &self,
        py: Python<'_>,
        ops: Vec<(bool, u64, usize, usize)>,
        device: u32,
        stream: usize,
    ) -> PyResult<()> {
        let ops: Vec<_> = ops
            .into_iter()
            .map(|(s, addr, len, peer)| (s, device::DevSpan { addr, len }, peer))
            .collect();
        let on = device::On { device, stream };
        self.run_in_order(
            py,
            Box::new(move |c| {
                // SAFETY: as for `collective_on_stream`; the Python layer never passes a
                // receive tensor that overlaps another tensor of the group.
                unsafe { device::group(c, &ops, on) }
            }),
        )
    }

    /// Queues a barrier.
    fn barrier(&self, py: Python<'_>, done: Py<PyAny>) -> PyResult<()> {
        self.submit(py, Box::new(|c| c.barrier()), done)
    }

    /// Whether this is the worker thread (running a callback of an operation): a wait there
    /// for an operation still queued behind the callback would wait for itself.
    #[getter]
    fn on_worker(&self) -> bool {
        std::thread::current().id() == self.worker
    }

    /// A barrier on this thread if nothing is queued or running (as `collective_now`).
    fn barrier_now(&self, py: Python<'_>) -> PyResult<bool> {
        if !self.idle() {
            return Ok(false);
        }
        self.run_now(py, Box::new(|c| c.barrier()))
    }

    /// Whether nothing is queued or running on the worker.
    #[getter]
    fn idle(&self) -> bool {
        self.pending.load(Ordering::Acquire) == 0
    }

    /// Fails every queued and running operation at once and closes the connections.
    fn abort(&self) {
        self.comm.abort();
    }

    /// The communicator's first error, if it failed.
    fn async_error(&self) -> Option<String> {
        self.comm.async_error().map(|e| e.to_string())
    }

    /// Lets queued operations finish, then stops the worker thread, then waits for the
    /// operations queued on device streams (the GIL is released meanwhile, since finishing
    /// operations call back into Python). Without that wait a process that shuts down right
    /// after its last stream-ordered call leaves while its jobs are queued, and its peers fail
    /// mid-collective. A failure was reported when it happened (a warning line, and the next
    /// wait or call); it is not raised again here.
    fn close(&mut self, py: Python<'_>) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            py.allow_threads(|| {
                let _ = t.join();
            });
        }
        let comm = &self.comm;
        let _ = py.allow_threads(|| comm.finalize());
    }
}

impl Comm {
    /// Queues `job` on the worker; `done` is called there with its result. Issued from a
    /// callback on the worker itself (a future's `then`), the job runs at once instead and
    /// `done` is called before this returns: the operation takes its place right after the
    /// one whose callback issued it, on every rank alike (queued, it would land after whatever
    /// other threads had queued meanwhile, which differs from rank to rank), and a wait for it
    /// inside the callback does not wait for the worker the callback is holding.
    fn submit(&self, py: Python<'_>, job: Job, done: Py<PyAny>) -> PyResult<()> {
        let Some(tx) = self.tx.as_ref() else {
            return Err(Error::new_err("ferroccl: the communicator was closed"));
        };
        if self.on_worker() {
            self.pending.fetch_add(1, Ordering::AcqRel);
            let r = {
                let _turn = self.running.lock().unwrap_or_else(|e| e.into_inner());
                let (comm, rank) = (&self.comm, self.rank);
                py.allow_threads(|| run_job(job, comm, rank))
            };
            call_done(py, &done, r);
            self.pending.fetch_sub(1, Ordering::AcqRel);
            return Ok(());
        }
        self.pending.fetch_add(1, Ordering::AcqRel);
        if tx.send((job, done)).is_err() {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::new_err("ferroccl: the communicator was closed"));
        }
        Ok(())
    }

    /// Runs `job` on this thread (GIL released) once every queued operation has ended, or at
    /// once on the worker thread (a callback): the entry of calls that must be issued on the
    /// caller's thread (stream-ordered ones record where they stand on the caller's stream
    /// when issued).
    fn run_in_order(&self, py: Python<'_>, job: Job) -> PyResult<()> {
        if std::thread::current().id() == self.worker {
            // A callback of an operation (a future's `then`, as DDP's communication hooks
            // chain them) runs on the worker between two queued operations: the one before
            // has ended and the next has not started, so issuing here keeps issue order. (The
            // worker counts as busy until the callback returns: waiting for idle would never
            // end.)
            return self.run_now(py, job).map(|_| ());
        }
        while !self.idle() {
            py.allow_threads(|| std::thread::sleep(Duration::from_micros(50)));
        }
        self.run_now(py, job).map(|_| ())
    }

    /// Runs `job` on this thread with the GIL released. Callers check `idle()` first: only
    /// threads holding the GIL submit, and the worker counts down only after its last `done`
    /// returned, so idle means every earlier operation has completed and issue order holds.
    /// While it runs it counts as pending and holds `running` (taken before the GIL is
    /// released), so operations other Python threads issue meanwhile queue behind it.
    fn run_now(&self, py: Python<'_>, job: Job) -> PyResult<bool> {
        if self.tx.is_none() {
            return Err(Error::new_err("ferroccl: the communicator was closed"));
        }
        self.pending.fetch_add(1, Ordering::AcqRel);
        let turn = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let (comm, rank) = (&self.comm, self.rank);
        let r = py.allow_threads(|| run_job(job, comm, rank));
        drop(turn);
        self.pending.fetch_sub(1, Ordering::AcqRel);
        r.map(|()| true).map_err(to_py)
    }
}

/// The job of one collective (arguments as for `Comm::collective`).
#[allow(clippy::too_many_arguments)]
fn coll_job(
    kind: &str,
    send_ptr: Option<usize>,
    send_len: usize,
    recv_ptr: usize,
    recv_len: usize,
    count: usize,
    dtype: &str,
    op: &str,
    root: usize,
    scalar: f64,
) -> PyResult<Job> {
    let kind = kind_of(kind, root)?;
    let dtype = dtype_of(dtype)?;
    let op = op_of(op, scalar)?;
    let send = send_ptr.map(|p| mem::Span::new(p, send_len));
    let recv = mem::SpanMut::new(recv_ptr, recv_len);
    Ok(Box::new(move |c| {
        // SAFETY: the Python layer passes the addresses and lengths of contiguous CPU tensors
        // it keeps alive and untouched until `done` runs (or, run now, until the call returns).
        let (s, r) = unsafe { (send.map(|s| s.slice()), recv.slice()) };
        c.raw_collective(kind, s, r, count, dtype, op)
    }))
}

/// Runs one job; a panic becomes the operation's error, so the waiting Python thread is told.
fn run_job(job: Job, comm: &Communicator, rank: usize) -> ferroccl::Result<()> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(comm))).unwrap_or_else(|_| {
        Err(ferroccl::Error::new(
            ferroccl::ErrorKind::Internal,
            format!("rank {rank}: the operation panicked"),
        ))
    })
}

/// Calls `done(None)` or `done(ferroccl.Error(...))`; an exception it raises is printed.
fn call_done(py: Python<'_>, done: &Py<PyAny>, r: ferroccl::Result<()>) {
    let arg = match r {
        Ok(()) => py.None(),
        Err(e) => to_py(e).into_value(py).into_any(),
    };
    if let Err(e) = done.call1(py, (arg,)) {
        e.print(py);
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            // Dropped with the GIL held: a job still running would wait for the GIL to call
            // back, so the thread is left to finish on its own rather than joined.
            drop(t);
        }
    }
}

/// The module.
#[pymodule]
fn _ferroccl(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("Error", m.py().get_type::<Error>())?;
    m.add_class::<Comm>()?;
    m.add_class::<StoreServer>()?;
    m.add_function(wrap_pyfunction!(create_unique_id, m)?)?;
    m.add_function(wrap_pyfunction!(device::device_alloc, m)?)?;
    m.add_function(wrap_pyfunction!(device::device_free, m)?)?;
    m.add_function(wrap_pyfunction!(device::device_write, m)?)?;
    m.add_function(wrap_pyfunction!(device::device_read, m)?)?;
    m.add_function(wrap_pyfunction!(device::stream_synchronize, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_name_maps_to_its_ferroccl_type() {
        let cases = [
            ("int8", DataType::Int8),
            ("uint8", DataType::Uint8),
            ("bool", DataType::Uint8),
            ("int32", DataType::Int32),
            ("uint32", DataType::Uint32),
            ("int64", DataType::Int64),
            ("uint64", DataType::Uint64),
            ("float16", DataType::Float16),
            ("float32", DataType::Float32),
            ("float64", DataType::Float64),
            ("bfloat16", DataType::Bfloat16),
            ("float8_e4m3fn", DataType::Float8E4M3),
            ("float8_e5m2", DataType::Float8E5M2),
        ];
        for (name, dtype) in cases {
            assert_eq!(dtype_of(name).unwrap(), dtype, "{name}");
        }
        assert!(dtype_of("complex64").is_err());
        assert!(dtype_of("uint16").is_err());
    }

    #[test]
    fn ops_and_kinds_map_and_unknown_names_are_refused() {
        assert_eq!(op_of("sum", 0.0).unwrap(), ReduceOp::Sum);
        assert_eq!(op_of("product", 0.0).unwrap(), ReduceOp::Prod);
        assert_eq!(op_of("avg", 0.0).unwrap(), ReduceOp::Avg);
        assert_eq!(op_of("premul_sum", 0.5).unwrap(), ReduceOp::PreMulSum(0.5));
        assert!(op_of("band", 0.0).is_err());
        assert_eq!(
            kind_of("broadcast", 2).unwrap(),
            CollKind::Broadcast { root: 2 }
        );
        assert_eq!(kind_of("reduce", 1).unwrap(), CollKind::Reduce { root: 1 });
        assert_eq!(kind_of("all_to_all", 0).unwrap(), CollKind::AllToAll);
        assert!(kind_of("gather", 0).is_err());
    }

    #[test]
    fn empty_spans_make_empty_slices() {
        // SAFETY: zero-length spans never touch memory.
        let (s, m) = unsafe {
            (
                mem::Span::new(0, 0).slice(),
                mem::SpanMut::new(0, 0).slice(),
            )
        };
        assert!(s.is_empty() && m.is_empty());
    }
}
