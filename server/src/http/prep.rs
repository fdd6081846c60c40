//! The bounded pool for a request's blocking preparation. Parsing, chat-template rendering,
//! tokenization, grammar compilation and the weight-health check of a generation request run
//! here, on tokio's blocking threads: at most `workers` at once, at most `queue` more waiting
//! for a worker, and a request beyond that gets 429 at once. So a 100k-token render or a
//! 160k-vocabulary grammar compile never stalls the async threads that serve every other
//! connection (probes, streams, metrics).
//!
//! Streamed output is detokenized incrementally on the async side: one token's text per event
//! is bounded work, and a round trip to another thread per token would cost more than it saves.

use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::http::error::ApiError;

/// Default preparation workers: one per core, at least two.
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().max(2))
}

/// Default requests that may wait for a preparation worker.
pub const DEFAULT_QUEUE: usize = 64;

/// The preparation pool.
#[derive(Debug)]
pub struct PrepPool {
    workers: Arc<Semaphore>,
    /// Workers plus queue: a request that cannot take one is refused.
    admitted: Arc<Semaphore>,
    capacity: usize,
}

impl PrepPool {
    /// A pool of `workers` (at least 1) with `queue` places to wait.
    pub fn new(workers: usize, queue: usize) -> Self {
        let workers = workers.max(1);
        PrepPool {
            workers: Arc::new(Semaphore::new(workers)),
            admitted: Arc::new(Semaphore::new(workers + queue)),
            capacity: workers + queue,
        }
    }

    /// Run `f` on a blocking thread once a worker is free; `Busy` (429) when the pool and its
    /// queue are full.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let Ok(place) = self.admitted.clone().try_acquire_owned() else {
            return Err(ApiError::Busy {
                in_flight: self.capacity as u64,
                retry_after: 1,
            });
        };
        let worker = self
            .workers
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ApiError::ShuttingDown)?;
        let done = tokio::task::spawn_blocking(move || {
            let _held = (worker, place);
            f()
        })
        .await;
        done.unwrap_or(Err(ApiError::Internal("request preparation")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn runs_off_the_async_threads_and_refuses_beyond_its_queue() {
        let pool = Arc::new(PrepPool::new(1, 1));
        let on_runtime = std::thread::current().id();
        let ran_on = pool.run(|| Ok(std::thread::current().id())).await.unwrap();
        assert_ne!(ran_on, on_runtime);
        // One running (blocked until released), one queued: a third is refused.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let p = pool.clone();
        let first = tokio::spawn(async move {
            p.run(move || {
                rx.recv().ok();
                Ok(1)
            })
            .await
        });
        let p = pool.clone();
        let second = tokio::spawn(async move { p.run(|| Ok(2)).await });
        while pool.admitted.available_permits() > 0 {
            tokio::task::yield_now().await;
        }
        let third = pool.run(|| Ok(3)).await;
        assert!(matches!(third, Err(ApiError::Busy { .. })), "{third:?}");
        tx.send(()).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), 1);
        assert_eq!(second.await.unwrap().unwrap(), 2);
        assert_eq!(pool.run(|| Ok(4)).await.unwrap(), 4, "room again");
    }
}
