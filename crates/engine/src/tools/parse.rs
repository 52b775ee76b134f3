//! Recognising calls in text. Every decision here is made on a prefix of the output and never
//! changes when more text arrives: where the text so far cannot tell, the answer is "need more"
//! (`eof == false`) or "not a call" (`eof == true`). The streamer relies on this to match
//! [`parse_tool_calls`] exactly.

use super::{calls_from_value, json_prefix, make_call, Json, ParsedCall, ParsedOutput};

const TOOL_CALL: &str = "<tool_call>";
const TOOL_CALL_END: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";
const FUNCTION: &str = "<function=";
const FUNCTION_END: &str = "</function>";
const MISTRAL: &str = "[TOOL_CALLS]";
const MISTRAL_ARGS: &str = "[ARGS]";
const MISTRAL_CALL_ID: &str = "[CALL_ID]";
const FENCE: &str = "```";
const TRIGGERS: [&str; 5] = [TOOL_CALL, PYTHON_TAG, FUNCTION, MISTRAL, FENCE];

/// Splits finished model output into content and calls to the functions named in `known`.
pub fn parse_tool_calls(text: &str, known: &[&str]) -> ParsedOutput {
    if let Bare::Calls(calls) = bare_calls(text.trim(), known, true) {
        return ParsedOutput { content: None, calls };
    }
    let (mut content, mut calls, mut rest) = (String::new(), Vec::new(), text);
    while !rest.is_empty() {
        let n = match scan_step(rest, known, true) {
            Step::Content(n) => {
                content.push_str(&rest[..n]);
                n
            }
            Step::Calls(found, n) => {
                calls.extend(found);
                n
            }
            Step::Hold => unreachable!("scan_step never holds at the end of the text"),
        };
        rest = &rest[n..];
    }
    let content = content.trim();
    ParsedOutput { content: (!content.is_empty()).then(|| content.to_string()), calls }
}

/// Whether a whole (trimmed) text is bare JSON calls: objects or arrays of them, separated by
/// whitespace, `;` or `,`.
pub(super) enum Bare {
    Calls(Vec<ParsedCall>),
    /// Only before the end: so far the text could still be bare calls.
    Possible,
    Not,
}

pub(super) fn bare_calls(t: &str, known: &[&str], eof: bool) -> Bare {
    if known.is_empty() {
        return Bare::Not;
    }
    let mut calls = Vec::new();
    let mut pos = 0;
    loop {
        let separators = !calls.is_empty();
        pos = skip(t, pos, |c| c.is_whitespace() || (separators && (c == ';' || c == ',')));
        if pos == t.len() {
            return match (eof, calls.is_empty()) {
                (false, _) => Bare::Possible,
                (true, false) => Bare::Calls(calls),
                (true, true) => Bare::Not,
            };
        }
        if !t[pos..].starts_with(['{', '[']) {
            return Bare::Not;
        }
        match json_prefix(&t[pos..]) {
            Json::Done(v, n) => match calls_from_value(&t[pos..pos + n], &v, known) {
                Some(found) => {
                    calls.extend(found);
                    pos += n;
                }
                None => return Bare::Not,
            },
            Json::Incomplete if !eof => return Bare::Possible,
            Json::Incomplete | Json::Invalid => return Bare::Not,
        }
    }
}

/// What the start of a text is, in scanning order.
#[derive(Debug)]
pub(super) enum Step {
    /// The first `n` bytes are content.
    Content(usize),
    /// Calls, written in the first `n` bytes.
    Calls(Vec<ParsedCall>, usize),
    /// Only before the end: the text could still begin a call; wait for more.
    Hold,
}

/// Classifies the start of `s` (non-empty): content up to the next possible call, a call, or
/// (when `!eof`) a wait.
pub(super) fn scan_step(s: &str, known: &[&str], eof: bool) -> Step {
    if known.is_empty() {
        return Step::Content(s.len());
    }
    let Some((at, trigger)) = find_trigger(s, eof) else { return Step::Content(s.len()) };
    if at > 0 {
        return Step::Content(at);
    }
    let Some(trigger) = trigger else { return Step::Hold };
    let outcome = match trigger {
        TOOL_CALL => tool_call_tag(s, known, eof),
        PYTHON_TAG => python_tag(s, known, eof),
        FUNCTION => function_tag(s, known, eof),
        MISTRAL => mistral(s, known, eof),
        _ => fence(s, known, eof),
    };
    match outcome {
        Outcome::Accept(calls, n) => Step::Calls(calls, n),
        Outcome::NeedMore if !eof => Step::Hold,
        // Not a call: its first character (always ASCII) is content; scanning goes on after it.
        Outcome::NeedMore | Outcome::Fail => Step::Content(1),
    }
}

/// The first position where a trigger starts, or (when `!eof`) where the text ends in a trigger's
/// beginning (`None` trigger).
fn find_trigger(s: &str, eof: bool) -> Option<(usize, Option<&'static str>)> {
    for (i, b) in s.bytes().enumerate() {
        if !matches!(b, b'<' | b'[' | b'`') {
            continue;
        }
        let rest = &s[i..];
        if let Some(t) = TRIGGERS.iter().find(|t| rest.starts_with(**t)) {
            return Some((i, Some(t)));
        }
        if !eof && TRIGGERS.iter().any(|t| t.starts_with(rest)) {
            return Some((i, None));
        }
    }
    None
}

#[derive(Debug)]
enum Outcome {
    /// Calls, and the bytes they took from the trigger on.
    Accept(Vec<ParsedCall>, usize),
    NeedMore,
    Fail,
}

use Outcome::{Accept, Fail, NeedMore};

/// The text ended where more was needed.
fn more(eof: bool) -> Outcome {
    if eof {
        Fail
    } else {
        NeedMore
    }
}

/// The first position at or after `pos` whose character fails `f`.
fn skip(s: &str, pos: usize, f: impl Fn(char) -> bool) -> usize {
    s[pos..].char_indices().find(|&(_, c)| !f(c)).map_or(s.len(), |(i, _)| pos + i)
}

fn is_name_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// Calls from the JSON object or array at `pos`, with the position after it.
fn calls_at(s: &str, pos: usize, known: &[&str], eof: bool) -> Result<(Vec<ParsedCall>, usize), Outcome> {
    if pos >= s.len() {
        return Err(more(eof));
    }
    if !s[pos..].starts_with(['{', '[']) {
        return Err(Fail);
    }
    match json_prefix(&s[pos..]) {
        Json::Done(v, n) => calls_from_value(&s[pos..pos + n], &v, known).map(|calls| (calls, pos + n)).ok_or(Fail),
        Json::Incomplete => Err(more(eof)),
        Json::Invalid => Err(Fail),
    }
}

/// A call to `name` whose arguments are the JSON object at `pos`.
fn args_at(s: &str, pos: usize, name: &str, known: &[&str], eof: bool) -> Result<(ParsedCall, usize), Outcome> {
    if pos >= s.len() {
        return Err(more(eof));
    }
    if !s[pos..].starts_with('{') {
        return Err(Fail);
    }
    match json_prefix(&s[pos..]) {
        Json::Done(v, n) => make_call(name, &v, &s[pos..pos + n], known).map(|call| (call, pos + n)).ok_or(Fail),
        Json::Incomplete => Err(more(eof)),
        Json::Invalid => Err(Fail),
    }
}

/// After the JSON of a tagged call ending at `end`: takes the closing tag, forgiving stray `}` or
/// `]` before it (small models often close one brace too many) and a missing tag at the end.
fn close_tag(s: &str, end: usize, close: &str, calls: Vec<ParsedCall>, eof: bool) -> Outcome {
    let j = skip(s, end, |c| c.is_whitespace() || c == '}' || c == ']');
    let rest = &s[j..];
    if rest.starts_with(close) {
        Accept(calls, j + close.len())
    } else if rest.is_empty() {
        if eof {
            Accept(calls, j)
        } else {
            NeedMore
        }
    } else if !eof && close.starts_with(rest) {
        NeedMore
    } else {
        // No closing tag (e.g. the next `<tool_call>` follows): what comes after is scanned anew.
        Accept(calls, end)
    }
}

/// Qwen / Hermes: `<tool_call>{"name": .., "arguments": ..}</tool_call>`.
fn tool_call_tag(s: &str, known: &[&str], eof: bool) -> Outcome {
    let pos = skip(s, TOOL_CALL.len(), char::is_whitespace);
    match calls_at(s, pos, known, eof) {
        Ok((calls, end)) => close_tag(s, end, TOOL_CALL_END, calls, eof),
        Err(outcome) => outcome,
    }
}

/// Llama 3: `<|python_tag|>{"name": .., "parameters": ..}`, several separated by `;`.
fn python_tag(s: &str, known: &[&str], eof: bool) -> Outcome {
    let pos = skip(s, PYTHON_TAG.len(), char::is_whitespace);
    let (mut calls, mut end) = match calls_at(s, pos, known, eof) {
        Ok(found) => found,
        Err(outcome) => return outcome,
    };
    loop {
        let j = skip(s, end, |c| c.is_whitespace() || c == ';');
        if j == s.len() {
            return if eof { Accept(calls, j) } else { NeedMore };
        }
        match calls_at(s, j, known, eof) {
            Ok((found, e)) => {
                calls.extend(found);
                end = e;
            }
            Err(NeedMore) => return NeedMore,
            Err(_) => return Accept(calls, end),
        }
    }
}

/// Llama 3.1 custom format: `<function=name>{..args..}</function>`.
fn function_tag(s: &str, known: &[&str], eof: bool) -> Outcome {
    let start = FUNCTION.len();
    let name_end = skip(s, start, is_name_char);
    if name_end == s.len() {
        return more(eof);
    }
    if name_end == start || !s[name_end..].starts_with('>') {
        return Fail;
    }
    let pos = skip(s, name_end + 1, char::is_whitespace);
    match args_at(s, pos, &s[start..name_end], known, eof) {
        Ok((call, end)) => close_tag(s, end, FUNCTION_END, vec![call], eof),
        Err(outcome) => outcome,
    }
}

/// Mistral: `[TOOL_CALLS] [{"name": .., "arguments": ..}]` or `[TOOL_CALLS]name[ARGS]{..}`
/// (optionally `name[CALL_ID]id[ARGS]{..}`).
fn mistral(s: &str, known: &[&str], eof: bool) -> Outcome {
    let pos = skip(s, MISTRAL.len(), char::is_whitespace);
    if pos == s.len() {
        return more(eof);
    }
    if s[pos..].starts_with(['[', '{']) {
        return match calls_at(s, pos, known, eof) {
            Ok((calls, end)) => Accept(calls, end),
            Err(outcome) => outcome,
        };
    }
    let name_end = skip(s, pos, is_name_char);
    if name_end == s.len() {
        return more(eof);
    }
    if name_end == pos {
        return Fail;
    }
    let mut j = name_end;
    if s[j..].starts_with(MISTRAL_CALL_ID) {
        j = skip(s, j + MISTRAL_CALL_ID.len(), |c| c.is_ascii_alphanumeric());
        if j == s.len() {
            return more(eof);
        }
    }
    let rest = &s[j..];
    if !rest.starts_with(MISTRAL_ARGS) {
        let partial = MISTRAL_ARGS.starts_with(rest) || (j == name_end && MISTRAL_CALL_ID.starts_with(rest));
        return if !eof && partial { NeedMore } else { Fail };
    }
    let args = skip(s, j + MISTRAL_ARGS.len(), char::is_whitespace);
    match args_at(s, args, &s[pos..name_end], known, eof) {
        Ok((call, end)) => Accept(vec![call], end),
        Err(outcome) => outcome,
    }
}

/// A ```json (or bare ```) fence holding only calls; the closing fence may be missing at the end.
fn fence(s: &str, known: &[&str], eof: bool) -> Outcome {
    let lang_end = skip(s, FENCE.len(), |c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if lang_end == s.len() {
        return more(eof);
    }
    let lang = &s[FENCE.len()..lang_end];
    if !(lang.is_empty() || lang.eq_ignore_ascii_case("json")) {
        return Fail;
    }
    let pos = skip(s, lang_end, char::is_whitespace);
    let (mut calls, mut end) = match calls_at(s, pos, known, eof) {
        Ok(found) => found,
        Err(outcome) => return outcome,
    };
    loop {
        let j = skip(s, end, |c| c.is_whitespace() || c == ',' || c == ';');
        let rest = &s[j..];
        if rest.starts_with(FENCE) {
            return Accept(calls, j + FENCE.len());
        }
        if rest.is_empty() {
            return if eof { Accept(calls, j) } else { NeedMore };
        }
        if !eof && FENCE.starts_with(rest) {
            return NeedMore;
        }
        match calls_at(s, j, known, eof) {
            Ok((found, e)) => {
                calls.extend(found);
                end = e;
            }
            Err(outcome) => return outcome,
        }
    }
}
