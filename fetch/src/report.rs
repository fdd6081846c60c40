//! Progress reports to a `DeltafinModel`'s status on the Kubernetes API server
//! (`deltafin setup --report-status NAMESPACE/NAME`).
//!
//! The operator watches its DeltafinModels, so a JSON merge patch of `status.setupProgress` is a
//! progress channel it sees at once, with no pod logs read and no polling. The setup pod runs as
//! the model's `<name>-setup` ServiceAccount, whose Role allows `patch` on that one object's
//! status and nothing else.
//!
//! [`StatusReporter`] is a [`ProgressSink`]: events are handed to a background thread, which
//! keeps only the newest, sends phase changes at once and download ticks at most every
//! `interval` ([`due`]), and re-reads the token file before every request (projected tokens are
//! rotated by the kubelet). A failed report never fails the install: the first failure of each
//! kind is passed to the caller's `warn` callback, and [`StatusReporter::finish`] sends what is
//! pending and says how many reports were sent and failed.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::error::{Error, Result};
use crate::progress::{Phase, ProgressEvent, ProgressSink};

/// The API group/version/plural of the DeltafinModel resource.
pub const MODEL_PATH: &str = "apis/deltafin.dev/v1alpha1";

/// Where and as whom to report.
#[derive(Debug, Clone)]
pub struct KubeTarget {
    /// API server base URL, `https://HOST:PORT`.
    pub api: String,
    /// Bearer token file (re-read before each request).
    pub token_file: PathBuf,
    /// PEM bundle of the API server's CA; `None`: the platform's roots.
    pub ca_file: Option<PathBuf>,
    /// Namespace of the DeltafinModel.
    pub namespace: String,
    /// Name of the DeltafinModel.
    pub name: String,
    /// The setup Job reporting (written with every report).
    pub job: String,
}

impl KubeTarget {
    /// The status subresource URL of the model.
    pub fn status_url(&self) -> String {
        format!(
            "{}/{MODEL_PATH}/namespaces/{}/deltafinmodels/{}/status",
            self.api.trim_end_matches('/'),
            self.namespace,
            self.name
        )
    }
}

/// What [`StatusReporter::finish`] saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReportSummary {
    /// Reports the API server accepted.
    pub sent: u64,
    /// Reports that failed.
    pub failed: u64,
    /// The last failure ([`ReportError`], as it was said), if any.
    pub last_error: Option<String>,
}

/// Whether `ev` is sent now, given the phase and time of the last report sent: phase changes and
/// the end of an install at once, ticks of the same phase at most every `interval`.
pub fn due(last: Option<(Phase, Instant)>, ev: &ProgressEvent, now: Instant, interval: Duration) -> bool {
    match last {
        None => true,
        Some((phase, at)) => {
            phase != ev.phase
                || matches!(ev.phase, Phase::Done | Phase::Error)
                || now.duration_since(at) >= interval
        }
    }
}

/// The JSON merge patch of one report.
pub fn patch_body(job: &str, ev: &ProgressEvent) -> serde_json::Value {
    json!({"status": {"setupProgress": {
        "job": job,
        "phase": ev.phase,
        "bytesDone": ev.bytes_done,
        "bytesTotal": ev.bytes_total,
        "filesDone": ev.files_done,
        "filesTotal": ev.files_total,
        "message": ev.message,
    }}})
}

enum Msg {
    Event(ProgressEvent),
    Finish,
}

/// A [`ProgressSink`] that patches `status.setupProgress` of one DeltafinModel.
pub struct StatusReporter {
    tx: Mutex<Option<Sender<Msg>>>,
    thread: Mutex<Option<JoinHandle<ReportSummary>>>,
}

impl std::fmt::Debug for StatusReporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusReporter").finish_non_exhaustive()
    }
}

impl StatusReporter {
    /// Starts the reporting thread. Fails only on a CA file that cannot be read or parsed (the
    /// token is read per request, so a missing token shows up as a failed report).
    pub fn start(
        target: KubeTarget,
        interval: Duration,
        warn: Box<dyn Fn(&str) + Send>,
    ) -> Result<StatusReporter> {
        let client = client_for(&target)?;
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("status-report".into())
            .spawn(move || report_loop(rx, target, client, interval, warn))
            .map_err(|e| Error::io("status-report thread", e))?;
        Ok(StatusReporter {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Sends what is pending and stops the thread.
    pub fn finish(&self) -> ReportSummary {
        if let Some(tx) = self.tx.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = tx.send(Msg::Finish);
        }
        let handle = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        handle.and_then(|h| h.join().ok()).unwrap_or_default()
    }
}

impl Drop for StatusReporter {
    fn drop(&mut self) {
        self.finish();
    }
}

impl ProgressSink for StatusReporter {
    fn event(&self, e: &ProgressEvent) {
        if let Some(tx) = self.tx.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            let _ = tx.send(Msg::Event(e.clone()));
        }
    }
}

fn client_for(target: &KubeTarget) -> Result<reqwest::Client> {
    crate::http::install_tls_provider();
    let mut b = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .user_agent(format!("deltafin-setup/{}", env!("CARGO_PKG_VERSION")));
    if let Some(ca) = &target.ca_file {
        let pem = std::fs::read(ca).map_err(|e| Error::io(ca, e))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| Error::InvalidArgument {
            what: "Kubernetes CA file",
            input: ca.display().to_string(),
            reason: e.to_string(),
        })?;
        b = b.tls_certs_only(certs);
    }
    b.build().map_err(|e| Error::InvalidArgument {
        what: "Kubernetes API client",
        input: target.api.clone(),
        reason: e.to_string(),
    })
}

/// The thread: newest event wins, sent when [`due`]; on `Finish`, the pending one is sent.
fn report_loop(
    rx: Receiver<Msg>,
    target: KubeTarget,
    client: reqwest::Client,
    interval: Duration,
    warn: Box<dyn Fn(&str) + Send>,
) -> ReportSummary {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            warn(&format!("status reports disabled: no runtime: {e}"));
            return ReportSummary::default();
        }
    };
    let mut summary = ReportSummary::default();
    let mut last: Option<(Phase, Instant)> = None;
    let mut pending: Option<ProgressEvent> = None;
    let mut warned: Option<String> = None;
    loop {
        let msg = match (&pending, last) {
            (Some(_), Some((_, at))) => {
                let wait = (at + interval).saturating_duration_since(Instant::now());
                match rx.recv_timeout(wait) {
                    Ok(m) => Some(m),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => Some(Msg::Finish),
                }
            }
            _ => Some(rx.recv().unwrap_or(Msg::Finish)),
        };
        let finish = matches!(msg, Some(Msg::Finish));
        if let Some(Msg::Event(e)) = msg {
            pending = Some(e);
        }
        let Some(ev) = pending.take() else {
            if finish {
                return summary;
            }
            continue;
        };
        if !finish && !due(last, &ev, Instant::now(), interval) {
            pending = Some(ev);
            continue;
        }
        match rt.block_on(send(&client, &target, &ev)) {
            Ok(()) => summary.sent += 1,
            Err(e) => {
                summary.failed += 1;
                // Said once per distinct failure, not once per tick.
                let e = e.to_string();
                if warned.as_deref() != Some(e.as_str()) {
                    warn(&format!("status report to {} failed: {e}", target.status_url()));
                    warned = Some(e.clone());
                }
                summary.last_error = Some(e);
            }
        }
        last = Some((ev.phase, Instant::now()));
        if finish {
            return summary;
        }
    }
}

/// Why one status report failed.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The bearer token file could not be read.
    #[error("token {path}: {source}")]
    Token { path: PathBuf, source: std::io::Error },
    /// The request did not complete (connection, TLS, timeout).
    #[error("{0}")]
    Request(#[from] reqwest::Error),
    /// The API server refused the patch (its `message`, at most 300 characters).
    #[error("HTTP {status}: {message}")]
    Refused { status: u16, message: String },
}

async fn send(
    client: &reqwest::Client,
    target: &KubeTarget,
    ev: &ProgressEvent,
) -> std::result::Result<(), ReportError> {
    let token = std::fs::read_to_string(&target.token_file).map_err(|source| ReportError::Token {
        path: target.token_file.clone(),
        source,
    })?;
    let resp = client
        .patch(target.status_url())
        .bearer_auth(token.trim())
        .header(reqwest::header::CONTENT_TYPE, "application/merge-patch+json")
        .body(patch_body(&target.job, ev).to_string())
        .send()
        .await?;
    let status = resp.status();
    if status.is_success() {
        return Ok(());
    }
    let body = resp.text().await.unwrap_or_default();
    let reason = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["message"].as_str().map(String::from))
        .unwrap_or(body);
    Err(ReportError::Refused {
        status: status.as_u16(),
        message: reason.chars().take(300).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(phase: Phase, done: u64) -> ProgressEvent {
        ProgressEvent {
            phase,
            bytes_done: done,
            bytes_total: 100,
            files_done: 0,
            files_total: 2,
            message: "m".into(),
        }
    }

    #[test]
    fn phase_changes_and_the_end_go_at_once_ticks_are_throttled() {
        let t0 = Instant::now();
        let i = Duration::from_secs(2);
        assert!(due(None, &ev(Phase::Download, 1), t0, i), "the first report");
        let last = Some((Phase::Download, t0));
        assert!(!due(
            last,
            &ev(Phase::Download, 2),
            t0 + Duration::from_millis(500),
            i
        ));
        assert!(due(last, &ev(Phase::Download, 3), t0 + i, i));
        assert!(due(last, &ev(Phase::Verify, 3), t0, i), "a phase change");
        assert!(
            due(Some((Phase::Done, t0)), &ev(Phase::Done, 100), t0, i),
            "the end"
        );
        assert!(due(last, &ev(Phase::Error, 3), t0, i));
    }

    #[test]
    fn the_patch_names_the_job_and_uses_the_crd_field_names() {
        let body = patch_body("m-setup-abc", &ev(Phase::Download, 38));
        let p = &body["status"]["setupProgress"];
        assert_eq!(p["job"], "m-setup-abc");
        assert_eq!(p["phase"], "download");
        assert_eq!(p["bytesDone"], 38);
        assert_eq!(p["bytesTotal"], 100);
        assert_eq!(p["filesTotal"], 2);
        let t = KubeTarget {
            api: "https://10.0.0.1:443/".into(),
            token_file: "/t".into(),
            ca_file: None,
            namespace: "ns".into(),
            name: "m".into(),
            job: "j".into(),
        };
        assert_eq!(
            t.status_url(),
            "https://10.0.0.1:443/apis/deltafin.dev/v1alpha1/namespaces/ns/deltafinmodels/m/status"
        );
    }
}
