//! Reasoning models: a template with a thinking block (`<think>…</think>`: DeepSeek-R1 distills,
//! Qwen3; harmony's `analysis` channel before its `final` one: gpt-oss) lets the model think
//! before it answers. Here the request's wish (think or not, and for
//! how long) becomes the prompt's last words and a [`ThinkingPlan`] the scheduler follows: the
//! thinking is streamed apart from the answer, counted, and closed by the model's own end marker
//! when its budget runs out, so a thinking loop never eats the answer's tokens.

/// What a request asks of the model's thinking.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Thinking {
    /// The model thinks, as its template has it, bounded only by `max_tokens` (see
    /// [`answer_room`]).
    #[default]
    Default,
    /// No thinking: the template's switch is off, and the prompt holds an empty thinking block.
    Off,
    /// At most this many thinking tokens (its markers included); then the end marker is forced.
    Budget(u32),
}

/// How a template writes a thinking block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Format {
    pub open: &'static str,
    pub close: &'static str,
    /// What follows the close before the answer, hidden (harmony's final-channel header).
    pub header: &'static str,
    /// Written inside an empty block, and after it (`<think>`'s blank lines).
    pub gap: &'static str,
}

/// `<think>…</think>` (DeepSeek-R1 distills, Qwen3).
pub(crate) const THINK: Format = Format { open: "<think>", close: "</think>", header: "", gap: "\n\n" };

/// gpt-oss's harmony: the `analysis` channel, then the `final` one.
pub(crate) const HARMONY: Format = Format {
    open: "<|channel|>analysis<|message|>",
    close: "<|end|>",
    header: "<|start|>assistant<|channel|>final<|message|>",
    gap: "",
};

/// A thinking block's markers, as texts and as the tokens that are forced to write them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Markers {
    format: Format,
    open_tokens: Vec<i32>,
    /// How the models end their thinking themselves (`<think>`'s after a line break).
    close_tokens: Vec<i32>,
    header_tokens: Vec<i32>,
}

impl Markers {
    /// The markers of a template with a thinking block; `tokenize` parses special tokens.
    pub(crate) fn detect(template: &str, tokenize: impl Fn(&str) -> Vec<i32>) -> Option<Self> {
        let format = if template.contains("<|channel|>") && template.contains("analysis") {
            HARMONY
        } else if template.contains(THINK.close) {
            THINK
        } else {
            return None;
        };
        let close = if format == THINK { format!("\n{}", format.close) } else { format.close.to_string() };
        Some(Self {
            format,
            open_tokens: tokenize(format.open),
            close_tokens: tokenize(&close),
            header_tokens: if format.header.is_empty() { Vec::new() } else { tokenize(format.header) },
        })
    }

    /// Ends the rendered prompt `text` the way `thinking` needs, and says what the scheduler does
    /// about the output's thinking (`None`: there is none to watch).
    ///
    /// - The template already closed the block (its switch was off): nothing is left to think.
    /// - Off: an empty block is written, closing the one the template opened (DeepSeek-R1
    ///   distills open it after the generation prompt and have no switch).
    /// - Otherwise the output is thinking from its first token: where the template did not open
    ///   the block, the opening marker is the output's first token(s), forced.
    pub(crate) fn plan(&self, text: &mut String, thinking: Thinking) -> Option<ThinkingPlan> {
        let Format { open, close, header, gap } = self.format;
        let tail = text.trim_end();
        if tail.ends_with(&format!("{close}{header}")) {
            return None;
        }
        let opened = tail.ends_with(open);
        if thinking == Thinking::Off {
            let opening = if opened { "" } else { open };
            let gap_inside = if opened { "\n" } else { gap };
            text.push_str(&format!("{opening}{gap_inside}{close}{header}{gap}"));
            return None;
        }
        let budget = match thinking {
            Thinking::Budget(b) => b,
            Thinking::Default | Thinking::Off => u32::MAX,
        };
        Some(ThinkingPlan {
            open: if opened { Vec::new() } else { self.open_tokens.clone() },
            close: self.close_tokens.clone(),
            close_text: close,
            header: self.header_tokens.clone(),
            budget,
        })
    }
}

/// How the scheduler handles one request's thinking (see `scheduler::request::thinking`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThinkingPlan {
    /// Forced as the output's first tokens: the opening marker, where the prompt did not write
    /// it. Their text is not shown.
    pub open: Vec<i32>,
    /// Forced when the budget runs out: the closing marker (after a line break, for `<think>`).
    pub close: Vec<i32>,
    /// The closing marker's text, where the thinking's text ends.
    pub close_text: &'static str,
    /// Forced right after the closing marker, and hidden: harmony's final-channel header.
    pub header: Vec<i32>,
    /// Most thinking tokens, markers included.
    pub budget: u32,
}

impl ThinkingPlan {
    /// Caps the budget so that an answer fits in `max_tokens` after the thinking: at least a
    /// quarter of it (a thinking cut by `max_tokens` leaves no answer at all).
    pub(crate) fn fit(&mut self, max_tokens: u32) {
        self.budget = self.budget.min(max_tokens - answer_room(max_tokens));
    }
}

/// The part of `max_tokens` thinking never takes: a quarter, at least one token.
pub fn answer_room(max_tokens: u32) -> u32 {
    (max_tokens / 4).max(1).min(max_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn markers() -> Markers {
        Markers { format: THINK, open_tokens: vec![1], close_tokens: vec![10, 2], header_tokens: vec![] }
    }

    #[test]
    fn a_template_without_a_thinking_block_has_no_markers() {
        assert!(Markers::detect("{{ messages }}<|im_start|>assistant\n", |_| vec![]).is_none());
        let m = Markers::detect("{% if '</think>' in c %}…", |t| vec![t.len() as i32]).unwrap();
        assert_eq!(m, markers_of(THINK, 7, 9, None));
        let harmony = "{{ '<|start|>assistant<|channel|>analysis<|message|>' }}";
        let m = Markers::detect(harmony, |t| vec![t.len() as i32]).unwrap();
        assert_eq!(m, markers_of(HARMONY, 30, 7, Some(45)));
    }

    fn markers_of(format: Format, open: i32, close: i32, header: Option<i32>) -> Markers {
        Markers {
            format,
            open_tokens: vec![open],
            close_tokens: vec![close],
            header_tokens: header.into_iter().collect(),
        }
    }

    #[test]
    fn the_prompt_ends_as_the_wish_needs() {
        let m = markers();
        // A template that opened the block (DeepSeek-R1 distills).
        let mut text = String::from("<|Assistant|><think>\n");
        let plan = m.plan(&mut text, Thinking::Budget(50)).unwrap();
        assert_eq!((plan.open, plan.budget), (vec![], 50));
        let mut text = String::from("<|Assistant|><think>\n");
        assert!(m.plan(&mut text, Thinking::Off).is_none());
        assert_eq!(text, "<|Assistant|><think>\n\n</think>\n\n");
        // A template where the model opens it (Qwen3): forced open, unbounded by default.
        let mut text = String::from("<|im_start|>assistant\n");
        let plan = m.plan(&mut text, Thinking::Default).unwrap();
        assert_eq!((plan.open, plan.close, plan.budget), (vec![1], vec![10, 2], u32::MAX));
        assert_eq!(text, "<|im_start|>assistant\n");
        let mut text = String::from("<|im_start|>assistant\n");
        assert!(m.plan(&mut text, Thinking::Off).is_none());
        assert_eq!(text, "<|im_start|>assistant\n<think>\n\n</think>\n\n");
        // The template's switch already closed it.
        let mut text = String::from("<|im_start|>assistant\n<think>\n\n</think>\n\n");
        assert!(m.plan(&mut text, Thinking::Default).is_none());
        assert_eq!(text, "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    }

    #[test]
    fn harmony_off_is_an_empty_analysis_then_the_final_channel() {
        let m = markers_of(HARMONY, 1, 2, Some(3));
        let mut text = String::from("<|start|>assistant");
        assert!(m.plan(&mut text, Thinking::Off).is_none());
        assert_eq!(
            text,
            "<|start|>assistant<|channel|>analysis<|message|><|end|><|start|>assistant<|channel|>final<|message|>"
        );
        let plan = m.plan(&mut String::from("<|start|>assistant"), Thinking::Budget(9)).unwrap();
        assert_eq!((plan.open, plan.close, plan.close_text, plan.header), (vec![1], vec![2], "<|end|>", vec![3]));
    }

    #[test]
    fn thinking_leaves_room_for_an_answer() {
        let mut plan = markers().plan(&mut String::new(), Thinking::Default).unwrap();
        plan.fit(100);
        assert_eq!(plan.budget, 75);
        plan.fit(1);
        assert_eq!(plan.budget, 0);
        let mut plan = markers().plan(&mut String::new(), Thinking::Budget(10)).unwrap();
        plan.fit(100);
        assert_eq!(plan.budget, 10);
    }
}
