//! The Responses API `response` object and its output items (pure), shared by the
//! non-streamed body and the stream's events so both carry the same items with the same ids.
//! Output order: `reasoning` (when the model thought), a `message` with one `output_text` part
//! (when there is answer text, or nothing else), then one `function_call` per call (`call_id`
//! is the id the model's format carries, so it round-trips through history). Item ids derive
//! from the response id and the item's output index.

use serde_json::{Map, Value, json};

use super::request::ResponsesRequest;
use crate::http::openai::chat::{ChoiceOutcome, ToolCall};
use crate::http::openai::request::ResponseFormat;
use crate::http::openai::types::Usage;

/// What every rendering of one response shares: its id and the request fields it echoes.
#[derive(Debug, Clone, PartialEq)]
pub struct Head {
    /// `resp_…`.
    pub id: String,
    pub created_at: u64,
    pub model: String,
    echo: Map<String, Value>,
}

fn format_echo(f: &ResponseFormat) -> Value {
    match f {
        ResponseFormat::Text => json!({"type": "text"}),
        ResponseFormat::JsonObject => json!({"type": "json_object"}),
        ResponseFormat::JsonSchema { name, schema, strict } => {
            json!({"type": "json_schema", "name": name, "schema": schema, "strict": strict})
        }
    }
}

impl Head {
    pub fn new(id: String, created_at: u64, model: String, req: &ResponsesRequest) -> Self {
        let c = &req.chat.common;
        let effort = match &req.chat.reasoning_effort {
            Some(Some(e)) => Value::from(e.clone()),
            Some(None) => Value::from("none"),
            None => Value::Null,
        };
        let fields = [
            ("instructions", json!(req.instructions)),
            ("tools", req.tools_echo.clone()),
            ("tool_choice", req.tool_choice_echo.clone()),
            ("parallel_tool_calls", json!(req.chat.parallel_tool_calls)),
            ("temperature", json!(c.sampling.temperature)),
            ("top_p", json!(c.sampling.top_p)),
            ("max_output_tokens", json!(c.max_tokens)),
            ("previous_response_id", json!(req.previous_response_id)),
            ("text", json!({"format": format_echo(&req.chat.response_format)})),
            ("reasoning", json!({"effort": effort, "summary": null})),
            ("store", json!(req.store)),
            ("metadata", Value::Object(req.metadata.clone())),
            ("truncation", json!("disabled")),
            ("background", json!(false)),
            ("service_tier", json!("default")),
        ];
        let echo = fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        Head {
            id,
            created_at,
            model,
            echo,
        }
    }

    /// An item id: `prefix`, this response's hex and the output index.
    pub fn item_id(&self, prefix: &str, index: usize) -> String {
        let hex = self.id.strip_prefix("resp_").unwrap_or(&self.id);
        format!("{prefix}_{hex}{index:02}")
    }

    /// The `response` object (`usage` absent while in progress; `incomplete`: the output hit
    /// `max_output_tokens`).
    pub fn object(
        &self,
        status: &str,
        output: Vec<Value>,
        usage: Option<&Usage>,
        error: Option<Value>,
    ) -> Value {
        let mut o = Map::new();
        o.insert("id".into(), Value::from(self.id.clone()));
        o.insert("object".into(), Value::from("response"));
        o.insert("created_at".into(), Value::from(self.created_at));
        o.insert("status".into(), Value::from(status));
        o.insert("error".into(), error.unwrap_or(Value::Null));
        let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
        o.insert("incomplete_details".into(), incomplete.unwrap_or(Value::Null));
        o.insert("model".into(), Value::from(self.model.clone()));
        o.insert("output".into(), Value::Array(output));
        o.insert("usage".into(), usage.map_or(Value::Null, usage_object));
        o.extend(self.echo.clone());
        Value::Object(o)
    }
}

/// `usage` as the Responses API shapes it.
pub fn usage_object(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.prompt_tokens_details.cached_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.total_tokens,
    })
}

/// A `reasoning` item.
pub fn reasoning_item(id: &str, text: &str, done: bool) -> Value {
    let content = match done {
        true => json!([{"type": "reasoning_text", "text": text}]),
        false => json!([]),
    };
    json!({"type": "reasoning", "id": id, "summary": [], "content": content})
}

/// An `output_text` part.
pub fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// An assistant `message` item (`text: None`: just added, no parts yet).
pub fn message_item(id: &str, text: Option<&str>, status: &str) -> Value {
    let content: Vec<Value> = text.map(text_part).into_iter().collect();
    json!({"type": "message", "id": id, "role": "assistant", "status": status, "content": content})
}

/// A `function_call` item.
pub fn call_item(id: &str, call: &ToolCall, status: &str) -> Value {
    json!({
        "type": "function_call", "id": id, "call_id": call.id, "name": call.name,
        "arguments": call.arguments, "status": status,
    })
}

/// `completed`, or `incomplete` when the output hit the token limit.
pub fn status(finish_reason: &str) -> &'static str {
    match finish_reason {
        "length" => "incomplete",
        _ => "completed",
    }
}

/// The output items of a finished choice.
pub fn output_items(head: &Head, choice: &ChoiceOutcome) -> Vec<Value> {
    let mut items = Vec::new();
    if !choice.reasoning.is_empty() {
        items.push(reasoning_item(
            &head.item_id("rs", items.len()),
            &choice.reasoning,
            true,
        ));
    }
    if !choice.content.is_empty() || choice.tool_calls.is_empty() {
        let id = head.item_id("msg", items.len());
        items.push(message_item(
            &id,
            Some(&choice.content),
            status(choice.finish_reason),
        ));
    }
    for call in &choice.tool_calls {
        items.push(call_item(&head.item_id("fc", items.len()), call, "completed"));
    }
    items
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::http::openai::request::ChatRequest;

    pub(crate) fn request() -> ResponsesRequest {
        ResponsesRequest {
            chat: ChatRequest::new(Vec::new()),
            instructions: Some("be brief".into()),
            previous_response_id: None,
            store: true,
            metadata: Map::new(),
            tools_echo: json!([]),
            tool_choice_echo: json!("auto"),
        }
    }

    #[test]
    fn a_finished_response_has_reasoning_message_and_calls_in_order() {
        let head = Head::new("resp_ab".into(), 7, "m".into(), &request());
        let choice = ChoiceOutcome {
            index: 0,
            reasoning: "think".into(),
            content: "hi".into(),
            tool_calls: vec![ToolCall {
                id: "functions.f:0".into(),
                name: "f".into(),
                arguments: "{}".into(),
            }],
            finish_reason: "tool_calls",
            logprobs: Vec::new(),
        };
        let items = output_items(&head, &choice);
        assert_eq!(
            items[0],
            json!({"type": "reasoning", "id": "rs_ab00", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]})
        );
        assert_eq!(
            items[1]["content"][0],
            json!({"type": "output_text", "text": "hi", "annotations": [], "logprobs": []})
        );
        assert_eq!(
            items[2],
            json!({"type": "function_call", "id": "fc_ab02", "call_id": "functions.f:0", "name": "f",
                "arguments": "{}", "status": "completed"})
        );
        let o = head.object("completed", items, Some(&Usage::new(10, 4, 6)), None);
        assert_eq!(o["object"], "response");
        assert_eq!(o["instructions"], "be brief");
        assert_eq!(o["incomplete_details"], Value::Null);
        assert_eq!(
            o["usage"],
            json!({"input_tokens": 10, "input_tokens_details": {"cached_tokens": 6}, "output_tokens": 4,
                "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 14})
        );
        let o = head.object("incomplete", Vec::new(), None, None);
        assert_eq!(o["incomplete_details"], json!({"reason": "max_output_tokens"}));
    }
}
