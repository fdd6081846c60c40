//! Responses API `input` → chat messages (pure). A string is one user message. Items, in
//! order: a `message` (`role` user / system / developer / assistant; content a string or
//! `input_text` / `output_text` / `refusal` parts) is a message; `function_call` items join the
//! assistant message they follow as OpenAI-shaped `tool_calls` (`id` = `call_id`, so the id the
//! model rendered comes back unchanged); `function_call_output` is a `tool` message;
//! a `reasoning` item's `reasoning_text` content becomes the `reasoning_content` of the
//! assistant message after it (summary-only reasoning is accepted and dropped). Images, files
//! and item references are refused.

use deltafin_engine::tokenizer::ChatMessage;
use serde_json::{Map, Value, json};

use crate::http::error::ApiError;
use crate::http::openai::request::fields::{obj, only};

fn string<'a>(o: &'a Map<String, Value>, key: &str, at: &str) -> Result<&'a str, ApiError> {
    o.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::field(format!("{at}.{key}"), format!("`{at}.{key}` must be a string")))
}

/// Parse `input`.
pub fn parse_input(v: &Value) -> Result<Vec<ChatMessage>, ApiError> {
    match v {
        Value::String(s) => Ok(vec![ChatMessage::new("user", s.clone())]),
        Value::Array(items) if !items.is_empty() => {
            let mut b = Builder::default();
            for (i, item) in items.iter().enumerate() {
                b.item(item, &format!("input[{i}]"))?;
            }
            Ok(b.out)
        }
        _ => Err(ApiError::field(
            "input",
            "`input` must be a string or a non-empty array of items",
        )),
    }
}

#[derive(Default)]
struct Builder {
    out: Vec<ChatMessage>,
    /// The last message is an assistant message later items may extend.
    open: bool,
    /// Reasoning for the next assistant message.
    reasoning: Option<String>,
}

impl Builder {
    fn item(&mut self, item: &Value, at: &str) -> Result<(), ApiError> {
        let o = obj(item, at)?;
        match o.get("type").and_then(Value::as_str) {
            None | Some("message") => self.message(o, at),
            Some("function_call") => {
                only(o, &["type", "id", "call_id", "name", "arguments", "status"], at)?;
                let call = json!({
                    "id": string(o, "call_id", at)?,
                    "type": "function",
                    "function": {"name": string(o, "name", at)?, "arguments": string(o, "arguments", at)?},
                });
                let msg = self.assistant();
                msg.tool_calls.get_or_insert_with(Vec::new).push(call);
                Ok(())
            }
            Some("function_call_output") => {
                only(o, &["type", "id", "call_id", "output", "status"], at)?;
                let mut msg =
                    ChatMessage::new("tool", output_text(o.get("output"), &format!("{at}.output"))?);
                msg.tool_call_id = Some(string(o, "call_id", at)?.to_string());
                self.push(msg);
                Ok(())
            }
            Some("reasoning") => {
                only(
                    o,
                    &["type", "id", "summary", "content", "encrypted_content", "status"],
                    at,
                )?;
                let text = reasoning_text(o.get("content"), &format!("{at}.content"))?;
                self.open = false;
                self.reasoning = (!text.is_empty()).then_some(text);
                Ok(())
            }
            Some(other) => {
                let other: String = other.chars().take(64).collect();
                Err(ApiError::unsupported(
                    format!("{at}.type"),
                    format!("input items of type `{other}` are not supported"),
                ))
            }
        }
    }

    fn push(&mut self, msg: ChatMessage) {
        self.open = false;
        self.reasoning = None;
        self.out.push(msg);
    }

    /// The open assistant message, or a new one (taking the pending reasoning).
    fn assistant(&mut self) -> &mut ChatMessage {
        if !self.open {
            let mut msg = ChatMessage::new("assistant", String::new());
            msg.reasoning_content = self.reasoning.take();
            self.out.push(msg);
            self.open = true;
        }
        let last = self.out.len() - 1;
        &mut self.out[last]
    }

    fn message(&mut self, o: &Map<String, Value>, at: &str) -> Result<(), ApiError> {
        only(o, &["type", "id", "role", "content", "status"], at)?;
        let role = match o.get("role").and_then(Value::as_str) {
            Some("user") => "user",
            Some("system" | "developer") => "system",
            Some("assistant") => "assistant",
            _ => {
                return Err(ApiError::field(
                    format!("{at}.role"),
                    format!("`{at}.role` must be one of user, system, developer, assistant"),
                ));
            }
        };
        let text = content(o.get("content"), &format!("{at}.content"))?;
        if role == "assistant" {
            let msg = self.assistant();
            if !msg.content.is_empty() && !text.is_empty() {
                msg.content.push('\n');
            }
            msg.content.push_str(&text);
        } else {
            self.push(ChatMessage::new(role, text));
        }
        Ok(())
    }
}

/// Message content: a string or text parts (joined with newlines).
fn content(v: Option<&Value>, at: &str) -> Result<String, ApiError> {
    match v {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let texts = parts.iter().enumerate().map(|(j, p)| {
                let at = format!("{at}[{j}]");
                let o = obj(p, &at)?;
                match o.get("type").and_then(Value::as_str) {
                    Some("input_text") => {
                        only(o, &["type", "text"], &at).and_then(|_| string(o, "text", &at))
                    }
                    Some("output_text") => only(o, &["type", "text", "annotations", "logprobs"], &at)
                        .and_then(|_| string(o, "text", &at)),
                    Some("refusal") => {
                        only(o, &["type", "refusal"], &at).and_then(|_| string(o, "refusal", &at))
                    }
                    Some(kind @ ("input_image" | "input_file" | "input_audio")) => {
                        Err(ApiError::unsupported(
                            at.clone(),
                            format!("`{at}`: `{kind}` parts are not supported (this model reads text only)"),
                        ))
                    }
                    _ => Err(ApiError::unsupported(
                        at.clone(),
                        format!("`{at}`: only input_text, output_text and refusal parts are supported"),
                    )),
                }
            });
            Ok(texts.collect::<Result<Vec<_>, _>>()?.join("\n"))
        }
        _ => Err(ApiError::field(
            at,
            format!("`{at}` must be a string or an array of content parts"),
        )),
    }
}

/// A `function_call_output`'s `output`: a string or `input_text` parts.
fn output_text(v: Option<&Value>, at: &str) -> Result<String, ApiError> {
    content(v, at)
}

/// The text of a reasoning item's `reasoning_text` parts (absent or empty: none).
fn reasoning_text(v: Option<&Value>, at: &str) -> Result<String, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(String::new());
    };
    let parts = v
        .as_array()
        .ok_or_else(|| ApiError::field(at, format!("`{at}` must be an array")))?;
    let texts = parts.iter().enumerate().map(|(j, p)| {
        let at = format!("{at}[{j}]");
        let o = obj(p, &at)?;
        match o.get("type").and_then(Value::as_str) {
            Some("reasoning_text") => string(o, "text", &at),
            _ => Err(ApiError::unsupported(
                at.clone(),
                format!("`{at}`: only reasoning_text parts are supported"),
            )),
        }
    });
    Ok(texts.collect::<Result<Vec<_>, _>>()?.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::http::error::param_of as param;

    #[test]
    fn a_string_is_one_user_message() {
        assert_eq!(
            parse_input(&json!("hi")).unwrap(),
            vec![ChatMessage::new("user", "hi")]
        );
    }

    #[test]
    fn replayed_output_items_become_one_assistant_turn_and_tool_messages() {
        let input = json!([
            {"role": "developer", "content": "rules"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "call it"}]},
            {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "checking", "annotations": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "get", "arguments": "{\"x\":1}", "status": "completed"},
            {"type": "function_call", "call_id": "call_b", "name": "get", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
            {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "rain"}]},
        ]);
        let m = parse_input(&input).unwrap();
        assert_eq!(m.len(), 5);
        assert_eq!(m[0], ChatMessage::new("system", "rules"));
        assert_eq!(
            (m[2].role.as_str(), m[2].content.as_str()),
            ("assistant", "checking")
        );
        assert_eq!(m[2].reasoning_content.as_deref(), Some("call it"));
        let calls = m[2].tool_calls.as_ref().unwrap();
        assert_eq!(
            calls[0],
            json!({"id": "call_a", "type": "function", "function": {"name": "get", "arguments": "{\"x\":1}"}})
        );
        assert_eq!(calls[1]["id"], "call_b");
        assert_eq!((m[3].role.as_str(), m[3].content.as_str()), ("tool", "sunny"));
        assert_eq!(m[3].tool_call_id.as_deref(), Some("call_a"));
        assert_eq!(m[4].content, "rain");
        // Summary-only reasoning (as some SDKs replay it) is accepted.
        let m = parse_input(&json!([
            {"role": "user", "content": "q"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        ]))
        .unwrap();
        assert_eq!(m[1].reasoning_content, None);
    }

    #[test]
    fn images_files_and_unknown_items_are_refused() {
        let cases = [
            (json!([]), "input"),
            (json!(3), "input"),
            (
                json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
                "input[0].content[0]",
            ),
            (json!([{"type": "item_reference", "id": "x"}]), "input[0].type"),
            (json!([{"role": "tool", "content": "x"}]), "input[0].role"),
            (
                json!([{"type": "function_call", "name": "f", "arguments": "{}"}]),
                "input[0].call_id",
            ),
            (
                json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]),
                "input[0].arguments",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(param(parse_input(&input).unwrap_err()), want, "{input}");
        }
    }
}
