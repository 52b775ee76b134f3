//! What a stored Response keeps of its request: the fields it echoes and the input items, held
//! to what the Responses API defines. A stored Response lives for weeks and costs its key nothing
//! beyond the tokens it ran, so a field the model never reads (`metadata`, `truncation`, `user`,
//! `safety_identifier`, keys of `text`, `reasoning`, tools and `tool_choice`, unknown keys of
//! items and parts, a reasoning item's `summary`) must not carry megabytes into storage: each
//! is checked as OpenAI checks it (or refused by name), and items and their parts keep only
//! the keys their type defines.

use serde_json::{Map, Value};

use crate::fields::{get, type_error};
use crate::ApiError;

/// OpenAI's limits on `metadata`: 16 pairs, keys of 64 characters, string values of 512.
const METADATA_PAIRS: usize = 16;
const METADATA_KEY_CHARS: usize = 64;
const METADATA_VALUE_CHARS: usize = 512;
/// An item's `id` or `call_id`: ids this server makes are ~30 characters; OpenAI's are shorter.
const ID_CHARS: usize = 256;
/// `safety_identifier`: OpenAI's documented maximum. `user`, which it supersedes, gets the same.
const END_USER_ID_CHARS: usize = 64;
/// `text.format.description`: OpenAI documents none; this is its limit on a function's
/// description, the same kind of text.
const FORMAT_DESCRIPTION_CHARS: usize = 1024;

/// Checks the echoed fields no other part of the request reads: `stream`, `metadata`,
/// `truncation`, `user`, `safety_identifier`, the keys of `text` (its format's name and
/// description), of `reasoning`, of each tool and of `tool_choice`.
pub(crate) fn check_echoed(obj: &Map<String, Value>) -> Result<(), ApiError> {
    if let Some(v) = get(obj, "stream").filter(|v| !v.is_boolean()) {
        return Err(type_error("stream", "a boolean", v));
    }
    if let Some(metadata) = get(obj, "metadata") {
        check_metadata(metadata)?;
    }
    if let Some(v) = get(obj, "truncation") {
        enumerated("truncation", v, &["auto", "disabled"])?;
    }
    for field in ["user", "safety_identifier"] {
        if let Some(v) = get(obj, field) {
            bounded_string(field, v, END_USER_ID_CHARS)?;
        }
    }
    if let Some(text) = get(obj, "text") {
        let text = known_keys("text", text, &["format", "verbosity"])?;
        if let Some(v) = get(text, "verbosity") {
            enumerated("text.verbosity", v, &["low", "medium", "high"])?;
        }
        if let Some(format) = get(text, "format") {
            check_format(format)?;
        }
    }
    if let Some(Value::Array(tools)) = get(obj, "tools") {
        for (i, tool) in tools.iter().enumerate() {
            known_keys(&format!("tools[{i}]"), tool, &["type", "name", "description", "parameters", "strict"])?;
        }
    }
    if let Some(choice @ Value::Object(_)) = get(obj, "tool_choice") {
        known_keys("tool_choice", choice, &["type", "name"])?;
    }
    if let Some(reasoning) = get(obj, "reasoning") {
        let reasoning = known_keys("reasoning", reasoning, &["effort", "summary", "generate_summary"])?;
        for key in ["summary", "generate_summary"] {
            if let Some(v) = get(reasoning, key) {
                enumerated(&format!("reasoning.{key}"), v, &["auto", "concise", "detailed"])?;
            }
        }
    }
    Ok(())
}

/// `text.format`: its defined keys only; a schema's `name` as OpenAI's pattern and length, its
/// `description` bounded (the schema itself is bounded by the chat validation).
fn check_format(format: &Value) -> Result<(), ApiError> {
    let format = known_keys("text.format", format, &["type", "name", "description", "schema", "strict"])?;
    if let Some(name) = get(format, "name") {
        let Value::String(name) = name else { return Err(type_error("text.format.name", "a string", name)) };
        crate::fields::check_function_name("text.format.name", name)?;
    }
    if let Some(v) = get(format, "description") {
        bounded_string("text.format.description", v, FORMAT_DESCRIPTION_CHARS)?;
    }
    Ok(())
}

fn bounded_string(param: &str, v: &Value, max: usize) -> Result<(), ApiError> {
    let Value::String(s) = v else { return Err(type_error(param, "a string", v)) };
    let chars = s.chars().count();
    if chars > max {
        return Err(crate::fields::above_max_length(param, "string", max, chars));
    }
    Ok(())
}

fn check_metadata(metadata: &Value) -> Result<(), ApiError> {
    let Value::Object(pairs) = metadata else { return Err(type_error("metadata", "an object", metadata)) };
    if pairs.len() > METADATA_PAIRS {
        return Err(ApiError::invalid_value(
            "metadata",
            format!(
                "Invalid 'metadata': too many properties. Expected an object with at most {METADATA_PAIRS} properties, but got an object with {} properties instead.",
                pairs.len()
            ),
        ));
    }
    for (key, value) in pairs {
        let param = format!("metadata.{}", shortened(key));
        if key.chars().count() > METADATA_KEY_CHARS {
            return Err(too_long(&param, "key", METADATA_KEY_CHARS, key));
        }
        let Value::String(value) = value else { return Err(type_error(&param, "a string", value)) };
        if value.chars().count() > METADATA_VALUE_CHARS {
            return Err(too_long(&param, "string", METADATA_VALUE_CHARS, value));
        }
    }
    Ok(())
}

/// An input item as stored: its defined keys only (content parts too), ids checked. A reasoning
/// item's `summary` is not given to the model (only its `content` is), so it is not kept either:
/// it is stored empty.
pub(crate) fn kept_item(at: &str, item: &Value) -> Result<Value, ApiError> {
    let Value::Object(obj) = item else { return Err(type_error(at, "an object", item)) };
    let kind = obj.get("type").and_then(Value::as_str).unwrap_or("message");
    let keys: &[&str] = match kind {
        "message" => &["type", "id", "role", "content"],
        "function_call" => &["type", "id", "call_id", "name", "arguments"],
        "function_call_output" => &["type", "id", "call_id", "output"],
        "reasoning" => &["type", "id", "summary", "content"],
        // Refused by the translation, which names the type.
        _ => &["type"],
    };
    let mut kept = Map::new();
    for &key in keys {
        let Some(v) = obj.get(key) else { continue };
        let v = match (key, v) {
            ("id" | "call_id", Value::String(s)) if s.chars().count() > ID_CHARS => {
                return Err(too_long(&format!("{at}.{key}"), "string", ID_CHARS, s))
            }
            ("summary", _) if kind == "reasoning" => Value::Array(Vec::new()),
            ("content" | "output", Value::Array(parts)) => Value::Array(parts.iter().map(kept_part).collect()),
            _ => v.clone(),
        };
        kept.insert(key.into(), v);
    }
    Ok(Value::Object(kept))
}

/// A content part's keys as its type defines them: a text part keeps its `text` (an echoed
/// `output_text`'s `annotations` and `logprobs` go), an image its `image_url` and `detail`;
/// any other key goes, whatever its size.
fn kept_part(part: &Value) -> Value {
    let Value::Object(obj) = part else { return part.clone() };
    let keep: &[&str] = match obj.get("type").and_then(Value::as_str) {
        Some("input_text" | "output_text" | "text" | "reasoning_text") => &["type", "text"],
        Some("refusal") => &["type", "refusal"],
        Some("input_image") => &["type", "image_url", "detail"],
        // The translation refuses a part of any other type (a tool output's parts are read
        // for their `text`).
        _ => &["type", "text"],
    };
    Value::Object(obj.iter().filter(|(k, _)| keep.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect())
}

fn known_keys<'a>(param: &str, v: &'a Value, known: &[&str]) -> Result<&'a Map<String, Value>, ApiError> {
    let Value::Object(obj) = v else { return Err(type_error(param, "an object", v)) };
    if let Some(key) = obj.keys().find(|k| !known.contains(&k.as_str())) {
        let key = shortened(key);
        return Err(ApiError::invalid_value(&format!("{param}.{key}"), format!("Unknown parameter: '{param}.{key}'.")));
    }
    Ok(obj)
}

fn enumerated(param: &str, v: &Value, values: &[&str]) -> Result<(), ApiError> {
    match v {
        Value::String(s) if values.contains(&s.as_str()) => Ok(()),
        other => Err(one_of(param, other, values)),
    }
}

fn one_of(param: &str, got: &Value, values: &[&str]) -> ApiError {
    let got = match got {
        Value::String(s) => format!("'{}'", shortened(s)),
        other => crate::fields::type_name(other).to_owned(),
    };
    let values: Vec<String> = values.iter().map(|v| format!("'{v}'")).collect();
    ApiError::invalid_value(param, format!("Invalid value: {got}. Supported values are: {}.", values.join(", ")))
}

fn too_long(param: &str, what: &str, max: usize, got: &str) -> ApiError {
    ApiError::invalid_value(
        param,
        format!(
            "Invalid '{param}': {what} too long. Expected a {what} with maximum length {max}, but got a {what} with length {} instead.",
            got.chars().count()
        ),
    )
}

/// A client's string as quoted in an error: its start only, so an error stays small.
fn shortened(s: &str) -> String {
    const SHOWN: usize = 64;
    match s.char_indices().nth(SHOWN) {
        Some((end, _)) => format!("{}…", &s[..end]),
        None => s.to_owned(),
    }
}
