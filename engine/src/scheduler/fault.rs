//! Fault injection for tests: named points in the engine loop ([`Faults::point`]) that panic
//! when a test armed them for this engine ([`super::start_with_faults`]). Armed only under
//! `cfg(test)` or the `fault-injection` feature; otherwise [`Faults`] is empty and every point
//! is a no-op.
//!
//! Points: `admit`, `plan_drafts`, `forward` (inside the model pass), `advance` (sampling and
//! verification), `retire`.

/// The armed points of one engine and how many more hits each lets pass before it panics.
#[derive(Debug, Default)]
pub struct Faults {
    #[cfg(any(test, feature = "fault-injection"))]
    armed: Vec<(&'static str, u32)>,
}

impl Faults {
    /// Make point `name` panic once, on its `after + 1`-th hit.
    #[cfg(any(test, feature = "fault-injection"))]
    pub fn arm(mut self, name: &'static str, after: u32) -> Self {
        self.armed.push((name, after));
        self
    }

    /// Panic if `name` is armed and due.
    #[cfg(any(test, feature = "fault-injection"))]
    pub(crate) fn point(&mut self, name: &'static str) {
        let Some(i) = self.armed.iter().position(|(n, _)| *n == name) else {
            return;
        };
        if self.armed[i].1 > 0 {
            self.armed[i].1 -= 1;
            return;
        }
        self.armed.remove(i);
        panic!("injected fault at `{name}`");
    }

    /// No fault injection in this build.
    #[cfg(not(any(test, feature = "fault-injection")))]
    #[inline(always)]
    pub(crate) fn point(&mut self, _name: &'static str) {}
}
