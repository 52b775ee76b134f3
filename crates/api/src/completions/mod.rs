//! OpenAI's legacy Completions (`POST /v1/completions`) and llama.cpp's `/infill`: a raw prompt
//! (or a fill-in-the-middle prompt) instead of messages, parsed onto a [`ValidatedChat`] that
//! carries the shared fields (model, sampling, `n`, `stop`, stream), so both run the chat path.
//! `fim_stop` holds the rule that stops a middle where it runs into the suffix; `response`
//! the `text_completion` wire types.

pub mod fim_stop;
mod infill;
pub mod response;
#[cfg(test)]
mod tests;

use serde_json::{Map, Value};

use crate::fields::{check_array_len, get, opt_bool, opt_int, opt_num, opt_str, type_error, type_name};
use crate::request::ValidatedChat;
use crate::validate::{parse_logit_bias, parse_stop, parse_stream, too_deep};
use crate::ApiError;

pub use fim_stop::{indent_stops, FimStop};
pub use infill::parse_infill_request;

/// Most prompts one request may carry (`prompt` as an array), and most choices over all of them:
/// each choice is a sequence of its own.
pub const MAX_PROMPTS: usize = 128;
/// OpenAI's default `max_tokens` for Completions.
pub const DEFAULT_MAX_TOKENS: u32 = 16;
/// Most alternatives `logprobs` may ask for per token, as OpenAI allows.
pub const MAX_LOGPROBS: i64 = 5;

/// One prompt: text, or the model's token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<i32>),
}

/// A file sent for context with a fill-in-the-middle request (llama.cpp's `input_extra`).
#[derive(Debug, Clone, PartialEq)]
pub struct ExtraFile {
    pub filename: String,
    pub text: String,
}

/// A completions request, validated. `chat` holds the fields chat shares (its `messages` are
/// empty; its `logprobs`/`top_logprobs` are `logprobs`' on/off and count).
#[derive(Debug, Clone)]
pub struct ValidatedCompletion {
    pub chat: ValidatedChat,
    /// Each is its own set of `n` choices; choice `i` of prompt `p` has index `p * n + i`.
    pub prompts: Vec<PromptInput>,
    /// The code after the cursor: with it (non-empty, or any `/infill` request) the prompt is
    /// the code before, and the model fills the middle.
    pub suffix: Option<String>,
    pub extra: Vec<ExtraFile>,
    /// The prompt is repeated before each choice's text.
    pub echo: bool,
    /// `logprobs` (0–5 alternatives per token; `/infill`'s `n_probs`, 1–20), or `None` for no
    /// logprobs.
    pub logprobs: Option<u32>,
    /// Stop where the middle runs into the suffix or leaves the cursor's block (`fim_stop_rule`).
    pub fim_stop_rule: bool,
    /// `/infill`: a prefix and suffix too long for the context are cut to fit, as llama-server
    /// cuts them; `/v1/completions` refuses them, as OpenAI does.
    pub cut_to_fit: bool,
    /// `/infill`'s `n_indent`: lines after the first indented less than this end the answer
    /// ([`fim_stop::indent_stops`]); 0 for none.
    pub n_indent: u32,
}

impl ValidatedCompletion {
    /// Whether this is a fill-in-the-middle request.
    pub fn is_fim(&self) -> bool {
        self.suffix.is_some()
    }

    /// The stop rule a FIM request adds to its stop strings (see [`FimStop`]).
    pub fn fim_stop(&self) -> Option<FimStop> {
        let prefix = match self.prompts.first() {
            Some(PromptInput::Text(t)) => t.as_str(),
            _ => "",
        };
        self.suffix.as_deref().filter(|_| self.fim_stop_rule).and_then(|s| FimStop::for_suffix(prefix, s))
    }
}

/// The fields OpenAI's Completions takes, and Gantry's extensions; anything else is refused, as
/// OpenAI refuses it ("Unrecognized request argument supplied").
const KNOWN_FIELDS: &[&str] = &[
    "model",
    "prompt",
    "best_of",
    "echo",
    "frequency_penalty",
    "logit_bias",
    "ignore_eos",
    "logprobs",
    "max_tokens",
    "n",
    "presence_penalty",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "suffix",
    "temperature",
    "top_p",
    "user",
    // vLLM's and llama-server's extension, as on chat.
    "top_k",
    // Gantry's: the FIM stop rule (docs/api.md).
    "fim_stop_rule",
    // As on chat: the queue's lane (`flex` runs on idle capacity).
    "service_tier",
];

const BAD_JSON: &str = "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The API expects a JSON payload, but what was sent was not valid JSON.)";

/// Parses and validates a Completions request body, with OpenAI's 400s. `null` is absent.
pub fn parse_completion_request(body: &[u8]) -> Result<ValidatedCompletion, ApiError> {
    let value = request_object(body, KNOWN_FIELDS)?;
    let obj = body_object(&value)?;
    let prompts = match get(obj, "prompt") {
        None => return Err(ApiError::invalid_value("prompt", "Missing required parameter: 'prompt'.")),
        Some(v) => parse_prompt(v)?,
    };
    let mut chat = shared_fields(obj, "max_tokens", DEFAULT_MAX_TOKENS)?;
    let n = chat.n;
    if prompts.len() * n as usize > MAX_PROMPTS {
        return Err(ApiError::invalid_value(
            "n",
            format!(
                "Invalid 'n': {} prompts with n = {n} make {} choices; at most {MAX_PROMPTS} per request.",
                prompts.len(),
                prompts.len() * n as usize
            ),
        ));
    }
    // best_of ranks candidates server-side by their log-probability; this server does not, so
    // only the value that changes nothing is accepted.
    if let Some(best_of) = opt_int(obj, "best_of", 1, 128)? {
        if best_of != i64::from(n) {
            return Err(ApiError::invalid_value(
                "best_of",
                format!("Invalid 'best_of': this server does not rank candidates, so best_of must equal n ({n}) or be left out, but got {best_of}."),
            ));
        }
    }
    let logprobs = opt_int(obj, "logprobs", 0, MAX_LOGPROBS)?.map(|v| v as u32);
    chat.logprobs = logprobs.is_some();
    chat.top_logprobs = logprobs.unwrap_or(0);
    let echo = opt_bool(obj, "echo")?.unwrap_or(false);
    // Prompt tokens' logprobs would need the logits of every prompt position, which the engine
    // does not keep; OpenAI refuses the pair too for its current completion model.
    if echo && logprobs.is_some() {
        return Err(ApiError::invalid_value(
            "echo",
            "Setting 'echo' and 'logprobs' at the same time is not supported by this server.",
        ));
    }
    let suffix = opt_str(obj, "suffix", "suffix")?.filter(|s| !s.is_empty());
    if suffix.is_some() && prompts.len() > 1 {
        return Err(ApiError::invalid_value(
            "suffix",
            "A 'suffix' completes between one prompt and it: send one prompt with a suffix.",
        ));
    }
    let fim_stop_rule = opt_bool(obj, "fim_stop_rule")?.unwrap_or(true);
    Ok(ValidatedCompletion {
        chat,
        prompts,
        suffix,
        extra: Vec::new(),
        echo,
        logprobs,
        fim_stop_rule,
        cut_to_fit: false,
        n_indent: 0,
    })
}

/// A request body: JSON (OpenAI's 400 when it is not, or nests too deep), an object, with no
/// field outside `known` ("Unrecognized request argument supplied", as OpenAI refuses one).
/// `null` fields count as absent.
pub(crate) fn request_object(body: &[u8], known: &[&str]) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| too_deep(&e).unwrap_or_else(|| ApiError::invalid_request(BAD_JSON, None)))?;
    let obj = body_object(&value)?;
    if let Some(unknown) = obj.iter().find(|(k, v)| !v.is_null() && !known.contains(&k.as_str())) {
        return Err(ApiError::invalid_request(
            format!("Unrecognized request argument supplied: {}", unknown.0),
            Some(unknown.0),
        ));
    }
    Ok(value)
}

pub(crate) fn body_object(value: &Value) -> Result<&Map<String, Value>, ApiError> {
    value.as_object().ok_or_else(|| {
        ApiError::invalid_request(
            format!("Invalid type for request body: expected an object, but got {} instead.", type_name(value)),
            None,
        )
    })
}

/// The fields Completions shares with chat, as a [`ValidatedChat`] without messages;
/// `max_key` names the completion limit (`n_predict` on `/infill`, where -1 is no limit).
pub(crate) fn shared_fields(
    obj: &Map<String, Value>,
    max_key: &str,
    default_max: u32,
) -> Result<ValidatedChat, ApiError> {
    let model = match get(obj, "model") {
        None => return Err(ApiError::invalid_request("you must provide a model parameter", None)),
        Some(Value::String(s)) if s.is_empty() => {
            return Err(ApiError::invalid_value("model", "Invalid 'model': empty string. Expected a model id."))
        }
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(type_error("model", "a string", other)),
    };
    let (stream, include_usage) = parse_stream(obj)?;
    let max_tokens = match opt_int(obj, max_key, -1, i64::MAX)? {
        None => (default_max > 0).then_some(default_max),
        // llama.cpp's "no limit": what the context leaves.
        Some(-1) if max_key == "n_predict" => None,
        Some(m) if m < 1 => return Err(crate::fields::range_error(max_key, "integer", false, 1, m)),
        Some(m) => Some(m.min(i64::from(u32::MAX)) as u32),
    };
    Ok(ValidatedChat {
        model,
        messages: Vec::new(),
        stream,
        include_usage,
        temperature: opt_num(obj, "temperature", 0.0, 2.0)?.map(|v| v as f32),
        top_p: opt_num(obj, "top_p", 0.0, 1.0)?.map(|v| v as f32),
        top_k: opt_int(obj, "top_k", -1, i64::from(u32::MAX))?.filter(|&k| k > 0).map(|k| k as u32),
        max_tokens,
        stop: parse_stop(get(obj, "stop"))?,
        presence_penalty: opt_num(obj, "presence_penalty", -2.0, 2.0)?.unwrap_or(0.0) as f32,
        frequency_penalty: opt_num(obj, "frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0) as f32,
        n: opt_int(obj, "n", 1, MAX_PROMPTS as i64)?.unwrap_or(1) as u32,
        seed: opt_int(obj, "seed", i64::MIN, i64::MAX)?,
        logprobs: false,
        top_logprobs: 0,
        logit_bias: parse_logit_bias(get(obj, "logit_bias"))?,
        ignore_eos: crate::fields::opt_bool(obj, "ignore_eos")?.unwrap_or(false),
        tools: None,
        tool_choice: None,
        response_format: None,
        parallel_tool_calls: None,
        user: opt_str(obj, "user", "user")?,
        images: Vec::new(),
        reasoning_effort: None,
        thinking_token_budget: None,
        service_tier: crate::service_tier::parse_service_tier(obj)?,
    })
}

/// `prompt`: a string, strings, token ids, or arrays of token ids.
fn parse_prompt(v: &Value) -> Result<Vec<PromptInput>, ApiError> {
    parse_inputs("prompt", v, MAX_PROMPTS)
}

/// A string, an array of strings, an array of token ids, or an array of token arrays (at most
/// `max` items), as Completions' `prompt` and Embeddings' `input` take.
pub(crate) fn parse_inputs(param: &str, v: &Value, max: usize) -> Result<Vec<PromptInput>, ApiError> {
    let items = match v {
        Value::String(s) => return Ok(vec![PromptInput::Text(s.clone())]),
        Value::Array(items) => items,
        other => return Err(type_error(param, "a string or array", other)),
    };
    if items.is_empty() {
        return Err(ApiError::invalid_value(
            param,
            format!("Invalid '{param}': empty array. Expected a string, an array of strings or tokens, or an array of token arrays."),
        ));
    }
    if items.iter().all(Value::is_number) {
        return Ok(vec![PromptInput::Tokens(token_ids(param, items)?)]);
    }
    check_array_len(param, items, max)?;
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(s) => Ok(PromptInput::Text(s.clone())),
            Value::Array(ids) if !ids.is_empty() => Ok(PromptInput::Tokens(token_ids(&format!("{param}[{i}]"), ids)?)),
            Value::Array(_) => Err(ApiError::invalid_value(
                &format!("{param}[{i}]"),
                format!("Invalid '{param}': an empty token array."),
            )),
            other => Err(type_error(&format!("{param}[{i}]"), "a string or an array of token ids", other)),
        })
        .collect()
}

fn token_ids(param: &str, items: &[Value]) -> Result<Vec<i32>, ApiError> {
    items
        .iter()
        .map(|t| {
            t.as_i64().and_then(|t| i32::try_from(t).ok()).filter(|t| *t >= 0).ok_or_else(|| {
                ApiError::invalid_value(
                    param,
                    format!("Invalid '{param}': token ids are non-negative integers, got {t}."),
                )
            })
        })
        .collect()
}
