//! The Messages request's options beyond its messages and tools: `thinking`, `output_config`
//! and `stop_sequences`, as the chat request's fields.

use serde_json::{json, Map, Value};

use crate::fields::{get, type_error};
use crate::ApiError;

/// Extended thinking on a reasoning model: `enabled` with its `budget_tokens` (at least 1024 and
/// under `max_tokens`, as Anthropic requires) is the chat request's `thinking_token_budget`;
/// `disabled`, or no `thinking` at all, turns the thinking off, as a Messages request without it
/// gets no thinking; `adaptive` leaves it to the model's default. Other models ignore all three.
pub(super) fn thinking(v: Option<&Value>, max_tokens: u64, chat: &mut Map<String, Value>) -> Result<(), ApiError> {
    let kind = match v {
        None | Some(Value::Null) => "disabled",
        Some(t) => t.get("type").and_then(Value::as_str).unwrap_or(""),
    };
    match kind {
        "disabled" => {
            chat.insert("reasoning_effort".into(), "none".into());
        }
        // The model decides how much to think: its own default.
        "adaptive" => {}
        "enabled" => {
            let budget = v.and_then(|t| t.get("budget_tokens"));
            let budget = budget.and_then(Value::as_u64).ok_or_else(|| {
                ApiError::invalid_value("thinking", "thinking.enabled.budget_tokens: Field required (an integer)")
            })?;
            if budget < 1024 {
                return Err(ApiError::invalid_value(
                    "thinking",
                    format!(
                        "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024, got {budget}"
                    ),
                ));
            }
            if budget >= max_tokens {
                return Err(ApiError::invalid_value(
                    "thinking",
                    format!("`max_tokens` must be greater than `thinking.budget_tokens` ({budget}), got {max_tokens}"),
                ));
            }
            chat.insert("thinking_token_budget".into(), budget.into());
        }
        other => {
            return Err(ApiError::invalid_value(
                "thinking",
                format!("thinking.type: Input should be 'enabled', 'adaptive' or 'disabled', got '{other}'"),
            ))
        }
    }
    Ok(())
}

/// `output_config`: `format` (`{"type": "json_schema", "schema"}`, Anthropic's structured
/// outputs) is the chat `response_format`, held to exactly (`strict`), as Anthropic guarantees
/// the schema; `effort` is checked and changes nothing here (how much a model thinks is
/// `thinking`'s to say).
pub(super) fn output_config(v: &Value, chat: &mut Map<String, Value>) -> Result<(), ApiError> {
    let Value::Object(config) = v else { return Err(type_error("output_config", "an object", v)) };
    if let Some(extra) = config.keys().find(|k| !["effort", "format"].contains(&k.as_str())) {
        return Err(ApiError::invalid_value(
            "output_config",
            format!("output_config.{extra}: Extra inputs are not permitted"),
        ));
    }
    if let Some(effort) = get(config, "effort") {
        if !effort.as_str().is_some_and(|e| ["low", "medium", "high", "xhigh", "max"].contains(&e)) {
            return Err(ApiError::invalid_value(
                "output_config",
                format!(
                    "output_config.effort: Input should be 'low', 'medium', 'high', 'xhigh' or 'max', got {effort}"
                ),
            ));
        }
    }
    let Some(format) = get(config, "format") else { return Ok(()) };
    let schema = match (format.get("type").and_then(Value::as_str), format.get("schema")) {
        (Some("json_schema"), Some(schema @ Value::Object(_))) => schema,
        _ => {
            return Err(ApiError::invalid_value(
                "output_config",
                "output_config.format: expected {\"type\": \"json_schema\", \"schema\": {…}}",
            ))
        }
    };
    let format = json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": true}});
    chat.insert("response_format".into(), format);
    Ok(())
}

/// At most this many stop sequences (Chat Completions allows 4; Anthropic sets no small limit).
const MAX_STOP_SEQUENCES: usize = 16;

pub(super) fn stop_sequences(v: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let Some(v) = v else { return Ok(Vec::new()) };
    let Value::Array(items) = v else { return Err(type_error("stop_sequences", "an array of strings", v)) };
    if items.len() > MAX_STOP_SEQUENCES {
        return Err(ApiError::invalid_value(
            "stop_sequences",
            format!("stop_sequences: at most {MAX_STOP_SEQUENCES} are allowed, got {}", items.len()),
        ));
    }
    let mut stops = Vec::with_capacity(items.len());
    for (i, s) in items.iter().enumerate() {
        let s = s.as_str().ok_or_else(|| type_error(&format!("stop_sequences.{i}"), "a string", s))?;
        if s.trim().is_empty() {
            return Err(ApiError::invalid_value(
                "stop_sequences",
                format!("stop_sequences.{i}: each stop sequence must contain non-whitespace"),
            ));
        }
        stops.push(s.to_string());
    }
    Ok(stops)
}
