//! The Messages API event stream (pure): chat output steps become the named SSE events
//! `message_start`, `ping`, then per content block `content_block_start` /
//! `content_block_delta` (`thinking_delta`, `text_delta`, `input_json_delta`) /
//! `content_block_stop`, then `message_delta` (stop reason, output tokens) and `message_stop`;
//! a failure after the headers is an `error` event.
//!
//! Invariants: block indices count up from 0 with one block open at a time; thinking streams
//! as it comes, then text; tool calls are held until the output ends and then emitted as
//! `tool_use` blocks (one `input_json_delta` each) after the text, so the blocks, their order
//! and a call that is not a JSON object becoming text are exactly the non-streamed
//! response's ([`super::response::content_blocks`]).

use serde_json::{Value, json};

use super::error::AnthropicError;
use super::response::{call_as_text, call_input, stop_reason};
use crate::http::openai::chat::{ToolCall, fold_call};

/// One SSE event: its `event:` name and `data:` object.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub name: &'static str,
    pub data: Value,
}

fn event(name: &'static str, data: Value) -> Event {
    Event { name, data }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Thinking,
    Text,
}

/// The event state of one streamed message.
#[derive(Debug)]
pub struct MessageStream {
    id: String,
    model: String,
    next_index: usize,
    open: Option<(Kind, usize)>,
    calls: Vec<ToolCall>,
}

impl MessageStream {
    pub fn new(id: String, model: String) -> Self {
        MessageStream {
            id,
            model,
            next_index: 0,
            open: None,
            calls: Vec::new(),
        }
    }

    /// `message_start` (empty content, the prompt's tokens) and a `ping`.
    pub fn start(&self, input_tokens: usize) -> Vec<Event> {
        let message = json!({
            "id": self.id, "type": "message", "role": "assistant", "content": [], "model": self.model,
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input_tokens, "output_tokens": 0},
        });
        vec![
            event(
                "message_start",
                json!({"type": "message_start", "message": message}),
            ),
            event("ping", json!({"type": "ping"})),
        ]
    }

    fn close(&mut self, out: &mut Vec<Event>) {
        if let Some((_, index)) = self.open.take() {
            out.push(event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            ));
        }
    }

    /// Open a block of `kind` unless one is open; its index.
    fn ensure(&mut self, kind: Kind, out: &mut Vec<Event>) -> usize {
        match self.open {
            Some((k, index)) if k == kind => return index,
            Some(_) => self.close(out),
            None => {}
        }
        let index = self.next_index;
        self.next_index += 1;
        let block = match kind {
            Kind::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            Kind::Text => json!({"type": "text", "text": ""}),
        };
        out.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": block}),
        ));
        self.open = Some((kind, index));
        index
    }

    fn delta(&mut self, kind: Kind, text: &str, out: &mut Vec<Event>) {
        if text.is_empty() {
            return;
        }
        let index = self.ensure(kind, out);
        let delta = match kind {
            Kind::Thinking => json!({"type": "thinking_delta", "thinking": text}),
            Kind::Text => json!({"type": "text_delta", "text": text}),
        };
        out.push(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        ));
    }

    /// Reasoning and answer text of one step.
    pub fn text(&mut self, reasoning: &str, content: &str) -> Vec<Event> {
        let mut out = Vec::new();
        self.delta(Kind::Thinking, reasoning, &mut out);
        self.delta(Kind::Text, content, &mut out);
        out
    }

    /// A tool-call fragment (`index`: the call's; `id` and `name` on its first fragment).
    pub fn call(&mut self, index: usize, id: Option<&str>, name: Option<&str>, arguments: &str) {
        fold_call(&mut self.calls, index, id, name, arguments);
    }

    /// The end: held calls as text or `tool_use` blocks, `message_delta`, `message_stop`.
    pub fn finish(&mut self, finish_reason: &str, output_tokens: usize) -> Vec<Event> {
        let mut out = Vec::new();
        let calls = std::mem::take(&mut self.calls);
        let (uses, bad): (Vec<_>, Vec<_>) = calls.iter().partition(|c| call_input(&c.arguments).is_some());
        for call in bad {
            self.delta(Kind::Text, &call_as_text(call), &mut out);
        }
        if self.next_index == 0 && uses.is_empty() {
            self.ensure(Kind::Text, &mut out);
        }
        self.close(&mut out);
        for call in &uses {
            let index = self.next_index;
            self.next_index += 1;
            let block = json!({"type": "tool_use", "id": call.id, "name": call.name, "input": {}});
            out.push(event(
                "content_block_start",
                json!({"type": "content_block_start", "index": index, "content_block": block}),
            ));
            let delta = json!({"type": "input_json_delta", "partial_json": call.arguments});
            out.push(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": delta}),
            ));
            out.push(event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            ));
        }
        let delta =
            json!({"stop_reason": stop_reason(finish_reason, !uses.is_empty()), "stop_sequence": null});
        out.push(event(
            "message_delta",
            json!({"type": "message_delta", "delta": delta, "usage": {"output_tokens": output_tokens}}),
        ));
        out.push(event("message_stop", json!({"type": "message_stop"})));
        out
    }

    /// A failure after the stream started.
    pub fn error(e: &AnthropicError) -> Event {
        event("error", e.body())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::error::ApiError;

    fn names(events: &[Event]) -> Vec<&'static str> {
        events.iter().map(|e| e.name).collect()
    }

    #[test]
    fn thinking_then_text_then_tool_use_blocks_in_index_order() {
        let mut s = MessageStream::new("msg_1".into(), "m".into());
        let mut all = s.start(7);
        assert_eq!(all[0].data["message"]["usage"]["input_tokens"], 7);
        all.extend(s.text("think", ""));
        all.extend(s.text("more", "answer"));
        s.call(0, Some("c0"), Some("f"), "");
        s.call(0, None, None, r#"{"a":"#);
        s.call(0, None, None, "1}");
        s.call(1, Some("c1"), Some("g"), "oops");
        all.extend(s.finish("tool_calls", 9));
        assert_eq!(
            names(&all),
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        assert_eq!(all[2].data["content_block"]["type"], "thinking");
        assert_eq!(
            all[4].data["delta"],
            json!({"type": "thinking_delta", "thinking": "more"})
        );
        assert_eq!(all[6].data["index"], 1);
        assert_eq!(all[8].data["delta"]["text"], r#"{"name":"g","arguments":"oops"}"#);
        assert_eq!(
            all[10].data["content_block"],
            json!({"type": "tool_use", "id": "c0", "name": "f", "input": {}})
        );
        assert_eq!(all[11].data["delta"]["partial_json"], r#"{"a":1}"#);
        assert_eq!(all[12].data["index"], 2);
        assert_eq!(
            all[13].data,
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null},
                "usage": {"output_tokens": 9}})
        );
    }

    #[test]
    fn an_empty_answer_still_has_one_text_block() {
        let mut s = MessageStream::new("m".into(), "m".into());
        let all = s.finish("length", 0);
        assert_eq!(
            names(&all),
            [
                "content_block_start",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(all[2].data["delta"]["stop_reason"], "max_tokens");
        let e = MessageStream::error(&AnthropicError(ApiError::Internal("generation")));
        assert_eq!(
            (e.name, e.data["error"]["type"].as_str()),
            ("error", Some("api_error"))
        );
    }
}
