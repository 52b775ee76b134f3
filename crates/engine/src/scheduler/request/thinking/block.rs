//! One choice's thinking block, while the model is in it (see `crate::thinking`): its text as
//! shown, its tokens counted, and when its end marker must be forced. The answer's grammar (a
//! `response_format`, a forced tool call) waits here until the block closes, so it shapes the
//! answer and never the thinking. What the scheduler does with each step is in `thinking`.

use llguidance::Matcher;

use crate::scheduler::request::stop_strings::TextAssembler;
use crate::thinking::ThinkingPlan;

pub(crate) struct ChoiceThinking {
    /// Ends at the closing marker, which is never shown (nor anything after it in its piece).
    text: TextAssembler,
    /// Forced opening-marker tokens still to come: their text is not shown.
    hidden: usize,
    /// Whitespace held back: the thinking's text is shown trimmed, as the peers report it.
    held_ws: String,
    started: bool,
    /// Thinking tokens so far, markers included.
    pub tokens: u32,
    budget: u32,
    /// Forced when the budget runs out.
    pub close: Vec<i32>,
    close_text: &'static str,
    /// Forced after the closing marker, hidden (harmony's final-channel header).
    pub header: Vec<i32>,
    /// Header tokens still to come once the marker closed the block.
    header_left: usize,
    closing: bool,
    /// The answer's grammar, applied once the block closes.
    pub deferred: Option<Matcher>,
}

/// What one thinking token did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ThinkStep {
    /// Still thinking: text to stream, and whether the end marker must be forced now.
    Thinking { emit: String, force_close: bool },
    /// The end marker came; the answer's header is to be forced now (and is not shown).
    Header { emit: String },
    /// The end marker came: the last thinking text; the answer starts at the next token.
    Closed { emit: String },
}

impl ChoiceThinking {
    pub(crate) fn new(plan: &ThinkingPlan, deferred: Option<Matcher>) -> Self {
        Self {
            text: TextAssembler::new(vec![plan.close_text.to_string()]),
            hidden: plan.open.len(),
            held_ws: String::new(),
            started: false,
            tokens: 0,
            budget: plan.budget,
            close: plan.close.clone(),
            close_text: plan.close_text,
            header: plan.header.clone(),
            header_left: 0,
            closing: false,
            deferred,
        }
    }

    /// Takes the next token's text. The budget counts the closing marker too: it is forced so
    /// that the block ends on the budget's last token.
    pub(crate) fn push(&mut self, piece: &[u8]) -> ThinkStep {
        self.tokens += 1;
        if self.header_left > 0 {
            self.header_left -= 1;
            if self.header_left == 0 {
                return ThinkStep::Closed { emit: String::new() };
            }
            return ThinkStep::Thinking { emit: String::new(), force_close: false };
        }
        let emit = if self.hidden > 0 {
            self.hidden -= 1;
            String::new()
        } else {
            let scan = self.text.push(piece);
            let emit = self.shown(&scan.emit);
            if scan.stopped && self.header.is_empty() {
                return ThinkStep::Closed { emit };
            }
            if scan.stopped {
                self.header_left = self.header.len();
                return ThinkStep::Header { emit };
            }
            emit
        };
        let close_len = crate::units::count_u32(self.close.len() + self.header.len());
        let force_close = !self.closing && self.tokens.saturating_add(close_len) >= self.budget;
        self.closing |= force_close;
        ThinkStep::Thinking { emit, force_close }
    }

    /// Whether a token's text (control tokens written out) is the closing marker itself.
    pub(crate) fn is_close_marker(&self, piece: &[u8]) -> bool {
        piece == self.close_text.as_bytes()
    }

    /// The thinking text still held when the output ends inside the block.
    pub(crate) fn finish(&mut self) -> String {
        let tail = self.text.finish();
        self.shown(&tail.emit)
    }

    /// `text` as shown: without the block's leading whitespace, and with trailing whitespace
    /// held until more text follows it.
    fn shown(&mut self, text: &str) -> String {
        let text = if self.started { text } else { text.trim_start() };
        let body = text.trim_end();
        if body.is_empty() {
            self.held_ws.push_str(text);
            return String::new();
        }
        self.started = true;
        let out = std::mem::take(&mut self.held_ws) + body;
        self.held_ws.push_str(&text[body.len()..]);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thinking(open: usize, budget: u32) -> ChoiceThinking {
        let plan =
            ThinkingPlan { open: vec![1; open], close: vec![10, 2], close_text: "</think>", header: vec![], budget };
        ChoiceThinking::new(&plan, None)
    }

    #[test]
    fn harmonys_final_header_is_forced_hidden_and_counted() {
        let plan =
            ThinkingPlan { open: vec![1], close: vec![2], close_text: "<|end|>", header: vec![3, 4, 5], budget: 6 };
        let mut t = ChoiceThinking::new(&plan, None);
        assert_eq!(t.push(b"<|channel|>"), ThinkStep::Thinking { emit: String::new(), force_close: false });
        // 2 tokens, then the close and the header's 3: 6.
        assert_eq!(t.push(b"Hmm"), ThinkStep::Thinking { emit: "Hmm".into(), force_close: true });
        assert_eq!(t.push(b"<|end|>"), ThinkStep::Header { emit: String::new() });
        for piece in ["<|start|>assistant", "<|channel|>final"] {
            assert_eq!(t.push(piece.as_bytes()), ThinkStep::Thinking { emit: String::new(), force_close: false });
        }
        assert_eq!(t.push(b"<|message|>"), ThinkStep::Closed { emit: String::new() });
        assert_eq!(t.tokens, 6);
    }

    fn text(step: ThinkStep) -> String {
        match step {
            ThinkStep::Thinking { emit, .. } | ThinkStep::Header { emit } | ThinkStep::Closed { emit } => emit,
        }
    }

    #[test]
    fn the_markers_and_the_edges_whitespace_are_not_shown() {
        let mut t = thinking(1, u32::MAX);
        let pieces = ["<think>", "\n", "Let", " me", " see", ".\n", "\n", "Yes", ".", "\n", "</think>"];
        let shown: Vec<String> = pieces.iter().map(|p| text(t.push(p.as_bytes()))).collect();
        assert_eq!(shown.concat(), "Let me see.\n\nYes.");
        assert_eq!(t.tokens, 11);
        let mut t = thinking(0, u32::MAX);
        assert_eq!(t.push(b"Hmm </th"), ThinkStep::Thinking { emit: "Hmm".into(), force_close: false });
        assert_eq!(t.push(b"ink>"), ThinkStep::Closed { emit: String::new() });
    }

    #[test]
    fn the_end_marker_is_forced_so_the_block_ends_on_the_budget() {
        let mut t = thinking(1, 6);
        let steps: Vec<bool> = (0..4)
            .map(|_| match t.push(b"a") {
                ThinkStep::Thinking { force_close, .. } => force_close,
                ThinkStep::Header { .. } | ThinkStep::Closed { .. } => unreachable!(),
            })
            .collect();
        // 4 tokens, then the two forced ones: 6.
        assert_eq!(steps, [false, false, false, true]);
        assert!(matches!(t.push(b"\n"), ThinkStep::Thinking { force_close: false, .. }));
        assert!(matches!(t.push(b"</think>"), ThinkStep::Closed { .. }));
        assert_eq!(t.tokens, 6);
        // A budget smaller than the markers closes at once.
        let mut t = thinking(1, 0);
        assert_eq!(t.push(b"<think>"), ThinkStep::Thinking { emit: String::new(), force_close: true });
    }

    #[test]
    fn an_output_cut_inside_the_block_shows_what_it_thought() {
        let mut t = thinking(0, u32::MAX);
        assert_eq!(text(t.push(b"Well </")), "Well");
        assert_eq!(t.finish(), " </");
    }
}
