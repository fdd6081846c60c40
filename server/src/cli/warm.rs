//! `deltafin warm --dir DIR --trace FILE --top N`: rank the routed experts of a route trace
//! (recorded by `run`/`serve --route-trace FILE`) by the passes that used them and fetch the top
//! N into the stream install in DIR, through its store (coalesced ranges, crash-safe, shards
//! verified and published as they complete). Prints a summary line, or one JSON object with
//! `--json`; exits non-zero with a one-line error on failure.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Args;
use deltafin_engine::cache::routes::RouteCounts;
use deltafin_fetch::error::human_bytes;
use deltafin_fetch::manifest::Manifest;
use deltafin_fetch::safetensors::ExpertKey;
use deltafin_fetch::warm::WarmReport;

use crate::cli::stream_mode::{self, StreamArgs};

/// `deltafin warm`.
#[derive(Debug, Args)]
pub struct WarmArgs {
    /// Install directory (made by `deltafin setup --stream`).
    #[arg(long, env = "DELTAFIN_DIR")]
    pub dir: PathBuf,
    /// Route trace (JSON lines) recorded with `--route-trace`.
    #[arg(long, env = "DELTAFIN_TRACE")]
    pub trace: PathBuf,
    /// How many of the most used experts to make local.
    #[arg(long, env = "DELTAFIN_TOP")]
    pub top: usize,
    /// Largest coalesced range request, in MiB.
    #[arg(long, env = "DELTAFIN_CHUNK_MIB", default_value_t = 64)]
    pub chunk_mib: u64,
    /// Print one JSON object on stdout.
    #[arg(long, env = "DELTAFIN_JSON")]
    pub json: bool,
    #[command(flatten)]
    pub net: StreamArgs,
}

/// `deltafin warm`.
pub fn warm(args: WarmArgs) -> Result<ExitCode> {
    let counts = RouteCounts::read(&args.trace).context("reading the route trace")?;
    let ranked: Vec<ExpertKey> = counts
        .ranked()
        .into_iter()
        .map(|(k, _)| ExpertKey {
            layer: k.layer,
            expert: k.expert,
        })
        .collect();
    if Manifest::load(&args.dir)?.is_none() {
        bail!(
            "{}: no install manifest: run `deltafin setup --stream` first",
            args.dir.display()
        );
    }
    let mut report = match stream_mode::open(&args.dir, &args.net)? {
        Some(source) => {
            let max_run = args.chunk_mib.max(1) << 20;
            deltafin_fetch::warm::warm(source.store(), &ranked, args.top, max_run, args.net.fetch_workers)
                .with_context(|| format!("warming {}", args.dir.display()))?
        }
        // A complete install: every expert is local already.
        None => WarmReport {
            selected: args.top.min(ranked.len()),
            already_local: args.top.min(ranked.len()),
            ..WarmReport::default()
        },
    };
    report.experts_in_trace = ranked.len();
    report.passes = counts.passes;
    report.torn_tail = counts.torn_tail;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        eprintln!("{}", summary(&report));
    }
    Ok(ExitCode::SUCCESS)
}

fn summary(r: &WarmReport) -> String {
    let torn = if r.torn_tail {
        " (a torn last line was skipped)"
    } else {
        ""
    };
    format!(
        "warm: {} passes, {} experts in the trace{torn}; top {}: {} already local, {} fetched in {} request(s), {} in {:.2} s; {} shard(s) completed, verified and published",
        r.passes,
        r.experts_in_trace,
        r.selected,
        r.already_local,
        r.fetched,
        r.requests,
        human_bytes(r.bytes),
        r.seconds,
        r.files_published
    )
}
