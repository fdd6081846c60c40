//! The persistent expert heat histogram: a decayed count, per (layer, expert), of the passes
//! that selected the expert. It survives restarts so a new process can pre-warm its cache with
//! the experts this installation used most.
//!
//! File format (little-endian): `b"DFHEAT01"`, `u32 layers`, `u32 experts`, `u64 passes`,
//! `f32 heat[layers * experts]`, `u32 crc32` (IEEE) of every preceding byte. Writes are atomic
//! (temp file, fsync, rename, fsync of the directory) under an exclusive `flock` of a sibling
//! `.lock` file, merging with what other processes wrote since. A file that is missing,
//! truncated, of another shape, or whose checksum fails means "nothing learned": the engine
//! starts cold and the next flush replaces it.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::ExpertKey;
use crate::error::{Error, Result};
use crate::weights::write_atomic;

const MAGIC: &[u8; 8] = b"DFHEAT01";
const HEADER: usize = 8 + 4 + 4 + 8;

/// Heat of every expert.
#[derive(Debug, Clone, PartialEq)]
pub struct Heat {
    pub layers: usize,
    pub experts: usize,
    /// Passes recorded (before decay).
    pub passes: u64,
    /// `layers * experts` values.
    pub values: Vec<f32>,
}

/// Why a heat file was not used (the run then starts cold).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeatError {
    #[error("not a heat file")]
    NotHeat,
    #[error("recorded for {} layers x {} experts, model has {} x {}", recorded.0, recorded.1, model.0, model.1)]
    Shape {
        recorded: (usize, usize),
        model: (usize, usize),
    },
    #[error("{found} bytes, expected {expected} (truncated or padded)")]
    Length { found: usize, expected: usize },
    #[error("checksum mismatch")]
    Checksum,
    #[error("negative or non-finite heat")]
    Values,
}

impl Heat {
    /// No history.
    pub fn empty(layers: usize, experts: usize) -> Heat {
        Heat {
            layers,
            experts,
            passes: 0,
            values: vec![0.0; layers * experts],
        }
    }

    /// Serialise.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + 4 * self.values.len() + 4);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(self.layers as u32).to_le_bytes());
        out.extend_from_slice(&(self.experts as u32).to_le_bytes());
        out.extend_from_slice(&self.passes.to_le_bytes());
        for v in &self.values {
            out.extend_from_slice(&v.to_le_bytes());
        }
        let crc = crc32(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Parse a file's bytes for a model of this shape; the error says why it was rejected.
    pub fn decode(bytes: &[u8], layers: usize, experts: usize) -> std::result::Result<Heat, HeatError> {
        let want = HEADER + 4 * layers * experts + 4;
        if bytes.len() < HEADER || &bytes[..8] != MAGIC {
            return Err(HeatError::NotHeat);
        }
        let l = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
        let e = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
        if (l, e) != (layers, experts) {
            return Err(HeatError::Shape {
                recorded: (l, e),
                model: (layers, experts),
            });
        }
        if bytes.len() != want {
            return Err(HeatError::Length {
                found: bytes.len(),
                expected: want,
            });
        }
        let crc = u32::from_le_bytes(bytes[want - 4..].try_into().unwrap());
        if crc32(&bytes[..want - 4]) != crc {
            return Err(HeatError::Checksum);
        }
        let passes = u64::from_le_bytes(bytes[16..24].try_into().unwrap());
        let values: Vec<f32> = bytes[HEADER..want - 4]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        if values.iter().any(|v| !v.is_finite() || *v < 0.0) {
            return Err(HeatError::Values);
        }
        Ok(Heat {
            layers,
            experts,
            passes,
            values,
        })
    }

    /// Load `path`; any problem yields an empty histogram and the reason.
    pub fn load(path: &Path, layers: usize, experts: usize) -> (Heat, Option<String>) {
        match std::fs::read(path) {
            Ok(bytes) => match Heat::decode(&bytes, layers, experts) {
                Ok(h) => (h, None),
                Err(why) => (
                    Heat::empty(layers, experts),
                    Some(format!("{}: {why}; starting cold", path.display())),
                ),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Heat::empty(layers, experts), None),
            Err(e) => (
                Heat::empty(layers, experts),
                Some(format!("{}: {e}; starting cold", path.display())),
            ),
        }
    }

    /// Heat of one expert.
    pub fn get(&self, key: ExpertKey) -> f32 {
        self.values[key.layer as usize * self.experts + key.expert as usize]
    }

    /// Multiply every value by `0.5^(passes / half_life)`.
    pub fn decay(&mut self, passes: u64, half_life: u64) {
        let f = 0.5f64.powf(passes as f64 / half_life.max(1) as f64) as f32;
        self.values.iter_mut().for_each(|v| *v *= f);
    }

    /// Experts with positive heat, hottest first (ties by key).
    pub fn ranked(&self) -> Vec<(ExpertKey, f32)> {
        let mut out: Vec<(ExpertKey, f32)> = self
            .values
            .iter()
            .enumerate()
            .filter(|(_, v)| **v > 0.0)
            .map(|(i, &v)| {
                (
                    ExpertKey {
                        layer: (i / self.experts) as u32,
                        expert: (i % self.experts) as u32,
                    },
                    v,
                )
            })
            .collect();
        out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        out
    }
}

/// In-memory deltas recorded since the last flush.
#[derive(Debug, Clone)]
pub struct HeatRecorder {
    pub path: PathBuf,
    pub half_life: u64,
    layers: usize,
    experts: usize,
    counts: Vec<u32>,
    passes: u64,
}

impl HeatRecorder {
    pub fn new(path: PathBuf, layers: usize, experts: usize, half_life: u64) -> Self {
        HeatRecorder {
            path,
            half_life,
            layers,
            experts,
            counts: vec![0; layers * experts],
            passes: 0,
        }
    }

    /// Experts selected by any row of a pass at `layer` (each counted once per pass).
    pub fn record(&mut self, layer: usize, experts: &[usize]) {
        for &e in experts {
            self.counts[layer * self.experts + e] += 1;
        }
    }

    /// A pass ended.
    pub fn end_pass(&mut self) {
        self.passes += 1;
    }

    /// Passes recorded since the last flush.
    pub fn pending_passes(&self) -> u64 {
        self.passes
    }

    /// Merge the deltas into the file (locked, atomic) and reset them.
    pub fn flush(&mut self) -> Result<()> {
        if self.passes == 0 {
            return Ok(());
        }
        let lock_path = self.path.with_extension("lock");
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| Error::io(&lock_path, e))?;
        let _guard = FileLock::exclusive(&lock).map_err(|e| Error::io(&lock_path, e))?;
        let (mut heat, _) = Heat::load(&self.path, self.layers, self.experts);
        heat.decay(self.passes, self.half_life);
        for (v, &c) in heat.values.iter_mut().zip(&self.counts) {
            *v += c as f32;
        }
        heat.passes += self.passes;
        write_atomic(&self.path, &heat.encode())?;
        self.counts.iter_mut().for_each(|c| *c = 0);
        self.passes = 0;
        Ok(())
    }
}

/// An exclusive advisory lock held until drop.
struct FileLock<'a>(&'a File);

impl<'a> FileLock<'a> {
    fn exclusive(file: &'a File) -> std::io::Result<Self> {
        use std::os::fd::AsRawFd;
        // SAFETY: `flock` on a descriptor owned by `file`, which outlives the guard.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(FileLock(file))
    }
}

impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: unlocking the descriptor locked in `exclusive`, still open.
        #[allow(unsafe_code)]
        unsafe {
            libc::flock(self.0.as_raw_fd(), libc::LOCK_UN);
        }
    }
}

/// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320), bitwise.
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn round_trip_decay_and_ranking() {
        let mut h = Heat::empty(2, 3);
        h.values = vec![0.0, 4.0, 1.0, 2.0, 0.0, 4.0];
        h.passes = 9;
        let back = Heat::decode(&h.encode(), 2, 3).unwrap();
        assert_eq!(back, h);
        let r = back.ranked();
        assert_eq!(r[0].0, ExpertKey { layer: 0, expert: 1 });
        assert_eq!(r[1].0, ExpertKey { layer: 1, expert: 2 });
        assert_eq!(r.len(), 4);
        let mut d = back.clone();
        d.decay(8, 8);
        assert_eq!(d.values[1], 2.0);
        assert!(
            Heat::decode(&h.encode(), 3, 3)
                .unwrap_err()
                .to_string()
                .contains("layers")
        );
        let mut bad = h.encode();
        bad[30] ^= 1;
        assert_eq!(Heat::decode(&bad, 2, 3), Err(HeatError::Checksum));
        assert_eq!(Heat::decode(b"garbage", 2, 3), Err(HeatError::NotHeat));
    }

    #[test]
    fn flush_merges_with_decay() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("heat.bin");
        let mut rec = HeatRecorder::new(path.clone(), 2, 2, 1);
        rec.record(1, &[0, 1]);
        rec.end_pass();
        rec.flush().unwrap();
        rec.record(1, &[1]);
        rec.end_pass();
        rec.flush().unwrap();
        let (h, why) = Heat::load(&path, 2, 2);
        assert!(why.is_none());
        // first flush: [0,0,1,1]; second: decayed by 0.5 then + [0,0,0,1].
        assert_eq!(h.values, vec![0.0, 0.0, 0.5, 1.5]);
        assert_eq!(h.passes, 2);
    }
}
