//! Recognising calls while the model generates.
//!
//! [`ToolCallStreamer`] releases content as soon as it cannot be part of a call and holds back
//! anything that still could be (a possible tag, fence, or bare JSON at the start). Its output,
//! for any split of a text into deltas, is the same as [`super::parse_tool_calls`] on the whole
//! text: the content pieces concatenate to its `content` and the calls are its `calls`.
//! Calls are emitted whole, each as soon as it is complete (bare JSON calls at `finish`, since
//! prose after them would turn them back into text) — except calls known to be calls before they
//! end ([`ToolCallStreamer::stream_arguments`]): those start with their name and stream their
//! arguments as they are written.

use super::commit::{call_head, Commitment};
use super::parse::{bare_calls, scan_step, Bare, Step};
use super::raw::{minify, Minifier};
use super::ParsedCall;

const TOOL_CALL: &str = "<tool_call>";
const TOOL_CALL_END: &str = "</tool_call>";

/// Part of the output, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamPiece {
    Content(String),
    /// A complete call; `index` counts calls from 0. `arguments` is compact JSON object text.
    Call {
        index: usize,
        name: String,
        arguments: String,
    },
    /// The start of a call whose arguments follow as [`StreamPiece::CallArguments`].
    CallStart {
        index: usize,
        name: String,
    },
    /// The next part of the arguments of call `index`; all parts concatenate to what
    /// [`super::parse_tool_calls`] returns as its `arguments`.
    CallArguments {
        index: usize,
        fragment: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Only whitespace so far.
    Start,
    /// The text starts with `{` or `[` and may be bare JSON calls; everything is held.
    Bare,
    /// Tagged or fenced calls among content.
    Scan,
    /// Inside the arguments of a started call (`tagged`: opened by `<tool_call>`).
    Arguments { tagged: bool },
    /// After a started call's arguments: its closing `}` (and `</tool_call>`) come next.
    CallEnd { tagged: bool },
}

/// Incremental tool-call recogniser: feed it deltas with [`push`](Self::push), then
/// [`finish`](Self::finish).
#[derive(Debug, Clone)]
pub struct ToolCallStreamer {
    known: Vec<String>,
    mode: Mode,
    /// Text received and not yet classified.
    buf: String,
    /// Whether content with non-whitespace has been emitted (leading whitespace is trimmed).
    started: bool,
    /// Whitespace at the end of emitted content, released only if more content follows.
    pending_ws: String,
    calls: usize,
    /// Calls that start `{"name": "<known>", "arguments":` after `<tool_call>` (or, `forced`, at
    /// the very start) are streamed as they are written.
    incremental: bool,
    forced: bool,
    /// The functions a forced output may call, in the order offered (see `finish_cut`).
    callable: Vec<String>,
    minifier: Minifier,
}

impl ToolCallStreamer {
    /// A streamer recognising calls to the functions named in `known`.
    pub fn new(known: &[&str]) -> Self {
        Self {
            known: known.iter().map(|s| s.to_string()).collect(),
            mode: Mode::Start,
            buf: String::new(),
            started: false,
            pending_ws: String::new(),
            calls: 0,
            incremental: false,
            forced: false,
            callable: Vec::new(),
            minifier: Minifier::default(),
        }
    }

    /// Streams the arguments of calls that cannot turn out to be anything else: those after a
    /// `<tool_call>` tag, which the engine samples under the strict call grammar, and (`forced`)
    /// the whole output of a forced call. Only for output sampled so; unconstrained text could
    /// break such a call after it started.
    pub fn stream_arguments(mut self, forced: bool) -> Self {
        self.incremental = true;
        self.forced = forced;
        self
    }

    /// A forced output may call only these (all offered for `required`, the one named
    /// otherwise): a cut before the call's name was closed is still that call (`finish_cut`).
    pub fn forced_to(mut self, callable: &[&str]) -> Self {
        self.callable = callable.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Takes the next delta; returns what is now certain.
    pub fn push(&mut self, delta: &str) -> Vec<StreamPiece> {
        self.buf.push_str(delta);
        self.run(false)
    }

    /// Ends the text; returns everything still held.
    pub fn finish(mut self) -> Vec<StreamPiece> {
        self.run(true)
    }

    /// Ends text that was cut by `max_tokens`: a call still being written is emitted with the
    /// arguments written so far, as [`super::parse_cut_output`] reads it.
    pub fn finish_cut(mut self) -> Vec<StreamPiece> {
        if matches!(self.mode, Mode::Arguments { .. } | Mode::CallEnd { .. }) {
            // Started and streaming: what is left of its arguments follows.
            return self.finish();
        }
        let known: Vec<&str> = self.known.iter().map(String::as_str).collect();
        let cut = super::truncated_call(&self.buf, &known)
            .filter(|(_, _, args)| serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(args).is_err())
            .map(|(before, name, arguments)| (before.len(), ParsedCall { name, arguments: minify(&arguments) }));
        let forced_cut = || {
            let callable: Vec<&str> = self.callable.iter().map(String::as_str).collect();
            super::forced_cut_call(&self.buf, &callable).map(|call| (0, call))
        };
        let cut = cut.or_else(|| if self.forced && self.calls == 0 { forced_cut() } else { None });
        let Some((before, call)) = cut else { return self.finish() };
        self.buf.truncate(before);
        let mut out = self.run(true);
        self.emit_call(call, &mut out);
        out
    }

    /// Calls emitted so far.
    pub fn calls_emitted(&self) -> usize {
        self.calls
    }

    fn run(&mut self, eof: bool) -> Vec<StreamPiece> {
        let known_owned = std::mem::take(&mut self.known);
        let known: Vec<&str> = known_owned.iter().map(String::as_str).collect();
        let mut out = Vec::new();
        self.step(&known, eof, &mut out);
        self.known = known_owned;
        out
    }

    fn step(&mut self, known: &[&str], eof: bool, out: &mut Vec<StreamPiece>) {
        if self.mode == Mode::Start {
            let skipped = self.buf.len() - self.buf.trim_start().len();
            if skipped == self.buf.len() {
                // Whitespace only: trimmed away if nothing follows.
                return;
            }
            if self.incremental && self.forced {
                match call_head(&self.buf[skipped..], known) {
                    (Commitment::Committed, Some((name, len))) => {
                        self.buf.drain(..skipped + len);
                        self.start_call(name, false, out);
                    }
                    (Commitment::Undecided, _) if !eof => return,
                    _ => {}
                }
            }
            if self.mode == Mode::Start {
                let bare = !known.is_empty() && self.buf[skipped..].starts_with(['{', '[']);
                self.mode = if bare { Mode::Bare } else { Mode::Scan };
            }
        }
        if self.mode == Mode::Bare {
            let t = if eof { self.buf.trim() } else { self.buf.trim_start() };
            match bare_calls(t, known, eof) {
                Bare::Possible => return,
                Bare::Calls(calls) => {
                    self.buf.clear();
                    calls.into_iter().for_each(|c| self.emit_call(c, out));
                    return;
                }
                // Never bare calls: scan the whole text from its start, like `parse_tool_calls`.
                Bare::Not => self.mode = Mode::Scan,
            }
        }
        while !self.buf.is_empty() {
            match self.mode {
                Mode::Arguments { tagged } => {
                    if !self.stream_arguments_step(tagged, out) {
                        return;
                    }
                    continue;
                }
                Mode::CallEnd { tagged } => {
                    if !self.call_end_step(tagged, eof) {
                        return;
                    }
                    continue;
                }
                _ => {}
            }
            if self.incremental && self.buf.starts_with(TOOL_CALL) {
                let body = self.buf[TOOL_CALL.len()..].trim_start();
                let skipped = self.buf.len() - body.len();
                match call_head(body, known) {
                    (Commitment::Committed, Some((name, len))) => {
                        self.buf.drain(..skipped + len);
                        self.start_call(name, true, out);
                        continue;
                    }
                    (Commitment::Undecided, _) if !eof => return,
                    _ => {}
                }
            }
            match scan_step(&self.buf, known, eof) {
                Step::Hold => return,
                Step::Content(n) => {
                    let text: String = self.buf.drain(..n).collect();
                    self.emit_content(&text, out);
                }
                Step::Calls(calls, n) => {
                    self.buf.drain(..n);
                    calls.into_iter().for_each(|c| self.emit_call(c, out));
                }
            }
        }
    }

    /// Emits content so that all of it together is the trimmed concatenation.
    fn emit_content(&mut self, text: &str, out: &mut Vec<StreamPiece>) {
        let text = if self.started { text } else { text.trim_start() };
        let body = text.trim_end();
        if body.is_empty() {
            self.pending_ws.push_str(text);
            return;
        }
        let mut piece = std::mem::take(&mut self.pending_ws);
        piece.push_str(body);
        self.pending_ws.push_str(&text[body.len()..]);
        self.started = true;
        match out.last_mut() {
            Some(StreamPiece::Content(last)) => last.push_str(&piece),
            _ => out.push(StreamPiece::Content(piece)),
        }
    }

    fn start_call(&mut self, name: String, tagged: bool, out: &mut Vec<StreamPiece>) {
        out.push(StreamPiece::CallStart { index: self.calls, name });
        self.calls += 1;
        self.minifier = Minifier::default();
        self.mode = Mode::Arguments { tagged };
    }

    /// Releases the arguments text received so far; whether they ended.
    fn stream_arguments_step(&mut self, tagged: bool, out: &mut Vec<StreamPiece>) -> bool {
        let mut fragment = String::new();
        let mut consumed = self.buf.len();
        let mut ended = false;
        for (i, c) in self.buf.char_indices() {
            if self.minifier.push(c, &mut fragment) {
                consumed = i + c.len_utf8();
                ended = true;
                break;
            }
        }
        self.buf.drain(..consumed);
        if !fragment.is_empty() {
            out.push(StreamPiece::CallArguments { index: self.calls - 1, fragment });
        }
        if ended {
            self.mode = Mode::CallEnd { tagged };
        }
        ended
    }

    /// Takes the started call's closing `}` and, after a tag, `</tool_call>` (forgiving stray
    /// braces before it and its absence, as the parser does); whether scanning can go on.
    fn call_end_step(&mut self, tagged: bool, eof: bool) -> bool {
        let ws = |c: char| c.is_whitespace();
        let j = self.buf.len() - self.buf.trim_start_matches(ws).len();
        if j == self.buf.len() {
            return false;
        }
        if !self.buf[j..].starts_with('}') {
            // Not what the grammar lets through; the rest is scanned as usual.
            self.mode = Mode::Scan;
            return true;
        }
        let end = j + 1;
        if tagged {
            let k = self.buf.len() - self.buf[end..].trim_start_matches(|c: char| ws(c) || c == '}' || c == ']').len();
            let rest = &self.buf[k..];
            if rest.starts_with(TOOL_CALL_END) {
                self.buf.drain(..k + TOOL_CALL_END.len());
            } else if rest.is_empty() || TOOL_CALL_END.starts_with(rest) {
                if !eof {
                    return false;
                }
                let cut = if rest.is_empty() { k } else { end };
                self.buf.drain(..cut);
            } else {
                self.buf.drain(..end);
            }
        } else {
            self.buf.drain(..end);
        }
        self.mode = Mode::Scan;
        true
    }

    fn emit_call(&mut self, call: ParsedCall, out: &mut Vec<StreamPiece>) {
        out.push(StreamPiece::Call { index: self.calls, name: call.name, arguments: call.arguments });
        self.calls += 1;
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    const KNOWN: &[&str] = &["get_weather", "search"];

    #[test]
    fn plain_text_flows_immediately_with_trailing_space_held() {
        let mut s = ToolCallStreamer::new(KNOWN);
        assert_eq!(s.push("  Hello, "), vec![StreamPiece::Content("Hello,".into())]);
        assert_eq!(s.push("world"), vec![StreamPiece::Content(" world".into())]);
        assert_eq!(s.push(" \n"), vec![]);
        assert_eq!(s.finish(), vec![]);
    }

    #[test]
    fn tagged_call_is_emitted_when_its_tag_closes() {
        let mut s = ToolCallStreamer::new(KNOWN);
        assert_eq!(s.push("Checking.\n<tool"), vec![StreamPiece::Content("Checking.".into())]);
        assert_eq!(s.push("_call>\n{\"name\": \"search\", \"arguments\": {\"q\": 1}}\n</tool_"), vec![]);
        let call = StreamPiece::Call { index: 0, name: "search".into(), arguments: r#"{"q":1}"#.into() };
        assert_eq!(s.push("call>"), vec![call]);
        assert_eq!(s.calls_emitted(), 1);
        assert_eq!(s.finish(), vec![]);
    }

    #[test]
    fn near_triggers_are_released_once_they_diverge() {
        let mut s = ToolCallStreamer::new(KNOWN);
        assert_eq!(s.push("a <tool"), vec![StreamPiece::Content("a".into())]);
        assert_eq!(s.push("s> b `"), vec![StreamPiece::Content(" <tools> b".into())]);
        assert_eq!(s.push("x`"), vec![StreamPiece::Content(" `x".into())]);
        assert_eq!(s.finish(), vec![StreamPiece::Content("`".into())]);
    }

    #[test]
    fn prose_starting_with_a_brace_is_released_before_finish() {
        let mut s = ToolCallStreamer::new(KNOWN);
        assert_eq!(s.push("{"), vec![]);
        assert_eq!(s.push("curly} braces"), vec![StreamPiece::Content("{curly} braces".into())]);
    }

    #[test]
    fn json_that_is_not_a_call_is_released_when_complete() {
        let mut s = ToolCallStreamer::new(KNOWN);
        assert_eq!(s.push(r#"{"city": "Paris""#), vec![]);
        assert_eq!(s.push("}"), vec![StreamPiece::Content(r#"{"city": "Paris"}"#.into())]);
    }

    #[test]
    fn bare_call_waits_for_finish() {
        let mut s = ToolCallStreamer::new(KNOWN);
        assert_eq!(s.push(r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#), vec![]);
        let call = StreamPiece::Call { index: 0, name: "get_weather".into(), arguments: r#"{"city":"Paris"}"#.into() };
        assert_eq!(s.finish(), vec![call]);
    }

    #[test]
    fn no_known_functions_means_pure_passthrough() {
        let mut s = ToolCallStreamer::new(&[]);
        assert_eq!(s.push("<tool_call>{"), vec![StreamPiece::Content("<tool_call>{".into())]);
        assert_eq!(s.finish(), vec![]);
    }
}
