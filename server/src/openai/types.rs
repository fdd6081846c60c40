//! OpenAI response objects, serialised exactly as OpenAI does (`null` where OpenAI sends
//! `null`, optional extensions omitted when absent), and the SSE chunk builders (pure).

use serde::Serialize;

use super::output::Delta;

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
    pub content: String,
    /// The thinking, when the chat format separates it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<()>,
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
    pub logprobs: Option<()>,
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
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: ChunkDelta,
    pub logprobs: Option<()>,
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

    fn chat(&self, delta: ChunkDelta, finish_reason: Option<&'static str>) -> String {
        let choice = ChunkChoice {
            index: 0,
            delta,
            logprobs: None,
            finish_reason,
        };
        json(&ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices: vec![choice],
            usage: self.usage_slot(),
        })
    }

    /// The first chat chunk: the assistant role with empty content.
    pub fn chat_role(&self) -> String {
        self.chat(
            ChunkDelta {
                role: Some("assistant"),
                content: Some(String::new()),
                reasoning_content: None,
            },
            None,
        )
    }

    /// A chat chunk for `d` (`None` if there is nothing to send).
    pub fn chat_delta(&self, d: Delta) -> Option<String> {
        if d.is_empty() {
            return None;
        }
        let some = |s: String| (!s.is_empty()).then_some(s);
        Some(self.chat(
            ChunkDelta {
                role: None,
                content: some(d.content),
                reasoning_content: some(d.reasoning),
            },
            None,
        ))
    }

    /// The closing chat chunks: the finish reason, then (with `include_usage`) the usage.
    pub fn chat_finish(&self, finish_reason: &'static str, usage: Usage) -> Vec<String> {
        let mut out = vec![self.chat(ChunkDelta::default(), Some(finish_reason))];
        if self.include_usage {
            out.push(json(&ChatChunk {
                id: self.id.clone(),
                object: "chat.completion.chunk",
                created: self.created,
                model: self.model.clone(),
                choices: vec![],
                usage: Some(Some(usage)),
            }));
        }
        out
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

    /// A completions chunk for `d` (its content; completions have no reasoning channel).
    pub fn completion_delta(&self, d: Delta) -> Option<String> {
        let text = d.content;
        (!text.is_empty()).then(|| {
            let choice = CompletionChoice {
                index: 0,
                text,
                logprobs: None,
                finish_reason: None,
            };
            self.completion(vec![choice], self.usage_slot())
        })
    }

    /// The closing completions chunks.
    pub fn completion_finish(&self, finish_reason: &'static str, usage: Usage) -> Vec<String> {
        let choice = CompletionChoice {
            index: 0,
            text: String::new(),
            logprobs: None,
            finish_reason: Some(finish_reason),
        };
        let mut out = vec![self.completion(vec![choice], self.usage_slot())];
        if self.include_usage {
            out.push(self.completion(vec![], Some(Some(usage))));
        }
        out
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
            h.chat_role(),
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}"#
        );
        let d = Delta {
            reasoning: "r".into(),
            content: String::new(),
        };
        assert_eq!(
            h.chat_delta(d).unwrap(),
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"reasoning_content":"r"},"logprobs":null,"finish_reason":null}],"usage":null}"#
        );
        assert_eq!(h.chat_delta(Delta::default()), None);
        let end = h.chat_finish("stop", Usage::new(3, 2, 1));
        assert_eq!(
            end[1],
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5,"prompt_tokens_details":{"cached_tokens":1}}}"#
        );
        let no_usage = header(false).chat_finish("length", Usage::new(1, 1, 0));
        assert_eq!(no_usage.len(), 1);
        assert!(!no_usage[0].contains("usage"));
        assert!(no_usage[0].contains(r#""finish_reason":"length""#));
    }

    #[test]
    fn completion_chunks_and_bodies() {
        let h = header(false);
        let d = Delta {
            reasoning: String::new(),
            content: "hi".into(),
        };
        assert_eq!(
            h.completion_delta(d).unwrap(),
            r#"{"id":"chatcmpl-1","object":"text_completion","created":7,"model":"m","choices":[{"index":0,"text":"hi","logprobs":null,"finish_reason":null}]}"#
        );
        let msg = AssistantMessage {
            role: "assistant",
            content: "a".into(),
            reasoning_content: None,
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
