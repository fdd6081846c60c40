//! Tool-call history as each family's chat template expects it.
//!
//! * Kimi K2's ids (reference/agent-api.md §1), below.
//! * Arguments as objects: OpenAI clients send a history call's `arguments` as a JSON string,
//!   while the templates of Qwen3.5, GLM, MiniMax-M2 and gpt-oss iterate them as a mapping
//!   (`arguments.items()`, `arguments|items`, `arguments|tojson`), as transformers documents
//!   and vLLM does before rendering. [`arguments_as_objects`] decodes them.
//!
//! K2 renders a history call's id verbatim, and that id is the only place its function name
//! reaches the model: the model was trained on `functions.{name}:{idx}` (idx counting the calls
//! of one assistant turn from 0), and foreign ids (`call_…`) make it emit foreign ids back
//! ("Known failure modes" (3)). [`normalize_k2_tool_ids`] rewrites them, and the `tool_call_id`
//! of the tool messages answering them, so the conversation binds exactly as before.

use serde_json::Value;

use super::chat::ChatMessage;

/// Rewrite every assistant tool-call id that is not `functions.{its function name}:{digits}` to
/// `functions.{name}:{idx}` (`idx` = the call's position in its turn, from 0), and the
/// `tool_call_id` of the tool messages that follow that turn (up to the next assistant message)
/// accordingly. A call without a string function name is left as it is. With duplicate foreign
/// ids in one turn, the k-th tool message naming that id is bound to the k-th such call.
///
/// ```
/// use deltafin_engine::tokenizer::{ChatMessage, normalize_k2_tool_ids};
/// let call = serde_json::json!({"id": "call_9", "type": "function",
///     "function": {"name": "get_weather", "arguments": "{}"}});
/// let mut messages = vec![
///     ChatMessage { tool_calls: Some(vec![call]), ..ChatMessage::new("assistant", "") },
///     ChatMessage { tool_call_id: Some("call_9".into()), ..ChatMessage::new("tool", "sunny") },
/// ];
/// normalize_k2_tool_ids(&mut messages);
/// assert_eq!(messages[0].tool_calls.as_ref().unwrap()[0]["id"], "functions.get_weather:0");
/// assert_eq!(messages[1].tool_call_id.as_deref(), Some("functions.get_weather:0"));
/// ```
pub fn normalize_k2_tool_ids(messages: &mut [ChatMessage]) {
    // (old id, new id, used by a tool message yet) for the current assistant turn.
    let mut renamed: Vec<(Option<String>, String, bool)> = Vec::new();
    for m in messages.iter_mut() {
        match m.role.as_str() {
            "assistant" => {
                renamed.clear();
                for (idx, call) in m.tool_calls.iter_mut().flatten().enumerate() {
                    if let Some((old, new)) = normalize_call(call, idx) {
                        renamed.push((old, new, false));
                    }
                }
            }
            "tool" => {
                let Some(id) = m.tool_call_id.as_deref() else {
                    continue;
                };
                if let Some(entry) = renamed
                    .iter_mut()
                    .find(|(old, _, used)| !used && old.as_deref() == Some(id))
                {
                    entry.2 = true;
                    m.tool_call_id = Some(entry.1.clone());
                }
            }
            _ => {}
        }
    }
}

/// Decode every assistant tool call's `function.arguments` that is a JSON string holding an
/// object into that object (the form the templates that iterate arguments need). A string
/// that is not a JSON object is left as it is, for the template to render or refuse.
///
/// ```
/// use deltafin_engine::tokenizer::{ChatMessage, arguments_as_objects};
/// let call = serde_json::json!({"id": "call_9", "type": "function",
///     "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}});
/// let mut messages = vec![ChatMessage { tool_calls: Some(vec![call]), ..ChatMessage::new("assistant", "") }];
/// arguments_as_objects(&mut messages);
/// let args = &messages[0].tool_calls.as_ref().unwrap()[0]["function"]["arguments"];
/// assert_eq!(args, &serde_json::json!({"city": "Oslo"}));
/// ```
pub fn arguments_as_objects(messages: &mut [ChatMessage]) {
    let calls = messages
        .iter_mut()
        .filter(|m| m.role == "assistant")
        .flat_map(|m| m.tool_calls.iter_mut().flatten());
    for call in calls {
        let Some(args) = call.get_mut("function").and_then(|f| f.get_mut("arguments")) else {
            continue;
        };
        let decoded = args
            .as_str()
            .and_then(|s| serde_json::from_str::<Value>(s).ok())
            .filter(Value::is_object);
        if let Some(object) = decoded {
            *args = object;
        }
    }
}

/// Give one call its K2 id if it lacks one; returns `(old id, new id)` when it changed.
fn normalize_call(call: &mut Value, idx: usize) -> Option<(Option<String>, String)> {
    let name = call.get("function")?.get("name")?.as_str()?.to_owned();
    let old = call.get("id").and_then(Value::as_str).map(str::to_owned);
    if old.as_deref().is_some_and(|id| is_k2_id(id, &name)) {
        return None;
    }
    let new = format!("functions.{name}:{idx}");
    call.as_object_mut()?
        .insert("id".into(), Value::String(new.clone()));
    Some((old, new))
}

/// Whether `id` is `functions.{name}:{digits}`.
fn is_k2_id(id: &str, name: &str) -> bool {
    id.strip_prefix("functions.")
        .and_then(|rest| rest.strip_prefix(name))
        .and_then(|rest| rest.strip_prefix(':'))
        .is_some_and(|idx| !idx.is_empty() && idx.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn call(id: Option<&str>, name: &str) -> Value {
        let mut c = json!({"type": "function", "function": {"name": name, "arguments": "{}"}});
        if let Some(id) = id {
            c["id"] = json!(id);
        }
        c
    }

    fn assistant(calls: Vec<Value>) -> ChatMessage {
        ChatMessage {
            tool_calls: Some(calls),
            ..ChatMessage::new("assistant", "")
        }
    }

    fn tool(id: &str) -> ChatMessage {
        ChatMessage {
            tool_call_id: Some(id.into()),
            ..ChatMessage::new("tool", "r")
        }
    }

    fn ids(m: &ChatMessage) -> Vec<String> {
        m.tool_calls
            .iter()
            .flatten()
            .map(|c| c["id"].as_str().unwrap_or("-").to_owned())
            .collect()
    }

    #[test]
    fn json_string_arguments_become_objects_and_other_values_stay() {
        let with_args = |a: Value| {
            let mut c = call(Some("c"), "f");
            c["function"]["arguments"] = a;
            c
        };
        let mut msgs = vec![
            assistant(vec![
                with_args(json!("{\"a\": [1, {\"b\": null}]}")),
                with_args(json!("not json")),
                with_args(json!("[1]")),
                with_args(json!({"x": 1})),
            ]),
            ChatMessage {
                tool_calls: Some(vec![with_args(json!("{\"u\": 1}"))]),
                ..ChatMessage::new("user", "")
            },
        ];
        arguments_as_objects(&mut msgs);
        let args: Vec<&Value> = msgs[0]
            .tool_calls
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| &c["function"]["arguments"])
            .collect();
        assert_eq!(
            args,
            [
                &json!({"a": [1, {"b": null}]}),
                &json!("not json"),
                &json!("[1]"),
                &json!({"x": 1})
            ]
        );
        assert_eq!(
            msgs[1].tool_calls.as_ref().unwrap()[0]["function"]["arguments"],
            json!("{\"u\": 1}")
        );
    }

    #[test]
    fn foreign_ids_are_rewritten_per_turn_and_results_follow() {
        let mut msgs = vec![
            ChatMessage::new("user", "q"),
            assistant(vec![
                call(Some("call_a"), "f"),
                call(Some("functions.g:1"), "g"),
                call(None, "h"),
            ]),
            tool("functions.g:1"),
            tool("call_a"),
            tool("unknown"),
            assistant(vec![call(Some("call_a"), "f")]),
            tool("call_a"),
        ];
        normalize_k2_tool_ids(&mut msgs);
        assert_eq!(ids(&msgs[1]), ["functions.f:0", "functions.g:1", "functions.h:2"]);
        assert_eq!(msgs[2].tool_call_id.as_deref(), Some("functions.g:1"));
        assert_eq!(msgs[3].tool_call_id.as_deref(), Some("functions.f:0"));
        assert_eq!(msgs[4].tool_call_id.as_deref(), Some("unknown"));
        assert_eq!(ids(&msgs[5]), ["functions.f:0"]);
        assert_eq!(msgs[6].tool_call_id.as_deref(), Some("functions.f:0"));
    }

    #[test]
    fn malformed_k2_ids_and_duplicates() {
        let mut msgs = vec![
            assistant(vec![
                call(Some("functions.other:0"), "f"),
                call(Some("functions.f:"), "f"),
                call(Some("dup"), "f"),
                call(Some("dup"), "g"),
                json!({"id": "x", "function": {"arguments": "{}"}}),
            ]),
            tool("dup"),
            tool("dup"),
        ];
        normalize_k2_tool_ids(&mut msgs);
        assert_eq!(
            ids(&msgs[0]),
            [
                "functions.f:0",
                "functions.f:1",
                "functions.f:2",
                "functions.g:3",
                "x"
            ]
        );
        assert_eq!(msgs[1].tool_call_id.as_deref(), Some("functions.f:2"));
        assert_eq!(msgs[2].tool_call_id.as_deref(), Some("functions.g:3"));
        assert!(is_k2_id("functions.f:12", "f") && !is_k2_id("functions.f:1a", "f"));
    }
}
