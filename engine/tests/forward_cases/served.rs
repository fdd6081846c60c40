//! Whole served requests on a device: the engine loop the server runs (`scheduler::start`) over
//! `arch::DeviceModel` against the same loop over the CPU model. Several requests at once
//! (batched passes over several sequences, each in its own cache slot), greedy and sampled,
//! with drafts forced on (verify passes whose rejected rows are cut back, so mirrors go stale),
//! the DSpark head reading the target's hidden rows, and state reuse (cloned states: new
//! slots): every request's token ids must be the CPU's.

use std::sync::{Arc, mpsc};
use std::time::Duration;

use deltafin_engine::arch::{self, DeviceModel, Model};
use deltafin_engine::backend::device::DeviceOps;
use deltafin_engine::generate::Sampling;
use deltafin_engine::scheduler::{self, Event, GenRequest, SchedulerConfig, SchedulerHandle};
use deltafin_engine::spec::mtp::Mtp;
use deltafin_engine::spec::{Drafts, EconomicsConfig, RequestKind, SpecMode};
use deltafin_engine::synth::{DSparkSynth, DeepseekSynth, DeepseekV4Synth, ExpertFormat};

/// What drafts in a served test: a synthetic DSpark head made for the target, or the target's
/// own MTP block.
#[derive(Clone)]
enum Drafter {
    DSpark,
    Mtp(Arc<Mtp>),
}

/// The engine loop over `model`: batches of up to 3, prefill chunks of 5 tokens, drafts forced
/// (`drafter` drafts every step, and most drafts are rejected), state reuse on.
fn engine(model: Box<dyn Model>, drafter: &Drafter) -> SchedulerHandle {
    let mut drafts = Drafts {
        economics: EconomicsConfig {
            forced: true,
            max_width: 3,
            ..Default::default()
        },
        ..Default::default()
    };
    match drafter {
        Drafter::DSpark => {
            let dir = tempfile::tempdir().unwrap();
            DSparkSynth::for_target(model.info(), 5)
                .write(dir.path())
                .unwrap();
            let head = deltafin_engine::spec::dspark::DSpark::load(dir.path()).unwrap();
            drafts.dspark = Some(Arc::new(head));
        }
        Drafter::Mtp(m) => drafts.mtp = Some(m.clone()),
    }
    let cfg = SchedulerConfig {
        max_batch: 3,
        prefill_chunk: 5,
        prefill_chunk_solo: 5,
        state_cache_entries: 8,
        min_reuse_tokens: 2,
        drafts,
        ..Default::default()
    };
    scheduler::start(model, cfg).unwrap().0
}

/// Request `i` of `tokens` new tokens: a chat request (so the draft head drafts), greedy or
/// sampled; request 3 repeats request 0's prompt (state reuse).
fn request(i: usize, vocab: usize, tokens: usize) -> GenRequest {
    let motif: Vec<u32> = (0..3)
        .map(|k| ((i % 3) * 31 + k * 17 + 7) as u32 % vocab as u32)
        .collect();
    let prompt: Vec<u32> = motif.iter().cycle().take(8 + i % 3).copied().collect();
    GenRequest {
        prompt,
        max_new_tokens: tokens,
        sampling: if i.is_multiple_of(2) {
            Sampling::Greedy
        } else {
            Sampling::new(0.9, 0.95, 0, 11 + i as u64).unwrap()
        },
        stop_ids: vec![],
        reuse_state: true,
        kind: RequestKind::Chat,
        spec: SpecMode::On,
        decode: Default::default(),
    }
}

/// Every request submitted at once; each one's token ids.
fn run_all(h: &SchedulerHandle, reqs: &[GenRequest]) -> Vec<Vec<u32>> {
    let rxs: Vec<_> = reqs
        .iter()
        .map(|r| {
            let (tx, rx) = mpsc::channel();
            h.submit(r.clone(), Box::new(tx)).unwrap();
            rx
        })
        .collect();
    rxs.iter()
        .map(|rx| {
            let mut ids = Vec::new();
            loop {
                match rx.recv_timeout(Duration::from_secs(600)).expect("event") {
                    Event::Token(t) => ids.push(t),
                    Event::Done(_) => return ids,
                    Event::Failed { kind, message } => panic!("failed ({kind}): {message}"),
                    _ => {}
                }
            }
        })
        .collect()
}

/// `load()` served on the CPU and on `dev`: requests `0..batch` at once, then request 3 (which
/// starts from request 0's reused state), `tokens` new tokens each; the same ids for every
/// request, and drafts verified.
fn served_agrees<D>(
    dev: &'static D,
    load: impl Fn() -> Box<dyn Model>,
    (what, drafter): (&str, &Drafter),
    (batch, tokens): (usize, usize),
) where
    D: DeviceOps + Send + Sync,
    D::Buf: Send,
{
    let vocab = load().info().vocab_size.min(200);
    let reqs: Vec<GenRequest> = (0..batch).chain([3]).map(|i| request(i, vocab, tokens)).collect();
    let cpu = engine(load(), drafter);
    let want = run_all(&cpu, &reqs[..batch]);
    let want_reused = run_all(&cpu, &reqs[batch..]);
    let served = DeviceModel::new(load(), dev, (batch + 1, 48)).unwrap();
    let device = engine(Box::new(served), drafter);
    compare(&device, &reqs, (want, want_reused), what);
}

/// The ids of `reqs` (the first `reqs.len() - 1` at once, then the last) on `device` are
/// `want`; drafts were verified and some cut back.
fn compare(
    device: &SchedulerHandle,
    reqs: &[GenRequest],
    (want, want_reused): (Vec<Vec<u32>>, Vec<Vec<u32>>),
    what: &str,
) {
    let batch = reqs.len() - 1;
    assert_eq!(run_all(device, &reqs[..batch]), want, "{what}: batched requests");
    assert_eq!(
        run_all(device, &reqs[batch..]),
        want_reused,
        "{what}: a reused state"
    );
    let spec = device.stats().speculation();
    let drafted: u64 = spec.proposers.values().map(|p| p.draft_tokens).sum();
    let accepted: u64 = spec.proposers.values().map(|p| p.accepted_tokens).sum();
    assert!(
        drafted > accepted,
        "{what}: drafts must be verified and some cut back ({drafted} drafted, {accepted} kept)"
    );
}

/// DeepSeek-V3 (MLA, FP8 experts; in memory and out of core), gpt-oss (sliding-window GQA with sinks),
/// Kimi-Linear (KDA and MLA) and K3 (Block Attention Residuals) served on `dev`.
pub fn served_requests_match_the_cpu<D>(dev: &'static D)
where
    D: DeviceOps + Send + Sync,
    D::Buf: Send,
{
    let dir = tempfile::tempdir().unwrap();
    DeepseekSynth::tiny(ExpertFormat::Fp8).write(dir.path()).unwrap();
    served_agrees(
        dev,
        || arch::load(dir.path()).unwrap(),
        ("deepseek-v3", &Drafter::DSpark),
        (3, 8),
    );
    served_out_of_core(dev);
    // Split: the first layer on the device, the rest on the CPU against the host states.
    let split = |m| Box::new(DeviceModel::split(m, dev, (3, 48), 1).unwrap()) as Box<dyn Model>;
    served_split(
        || arch::load(dir.path()).unwrap(),
        split,
        ("deepseek-v3 split", &Drafter::DSpark),
    );
    let k3 = super::fixture("k3");
    served_split(|| arch::load(&k3).unwrap(), split, ("k3 split", &Drafter::DSpark));
    // DeepSeek Sparse Attention: V3.2 and GLM-5 (whose shared layers reuse the last full
    // layer's choice, past a split too), contexts past the indexer's top-k.
    for name in ["dsv32-dsa-bf16", "glm5-dsa-fp8"] {
        let path = super::fixture(name);
        passes_agree(dev, || arch::load(&path).unwrap(), name);
        served_agrees(
            dev,
            || arch::load(&path).unwrap(),
            (name, &Drafter::DSpark),
            (2, 8),
        );
    }
    let glm5 = super::fixture("glm5-dsa-fp8");
    served_split(
        || arch::load(&glm5).unwrap(),
        split,
        ("glm-5 split", &Drafter::DSpark),
    );
    // Fewer and shorter requests where the emulator is slow (larger fixtures).
    for (name, shape) in [("gpt-oss", (3, 8)), ("kimi-linear", (2, 5)), ("k3", (2, 4))] {
        let path = super::fixture(name);
        served_agrees(
            dev,
            || arch::load(&path).unwrap(),
            (name, &Drafter::DSpark),
            shape,
        );
    }
}

/// DeepSeek-V4 served on `dev`: hyper-connection streams; sliding, compressed sparse and
/// heavily compressed attention (projections on the device, the windows, pooled entries,
/// indexer and attention on the host states); hash-routed and sqrt-softplus layers.
/// * The HF fixture's logits bit for bit over two sequences (50 prompt tokens: 12 closed
///   entries, of which the indexer keeps 3).
/// * A synthetic V4 with its MTP block (which drafts; the block runs on the host): requests with
///   drafts and a reused state, and a split after layer 1 (the streams carried to the host).
pub fn served_v4_matches_the_cpu<D>(dev: &'static D)
where
    D: DeviceOps + Send + Sync,
    D::Buf: Send,
{
    let v4 = super::fixture("dsv4-flash");
    passes_agree(dev, || arch::load(&v4).unwrap(), "deepseek-v4");
    let dir = tempfile::tempdir().unwrap();
    DeepseekV4Synth {
        hidden: 64,
        heads: 4,
        head_dim: 32,
        rope: 16,
        q_lora: 32,
        o_groups: 2,
        o_rank: 16,
        window: 8,
        index_heads: 2,
        index_head_dim: 16,
        index_topk: 2,
        ratios: (4, 8),
        experts: 8,
        moe_intermediate: 32,
        ..DeepseekV4Synth::flash(4)
    }
    .write(dir.path())
    .unwrap();
    let load = || arch::load(dir.path()).unwrap();
    let mtp = Mtp::new(
        arch::load_mtp(dir.path())
            .unwrap()
            .expect("the synth writes mtp.0.*"),
    );
    let drafter = Drafter::Mtp(Arc::new(mtp));
    served_agrees(dev, load, ("deepseek-v4", &drafter), (2, 6));
    let split = |m| Box::new(DeviceModel::split(m, dev, (3, 48), 1).unwrap()) as Box<dyn Model>;
    served_split(load, split, ("deepseek-v4 split", &drafter));
}

/// The served delta rule on the device for long sequences (KDA: Kimi-Linear; gated DeltaNet:
/// Qwen3-Next): logits bit for bit over a batched prefill of 50 and 14 tokens (both sequences'
/// delta rules on the device, their states brought back to the host), then a decode step of one
/// row each (on the host, from those states).
pub fn served_recurrent_matches_the_cpu<D>(dev: &'static D)
where
    D: DeviceOps + Send + Sync,
    D::Buf: Send,
{
    for name in ["kimi-linear", "qwen3-next"] {
        let path = super::fixture(name);
        passes_agree(dev, || arch::load(&path).unwrap(), name);
    }
}

/// DeepSeek-V3 (6 layers, FP8 experts) out of core under a budget of two streamed layers and
/// three expert slots, served: routed experts come through the host expert cache and disk reads
/// below the device tier, and the store must have missed.
fn served_out_of_core<D>(dev: &'static D)
where
    D: DeviceOps + Send + Sync,
    D::Buf: Send,
{
    let (dir, o) = super::tight_deepseek();
    let runtimes = std::sync::Mutex::new(Vec::new());
    let load = || {
        let (model, rt) = arch::load_budgeted(dir.path(), &o).unwrap();
        runtimes.lock().unwrap().push(rt);
        model
    };
    served_agrees(dev, load, ("deepseek-v3 out of core", &Drafter::DSpark), (2, 5));
    let runtimes = runtimes.into_inner().unwrap();
    let experts = runtimes.last().unwrap().stats().experts;
    assert!(
        experts.misses > 0,
        "served experts were read from disk: {experts:?}"
    );
}

/// `load()` served by `place` (a split model) against the CPU: two requests at once, then one
/// from a reused state, 4 tokens each.
fn served_split(
    load: impl Fn() -> Box<dyn Model>,
    place: impl Fn(Box<dyn Model>) -> Box<dyn Model>,
    (what, drafter): (&str, &Drafter),
) {
    let vocab = load().info().vocab_size.min(200);
    let reqs: Vec<GenRequest> = [0, 1, 3].into_iter().map(|i| request(i, vocab, 4)).collect();
    let cpu = engine(load(), drafter);
    let want = (run_all(&cpu, &reqs[..2]), run_all(&cpu, &reqs[2..]));
    compare(&engine(place(load()), drafter), &reqs, want, what);
}

/// A model's logits, bit for bit, on the CPU and served on `dev`: two sequences of 50
/// and 14 prompt tokens in one pass (every row's logits), then a decode step of both. With DSA
/// the indexer keeps 10-12 positions, so most rows attend a chosen subset (a device that
/// attended every position would differ), and the pass's 40-odd sparse rows are scored in two
/// launches of `dsa::ROW_GROUP` rows.
fn passes_agree<D>(dev: &'static D, load: impl Fn() -> Box<dyn Model>, what: &str)
where
    D: DeviceOps + Send + Sync,
    D::Buf: Send,
{
    use deltafin_engine::arch::{LogitRows, SeqInput};
    let logits = |m: &dyn Model| -> Vec<Vec<u32>> {
        let vocab = m.info().vocab_size as u32;
        let prompt =
            |len: u32, salt: u32| -> Vec<u32> { (0..len).map(|i| (i * 37 + salt) % vocab).collect() };
        let (a, b) = (prompt(50, 5), prompt(14, 11));
        let (mut sa, mut sb) = (m.new_state(), m.new_state());
        let mut out = Vec::new();
        for (ta, tb) in [(&a[..], &b[..]), (&[7][..], &[9][..])] {
            let rows = m
                .forward(
                    &mut [
                        SeqInput {
                            state: &mut sa,
                            tokens: ta,
                            logits: LogitRows::All,
                        },
                        SeqInput {
                            state: &mut sb,
                            tokens: tb,
                            logits: LogitRows::All,
                        },
                    ],
                    None,
                )
                .unwrap();
            out.push(rows.iter().map(|v| v.to_bits()).collect());
        }
        out
    };
    let want = logits(load().as_ref());
    let served = DeviceModel::new(load(), dev, (3, 64)).unwrap();
    assert_eq!(logits(&served), want, "{what}: served logits differ from the CPU");
}
