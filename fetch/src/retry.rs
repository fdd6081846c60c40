//! Retry policy (pure): which failures are retried and how long to wait. Retryable: HTTP 408, 425,
//! 429 and 5xx, connection failures, timeouts and bodies cut short. Not retried: 401/403/404 and
//! every other status (they will not change by waiting). Waits grow exponentially from `base`, are
//! capped at `cap`, carry "equal jitter" (half fixed, half random) so parallel workers do not retry
//! in lockstep, and honour a server's `Retry-After` up to [`MAX_RETRY_AFTER`]. The attempt counter
//! counts *consecutive* failures without progress: a transfer that keeps making progress between
//! drops is never abandoned, one that makes none is abandoned after `max_attempts`.

use std::time::Duration;

/// Longest `Retry-After` we honour.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// What went wrong with one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The server answered with this status (and maybe a `Retry-After`).
    Status {
        status: u16,
        retry_after: Option<Duration>,
    },
    /// Could not connect, or the connection broke before a status arrived.
    Connect,
    /// The connection stalled past the read timeout.
    Timeout,
    /// The body ended (or broke) before all requested bytes arrived.
    BodyCut,
}

impl Failure {
    /// Whether waiting and trying again can help.
    pub fn is_retryable(&self) -> bool {
        match self {
            Failure::Status { status, .. } => matches!(status, 408 | 425 | 429 | 500..=599),
            Failure::Connect | Failure::Timeout | Failure::BodyCut => true,
        }
    }
}

/// Bounded exponential backoff with jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Consecutive failures (without progress) after which we give up.
    pub max_attempts: u32,
    /// Wait after the first failure (before jitter).
    pub base: Duration,
    /// Largest wait (before `Retry-After`).
    pub cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 8,
            base: Duration::from_millis(500),
            cap: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// How long to wait before the next try after the `failures`-th consecutive failure (1-based),
    /// or `None` to give up. `jitter` is a uniform sample in `[0, 1)`.
    pub fn delay(&self, failures: u32, failure: &Failure, jitter: f64) -> Option<Duration> {
        if !failure.is_retryable() || failures >= self.max_attempts {
            return None;
        }
        let exp = failures.saturating_sub(1).min(30);
        let raw = self.base.saturating_mul(1u32 << exp).min(self.cap);
        let jitter = jitter.clamp(0.0, 1.0);
        let wait = raw.mul_f64(0.5 + 0.5 * jitter);
        match failure {
            Failure::Status {
                retry_after: Some(ra),
                ..
            } => Some(wait.max((*ra).min(MAX_RETRY_AFTER))),
            _ => Some(wait),
        }
    }
}

/// A cheap jitter sample in `[0, 1)` (not cryptographic): splitmix64 of the clock and a counter.
pub fn jitter_sample() -> f64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut z = nanos ^ COUNTER.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(status: u16) -> Failure {
        Failure::Status {
            status,
            retry_after: None,
        }
    }

    #[test]
    fn classification() {
        for s in [408, 425, 429, 500, 502, 503, 504] {
            assert!(st(s).is_retryable(), "{s}");
        }
        for s in [400, 401, 403, 404, 410, 416] {
            assert!(!st(s).is_retryable(), "{s}");
        }
        assert!(
            Failure::Connect.is_retryable()
                && Failure::Timeout.is_retryable()
                && Failure::BodyCut.is_retryable()
        );
    }

    #[test]
    fn backoff_grows_caps_and_stops() {
        let p = RetryPolicy {
            max_attempts: 5,
            base: Duration::from_millis(100),
            cap: Duration::from_millis(500),
        };
        let d: Vec<_> = (1..5)
            .map(|n| p.delay(n, &Failure::Connect, 0.999_999).unwrap().as_millis())
            .collect();
        assert_eq!(d, vec![99, 199, 399, 499]);
        let lo = p.delay(3, &Failure::Connect, 0.0).unwrap();
        assert_eq!(lo, Duration::from_millis(200));
        assert_eq!(p.delay(5, &Failure::Connect, 0.5), None);
        assert_eq!(p.delay(1, &st(404), 0.5), None);
    }

    #[test]
    fn retry_after_is_honoured_but_bounded() {
        let p = RetryPolicy::default();
        let f = Failure::Status {
            status: 429,
            retry_after: Some(Duration::from_secs(7)),
        };
        assert_eq!(p.delay(1, &f, 0.0), Some(Duration::from_secs(7)));
        let f = Failure::Status {
            status: 503,
            retry_after: Some(Duration::from_secs(3600)),
        };
        assert_eq!(p.delay(1, &f, 0.0), Some(MAX_RETRY_AFTER));
    }

    #[test]
    fn jitter_in_unit_interval() {
        for _ in 0..1000 {
            let j = jitter_sample();
            assert!((0.0..1.0).contains(&j));
        }
    }
}
