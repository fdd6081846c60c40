//! Shared by the out-of-core tests (`out_of_core.rs` for DeepSeek-V3, `out_of_core_kimi.rs` for
//! Kimi K3 / Kimi-Linear): the run whose bits are compared, the budgeted options and the budget
//! ladder, and the cgroup v1 harness that re-runs this test binary inside a memory limit.

#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use deltafin_engine::arch::{self, LogitRows, Model, SeqInput};
use deltafin_engine::cache::{OocOptions, OocRuntime, PolicyKind, ReadMode};
use deltafin_engine::generate::{Flow, GenerateOptions, Sampling, generate};

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

pub fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 37 + salt * 11 + 5) % 500).collect()
}

/// What a run produces: all-row logits of a chunked prefill, greedy ids (chunked prefill then
/// decode), and a batched pass of two sequences.
#[derive(Debug, PartialEq)]
pub struct Outcome {
    pub prefill: Vec<u32>,
    pub ids: Vec<u32>,
    pub batched: Vec<u32>,
}

pub fn run(m: &dyn Model) -> Outcome {
    let tokens = prompt(13, 1);
    let mut s = m.new_state();
    let mut prefill = Vec::new();
    for part in tokens.chunks(5) {
        let inputs = &mut [SeqInput {
            state: &mut s,
            tokens: part,
            logits: LogitRows::All,
        }];
        prefill.extend(m.forward(inputs, None).unwrap());
    }
    let opts = GenerateOptions {
        max_new_tokens: 10,
        sampling: Sampling::Greedy,
        stop_ids: vec![],
        prefill_chunk: 4,
    };
    let mut s = m.new_state();
    let ids = generate(m, &mut s, &prompt(7, 2), &opts, |_| Flow::Continue)
        .unwrap()
        .output_ids;
    let (mut a, mut b) = (m.new_state(), m.new_state());
    let (pa, pb) = (prompt(3, 3), prompt(4, 4));
    let inputs = &mut [
        SeqInput {
            state: &mut a,
            tokens: &pa,
            logits: LogitRows::All,
        },
        SeqInput {
            state: &mut b,
            tokens: &pb,
            logits: LogitRows::Last,
        },
    ];
    let batched = m.forward(inputs, None).unwrap();
    Outcome {
        prefill: bits(&prefill),
        ids,
        batched: bits(&batched),
    }
}

/// Greedy ids of a short generation (the cgroup runs).
pub fn greedy(m: &dyn Model) -> Vec<u32> {
    try_greedy(m).unwrap()
}

/// [`greedy`], or the error of the pass that failed.
pub fn try_greedy(m: &dyn Model) -> deltafin_engine::Result<Vec<u32>> {
    let opts = GenerateOptions {
        max_new_tokens: 6,
        sampling: Sampling::Greedy,
        stop_ids: vec![],
        prefill_chunk: 8,
    };
    let mut s = m.new_state();
    Ok(generate(m, &mut s, &prompt(9, 5), &opts, |_| Flow::Continue)?.output_ids)
}

/// Budgeted options with small reads (`chunk_bytes`: several chunks per expert even on tiny
/// models), three reader threads and no reserve.
pub fn options(
    budget: u64,
    policy: PolicyKind,
    mode: ReadMode,
    prefetch: bool,
    chunk_bytes: usize,
) -> OocOptions {
    let mut o = OocOptions::with_budget(budget);
    o.policy = policy;
    o.reader.mode = mode;
    o.reader.threads = 3;
    o.reader.chunk_bytes = chunk_bytes;
    o.prefetch = prefetch;
    o.reserve_bytes = 0;
    o
}

pub fn load(dir: &Path, o: &OocOptions) -> (Box<dyn Model>, OocRuntime) {
    arch::load_budgeted(dir, o).unwrap_or_else(|e| panic!("budget {} {:?}: {e}", o.budget, o.reader.mode))
}

/// Budgets from "one slot, every layer streamed" to "everything resident".
pub fn budgets(dir: &Path, chunk_bytes: usize) -> Vec<u64> {
    let o = options(u64::MAX / 4, PolicyKind::Lru, ReadMode::Auto, false, chunk_bytes);
    let (_, rt) = load(dir, &o);
    let p = &rt.plan;
    let max_layer = *p.layer_bytes.iter().max().unwrap();
    let spine: u64 = p.layer_bytes.iter().sum();
    let floor = p.fixed_bytes + 2 * max_layer + p.slot_bytes;
    vec![
        floor,
        floor + 2 * p.slot_bytes,
        p.fixed_bytes + spine + 3 * p.slot_bytes,
        u64::MAX / 4,
    ]
}

pub const CGROUP_V1: &str = "/sys/fs/cgroup/memory";
pub const CGROUP_V2: &str = "/sys/fs/cgroup";

/// What the memory cgroup saw of a child run.
#[derive(Debug)]
pub struct CgroupRun {
    pub status: ExitStatus,
    pub max_usage: u64,
    pub failcnt: u64,
    pub oom_kills: u64,
}

/// A memory cgroup made for one test run: v1 (`memory.limit_in_bytes`) or v2 (`memory.max`).
#[derive(Debug)]
pub struct Cgroup {
    path: PathBuf,
    v2: bool,
}

/// A fresh memory cgroup named `name` (v1 where the v1 memory controller is mounted, else v2
/// with the memory controller enabled for children), or `None` where neither can be made.
/// Under `DELTAFIN_REQUIRE_SERVICES=1` (the README's test command) a missing cgroup is a
/// failure, never a skip.
pub fn cgroup(name: &str) -> Option<Cgroup> {
    let leaf = format!("{name}-{}", std::process::id());
    let made = if Path::new(CGROUP_V1).join("memory.limit_in_bytes").exists() {
        let path = Path::new(CGROUP_V1).join(&leaf);
        std::fs::create_dir(&path).map(|()| Cgroup { path, v2: false })
    } else if std::fs::read_to_string(Path::new(CGROUP_V2).join("cgroup.subtree_control"))
        .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
    {
        let path = Path::new(CGROUP_V2).join(&leaf);
        std::fs::create_dir(&path).map(|()| Cgroup { path, v2: true })
    } else {
        Err(std::io::Error::other(
            "no cgroup v1 memory controller and no cgroup v2 hierarchy delegating `memory`",
        ))
    };
    match made {
        Ok(group) => Some(group),
        Err(e) => {
            let required = std::env::var("DELTAFIN_REQUIRE_SERVICES").is_ok_and(|v| v == "1");
            assert!(
                !required,
                "a memory cgroup is required (DELTAFIN_REQUIRE_SERVICES=1) and cannot be made: {e}; run as root on a host with cgroup v1 or v2"
            );
            eprintln!("skipped: cannot make a memory cgroup ({e}); run as root");
            None
        }
    }
}

impl Cgroup {
    fn limit(&self, bytes: u64) {
        let file = if self.v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        std::fs::write(self.path.join(file), bytes.to_string()).unwrap();
        if self.v2 {
            // Swap would hide the limit's pressure: none, where the kernel has the file.
            let _ = std::fs::write(self.path.join("memory.swap.max"), "0");
        }
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.path.join(file)).unwrap_or_default()
    }

    fn field(text: &str, key: &str) -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// (peak charged bytes, times the limit was hit, OOM kills).
    fn observed(&self) -> (u64, u64, u64) {
        if self.v2 {
            let events = self.read("memory.events");
            let peak = self.read("memory.peak").trim().parse();
            let peak = peak.expect("cgroup v2 without memory.peak (kernel 5.19+ needed)");
            (
                peak,
                Self::field(&events, "max"),
                Self::field(&events, "oom_kill"),
            )
        } else {
            (
                self.read("memory.max_usage_in_bytes").trim().parse().unwrap_or(0),
                self.read("memory.failcnt").trim().parse().unwrap_or(0),
                Self::field(&self.read("memory.oom_control"), "oom_kill"),
            )
        }
    }
}

/// Run the ignored test `child` of this binary inside `group` limited to `limit` bytes, passing
/// the model, the expected ids and the budget (plus `extra` variables); the child waits on stdin
/// until it has been moved into the group. Removes the group afterwards.
pub fn run_in_cgroup(
    group: &Cgroup,
    limit: u64,
    child: &str,
    model: &Path,
    want: &[u32],
    budget: u64,
    extra: &[(&str, &str)],
) -> CgroupRun {
    group.limit(limit);
    let ids: Vec<String> = want.iter().map(u32::to_string).collect();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", child, "--ignored", "--nocapture", "--test-threads=1"])
        .env("DELTAFIN_TEST_CHILD_MODEL", model)
        .env("DELTAFIN_TEST_CHILD_IDS", ids.join(","))
        .env("DELTAFIN_TEST_CHILD_BUDGET", budget.to_string())
        .stdin(Stdio::piped());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let mut process = cmd.spawn().unwrap();
    std::fs::write(group.path.join("cgroup.procs"), process.id().to_string()).unwrap();
    process.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let status = process.wait().unwrap();
    let (max_usage, failcnt, oom_kills) = group.observed();
    let _ = std::fs::remove_dir(&group.path);
    CgroupRun {
        status,
        max_usage,
        failcnt,
        oom_kills,
    }
}

/// The child side: `(model dir, expected ids, budget)` once moved into the group, or `None`
/// when the ignored test is run directly.
pub fn child_args() -> Option<(PathBuf, Vec<u32>, u64)> {
    let dir = std::env::var("DELTAFIN_TEST_CHILD_MODEL").ok()?;
    let want = std::env::var("DELTAFIN_TEST_CHILD_IDS")
        .unwrap()
        .split(',')
        .map(|v| v.parse().unwrap())
        .collect();
    let budget = std::env::var("DELTAFIN_TEST_CHILD_BUDGET")
        .unwrap()
        .parse()
        .unwrap();
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).unwrap(); // wait until moved into the cgroup
    Some((PathBuf::from(dir), want, budget))
}
