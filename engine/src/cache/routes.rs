//! Route traces: the routed experts every pass selected, appended to a file as JSON lines, and
//! the reading side that ranks experts by how many passes used them (`deltafin warm`).
//!
//! The expert store records a trace on the same path as the [`super::heat`] histogram: each MoE
//! layer's selection (the union over the pass's rows, each expert once) is noted when the layer
//! asks for its experts, and one line is written when the pass ends:
//!
//! ```text
//! {"pass":0,"routes":[{"layer":1,"experts":[0,5]},{"layer":2,"experts":[3,7]}]}
//! ```
//!
//! `pass` counts the recording process's passes; a pass that failed (e.g. an expert could not be
//! fetched) is not recorded. Each line is written with one `write(2)` on a
//! file opened `O_APPEND`, so processes appending to one trace never interleave inside a line; a
//! crash can at worst leave a torn last line without its newline, which the reader skips and
//! reports ([`RouteCounts::torn_tail`]). Any other malformed line is an error naming the line.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::ExpertKey;
use crate::error::{Error, Result};

/// One layer's selection in a trace line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerRoutes {
    pub layer: u32,
    pub experts: Vec<u32>,
}

/// One trace line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PassRoutes {
    pub pass: u64,
    pub routes: Vec<LayerRoutes>,
}

/// Appends a line per pass to a trace file.
#[derive(Debug)]
pub struct RouteRecorder {
    path: PathBuf,
    file: File,
    passes: u64,
    current: Vec<LayerRoutes>,
}

impl RouteRecorder {
    /// Open `path` for appending (created if missing).
    pub fn create(path: &Path) -> Result<Self> {
        let file = File::options()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| Error::io(path, e))?;
        Ok(RouteRecorder {
            path: path.to_path_buf(),
            file,
            passes: 0,
            current: Vec::new(),
        })
    }

    /// Layer `layer` selected `experts` in this pass. A layer seen again before the pass ended
    /// means the previous pass failed (it never ended): its partial selections are dropped.
    pub fn record(&mut self, layer: usize, experts: &[usize]) {
        if self.current.iter().any(|l| l.layer == layer as u32) {
            self.current.clear();
        }
        let mut experts: Vec<u32> = experts.iter().map(|&e| e as u32).collect();
        experts.sort_unstable();
        experts.dedup();
        self.current.push(LayerRoutes {
            layer: layer as u32,
            experts,
        });
    }

    /// The pass failed: forget its selections (no line is written for it).
    pub fn abort_pass(&mut self) {
        self.current.clear();
    }

    /// Whether nothing is recorded for a pass under way.
    #[cfg(test)]
    pub(crate) fn is_between_passes(&self) -> bool {
        self.current.is_empty()
    }

    /// The pass ended: append its line (nothing for a pass without routed experts).
    pub fn end_pass(&mut self) -> Result<()> {
        if self.current.is_empty() {
            return Ok(());
        }
        let line = PassRoutes {
            pass: self.passes,
            routes: std::mem::take(&mut self.current),
        };
        self.passes += 1;
        let mut bytes = serde_json::to_vec(&line).expect("route line serialises");
        bytes.push(b'\n');
        // One write call per line: with O_APPEND the kernel places it at the end as a unit.
        match self.file.write(&bytes) {
            Ok(n) if n == bytes.len() => Ok(()),
            Ok(n) => Err(Error::io(
                &self.path,
                std::io::Error::other(format!("short write: {n} of {} bytes", bytes.len())),
            )),
            Err(e) => Err(Error::io(&self.path, e)),
        }
    }
}

/// Passes per expert over a whole trace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteCounts {
    /// Trace lines (passes) read.
    pub passes: u64,
    /// Passes that selected each expert.
    pub counts: BTreeMap<ExpertKey, u64>,
    /// A last line without its newline that did not parse (a writer died mid-line) was skipped.
    pub torn_tail: bool,
}

impl RouteCounts {
    /// Parse a trace's text; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let mut out = RouteCounts::default();
        let complete = text.ends_with('\n');
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let pass: PassRoutes = match serde_json::from_str(line) {
                Ok(p) => p,
                Err(_) if i + 1 == lines.len() && !complete => {
                    out.torn_tail = true;
                    continue;
                }
                Err(e) => {
                    return Err(Error::InvalidArgument {
                        field: "route trace",
                        reason: format!("{} line {}: not a route record: {e}", path.display(), i + 1),
                    });
                }
            };
            out.passes += 1;
            for l in pass.routes {
                let mut experts = l.experts;
                experts.sort_unstable();
                experts.dedup();
                for expert in experts {
                    *out.counts
                        .entry(ExpertKey {
                            layer: l.layer,
                            expert,
                        })
                        .or_default() += 1;
                }
            }
        }
        Ok(out)
    }

    /// Read and parse the trace at `path`.
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::parse(&text, path)
    }

    /// Experts by descending count, ties by (layer, expert).
    pub fn ranked(&self) -> Vec<(ExpertKey, u64)> {
        let mut v: Vec<(ExpertKey, u64)> = self.counts.iter().map(|(&k, &c)| (k, c)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(layer: u32, expert: u32) -> ExpertKey {
        ExpertKey { layer, expert }
    }

    #[test]
    fn recorded_lines_parse_back_and_rank() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("routes.jsonl");
        for _ in 0..2 {
            // Two processes' worth of appends to one file.
            let mut r = RouteRecorder::create(&path).unwrap();
            r.record(1, &[5, 0, 5]);
            r.record(2, &[3]);
            r.end_pass().unwrap();
            r.end_pass().unwrap(); // an empty pass writes nothing
            r.record(1, &[7]); // a pass that failed after layer 1: never ended
            r.record(1, &[0]);
            r.end_pass().unwrap();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 4, "{text}");
        assert!(
            text.starts_with(
                r#"{"pass":0,"routes":[{"layer":1,"experts":[0,5]},{"layer":2,"experts":[3]}]}"#
            ),
            "{text}"
        );
        let c = RouteCounts::read(&path).unwrap();
        assert_eq!(c.passes, 4);
        assert!(!c.torn_tail);
        assert_eq!(c.ranked(), vec![(key(1, 0), 4), (key(1, 5), 2), (key(2, 3), 2)]);
    }

    #[test]
    fn a_torn_last_line_is_skipped_and_other_garbage_is_an_error() {
        let p = Path::new("t.jsonl");
        let good = r#"{"pass":0,"routes":[{"layer":1,"experts":[2]}]}"#;
        let c = RouteCounts::parse(&format!("{good}\n{{\"pass\":1,\"rou"), p).unwrap();
        assert_eq!((c.passes, c.torn_tail), (1, true));
        let e = RouteCounts::parse(&format!("{good}\nnot json\n{good}\n"), p).unwrap_err();
        assert!(e.to_string().contains("t.jsonl line 2"), "{e}");
        let e = RouteCounts::parse("{\"pass\":1}\n", p).unwrap_err();
        assert!(e.to_string().contains("line 1"), "{e}");
    }
}
