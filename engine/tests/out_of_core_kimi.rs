//! Out-of-core exactness and bounds for Kimi K3 and Kimi-Linear: under any memory budget (down
//! to one or two expert slots with every spine layer streamed), cache policy (LRU, LFU), read
//! mode (`O_DIRECT`, buffered) and prefetch setting, the committed fixtures (`fixtures/k3`,
//! `fixtures/kimi-linear`) and synthetic checkpoints in the real formats (K3: MXFP4 experts at
//! the latent width, `language_model.` prefix) produce bit-identical logits (f32 bits) and
//! identical greedy token ids to the in-memory load; each expert's read layout is exactly its
//! six MXFP4 tensors; and a budgeted K3 run stays inside a cgroup v1 memory limit smaller than
//! the model.

mod ooc_support;

use std::path::{Path, PathBuf};

use deltafin_engine::arch;
use deltafin_engine::cache::{OocOptions, PolicyKind, ReadMode};
use deltafin_engine::synth::KimiSynth;
use ooc_support::{greedy, load, run};

/// Reads per expert in this file's runs (several chunks per expert even on tiny models).
const CHUNK: usize = 4096;

fn options(budget: u64, policy: PolicyKind, mode: ReadMode, prefetch: bool) -> OocOptions {
    ooc_support::options(budget, policy, mode, prefetch, CHUNK)
}

fn budgets(dir: &Path) -> Vec<u64> {
    ooc_support::budgets(dir, CHUNK)
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// `O_DIRECT` where the filesystem has it (the test reads through it), else `Auto`.
fn direct_mode(dir: &Path) -> ReadMode {
    match arch::load_budgeted(
        dir,
        &options(u64::MAX / 4, PolicyKind::Lru, ReadMode::Direct, false),
    ) {
        Ok(_) => ReadMode::Direct,
        Err(e) => {
            eprintln!(
                "O_DIRECT unavailable for {} ({e}); testing ReadMode::Auto instead",
                dir.display()
            );
            ReadMode::Auto
        }
    }
}

/// Every budget × policy × read mode × prefetch setting (`full`), or every budget × prefetch
/// setting with LRU and `O_DIRECT` plus one buffered LFU run, against the in-memory load.
fn check_matrix(dir: &Path, full: bool) {
    let want = run(arch::load(dir).unwrap().as_ref());
    let direct = direct_mode(dir);
    let budgets = budgets(dir);
    let mut runs = 0;
    for (bi, &budget) in budgets.iter().enumerate() {
        for policy in [PolicyKind::Lru, PolicyKind::Lfu] {
            for mode in [direct, ReadMode::Buffered] {
                for prefetch in [true, false] {
                    let smoke =
                        policy == PolicyKind::Lfu && mode == ReadMode::Buffered && prefetch && bi == 0;
                    if !full && (mode == ReadMode::Buffered || policy == PolicyKind::Lfu) && !smoke {
                        continue;
                    }
                    let (m, rt) = load(dir, &options(budget, policy, mode, prefetch));
                    let got = run(m.as_ref());
                    let what = format!(
                        "{} budget {budget} {policy:?} {mode:?} prefetch {prefetch}: {:?}",
                        dir.display(),
                        rt.plan
                    );
                    assert_eq!(got.ids, want.ids, "{what}");
                    assert_eq!(got.prefill, want.prefill, "{what}");
                    assert_eq!(got.batched, want.batched, "{what}");
                    let s = rt.stats();
                    assert_eq!(s.read_mode, mode, "{what}");
                    if bi == 0 {
                        // The floor really streams the spine and evicts experts.
                        assert!(
                            s.spine.streamed_uses > 0 && rt.plan.resident_layers < rt.plan.layer_bytes.len(),
                            "{what}"
                        );
                        assert!(s.experts.misses > rt.plan.expert_slots, "{what}: {:?}", s.experts);
                    }
                    if prefetch && bi == 3 {
                        assert!(s.experts.prefetch_reads > 0, "{what}: {:?}", s.experts);
                    }
                    if !prefetch {
                        assert_eq!(s.experts.prefetch_reads, 0, "{what}");
                    }
                    runs += 1;
                }
            }
        }
    }
    assert!(runs >= 8, "{runs} configurations run");
}

#[test]
fn k3_fixture_exact_under_every_budget_policy_read_mode_and_prefetch_setting() {
    check_matrix(&fixture("k3"), true);
}

#[test]
fn kimi_linear_fixture_exact_under_every_budget() {
    check_matrix(&fixture("kimi-linear"), false);
}

#[test]
fn synthetic_k3_exact_under_every_budget_policy_read_mode_and_prefetch_setting() {
    let dir = tempfile::tempdir().unwrap();
    KimiSynth::k3_tiny().write(dir.path()).unwrap();
    check_matrix(dir.path(), true);
}

#[test]
fn synthetic_kimi_linear_exact_under_every_budget() {
    let dir = tempfile::tempdir().unwrap();
    KimiSynth {
        layers: 6,
        full_attn_layers: vec![3, 6],
        ..KimiSynth::linear_tiny()
    }
    .write(dir.path())
    .unwrap();
    check_matrix(dir.path(), false);
}

/// The comparison can fail: another checkpoint of the same shape gives other bits, and so do
/// the same weights with one expert byte changed (which only the expert cache serves).
#[test]
fn the_comparison_detects_a_changed_expert_byte() {
    let dir = tempfile::tempdir().unwrap();
    let synth = KimiSynth::k3_tiny();
    synth.write(dir.path()).unwrap();
    let want = run(arch::load(dir.path()).unwrap().as_ref());
    let other = tempfile::tempdir().unwrap();
    KimiSynth {
        seed: synth.seed + 1,
        ..synth.clone()
    }
    .write(other.path())
    .unwrap();
    assert_ne!(
        run(arch::load(other.path()).unwrap().as_ref()).prefill,
        want.prefill
    );

    let index = deltafin_engine::weights::WeightIndex::open(dir.path()).unwrap();
    let mut targets: Vec<(PathBuf, u64)> = Vec::new();
    for l in synth.first_dense..synth.layers {
        for e in 0..synth.experts {
            let name =
                format!("language_model.model.layers.{l}.block_sparse_moe.experts.{e}.w2.weight_packed");
            let info = index.info(&name).unwrap();
            targets.push((index.shard_path(info).to_path_buf(), info.offset));
        }
    }
    drop(index);
    assert!(!targets.is_empty());
    for (path, offset) in targets {
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[offset as usize] ^= 0x11; // two E2M1 codes of row 0 (`offset` is absolute)
        std::fs::write(&path, bytes).unwrap();
    }
    let (m, _rt) = load(
        dir.path(),
        &options(budgets(dir.path())[0], PolicyKind::Lru, ReadMode::Auto, true),
    );
    assert_ne!(
        run(m.as_ref()).prefill,
        want.prefill,
        "changed expert bytes reach the budgeted model"
    );
}

/// Each expert's read set is exactly its six MXFP4 tensors (`w{1,2,3}.weight_packed` +
/// `weight_scale`), recorded from the in-memory builder: the bytes counted per expert use equal
/// their sum, and one slot holds them.
#[test]
fn k3_expert_layouts_are_the_six_mxfp4_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let synth = KimiSynth::k3_tiny();
    synth.write(dir.path()).unwrap();
    let (w, i) = (synth.moe_intermediate, synth.latent);
    let six = 2 * (w * i / 2 + w * i / 32) + (i * w / 2 + i * w / 32);
    assert_eq!(synth.expert_bytes(), six as u64);
    let budget = budgets(dir.path())[1];
    let (m, rt) = load(
        dir.path(),
        &options(budget, PolicyKind::Lru, ReadMode::Auto, false),
    );
    run(m.as_ref());
    let e = rt.stats().experts;
    assert!(e.uses > 0);
    assert_eq!(e.use_bytes, e.uses * six as u64, "{e:?}");
    assert!(rt.plan.slot_bytes >= six as u64 && rt.plan.slot_bytes < six as u64 + 2 * 4096 + 256 * 1024);
    assert_eq!(e.uses, e.hits + e.prefetch_hits + e.misses, "{e:?}");
    assert!(e.passes > 0);
}

#[test]
fn the_smallest_k3_budget_streams_and_a_smaller_one_is_refused() {
    let dir = fixture("k3");
    let floor = budgets(&dir)[0];
    let (m, rt) = load(&dir, &options(floor, PolicyKind::Lru, ReadMode::Auto, true));
    assert!(rt.plan.expert_slots <= 2, "{:?}", rt.plan);
    assert!(rt.plan.streamed_layers.len() >= 2, "{:?}", rt.plan);
    assert!(rt.plan.total_bytes() <= floor);
    run(m.as_ref());
    let s = rt.stats();
    assert!(s.spine.streamed_uses > 0, "{s:?}");
    assert_eq!(
        s.spine.arena_reallocations, 0,
        "the forward pass releases each streamed layer in time"
    );
    let too_small = arch::load_budgeted(&dir, &options(floor - 1, PolicyKind::Lru, ReadMode::Auto, true));
    assert_eq!(too_small.err().map(|e| e.kind()), Some("budget"));
    assert!(arch::supports_budget(&dir).unwrap());
    assert!(arch::supports_budget(&fixture("kimi-linear")).unwrap());
}

/// Heat recorded by a K3 run pre-warms the next load (the K3 MoE layers are 1..layers) and the
/// pre-warmed cache changes nothing.
#[test]
fn k3_heat_is_recorded_and_prewarms_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let synth = KimiSynth::k3_tiny();
    synth.write(dir.path()).unwrap();
    let want = run(arch::load(dir.path()).unwrap().as_ref());
    let mut o = options(budgets(dir.path())[2], PolicyKind::Lfu, ReadMode::Auto, true);
    o.heat_file = Some(dir.path().join("heat.bin"));
    for round in 0..2 {
        let (m, rt) = load(dir.path(), &o);
        assert!(rt.heat_note.is_none(), "{:?}", rt.heat_note);
        assert_eq!(
            round > 0,
            rt.prewarmed > 0,
            "round {round}: pre-warmed {}",
            rt.prewarmed
        );
        assert_eq!(run(m.as_ref()), want, "round {round}");
        rt.flush_heat().unwrap();
    }
    let (heat, why) =
        deltafin_engine::cache::heat::Heat::load(&dir.path().join("heat.bin"), synth.layers, synth.experts);
    assert!(why.is_none(), "{why:?}");
    assert!(
        heat.ranked()
            .iter()
            .all(|(k, _)| k.layer as usize >= synth.first_dense),
        "dense layers have no heat"
    );
}

/// A K3-format model of ~260 MB: 8 layers (MLA at one-based 4 and 8), 64 MXFP4 experts of
/// 408 KiB per MoE layer, top-4.
fn cgroup_model() -> KimiSynth {
    KimiSynth {
        hidden: 1024,
        intermediate: 1024,
        moe_intermediate: 512,
        latent: 512,
        layers: 8,
        full_attn_layers: vec![4, 8],
        heads: 4,
        q_lora: Some(128),
        kv_lora: 64,
        kda_heads: 4,
        kda_head_dim: 64,
        experts: 64,
        top_k: 4,
        block_size: 3,
        shards: 3,
        ..KimiSynth::k3_builtin()
    }
}

/// Runs a budgeted K3 generation inside a cgroup v1 memory child whose limit is well below the
/// model's size, in a child process (this test binary, re-run on the ignored test below), and
/// checks the run succeeds and produces the unbudgeted tokens, and (with `O_DIRECT` reads, where
/// the filesystem has them) that the group's peak charge stays within the budget.
#[test]
fn budgeted_k3_run_stays_under_a_cgroup_v1_limit_smaller_than_the_model() {
    let limit: u64 = 96 << 20;
    let budget: u64 = 40 << 20;
    let Some(group) = ooc_support::cgroup("deltafin-ooc-k3-test") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let synth = cgroup_model();
    synth.write(dir.path()).unwrap();
    assert!(
        synth.data_bytes() > 2 * limit,
        "the model must not fit in the limit"
    );
    let want = greedy(arch::load(dir.path()).unwrap().as_ref());
    let direct = direct_mode(dir.path()) == ReadMode::Direct;
    let extra = [("DELTAFIN_TEST_CHILD_DIRECT", if direct { "1" } else { "0" })];
    let ooc_support::CgroupRun {
        status,
        max_usage,
        failcnt,
        oom_kills,
    } = ooc_support::run_in_cgroup(
        &group,
        limit,
        "k3_cgroup_child_process",
        dir.path(),
        &want,
        budget,
        &extra,
    );
    eprintln!(
        "K3 model {} MiB, limit {} MiB, budget {} MiB: peak charged {:.1} MiB, failcnt {failcnt}, oom kills {oom_kills}",
        synth.data_bytes() >> 20,
        limit >> 20,
        budget >> 20,
        max_usage as f64 / (1 << 20) as f64
    );
    assert!(
        status.success(),
        "the budgeted run failed or was killed: {status}"
    );
    assert_eq!(oom_kills, 0);
    assert!(max_usage > 0 && max_usage <= limit);
    if direct {
        // With O_DIRECT reads nothing lands in the page cache: the group never reaches its
        // limit and its peak charge stays within the budget (plus the harness's slack).
        assert_eq!(failcnt, 0, "the group hit its limit");
        assert!(
            max_usage <= budget + (16 << 20),
            "peak charge {max_usage} over budget {budget}"
        );
    }
}

/// The child half of the cgroup test (does nothing when run directly).
#[test]
#[ignore]
fn k3_cgroup_child_process() {
    let Some((dir, want, budget)) = ooc_support::child_args() else {
        return;
    };
    let direct = std::env::var("DELTAFIN_TEST_CHILD_DIRECT").is_ok_and(|v| v == "1");
    let mode = if direct { ReadMode::Direct } else { ReadMode::Auto };
    let mut o = options(budget, PolicyKind::Lru, mode, true);
    o.reserve_bytes = 8 << 20;
    o.reader.chunk_bytes = 1 << 20;
    let (m, rt) = load(&dir, &o);
    assert!(rt.plan.total_bytes() <= budget);
    assert!(rt.plan.cache_fraction < 0.5, "{:?}", rt.plan);
    assert!(!rt.plan.streamed_layers.is_empty(), "{:?}", rt.plan);
    assert_eq!(greedy(m.as_ref()), want);
    let s = rt.stats();
    assert!(s.experts.misses > 0);
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |k: &str| {
        status
            .lines()
            .find(|l| l.starts_with(k))
            .unwrap_or("?")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let hwm = format!("{}, {}, {}", field("VmHWM"), field("RssAnon"), field("RssFile"));
    // The engine's own memory (anonymous: buffers, slots, arenas, state) stays within the
    // budget plus the test harness; an in-memory load of this model would hold ~260 MiB.
    let anon_kib: u64 = field("RssAnon")
        .split(' ')
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(u64::MAX);
    assert!(
        anon_kib << 10 <= budget + (16 << 20),
        "anonymous memory {anon_kib} KiB over budget {budget}"
    );
    eprintln!(
        "child: {hwm}; plan {} slots, {} streamed layers, read {} MiB",
        rt.plan.expert_slots,
        rt.plan.streamed_layers.len(),
        s.read.bytes >> 20
    );
}
