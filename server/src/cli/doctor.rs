//! `deltafin doctor [--dir DIR] [--json] [--verify] [--write-checksums]`: a check of an install:
//! the install manifest and what is on disk (sizes, and hashes with `--verify`), `config.json`
//! through the engine's typed config, the safetensors headers through the engine's weight index,
//! the per-tensor checksums (re-hashed with `--verify`), free space, the mode (full, or stream
//! with the share already local) and the drafts under `drafts/`, and, with `--device cuda`, that
//! the GPU opens. Prints a verdict; exits 0 only when the install is usable. Read-only, except
//! `--write-checksums`, which first records the checksums `serve` and `run` verify every weight
//! read against (`.deltafin/checksums.json`, written atomically).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use deltafin_engine::arch::ModelSpec;
use deltafin_engine::backend::{Backend, Device};
use deltafin_engine::weights::checksums::ALGORITHM;
use deltafin_engine::weights::{Checksums, ShardFile, WeightIndex};
use deltafin_fetch::error::human_bytes;
use deltafin_fetch::fsutil::free_space;
use deltafin_fetch::inspect::{InstallStatus, inspect};
use deltafin_fetch::manifest::{FileState, Manifest, Mode, STATE_DIR};
use deltafin_fetch::staged::staged_paths;
use serde::Serialize;

/// `deltafin doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Install directory.
    #[arg(long, env = "DELTAFIN_DIR", default_value = ".")]
    pub dir: PathBuf,
    /// Re-hash every complete file against the source's digests.
    #[arg(long, env = "DELTAFIN_VERIFY")]
    pub verify: bool,
    /// Print one JSON object on stdout.
    #[arg(long, env = "DELTAFIN_JSON")]
    pub json: bool,
    /// Record the xxh3-64 of every tensor (`.deltafin/checksums.json`) from the files as they
    /// are now, before checking; `serve` and `run` then verify every weight read against them.
    #[arg(long, env = "DELTAFIN_WRITE_CHECKSUMS")]
    pub write_checksums: bool,
}

/// One check and its outcome.
#[derive(Debug, Serialize)]
struct Check {
    name: &'static str,
    ok: bool,
    detail: String,
}

/// A draft under `drafts/`.
#[derive(Debug, Serialize)]
struct Draft {
    name: String,
    complete: bool,
    detail: String,
}

#[derive(Debug, Serialize)]
struct Report {
    dir: PathBuf,
    usable: bool,
    verdict: String,
    mode: Option<Mode>,
    percent_local: Option<f64>,
    free_bytes: u64,
    checks: Vec<Check>,
    drafts: Vec<Draft>,
    install: Option<InstallStatus>,
}

/// Run `deltafin doctor`; with a GPU `device` (`deltafin --device cuda doctor`) it also opens
/// the device and compiles the kernels, so a pod can check its GPU before serving.
pub fn doctor(args: DoctorArgs, device: Device) -> anyhow::Result<ExitCode> {
    if args.write_checksums {
        let line = record_checksums(&args.dir)?;
        if !args.json {
            eprintln!("{line}");
        }
    }
    let report = examine(&args.dir, args.verify, device)?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_human(&report);
    }
    Ok(if report.usable {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn examine(dir: &Path, verify: bool, device: Device) -> anyhow::Result<Report> {
    anyhow::ensure!(dir.is_dir(), "{} is not a directory", dir.display());
    let install = inspect(dir, verify)?;
    let free = free_space(dir)?;
    let mut checks = install_checks(install.as_ref(), free, verify);
    checks.push(match ModelSpec::load(dir) {
        Ok(spec) => Check {
            name: "config",
            ok: true,
            detail: format!("model_type {}", spec.model_type),
        },
        Err(e) => Check {
            name: "config",
            ok: false,
            detail: e.to_string(),
        },
    });
    checks.push(weights_check(dir, install.as_ref()));
    checks.push(checksums_check(dir, verify));
    if device != Device::Cpu {
        checks.push(device_check(device));
    }
    let drafts = drafts(dir)?;
    let usable = checks.iter().all(|c| c.ok);
    let verdict = verdict(usable, install.as_ref(), &checks);
    Ok(Report {
        dir: dir.into(),
        usable,
        verdict,
        mode: install.as_ref().map(|s| s.mode),
        percent_local: install.as_ref().map(|s| s.percent_local),
        free_bytes: free,
        checks,
        drafts,
        install,
    })
}

/// Open the compute device (compiling its kernels) and drop it again.
fn device_check(device: Device) -> Check {
    match Backend::open(device, None) {
        Ok(b) => Check {
            name: "device",
            ok: true,
            detail: b.describe(),
        },
        Err(e) => Check {
            name: "device",
            ok: false,
            detail: e.to_string(),
        },
    }
}

/// Manifest-level checks: files (sizes, hashes, completeness) and free space.
fn install_checks(install: Option<&InstallStatus>, free: u64, verify: bool) -> Vec<Check> {
    let Some(s) = install else {
        let detail = "none (not installed by `deltafin setup`); checking files only".into();
        return vec![Check {
            name: "manifest",
            ok: true,
            detail,
        }];
    };
    let detail = if s.problems.is_empty() {
        let hashed = if verify { ", hashes verified" } else { "" };
        format!("{} @ {} ({} files{hashed})", s.source, s.pinned, s.files.len())
    } else {
        s.problems.join("; ")
    };
    let missing = s.bytes_total - s.bytes_local;
    let space = format!(
        "{} free; {} more needed for a full install",
        human_bytes(free),
        human_bytes(missing)
    );
    vec![
        Check {
            name: "files",
            ok: s.problems.is_empty(),
            detail,
        },
        Check {
            name: "free space",
            ok: s.mode == Mode::Full || free >= missing,
            detail: space,
        },
    ]
}

/// The engine's safetensors index over the shards (stream installs: over the staged shards, as
/// `run`/`serve` open them, which parses every header).
fn weights_check(dir: &Path, install: Option<&InstallStatus>) -> Check {
    if let Some(s) = install.filter(|s| s.mode == Mode::Stream) {
        let (ok, indexed) = match stream_shards(dir).and_then(|sh| Ok(WeightIndex::open_shards(dir, &sh)?)) {
            Ok(ix) => (true, format!("{} tensors indexed", ix.names().count())),
            Err(e) => (false, e.to_string()),
        };
        let detail = format!(
            "stream mode: {:.1}% local, {} of experts fetched on first use; {indexed}",
            s.percent_local,
            human_bytes(s.remote_expert_bytes)
        );
        return Check {
            name: "weights",
            ok,
            detail,
        };
    }
    match WeightIndex::open(dir) {
        Ok(ix) => Check {
            name: "weights",
            ok: true,
            detail: format!("{} tensors indexed", ix.names().count()),
        },
        Err(e) => Check {
            name: "weights",
            ok: false,
            detail: e.to_string(),
        },
    }
}

/// Every top-level shard of a stream install with the file it is read from (read-only).
fn stream_shards(dir: &Path) -> anyhow::Result<Vec<ShardFile>> {
    let m = Manifest::load(dir)?.ok_or_else(|| anyhow::anyhow!("no install manifest"))?;
    let state = dir.join(STATE_DIR);
    let mut out: Vec<ShardFile> = m
        .files
        .iter()
        .filter(|f| f.path.ends_with(".safetensors") && !f.path.contains('/'))
        .map(|f| ShardFile {
            name: f.path.clone(),
            path: match f.state {
                FileState::Published => dir.join(&f.path),
                _ => staged_paths(&state, &f.path).0,
            },
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn verdict(usable: bool, install: Option<&InstallStatus>, checks: &[Check]) -> String {
    if !usable {
        let failed: Vec<&str> = checks.iter().filter(|c| !c.ok).map(|c| c.name).collect();
        return format!("NOT USABLE: failed {}", failed.join(", "));
    }
    match install {
        Some(s) if s.mode == Mode::Stream => format!("usable (stream mode, {:.1}% local)", s.percent_local),
        Some(_) => "usable (full install)".into(),
        None => "usable (plain model directory)".into(),
    }
}

fn drafts(dir: &Path) -> anyhow::Result<Vec<Draft>> {
    let root = dir.join("drafts");
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        if !e.path().is_dir() {
            continue;
        }
        let name = e.file_name().to_string_lossy().into_owned();
        let (complete, detail) = match inspect(&e.path(), false)? {
            Some(s) if s.problems.is_empty() && s.mode == Mode::Full => {
                (true, format!("{} @ {}", s.source, s.pinned))
            }
            Some(s) => (false, s.problems.join("; ")),
            None => (e.path().join("config.json").is_file(), "no manifest".into()),
        };
        out.push(Draft {
            name,
            complete,
            detail,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn print_human(r: &Report) {
    println!("deltafin doctor: {}", r.dir.display());
    for c in &r.checks {
        println!(
            "  [{}] {:<10} {}",
            if c.ok { " ok " } else { "FAIL" },
            c.name,
            c.detail
        );
    }
    for d in &r.drafts {
        println!(
            "  [{}] draft {:<5} {}",
            if d.complete { " ok " } else { "part" },
            d.name,
            d.detail
        );
    }
    println!("verdict: {}", r.verdict);
}

/// Record the checksums of every tensor of the complete checkpoint in `dir`; returns the line
/// to print. A stream install is refused: its experts are not all local.
pub fn record_checksums(dir: &Path) -> anyhow::Result<String> {
    if let Some(m) = Manifest::load(dir)?
        && m.mode == Mode::Stream
    {
        anyhow::bail!(
            "{}: a stream install's experts are not all local; complete it with `deltafin setup --full` before recording checksums",
            dir.display()
        );
    }
    let started = std::time::Instant::now();
    let index = WeightIndex::open(dir)?;
    let sums = Checksums::compute(&index);
    sums.save(dir)?;
    let tensors: usize = sums.shards.values().map(|s| s.tensors.len()).sum();
    Ok(format!(
        "checksums: recorded {ALGORITHM} of {tensors} tensors in {} shards in {:.1} s ({}); weight reads are verified against them",
        sums.shards.len(),
        started.elapsed().as_secs_f64(),
        Checksums::path(dir).display()
    ))
}

/// The recorded checksums: present and matching the shards (with `verify`: every tensor
/// re-hashed and compared, which finds bit rot at rest).
fn checksums_check(dir: &Path, verify: bool) -> Check {
    let check = |ok, detail| Check {
        name: "checksums",
        ok,
        detail,
    };
    let sums = match Checksums::load(dir) {
        Ok(Some(s)) => s,
        Ok(None) => {
            return check(
                true,
                "none recorded (`deltafin doctor --write-checksums` records them; reads are then verified)"
                    .into(),
            );
        }
        Err(e) => return check(false, e.to_string()),
    };
    let Ok(index) = WeightIndex::open(dir) else {
        return check(
            false,
            "recorded, but the shards do not index (see `weights`)".into(),
        );
    };
    if let Err(e) = sums.for_index(&index) {
        return check(false, e.to_string());
    }
    if !verify {
        return check(
            true,
            format!("{ALGORITHM} recorded; every weight read is verified"),
        );
    }
    let now = Checksums::compute(&index);
    let bad: Vec<String> = sums
        .shards
        .iter()
        .flat_map(|(shard, s)| {
            let now = &now.shards[shard].tensors;
            s.tensors
                .iter()
                .filter(move |(t, h)| now.get(*t) != Some(*h))
                .map(move |(t, _)| format!("{shard}: `{t}`"))
        })
        .collect();
    match bad.first() {
        None => check(
            true,
            format!("{ALGORITHM} recorded; every tensor re-hashed and matches"),
        ),
        Some(first) => check(
            false,
            format!(
                "{} tensors differ from their recorded checksums, first {first}",
                bad.len()
            ),
        ),
    }
}
