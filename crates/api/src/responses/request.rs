//! A Responses request as the chat request it means, validated by the same
//! [`parse_chat_request`](crate::parse_chat_request), plus what the Response object echoes back.

use serde_json::{json, Map, Value};

use super::kept;
use crate::fields::{get, type_error, type_name};
use crate::{ApiError, ValidatedChat};

/// A validated Responses request: the chat request to run and the fields its Response repeats.
#[derive(Debug, Clone)]
pub struct ResponsesRequest {
    pub chat: ValidatedChat,
    /// `store` (OpenAI's default: true).
    pub store: bool,
    pub previous_response_id: Option<String>,
    /// This request's `input` as items (a string is one user message), with the keys the API
    /// defines only (`kept`): what a stored response keeps of its turn, beside its output.
    pub items: Vec<Value>,
    /// `instructions`, `tools`, `tool_choice`, `text`, `temperature`, `top_p`,
    /// `max_output_tokens`, `parallel_tool_calls`, `metadata`, `user`, `safety_identifier`,
    /// `reasoning`, as sent (with the API's defaults where absent).
    pub echo: Map<String, Value>,
    /// The body, kept while the conversation `previous_response_id` names is still to be read
    /// ([`ResponsesRequest::continuing`]); `None` once `chat` holds the whole conversation.
    body: Option<Map<String, Value>>,
}

/// Parses and validates a `POST /v1/responses` body on its own, before any stored response is
/// read: a bad body is refused without touching storage. A body continuing a stored response
/// (`previous_response_id`) is checked as if that response ended with the calls its
/// `function_call_output` items answer; its `chat` is whole only after
/// [`ResponsesRequest::continuing`].
pub fn parse_responses_request(body: &[u8]) -> Result<ResponsesRequest, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        crate::validate::too_deep(&e).unwrap_or_else(|| {
            ApiError::invalid_request("We could not parse the JSON body of your request: it is not valid JSON.", None)
        })
    })?;
    let Value::Object(obj) = value else {
        return Err(ApiError::invalid_request(
            format!("Invalid type for request body: expected an object, got {}.", type_name(&value)),
            None,
        ));
    };
    refuse_unsupported(&obj)?;
    kept::check_echoed(&obj)?;
    let items = match get(&obj, "input") {
        Some(Value::String(s)) => vec![json!({"type": "message", "role": "user", "content": s})],
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| kept::kept_item(&format!("input[{i}]"), item))
            .collect::<Result<_, _>>()?,
        Some(other) => return Err(type_error("input", "a string or an array of items", other)),
        None => return Err(ApiError::invalid_request("Missing required parameter: 'input'.", Some("input"))),
    };
    let store = match get(&obj, "store") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(type_error("store", "a boolean", other)),
    };
    let previous_response_id = match get(&obj, "previous_response_id") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => return Err(type_error("previous_response_id", "a string", other)),
    };
    let stand_in = match previous_response_id {
        Some(_) => calls_answered_before(&items),
        None => Vec::new(),
    };
    let chat = to_chat(&obj, &stand_in, &items)?;
    let echo = echo(&obj);
    let body = previous_response_id.is_some().then_some(obj);
    Ok(ResponsesRequest { chat, store, previous_response_id, items, echo, body })
}

impl ResponsesRequest {
    /// The stored response whose conversation this request still has to read, if any.
    pub fn continues(&self) -> Option<&str> {
        self.body.as_ref().and(self.previous_response_id.as_deref())
    }

    /// This request with the conversation it continues (`prior`: its items, oldest first)
    /// before its own input: the chat request to run.
    pub fn continuing(mut self, prior: &[Value]) -> Result<Self, ApiError> {
        let Some(obj) = self.body.take() else { return Ok(self) };
        self.chat = to_chat(&obj, prior, &self.items)?;
        Ok(self)
    }
}

fn to_chat(obj: &Map<String, Value>, prior: &[Value], items: &[Value]) -> Result<ValidatedChat, ApiError> {
    let chat_body = to_chat_body(obj, prior, items)?;
    crate::validate::parse_chat_value(&chat_body).map_err(in_responses_terms)
}

/// Stand-ins for the calls of a continued response that `items` answers (its
/// `function_call_output`s without a call among `items`), so the body can be checked whole
/// before that response is read; the real calls take their place then.
fn calls_answered_before(items: &[Value]) -> Vec<Value> {
    let made: Vec<&Value> =
        items.iter().filter(|i| i["type"] == "function_call").filter_map(|i| i.get("call_id")).collect();
    items
        .iter()
        .filter(|i| i["type"] == "function_call_output")
        .filter_map(|i| i.get("call_id").filter(|id| id.is_string() && !made.contains(id)))
        .map(|id| json!({"type": "function_call", "call_id": id, "name": "stored_call", "arguments": "{}"}))
        .collect()
}

/// What a stored response keeps of its turn: `items` (its input) and its output items.
pub fn turn_items(items: &[Value], response: &Value) -> Value {
    let mut turn = items.to_vec();
    turn.extend(response["output"].as_array().into_iter().flatten().cloned());
    Value::Array(turn)
}

/// What this server cannot do is said, never silently skipped.
fn refuse_unsupported(obj: &Map<String, Value>) -> Result<(), ApiError> {
    for (field, what) in
        [("conversation", "conversations"), ("prompt", "stored prompts"), ("background", "background responses")]
    {
        if get(obj, field).is_some_and(|v| v != &Value::Bool(false)) {
            return Err(ApiError::invalid_value(field, format!("`{field}`: {what} are not supported by this server.")));
        }
    }
    Ok(())
}

fn to_chat_body(obj: &Map<String, Value>, prior: &[Value], items: &[Value]) -> Result<Value, ApiError> {
    let mut chat = Map::new();
    match get(obj, "model") {
        Some(m) => chat.insert("model".into(), m.clone()),
        None => return Err(ApiError::invalid_request("Missing required parameter: 'model'.", Some("model"))),
    };
    let mut messages = Vec::new();
    if let Some(instructions) = get(obj, "instructions") {
        let Value::String(text) = instructions else {
            return Err(type_error("instructions", "a string", instructions));
        };
        messages.push(json!({"role": "system", "content": text}));
    }
    // A continued conversation's items were checked when they were stored.
    for item in prior {
        translate_item(0, item, &mut messages)?;
    }
    for (i, item) in items.iter().enumerate() {
        translate_item(i, item, &mut messages)?;
    }
    chat.insert("messages".into(), messages.into());
    if get(obj, "stream") == Some(&Value::Bool(true)) {
        chat.insert("stream".into(), true.into());
        chat.insert("stream_options".into(), json!({"include_usage": true}));
    }
    for (from, to) in [
        ("max_output_tokens", "max_completion_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("parallel_tool_calls", "parallel_tool_calls"),
        ("user", "user"),
        ("prompt_cache_key", "prompt_cache_key"),
        ("prompt_cache_retention", "prompt_cache_retention"),
        ("service_tier", "service_tier"),
    ] {
        if let Some(v) = get(obj, from) {
            chat.insert(to.into(), v.clone());
        }
    }
    if wants_logprobs(obj)? {
        chat.insert("logprobs".into(), true.into());
        if let Some(top) = get(obj, "top_logprobs") {
            chat.insert("top_logprobs".into(), top.clone());
        }
    }
    if let Some(tools) = get(obj, "tools") {
        chat.insert("tools".into(), translate_tools(tools)?);
    }
    if let Some(effort) = get(obj, "reasoning").and_then(|r| r.get("effort")).filter(|e| !e.is_null()) {
        chat.insert("reasoning_effort".into(), effort.clone());
    }
    if let Some(choice) = get(obj, "tool_choice") {
        chat.insert("tool_choice".into(), translate_tool_choice(choice)?);
    }
    if let Some(format) = get(obj, "text").and_then(|t| t.get("format")).filter(|f| !f.is_null()) {
        if let Some(rf) = translate_format(format)? {
            chat.insert("response_format".into(), rf);
        }
    }
    Ok(Value::Object(chat))
}

/// Whether `include` asks for the answer's logprobs (`message.output_text.logprobs`; then
/// `top_logprobs` says how many alternatives, as in Chat Completions). Its other values name
/// what this server does not keep (encrypted reasoning, search results) and change nothing.
fn wants_logprobs(obj: &Map<String, Value>) -> Result<bool, ApiError> {
    match get(obj, "include") {
        None => Ok(false),
        Some(Value::Array(values)) => Ok(values.iter().any(|v| v == "message.output_text.logprobs")),
        Some(other) => Err(type_error("include", "an array", other)),
    }
}

/// One input item as chat messages. A `function_call` joins the assistant message right before
/// it (the turn that made it), so parallel calls and the text before them are one turn.
fn translate_item(i: usize, item: &Value, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let at = format!("input[{i}]");
    let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
    match kind {
        "message" => {
            let msg = message(&at, item)?;
            match out.last_mut() {
                // The answer after a reasoning item is the same assistant turn.
                Some(last) if is_bare_reasoning(last) && msg["role"] == "assistant" => last["content"] = msg["content"].clone(),
                _ => out.push(msg),
            }
        }
        "function_call" => {
            let field = |name: &str| {
                item.get(name).and_then(Value::as_str).ok_or_else(|| {
                    ApiError::invalid_value(&format!("{at}.{name}"), format!("Missing required parameter: '{at}.{name}'."))
                })
            };
            let call = json!({"id": field("call_id")?, "type": "function",
                              "function": {"name": field("name")?, "arguments": field("arguments")?}});
            match out.last_mut() {
                Some(last) if last["role"] == "assistant" => {
                    if let Some(calls) = last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                        calls.push(call);
                    } else {
                        last["tool_calls"] = json!([call]);
                    }
                }
                _ => out.push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
            }
        }
        "function_call_output" => {
            let call_id = item.get("call_id").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid_value(&format!("{at}.call_id"), format!("Missing required parameter: '{at}.call_id'."))
            })?;
            let output = match item.get("output") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => text_parts(&format!("{at}.output"), parts)?,
                _ => return Err(ApiError::invalid_value(&format!("{at}.output"), format!("'{at}.output' must be a string."))),
            };
            // As OpenAI: the call it answers is an earlier item (or in the continued response).
            let calls = out.iter().filter_map(|m| m["tool_calls"].as_array()).flatten();
            if !calls.into_iter().any(|c| c["id"] == call_id) {
                return Err(ApiError::invalid_value(
                    "input",
                    format!("No tool call found for function call output with call_id {call_id}."),
                ));
            }
            out.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
        }
        // Earlier reasoning goes to the template with the assistant turn it preceded, which
        // keeps or drops it as the model was trained.
        "reasoning" => {
            let texts = item.get("content").and_then(Value::as_array).into_iter().flatten();
            let text: Vec<&str> = texts.filter_map(|c| c.get("text").and_then(Value::as_str)).collect();
            if !text.is_empty() {
                out.push(json!({"role": "assistant", "content": null, "reasoning_content": text.join("\n")}));
            }
        }
        other => {
            return Err(ApiError::invalid_value(
                &format!("{at}.type"),
                format!("Input items of type '{other}' are not supported by this server (only messages, function_call, function_call_output and reasoning)."),
            ))
        }
    }
    Ok(())
}

/// An assistant turn holding only the thinking of a reasoning item, so far.
fn is_bare_reasoning(m: &Value) -> bool {
    m["role"] == "assistant"
        && m["content"].is_null()
        && m.get("tool_calls").is_none()
        && m.get("reasoning_content").is_some()
}

fn message(at: &str, item: &Value) -> Result<Value, ApiError> {
    let role = match item.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "system" | "developer" | "assistant")) => r,
        Some(other) => {
            return Err(ApiError::invalid_value(
                &format!("{at}.role"),
                format!(
                    "Invalid value: '{other}'. Supported values are: 'user', 'system', 'developer' and 'assistant'."
                ),
            ))
        }
        None => {
            return Err(ApiError::invalid_value(
                &format!("{at}.role"),
                format!("Missing required parameter: '{at}.role'."),
            ))
        }
    };
    let content = match item.get("content") {
        Some(Value::String(s)) => Value::String(s.clone()),
        Some(Value::Array(parts)) if role == "assistant" => Value::String(text_parts(&format!("{at}.content"), parts)?),
        Some(Value::Array(parts)) => {
            let mut out = Vec::with_capacity(parts.len());
            for (j, p) in parts.iter().enumerate() {
                out.push(input_part(&format!("{at}.content[{j}]"), p)?);
            }
            Value::Array(out)
        }
        Some(other) => return Err(type_error(&format!("{at}.content"), "a string or an array", other)),
        None => {
            return Err(ApiError::invalid_value(
                &format!("{at}.content"),
                format!("Missing required parameter: '{at}.content'."),
            ))
        }
    };
    Ok(json!({"role": role, "content": content}))
}

fn input_part(at: &str, part: &Value) -> Result<Value, ApiError> {
    match part.get("type").and_then(Value::as_str) {
        Some("input_text" | "output_text" | "text") => {
            let text = part.get("text").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid_value(&format!("{at}.text"), format!("Missing required parameter: '{at}.text'."))
            })?;
            Ok(json!({"type": "text", "text": text}))
        }
        Some("input_image") => {
            let url = part.get("image_url").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid_value(&format!("{at}.image_url"), "Images are taken by `image_url` (a URL or a data URL); `file_id` needs the Files API, which this server does not have.")
            })?;
            let detail = part.get("detail").cloned().unwrap_or_else(|| json!("auto"));
            Ok(json!({"type": "image_url", "image_url": {"url": url, "detail": detail}}))
        }
        other => Err(ApiError::invalid_value(
            &format!("{at}.type"),
            format!("Content parts of type {other:?} are not supported here (input_text and input_image are)."),
        )),
    }
}

/// Text parts (`input_text`, `output_text`, `refusal`) joined: an assistant turn or a tool output.
fn text_parts(at: &str, parts: &[Value]) -> Result<String, ApiError> {
    let mut text = String::new();
    for (j, p) in parts.iter().enumerate() {
        let piece = p.get("text").or_else(|| p.get("refusal")).and_then(Value::as_str).ok_or_else(|| {
            ApiError::invalid_value(&format!("{at}[{j}]"), format!("'{at}[{j}]' must be a text part."))
        })?;
        text.push_str(piece);
    }
    Ok(text)
}

fn translate_tools(tools: &Value) -> Result<Value, ApiError> {
    let Value::Array(tools) = tools else { return Err(type_error("tools", "an array", tools)) };
    let mut out = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {}
            other => {
                return Err(ApiError::invalid_value(
                    &format!("tools[{i}].type"),
                    format!(
                        "Built-in tools ({}) are not supported by this server; only function tools are.",
                        other.unwrap_or("none")
                    ),
                ))
            }
        }
        let mut function = Map::new();
        for key in ["name", "description", "parameters", "strict"] {
            if let Some(v) = t.get(key).filter(|v| !v.is_null()) {
                function.insert(key.into(), v.clone());
            }
        }
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(out.into())
}

fn translate_tool_choice(choice: &Value) -> Result<Value, ApiError> {
    match choice {
        Value::String(_) => Ok(choice.clone()),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o.get("name").cloned().unwrap_or(Value::Null);
            Ok(json!({"type": "function", "function": {"name": name}}))
        }
        other => Err(ApiError::invalid_value(
            "tool_choice",
            format!("tool_choice {other} is not supported here: use 'auto', 'none', 'required' or {{\"type\": \"function\", \"name\": …}}."),
        )),
    }
}

/// `text.format` as the chat `response_format`; `text` needs none.
fn translate_format(format: &Value) -> Result<Option<Value>, ApiError> {
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let mut schema = Map::new();
            for key in ["name", "description", "schema", "strict"] {
                if let Some(v) = format.get(key).filter(|v| !v.is_null()) {
                    schema.insert(key.into(), v.clone());
                }
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": schema})))
        }
        _ => Err(ApiError::invalid_value(
            "text.format.type",
            "Invalid value for 'text.format.type': expected 'text', 'json_object' or 'json_schema'.",
        )),
    }
}

/// The request fields a Response repeats, with the API's defaults.
fn echo(obj: &Map<String, Value>) -> Map<String, Value> {
    let field = |k: &str, default: Value| get(obj, k).cloned().unwrap_or(default);
    let mut e = Map::new();
    e.insert("instructions".into(), field("instructions", Value::Null));
    e.insert("max_output_tokens".into(), field("max_output_tokens", Value::Null));
    e.insert("metadata".into(), field("metadata", json!({})));
    e.insert("parallel_tool_calls".into(), field("parallel_tool_calls", json!(true)));
    e.insert("temperature".into(), field("temperature", json!(1.0)));
    e.insert("top_p".into(), field("top_p", json!(1.0)));
    e.insert("tool_choice".into(), field("tool_choice", json!("auto")));
    e.insert("tools".into(), field("tools", json!([])));
    e.insert("text".into(), field("text", json!({"format": {"type": "text"}})));
    e.insert("reasoning".into(), field("reasoning", json!({"effort": null, "summary": null})));
    e.insert("truncation".into(), field("truncation", json!("disabled")));
    e.insert("user".into(), field("user", Value::Null));
    e.insert("safety_identifier".into(), field("safety_identifier", Value::Null));
    // The server sets `store` to what it did.
    e.insert("store".into(), json!(false));
    e.insert("previous_response_id".into(), field("previous_response_id", Value::Null));
    e
}

/// An error of the shared chat path (validation, tools, prompt, grammar) in the Responses API's
/// terms: its field names, in the parameter and the message.
pub fn in_responses_terms(e: ApiError) -> ApiError {
    e.with_fields_renamed(&[
        ("max_completion_tokens", "max_output_tokens"),
        // `text.format` holds the schema and its name itself.
        ("response_format.json_schema", "text.format"),
        ("response_format", "text.format"),
        ("messages", "input"),
        ("reasoning_effort", "reasoning.effort"),
    ])
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
