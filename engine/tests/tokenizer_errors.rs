//! Missing and malformed tokenizer files give typed errors naming the file; arbitrary input
//! never panics.

mod tokenizer_support;

use std::path::{Path, PathBuf};

use deltafin_engine::Error;
use deltafin_engine::tokenizer::{ChatMessage, ChatOptions, IncrementalDecoder, Tokenizer};
use tokenizer_support::*;

/// A temp dir holding copies of a fixture's files.
fn copy_fixture(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap();
        if file != "golden.json" {
            std::fs::copy(&path, dir.path().join(file)).unwrap();
        }
    }
    dir
}

/// The path and reason of an `Error::Tokenizer`, or a panic.
fn tokenizer_error(result: deltafin_engine::Result<Tokenizer>) -> (PathBuf, String) {
    match result {
        Err(Error::Tokenizer { path, reason }) => (path, reason),
        Err(other) => panic!("expected Error::Tokenizer, got {other:?}"),
        Ok(_) => panic!("expected an error"),
    }
}

fn edit(path: &Path, f: impl FnOnce(String) -> String) {
    let text = std::fs::read_to_string(path).unwrap();
    std::fs::write(path, f(text)).unwrap();
}

#[test]
fn missing_directory_or_files_name_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let (path, reason) = tokenizer_error(Tokenizer::from_dir(dir.path()));
    assert_eq!(path, dir.path());
    assert!(
        reason.contains("tiktoken.model") && reason.contains("tokenizer.json"),
        "{reason}"
    );
    let missing = dir.path().join("nope");
    let (path, reason) = tokenizer_error(Tokenizer::from_dir(&missing));
    assert_eq!(path, missing);
    assert!(reason.contains("not a directory"), "{reason}");
    let message = Tokenizer::from_dir(&missing).unwrap_err().to_string();
    assert!(
        message.contains("nope") && message.contains("tokenizer"),
        "{message}"
    );
}

#[test]
fn malformed_tiktoken_model_names_the_file() {
    type Corruption = (&'static str, fn(String) -> String);
    let cases: [Corruption; 6] = [
        ("invalid base64", |t| t.replacen(' ', "!! ", 1)),
        ("out of range", |t| {
            t.lines()
                .filter(|l| !l.ends_with(" 300"))
                .collect::<Vec<_>>()
                .join("\n")
        }),
        ("appears twice", |t| {
            // Give rank 1023 the bytes of rank 0.
            let first = t.lines().next().unwrap().split(' ').next().unwrap().to_owned();
            let lines = t.lines().map(|l| {
                if l.ends_with(" 1023") {
                    format!("{first} 1023")
                } else {
                    l.to_owned()
                }
            });
            lines.collect::<Vec<_>>().join("\n")
        }),
        ("0x21", |t| t.replacen("IQ== 0", "ISE= 0", 1)),
        ("expected", |t| t.replacen(" 5\n", " 5 extra\n", 1)),
        ("no ranks", |_| String::new()),
    ];
    for (want, corrupt) in cases {
        let dir = copy_fixture("kimi_tiny");
        let model = dir.path().join("tiktoken.model");
        edit(&model, corrupt);
        let (path, reason) = tokenizer_error(Tokenizer::from_dir(dir.path()));
        assert_eq!(path, model, "{want}");
        assert!(reason.contains(want), "want `{want}` in: {reason}");
    }
}

#[test]
fn malformed_tokenizer_config_names_the_file() {
    let dir = copy_fixture("kimi_tiny");
    let config = dir.path().join("tokenizer_config.json");
    edit(&config, |t| t.replacen('{', "{,", 1));
    match Tokenizer::from_dir(dir.path()) {
        Err(Error::Json { path, .. }) => assert_eq!(path, config),
        other => panic!("expected Error::Json, got {other:?}"),
    }
    let dir = copy_fixture("kimi_tiny");
    let config = dir.path().join("tokenizer_config.json");
    edit(&config, |t| t.replacen("\"1024\": {", "\"not-an-id\": {", 1));
    let (path, reason) = tokenizer_error(Tokenizer::from_dir(dir.path()));
    assert_eq!(path, config);
    assert!(reason.contains("not an id"), "{reason}");
    let dir = copy_fixture("kimi_tiny");
    let config = dir.path().join("tokenizer_config.json");
    edit(&config, |t| {
        t.replacen("\"bos_token\": \"[BOS]\"", "\"bos_token\": \"<nope>\"", 1)
    });
    let (path, reason) = tokenizer_error(Tokenizer::from_dir(dir.path()));
    assert_eq!(path, config);
    assert!(
        reason.contains("bos_token") && reason.contains("<nope>"),
        "{reason}"
    );
}

#[test]
fn broken_chat_templates_name_their_file() {
    let dir = copy_fixture("kimi_tiny");
    let config = dir.path().join("tokenizer_config.json");
    edit(&config, |t| {
        t.replacen("{%- if tools -%}", "{%- if tools -%}{% for %}", 1)
    });
    let (path, reason) = tokenizer_error(Tokenizer::from_dir(dir.path()));
    assert_eq!(path, config);
    assert!(reason.contains("chat template"), "{reason}");
    // chat_template.jinja takes precedence over the config's template.
    let jinja = dir.path().join("chat_template.jinja");
    std::fs::write(&jinja, "{{ messages[0].content }}|{{ bos_token }}").unwrap();
    let t = Tokenizer::from_dir(dir.path()).unwrap();
    let rendered = t
        .render_chat(&[ChatMessage::new("user", "hi")], &ChatOptions::default())
        .unwrap();
    assert_eq!(rendered, "hi|[BOS]");
    std::fs::write(&jinja, "{% if %}").unwrap();
    let (path, _) = tokenizer_error(Tokenizer::from_dir(dir.path()));
    assert_eq!(path, jinja);
}

#[test]
fn malformed_tokenizer_json_names_the_file() {
    let dir = copy_fixture("deepseek_tiny");
    let json = dir.path().join("tokenizer.json");
    edit(&json, |t| t[..t.len() / 2].to_owned());
    let (path, reason) = tokenizer_error(Tokenizer::from_dir(dir.path()));
    assert_eq!(path, json);
    assert!(!reason.is_empty());
    let dir = copy_fixture("deepseek_tiny");
    let json = dir.path().join("tokenizer.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    v["decoder"] = serde_json::json!({"type": "Fuse"});
    std::fs::write(&json, v.to_string()).unwrap();
    let (path, reason) = tokenizer_error(Tokenizer::from_dir(dir.path()));
    assert_eq!(path, json);
    assert!(reason.contains("unsupported decoder"), "{reason}");
}

#[test]
fn optional_files_may_be_absent() {
    let dir = copy_fixture("kimi_tiny");
    std::fs::remove_file(dir.path().join("tokenizer_config.json")).unwrap();
    let t = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!((t.bos_id(), t.eos_id()), (None, None));
    assert!(t.chat_template().is_none());
    assert_eq!(t.token_to_id("<|reserved_token_1026|>"), Some(1026));
    assert!(matches!(
        t.encode_chat(&[ChatMessage::new("user", "x")], &ChatOptions::default()),
        Err(Error::Template(_))
    ));
    let dir = copy_fixture("deepseek_tiny");
    std::fs::remove_file(dir.path().join("tokenizer_config.json")).unwrap();
    let t = Tokenizer::from_dir(dir.path()).unwrap();
    assert!(t.chat_template().is_none() && t.bos_id().is_none());
    assert_eq!(t.encode("hello"), load_tokenizer("deepseek_tiny").encode("hello"));
}

#[test]
fn tiktoken_model_wins_over_tokenizer_json() {
    let dir = copy_fixture("kimi_tiny");
    std::fs::copy(
        fixture("deepseek_tiny/tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    let t = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(t.vocab_size(), load_tokenizer("kimi_tiny").vocab_size());
}

/// xorshift64*, for reproducible pseudo-random inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[test]
fn arbitrary_input_never_panics() {
    let alphabet: Vec<char> = " \t\n\r\u{1c}\u{a0}\u{3000}aZ9'!<|>_世界😀\u{301}\u{F0000}\u{F0001}é١"
        .chars()
        .collect();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for name in ["kimi_tiny", "deepseek_tiny"] {
        let t = load_tokenizer(name);
        let vocab = t.vocab_size() as u64;
        for round in 0..300 {
            let len = (rng.next() % 64) as usize;
            let mut text: String = (0..len)
                .map(|_| alphabet[(rng.next() % alphabet.len() as u64) as usize])
                .collect();
            if round % 3 == 0 {
                text.push_str(["<|im_end|>", "<｜end▁of▁sentence｜>", "<｜User｜>", "</think>"][round % 4]);
            }
            let plain = t.encode(&text);
            let special = t.encode_with_special(&text);
            if name == "kimi_tiny" {
                assert_eq!(t.decode(&plain), text);
            }
            assert!(plain.iter().chain(&special).all(|&id| (id as u64) < vocab));
            let messages = vec![ChatMessage::new("user", text.clone())];
            let ids = t
                .encode_chat(
                    &messages,
                    &ChatOptions {
                        add_generation_prompt: true,
                        ..Default::default()
                    },
                )
                .unwrap();
            assert!(ids.iter().all(|&id| (id as u64) < vocab));
            let random: Vec<u32> = (0..len).map(|_| (rng.next() % (vocab + 10)) as u32).collect();
            let mut dec = IncrementalDecoder::new(&t);
            let mut streamed: String = random.iter().filter_map(|&id| dec.push(id)).collect();
            streamed.extend(dec.flush());
            assert_eq!(streamed, t.decode(&random));
        }
    }
}
