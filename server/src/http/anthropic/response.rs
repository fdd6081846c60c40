//! The non-streamed Messages API response (pure): a finished chat choice becomes
//! `{id, type: "message", role, content: [thinking?, text?, tool_use…], model, stop_reason,
//! stop_sequence, usage}`. A call whose arguments are not a JSON object cannot be a `tool_use`
//! block (its `input` is an object), so it is returned as text instead ([`call_as_text`]).

use serde_json::{Value, json};

use crate::http::openai::chat::{ChoiceOutcome, ToolCall};
use crate::http::openai::types::Usage;

/// A call's `input`: its arguments when they are a JSON object.
pub fn call_input(arguments: &str) -> Option<Value> {
    serde_json::from_str::<Value>(arguments)
        .ok()
        .filter(Value::is_object)
}

/// The text a call with unusable arguments is returned as.
pub fn call_as_text(call: &ToolCall) -> String {
    json!({"name": call.name, "arguments": call.arguments}).to_string()
}

/// `stop_reason` from the chat finish reason and whether `tool_use` blocks were returned.
/// Which stop sequence ended the output is not tracked, so `stop_sequence` stays `null` and
/// a stop-sequence stop reads as `end_turn`.
pub fn stop_reason(finish_reason: &str, tool_use: bool) -> &'static str {
    match finish_reason {
        _ if tool_use => "tool_use",
        "length" => "max_tokens",
        _ => "end_turn",
    }
}

/// `usage`: every prompt token counts as input (reused state is not reported as a cache read).
pub fn usage(u: &Usage) -> Value {
    json!({"input_tokens": u.prompt_tokens, "output_tokens": u.completion_tokens})
}

/// The content blocks of a finished choice: thinking, text, then `tool_use` blocks.
pub fn content_blocks(choice: &ChoiceOutcome) -> Vec<Value> {
    let mut blocks = Vec::new();
    if !choice.reasoning.is_empty() {
        blocks.push(json!({"type": "thinking", "thinking": choice.reasoning, "signature": ""}));
    }
    let mut text = choice.content.clone();
    let mut uses = Vec::new();
    for call in &choice.tool_calls {
        match call_input(&call.arguments) {
            Some(input) => {
                uses.push(json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input}))
            }
            None => text.push_str(&call_as_text(call)),
        }
    }
    if !text.is_empty() || (blocks.is_empty() && uses.is_empty()) {
        blocks.push(json!({"type": "text", "text": text}));
    }
    blocks.extend(uses);
    blocks
}

/// The whole `message` object.
pub fn message(id: &str, model: &str, choice: &ChoiceOutcome, u: &Usage) -> Value {
    let content = content_blocks(choice);
    let tool_use = content.iter().any(|b| b["type"] == "tool_use");
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": model,
        "stop_reason": stop_reason(choice.finish_reason, tool_use),
        "stop_sequence": null,
        "usage": usage(u),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(
        reasoning: &str,
        content: &str,
        calls: &[(&str, &str, &str)],
        finish: &'static str,
    ) -> ChoiceOutcome {
        ChoiceOutcome {
            index: 0,
            reasoning: reasoning.into(),
            content: content.into(),
            tool_calls: calls
                .iter()
                .map(|(id, name, arguments)| ToolCall {
                    id: id.to_string(),
                    name: name.to_string(),
                    arguments: arguments.to_string(),
                })
                .collect(),
            finish_reason: finish,
            logprobs: Vec::new(),
        }
    }

    #[test]
    fn a_text_answer_is_one_text_block_ending_the_turn() {
        let m = message("msg_1", "m", &choice("", "hi", &[], "stop"), &Usage::new(5, 2, 3));
        assert_eq!(
            m,
            json!({"id": "msg_1", "type": "message", "role": "assistant",
                "content": [{"type": "text", "text": "hi"}], "model": "m", "stop_reason": "end_turn",
                "stop_sequence": null, "usage": {"input_tokens": 5, "output_tokens": 2}})
        );
        let m = message("msg_1", "m", &choice("", "", &[], "length"), &Usage::new(5, 2, 0));
        assert_eq!(m["stop_reason"], "max_tokens");
        assert_eq!(m["content"], json!([{"type": "text", "text": ""}]));
    }

    #[test]
    fn thinking_text_and_calls_come_in_order_and_bad_arguments_become_text() {
        let c = choice(
            "hmm",
            "ok",
            &[
                ("c1", "f", r#"{"a": 1}"#),
                ("c2", "g", "not json"),
                ("c3", "h", "[1]"),
            ],
            "tool_calls",
        );
        let blocks = content_blocks(&c);
        assert_eq!(
            blocks[0],
            json!({"type": "thinking", "thinking": "hmm", "signature": ""})
        );
        assert_eq!(blocks[1]["type"], "text");
        let text = blocks[1]["text"].as_str().unwrap();
        assert!(text.starts_with("ok{") && text.contains("not json") && text.contains("[1]"));
        assert_eq!(
            blocks[2],
            json!({"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}})
        );
        assert_eq!(blocks.len(), 3);
        let m = message("x", "m", &c, &Usage::new(1, 1, 0));
        assert_eq!(m["stop_reason"], "tool_use");
        // A named choice finishes with `stop`; a tool_use block still makes it `tool_use`.
        let m = message(
            "x",
            "m",
            &choice("", "", &[("c", "f", "{}")], "stop"),
            &Usage::new(1, 1, 0),
        );
        assert_eq!(
            (m["stop_reason"].as_str(), m["content"].as_array().unwrap().len()),
            (Some("tool_use"), 1)
        );
        // Only unusable calls: no tool_use, the turn ends.
        let m = message(
            "x",
            "m",
            &choice("", "", &[("c", "f", "{")], "tool_calls"),
            &Usage::new(1, 1, 0),
        );
        assert_eq!(m["stop_reason"], "end_turn");
    }
}
