//! Turning a stream of token pieces into client-visible text.
//!
//! Two concerns live here because they must be solved together: a token piece can end
//! in the middle of a multi-byte UTF-8 character, and a stop string can span several
//! tokens. [`TextAssembler`] only ever releases text that is valid UTF-8 and that can no
//! longer turn out to be the start of a stop string.

/// Accumulates raw token bytes and releases the longest valid UTF-8 prefix.
#[derive(Debug, Default)]
pub struct Utf8Decoder {
    pending: Vec<u8>,
}

impl Utf8Decoder {
    /// Appends `bytes` and returns whatever now forms complete characters.
    /// Bytes that can never become valid UTF-8 are replaced by U+FFFD, so a model that
    /// emits garbage cannot stall the stream.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // SAFETY of unwrap: from_utf8 guarantees the prefix is valid.
                    out.push_str(std::str::from_utf8(&self.pending[..valid]).unwrap());
                    match e.error_len() {
                        // Incomplete character at the end: keep it for the next piece.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// Flushes what is left at the end of generation (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }
}

/// Outcome of feeding text through a [`StopMatcher`].
#[derive(Debug, PartialEq, Eq)]
pub struct StopScan {
    /// Text that is safe to show the client now.
    pub emit: String,
    /// True when a stop string matched; nothing after it must ever be emitted.
    pub stopped: bool,
}

/// Holds back text that might be the beginning of a stop string.
#[derive(Debug)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    /// Which stop string matched, once one did (its index among the non-empty ones).
    matched: Option<usize>,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        let stops = stops.into_iter().filter(|s| !s.is_empty()).collect();
        Self { stops, held: String::new(), matched: None }
    }

    pub fn push(&mut self, text: &str) -> StopScan {
        self.held.push_str(text);
        if self.stops.is_empty() {
            return StopScan { emit: std::mem::take(&mut self.held), stopped: false };
        }
        // Earliest complete match wins, as in OpenAI's API.
        let first = self.stops.iter().enumerate().filter_map(|(k, s)| Some((self.held.find(s.as_str())?, k))).min();
        if let Some((at, k)) = first {
            self.matched = Some(k);
            let emit = self.held[..at].to_string();
            self.held.clear();
            return StopScan { emit, stopped: true };
        }
        let keep = self.longest_partial_suffix();
        let cut = self.held.len() - keep;
        let emit = self.held[..cut].to_string();
        self.held.drain(..cut);
        StopScan { emit, stopped: false }
    }

    /// Releases held text at the end of generation (no stop string can complete any more).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length in bytes of the longest suffix of `held` that is a proper prefix of a stop string.
    fn longest_partial_suffix(&self) -> usize {
        let mut best = 0;
        for stop in &self.stops {
            let max = stop.len().saturating_sub(1).min(self.held.len());
            for len in (best + 1..=max).rev() {
                let start = self.held.len() - len;
                if self.held.is_char_boundary(start) && stop.starts_with(&self.held[start..]) {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

/// UTF-8 decoding followed by stop-string matching, one per generated sequence.
#[derive(Debug)]
pub struct TextAssembler {
    utf8: Utf8Decoder,
    stops: StopMatcher,
}

impl TextAssembler {
    pub fn new(stops: Vec<String>) -> Self {
        Self { utf8: Utf8Decoder::default(), stops: StopMatcher::new(stops) }
    }

    pub fn push(&mut self, piece: &[u8]) -> StopScan {
        let text = self.utf8.push(piece);
        self.stops.push(&text)
    }

    /// Forgets the text taken so far (an output dropped to be sampled again).
    pub(crate) fn reset(&mut self) {
        self.utf8 = Utf8Decoder::default();
        self.stops.held.clear();
        self.stops.matched = None;
    }

    /// The index of the stop string that ended the text (among the non-empty ones), if one did.
    pub fn matched_stop(&self) -> Option<usize> {
        self.stops.matched
    }

    /// Like [`push`](Self::push), for text sampled under a grammar: stop strings are not matched
    /// in it, since ending there would cut the JSON the grammar guarantees. Text held back as a
    /// possible stop-string start is released with it.
    pub fn push_constrained(&mut self, piece: &[u8]) -> StopScan {
        let text = self.utf8.push(piece);
        StopScan { emit: self.stops.finish() + &text, stopped: false }
    }

    /// Final text once generation ends for a reason other than a stop string.
    pub fn finish(&mut self) -> StopScan {
        let tail = self.utf8.finish();
        let scan = self.stops.push(&tail);
        if scan.stopped {
            return scan;
        }
        StopScan { emit: scan.emit + &self.stops.finish(), stopped: false }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_split_across_pieces_is_never_emitted_half() {
        let mut d = Utf8Decoder::default();
        let bytes = "é你😀".as_bytes();
        let mut out = String::new();
        for b in bytes {
            let part = d.push(std::slice::from_ref(b));
            // Every released part must be whole characters.
            assert!(std::str::from_utf8(part.as_bytes()).is_ok());
            out.push_str(&part);
        }
        assert_eq!(out, "é你😀");
        assert_eq!(d.finish(), "");
    }

    #[test]
    fn utf8_incomplete_held_until_complete() {
        let mut d = Utf8Decoder::default();
        assert_eq!(d.push(&[b'a', 0xE4, 0xBD]), "a");
        assert_eq!(d.push(&[0xA0]), "你");
    }

    #[test]
    fn utf8_invalid_bytes_become_replacement() {
        let mut d = Utf8Decoder::default();
        assert_eq!(d.push(&[b'x', 0xFF, b'y']), "x\u{FFFD}y");
        assert_eq!(d.push(&[0xE4]), "");
        assert_eq!(d.finish(), "\u{FFFD}");
    }

    #[test]
    fn stop_string_within_one_piece() {
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("abcENDdef"), StopScan { emit: "abc".into(), stopped: true });
        assert_eq!(m.matched, Some(0));
        let mut two = StopMatcher::new(vec![String::new(), "x".into(), "b".into()]);
        assert_eq!(two.push("abx").emit, "a", "the earliest match wins");
        assert_eq!(two.matched, Some(1), "counted among the non-empty stop strings");
    }

    #[test]
    fn stop_string_spanning_pieces_is_never_emitted() {
        let mut m = StopMatcher::new(vec!["\n\nUser:".into()]);
        let mut out = String::new();
        let mut stopped = false;
        for piece in ["Hello", "\n", "\nUs", "er", ":", " more"] {
            let s = m.push(piece);
            out.push_str(&s.emit);
            if s.stopped {
                stopped = true;
                break;
            }
        }
        assert!(stopped);
        assert_eq!(out, "Hello");
    }

    #[test]
    fn partial_match_released_when_it_diverges() {
        let mut m = StopMatcher::new(vec!["STOP".into()]);
        assert_eq!(m.push("ab ST").emit, "ab ");
        assert_eq!(m.push("AR").emit, "STAR");
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        let mut m = StopMatcher::new(vec!["world".into(), "lo".into()]);
        assert_eq!(m.push("hello world").emit, "hel");
    }

    #[test]
    fn finish_releases_held_prefix() {
        let mut a = TextAssembler::new(vec!["###".into()]);
        assert_eq!(a.push(b"x#").emit, "x");
        assert_eq!(a.finish(), StopScan { emit: "#".into(), stopped: false });
    }

    #[test]
    fn constrained_text_is_never_stopped() {
        let mut a = TextAssembler::new(vec!["}".into(), "\"name\"".into()]);
        assert_eq!(a.push(b"x \"na"), StopScan { emit: "x ".into(), stopped: false });
        let mut out = String::new();
        for piece in ["me\": 1", "}", "\"name\"", "}"] {
            let scan = a.push_constrained(piece.as_bytes());
            assert!(!scan.stopped);
            out.push_str(&scan.emit);
        }
        assert_eq!(out, "\"name\": 1}\"name\"}");
        assert_eq!(a.finish(), StopScan { emit: String::new(), stopped: false });
    }

    #[test]
    fn empty_stop_strings_are_ignored() {
        let mut m = StopMatcher::new(vec![String::new()]);
        assert_eq!(m.push("abc"), StopScan { emit: "abc".into(), stopped: false });
    }

    #[test]
    fn stop_with_multibyte_text() {
        let mut a = TextAssembler::new(vec!["你好".into()]);
        let bytes = "ok 你好 rest".as_bytes();
        let mut out = String::new();
        let mut stopped = false;
        for b in bytes {
            let s = a.push(std::slice::from_ref(b));
            out.push_str(&s.emit);
            if s.stopped {
                stopped = true;
                break;
            }
        }
        assert!(stopped);
        assert_eq!(out, "ok ");
    }
}
