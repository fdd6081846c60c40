//! How the reader pool reads shard files: the [`ReadMode`] a user asks for (`--read-mode`) and
//! the [`ReadDecision`] made from it once each shard is opened, a line of the residency plan.

use serde::Serialize;

/// How shard files are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadMode {
    /// `O_DIRECT` when the filesystem supports it; otherwise (per file) buffered reads that drop
    /// the pages they read at once, so expert reads never grow the page cache, which a cgroup
    /// limit charges to the process and the budget cannot see.
    Auto,
    /// `O_DIRECT` only; opening a file that does not support it is an error.
    Direct,
    /// Through the page cache, which keeps what it read (an explicit choice: fast when the
    /// model fits in free memory outside the budget, but charged to a memory cgroup).
    Buffered,
}

impl ReadMode {
    /// Whether buffered reads in this mode drop the pages they read (`Auto` only).
    pub fn drops_pages(self) -> bool {
        self == ReadMode::Auto
    }
}

/// How a reader pool reads its shards and why: a line of the residency plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReadDecision {
    pub mode: ReadMode,
    /// Shards opened with `O_DIRECT`, of `shards`.
    pub direct_shards: usize,
    pub shards: usize,
    /// Whether buffered reads drop the pages they read.
    pub drop_pages: bool,
}

impl ReadDecision {
    /// The decision for `mode` when `direct_shards` of `shards` files accept `O_DIRECT`.
    pub fn new(mode: ReadMode, direct_shards: usize, shards: usize) -> Self {
        ReadDecision {
            mode,
            direct_shards,
            shards,
            drop_pages: mode.drops_pages(),
        }
    }
}

impl std::fmt::Display for ReadDecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (d, n) = (self.direct_shards, self.shards);
        match self.mode {
            ReadMode::Direct => write!(f, "O_DIRECT (--read-mode direct)"),
            ReadMode::Buffered => write!(
                f,
                "buffered through the page cache (--read-mode buffered; a memory cgroup is charged for it)"
            ),
            ReadMode::Auto if d == n => write!(
                f,
                "O_DIRECT (auto: the filesystem supports it, so expert reads never go through the page cache)"
            ),
            ReadMode::Auto if d == 0 => write!(
                f,
                "buffered, each read's pages dropped at once (auto: the filesystem refuses O_DIRECT)"
            ),
            ReadMode::Auto => write!(
                f,
                "O_DIRECT on {d} of {n} shards; the others buffered, each read's pages dropped at once \
                 (auto: their filesystem refuses O_DIRECT)"
            ),
        }
    }
}

impl std::str::FromStr for ReadMode {
    type Err = crate::error::UnknownChoice;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "auto" => Ok(ReadMode::Auto),
            "direct" => Ok(ReadMode::Direct),
            "buffered" => Ok(ReadMode::Buffered),
            _ => Err(crate::error::UnknownChoice {
                what: "read mode",
                input: s.into(),
                expected: "auto, direct, buffered",
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_read_decision_says_what_and_why() {
        let all = ReadDecision::new(ReadMode::Auto, 3, 3).to_string();
        assert!(all.starts_with("O_DIRECT (auto"), "{all}");
        assert!(all.contains("never go through the page cache"), "{all}");
        let none = ReadDecision::new(ReadMode::Auto, 0, 2).to_string();
        assert!(
            none.contains("dropped at once") && none.contains("refuses O_DIRECT"),
            "{none}"
        );
        let some = ReadDecision::new(ReadMode::Auto, 1, 2).to_string();
        assert!(some.starts_with("O_DIRECT on 1 of 2 shards"), "{some}");
        let buffered = ReadDecision::new(ReadMode::Buffered, 2, 2);
        assert!(!buffered.drop_pages && buffered.to_string().contains("--read-mode buffered"));
        assert!(
            ReadDecision::new(ReadMode::Direct, 2, 2)
                .to_string()
                .contains("--read-mode direct")
        );
    }
}
