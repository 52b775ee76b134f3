//! What one produced token does to a running request, whether sampled alone or a verified draft:
//! it is billed, streamed to the owner with its logprobs (unless held back), and checked against
//! the end of generation, stop strings, tool calls, `max_tokens` and the context end, which may
//! finish its choice.

use std::time::Instant;

use llama_cpp_2::context::LlamaContext;

use crate::faults::FaultPoint;
use crate::model::LoadedModel;
use crate::request::{Event, FinishReason, TokenLogprob};
use crate::scheduler::request::{ActiveRequest, ChoiceState, Phase};
use crate::scheduler::sample::sampler::logprobs_for;

impl ActiveRequest {
    /// Streams a delta of choice `choice`, unless its output is held back (see `answer_gate`).
    pub(crate) fn send_delta(&mut self, choice: u32, text: String, mut logprobs: Vec<TokenLogprob>) {
        if self.hold(choice as usize, &text, &mut logprobs) {
            return;
        }
        if !text.is_empty() || !logprobs.is_empty() {
            let _ = self.events.send(Event::Delta { choice, text, logprobs });
        }
    }

    fn send_stop_sequence(&self, i: usize) {
        let c = &self.choices[i];
        if let Some(k) = c.text.matched_stop() {
            let _ = self.events.send(Event::StopSequence { choice: c.index, index: crate::units::count_u32(k) });
        }
    }

    pub(crate) fn finish_choice(&mut self, i: usize, reason: FinishReason) {
        if self.choices[i].finished().is_some() {
            return;
        }
        self.release_held(i);
        let c = &mut self.choices[i];
        c.state = ChoiceState::Finished(reason);
        let index = c.index;
        if self.choices.iter().all(|c| c.finished().is_some()) {
            self.phase = Phase::Finished;
        }
        if reason != FinishReason::Cancelled {
            let _ = self.events.send(Event::Finished { choice: index, reason });
        }
    }

    /// Everything one produced token does, whether it was sampled alone or verified a draft
    /// token: it is billed, streamed with its logprobs, checked against the end of generation,
    /// stop strings, tool calls, `max_tokens` and the context end. `logits_idx` is where its
    /// logits are in the batch just decoded; `c.pos` must already be the position it would be
    /// fed at. Returns whether the choice goes on (the caller then feeds `token` next).
    pub(crate) fn produce(
        &mut self,
        i: usize,
        token: i32,
        logits_idx: i32,
        ctx: &LlamaContext<'_>,
        model: &LoadedModel,
        ctx_size: i32,
    ) -> bool {
        let logprobs = match self.logprobs {
            Some(top) => vec![logprobs_for(model, ctx.get_logits_ith(logits_idx), token, top)],
            None => Vec::new(),
        };
        self.usage.completion_tokens += 1;
        self.token_produced(i);
        self.choices[i].generated += 1;
        self.choices[i].drafter.push(token);
        let before = std::mem::replace(&mut self.choices[i].last_token, token);
        self.after_gate(i, token, before, model);
        let index = self.choices[i].index;
        if self.choices[i].thinking.is_some() {
            return self.produce_thinking(i, token, ctx_size, model);
        }
        if model.is_end_of_generation(token) {
            if self.choices[i].held.is_some() {
                // Ended before any call: an answer, which must follow its format.
                self.restart_answer(i);
                return false;
            }
            // The end-of-generation token is billed like every sampled token, so it gets its
            // logprobs entry too (its text is empty), as vLLM and llama.cpp report it.
            let tail = self.choices[i].text.finish();
            self.send_delta(index, tail.emit, logprobs);
            self.finish_choice(i, FinishReason::Stop);
            return false;
        }
        let mut piece = model.piece(token);
        if self.choices[i].answer_unstarted {
            let shown = piece.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(piece.len());
            piece.drain(..shown);
            self.choices[i].answer_unstarted = piece.is_empty();
        }
        if let Some(at) = self.watch_for_tool_call(i, token, &piece, model) {
            // A word joiner before the tag's `>`: the text reads the same, but neither the
            // server's call parser nor a later prompt takes it for the tag.
            piece.splice(at..at, "\u{2060}".bytes());
        }
        if self.decide_held(i) {
            return false;
        }
        self.fault.check(FaultPoint::Producing, self.usage.completion_tokens);
        let c = &mut self.choices[i];
        let scan = if c.constrained { c.text.push_constrained(&piece) } else { c.text.push(&piece) };
        if scan.stopped {
            self.send_delta(index, scan.emit, logprobs);
            self.send_stop_sequence(i);
            self.finish_choice(i, FinishReason::Stop);
            false
        } else if c.generated >= self.max_tokens || c.pos >= ctx_size {
            let tail = c.text.finish();
            let reason = if tail.stopped { FinishReason::Stop } else { FinishReason::Length };
            self.send_delta(index, scan.emit + &tail.emit, logprobs);
            if tail.stopped {
                self.send_stop_sequence(i);
            }
            self.finish_choice(i, reason);
            false
        } else {
            self.send_delta(index, scan.emit, logprobs);
            true
        }
    }

    pub(crate) fn send_reasoning(&self, i: usize, text: String) {
        if !text.is_empty() {
            let _ = self.events.send(Event::Reasoning { choice: self.choices[i].index, text });
        }
    }

    /// Records latency metrics for a token choice `i` just produced.
    pub(crate) fn token_produced(&mut self, i: usize) {
        let now = Instant::now();
        match self.choices[i].last_token_at.replace(now) {
            None => crate::telemetry::first_token(now - self.submitted_at),
            Some(prev) => crate::telemetry::inter_token(now - prev),
        }
    }
}
