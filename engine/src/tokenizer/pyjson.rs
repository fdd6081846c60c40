//! Python-compatible text forms of template values: `json.dumps` (the `tojson` filter that
//! transformers installs) and `str()` (what Jinja2 prints for `{{ value }}`).

use std::fmt::Write as _;

use minijinja::value::{Value, ValueKind};
use minijinja::{Error as JinjaError, ErrorKind};

/// `json.dumps` options, with Python's defaults as used by transformers' `tojson`.
#[derive(Debug, Clone)]
pub(crate) struct JsonOptions {
    pub ensure_ascii: bool,
    /// `None`: one line. `Some(s)`: newline and `s` repeated per level.
    pub indent: Option<String>,
    pub item_separator: String,
    pub key_separator: String,
    pub sort_keys: bool,
}

impl JsonOptions {
    /// `separators=None` resolves to `(", ", ": ")` without indent and `(",", ": ")` with it.
    pub(crate) fn new(
        ensure_ascii: bool,
        indent: Option<String>,
        separators: Option<(String, String)>,
        sort_keys: bool,
    ) -> Self {
        let (item_separator, key_separator) = separators.unwrap_or_else(|| {
            let item = if indent.is_some() { "," } else { ", " };
            (item.to_owned(), ": ".to_owned())
        });
        JsonOptions {
            ensure_ascii,
            indent,
            item_separator,
            key_separator,
            sort_keys,
        }
    }
}

/// Python's `json.dumps(value, ...)`.
pub(crate) fn dumps(value: &Value, opts: &JsonOptions) -> Result<String, JinjaError> {
    let mut out = String::new();
    write_json(&mut out, value, opts, 0)?;
    Ok(out)
}

fn write_json(out: &mut String, value: &Value, opts: &JsonOptions, level: usize) -> Result<(), JinjaError> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&number_text(value, true)),
        ValueKind::String => write_json_string(out, value.as_str().unwrap_or_default(), opts.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, opts, level, '[', ']', items.len(), |out, i| {
                write_json(out, &items[i], opts, level + 1)
            })?;
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((json_key(&key)?, item));
            }
            if opts.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(out, opts, level, '{', '}', entries.len(), |out, i| {
                write_json_string(out, &entries[i].0, opts.ensure_ascii);
                out.push_str(&opts.key_separator);
                write_json(out, &entries[i].1, opts, level + 1)
            })?;
        }
        kind => {
            return Err(JinjaError::new(
                ErrorKind::InvalidOperation,
                format!("Object of type {kind} is not JSON serializable"),
            ));
        }
    }
    Ok(())
}

fn write_container(
    out: &mut String,
    opts: &JsonOptions,
    level: usize,
    open: char,
    close: char,
    len: usize,
    mut item: impl FnMut(&mut String, usize) -> Result<(), JinjaError>,
) -> Result<(), JinjaError> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    for i in 0..len {
        if i > 0 {
            out.push_str(&opts.item_separator);
        }
        if let Some(indent) = &opts.indent {
            out.push('\n');
            out.push_str(&indent.repeat(level + 1));
        }
        item(out, i)?;
    }
    if let Some(indent) = &opts.indent {
        out.push('\n');
        out.push_str(&indent.repeat(level));
    }
    out.push(close);
    Ok(())
}

/// Python converts dict keys to strings: str keys as is, numbers, bools and None to JSON text.
fn json_key(key: &Value) -> Result<String, JinjaError> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_owned()),
        ValueKind::Number => Ok(number_text(key, true)),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_owned()),
        ValueKind::None => Ok("null".to_owned()),
        kind => Err(JinjaError::new(
            ErrorKind::InvalidOperation,
            format!("keys must be str, int, float, bool or None, not {kind}"),
        )),
    }
}

/// JSON string literal, escaping like Python's `json` encoder.
pub(crate) fn write_json_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7e) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Integers in decimal; floats as Python's `repr(float)` (JSON: `NaN`, `Infinity`).
fn number_text(value: &Value, json: bool) -> String {
    if value.is_integer() {
        return value.to_string();
    }
    let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    if json {
        if f.is_nan() {
            return "NaN".into();
        }
        if f.is_infinite() {
            return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
        }
    }
    py_float_repr(f)
}

/// Python's `repr(float)`: shortest round-trip digits; positional notation for exponents
/// -4..=15, otherwise `d.ddde±XX`; integral values keep a `.0`.
pub(crate) fn py_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    let sci = format!("{f:e}"); // e.g. "-1.2345e-5", "1e16", "0e0"
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |m| ("-", m));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let body = if point <= 0 {
            format!("0.{}{}", "0".repeat(point.unsigned_abs() as usize), digits)
        } else if (point as usize) >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            let (int, frac) = digits.split_at(point as usize);
            format!("{int}.{frac}")
        };
        return format!("{sign}{body}");
    }
    let (first, rest) = digits.split_at(1.min(digits.len()));
    let frac = if rest.is_empty() {
        String::new()
    } else {
        format!(".{rest}")
    };
    let esign = if exp < 0 { '-' } else { '+' };
    format!("{sign}{first}{frac}e{esign}{:02}", exp.unsigned_abs())
}

/// Python's `str(value)` for printing: strings raw, containers with `repr` items.
pub(crate) fn py_str(value: &Value) -> Option<String> {
    match value.kind() {
        ValueKind::Undefined => Some(String::new()),
        ValueKind::String => Some(value.as_str().unwrap_or_default().to_owned()),
        _ => py_repr(value),
    }
}

/// Python's `repr(value)` for plain data; `None` for objects without a Python equivalent.
fn py_repr(value: &Value) -> Option<String> {
    Some(match value.kind() {
        ValueKind::None | ValueKind::Undefined => "None".to_owned(),
        ValueKind::Bool => if value.is_true() { "True" } else { "False" }.to_owned(),
        ValueKind::Number => number_text(value, false),
        ValueKind::String => py_repr_str(value.as_str().unwrap_or_default()),
        ValueKind::Seq => {
            let items: Option<Vec<String>> = value.try_iter().ok()?.map(|v| py_repr(&v)).collect();
            format!("[{}]", items?.join(", "))
        }
        ValueKind::Map if !value.is_kwargs() => {
            let mut parts = Vec::new();
            for key in value.try_iter().ok()? {
                let item = value.get_item(&key).ok()?;
                parts.push(format!("{}: {}", py_repr(&key)?, py_repr(&item)?));
            }
            format!("{{{}}}", parts.join(", "))
        }
        _ => return None,
    })
}

/// Python's `repr(str)`: single quotes unless the text has `'` and no `"`; control characters
/// escaped (other non-printable characters are left as they are: an approximation).
fn py_repr_str(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..0xa0).contains(&(c as u32)) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        // Expected strings are Python 3.11 `repr(float)`.
        let cases = [
            (0.1, "0.1"),
            (1.0, "1.0"),
            (-0.0, "-0.0"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (123.456, "123.456"),
            (1e22, "1e+22"),
            (2.5e-300, "2.5e-300"),
            (0.30000000000000004, "0.30000000000000004"),
            (1e-7, "1e-07"),
            (100.0, "100.0"),
            (1.2345678901234567e17, "1.2345678901234566e+17"),
            (5e-324, "5e-324"),
        ];
        for (f, want) in cases {
            assert_eq!(py_float_repr(f), want, "{f:e}");
        }
    }

    #[test]
    fn dumps_defaults_and_options() {
        let v = crate::tokenizer::chat::to_value(serde_json::json!({"b": [1, 2.0, null], "a": "é\u{1}"}));
        let plain = JsonOptions::new(false, None, None, false);
        assert_eq!(
            dumps(&v, &plain).unwrap(),
            r#"{"b": [1, 2.0, null], "a": "é\u0001"}"#
        );
        let ascii = JsonOptions::new(true, Some("  ".into()), None, true);
        assert_eq!(
            dumps(&v, &ascii).unwrap(),
            "{\n  \"a\": \"\\u00e9\\u0001\",\n  \"b\": [\n    1,\n    2.0,\n    null\n  ]\n}"
        );
    }
}
