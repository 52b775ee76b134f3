//! `tools`, `tool_choice` and `response_format`, checked once into typed values: the server and
//! the engine take them from here and never read their JSON again.

use serde_json::Value;

use crate::fields::{check_array_len, check_function_name, check_schema_size, serialized_len, too_large};
use crate::fields::{get, opt_bool_at, opt_str, type_error};
use crate::ApiError;

/// Most `tools` one request may offer (OpenAI's limit): each is rendered into the prompt and
/// compiled into the call grammar, so their number bounds what one request costs to prepare.
pub(crate) const MAX_TOOLS: usize = 128;
/// Most bytes the `tools` array may take once serialized: 128 tools of 4 KiB each.
pub(crate) const MAX_TOOLS_BYTES: usize = 512 * 1024;

/// One offered function, checked: its name matches OpenAI's pattern, its parameters (if any) are
/// a JSON schema object within the size limit.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    /// The JSON schema of the call's arguments, as sent.
    pub parameters: Option<Value>,
    /// The tool as sent (`{"type": "function", "function": {…}}`): what chat templates render.
    pub definition: Value,
    /// `function.strict: true`: the schema is held to exactly; without it, keywords a grammar
    /// cannot enforce are skipped rather than refused (OpenAI enforces nothing then).
    pub strict: bool,
}

/// `tool_choice`. A named function is one of the request's `tools` (checked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    Function(String),
}

/// `response_format`.
#[derive(Debug, Clone, PartialEq)]
pub enum ResponseFormat {
    Text,
    JsonObject,
    /// `strict`: as for [`Tool::strict`].
    JsonSchema {
        name: String,
        schema: Value,
        strict: bool,
    },
}

impl ResponseFormat {
    /// Whether it asks for JSON (anything but `text`).
    pub fn is_json(&self) -> bool {
        !matches!(self, ResponseFormat::Text)
    }
}

/// The refusal of a `tool_choice` that names a function the request does not offer.
pub fn tool_choice_not_offered(name: &str) -> ApiError {
    ApiError::invalid_value(
        "tool_choice",
        format!("Invalid value for 'tool_choice': function '{name}' is not one of the offered 'tools'."),
    )
}

pub(crate) fn parse_tools(v: Option<&Value>) -> Result<Option<Vec<Tool>>, ApiError> {
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
    let mut tools = Vec::with_capacity(arr.len());
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
        let name = match opt_str(f, "name", &np)? {
            Some(n) if !n.is_empty() => {
                check_function_name(&np, &n)?;
                n
            }
            _ => return Err(ApiError::invalid_value(&np, format!("Missing required parameter: '{np}'."))),
        };
        let parameters = get(f, "parameters").cloned();
        if let Some(params) = &parameters {
            if !params.is_object() {
                return Err(type_error(&format!("{fp}.parameters"), "an object", params));
            }
            check_schema_size(&format!("{fp}.parameters"), params)?;
        }
        let strict = opt_bool_at(f, "strict", &format!("{fp}.strict"))?.unwrap_or(false);
        tools.push(Tool { name, parameters, definition: t.clone(), strict });
    }
    Ok(Some(tools))
}

pub(crate) fn parse_tool_choice(v: Option<&Value>, tools: Option<&[Tool]>) -> Result<Option<ToolChoice>, ApiError> {
    let Some(v) = v else { return Ok(None) };
    let have_tools = tools.is_some_and(|t| !t.is_empty());
    let no_tools = || {
        ApiError::invalid_value(
            "tool_choice",
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
        )
    };
    let choice = match v {
        Value::String(s) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" if have_tools => ToolChoice::Required,
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
            let offered = tools.unwrap_or_default().iter().any(|t| t.name == name);
            if !offered {
                return Err(tool_choice_not_offered(name));
            }
            ToolChoice::Function(name.to_string())
        }
        other => return Err(type_error("tool_choice", "a string or object", other)),
    };
    Ok(Some(choice))
}

pub(crate) fn parse_response_format(v: Option<&Value>) -> Result<Option<ResponseFormat>, ApiError> {
    let o = match v {
        None => return Ok(None),
        Some(Value::Object(o)) => o,
        Some(other) => return Err(type_error("response_format", "an object", other)),
    };
    let format = match get(o, "type") {
        Some(Value::String(s)) => match s.as_str() {
            "text" => ResponseFormat::Text,
            "json_object" => ResponseFormat::JsonObject,
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
                let Some(name) = opt_str(js, "name", "response_format.json_schema.name")? else {
                    return Err(ApiError::invalid_value(
                        "response_format.json_schema.name",
                        "Missing required parameter: 'response_format.json_schema.name'.",
                    ));
                };
                let schema = match get(js, "schema") {
                    Some(schema @ Value::Object(_)) => {
                        check_schema_size("response_format.json_schema.schema", schema)?;
                        schema.clone()
                    }
                    None => {
                        return Err(ApiError::invalid_value(
                            "response_format.json_schema.schema",
                            "Missing required parameter: 'response_format.json_schema.schema'.",
                        ))
                    }
                    Some(other) => return Err(type_error("response_format.json_schema.schema", "an object", other)),
                };
                let strict = opt_bool_at(js, "strict", "response_format.json_schema.strict")?.unwrap_or(false);
                ResponseFormat::JsonSchema { name, schema, strict }
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
    };
    Ok(Some(format))
}
