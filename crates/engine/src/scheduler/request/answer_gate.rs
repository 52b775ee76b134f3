//! A `response_format` beside `auto` tools, on a model with a `<tool_call>` tag token: the model
//! decides between answering and calling, and a format never turns an answer into a call.
//!
//! The first answer token is the model's own pick (see `sampling::AnswerGate`). Prose is an
//! answer: the format's grammar holds it from that token on. The tag is a call, which the tool
//! watch constrains at once. A token that may open a bare JSON call or a fenced one (`{`, `[`,
//! a backtick, whitespace) is ambiguous: the model goes on unconstrained, its output held back (not streamed, not billed
//! yet), until the tool watch sees it commit to a call of an offered function (then the held
//! output is released and the call grammar takes over), or sees that no call can follow (`{"name":
//! "red"`): then the held tokens are dropped, unbilled, from the KV cache and the output, and the
//! answer restarts where it began, under the format's grammar.

use crate::model::LoadedModel;
use crate::request::TokenLogprob;
use crate::scheduler::request::held_output::{Held, MOST_HELD};
use crate::scheduler::request::ActiveRequest;
use crate::scheduler::sample::sampler::GateOutcome;

impl ActiveRequest {
    /// Lets choice `i`'s next token decide between answer and call (see `sampling::AnswerGate`).
    pub(crate) fn arm_gate(&mut self, i: usize, model: &LoadedModel) {
        let (Some(answer), Some(tag)) = (self.grammars.answer.as_ref(), model.tool_call_tag()) else { return };
        // A grammar that compiled in `prepare` instantiates: should it not, the answer is free.
        if let Ok(matcher) = answer.matcher() {
            self.choices[i].sampler.gate(tag, model.call_starts(), matcher);
        }
    }

    /// After choice `i` produced `token` (billed, not yet shown; `before` is the token fed
    /// before it): acts on what its gate decided, if it just did.
    pub(crate) fn after_gate(&mut self, i: usize, token: i32, before: i32, model: &LoadedModel) {
        let c = &mut self.choices[i];
        match c.sampler.gate_outcome.take() {
            None => {}
            Some(GateOutcome::Answer) => {
                if let Some(copy) = c.sampler.grammar_copy() {
                    c.drafter.follow_grammar(copy);
                }
                c.constrained = true;
                c.tool_watch = None;
            }
            Some(GateOutcome::MayCall) if Some(token) == model.tool_call_tag() => {}
            Some(GateOutcome::MayCall) => {
                c.held = Some(Held { anchor: (before, c.pos - 1), tokens: 0, deltas: Vec::new() });
            }
        }
        if let Some(held) = c.held.as_mut() {
            held.tokens += 1;
        }
    }

    /// After the tool watch saw choice `i`'s latest token: releases the held output once a call
    /// committed, or restarts the answer once none can follow. Returns whether it restarted (the
    /// latest token was dropped with the rest).
    pub(crate) fn decide_held(&mut self, i: usize) -> bool {
        let c = &self.choices[i];
        let Some(held) = c.held.as_ref() else { return false };
        let names = self.lazy_tools.as_ref().map_or(&[][..], |l| l.names.as_slice());
        match &c.tool_watch {
            // The watch handed the output to the call grammar.
            None => self.release_held(i),
            Some(watch) if watch.call_may_follow(names) && held.tokens < MOST_HELD => {}
            Some(_) => {
                self.restart_answer(i);
                return true;
            }
        }
        false
    }

    /// Sends what choice `i` held back.
    pub(crate) fn release_held(&mut self, i: usize) {
        if let Some(held) = self.choices[i].held.take() {
            let index = self.choices[i].index;
            for (text, logprobs) in held.deltas {
                self.send_delta(index, text, logprobs);
            }
        }
    }

    /// Holds a delta of choice `i` back while its output may still be a call; false when it
    /// holds nothing.
    pub(crate) fn hold(&mut self, i: usize, text: &str, logprobs: &mut Vec<TokenLogprob>) -> bool {
        match self.choices[i].held.as_mut() {
            Some(held) => {
                held.deltas.push((text.to_owned(), std::mem::take(logprobs)));
                true
            }
            None => false,
        }
    }

    /// Drops choice `i`'s held output (unbilled: it was never shown) and restarts its answer at
    /// the anchor, under the format's grammar. The scheduler cuts the KV cache back to the
    /// choice's position once this step's sampling ends.
    pub(crate) fn restart_answer(&mut self, i: usize) {
        let Some(held) = self.choices[i].held.take() else { return };
        let answer = self.grammars.answer.as_ref().and_then(|g| g.matcher().ok());
        self.usage.completion_tokens -= held.tokens;
        let c = &mut self.choices[i];
        let (token, pos) = held.anchor;
        c.generated -= held.tokens;
        c.pos = pos;
        c.feed(token);
        c.last_token = token;
        c.answer_unstarted = false;
        c.text.reset();
        c.drafter.rewind(held.tokens as usize);
        c.tool_watch = None;
        if let Some(matcher) = answer {
            c.sampler.constrain(c.drafter.follow_grammar(matcher));
            c.constrained = true;
        }
        tracing::debug!(choice = i, dropped = held.tokens, "no call followed: the answer restarts under its format");
    }
}
