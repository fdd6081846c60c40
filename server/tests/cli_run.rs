//! `deltafin run` end to end: the real binary on synthetic checkpoints and on the built-in
//! default; malformed input gives a one-line error naming the culprit and a non-zero exit,
//! never a panic. Also `deltafin bench attention`, which needs no model.

use std::path::Path;
use std::process::{Command, Output};

use deltafin_engine::synth::{DeepseekSynth, ExpertFormat};
use serde_json::Value;

fn deltafin(args: &[&str], cache: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_deltafin"))
        .args(args)
        .env("DELTAFIN_CACHE_DIR", cache)
        .env("DELTAFIN_THREADS", "2")
        .output()
        .expect("spawn deltafin")
}

fn synth() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    DeepseekSynth::tiny(ExpertFormat::Bf16).write(dir.path()).unwrap();
    dir
}

fn assert_clean_failure(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected failure, got success; stderr: {stderr}"
    );
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains(needle),
        "stderr does not name `{needle}`: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
}

#[test]
fn json_output_has_ids_text_and_stats_and_is_reproducible() {
    let model = synth();
    let cache = tempfile::tempdir().unwrap();
    let m = model.path().to_str().unwrap();
    let args = [
        "run",
        "--model",
        m,
        "--prompt",
        "Hello there",
        "--max-new",
        "12",
        "--json",
    ];
    let out = deltafin(&args, cache.path());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object on stdout");
    assert!(!v["prompt_ids"].as_array().unwrap().is_empty());
    let output = v["output_ids"].as_array().unwrap();
    assert!(!output.is_empty() && output.len() <= 12);
    assert!(v["text"].is_string());
    assert!(v["stats"]["decode_tokens_per_second"].as_f64().is_some());
    let again: Value = serde_json::from_slice(&deltafin(&args, cache.path()).stdout).unwrap();
    assert_eq!(
        v["output_ids"], again["output_ids"],
        "greedy output must be reproducible"
    );
    // Seeded sampling is reproducible too.
    let sampled = [
        "run",
        "--model",
        m,
        "--prompt",
        "Hi",
        "--max-new",
        "8",
        "--json",
        "--temperature",
        "0.9",
        "--seed",
        "4",
    ];
    let a: Value = serde_json::from_slice(&deltafin(&sampled, cache.path()).stdout).unwrap();
    let b: Value = serde_json::from_slice(&deltafin(&sampled, cache.path()).stdout).unwrap();
    assert_eq!(a["output_ids"], b["output_ids"]);
}

#[test]
fn chat_mode_renders_the_template() {
    let model = synth();
    let cache = tempfile::tempdir().unwrap();
    let m = model.path().to_str().unwrap();
    let out = deltafin(
        &[
            "run",
            "--model",
            m,
            "--chat",
            "--prompt",
            "Hi",
            "--max-new",
            "4",
            "--json",
        ],
        cache.path(),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<u64> = v["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    // Byte-level synthetic tokenizer: specials live at 256 + K2 offset.
    assert_eq!(ids[0], 256 + 10, "system turn first (<|im_system|>)");
    assert!(
        ids.contains(&(256 + 3)) && ids.ends_with(&[256 + 17]),
        "user turn and generation prompt: {ids:?}"
    );
}

fn u64s(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// The README's first command: the trained default prints readable English (no reserved-token
/// noise) and its greedy tokens are HF's (the golden's prompt and path).
#[test]
fn builtin_default_model_prints_readable_english() {
    let cache = tempfile::tempdir().unwrap();
    let out = deltafin(
        &[
            "run",
            "--prompt",
            "Once upon a time",
            "--max-new",
            "32",
            "--stats",
        ],
        cache.path(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("tok/s"), "{stderr}");
    assert!(!stderr.contains("SYNTHETIC"), "{stderr}");
    let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(
        !text.contains("<|") && !text.contains('\u{fffd}'),
        "noise: {text}"
    );
    let words: Vec<&str> = text
        .split(|c: char| !c.is_ascii_alphabetic())
        .filter(|w| !w.is_empty())
        .collect();
    let common = [
        "the", "and", "of", "to", "a", "her", "was", "in", "he", "she", "it", "had", "not", "be",
    ];
    let known = words.iter().filter(|w| common.contains(w)).count();
    assert!(words.len() >= 16 && known >= 4, "not English-looking: {text}");

    let golden: Value = serde_json::from_slice(
        &std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/assets/austen-moe/golden.json"))
            .unwrap(),
    )
    .unwrap();
    let prompt = golden["prompt_text"].as_str().unwrap();
    let want = u64s(&golden["greedy"]["output_ids"]);
    let n = want.len().to_string();
    let out = deltafin(
        &["run", "--prompt", prompt, "--max-new", &n, "--json"],
        cache.path(),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        got["prompt_ids"], golden["prompt_ids"],
        "the prompt encodes as HF's"
    );
    let ids = u64s(&got["output_ids"]);
    assert_eq!(ids, want, "the binary's greedy path is HF's");
}

#[test]
fn builtin_k3_preset_says_its_weights_are_synthetic() {
    let cache = tempfile::tempdir().unwrap();
    let out = deltafin(
        &[
            "run",
            "--model",
            "builtin:k3",
            "--prompt",
            "Hello",
            "--max-new",
            "4",
        ],
        cache.path(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("SYNTHETIC"), "{stderr}");
    let out = deltafin(&["run", "--model", "builtin:gpt", "--prompt", "x"], cache.path());
    assert_clean_failure(&out, "builtin:k3");
}

#[test]
fn bad_inputs_fail_with_named_causes() {
    let cache = tempfile::tempdir().unwrap();
    // Missing tokenizer file.
    let model = synth();
    std::fs::remove_file(model.path().join("tiktoken.model")).unwrap();
    let out = deltafin(
        &["run", "--model", model.path().to_str().unwrap(), "--prompt", "x"],
        cache.path(),
    );
    assert_clean_failure(&out, "tokenizer");
    // Truncated shard.
    let model = synth();
    let shard = model.path().join("model-00001-of-00002.safetensors");
    let len = std::fs::metadata(&shard).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let out = deltafin(
        &["run", "--model", model.path().to_str().unwrap(), "--prompt", "x"],
        cache.path(),
    );
    assert_clean_failure(&out, "model-00001-of-00002.safetensors");
    // Unknown model_type.
    let model = synth();
    let cfg = model.path().join("config.json");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("\"deepseek_v3\"", "\"gpt_neox\"");
    std::fs::write(&cfg, text).unwrap();
    let out = deltafin(
        &["run", "--model", model.path().to_str().unwrap(), "--prompt", "x"],
        cache.path(),
    );
    assert_clean_failure(&out, "gpt_neox");
    // Nonexistent directory and an invalid sampling value.
    let out = deltafin(
        &["run", "--model", "/nonexistent/model", "--prompt", "x"],
        cache.path(),
    );
    assert_clean_failure(&out, "/nonexistent/model");
    let model = synth();
    let out = deltafin(
        &[
            "run",
            "--model",
            model.path().to_str().unwrap(),
            "--prompt",
            "x",
            "--top-p",
            "0",
        ],
        cache.path(),
    );
    assert_clean_failure(&out, "top_p");
}

/// A device this build or machine cannot provide: `run` fails up front with a one-line error
/// naming the device, and `doctor --device cuda` reports a failed `device` check (the same test
/// on a GPU build and machine would pass both; `bench/cuda.sh` covers that).
#[test]
fn an_unavailable_device_fails_closed() {
    let cache = tempfile::tempdir().unwrap();
    let model = synth();
    let dir = model.path().to_str().unwrap();
    let out = deltafin(
        &["--device", "cuda", "run", "--model", dir, "--prompt", "hi"],
        cache.path(),
    );
    if out.status.success() {
        return; // a CUDA build on a GPU machine
    }
    assert_clean_failure(&out, "device cuda:0: ");
    let out = deltafin(
        &["--device", "cuda:1", "doctor", "--json", "--dir", dir],
        cache.path(),
    );
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let checks = report["checks"].as_array().unwrap();
    let device = checks
        .iter()
        .find(|c| c["name"] == "device")
        .expect("a device check");
    assert_eq!(device["ok"], false);
    assert!(
        device["detail"].as_str().unwrap().starts_with("device cuda:1: "),
        "{device}"
    );
    assert_eq!(report["usable"], false);
    assert!(report["verdict"].as_str().unwrap().contains("device"), "{report}");
    let out = deltafin(
        &["--device", "cpu", "doctor", "--json", "--dir", dir],
        cache.path(),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert!(!names.contains(&"device"), "the CPU needs no check: {names:?}");
}

#[test]
fn bench_attention_prints_a_figure_per_length_and_refuses_a_chunk_longer_than_the_prompt() {
    let cache = tempfile::tempdir().unwrap();
    let args = [
        "bench",
        "attention",
        "--lengths",
        "64,300",
        "--rows",
        "16",
        "--repeats",
        "1",
    ];
    let out = deltafin(
        &[
            &args[..],
            &["--heads", "3", "--latent", "40", "--rope", "8", "--json"],
        ]
        .concat(),
        cache.path(),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let figures: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let lengths: Vec<u64> = figures.iter().map(|f| f["length"].as_u64().unwrap()).collect();
    assert_eq!(lengths, [64, 300]);
    for f in &figures {
        assert!(f["gflops"].as_f64().unwrap() > 0.0, "{f}");
    }
    let out = deltafin(
        &["bench", "attention", "--lengths", "8", "--rows", "16"],
        cache.path(),
    );
    assert_clean_failure(&out, "below --rows");
}

/// `doctor --write-checksums` records every tensor's checksum; `run` in memory (verified at
/// load) then refuses a checkpoint with one flipped byte, naming the tensor (out of core every
/// read is verified: `engine/tests/out_of_core.rs`); `doctor --verify` finds it too;
/// `--verify-weights off` runs as before, and `on` refuses an install without checksums.
#[test]
fn checksums_recorded_by_doctor_catch_a_flipped_byte() {
    use std::os::unix::fs::FileExt;
    let model = synth();
    let cache = tempfile::tempdir().unwrap();
    let m = model.path().to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--model",
            m,
            "--prompt",
            "Hello there",
            "--max-new",
            "4",
            "--json",
        ];
        args.extend_from_slice(extra);
        deltafin(&args, cache.path())
    };
    let out = run(&["--verify-weights", "on"]);
    assert_clean_failure(&out, "doctor --write-checksums");
    let out = deltafin(&["doctor", "--dir", m, "--write-checksums"], cache.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("checksums: recorded xxh3-64"), "{stderr}");
    let clean = run(&["--memory-budget", "off"]);
    assert!(
        clean.status.success(),
        "{}",
        String::from_utf8_lossy(&clean.stderr)
    );
    // One byte in the middle of an expert's weight.
    let index = deltafin_engine::weights::WeightIndex::open(model.path()).unwrap();
    let name = index
        .names()
        .filter(|n| n.contains(".experts.") && n.ends_with("down_proj.weight"))
        .min()
        .unwrap()
        .to_string();
    let info = index.info(&name).unwrap();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(index.shard_path(info))
        .unwrap();
    let at = info.offset + info.len / 2;
    let mut b = [0u8];
    file.read_exact_at(&mut b, at).unwrap();
    file.write_all_at(&[!b[0]], at).unwrap();
    drop(index);
    assert_clean_failure(&run(&["--memory-budget", "off"]), &name);
    let out = deltafin(&["doctor", "--dir", m, "--verify", "--json"], cache.path());
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains(&name));
    let off = run(&["--memory-budget", "off", "--verify-weights", "off"]);
    assert!(off.status.success(), "{}", String::from_utf8_lossy(&off.stderr));
    file.write_all_at(&b, at).unwrap();
    let restored = run(&["--memory-budget", "off"]);
    assert!(restored.status.success());
    let ids = |o: &Output| serde_json::from_slice::<Value>(&o.stdout).unwrap()["output_ids"].clone();
    assert_eq!(ids(&restored), ids(&clean));
}

/// `bench compress` measures every stored format of a checkpoint: a zstd ratio and decode rate
/// per format (16-bit floats also as byte planes) and the I/O bound it would give.
#[test]
fn bench_compress_reports_every_stored_format() {
    let model = synth();
    let cache = tempfile::tempdir().unwrap();
    let m = model.path().to_str().unwrap();
    let out = deltafin(
        &["bench", "compress", "--model", m, "--sample-mib", "1", "--json"],
        cache.path(),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    let formats = r["formats"].as_array().unwrap();
    let bf16 = formats
        .iter()
        .find(|f| f["dtype"] == "BF16")
        .expect("the synthetic model stores BF16");
    let names: Vec<&str> = bf16["codecs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["zstd-1", "planes+zstd-1"]);
    for f in formats {
        for c in f["codecs"].as_array().unwrap() {
            let ratio = c["ratio"].as_f64().unwrap();
            assert!(ratio > 0.0 && ratio < 2.0, "{c}");
            assert!(c["decode_gb_s"].as_f64().unwrap() > 0.0, "{c}");
        }
    }
    let ratio = r["ratio"].as_f64().unwrap();
    assert!(ratio > 0.0 && ratio <= 1.1, "{r}");
    assert!(r["effective_gib_s_compressed"].as_f64().unwrap() > 0.0);
    let out = deltafin(&["bench", "compress", "--model", "/nonexistent/m"], cache.path());
    assert_clean_failure(&out, "/nonexistent/m");
}

/// `bench serve` out of core reports the per-step bound beside what it measured: the union of
/// the step's routed experts per layer, the ideal disk bytes per token the cache size allows, and
/// the tokens per second the reader's busy rate allows.
#[test]
fn bench_serve_reports_the_step_bound_out_of_core() {
    let model = synth();
    let cache = tempfile::tempdir().unwrap();
    let m = model.path().to_str().unwrap();
    let args = [
        "bench",
        "serve",
        "--model",
        m,
        "--streams",
        "1,4",
        "--tokens",
        "6",
        "--prompt-tokens",
        "4",
    ];
    let out = deltafin(
        &[&args[..], &["--memory-budget", "34300000", "--json"]].concat(),
        cache.path(),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    let levels = r["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 2);
    let top_k = DeepseekSynth::tiny(ExpertFormat::Bf16).top_k as f64;
    for l in levels {
        let rows = l["mean_batch_rows"].as_f64().unwrap();
        let union = l["union_experts_per_layer_step"].as_f64().unwrap();
        assert!(union > 0.0 && union <= top_k * rows.ceil() + 1e-9, "{l}");
        let ideal = l["ideal_disk_bytes_per_token"].as_f64().unwrap();
        let fraction = l["cache_fraction"].as_f64().unwrap();
        let want = l["union_bytes_per_token"].as_f64().unwrap() * (1.0 - fraction);
        assert!((ideal - want).abs() <= 1e-6 * want.max(1.0), "{l}");
        assert!(l["io_bound_tokens_per_second"].as_f64().unwrap() > 0.0, "{l}");
        assert!(l["fraction_of_io_bound"].as_f64().unwrap() > 0.0, "{l}");
    }
    // In memory there is no bound to report.
    let out = deltafin(
        &[&args[..], &["--memory-budget", "off", "--json"]].concat(),
        cache.path(),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        r["levels"][0].get("union_experts_per_layer_step").is_none(),
        "{r}"
    );
}

/// `synth --routing published` writes routers whose consecutive tokens share experts well above
/// chance (the published band is 29.5-41.3 %), where `uniform` stays at chance (top-4 of 16:
/// 25 %); `bench serve` measures both (one stream: the previous pass is the previous token).
#[test]
fn synth_routing_models_give_the_reuse_bench_serve_measures() {
    let cache = tempfile::tempdir().unwrap();
    let reuse = |routing: &str| {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("m");
        let o = out.to_str().unwrap();
        let w = deltafin(
            &["synth", "--preset", "builtin", "--routing", routing, "--out", o],
            cache.path(),
        );
        assert!(w.status.success(), "{}", String::from_utf8_lossy(&w.stderr));
        let args = ["bench", "serve", "--model", o, "--streams", "1", "--tokens", "64"];
        let r = deltafin(
            &[&args[..], &["--memory-budget", "40M", "--json"]].concat(),
            cache.path(),
        );
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        let v: Value = serde_json::from_slice(&r.stdout).unwrap();
        v["levels"][0]["previous_pass_reuse"].as_f64().unwrap()
    };
    let (uniform, published) = (reuse("uniform"), reuse("published"));
    assert!((0.17..=0.33).contains(&uniform), "uniform {uniform}");
    assert!(
        (0.3..=0.5).contains(&published) && published > uniform + 0.06,
        "published {published}, uniform {uniform}"
    );
    let bad = deltafin(&["synth", "--routing", "zipf", "--out", "/tmp/x"], cache.path());
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("uniform, published"));
}

/// `deltafin plan` prints the residency plan `serve` would make for the given memory and the
/// predicted tokens/s from the measured kernel cost: the plan matches the one the loader makes
/// (`bench serve` prints it), more memory reads fewer bytes, the box's figures are named as
/// given, and bad input fails with the flag named.
#[test]
fn plan_predicts_from_the_loaders_plan_and_names_its_inputs() {
    let model = synth();
    let cache = tempfile::tempdir().unwrap();
    let m = model.path().to_str().unwrap();
    let plan = |ram: &str| {
        let args = [
            "plan",
            "--model",
            m,
            "--ram",
            ram,
            "--disk-gbps",
            "1.5",
            "--cores",
            "4",
        ];
        let out = deltafin(
            &[&args[..], &["--context-memory", "0", "--json"]].concat(),
            cache.path(),
        );
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let (small, large) = (plan("34300000"), plan("1G"));
    assert_eq!(small["budget"]["source"], "given");
    assert_eq!(small["disk_bytes_per_second"]["value"].as_f64(), Some(1.5e9));
    assert_eq!(
        small["disk_probes"],
        serde_json::json!([]),
        "a given bandwidth is not probed"
    );
    assert_eq!(small["cores"]["value"].as_u64(), Some(4));
    // Measured: the figure is the median of three probes.
    let args = [
        "plan",
        "--model",
        m,
        "--ram",
        "1G",
        "--cores",
        "4",
        "--context-memory",
        "0",
        "--json",
    ];
    let out = deltafin(&args, cache.path());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let measured = serde_json::from_slice::<Value>(&out.stdout).unwrap();
    let mut probes: Vec<f64> = measured["disk_probes"]
        .as_array()
        .expect("probes")
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    probes.sort_by(f64::total_cmp);
    assert_eq!(probes.len(), 3, "{measured}");
    assert!(probes[0] > 0.0);
    assert_eq!(
        measured["disk_bytes_per_second"]["value"].as_f64(),
        Some(probes[1])
    );
    let tiny = DeepseekSynth::tiny(ExpertFormat::Bf16);
    assert_eq!(small["layout"]["top_k"].as_u64(), Some(tiny.top_k as u64));
    assert_eq!(large["plan"]["cache_fraction"].as_f64(), Some(1.0));
    // The loader's own plan at the same budget has the same expert slots.
    let out = deltafin(
        &[
            "bench",
            "serve",
            "--model",
            m,
            "--streams",
            "1",
            "--tokens",
            "2",
            "--prompt-tokens",
            "2",
            "--memory-budget",
            "34300000",
            "--json",
        ],
        cache.path(),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let served: Value = serde_json::from_slice(&out.stdout).unwrap();
    let fraction = served["levels"][0]["cache_fraction"].as_f64().unwrap();
    assert_eq!(small["plan"]["cache_fraction"].as_f64(), Some(fraction));
    let field = |r: &Value, kind: &str, streams: u64, name: &str| {
        r["predictions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["kind"] == kind && p["streams"].as_u64() == Some(streams))
            .map(|p| p[name].as_f64().unwrap())
            .unwrap()
    };
    // Each run times the kernels anew, so rates are compared within a run; bytes across runs.
    for (kind, s) in [("decode", 1), ("decode", 8), ("prefill", 1)] {
        assert!(field(&small, kind, s, "tokens_per_second") > 0.0);
        let disk = |r: &Value| field(r, kind, s, "disk_bytes");
        assert!(disk(&large) < disk(&small), "{kind} {s}: more memory reads less");
    }
    let rate = |kind, s| field(&small, kind, s, "tokens_per_second");
    assert!(rate("decode", 8) > rate("decode", 1), "streams share experts");
    let out = deltafin(
        &["plan", "--model", m, "--ram", "1K", "--disk-gbps", "1"],
        cache.path(),
    );
    assert_clean_failure(&out, "too small");
    let out = deltafin(&["plan", "--model", m, "--disk-gbps", "0"], cache.path());
    assert_clean_failure(&out, "--disk-gbps");
    let out = deltafin(&["plan", "--model", "/nonexistent/m"], cache.path());
    assert_clean_failure(&out, "/nonexistent/m");
}
