use serde_json::json;

use super::*;

const LIMITS: Limits = Limits {
    max_tokens: 1000,
    default_completion_tokens: 16,
};

fn chat(extra: Value) -> Result<ChatRequest, ApiError> {
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    parse_chat(&body, &LIMITS)
}

use crate::http::error::param_of as param;

#[test]
fn a_full_chat_request_becomes_typed() {
    let r = chat(json!({
        "max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": -3, "stop": ["a", "b"],
        "stream": true, "stream_options": {"include_usage": true}, "n": 1, "logit_bias": {}, "user": "u",
        "presence_penalty": 0, "response_format": {"type": "text"}, "tools": [], "metadata": {"k": "v"},
        "chat_template_kwargs": {"thinking": true}, "logprobs": false, "parallel_tool_calls": true,
    }))
    .unwrap();
    assert_eq!(r.common.max_tokens, Some(5));
    assert_eq!(
        r.common.sampling,
        SamplingParams {
            temperature: 0.5,
            top_p: 0.9,
            top_k: 40,
            seed: Some(-3i64 as u64),
            ..Common::new().sampling
        }
    );
    assert_eq!(r.common.stop, vec!["a", "b"]);
    assert!(r.common.stream && r.common.include_usage);
    assert_eq!(r.template_kwargs["thinking"], json!(true));
    assert_eq!(r.messages, vec![ChatMessage::new("user", "hi")]);
}

#[test]
fn unsupported_fields_fail_closed_naming_the_field() {
    let cases = [
        (json!({"n": 9}), "n"),
        (json!({"top_logprobs": 2}), "top_logprobs"),
        (json!({"top_logprobs": 21, "logprobs": true}), "top_logprobs"),
        (json!({"tools": [{"type": "function"}]}), "tools[0].function"),
        (
            json!({"tools": [{"type": "custom", "function": {}}]}),
            "tools[0].type",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "a.b"}}]}),
            "tools[0].function.name",
        ),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"tool_choice": "sometimes"}), "tool_choice"),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f"}}],
                   "tool_choice": {"type": "function", "function": {"name": "g"}}}),
            "tool_choice",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "response_format.json_schema.schema",
        ),
        (
            json!({"response_format": {"type": "yaml"}}),
            "response_format.type",
        ),
        (json!({"logit_bias": {"x": 1}}), "logit_bias"),
        (json!({"logit_bias": {"5": 101}}), "logit_bias"),
        (json!({"frequency_penalty": 2.5}), "frequency_penalty"),
        (json!({"min_p": 1.5}), "min_p"),
        (json!({"reasoning_effort": "extreme"}), "reasoning_effort"),
        (json!({"bogus": 1}), "bogus"),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
            "messages[0].content[0]",
        ),
        (
            json!({"messages": [{"role": "tool", "content": "x"}]}),
            "messages[0].tool_call_id",
        ),
        (
            json!({"messages": [{"role": "function", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"messages": [{"role": "assistant", "tool_calls": [{"type": "function"}]}]}),
            "messages[0].tool_calls[0].id",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x", "extra": 1}]}),
            "messages[0].extra",
        ),
        (
            json!({"stream": true, "stream_options": {"other": true}}),
            "stream_options.other",
        ),
    ];
    for (body, field) in cases {
        let e = chat(body.clone()).unwrap_err();
        assert_eq!(e.status(), 400, "{body}");
        assert_eq!(param(e.clone()), field, "{body}: {e}");
        assert!(e.to_string().contains(field.split('[').next().unwrap()), "{e}");
    }
}

#[test]
fn bad_values_are_400_with_the_field() {
    let cases = [
        (json!({"max_tokens": 0}), "max_tokens"),
        (json!({"max_tokens": 1001}), "max_tokens"),
        (json!({"max_tokens": 1e300}), "max_tokens"),
        (json!({"max_tokens": "5"}), "max_tokens"),
        (
            json!({"max_tokens": 5, "max_completion_tokens": 6}),
            "max_completion_tokens",
        ),
        (json!({"temperature": 2.5}), "temperature"),
        (json!({"top_p": 0}), "top_p"),
        (json!({"seed": 1.5}), "seed"),
        (json!({"stop": ["", "x"]}), "stop"),
        (json!({"stop": ["a", "b", "c", "d", "e"]}), "stop"),
        (
            json!({"stream_options": {"include_usage": true}}),
            "stream_options",
        ),
        (json!({"messages": []}), "messages"),
        (
            json!({"messages": [{"role": "robot", "content": "x"}]}),
            "messages[0].role",
        ),
        (json!({"messages": [{"role": "user"}]}), "messages[0].content"),
        (
            json!({"messages": [{"role": "user", "content": 5}]}),
            "messages[0].content",
        ),
        (json!({"model": 5}), "model"),
    ];
    for (body, field) in cases {
        let e = chat(body.clone()).unwrap_err();
        assert_eq!(param(e), field, "{body}");
    }
    assert_eq!(param(parse_chat(&json!([1]), &LIMITS).unwrap_err()), "body");
    assert_eq!(
        param(parse_chat(&json!({"model": "m"}), &LIMITS).unwrap_err()),
        "messages"
    );
}

#[test]
fn agent_fields_become_typed() {
    let r = chat(json!({
        "n": 3, "logprobs": true, "top_logprobs": 5, "logit_bias": {"7": -100, "9": 2.5},
        "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1, "min_p": 0.05,
        "parallel_tool_calls": false, "reasoning_effort": "none",
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
    }))
    .unwrap();
    assert_eq!(
        (r.common.n, r.common.logprobs, r.common.top_logprobs),
        (3, true, 5)
    );
    assert_eq!(r.common.sampling.logit_bias, vec![(7, -100.0), (9, 2.5)]);
    assert_eq!(r.common.sampling.repetition_penalty, 1.1);
    assert_eq!(r.tool_choice, ToolChoice::Named("get_weather".into()));
    assert!(!r.parallel_tool_calls);
    assert_eq!(r.reasoning_effort, Some(None));
    assert_eq!(r.tools[0].name, "get_weather");
    let calls = r.messages[1].tool_calls.as_ref().unwrap();
    assert_eq!(calls[0]["function"]["arguments"], json!("{\"city\":\"Paris\"}"));
    assert_eq!(r.messages[2].tool_call_id.as_deref(), Some("call_1"));
    let auto = chat(json!({"tools": [{"type": "function", "function": {"name": "f"}}]})).unwrap();
    assert_eq!(auto.tool_choice, ToolChoice::Auto);
    assert_eq!(
        auto.tools[0].parameters,
        json!({"type": "object", "properties": {}})
    );
    let rf = chat(json!({"response_format": {"type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": true}}}))
    .unwrap();
    assert!(matches!(
        rf.response_format,
        ResponseFormat::JsonSchema { strict: true, .. }
    ));
    let c = parse_completion(&json!({"prompt": "x", "logprobs": 2, "n": 2}), &LIMITS).unwrap();
    assert_eq!(
        (c.common.logprobs, c.common.top_logprobs, c.common.n),
        (true, 2, 2)
    );
}

#[test]
fn nulls_are_absent_and_text_parts_join() {
    let r = chat(json!({"temperature": null, "stop": null, "messages": [
        {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": null, "reasoning_content": "r", "tool_calls": []},
        {"role": "user", "content": "q", "name": "n"},
    ]}))
    .unwrap();
    assert_eq!(r.common.sampling.temperature, 1.0);
    assert_eq!(r.messages[0], ChatMessage::new("system", "a\nb"));
    assert_eq!(r.messages[1].reasoning_content.as_deref(), Some("r"));
    assert_eq!(r.messages[2].name.as_deref(), Some("n"));
}

#[test]
fn completions_prompts_and_defaults() {
    let p = |v: Value| parse_completion(&json!({"prompt": v}), &LIMITS);
    assert_eq!(p(json!("hi")).unwrap().prompt, PromptInput::Text("hi".into()));
    assert_eq!(p(json!(["hi"])).unwrap().prompt, PromptInput::Text("hi".into()));
    assert_eq!(p(json!([1, 2])).unwrap().prompt, PromptInput::Ids(vec![1, 2]));
    assert_eq!(p(json!([[3]])).unwrap().prompt, PromptInput::Ids(vec![3]));
    assert_eq!(p(json!("x")).unwrap().common.max_tokens, Some(16));
    for bad in [
        json!(["a", "b"]),
        json!([]),
        json!([-1]),
        json!([1.5]),
        json!({}),
        json!(5),
    ] {
        assert_eq!(param(p(bad.clone()).unwrap_err()), "prompt", "{bad}");
    }
    for (body, field) in [
        (json!({"prompt": "x", "echo": true}), "echo"),
        (json!({"prompt": "x", "best_of": 2}), "best_of"),
        (json!({"prompt": "x", "logprobs": 6}), "logprobs"),
        (json!({"prompt": "x", "suffix": "s"}), "suffix"),
        (json!({"prompt": "x", "messages": []}), "messages"),
    ] {
        assert_eq!(
            param(parse_completion(&body, &LIMITS).unwrap_err()),
            field,
            "{body}"
        );
    }
}
