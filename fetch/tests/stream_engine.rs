//! Stream installs driven by the engine, against a real loopback nginx: the out-of-core loader
//! reads the staged shards, fetches every routed expert on first use through [`EngineSource`]
//! (so through `StreamStore`), produces exactly the tokens of a full install, fetches only the
//! experts that were routed (counted from the route trace, the store and the HTTP requests), and
//! fetches nothing the second time. A fetch that fails (HTTP 5xx, connections cut mid-body) is a
//! clear `remote` error that leaves nothing partial visible, and a later run completes exactly.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use deltafin_engine::arch;
use deltafin_engine::cache::routes::RouteCounts;
use deltafin_engine::cache::{OocOptions, OocRuntime};
use deltafin_engine::generate::{Flow, GenerateOptions, generate};
use deltafin_engine::synth::{DeepseekSynth, ExpertFormat};
use deltafin_fetch::manifest::{Manifest, Mode};
use deltafin_fetch::progress::NoProgress;
use deltafin_fetch::retry::RetryPolicy;
use deltafin_fetch::source::hf::HfRepo;
use deltafin_fetch::{EngineSource, InstallOptions, Remote, install};

const PROMPT: [u32; 4] = [1, 5, 9, 42];

/// Few routed experts per pass among many, so a short generation routes a strict subset.
fn synth(format: ExpertFormat) -> DeepseekSynth {
    DeepseekSynth {
        experts: 32,
        ..DeepseekSynth::tiny(format)
    }
}

fn policy() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 2,
        base: Duration::from_millis(10),
        cap: Duration::from_millis(50),
    }
}

fn remote(endpoint: &str) -> Remote {
    let client = deltafin_fetch::http::build_client(&Default::default()).unwrap();
    Remote::Hf(
        HfRepo::new(
            client,
            endpoint,
            &"hf://org/tiny".parse().unwrap(),
            None,
            policy(),
        )
        .unwrap(),
    )
}

struct Served {
    model: tempfile::TempDir,
    _root: tempfile::TempDir,
    nginx: Nginx,
}

fn served(format: ExpertFormat) -> Option<Served> {
    if !have("nginx") {
        return None;
    }
    let model = tempfile::tempdir().unwrap();
    synth(format).write(model.path()).unwrap();
    let root = tempfile::tempdir().unwrap();
    serve_hf(root.path(), "org/tiny", "main", model.path());
    let nginx = Nginx::start(root.path(), None);
    Some(Served {
        model,
        _root: root,
        nginx,
    })
}

fn stream_install(endpoint: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let opts = InstallOptions {
        workers: 2,
        chunk_size: 64 << 10,
        headroom: 0,
        ..InstallOptions::new(dir.path(), Mode::Stream)
    };
    let r = rt
        .block_on(install(&remote(endpoint), &opts, &NoProgress))
        .unwrap();
    assert!(
        r.complete && r.mode == Mode::Stream && r.bytes_local < r.bytes_total,
        "{r:?}"
    );
    dir
}

fn greedy(model: &dyn arch::Model) -> deltafin_engine::Result<Vec<u32>> {
    let opts = GenerateOptions {
        max_new_tokens: 4,
        prefill_chunk: 2,
        ..Default::default()
    };
    let mut state = model.new_state();
    Ok(generate(model, &mut state, &PROMPT, &opts, |_| Flow::Continue)?.output_ids)
}

/// Load `dir` out of core through `source` (a small cache: experts are evicted and re-read).
fn load(dir: &Path, source: &Arc<EngineSource>, trace: Option<&Path>) -> (Box<dyn arch::Model>, OocRuntime) {
    let mut o = OocOptions::with_budget(u64::MAX / 4);
    o.remote = Some(source.remote_weights(4));
    o.route_trace = trace.map(Path::to_path_buf);
    o.reader.threads = 2;
    let (_, probe) = arch::load_budgeted(dir, &o).unwrap();
    let p = probe.plan.clone();
    drop(probe);
    o.budget = p.fixed_bytes + p.layer_bytes.iter().sum::<u64>() + 3 * p.slot_bytes + o.reserve_bytes;
    o.heat_file = Some(dir.join("heat.bin"));
    let (m, rt) = arch::load_budgeted(dir, &o).unwrap();
    assert!(
        rt.plan.expert_slots < 64,
        "the cache must be smaller than the experts: {:?}",
        rt.plan
    );
    (m, rt)
}

/// Experts whose every catalog range is local now.
fn local_experts(dir: &Path, source: &EngineSource) -> BTreeSet<(u32, u32)> {
    let m = Manifest::load(dir).unwrap().unwrap();
    let keys: BTreeSet<(u32, u32)> = m.experts.iter().map(|e| (e.layer, e.expert)).collect();
    keys.into_iter()
        .filter(|&(l, e)| {
            let ranges = source.store().expert_ranges(l, e).unwrap();
            ranges
                .iter()
                .all(|r| source.store().is_local(&r.file, &(r.start..r.end)))
        })
        .collect()
}

fn range_requests(proxy: &FaultProxy) -> Vec<String> {
    proxy
        .requests()
        .into_iter()
        .filter(|r| r.contains("bytes="))
        .collect()
}

/// `(file, "first-last")` of every range request, sorted.
fn requested_ranges(proxy: &FaultProxy) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = range_requests(proxy)
        .iter()
        .map(|r| {
            let path = r.split_whitespace().nth(1).unwrap();
            let file = path.rsplit('/').next().unwrap().to_string();
            (file, r.rsplit("bytes=").next().unwrap().to_string())
        })
        .collect();
    v.sort();
    v
}

fn engine_fetches_only_routed_experts(format: ExpertFormat) {
    let Some(s) = served(format) else { return };
    let want = greedy(arch::load(s.model.path()).unwrap().as_ref()).unwrap();
    let dir = stream_install(&s.nginx.url());
    let catalog = Manifest::load(dir.path()).unwrap().unwrap().experts;
    assert!(
        arch::load(dir.path()).is_err(),
        "the in-memory loader fails closed on a stream install"
    );
    let proxy = FaultProxy::start(s.nginx.port);
    let trace = dir.path().join("routes.jsonl");

    let source = EngineSource::open(dir.path(), remote(&proxy.url()), policy()).unwrap();
    assert!(local_experts(dir.path(), &source).is_empty());
    let (model, rt) = load(dir.path(), &source, Some(&trace));
    assert!(
        range_requests(&proxy).is_empty(),
        "loading fetches nothing: {:?}",
        proxy.requests()
    );
    assert_eq!(
        greedy(model.as_ref()).unwrap(),
        want,
        "{format:?}: stream install vs full"
    );
    let routed: BTreeSet<(u32, u32)> = RouteCounts::read(&trace)
        .unwrap()
        .counts
        .keys()
        .map(|k| (k.layer, k.expert))
        .collect();
    assert!(
        !routed.is_empty() && routed.len() < 64,
        "a strict subset must be routed: {routed:?}"
    );
    assert_eq!(
        local_experts(dir.path(), &source),
        routed,
        "exactly the routed experts are local"
    );
    let stats = rt.stats().experts;
    assert_eq!(stats.remote_experts, routed.len() as u64, "{stats:?}");
    // Exactly one range request per range of a routed expert (the catalog's ranges are the
    // engine's), and nothing else.
    let mut wanted: Vec<(String, String)> = catalog
        .iter()
        .filter(|e| routed.contains(&(e.layer, e.expert)))
        .map(|e| (e.file.clone(), format!("{}-{}", e.start, e.end - 1)))
        .collect();
    wanted.sort();
    assert_eq!(requested_ranges(&proxy), wanted);
    assert_eq!(source.store().stats().fetches, wanted.len() as u64);
    assert!(
        stats.misses + stats.prefetch_reads > stats.remote_experts,
        "evicted experts are re-read locally: {stats:?}"
    );
    let passes = RouteCounts::read(&trace).unwrap().passes;
    assert!(passes >= 3, "prefill and decode passes are traced: {passes}");
    rt.flush_heat().unwrap();
    drop((model, rt, source));
    second_run_fetches_nothing(dir.path(), &proxy, &trace, &want, passes);
}

/// A second run (new store, heat pre-warm on) fetches nothing and generates the same.
fn second_run_fetches_nothing(dir: &Path, proxy: &FaultProxy, trace: &Path, want: &[u32], passes: u64) {
    let before = proxy.requests().len();
    let source = EngineSource::open(dir, remote(&proxy.url()), policy()).unwrap();
    let (model, rt) = load(dir, &source, Some(trace));
    assert!(rt.prewarmed > 0, "the heat file pre-warms local experts");
    assert_eq!(greedy(model.as_ref()).unwrap(), want);
    assert_eq!(
        proxy.requests().len(),
        before,
        "{:?}",
        &proxy.requests()[before..]
    );
    assert_eq!(rt.stats().experts.remote_experts, 0);
    assert_eq!(
        RouteCounts::read(trace).unwrap().passes,
        2 * passes,
        "the second run appended its passes"
    );
    assert_eq!(
        Manifest::load(dir).unwrap().unwrap().mode,
        Mode::Stream,
        "unrouted experts stay remote"
    );
}

#[test]
fn bf16_stream_install_generates_like_full_fetching_only_routed_experts() {
    engine_fetches_only_routed_experts(ExpertFormat::Bf16);
}

#[test]
fn int4_stream_install_generates_like_full_fetching_only_routed_experts() {
    // compressed-tensors INT4 experts carry a `weight_shape` tensor whose value is checked: it is
    // remote too, so only the built expert (never the load-time layout pass) may read it.
    engine_fetches_only_routed_experts(ExpertFormat::Int4);
}

/// Run the engine against a failing source, then against a working one.
fn failure_leaves_nothing_partial(s: &Served, bad_endpoint: &str, expect: &str, proxy: Option<&FaultProxy>) {
    let want = greedy(arch::load(s.model.path()).unwrap().as_ref()).unwrap();
    let dir = stream_install(&s.nginx.url());
    let sidecars = |d: &Path| -> Vec<(String, Vec<u8>)> {
        let root = d.join(".deltafin/partial");
        let mut v: Vec<(String, Vec<u8>)> = files_under(&root)
            .into_iter()
            .filter(|f| f.ends_with(".json"))
            .map(|f| (f.clone(), std::fs::read(root.join(&f)).unwrap()))
            .collect();
        v.sort();
        v
    };
    let before = sidecars(dir.path());
    let published_before = files_under(dir.path());
    {
        let source = EngineSource::open(dir.path(), remote(bad_endpoint), policy()).unwrap();
        let (model, _rt) = load(dir.path(), &source, None);
        let err = greedy(model.as_ref()).unwrap_err();
        assert_eq!(err.kind(), "remote", "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains(".safetensors: bytes ") && msg.contains(expect),
            "{msg}"
        );
        assert!(
            local_experts(dir.path(), &source).is_empty(),
            "nothing became local"
        );
        if let Some(p) = proxy {
            assert!(!range_requests(p).is_empty(), "the fault path was exercised");
        }
    }
    assert_eq!(
        sidecars(dir.path()),
        before,
        "no sidecar records a byte of a failed fetch"
    );
    assert_eq!(files_under(dir.path()), published_before, "nothing was published");
    // The same install then works and is exact: the failed attempts left nothing half-written
    // that a reader could see.
    let source = EngineSource::open(dir.path(), remote(&s.nginx.url()), policy()).unwrap();
    let (model, _rt) = load(dir.path(), &source, None);
    assert_eq!(greedy(model.as_ref()).unwrap(), want);
}

#[test]
fn a_failing_expert_fetch_is_a_clear_error_and_leaves_nothing_partial() {
    let Some(s) = served(ExpertFormat::Bf16) else {
        return;
    };
    // Every request answered 503 (nginx `location /flaky/`).
    failure_leaves_nothing_partial(&s, &format!("{}/flaky", s.nginx.url()), "HTTP 503", None);
    // Connections cut: the first ones after the headers and part of the body (bytes written to
    // the staged shard, never recorded), then at once, so the retries give up.
    let proxy = FaultProxy::start(s.nginx.port);
    let mut plan = vec![400; 4];
    plan.extend([0; 64]);
    proxy.cut_each(&plan);
    failure_leaves_nothing_partial(&s, &proxy.url(), "network failure", Some(&proxy));
}

#[test]
fn a_shard_failing_verification_is_refused_from_then_on() {
    let Some(s) = served(ExpertFormat::Bf16) else {
        return;
    };
    // The listing announces another SHA-256 for the second shard: nothing can tell until the
    // shard is complete (there are no per-expert digests).
    let shard = "model-00002-of-00002.safetensors";
    let api_dir = s._root.path().join("api/models/org/tiny/revision");
    for f in std::fs::read_dir(&api_dir).unwrap().flatten() {
        let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(f.path()).unwrap()).unwrap();
        for sib in v["siblings"].as_array_mut().unwrap() {
            if sib["rfilename"] == shard {
                sib["lfs"]["sha256"] = "0".repeat(64).into();
            }
        }
        std::fs::write(f.path(), v.to_string()).unwrap();
    }
    let dir = stream_install(&s.nginx.url());
    let source = EngineSource::open(dir.path(), remote(&s.nginx.url()), policy()).unwrap();
    let (model, rt) = load(dir.path(), &source, None);
    let catalog = Manifest::load(dir.path()).unwrap().unwrap().experts;
    let mut errors = Vec::new();
    for e in catalog.iter().filter(|e| e.file == shard) {
        use deltafin_fetch::ExpertSource;
        if let Err(err) = source.store().ensure_range(&e.file, e.start..e.end) {
            errors.push(err.to_string());
        }
    }
    assert_eq!(
        errors.len(),
        1,
        "the range that completed the shard reports the mismatch: {errors:?}"
    );
    assert!(
        errors[0].contains(shard) && errors[0].contains("checksum mismatch"),
        "{errors:?}"
    );
    assert!(
        !dir.path().join(shard).exists(),
        "a shard failing verification is never published"
    );
    let e = catalog.iter().find(|e| e.file == shard).unwrap();
    assert!(
        !source.store().is_local(shard, &(e.start..e.end)),
        "nothing of it counts as local any more"
    );
    // The engine fails closed on that shard's experts, naming the cause (a prompt that routes
    // experts of both layers: the shards split the layers).
    let err = greedy(model.as_ref()).unwrap_err();
    assert_eq!(err.kind(), "remote", "{err}");
    assert!(err.to_string().contains("failed verification"), "{err}");
    drop((model, rt, source));
    // And the next start refuses the install instead of reading holes.
    let err = EngineSource::open(dir.path(), remote(&s.nginx.url()), policy()).unwrap_err();
    assert!(
        err.to_string().contains(shard) && err.to_string().contains("rerun `deltafin setup --stream`"),
        "{err}"
    );
}
