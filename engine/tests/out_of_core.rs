//! Out-of-core exactness and bounds: under any memory budget (down to one expert slot, every
//! spine layer streamed), cache policy, read mode and prefetch setting, a model produces
//! bit-identical logits and identical greedy token ids to the all-in-memory run; the heat file
//! survives corruption; a budgeted run stays inside a cgroup v1 memory limit smaller than the
//! model; and every stream of a batched engine loop out of core gets its one-at-a-time ids.

mod ooc_support;

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use deltafin_engine::arch;
use deltafin_engine::cache::heat::Heat;
use deltafin_engine::cache::{OocOptions, PolicyKind, ReadMode};
use deltafin_engine::generate::{Flow, GenerateOptions, Sampling, generate};
use deltafin_engine::scheduler::{self, Event, GenRequest, SchedulerConfig};
use deltafin_engine::synth::{DeepseekSynth, ExpertFormat};
use ooc_support::{greedy, load, run, try_greedy};

/// Reads per expert in this file's runs (several chunks per expert even on tiny models).
const CHUNK: usize = 8192;

fn options(budget: u64, policy: PolicyKind, mode: ReadMode, prefetch: bool) -> OocOptions {
    ooc_support::options(budget, policy, mode, prefetch, CHUNK)
}

fn budgets(dir: &Path) -> Vec<u64> {
    ooc_support::budgets(dir, CHUNK)
}

/// The tiny test model with enough layers that streaming some is cheaper than keeping all.
fn tiny(format: ExpertFormat) -> DeepseekSynth {
    DeepseekSynth {
        layers: 6,
        ..DeepseekSynth::tiny(format)
    }
}

fn check_matrix(format: ExpertFormat, full: bool) {
    let dir = tempfile::tempdir().unwrap();
    tiny(format).write(dir.path()).unwrap();
    let want = run(arch::load(dir.path()).unwrap().as_ref());
    for budget in budgets(dir.path()) {
        for policy in [PolicyKind::Lru, PolicyKind::Lfu] {
            for mode in [ReadMode::Auto, ReadMode::Buffered] {
                for prefetch in [true, false] {
                    if !full && (mode == ReadMode::Buffered || policy == PolicyKind::Lfu) {
                        continue;
                    }
                    let (m, rt) = load(dir.path(), &options(budget, policy, mode, prefetch));
                    let got = run(m.as_ref());
                    let what = format!(
                        "{format:?} budget {budget} {policy:?} {mode:?} prefetch {prefetch}: {:?}",
                        rt.plan
                    );
                    assert_eq!(got.ids, want.ids, "{what}");
                    assert_eq!(got.prefill, want.prefill, "{what}");
                    assert_eq!(got.batched, want.batched, "{what}");
                }
            }
        }
    }
}

#[test]
fn bf16_exact_under_every_budget_policy_read_mode_and_prefetch_setting() {
    check_matrix(ExpertFormat::Bf16, true);
}

#[test]
fn fp8_and_int4_exact_under_every_budget() {
    check_matrix(ExpertFormat::Fp8, false);
    check_matrix(ExpertFormat::Int4, false);
}

#[test]
fn the_smallest_budget_streams_the_spine_and_uses_one_or_two_slots() {
    let dir = tempfile::tempdir().unwrap();
    tiny(ExpertFormat::Bf16).write(dir.path()).unwrap();
    let floor = budgets(dir.path())[0];
    let (m, rt) = load(dir.path(), &options(floor, PolicyKind::Lru, ReadMode::Auto, true));
    assert!(rt.plan.expert_slots <= 2, "{:?}", rt.plan);
    assert!(rt.plan.streamed_layers.len() >= 2, "{:?}", rt.plan);
    assert!(rt.plan.total_bytes() <= floor);
    run(m.as_ref());
    let s = rt.stats();
    assert!(s.spine.streamed_uses > 0, "{s:?}");
    assert!(s.experts.misses > 0 && s.read.bytes > 0, "{s:?}");
    assert_eq!(
        s.spine.arena_reallocations, 0,
        "the forward pass releases each streamed layer in time"
    );
    let too_small = arch::load_budgeted(
        dir.path(),
        &options(floor - 1, PolicyKind::Lru, ReadMode::Auto, true),
    );
    assert_eq!(too_small.err().map(|e| e.kind()), Some("budget"));
}

/// The matrix keys of expert `e` of `layer` as the store serves it now (`None`: a dense layer).
fn expert_keys(
    rt: &deltafin_engine::cache::OocRuntime,
    layer: usize,
    e: usize,
) -> Option<Vec<deltafin_engine::weights::BlobKey>> {
    use deltafin_engine::model::layers::moe::ExpertProvider;
    let keys = std::sync::Mutex::new(Vec::new());
    let served = rt.experts.layer(layer).for_each_expert(&[e], &|_, mlp| {
        mlp.map_matrices(|m| {
            keys.lock().unwrap().push(m.data.key());
            m.clone()
        });
    });
    served.ok().map(|()| keys.into_inner().unwrap())
}

#[test]
fn an_expert_read_again_into_another_slot_keeps_its_bytes_identity() {
    // A device tier keeps routed experts under their blobs' keys (backend::residency): a key
    // that changed with every read of the host cache would never hit, and would fill VRAM with
    // dead copies.
    let dir = tempfile::tempdir().unwrap();
    tiny(ExpertFormat::Fp8).write(dir.path()).unwrap();
    let floor = budgets(dir.path())[0];
    let (_m, rt) = load(
        dir.path(),
        &options(floor, PolicyKind::Lru, ReadMode::Auto, false),
    );
    assert!(rt.plan.expert_slots <= 2, "{:?}", rt.plan);
    let layer = (0..6)
        .find(|&l| expert_keys(&rt, l, 0).is_some())
        .expect("a MoE layer");
    let first = expert_keys(&rt, layer, 0).unwrap();
    let misses = rt.stats().experts.misses;
    let other = expert_keys(&rt, layer, 1).unwrap();
    for e in 2..5 {
        expert_keys(&rt, layer, e).unwrap();
    }
    let again = expert_keys(&rt, layer, 0).unwrap();
    assert!(
        rt.stats().experts.misses >= misses + 5,
        "expert 0 was evicted and read again: {:?}",
        rt.stats().experts
    );
    assert!(!first.is_empty());
    assert_eq!(first, again, "the same bytes, the same keys");
    assert!(
        first.iter().all(|k| !other.contains(k)),
        "another expert's bytes have other keys"
    );
}

#[test]
fn heat_is_recorded_prewarms_and_corruption_means_nothing_learned() {
    let dir = tempfile::tempdir().unwrap();
    tiny(ExpertFormat::Bf16).write(dir.path()).unwrap();
    let want = run(arch::load(dir.path()).unwrap().as_ref());
    let heat_path = dir.path().join("heat.bin");
    let mut o = options(budgets(dir.path())[2], PolicyKind::Lfu, ReadMode::Auto, true);
    o.heat_file = Some(heat_path.clone());
    {
        let (m, rt) = load(dir.path(), &o);
        assert!(rt.heat_note.is_none());
        assert_eq!(run(m.as_ref()), want);
        rt.flush_heat().unwrap();
    }
    let (heat, why) = Heat::load(&heat_path, 6, 8);
    assert!(why.is_none(), "{why:?}");
    assert!(heat.passes > 0 && !heat.ranked().is_empty());
    let (m, rt) = load(dir.path(), &o);
    assert!(rt.prewarmed > 0, "a learned heat file pre-warms the cache");
    assert_eq!(run(m.as_ref()), want);
    rt.flush_heat().unwrap();
    drop((m, rt));

    let good = std::fs::read(&heat_path).unwrap();
    let mut flipped = good.clone();
    flipped[30] ^= 0x40;
    let corruptions: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", good[..good.len() / 2].to_vec()),
        ("empty", Vec::new()),
        ("bit flip", flipped),
        ("garbage", b"not a heat file at all".to_vec()),
    ];
    for (what, bytes) in corruptions {
        std::fs::write(&heat_path, &bytes).unwrap();
        let (m, rt) = load(dir.path(), &o);
        assert_eq!(rt.prewarmed, 0, "{what}: nothing learned");
        if !bytes.is_empty() {
            assert!(rt.heat_note.is_some(), "{what}: the reason is reported");
        }
        assert_eq!(run(m.as_ref()), want, "{what}");
        rt.flush_heat().unwrap();
        let (_, why) = Heat::load(&heat_path, 6, 8);
        assert!(
            why.is_none(),
            "{what}: the next flush writes a valid file again ({why:?})"
        );
    }
}

#[test]
fn prefetch_and_policies_report_consistent_counters() {
    let dir = tempfile::tempdir().unwrap();
    tiny(ExpertFormat::Bf16).write(dir.path()).unwrap();
    let budget = budgets(dir.path())[1];
    for prefetch in [false, true] {
        let (m, rt) = load(
            dir.path(),
            &options(budget, PolicyKind::Lru, ReadMode::Auto, prefetch),
        );
        run(m.as_ref());
        let e = rt.stats().experts;
        assert_eq!(e.uses, e.hits + e.prefetch_hits + e.misses, "{e:?}");
        assert_eq!(
            e.use_bytes,
            e.hit_bytes + e.prefetch_hit_bytes + e.miss_bytes,
            "{e:?}"
        );
        if !prefetch {
            assert_eq!(e.prefetch_reads, 0);
        }
    }
}

/// A model of ~250 MB with 320 experts of 768 KiB.
fn cgroup_model() -> DeepseekSynth {
    DeepseekSynth {
        hidden: 256,
        intermediate: 512,
        moe_intermediate: 512,
        layers: 6,
        heads: 4,
        q_lora: Some(128),
        kv_lora: 64,
        nope: 32,
        rope: 16,
        v: 32,
        experts: 64,
        top_k: 4,
        n_group: 1,
        topk_group: 1,
        first_dense: 1,
        shards: 2,
        ..DeepseekSynth::builtin()
    }
}

/// Runs a budgeted generation inside a cgroup v1 memory child whose limit is well below the
/// model's size, in a child process (this test binary, re-run on the ignored test below), and
/// checks the run succeeds, produces the unbudgeted tokens, and never hits the limit.
#[test]
fn budgeted_run_stays_under_a_cgroup_v1_limit_smaller_than_the_model() {
    let limit: u64 = 96 << 20;
    let budget: u64 = 40 << 20;
    let Some(group) = ooc_support::cgroup("deltafin-ooc-test") else {
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
    let ooc_support::CgroupRun {
        status,
        max_usage,
        failcnt,
        oom_kills,
    } = ooc_support::run_in_cgroup(
        &group,
        limit,
        "cgroup_child_process",
        dir.path(),
        &want,
        budget,
        &[],
    );
    eprintln!(
        "model {} MiB, limit {} MiB, budget {} MiB: peak charged {:.1} MiB, failcnt {failcnt}, oom kills {oom_kills}",
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
}

/// The child half of the cgroup test (does nothing when run directly).
#[test]
#[ignore]
fn cgroup_child_process() {
    let Some((dir, want, budget)) = ooc_support::child_args() else {
        return;
    };
    let mut o = options(budget, PolicyKind::Lru, ReadMode::Auto, true);
    o.reserve_bytes = 8 << 20;
    o.reader.chunk_bytes = 1 << 20;
    let (m, rt) = load(&dir, &o);
    assert!(rt.plan.total_bytes() <= budget);
    assert!(rt.plan.cache_fraction < 0.5, "{:?}", rt.plan);
    assert_eq!(greedy(m.as_ref()), want);
    let s = rt.stats();
    assert!(s.experts.misses > 0);
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let hwm = status
        .lines()
        .find(|l| l.starts_with("VmHWM"))
        .unwrap_or("VmHWM: ?");
    eprintln!(
        "child: {hwm}; plan {} slots, read {} MiB",
        rt.plan.expert_slots,
        s.read.bytes >> 20
    );
}

/// The weights changing under a running model (a failing disk, a half-finished copy, a second
/// `setup`) never yield tokens: every pass that reads a truncated shard fails with a typed
/// error naming the file, the runtime reports itself unhealthy, and once the file is whole
/// again the same ids come back.
#[test]
fn a_shard_truncated_under_a_running_model_fails_until_it_is_restored() {
    let dir = tempfile::tempdir().unwrap();
    tiny(ExpertFormat::Bf16).write(dir.path()).unwrap();
    let floor = budgets(dir.path())[0];
    for mode in [ReadMode::Auto, ReadMode::Buffered] {
        let (m, rt) = load(dir.path(), &options(floor, PolicyKind::Lru, mode, true));
        let want = greedy(m.as_ref());
        assert!(rt.health().is_ok());
        let shards: Vec<_> = rt.reader.read_errors().into_iter().map(|(p, _)| p).collect();
        let originals: Vec<Vec<u8>> = shards.iter().map(|p| std::fs::read(p).unwrap()).collect();
        for (path, bytes) in shards.iter().zip(&originals) {
            let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            f.set_len(bytes.len() as u64 / 2).unwrap();
        }
        for _ in 0..2 {
            let err = try_greedy(m.as_ref()).expect_err("a pass over truncated weights must fail");
            assert_eq!(err.kind(), "weights_unavailable", "{mode:?}: {err}");
            assert!(err.to_string().contains(".safetensors"), "{err}");
        }
        let unhealthy = rt.health().expect_err("truncated shards are unhealthy");
        assert!(unhealthy.to_string().contains("truncated"), "{unhealthy}");
        assert!(rt.reader.read_errors().iter().any(|(_, n)| *n > 0));
        for (path, bytes) in shards.iter().zip(&originals) {
            std::fs::write(path, bytes).unwrap(); // restored in place (same inode)
        }
        assert!(rt.health().is_ok());
        assert_eq!(
            greedy(m.as_ref()),
            want,
            "{mode:?}: the restored weights give the same ids"
        );
    }
}

/// With checksums recorded, one flipped byte inside an expert on disk fails the pass that reads
/// it with the checksum error naming the expert's tensor; the runtime is unhealthy until the
/// byte is restored, and then the ids are the same as before.
#[test]
fn a_flipped_byte_in_an_expert_fails_its_read_with_the_expert_named() {
    use deltafin_engine::weights::{Checksums, WeightIndex};
    let dir = tempfile::tempdir().unwrap();
    tiny(ExpertFormat::Bf16).write(dir.path()).unwrap();
    let index = WeightIndex::open(dir.path()).unwrap();
    Checksums::compute(&index).save(dir.path()).unwrap();
    let floor = budgets(dir.path())[0];
    let (m, rt) = load(dir.path(), &options(floor, PolicyKind::Lru, ReadMode::Auto, true));
    let at_load = rt.reader.checksums().expect("verified from the first read on");
    assert!(at_load > 0, "the resident tensors were verified at load");
    let want = greedy(m.as_ref());
    assert!(
        rt.reader.checksums().unwrap() > at_load,
        "and the experts read by the passes"
    );
    // One byte flipped in the middle of each routed expert's up projection of the first MoE
    // layer: whichever expert the next pass routes to there, its read meets one.
    let mut names: Vec<&str> = index
        .names()
        .filter(|n| n.contains(".experts.") && n.ends_with("up_proj.weight"))
        .collect();
    names.sort_unstable();
    let layer = names[0].split(".experts.").next().unwrap().to_string();
    let flipped: Vec<(std::path::PathBuf, u64)> = names
        .iter()
        .filter(|n| n.starts_with(&format!("{layer}.experts.")))
        .map(|n| {
            let info = index.info(n).unwrap();
            (index.shard_path(info).to_path_buf(), info.offset + info.len / 2)
        })
        .collect();
    let flip = |path: &Path, at: u64| {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        let mut b = [0u8];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_all_at(&[b[0] ^ 0x10], at).unwrap();
    };
    for (path, at) in &flipped {
        flip(path, *at);
    }
    let err = try_greedy(m.as_ref()).expect_err("a flipped byte must fail the read");
    let msg = err.to_string();
    assert_eq!(err.kind(), "weights_unavailable", "{msg}");
    assert!(
        msg.contains("checksum") && msg.contains(&format!("{layer}.experts.")),
        "{msg}"
    );
    assert!(
        rt.health().is_err(),
        "the bad range stays a fault until it reads cleanly"
    );
    for (path, at) in &flipped {
        flip(path, *at);
    }
    assert!(rt.health().is_ok());
    assert_eq!(greedy(m.as_ref()), want);
}

/// Greedy ids of `prompt` through the engine loop, submitted with the others of `prompts` at once.
fn through_scheduler(handle: &scheduler::SchedulerHandle, prompts: &[Vec<u32>]) -> Vec<Vec<u32>> {
    let receivers: Vec<mpsc::Receiver<Event>> = prompts
        .iter()
        .map(|p| {
            let (tx, rx) = mpsc::channel();
            let req = GenRequest {
                prompt: p.clone(),
                max_new_tokens: 12,
                sampling: Sampling::Greedy,
                stop_ids: vec![],
                reuse_state: false,
                kind: deltafin_engine::spec::RequestKind::Completion,
                spec: deltafin_engine::spec::SpecMode::Off,
                decode: Default::default(),
            };
            handle.submit(req, Box::new(tx)).expect("submit");
            rx
        })
        .collect();
    receivers
        .into_iter()
        .map(|rx| {
            let mut ids = Vec::new();
            loop {
                match rx.recv_timeout(Duration::from_secs(120)).expect("an event") {
                    Event::Token(t) => ids.push(t),
                    Event::Done(_) => return ids,
                    Event::Failed { message, .. } => panic!("generation failed: {message}"),
                    _ => {}
                }
            }
        })
        .collect()
}

/// Many agents, one disk: out of core (experts streamed through a cache of a few slots, prefetch
/// on), every stream of every concurrency level 1, 2, 4 and 8 gets the ids it gets run alone. A
/// batched step shares each expert read among its rows, never a row's result.
#[test]
fn every_stream_at_1_2_4_8_streams_gets_its_one_at_a_time_ids_out_of_core() {
    let dir = tempfile::tempdir().unwrap();
    tiny(ExpertFormat::Bf16).write(dir.path()).unwrap();
    let budget = budgets(dir.path())[1];
    let (m, rt) = load(
        dir.path(),
        &options(budget, PolicyKind::Lru, ReadMode::Auto, true),
    );
    let prompts: Vec<Vec<u32>> = (0..8)
        .map(|s| ooc_support::prompt(4 + s, 20 + s as u32))
        .collect();
    let cfg = SchedulerConfig {
        max_batch: 8,
        max_queue: 8,
        state_cache_entries: 0,
        ..Default::default()
    };
    let (handle, _engine) = scheduler::start(m, cfg).expect("engine");
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| through_scheduler(&handle, std::slice::from_ref(p)).remove(0))
        .collect();
    for level in [2, 4, 8] {
        let before = handle.stats().snapshot();
        let ids = through_scheduler(&handle, &prompts[..level]);
        let after = handle.stats().snapshot();
        for (i, got) in ids.iter().enumerate() {
            assert_eq!(got, &alone[i], "{level} streams: stream {i}");
        }
        let rows_per_pass = (after.rows - before.rows) as f64 / (after.steps - before.steps).max(1) as f64;
        assert!(
            rows_per_pass > 1.5,
            "{level} streams were batched ({rows_per_pass:.2} rows per pass)"
        );
    }
    assert!(rt.stats().experts.misses > 0, "the experts streamed from disk");
    // One at a time out of core is the in-memory model's greedy run.
    let mem = arch::load(dir.path()).unwrap();
    for (p, want) in prompts.iter().zip(&alone) {
        let opts = GenerateOptions {
            max_new_tokens: 12,
            sampling: Sampling::Greedy,
            stop_ids: vec![],
            prefill_chunk: 64,
        };
        let mut s = mem.new_state();
        let ids = generate(mem.as_ref(), &mut s, p, &opts, |_| Flow::Continue)
            .unwrap()
            .output_ids;
        assert_eq!(&ids, want);
    }
}
