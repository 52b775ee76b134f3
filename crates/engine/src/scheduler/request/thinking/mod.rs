//! A reasoning model's thinking in a running request: each thinking token is streamed as
//! thinking (see `block` for the text and the budget), and the block's end hands the
//! choice to its answer, with the answer's grammar or answer-or-call gate.

pub(crate) mod block;

use crate::request::FinishReason;
use crate::scheduler::request::thinking::block::ThinkStep;
use crate::scheduler::request::ActiveRequest;

impl ActiveRequest {
    /// A token inside choice `i`'s thinking block: streamed as thinking (without logprobs: its
    /// tokens are not the answer's), counted, and the block closed by force when its budget runs
    /// out. Returns whether the choice goes on.
    ///
    /// The markers are read in the token's text with control tokens written out, since
    /// harmony's (`<|end|>`) are control tokens, which a vocabulary may even count as ending
    /// the generation: inside the block, the closing marker only closes it.
    pub(crate) fn produce_thinking(
        &mut self,
        i: usize,
        token: i32,
        ctx_size: i32,
        model: &crate::model::LoadedModel,
    ) -> bool {
        let piece = model.special_piece(token);
        let c = &mut self.choices[i];
        let thinking = c.thinking.as_mut().expect("called inside a thinking block");
        if model.is_end_of_generation(token) && !thinking.is_close_marker(&piece) {
            // The model ended inside its thinking: no answer follows.
            self.end_thinking(i);
            self.finish_choice(i, FinishReason::Stop);
            return false;
        }
        self.usage.reasoning_tokens += 1;
        let emit = match thinking.push(&piece) {
            ThinkStep::Thinking { emit, force_close } => {
                if force_close {
                    c.sampler.force(&thinking.close);
                }
                emit
            }
            ThinkStep::Header { emit } => {
                c.sampler.force(&thinking.header);
                emit
            }
            ThinkStep::Closed { emit } => {
                if let Some(grammar) = c.thinking.take().and_then(|t| t.deferred) {
                    c.sampler.constrain(c.drafter.follow_grammar(grammar));
                    c.constrained = true;
                }
                c.answer_unstarted = true;
                self.arm_gate(i, model);
                emit
            }
        };
        self.send_reasoning(i, emit);
        let c = &self.choices[i];
        if c.generated >= self.max_tokens || c.pos >= ctx_size {
            self.end_thinking(i);
            self.finish_choice(i, FinishReason::Length);
            return false;
        }
        true
    }

    /// Streams what choice `i` still holds of its thinking, when its output ends inside the block.
    pub(crate) fn end_thinking(&mut self, i: usize) {
        if let Some(mut thinking) = self.choices[i].thinking.take() {
            self.send_reasoning(i, thinking.finish());
        }
    }
}
