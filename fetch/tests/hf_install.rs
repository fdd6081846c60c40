//! Full and stream installs of a tiny checkpoint served by nginx in Hugging Face's URL layout:
//! byte-identical files, identical generated tokens, stream-mode expert fetching with coalescing,
//! and `--full` completing a streamed install without re-downloading.

mod common;

use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::*;
use deltafin_fetch::manifest::{FileState, Manifest, Mode};
use deltafin_fetch::progress::NoProgress;
use deltafin_fetch::retry::RetryPolicy;
use deltafin_fetch::source::hf::HfRepo;
use deltafin_fetch::{ExpertSource, InstallOptions, Remote, StreamStore, install};

fn remote(endpoint: &str, source: &str) -> Remote {
    let client = deltafin_fetch::http::build_client(&Default::default()).unwrap();
    let policy = RetryPolicy {
        max_attempts: 5,
        base: Duration::from_millis(20),
        cap: Duration::from_millis(200),
    };
    Remote::Hf(HfRepo::new(client, endpoint, &source.parse().unwrap(), None, policy).unwrap())
}

fn opts(dir: &Path, mode: Mode) -> InstallOptions {
    InstallOptions {
        workers: 4,
        chunk_size: 64 << 10,
        headroom: 0,
        ..InstallOptions::new(dir, mode)
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

struct Fixture {
    model: tempfile::TempDir,
    root: tempfile::TempDir,
    nginx: Nginx,
    sha: String,
}

fn fixture(limit_rate: Option<u64>) -> Option<Fixture> {
    if !have("nginx") {
        return None;
    }
    let model = tempfile::tempdir().unwrap();
    write_tiny(model.path());
    let root = tempfile::tempdir().unwrap();
    let sha = serve_hf(root.path(), "org/tiny", "main", model.path());
    let nginx = Nginx::start(root.path(), limit_rate);
    Some(Fixture {
        model,
        root,
        nginx,
        sha,
    })
}

#[test]
fn full_install_is_byte_identical_and_generates_the_same_tokens() {
    let Some(fx) = fixture(None) else { return };
    let dir = tempfile::tempdir().unwrap();
    let rt = rt();
    let r = rt
        .block_on(install(
            &remote(&fx.nginx.url(), "hf://org/tiny"),
            &opts(dir.path(), Mode::Full),
            &NoProgress,
        ))
        .unwrap();
    assert!(r.complete && r.mode == Mode::Full, "{r:?}");
    assert_eq!(r.pinned, fx.sha);
    assert_eq!(r.bytes_downloaded, r.bytes_total);
    assert_same_tree(fx.model.path(), dir.path());
    assert_eq!(generate_ids(dir.path()), generate_ids(fx.model.path()));
    let m = Manifest::load(dir.path()).unwrap().unwrap();
    assert!(m.files.iter().all(|f| f.state == FileState::Published));
    // A rerun downloads nothing.
    let r = rt
        .block_on(install(
            &remote(&fx.nginx.url(), "hf://org/tiny"),
            &opts(dir.path(), Mode::Full),
            &NoProgress,
        ))
        .unwrap();
    assert_eq!(r.bytes_downloaded, 0);
}

#[test]
fn stream_install_fetches_experts_on_demand_and_matches_full() {
    let Some(fx) = fixture(None) else { return };
    let dir = tempfile::tempdir().unwrap();
    let rt = rt();
    let src = remote(&fx.nginx.url(), "hf://org/tiny");
    let r = rt
        .block_on(install(&src, &opts(dir.path(), Mode::Stream), &NoProgress))
        .unwrap();
    assert!(r.complete && r.mode == Mode::Stream, "{r:?}");
    assert!(r.bytes_local < r.bytes_total, "experts must stay remote: {r:?}");
    let m = Manifest::load(dir.path()).unwrap().unwrap();
    assert!(!m.experts.is_empty());
    // Shards are staged, not at their final names, so an engine unaware of stream mode fails closed.
    assert!(deltafin_engine::weights::WeightIndex::open(dir.path()).is_err());
    assert!(dir.path().join("config.json").exists());

    let store = StreamStore::open(
        dir.path(),
        remote(&fx.nginx.url(), "hf://org/tiny"),
        rt.handle().clone(),
        RetryPolicy::default(),
    )
    .unwrap();
    let (local0, total) = store.completeness();
    let keys: Vec<(u32, u32)> = m.experts.iter().map(|e| (e.layer, e.expert)).collect();
    let first = keys[0];
    store.ensure_expert(first.0, first.1).unwrap();
    let e = &m.experts[0];
    assert!(store.is_local(&e.file, &(e.start..e.end)));
    let staged = store.local_path(&e.file).unwrap();
    assert!(
        staged.to_string_lossy().contains(".deltafin/partial/"),
        "{}",
        staged.display()
    );
    assert!(store.completeness().0 > local0);
    for (l, x) in &keys {
        store.ensure_expert(*l, *x).unwrap();
    }
    assert_eq!(store.completeness(), (total, total));
    let stats = store.stats();
    assert!(stats.files_published >= 1, "{stats:?}");
    drop(store);
    let m = Manifest::load(dir.path()).unwrap().unwrap();
    assert_eq!(m.mode, Mode::Full);
    assert_same_tree(fx.model.path(), dir.path());
    assert_eq!(generate_ids(dir.path()), generate_ids(fx.model.path()));
}

#[test]
fn full_setup_completes_a_stream_install_without_redownloading() {
    let Some(fx) = fixture(None) else { return };
    let dir = tempfile::tempdir().unwrap();
    let rt = rt();
    let src = remote(&fx.nginx.url(), "hf://org/tiny");
    let s = rt
        .block_on(install(&src, &opts(dir.path(), Mode::Stream), &NoProgress))
        .unwrap();
    // Fetch one expert through the store first: it must not be fetched again either.
    let m = Manifest::load(dir.path()).unwrap().unwrap();
    let e = m.experts[0].clone();
    let store = StreamStore::open(
        dir.path(),
        remote(&fx.nginx.url(), "hf://org/tiny"),
        rt.handle().clone(),
        RetryPolicy::default(),
    )
    .unwrap();
    store.ensure_expert(e.layer, e.expert).unwrap();
    let fetched = store.stats().bytes;
    drop(store);
    let f = rt
        .block_on(install(&src, &opts(dir.path(), Mode::Full), &NoProgress))
        .unwrap();
    assert!(f.complete && f.mode == Mode::Full);
    assert_eq!(
        f.bytes_downloaded,
        s.bytes_total - s.bytes_local - fetched,
        "stream {s:?} full {f:?}"
    );
    assert_same_tree(fx.model.path(), dir.path());
}

#[test]
fn concurrent_fetches_of_one_expert_coalesce() {
    // The store reads through a slow server so that the callers overlap; the proxy counts requests.
    let Some(fx) = fixture(None) else { return };
    let slow = Nginx::start(fx.root.path(), Some(4_000));
    let proxy = FaultProxy::start(slow.port);
    let dir = tempfile::tempdir().unwrap();
    let rt = rt();
    rt.block_on(install(
        &remote(&fx.nginx.url(), "hf://org/tiny"),
        &opts(dir.path(), Mode::Stream),
        &NoProgress,
    ))
    .unwrap();
    let m = Manifest::load(dir.path()).unwrap().unwrap();
    let e = m
        .experts
        .iter()
        .find(|e| e.end - e.start >= 4096)
        .expect("an expert of at least 4 KiB")
        .clone();
    let store = Arc::new(
        StreamStore::open(
            dir.path(),
            remote(&proxy.url(), "hf://org/tiny"),
            rt.handle().clone(),
            RetryPolicy::default(),
        )
        .unwrap(),
    );
    let n = 6;
    let barrier = Arc::new(Barrier::new(n));
    let before = proxy.requests().len();
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let (store, barrier, e) = (store.clone(), barrier.clone(), e.clone());
            std::thread::spawn(move || {
                barrier.wait();
                store.ensure_range(&e.file, e.start..e.end).unwrap()
            })
        })
        .collect();
    let paths: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(paths.windows(2).all(|w| w[0] == w[1]));
    let reqs = proxy.requests()[before..].to_vec();
    let wanted = format!("bytes={}-{}", e.start, e.end - 1);
    assert_eq!(
        reqs.iter().filter(|r| r.ends_with(&wanted)).count(),
        1,
        "{reqs:?}"
    );
    let stats = store.stats();
    assert_eq!(stats.fetches, 1);
    assert_eq!(stats.coalesced, (n - 1) as u64, "{stats:?}");
    // The bytes are the source's.
    let src = std::fs::read(fx.model.path().join(&e.file)).unwrap();
    let got = std::fs::read(&paths[0]).unwrap();
    assert_eq!(
        &got[e.start as usize..e.end as usize],
        &src[e.start as usize..e.end as usize]
    );
}
