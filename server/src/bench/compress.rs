//! `deltafin bench compress`: what lossless compression of the stored weights would buy, measured
//! before anything is built (nothing is stored compressed). Per stored format (tensor dtype) of a
//! checkpoint: the compressed ratio and the single-core decode GB/s of zstd at a low level, on an
//! evenly spread sample of that format's tensors; for 16-bit floats also with the bytes split into
//! planes first (the sign-and-exponent bytes compress, the mantissa bytes barely do). Then the
//! decode rate an out-of-core run would get per GiB of weights it needs: today the disk's rate;
//! compressed the lower of the disk's rate over the ratio and what the cores can decode.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use deltafin_engine::weights::{Dtype, TensorInfo, WeightIndex};
use serde::Serialize;

/// Arguments of `deltafin bench compress`.
#[derive(Debug, Args)]
pub struct CompressBenchArgs {
    /// Model directory.
    #[arg(long, env = "DELTAFIN_MODEL")]
    pub model: PathBuf,
    /// zstd level (low levels decode fastest; the ratio barely moves above 3 on weights).
    #[arg(long, default_value_t = 1)]
    pub level: i32,
    /// MiB sampled per format, spread evenly over its tensors.
    #[arg(long, default_value_t = 64)]
    pub sample_mib: usize,
    /// Disk read rate, GiB/s, for the I/O bound (`deltafin bench disk` measures it).
    #[arg(long, default_value_t = 2.0)]
    pub disk_gib_s: f64,
    /// Cores decoding (default: all available).
    #[arg(long)]
    pub cores: Option<usize>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One way of compressing one format's sample.
#[derive(Debug, Clone, Serialize)]
pub struct Codec {
    /// `zstd-N`, or `planes+zstd-N` for 16-bit floats split into byte planes.
    pub name: String,
    /// Compressed / stored bytes.
    pub ratio: f64,
    /// Stored bytes decoded per second on one core, GB/s (10^9).
    pub decode_gb_s: f64,
}

/// One stored format of the checkpoint.
#[derive(Debug, Clone, Serialize)]
pub struct FormatReport {
    pub dtype: String,
    pub tensors: usize,
    /// Bytes of this format in the checkpoint, and of the sample measured.
    pub bytes: u64,
    pub sample_bytes: u64,
    pub codecs: Vec<Codec>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct CompressReport {
    pub model: PathBuf,
    pub level: i32,
    pub cores: usize,
    pub disk_gib_s: f64,
    pub formats: Vec<FormatReport>,
    /// Every format with its best codec, weighted by its bytes: compressed / stored.
    pub ratio: f64,
    /// Stored GiB per second an I/O-bound run gets today (the disk rate) and compressed.
    pub effective_gib_s_today: f64,
    pub effective_gib_s_compressed: f64,
    /// Cores busy decoding at that rate: taken from the compute an out-of-core pass needs.
    pub decode_cores: f64,
}

pub fn run(a: CompressBenchArgs) -> Result<()> {
    let index = WeightIndex::open(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
    let cores = a
        .cores
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let mut by_dtype: std::collections::BTreeMap<&'static str, Vec<&TensorInfo>> = Default::default();
    for name in index.names() {
        let info = index.info(name)?;
        by_dtype.entry(info.dtype.name()).or_default().push(info);
    }
    if by_dtype.is_empty() {
        bail!("{}: no tensors", a.model.display());
    }
    let mut formats = Vec::new();
    for (dtype, mut tensors) in by_dtype {
        tensors.sort_by(|x, y| x.name.cmp(&y.name));
        let sample = sample(&index, &tensors, a.sample_mib << 20);
        let mut codecs = vec![measure(&format!("zstd-{}", a.level), &sample, a.level, false)?];
        if matches!(tensors[0].dtype, Dtype::BF16 | Dtype::F16) {
            codecs.push(measure(
                &format!("planes+zstd-{}", a.level),
                &sample,
                a.level,
                true,
            )?);
        }
        formats.push(FormatReport {
            dtype: dtype.to_string(),
            tensors: tensors.len(),
            bytes: tensors.iter().map(|t| t.len).sum(),
            sample_bytes: sample.len() as u64,
            codecs,
        });
    }
    let report = summarize(a.model, a.level, cores, a.disk_gib_s, formats);
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

/// Up to `budget` bytes of `tensors`, every k-th tensor so the sample spreads over the model.
fn sample(index: &WeightIndex, tensors: &[&TensorInfo], budget: usize) -> Vec<u8> {
    let total: u64 = tensors.iter().map(|t| t.len).sum();
    let step = (total / budget.max(1) as u64).max(1) as usize;
    let mut out = Vec::with_capacity(budget.min(total as usize));
    for t in tensors.iter().step_by(step.min(tensors.len()).max(1)) {
        let blob = index.blob(t);
        let take = (budget - out.len()).min(blob.len());
        out.extend_from_slice(&blob[..take]);
        if out.len() >= budget {
            break;
        }
    }
    out
}

/// Byte planes of 16-bit values: every high byte, then every low byte.
fn split_planes(bytes: &[u8]) -> Vec<u8> {
    let pairs = bytes.len() / 2;
    let mut out = vec![0u8; bytes.len()];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        out[i] = pair[1];
        out[pairs + i] = pair[0];
    }
    out[2 * pairs..].copy_from_slice(&bytes[2 * pairs..]);
    out
}

/// [`split_planes`] undone into `out`.
fn join_planes(planes: &[u8], out: &mut [u8]) {
    let pairs = planes.len() / 2;
    for i in 0..pairs {
        out[2 * i] = planes[pairs + i];
        out[2 * i + 1] = planes[i];
    }
    out[2 * pairs..].copy_from_slice(&planes[2 * pairs..]);
}

/// Compress `data` (byte planes first when `planes`), check the round trip, and time decoding
/// (back to the stored layout) on this thread for at least 0.3 s.
fn measure(name: &str, data: &[u8], level: i32, planes: bool) -> Result<Codec> {
    let input = if planes { split_planes(data) } else { data.to_vec() };
    let packed = zstd::bulk::compress(&input, level).context("zstd")?;
    let mut out = vec![0u8; data.len()];
    let decode = |out: &mut [u8]| -> Result<()> {
        let plain = zstd::bulk::decompress(&packed, data.len()).context("zstd")?;
        match planes {
            true => join_planes(&plain, out),
            false => out.copy_from_slice(&plain),
        }
        Ok(())
    };
    decode(&mut out)?;
    anyhow::ensure!(out == data, "{name}: the round trip changed the bytes");
    let (started, mut rounds) = (Instant::now(), 0u64);
    while rounds < 3 || started.elapsed().as_secs_f64() < 0.3 {
        decode(&mut out)?;
        rounds += 1;
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(Codec {
        name: name.to_string(),
        ratio: packed.len() as f64 / data.len().max(1) as f64,
        decode_gb_s: (data.len() as f64 * rounds as f64) / seconds / 1e9,
    })
}

/// The checkpoint-wide ratio (each format's best codec, weighted by bytes) and the effective
/// stored-GiB/s of an I/O-bound run: `min(disk / ratio, cores x decode rate)`.
fn summarize(
    model: PathBuf,
    level: i32,
    cores: usize,
    disk: f64,
    formats: Vec<FormatReport>,
) -> CompressReport {
    let total: u64 = formats.iter().map(|f| f.bytes).sum::<u64>().max(1);
    let (mut packed, mut decode_seconds) = (0.0, 0.0);
    for f in &formats {
        let best = f
            .codecs
            .iter()
            .min_by(|x, y| x.ratio.total_cmp(&y.ratio))
            .expect("every format has a codec");
        packed += f.bytes as f64 * best.ratio;
        decode_seconds += f.bytes as f64 / (best.decode_gb_s * 1e9);
    }
    let ratio = packed / total as f64;
    let decode_gib_s = total as f64 / decode_seconds.max(f64::MIN_POSITIVE) / (1u64 << 30) as f64;
    let effective = (disk / ratio).min(cores as f64 * decode_gib_s);
    CompressReport {
        model,
        level,
        cores,
        disk_gib_s: disk,
        formats,
        ratio,
        effective_gib_s_today: disk,
        effective_gib_s_compressed: effective,
        decode_cores: effective / decode_gib_s,
    }
}

fn print_table(r: &CompressReport) {
    println!(
        "{}: zstd level {}, {} core(s), disk {:.2} GiB/s",
        r.model.display(),
        r.level,
        r.cores,
        r.disk_gib_s
    );
    println!(
        "{:<10} {:>8} {:>10} {:>10}  {:<16} {:>7} {:>12}",
        "dtype", "tensors", "GiB", "sample MiB", "codec", "ratio", "decode GB/s"
    );
    for f in &r.formats {
        for c in &f.codecs {
            println!(
                "{:<10} {:>8} {:>10.3} {:>10.1}  {:<16} {:>7.3} {:>12.2}",
                f.dtype,
                f.tensors,
                f.bytes as f64 / (1u64 << 30) as f64,
                f.sample_bytes as f64 / (1u64 << 20) as f64,
                c.name,
                c.ratio,
                c.decode_gb_s
            );
        }
    }
    println!(
        "checkpoint: compressed/stored {:.3}; an I/O-bound run gets {:.2} stored GiB/s today, {:.2} compressed ({:.2}x), with {:.2} of {} cores decoding",
        r.ratio,
        r.effective_gib_s_today,
        r.effective_gib_s_compressed,
        r.effective_gib_s_compressed / r.effective_gib_s_today,
        r.decode_cores,
        r.cores
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_planes_round_trip_odd_lengths_too() {
        for len in [0, 1, 2, 7, 64] {
            let data: Vec<u8> = (0..len as u32).map(|i| (i * 37 % 251) as u8).collect();
            let planes = split_planes(&data);
            let mut back = vec![0u8; len];
            join_planes(&planes, &mut back);
            assert_eq!(back, data, "{len}");
        }
        assert_eq!(split_planes(&[1, 2, 3, 4]), [2, 4, 1, 3]);
    }

    #[test]
    fn the_compressed_rate_is_capped_by_the_cores_decoding() {
        let f = |ratio, decode_gb_s| FormatReport {
            dtype: "BF16".into(),
            tensors: 1,
            bytes: 1 << 30,
            sample_bytes: 1 << 20,
            codecs: vec![Codec {
                name: "zstd-1".into(),
                ratio,
                decode_gb_s,
            }],
        };
        // Fast decode: the disk bound moves by the ratio.
        let r = summarize(PathBuf::new(), 1, 2, 2.0, vec![f(0.8, 100.0)]);
        assert!((r.effective_gib_s_compressed - 2.5).abs() < 1e-9);
        // Slow decode: the cores are the bound.
        let r = summarize(PathBuf::new(), 1, 1, 2.0, vec![f(0.5, 1.0737418240)]);
        assert!(
            (r.effective_gib_s_compressed - 1.0).abs() < 1e-6,
            "{}",
            r.effective_gib_s_compressed
        );
    }
}
