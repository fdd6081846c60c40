//! `metav1.Condition` bookkeeping: stable transition times and transition detection.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// Weights are installed and verified for the current spec.
pub const WEIGHTS_READY: &str = "WeightsReady";
/// The server Deployment answers `/readyz`.
pub const SERVER_READY: &str = "ServerReady";
/// A new image is being checked by a pre-flight Job (True), or the last check failed
/// (False, `PreflightFailed`), or nothing is pending (False, `UpToDate`).
pub const UPGRADING: &str = "Upgrading";
/// Summary: the spec's model is served.
pub const READY: &str = "Ready";

/// Types in the order they are written.
pub const ALL: [&str; 4] = [WEIGHTS_READY, SERVER_READY, UPGRADING, READY];

/// Reasons that mean something is broken (published as Warning events).
pub const FAILURE_REASONS: &[&str] = &[
    "InvalidSpec",
    "AwaitingStorage",
    "SetupFailed",
    "ChecksumMismatch",
    "DiskFull",
    "SourceNotFound",
    "Unauthorized",
    "OOMKilled",
    "DeadlineExceeded",
    "PreflightFailed",
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "CreateContainerConfigError",
    "AwaitingGPU",
    "Unschedulable",
];

/// Whether a reason is a failure.
pub fn is_failure(reason: &str) -> bool {
    FAILURE_REASONS.contains(&reason)
}

/// Status of a condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// `True`.
    True,
    /// `False`.
    False,
    /// `Unknown`.
    Unknown,
}

impl Status {
    /// The Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }

    /// `True` or `False`.
    pub fn from_bool(b: bool) -> Self {
        if b { Self::True } else { Self::False }
    }
}

/// Sets (or adds) a condition. `lastTransitionTime` changes only when the status flips, so a
/// reconcile that observes the same state writes the same condition.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: Status,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
    now: Timestamp,
) {
    let message = message.into();
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status.as_str() {
                c.last_transition_time = Time(now);
                c.status = status.as_str().into();
            }
            c.reason = reason.into();
            c.message = message;
            c.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: type_.into(),
            status: status.as_str().into(),
            reason: reason.into(),
            message,
            observed_generation: generation,
            last_transition_time: Time(now),
        }),
    }
}

/// Finds a condition.
pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Conditions whose status or reason differ between `old` and `new` (the ones worth an event).
pub fn transitions<'a>(old: &[Condition], new: &'a [Condition]) -> Vec<&'a Condition> {
    new.iter()
        .filter(|n| match get(old, &n.type_) {
            Some(o) => o.status != n.status || o.reason != n.reason,
            None => true,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn transition_time_changes_only_when_status_flips() {
        let mut c = Vec::new();
        set(
            &mut c,
            READY,
            Status::False,
            "Downloading",
            "1%",
            Some(1),
            ts(100),
        );
        set(&mut c, READY, Status::False, "Verifying", "99%", Some(2), ts(200));
        assert_eq!(c[0].last_transition_time, Time(ts(100)));
        assert_eq!(c[0].reason, "Verifying");
        assert_eq!(c[0].observed_generation, Some(2));
        set(&mut c, READY, Status::True, "Serving", "", Some(2), ts(300));
        assert_eq!(c[0].last_transition_time, Time(ts(300)));
        set(&mut c, READY, Status::True, "Serving", "", Some(2), ts(400));
        assert_eq!(c[0].last_transition_time, Time(ts(300)));
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn transitions_report_status_or_reason_changes() {
        let mut old = Vec::new();
        set(
            &mut old,
            WEIGHTS_READY,
            Status::False,
            "Downloading",
            "1%",
            None,
            ts(1),
        );
        set(&mut old, READY, Status::False, "Downloading", "", None, ts(1));
        let mut new = old.clone();
        set(
            &mut new,
            WEIGHTS_READY,
            Status::False,
            "Downloading",
            "50%",
            None,
            ts(2),
        );
        assert!(
            transitions(&old, &new).is_empty(),
            "a message change is not a transition"
        );
        set(
            &mut new,
            WEIGHTS_READY,
            Status::True,
            "Installed",
            "",
            None,
            ts(3),
        );
        set(&mut new, SERVER_READY, Status::False, "Starting", "", None, ts(3));
        let t: Vec<_> = transitions(&old, &new).iter().map(|c| c.type_.clone()).collect();
        assert_eq!(t, [WEIGHTS_READY, SERVER_READY]);
    }
}
