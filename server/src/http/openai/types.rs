//! OpenAI response objects, serialised exactly as OpenAI does (`null` where OpenAI sends
//! `null`, optional extensions omitted when absent), and the SSE chunk builders (pure).

use serde::Serialize;

use super::logprobs::{ChatLogprobs, CompletionLogprobs};
use super::output::{Delta, ToolCallDelta};

/// Token accounting of one response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

/// Prompt tokens served from a reused conversation state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize) -> Self {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }
}

/// The assistant message of a chat completion.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    /// `null` when the turn is only tool calls.
    pub content: Option<String>,
    /// The thinking, when the chat format separates it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallOut>>,
}

/// A complete call in a chat completion.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolCallOut {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionOut,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FunctionOut {
    pub name: String,
    /// A JSON string.
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: &'static str,
}

/// `object: "chat.completion"`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// `object: "text_completion"` (also each streamed completions chunk).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Completion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    /// Absent in chunks without `include_usage`; `null` in chunks before the last with it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ChunkDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallChunk>>,
}

/// A streamed call fragment: the first carries `id`, `type` and the name with empty
/// arguments; later ones only `index` and an arguments fragment (OpenAI's shape).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolCallChunk {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionChunk,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FunctionChunk {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

impl From<&ToolCallDelta> for ToolCallChunk {
    fn from(t: &ToolCallDelta) -> Self {
        ToolCallChunk {
            index: t.index,
            id: t.id.clone(),
            kind: t.id.as_ref().map(|_| "function"),
            function: FunctionChunk {
                name: t.name.clone(),
                arguments: t.arguments.clone(),
            },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: ChunkDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// `object: "chat.completion.chunk"`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

/// One entry of `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    /// Context limit in tokens (vLLM's extension).
    pub max_model_len: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

/// Identity shared by every chunk of one response.
#[derive(Debug, Clone)]
pub struct ChunkHeader {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub include_usage: bool,
}

fn json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

impl ChunkHeader {
    fn usage_slot(&self) -> Option<Option<Usage>> {
        self.include_usage.then_some(None)
    }

    fn chat(&self, choice: ChunkChoice) -> String {
        json(&ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices: vec![choice],
            usage: self.usage_slot(),
        })
    }

    /// The first chat chunk of choice `index`: the assistant role with empty content.
    pub fn chat_role(&self, index: u32) -> String {
        self.chat(ChunkChoice {
            index,
            delta: ChunkDelta {
                role: Some("assistant"),
                content: Some(String::new()),
                ..Default::default()
            },
            logprobs: None,
            finish_reason: None,
        })
    }

    /// A chat chunk of choice `index` for `d` (`None` if there is nothing to send).
    pub fn chat_delta(&self, index: u32, d: Delta, logprobs: Option<ChatLogprobs>) -> Option<String> {
        if d.is_empty() && logprobs.is_none() {
            return None;
        }
        let some = |s: String| (!s.is_empty()).then_some(s);
        let calls: Vec<ToolCallChunk> = d.tool_calls.iter().map(ToolCallChunk::from).collect();
        Some(self.chat(ChunkChoice {
            index,
            delta: ChunkDelta {
                role: None,
                content: some(d.content),
                reasoning_content: some(d.reasoning),
                tool_calls: (!calls.is_empty()).then_some(calls),
            },
            logprobs,
            finish_reason: None,
        }))
    }

    /// The closing chat chunk of choice `index` (its finish reason).
    pub fn chat_finish(&self, index: u32, finish_reason: &'static str) -> String {
        self.chat(ChunkChoice {
            index,
            delta: ChunkDelta::default(),
            logprobs: None,
            finish_reason: Some(finish_reason),
        })
    }

    /// The usage chunk after every choice finished (only with `include_usage`).
    pub fn chat_usage(&self, usage: Usage) -> Option<String> {
        self.include_usage.then(|| {
            json(&ChatChunk {
                id: self.id.clone(),
                object: "chat.completion.chunk",
                created: self.created,
                model: self.model.clone(),
                choices: vec![],
                usage: Some(Some(usage)),
            })
        })
    }

    fn completion(&self, choices: Vec<CompletionChoice>, usage: Option<Option<Usage>>) -> String {
        json(&Completion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        })
    }

    /// A completions chunk of choice `index` for `d` (completions have no reasoning channel).
    pub fn completion_delta(
        &self,
        index: u32,
        d: Delta,
        logprobs: Option<CompletionLogprobs>,
    ) -> Option<String> {
        let text = d.content;
        (!text.is_empty() || logprobs.is_some()).then(|| {
            let choice = CompletionChoice {
                index,
                text,
                logprobs,
                finish_reason: None,
            };
            self.completion(vec![choice], self.usage_slot())
        })
    }

    /// The closing completions chunk of choice `index`.
    pub fn completion_finish(&self, index: u32, finish_reason: &'static str) -> String {
        let choice = CompletionChoice {
            index,
            text: String::new(),
            logprobs: None,
            finish_reason: Some(finish_reason),
        };
        self.completion(vec![choice], self.usage_slot())
    }

    /// The completions usage chunk (only with `include_usage`).
    pub fn completion_usage(&self, usage: Usage) -> Option<String> {
        self.include_usage
            .then(|| self.completion(vec![], Some(Some(usage))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(include_usage: bool) -> ChunkHeader {
        ChunkHeader {
            id: "chatcmpl-1".into(),
            created: 7,
            model: "m".into(),
            include_usage,
        }
    }

    #[test]
    fn chat_chunks_are_openai_shaped() {
        let h = header(true);
        assert_eq!(
            h.chat_role(0),
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}"#
        );
        let d = Delta {
            reasoning: "r".into(),
            ..Default::default()
        };
        assert_eq!(
            h.chat_delta(0, d, None).unwrap(),
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"reasoning_content":"r"},"logprobs":null,"finish_reason":null}],"usage":null}"#
        );
        assert_eq!(h.chat_delta(0, Delta::default(), None), None);
        let usage = h.chat_usage(Usage::new(3, 2, 1)).unwrap();
        assert_eq!(
            usage,
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5,"prompt_tokens_details":{"cached_tokens":1}}}"#
        );
        let h = header(false);
        assert_eq!(h.chat_usage(Usage::new(1, 1, 0)), None);
        let end = h.chat_finish(0, "length");
        assert!(!end.contains("usage"));
        assert!(end.contains(r#""finish_reason":"length""#));
    }

    #[test]
    fn completion_chunks_and_bodies() {
        let h = header(false);
        let d = Delta {
            content: "hi".into(),
            ..Default::default()
        };
        assert_eq!(
            h.completion_delta(0, d, None).unwrap(),
            r#"{"id":"chatcmpl-1","object":"text_completion","created":7,"model":"m","choices":[{"index":0,"text":"hi","logprobs":null,"finish_reason":null}]}"#
        );
        let msg = AssistantMessage {
            role: "assistant",
            content: Some("a".into()),
            reasoning_content: None,
            tool_calls: None,
        };
        let body = ChatCompletion {
            id: "x".into(),
            object: "chat.completion",
            created: 1,
            model: "m".into(),
            choices: vec![ChatChoice {
                index: 0,
                message: msg,
                logprobs: None,
                finish_reason: "stop",
            }],
            usage: Usage::new(1, 2, 0),
        };
        assert_eq!(
            serde_json::to_string(&body).unwrap(),
            r#"{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"a"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3,"prompt_tokens_details":{"cached_tokens":0}}}"#
        );
    }
}
