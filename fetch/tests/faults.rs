//! Failure handling against real servers: dropped connections resume, a corrupted byte is never
//! published, 404/401/403 fail at once, 5xx is retried and then reported, a source that moved
//! under its revision is refused, and a too-small disk fails before any payload is fetched.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use deltafin_fetch::manifest::Mode;
use deltafin_fetch::progress::NoProgress;
use deltafin_fetch::retry::RetryPolicy;
use deltafin_fetch::source::hf::HfRepo;
use deltafin_fetch::{Error, InstallOptions, Remote, install};

fn remote(endpoint: &str, source: &str) -> Remote {
    let client = deltafin_fetch::http::build_client(&Default::default()).unwrap();
    let policy = RetryPolicy {
        max_attempts: 4,
        base: Duration::from_millis(10),
        cap: Duration::from_millis(50),
    };
    Remote::Hf(HfRepo::new(client, endpoint, &source.parse().unwrap(), None, policy).unwrap())
}

fn opts(dir: &Path) -> InstallOptions {
    InstallOptions {
        workers: 2,
        chunk_size: 256 << 10,
        headroom: 0,
        ..InstallOptions::new(dir, Mode::Full)
    }
}

fn run(endpoint: &str, dir: &Path) -> deltafin_fetch::Result<deltafin_fetch::InstallReport> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(install(
        &remote(endpoint, "hf://org/tiny"),
        &opts(dir),
        &NoProgress,
    ))
}

/// A served tiny model plus a 3 MiB payload file; returns (model dir, root dir, commit).
fn served() -> Option<(tempfile::TempDir, tempfile::TempDir, String)> {
    if !have("nginx") {
        return None;
    }
    let model = tempfile::tempdir().unwrap();
    write_tiny(model.path());
    let payload: Vec<u8> = (0..3u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(model.path().join("payload.bin"), payload).unwrap();
    let root = tempfile::tempdir().unwrap();
    let sha = serve_hf(root.path(), "org/tiny", "main", model.path());
    Some((model, root, sha))
}

#[test]
fn dropped_connections_resume_inside_the_file() {
    let Some((model, root, _)) = served() else { return };
    let nginx = Nginx::start(root.path(), None);
    let proxy = FaultProxy::start(nginx.port);
    // The first 6 connections (API included) are cut after 100 KiB.
    proxy.cut(6, 100 << 10);
    let dir = tempfile::tempdir().unwrap();
    let r = run(&proxy.url(), dir.path()).unwrap();
    assert!(r.complete);
    assert_same_tree(model.path(), dir.path());
    // Resumed requests start where the data stopped, not at the chunk start.
    let reqs = proxy.requests();
    let resumed = reqs
        .iter()
        .filter(|r| r.contains("payload.bin"))
        .filter_map(|r| r.split("bytes=").nth(1))
        .filter(|span| {
            let start: u64 = span.split('-').next().unwrap().parse().unwrap();
            !start.is_multiple_of(256 << 10)
        });
    assert!(resumed.count() > 0, "{reqs:#?}");
}

#[test]
fn a_corrupted_byte_fails_the_checksum_and_nothing_is_published() {
    let Some((_model, root, sha)) = served() else {
        return;
    };
    let served_file = root
        .path()
        .join("org/tiny/resolve")
        .join(&sha)
        .join("payload.bin");
    let mut bytes = std::fs::read(&served_file).unwrap();
    bytes[1_000_000] ^= 0x01;
    std::fs::write(&served_file, bytes).unwrap();
    let nginx = Nginx::start(root.path(), None);
    let dir = tempfile::tempdir().unwrap();
    let e = run(&nginx.url(), dir.path()).unwrap_err();
    assert!(
        matches!(&e, Error::ChecksumMismatch { path, algo: "sha256", .. } if path == "payload.bin"),
        "{e}"
    );
    assert!(e.to_string().contains("nothing was published"));
    assert!(!dir.path().join("payload.bin").exists());
    assert!(!dir.path().join(".deltafin/partial/payload.bin.partial").exists());
}

#[test]
fn not_found_and_auth_errors_are_not_retried() {
    let Some((_model, root, _)) = served() else { return };
    let nginx = Nginx::start(root.path(), None);
    let proxy = FaultProxy::start(nginx.port);
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let e = rt
        .block_on(install(
            &remote(&proxy.url(), "hf://org/missing"),
            &opts(dir.path()),
            &NoProgress,
        ))
        .unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
    assert!(e.to_string().contains("HF_TOKEN"), "{e}");
    assert_eq!(proxy.requests().len(), 1);
    for (prefix, status) in [("denied", 401), ("forbidden", 403)] {
        let e = run(&format!("{}/{prefix}", proxy.url()), dir.path()).unwrap_err();
        assert!(
            matches!(e, Error::Unauthorized { status: s, .. } if s == status),
            "{e}"
        );
    }
    assert_eq!(proxy.requests().len(), 3);
}

#[test]
fn the_token_is_sent_as_bearer() {
    let Some((model, root, _)) = served() else { return };
    let nginx = Nginx::start(root.path(), None);
    let endpoint = format!("{}/private", nginx.url());
    let dir = tempfile::tempdir().unwrap();
    let e = run(&endpoint, dir.path()).unwrap_err();
    assert!(matches!(e, Error::Unauthorized { status: 401, .. }), "{e}");
    let client = deltafin_fetch::http::build_client(&Default::default()).unwrap();
    let spec = "hf://org/tiny".parse().unwrap();
    let remote = Remote::Hf(
        HfRepo::new(
            client,
            &endpoint,
            &spec,
            Some("s3cret".into()),
            RetryPolicy::default(),
        )
        .unwrap(),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(install(&remote, &opts(dir.path()), &NoProgress))
        .unwrap();
    assert_same_tree(model.path(), dir.path());
}

#[test]
fn server_errors_are_retried_then_reported() {
    let Some((_model, root, _)) = served() else { return };
    let nginx = Nginx::start(root.path(), None);
    let proxy = FaultProxy::start(nginx.port);
    let dir = tempfile::tempdir().unwrap();
    let e = run(&format!("{}/flaky", proxy.url()), dir.path()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::HttpStatus {
                status: 503,
                attempts: 4,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(proxy.requests().len(), 4);
}

#[test]
fn a_revision_that_moved_is_refused() {
    let Some((model, root, sha)) = served() else {
        return;
    };
    let nginx = Nginx::start(root.path(), None);
    let dir = tempfile::tempdir().unwrap();
    run(&nginx.url(), dir.path()).unwrap();
    // The branch now points to another commit.
    std::fs::write(model.path().join("config.json.extra"), b"{}").unwrap();
    let new_sha = serve_hf(root.path(), "org/tiny", "main", model.path());
    assert_ne!(new_sha, sha);
    let e = run(&nginx.url(), dir.path()).unwrap_err();
    match &e {
        Error::RevisionMoved { was, now, .. } => assert_eq!((was, now), (&sha, &new_sha)),
        e => panic!("{e}"),
    }
    assert!(e.to_string().contains(&format!("@{sha}")));
    // Asking for the pinned commit explicitly still works (nothing to download).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let r = rt
        .block_on(install(
            &remote(&nginx.url(), &format!("hf://org/tiny@{sha}")),
            &opts(dir.path()),
            &NoProgress,
        ))
        .unwrap();
    assert_eq!(r.bytes_downloaded, 0);
}

#[test]
fn a_too_small_disk_fails_before_downloading() {
    let Some((_model, root, _)) = served() else { return };
    let Some(tmpfs) = Tmpfs::mount("1m") else { return };
    let nginx = Nginx::start(root.path(), None);
    let proxy = FaultProxy::start(nginx.port);
    let dir = tmpfs.path.join("model");
    let e = run(&proxy.url(), &dir).unwrap_err();
    assert!(matches!(e, Error::InsufficientSpace { .. }), "{e}");
    assert!(e.to_string().contains("not enough free space"), "{e}");
    let reqs = proxy.requests();
    assert!(
        reqs.iter().all(|r| r.contains("/api/")),
        "payload was requested: {reqs:?}"
    );
}
