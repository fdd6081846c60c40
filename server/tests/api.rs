//! In-process tests of the router (`app(state)` driven with `oneshot`, no socket): probes and
//! API answers before and after the model is loaded, and while draining.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode};
use deltafin_engine::scheduler::{ExpertIoStats, SchedulerConfig};
use deltafin_engine::synth::{DeepseekSynth, ExpertFormat};
use deltafin_server::http::openai::request::Limits;
use deltafin_server::metrics::{BuildInfo, Metrics};
use deltafin_server::{AppState, ServerConfig, app, model};
use serde_json::{Value, json};
use tower::ServiceExt;

fn state() -> AppState {
    let config = ServerConfig {
        limits: Limits {
            max_tokens: 64,
            default_completion_tokens: 16,
        },
        max_request_bytes: 1 << 16,
        api_key: None,
        keep_alive: Duration::from_secs(15),
        log_prompts: false,
        spec: deltafin_engine::spec::SpecMode::Auto,
        liveness_stall: Duration::from_secs(120),
        prep_workers: 2,
        prep_queue: 64,
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

async fn call(state: &AppState, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json");
    let req = req
        .body(body.map_or(Body::empty(), |b| Body::from(b.to_string())))
        .unwrap();
    let resp = app(state.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = to_bytes(resp.into_body(), 1 << 20).await.unwrap();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[tokio::test]
async fn not_ready_until_loaded_ready_while_serving_unready_while_draining() {
    let state = state();
    assert_eq!(call(&state, "GET", "/livez", None).await.0, StatusCode::OK);
    assert_eq!(
        call(&state, "GET", "/readyz", None).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0});
    let (status, body) = call(&state, "POST", "/v1/chat/completions", Some(chat.clone())).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["error"]["code"], "model_loading");
    assert_eq!(call(&state, "GET", "/metrics", None).await.0, StatusCode::OK);

    let dir = tempfile::tempdir().unwrap();
    let model_dir = dir.path().join("m");
    DeepseekSynth::tiny(ExpertFormat::Bf16).write(&model_dir).unwrap();
    let (loaded, _thread) = model::load(
        &model_dir,
        "m".into(),
        SchedulerConfig::default(),
        None,
        Default::default(),
        &Default::default(),
    )
    .unwrap();
    state.set_loaded(loaded);
    assert_eq!(call(&state, "GET", "/readyz", None).await.0, StatusCode::OK);
    let (status, body) = call(&state, "POST", "/v1/chat/completions", Some(chat.clone())).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    let (status, body) = call(&state, "GET", "/v1/models", None).await;
    assert_eq!((status, &body["data"][0]["id"]), (StatusCode::OK, &json!("m")));

    state.begin_drain();
    assert_eq!(
        call(&state, "GET", "/readyz", None).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let (status, body) = call(&state, "POST", "/v1/chat/completions", Some(chat)).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (StatusCode::SERVICE_UNAVAILABLE, &json!("shutting_down"))
    );
    assert_eq!(call(&state, "GET", "/livez", None).await.0, StatusCode::OK);
}
