//! Under `tool_choice: "auto"`, where in the output a call starts that the call grammar must take
//! over from. Every form the parser reads back as a call in the middle of the output must be seen
//! here too, or a call the model writes that way would reach the client unconstrained (a fresh
//! CI run saw Qwen2.5-Coder-0.5B write prose, then a ```json fence with `"unit": "metric"`
//! where the schema allows only celsius or fahrenheit).

use super::{call_commitment, Commitment};

/// Which grammar takes over, and from where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallStart {
    /// After a `<tool_call>` tag: the tagged grammar, from the tag on.
    Tagged,
    /// The whole output is a bare JSON call so far: the bare grammar, over all of it.
    Bare,
    /// A ```json fence holding a call, after the output's first `prefix` bytes (none, whitespace
    /// or prose): the fenced-calls grammar, which repeats those bytes as a literal.
    Fenced { prefix: usize },
}

/// The output so far of a choice that may still start a tool call.
#[derive(Debug, Default)]
pub struct CallWatch {
    text: Vec<u8>,
    /// Still only whitespace, or a `{`/`[` start: a bare call is possible.
    bare_possible: bool,
    /// Fences starting before this byte are decided: not calls.
    fences_from: usize,
}

const FENCE: &[u8] = b"```";
const TAG: &[u8] = b"<tool_call>";

impl CallWatch {
    pub fn new() -> Self {
        Self { bare_possible: true, ..Self::default() }
    }

    /// The output so far, as the model's bytes (whole, so a character split across tokens reads
    /// back as itself).
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.text)
    }

    /// The output before byte `at` (where a fenced call starts: `CallStart::Fenced`), as the
    /// grammar's literal start; `None` when those bytes are not valid UTF-8 (a model may emit
    /// any bytes), which no Lark literal can hold. `at` indexes the model's bytes, not `text()`,
    /// whose U+FFFD replacements are longer than the bytes they stand for.
    pub fn text_before(&self, at: usize) -> Option<&str> {
        std::str::from_utf8(self.text.get(..at)?).ok()
    }

    /// Takes the next token's text; says whether a call starts here (the watch is then done).
    /// `tag_token`: `None` where the model has no `<tool_call>` token (its tag is plain text);
    /// else whether this token is that one. Where the tag is a token, the same characters
    /// written as plain-text tokens (a client's text echoed back) do not start a call.
    pub fn push(&mut self, piece: &[u8], names: &[String], tag_token: Option<bool>) -> Option<CallStart> {
        self.text.extend_from_slice(piece);
        if self.ends_with_tag() && tag_token != Some(false) {
            return Some(CallStart::Tagged);
        }
        if self.bare_possible {
            match self.bare(names) {
                Commitment::Committed => return Some(CallStart::Bare),
                Commitment::Undecided => return None,
                Commitment::Not => self.bare_possible = false,
            }
        }
        self.fence(names)
    }

    /// Whether the whole output may still turn out to be a call from its very start: a bare
    /// JSON call, or a ```json fence holding one.
    pub fn call_may_follow(&self, names: &[String]) -> bool {
        let text = self.text();
        let start = text.trim_start();
        let json_call = |body: &str| {
            let body = body.trim_start();
            body.is_empty() || (body.starts_with(['{', '[']) && call_commitment(body, names) != Commitment::Not)
        };
        if start.starts_with(['{', '[']) {
            return self.bare_possible && json_call(start);
        }
        match start.strip_prefix("```") {
            // The fence line's language so far, then the body.
            Some(rest) => match rest.split_once('\n') {
                None => rest.chars().all(|c| c.is_ascii_alphanumeric()),
                Some((_, body)) => json_call(body),
            },
            // Nothing yet, or a fence split across tokens.
            None => "```".starts_with(start),
        }
    }

    /// Whether the output so far ends with the `<tool_call>` tag's text.
    fn ends_with_tag(&self) -> bool {
        self.text.ends_with(TAG)
    }

    /// Where the `<tool_call>` tag's text ends in the last piece pushed (`len` bytes), if it
    /// does: the offset of its `>` in that piece (the tag may start in earlier pieces, and the
    /// piece go on after it, as Qwen's `>\n` does).
    pub fn tag_end_in_last(&self, len: usize) -> Option<usize> {
        let start = self.text.len() - len;
        let from = start.saturating_sub(TAG.len() - 1);
        let end = find(&self.text[from..], TAG).map(|i| from + i + TAG.len() - 1)?;
        (end >= start).then(|| end - start)
    }

    /// The grammar refused the output at `start` (the model's layout does not fit it): that
    /// start is not watched again.
    pub fn rejected(&mut self, start: &CallStart) {
        match start {
            CallStart::Tagged => {}
            CallStart::Bare => self.bare_possible = false,
            CallStart::Fenced { prefix } => self.fences_from = prefix + FENCE.len(),
        }
    }

    /// Whether the whole output (after whitespace) is a bare JSON call so far.
    fn bare(&self, names: &[String]) -> Commitment {
        let text = self.text();
        let started = text.trim_start();
        if started.is_empty() {
            Commitment::Undecided
        } else if started.starts_with(['{', '[']) {
            call_commitment(started, names)
        } else {
            Commitment::Not
        }
    }

    /// The first undecided fence, anywhere in the output, that holds a call: a fenced block is
    /// a call only if the JSON after its fence line commits to one (not ```python …).
    fn fence(&mut self, names: &[String]) -> Option<CallStart> {
        while let Some(at) = find(&self.text[self.fences_from..], FENCE).map(|i| i + self.fences_from) {
            let after = &self.text[at + FENCE.len()..];
            let line_end = after.iter().position(|&b| b == b'\n')?;
            let body = String::from_utf8_lossy(&after[line_end + 1..]);
            match call_commitment(body.trim_start(), names) {
                Commitment::Committed => return Some(CallStart::Fenced { prefix: at }),
                Commitment::Undecided => return None,
                Commitment::Not => self.fences_from = at + FENCE.len(),
            }
        }
        // A fence may be split across tokens: keep its possible start undecided.
        self.fences_from = self.fences_from.max(self.text.len().saturating_sub(FENCE.len() - 1));
        None
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The grammar for a fenced call, compiled once per request in `prepare` (off the scheduler
/// thread): `rules` define `fenced_calls` (see `LazyTools::fenced_calls_rules`). It runs over
/// the output from the token holding the fence's first backtick, so it lets that token's text
/// before the fence (`FENCE_LEAD`: no backtick, since the fence is the first one there) come
/// first; what earlier tokens wrote is not the grammar's concern, text or not.
pub fn fenced_call_grammar(rules: &str) -> String {
    format!("start: fenced_calls | FENCE_LEAD fenced_calls\nFENCE_LEAD: /[^`]+/\n{rules}")
}

/// The grammar for a fenced call after `prefix`: `rules` define `fenced_calls` (see
/// `LazyTools::fenced_calls_rules`); the text before the fence is repeated as a literal, so the
/// grammar runs over the whole output and takes every token generated so far.
pub fn fenced_grammar(rules: &str, prefix: &str) -> String {
    if prefix.is_empty() {
        return format!("start: fenced_calls\n{rules}");
    }
    let literal = serde_json::to_string(prefix).expect("a string serialises");
    format!("start: {literal} fenced_calls\n{rules}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["get_weather".to_string()]
    }

    /// Feeds `pieces` in order; the first call start seen, and after which piece.
    fn watch(pieces: &[&str]) -> Option<(usize, CallStart)> {
        let mut w = CallWatch::new();
        pieces.iter().enumerate().find_map(|(i, p)| w.push(p.as_bytes(), &names(), None).map(|s| (i, s)))
    }

    #[test]
    fn calls_from_the_start_commit_at_their_arguments() {
        let bare = ["{\"name\": ", "\"get_weather\"", ", \"arguments\": ", "{", "\"city\""];
        assert_eq!(watch(&bare), Some((3, CallStart::Bare)));
        let fenced = ["```", "json\n", "{\"name\": \"get_weather\", \"arguments\": {"];
        assert_eq!(watch(&fenced), Some((2, CallStart::Fenced { prefix: 0 })));
        let fenced = ["\n ``", "`json\n", "{\"name\": \"get_weather\", \"arguments\": {"];
        assert_eq!(watch(&fenced), Some((2, CallStart::Fenced { prefix: 2 })));
        assert_eq!(watch(&["<tool_call>"]), Some((0, CallStart::Tagged)));
        assert_eq!(watch(&["Sure", "<tool", "_call>"]), Some((2, CallStart::Tagged)));
    }

    #[test]
    fn where_the_tag_is_a_token_only_that_token_starts_a_tagged_call() {
        let mut w = CallWatch::new();
        assert_eq!(w.push(b"Echo: <tool", &names(), Some(false)), None);
        assert_eq!(w.push(b"_call>", &names(), Some(false)), None);
        assert_eq!(w.tag_end_in_last(b"_call>".len()), Some(5));
        assert_eq!(w.push(b" {", &names(), Some(false)), None);
        assert_eq!(w.tag_end_in_last(2), None);
        let mut w = CallWatch::new();
        for piece in ["<", "tool", "_call"] {
            assert_eq!(w.push(piece.as_bytes(), &names(), Some(false)), None);
        }
        assert_eq!(w.push(b">\n", &names(), Some(false)), None);
        assert_eq!(w.tag_end_in_last(2), Some(0), "the tag ends inside the piece");
        assert_eq!(w.push(b"<tool_call>", &names(), Some(true)), Some(CallStart::Tagged));
    }

    #[test]
    fn a_fence_after_prose_commits_with_the_prose_as_its_prefix() {
        let pieces = ["Let's check.\n\n", "``", "`json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": ", "{"];
        assert_eq!(watch(&pieces), Some((3, CallStart::Fenced { prefix: 14 })));
        // A code fence that is not a call is skipped; a later one that is, counts.
        let pieces =
            ["Code:\n```python\nprint(1)\n```\nThen:\n```json\n", "{\"name\": \"get_weather\", \"arguments\": {"];
        let prefix = "Code:\n```python\nprint(1)\n```\nThen:\n".len();
        assert_eq!(watch(&pieces), Some((1, CallStart::Fenced { prefix })));
    }

    #[test]
    fn answers_that_never_start_a_call_are_left_alone() {
        assert_eq!(watch(&["The weather ", "is fine.\n```json\n{\"temp\": 3}\n```"]), None);
        assert_eq!(watch(&["{\"name\": \"get_time\", \"arguments\": {"]), None);
        assert_eq!(watch(&["```json\n{\"result\": 1}"]), None);
    }

    #[test]
    fn the_text_before_a_fence_is_read_from_the_models_bytes() {
        let call = b"```json\n{\"name\": \"get_weather\", \"arguments\": {";
        for (before, text) in [(&b"caf\xC3\xA9 "[..], Some("caf\u{e9} ")), (b"caf\xC3", None), (b"\xFF\xFE ok ", None)]
        {
            let mut w = CallWatch::new();
            assert_eq!(w.push(before, &names(), None), None);
            assert_eq!(w.push(call, &names(), None), Some(CallStart::Fenced { prefix: before.len() }), "{before:?}");
            assert_eq!(w.text_before(before.len()), text, "{before:?}");
        }
        assert_eq!(CallWatch::new().text_before(3), None, "past the output's end");
    }

    #[test]
    fn the_prefix_is_a_lark_literal_of_any_text() {
        let g = fenced_grammar("fenced_calls: \"x\"\n", "a \"quoted\"\n\\ line: é");
        assert_eq!(g, "start: \"a \\\"quoted\\\"\\n\\\\ line: é\" fenced_calls\nfenced_calls: \"x\"\n");
        assert_eq!(fenced_grammar("fenced_calls: \"x\"\n", ""), "start: fenced_calls\nfenced_calls: \"x\"\n");
    }
}
