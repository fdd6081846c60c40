//! `deltafin push DIR oci://REGISTRY/REPO:TAG`: upload a complete install (or a plain model
//! directory) as a Deltafin model artifact: one raw layer per file titled with its relative path,
//! a JSON config blob, `artifactType` `application/vnd.deltafin.model.v1+json`. Layers already in
//! the registry are not uploaded again, so an interrupted push resumes at file granularity.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;
use deltafin_fetch::artifact::push_plan;
use deltafin_fetch::error::human_bytes;

use crate::cli::setup::{NetArgs, oci_options};

/// `deltafin push`.
#[derive(Debug, Args)]
pub struct PushArgs {
    /// The install (or model) directory.
    pub dir: PathBuf,
    /// Destination, `oci://REGISTRY/REPO:TAG`.
    pub destination: String,
    /// Print one JSON summary object on stdout.
    #[arg(long, env = "DELTAFIN_JSON")]
    pub json: bool,
    #[command(flatten)]
    pub net: NetArgs,
}

/// Run `deltafin push`.
pub fn push(args: PushArgs) -> anyhow::Result<ExitCode> {
    let Some(reference) = args.destination.strip_prefix("oci://") else {
        bail!(
            "destination `{}`: expected oci://REGISTRY/REPO:TAG",
            args.destination
        );
    };
    let (files, config) = push_plan(&args.dir)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let started = std::time::Instant::now();
    let report = rt
        .block_on(deltafin_fetch::source::oci::push(
            &args.dir,
            reference,
            &files,
            &config,
            &oci_options(&args.net),
        ))
        .with_context(|| format!("pushing {} to {}", args.dir.display(), args.destination))?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        eprintln!(
            "pushed {} files ({}, {} already present) to {} in {:.1} s",
            report.files,
            human_bytes(report.bytes),
            report.skipped,
            report.reference,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(ExitCode::SUCCESS)
}
