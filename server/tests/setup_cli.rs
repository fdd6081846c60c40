//! The `deltafin setup` / `doctor` / `push` commands end to end against real loopback servers:
//! exit codes, one-line errors, the JSON-lines progress contract, drafts, `kill -9` mid-transfer
//! followed by a rerun, and OCI push/pull through the CLI.

#[path = "../../fetch/tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// The binary under test (`DELTAFIN_TEST_BIN` overrides it, for shared target directories where
/// another checkout may rebuild `target/debug/deltafin` concurrently).
fn deltafin() -> Command {
    let bin =
        std::env::var("DELTAFIN_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_deltafin").to_string());
    let mut c = Command::new(bin);
    c.env_remove("HF_TOKEN")
        .env_remove("HF_ENDPOINT")
        .env("DELTAFIN_RETRY_BASE_MS", "20")
        .env("DELTAFIN_HEADROOM_MIB", "0");
    c
}

fn ok(out: &Output) -> &Output {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout {}\nstderr {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The one `error: ...` line, which must be the last line on stderr (progress lines may precede it).
fn error_line(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    let errors: Vec<&str> = text.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "{text}");
    assert_eq!(text.lines().last(), Some(errors[0]), "{text}");
    errors[0].to_string()
}

/// Tiny model + 4 MiB payload, and a second tiny repo posing as the Qwen drafter.
fn served() -> Option<(tempfile::TempDir, tempfile::TempDir)> {
    if !have("nginx") {
        return None;
    }
    let model = tempfile::tempdir().unwrap();
    write_tiny(model.path());
    let payload: Vec<u8> = (0..4u32 << 20)
        .map(|i| (i.wrapping_mul(2246822519) >> 11) as u8)
        .collect();
    std::fs::write(model.path().join("payload.bin"), payload).unwrap();
    let root = tempfile::tempdir().unwrap();
    serve_hf(root.path(), "org/tiny", "main", model.path());
    let draft = tempfile::tempdir().unwrap();
    write_tiny(draft.path());
    serve_hf(root.path(), "qwen/draft", "main", draft.path());
    Some((model, root))
}

fn setup_cmd(endpoint: &str, dir: &Path) -> Command {
    let mut c = deltafin();
    c.args([
        "setup",
        "--source",
        "hf://org/tiny",
        "--full",
        "--endpoint",
        endpoint,
    ])
    .arg("--dir")
    .arg(dir);
    c
}

#[test]
fn setup_with_drafts_progress_file_and_doctor() {
    let Some((model, root)) = served() else { return };
    let nginx = Nginx::start(root.path(), None);
    let dir = tempfile::tempdir().unwrap();
    let progress = dir.path().join("progress.jsonl");
    let out = setup_cmd(&nginx.url(), &dir.path().join("m"))
        .args([
            "--include-qwen",
            "--qwen-source",
            "hf://qwen/draft",
            "--draft",
            "dspark=hf://qwen/draft",
            "--json",
        ])
        .arg("--progress-file")
        .arg(&progress)
        .output()
        .unwrap();
    ok(&out);
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["model"]["complete"], true, "{summary}");
    assert_eq!(summary["draft qwen"]["mode"], "full");
    let m = dir.path().join("m");
    for f in files_under(model.path()) {
        assert_eq!(
            std::fs::read(model.path().join(&f)).unwrap(),
            std::fs::read(m.join(&f)).unwrap(),
            "{f}"
        );
    }
    assert!(m.join("drafts/qwen/config.json").exists() && m.join("drafts/dspark/config.json").exists());
    // The progress contract: exact keys in order, phases from the set, one final `done`.
    let text = std::fs::read_to_string(&progress).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    for l in &lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(v.as_object().unwrap().len(), 6, "{l}");
        assert!(
            l.starts_with(r#"{"phase":""#) && l.contains(r#","bytes_done":"#),
            "{l}"
        );
        assert!(
            l.contains(r#","bytes_total":"#)
                && l.contains(r#","files_done":"#)
                && l.contains(r#","files_total":"#),
            "{l}"
        );
        assert!(l.contains(r#","message":""#), "{l}");
        assert!(
            ["resolve", "download", "verify", "done"].contains(&v["phase"].as_str().unwrap()),
            "{l}"
        );
    }
    assert_eq!(
        lines.iter().filter(|l| l.contains(r#""phase":"done""#)).count(),
        1
    );
    assert!(lines.last().unwrap().contains(r#""phase":"done""#));

    let out = deltafin()
        .args(["doctor", "--verify", "--json", "--dir"])
        .arg(&m)
        .output()
        .unwrap();
    ok(&out);
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(d["usable"], true, "{d}");
    assert_eq!(d["mode"], "full");
    assert_eq!(d["drafts"].as_array().unwrap().len(), 2);
    // A flipped byte makes doctor --verify fail.
    let f = m.join("payload.bin");
    let mut b = std::fs::read(&f).unwrap();
    b[10] ^= 0xff;
    std::fs::write(&f, b).unwrap();
    let out = deltafin()
        .args(["doctor", "--verify", "--dir"])
        .arg(&m)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("NOT USABLE") && text.contains("payload.bin: checksum mismatch"),
        "{text}"
    );
}

#[test]
fn kill_9_mid_transfer_then_rerun_completes_and_verifies() {
    let Some((model, root)) = served() else { return };
    let slow = Nginx::start(root.path(), Some(512 << 10));
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m");
    let mut child = setup_cmd(&slow.url(), &m)
        .args(["--workers", "1", "--chunk-mib", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until some payload range is durably recorded, then SIGKILL.
    let sidecar = m.join(".deltafin/partial/payload.bin.partial.json");
    let t = Instant::now();
    loop {
        let side = std::fs::read_to_string(&sidecar)
            .ok()
            .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok());
        if side.is_some_and(|v| v["present"].as_array().is_some_and(|a| !a.is_empty())) {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "no progress recorded");
        assert!(
            child.try_wait().unwrap().is_none(),
            "setup finished before it could be killed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(!m.join("payload.bin").exists(), "a partial file was published");
    let fast = Nginx::start(root.path(), None);
    let out = setup_cmd(&fast.url(), &m).arg("--json").output().unwrap();
    ok(&out);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (downloaded, total) = (
        r["model"]["bytes_downloaded"].as_u64().unwrap(),
        r["model"]["bytes_total"].as_u64().unwrap(),
    );
    assert!(downloaded < total, "the rerun started over: {r}");
    assert_installed(model.path(), &m);
}

#[test]
fn failures_exit_1_with_one_line() {
    let Some((_model, root)) = served() else { return };
    let nginx = Nginx::start(root.path(), None);
    let dir = tempfile::tempdir().unwrap();
    let out = deltafin()
        .args([
            "setup",
            "--source",
            "hf://org/nope",
            "--full",
            "--endpoint",
            &nginx.url(),
        ])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let e = error_line(&out);
    assert!(
        e.contains("not found (HTTP 404)") && e.contains("HF_TOKEN"),
        "{e}"
    );
    // Usage errors exit 2: a mode is required.
    let out = deltafin()
        .args(["setup", "--source", "hf://org/tiny", "--dir", "x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    if let Some(tmpfs) = Tmpfs::mount("1m") {
        let out = setup_cmd(&nginx.url(), &tmpfs.path.join("m")).output().unwrap();
        assert_eq!(out.status.code(), Some(1));
        let e = error_line(&out);
        assert!(e.contains("not enough free space"), "{e}");
        assert!(!tmpfs.path.join("m/payload.bin").exists());
    }
    // doctor on an empty directory: not usable.
    let out = deltafin()
        .args(["doctor", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn stream_setup_then_doctor_then_full() {
    let Some((model, root)) = served() else { return };
    let nginx = Nginx::start(root.path(), None);
    let dir = tempfile::tempdir().unwrap();
    let mut c = deltafin();
    c.args([
        "setup",
        "--source",
        "hf://org/tiny",
        "--stream",
        "--json",
        "--endpoint",
        &nginx.url(),
    ])
    .arg("--dir")
    .arg(dir.path());
    ok(&c.output().unwrap());
    let out = deltafin()
        .args(["doctor", "--json", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    ok(&out);
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(d["mode"], "stream", "{d}");
    let pct = d["percent_local"].as_f64().unwrap();
    assert!(pct > 0.0 && pct < 100.0, "{d}");
    ok(&setup_cmd(&nginx.url(), dir.path()).output().unwrap());
    let out = deltafin()
        .args(["doctor", "--json", "--verify", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    ok(&out);
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (d["mode"].as_str(), d["percent_local"].as_f64()),
        (Some("full"), Some(100.0)),
        "{d}"
    );
    assert_eq!(generate_ids(dir.path()), generate_ids(model.path()));
}

#[test]
fn cli_push_then_setup_from_oci() {
    if !have("docker-registry") {
        return;
    }
    let registry = Registry::start();
    let model = tempfile::tempdir().unwrap();
    write_tiny(model.path());
    let dest = format!("oci://127.0.0.1:{}/models/tiny:v1", registry.port);
    ok(&deltafin()
        .arg("push")
        .arg(model.path())
        .arg(&dest)
        .output()
        .unwrap());
    let dir = tempfile::tempdir().unwrap();
    ok(&deltafin()
        .args(["setup", "--full", "--source", &dest])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap());
    assert_same_tree(model.path(), dir.path());
    ok(&deltafin()
        .args(["doctor", "--verify", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap());
}

/// A full `setup` records the per-tensor checksums that `serve` and `run` verify every weight
/// read against; `doctor --verify` re-hashes them; a repeated `setup` of the complete install
/// leaves them as they are.
#[test]
fn a_full_setup_records_checksums_that_doctor_verifies() {
    let Some((_model, root)) = served() else { return };
    let nginx = Nginx::start(root.path(), None);
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m");
    let out = setup_cmd(&nginx.url(), &m).output().unwrap();
    ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("checksums: recorded xxh3-64"), "{stderr}");
    let sums = m.join(".deltafin/checksums.json");
    let recorded = std::fs::read(&sums).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&recorded).unwrap();
    assert_eq!(v["algorithm"], "xxh3-64");
    assert!(!v["shards"].as_object().unwrap().is_empty(), "{v}");
    let report = doctor_verify_json(&m);
    let check = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "checksums")
        .unwrap();
    assert_eq!(check["ok"], true, "{check}");
    assert!(
        check["detail"]
            .as_str()
            .unwrap()
            .contains("re-hashed and matches"),
        "{check}"
    );
    let again = setup_cmd(&nginx.url(), &m).output().unwrap();
    ok(&again);
    assert!(!String::from_utf8_lossy(&again.stderr).contains("checksums: recorded"));
    assert_eq!(std::fs::read(&sums).unwrap(), recorded);
}

/// The disk fills up while `setup` downloads (another writer took the space its free-space
/// check saw): it exits 1 with one line naming the full disk, publishes nothing partial, and
/// once space is freed a rerun resumes and verifies.
#[test]
fn a_disk_filled_mid_download_fails_cleanly_and_a_rerun_resumes() {
    let Some((model, root)) = served() else { return };
    let Some(tmpfs) = Tmpfs::mount("24m") else { return };
    let slow = Nginx::start(root.path(), Some(512 << 10));
    let m = tmpfs.path.join("m");
    let child = setup_cmd(&slow.url(), &m)
        .args(["--workers", "1", "--chunk-mib", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sidecar = m.join(".deltafin/partial/payload.bin.partial.json");
    let t = Instant::now();
    while !sidecar.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the download never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Take every free byte.
    let filler = tmpfs.path.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let block = vec![0u8; 64 << 10];
        while f.write_all(&block).is_ok() {}
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let e = error_line(&out);
    assert!(e.contains("No space left on device"), "{e}");
    assert!(!m.join("payload.bin").exists(), "a partial file was published");
    std::fs::remove_file(&filler).unwrap();
    let fast = Nginx::start(root.path(), None);
    ok(&setup_cmd(&fast.url(), &m).output().unwrap());
    assert_installed(model.path(), &m);
}

/// Every file of `model` is in `m` byte for byte, and `doctor --verify` passes there.
fn assert_installed(model: &Path, m: &Path) {
    for f in files_under(model) {
        assert_eq!(
            std::fs::read(model.join(&f)).unwrap(),
            std::fs::read(m.join(&f)).unwrap(),
            "{f}"
        );
    }
    ok(&deltafin()
        .args(["doctor", "--verify", "--dir"])
        .arg(m)
        .output()
        .unwrap());
}

/// `doctor --verify --json` on `m`, which must pass: its report.
fn doctor_verify_json(m: &Path) -> serde_json::Value {
    let out = deltafin()
        .args(["doctor", "--verify", "--json", "--dir"])
        .arg(m)
        .output()
        .unwrap();
    ok(&out);
    serde_json::from_slice(&out.stdout).unwrap()
}
