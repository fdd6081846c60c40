//! The Responses API event stream (pure): chat output steps become `event: <type>` /
//! `data: {…, "type", "sequence_number"}` events: `response.created`, `response.in_progress`,
//! then per output item `response.output_item.added`, its content events
//! (`response.reasoning_text.delta` / `.done`; `response.content_part.added`,
//! `response.output_text.delta` / `.done`, `response.content_part.done`;
//! `response.function_call_arguments.delta` / `.done`) and `response.output_item.done`, and
//! last `response.completed` (or `response.incomplete` at the token limit, `response.failed`
//! on an error). There is no `[DONE]`.
//!
//! Invariants: sequence numbers count up from 0; one item is open at a time and output
//! indices count up from 0; items and ids are those of the non-streamed body
//! ([`super::object::output_items`]); the final response carries every item as done.

use serde_json::{Value, json};

use super::object::{Head, call_item, message_item, reasoning_item, status, text_part};
use crate::http::error::ApiError;
use crate::http::openai::chat::ToolCall;
use crate::http::openai::types::Usage;

/// One SSE event: its `event:` name (the data's `type`) and `data:` object.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub name: &'static str,
    pub data: Value,
}

#[derive(Debug)]
enum Open {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call: ToolCall,
        index: usize,
    },
}

/// The event state of one streamed response.
#[derive(Debug)]
pub struct ResponseStream {
    head: Head,
    seq: u64,
    /// Finished items, in output order.
    items: Vec<Value>,
    open: Option<Open>,
    /// Calls seen (their chat-side indices), so a fragment of a new call closes the last.
    calls: usize,
    messages: usize,
    /// The status a message closed now gets (`incomplete` once the output hit the limit).
    message_status: &'static str,
}

impl ResponseStream {
    pub fn new(head: Head) -> Self {
        ResponseStream {
            head,
            seq: 0,
            items: Vec::new(),
            open: None,
            calls: 0,
            messages: 0,
            message_status: "completed",
        }
    }

    fn emit(&mut self, out: &mut Vec<Event>, name: &'static str, mut data: Value) {
        data["type"] = Value::from(name);
        data["sequence_number"] = Value::from(self.seq);
        self.seq += 1;
        out.push(Event { name, data });
    }

    /// `response.created` and `response.in_progress`.
    pub fn start(&mut self) -> Vec<Event> {
        let mut out = Vec::new();
        let response = self.head.object("in_progress", Vec::new(), None, None);
        self.emit(&mut out, "response.created", json!({"response": response}));
        let response = self.head.object("in_progress", Vec::new(), None, None);
        self.emit(&mut out, "response.in_progress", json!({"response": response}));
        out
    }

    fn index(&self) -> usize {
        self.items.len()
    }

    fn added(&mut self, out: &mut Vec<Event>, item: Value) {
        let index = self.index();
        self.emit(
            out,
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
    }

    /// Close the open item (its done events).
    fn close(&mut self, out: &mut Vec<Event>) {
        let index = self.index();
        let item = match self.open.take() {
            None => return,
            Some(Open::Reasoning { id, text }) => {
                let base = json!({"item_id": id, "output_index": index, "content_index": 0});
                let mut done = base.clone();
                done["text"] = Value::from(text.clone());
                self.emit(out, "response.reasoning_text.done", done);
                reasoning_item(&id, &text, true)
            }
            Some(Open::Message { id, text }) => {
                let base = json!({"item_id": id, "output_index": index, "content_index": 0});
                let mut done = base.clone();
                done["text"] = Value::from(text.clone());
                done["logprobs"] = json!([]);
                self.emit(out, "response.output_text.done", done);
                let mut part = base;
                part["part"] = text_part(&text);
                self.emit(out, "response.content_part.done", part);
                message_item(&id, Some(&text), self.message_status)
            }
            Some(Open::Call { id, call, .. }) => {
                let done = json!({"item_id": id, "output_index": index, "arguments": call.arguments, "name": call.name});
                self.emit(out, "response.function_call_arguments.done", done);
                call_item(&id, &call, "completed")
            }
        };
        self.emit(
            out,
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        self.items.push(item);
    }

    fn reasoning(&mut self, out: &mut Vec<Event>, delta: &str) {
        if !matches!(self.open, Some(Open::Reasoning { .. })) {
            self.close(out);
            let id = self.head.item_id("rs", self.index());
            self.added(out, reasoning_item(&id, "", false));
            self.open = Some(Open::Reasoning {
                id,
                text: String::new(),
            });
        }
        let index = self.index();
        if let Some(Open::Reasoning { id, text }) = &mut self.open {
            text.push_str(delta);
            let data = json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta});
            self.emit(out, "response.reasoning_text.delta", data);
        }
    }

    fn open_message(&mut self, out: &mut Vec<Event>) {
        self.close(out);
        let id = self.head.item_id("msg", self.index());
        self.added(out, message_item(&id, None, "in_progress"));
        let index = self.index();
        let data = json!({"item_id": id, "output_index": index, "content_index": 0, "part": text_part("")});
        self.emit(out, "response.content_part.added", data);
        self.open = Some(Open::Message {
            id,
            text: String::new(),
        });
        self.messages += 1;
    }

    fn content(&mut self, out: &mut Vec<Event>, delta: &str) {
        if !matches!(self.open, Some(Open::Message { .. })) {
            self.open_message(out);
        }
        let index = self.index();
        if let Some(Open::Message { id, text }) = &mut self.open {
            text.push_str(delta);
            let data = json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta, "logprobs": []});
            self.emit(out, "response.output_text.delta", data);
        }
    }

    /// Reasoning and answer text of one step.
    pub fn text(&mut self, reasoning: &str, content: &str) -> Vec<Event> {
        let mut out = Vec::new();
        if !reasoning.is_empty() {
            self.reasoning(&mut out, reasoning);
        }
        if !content.is_empty() {
            self.content(&mut out, content);
        }
        out
    }

    /// A tool-call fragment (`index`: the call's; `id` and `name` on its first fragment).
    pub fn call(
        &mut self,
        index: usize,
        id: Option<&str>,
        name: Option<&str>,
        arguments: &str,
    ) -> Vec<Event> {
        let mut out = Vec::new();
        let same = matches!(&self.open, Some(Open::Call { index: i, .. }) if *i == index);
        if !same {
            self.close(&mut out);
            let item_id = self.head.item_id("fc", self.index());
            let call = ToolCall {
                id: id.unwrap_or_default().to_string(),
                name: name.unwrap_or_default().to_string(),
                arguments: String::new(),
            };
            self.added(&mut out, call_item(&item_id, &call, "in_progress"));
            self.open = Some(Open::Call {
                id: item_id,
                call,
                index,
            });
            self.calls += 1;
        }
        let output_index = self.index();
        if let Some(Open::Call { id, call, .. }) = &mut self.open
            && !arguments.is_empty()
        {
            call.arguments.push_str(arguments);
            let data = json!({"item_id": id, "output_index": output_index, "delta": arguments});
            self.emit(&mut out, "response.function_call_arguments.delta", data);
        }
        out
    }

    /// The end: the open item's done events and `response.completed` / `.incomplete`.
    pub fn finish(&mut self, finish_reason: &str, usage: &Usage) -> Vec<Event> {
        let mut out = Vec::new();
        if self.messages == 0 && self.calls == 0 {
            self.open_message(&mut out);
        }
        let status = status(finish_reason);
        self.message_status = status;
        self.close(&mut out);
        let response = self.head.object(status, self.items.clone(), Some(usage), None);
        let name = match status {
            "incomplete" => "response.incomplete",
            _ => "response.completed",
        };
        self.emit(&mut out, name, json!({"response": response}));
        out
    }

    /// A failure after the stream started: `response.failed` with the error.
    pub fn fail(&mut self, e: &ApiError) -> Vec<Event> {
        let mut out = Vec::new();
        let body = e.body();
        let error = json!({"code": body["error"]["code"], "message": body["error"]["message"]});
        let response = self.head.object("failed", self.items.clone(), None, Some(error));
        self.emit(&mut out, "response.failed", json!({"response": response}));
        out
    }

    /// The finished items so far.
    pub fn items(&self) -> &[Value] {
        &self.items
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::openai::chat::ChoiceOutcome;
    use crate::http::responses::object::output_items;
    use crate::http::responses::object::tests::request;

    fn names(events: &[Event]) -> Vec<&'static str> {
        events.iter().map(|e| e.name).collect()
    }

    #[test]
    fn text_then_calls_stream_the_items_of_the_non_streamed_body() {
        let head = Head::new("resp_x".into(), 1, "m".into(), &request());
        let mut s = ResponseStream::new(head.clone());
        let mut all = s.start();
        all.extend(s.text("r", ""));
        all.extend(s.text("", "he"));
        all.extend(s.text("", "llo"));
        all.extend(s.call(0, Some("call_0"), Some("f"), ""));
        all.extend(s.call(0, None, None, "{\"a\":"));
        all.extend(s.call(0, None, None, "1}"));
        all.extend(s.call(1, Some("call_1"), Some("g"), ""));
        all.extend(s.finish("tool_calls", &Usage::new(3, 4, 0)));
        assert_eq!(
            names(&all),
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (i, e) in all.iter().enumerate() {
            assert_eq!(e.data["sequence_number"], i as u64);
            assert_eq!(e.data["type"], e.name);
        }
        assert_eq!(all[10].data["text"], "hello");
        assert_eq!(all[16].data["arguments"], "{\"a\":1}");
        let choice = ChoiceOutcome {
            index: 0,
            reasoning: "r".into(),
            content: "hello".into(),
            tool_calls: vec![
                ToolCall {
                    id: "call_0".into(),
                    name: "f".into(),
                    arguments: "{\"a\":1}".into(),
                },
                ToolCall {
                    id: "call_1".into(),
                    name: "g".into(),
                    arguments: String::new(),
                },
            ],
            finish_reason: "tool_calls",
            logprobs: Vec::new(),
        };
        let done = &all.last().unwrap().data["response"];
        assert_eq!(done["status"], "completed");
        assert_eq!(done["output"], Value::Array(output_items(&head, &choice)));
        assert_eq!(done["usage"]["total_tokens"], 7);
    }

    #[test]
    fn an_empty_output_is_one_empty_message_and_the_limit_is_incomplete() {
        let head = Head::new("resp_y".into(), 1, "m".into(), &request());
        let mut s = ResponseStream::new(head);
        s.start();
        let end = s.finish("length", &Usage::new(1, 0, 0));
        assert_eq!(end.last().unwrap().name, "response.incomplete");
        let response = &end.last().unwrap().data["response"];
        assert_eq!(response["output"][0]["content"][0]["text"], "");
        assert_eq!(response["output"][0]["status"], "incomplete");
        assert_eq!(response["incomplete_details"]["reason"], "max_output_tokens");
        let failed = s.fail(&ApiError::Internal("generation"));
        assert_eq!(failed[0].data["response"]["status"], "failed");
        assert_eq!(failed[0].data["response"]["error"]["code"], "internal_error");
    }
}
