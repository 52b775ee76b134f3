//! An Anthropic Messages request as the Chat Completions request it means, validated by the
//! same [`parse_chat_request`](crate::parse_chat_request): one set of rules for both dialects.
//! What Chat Completions cannot say (more than four stop sequences, `top_k`) is set on the
//! validated request afterwards.

use serde_json::{json, Map, Value};

use super::options::{output_config, stop_sequences, thinking};
use crate::fields::{get, type_error, type_name};
use crate::{ApiError, ValidatedChat};

/// The fields of a Messages request this server knows. Anything else is refused, as Anthropic
/// does ("Extra inputs are not permitted"), so a misspelt field never silently does nothing.
const KNOWN: [&str; 23] = [
    "model",
    "messages",
    "max_tokens",
    "system",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
    "metadata",
    "thinking",
    "service_tier",
    "cache_control",
    "output_config",
    // Where and how fast Anthropic serves, and whose account: nothing to change here.
    "inference_geo",
    "speed",
    "diagnostics",
    "user_profile_id",
    "workspace_id",
    // Server-side features: accepted only as `null` (see `refuse_server_features`).
    "container",
    "context_management",
];

/// Anthropic's code-execution container and context editing run on Anthropic's side: asked for,
/// they would silently not happen here.
fn refuse_server_features(obj: &Map<String, Value>) -> Result<(), ApiError> {
    for key in ["container", "context_management"] {
        if obj.get(key).is_some_and(|v| !v.is_null()) {
            return Err(ApiError::invalid_value(key, format!("{key}: not supported by this server")));
        }
    }
    Ok(())
}

/// Parses and validates a Messages request body into the chat request the engine runs.
pub fn parse_messages_request(body: &[u8]) -> Result<ValidatedChat, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        crate::validate::too_deep(&e)
            .unwrap_or_else(|| ApiError::invalid_request(format!("The request body is not valid JSON: {e}"), None))
    })?;
    let obj = value.as_object().ok_or_else(|| {
        ApiError::invalid_request(format!("The request body must be a JSON object, not {}.", type_name(&value)), None)
    })?;
    if let Some(extra) = obj.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(ApiError::invalid_request(format!("{extra}: Extra inputs are not permitted"), Some(extra)));
    }
    refuse_server_features(obj)?;
    let (chat_body, stops, top_k) = to_chat_body(obj)?;
    let mut chat = crate::validate::parse_chat_value(&chat_body).map_err(in_messages_terms)?;
    chat.stop = stops;
    chat.top_k = top_k;
    Ok(chat)
}

/// The chat body, the stop sequences and `top_k`.
fn to_chat_body(obj: &Map<String, Value>) -> Result<(Value, Vec<String>, Option<u32>), ApiError> {
    let model = match get(obj, "model") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(type_error("model", "a string", other)),
        None => return Err(required("model")),
    };
    let max_tokens = match get(obj, "max_tokens") {
        Some(v) => v.as_u64().filter(|&n| n >= 1).ok_or_else(|| {
            ApiError::invalid_value("max_tokens", format!("max_tokens: must be an integer of at least 1, got {v}"))
        })?,
        None => return Err(required("max_tokens")),
    };
    let messages = match get(obj, "messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => {
            return Err(ApiError::invalid_value("messages", "messages: at least one message is required"))
        }
        Some(other) => return Err(type_error("messages", "an array", other)),
        None => return Err(required("messages")),
    };
    let mut chat_messages = Vec::new();
    if let Some(system) = get(obj, "system") {
        chat_messages.push(json!({"role": "system", "content": text_of("system", system)?}));
    }
    for (i, m) in messages.iter().enumerate() {
        translate_message(i, m, &mut chat_messages)?;
    }
    mark_prefill(&mut chat_messages)?;
    let mut chat = Map::new();
    chat.insert("model".into(), model.into());
    chat.insert("messages".into(), chat_messages.into());
    chat.insert("max_completion_tokens".into(), max_tokens.into());
    let stream = get(obj, "stream").cloned();
    if stream == Some(Value::Bool(true)) {
        // The translated stream reports usage in `message_delta`, so it always asks for it.
        chat.insert("stream_options".into(), json!({"include_usage": true}));
    }
    for (from, to) in [("stream", "stream"), ("top_p", "top_p")] {
        if let Some(v) = get(obj, from) {
            chat.insert(to.into(), v.clone());
        }
    }
    if let Some(t) = get(obj, "temperature") {
        // Anthropic's range is 0 to 1 (Chat Completions allows 2).
        if t.as_f64().is_some_and(|t| !(0.0..=1.0).contains(&t)) {
            return Err(ApiError::invalid_value(
                "temperature",
                format!("temperature: must be between 0 and 1, got {t}"),
            ));
        }
        chat.insert("temperature".into(), t.clone());
    }
    if let Some(user) = get(obj, "metadata").and_then(|m| m.get("user_id")).filter(|u| !u.is_null()) {
        chat.insert("user".into(), user.clone());
    }
    thinking(get(obj, "thinking"), max_tokens, &mut chat)?;
    if let Some(config) = get(obj, "output_config") {
        output_config(config, &mut chat)?;
    }
    if let Some(tools) = get(obj, "tools") {
        chat.insert("tools".into(), translate_tools(tools)?);
    }
    if let Some(choice) = get(obj, "tool_choice") {
        let (choice, parallel) = translate_tool_choice(choice)?;
        chat.insert("tool_choice".into(), choice);
        if let Some(parallel) = parallel {
            chat.insert("parallel_tool_calls".into(), parallel.into());
        }
    }
    let stops = stop_sequences(get(obj, "stop_sequences"))?;
    let top_k =
        match get(obj, "top_k") {
            None => None,
            Some(v) => Some(v.as_u64().and_then(|k| u32::try_from(k).ok()).filter(|&k| k >= 1).ok_or_else(|| {
                ApiError::invalid_value("top_k", format!("top_k: must be a positive integer, got {v}"))
            })?),
        };
    Ok((Value::Object(chat), stops, top_k))
}

fn required(field: &str) -> ApiError {
    ApiError::invalid_value(field, format!("{field}: Field required"))
}

/// `system`, or a `tool_result`'s content: a string, or text blocks joined by newlines.
fn text_of(param: &str, v: &Value) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut parts = Vec::with_capacity(blocks.len());
            for (j, b) in blocks.iter().enumerate() {
                match (b.get("type").and_then(Value::as_str), b.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(text)) => parts.push(text),
                    _ => {
                        return Err(ApiError::invalid_value(
                            param,
                            format!("{param}.{j}: only text blocks are supported here, with a string `text`"),
                        ))
                    }
                }
            }
            Ok(parts.join("\n"))
        }
        other => Err(type_error(param, "a string or an array of text blocks", other)),
    }
}

/// One Messages message as chat messages: a user turn's `tool_result` blocks become `tool`
/// messages (before its other content, right after the calls they answer); an assistant turn's
/// `tool_use` blocks become its `tool_calls`.
fn translate_message(i: usize, m: &Value, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let param = format!("messages.{i}");
    let role = match m.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant")) => r,
        Some(other) => {
            return Err(ApiError::invalid_value(
                &param,
                format!("{param}.role: Input should be 'user' or 'assistant', got '{other}'"),
            ))
        }
        None => return Err(ApiError::invalid_value(&param, format!("{param}.role: Field required"))),
    };
    let blocks = match m.get("content") {
        Some(Value::String(s)) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        Some(other) => return Err(type_error(&format!("{param}.content"), "a string or an array", other)),
        None => return Err(ApiError::invalid_value(&param, format!("{param}.content: Field required"))),
    };
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    let mut thoughts = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{param}.content.{j}");
        let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
        match (role, kind) {
            (_, "text") => {
                let text = block.get("text").and_then(Value::as_str).ok_or_else(|| text_required(&at))?;
                parts.push(json!({"type": "text", "text": text}));
            }
            ("user", "image") => parts.push(image_part(&at, block)?),
            ("user", "tool_result") => {
                let result = tool_result(&at, block)?;
                check_answers_a_call(&at, &result, out)?;
                out.push(result);
            }
            ("assistant", "tool_use") => calls.push(tool_use(&at, block)?),
            // Earlier thinking goes to the template, which keeps or drops it as the model
            // was trained; redacted thinking has no text to give it.
            ("assistant", "thinking") => {
                thoughts.push(block.get("thinking").and_then(Value::as_str).unwrap_or_default().to_string())
            }
            ("assistant", "redacted_thinking") => {}
            _ => {
                return Err(ApiError::invalid_value(
                    &at,
                    format!("{at}: a block of type '{kind}' is not supported in a {role} message"),
                ))
            }
        }
    }
    if role == "assistant" {
        let text: Vec<&str> = parts.iter().filter_map(|p| p["text"].as_str()).collect();
        let mut msg = json!({"role": "assistant", "content": text.join("")});
        if !calls.is_empty() {
            msg["tool_calls"] = calls.into();
        }
        if !thoughts.is_empty() {
            msg["reasoning_content"] = thoughts.join("\n").into();
        }
        out.push(msg);
    } else if !parts.is_empty() {
        out.push(json!({"role": "user", "content": parts}));
    }
    Ok(())
}

/// A conversation that ends with an assistant turn is a prefill: the answer continues that text
/// (and, as Anthropic's, leaves it out). Anthropic refuses one that ends in whitespace.
fn mark_prefill(messages: &mut [Value]) -> Result<(), ApiError> {
    let Some(last) = messages.last_mut().filter(|m| m["role"] == "assistant" && m.get("tool_calls").is_none()) else {
        return Ok(());
    };
    let text = last["content"].as_str().unwrap_or_default();
    if text.ends_with(char::is_whitespace) {
        return Err(ApiError::invalid_value(
            "messages",
            "messages: final assistant content cannot end with trailing whitespace",
        ));
    }
    last["prefix"] = true.into();
    Ok(())
}

fn text_required(at: &str) -> ApiError {
    ApiError::invalid_value(at, format!("{at}.text: Field required"))
}

fn image_part(at: &str, block: &Value) -> Result<Value, ApiError> {
    let source =
        block.get("source").ok_or_else(|| ApiError::invalid_value(at, format!("{at}.source: Field required")))?;
    let url = match source.get("type").and_then(Value::as_str) {
        Some("base64") => {
            let media = source.get("media_type").and_then(Value::as_str).unwrap_or("");
            let data = source.get("data").and_then(Value::as_str).unwrap_or("");
            if media.is_empty() || data.is_empty() {
                return Err(ApiError::invalid_value(
                    at,
                    format!("{at}.source: a base64 image needs `media_type` and `data`"),
                ));
            }
            format!("data:{media};base64,{data}")
        }
        Some("url") => source
            .get("url")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid_value(at, format!("{at}.source.url: Field required")))?
            .to_string(),
        _ => return Err(ApiError::invalid_value(at, format!("{at}.source.type: Input should be 'base64' or 'url'"))),
    };
    Ok(json!({"type": "image_url", "image_url": {"url": url}}))
}

fn tool_result(at: &str, block: &Value) -> Result<Value, ApiError> {
    let id = block
        .get("tool_use_id")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid_value(at, format!("{at}.tool_use_id: Field required")))?;
    let content = match block.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(v) => text_of(&format!("{at}.content"), v)?,
    };
    // The model is told a failed call failed; Anthropic passes `is_error` to Claude the same way.
    let content = if block.get("is_error").and_then(Value::as_bool) == Some(true) {
        format!("Error: {content}")
    } else {
        content
    };
    Ok(json!({"role": "tool", "tool_call_id": id, "content": content}))
}

/// As Anthropic: a `tool_result` answers a `tool_use` of the assistant message right before its
/// own message (`out` holds that message, then this message's earlier results).
fn check_answers_a_call(at: &str, result: &Value, out: &[Value]) -> Result<(), ApiError> {
    let id = result["tool_call_id"].as_str().unwrap_or_default();
    let previous = out.iter().rev().find(|m| m["role"] != "tool");
    let calls = previous.filter(|m| m["role"] == "assistant").and_then(|m| m["tool_calls"].as_array());
    if calls.into_iter().flatten().any(|c| c["id"] == id) {
        return Ok(());
    }
    Err(ApiError::invalid_value(
        at,
        format!("{at}: unexpected `tool_use_id` found in `tool_result` blocks: {id}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."),
    ))
}

fn tool_use(at: &str, block: &Value) -> Result<Value, ApiError> {
    let field = |name: &str| {
        block
            .get(name)
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid_value(at, format!("{at}.{name}: Field required")))
    };
    let (id, name) = (field("id")?, field("name")?);
    let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
    Ok(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input.to_string()}}))
}

fn translate_tools(tools: &Value) -> Result<Value, ApiError> {
    let Value::Array(tools) = tools else { return Err(type_error("tools", "an array", tools)) };
    let mut out = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let at = format!("tools.{i}");
        // Anthropic's server tools (web search, code execution, computer use, …) run on
        // Anthropic's side; here only the client's own tools exist.
        if let Some(kind) = t.get("type").and_then(Value::as_str).filter(|k| *k != "custom") {
            return Err(ApiError::invalid_value(
                &at,
                format!("{at}.type: server tools such as '{kind}' are not supported; define a custom tool with `input_schema`"),
            ));
        }
        let name = t.get("name").and_then(Value::as_str).ok_or_else(|| required(&format!("{at}.name")))?;
        let schema = t.get("input_schema").ok_or_else(|| required(&format!("{at}.input_schema")))?;
        // In the chat path's order (name, description, parameters): the template renders the
        // tool as written, and the same tools should read the same to the model in both.
        let mut function = json!({"name": name});
        if let Some(d) = t.get("description").filter(|d| !d.is_null()) {
            function["description"] = d.clone();
        }
        function["parameters"] = schema.clone();
        // Anthropic's structured tool use: the input follows the schema exactly, as a strict
        // OpenAI function does (keywords no grammar enforces are then refused, not skipped).
        if let Some(strict) = t.get("strict").filter(|s| !s.is_null()) {
            function["strict"] = strict.clone();
        }
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(out.into())
}

/// `tool_choice` as the chat one, and `parallel_tool_calls` from `disable_parallel_tool_use`.
fn translate_tool_choice(choice: &Value) -> Result<(Value, Option<bool>), ApiError> {
    let parallel = choice.get("disable_parallel_tool_use").and_then(Value::as_bool).map(|d| !d);
    let chat = match choice.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            let name = choice.get("name").and_then(Value::as_str).ok_or_else(|| required("tool_choice.name"))?;
            json!({"type": "function", "function": {"name": name}})
        }
        _ => {
            return Err(ApiError::invalid_value(
                "tool_choice",
                "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'",
            ))
        }
    };
    Ok((chat, parallel))
}

/// An error of the shared chat path (validation, tools, prompt, grammar) in the Messages API's
/// terms: its field names, in the parameter and the message.
pub fn in_messages_terms(e: ApiError) -> ApiError {
    e.with_fields_renamed(&[
        ("max_completion_tokens", "max_tokens"),
        ("stop", "stop_sequences"),
        ("response_format.json_schema.schema", "output_config.format.schema"),
        ("response_format", "output_config.format"),
    ])
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
