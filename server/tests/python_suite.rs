//! Runs the pytest suite in `tests/python/` (the official `openai` client against the real
//! `deltafin serve` binary on loopback) on a tiny synthetic model. The suite needs a Python with
//! `openai`, `httpx` and `pytest`: `scripts/test-server` installs one and points
//! `DELTAFIN_TEST_PYTHON` at it. Without that variable this test says so and passes — unless
//! `DELTAFIN_REQUIRE_SERVICES=1` (as `scripts/test-all` sets it), where it fails.

use std::path::Path;
use std::process::Command;

use deltafin_engine::synth::{DSparkSynth, DeepseekSynth, ExpertFormat};

#[test]
fn openai_client_suite() {
    let Some(python) = std::env::var_os("DELTAFIN_TEST_PYTHON") else {
        let required = std::env::var("DELTAFIN_REQUIRE_SERVICES").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "DELTAFIN_TEST_PYTHON is not set and DELTAFIN_REQUIRE_SERVICES=1 (run scripts/install-test-deps)"
        );
        eprintln!("skipped: DELTAFIN_TEST_PYTHON is not set (run scripts/test-server)");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny-deepseek");
    DeepseekSynth::tiny(ExpertFormat::Bf16).write(&model).unwrap();
    // Drafts where `deltafin setup` installs them: a draft head made for this model and the
    // Qwen3 drafter fixture (a different tokenizer: its drafts are translated through text).
    let info = deltafin_engine::arch::load(&model).unwrap().info().clone();
    DSparkSynth::for_target(&info, 9)
        .write(&model.join("drafts/dspark"))
        .unwrap();
    let qwen = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/qwen3");
    let qwen_dst = model.join("drafts/qwen");
    std::fs::create_dir_all(&qwen_dst).unwrap();
    for entry in std::fs::read_dir(&qwen).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, qwen_dst.join(path.file_name().unwrap())).unwrap();
    }
    // The built-in K3 preset (Kimi K3: XTML chat format and tool calls).
    let k3 = tmp.path().join("builtin-k3");
    deltafin_engine::synth::KimiK3Synth::k3_builtin()
        .write(&k3)
        .unwrap();
    let suite = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python");
    let mut cmd = Command::new(python);
    cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .args(
            std::env::var("DELTAFIN_PYTEST_ARGS")
                .ok()
                .iter()
                .flat_map(|a| a.split_whitespace()),
        )
        .current_dir(&suite)
        .env("DELTAFIN_BIN", env!("CARGO_BIN_EXE_deltafin"))
        .env("DELTAFIN_TEST_MODEL", &model)
        .env("DELTAFIN_TEST_K3_MODEL", &k3);
    let status = cmd.status().expect("running pytest");
    assert!(status.success(), "the pytest suite failed");
}
