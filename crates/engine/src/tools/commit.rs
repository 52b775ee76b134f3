//! When bare JSON or a fenced block is a tool call rather than an answer.
//!
//! Under `tool_choice: "auto"` both are also how models answer (a JSON answer, or, after a tool
//! result, the call echoed with its `"result"`). Only the start `{"name": "<offered function>",
//! "arguments": {` (optionally inside `[`) commits the output to a call; the call grammar takes
//! over from there.

/// What the start of a bare or fenced JSON body says about it being a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commitment {
    /// `{"name": "<known>", "arguments": {` is written: this is a call.
    Committed,
    /// Still a prefix of that start: keep watching.
    Undecided,
    /// Cannot become that start: an answer, not a call.
    Not,
}

enum Part {
    /// This exact text.
    Lit(&'static str),
    /// Optional JSON whitespace.
    Ws,
    /// Optionally `[` followed by whitespace (an array of calls).
    OptArray,
    /// Optionally a `{` that another `{` follows: the doubled braces of Qwen2.5's template.
    OptBrace,
    /// A JSON string naming a known function (without escapes), quotes included.
    Name,
    /// `"arguments"`, or `"parameters"` as Llama 3 writes it.
    ArgsKey,
}

use Part::{ArgsKey, Lit, Name, OptArray, OptBrace, Ws};

/// A call object up to its arguments' opening brace.
const CALL_OBJECT: &[Part] =
    &[Lit("{"), Ws, Lit("\"name\""), Ws, Lit(":"), Ws, Name, Ws, Lit(","), Ws, ArgsKey, Ws, Lit(":"), Ws, Lit("{")];

/// A call, optionally in an array and Qwen's doubled braces.
const CALL_START: &[&[Part]] = &[&[OptArray, OptBrace], CALL_OBJECT];

/// The same call inside OpenAI's wrapper, `{"type": "function", "function": {"name": …`, as
/// models that echo the API's own format write it.
const WRAPPED_CALL_START: &[&[Part]] = &[
    &[
        OptArray,
        Lit("{"),
        Ws,
        Lit("\"type\""),
        Ws,
        Lit(":"),
        Ws,
        Lit("\"function\""),
        Ws,
        Lit(","),
        Ws,
        Lit("\"function\""),
        Ws,
        Lit(":"),
        Ws,
    ],
    CALL_OBJECT,
];

/// A single call object up to its arguments' value.
const CALL_HEAD: &[Part] =
    &[Lit("{"), Ws, Lit("\"name\""), Ws, Lit(":"), Ws, Name, Ws, Lit(","), Ws, Lit("\"arguments\""), Ws, Lit(":")];

/// Whether `body` (the text from its first `{` or `[` on) commits to a call of one of `known`,
/// plain or in OpenAI's `{"type": "function", "function": …}` wrapper.
pub fn call_commitment(body: &str, known: &[String]) -> Commitment {
    match (match_parts(body, CALL_START, known).0, match_parts(body, WRAPPED_CALL_START, known).0) {
        (Commitment::Committed, _) | (_, Commitment::Committed) => Commitment::Committed,
        (Commitment::Undecided, _) | (_, Commitment::Undecided) => Commitment::Undecided,
        _ => Commitment::Not,
    }
}

/// Whether `s` starts with `{"name": "<known>", "arguments":`; when it does, the name and the
/// length of that head (the arguments' value follows).
pub(super) fn call_head<S: AsRef<str>>(s: &str, known: &[S]) -> (Commitment, Option<(String, usize)>) {
    match match_parts(s, &[CALL_HEAD], known) {
        (Commitment::Committed, name, len) => (Commitment::Committed, Some((name, len))),
        (other, ..) => (other, None),
    }
}

/// Matches `parts` (runs of parts, one after the other) against the start of `body`: the
/// outcome, the function name, bytes matched.
fn match_parts<S: AsRef<str>>(body: &str, parts: &[&[Part]], known: &[S]) -> (Commitment, String, usize) {
    let count = parts.iter().map(|run| run.len()).sum::<usize>();
    let is_known = |name: &str| known.iter().any(|k| k.as_ref() == name);
    let starts_known = |prefix: &str| known.iter().any(|k| k.as_ref().starts_with(prefix));
    let mut rest = body;
    let mut name = String::new();
    for (i, part) in parts.iter().copied().flatten().enumerate() {
        match part {
            Ws => rest = rest.trim_start_matches([' ', '\t', '\n', '\r']),
            OptArray => {
                if let Some(r) = rest.strip_prefix('[') {
                    rest = r.trim_start_matches([' ', '\t', '\n', '\r']);
                }
            }
            OptBrace => {
                if let Some(r) = rest.strip_prefix('{') {
                    let inner = r.trim_start_matches([' ', '\t', '\n', '\r']);
                    if inner.starts_with('{') {
                        rest = inner;
                    }
                }
            }
            Lit(_) | ArgsKey => {
                let options: &[&str] = match part {
                    Lit(lit) => &[lit],
                    _ => &["\"arguments\"", "\"parameters\""],
                };
                if let Some(r) = options.iter().find_map(|lit| rest.strip_prefix(lit)) {
                    rest = r;
                } else if options.iter().any(|lit| lit.starts_with(rest)) {
                    return (Commitment::Undecided, name, 0);
                } else {
                    return (Commitment::Not, name, 0);
                }
            }
            Name => {
                let Some(r) = rest.strip_prefix('"') else {
                    let outcome = if rest.is_empty() { Commitment::Undecided } else { Commitment::Not };
                    return (outcome, name, 0);
                };
                match r.find('"') {
                    Some(end) if is_known(&r[..end]) => {
                        name = r[..end].to_string();
                        rest = &r[end + 1..];
                    }
                    Some(_) => return (Commitment::Not, name, 0),
                    None if starts_known(r) => return (Commitment::Undecided, name, 0),
                    None => return (Commitment::Not, name, 0),
                }
            }
        }
        if rest.is_empty() && i + 1 < count {
            return (Commitment::Undecided, name, 0);
        }
    }
    (Commitment::Committed, name, body.len() - rest.len())
}

/// Text after which a call may begin: the native tags and a JSON fence line.
const CALL_OPENERS: [&str; 5] = ["<tool_call>", "<|python_tag|>", "```json", "```", "["];

/// Output cut (by `max_tokens`) inside a call: `(text before the call, name, the arguments text
/// written so far)`. The call must have started where calls start — at the beginning of the
/// output, after a tag, a fence line or `[` — and its name must be complete and offered. The
/// arguments are returned as written (an unfinished JSON object, or empty when the cut came
/// before them), as OpenAI returns a call cut by `max_tokens`.
pub fn truncated_call<'a>(text: &'a str, known: &[&str]) -> Option<(&'a str, String, String)> {
    for (at, _) in text.match_indices('{').collect::<Vec<_>>().into_iter().rev() {
        let before = text[..at].trim_end();
        let opener = CALL_OPENERS.iter().find(|o| before.ends_with(**o));
        if !before.is_empty() && opener.is_none() {
            continue;
        }
        let Some((name, args)) = cut_call_head(&text[at..]) else { continue };
        if !known.contains(&name) {
            continue;
        }
        let before = opener.map_or(before, |o| &before[..before.len() - o.len()]);
        return Some((before, name.to_string(), args.trim_start().to_string()));
    }
    None
}

/// The call a forced output (the whole output is one call, under its grammar) was writing when
/// `max_tokens` cut it before its name was closed: `{"name": "get_wea` is `get_weather` with no
/// arguments. The name is the first of `callable` (the functions the grammar allowed, in the
/// order offered) that what was written of it can still become; `None` when the text cannot
/// be the start of such a call.
pub fn forced_cut_call(text: &str, callable: &[&str]) -> Option<super::ParsedCall> {
    const WS: [char; 4] = [' ', '\t', '\n', '\r'];
    let rest = text.trim_start_matches(WS).strip_prefix('{')?.trim_start_matches(WS);
    // Each part of `"name": "` may be cut: what is written must be a prefix of it.
    let mut written = "";
    let mut left = rest;
    for part in ["\"name\"", ":", "\""] {
        left = left.trim_start_matches(WS);
        if left.is_empty() {
            break;
        }
        if let Some(after) = left.strip_prefix(part) {
            left = after;
            if part == "\"" {
                written = left;
            }
        } else if part.starts_with(left) {
            left = "";
        } else {
            return None;
        }
    }
    if written.contains('"') {
        return None; // the name was closed: `truncated_call` reads that
    }
    let name = callable.iter().find(|n| n.starts_with(written))?;
    Some(super::ParsedCall { name: (*name).to_string(), arguments: String::new() })
}

/// `{"name": "<name>"` then optionally `, "arguments": ` and what follows, to the end.
fn cut_call_head(s: &str) -> Option<(&str, &str)> {
    let rest = s.strip_prefix('{')?;
    let rest = rest.trim_start_matches([' ', '\t', '\n', '\r']).strip_prefix("\"name\"")?;
    let rest = rest.trim_start_matches([' ', '\t', '\n', '\r']).strip_prefix(':')?;
    let rest = rest.trim_start_matches([' ', '\t', '\n', '\r']).strip_prefix('"')?;
    let end = rest.find('"')?;
    let name = &rest[..end];
    let after = &rest[end + 1..];
    let args = after
        .trim_start_matches([' ', '\t', '\n', '\r'])
        .strip_prefix(',')
        .map(|r| r.trim_start_matches([' ', '\t', '\n', '\r']))
        .and_then(|r| r.strip_prefix("\"arguments\"").or_else(|| r.strip_prefix("\"parameters\"")))
        .map(|r| r.trim_start_matches([' ', '\t', '\n', '\r']))
        .and_then(|r| r.strip_prefix(':'))
        .unwrap_or("");
    Some((name, args))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forced_call_cut_inside_its_name_is_that_call() {
        let callable = ["get_weather", "get_time"];
        let name = |text: &str| forced_cut_call(text, &callable).map(|c| (c.name, c.arguments));
        assert_eq!(name(r#"{"name": "get_wea"#), Some(("get_weather".into(), String::new())));
        assert_eq!(name(r#"{"name": "get_t"#).unwrap().0, "get_time");
        assert_eq!(name(r#"{"name": "get_"#).unwrap().0, "get_weather", "the first it can still become");
        assert_eq!(name(r#"{"na"#).unwrap().0, "get_weather");
        assert_eq!(name("{").unwrap().0, "get_weather");
        assert_eq!(name(r#"{"name": "search"#), None, "no offered function starts so");
        assert_eq!(name(r#"{"city": "Pa"#), None, "not a call");
        assert_eq!(name(r#"{"name": "get_time", "#), None, "a closed name is truncated_call's");
        assert_eq!(name("Sure"), None);
    }

    fn known() -> Vec<String> {
        vec!["add".into(), "get_weather".into()]
    }

    #[test]
    fn call_start_commits_once_arguments_open() {
        let k = known();
        let text = r#"{"name": "add", "arguments": {"a": 1}}"#;
        let at = text.find("{\"a\"").unwrap();
        for end in 1..=at {
            assert_eq!(call_commitment(&text[..end], &k), Commitment::Undecided, "{}", &text[..end]);
        }
        assert_eq!(call_commitment(&text[..at + 1], &k), Commitment::Committed);
        assert_eq!(call_commitment(text, &k), Commitment::Committed);
        assert_eq!(call_commitment("[\n  {\"name\":\"get_weather\",\n \"arguments\":{}}]", &k), Commitment::Committed);
        // Doubled braces, as Qwen2.5's template shows the format.
        assert_eq!(call_commitment("{", &k), Commitment::Undecided);
        assert_eq!(call_commitment("{{", &k), Commitment::Undecided);
        assert_eq!(call_commitment(r#"{{"name": "add", "arguments": {"#, &k), Commitment::Committed);
        assert_eq!(call_commitment(r#"{{"answer": 1}}"#, &k), Commitment::Not);
        // OpenAI's wrapper.
        let wrapped = r#"[{"type": "function", "function": {"name": "add", "arguments": {"#;
        for end in 1..wrapped.len() {
            assert_eq!(call_commitment(&wrapped[..end], &k), Commitment::Undecided, "{}", &wrapped[..end]);
        }
        assert_eq!(call_commitment(wrapped, &k), Commitment::Committed);
        assert_eq!(call_commitment(r#"{"type": "function", "function": {"name": "nope""#, &k), Commitment::Not);
        assert_eq!(call_commitment(r#"{"type": "object""#, &k), Commitment::Not);
        // Llama 3's key for the arguments.
        assert_eq!(call_commitment(r#"{"name": "add", "par"#, &k), Commitment::Undecided);
        assert_eq!(call_commitment(r#"{"name": "add", "parameters": {"#, &k), Commitment::Committed);
        assert_eq!(call_commitment(r#"{"name": "add", "params": {"#, &k), Commitment::Not);
    }

    #[test]
    fn answers_and_unknown_names_are_not_calls() {
        let k = known();
        for answer in [
            r#"{"answer": 42}"#,
            r#"{"name": "Ada", "age": 3}"#,
            r#"{"name": "addition", "arguments": {}}"#,
            r#"{"name": "add", "result": 42}"#,
            r#"{"name": "add"}"#,
            "[1, 2]",
            r#"{"type": "function"}"#,
        ] {
            assert_eq!(call_commitment(answer, &k), Commitment::Not, "{answer}");
        }
        assert_eq!(call_commitment(r#"{"name": "ad"#, &k), Commitment::Undecided);
        assert_eq!(call_commitment(r#"{"name": "x"#, &k), Commitment::Not);
    }

    #[test]
    fn calls_cut_by_max_tokens_keep_their_partial_arguments() {
        let k = ["add", "get_weather"];
        let cut = |t| truncated_call(t, &k).map(|(b, n, a)| (b.to_string(), n, a));
        let s = |x: &str| x.to_string();
        assert_eq!(cut(r#"{"name": "add", "arguments": {"a": 1"#), Some((s(""), s("add"), s(r#"{"a": 1"#))));
        assert_eq!(
            cut("Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par"),
            Some((s("Sure.\n"), s("get_weather"), s(r#"{"city": "Par"#)))
        );
        assert_eq!(cut("```json\n{\"name\": \"add\", \"argu"), Some((s(""), s("add"), s(""))));
        assert_eq!(cut(r#"{"name":"add","arguments":{"a":{"x":1"#), Some((s(""), s("add"), s(r#"{"a":{"x":1"#))));
        // Prose around JSON, unknown names and unfinished names are not calls.
        assert_eq!(cut(r#"You could call {"name": "add", "arguments": {"a": 1"#), None);
        assert_eq!(cut(r#"{"name": "sub", "arguments": {"a": 1"#), None);
        assert_eq!(cut(r#"{"name": "ad"#), None);
    }
}
