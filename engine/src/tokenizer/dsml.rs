//! DeepSeek-V3.2's native prompt encoder (DSML tool calls).
//!
//! DeepSeek-V3.2 ships no Jinja template: its release renders prompts with a Python program,
//! `encoding/encoding_dsv32.py` (`encode_messages`), and this module renders the same text.
//! What it does, in the reference's order:
//! * `<｜begin▁of▁sentence｜>`, then each message;
//! * a user turn is `<｜User｜>{content}<｜Assistant｜>`, then `<think>` when thinking and it is the
//!   last user (or developer) turn, else `</think>`;
//! * a developer turn is a user turn holding the tools block and `# The user's message is: …`;
//! * an assistant turn is `{reasoning}</think>` (thinking, after the last user turn only),
//!   the content, the calls as a `<｜DSML｜function_calls>` block, and `<｜end▁of▁sentence｜>`;
//!   an argument is `string="true"` with the raw text when it is a JSON string, else
//!   `string="false"` with its JSON (`json.dumps`, `ensure_ascii=False`);
//! * tool results answer the calls of the assistant turn before them, in order, inside one
//!   `<function_results>` block of `<result>…</result>` lines, followed by `<think>` or `</think>`
//!   as after a user turn;
//! * with thinking on, reasoning before the last user turn is dropped (the reference's
//!   `drop_thinking_messages`; a developer turn there makes the reference fail, so it is refused).
//!
//! Request conventions (as vLLM and SGLang call the reference): `tools` join the first message
//! when it is a system message, else an empty system message that carries them is put first;
//! thinking is on when `extra` sets `thinking` or `enable_thinking` true. The reference has no
//! generation-prompt switch: a prompt ending in a user or tool turn always ends with the assistant
//! opener. Where the reference asserts, this returns [`Error::InvalidArgument`].

use serde_json::{Map, Value};

use super::chat::{ChatMessage, ChatOptions, py_dumps};
use crate::error::{Error, Result};

pub(super) const USER: &str = "<｜User｜>";
pub(super) const ASSISTANT: &str = "<｜Assistant｜>";
pub(super) const BOS: &str = "<｜begin▁of▁sentence｜>";
pub(super) const EOS: &str = "<｜end▁of▁sentence｜>";
pub(super) const THINK: &str = "<think>";
pub(super) const THINK_END: &str = "</think>";
pub(super) const DSML: &str = "｜DSML｜";

/// Every marker the encoder writes: added tokens among them are the control tokens that user
/// text cannot forge (the role a Jinja template's source plays for templated tokenizers).
pub(crate) const MARKERS: &str =
    "<｜begin▁of▁sentence｜><｜end▁of▁sentence｜><｜User｜><｜Assistant｜><think></think>｜DSML｜";

/// Which of DeepSeek's native encoders renders a checkpoint that ships no chat template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DsmlVersion {
    /// DeepSeek-V3.2 (`encoding_dsv32.py`): `<｜DSML｜function_calls>` blocks (this module).
    V32,
    /// DeepSeek-V4 (`encoding_dsv4.py`): `<｜DSML｜tool_calls>` blocks ([`super::dsml_v4`]).
    V4,
}

impl DsmlVersion {
    /// The encoder of a `config.json` `model_type`, when it is one of DeepSeek's DSML families.
    pub(crate) fn of_model_type(model_type: &str) -> Option<Self> {
        match model_type {
            "deepseek_v32" => Some(DsmlVersion::V32),
            "deepseek_v4" => Some(DsmlVersion::V4),
            _ => None,
        }
    }

    /// The text that opens a call block in the output (the reference's
    /// `tool_calls_start_token`).
    pub const fn block_start(self) -> &'static str {
        match self {
            DsmlVersion::V32 => "\n\n<｜DSML｜function_calls",
            DsmlVersion::V4 => "\n\n<｜DSML｜tool_calls",
        }
    }

    /// The tag that closes a call block.
    pub const fn block_end(self) -> &'static str {
        match self {
            DsmlVersion::V32 => "</｜DSML｜function_calls>",
            DsmlVersion::V4 => "</｜DSML｜tool_calls>",
        }
    }
}

/// One message as the reference sees it (`tools` only on the message that carries them).
#[derive(Clone)]
struct Turn<'a> {
    msg: &'a ChatMessage,
    tools: Option<&'a [Value]>,
    /// The reasoning kept (dropped before the last user turn when thinking).
    reasoning: Option<&'a str>,
}

/// Render `messages` with `opts` as `encode_messages(messages, thinking_mode)` does.
pub(crate) fn render(messages: &[ChatMessage], opts: &ChatOptions) -> Result<String> {
    let thinking = ["thinking", "enable_thinking"]
        .iter()
        .any(|k| opts.extra.get(*k).and_then(Value::as_bool) == Some(true));
    let tools = opts.tools.as_deref().filter(|t| !t.is_empty());
    let system = ChatMessage::new("system", "");
    let mut turns: Vec<Turn<'_>> = Vec::with_capacity(messages.len() + 1);
    if tools.is_some() && messages.first().is_none_or(|m| m.role != "system") {
        turns.push(Turn {
            msg: &system,
            tools,
            reasoning: None,
        });
    }
    for m in messages {
        let tools = if turns.is_empty() { tools } else { None };
        turns.push(Turn {
            msg: m,
            tools,
            reasoning: m.reasoning_content.as_deref(),
        });
    }
    if thinking {
        turns = drop_thinking(turns)?;
    }
    let last = last_user(&turns);
    let mut prompt = String::from(BOS);
    for i in 0..turns.len() {
        prompt.push_str(&render_turn(i, &turns, thinking, last)?);
    }
    Ok(prompt)
}

/// The last user or developer turn (`None`: there is none; the reference's -1).
fn last_user(turns: &[Turn<'_>]) -> Option<usize> {
    turns
        .iter()
        .rposition(|t| matches!(t.msg.role.as_str(), "user" | "developer"))
}

/// The reference's `drop_thinking_messages`: before the last user turn, assistant reasoning is
/// dropped. It would also drop the turns other than user, system, tool and assistant there
/// (a developer turn), and then index past the shortened list: the reference fails on such a
/// conversation, so it is refused here.
fn drop_thinking(mut turns: Vec<Turn<'_>>) -> Result<Vec<Turn<'_>>> {
    let last = last_user(&turns).unwrap_or(0);
    for (i, t) in turns.iter_mut().enumerate().take(last) {
        match t.msg.role.as_str() {
            "user" | "system" | "tool" => {}
            "assistant" => t.reasoning = None,
            other => {
                return Err(invalid(format!(
                    "message {i}: DeepSeek-V3.2's encoder cannot drop a `{other}` message before the last user message with thinking on"
                )));
            }
        }
    }
    Ok(turns)
}

pub(super) fn invalid(reason: String) -> Error {
    Error::InvalidArgument {
        field: "messages",
        reason,
    }
}

/// `<think>` when thinking and at or past the last user turn, else `</think>`.
fn think_opener(thinking: bool, at_or_after_last_user: bool) -> &'static str {
    if thinking && at_or_after_last_user {
        THINK
    } else {
        THINK_END
    }
}

/// Turn `index`; `last`: the last user turn.
fn render_turn(index: usize, turns: &[Turn<'_>], thinking: bool, last: Option<usize>) -> Result<String> {
    let turn = &turns[index];
    let msg = turn.msg;
    let mut out = String::new();
    match msg.role.as_str() {
        "system" => {
            out.push_str(&msg.content);
            if let Some(tools) = turn.tools {
                out.push_str("\n\n");
                out.push_str(&tools_block(tools)?);
            }
        }
        "developer" => {
            if msg.content.is_empty() {
                return Err(invalid("a developer message needs content".into()));
            }
            let mut body = String::new();
            if let Some(tools) = turn.tools {
                body.push_str("\n\n");
                body.push_str(&tools_block(tools)?);
            }
            body.push_str("\n\n# The user's message is: ");
            body.push_str(&msg.content);
            out.push_str(&format!("{USER}{body}{ASSISTANT}"));
            out.push_str(think_opener(thinking, Some(index) == last));
        }
        "user" => {
            out.push_str(&format!("{USER}{}{ASSISTANT}", msg.content));
            out.push_str(think_opener(thinking, Some(index) == last));
        }
        "tool" => out.push_str(&tool_result(index, turns, thinking, last)?),
        "assistant" => out.push_str(&assistant(index, turn, thinking, last)?),
        other => return Err(invalid(format!("DeepSeek-V3.2 has no `{other}` role"))),
    }
    Ok(out)
}

/// A tool result: the `order`-th answer to the calls of the assistant turn before it.
fn tool_result(index: usize, turns: &[Turn<'_>], thinking: bool, last: Option<usize>) -> Result<String> {
    let Some(caller) = turns[..index].iter().rposition(|t| t.msg.role != "tool") else {
        return Err(invalid(format!(
            "message {index}: a tool result without an assistant call before it"
        )));
    };
    if turns[caller].msg.role != "assistant" {
        return Err(invalid(format!(
            "message {index}: a tool result must follow an assistant's calls"
        )));
    }
    let order = index - caller;
    let calls = turns[caller].msg.tool_calls.as_deref().unwrap_or_default();
    if calls.len() < order {
        return Err(invalid(format!(
            "message {index}: tool result {order} answers an assistant message with {} tool calls",
            calls.len()
        )));
    }
    let mut out = String::new();
    if order == 1 {
        out.push_str("\n\n<function_results>");
    }
    out.push_str(&format!("\n<result>{}</result>", turns[index].msg.content));
    if order == calls.len() {
        out.push_str("\n</function_results>\n\n");
        out.push_str(think_opener(thinking, last.is_none_or(|l| index >= l)));
    }
    Ok(out)
}

fn assistant(index: usize, turn: &Turn<'_>, thinking: bool, last: Option<usize>) -> Result<String> {
    let calls = turn.msg.tool_calls.as_deref().filter(|c| !c.is_empty());
    let mut out = String::new();
    if thinking && last.is_none_or(|l| index > l) {
        if turn.reasoning.is_none_or(str::is_empty) && calls.is_none() {
            return Err(invalid(format!(
                "message {index}: with thinking on, an assistant message after the last user message needs reasoning_content or tool_calls"
            )));
        }
        out.push_str(turn.reasoning.unwrap_or_default());
        out.push_str(THINK_END);
    }
    out.push_str(&turn.msg.content);
    if let Some(calls) = calls {
        let invokes = calls.iter().map(invoke).collect::<Result<Vec<_>>>()?;
        out.push_str(&format!(
            "\n\n<{DSML}function_calls>\n{}\n</{DSML}function_calls>",
            invokes.join("\n")
        ));
    }
    out.push_str(EOS);
    Ok(out)
}

/// One OpenAI-shaped call as `<｜DSML｜invoke name="…">` with a parameter per argument.
fn invoke(call: &Value) -> Result<String> {
    invoke_with(call, false)
}

/// [`invoke`]; `lenient`: arguments that are not JSON become one `arguments` parameter holding
/// the text (V4's `encode_arguments_to_dsml`) instead of an error (V3.2's).
pub(super) fn invoke_with(call: &Value, lenient: bool) -> Result<String> {
    let function = call.get("function").unwrap_or(call);
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("a tool call without a function name".into()))?;
    let arguments = match function.get("arguments") {
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(v) => v,
            Err(_) if lenient => serde_json::json!({ "arguments": s }),
            Err(e) => {
                return Err(invalid(format!(
                    "tool call `{name}`: arguments are not JSON: {e}"
                )));
            }
        },
        Some(v) => v.clone(),
        None => Value::Object(Map::new()),
    };
    let Value::Object(arguments) = arguments else {
        return Err(invalid(format!(
            "tool call `{name}`: arguments must be a JSON object"
        )));
    };
    let mut params = Vec::with_capacity(arguments.len());
    for (key, value) in &arguments {
        let (string, text) = match value {
            Value::String(s) => ("true", s.clone()),
            other => ("false", py_dumps(other, false)?),
        };
        params.push(format!(
            "<{DSML}parameter name=\"{key}\" string=\"{string}\">{text}</{DSML}parameter>"
        ));
    }
    Ok(format!(
        "<{DSML}invoke name=\"{name}\">\n{}\n</{DSML}invoke>",
        params.join("\n")
    ))
}

/// The reference's `TOOLS_SYSTEM_TEMPLATE` with each tool's `function` as one JSON line.
fn tools_block(tools: &[Value]) -> Result<String> {
    let schemas = tools
        .iter()
        .map(|t| py_dumps(t.get("function").unwrap_or(t), false))
        .collect::<Result<Vec<_>>>()?;
    Ok(format!(
        "## Tools\n\n\
You have access to a set of tools you can use to answer the user's question.\n\
You can invoke functions by writing a \"<{DSML}function_calls>\" block like the following as part of your reply to the user:\n\
<{DSML}function_calls>\n\
<{DSML}invoke name=\"$FUNCTION_NAME\">\n\
<{DSML}parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</{DSML}parameter>\n\
...\n\
</{DSML}invoke>\n\
<{DSML}invoke name=\"$FUNCTION_NAME2\">\n\
...\n\
</{DSML}invoke>\n\
</{DSML}function_calls>\n\n\
String and scalar parameters should be specified as is without any escaping or quotes, while lists and objects should use JSON format. \
The \"string\" attribute should be set to \"true\" for string type parameters and \"false\" for other types (numbers, booleans, arrays, objects).\n\n\
If the thinking_mode is enabled, then after function results you should strongly consider outputting a thinking block. Here is an example:\n\n\
<{DSML}function_calls>\n\
...\n\
</{DSML}function_calls>\n\n\
<function_results>\n\
...\n\
</function_results>\n\n\
{THINK}...thinking about results{THINK_END}\n\n\
Here are the functions available in JSONSchema format:\n\
<functions>\n\
{}\n\
</functions>\n",
        schemas.join("\n")
    ))
}
