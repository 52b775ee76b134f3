//! Where a JSON answer's layout ends and a value begins, read from the tokens' text.
//!
//! Under a schema, drafts copied from earlier answers (or the answer's own earlier keys) are
//! right about the layout (`,\n  "city": "`) and mostly wrong about the value after it (another
//! customer's city). Cut at the value, such a draft is accepted nearly every time, so the
//! scheduler dares a longer one; left to run into the value, one wrong token in three made
//! every layout draft look doubtful, and each key took two steps instead of one.

use std::sync::Arc;

/// A token that is layout only: whitespace and at most one quote (` `, ` "`, `"`, `\n  `).
const SPACING: u8 = 1;
/// A token after which a value follows: its text ends with `:`, maybe followed by spacing
/// (`":`, `": "`).
const OPENS_VALUE: u8 = 2;
/// Flags on top of the kind above.
/// A layout token holding a quote (` "`, `": "`): the value after it is a string.
const QUOTED: u8 = 32;
/// Ends a string value and what follows it in layout (`",\n`, `"}`, `",`).
const CLOSES_STRING: u8 = 4;
/// Ends a number or literal and what follows it in layout (`,\n`, `\n`, `}`).
const CLOSES_OTHER: u8 = 8;
/// Punctuation that ends a phrase in prose (`.`, `,`, `)`, ` (`): where a value quoted from a
/// sentence most likely ends.
const ENDS_PHRASE: u8 = 16;
const KIND: u8 = 3;

/// What is being written at the end of an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Value {
    String,
    Other,
}

/// What each token of a vocabulary is to JSON layout.
#[derive(Clone)]
pub(crate) struct JsonMarks(Arc<[u8]>);

impl JsonMarks {
    /// Marks for a vocabulary whose token `i` writes `piece(i)`.
    pub(crate) fn new(n_vocab: usize, piece: impl Fn(i32) -> Vec<u8>) -> Self {
        Self((0..n_vocab).map(|t| mark(&piece(crate::units::token_id(t)))).collect())
    }

    fn of(&self, token: i32) -> u8 {
        self.flags(token) & KIND
    }

    fn flags(&self, token: i32) -> u8 {
        usize::try_from(token).ok().and_then(|t| self.0.get(t)).copied().unwrap_or(0)
    }

    /// The value an answer's `output` ends inside, if it ends inside one (opened, not closed
    /// yet, at least one token written).
    pub(crate) fn value_at_end(&self, output: &[i32]) -> Option<Value> {
        let (&last, _) = output.split_last()?;
        if self.of(last) != 0 {
            return None;
        }
        let mut string = false;
        for &t in output.iter().rev().skip(1) {
            let flags = self.flags(t);
            if flags & (CLOSES_STRING | CLOSES_OTHER) != 0 {
                return None;
            }
            match flags & KIND {
                SPACING => string |= self.quoted(t),
                OPENS_VALUE => return Some(if string || self.quoted(t) { Value::String } else { Value::Other }),
                _ => {}
            }
        }
        None
    }

    /// Whether a layout token holds a quote (one that opens a string value).
    fn quoted(&self, token: i32) -> bool {
        self.flags(token) & QUOTED != 0
    }

    /// Whether the prompt token `token` ends a phrase (see `ENDS_PHRASE`).
    pub(crate) fn ends_phrase(&self, token: i32) -> bool {
        self.flags(token) & ENDS_PHRASE != 0
    }

    /// The newest token in `output` that closed a value of this kind, to guess the next close.
    pub(crate) fn last_closer(&self, output: &[i32], value: Value) -> Option<i32> {
        let flag = match value {
            Value::String => CLOSES_STRING,
            Value::Other => CLOSES_OTHER,
        };
        output.iter().rev().copied().find(|&t| self.flags(t) & flag != 0)
    }

    /// How many of `draft`'s tokens, written after `history`, come before a JSON value starts:
    /// the first token after a `:` that is not spacing begins the value.
    pub(crate) fn before_value(&self, history: &[i32], draft: &[i32]) -> usize {
        // Whether the history already ends at a value's start (`"city":` or `"city": "`).
        let mut opened = false;
        for &t in history.iter().rev() {
            match self.of(t) {
                SPACING => continue,
                OPENS_VALUE => opened = true,
                _ => {}
            }
            break;
        }
        for (i, &t) in draft.iter().enumerate() {
            match self.of(t) {
                SPACING => {}
                OPENS_VALUE => opened = true,
                _ if opened => return i,
                _ => {}
            }
        }
        draft.len()
    }
}

fn mark(piece: &[u8]) -> u8 {
    let spacing = |b: &u8| b.is_ascii_whitespace();
    let quotes = piece.iter().filter(|&&b| b == b'"').count();
    if !piece.is_empty() && quotes <= 1 && piece.iter().all(|b| spacing(b) || *b == b'"') {
        let closes = if piece.contains(&b'\n') && quotes == 0 { CLOSES_OTHER } else { 0 };
        return SPACING | closes | if quotes == 1 { QUOTED } else { 0 };
    }
    let layout = |b: &u8| spacing(b) || b",}]".contains(b);
    if let Some((b'"', rest)) = piece.split_first() {
        if !rest.is_empty() && rest.iter().all(layout) {
            return CLOSES_STRING;
        }
    }
    if matches!(piece.first(), Some(b',' | b'}' | b']')) && piece.iter().all(layout) {
        return CLOSES_OTHER;
    }
    if piece.iter().any(|b| b".,;!?()".contains(b)) && piece.iter().all(|b| spacing(b) || b".,;!?()".contains(b)) {
        return ENDS_PHRASE;
    }
    // Trailing spacing and one opening quote are part of the opener (`": "`).
    let mut end = piece.len();
    while end > 0 && spacing(&piece[end - 1]) {
        end -= 1;
    }
    let mut quoted = 0;
    if end > 0 && piece[end - 1] == b'"' {
        end -= 1;
        quoted = QUOTED;
        while end > 0 && spacing(&piece[end - 1]) {
            end -= 1;
        }
    }
    if end > 0 && piece[end - 1] == b':' {
        return OPENS_VALUE | quoted;
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy vocabulary: the token id is the index in this list.
    const VOCAB: &[&str] =
        &[",\n", " ", " \"", "city", "\":", "Os", "aka", "\",\n", "age", "3", "4", "\": \"", "x:y", ".", "-"];

    fn marks() -> JsonMarks {
        JsonMarks::new(VOCAB.len(), |t| VOCAB[t as usize].as_bytes().to_vec())
    }

    fn ids(words: &[&str]) -> Vec<i32> {
        words.iter().map(|w| VOCAB.iter().position(|v| v == w).unwrap() as i32).collect()
    }

    #[test]
    fn tokens_are_marked_by_their_text() {
        assert_eq!(mark(b" "), SPACING);
        assert_eq!(mark(b" \""), SPACING | QUOTED);
        assert_eq!(mark(b"\n  "), SPACING | CLOSES_OTHER);
        assert_eq!(mark(b"\"\""), 0);
        assert_eq!(mark(b"\":"), OPENS_VALUE);
        assert_eq!(mark(b"\": \""), OPENS_VALUE | QUOTED);
        assert_eq!(mark(b":"), OPENS_VALUE);
        assert_eq!(mark(b"x:y"), 0);
        assert_eq!(mark(b"\",\n"), CLOSES_STRING);
        assert_eq!(mark(b"\"}"), CLOSES_STRING);
        assert_eq!(mark(b",\n"), CLOSES_OTHER);
        assert_eq!(mark(b"}"), CLOSES_OTHER);
        assert_eq!(mark(b"."), ENDS_PHRASE);
        assert_eq!(mark(b" ("), ENDS_PHRASE);
        assert_eq!(mark(b".com"), 0);
        assert_eq!(mark(b"-"), 0);
        assert_eq!(mark(b"@"), 0);
        assert_eq!(mark(b""), 0);
    }

    #[test]
    fn a_draft_is_cut_where_a_value_starts() {
        let m = marks();
        // After `,\n`: the key and its opener are layout, the city is a value.
        let history = ids(&["3", ",\n"]);
        let draft = ids(&[" ", " \"", "city", "\":", " \"", "Os", "aka"]);
        assert_eq!(m.before_value(&history, &draft), 5);
        // A number value starts right after the spacing.
        assert_eq!(m.before_value(&history, &ids(&[" ", " \"", "age", "\":", " ", "3", "4"])), 5);
        // An opener with its quote in one token.
        assert_eq!(m.before_value(&history, &ids(&[" \"", "city", "\": \"", "Os"])), 3);
        // Nothing opens a value: all of it is layout.
        assert_eq!(m.before_value(&history, &ids(&[" ", " \"", "city"])), 3);
        // Text that merely holds a colon opens nothing.
        assert_eq!(m.before_value(&history, &ids(&["x:y", "Os"])), 2);
    }

    #[test]
    fn a_history_ending_at_a_value_start_leaves_no_layout_to_draft() {
        let m = marks();
        assert_eq!(m.before_value(&ids(&["city", "\":"]), &ids(&[" \"", "Os", "aka"])), 1);
        assert_eq!(m.before_value(&ids(&["city", "\":", " \""]), &ids(&["Os", "aka"])), 0);
        // Inside the value the rest of it and its closing quote are not cut.
        assert_eq!(m.before_value(&ids(&["\":", " \"", "Os"]), &ids(&["aka", "\",\n", " "])), 3);
    }

    #[test]
    fn the_value_an_answer_ends_inside_and_how_the_last_one_closed() {
        let m = marks();
        assert_eq!(m.value_at_end(&ids(&["city", "\":", " \"", "Os"])), Some(Value::String));
        assert_eq!(m.value_at_end(&ids(&["city", "\": \"", "Os", "aka"])), Some(Value::String));
        assert_eq!(m.value_at_end(&ids(&["age", "\":", " ", "3", "4"])), Some(Value::Other));
        // Not inside a value: at layout, or after the value closed, or in a key.
        assert_eq!(m.value_at_end(&ids(&["city", "\":", " \""])), None);
        assert_eq!(m.value_at_end(&ids(&["\":", " \"", "Os", "\",\n", " \"", "city"])), None);
        assert_eq!(m.value_at_end(&ids(&[",\n", " \"", "city"])), None);
        let output = ids(&["\":", " ", "3", ",\n", " \"", "city", "\":", " \"", "Os", "\",\n", "age", "\":", " ", "4"]);
        assert_eq!(m.last_closer(&output, Value::String), Some(ids(&["\",\n"])[0]));
        assert_eq!(m.last_closer(&output, Value::Other), Some(ids(&[",\n"])[0]));
        assert_eq!(m.last_closer(&output[..3], Value::String), None);
        assert!(m.ends_phrase(ids(&["."])[0]) && !m.ends_phrase(ids(&["-"])[0]));
    }
}
