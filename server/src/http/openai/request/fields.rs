//! Shared validators of JSON request fields (every API surface): each names the field it
//! checks (`at`, a JSON path such as `tools[0].function.name`) in its OpenAI-shaped 400.

use serde_json::{Map, Value};

use crate::http::error::ApiError;

/// `v` as an object.
pub fn obj<'a>(v: &'a Value, at: &str) -> Result<&'a Map<String, Value>, ApiError> {
    v.as_object()
        .ok_or_else(|| ApiError::field(at, format!("`{at}` must be an object")))
}

/// `v` as a string.
pub fn string<'a>(v: &'a Value, at: &str) -> Result<&'a str, ApiError> {
    v.as_str()
        .ok_or_else(|| ApiError::field(at, format!("`{at}` must be a string")))
}

/// `v` as a boolean.
pub fn boolean(v: &Value, at: &str) -> Result<bool, ApiError> {
    v.as_bool()
        .ok_or_else(|| ApiError::field(at, format!("`{at}` must be a boolean")))
}

/// `v` as an integer in `min..=max`.
pub fn integer(v: &Value, at: &str, min: u64, max: u64) -> Result<u64, ApiError> {
    match v.as_u64() {
        Some(u) if (min..=max).contains(&u) => Ok(u),
        _ => Err(ApiError::field(
            at,
            format!("`{at}` must be an integer between {min} and {max}"),
        )),
    }
}

/// `v` as a finite number in `min..=max`.
pub fn number(v: &Value, at: &str, min: f64, max: f64) -> Result<f64, ApiError> {
    match v.as_f64() {
        Some(x) if x.is_finite() && (min..=max).contains(&x) => Ok(x),
        _ => Err(ApiError::field(
            at,
            format!("`{at}` must be a number between {min} and {max}"),
        )),
    }
}

/// A field accepted only with its neutral value.
pub fn neutral(at: &str, ok: bool, value: &str) -> Result<(), ApiError> {
    if ok {
        Ok(())
    } else {
        Err(ApiError::unsupported(
            at,
            format!("`{at}` is not supported by this server (only {value} is accepted)"),
        ))
    }
}

/// Refuse keys of `o` outside `allowed`, except the `ignored` ones (accepted without effect).
pub fn only_except(
    o: &Map<String, Value>,
    allowed: &[&str],
    ignored: &[&str],
    at: &str,
) -> Result<(), ApiError> {
    match o
        .keys()
        .find(|k| !allowed.contains(&k.as_str()) && !ignored.contains(&k.as_str()))
    {
        Some(k) => {
            let k: String = k.chars().take(64).collect();
            Err(ApiError::unsupported(
                format!("{at}.{k}"),
                format!("unknown or unsupported field `{at}.{k}`"),
            ))
        }
        None => Ok(()),
    }
}

/// Refuse keys of `o` outside `allowed`.
pub fn only(o: &Map<String, Value>, allowed: &[&str], at: &str) -> Result<(), ApiError> {
    only_except(o, allowed, &[], at)
}
