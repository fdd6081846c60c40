//! Reading what the setup, pre-flight and server containers report: the JSON-lines progress of
//! `deltafin setup` and the causes of failed containers.
//!
//! The setup Job runs `deltafin setup ... --report-status NS/NAME`, which patches
//! `status.setupProgress` of its own DeltafinModel (under the model's `<name>-setup` Role, which
//! allows exactly that); the DeltafinModel watch brings each report to a reconcile, so progress
//! moves without reading logs or polling. The Job also writes the same records as JSON lines on
//! stdout (`--progress-file /dev/stdout`) for `kubectl logs`. Containers use
//! `terminationMessagePolicy: FallbackToLogsOnError`, so a failed container's termination message
//! holds the end of its log, whose last line is the one-line cause `deltafin` prints on stderr.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

use crate::crd::{FailureStatus, SetupProgress, WeightsStatus};

/// Reading a report: the fields are [`SetupProgress`]'s (`deltafin setup`'s record).
impl SetupProgress {
    /// Percent of bytes done, rounded down, when the total is known.
    pub fn percent(&self) -> Option<i32> {
        (self.bytes_total > 0).then(|| {
            let p = (self.bytes_done.clamp(0, self.bytes_total) as i128 * 100) / self.bytes_total as i128;
            p as i32
        })
    }

    /// Copies the report into the weights status (stage, counters, percent, message).
    pub fn apply_to(&self, w: &mut WeightsStatus) {
        w.stage = Some(self.phase.clone());
        w.bytes_done = Some(self.bytes_done);
        w.bytes_total = (self.bytes_total > 0).then_some(self.bytes_total);
        w.files_done = Some(self.files_done);
        w.files_total = (self.files_total > 0).then_some(self.files_total);
        w.percent = self.percent();
        w.percent_text = self.percent().map(|p| format!("{p}%"));
        w.message = (!self.message.is_empty()).then(|| self.message.clone());
    }

    /// `"38% (712.0/1870.0 GB)"`, or the phase when sizes are unknown.
    pub fn summary(&self) -> String {
        match self.percent() {
            Some(p) => format!(
                "{p}% ({:.1}/{:.1} GB, {}/{} files)",
                self.bytes_done as f64 / 1e9,
                self.bytes_total as f64 / 1e9,
                self.files_done,
                self.files_total
            ),
            None => format!("{}: {}", self.phase, self.message),
        }
    }
}

/// The report of setup Job `job` in the status, if that Job sent the last one (a report left by
/// an earlier Job, of another content key, is not this Job's progress).
pub fn reported_by<'a>(status: Option<&'a SetupProgress>, job: &str) -> Option<&'a SetupProgress> {
    status.filter(|p| p.job == job)
}

/// The cause in a termination message: an `error` progress line's message, else the last
/// non-empty line that is not progress JSON, without an `error: ` prefix.
pub fn cause_from_message(message: &str) -> Option<String> {
    for line in message.lines().rev().map(str::trim).filter(|l| !l.is_empty()) {
        if line.starts_with('{') {
            match serde_json::from_str::<SetupProgress>(line) {
                Ok(p) if p.phase == "error" && !p.message.is_empty() => return Some(p.message),
                Ok(_) => continue,
                Err(_) => {}
            }
        }
        let line = line.strip_prefix("error: ").unwrap_or(line);
        return Some(truncate(line, 512));
    }
    None
}

/// CamelCase reason for a one-line cause printed by `deltafin setup` or `deltafin doctor`.
pub fn classify_cause(cause: &str) -> &'static str {
    let c = cause.to_ascii_lowercase();
    if c.contains("checksum") || c.contains("hash mismatch") || c.contains("digest mismatch") {
        "ChecksumMismatch"
    } else if c.contains("disk full") || c.contains("no space left") || c.contains("enospc") {
        "DiskFull"
    } else if c.contains("not found") || c.contains("404") {
        "SourceNotFound"
    } else if c.contains("unauthorized") || c.contains("forbidden") || c.contains("401") || c.contains("403")
    {
        "Unauthorized"
    } else if c.contains("permission denied") || c.contains("read-only file system") {
        "PermissionDenied"
    } else {
        "SetupFailed"
    }
}

/// The most recent failure of a container in `pods` (newest `finishedAt` wins). `default_reason`
/// names failures whose message does not classify (`SetupFailed`, `PreflightFailed`, ...).
pub fn container_failure(pods: &[&Pod], component: &str, default_reason: &str) -> Option<FailureStatus> {
    let mut best: Option<(String, FailureStatus)> = None;
    for pod in pods {
        let Some(status) = &pod.status else { continue };
        for cs in status.container_statuses.iter().flatten() {
            for f in failures_of(cs, component, default_reason) {
                let when = f.time.clone().unwrap_or_default();
                if best.as_ref().is_none_or(|(t, _)| when >= *t) {
                    best = Some((when, f));
                }
            }
        }
    }
    best.map(|(_, f)| f)
}

fn failures_of(cs: &ContainerStatus, component: &str, default_reason: &str) -> Vec<FailureStatus> {
    let mut out = Vec::new();
    let states = [
        cs.state.as_ref().and_then(|s| s.terminated.as_ref()),
        cs.last_state.as_ref().and_then(|s| s.terminated.as_ref()),
    ];
    for t in states.into_iter().flatten() {
        if t.exit_code == 0 {
            continue;
        }
        let cause = t.message.as_deref().and_then(cause_from_message);
        let reason = if t.reason.as_deref() == Some("OOMKilled") || t.exit_code == 137 && cause.is_none() {
            "OOMKilled".to_string()
        } else {
            match cause.as_deref().map(classify_cause) {
                Some("SetupFailed") | None => default_reason.to_string(),
                Some(r) => r.to_string(),
            }
        };
        let message = cause.unwrap_or_else(|| match t.reason.as_deref() {
            Some(r) => format!("{r} (exit code {})", t.exit_code),
            None => format!("exit code {}", t.exit_code),
        });
        out.push(FailureStatus {
            component: component.into(),
            reason,
            exit_code: Some(t.exit_code),
            message,
            time: t.finished_at.as_ref().map(|t| t.0.to_string()),
        });
    }
    out
}

/// A waiting reason that will not fix itself (`ImagePullBackOff`, `CrashLoopBackOff`, ...).
pub fn stuck_waiting(pods: &[&Pod]) -> Option<(String, String)> {
    const STUCK: &[&str] = &[
        "ImagePullBackOff",
        "ErrImagePull",
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "InvalidImageName",
    ];
    for pod in pods {
        for cs in pod
            .status
            .iter()
            .flat_map(|s| s.container_statuses.iter().flatten())
        {
            if let Some(w) = cs.state.as_ref().and_then(|s| s.waiting.as_ref()) {
                let reason = w.reason.as_deref().unwrap_or_default();
                if STUCK.contains(&reason) {
                    let reason = if reason == "ErrImagePull" || reason == "InvalidImageName" {
                        "ImagePullBackOff"
                    } else {
                        reason
                    };
                    return Some((reason.to_string(), w.message.clone().unwrap_or_default()));
                }
            }
        }
    }
    None
}

/// `PodScheduled=False` with reason `Unschedulable`: `AwaitingGPU` when a GPU resource is short.
pub fn unschedulable(pods: &[&Pod], gpu_resource: Option<&str>) -> Option<(String, String)> {
    for pod in pods {
        for c in pod.status.iter().flat_map(|s| s.conditions.iter().flatten()) {
            if c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
            {
                let msg = c.message.clone().unwrap_or_default();
                let reason = match gpu_resource {
                    Some(r) if msg.contains(r) => "AwaitingGPU",
                    _ => "Unschedulable",
                };
                return Some((reason.to_string(), msg));
            }
        }
    }
    None
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_current_jobs_report_counts() {
        let report = SetupProgress {
            job: "m-setup-abc".into(),
            phase: "download".into(),
            bytes_done: 712_000_000_000,
            bytes_total: 1_870_000_000_000,
            files_done: 10,
            files_total: 64,
            message: "model-00011.safetensors".into(),
        };
        let p = reported_by(Some(&report), "m-setup-abc").unwrap();
        assert_eq!(p.phase, "download");
        assert_eq!(p.percent(), Some(38));
        assert_eq!(p.summary(), "38% (712.0/1870.0 GB, 10/64 files)");
        assert_eq!(
            reported_by(Some(&report), "m-setup-def"),
            None,
            "an earlier Job's report"
        );
        assert_eq!(reported_by(None, "m-setup-abc"), None);
    }

    #[test]
    fn percent_is_clamped_and_needs_a_total() {
        let p = |d, t| SetupProgress {
            job: String::new(),
            phase: "download".into(),
            bytes_done: d,
            bytes_total: t,
            files_done: 0,
            files_total: 0,
            message: String::new(),
        };
        assert_eq!(p(5, 0).percent(), None);
        assert_eq!(p(15, 10).percent(), Some(100));
        assert_eq!(p(i64::MAX / 2, i64::MAX).percent(), Some(49));
    }

    #[test]
    fn causes_are_read_and_classified() {
        let msg = "{\"phase\":\"download\",\"bytes_done\":1,\"bytes_total\":2}\nerror: checksum mismatch in model-00003.safetensors\n";
        let cause = cause_from_message(msg).unwrap();
        assert_eq!(cause, "checksum mismatch in model-00003.safetensors");
        assert_eq!(classify_cause(&cause), "ChecksumMismatch");
        let msg = "{\"phase\":\"error\",\"message\":\"disk full: 12 GB short\"}";
        assert_eq!(cause_from_message(msg).unwrap(), "disk full: 12 GB short");
        assert_eq!(classify_cause("disk full: 12 GB short"), "DiskFull");
        assert_eq!(classify_cause("repo not found: org/x"), "SourceNotFound");
        assert_eq!(classify_cause("HTTP 401 Unauthorized"), "Unauthorized");
        assert_eq!(classify_cause("something odd"), "SetupFailed");
        assert_eq!(cause_from_message("\n \n"), None);
    }
}
