//! Progress reporting. [`Progress`] keeps the counters and emits [`ProgressEvent`]s to a
//! [`ProgressSink`]: phase changes always, download ticks at most every `interval`. The JSON shape
//! of an event is a contract with the Kubernetes operator and must not change:
//! `{"phase":"resolve|download|verify|done|error","bytes_done":N,"bytes_total":N,"files_done":N,"files_total":N,"message":"..."}`
//! ([`JsonLinesFile`] appends one such object per line).

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::{Error, Result};

/// Phase of an install.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Resolve,
    Download,
    Verify,
    Done,
    Error,
}

/// One progress record (field order is part of the contract).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProgressEvent {
    pub phase: Phase,
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub files_done: u64,
    pub files_total: u64,
    pub message: String,
}

/// Receives progress events (a terminal bar, a JSON-lines file, a test recorder...).
pub trait ProgressSink: Send + Sync {
    fn event(&self, e: &ProgressEvent);
}

/// Discards events.
#[derive(Debug, Default)]
pub struct NoProgress;

impl ProgressSink for NoProgress {
    fn event(&self, _: &ProgressEvent) {}
}

/// Appends one JSON object per line to a file, flushing each line.
#[derive(Debug)]
pub struct JsonLinesFile {
    file: Mutex<File>,
}

impl JsonLinesFile {
    /// Create (truncate) `path`.
    pub fn create(path: &Path) -> Result<Self> {
        let file = File::create(path).map_err(|e| Error::io(path, e))?;
        Ok(JsonLinesFile {
            file: Mutex::new(file),
        })
    }
}

impl ProgressSink for JsonLinesFile {
    fn event(&self, e: &ProgressEvent) {
        let mut line = serde_json::to_string(e).expect("json");
        line.push('\n');
        let mut f = self.file.lock().expect("lock");
        let _ = f.write_all(line.as_bytes()).and_then(|_| f.flush());
    }
}

/// Several sinks at once.
pub struct Fanout(pub Vec<Box<dyn ProgressSink>>);

impl std::fmt::Debug for Fanout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fanout({} sinks)", self.0.len())
    }
}

impl ProgressSink for Fanout {
    fn event(&self, e: &ProgressEvent) {
        for s in &self.0 {
            s.event(e);
        }
    }
}

/// Counters of one install plus throttled emission.
pub struct Progress<'a> {
    sink: &'a dyn ProgressSink,
    bytes_done: AtomicU64,
    bytes_total: AtomicU64,
    files_done: AtomicU64,
    files_total: AtomicU64,
    last: Mutex<Instant>,
    interval: Duration,
}

impl std::fmt::Debug for Progress<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress")
            .field("bytes_done", &self.bytes_done)
            .field("bytes_total", &self.bytes_total)
            .finish()
    }
}

impl<'a> Progress<'a> {
    /// New counters reporting to `sink`, with download ticks at most every `interval`.
    pub fn new(sink: &'a dyn ProgressSink, interval: Duration) -> Self {
        Progress {
            sink,
            bytes_done: AtomicU64::new(0),
            bytes_total: AtomicU64::new(0),
            files_done: AtomicU64::new(0),
            files_total: AtomicU64::new(0),
            last: Mutex::new(Instant::now() - interval),
            interval,
        }
    }

    /// Set the totals and what is already done.
    pub fn set(&self, bytes_done: u64, bytes_total: u64, files_done: u64, files_total: u64) {
        self.bytes_done.store(bytes_done, Ordering::Relaxed);
        self.bytes_total.store(bytes_total, Ordering::Relaxed);
        self.files_done.store(files_done, Ordering::Relaxed);
        self.files_total.store(files_total, Ordering::Relaxed);
    }

    /// Count received bytes and maybe emit a download tick.
    pub fn add_bytes(&self, n: u64, message: &str) {
        self.bytes_done.fetch_add(n, Ordering::Relaxed);
        let mut last = self.last.lock().expect("lock");
        if last.elapsed() >= self.interval {
            *last = Instant::now();
            drop(last);
            self.emit(Phase::Download, message);
        }
    }

    /// Count a finished file.
    pub fn file_done(&self) {
        self.files_done.fetch_add(1, Ordering::Relaxed);
    }

    /// Emit an event now.
    pub fn emit(&self, phase: Phase, message: &str) {
        self.sink.event(&self.snapshot(phase, message));
    }

    /// The current counters as an event.
    pub fn snapshot(&self, phase: Phase, message: &str) -> ProgressEvent {
        ProgressEvent {
            phase,
            bytes_done: self.bytes_done.load(Ordering::Relaxed),
            bytes_total: self.bytes_total.load(Ordering::Relaxed),
            files_done: self.files_done.load(Ordering::Relaxed),
            files_total: self.files_total.load(Ordering::Relaxed),
            message: message.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_shape_is_the_operator_contract() {
        let e = ProgressEvent {
            phase: Phase::Download,
            bytes_done: 1,
            bytes_total: 2,
            files_done: 3,
            files_total: 4,
            message: "m".into(),
        };
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"phase":"download","bytes_done":1,"bytes_total":2,"files_done":3,"files_total":4,"message":"m"}"#
        );
        for (p, s) in [
            (Phase::Resolve, "resolve"),
            (Phase::Verify, "verify"),
            (Phase::Done, "done"),
            (Phase::Error, "error"),
        ] {
            assert_eq!(serde_json::to_value(p).unwrap(), s);
        }
    }

    #[test]
    fn ticks_are_throttled_and_lines_appended() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("p.jsonl");
        let sink = JsonLinesFile::create(&path).unwrap();
        let p = Progress::new(&sink, Duration::from_secs(3600));
        p.set(0, 10, 0, 1);
        p.add_bytes(5, "a"); // first tick goes out
        p.add_bytes(5, "b"); // throttled
        p.file_done();
        p.emit(Phase::Done, "ok");
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(
            lines[1].starts_with(r#"{"phase":"done","bytes_done":10,"bytes_total":10,"files_done":1"#),
            "{}",
            lines[1]
        );
    }
}
