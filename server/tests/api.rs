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

/// `/tokenize` and `/detokenize` on the `dsv3-bf16` fixture, against the ids its own Hugging
/// Face tokenizer and chat template gave (`engine/tests/fixtures/gen_dsv3_bf16.py`,
/// `golden.json["tokenizer"]`): raw prompts with and without the added BOS, a chat
/// conversation through `apply_chat_template(add_generation_prompt=True)`, and the decoded text.
#[tokio::test]
async fn tokenize_and_detokenize_match_the_models_own_tokenizer() {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/dsv3-bf16");
    let golden: Value = serde_json::from_slice(&std::fs::read(fixture.join("golden.json")).unwrap()).unwrap();
    let tok = &golden["tokenizer"];
    let state = state();
    let (loaded, _thread) = model::load(
        &fixture,
        "dsv3".into(),
        SchedulerConfig::default(),
        None,
        Default::default(),
        &Default::default(),
    )
    .unwrap();
    let max_model_len = loaded.engine.context_limit();
    state.set_loaded(loaded);
    for case in tok["cases"].as_array().unwrap() {
        let text = &case["text"];
        let (status, body) = call(
            &state,
            "POST",
            "/tokenize",
            Some(json!({"model": "dsv3", "prompt": text})),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["tokens"], case["ids_add_special_tokens"], "{text}");
        assert_eq!(
            body["count"],
            case["ids_add_special_tokens"].as_array().unwrap().len()
        );
        assert_eq!(body["max_model_len"], max_model_len);
        let plain = json!({"prompt": text, "add_special_tokens": false});
        let (_, body) = call(&state, "POST", "/tokenize", Some(plain)).await;
        assert_eq!(body["tokens"], case["ids"], "{text}");
        let (status, body) = call(
            &state,
            "POST",
            "/detokenize",
            Some(json!({"tokens": case["ids"]})),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(&body["prompt"], text);
    }
    let chat = &tok["chat"];
    let request =
        json!({"messages": chat["messages"], "add_generation_prompt": true, "return_token_strs": true});
    let (status, body) = call(&state, "POST", "/tokenize", Some(request)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["tokens"], chat["ids"]);
    assert_eq!(
        body["token_strs"].as_array().unwrap().len(),
        chat["ids"].as_array().unwrap().len()
    );
    // Without the generation prompt the ids end with the last message.
    let request = json!({"messages": chat["messages"], "add_generation_prompt": false});
    let (_, body) = call(&state, "POST", "/tokenize", Some(request)).await;
    let ids = chat["ids"].as_array().unwrap();
    assert_eq!(body["tokens"].as_array().unwrap()[..], ids[..ids.len() - 1]);
    // The ids a chat completion is generated from are the ones /tokenize shows.
    let completion = json!({"messages": chat["messages"], "max_tokens": 1, "temperature": 0});
    let (status, body) = call(&state, "POST", "/v1/chat/completions", Some(completion)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["usage"]["prompt_tokens"], ids.len());
    // Bad input: typed 400s and a model that is not served.
    for (path, body, code) in [
        ("/tokenize", json!({}), "invalid_value"),
        (
            "/tokenize",
            json!({"prompt": "x", "messages": []}),
            "invalid_value",
        ),
        (
            "/tokenize",
            json!({"prompt": "x", "tools": []}),
            "unsupported_parameter",
        ),
        (
            "/tokenize",
            json!({"messages": chat["messages"], "add_special_tokens": true}),
            "unsupported_parameter",
        ),
        ("/detokenize", json!({"tokens": [0, 99999]}), "invalid_value"),
        ("/detokenize", json!({"tokens": "x"}), "invalid_value"),
        (
            "/tokenize",
            json!({"model": "other", "prompt": "x"}),
            "model_not_found",
        ),
    ] {
        let (status, answer) = call(&state, "POST", path, Some(body.clone())).await;
        assert!(status.is_client_error(), "{body}: {status} {answer}");
        assert_eq!(answer["error"]["code"], code, "{body}: {answer}");
    }
}
