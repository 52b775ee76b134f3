//! A batch's input file, line by line: each a JSON object with a unique `custom_id`, `method`
//! POST, the batch's `url`, and a `body` the endpoint accepts (checked by the endpoint's own
//! parse, so a line that validates here is not refused later for its shape) naming a model the
//! key may use for that endpoint. A file with any bad line makes a failed batch whose errors name
//! each line, as OpenAI reports them.

use std::collections::HashSet;

use gantry_accounts::{KeyInfo, NewLine};
use serde_json::{json, Value};

use super::endpoint::Endpoint;
use crate::openai::models::key_allows;
use crate::state::AppState;

/// The most line errors a failed batch lists.
const MAX_ERRORS: usize = 100;

/// One line's error, as the batch's `errors.data` lists it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct LineError {
    pub code: &'static str,
    pub message: String,
    pub param: Option<String>,
    /// 1-based; `None` for the file as a whole.
    pub line: Option<usize>,
}

impl LineError {
    pub(super) fn to_json(&self) -> Value {
        json!({"code": self.code, "message": self.message, "param": self.param, "line": self.line})
    }
}

/// The file's requests, or every error found (up to [`MAX_ERRORS`]).
pub(super) fn lines(
    state: &AppState,
    key: &KeyInfo,
    endpoint: Endpoint,
    content: &str,
    max_lines: usize,
) -> Result<Vec<NewLine>, Vec<LineError>> {
    let (mut lines, mut errors, mut seen) = (Vec::new(), Vec::new(), HashSet::new());
    for (n, text) in content.lines().enumerate().filter(|(_, t)| !t.trim().is_empty()) {
        if lines.len() + errors.len() >= max_lines {
            let message = format!("The file holds more than {max_lines} requests, the most a batch may.");
            errors.push(LineError { code: "too_many_requests", message, param: None, line: None });
            break;
        }
        match line(state, key, endpoint, text, &mut seen) {
            Ok(line) => lines.push(line),
            Err((code, message, param)) => {
                errors.push(LineError { code, message, param: param.map(str::to_owned), line: Some(n + 1) })
            }
        }
        if errors.len() >= MAX_ERRORS {
            break;
        }
    }
    if lines.is_empty() && errors.is_empty() {
        let message = "The input file holds no requests.".to_string();
        errors.push(LineError { code: "empty_file", message, param: None, line: None });
    }
    if errors.is_empty() {
        Ok(lines)
    } else {
        Err(errors)
    }
}

type Refusal = (&'static str, String, Option<&'static str>);

fn line(
    state: &AppState,
    key: &KeyInfo,
    endpoint: Endpoint,
    text: &str,
    seen: &mut HashSet<String>,
) -> Result<NewLine, Refusal> {
    let invalid = |m: &str| ("invalid_json_line", m.to_string(), None);
    let Ok(Value::Object(mut request)) = serde_json::from_str::<Value>(text) else {
        return Err(invalid("This line is not parseable as a JSON object."));
    };
    let custom_id = match request.remove("custom_id") {
        Some(Value::String(id)) if !id.is_empty() && id.len() <= 512 => id,
        _ => {
            return Err((
                "missing_required_parameter",
                "Each line needs a 'custom_id': a string of 1 to 512 characters.".into(),
                Some("custom_id"),
            ))
        }
    };
    if !seen.insert(custom_id.clone()) {
        return Err((
            "duplicate_custom_id",
            format!("The custom_id '{custom_id}' is used by an earlier line; each line needs its own."),
            Some("custom_id"),
        ));
    }
    match request.get("method").and_then(Value::as_str) {
        Some("POST") => {}
        _ => return Err(("invalid_method", "Each line's 'method' must be 'POST'.".into(), Some("method"))),
    }
    match request.get("url").and_then(Value::as_str) {
        Some(url) if url == endpoint.path() => {}
        url => {
            let endpoint = endpoint.path();
            let message = format!("The line's url {url:?} is not the batch's endpoint '{endpoint}': a batch runs requests of one endpoint.");
            return Err(("mismatched_endpoint", message, Some("url")));
        }
    }
    let Some(Value::Object(mut body)) = request.remove("body") else {
        return Err(("invalid_request", "Each line needs a 'body': the request, a JSON object.".into(), Some("body")));
    };
    // A batch's answers are collected, never streamed.
    if !endpoint.embeds() {
        body.insert("stream".into(), Value::Bool(false));
        body.remove("stream_options");
    }
    let body = Value::Object(body).to_string();
    let model = endpoint.parsed_model(body.as_bytes()).map_err(|e| ("invalid_request", e.message, None))?;
    let spec = state.models.resolve(&model).filter(|spec| key_allows(key, &model, spec));
    let serves = spec.is_some_and(|spec| endpoint.served_by(&spec.capabilities));
    if !serves {
        let message = format!(
            "The model `{model}` does not exist, you do not have access to it, or it does not serve {}.",
            endpoint.path()
        );
        return Err(("model_not_found", message, Some("body.model")));
    }
    Ok(NewLine { custom_id, request_id: super::new_id("batch_req_"), body })
}
