//! Asynchronous operations: [`Work`] handles and the progress thread that runs them.

use crossbeam_channel::{Receiver, Sender};

use crate::{Error, Result};

/// A job for the progress thread.
pub(crate) type Job = Box<dyn FnOnce() + Send + 'static>;

/// The progress thread of one communicator: runs queued jobs one after another.
#[derive(Debug)]
pub(crate) struct Worker {
    tx: Option<Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Worker {
    pub(crate) fn start(rank: usize) -> Result<Worker> {
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        let thread = std::thread::Builder::new()
            .name(format!("ferroccl-progress-{rank}"))
            .spawn(move || {
                for job in rx {
                    job();
                }
            })
            .map_err(|e| Error::io("starting the progress thread", &e))?;
        Ok(Worker {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    pub(crate) fn submit(&self, job: Job) -> Result<()> {
        self.tx
            .as_ref()
            .and_then(|tx| tx.send(job).ok())
            .ok_or_else(|| Error::internal("the progress thread has stopped"))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The handle of an operation running on the communicator's progress thread. Operations on one
/// communicator complete in issue order.
///
/// [`Work::wait`] returns the buffers the operation was given, holding the result.
#[derive(Debug)]
pub struct Work<B> {
    rx: Receiver<(Result<()>, B)>,
    done: Option<(Result<()>, B)>,
}

impl<B> Work<B> {
    pub(crate) fn new(rx: Receiver<(Result<()>, B)>) -> Self {
        Work { rx, done: None }
    }

    /// Whether the operation has finished (successfully or not). Never blocks.
    pub fn test(&mut self) -> bool {
        if self.done.is_none() {
            if let Ok(r) = self.rx.try_recv() {
                self.done = Some(r);
            }
        }
        self.done.is_some()
    }

    /// Waits for the operation and returns its buffers.
    pub fn wait(self) -> Result<B> {
        let (r, b) = self.wait_with_buffers();
        r.map(|()| b.expect("buffers come back with a successful result"))
    }

    /// Waits for the operation; returns its result and, whatever happened, its buffers (`None`
    /// only if the progress thread died).
    pub fn wait_with_buffers(mut self) -> (Result<()>, Option<B>) {
        if let Some((r, b)) = self.done.take() {
            return (r, Some(b));
        }
        match self.rx.recv() {
            Ok((r, b)) => (r, Some(b)),
            Err(_) => (
                Err(Error::internal(
                    "the progress thread stopped before the operation finished",
                )),
                None,
            ),
        }
    }
}
