//! The one chat pipeline behind `/v1/chat/completions`, `/v1/messages` and `/v1/responses`: a
//! typed [`ChatRequest`] becomes the prompt the model's own template or encoder renders (tools,
//! tool history, tool choice and response format included), the decode options (a grammar that
//! forces a call or a JSON answer, logit bias, penalties, log-probabilities) and `n` generations
//! sharing one prefill. Each API surface only translates its wire format into a `ChatRequest`
//! and a [`ChatRun`]'s steps back into its own.

use std::sync::Arc;
use std::time::Instant;

use deltafin_engine::constrain::{ReasoningBudget, Vocabulary};
use deltafin_engine::generate::{DecodeOptions, TokenLogprobs};
use deltafin_engine::spec::RequestKind;
use deltafin_engine::tokenizer::{
    ChatMessage, ChatOptions, DsmlVersion, arguments_as_objects, normalize_k2_tool_ids,
};
use deltafin_engine::tools::grammar::{self, Answer, Forced, FunctionSpec};
use deltafin_engine::tools::{ToolFormat, ToolMarkers};
use serde_json::Value;

use super::generation::{Generation, Step};
use super::output::{Delta, OutputParser};
use super::reasoning::Markers;
use super::request::{ChatRequest, Common, ResponseFormat, ToolChoice};
use super::types::Usage;
use crate::http::error::ApiError;
use crate::metrics::Endpoint;
use crate::state::{AppState, Loaded};

/// A chat request in flight: one [`Generation`] per choice.
#[derive(Debug)]
pub struct ChatRun {
    pub choices: Vec<Generation>,
    /// The served model id.
    pub model: String,
    /// A request-unique hex id (response ids and minted call ids derive from it).
    pub id: String,
    /// Prompt tokens (the same for every choice).
    pub prompt_tokens: usize,
    /// The prompt's ids.
    pub prompt: Vec<u32>,
    /// Whether tool calls are parsed out of the output.
    pub tools: bool,
}

/// One complete tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as a JSON string (as the model wrote them).
    pub arguments: String,
}

/// One finished choice.
#[derive(Debug, Clone, PartialEq)]
pub struct ChoiceOutcome {
    pub index: usize,
    pub reasoning: String,
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
    /// `stop`, `length` or `tool_calls`.
    pub finish_reason: &'static str,
    /// With `logprobs`: one entry per generated token.
    pub logprobs: Vec<TokenLogprobs>,
}

/// Every choice of a finished request.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatOutcome {
    pub choices: Vec<ChoiceOutcome>,
    /// The prompt's ids, and each choice's generated ids (stop ids included).
    pub prompt_token_ids: Vec<u32>,
    pub token_ids: Vec<Vec<u32>>,
    /// Summed over the choices (prompt tokens counted once).
    pub usage: Usage,
}

/// Collects the steps of one choice into a [`ChoiceOutcome`] (also used by streaming handlers
/// that need the whole answer at the end).
#[derive(Debug, Default)]
pub struct Accumulator {
    pub reasoning: String,
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
}

impl Accumulator {
    /// Add one step's output.
    pub fn push(&mut self, d: &Delta) {
        self.reasoning.push_str(&d.reasoning);
        self.content.push_str(&d.content);
        for t in &d.tool_calls {
            fold_call(
                &mut self.tool_calls,
                t.index,
                t.id.as_deref(),
                t.name.as_deref(),
                &t.arguments,
            );
        }
    }
}

/// Fold one streamed call fragment into `calls` (`index`: the call's; `id` and `name` on its
/// first fragment, then argument pieces).
pub fn fold_call(
    calls: &mut Vec<ToolCall>,
    index: usize,
    id: Option<&str>,
    name: Option<&str>,
    arguments: &str,
) {
    if index >= calls.len() {
        calls.resize_with(index + 1, || ToolCall {
            id: String::new(),
            name: String::new(),
            arguments: String::new(),
        });
    }
    let call = &mut calls[index];
    if let Some(id) = id {
        call.id = id.to_string();
    }
    if let Some(name) = name {
        call.name = name.to_string();
    }
    call.arguments.push_str(arguments);
}

impl ChatRun {
    /// Run every choice to its end (choices in index order; they run concurrently in the engine).
    pub async fn collect(self) -> Result<ChatOutcome, ApiError> {
        let mut choices = Vec::with_capacity(self.choices.len());
        let mut token_ids = Vec::with_capacity(self.choices.len());
        let mut usage = Usage::new(self.prompt_tokens, 0, 0);
        for (index, mut g) in self.choices.into_iter().enumerate() {
            let mut acc = Accumulator::default();
            let mut logprobs = Vec::new();
            let finish = loop {
                match g.next().await {
                    Some(Step::Text(d)) => acc.push(&d),
                    Some(Step::Failed(e)) => return Err(e),
                    Some(Step::Finished { reason, usage: u }) => break (reason, u),
                    None => return Err(ApiError::Internal("generation ended without a result")),
                }
                logprobs.extend(g.take_logprobs());
            };
            logprobs.extend(g.take_logprobs());
            token_ids.push(g.output_ids().to_vec());
            let (reason, u) = finish;
            usage = Usage::new(
                self.prompt_tokens,
                usage.completion_tokens + u.completion_tokens,
                u.prompt_tokens_details
                    .cached_tokens
                    .max(usage.prompt_tokens_details.cached_tokens),
            );
            choices.push(ChoiceOutcome {
                index,
                reasoning: acc.reasoning,
                content: acc.content,
                tool_calls: acc.tool_calls,
                finish_reason: reason,
                logprobs,
            });
        }
        Ok(ChatOutcome {
            choices,
            prompt_token_ids: self.prompt,
            token_ids,
            usage,
        })
    }
}

/// Validate, render and submit a chat request.
pub fn start(
    app: &AppState,
    req: &ChatRequest,
    endpoint: Endpoint,
    started: Instant,
) -> Result<ChatRun, ApiError> {
    let loaded = app.loaded()?;
    super::handlers::check_model(&loaded, &req.common)?;
    let tools_on = tools_callable(req);
    if tools_on && loaded.tool_format.is_none() {
        return Err(ApiError::unsupported(
            "tools",
            "`tools`: this model's tokenizer has no native tool-call format (supported: Kimi K2, Kimi K3, DeepSeek-V3, Qwen hermes, Qwen3.5 XML, GLM, MiniMax-M2, gpt-oss harmony, DeepSeek-V3.2 and V4 DSML)",
        ));
    }
    let (prompt, thinking) = render(&loaded, req)?;
    if app.config().log_prompts {
        tracing::info!(messages = ?req.messages, "chat prompt");
    }
    let limit = req.common.max_tokens.unwrap_or(app.config().limits.max_tokens);
    let decode = decode_options(&loaded, req, &req.common, thinking, limit)?;
    let id = super::handlers::random_hex();
    let parsers = (0..req.common.n)
        .map(|i| {
            let p = OutputParser::new(
                Arc::clone(&loaded.tokenizer),
                loaded.markers.clone(),
                &prompt,
                req.common.stop.clone(),
            );
            match loaded.tool_format.filter(|_| tools_on) {
                Some(f) => p
                    .with_tools(f, format!("{id}{i}"), tool_schemas(req))
                    .malformed_as_text(app.config().malformed_calls_as_text),
                None => p,
            }
        })
        .collect();
    let prompt_tokens = prompt.len();
    let prompt_ids = prompt.clone();
    let gen_req = super::handlers::gen_request(app, &loaded, endpoint, &req.common, prompt, decode)?;
    let mut choices = Generation::submit_choices(app, &loaded, endpoint, gen_req, parsers, started)?;
    let named = matches!(req.tool_choice, ToolChoice::Named(_));
    choices.iter_mut().for_each(|g| g.set_named_choice(named));
    Ok(ChatRun {
        choices,
        model: loaded.model_id.clone(),
        id,
        prompt_tokens,
        prompt: prompt_ids,
        tools: tools_on,
    })
}

/// Each requested tool's `parameters` schema by name (the XML-like formats' values are typed by it).
fn tool_schemas(req: &ChatRequest) -> std::collections::HashMap<String, Value> {
    req.tools
        .iter()
        .map(|t| (t.name.clone(), t.parameters.clone()))
        .collect()
}

/// The prompt ids, and whether the generation prompt opened a thinking channel.
pub fn render(loaded: &Loaded, req: &ChatRequest) -> Result<(Vec<u32>, bool), ApiError> {
    render_with(loaded, req, true)
}

/// [`render`], with or without the generation prompt (`/tokenize`'s `add_generation_prompt`).
pub fn render_with(
    loaded: &Loaded,
    req: &ChatRequest,
    add_generation_prompt: bool,
) -> Result<(Vec<u32>, bool), ApiError> {
    let mut messages: Vec<ChatMessage> = req.messages.clone();
    if loaded.tool_format == Some(ToolFormat::KimiK2) {
        normalize_k2_tool_ids(&mut messages);
    }
    if loaded
        .tool_format
        .is_none_or(ToolFormat::history_arguments_as_objects)
    {
        arguments_as_objects(&mut messages);
    }
    let mut extra = req.template_kwargs.clone();
    if let Some(effort) = &req.reasoning_effort {
        let model = (loaded.tool_format, loaded.tokenizer.dsml_version());
        for (key, value) in effort_kwargs(model, effort.as_deref())? {
            extra.insert(key.into(), value);
        }
    }
    let opts = ChatOptions {
        add_generation_prompt,
        tools: (!req.tools.is_empty()).then(|| req.tools.iter().map(|t| t.to_openai()).collect()),
        extra,
        tool_choice: (!req.tools.is_empty()).then(|| req.tool_choice.label().to_string()),
        response_format: req.response_format.to_openai(),
    };
    let prompt = loaded.tokenizer.encode_chat(&messages, &opts).map_err(|e| {
        ApiError::field(
            "messages",
            format!("the chat template cannot render these messages: {e}"),
        )
    })?;
    let thinking = super::reasoning::opens_thinking(loaded.markers.as_ref(), &prompt);
    Ok((prompt, thinking))
}

/// The template variables a request's `reasoning_effort` sets (`None`: thinking off): Kimi K3's
/// `thinking_effort` (low, high, max) or `thinking: false`; gpt-oss's `reasoning_effort` (low,
/// medium, high: harmony's system message; gpt-oss cannot stop reasoning); DeepSeek-V4's
/// thinking mode with `reasoning_effort` high or max (its encoder's), or `thinking: false`.
/// Other models have no effort control.
fn effort_kwargs(
    (format, dsml): (Option<ToolFormat>, Option<DsmlVersion>),
    effort: Option<&str>,
) -> Result<Vec<(&'static str, Value)>, ApiError> {
    if format == Some(ToolFormat::Dsml) && dsml == Some(DsmlVersion::V4) {
        return match effort {
            None => Ok(vec![("thinking", Value::Bool(false))]),
            Some(e @ ("high" | "max")) => Ok(vec![
                ("thinking", Value::Bool(true)),
                ("reasoning_effort", Value::from(e)),
            ]),
            Some(_) => Err(ApiError::unsupported(
                "reasoning_effort",
                "`reasoning_effort`: DeepSeek-V4 thinks at high or max effort, or not at all (none)",
            )),
        };
    }
    effort_kwarg(format, effort).map(|kv| vec![kv])
}

/// [`effort_kwargs`] for the models with one variable.
fn effort_kwarg(format: Option<ToolFormat>, effort: Option<&str>) -> Result<(&'static str, Value), ApiError> {
    let refuse = |msg: &str| {
        Err(ApiError::unsupported(
            "reasoning_effort",
            format!("`reasoning_effort`: {msg}"),
        ))
    };
    match (format, effort) {
        (Some(ToolFormat::KimiK3), None) => Ok(("thinking", Value::Bool(false))),
        (Some(ToolFormat::KimiK3), Some("medium")) => {
            refuse("Kimi K3's thinking_effort accepts low, high and max (\"medium\" has no equivalent)")
        }
        (Some(ToolFormat::KimiK3), Some(e)) => Ok(("thinking_effort", Value::from(e))),
        (Some(ToolFormat::Harmony), Some(e @ ("low" | "medium" | "high"))) => {
            Ok(("reasoning_effort", Value::from(e)))
        }
        (Some(ToolFormat::Harmony), _) => refuse("gpt-oss accepts low, medium and high (it always reasons)"),
        _ => refuse(
            "this model has no reasoning-effort control (Kimi K3's thinking_effort and gpt-oss's reasoning effort are supported)",
        ),
    }
}

/// Decode options of a chat request: bias, penalties, log-probabilities and the grammar;
/// `thinking`: the prompt opened reasoning; `limit`: the tokens the request may write.
fn decode_options(
    loaded: &Loaded,
    req: &ChatRequest,
    common: &Common,
    thinking: bool,
    limit: usize,
) -> Result<DecodeOptions, ApiError> {
    let mut decode = sampling_options(common);
    let forced = match &req.tool_choice {
        ToolChoice::Required => Some(Forced::Required),
        ToolChoice::Named(n) => Some(Forced::Named(n.clone())),
        _ => None,
    };
    let grammar_text = match (forced, &req.response_format) {
        (Some(forced), _) => {
            let markers = loaded.tool_markers.as_ref().ok_or_else(|| {
                ApiError::unsupported("tool_choice", "this model has no native tool-call format")
            })?;
            let specs: Vec<FunctionSpec> = req
                .tools
                .iter()
                .map(|t| FunctionSpec {
                    name: t.name.clone(),
                    parameters: t.parameters.clone(),
                })
                .collect();
            let g = grammar::forced_call_grammar(markers, &specs, forced, req.parallel_tool_calls, thinking)
                .map_err(|e| ApiError::field("tools", format!("cannot constrain this tool call: {e}")))?;
            Some((g, "tools"))
        }
        (None, ResponseFormat::Text) => None,
        // With `auto` the model may call a tool instead of answering: the answer format is
        // then rendered into the prompt where the template does so (K3) but not enforced, so a
        // call stays possible. It is enforced when no call can be made (no tools, or `none`).
        (None, _) if tools_callable(req) => None,
        (None, rf) => {
            let schema = match rf {
                ResponseFormat::JsonSchema { schema, .. } => Some(schema),
                _ => None,
            };
            let answer = match &loaded.tool_markers {
                Some(m) => Answer::Native(m),
                None => Answer::Plain {
                    end_of_turn: chat_end_id(loaded).ok_or_else(|| {
                        ApiError::unsupported(
                            "response_format",
                            "this model has no end-of-turn token to end JSON",
                        )
                    })?,
                    think_close: match &loaded.markers {
                        Some(Markers::Think(t)) => Some(t.close),
                        _ => None,
                    },
                },
            };
            let g = grammar::json_response_grammar(answer, schema, thinking).map_err(|e| {
                ApiError::field(
                    "response_format",
                    format!("Invalid schema for response_format: {e}"),
                )
            })?;
            Some((g, "response_format"))
        }
    };
    if let Some((text, param)) = grammar_text {
        let vocab: Arc<Vocabulary> = loaded.vocabulary()?;
        let mut g = vocab.lark(&text).map_err(|e| match param {
            "response_format" => ApiError::field(param, format!("Invalid schema for response_format: {e}")),
            _ => ApiError::field(param, format!("Invalid schema for function parameters: {e}")),
        })?;
        // Reasoning before a forced call or JSON takes at most half the token limit.
        if let Some(close) = reasoning_close(loaded, thinking) {
            g = g.with_reasoning_budget(ReasoningBudget::half_of(limit, close));
        }
        // A stop token ends the output only where it completes the grammar.
        let stops: Vec<u32> = loaded
            .stop_ids
            .iter()
            .chain(&loaded.chat_stop_ids)
            .copied()
            .collect();
        decode.constraint = Some(g.with_stop_ids(&stops));
    }
    Ok(decode)
}

/// The token that ends reasoning the output may open with: `</think>` or K3's `<|close|>`
/// when the prompt opened it (`thinking`); harmony's `<|end|>` always (gpt-oss opens its own
/// `analysis` message).
fn reasoning_close(loaded: &Loaded, thinking: bool) -> Option<u32> {
    match (&loaded.markers, &loaded.tool_markers) {
        (_, Some(ToolMarkers::Harmony(h))) => Some(h.end),
        (Some(Markers::Think(t)), _) if thinking => Some(t.close),
        (Some(Markers::Xtml(x)), _) if thinking => Some(x.close),
        _ => None,
    }
}

/// Whether the model may call a tool in this turn.
fn tools_callable(req: &ChatRequest) -> bool {
    !req.tools.is_empty() && req.tool_choice != ToolChoice::None
}

/// The token that ends a chat turn: the first chat stop id, else EOS.
fn chat_end_id(loaded: &Loaded) -> Option<u32> {
    loaded
        .chat_stop_ids
        .first()
        .or(loaded.stop_ids.first())
        .copied()
        .or(loaded.tokenizer.eos_id())
}

/// Bias, penalties and log-probabilities of `common` (no constraint).
pub fn sampling_options(common: &Common) -> DecodeOptions {
    let s = &common.sampling;
    DecodeOptions {
        logit_bias: s.logit_bias.clone(),
        presence_penalty: s.presence_penalty,
        frequency_penalty: s.frequency_penalty,
        repetition_penalty: s.repetition_penalty,
        logprobs: common.logprobs.then_some(common.top_logprobs),
        constraint: None,
    }
}

/// The kind of request for the draft proposers.
pub fn kind_of(endpoint: Endpoint) -> RequestKind {
    if endpoint == Endpoint::Completions {
        RequestKind::Completion
    } else {
        RequestKind::Chat
    }
}

#[cfg(test)]
mod effort_tests {
    use super::*;

    /// DeepSeek-V4 (DSML, V4's encoder): none is chat mode, high and max think with that effort,
    /// others are refused; V3.2 has no effort control.
    #[test]
    fn deepseek_v4_efforts_map_to_its_encoder() {
        let v4 = (Some(ToolFormat::Dsml), Some(DsmlVersion::V4));
        assert_eq!(
            effort_kwargs(v4, None).unwrap(),
            vec![("thinking", Value::Bool(false))]
        );
        assert_eq!(
            effort_kwargs(v4, Some("max")).unwrap(),
            vec![
                ("thinking", Value::Bool(true)),
                ("reasoning_effort", Value::from("max"))
            ]
        );
        assert!(effort_kwargs(v4, Some("low")).is_err());
        assert!(effort_kwargs((Some(ToolFormat::Dsml), Some(DsmlVersion::V32)), Some("high")).is_err());
    }
}
