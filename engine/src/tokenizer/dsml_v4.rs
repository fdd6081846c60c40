//! DeepSeek-V4's native prompt encoder (`encoding/encoding_dsv4.py`, `encode_messages`; V4 ships
//! no Jinja template). What it renders, in the reference's order:
//! * `<｜begin▁of▁sentence｜>`; with thinking and `reasoning_effort` `max`, the maximum-effort
//!   preamble before the first message;
//! * tool results are not a role of their own: each joins a user turn as
//!   `<tool_result>{content}</tool_result>`, and a user message after them (or after another
//!   user message) joins the same turn, its parts separated by a blank line; results are put in
//!   the order of the calls they answer (by id);
//! * a system turn is its content, then the tools block (`## Tools`, the DSML example and one
//!   JSON line per tool);
//! * a user turn is `<｜User｜>{content}`; a developer turn the same with the tools block after
//!   its content;
//! * an assistant turn is `{reasoning}</think>` (thinking: every turn when history reasoning
//!   is kept, else only after the last user turn), the content, the calls as
//!   `\n\n<｜DSML｜tool_calls>` … `</｜DSML｜tool_calls>`, and `<｜end▁of▁sentence｜>`;
//! * a user or developer turn followed by an assistant turn, or the last one, is closed by
//!   `<｜Assistant｜>` and `<think>` (thinking, and reasoning kept or at the last user turn) or
//!   `</think>`;
//! * with thinking on and no tools anywhere, reasoning and developer turns before the last user
//!   turn are dropped (`drop_thinking`); tools keep every reasoning.
//!
//! Arguments are written as the reference's `encode_arguments_to_dsml`: a string value raw with
//! `string="true"`, any other JSON value as `json.dumps` with `string="false"`; arguments that
//! are not JSON become one `arguments` parameter holding the text. Request conventions are
//! [`super::dsml`]'s: `tools` join the first message when it is a system message, else an empty
//! system message carrying them is put first; thinking is on when `extra` sets `thinking` or
//! `enable_thinking`; `extra.reasoning_effort` is `max`, `high` or absent.

use serde_json::Value;

use super::chat::{ChatMessage, ChatOptions, py_dumps};
use super::dsml::{ASSISTANT, BOS, DSML, EOS, THINK, THINK_END, USER, invalid, invoke_with};
use crate::error::Result;

const REMINDER: &str = "<｜latest_reminder｜>";

/// Every marker the encoder writes (the control tokens user text cannot forge).
pub(crate) const MARKERS: &str = "<｜begin▁of▁sentence｜><｜end▁of▁sentence｜><｜User｜><｜Assistant｜><｜latest_reminder｜><think></think>｜DSML｜";

/// The reference's `REASONING_EFFORT_MAX`.
const EFFORT_MAX: &str = "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n\
You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n\
Explicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

/// One turn after tool results are merged into user turns.
#[derive(Debug, Clone)]
struct Turn<'a> {
    role: &'a str,
    /// User turns: their parts (text, or a tool result's content with its call id).
    parts: Vec<Part<'a>>,
    msg: Option<&'a ChatMessage>,
    tools: Option<&'a [Value]>,
    reasoning: Option<&'a str>,
}

#[derive(Debug, Clone)]
enum Part<'a> {
    Text(&'a str),
    Result { id: &'a str, content: &'a str },
}

/// Render `messages` with `opts` as `encode_messages(messages, thinking_mode, reasoning_effort)`.
pub(crate) fn render(messages: &[ChatMessage], opts: &ChatOptions) -> Result<String> {
    let thinking = ["thinking", "enable_thinking"]
        .iter()
        .any(|k| opts.extra.get(*k).and_then(Value::as_bool) == Some(true));
    let effort = match opts.extra.get("reasoning_effort") {
        None | Some(Value::Null) => None,
        Some(Value::String(e)) if e == "max" || e == "high" => Some(e.as_str()),
        Some(other) => return Err(invalid(format!("reasoning_effort {other}: max, high or none"))),
    };
    let tools = opts.tools.as_deref().filter(|t| !t.is_empty());
    let mut turns = merge(messages, tools)?;
    sort_results(&mut turns);
    // Tools anywhere keep every reasoning (the reference's `effective_drop_thinking`).
    let drop = thinking && tools.is_none();
    if drop {
        turns = drop_thinking(turns);
    }
    let last = turns.iter().rposition(|t| matches!(t.role, "user" | "developer"));
    let mut prompt = String::from(BOS);
    for i in 0..turns.len() {
        if i == 0 && thinking && effort == Some("max") {
            prompt.push_str(EFFORT_MAX);
        }
        prompt.push_str(&render_turn(i, &turns, (thinking, drop), last)?);
    }
    Ok(prompt)
}

/// The reference's `merge_tool_messages`: tool results and user messages that follow a user
/// turn join it; `tools` go on the first message when it is a system message, else on an empty
/// system turn put first.
fn merge<'a>(messages: &'a [ChatMessage], tools: Option<&'a [Value]>) -> Result<Vec<Turn<'a>>> {
    let mut turns: Vec<Turn<'a>> = Vec::with_capacity(messages.len() + 1);
    let turn = |role, msg, tools| Turn {
        role,
        parts: Vec::new(),
        msg,
        tools,
        reasoning: None,
    };
    if tools.is_some() && messages.first().is_none_or(|m| m.role != "system") {
        turns.push(turn("system", None, tools));
    }
    for (i, m) in messages.iter().enumerate() {
        let part = match m.role.as_str() {
            "tool" => Part::Result {
                id: m.tool_call_id.as_deref().unwrap_or_default(),
                content: &m.content,
            },
            "user" => Part::Text(&m.content),
            "system" | "developer" | "assistant" | "latest_reminder" => {
                let tools = if i == 0 && m.role == "system" { tools } else { None };
                let mut t = turn(m.role.as_str(), Some(m), tools);
                t.reasoning = m.reasoning_content.as_deref();
                turns.push(t);
                continue;
            }
            other => return Err(invalid(format!("DeepSeek-V4 has no `{other}` role"))),
        };
        match turns.last_mut() {
            Some(t) if t.role == "user" => t.parts.push(part),
            _ => {
                let mut t = turn("user", Some(m), None);
                t.parts.push(part);
                turns.push(t);
            }
        }
    }
    Ok(turns)
}

/// The reference's `sort_tool_results_by_call_order`: a user turn's tool results follow the
/// order of the last assistant calls' ids (unknown ids first, stably); text parts stay put.
fn sort_results(turns: &mut [Turn<'_>]) {
    let mut order: Vec<String> = Vec::new();
    for t in turns.iter_mut() {
        match t.role {
            "assistant" => {
                if let Some(calls) = t
                    .msg
                    .and_then(|m| m.tool_calls.as_deref())
                    .filter(|c| !c.is_empty())
                {
                    order = calls
                        .iter()
                        .map(|c| {
                            c.get("id")
                                .and_then(Value::as_str)
                                .unwrap_or_default()
                                .to_string()
                        })
                        .collect();
                }
            }
            "user" => {
                let rank = |id: &str| order.iter().position(|o| !o.is_empty() && o == id).unwrap_or(0);
                let mut results: Vec<Part<'_>> = t
                    .parts
                    .iter()
                    .filter(|p| matches!(p, Part::Result { .. }))
                    .cloned()
                    .collect();
                if results.len() < 2 || order.iter().all(String::is_empty) {
                    continue;
                }
                results.sort_by_key(|p| match p {
                    Part::Result { id, .. } => rank(id),
                    Part::Text(_) => 0,
                });
                let mut sorted = results.into_iter();
                for p in t.parts.iter_mut() {
                    if matches!(p, Part::Result { .. }) {
                        *p = sorted.next().expect("as many results as sorted");
                    }
                }
            }
            _ => {}
        }
    }
}

/// The reference's `_drop_thinking_messages`: before the last user turn, assistant reasoning
/// is dropped and developer turns are left out.
fn drop_thinking(turns: Vec<Turn<'_>>) -> Vec<Turn<'_>> {
    let last = turns
        .iter()
        .rposition(|t| matches!(t.role, "user" | "developer"))
        .map_or(-1, |l| l as isize);
    turns
        .into_iter()
        .enumerate()
        .filter_map(|(i, mut t)| match t.role {
            _ if i as isize >= last => Some(t),
            "user" | "system" | "latest_reminder" => Some(t),
            "assistant" => {
                t.reasoning = None;
                Some(t)
            }
            _ => None,
        })
        .collect()
}

/// Turn `index`; `last`: the last user or developer turn.
fn render_turn(
    index: usize,
    turns: &[Turn<'_>],
    (thinking, drop): (bool, bool),
    last: Option<usize>,
) -> Result<String> {
    let t = &turns[index];
    let content = t.msg.map_or("", |m| m.content.as_str());
    let mut out = String::new();
    match t.role {
        "system" => {
            out.push_str(content);
            if let Some(tools) = t.tools {
                out.push_str("\n\n");
                out.push_str(&tools_block(tools)?);
            }
        }
        "developer" => {
            if content.is_empty() {
                return Err(invalid(format!(
                    "message {index}: a developer message needs content"
                )));
            }
            out.push_str(USER);
            out.push_str(content);
        }
        "user" => {
            out.push_str(USER);
            let parts: Vec<String> = t
                .parts
                .iter()
                .map(|p| match p {
                    Part::Text(s) => s.to_string(),
                    Part::Result { content, .. } => format!("<tool_result>{content}</tool_result>"),
                })
                .collect();
            out.push_str(&parts.join("\n\n"));
        }
        "latest_reminder" => {
            out.push_str(REMINDER);
            out.push_str(content);
        }
        _ => out.push_str(&assistant(index, t, (thinking, drop), last)?),
    }
    let next = turns.get(index + 1).map(|n| n.role);
    if next.is_some_and(|r| r != "assistant" && r != "latest_reminder") {
        return Ok(out);
    }
    if matches!(t.role, "user" | "developer") {
        out.push_str(ASSISTANT);
        let opens = thinking && (!drop || last.is_some_and(|l| index >= l));
        out.push_str(if opens { THINK } else { THINK_END });
    }
    Ok(out)
}

fn assistant(
    index: usize,
    t: &Turn<'_>,
    (thinking, drop): (bool, bool),
    last: Option<usize>,
) -> Result<String> {
    let msg = t.msg.expect("an assistant turn is a message");
    let mut out = String::new();
    let after_last = last.is_none_or(|l| index > l);
    if thinking && (!drop || after_last) {
        out.push_str(t.reasoning.unwrap_or_default());
        out.push_str(THINK_END);
    }
    out.push_str(&msg.content);
    if let Some(calls) = msg.tool_calls.as_deref().filter(|c| !c.is_empty()) {
        let invokes = calls
            .iter()
            .map(|c| invoke_with(c, true))
            .collect::<Result<Vec<_>>>()?;
        out.push_str(&format!(
            "\n\n<{DSML}tool_calls>\n{}\n</{DSML}tool_calls>",
            invokes.join("\n")
        ));
    }
    out.push_str(EOS);
    Ok(out)
}

/// The reference's `TOOLS_TEMPLATE` with each tool's `function` as one JSON line.
fn tools_block(tools: &[Value]) -> Result<String> {
    let schemas = tools
        .iter()
        .map(|t| py_dumps(t.get("function").unwrap_or(t), false))
        .collect::<Result<Vec<_>>>()?;
    Ok(format!(
        "## Tools\n\n\
You have access to a set of tools to help answer the user's question. You can invoke tools by writing a \"<{DSML}tool_calls>\" block like the following:\n\n\
<{DSML}tool_calls>\n\
<{DSML}invoke name=\"$TOOL_NAME\">\n\
<{DSML}parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</{DSML}parameter>\n\
...\n\
</{DSML}invoke>\n\
<{DSML}invoke name=\"$TOOL_NAME2\">\n\
...\n\
</{DSML}invoke>\n\
</{DSML}tool_calls>\n\n\
String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n\
If thinking_mode is enabled (triggered by {THINK}), you MUST output your complete reasoning inside {THINK}...{THINK_END} BEFORE any tool calls or final response.\n\n\
Otherwise, output directly after {THINK_END} with tool calls or final response.\n\n\
### Available Tool Schemas\n\n\
{}\n\n\
You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n",
        schemas.join("\n")
    ))
}
