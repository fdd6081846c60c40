//! Chat templates on minijinja, configured like transformers' Jinja environment:
//! `trim_blocks`, `lstrip_blocks`, loop controls, no auto-escaping, Python string/dict methods
//! (minijinja-contrib pycompat), `raise_exception`, `strftime_now`, a `tojson` filter that is
//! Python's `json.dumps` (separators, `ensure_ascii`, `indent`, `sort_keys`) and Python-style
//! printing of `None`, booleans, floats, lists and dicts.

use std::collections::BTreeMap;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error as JinjaError, ErrorKind, Output, State, UndefinedBehavior};

use super::chat::to_value;
use super::pyjson::{self, JsonOptions};
use crate::error::{Error, Result};

const TEMPLATE_NAME: &str = "chat_template";

/// A compiled chat template.
pub struct ChatTemplate {
    source: String,
    env: Environment<'static>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compile `source`; a syntax error is [`Error::Template`].
    pub fn new(source: impl Into<String>) -> Result<ChatTemplate> {
        let source = source.into();
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| Error::Template(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_undefined_behavior(UndefinedBehavior::Lenient);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(python_formatter);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(|e| Error::Template(describe(&e)))?;
        Ok(ChatTemplate { source, env })
    }

    /// The template text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Render with the variables of `context` (a JSON object); `strftime_now` reads the clock (UTC).
    pub fn render(&self, context: &serde_json::Value) -> Result<String> {
        self.render_at(context, unix_now())
    }

    /// Render with `strftime_now` pinned to `unix_secs` (UTC), for reproducible output.
    pub fn render_at(&self, context: &serde_json::Value, unix_secs: i64) -> Result<String> {
        let obj = context
            .as_object()
            .ok_or_else(|| Error::Template("context must be a JSON object".into()))?;
        let vars = obj.iter().map(|(k, v)| (k.clone(), to_value(v))).collect();
        self.render_vars(vars, unix_secs)
    }

    /// Render with prepared variables.
    pub(crate) fn render_vars(&self, mut vars: BTreeMap<String, Value>, unix_secs: i64) -> Result<String> {
        vars.entry("strftime_now".to_owned()).or_insert_with(|| {
            Value::from_function(move |fmt: String| -> String { strftime(&fmt, unix_secs) })
        });
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| Error::Template(describe(&e)))?;
        template
            .render(to_value(&vars))
            .map_err(|e| Error::Template(describe(&e)))
    }
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The error with its cause chain, on one line.
fn describe(e: &JinjaError) -> String {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}

fn raise_exception(message: String) -> std::result::Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, message))
}

/// Print values as Python's `str()` would; other objects use minijinja's own formatting.
fn python_formatter(
    out: &mut Output,
    state: &mut State,
    value: &Value,
) -> std::result::Result<(), JinjaError> {
    match pyjson::py_str(value) {
        Some(text) => out
            .write_str(&text)
            .map_err(|_| JinjaError::new(ErrorKind::WriteFailure, "cannot write output")),
        None => minijinja::escape_formatter(out, state, value),
    }
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(value: &Value, kwargs: Kwargs) -> std::result::Result<Value, JinjaError> {
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
        Some(v) => {
            let n = i64::try_from(v).map_err(|_| {
                JinjaError::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an int or a string",
                )
            })?;
            Some(" ".repeat(usize::try_from(n).unwrap_or(0).min(1024)))
        }
    };
    let separators = match kwargs.get::<Option<Value>>("separators")? {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.kind() == ValueKind::String && b.kind() == ValueKind::String => Some((
                    a.as_str().unwrap_or_default().to_owned(),
                    b.as_str().unwrap_or_default().to_owned(),
                )),
                _ => {
                    return Err(JinjaError::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    ));
                }
            }
        }
    };
    kwargs.assert_all_used()?;
    let opts = JsonOptions::new(ensure_ascii, indent, separators, sort_keys);
    pyjson::dumps(value, &opts).map(Value::from)
}

const DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// A UTC civil time.
struct Civil {
    year: i64,
    month: u32,
    day: u32,
    hour: i64,
    minute: i64,
    second: i64,
    weekday: usize,
    yday: i64,
}

fn civil(unix: i64) -> Civil {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    // Days since 0000-03-01 in the proleptic Gregorian calendar, split into 400-year eras.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    const CUM: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = CUM[(month - 1) as usize] + i64::from(day) + i64::from(leap && month > 2);
    Civil {
        year,
        month,
        day,
        hour: secs / 3600,
        minute: secs / 60 % 60,
        second: secs % 60,
        weekday: (days + 4).rem_euclid(7) as usize,
        yday,
    }
}

/// C `strftime` for a UTC time (the directives chat templates use); unknown directives are kept.
pub(crate) fn strftime(format: &str, unix_secs: i64) -> String {
    let t = civil(unix_secs);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(d) = chars.next() else {
            out.push('%');
            break;
        };
        let month = MONTHS[(t.month - 1) as usize];
        let day = DAYS[t.weekday];
        let hour12 = if t.hour % 12 == 0 { 12 } else { t.hour % 12 };
        let piece = match d {
            'a' => day[..3].to_owned(),
            'A' => day.to_owned(),
            'b' | 'h' => month[..3].to_owned(),
            'B' => month.to_owned(),
            'd' => format!("{:02}", t.day),
            'e' => format!("{:2}", t.day),
            'H' => format!("{:02}", t.hour),
            'I' => format!("{hour12:02}"),
            'j' => format!("{:03}", t.yday),
            'm' => format!("{:02}", t.month),
            'M' => format!("{:02}", t.minute),
            'p' => if t.hour < 12 { "AM" } else { "PM" }.to_owned(),
            'S' => format!("{:02}", t.second),
            'y' => format!("{:02}", t.year.rem_euclid(100)),
            'Y' => t.year.to_string(),
            'F' => format!("{}-{:02}-{:02}", t.year, t.month, t.day),
            'T' => format!("{:02}:{:02}:{:02}", t.hour, t.minute, t.second),
            'R' => format!("{:02}:{:02}", t.hour, t.minute),
            'D' => format!("{:02}/{:02}/{:02}", t.month, t.day, t.year.rem_euclid(100)),
            'u' => (if t.weekday == 0 { 7 } else { t.weekday }).to_string(),
            'w' => t.weekday.to_string(),
            'z' | 'Z' => String::new(),
            'n' => "\n".to_owned(),
            't' => "\t".to_owned(),
            '%' => "%".to_owned(),
            other => format!("%{other}"),
        };
        out.push_str(&piece);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_matches_python() {
        // Python: datetime(2024, 3, 5, 13, 7, 9).strftime(...)
        let t = 1_709_644_029;
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", t), "2024-03-05 13:07:09");
        assert_eq!(
            strftime("%d %b %Y|%A, %B %d|%j %p %I %y %a %e %%", t),
            "05 Mar 2024|Tuesday, March 05|065 PM 01 24 Tue  5 %"
        );
        // 2000-12-31 (leap year, day 366), 1969-12-31 23:59:59 (before the epoch)
        assert_eq!(strftime("%F %j %a", 978_220_800), "2000-12-31 366 Sun");
        assert_eq!(strftime("%F %T %a", -1), "1969-12-31 23:59:59 Wed");
    }
}
