//! Hostile input over raw TCP against the real accept loop (`shutdown::serve_with` on a loopback
//! port, tiny synthetic model): broken framing, oversized targets and heads, garbage, a slow
//! head, compressed and aborted bodies, case-insensitive bearer auth and duplicated
//! credentials each get the right status and an OpenAI-shaped JSON body; and `/readyz` answers
//! 503 `draining` while an in-flight stream holds a drain open, both in-process and for the
//! `deltafin serve` binary after SIGTERM.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use deltafin_engine::scheduler::{ExpertIoStats, SchedulerConfig};
use deltafin_engine::synth::{DeepseekSynth, ExpertFormat};
use deltafin_server::http::guard::HttpLimits;
use deltafin_server::http::openai::request::Limits;
use deltafin_server::http::shutdown;
use deltafin_server::metrics::{BuildInfo, Metrics};
use deltafin_server::{AppState, ServerConfig, model};
use serde_json::Value;

/// The header-read timeout of the in-process servers (short, so the slow-head case is quick).
const HEAD_TIMEOUT: Duration = Duration::from_millis(400);

/// A served model on a loopback port; `stop` starts the drain, `done` reports the end of
/// `serve_with`.
struct Served {
    port: u16,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: mpsc::Receiver<std::io::Result<()>>,
    _dir: tempfile::TempDir,
}

impl Served {
    fn start(api_key: Option<&str>, step_delay: Duration) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let model_dir = dir.path().join("m");
        DeepseekSynth::tiny(ExpertFormat::Bf16).write(&model_dir).unwrap();
        let state = state(api_key);
        let sched = SchedulerConfig {
            step_delay,
            ..SchedulerConfig::default()
        };
        let (loaded, _thread) = model::load(
            &model_dir,
            "m".into(),
            sched,
            None,
            Default::default(),
            &Default::default(),
        )
        .unwrap();
        state.set_loaded(loaded);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (port_tx, port_rx) = mpsc::channel();
        let (done_tx, done) = mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let r = rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                port_tx.send(listener.local_addr().unwrap().port()).unwrap();
                let limits = HttpLimits {
                    header_read_timeout: HEAD_TIMEOUT,
                    ..HttpLimits::default()
                };
                let shutdown = async move {
                    let _ = stopped.await;
                };
                shutdown::serve_with(listener, state, shutdown, Duration::from_secs(20), limits).await
            });
            let _ = done_tx.send(r);
        });
        Served {
            port: port_rx.recv_timeout(Duration::from_secs(30)).unwrap(),
            stop: Some(stop),
            done,
            _dir: dir,
        }
    }

    fn connect(&self) -> TcpStream {
        let conn = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        conn
    }

    /// Send `raw` on a fresh connection and read the whole answer.
    fn exchange(&self, raw: &[u8]) -> Reply {
        let mut conn = self.connect();
        let _ = conn.write_all(raw);
        read_reply(&mut conn)
    }

    /// [`Served::exchange`], closing the sending side after `raw` (a client that gives up).
    fn exchange_cut(&self, raw: &[u8]) -> Reply {
        let mut conn = self.connect();
        let _ = conn.write_all(raw);
        let _ = conn.shutdown(Shutdown::Write);
        read_reply(&mut conn)
    }
}

fn state(api_key: Option<&str>) -> AppState {
    let config = ServerConfig {
        limits: Limits {
            max_tokens: 512,
            default_completion_tokens: 16,
        },
        max_request_bytes: 1 << 16,
        api_key: api_key.map(str::to_string),
        keep_alive: Duration::from_secs(15),
        log_prompts: false,
        spec: deltafin_engine::spec::SpecMode::Auto,
        liveness_stall: Duration::from_secs(120),
        prep_workers: 2,
        prep_queue: 64,
        malformed_calls_as_text: false,
    };
    let build = BuildInfo {
        version: "test".into(),
        device: "cpu".into(),
        spine: "native".into(),
        exact: true,
    };
    AppState::new(
        config,
        Arc::new(Metrics::new(build)),
        Arc::new(ExpertIoStats::default()),
    )
}

/// One HTTP response as read off the wire.
#[derive(Debug)]
struct Reply {
    status: u16,
    head: String,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }

    /// The status is `status`, the body is an OpenAI-shaped error whose message has `phrase`.
    fn assert_error(&self, status: u16, phrase: &str, case: &str) {
        assert_eq!(self.status, status, "{case}: {self:?}");
        let v = self.json();
        let e = &v["error"];
        let message = e["message"].as_str().unwrap_or_else(|| panic!("{case}: {v}"));
        assert!(message.contains(phrase), "{case}: {message:?} lacks {phrase:?}");
        assert_eq!(e["type"], "invalid_request_error", "{case}: {v}");
        assert!(e["param"].is_null(), "{case}: {v}");
        assert!(e["code"].is_string(), "{case}: {v}");
    }

    fn closes(&self) -> bool {
        self.head.to_ascii_lowercase().contains("\r\nconnection: close")
    }
}

/// Read to the end of the stream (the server closes after these answers).
fn read_reply(conn: &mut TcpStream) -> Reply {
    let mut raw = Vec::new();
    let _ = conn.read_to_end(&mut raw);
    parse_reply(&String::from_utf8_lossy(&raw))
}

fn parse_reply(text: &str) -> Reply {
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Reply {
        status,
        head: head.to_string(),
        body: body.to_string(),
    }
}

fn get(port: u16, path: &str) -> Reply {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let head = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    conn.write_all(head.as_bytes()).unwrap();
    read_reply(&mut conn)
}

fn post(port: u16, path: &str, body: &str) -> Reply {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(head.as_bytes()).unwrap();
    read_reply(&mut conn)
}

const CHAT: &str = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";

#[test]
fn hostile_request_heads_get_json_errors_with_the_right_status() {
    let s = Served::start(None, Duration::ZERO);
    let long_uri = format!(
        "GET /v1/models?q={} HTTP/1.1\r\nHost: x\r\n\r\n",
        "a".repeat(20_000)
    );
    let big_header = format!(
        "GET /livez HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "b".repeat(100_000)
    );
    let many_headers: String = (0..1000)
        .map(|i| format!("X-H{i}: {}\r\n", "c".repeat(90)))
        .collect();
    let many_headers = format!("GET /livez HTTP/1.1\r\nHost: x\r\n{many_headers}\r\n");
    let cases: Vec<(&str, String, u16, &str)> = vec![
        (
            "conflicting Content-Length",
            format!("{CHAT}Content-Length: 2\r\nContent-Length: 3\r\n\r\n{{}}"),
            400,
            "conflicting Content-Length",
        ),
        (
            "non-numeric Content-Length",
            format!("{CHAT}Content-Length: ten\r\n\r\n{{}}"),
            400,
            "invalid Content-Length `ten`",
        ),
        (
            "gzip before chunked",
            format!("{CHAT}Transfer-Encoding: gzip, chunked\r\n\r\n2\r\n{{}}\r\n0\r\n\r\n"),
            501,
            "`gzip` is not implemented",
        ),
        (
            "unknown transfer coding",
            format!("{CHAT}Transfer-Encoding: foo\r\n\r\n{{}}"),
            400,
            "chunked must be the final transfer coding",
        ),
        (
            "20 KB request target",
            long_uri,
            414,
            "request target is longer than the limit",
        ),
        (
            "100 KB header",
            big_header,
            431,
            "headers are larger than the limit",
        ),
        (
            "1000 headers",
            many_headers,
            431,
            "headers are larger than the limit",
        ),
        (
            "garbage",
            "HELLO\r\n\r\n".to_string(),
            400,
            "malformed request line",
        ),
        (
            "HTTP/2 preface",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_string(),
            505,
            "HTTP version",
        ),
    ];
    for (case, raw, status, phrase) in &cases {
        let reply = s.exchange(raw.as_bytes());
        reply.assert_error(*status, phrase, case);
        assert!(reply.closes(), "{case}: {}", reply.head);
    }
    let cut = s.exchange_cut(b"GET /livez HTTP/1.1\r\nHost:");
    cut.assert_error(400, "closed before the request head", "cut head");
    // Sane requests still pass, including two pipelined in one write (the replayed bytes hold
    // the second one).
    assert_eq!(get(s.port, "/v1/models").json()["data"][0]["id"], "m");
    let two =
        "GET /livez HTTP/1.1\r\nHost: x\r\n\r\nGET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let raw = {
        let mut conn = s.connect();
        conn.write_all(two.as_bytes()).unwrap();
        let mut raw = String::new();
        let _ = conn.read_to_string(&mut raw);
        raw
    };
    assert_eq!(raw.matches("HTTP/1.1 200 OK").count(), 2, "{raw}");
}

#[test]
fn a_slow_head_is_answered_408_and_closed() {
    let s = Served::start(None, Duration::ZERO);
    let mut conn = s.connect();
    let started = Instant::now();
    conn.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let reply = read_reply(&mut conn);
    reply.assert_error(408, "request head was not received within 400 ms", "slow head");
    assert!(reply.closes(), "{}", reply.head);
    let waited = started.elapsed();
    assert!(
        waited >= HEAD_TIMEOUT && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    // A silent connection is closed at the same deadline.
    let mut idle = s.connect();
    assert_eq!(read_reply(&mut idle).status, 408);
}

#[test]
fn compressed_and_aborted_bodies_say_what_is_wrong() {
    let s = Served::start(None, Duration::ZERO);
    let gzip = [0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03];
    let mut raw = format!(
        "{CHAT}Content-Encoding: gzip\r\nContent-Length: {}\r\n\r\n",
        gzip.len()
    )
    .into_bytes();
    raw.extend_from_slice(&gzip);
    let reply = s.exchange(&raw);
    reply.assert_error(415, "Content-Encoding `gzip` are not supported", "gzip body");
    let cut = format!("{CHAT}Content-Length: 1000\r\n\r\n{{\"messages\"");
    s.exchange_cut(cut.as_bytes()).assert_error(
        400,
        "request body was incomplete",
        "aborted Content-Length body",
    );
    let chunked = format!("{CHAT}Transfer-Encoding: chunked\r\n\r\n5\r\n{{\"mes\r\n");
    s.exchange_cut(chunked.as_bytes()).assert_error(
        400,
        "request body was incomplete",
        "aborted chunked body",
    );
    let json = post(s.port, "/v1/chat/completions", "{not json");
    json.assert_error(400, "invalid JSON", "malformed JSON stays a JSON error");
}

#[test]
fn the_bearer_scheme_is_case_insensitive_and_two_authorization_headers_are_400() {
    let s = Served::start(Some("s3cret"), Duration::ZERO);
    for auth in [
        "Bearer s3cret",
        "bearer s3cret",
        "BEARER s3cret",
        "Bearer \t  s3cret",
    ] {
        let raw = format!(
            "GET /v1/models HTTP/1.1\r\nHost: x\r\nauthorization: {auth}\r\nConnection: close\r\n\r\n"
        );
        let reply = s.exchange(raw.as_bytes());
        assert_eq!(reply.status, 200, "{auth:?}: {reply:?}");
    }
    let wrong =
        "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\nConnection: close\r\n\r\n";
    s.exchange(wrong.as_bytes())
        .assert_error(401, "incorrect API key", "wrong key");
    let two = "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\nAuthorization: Bearer other\r\nConnection: close\r\n\r\n";
    s.exchange(two.as_bytes()).assert_error(
        400,
        "two or more Authorization headers",
        "two Authorization headers",
    );
}

/// Open a streamed completion and read until its first token event.
fn open_stream(port: u16) -> BufReader<TcpStream> {
    let body = r#"{"prompt": "abc", "max_tokens": 80, "stream": true, "temperature": 0, "ignore_eos": true}"#;
    let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(head.as_bytes()).unwrap();
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    while !line.starts_with("data: {") {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the stream ended early");
    }
    reader
}

/// While `stream` is still in flight: `/readyz` is 503 `draining`, an API request is 503
/// `shutting_down` with `Connection: close`, `/livez` is 200; then the stream ends normally.
fn check_drain(port: u16, mut stream: BufReader<TcpStream>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let ready = loop {
        let r = get(port, "/readyz");
        if r.status != 200 || Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(ready.status, 503, "{ready:?}");
    assert_eq!(ready.json()["status"], "draining", "{ready:?}");
    let chat = post(
        port,
        "/v1/chat/completions",
        r#"{"messages": [{"role": "user", "content": "x"}]}"#,
    );
    assert_eq!(
        (chat.status, &chat.json()["error"]["code"]),
        (503, &"shutting_down".into())
    );
    assert!(chat.closes(), "{}", chat.head);
    assert_eq!(get(port, "/livez").status, 200);
    let mut rest = String::new();
    let _ = stream.read_to_string(&mut rest);
    assert!(rest.contains(r#""finish_reason":"length""#), "{rest}");
    assert!(
        rest.contains("data: [DONE]"),
        "the in-flight stream finished: {rest}"
    );
}

#[test]
fn readyz_is_503_draining_while_an_in_flight_stream_holds_the_drain() {
    let mut s = Served::start(None, Duration::from_millis(30));
    let stream = open_stream(s.port);
    s.stop.take().unwrap().send(()).unwrap();
    check_drain(s.port, stream);
    let ended = s.done.recv_timeout(Duration::from_secs(10));
    assert!(matches!(ended, Ok(Ok(()))), "serve_with ended: {ended:?}");
    assert!(
        TcpStream::connect(("127.0.0.1", s.port)).is_err(),
        "the listener closed once the drain ended"
    );
}

#[test]
fn the_binary_keeps_answering_readyz_503_after_sigterm_until_the_drain_ends() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("m");
    DeepseekSynth::tiny(ExpertFormat::Bf16).write(&model).unwrap();
    let mut child = Child(
        Command::new(env!("CARGO_BIN_EXE_deltafin"))
            .args([
                "--threads",
                "2",
                "serve",
                "--port",
                "0",
                "--step-delay-ms",
                "30",
                "--model",
            ])
            .arg(&model)
            .args(["--shutdown-timeout", "20"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let port = listening_port(&mut child.0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while get(port, "/readyz").status != 200 {
        assert!(Instant::now() < deadline, "never ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    let stream = open_stream(port);
    let term = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    check_drain(port, stream);
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the server did not exit after its drain"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
}

/// A server process, killed if a test fails while it runs.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The port `deltafin serve --port 0` printed; its later stderr is drained in the background.
fn listening_port(child: &mut std::process::Child) -> u16 {
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let port = loop {
        let line = lines.next().expect("server exited before listening").unwrap();
        if let Some(rest) = line.split("listening on 127.0.0.1:").nth(1) {
            break rest.trim().parse().unwrap();
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    port
}
