use serde_json::json;

use super::*;

const LIMITS: Limits = Limits {
    max_tokens: 1000,
    default_completion_tokens: 16,
};

fn messages(extra: Value) -> Result<ChatRequest, ApiError> {
    let mut body = json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    parse(&body, &LIMITS, false)
}

use crate::http::error::param_of as param;

#[test]
fn a_full_request_becomes_a_typed_chat_request() {
    let r = messages(json!({
        "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "really"}],
        "temperature": 0.5, "top_p": 0.9, "top_k": 40, "stop_sequences": ["END"], "stream": true,
        "metadata": {"user_id": "u"}, "thinking": {"type": "disabled"},
        "tools": [{"name": "get_weather", "description": "d", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true},
    }))
    .unwrap();
    assert_eq!(r.common.max_tokens, Some(10));
    assert_eq!(
        (
            r.common.sampling.temperature,
            r.common.sampling.top_p,
            r.common.sampling.top_k
        ),
        (0.5, 0.9, 40)
    );
    assert_eq!(r.common.stop, vec!["END"]);
    assert!(r.common.stream);
    assert_eq!(r.template_kwargs["thinking"], json!(false));
    assert_eq!(r.template_kwargs["enable_thinking"], json!(false));
    assert_eq!(
        r.messages,
        vec![
            ChatMessage::new("system", "be brief\nreally"),
            ChatMessage::new("user", "hi")
        ]
    );
    assert_eq!(r.tools[0].name, "get_weather");
    assert_eq!(r.tools[0].parameters["properties"]["city"]["type"], "string");
    assert_eq!(r.tool_choice, ToolChoice::Named("get_weather".into()));
    assert!(!r.parallel_tool_calls);
}

#[test]
fn tool_choice_maps_and_defaults() {
    let tools = json!([{"name": "f", "input_schema": {"type": "object"}}]);
    let choice = |c: Value| messages(json!({"tools": tools, "tool_choice": c})).map(|r| r.tool_choice);
    assert_eq!(choice(json!({"type": "auto"})).unwrap(), ToolChoice::Auto);
    assert_eq!(choice(json!({"type": "any"})).unwrap(), ToolChoice::Required);
    assert_eq!(choice(json!({"type": "none"})).unwrap(), ToolChoice::None);
    assert_eq!(
        param(choice(json!({"type": "tool", "name": "g"})).unwrap_err()),
        "tool_choice"
    );
    assert_eq!(
        param(choice(json!({"type": "some"})).unwrap_err()),
        "tool_choice.type"
    );
    let r = messages(json!({"tools": tools})).unwrap();
    assert_eq!((r.tool_choice, r.parallel_tool_calls), (ToolChoice::Auto, true));
    assert_eq!(messages(json!({})).unwrap().tool_choice, ToolChoice::None);
    let e = messages(json!({"tool_choice": {"type": "any"}})).unwrap_err();
    assert_eq!(param(e), "tool_choice");
}

#[test]
fn tool_use_and_tool_result_turns_become_tool_calls_and_tool_messages() {
    let r = messages(json!({"messages": [
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "use the tool", "signature": "sig"},
            {"type": "text", "text": "checking"},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}], "is_error": false},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "rain"},
            {"type": "text", "text": "and now?"},
        ]},
    ]}))
    .unwrap();
    let m = &r.messages;
    assert_eq!(m.len(), 5);
    assert_eq!(
        (m[1].role.as_str(), m[1].content.as_str()),
        ("assistant", "checking")
    );
    assert_eq!(m[1].reasoning_content.as_deref(), Some("use the tool"));
    assert_eq!(
        m[1].tool_calls.as_ref().unwrap()[0],
        json!({"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}})
    );
    assert_eq!((m[2].role.as_str(), m[2].content.as_str()), ("tool", "sunny"));
    assert_eq!(m[2].tool_call_id.as_deref(), Some("toolu_1"));
    assert_eq!(
        (m[3].content.as_str(), m[3].tool_call_id.as_deref()),
        ("rain", Some("toolu_2"))
    );
    assert_eq!(m[4], ChatMessage::new("user", "and now?"));
}

#[test]
fn what_cannot_be_honoured_is_refused_naming_the_field() {
    let image =
        json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}});
    let cases = [
        (json!({"max_tokens": null}), "max_tokens"),
        (json!({"max_tokens": 1001}), "max_tokens"),
        (json!({"messages": []}), "messages"),
        (
            json!({"messages": [{"role": "user", "content": [image]}]}),
            "messages[0].content[0]",
        ),
        (
            json!({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "{"}]}),
            "messages[1].role",
        ),
        (
            json!({"messages": [{"role": "system", "content": "a"}]}),
            "messages[0].role",
        ),
        (json!({"temperature": 1.5}), "temperature"),
        (json!({"top_p": 0}), "top_p"),
        (json!({"stop_sequences": "x"}), "stop_sequences"),
        (json!({"thinking": {"type": "sometimes"}}), "thinking.type"),
        (json!({"tools": [{"name": "f"}]}), "tools[0].input_schema"),
        (
            json!({"tools": [{"name": "bad name", "input_schema": {}}]}),
            "tools[0].name",
        ),
        (
            json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
            "tools[0].type",
        ),
        (json!({"container": "c"}), "container"),
        (json!({"n": 2}), "n"),
    ];
    for (extra, want) in cases {
        let e = messages(extra.clone()).unwrap_err();
        assert_eq!(e.status(), axum::http::StatusCode::BAD_REQUEST, "{extra}");
        assert_eq!(param(e), want, "{extra}");
    }
}

#[test]
fn count_tokens_needs_no_max_tokens() {
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    assert!(parse(&body, &LIMITS, true).is_ok());
    assert_eq!(param(parse(&body, &LIMITS, false).unwrap_err()), "max_tokens");
}

#[test]
fn thinking_is_on_only_when_enabled_and_never_with_a_forced_tool() {
    let tools = json!([{"name": "f", "input_schema": {"type": "object"}}]);
    let off = messages(json!({"tools": tools})).unwrap();
    assert_eq!(off.template_kwargs["thinking"], json!(false));
    assert!(!thinking_shown(&off));
    for on in [
        json!({"type": "enabled", "budget_tokens": 64}),
        json!({"type": "adaptive"}),
    ] {
        let r = messages(json!({"thinking": on, "tools": tools})).unwrap();
        assert!(r.template_kwargs.get("thinking").is_none() && thinking_shown(&r));
        for choice in [json!({"type": "any"}), json!({"type": "tool", "name": "f"})] {
            let e = messages(json!({"thinking": on, "tools": tools, "tool_choice": choice})).unwrap_err();
            assert!(e.to_string().contains("Thinking may not be enabled"), "{e}");
        }
        assert!(messages(json!({"thinking": on, "tools": tools, "tool_choice": {"type": "auto"}})).is_ok());
    }
}
