//! Scheduler tests on a tiny synthetic model: batching, chunked prefill, reuse and cancellation
//! never change a request's tokens.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use super::*;
use crate::arch;
use crate::generate::{GenerateOptions, Sampling, generate};
use crate::synth::{DeepseekSynth, ExpertFormat};

pub(super) fn model_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    DeepseekSynth::tiny(ExpertFormat::Bf16).write(dir.path()).unwrap();
    dir
}

pub(super) fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 31 + salt * 7 + 3) % 250).collect()
}

pub(super) fn request(prompt: Vec<u32>, max_new: usize, sampling: Sampling) -> GenRequest {
    GenRequest {
        prompt,
        max_new_tokens: max_new,
        sampling,
        stop_ids: vec![],
        reuse_state: true,
        kind: crate::spec::RequestKind::Completion,
        spec: crate::spec::SpecMode::Auto,
        decode: Default::default(),
    }
}

/// Tokens `generate` gives for `req` alone.
pub(super) fn alone(dir: &std::path::Path, req: &GenRequest) -> Vec<u32> {
    let m = arch::load(dir).unwrap();
    let opts = GenerateOptions {
        max_new_tokens: req.max_new_tokens,
        sampling: req.sampling,
        stop_ids: req.stop_ids.clone(),
        prefill_chunk: 64,
    };
    generate(m.as_ref(), &mut m.new_state(), &req.prompt, &opts, |_| {
        crate::generate::Flow::Continue
    })
    .unwrap()
    .output_ids
}

/// Collect a request's events until Done/Failed.
pub(super) fn drain(rx: &mpsc::Receiver<Event>) -> (Vec<u32>, Option<Completion>) {
    let mut tokens = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(60)).expect("event") {
            Event::Started { .. } | Event::Logprobs(_) => {}
            Event::Token(t) => tokens.push(t),
            Event::Done(c) => return (tokens, Some(c)),
            Event::Failed { .. } => return (tokens, None),
        }
    }
}

/// Tiny DeepSeek-V3 (MLA), Kimi K3 (MLA + KDA) and Kimi-Linear checkpoints.
fn three_stacks() -> [tempfile::TempDir; 3] {
    use crate::synth::KimiSynth;
    let write = |f: &dyn Fn(&std::path::Path)| {
        let dir = tempfile::tempdir().unwrap();
        f(dir.path());
        dir
    };
    [
        write(&|p| DeepseekSynth::tiny(ExpertFormat::Bf16).write(p).unwrap()),
        write(&|p| KimiSynth::k3_tiny().write(p).unwrap()),
        write(&|p| KimiSynth::linear_tiny().write(p).unwrap()),
    ]
}

fn start_with(dir: &std::path::Path, cfg: SchedulerConfig) -> SchedulerHandle {
    start(arch::load(dir).unwrap(), cfg).unwrap().0
}

#[test]
fn concurrent_requests_get_the_tokens_they_get_alone() {
    let dir = model_dir();
    let reqs = [
        request(prompt(5, 1), 12, Sampling::Greedy),
        request(prompt(40, 2), 7, Sampling::new(0.9, 0.95, 20, 11).unwrap()),
        request(prompt(17, 3), 20, Sampling::new(1.3, 1.0, 0, 5).unwrap()),
        request(prompt(1, 4), 9, Sampling::Greedy),
        request(prompt(63, 5), 15, Sampling::new(0.7, 0.5, 0, 99).unwrap()),
    ];
    // A small prefill budget forces chunked prefill interleaved with decode.
    let cfg = SchedulerConfig {
        max_batch: 4,
        prefill_chunk: 8,
        prefill_chunk_solo: 8,
        state_cache_entries: 0,
        ..Default::default()
    };
    let handle = start_with(dir.path(), cfg);
    let receivers: Vec<_> = reqs
        .iter()
        .map(|r| {
            let (tx, rx) = mpsc::channel();
            handle.submit(r.clone(), Box::new(tx)).unwrap();
            rx
        })
        .collect();
    for (req, rx) in reqs.iter().zip(&receivers) {
        let (tokens, done) = drain(rx);
        assert_eq!(
            tokens,
            alone(dir.path(), req),
            "prompt of {} tokens",
            req.prompt.len()
        );
        let done = done.unwrap();
        assert_eq!(
            (done.prompt_tokens, done.generated_tokens),
            (req.prompt.len(), tokens.len())
        );
    }
    let s = handle.stats().snapshot();
    assert_eq!(
        s.generated,
        reqs.iter().map(|r| r.max_new_tokens as u64).sum::<u64>()
    );
    assert!(
        s.steps < s.generated,
        "requests shared passes ({} steps, {} tokens)",
        s.steps,
        s.generated
    );
}

#[test]
fn reused_state_gives_identical_output_and_skips_prefill() {
    let dir = model_dir();
    let cfg = SchedulerConfig {
        min_reuse_tokens: 4,
        ..Default::default()
    };
    let handle = start_with(dir.path(), cfg);
    let first = request(prompt(30, 6), 10, Sampling::Greedy);
    let (tx, rx) = mpsc::channel();
    handle.submit(first.clone(), Box::new(tx)).unwrap();
    let (out, _) = drain(&rx);
    // The next turn: the previous prompt, the answer, and more.
    let mut next_prompt = first.prompt.clone();
    next_prompt.extend(&out);
    next_prompt.extend(prompt(6, 7));
    let next = request(next_prompt, 10, Sampling::new(0.8, 0.9, 0, 3).unwrap());
    let (tx, rx) = mpsc::channel();
    handle.submit(next.clone(), Box::new(tx)).unwrap();
    let (tokens, done) = drain(&rx);
    assert_eq!(tokens, alone(dir.path(), &next));
    assert_eq!(done.unwrap().cached_tokens, first.prompt.len() + out.len() - 1);
    // A divergent prompt reuses the common prefix only.
    let mut fork = first.prompt[..20].to_vec();
    fork.extend(prompt(5, 8));
    let fork = request(fork, 6, Sampling::Greedy);
    let (tx, rx) = mpsc::channel();
    handle.submit(fork.clone(), Box::new(tx)).unwrap();
    let (tokens, done) = drain(&rx);
    assert_eq!(tokens, alone(dir.path(), &fork));
    assert_eq!(done.unwrap().cached_tokens, 20);
    let s = handle.stats().snapshot();
    assert_eq!((s.reuse_hits, s.reuse_misses), (2, 1));
}

#[test]
fn a_shared_prompt_is_reusable_once_prefilled_while_its_request_still_runs() {
    let dir = model_dir();
    let cfg = SchedulerConfig {
        min_reuse_tokens: 4,
        step_delay: Duration::from_millis(5),
        ..Default::default()
    };
    let handle = start_with(dir.path(), cfg);
    let system = prompt(40, 9);
    let first = request(system.clone(), 200, Sampling::Greedy);
    let (tx1, rx1) = mpsc::channel();
    handle.submit(first, Box::new(tx1)).unwrap();
    // Wait until the first request has produced a token: its prompt is prefilled, it still runs.
    loop {
        if let Event::Token(_) = rx1.recv_timeout(Duration::from_secs(60)).expect("event") {
            break;
        }
    }
    let mut second = system.clone();
    second.extend(prompt(5, 3));
    let second = request(second, 6, Sampling::Greedy);
    let (tx2, rx2) = mpsc::channel();
    handle.submit(second.clone(), Box::new(tx2)).unwrap();
    let (tokens, done) = drain(&rx2);
    assert_eq!(
        done.unwrap().cached_tokens,
        system.len(),
        "the shared prompt was not prefilled again"
    );
    assert_eq!(
        tokens,
        alone(dir.path(), &second),
        "reuse never changes the output"
    );
    drop(rx1);
}

/// Two prompts that share a long prefix and then diverge (two agents with the same system
/// prompt and tools): the second reuses the prefix on every architecture — MLA caches cut to
/// the common prefix, K3 and Kimi-Linear recurrent states rewound to the latest checkpoint
/// (prefill chunk end) inside it — and its tokens are those it gets alone.
#[test]
fn a_divergent_prompt_reuses_the_shared_prefix_on_every_architecture() {
    let models = ["deepseek_v3", "kimi_k3", "kimi_linear"]
        .into_iter()
        .zip(three_stacks())
        .zip([200, 192, 192]);
    for ((name, dir), expect_cached) in &models.collect::<Vec<_>>() {
        let cfg = SchedulerConfig {
            prefill_chunk: 64,
            prefill_chunk_solo: 64,
            min_reuse_tokens: 4,
            ..Default::default()
        };
        let handle = start_with(dir.path(), cfg);
        let shared = prompt(200, 5);
        let with = |salt| {
            let mut p = shared.clone();
            p.extend(prompt(10, salt));
            request(p, 6, Sampling::Greedy)
        };
        let (first, second) = (with(1), with(2));
        for (req, cached) in [(&first, 0), (&second, *expect_cached)] {
            let (tx, rx) = mpsc::channel();
            handle.submit(req.clone(), Box::new(tx)).unwrap();
            let (tokens, done) = drain(&rx);
            assert_eq!(done.unwrap().cached_tokens, cached, "{name}");
            assert_eq!(
                tokens,
                alone(dir.path(), req),
                "{name}: reuse never changes the output"
            );
        }
    }
}

/// A sink whose receiver "disconnects" after `limit` tokens.
struct Flaky {
    tx: mpsc::Sender<Event>,
    seen: Arc<std::sync::atomic::AtomicUsize>,
    limit: usize,
    closed: Arc<AtomicBool>,
}

impl EventSink for Flaky {
    fn send(&self, event: Event) -> bool {
        if self.seen.fetch_add(1, Ordering::SeqCst) + 1 >= self.limit {
            self.closed.store(true, Ordering::SeqCst);
        }
        self.tx.send(event).is_ok()
    }
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

#[test]
fn a_closed_sink_cancels_within_one_step_and_frees_its_slot() {
    let dir = model_dir();
    let cfg = SchedulerConfig {
        max_batch: 1,
        max_queue: 0,
        ..Default::default()
    };
    let handle = start_with(dir.path(), cfg);
    let (tx, rx) = mpsc::channel();
    let closed = Arc::new(AtomicBool::new(false));
    let sink = Flaky {
        tx,
        seen: Default::default(),
        limit: 3,
        closed: closed.clone(),
    };
    handle
        .submit(request(prompt(8, 9), 500, Sampling::Greedy), Box::new(sink))
        .unwrap();
    // Capacity is 1: a second request is refused while the first runs.
    let (tx2, _rx2) = mpsc::channel();
    let busy = handle.submit(request(prompt(8, 9), 5, Sampling::Greedy), Box::new(tx2));
    assert!(matches!(busy, Err(SubmitError::Busy { .. })) || closed.load(Ordering::SeqCst));
    let mut tokens = 0;
    assert!(matches!(rx.recv().unwrap(), Event::Started { cached_tokens: 0 }));
    while let Ok(ev) = rx.recv_timeout(Duration::from_secs(5)) {
        assert!(
            matches!(ev, Event::Token(_)),
            "no completion after cancellation: {ev:?}"
        );
        tokens += 1;
    }
    assert!(tokens <= 3, "at most one step after the close ({tokens} tokens)");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while handle.stats().snapshot().in_flight > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let s = handle.stats().snapshot();
    assert_eq!((s.in_flight, s.cancelled), (0, 1));
    let (tx, rx) = mpsc::channel();
    handle
        .submit(request(prompt(4, 1), 3, Sampling::Greedy), Box::new(tx))
        .unwrap();
    assert_eq!(drain(&rx).0.len(), 3);
}

#[test]
fn invalid_requests_are_refused_before_queueing() {
    let dir = model_dir();
    let cfg = SchedulerConfig {
        context_limit: Some(32),
        ..Default::default()
    };
    let handle = start_with(dir.path(), cfg);
    assert_eq!(handle.context_limit(), 32);
    let (tx, _rx) = mpsc::channel::<Event>();
    let bad = [
        request(vec![], 4, Sampling::Greedy),
        request(prompt(33, 1), 4, Sampling::Greedy),
        request(vec![1, 100_000], 4, Sampling::Greedy),
        request(prompt(3, 1), 0, Sampling::Greedy),
    ];
    for r in bad {
        assert!(matches!(
            handle.submit(r, Box::new(tx.clone())),
            Err(SubmitError::Invalid(_))
        ));
    }
    assert_eq!(handle.stats().snapshot().in_flight, 0);
}

#[test]
fn the_context_limit_ends_generation_with_length() {
    let dir = model_dir();
    let handle = start_with(
        dir.path(),
        SchedulerConfig {
            context_limit: Some(12),
            ..Default::default()
        },
    );
    let (tx, rx) = mpsc::channel();
    handle
        .submit(request(prompt(10, 2), 100, Sampling::Greedy), Box::new(tx))
        .unwrap();
    let (tokens, done) = drain(&rx);
    // Positions 10, 11 and 12 are sampled; the last is never run.
    assert_eq!(tokens.len(), 3);
    assert_eq!(done.unwrap().finish_reason, FinishReason::Length);
}

#[test]
fn stop_ids_end_generation_and_cancel_all_fails_the_rest() {
    let dir = model_dir();
    let probe = request(prompt(6, 3), 8, Sampling::Greedy);
    let expected = alone(dir.path(), &probe);
    let handle = start_with(
        dir.path(),
        SchedulerConfig {
            step_delay: Duration::from_millis(2),
            ..Default::default()
        },
    );
    let mut stopping = probe.clone();
    stopping.stop_ids = vec![expected[2]];
    let (tx, rx) = mpsc::channel();
    handle.submit(stopping, Box::new(tx)).unwrap();
    let (tokens, done) = drain(&rx);
    let cut = expected.iter().position(|&t| t == expected[2]).unwrap();
    assert_eq!(tokens, expected[..=cut]);
    assert_eq!(done.unwrap().finish_reason, FinishReason::Stop);
    let (tx, rx) = mpsc::channel();
    handle
        .submit(request(prompt(6, 3), 100_000, Sampling::Greedy), Box::new(tx))
        .unwrap();
    assert!(matches!(rx.recv().unwrap(), Event::Started { .. }));
    assert!(matches!(rx.recv().unwrap(), Event::Token(_)));
    handle.cancel_all();
    let (_, done) = drain(&rx);
    assert!(done.is_none());
}

#[test]
fn kimi_k3_recurrent_states_batch_and_reuse_exactly() {
    let dir = tempfile::tempdir().unwrap();
    crate::synth::KimiK3Synth::k3_tiny().write(dir.path()).unwrap();
    let reqs = [
        request(prompt(9, 1), 10, Sampling::Greedy),
        request(prompt(30, 2), 8, Sampling::new(0.9, 0.95, 0, 4).unwrap()),
        request(prompt(3, 3), 12, Sampling::Greedy),
    ];
    let cfg = SchedulerConfig {
        max_batch: 3,
        prefill_chunk: 7,
        prefill_chunk_solo: 7,
        min_reuse_tokens: 4,
        ..Default::default()
    };
    let handle = start_with(dir.path(), cfg);
    let receivers: Vec<_> = reqs
        .iter()
        .map(|r| {
            let (tx, rx) = mpsc::channel();
            handle.submit(r.clone(), Box::new(tx)).unwrap();
            rx
        })
        .collect();
    let mut outputs = Vec::new();
    for (req, rx) in reqs.iter().zip(&receivers) {
        let (tokens, _) = drain(rx);
        assert_eq!(
            tokens,
            alone(dir.path(), req),
            "prompt of {} tokens",
            req.prompt.len()
        );
        outputs.push(tokens);
    }
    // Extending the first conversation: reused where the state allows it, identical either way.
    let mut next = reqs[0].prompt.clone();
    next.extend(&outputs[0]);
    next.extend(prompt(5, 9));
    let next = request(next, 6, Sampling::Greedy);
    let (tx, rx) = mpsc::channel();
    handle.submit(next.clone(), Box::new(tx)).unwrap();
    assert_eq!(drain(&rx).0, alone(dir.path(), &next));
}

#[test]
fn batched_requests_that_draft_get_the_tokens_they_get_alone() {
    // Eight concurrent requests, each drafting every step (forced) with the draft head (chat)
    // or n-gram (completions), verified together in shared passes, mixed with prefill chunks.
    let dir = model_dir();
    let head_dir = tempfile::tempdir().unwrap();
    let info = arch::load(dir.path()).unwrap().info().clone();
    crate::synth::DSparkSynth::for_target(&info, 3)
        .write(head_dir.path())
        .unwrap();
    let head = crate::spec::dspark::DSpark::load(head_dir.path()).unwrap();
    let drafts = crate::spec::Drafts {
        dspark: Some(Arc::new(head)),
        ..Default::default()
    };
    let cfg = SchedulerConfig {
        max_batch: 8,
        prefill_chunk: 16,
        prefill_chunk_solo: 16,
        state_cache_entries: 0,
        drafts,
        ..Default::default()
    };
    let handle = start_with(dir.path(), cfg);
    let reqs: Vec<GenRequest> = (0..8u32)
        .map(|i| {
            let sampling = if i % 2 == 0 {
                Sampling::Greedy
            } else {
                Sampling::new(0.8, 0.9, 0, i as u64).unwrap()
            };
            // Repetitive prompts give n-gram something to propose.
            let base = prompt(3 + i as usize, i);
            let p: Vec<u32> = base.iter().cycle().take(6 + 5 * i as usize).copied().collect();
            let mut r = request(p, 10 + 3 * i as usize, sampling);
            r.kind = if i % 2 == 0 {
                crate::spec::RequestKind::Chat
            } else {
                crate::spec::RequestKind::Completion
            };
            r.spec = crate::spec::SpecMode::On;
            r
        })
        .collect();
    let receivers: Vec<_> = reqs
        .iter()
        .map(|r| {
            let (tx, rx) = mpsc::channel();
            handle.submit(r.clone(), Box::new(tx)).unwrap();
            rx
        })
        .collect();
    for (i, (req, rx)) in reqs.iter().zip(&receivers).enumerate() {
        let (tokens, done) = drain(rx);
        assert!(done.is_some(), "request {i} failed");
        assert_eq!(tokens, alone(dir.path(), req), "request {i}");
    }
    let spec = handle.stats().speculation();
    let dspark = spec.proposers.get("dspark").cloned().unwrap_or_default();
    assert!(
        dspark.proposals > 0,
        "the draft head drafted in the batch: {spec:?}"
    );
    let s = handle.stats().snapshot();
    assert!(s.rows > s.steps, "drafted rows were verified in shared passes");
}

/// Under a context-memory pool: a prompt that cannot fit is refused at submission with a budget
/// error; two requests that fit together at admission but not once grown: the later one is
/// stopped with a budget error when the pool fills, and the earlier one finishes with exactly
/// the tokens it gets alone.
#[test]
fn the_context_memory_pool_refuses_waits_and_stops_instead_of_growing() {
    let dir = model_dir();
    let size = arch::load(dir.path()).unwrap().info().state;
    assert!(size.per_token > 0 && size.per_sequence == 0);
    // Two blocks of 64 positions.
    let pool = size.bytes(128, 0);
    let cfg = SchedulerConfig {
        context_memory: Some(pool),
        state_cache_entries: 0,
        ..Default::default()
    };
    let handle = start_with(dir.path(), cfg);
    let (tx, _rx) = mpsc::channel();
    let err = handle
        .submit(request(prompt(130, 1), 4, Sampling::Greedy), Box::new(tx))
        .unwrap_err();
    assert_eq!(err.kind(), "budget", "{err}");
    assert!(
        err.to_string().contains("longest context it holds is 128 tokens"),
        "{err}"
    );

    // One block each at admission, two each once grown to 90 positions.
    let first = request(prompt(40, 2), 50, Sampling::Greedy);
    let second = request(prompt(40, 3), 50, Sampling::Greedy);
    let (tx1, rx1) = mpsc::channel();
    let (tx2, rx2) = mpsc::channel();
    handle.submit(first.clone(), Box::new(tx1)).unwrap();
    handle.submit(second, Box::new(tx2)).unwrap();
    let (tokens, done) = drain(&rx1);
    assert!(done.is_some(), "the earlier request finishes");
    assert_eq!(tokens, alone(dir.path(), &first));
    let failed = loop {
        match rx2.recv_timeout(Duration::from_secs(60)).expect("event") {
            Event::Failed { kind, message } => break (kind, message),
            Event::Done(_) => panic!("both cannot grow to 90 tokens in a 128-token pool"),
            _ => {}
        }
    };
    assert_eq!(failed.0, "budget");
    assert!(failed.1.contains("context memory"), "{}", failed.1);
}

/// A request that fits the pool alone waits while others hold it, then runs.
#[test]
fn a_request_waits_for_context_memory_instead_of_failing() {
    let dir = model_dir();
    let size = arch::load(dir.path()).unwrap().info().state;
    let cfg = SchedulerConfig {
        context_memory: Some(size.bytes(40, 0)),
        state_cache_entries: 0,
        ..Default::default()
    };
    let handle = start_with(dir.path(), cfg);
    let reqs = [
        request(prompt(30, 4), 5, Sampling::Greedy),
        request(prompt(30, 5), 5, Sampling::Greedy),
    ];
    let receivers: Vec<_> = reqs
        .iter()
        .map(|r| {
            let (tx, rx) = mpsc::channel();
            handle.submit(r.clone(), Box::new(tx)).unwrap();
            rx
        })
        .collect();
    for (req, rx) in reqs.iter().zip(&receivers) {
        let (tokens, done) = drain(rx);
        assert!(done.is_some());
        assert_eq!(tokens, alone(dir.path(), req));
    }
    let s = handle.stats().snapshot();
    assert_eq!(s.queue_wait.count, 2);
    assert!(s.queue_wait.sum_micros > 0, "the second waited for the first");
}

/// Paged context memory under a pool with reuse on: concurrent requests sharing a prefix start
/// from the cached prompt's blocks, every request gets the tokens it gets alone, and after every
/// step what the states and the reuse cache really hold (shared blocks once) is within the pool
/// (`Worker::check_pool`, which fails the turn in debug builds), on MLA, MLA + KDA, gated
/// DeltaNet + GQA (Qwen3.5) and DeepSeek-V4 (sliding / compressed attention, mHC) stacks.
#[test]
fn shared_prefixes_under_a_pool_reuse_blocks_and_stay_within_it() {
    let qwen35 = tempfile::tempdir().unwrap();
    crate::synth::GqaMoeSynth::tiny(crate::synth::GqaFamily::Qwen35)
        .write(qwen35.path())
        .unwrap();
    // DeepSeek-V4: compressed entries per token and a window per sequence.
    let dsv4 = tempfile::tempdir().unwrap();
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dsv4-flash");
    for f in std::fs::read_dir(&fixture).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dsv4.path().join(f.file_name().unwrap())).unwrap();
    }
    let mut dirs = Vec::from(three_stacks());
    dirs.push(qwen35);
    dirs.push(dsv4);
    for dir in &dirs {
        let size = arch::load(dir.path()).unwrap().info().state;
        // Room for about three of these sequences (a checkpoint each), not all five.
        let pool = 3 * size.bytes(200, 1);
        let cfg = SchedulerConfig {
            max_batch: 5,
            prefill_chunk: 64,
            prefill_chunk_solo: 64,
            min_reuse_tokens: 4,
            context_memory: Some(pool),
            ..Default::default()
        };
        let handle = start_with(dir.path(), cfg);
        let shared = prompt(150, 5);
        let reqs: Vec<GenRequest> = (0..5)
            .map(|i| {
                let mut p = shared.clone();
                p.extend(prompt(20, 10 + i));
                request(p, 8, Sampling::Greedy)
            })
            .collect();
        // The first request leaves the shared prompt's state in the cache.
        let (tx, rx) = mpsc::channel();
        handle.submit(reqs[0].clone(), Box::new(tx)).unwrap();
        assert_eq!(drain(&rx).0, alone(dir.path(), &reqs[0]));
        let receivers: Vec<_> = reqs[1..]
            .iter()
            .map(|r| {
                let (tx, rx) = mpsc::channel();
                handle.submit(r.clone(), Box::new(tx)).unwrap();
                rx
            })
            .collect();
        for (req, rx) in reqs[1..].iter().zip(&receivers) {
            let (tokens, done) = drain(rx);
            let done = done.expect("every request finishes: none over the pool");
            assert!(done.cached_tokens > 0, "the shared prefix was reused");
            assert_eq!(tokens, alone(dir.path(), req));
        }
        assert_eq!(handle.stats().snapshot().panics, 0);
    }
}
