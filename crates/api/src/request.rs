//! The validated chat request and its messages.
//!
//! Requests are not deserialised with serde derive: the body is parsed as a
//! `serde_json::Value` and [`crate::parse_chat_request`] reads each field with precise type
//! checks, so a wrong type yields a 400 naming the parameter (as OpenAI does).

use serde_json::{Map, Value};

use crate::fields::{get, opt_bool_at, opt_str, type_error};
use crate::image::{parse_image_url, ImageRef};
use crate::tools::{ResponseFormat, Tool, ToolChoice};
use crate::ApiError;

/// A message author.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Some(match s {
            "system" => Role::System,
            "developer" => Role::Developer,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            _ => return None,
        })
    }
}

/// One normalised message.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatMessage {
    pub role: Role,
    /// Text content. Array content has its text (and refusal) parts concatenated with no
    /// separator; image parts contribute no text (see `image_offsets` and
    /// [`ValidatedChat::images`]). `None` only for an assistant message sent without content.
    pub content: Option<String>,
    pub name: Option<String>,
    /// The assistant's `tool_calls` array as sent (already shape-checked).
    pub tool_calls: Option<Value>,
    pub tool_call_id: Option<String>,
    /// Where this message's images sit in `content`: the byte offset of each, in order.
    pub image_offsets: Vec<usize>,
    /// `"prefix": true` on the last message, an assistant's (DeepSeek's and Mistral's
    /// convention; Anthropic's prefill): the answer continues this text instead of starting a
    /// new turn.
    pub prefix: bool,
    /// An assistant's thinking (`reasoning_content`, or `reasoning`, as the answers carry it),
    /// passed to the template as `reasoning_content` (and `thinking`): a reasoning model's template
    /// keeps or drops it as the model was trained.
    pub reasoning: Option<String>,
}

impl ChatMessage {
    /// The message as chat templates expect it: `{"role", "content"}` plus `tool_calls`
    /// (each `function.arguments` parsed into JSON when it parses), `tool_call_id` and `name`
    /// when present. A missing assistant content renders as `null` when the message carries
    /// tool calls and as `""` otherwise.
    pub fn to_template_value(&self) -> Value {
        self.to_template_value_marking_images(None)
    }

    /// [`Self::to_template_value`] with `image_marker` written into the content where each image
    /// part was (the text a vision model's prompt builder replaces with the image). Without a
    /// marker images leave no trace in the text.
    pub fn to_template_value_marking_images(&self, image_marker: Option<&str>) -> Value {
        let mut m = Map::new();
        m.insert("role".into(), self.role.as_str().into());
        let content = match (&self.content, &self.tool_calls) {
            (Some(c), _) => Value::String(match image_marker {
                Some(marker) if !self.image_offsets.is_empty() => mark_images(c, &self.image_offsets, marker),
                _ => c.clone(),
            }),
            (None, Some(_)) => Value::Null,
            (None, None) => Value::String(String::new()),
        };
        m.insert("content".into(), content);
        if let Some(Value::Array(calls)) = &self.tool_calls {
            let calls: Vec<Value> = calls.iter().map(template_tool_call).collect();
            m.insert("tool_calls".into(), Value::Array(calls));
        }
        if let Some(id) = &self.tool_call_id {
            m.insert("tool_call_id".into(), id.clone().into());
        }
        if let Some(name) = &self.name {
            m.insert("name".into(), name.clone().into());
        }
        if self.prefix {
            m.insert("prefix".into(), true.into());
        }
        if let Some(r) = &self.reasoning {
            // Qwen3's templates read `reasoning_content`, gpt-oss's `thinking`.
            m.insert("reasoning_content".into(), r.clone().into());
            m.insert("thinking".into(), r.clone().into());
        }
        Value::Object(m)
    }
}

fn mark_images(content: &str, offsets: &[usize], marker: &str) -> String {
    let mut out = String::with_capacity(content.len() + offsets.len() * marker.len());
    let mut from = 0;
    for &at in offsets {
        out.push_str(&content[from..at]);
        out.push_str(marker);
        from = at;
    }
    out.push_str(&content[from..]);
    out
}

fn template_tool_call(call: &Value) -> Value {
    let mut call = call.clone();
    if let Some(args) = call.pointer_mut("/function/arguments") {
        if let Some(parsed) = args.as_str().and_then(|s| serde_json::from_str::<Value>(s).ok()) {
            *args = parsed;
        }
    }
    call
}

/// A chat completion request after validation. Defaults: `n` 1, penalties 0, `stop` empty.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidatedChat {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    pub stream: bool,
    /// `stream_options.include_usage`; only ever true when `stream` is.
    pub include_usage: bool,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// Only the `top_k` most probable tokens may be drawn (vLLM's and llama-server's extension
    /// of Chat Completions; Anthropic's `top_k`). `None`: no limit.
    pub top_k: Option<u32>,
    /// `max_completion_tokens` if given, else `max_tokens`.
    pub max_tokens: Option<u32>,
    /// At most 4, empty strings dropped.
    pub stop: Vec<String>,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub n: u32,
    pub seed: Option<i64>,
    pub logprobs: bool,
    pub top_logprobs: u32,
    /// (token id, bias) in request order; token ids are non-negative.
    pub logit_bias: Vec<(i32, f32)>,
    /// No end-of-generation token may be drawn: the answer runs to `max_tokens` or a stop string
    /// (llama-server's and vLLM's `ignore_eos`, for benchmarks and fixed-length outputs).
    pub ignore_eos: bool,
    pub tools: Option<Vec<Tool>>,
    pub tool_choice: Option<ToolChoice>,
    pub response_format: Option<ResponseFormat>,
    pub parallel_tool_calls: Option<bool>,
    pub user: Option<String>,
    /// Every `image_url` part of every message, in order.
    pub images: Vec<ImagePart>,
    /// How much a reasoning model thinks (`reasoning_effort`).
    pub reasoning_effort: Option<ReasoningEffort>,
    /// Most thinking tokens (vLLM's `thinking_token_budget`); 0: no thinking.
    pub thinking_token_budget: Option<u32>,
    /// The tier asked for (`service_tier`); the server grants `priority` or not.
    pub service_tier: crate::ServiceTier,
}

/// `reasoning_effort`: OpenAI's levels. On a reasoning model each is a thinking budget (`none`
/// turns the thinking off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningEffort {
    None,
    Minimal,
    Low,
    Medium,
    High,
    Xhigh,
}

impl ReasoningEffort {
    pub const NAMES: [&'static str; 6] = ["none", "minimal", "low", "medium", "high", "xhigh"];

    pub fn parse(s: &str) -> Option<Self> {
        use ReasoningEffort::*;
        let all = [None, Minimal, Low, Medium, High, Xhigh];
        Self::NAMES.iter().position(|&n| n == s).map(|i| all[i])
    }

    /// The thinking tokens this level allows; `Some(0)`: none; `None`: as many as `max_tokens`
    /// leaves (xhigh).
    pub fn budget_tokens(self) -> Option<u32> {
        match self {
            ReasoningEffort::None => Some(0),
            ReasoningEffort::Minimal => Some(256),
            ReasoningEffort::Low => Some(1024),
            ReasoningEffort::Medium => Some(4096),
            ReasoningEffort::High => Some(16384),
            ReasoningEffort::Xhigh => None,
        }
    }
}

impl ValidatedChat {
    /// The thinking budget the request asks for: `Some(0)` none, `None` unbounded (the model's
    /// default, up to `max_tokens`). The tighter of `reasoning_effort` and
    /// `thinking_token_budget` wins.
    pub fn thinking_budget(&self) -> Option<u32> {
        let effort = self.reasoning_effort.and_then(ReasoningEffort::budget_tokens);
        match (effort, self.thinking_token_budget) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// One `image_url` content part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImagePart {
    pub source: ImageRef,
    /// Names the part in errors: `messages[i].content[j].image_url`.
    pub param: String,
    pub detail: ImageDetail,
}

/// `image_url.detail`: how finely the model should look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ImageDetail {
    #[default]
    Auto,
    Low,
    High,
}

/// Parses `messages[i]`, pushing its images onto `images`.
pub(crate) fn parse_message(i: usize, v: &Value, images: &mut Vec<ImagePart>) -> Result<ChatMessage, ApiError> {
    let p = format!("messages[{i}]");
    let obj = v.as_object().ok_or_else(|| type_error(&p, "an object", v))?;
    let role_param = format!("{p}.role");
    let role = match get(obj, "role") {
        None => return Err(ApiError::invalid_value(&role_param, format!("Missing required parameter: '{role_param}'."))),
        Some(Value::String(s)) => Role::parse(s).ok_or_else(|| {
            ApiError::invalid_value(
                &role_param,
                format!(
                    "Invalid value: '{s}'. Supported values are: 'system', 'developer', 'user', 'assistant', and 'tool'."
                ),
            )
        })?,
        Some(other) => return Err(type_error(&role_param, "a string", other)),
    };
    let name = opt_str(obj, "name", &format!("{p}.name"))?;

    let content_param = format!("{p}.content");
    let mut image_offsets = Vec::new();
    let content = match get(obj, "content") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(parts)) => {
            if parts.is_empty() {
                return Err(ApiError::invalid_value(
                    &content_param,
                    format!("Invalid '{content_param}': empty array. Expected an array with minimum length 1, but got an empty array instead."),
                ));
            }
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let pp = format!("{content_param}[{j}]");
                if let Some(image) = parse_part(role, &pp, part, &mut text)? {
                    images.push(image);
                    image_offsets.push(text.len());
                }
            }
            Some(text)
        }
        Some(other) => return Err(type_error(&content_param, "a string or array", other)),
    };

    let mut tool_calls = None;
    let mut tool_call_id = None;
    match role {
        Role::Assistant => {
            if let Some(calls) = get(obj, "tool_calls") {
                check_tool_calls(&format!("{p}.tool_calls"), calls)?;
                tool_calls = Some(calls.clone());
            }
        }
        Role::Tool => {
            let id_param = format!("{p}.tool_call_id");
            tool_call_id = opt_str(obj, "tool_call_id", &id_param)?;
            if tool_call_id.is_none() {
                return Err(ApiError::invalid_value(&id_param, format!("Missing required parameter: '{id_param}'.")));
            }
        }
        _ => {}
    }
    if content.is_none() && role != Role::Assistant {
        return Err(ApiError::invalid_value(&content_param, format!("Missing required parameter: '{content_param}'.")));
    }
    let prefix_param = format!("{p}.prefix");
    let prefix = opt_bool_at(obj, "prefix", &prefix_param)?.unwrap_or(false);
    if prefix && (role != Role::Assistant || tool_calls.is_some() || !image_offsets.is_empty()) {
        return Err(ApiError::invalid_value(
            &prefix_param,
            "Only an assistant message with text content and no tool calls can be a prefix for the answer to continue.",
        ));
    }
    let mut reasoning = None;
    if role == Role::Assistant {
        for key in ["reasoning_content", "reasoning"] {
            reasoning = reasoning.or(opt_str(obj, key, &format!("{p}.{key}"))?);
        }
    }
    Ok(ChatMessage { role, content, name, tool_calls, tool_call_id, image_offsets, prefix, reasoning })
}

/// One content part: appends its text to `text`, returns its image if it is one.
fn parse_part(role: Role, pp: &str, part: &Value, text: &mut String) -> Result<Option<ImagePart>, ApiError> {
    let obj = part.as_object().ok_or_else(|| type_error(pp, "an object", part))?;
    let type_param = format!("{pp}.type");
    let kind = match get(obj, "type") {
        Some(Value::String(s)) => s.as_str(),
        None => {
            return Err(ApiError::invalid_value(&type_param, format!("Missing required parameter: '{type_param}'.")))
        }
        Some(other) => return Err(type_error(&type_param, "a string", other)),
    };
    let required_str = |key: &str| -> Result<String, ApiError> {
        let param = format!("{pp}.{key}");
        opt_str(obj, key, &param)?
            .ok_or_else(|| ApiError::invalid_value(&param, format!("Missing required parameter: '{param}'.")))
    };
    match (kind, role) {
        ("text", _) => text.push_str(&required_str("text")?),
        ("refusal", Role::Assistant) => text.push_str(&required_str("refusal")?),
        ("image_url", Role::User) => {
            let param = format!("{pp}.image_url");
            let mut detail = ImageDetail::Auto;
            let url = match get(obj, "image_url") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Object(o)) => {
                    if let Some(d) = opt_str(o, "detail", &format!("{param}.detail"))? {
                        detail = match d.as_str() {
                            "auto" => ImageDetail::Auto,
                            "low" => ImageDetail::Low,
                            "high" => ImageDetail::High,
                            _ => {
                                return Err(ApiError::invalid_value(
                                    &format!("{param}.detail"),
                                    format!("Invalid value: '{d}'. Supported values are: 'auto', 'low', and 'high'."),
                                ))
                            }
                        };
                    }
                    opt_str(o, "url", &format!("{param}.url"))?.ok_or_else(|| {
                        ApiError::invalid_value(
                            &format!("{param}.url"),
                            format!("Missing required parameter: '{param}.url'."),
                        )
                    })?
                }
                None => return Err(ApiError::invalid_value(&param, format!("Missing required parameter: '{param}'."))),
                Some(other) => return Err(type_error(&param, "an object", other)),
            };
            let source = parse_image_url(&url, &param)?;
            return Ok(Some(ImagePart { source, param, detail }));
        }
        _ => {
            let allowed = match role {
                Role::User => "'text' and 'image_url'",
                Role::Assistant => "'text' and 'refusal'",
                _ => "'text'",
            };
            return Err(ApiError::invalid_value(
                &type_param,
                format!("Invalid value: '{kind}'. Supported values for {} messages are: {allowed}.", role.as_str()),
            ));
        }
    }
    Ok(None)
}

fn check_tool_calls(param: &str, calls: &Value) -> Result<(), ApiError> {
    let arr = calls.as_array().ok_or_else(|| type_error(param, "an array", calls))?;
    for (k, call) in arr.iter().enumerate() {
        let cp = format!("{param}[{k}]");
        let obj = call.as_object().ok_or_else(|| type_error(&cp, "an object", call))?;
        let need = |o: &Map<String, Value>, key: &str, at: &str| -> Result<String, ApiError> {
            let param = format!("{at}.{key}");
            opt_str(o, key, &param)?
                .ok_or_else(|| ApiError::invalid_value(&param, format!("Missing required parameter: '{param}'.")))
        };
        need(obj, "id", &cp)?;
        if let Some(t) = opt_str(obj, "type", &format!("{cp}.type"))? {
            if t != "function" {
                return Err(ApiError::invalid_value(
                    &format!("{cp}.type"),
                    format!("Invalid value: '{t}'. Supported values are: 'function'."),
                ));
            }
        }
        let fp = format!("{cp}.function");
        let f = match get(obj, "function") {
            Some(Value::Object(f)) => f,
            None => return Err(ApiError::invalid_value(&fp, format!("Missing required parameter: '{fp}'."))),
            Some(other) => return Err(type_error(&fp, "an object", other)),
        };
        need(f, "name", &fp)?;
        need(f, "arguments", &fp)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msg(role: Role, content: Option<&str>) -> ChatMessage {
        ChatMessage {
            role,
            content: content.map(str::to_owned),
            name: None,
            tool_calls: None,
            tool_call_id: None,
            image_offsets: Vec::new(),
            prefix: false,
            reasoning: None,
        }
    }

    #[test]
    fn an_assistants_thinking_reaches_the_template_under_either_name() {
        for key in ["reasoning_content", "reasoning"] {
            let v = json!({"role": "assistant", "content": "4", key: "2 + 2 is 4."});
            let m = parse_message(0, &v, &mut Vec::new()).unwrap();
            assert_eq!(m.reasoning.as_deref(), Some("2 + 2 is 4."));
            assert_eq!(m.to_template_value()["reasoning_content"], "2 + 2 is 4.");
        }
        let bad = json!({"role": "assistant", "content": "4", "reasoning_content": 4});
        let e = parse_message(0, &bad, &mut Vec::new()).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].reasoning_content"));
        let user = json!({"role": "user", "content": "hi", "reasoning_content": "x"});
        assert!(parse_message(0, &user, &mut Vec::new()).unwrap().reasoning.is_none());
    }

    #[test]
    fn template_value_plain_and_tool() {
        assert_eq!(msg(Role::User, Some("hi")).to_template_value(), json!({"role": "user", "content": "hi"}));
        assert_eq!(msg(Role::Assistant, None).to_template_value(), json!({"role": "assistant", "content": ""}));
        let mut t = msg(Role::Tool, Some("42"));
        t.tool_call_id = Some("call_1".into());
        t.name = Some("calc".into());
        assert_eq!(
            t.to_template_value(),
            json!({"role": "tool", "content": "42", "tool_call_id": "call_1", "name": "calc"})
        );
    }

    #[test]
    fn template_value_parses_arguments() {
        let mut a = msg(Role::Assistant, None);
        a.tool_calls = Some(json!([
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "not json"}}
        ]));
        let v = a.to_template_value();
        assert_eq!(v["content"], Value::Null);
        assert_eq!(v["tool_calls"][0]["function"]["arguments"], json!({"x": 1}));
        assert_eq!(v["tool_calls"][1]["function"]["arguments"], "not json");
    }

    #[test]
    fn roles_round_trip() {
        for r in [Role::System, Role::Developer, Role::User, Role::Assistant, Role::Tool] {
            assert_eq!(Role::parse(r.as_str()), Some(r));
        }
        assert_eq!(Role::parse("function"), None);
    }
}
