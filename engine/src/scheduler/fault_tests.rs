//! Fault injection into the engine loop: a panic in any phase fails the requests of that turn
//! with an error (never a hang) and the engine goes on with exact tokens; a stalled loop and a
//! stopped one are reported by the heartbeat.

use std::sync::mpsc;
use std::time::Duration;

use super::tests::{alone, drain, model_dir, prompt, request};
use super::*;
use crate::arch;
use crate::generate::Sampling;

#[test]
fn a_panic_in_any_engine_phase_fails_that_turn_and_the_engine_goes_on() {
    let dir = model_dir();
    let req = request(prompt(9, 1), 6, Sampling::Greedy);
    let want = alone(dir.path(), &req);
    for point in ["admit", "plan_drafts", "forward", "advance", "retire"] {
        let faults = Faults::default().arm(point, 0);
        let model = arch::load(dir.path()).unwrap();
        let (h, _thread) = start_with_faults(model, SchedulerConfig::default(), faults).unwrap();
        let (tx, rx) = mpsc::channel();
        h.submit(req.clone(), Box::new(tx)).unwrap();
        let (tokens, done) = drain(&rx);
        if point == "admit" {
            // Before the request left the queue: it keeps its place and runs next turn.
            assert_eq!((tokens, done.is_some()), (want.clone(), true), "{point}");
        } else {
            assert!(done.is_none(), "{point}: the request of the panicking turn fails");
        }
        let (tx, rx) = mpsc::channel();
        h.submit(req.clone(), Box::new(tx)).unwrap();
        let (tokens, done) = drain(&rx);
        assert!(done.is_some(), "{point}: the engine goes on");
        assert_eq!(tokens, want, "{point}: with exact tokens");
        assert!(h.liveness(Duration::from_secs(30)).is_ok(), "{point}");
        // A panic inside the model pass is caught around the pass itself.
        let panics = u64::from(point != "forward");
        assert_eq!(h.stats().panics(), panics, "{point}");
    }
}

#[test]
fn the_heartbeat_reports_a_stalled_and_a_stopped_engine() {
    let dir = model_dir();
    let cfg = SchedulerConfig {
        step_delay: Duration::from_millis(1500),
        ..SchedulerConfig::default()
    };
    let (h, thread) = start(arch::load(dir.path()).unwrap(), cfg).unwrap();
    let stall = Duration::from_millis(400);
    assert!(h.liveness(stall).is_ok(), "idle is live");
    let (tx, rx) = mpsc::channel();
    h.submit(request(prompt(3, 2), 1, Sampling::Greedy), Box::new(tx))
        .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    assert!(
        matches!(h.liveness(stall), Err(Stall::Stalled { in_flight: 1, .. })),
        "a step longer than the allowed stall with work waiting: {:?}",
        h.liveness(stall)
    );
    assert!(drain(&rx).1.is_some());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while h.liveness(stall).is_err() {
        assert!(std::time::Instant::now() < deadline, "live again once idle");
        std::thread::sleep(Duration::from_millis(10));
    }
    let stats = h.stats().clone();
    drop(h);
    thread.join().unwrap();
    assert_eq!(stats.liveness(stall), Err(Stall::Stopped));
}
