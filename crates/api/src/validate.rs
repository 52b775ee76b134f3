//! `parse_chat_request`: raw body bytes to a [`ValidatedChat`], with OpenAI-style 400s.

use serde_json::Value;

use crate::fields::{get, opt_bool, opt_bool_at, opt_int, opt_num, opt_str, type_error, type_name};
use crate::request::{parse_message, ValidatedChat};
use crate::ApiError;

/// Most `tools` one request may offer (OpenAI's limit): each is rendered into the prompt and
/// compiled into the call grammar, so their number bounds what one request costs to prepare.
pub(crate) const MAX_TOOLS: usize = 128;
/// Most bytes the `tools` array may take once serialized: 128 tools of 4 KiB each.
pub(crate) const MAX_TOOLS_BYTES: usize = 512 * 1024;
/// Most entries in `messages`: each is rendered by the chat template before tokenization.
pub(crate) const MAX_MESSAGES: usize = 2048;
/// Most bytes one JSON schema (`response_format.json_schema.schema`, a tool's `parameters`)
/// may take once serialized: compiling a schema into a grammar grows with its size.
pub(crate) const MAX_SCHEMA_BYTES: usize = 128 * 1024;
/// Longest function name, as OpenAI allows: `^[a-zA-Z0-9_-]{1,64}$`.
pub(crate) const MAX_FUNCTION_NAME_LEN: usize = 64;

const BAD_JSON: &str = "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The API expects a JSON payload, but what was sent was not valid JSON.)";

/// Parses and validates a Chat Completions request body. Unknown fields are ignored and
/// every field may be `null`, meaning absent.
pub fn parse_chat_request(body: &[u8]) -> Result<ValidatedChat, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|_| ApiError::invalid_request(BAD_JSON, None))?;
    let obj = value.as_object().ok_or_else(|| {
        ApiError::invalid_request(
            format!("Invalid type for request body: expected an object, but got {} instead.", type_name(&value)),
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

    let stream = opt_bool(obj, "stream")?.unwrap_or(false);
    let include_usage = match get(obj, "stream_options") {
        None => false,
        Some(Value::Object(o)) => opt_bool_at(o, "include_usage", "stream_options.include_usage")?.unwrap_or(false),
        Some(other) => return Err(type_error("stream_options", "an object", other)),
    };
    // OpenAI refuses stream options on a request that does not stream, rather than ignoring them.
    if get(obj, "stream_options").is_some() && !stream {
        return Err(ApiError::invalid_value(
            "stream_options",
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
        ));
    }

    let temperature = opt_num(obj, "temperature", 0.0, 2.0)?.map(|v| v as f32);
    let top_p = opt_num(obj, "top_p", 0.0, 1.0)?.map(|v| v as f32);
    let presence_penalty = opt_num(obj, "presence_penalty", -2.0, 2.0)?.unwrap_or(0.0) as f32;
    let frequency_penalty = opt_num(obj, "frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0) as f32;

    let max_legacy = opt_int(obj, "max_tokens", 1, i64::MAX)?;
    let max_new = opt_int(obj, "max_completion_tokens", 1, i64::MAX)?;
    let max_tokens = max_new.or(max_legacy).map(|v| v.min(u32::MAX as i64) as u32);

    let n = opt_int(obj, "n", 1, 128)?.unwrap_or(1) as u32;
    let seed = opt_int(obj, "seed", i64::MIN, i64::MAX)?;
    let logprobs = opt_bool(obj, "logprobs")?.unwrap_or(false);
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
    opt_str(obj, "service_tier", "service_tier")?;
    if let Some(functions) = get(obj, "functions").filter(|f| !f.is_array()) {
        return Err(type_error("functions", "an array", functions));
    }
    let tools = parse_tools(get(obj, "tools"))?;
    let tool_choice = parse_tool_choice(get(obj, "tool_choice"), tools.as_deref())?;
    let response_format = parse_response_format(get(obj, "response_format"))?;

    Ok(ValidatedChat {
        model,
        messages,
        stream,
        include_usage,
        temperature,
        top_p,
        max_tokens,
        stop,
        presence_penalty,
        frequency_penalty,
        n,
        seed,
        logprobs,
        top_logprobs,
        logit_bias,
        tools,
        tool_choice,
        response_format,
        parallel_tool_calls,
        user,
        images,
    })
}

fn parse_stop(v: Option<&Value>) -> Result<Vec<String>, ApiError> {
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

fn parse_logit_bias(v: Option<&Value>) -> Result<Vec<(i32, f32)>, ApiError> {
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

fn parse_tools(v: Option<&Value>) -> Result<Option<Vec<Value>>, ApiError> {
    let arr = match v {
        None => return Ok(None),
        Some(Value::Array(a)) => a,
        Some(other) => return Err(type_error("tools", "an array", other)),
    };
    check_array_len("tools", arr, MAX_TOOLS)?;
    let size = serialized_len(arr);
    if size > MAX_TOOLS_BYTES {
        return Err(too_large("tools", size, MAX_TOOLS_BYTES));
    }
    for (i, t) in arr.iter().enumerate() {
        let p = format!("tools[{i}]");
        let o = t.as_object().ok_or_else(|| type_error(&p, "an object", t))?;
        match get(o, "type") {
            Some(Value::String(s)) if s == "function" => {}
            Some(Value::String(s)) => {
                return Err(ApiError::invalid_value(
                    &format!("{p}.type"),
                    format!("Invalid value: '{s}'. Supported values are: 'function'."),
                ))
            }
            None => {
                return Err(ApiError::invalid_value(
                    &format!("{p}.type"),
                    format!("Missing required parameter: '{p}.type'."),
                ))
            }
            Some(other) => return Err(type_error(&format!("{p}.type"), "a string", other)),
        }
        let fp = format!("{p}.function");
        let f = match get(o, "function") {
            Some(Value::Object(f)) => f,
            None => return Err(ApiError::invalid_value(&fp, format!("Missing required parameter: '{fp}'."))),
            Some(other) => return Err(type_error(&fp, "an object", other)),
        };
        let np = format!("{fp}.name");
        match opt_str(f, "name", &np)? {
            Some(n) if !n.is_empty() => check_function_name(&np, &n)?,
            _ => return Err(ApiError::invalid_value(&np, format!("Missing required parameter: '{np}'."))),
        }
        if let Some(params) = get(f, "parameters") {
            if !params.is_object() {
                return Err(type_error(&format!("{fp}.parameters"), "an object", params));
            }
            check_schema_size(&format!("{fp}.parameters"), params)?;
        }
    }
    Ok(Some(arr.clone()))
}

fn parse_tool_choice(v: Option<&Value>, tools: Option<&[Value]>) -> Result<Option<Value>, ApiError> {
    let Some(v) = v else { return Ok(None) };
    let have_tools = tools.is_some_and(|t| !t.is_empty());
    let no_tools = || {
        ApiError::invalid_value(
            "tool_choice",
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
        )
    };
    match v {
        Value::String(s) => match s.as_str() {
            "none" | "auto" => {}
            "required" if have_tools => {}
            "required" => return Err(no_tools()),
            other => {
                return Err(ApiError::invalid_value(
                    "tool_choice",
                    format!("Invalid value: '{other}'. Supported values are: 'none', 'auto', and 'required'."),
                ))
            }
        },
        Value::Object(o) => {
            if get(o, "type").and_then(Value::as_str) != Some("function") {
                return Err(ApiError::invalid_value(
                    "tool_choice.type",
                    "Invalid value for 'tool_choice.type': expected 'function'.",
                ));
            }
            let name = get(o, "function")
                .and_then(Value::as_object)
                .and_then(|f| get(f, "name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ApiError::invalid_value(
                        "tool_choice.function.name",
                        "Missing required parameter: 'tool_choice.function.name'.",
                    )
                })?;
            if !have_tools {
                return Err(no_tools());
            }
            let offered = tools
                .unwrap_or_default()
                .iter()
                .any(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(name));
            if !offered {
                return Err(ApiError::invalid_value(
                    "tool_choice",
                    format!("Invalid value for 'tool_choice': function '{name}' is not one of the offered 'tools'."),
                ));
            }
        }
        other => return Err(type_error("tool_choice", "a string or object", other)),
    }
    Ok(Some(v.clone()))
}

fn parse_response_format(v: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let o = match v {
        None => return Ok(None),
        Some(Value::Object(o)) => o,
        Some(other) => return Err(type_error("response_format", "an object", other)),
    };
    match get(o, "type") {
        Some(Value::String(s)) => match s.as_str() {
            "text" | "json_object" => {}
            "json_schema" => {
                let js = match get(o, "json_schema") {
                    Some(Value::Object(js)) => js,
                    None => {
                        return Err(ApiError::invalid_value(
                            "response_format.json_schema",
                            "Missing required parameter: 'response_format.json_schema'.",
                        ))
                    }
                    Some(other) => return Err(type_error("response_format.json_schema", "an object", other)),
                };
                if opt_str(js, "name", "response_format.json_schema.name")?.is_none() {
                    return Err(ApiError::invalid_value(
                        "response_format.json_schema.name",
                        "Missing required parameter: 'response_format.json_schema.name'.",
                    ));
                }
                match get(js, "schema") {
                    Some(schema @ Value::Object(_)) => check_schema_size("response_format.json_schema.schema", schema)?,
                    None => {
                        return Err(ApiError::invalid_value(
                            "response_format.json_schema.schema",
                            "Missing required parameter: 'response_format.json_schema.schema'.",
                        ))
                    }
                    Some(other) => return Err(type_error("response_format.json_schema.schema", "an object", other)),
                }
            }
            other => {
                return Err(ApiError::invalid_value(
                    "response_format.type",
                    format!(
                        "Invalid value: '{other}'. Supported values are: 'text', 'json_object', and 'json_schema'."
                    ),
                ))
            }
        },
        None => {
            return Err(ApiError::invalid_value(
                "response_format.type",
                "Missing required parameter: 'response_format.type'.",
            ))
        }
        Some(other) => return Err(type_error("response_format.type", "a string", other)),
    }
    Ok(Some(Value::Object(o.clone())))
}

/// "Invalid 'param': array too long.", OpenAI's wording and code.
fn check_array_len(param: &str, arr: &[Value], max: usize) -> Result<(), ApiError> {
    if arr.len() <= max {
        return Ok(());
    }
    Err(above_max_length(param, "array", max, arr.len()))
}

/// OpenAI's refusal of an array or string over its maximum length: "Invalid 'param': array too
/// long. …" with the code `array_above_max_length` (`string_…` for a string).
fn above_max_length(param: &str, kind: &str, max: usize, len: usize) -> ApiError {
    let mut e = ApiError::invalid_value(
        param,
        format!(
            "Invalid '{param}': {kind} too long. Expected {article} {kind} with maximum length {max}, but got {article} {kind} with length {len} instead.",
            article = if kind == "array" { "an" } else { "a" },
        ),
    );
    e.code = Some(format!("{kind}_above_max_length"));
    e
}

/// OpenAI's rule for function names: 1 to 64 letters, digits, underscores or dashes.
fn check_function_name(param: &str, name: &str) -> Result<(), ApiError> {
    if name.len() > MAX_FUNCTION_NAME_LEN {
        return Err(above_max_length(param, "string", MAX_FUNCTION_NAME_LEN, name.len()));
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        let mut e = ApiError::invalid_value(
            param,
            format!("Invalid '{param}': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'."),
        );
        e.code = Some("invalid_value".into());
        return Err(e);
    }
    Ok(())
}

fn check_schema_size(param: &str, schema: &Value) -> Result<(), ApiError> {
    let size = serialized_len(schema);
    if size > MAX_SCHEMA_BYTES {
        return Err(too_large(param, size, MAX_SCHEMA_BYTES));
    }
    Ok(())
}

fn too_large(param: &str, size: usize, max: usize) -> ApiError {
    ApiError::invalid_value(
        param,
        format!("Invalid '{param}': {size} bytes as JSON, more than this server's limit of {max} bytes. Send a smaller one."),
    )
}

/// Bytes of `v` as compact JSON, counted without building the string.
fn serialized_len(v: &impl serde::Serialize) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    // Writing to a counter cannot fail; a `Value` always serializes.
    let _ = serde_json::to_writer(&mut counter, v);
    counter.0
}

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;
