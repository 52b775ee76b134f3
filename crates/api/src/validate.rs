//! `parse_chat_request`: raw body bytes to a [`ValidatedChat`], with OpenAI-style 400s.

use serde_json::Value;

use crate::fields::{check_array_len, get, opt_bool, opt_bool_at, opt_int, opt_num, opt_str, type_error, type_name};
use crate::request::{parse_message, ReasoningEffort, ValidatedChat};
use crate::tools::{parse_response_format, parse_tool_choice, parse_tools};
use crate::ApiError;

/// Most entries in `messages`: each is rendered by the chat template before tokenization.
pub(crate) const MAX_MESSAGES: usize = 2048;

const BAD_JSON: &str = "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The API expects a JSON payload, but what was sent was not valid JSON.)";

/// Parses and validates a Chat Completions request body. Unknown fields are ignored and
/// every field may be `null`, meaning absent.
pub fn parse_chat_request(body: &[u8]) -> Result<ValidatedChat, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| too_deep(&e).unwrap_or_else(|| ApiError::invalid_request(BAD_JSON, None)))?;
    parse_chat_value(&value)
}

/// Valid JSON nested deeper than the parser follows (128 levels: a schema of nested objects) is
/// not a malformed body: said so, rather than blaming the client's HTTP library.
pub(crate) fn too_deep(e: &serde_json::Error) -> Option<ApiError> {
    e.to_string().starts_with("recursion limit exceeded").then(|| {
        ApiError::invalid_request(
            "The JSON body of your request is nested too deeply: at most 128 levels of arrays and objects.",
            None,
        )
    })
}

/// [`parse_chat_request`] of a body already parsed: the other dialects validate the chat request
/// they translate to without writing it out and reading it back.
pub(crate) fn parse_chat_value(value: &Value) -> Result<ValidatedChat, ApiError> {
    let obj = value.as_object().ok_or_else(|| {
        ApiError::invalid_request(
            format!("Invalid type for request body: expected an object, but got {} instead.", type_name(value)),
            None,
        )
    })?;

    let model = match get(obj, "model") {
        None => return Err(ApiError::invalid_request("you must provide a model parameter", None)),
        Some(Value::String(s)) if s.is_empty() => {
            return Err(ApiError::invalid_value("model", "Invalid 'model': empty string. Expected a model id."))
        }
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(type_error("model", "a string", other)),
    };

    let messages_v = match get(obj, "messages") {
        None => return Err(ApiError::invalid_value("messages", "Missing required parameter: 'messages'.")),
        Some(Value::Array(a)) => a,
        Some(other) => return Err(type_error("messages", "an array", other)),
    };
    if messages_v.is_empty() {
        return Err(ApiError::invalid_value(
            "messages",
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
        ));
    }
    check_array_len("messages", messages_v, MAX_MESSAGES)?;
    let mut images = Vec::new();
    let messages =
        messages_v.iter().enumerate().map(|(i, m)| parse_message(i, m, &mut images)).collect::<Result<Vec<_>, _>>()?;
    check_tool_turns(&messages)?;
    if let Some(i) = messages.iter().rev().skip(1).position(|m| m.prefix) {
        let param = format!("messages[{}].prefix", messages.len() - 2 - i);
        return Err(ApiError::invalid_value(
            &param,
            "Only the last message can be a prefix for the answer to continue.",
        ));
    }

    let (stream, include_usage) = parse_stream(obj)?;

    let temperature = opt_num(obj, "temperature", 0.0, 2.0)?.map(|v| v as f32);
    let top_p = opt_num(obj, "top_p", 0.0, 1.0)?.map(|v| v as f32);
    // vLLM's convention: 0 or -1 means no limit.
    let top_k = opt_int(obj, "top_k", -1, i64::from(u32::MAX))?.filter(|&k| k > 0).map(|k| k as u32);
    let presence_penalty = opt_num(obj, "presence_penalty", -2.0, 2.0)?.unwrap_or(0.0) as f32;
    let frequency_penalty = opt_num(obj, "frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0) as f32;

    let max_legacy = opt_int(obj, "max_tokens", 1, i64::MAX)?;
    let max_new = opt_int(obj, "max_completion_tokens", 1, i64::MAX)?;
    let max_tokens = max_new.or(max_legacy).map(|v| v.min(u32::MAX as i64) as u32);

    let n = opt_int(obj, "n", 1, 128)?.unwrap_or(1) as u32;
    let seed = opt_int(obj, "seed", i64::MIN, i64::MAX)?;
    let logprobs = opt_bool(obj, "logprobs")?.unwrap_or(false);
    let ignore_eos = opt_bool(obj, "ignore_eos")?.unwrap_or(false);
    let top_logprobs = opt_int(obj, "top_logprobs", 0, 20)?;
    if top_logprobs.is_some() && !logprobs {
        return Err(ApiError::invalid_value(
            "top_logprobs",
            "Invalid value for 'top_logprobs': 'logprobs' must be set to true when 'top_logprobs' is used.",
        ));
    }
    let top_logprobs = top_logprobs.unwrap_or(0) as u32;

    let stop = parse_stop(get(obj, "stop"))?;
    let logit_bias = parse_logit_bias(get(obj, "logit_bias"))?;
    let user = opt_str(obj, "user", "user")?;
    let parallel_tool_calls = opt_bool(obj, "parallel_tool_calls")?;
    // Fields this server does not act on are still type-checked, as OpenAI does.
    opt_bool(obj, "store")?;
    let service_tier = crate::service_tier::parse_service_tier(obj)?;
    // The load balancer's affinity key (docs/replicas.md); one replica's prefix cache needs none.
    opt_str(obj, "prompt_cache_key", "prompt_cache_key")?;
    check_cache_retention(opt_str(obj, "prompt_cache_retention", "prompt_cache_retention")?.as_deref())?;
    refuse_unsupported(obj)?;
    let tools = parse_tools(get(obj, "tools"))?;
    let tool_choice = parse_tool_choice(get(obj, "tool_choice"), tools.as_deref())?;
    let response_format = parse_response_format(get(obj, "response_format"))?;
    let reasoning_effort = match opt_str(obj, "reasoning_effort", "reasoning_effort")? {
        None => None,
        Some(s) => Some(ReasoningEffort::parse(&s).ok_or_else(|| {
            ApiError::invalid_value(
                "reasoning_effort",
                format!(
                    "Invalid value: '{s}'. Supported values are: {}.",
                    ReasoningEffort::NAMES.map(|n| format!("'{n}'")).join(", ")
                ),
            )
        })?),
    };
    let thinking_token_budget = opt_int(obj, "thinking_token_budget", 0, i64::from(u32::MAX))?.map(|v| v as u32);

    Ok(ValidatedChat {
        model,
        messages,
        stream,
        include_usage,
        temperature,
        top_p,
        top_k,
        max_tokens,
        stop,
        presence_penalty,
        frequency_penalty,
        n,
        seed,
        logprobs,
        top_logprobs,
        logit_bias,
        ignore_eos,
        tools,
        tool_choice,
        response_format,
        parallel_tool_calls,
        user,
        images,
        reasoning_effort,
        thinking_token_budget,
        service_tier,
    })
}

/// `prompt_cache_retention`: prefixes stay cached while there is room for them (`in-memory`,
/// OpenAI's default); no server-side promise of a day (`24h`) can be kept, so it is refused as
/// OpenAI refuses it for a model without extended caching.
/// What this server cannot do is refused, never answered as if it had been done: a client that
/// asked for audio or search, or sent deprecated `functions`, would otherwise read an answer
/// made without them.
fn refuse_unsupported(obj: &serde_json::Map<String, Value>) -> Result<(), ApiError> {
    let has = |k: &str| get(obj, k).is_some();
    let functions = match get(obj, "functions") {
        None => &[][..],
        Some(Value::Array(f)) => f.as_slice(),
        Some(other) => return Err(type_error("functions", "an array", other)),
    };
    if !functions.is_empty() || has("function_call") {
        let param = if has("function_call") { "function_call" } else { "functions" };
        return Err(ApiError::invalid_value(
            param,
            "The deprecated 'functions' and 'function_call' are not supported by this server: send the functions as 'tools' ({\"type\": \"function\", \"function\": …}) and choose with 'tool_choice'.",
        ));
    }
    let audio_out = get(obj, "modalities").and_then(Value::as_array).is_some_and(|m| m.iter().any(|v| v == "audio"));
    if audio_out || has("audio") {
        let param = if has("audio") { "audio" } else { "modalities" };
        return Err(ApiError::invalid_value(
            param,
            "Audio output is not supported by this server: its models write text only.",
        ));
    }
    if has("web_search_options") {
        return Err(ApiError::invalid_value(
            "web_search_options",
            "Web search is not supported by this server: its models answer from the prompt alone.",
        ));
    }
    Ok(())
}

/// As OpenAI: a tool message answers a call of the assistant message before it (other tool
/// messages between them: parallel calls), by that call's id. A result the model cannot tie to
/// any call of its own is a client's mistake to hear about, not to run.
fn check_tool_turns(messages: &[crate::ChatMessage]) -> Result<(), ApiError> {
    let mut calls: Option<Vec<&str>> = None;
    for (i, m) in messages.iter().enumerate() {
        match m.role {
            crate::Role::Tool => {
                let Some(ids) = &calls else {
                    return Err(ApiError::invalid_value(
                        &format!("messages[{i}].role"),
                        "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.",
                    ));
                };
                let id = m.tool_call_id.as_deref().unwrap_or_default();
                if !ids.contains(&id) {
                    return Err(ApiError::invalid_value(
                        &format!("messages[{i}].tool_call_id"),
                        format!("Invalid parameter: 'tool_call_id' of '{id}' not found in 'tool_calls' of previous message."),
                    ));
                }
            }
            crate::Role::Assistant => {
                let ids = m.tool_calls.as_ref().and_then(Value::as_array).into_iter().flatten();
                let ids: Vec<&str> = ids.filter_map(|c| c.get("id").and_then(Value::as_str)).collect();
                calls = (!ids.is_empty()).then_some(ids);
            }
            _ => calls = None,
        }
    }
    Ok(())
}

fn check_cache_retention(v: Option<&str>) -> Result<(), ApiError> {
    match v {
        None | Some("in-memory" | "in_memory") => Ok(()),
        Some("24h") => Err(ApiError::invalid_value(
            "prompt_cache_retention",
            "prompt_cache_retention '24h' is not supported by this server: cached prefixes are kept in memory (and in --cache-ram) while there is room, not for a set time. Use 'in-memory' or leave it out.",
        )),
        Some(other) => Err(ApiError::invalid_value(
            "prompt_cache_retention",
            format!("Invalid value for 'prompt_cache_retention': '{other}'. Supported values are: 'in-memory' and '24h'."),
        )),
    }
}

/// `stream` and `stream_options.include_usage`. OpenAI refuses stream options on a request that
/// does not stream, rather than ignoring them.
pub(crate) fn parse_stream(obj: &serde_json::Map<String, Value>) -> Result<(bool, bool), ApiError> {
    let stream = opt_bool(obj, "stream")?.unwrap_or(false);
    let include_usage = match get(obj, "stream_options") {
        None => false,
        Some(Value::Object(o)) => opt_bool_at(o, "include_usage", "stream_options.include_usage")?.unwrap_or(false),
        Some(other) => return Err(type_error("stream_options", "an object", other)),
    };
    if get(obj, "stream_options").is_some() && !stream {
        return Err(ApiError::invalid_value(
            "stream_options",
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
        ));
    }
    Ok((stream, include_usage))
}

pub(crate) fn parse_stop(v: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let strings: Vec<String> = match v {
        None => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => {
            check_array_len("stop", a, 4)?;
            a.iter()
                .enumerate()
                .map(|(i, s)| {
                    s.as_str().map(str::to_owned).ok_or_else(|| type_error(&format!("stop[{i}]"), "a string", s))
                })
                .collect::<Result<_, _>>()?
        }
        Some(other) => return Err(type_error("stop", "a string or array", other)),
    };
    Ok(strings.into_iter().filter(|s| !s.is_empty()).collect())
}

pub(crate) fn parse_logit_bias(v: Option<&Value>) -> Result<Vec<(i32, f32)>, ApiError> {
    let obj = match v {
        None => return Ok(Vec::new()),
        Some(Value::Object(o)) => o,
        Some(other) => return Err(type_error("logit_bias", "an object", other)),
    };
    obj.iter()
        .map(|(k, b)| {
            let token = k.trim().parse::<i32>().ok().filter(|t| *t >= 0).ok_or_else(|| {
                ApiError::invalid_value(
                    "logit_bias",
                    format!("Invalid key in 'logit_bias': {k}. You should only be submitting non-negative integers."),
                )
            })?;
            let param = format!("logit_bias.{k}");
            let x = b.as_f64().ok_or_else(|| type_error(&param, "a number", b))?;
            if !(-100.0..=100.0).contains(&x) {
                return Err(ApiError::invalid_value(
                    "logit_bias",
                    format!("Invalid 'logit_bias' value for token {k}: expected a value between -100 and 100, but got {x} instead."),
                ));
            }
            Ok((token, x as f32))
        })
        .collect()
}

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;
