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

/// "Invalid type for 'param': expected X, but got Y instead."
pub(crate) fn type_error(param: &str, expected: &str, got: &Value) -> ApiError {
    ApiError::invalid_value(
        param,
        format!("Invalid type for '{param}': expected {expected}, but got {} instead.", type_name(got)),
    )
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
    ApiError::invalid_value(
        param,
        format!("Invalid '{param}': {kind} {dir} value. Expected a value {op} {bound}, but got {got} instead."),
    )
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
