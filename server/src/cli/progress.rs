//! Progress display for people: an indicatif bar when stderr is a terminal, otherwise plain
//! lines on stderr (phase changes, and a download line at most every 10 s). The machine-readable
//! stream is `deltafin_fetch::progress::JsonLinesFile` (`--progress-file`).

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use deltafin_fetch::progress::{Phase, ProgressEvent, ProgressSink};
use indicatif::{ProgressBar, ProgressStyle};

/// A terminal bar or plain stderr lines, chosen by whether stderr is a TTY.
pub fn human_sink(label: &str) -> Box<dyn ProgressSink> {
    if std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {wide_msg}",
            )
            .expect("template"),
        );
        bar.set_prefix(label.to_string());
        Box::new(Bar(bar))
    } else {
        Box::new(Lines {
            label: label.to_string(),
            last: Mutex::new((None, Instant::now())),
        })
    }
}

struct Bar(ProgressBar);

impl ProgressSink for Bar {
    fn event(&self, e: &ProgressEvent) {
        self.0.set_length(e.bytes_total);
        self.0.set_position(e.bytes_done);
        self.0
            .set_message(format!("{}/{} files {}", e.files_done, e.files_total, e.message));
        if matches!(e.phase, Phase::Done | Phase::Error) {
            self.0.finish();
        }
    }
}

struct Lines {
    label: String,
    last: Mutex<(Option<Phase>, Instant)>,
}

impl ProgressSink for Lines {
    fn event(&self, e: &ProgressEvent) {
        if e.phase == Phase::Error {
            return; // main prints the error itself, as the last line
        }
        let mut last = self.last.lock().expect("lock");
        let changed = last.0 != Some(e.phase);
        if !changed && e.phase == Phase::Download && last.1.elapsed() < Duration::from_secs(10) {
            return;
        }
        *last = (Some(e.phase), Instant::now());
        eprintln!(
            "{}: {:?} {}/{} bytes, {}/{} files {}",
            self.label, e.phase, e.bytes_done, e.bytes_total, e.files_done, e.files_total, e.message
        );
    }
}

/// Forwards events but reports `done` as `download` (for an install that is followed by more).
pub struct NotFinal<'a>(pub &'a dyn ProgressSink);

impl ProgressSink for NotFinal<'_> {
    fn event(&self, e: &ProgressEvent) {
        if e.phase == Phase::Done {
            self.0.event(&ProgressEvent {
                phase: Phase::Download,
                ..e.clone()
            });
        } else {
            self.0.event(e);
        }
    }
}
