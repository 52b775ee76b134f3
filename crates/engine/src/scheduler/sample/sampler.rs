//! Per-choice samplers for OpenAI's sampling parameters, and logprobs. The draw itself is in
//! `draw` (see docs/sampling.md): it reads the logits in place, never copying them into a
//! candidate array nor sorting the vocabulary.

use std::collections::{BTreeMap, VecDeque};

use llguidance::Matcher;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::model::LoadedModel;
use crate::request::{SamplingParams, TokenLogprob, TopLogprob};
use crate::scheduler::sample::draw::{self, Adjusted, Scratch};

/// The RNG seed of choice `choice`: `seed` when given (each choice of an `n > 1` request its
/// own stream), else a random one.
pub(crate) fn seed_for_choice(seed: Option<u64>, choice: u32) -> u64 {
    let base = seed.unwrap_or_else(rand_seed);
    base.wrapping_add(u64::from(choice).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

fn rand_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
    h.finish()
}

/// A choice's sampler, in OpenAI's order: logit bias and presence/frequency penalties are added
/// to the logits, the grammar (if any) forbids tokens, top-k keeps the highest logits, the
/// temperature divides, top-p keeps the nucleus of the *tempered* distribution (of the top-k
/// when both are set, as llama.cpp and vLLM order them), then one token is drawn. Temperature 0 is greedy: the
/// first highest (adjusted) logit, fully deterministic.
pub(crate) struct Sampler {
    temperature: f32,
    top_p: f32,
    top_k: u32,
    /// Logit bias by token, sorted, each token once.
    bias: Vec<(u32, f32)>,
    penalties: Option<Penalties>,
    grammar: Option<Matcher>,
    /// Tokens taken next whatever the logits say (a thinking block's markers).
    forced: VecDeque<u32>,
    /// Decides at the next token (see [`Sampler::gate`]).
    gate: Option<AnswerGate>,
    /// What the gate decided, until the scheduler takes it.
    pub(crate) gate_outcome: Option<GateOutcome>,
    /// Why the grammar could not say which tokens may come next (llguidance's limits on one
    /// step's work, reached by a huge schema): the token sampled with it is not the grammar's,
    /// and the scheduler ends the request instead of producing it.
    pub(crate) grammar_failed: Option<String>,
    rng: Xoshiro256PlusPlus,
    /// This step's bias and penalties merged, by token.
    deltas: Vec<(u32, f32)>,
    scratch: Scratch,
}

/// Where a `response_format` meets `auto` tools, the model, not the grammar, says whether it
/// answers or calls: the first token is its own pick, unmasked. The tool-call tag, or a token
/// that may open a bare or fenced JSON call, is taken as it is (the scheduler then watches whether a call
/// follows, see `answer_gate`); anything else is an answer, held to the answer's grammar from
/// this token on. A grammar of answer-or-call from the first token instead forbids the prose the
/// model meant and leaves the call allowed: "Name one colour." became a weather call.
struct AnswerGate {
    tag: u32,
    /// Bit `t` set: token `t`'s text may open a call (`{`, `[`, a fence's backtick, whitespace).
    call_starts: std::sync::Arc<Vec<u32>>,
    answer: Matcher,
}

/// What the first token under an [`AnswerGate`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GateOutcome {
    /// The model's own pick may start a call: taken unconstrained.
    MayCall,
    /// An answer: sampled under the answer's grammar.
    Answer,
}

/// Presence and frequency penalties over the last `window` sampled tokens.
struct Penalties {
    presence: f32,
    frequency: f32,
    window: usize,
    recent: VecDeque<u32>,
    counts: BTreeMap<u32, u32>,
}

impl Penalties {
    fn push(&mut self, token: u32) {
        if self.recent.len() == self.window {
            if let Some(old) = self.recent.pop_front() {
                if let Some(n) = self.counts.get_mut(&old) {
                    *n -= 1;
                    if *n == 0 {
                        self.counts.remove(&old);
                    }
                }
            }
        }
        self.recent.push_back(token);
        *self.counts.entry(token).or_insert(0) += 1;
    }

    fn delta(&self, count: u32) -> f32 {
        -(count as f32 * self.frequency + self.presence)
    }
}

impl Sampler {
    /// Picks the next token from one position's logits (`n_vocab` of them) and records it.
    pub(crate) fn sample(&mut self, logits: &[f32]) -> i32 {
        if let Some(token) = self.forced.pop_front() {
            self.accept(token);
            return token as i32;
        }
        if let Some(gate) = self.gate.take() {
            let own = self.pick(logits, false);
            let word = gate.call_starts.get(own as usize / 32).copied().unwrap_or(0);
            if own == gate.tag || (word >> (own % 32)) & 1 == 1 {
                self.gate_outcome = Some(GateOutcome::MayCall);
                self.accept(own);
                return own as i32;
            }
            self.gate_outcome = Some(GateOutcome::Answer);
            self.grammar = Some(gate.answer);
        }
        if self.temperature <= 0.0 && self.bias.is_empty() && self.penalties.is_none() && self.grammar.is_none() {
            return crate::units::token_id(draw::first_argmax(logits));
        }
        let token = self.pick(logits, true);
        self.accept(token);
        token as i32
    }

    /// The next token, not yet recorded in the penalties nor the grammar; `masked`: as the
    /// grammar allows.
    fn pick(&mut self, logits: &[f32], masked: bool) -> u32 {
        // A finished grammar allows only the end of generation. One in error masks nothing
        // here, but is reported: its request ends rather than going on unconstrained.
        let mask = match self.grammar.as_mut().filter(|_| masked).map(Matcher::compute_mask_or_eos) {
            Some(Ok(mask)) => Some(mask),
            Some(Err(e)) => {
                self.grammar_failed.get_or_insert_with(|| crate::constraint::reason(&e.to_string()));
                None
            }
            None => None,
        };
        self.merge_deltas();
        let adjusted = Adjusted { raw: logits, deltas: &self.deltas, allowed: mask.as_ref().map(|m| m.as_slice()) };
        let drawn = if self.temperature > 0.0 {
            let u = (self.rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
            draw::draw(
                &adjusted,
                draw::Cut { temperature: self.temperature, top_p: self.top_p, top_k: self.top_k },
                u,
                &mut self.scratch,
            )
        } else {
            None
        };
        drawn.unwrap_or_else(|| draw::greedy(&adjusted, &mut self.scratch))
    }

    /// From now on tokens are sampled under `grammar`, whose state already holds the output so
    /// far (a tool call the model started); the penalties keep counting what came before.
    pub(crate) fn constrain(&mut self, grammar: Matcher) {
        self.grammar = Some(grammar);
    }

    /// The next token decides between an answer (under `answer`) and a possible call: see
    /// [`AnswerGate`].
    pub(crate) fn gate(&mut self, tag: i32, call_starts: std::sync::Arc<Vec<u32>>, answer: Matcher) {
        self.gate = u32::try_from(tag).ok().map(|tag| AnswerGate { tag, call_starts, answer });
    }

    /// A copy of the grammar's state, for the drafter to follow.
    pub(crate) fn grammar_copy(&self) -> Option<Matcher> {
        self.grammar.as_ref().map(Matcher::deep_clone)
    }

    /// The next samples are `tokens`, in order (their logits are not read).
    pub(crate) fn force(&mut self, tokens: &[i32]) {
        self.forced.extend(tokens.iter().filter_map(|&t| u32::try_from(t).ok()));
    }

    fn accept(&mut self, token: u32) {
        if let Some(p) = self.penalties.as_mut() {
            p.push(token);
        }
        if let Some(g) = self.grammar.as_mut() {
            // A stopped matcher is poisoned by another token (as llama.cpp's sampler skips it).
            if !g.is_stopped() {
                let _ = g.consume_token(token);
            }
        }
    }

    fn merge_deltas(&mut self) {
        self.deltas.clear();
        let Some(p) = &self.penalties else {
            self.deltas.extend_from_slice(&self.bias);
            return;
        };
        let mut bias = self.bias.iter().copied().peekable();
        for (&t, &n) in &p.counts {
            while let Some(&(b, d)) = bias.peek() {
                if b > t {
                    break;
                }
                bias.next();
                if b < t {
                    self.deltas.push((b, d));
                } else {
                    self.deltas.push((t, d + p.delta(n)));
                }
            }
            if self.deltas.last().is_none_or(|&(last, _)| last != t) {
                self.deltas.push((t, p.delta(n)));
            }
        }
        self.deltas.extend(bias);
    }
}

/// Builds choice `choice`'s sampler. `penalty_window` is how many recent sampled tokens the
/// penalties count; `grammar`, when given, forbids every token it does not allow.
pub(crate) fn build_sampler(
    params: &SamplingParams,
    choice: u32,
    penalty_window: i32,
    grammar: Option<Matcher>,
) -> Sampler {
    let mut bias: BTreeMap<u32, f32> = BTreeMap::new();
    for &(t, b) in &params.logit_bias {
        if let Ok(t) = u32::try_from(t) {
            *bias.entry(t).or_insert(0.0) += b;
        }
    }
    let penalties = (params.presence_penalty != 0.0 || params.frequency_penalty != 0.0).then(|| Penalties {
        presence: params.presence_penalty,
        frequency: params.frequency_penalty,
        window: penalty_window.max(1) as usize,
        recent: VecDeque::new(),
        counts: BTreeMap::new(),
    });
    Sampler {
        temperature: params.temperature,
        top_p: params.top_p,
        top_k: params.top_k,
        bias: bias.into_iter().collect(),
        penalties,
        grammar,
        forced: VecDeque::new(),
        gate: None,
        gate_outcome: None,
        grammar_failed: None,
        rng: Xoshiro256PlusPlus::seed_from_u64(seed_for_choice(params.seed, choice)),
        deltas: Vec::new(),
        scratch: Scratch::default(),
    }
}

/// OpenAI reports logprobs of the model's distribution (before sampling settings).
pub(crate) fn logprobs_for(model: &LoadedModel, logits: &[f32], chosen: i32, top_n: u32) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_sum = logits.iter().map(|&l| (l - max).exp()).sum::<f32>().ln() + max;
    let entry = |id: i32| {
        let bytes = model.piece(id);
        (String::from_utf8_lossy(&bytes).into_owned(), bytes, logits[id as usize] - log_sum)
    };
    let mut top = Vec::new();
    if top_n > 0 {
        let mut ids: Vec<i32> = (0..crate::units::token_id(logits.len())).collect();
        let k = (top_n as usize).min(ids.len());
        ids.select_nth_unstable_by(k - 1, |&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        ids.truncate(k);
        ids.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        top = ids
            .into_iter()
            .map(|id| {
                let (token, bytes, logprob) = entry(id);
                TopLogprob { id, token, bytes, logprob }
            })
            .collect();
    }
    let (token, bytes, logprob) = entry(chosen);
    TokenLogprob { id: chosen, token, bytes, logprob, top }
}

#[cfg(test)]
#[path = "sampler_tests.rs"]
pub(crate) mod tests;
