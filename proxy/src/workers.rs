//! Connection workers: each a thread running its own single-threaded tokio runtime.
//!
//! A connection is accepted by one worker and stays there, with its upstream
//! connections, timers and mirrors, as an nginx worker keeps its connections. Nothing is
//! stolen between threads, so a request never pays for cross-thread wake-ups, and each worker
//! keeps its own pool of upstream connections (see `index`): a pooled connection is always
//! driven by the reactor of the thread that uses it.

use std::cell::Cell;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

thread_local! {
    /// The worker this thread runs (0 on any other thread). Per thread rather than per task:
    /// Pingora spawns a task of its own for each HTTP/2 stream, which a task-local would not
    /// reach.
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

/// Where connections run.
#[derive(Clone)]
pub struct Workers {
    inner: Arc<Inner>,
}

struct Inner {
    handles: Vec<Handle>,
    next: AtomicUsize,
    /// Dropping the senders ends the workers' runtimes (and every task on them).
    _stop: Vec<oneshot::Sender<()>>,
}

impl Workers {
    /// Starts `count` worker threads (at least one).
    pub fn start(count: usize) -> std::io::Result<Self> {
        let count = count.max(1);
        let mut handles = Vec::with_capacity(count);
        let mut stop = Vec::with_capacity(count);
        for i in 0..count {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(runtime.handle().clone());
            let (tx, rx) = oneshot::channel::<()>();
            stop.push(tx);
            std::thread::Builder::new()
                .name(format!("coxswain-worker-{i}"))
                .spawn(move || {
                    WORKER.with(|w| w.set(i));
                    // Ends when the pool is dropped; the runtime's tasks are dropped with it.
                    let _ = runtime.block_on(rx);
                })?;
        }
        Ok(Self {
            inner: Arc::new(Inner {
                handles,
                next: AtomicUsize::new(0),
                _stop: stop,
            }),
        })
    }

    pub fn len(&self) -> usize {
        self.inner.handles.len()
    }

    pub fn is_empty(&self) -> bool {
        self.inner.handles.is_empty()
    }

    /// Runs `task` on the next worker, round robin.
    pub fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let i = self.inner.next.fetch_add(1, Ordering::Relaxed) % self.inner.handles.len();
        self.inner.handles[i].spawn(task);
    }
}

impl Workers {
    /// Runs a task made by `make` on every worker; the handles are in worker order.
    pub fn spawn_on_each<F>(&self, mut make: impl FnMut() -> F) -> Vec<tokio::task::JoinHandle<()>>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.inner.handles.iter().map(|h| h.spawn(make())).collect()
    }
}

/// The index of the worker running the current task (0 outside a worker), so per-worker state
/// such as upstream connection pools can be kept apart.
pub fn index() -> usize {
    WORKER.with(Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Mutex;

    #[test]
    fn tasks_go_round_robin_and_each_runs_on_its_workers_thread() {
        let workers = Workers::start(3).expect("threads start");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        for _ in 0..6 {
            let seen = seen.clone();
            let done = done_tx.clone();
            workers.spawn(async move {
                // A task the connection's task spawns (Pingora's HTTP/2 streams) is on the
                // same worker.
                let spawned = tokio::spawn(async { index() }).await.expect("task runs");
                assert_eq!(spawned, index());
                let thread = std::thread::current().name().unwrap_or("").to_owned();
                seen.lock().expect("not poisoned").push((index(), thread));
                let _ = done.send(());
            });
        }
        for _ in 0..6 {
            done_rx
                .recv_timeout(std::time::Duration::from_secs(5))
                .expect("every task runs");
        }
        let seen = seen.lock().expect("not poisoned").clone();
        let indexes: Vec<usize> = {
            let mut v: Vec<usize> = seen.iter().map(|(i, _)| *i).collect();
            v.sort_unstable();
            v
        };
        assert_eq!(indexes, vec![0, 0, 1, 1, 2, 2]);
        for (i, thread) in &seen {
            assert_eq!(thread, &format!("coxswain-worker-{i}"));
        }
        let threads: HashSet<&String> = seen.iter().map(|(_, t)| t).collect();
        assert_eq!(threads.len(), 3);
        assert_eq!(index(), 0, "outside a worker");
    }

    #[test]
    fn spawn_on_each_runs_one_task_on_every_worker_in_order() {
        let workers = Workers::start(3).expect("threads start");
        let (tx, rx) = std::sync::mpsc::channel();
        let handles = workers.spawn_on_each(|| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(index());
            }
        });
        let mut ran: Vec<usize> = (0..3)
            .map(|_| {
                rx.recv_timeout(std::time::Duration::from_secs(5))
                    .expect("every task runs")
            })
            .collect();
        ran.sort_unstable();
        assert_eq!(ran, vec![0, 1, 2]);
        // Awaited from another runtime, as a port's accept loops are when it closes.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        for handle in handles {
            assert!(runtime.block_on(handle).is_ok(), "the task finished");
        }
    }
}
