//! Reading typed fields out of a request's JSON object, each failure in OpenAI's error shape
//! (`invalid_type`, `decimal_above_max_value`, …) naming the parameter.

use serde_json::{Map, Value};

use crate::ApiError;

/// A field's value, with JSON `null` meaning absent.
pub(crate) fn get<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

pub(crate) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a decimal",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// "Invalid type for 'param': expected X, but got Y instead.", code `invalid_type`.
pub(crate) fn type_error(param: &str, expected: &str, got: &Value) -> ApiError {
    let mut e = ApiError::invalid_value(
        param,
        format!("Invalid type for '{param}': expected {expected}, but got {} instead.", type_name(got)),
    );
    e.code = Some("invalid_type".into());
    e
}

pub(crate) fn opt_str(obj: &Map<String, Value>, key: &str, param: &str) -> Result<Option<String>, ApiError> {
    match get(obj, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(type_error(param, "a string", other)),
    }
}

pub(crate) fn opt_bool(obj: &Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    opt_bool_at(obj, key, key)
}

pub(crate) fn opt_bool_at(obj: &Map<String, Value>, key: &str, param: &str) -> Result<Option<bool>, ApiError> {
    match get(obj, key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(type_error(param, "a boolean", other)),
    }
}

pub(crate) fn range_error(
    param: &str,
    kind: &str,
    above: bool,
    bound: impl std::fmt::Display,
    got: impl std::fmt::Display,
) -> ApiError {
    let (dir, op) = if above { ("above maximum", "<=") } else { ("below minimum", ">=") };
    let mut e = ApiError::invalid_value(
        param,
        format!("Invalid '{param}': {kind} {dir} value. Expected a value {op} {bound}, but got {got} instead."),
    );
    // OpenAI's codes: `decimal_above_max_value`, `integer_below_min_value`, …
    e.code = Some(format!("{kind}_{}_value", if above { "above_max" } else { "below_min" }));
    e
}

pub(crate) fn opt_num(obj: &Map<String, Value>, key: &str, min: f64, max: f64) -> Result<Option<f64>, ApiError> {
    let Some(v) = get(obj, key) else { return Ok(None) };
    let x = v.as_f64().ok_or_else(|| type_error(key, "a number", v))?;
    if x > max {
        return Err(range_error(key, "decimal", true, max, x));
    }
    if x < min {
        return Err(range_error(key, "decimal", false, min, x));
    }
    Ok(Some(x))
}

pub(crate) fn opt_int(obj: &Map<String, Value>, key: &str, min: i64, max: i64) -> Result<Option<i64>, ApiError> {
    let Some(v) = get(obj, key) else { return Ok(None) };
    let Value::Number(num) = v else { return Err(type_error(key, "an integer", v)) };
    let x = match (num.as_i64(), num.as_u64()) {
        (Some(x), _) => x,
        (None, Some(u)) => return Err(range_error(key, "integer", true, max, u)),
        (None, None) => return Err(type_error(key, "an integer", v)),
    };
    if x > max {
        return Err(range_error(key, "integer", true, max, x));
    }
    if x < min {
        return Err(range_error(key, "integer", false, min, x));
    }
    Ok(Some(x))
}

/// Most bytes one JSON schema (`response_format.json_schema.schema`, a tool's `parameters`)
/// may take once serialized: compiling a schema into a grammar grows with its size.
pub(crate) const MAX_SCHEMA_BYTES: usize = 128 * 1024;
/// Longest function name, as OpenAI allows: `^[a-zA-Z0-9_-]{1,64}$`.
pub(crate) const MAX_FUNCTION_NAME_LEN: usize = 64;

/// "Invalid 'param': array too long.", OpenAI's wording and code.
pub(crate) fn check_array_len(param: &str, arr: &[Value], max: usize) -> Result<(), ApiError> {
    if arr.len() <= max {
        return Ok(());
    }
    Err(above_max_length(param, "array", max, arr.len()))
}

/// OpenAI's refusal of an array or string over its maximum length: "Invalid 'param': array too
/// long. …" with the code `array_above_max_length` (`string_…` for a string).
pub(crate) fn above_max_length(param: &str, kind: &str, max: usize, len: usize) -> ApiError {
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
pub(crate) fn check_function_name(param: &str, name: &str) -> Result<(), ApiError> {
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

pub(crate) fn check_schema_size(param: &str, schema: &Value) -> Result<(), ApiError> {
    let size = serialized_len(schema);
    if size > MAX_SCHEMA_BYTES {
        return Err(too_large(param, size, MAX_SCHEMA_BYTES));
    }
    Ok(())
}

pub(crate) fn too_large(param: &str, size: usize, max: usize) -> ApiError {
    ApiError::invalid_value(
        param,
        format!("Invalid '{param}': {size} bytes as JSON, more than this server's limit of {max} bytes. Send a smaller one."),
    )
}

/// Bytes of `v` as compact JSON, counted without building the string.
pub(crate) fn serialized_len(v: &impl serde::Serialize) -> usize {
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
mod tests {
    use serde_json::json;

    use crate::parse_chat_request;

    #[test]
    fn range_and_type_errors_carry_openais_codes() {
        for (patch, code) in [
            (json!({"temperature": 3}), "decimal_above_max_value"),
            (json!({"temperature": -1}), "decimal_below_min_value"),
            (json!({"n": 0}), "integer_below_min_value"),
            (json!({"n": 129}), "integer_above_max_value"),
            (json!({"temperature": "1"}), "invalid_type"),
        ] {
            let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
            body.as_object_mut().unwrap().extend(patch.as_object().unwrap().clone());
            let e = parse_chat_request(body.to_string().as_bytes()).unwrap_err();
            assert_eq!(e.code.as_deref(), Some(code), "{patch}");
        }
    }
}
