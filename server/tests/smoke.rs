//! Smoke test without Python: start the real binary on a free loopback port against a tiny
//! synthetic model and talk raw HTTP/1.1 to it: probes, models, a chat completion, a streamed
//! completion, and the 400/404/413 error shapes; then what the probes and requests say when the
//! weights are truncated under an out-of-core server, and when the engine stalls.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use deltafin_engine::synth::{DeepseekSynth, ExpertFormat};
use serde_json::{Value, json};

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

fn start(model: &std::path::Path, extra: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_deltafin"))
        .args(["--threads", "2", "serve", "--port", "0", "--model"])
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
    while request(&server, "GET", "/readyz", b"").0 != 200 {
        assert!(Instant::now() < deadline, "never ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    server
}

/// One request on a fresh connection; returns (status, body).
fn request(s: &Server, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    request_to(s.port, method, path, body)
}

/// [`request`] to the server on `port`.
fn request_to(port: u16, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).unwrap();
    let _ = conn.write_all(body);
    let mut raw = Vec::new();
    let _ = conn.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

fn json_body(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[test]
fn the_real_server_answers_over_http() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("smoke-model");
    DeepseekSynth::tiny(ExpertFormat::Bf16).write(&model).unwrap();
    let s = start(&model, &["--max-request-bytes", "4096"]);
    assert_eq!(request(&s, "GET", "/livez", b"").0, 200);
    let (status, body) = request(&s, "GET", "/v1/models", b"");
    assert_eq!(status, 200);
    assert_eq!(json_body(&body)["data"][0]["id"], "smoke-model");
    let chat = json!({"model": "smoke-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0});
    let (status, body) = request(&s, "POST", "/v1/chat/completions", chat.to_string().as_bytes());
    assert_eq!(status, 200, "{body}");
    let v = json_body(&body);
    assert_eq!(v["object"], "chat.completion");
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() <= 5);
    let again = request(&s, "POST", "/v1/chat/completions", chat.to_string().as_bytes()).1;
    assert_eq!(
        json_body(&again)["choices"],
        v["choices"],
        "greedy is reproducible"
    );
    let stream = json!({"prompt": "abc", "max_tokens": 3, "stream": true, "temperature": 0});
    let (status, body) = request(&s, "POST", "/v1/completions", stream.to_string().as_bytes());
    assert_eq!(status, 200);
    assert!(body.contains("data: [DONE]"), "{body}");
    for (path, body, want) in [
        ("/v1/chat/completions", &b"{not json"[..], 400),
        (
            "/v1/chat/completions",
            &br#"{"messages": [{"role": "user", "content": "x"}], "n": 9}"#[..],
            400,
        ),
        ("/v1/completions", &[b'"'; 5000][..], 413),
        ("/v1/nothing", &b"{}"[..], 404),
    ] {
        let (status, text) = request(&s, "POST", path, body);
        assert_eq!(status, want, "{path}: {text}");
        assert!(json_body(&text)["error"]["message"].is_string(), "{text}");
    }
    // The server's greedy completion equals `deltafin run` on the same prompt.
    let run = Command::new(env!("CARGO_BIN_EXE_deltafin"))
        .args([
            "--threads",
            "2",
            "run",
            "--json",
            "--max-new",
            "12",
            "--prompt",
            "abc",
            "--model",
        ])
        .arg(&model)
        .output()
        .unwrap();
    let run: Value = serde_json::from_slice(&run.stdout).unwrap();
    let tok = deltafin_engine::tokenizer::Tokenizer::from_dir(&model).unwrap();
    let ids: Vec<u32> = run["output_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let visible: Vec<u32> = ids.iter().copied().filter(|&id| !tok.is_special(id)).collect();
    let body = json!({"prompt": "abc", "max_tokens": ids.len(), "temperature": 0});
    let (_, text) = request(&s, "POST", "/v1/completions", body.to_string().as_bytes());
    assert_eq!(
        json_body(&text)["choices"][0]["text"],
        tok.decode(&visible),
        "{text}"
    );
    let (_, metrics) = request(&s, "GET", "/metrics", b"");
    assert!(
        metrics.contains("deltafin_requests_total{endpoint=\"chat_completions\",outcome=\"success\"} 2"),
        "{metrics}"
    );
}

/// Weights truncated under a running out-of-core server (a failing disk, a half-finished copy,
/// a second `setup`): no request answers 200 until the files are whole again. Each gets the
/// typed 500 naming the file, `/readyz` is 503 with the reason, the read-error counter names
/// the file, `/livez` stays 200 (a restart would not mend the disk); once the files are
/// restored the answers are the ones from before.
#[test]
fn shards_truncated_under_the_server_fail_requests_until_restored() {
    truncation_scenario(&["--memory-budget", "38M", "--context-memory", "1M"], true);
}

/// The same in memory (memory-mapped shards): requests are refused before they touch the pages
/// of a truncated file.
#[test]
fn shards_truncated_under_an_in_memory_server_fail_requests_until_restored() {
    truncation_scenario(&["--memory-budget", "off"], false);
}

fn truncation_scenario(args: &[&str], out_of_core: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("weights-model");
    DeepseekSynth::builtin().write(&model).unwrap();
    let s = start(&model, args);
    let plain = json!({"prompt": "hello there", "max_tokens": 8, "temperature": 0}).to_string();
    let streamed =
        json!({"prompt": "hello there", "max_tokens": 8, "temperature": 0, "stream": true}).to_string();
    let (status, before) = request(&s, "POST", "/v1/completions", plain.as_bytes());
    assert_eq!(status, 200, "{before}");
    let mut shards: Vec<std::path::PathBuf> = std::fs::read_dir(&model)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    shards.sort();
    let originals: Vec<Vec<u8>> = shards.iter().map(|p| std::fs::read(p).unwrap()).collect();
    for (path, bytes) in shards.iter().zip(&originals) {
        let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        f.set_len(bytes.len() as u64 / 2).unwrap();
    }
    for body in [&plain, &streamed, &plain] {
        let (status, text) = request(&s, "POST", "/v1/completions", body.as_bytes());
        assert_eq!(status, 500, "{text}");
        let error = &json_body(&text)["error"];
        assert_eq!(error["code"], "weights_unavailable", "{text}");
        assert!(
            error["message"].as_str().unwrap().contains(".safetensors"),
            "{text}"
        );
    }
    let (status, text) = request(&s, "GET", "/readyz", b"");
    assert_eq!(status, 503, "{text}");
    let ready = json_body(&text);
    assert_eq!(ready["status"], "degraded", "{text}");
    assert!(ready["reason"].as_str().unwrap().contains("truncated"), "{text}");
    if out_of_core {
        let (_, metrics) = request(&s, "GET", "/metrics", b"");
        let counted = metrics
            .lines()
            .filter(|l| l.starts_with("deltafin_weight_read_errors_total{file=\"model"))
            .any(|l| !l.ends_with(" 0"));
        assert!(counted, "{metrics}");
    }
    assert_eq!(request(&s, "GET", "/livez", b"").0, 200);
    for (path, bytes) in shards.iter().zip(&originals) {
        std::fs::write(path, bytes).unwrap();
    }
    assert_eq!(request(&s, "GET", "/readyz", b"").0, 200);
    let (status, after) = request(&s, "POST", "/v1/completions", plain.as_bytes());
    assert_eq!(status, 200, "{after}");
    assert_eq!(json_body(&after)["choices"], json_body(&before)["choices"]);
}

/// `/livez` fails while the engine makes no progress for longer than `--liveness-stall` with a
/// request in flight (here a step slowed to 2.5 s), and answers 200 again once it moves.
#[test]
fn livez_fails_while_the_engine_is_stalled() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("slow-model");
    DeepseekSynth::tiny(ExpertFormat::Bf16).write(&model).unwrap();
    let s = start(&model, &["--step-delay-ms", "2500", "--liveness-stall", "0.5"]);
    assert_eq!(request(&s, "GET", "/livez", b"").0, 200, "idle is live");
    let port = s.port;
    let slow = std::thread::spawn(move || {
        let body = json!({"prompt": "abc", "max_tokens": 1, "temperature": 0}).to_string();
        request_to(port, "POST", "/v1/completions", body.as_bytes()).0
    });
    let deadline = Instant::now() + Duration::from_secs(2);
    let stalled = loop {
        let (status, text) = request(&s, "GET", "/livez", b"");
        if status == 503 {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "/livez never failed during a 2.5 s step"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(json_body(&stalled)["status"], "stalled", "{stalled}");
    assert_eq!(slow.join().unwrap(), 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    while request(&s, "GET", "/livez", b"").0 != 200 {
        assert!(Instant::now() < deadline, "/livez never recovered");
        std::thread::sleep(Duration::from_millis(50));
    }
}
