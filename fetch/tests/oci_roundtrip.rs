//! OCI: push an install to Debian's docker-registry on 127.0.0.1, pull it back into a new
//! directory through the ranged downloader, and compare bytes; a pushed install generates the same
//! tokens; pushing again uploads nothing. A stream install from the registry runs through the
//! engine, fetching routed experts from the blobs on first use, with the full install's tokens.

mod common;

use std::time::Duration;

use common::*;
use deltafin_engine::arch;
use deltafin_engine::cache::OocOptions;
use deltafin_engine::generate::{Flow, GenerateOptions, generate};
use deltafin_engine::synth::{DeepseekSynth, ExpertFormat};
use deltafin_fetch::artifact::push_plan;
use deltafin_fetch::manifest::Mode;
use deltafin_fetch::progress::NoProgress;
use deltafin_fetch::retry::RetryPolicy;
use deltafin_fetch::source::oci::{OciOptions, OciSource, RegistryAuth, push};
use deltafin_fetch::{EngineSource, Error, InstallOptions, Remote, install};

fn oci_opts() -> OciOptions {
    OciOptions {
        plain_http: true,
        auth: RegistryAuth::Anonymous,
    }
}

#[test]
fn push_then_pull_is_byte_identical() {
    if !have("docker-registry") {
        return;
    }
    let registry = Registry::start();
    let model = tempfile::tempdir().unwrap();
    write_tiny(model.path());
    std::fs::create_dir_all(model.path().join("extra")).unwrap();
    std::fs::write(model.path().join("extra/empty.txt"), b"").unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let reference = format!("127.0.0.1:{}/deltafin/tiny:v1", registry.port);
    let (files, config) = push_plan(model.path()).unwrap();
    let r = rt
        .block_on(push(model.path(), &reference, &files, &config, &oci_opts()))
        .unwrap();
    assert_eq!((r.files, r.skipped), (files.len(), 0));
    let again = rt
        .block_on(push(model.path(), &reference, &files, &config, &oci_opts()))
        .unwrap();
    assert_eq!(again.skipped, files.len());

    let dir = tempfile::tempdir().unwrap();
    let spec = format!("oci://{reference}").parse().unwrap();
    let remote = Remote::Oci(OciSource::new(&spec, &oci_opts()).unwrap());
    let opts = InstallOptions {
        workers: 3,
        chunk_size: 32 << 10,
        headroom: 0,
        retry: RetryPolicy {
            max_attempts: 3,
            base: Duration::from_millis(10),
            cap: Duration::from_millis(50),
        },
        ..InstallOptions::new(dir.path(), Mode::Full)
    };
    let report = rt.block_on(install(&remote, &opts, &NoProgress)).unwrap();
    assert!(
        report.complete && report.pinned.starts_with("sha256:"),
        "{report:?}"
    );
    assert_same_tree(model.path(), dir.path());
    assert_eq!(generate_ids(dir.path()), generate_ids(model.path()));

    // The pulled install pushes again under another tag, reusing its verified digests.
    let (files2, config2) = push_plan(dir.path()).unwrap();
    assert_eq!(
        config2.source.as_deref(),
        Some(format!("oci://127.0.0.1:{}/deltafin/tiny", registry.port).as_str())
    );
    let tag2 = format!("127.0.0.1:{}/deltafin/tiny:v2", registry.port);
    let r2 = rt
        .block_on(push(dir.path(), &tag2, &files2, &config2, &oci_opts()))
        .unwrap();
    assert_eq!(r2.skipped, files2.len());

    // Pulling through connections cut mid-blob resumes and still verifies.
    let proxy = FaultProxy::start(registry.port);
    proxy.cut(8, 40 << 10);
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("oci://127.0.0.1:{}/deltafin/tiny:v1", proxy.port)
        .parse()
        .unwrap();
    let remote = Remote::Oci(OciSource::new(&spec, &oci_opts()).unwrap());
    let opts = InstallOptions {
        workers: 1,
        ..InstallOptions {
            dir: dir.path().into(),
            ..opts
        }
    };
    rt.block_on(install(&remote, &opts, &NoProgress)).unwrap();
    assert_same_tree(model.path(), dir.path());
    let resumed = proxy
        .requests()
        .into_iter()
        .filter(|r| r.contains("/blobs/"))
        .filter_map(|r| {
            let span = r.split("bytes=").nth(1)?.to_string();
            span.split('-').next()?.parse::<u64>().ok()
        });
    assert!(
        resumed.into_iter().any(|start| !start.is_multiple_of(32 << 10)),
        "{:#?}",
        proxy.requests()
    );

    // A missing tag is a clear error.
    let spec = format!("oci://127.0.0.1:{}/deltafin/tiny:nope", registry.port)
        .parse()
        .unwrap();
    let remote = Remote::Oci(OciSource::new(&spec, &oci_opts()).unwrap());
    let e = rt
        .block_on(install(
            &remote,
            &InstallOptions::new(tempfile::tempdir().unwrap().path(), Mode::Full),
            &NoProgress,
        ))
        .unwrap_err();
    assert!(matches!(e, Error::NotFound { .. } | Error::Oci { .. }), "{e}");
}

fn greedy(model: &dyn arch::Model) -> Vec<u32> {
    let opts = GenerateOptions {
        max_new_tokens: 6,
        ..Default::default()
    };
    let mut state = model.new_state();
    generate(model, &mut state, &[1, 5, 9, 42], &opts, |_| Flow::Continue)
        .unwrap()
        .output_ids
}

#[test]
fn a_stream_install_from_a_registry_fetches_routed_experts_from_blobs_on_first_use() {
    if !have("docker-registry") {
        return;
    }
    let registry = Registry::start();
    let model = tempfile::tempdir().unwrap();
    let synth = DeepseekSynth {
        experts: 32,
        ..DeepseekSynth::tiny(ExpertFormat::Int4)
    };
    synth.write(model.path()).unwrap();
    let want = greedy(arch::load(model.path()).unwrap().as_ref());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let reference = format!("127.0.0.1:{}/deltafin/stream:v1", registry.port);
    let (files, config) = push_plan(model.path()).unwrap();
    rt.block_on(push(model.path(), &reference, &files, &config, &oci_opts()))
        .unwrap();
    let remote = || {
        let spec = format!("oci://{reference}").parse().unwrap();
        Remote::Oci(OciSource::new(&spec, &oci_opts()).unwrap())
    };
    let dir = tempfile::tempdir().unwrap();
    let opts = InstallOptions {
        workers: 2,
        chunk_size: 64 << 10,
        headroom: 0,
        ..InstallOptions::new(dir.path(), Mode::Stream)
    };
    let r = rt.block_on(install(&remote(), &opts, &NoProgress)).unwrap();
    assert!(
        r.complete && r.mode == Mode::Stream && r.bytes_local < r.bytes_total,
        "only the resident set is downloaded: {r:?}"
    );
    drop(rt);

    let policy = RetryPolicy {
        max_attempts: 2,
        base: Duration::from_millis(10),
        cap: Duration::from_millis(50),
    };
    // Run twice over the same install (each run holds the install's lock until it ends).
    for run in 0..2 {
        let source = EngineSource::open(dir.path(), remote(), policy).unwrap();
        let mut o = OocOptions::with_budget(u64::MAX / 4);
        o.remote = Some(source.remote_weights(4));
        o.reader.threads = 2;
        let (m, _ooc) = arch::load_budgeted(dir.path(), &o).unwrap();
        assert_eq!(source.store().stats().fetches, 0, "loading fetches no expert");
        assert_eq!(
            greedy(m.as_ref()),
            want,
            "run {run}: stream install from OCI vs the full checkpoint"
        );
        let fetched = source.store().stats();
        let (local, total) = source.store().completeness();
        if run == 0 {
            assert!(fetched.fetches > 0 && fetched.bytes > 0, "{fetched:?}");
            assert!(
                local < total,
                "a short generation routes a strict subset of the experts"
            );
        } else {
            assert_eq!(fetched.fetches, 0, "everything the second run needs is local");
        }
    }
}
