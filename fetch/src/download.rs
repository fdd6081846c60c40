//! Moving bytes: [`fetch_range`] copies one byte range of a remote file into its staged file,
//! resuming inside the range after a dropped connection (the next request starts where the data
//! stopped), retrying per [`RetryPolicy`], and finally making the range durable and recording it.
//! A range is recorded present only once every byte of it is on disk.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::StreamExt;

use crate::error::{Error, Result};
use crate::http::{AttemptError, AttemptKind};
use crate::progress::Progress;
use crate::retry::{Failure, RetryPolicy, jitter_sample};
use crate::source::Remote;
use crate::staged::StagedFile;

/// Received bytes are made durable and recorded at least this often within a range, bounding
/// what a crash can lose per worker.
pub const COMMIT_EVERY: u64 = 16 << 20;

/// What a range fetch needs besides the range.
#[derive(Debug)]
pub struct FetchCtx<'a> {
    pub remote: &'a Remote,
    /// The pinned revision to read.
    pub pinned: &'a str,
    pub policy: RetryPolicy,
    pub progress: Option<&'a Progress<'a>>,
    /// Bytes received over the network (all attempts).
    pub received: &'a AtomicU64,
}

/// Fetch `range` of `staged`'s remote file into it, then commit the range.
pub async fn fetch_range(ctx: &FetchCtx<'_>, staged: &StagedFile, range: Range<u64>) -> Result<()> {
    let mut pos = range.start;
    let mut committed = range.start;
    let mut failures = 0u32;
    while pos < range.end {
        let before = pos;
        let outcome = copy_attempt(ctx, staged, pos..range.end, &mut pos, &mut committed).await;
        let err = match outcome {
            Ok(()) if pos == range.end => break,
            Ok(()) => AttemptError::retry(
                "",
                Failure::BodyCut,
                format!(
                    "body ended after {} of {} bytes",
                    pos - range.start,
                    range.end - range.start
                ),
            ),
            Err(e) => e,
        };
        if pos > before {
            failures = 0;
        }
        failures += 1;
        let delay = match &err.kind {
            AttemptKind::Retry(f, _) => ctx.policy.delay(failures, f, jitter_sample()),
            AttemptKind::Fatal(_) => None,
        };
        match delay {
            Some(d) => tokio::time::sleep(d).await,
            None => return Err(with_url(err, staged).into_error(failures)),
        }
    }
    staged.commit(range)
}

fn with_url(mut e: AttemptError, staged: &StagedFile) -> AttemptError {
    if e.url.is_empty() {
        e.url = staged.remote.path.clone();
    }
    e
}

/// One request for `want`, writing what arrives and advancing `pos`.
async fn copy_attempt(
    ctx: &FetchCtx<'_>,
    staged: &StagedFile,
    want: Range<u64>,
    pos: &mut u64,
    committed: &mut u64,
) -> Result<(), AttemptError> {
    let mut body = ctx
        .remote
        .open_range(ctx.pinned, &staged.remote, want.clone())
        .await?;
    while let Some(chunk) = body.next().await {
        let chunk = chunk?;
        let room = (want.end - *pos) as usize;
        let take = chunk.len().min(room);
        staged
            .write_at(*pos, &chunk[..take])
            .map_err(|e| AttemptError::fatal("", e))?;
        *pos += take as u64;
        ctx.received.fetch_add(take as u64, Ordering::Relaxed);
        if let Some(p) = ctx.progress {
            p.add_bytes(take as u64, &staged.remote.path);
        }
        if *pos - *committed >= COMMIT_EVERY {
            staged
                .commit(*committed..*pos)
                .map_err(|e| AttemptError::fatal("", e))?;
            *committed = *pos;
        }
        if *pos == want.end {
            break;
        }
    }
    Ok(())
}

/// Zero-length ranges need no request; an error for an impossible range.
pub fn check_range(staged: &StagedFile, range: &Range<u64>) -> Result<()> {
    if range.start > range.end || range.end > staged.remote.size {
        return Err(Error::InvalidArgument {
            what: "range",
            input: format!("{}..{}", range.start, range.end),
            reason: format!("outside {} ({} bytes)", staged.remote.path, staged.remote.size),
        });
    }
    Ok(())
}
