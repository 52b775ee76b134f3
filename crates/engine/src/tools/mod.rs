//! Tool calls in model output, recognised whatever format the model chose.
//!
//! Small models rarely follow their chat template's tool-call format exactly: Qwen2.5-Coder often
//! writes a bare JSON object or a ```json fence instead of `<tool_call>` tags, Llama 3 writes
//! `<|python_tag|>` or plain `{"name", "parameters"}` JSON, Mistral writes `[TOOL_CALLS]`.
//! [`parse_tool_calls`] recognises all of them in finished text; [`ToolCallStreamer`] does the
//! same incrementally and gives the same result for any split of the text into deltas.
//!
//! The rules, shared by both:
//! - Tagged calls (`<tool_call>`, `<|python_tag|>`, `<function=name>`, `[TOOL_CALLS]`) and
//!   ```json / ``` fences holding nothing but calls are recognised anywhere; the text around
//!   them is content.
//! - Bare JSON (an object, an array of objects, or several objects) is a call only when it is the
//!   whole (trimmed) text: a call-shaped object inside prose stays prose.
//! - A call must name a function in `known`; anything unknown, broken or truncated stays text.
//! - Content is the text outside the calls, concatenated and trimmed.

mod commit;
mod definitions;
mod grammar;
mod parse;
mod prompt;
mod raw;
mod stream;
#[cfg(test)]
mod tests;
mod watch;

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

pub use commit::{call_commitment, forced_cut_call, truncated_call, Commitment};
pub use definitions::{hoist_definitions, CallRoots};
pub use grammar::{answer_or_call, call_schema, close_objects, lazy_grammars};
pub use parse::parse_tool_calls;

pub use prompt::with_generic_tool_prompt;
pub use stream::{StreamPiece, ToolCallStreamer};
pub use watch::{fenced_call_grammar, fenced_grammar, CallStart, CallWatch};

/// One recognised call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    /// Compact JSON object text, e.g. `{"city":"Paris"}`.
    pub arguments: String,
}

/// Model output split into prose and calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedOutput {
    /// Text outside the calls, trimmed; `None` when there is none.
    pub content: Option<String>,
    pub calls: Vec<ParsedCall>,
}

/// A fresh OpenAI-style call id: `call_` and 24 random alphanumeric characters.
pub fn new_call_id() -> String {
    const ALPHABET: &[u8; 62] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    // Each RandomState is seeded randomly per process and thread; counter and time separate ids.
    let state = RandomState::new();
    let mut id = String::with_capacity(29);
    id.push_str("call_");
    let mut word = 0u64;
    for i in 0..24u64 {
        if i % 6 == 0 {
            // 62^6 < 2^64: six characters per hash.
            let mut h = state.build_hasher();
            h.write_u64(count);
            h.write_u128(nanos);
            h.write_u64(i);
            word = h.finish();
        }
        id.push(ALPHABET[(word % 62) as usize] as char);
        word /= 62;
    }
    id
}

/// One JSON value at the start of a text.
enum Json {
    /// The value and the byte length it took.
    Done(Value, usize),
    /// The text ends before the value does: more text could complete it.
    Incomplete,
    /// No text appended could make this a JSON value.
    Invalid,
}

/// Parses the JSON value at the start of `s` (which starts with `{` or `[`), ignoring what follows.
///
/// One object wrapped in a second pair of braces, `{{"name": …}}`, counts as that object: Qwen2.5's
/// chat template shows the call format with its braces doubled (a Jinja string printed as is), and
/// the models copy it. `{{` never starts valid JSON, so nothing else is read differently.
fn json_prefix(s: &str) -> Json {
    match doubled_inner(s) {
        Some((inner, at)) => match plain_json_prefix(inner) {
            Json::Done(v @ Value::Object(_), n) => {
                let rest = &inner[n..];
                let after = rest.trim_start();
                if after.is_empty() {
                    Json::Incomplete
                } else if after.starts_with('}') {
                    Json::Done(v, at + n + (rest.len() - after.len()) + 1)
                } else {
                    Json::Invalid
                }
            }
            Json::Done(..) => Json::Invalid,
            other => other,
        },
        None => plain_json_prefix(s),
    }
}

/// For `{` + whitespace + `{…`: the text from the inner brace on, and where it starts.
fn doubled_inner(s: &str) -> Option<(&str, usize)> {
    let rest = s.strip_prefix('{')?;
    let inner = rest.trim_start();
    inner.starts_with('{').then_some((inner, s.len() - inner.len()))
}

/// The raw text of a call object, without the doubled outer braces [`json_prefix`] accepts.
fn undoubled(raw: &str) -> &str {
    match doubled_inner(raw) {
        Some((inner, _)) => inner.trim_end().strip_suffix('}').map_or(inner, str::trim_end),
        None => raw,
    }
}

fn plain_json_prefix(s: &str) -> Json {
    let mut values = serde_json::Deserializer::from_str(s).into_iter::<Value>();
    match values.next() {
        Some(Ok(v)) => Json::Done(v, values.byte_offset()),
        None => Json::Incomplete,
        // An error at the very end may be the end of the text rather than a real mistake.
        Some(Err(e)) if e.is_eof() || error_offset(s, &e) >= s.len() => Json::Incomplete,
        Some(Err(_)) => Json::Invalid,
    }
}

/// Byte offset of a serde_json error's line and column in `s`.
fn error_offset(s: &str, e: &serde_json::Error) -> usize {
    let line_start = match e.line() {
        0 | 1 => 0,
        line => s.match_indices('\n').nth(line - 2).map_or(s.len(), |(i, _)| i + 1),
    };
    line_start + e.column()
}

/// The calls a JSON value describes (`raw` is its text): one call object, or a non-empty array of
/// them. `None` unless every one is well formed and names a known function.
fn calls_from_value(raw: &str, v: &Value, known: &[&str]) -> Option<Vec<ParsedCall>> {
    let raw = undoubled(raw);
    match v {
        Value::Object(m) => Some(vec![call_from_object(raw, m, known)?]),
        Value::Array(items) if !items.is_empty() => {
            let raws = raw::elements(raw)?;
            items.iter().zip(raws).map(|(item, raw)| call_from_object(raw, item.as_object()?, known)).collect()
        }
        _ => None,
    }
}

/// Exactly `{"name", "arguments"|"parameters"}`, or the OpenAI `{"type": "function", "function":
/// {..}}` (with an optional `id`). Any other key makes the object content, not a call: after a
/// tool result, models echo the call with its `"result"` as their answer, and reading that back as
/// the same call again would loop an agent forever.
fn call_from_object(raw: &str, m: &Map<String, Value>, known: &[&str]) -> Option<ParsedCall> {
    if let Some(Value::Object(inner)) = m.get("function") {
        let wrapper_only = m.keys().all(|k| matches!(k.as_str(), "function" | "type" | "id"));
        let typed = m.get("type").is_none_or(|t| t == "function");
        return (wrapper_only && typed)
            .then(|| call_from_object(raw::member(raw, "function")?, inner, known))
            .flatten();
    }
    let args_key = if m.contains_key("arguments") { "arguments" } else { "parameters" };
    if m.len() != 2 {
        return None;
    }
    let name = m.get("name")?.as_str()?;
    let args = m.get(args_key)?;
    make_call(name, args, raw::member(raw, args_key)?, known)
}

/// A call to `name` (which must be known) with arguments given as an object (`raw` is its text),
/// a string holding a JSON object, an empty string or null. An object's arguments are its text
/// without whitespace, as the streamer sends it.
fn make_call(name: &str, args: &Value, raw: &str, known: &[&str]) -> Option<ParsedCall> {
    if !known.contains(&name) {
        return None;
    }
    let arguments = match args {
        Value::Object(_) => raw::minify(raw),
        Value::Null => "{}".to_string(),
        Value::String(s) if s.trim().is_empty() => "{}".to_string(),
        Value::String(s) => match serde_json::from_str::<Value>(s).ok()? {
            v @ Value::Object(_) => serde_json::to_string(&v).ok()?,
            _ => return None,
        },
        _ => return None,
    };
    Some(ParsedCall { name: name.to_string(), arguments })
}

/// [`parse_tool_calls`] for output cut by `max_tokens`: a call it was still writing is one of
/// the calls, with its unfinished arguments text (see [`truncated_call`]).
pub fn parse_cut_output(text: &str, known: &[&str]) -> ParsedOutput {
    match truncated_call(text, known) {
        Some((before, name, arguments)) if serde_json::from_str::<Map<String, Value>>(&arguments).is_err() => {
            let mut parsed = parse_tool_calls(before, known);
            parsed.calls.push(ParsedCall { name, arguments: raw::minify(&arguments) });
            parsed
        }
        _ => parse_tool_calls(text, known),
    }
}
