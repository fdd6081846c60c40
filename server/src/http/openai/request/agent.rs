//! The agent-facing request fields, validated into types: `tools`, `tool_choice`,
//! `response_format`, `logit_bias`, `reasoning_effort`, and assistant `tool_calls` in history.
//! Shapes and messages follow OpenAI's (agent-api.md §4, §5).

use serde_json::{Map, Value};

use super::fields::{obj, only};
use crate::http::error::ApiError;

/// One function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionTool {
    pub name: String,
    pub description: Option<String>,
    /// The JSON schema of the arguments (`{"type": "object", "properties": {}}` when absent).
    pub parameters: Value,
    pub strict: bool,
}

impl FunctionTool {
    /// The OpenAI `tools[]` entry the chat template sees.
    pub fn to_openai(&self) -> Value {
        let mut function = Map::new();
        function.insert("name".into(), Value::from(self.name.clone()));
        if let Some(d) = &self.description {
            function.insert("description".into(), Value::from(d.clone()));
        }
        function.insert("parameters".into(), self.parameters.clone());
        serde_json::json!({"type": "function", "function": function})
    }
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// No call may be made.
    None,
    /// The model decides.
    Auto,
    /// At least one call, to any tool.
    Required,
    /// A call to this tool.
    Named(String),
}

impl ToolChoice {
    /// The name the chat renderer uses (`ChatOptions::tool_choice`).
    pub fn label(&self) -> &'static str {
        match self {
            ToolChoice::None => "none",
            ToolChoice::Auto => "auto",
            ToolChoice::Required => "required",
            ToolChoice::Named(_) => "named",
        }
    }
}

/// `response_format`.
#[derive(Debug, Clone, PartialEq)]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema {
        name: String,
        schema: Value,
        strict: bool,
    },
}

impl ResponseFormat {
    /// The `response_format` object as OpenAI shapes it (for the K3 renderer's note).
    pub fn to_openai(&self) -> Option<Value> {
        match self {
            ResponseFormat::Text => None,
            ResponseFormat::JsonObject => Some(serde_json::json!({"type": "json_object"})),
            ResponseFormat::JsonSchema { name, schema, strict } => Some(serde_json::json!({
                "type": "json_schema",
                "json_schema": {"name": name, "schema": schema, "strict": strict},
            })),
        }
    }
}

fn name_ok(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A JSON schema object (`parameters`, `schema`): an object, checked for shape only here; the
/// grammar compiler refuses what it cannot honour.
fn schema(v: &Value, param: &str) -> Result<Value, ApiError> {
    match v {
        Value::Object(_) => Ok(v.clone()),
        Value::Bool(true) => Ok(serde_json::json!({})),
        _ => Err(ApiError::field(
            param,
            format!("`{param}` must be a JSON Schema object"),
        )),
    }
}

/// `tools` (Chat Completions shape: `{"type": "function", "function": {...}}`).
pub fn parse_tools(v: &Value) -> Result<Vec<FunctionTool>, ApiError> {
    tool_list(v, "function.name", |o, at| {
        only(o, &["type", "function"], at)?;
        function_type(o, at)?;
        let f = o.get("function").ok_or_else(|| {
            ApiError::field(format!("{at}.function"), format!("`{at}.function` is required"))
        })?;
        function_tool(f, &format!("{at}.function"))
    })
}

/// A `tools` array (at most 128, names unique) of objects each read by `one(object, at)`;
/// `name_path` locates the name inside an entry for the duplicate-name error.
pub fn tool_list(
    v: &Value,
    name_path: &str,
    one: impl Fn(&Map<String, Value>, &str) -> Result<FunctionTool, ApiError>,
) -> Result<Vec<FunctionTool>, ApiError> {
    let list = v
        .as_array()
        .ok_or_else(|| ApiError::field("tools", "`tools` must be an array"))?;
    if list.len() > 128 {
        return Err(ApiError::field("tools", "`tools` may hold at most 128 functions"));
    }
    let mut out: Vec<FunctionTool> = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        let tool = one(obj(t, &at)?, &at)?;
        if out.iter().any(|t| t.name == tool.name) {
            return Err(ApiError::field(
                format!("{at}.{name_path}"),
                format!("duplicate function name `{}`", tool.name),
            ));
        }
        out.push(tool);
    }
    Ok(out)
}

/// A tool entry's `type` must be `function`.
pub fn function_type(o: &Map<String, Value>, at: &str) -> Result<(), ApiError> {
    match o.get("type").and_then(Value::as_str) {
        Some("function") => Ok(()),
        None => Err(ApiError::field(
            format!("{at}.type"),
            "Missing required parameter: 'tools.type'",
        )),
        Some(other) => {
            let other: String = other.chars().take(64).collect();
            Err(ApiError::unsupported(
                format!("{at}.type"),
                format!("`{at}.type`: tool type `{other}` is not supported (only \"function\")"),
            ))
        }
    }
}

/// One function declaration `{name, description?, parameters?, strict?}` (also the flat shape
/// of the Responses API and, with `input_schema`, of Anthropic's, via [`function_from_parts`]).
pub fn function_tool(f: &Value, at: &str) -> Result<FunctionTool, ApiError> {
    let o = obj(f, at)?;
    only(o, &["name", "description", "parameters", "strict"], at)?;
    function_from_parts(
        o.get("name"),
        o.get("description"),
        o.get("parameters"),
        o.get("strict"),
        at,
        "parameters",
    )
}

/// Validate the parts of a function declaration; `schema_key` names the schema field in errors.
pub fn function_from_parts(
    name: Option<&Value>,
    description: Option<&Value>,
    parameters: Option<&Value>,
    strict: Option<&Value>,
    at: &str,
    schema_key: &str,
) -> Result<FunctionTool, ApiError> {
    let name = match name.and_then(Value::as_str) {
        Some(n) if name_ok(n) => n.to_string(),
        Some(_) => {
            return Err(ApiError::field(
                format!("{at}.name"),
                format!("`{at}.name` must match ^[a-zA-Z0-9_-]{{1,64}}$"),
            ));
        }
        None => {
            return Err(ApiError::field(
                format!("{at}.name"),
                format!("`{at}.name` is required"),
            ));
        }
    };
    let description = match description.filter(|d| !d.is_null()) {
        Some(d) => Some(
            d.as_str()
                .ok_or_else(|| {
                    ApiError::field(format!("{at}.description"), "`description` must be a string")
                })?
                .to_string(),
        ),
        None => None,
    };
    let parameters = match parameters.filter(|p| !p.is_null()) {
        Some(p) => schema(p, &format!("{at}.{schema_key}"))?,
        None => serde_json::json!({"type": "object", "properties": {}}),
    };
    let strict = match strict.filter(|s| !s.is_null()) {
        Some(s) => s
            .as_bool()
            .ok_or_else(|| ApiError::field(format!("{at}.strict"), "`strict` must be a boolean"))?,
        None => false,
    };
    Ok(FunctionTool {
        name,
        description,
        parameters,
        strict,
    })
}

/// `tool_choice`; `tools` are the declared functions (a named choice must be one of them).
pub fn parse_tool_choice(v: &Value, tools: &[FunctionTool]) -> Result<ToolChoice, ApiError> {
    let invalid = || ApiError::field("tool_choice", "$.tool_choice is invalid");
    let choice = match v {
        Value::String(s) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            _ => return Err(invalid()),
        },
        Value::Object(o) => {
            if o.get("type").and_then(Value::as_str) != Some("function") {
                return Err(invalid());
            }
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(invalid)?;
            ToolChoice::Named(name.to_string())
        }
        _ => return Err(invalid()),
    };
    check_choice(&choice, tools, "tool_choice")?;
    Ok(choice)
}

/// A choice that needs tools must have them, and a named one must name a declared tool.
pub fn check_choice(choice: &ToolChoice, tools: &[FunctionTool], param: &str) -> Result<(), ApiError> {
    match choice {
        ToolChoice::Required if tools.is_empty() => Err(ApiError::field(
            param,
            format!("`{param}` \"required\" is only allowed when `tools` are specified"),
        )),
        ToolChoice::Named(n) if !tools.iter().any(|t| &t.name == n) => Err(ApiError::field(
            param,
            format!("`{param}` names the function `{n}`, which is not in `tools`"),
        )),
        _ => Ok(()),
    }
}

/// `response_format`.
pub fn parse_response_format(v: &Value) -> Result<ResponseFormat, ApiError> {
    let o = obj(v, "response_format")?;
    match o.get("type").and_then(Value::as_str) {
        Some("text") => {
            only(o, &["type"], "response_format")?;
            Ok(ResponseFormat::Text)
        }
        Some("json_object") => {
            only(o, &["type"], "response_format")?;
            Ok(ResponseFormat::JsonObject)
        }
        Some("json_schema") => {
            only(o, &["type", "json_schema"], "response_format")?;
            let js = o.get("json_schema").ok_or_else(|| {
                ApiError::field(
                    "response_format.json_schema",
                    "`response_format.json_schema` is required",
                )
            })?;
            json_schema_format(js, "response_format.json_schema")
        }
        _ => Err(ApiError::field(
            "response_format.type",
            "`response_format.type` must be one of text, json_object, json_schema",
        )),
    }
}

/// `{name, description?, schema, strict?}` (the Responses API's `text.format` has the same
/// fields beside its `type`).
pub fn json_schema_format(js: &Value, at: &str) -> Result<ResponseFormat, ApiError> {
    let o = obj(js, at)?;
    only(o, &["name", "description", "schema", "strict", "type"], at)?;
    let name = match o.get("name").and_then(Value::as_str) {
        Some(n) if name_ok(n) => n.to_string(),
        _ => {
            return Err(ApiError::field(
                format!("{at}.name"),
                format!("`{at}.name` is required and must match ^[a-zA-Z0-9_-]{{1,64}}$"),
            ));
        }
    };
    let schema = match o.get("schema") {
        Some(s) => schema(s, &format!("{at}.schema"))?,
        None => {
            return Err(ApiError::field(
                format!("{at}.schema"),
                format!("`{at}.schema` is required"),
            ));
        }
    };
    let strict = match o.get("strict").filter(|s| !s.is_null()) {
        Some(s) => s
            .as_bool()
            .ok_or_else(|| ApiError::field(format!("{at}.strict"), "`strict` must be a boolean"))?,
        None => false,
    };
    Ok(ResponseFormat::JsonSchema { name, schema, strict })
}

/// `logit_bias`: token-id strings to biases in [-100, 100].
pub fn parse_logit_bias(v: &Value) -> Result<Vec<(u32, f32)>, ApiError> {
    let o = obj(v, "logit_bias")?;
    if o.len() > 1024 {
        return Err(ApiError::field(
            "logit_bias",
            "`logit_bias` may hold at most 1024 entries",
        ));
    }
    o.iter()
        .map(|(k, b)| {
            let id: u32 = k.parse().map_err(|_| {
                ApiError::field("logit_bias", format!("`logit_bias` key `{k}` is not a token id"))
            })?;
            match b.as_f64() {
                Some(x) if (-100.0..=100.0).contains(&x) => Ok((id, x as f32)),
                _ => Err(ApiError::field(
                    "logit_bias",
                    format!("`logit_bias[{k}]` must be a number between -100 and 100"),
                )),
            }
        })
        .collect()
}

/// An assistant message's `tool_calls`, checked and normalised to the OpenAI shape
/// `{id, type: "function", function: {name, arguments}}` (`arguments` kept as given: a string).
pub fn parse_history_calls(v: &Value, at: &str) -> Result<Vec<Value>, ApiError> {
    let list = v
        .as_array()
        .ok_or_else(|| ApiError::field(at, format!("`{at}` must be an array")))?;
    list.iter()
        .enumerate()
        .map(|(j, c)| {
            let at = format!("{at}[{j}]");
            let o = obj(c, &at)?;
            only(o, &["id", "type", "function"], &at)?;
            let id = o
                .get("id")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::field(format!("{at}.id"), format!("`{at}.id` is required")))?;
            let f = obj(
                o.get("function").unwrap_or(&Value::Null),
                &format!("{at}.function"),
            )?;
            let name = f.get("name").and_then(Value::as_str).ok_or_else(|| {
                ApiError::field(format!("{at}.function.name"), "`function.name` is required")
            })?;
            let arguments = match f.get("arguments") {
                Some(Value::String(s)) => Value::from(s.clone()),
                Some(Value::Object(_)) => Value::from(f["arguments"].to_string()),
                None | Some(Value::Null) => Value::from("{}"),
                _ => {
                    return Err(ApiError::field(
                        format!("{at}.function.arguments"),
                        "`function.arguments` must be a JSON string",
                    ));
                }
            };
            Ok(serde_json::json!({
                "id": id,
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }))
        })
        .collect()
}

/// `reasoning_effort` (`None`: thinking off; `minimal` is `low`); which efforts a model takes
/// is decided when its prompt is rendered (K3: low, high, max; gpt-oss: low, medium, high).
pub fn parse_reasoning_effort(v: &Value) -> Result<Option<String>, ApiError> {
    match v.as_str() {
        Some("none") => Ok(None),
        Some(e @ ("low" | "medium" | "high" | "max")) => Ok(Some(e.to_string())),
        Some("minimal") => Ok(Some("low".to_string())),
        _ => Err(ApiError::field(
            "reasoning_effort",
            "`reasoning_effort` must be one of none, minimal, low, medium, high, max",
        )),
    }
}
