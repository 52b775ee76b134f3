//! llama.cpp's `POST /infill` request (llama.vim's, and other llama.cpp IDE clients'): the code
//! before and after the cursor, other files for context, and llama.cpp's sampling names, parsed
//! onto the same [`ValidatedCompletion`] as a `/v1/completions` request with a `suffix`.
//! llama.cpp ignores fields it does not know (`samplers`, `cache_prompt`, `t_max_*_ms`, …),
//! and so does this parse.

use serde_json::Value;

use super::{body_object, shared_fields, ExtraFile, PromptInput, ValidatedCompletion};
use crate::fields::{check_array_len, get, opt_bool, opt_int, opt_str, type_error};
use crate::validate::too_deep;
use crate::ApiError;

/// Most alternatives `n_probs` may ask for per token (as chat's `top_logprobs`).
const MAX_N_PROBS: i64 = 20;

/// Most files `input_extra` may carry (llama.vim sends at most its ring of 16 by default).
const MAX_EXTRA_FILES: usize = 256;

/// Parses an `/infill` body. `model` may be left out (llama-server serves one model): the
/// request's `chat.model` is then empty, for the server to fill with its default model.
pub fn parse_infill_request(body: &[u8]) -> Result<ValidatedCompletion, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| too_deep(&e).unwrap_or_else(|| ApiError::invalid_request("The body is not valid JSON.", None)))?;
    let obj = body_object(&value)?;
    // No `model`, or `""`: the server's default model (llama-server serves one).
    let default_model = matches!(get(obj, "model"), None | Some(Value::String(_)))
        && get(obj, "model").and_then(Value::as_str).is_none_or(str::is_empty);
    let mut named = obj.clone();
    if default_model {
        named.insert("model".into(), Value::String("-".into()));
    }
    let mut chat = shared_fields(&named, "n_predict", 0)?;
    if default_model {
        chat.model.clear();
    }
    // One choice: llama.cpp's `/infill` answers one `content`.
    chat.n = 1;
    let prefix = opt_str(obj, "input_prefix", "input_prefix")?.unwrap_or_default();
    let suffix = opt_str(obj, "input_suffix", "input_suffix")?.unwrap_or_default();
    // llama.vim sends the cursor's line up to the cursor as `prompt`: it follows the prefix.
    let prompt = match get(obj, "prompt") {
        None => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(type_error("prompt", "a string", other)),
    };
    let extra = match get(obj, "input_extra") {
        None => Vec::new(),
        Some(Value::Array(files)) => {
            check_array_len("input_extra", files, MAX_EXTRA_FILES)?;
            files.iter().enumerate().map(|(i, f)| extra_file(i, f)).collect::<Result<_, _>>()?
        }
        Some(other) => return Err(type_error("input_extra", "an array", other)),
    };
    // llama.cpp's `n_probs`: each token's log-probability and its `n_probs` likeliest
    // alternatives, reported as `completion_probabilities` (the model's distribution, as
    // llama.cpp reports it unless `post_sampling_probs`).
    let n_probs = opt_int(obj, "n_probs", 0, MAX_N_PROBS)?.filter(|&n| n > 0).map(|n| n as u32);
    if opt_bool(obj, "post_sampling_probs")? == Some(true) {
        return Err(ApiError::invalid_value(
            "post_sampling_probs",
            "post_sampling_probs is not supported: completion_probabilities report the model's distribution before sampling (leave it false or out).",
        ));
    }
    let fim_stop_rule = opt_bool(obj, "fim_stop_rule")?.unwrap_or(true);
    // llama.cpp reads any integer; none above 0 sets no limit.
    let n_indent = opt_int(obj, "n_indent", i64::MIN, i64::MAX)?.unwrap_or(0).max(0);
    Ok(ValidatedCompletion {
        chat,
        prompts: vec![PromptInput::Text(prefix + &prompt)],
        suffix: Some(suffix),
        extra,
        echo: false,
        logprobs: n_probs,
        fim_stop_rule,
        cut_to_fit: true,
        n_indent: u32::try_from(n_indent).unwrap_or(u32::MAX),
    })
}

fn extra_file(i: usize, f: &Value) -> Result<ExtraFile, ApiError> {
    let param = format!("input_extra[{i}]");
    let Value::Object(o) = f else { return Err(type_error(&param, "an object", f)) };
    let text = match get(o, "text") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(type_error(&format!("{param}.text"), "a string", other)),
        None => {
            return Err(ApiError::invalid_value(
                &format!("{param}.text"),
                "an input_extra chunk must contain a \"text\" field with a string value",
            ))
        }
    };
    let filename = match get(o, "filename") {
        None => "tmp".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(type_error(&format!("{param}.filename"), "a string", other)),
    };
    Ok(ExtraFile { filename, text })
}
