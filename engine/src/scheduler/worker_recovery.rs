//! What the engine loop does when a turn panics: the requests of that turn fail with an error
//! (never a hang), the reuse cache is dropped (a state may be half-written) and the loop goes
//! on; and the guard that marks the loop stopped when its thread ends, however it ends.

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Event, EventSink, SchedulerStats, Worker};

/// Marks the loop stopped when its thread ends, however it ends.
pub(super) struct Stopped(pub(super) Arc<SchedulerStats>);

impl Drop for Stopped {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// The text of a panic's payload.
fn panic_text(payload: &(dyn Any + Send)) -> String {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(s), _) => (*s).to_string(),
        (_, Some(s)) => s.clone(),
        _ => "a panic without a message".into(),
    }
}

impl Worker {
    /// After a panicking turn: fail every running request (and the choices forked from them)
    /// with an error, drop the reuse cache, and go on with the queue.
    pub(super) fn recover(&mut self, payload: &(dyn Any + Send)) {
        let what = panic_text(payload);
        SchedulerStats::add(&self.stats.panics, 1);
        tracing::error!(panic = %what, "an engine step panicked: its requests fail, the engine goes on");
        let message = format!("the engine step failed ({what}); the request was not completed");
        let fail = |sink: &dyn EventSink| {
            sink.send(Event::Failed {
                kind: "internal",
                message: message.clone(),
            });
        };
        for seq in self.running.drain(..) {
            fail(seq.job.sink.as_ref());
            seq.job.forks.iter().for_each(|f| fail(f.as_ref()));
        }
        for (seq, _) in self.pending_forks.drain(..) {
            fail(seq.job.sink.as_ref());
        }
        self.cache.evict_to(0, &[]);
        self.stats.running.store(0, Ordering::Relaxed);
    }
}
