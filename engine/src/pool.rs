//! Running work on the rayon pool from outside it.
//!
//! A parallel loop started from a thread outside the pool is injected into the pool, and the
//! calling thread sleeps until the loop ends: a wake-up and a hand-off for every loop, hundreds
//! per forward pass. Started from a worker, the loop is split on that worker, which takes part.
//! [`on_pool`] moves a whole pass (or a whole command) onto a worker, so its loops start there.

/// Run `f` on a worker of the current rayon pool; the calling thread waits for it. Inside the
/// pool already, `f` runs on the spot.
pub fn on_pool<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    if rayon::current_thread_index().is_some() {
        return f();
    }
    let mut out = None;
    rayon::scope(|s| s.spawn(|_| out = Some(f())));
    out.expect("the scope ran its task before returning")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_work_runs_on_a_worker_and_its_result_comes_back() {
        assert!(rayon::current_thread_index().is_none());
        let (index, value) = on_pool(|| (rayon::current_thread_index(), 6 * 7));
        assert!(index.is_some(), "ran outside the pool");
        assert_eq!(value, 42);
        // Nested: already on a worker, so it runs in place.
        assert!(on_pool(|| on_pool(rayon::current_thread_index)).is_some());
    }
}
