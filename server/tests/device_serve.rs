//! A whole served request on a device: the HTTP app (`app(state)`, in process) over a model that
//! `model::load_placed` put on the CPU emulator of the CUDA kernel sources (`arch::DeviceModel`
//! over the emulator's `DeviceOps`), against the same app over the CPU model. Three chat
//! completions at once (batched passes; greedy and seeded sampling, with log-probabilities),
//! then the next turn of the first conversation (its state reused): the same choices, token for
//! token, and token counts.
//!
//! Needs g++ (skipped without it, unless `DELTAFIN_REQUIRE_SERVICES=1`).

#[path = "../../engine/tests/emulator_support/mod.rs"]
mod emulator_support;

use std::sync::Arc;

use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode};
use deltafin_engine::arch::{DeviceModel, Model};
use deltafin_engine::scheduler::{ExpertIoStats, SchedulerConfig};
use deltafin_engine::synth::{DeepseekSynth, ExpertFormat};
use deltafin_server::metrics::{BuildInfo, Metrics};
use deltafin_server::model::{self, LoadError, Place};
use deltafin_server::{AppState, ServerConfig, app};
use emulator_support::EmuDevice;
use serde_json::{Value, json};
use tower::ServiceExt;

/// A ready app serving the checkpoint in `dir`, placed by `place`.
fn serving(dir: &std::path::Path, place: Place<'_>) -> AppState {
    let build = BuildInfo {
        version: "test".into(),
        device: "test".into(),
        spine: "native".into(),
        exact: true,
    };
    let state = AppState::new(
        ServerConfig::default(),
        Arc::new(Metrics::new(build)),
        Arc::new(ExpertIoStats::default()),
    );
    let cfg = SchedulerConfig {
        max_batch: 3,
        prefill_chunk: 6,
        ..Default::default()
    };
    let checks = (None, Default::default());
    let (loaded, _engine) =
        model::load_placed(dir, "m".into(), cfg, checks, &Default::default(), place).unwrap();
    state.set_loaded(loaded);
    state
}

async fn chat(state: &AppState, body: Value) -> Value {
    let req = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = app(state.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = to_bytes(resp.into_body(), 1 << 20).await.unwrap();
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

/// The choices and token counts of three chat completions sent at once, then of the first
/// conversation's next turn. (Not `cached_tokens`: how much of a prompt a request finds in the
/// reuse cache depends on when the others of its batch got there, on any device.)
async fn conversation(state: &AppState) -> Vec<Value> {
    let request = |i: usize, messages: Value| {
        let mut r = json!({"messages": messages, "max_tokens": 8, "logprobs": true, "top_logprobs": 2});
        if i.is_multiple_of(2) {
            r["temperature"] = json!(0);
        } else {
            r["temperature"] = json!(0.8);
            r["seed"] = json!(7 + i);
        }
        r
    };
    let first =
        |i: usize| json!([{"role": "user", "content": format!("Question {i}: what comes after {i}?")}]);
    let answers = futures_util::future::join_all((0..3).map(|i| chat(state, request(i, first(i))))).await;
    let counted = |a: &Value| {
        let u = &a["usage"];
        json!([a["choices"], u["prompt_tokens"], u["completion_tokens"]])
    };
    let mut out: Vec<Value> = answers.iter().map(counted).collect();
    let mut next = first(0);
    let reply = answers[0]["choices"][0]["message"]["content"].clone();
    next.as_array_mut().unwrap().extend([
        json!({"role": "assistant", "content": reply}),
        json!({"role": "user", "content": "And after that?"}),
    ]);
    let again = chat(state, request(0, next)).await;
    out.push(counted(&again));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_completions_served_on_the_device_give_the_cpu_tokens() {
    let Some(bin) = emulator_support::compile("emulate_layers.cpp", "deltafin-serve-device") else {
        return;
    };
    let dev: &'static EmuDevice = Box::leak(Box::new(EmuDevice::new(&bin)));
    let dir = tempfile::tempdir().unwrap();
    DeepseekSynth::tiny(ExpertFormat::Fp8).write(dir.path()).unwrap();
    let on_cpu = |m: Box<dyn Model>, _: &SchedulerConfig| Ok(m);
    let on_device = |m: Box<dyn Model>, cfg: &SchedulerConfig| {
        let served = DeviceModel::new(m, dev, (model::device_slots(cfg), 256)).map_err(LoadError::Model)?;
        Ok(Box::new(served) as Box<dyn Model>)
    };
    let want = conversation(&serving(dir.path(), &on_cpu)).await;
    let got = conversation(&serving(dir.path(), &on_device)).await;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "request {i}: {}", first_difference(g, w, String::new()));
    }
    assert_eq!(got.len(), want.len());
    let launches = dev.launches.load(std::sync::atomic::Ordering::Relaxed);
    assert!(launches > 100, "the device ran the passes ({launches} launches)");
}

/// Where `a` and `b` first differ (a JSON path and both values), for the failure message.
fn first_difference(a: &Value, b: &Value, at: String) -> String {
    match (a, b) {
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find(|(_, (p, q))| p != q)
            .map_or(String::new(), |(i, (p, q))| {
                first_difference(p, q, format!("{at}[{i}]"))
            }),
        (Value::Object(x), Value::Object(y)) if x.keys().eq(y.keys()) => x
            .iter()
            .find(|(k, v)| y.get(*k) != Some(v))
            .map_or(String::new(), |(k, v)| {
                first_difference(v, &y[k], format!("{at}.{k}"))
            }),
        _ => format!("{at}: {a} vs {b}"),
    }
}
