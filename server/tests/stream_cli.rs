//! Stream installs through the real binary against a loopback nginx: `deltafin run` and
//! `deltafin serve` on a `setup --stream` directory generate exactly what the full checkpoint
//! generates while fetching only the routed experts (once); `--route-trace` records the
//! selections; `deltafin warm` fetches the top experts of a trace so a later run fetches
//! nothing; failures are one-line errors with a non-zero exit.

#[path = "../../fetch/tests/common/mod.rs"]
mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use deltafin_engine::cache::routes::RouteCounts;
use deltafin_engine::synth::{DeepseekSynth, ExpertFormat};
use deltafin_fetch::manifest::Manifest;
use deltafin_fetch::source::RemoteFile;
use deltafin_fetch::staged::present_on_disk;
use serde_json::{Value, json};

const PROMPT: &str = "Hello there";

fn deltafin() -> Command {
    let bin =
        std::env::var("DELTAFIN_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_deltafin").to_string());
    let mut c = Command::new(bin);
    c.env_remove("HF_TOKEN")
        .env_remove("HF_ENDPOINT")
        .env("DELTAFIN_THREADS", "2")
        .env("DELTAFIN_RETRY_BASE_MS", "20")
        .env("DELTAFIN_RETRIES", "2")
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

fn json_out(out: &Output) -> Value {
    serde_json::from_slice(&ok(out).stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// The one `error: ...` line, last on stderr, of a failed command.
fn error_line(out: &Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    let errors: Vec<&str> = text.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "{text}");
    assert_eq!(text.lines().last(), Some(errors[0]), "{text}");
    assert!(!text.contains("panicked"), "{text}");
    errors[0].to_string()
}

struct Served {
    model: tempfile::TempDir,
    _root: tempfile::TempDir,
    nginx: Nginx,
}

/// A tiny model with many experts per layer (a short run routes a strict subset), served in
/// Hugging Face's layout.
fn served() -> Option<Served> {
    if !have("nginx") {
        return None;
    }
    let model = tempfile::tempdir().unwrap();
    DeepseekSynth {
        experts: 32,
        ..DeepseekSynth::tiny(ExpertFormat::Bf16)
    }
    .write(model.path())
    .unwrap();
    let root = tempfile::tempdir().unwrap();
    serve_hf(root.path(), "org/tiny", "main", model.path());
    let nginx = Nginx::start(root.path(), None);
    Some(Served {
        model,
        _root: root,
        nginx,
    })
}

fn setup_stream(endpoint: &str, dir: &Path) {
    ok(&deltafin()
        .args([
            "setup",
            "--source",
            "hf://org/tiny",
            "--stream",
            "--endpoint",
            endpoint,
            "--dir",
        ])
        .arg(dir)
        .output()
        .unwrap());
}

fn run_json(model: &Path, extra: &[&str]) -> Output {
    deltafin()
        .args(["run", "--json", "--max-new", "6", "--prompt", PROMPT, "--model"])
        .arg(model)
        .args(extra)
        .output()
        .unwrap()
}

/// Experts of the install in `dir` whose every catalog range is recorded present (read-only).
fn local_experts(dir: &Path) -> BTreeSet<(u32, u32)> {
    let m = Manifest::load(dir).unwrap().unwrap();
    let state = dir.join(".deltafin");
    let present = |file: &str| {
        let f = m.file(file).unwrap();
        let rf = RemoteFile {
            path: f.path.clone(),
            size: f.size,
            expected: f.expected.clone(),
            locator: f.locator.clone(),
        };
        present_on_disk(&state, &rf, &m.pinned)
    };
    let all: BTreeSet<(u32, u32)> = m.experts.iter().map(|e| (e.layer, e.expert)).collect();
    all.into_iter()
        .filter(|&(l, x)| {
            m.experts
                .iter()
                .filter(|e| (e.layer, e.expert) == (l, x))
                .all(|e| present(&e.file).covers(&(e.start..e.end)))
        })
        .collect()
}

fn traced(trace: &Path) -> (RouteCounts, BTreeSet<(u32, u32)>) {
    let c = RouteCounts::read(trace).unwrap();
    let keys = c.counts.keys().map(|k| (k.layer, k.expert)).collect();
    (c, keys)
}

#[test]
fn run_on_a_stream_install_matches_full_and_fetches_routed_experts_once() {
    let Some(s) = served() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let want = json_out(&run_json(s.model.path(), &[]))["output_ids"].clone();
    let dir = tmp.path().join("stream");
    setup_stream(&s.nginx.url(), &dir);
    let total = Manifest::load(&dir)
        .unwrap()
        .unwrap()
        .experts
        .iter()
        .map(|e| (e.layer, e.expert))
        .collect::<BTreeSet<_>>();
    let trace = tmp.path().join("routes.jsonl");

    let first = json_out(&run_json(
        &dir,
        &["--route-trace", trace.to_str().unwrap(), "--stats"],
    ));
    assert_eq!(first["output_ids"], want, "stream install vs full checkpoint");
    let (_, routed) = traced(&trace);
    assert!(
        !routed.is_empty() && routed.len() < total.len(),
        "{routed:?} of {}",
        total.len()
    );
    assert_eq!(
        local_experts(&dir),
        routed,
        "exactly the routed experts were fetched"
    );
    assert_eq!(first["out_of_core"]["experts"]["remote_experts"], routed.len());
    assert!(
        first["stream"]["fetches"].as_u64().unwrap() >= routed.len() as u64,
        "{}",
        first["stream"]
    );

    let second = json_out(&run_json(&dir, &[]));
    assert_eq!(second["output_ids"], want);
    assert_eq!(second["stream"]["fetches"], 0, "{}", second["stream"]);
    assert_eq!(second["out_of_core"]["experts"]["remote_experts"], 0);
}

#[test]
fn warm_fetches_the_most_used_experts_of_a_trace_so_a_run_fetches_nothing() {
    let Some(s) = served() else { return };
    let tmp = tempfile::tempdir().unwrap();
    // A trace recorded on the full checkpoint (route traces do not need a stream install).
    let trace = tmp.path().join("routes.jsonl");
    let want = json_out(&run_json(
        s.model.path(),
        &["--route-trace", trace.to_str().unwrap()],
    ))["output_ids"]
        .clone();
    let (counts, routed) = traced(&trace);
    assert!(routed.len() > 3, "{routed:?}");

    // `warm` on a fresh stream install: the top 3 experts of the trace, then all of them.
    let fresh = tmp.path().join("fresh");
    setup_stream(&s.nginx.url(), &fresh);
    let warm = |top: &str| {
        deltafin()
            .args([
                "warm",
                "--trace",
                trace.to_str().unwrap(),
                "--top",
                top,
                "--json",
                "--dir",
            ])
            .arg(&fresh)
            .output()
            .unwrap()
    };
    let r = json_out(&warm("3"));
    assert_eq!(
        (
            r["selected"].as_u64(),
            r["fetched"].as_u64(),
            r["already_local"].as_u64()
        ),
        (Some(3), Some(3), Some(0)),
        "{r}"
    );
    assert_eq!(r["experts_in_trace"], routed.len());
    assert_eq!(r["passes"], counts.passes);
    assert!(
        r["requests"].as_u64().unwrap() >= 1 && r["requests"].as_u64().unwrap() <= 3,
        "{r}"
    );
    let top3: BTreeSet<(u32, u32)> = counts
        .ranked()
        .iter()
        .take(3)
        .map(|(k, _)| (k.layer, k.expert))
        .collect();
    assert_eq!(
        local_experts(&fresh),
        top3,
        "the three most used experts, and only those"
    );
    let r = json_out(&warm("1000"));
    assert_eq!(r["already_local"], 3, "{r}");
    assert_eq!(r["fetched"].as_u64().unwrap() as usize, routed.len() - 3, "{r}");
    assert_eq!(local_experts(&fresh), routed);
    let warmed = json_out(&run_json(&fresh, &[]));
    assert_eq!(warmed["output_ids"], want);
    assert_eq!(
        warmed["stream"]["fetches"], 0,
        "a warmed install fetches nothing: {}",
        warmed["stream"]
    );
    // The human summary goes to stderr.
    let out = deltafin()
        .args(["warm", "--top", "1", "--trace"])
        .arg(&trace)
        .arg("--dir")
        .arg(&fresh)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&ok(&out).stderr).into_owned();
    assert!(
        text.contains("warm: ") && text.contains("1 already local, 0 fetched"),
        "{text}"
    );
}

#[test]
fn stream_failures_are_one_line_errors() {
    let Some(s) = served() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("stream");
    setup_stream(&s.nginx.url(), &dir);
    let flaky = format!("{}/flaky", s.nginx.url());

    // The source answers 5xx: the run fails naming the shard and the status; nothing is fetched.
    let line = error_line(&run_json(&dir, &["--endpoint", &flaky]));
    assert!(
        line.contains(".safetensors: bytes ")
            && line.contains("could not be fetched")
            && line.contains("HTTP 503"),
        "{line}"
    );
    assert!(local_experts(&dir).is_empty());
    let line = error_line(&run_json(&dir, &["--memory-budget", "off"]));
    assert!(
        line.contains("--memory-budget off") && line.contains("stream install"),
        "{line}"
    );

    // warm: a failing source, a malformed trace, a missing trace, an install of another model.
    let trace = tmp.path().join("routes.jsonl");
    std::fs::write(
        &trace,
        "{\"pass\":0,\"routes\":[{\"layer\":1,\"experts\":[0,1]}]}\n",
    )
    .unwrap();
    let warm = |trace: &Path, extra: &[&str]| {
        deltafin()
            .args(["warm", "--top", "2", "--trace"])
            .arg(trace)
            .arg("--dir")
            .arg(&dir)
            .args(extra)
            .output()
            .unwrap()
    };
    let line = error_line(&warm(&trace, &["--endpoint", &flaky]));
    assert!(line.contains("HTTP 503"), "{line}");
    assert!(local_experts(&dir).is_empty());
    std::fs::write(
        tmp.path().join("bad.jsonl"),
        "{\"pass\":0,\"routes\":[]}\nnope\n{}\n",
    )
    .unwrap();
    let line = error_line(&warm(&tmp.path().join("bad.jsonl"), &[]));
    assert!(line.contains("bad.jsonl line 2"), "{line}");
    let line = error_line(&warm(&tmp.path().join("missing.jsonl"), &[]));
    assert!(line.contains("missing.jsonl"), "{line}");
    std::fs::write(
        &trace,
        "{\"pass\":0,\"routes\":[{\"layer\":7,\"experts\":[99]}]}\n",
    )
    .unwrap();
    let line = error_line(&warm(&trace, &[]));
    assert!(line.contains("layer 7 expert 99"), "{line}");
    // Working again afterwards: the failures left nothing partial behind.
    let out = json_out(&run_json(&dir, &[]));
    assert_eq!(
        out["output_ids"],
        json_out(&run_json(s.model.path(), &[]))["output_ids"]
    );
}

struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(model: &Path, extra: &[&str]) -> Server {
    let mut child = deltafin()
        .args(["serve", "--port", "0", "--model"])
        .arg(model)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let port = loop {
        let line = lines.next().expect("server exited before listening").unwrap();
        if let Some(rest) = line.split("listening on 127.0.0.1:").nth(1) {
            break rest.trim().parse().unwrap();
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    let server = Server { child, port };
    let deadline = Instant::now() + Duration::from_secs(60);
    while post(&server, "GET", "/readyz", "").0 != 200 {
        assert!(Instant::now() < deadline, "never ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    server
}

fn post(s: &Server, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut conn = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).unwrap();
    conn.write_all(body.as_bytes()).unwrap();
    let mut raw = String::new();
    let _ = conn.read_to_string(&mut raw);
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (
        status,
        raw.split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default(),
    )
}

#[test]
fn serve_on_a_stream_install_answers_like_the_full_checkpoint() {
    let Some(s) = served() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("stream");
    setup_stream(&s.nginx.url(), &dir);
    let body = json!({"prompt": PROMPT, "max_tokens": 6, "temperature": 0}).to_string();
    let full = start(s.model.path(), &[]);
    let (status, want) = post(&full, "POST", "/v1/completions", &body);
    assert_eq!(status, 200, "{want}");
    drop(full);
    // A failing source fails that request (500, details in the log) and the server keeps going.
    let flaky = format!("{}/flaky", s.nginx.url());
    let failing = start(&dir, &["--endpoint", &flaky]);
    let (status, err) = post(&failing, "POST", "/v1/completions", &body);
    assert_eq!(status, 500, "{err}");
    assert!(
        serde_json::from_str::<Value>(&err).unwrap()["error"]["message"].is_string(),
        "{err}"
    );
    assert_eq!(post(&failing, "GET", "/livez", "").0, 200);
    assert_eq!(
        post(&failing, "POST", "/v1/completions", &body).0,
        500,
        "still failing, still serving"
    );
    drop(failing);
    assert!(
        local_experts(&dir).is_empty(),
        "a failed fetch makes nothing local"
    );
    let trace = tmp.path().join("serve-routes.jsonl");
    let server = start(&dir, &["--route-trace", trace.to_str().unwrap()]);
    assert!(
        local_experts(&dir).is_empty(),
        "nothing fetched before the first request"
    );
    let (status, got) = post(&server, "POST", "/v1/completions", &body);
    assert_eq!(status, 200, "{got}");
    let text = |b: &str| serde_json::from_str::<Value>(b).unwrap()["choices"][0]["text"].clone();
    assert_eq!(text(&got), text(&want));
    let fetched = local_experts(&dir);
    assert!(!fetched.is_empty(), "the request's experts were fetched");
    assert_eq!(
        traced(&trace).1,
        fetched,
        "exactly the traced (routed) experts were fetched"
    );
    let (_, again) = post(&server, "POST", "/v1/completions", &body);
    assert_eq!(text(&again), text(&want));
    assert_eq!(
        local_experts(&dir),
        fetched,
        "the same request fetches nothing new"
    );
    let (_, metrics) = post(&server, "GET", "/metrics", "");
    let want = format!(
        "deltafin_expert_reads_total{{source=\"network\"}} {}",
        fetched.len()
    );
    assert!(metrics.contains(&want), "{want} in\n{metrics}");
    // Every fetched expert's network time is observed (beside the demand reads that follow).
    let count: usize = metrics
        .lines()
        .find_map(|l| l.strip_prefix("deltafin_expert_fetch_seconds_count "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    assert!(
        count >= fetched.len(),
        "fetch count {count} < {} fetched",
        fetched.len()
    );
}
