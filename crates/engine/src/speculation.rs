//! Speculative decoding without a draft model: prompt lookup, and jump-forward under a grammar.
//!
//! Code edits, quotes and structured answers repeat long runs of tokens that are already in the
//! prompt or earlier in the output. For each decoding choice the drafter looks for the longest
//! earlier occurrence of the output's last tokens and proposes the tokens that followed it. The
//! scheduler feeds the choice's token plus the draft at consecutive positions of the same batch as
//! every other sequence, then walks them: at each position it samples with the choice's own
//! sampler and keeps the draft token only if the sampled token is the same one. Every produced
//! token is therefore sampled from exactly the distribution (and with the same single random
//! draw) that decoding one token at a time would use: the output follows the same distribution,
//! and at temperature 0 it is the same text up to floating-point rounding; only the number of
//! decode steps changes. Seeded sampling decodes one token at a time (`for_request`).
//!
//! Verifying k draft tokens is not free on a CPU (a batch of k+1 tokens costs more than one, by
//! how much depends on the CPU and the model), so drafting weighs cost against gain each step: each
//! choice estimates how likely its draft tokens are to be accepted, the scheduler measures what
//! each extra position in a step costs (`step_cost`), and a draft is fed only as far as it is
//! expected to produce more tokens per second than not drafting. Nobody drafts once enough
//! sequences are decoding that the batch is compute-bound.
//!
//! Under a grammar (a JSON schema, a tool call) the drafter first asks what the grammar forces
//! next: keys, punctuation and enum tails allow one tokenization only, so the sampler could pick
//! nothing else and those drafts are always accepted, at any load (jump-forward, verified the
//! same way, so constrained output is also unchanged).

use std::sync::atomic::{AtomicU64, Ordering};

use llguidance::Matcher;
use metrics::counter;

use crate::json_layout::{JsonMarks, Value};
use crate::request::SamplingParams;
use crate::shared_drafts::{common_prefix, SharedDrafts};

/// Whether the engine drafts tokens; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speculate {
    /// Draft where it pays: as far as a draft is expected to save more time than verifying it
    /// costs on this machine, and not under load.
    Auto,
    /// Feed every proposal in full (up to `draft_max`) without weighing its cost, for every
    /// request (seeded sampling included), still not under load: for hardware where verifying
    /// is known to be cheap, and for tests that need drafts to be verified.
    Always,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpeculationConfig {
    pub mode: Speculate,
    /// Most draft tokens one choice verifies in one step.
    pub draft_max: u32,
}

impl Default for SpeculationConfig {
    fn default() -> Self {
        Self { mode: Speculate::Auto, draft_max: 8 }
    }
}

impl SpeculationConfig {
    /// What one request gets. Under `auto` a request that asks for reproducible sampling (a
    /// `seed` at temperature > 0) decodes one token at a time: a position verified inside a
    /// multi-token batch gets logits that differ in the last bits from one decoded alone, and a
    /// random draw that lands on such a margin picks another token, after which the outputs part
    /// (measured: 1 run in a few of a 200-token seeded code edit). Which positions get batched
    /// depends on what the server learned before, so the same seeded request could come back
    /// different on the same server. Greedy requests keep speculation: only a near tie between
    /// the two best tokens could flip, and repeating the request repeats it. `always` drafts for
    /// every request.
    pub fn for_request(self, sampling: &SamplingParams) -> Self {
        let reproducible = sampling.seed.is_some() && sampling.temperature > 0.0;
        if self.mode == Speculate::Auto && reproducible {
            Self { mode: Speculate::Off, ..self }
        } else {
            self
        }
    }
}

/// With more choices decoding than this, nobody drafts: the batch already keeps the CPU's
/// arithmetic busy, and verified-then-rejected tokens would slow every stream.
pub(crate) const MAX_DRAFTING_STREAMS: usize = 2;

/// Shortest match (in tokens) of the output's tail that is trusted to predict what follows.
const MIN_MATCH: usize = 2;
/// Matches are compared back at most this far; longer ones are all equally convincing.
const MAX_MATCH: usize = 32;
/// Prompt tokens recorded before an answer for other requests to draft from.
const ANSWER_CONTEXT: usize = 4;
/// Weight left to earlier verifications in an acceptance estimate after each newer one.
const ACCEPTANCE_MEMORY: f64 = 0.98;
/// Weight left to them after each draft of that kind that was not fed: an estimate that stopped
/// drafting drifts back to its prior and gets probed again (text that stopped repeating its
/// context may start again).
const DECLINED_MEMORY: f64 = 0.995;
/// Upper bounds of the match-length classes acceptance is estimated for, and each class's prior
/// chance that a draft token is accepted: a draft that continues a long run copied from the
/// context is far likelier to be right than one that continues two matching tokens.
const MATCH_CLASSES: [(usize, f64); 7] =
    [(2, 0.5), (3, 0.6), (5, 0.7), (8, 0.8), (15, 0.85), (31, 0.9), (MAX_MATCH, 0.95)];
/// Prior chance of a draft token that other answers agree on (`Acceptance::agreed`).
const AGREED_PRIOR: f64 = 0.9;
/// Prior chance of a draft token quoted from the prompt under a grammar (`Acceptance::quoted`).
const QUOTED_PRIOR: f64 = 0.85;
/// Weight of the prior, in verified drafts.
const PRIOR_WEIGHT: f64 = 2.0;

/// Draft tokens proposed and accepted since start; shared with the engine handle.
#[derive(Debug, Default)]
pub struct SpeculationStats {
    drafted: AtomicU64,
    accepted: AtomicU64,
    forced: AtomicU64,
    forced_accepted: AtomicU64,
    shared: AtomicU64,
    shared_accepted: AtomicU64,
}

impl SpeculationStats {
    /// Draft tokens verified (each cost one position in a batch).
    pub fn drafted(&self) -> u64 {
        self.drafted.load(Ordering::Relaxed)
    }

    /// Draft tokens that were the sampled token, so a decode step was saved.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Grammar-forced tokens fed ahead as drafts (jump-forward).
    pub fn forced(&self) -> u64 {
        self.forced.load(Ordering::Relaxed)
    }

    /// Forced drafts that were the sampled token (all of them, unless the choice ended first).
    pub fn forced_accepted(&self) -> u64 {
        self.forced_accepted.load(Ordering::Relaxed)
    }

    /// Of the draft tokens, those copied from other requests' answers (`SharedDrafts`).
    pub fn shared(&self) -> u64 {
        self.shared.load(Ordering::Relaxed)
    }

    /// Of the accepted draft tokens, those copied from other requests' answers.
    pub fn shared_accepted(&self) -> u64 {
        self.shared_accepted.load(Ordering::Relaxed)
    }

    pub(crate) fn record_forced(&self, drafted: usize, accepted: usize) {
        self.forced.fetch_add(drafted as u64, Ordering::Relaxed);
        self.forced_accepted.fetch_add(accepted as u64, Ordering::Relaxed);
        counter!("gantry_forced_tokens_total", "model" => crate::telemetry::model()).increment(drafted as u64);
        counter!("gantry_forced_tokens_accepted_total", "model" => crate::telemetry::model())
            .increment(accepted as u64);
    }

    pub(crate) fn record(&self, drafted: usize, accepted: usize, source: DraftSource) {
        self.drafted.fetch_add(drafted as u64, Ordering::Relaxed);
        self.accepted.fetch_add(accepted as u64, Ordering::Relaxed);
        counter!("gantry_draft_tokens_total", "model" => crate::telemetry::model()).increment(drafted as u64);
        counter!("gantry_draft_tokens_accepted_total", "model" => crate::telemetry::model()).increment(accepted as u64);
        if source == DraftSource::Shared {
            self.shared.fetch_add(drafted as u64, Ordering::Relaxed);
            self.shared_accepted.fetch_add(accepted as u64, Ordering::Relaxed);
            counter!("gantry_draft_tokens_shared_total", "model" => crate::telemetry::model())
                .increment(drafted as u64);
            counter!("gantry_draft_tokens_shared_accepted_total", "model" => crate::telemetry::model())
                .increment(accepted as u64);
        }
    }
}

pub(crate) fn describe() {
    use metrics::{describe_counter, Unit};
    describe_counter!(
        "gantry_draft_tokens_total",
        Unit::Count,
        "Draft tokens (prompt lookup) verified in a batch; rejected ones are not billed."
    );
    describe_counter!(
        "gantry_draft_tokens_accepted_total",
        Unit::Count,
        "Draft tokens that matched the sampled token, each saving a decode step."
    );
    describe_counter!(
        "gantry_draft_tokens_shared_total",
        Unit::Count,
        "Of the draft tokens, those copied from recent answers to other requests."
    );
    describe_counter!(
        "gantry_draft_tokens_shared_accepted_total",
        Unit::Count,
        "Of the accepted draft tokens, those copied from recent answers to other requests."
    );
    describe_counter!(
        "gantry_forced_tokens_total",
        Unit::Count,
        "Tokens a grammar forces (JSON keys and punctuation), fed ahead in the same batch (jump-forward) and verified (not those after a rejected lookup draft)."
    );
    describe_counter!(
        "gantry_forced_tokens_accepted_total",
        Unit::Count,
        "Forced tokens that were produced, each saving a decode step."
    );
}

/// Where a lookup draft was copied from: acceptance is learned apart for each, since a match in
/// the choice's own context and one in another request's answer are not equally telling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DraftSource {
    /// The choice's own prompt and output.
    Own,
    /// Under a grammar, the choice's own output where it repeated itself (`Drafter::own_layout`).
    Agreed,
    /// Recent answers to other requests (`SharedDrafts`).
    Shared,
    /// Under a grammar, the choice's own prompt: a value quoted from the input (an extraction
    /// copies names, numbers and addresses from the text it was given).
    Quoted,
}

/// One choice's drafter: the tokens it may copy from (prompt and output so far) and how well
/// its drafts have been doing.
pub(crate) struct Drafter {
    history: Vec<i32>,
    /// How many of `history`'s tokens are the prompt.
    prompt_len: usize,
    /// A copy of the choice's grammar state (its sampler holds the other one), fed the same
    /// tokens, asked what the grammar forces next.
    grammar: Option<Matcher>,
    /// Which earlier answers it drafts from and joins (`DraftFamilies::family`).
    family: u64,
    /// Each prompt token's unspaced twin (`quote_unspaced`); empty unless under a grammar.
    unspaced: Vec<i32>,
    /// Under a grammar, where drafts copied from other values stop (`json_layout`).
    json: Option<JsonMarks>,
    max: usize,
    /// Length of the match the last proposal continues, and where it was found.
    matched: usize,
    source: DraftSource,
}

impl Drafter {
    pub(crate) fn new(prompt: &[i32], config: SpeculationConfig) -> Self {
        let max = match config.mode {
            Speculate::Auto | Speculate::Always => config.draft_max as usize,
            Speculate::Off => 0,
        };
        Self {
            // Only a drafter that may draft needs the tokens to copy from.
            history: if max > 0 { prompt.to_vec() } else { Vec::new() },
            prompt_len: prompt.len(),
            grammar: None,
            family: 0,
            unspaced: Vec::new(),
            json: None,
            max,
            matched: 0,
            source: DraftSource::Own,
        }
    }

    /// The choice drafts from, and joins, the earlier answers of `family`.
    pub(crate) fn join_family(&mut self, family: u64) {
        self.family = family;
    }

    pub(crate) fn family(&self) -> u64 {
        self.family
    }

    /// The choice answers under a grammar: runs copied from its prompt are quoted values
    /// (`DraftSource::Quoted`), drafted from their first token on (`quote_start`) with the
    /// prompt's tokens written without their leading space (`LoadedModel::unspaced`).
    pub(crate) fn quote_unspaced(&mut self, unspaced: Vec<i32>) {
        if self.max > 0 {
            self.unspaced = unspaced;
        }
    }

    /// The choice answers in JSON: a draft copied from the output (its own or an earlier
    /// answer's) stops where a value starts, since that value is another one's (see
    /// `json_layout`); quotes from the prompt do not.
    pub(crate) fn draft_json_layout(&mut self, marks: JsonMarks) {
        if self.max > 0 {
            self.json = Some(marks);
        }
    }

    /// Where a value quoted from the prompt most likely ends, the drafts go on with the token
    /// that closed the answer's last value of its kind (`",\n` after a string, `,\n` after a
    /// number), so one step can carry the value's end, its close and, chained after it, the
    /// next key. A string most likely ends where the sentence's phrase does (before `.`, `,`,
    /// `)`); a number where the grammar cut the quote (before ` years`). `copied` is how much
    /// of the prompt the quote took before the grammar cut it to `draft`.
    fn close_quote(&mut self, mut draft: Vec<i32>, copied: usize, limit: usize) -> Vec<i32> {
        let Some(marks) = self.json.clone() else { return draft };
        // The prompt may hold JSON of its own (tool schemas): only the answer's is read.
        let output = &self.history[self.prompt_len.min(self.history.len())..];
        let ended = match marks.value_at_end(output) {
            Some(Value::String) => match draft.iter().position(|&t| marks.ends_phrase(t)) {
                Some(end) => {
                    draft.truncate(end);
                    Some(Value::String)
                }
                None => None,
            },
            Some(Value::Other) => (draft.len() < copied).then_some(Value::Other),
            None => None,
        };
        if let Some(closer) = ended.filter(|_| draft.len() < limit).and_then(|value| marks.last_closer(output, value)) {
            draft.push(closer);
            draft = self.usable(draft);
        }
        draft
    }

    /// How much of `draft`, copied from the output, is layout before a value (all of it unless
    /// the choice answers in JSON).
    fn layout_only(&self, draft: &[i32]) -> usize {
        self.json.as_ref().map_or(draft.len(), |marks| marks.before_value(&self.history, draft))
    }

    /// The choice is sampled under `matcher`'s grammar from now on (its state already holds the
    /// output so far); returns the matcher for the sampler, keeping a copy to draft from.
    pub(crate) fn follow_grammar(&mut self, matcher: Matcher) -> Matcher {
        self.grammar = (self.max > 0).then(|| matcher.deep_clone());
        matcher
    }

    /// A token the choice produced.
    pub(crate) fn push(&mut self, token: i32) {
        if self.max > 0 {
            self.history.push(token);
        }
        if let Some(g) = self.grammar.as_mut() {
            // A stopped matcher is poisoned by another token; the sampler's copy skips it too.
            if g.is_stopped() || g.consume_token(token as u32).is_err() {
                self.grammar = None;
            }
        }
    }

    /// Up to `limit` tokens the grammar allows only one way after the output so far (a key, a
    /// `":`, the rest of an enum value), as the model's tokenizer writes them: the choice's
    /// sampler can then pick nothing else, so verifying them never wastes a position. Unlike
    /// lookup drafts they pay at any load: each saves a whole decode step of this stream.
    pub(crate) fn forced(&mut self, limit: usize) -> Vec<i32> {
        let Some(g) = self.grammar.as_mut() else { return Vec::new() };
        if limit == 0 || g.is_stopped() {
            return Vec::new();
        }
        let mut tokens: Vec<i32> = g.compute_ff_tokens().into_iter().map(|t| t as i32).collect();
        tokens.truncate(limit);
        tokens
    }

    /// Up to `limit` tokens expected to follow the output so far (empty when nothing earlier
    /// matches convincingly), cut where the grammar, if any, forbids one: the sampler would
    /// reject it and everything after it. Copied from the choice's own prompt and output, or,
    /// where an earlier answer in `shared` follows more of the output's last tokens, from that
    /// answer. How many of them are worth verifying is the scheduler's call (`Acceptance`,
    /// `StepCost`).
    pub(crate) fn propose(&mut self, limit: usize, shared: &SharedDrafts) -> Vec<i32> {
        let limit = limit.min(self.max);
        if limit == 0 {
            return Vec::new();
        }
        // Under a grammar a run copied from the prompt is a quoted value, right far more often
        // than a repeat of the output's own values (see `Acceptance::quoted`).
        let quoted = |start: usize| !self.unspaced.is_empty() && start < self.prompt_len;
        // A quoted word matches the prompt's spaced twin too (`"john` after `to john`).
        let same = |earlier: usize, token: i32| {
            self.history[earlier] == token || self.unspaced.get(earlier).is_some_and(|&u| u == token)
        };
        let mut best = longest_match(&self.history, same)
            .map(|(start, matched)| {
                (start, matched, if quoted(start) { DraftSource::Quoted } else { DraftSource::Own })
            })
            .or_else(|| self.quote_start().map(|start| (start, 1, DraftSource::Quoted)))
            .and_then(|(start, matched, source)| {
                // A quote ends with the prompt (the chat template's closing tokens, then output).
                let until = if source == DraftSource::Quoted { self.prompt_len } else { self.history.len() };
                let mut end = (start + limit).min(until);
                if source == DraftSource::Own {
                    end = start + self.layout_only(&self.history[start..end]);
                }
                let mut draft = self.usable(self.history[start..end].to_vec());
                if source == DraftSource::Quoted {
                    draft = self.close_quote(draft, end - start, limit);
                }
                (!draft.is_empty()).then_some((draft, matched, source))
            });
        // Under a grammar one matching token is enough to look across answers: the grammar then
        // tells the candidates apart (after `",\n  "` only the schema's next key is allowed).
        let min_shared = if self.grammar.is_some() { 1 } else { MIN_MATCH };
        let own_matched = best.as_ref().map_or(0, |b| b.1);
        // A value quoted from the prompt goes on as the prompt does, not as an earlier answer's
        // value that began alike ("john.s..." after "john" in another customer's email).
        let quoting = matches!(best, Some((_, _, DraftSource::Quoted)));
        if own_matched < MAX_MATCH && !quoting {
            for candidate in shared.candidates(&self.history, min_shared.max(own_matched + 1)) {
                // Under a grammar only what another answer agrees on: the schema's layout, not
                // the earlier answer's values (see `Candidate::agreed`).
                let usable_len = if self.grammar.is_some() {
                    let agreed = candidate.agreed.max(self.own_agreement(candidate.tokens));
                    self.layout_only(&candidate.tokens[..agreed.min(candidate.tokens.len())])
                } else {
                    candidate.tokens.len()
                };
                let tokens = &candidate.tokens[..usable_len.min(limit)];
                let draft = self.usable(tokens.to_vec());
                // Longest match first; among equals the draft the grammar lets run furthest.
                let better = match &best {
                    None => true,
                    Some((d, m, DraftSource::Shared)) => candidate.matched == *m && draft.len() > d.len(),
                    Some(_) => true,
                };
                if !draft.is_empty() && better {
                    best = Some((draft, candidate.matched, DraftSource::Shared));
                }
                if self.grammar.is_none() && best.is_some() {
                    break;
                }
            }
        }
        if best.is_none() && self.grammar.is_some() {
            best = self.own_layout(limit).map(|draft| (draft, 1, DraftSource::Agreed));
        }
        let Some((draft, matched, source)) = best else { return Vec::new() };
        self.matched = matched;
        self.source = source;
        draft
    }

    /// Where the prompt goes on after the value the output just opened, if it quotes one: the
    /// prompt writes a word spaced (`" Osaka"` after "in"), the value writes it unspaced after
    /// its opening quote (`"Os"`), so no two tokens match before its third token. One token is
    /// match enough where the prompt holds its spaced twin once and never the token itself.
    fn quote_start(&self) -> Option<usize> {
        let (&last, _) = self.history.split_last()?;
        if self.unspaced.is_empty() || self.history.len() <= self.prompt_len {
            return None;
        }
        let prompt = &self.history[..self.prompt_len];
        let mut twins = self.unspaced.iter().enumerate().filter(|&(i, &u)| u == last && prompt[i] != last);
        let (at, _) = twins.next()?;
        (twins.next().is_none() && !prompt.contains(&last)).then_some(at + 1)
    }

    /// How many of `tokens` the choice's own context also continued with after its last token
    /// (an answer repeats its layout between keys), so that an earlier answer's draft counts as
    /// agreed on even where no third answer was there to agree.
    fn own_agreement(&self, tokens: &[i32]) -> usize {
        let Some((&last, before)) = self.history.split_last() else { return 0 };
        (0..before.len())
            .filter(|&i| before[i] == last)
            .map(|i| common_prefix(tokens, &self.history[i + 1..]))
            .max()
            .unwrap_or(0)
    }

    /// Under a grammar with no earlier answer to copy: what followed the last token the last
    /// time the choice wrote it, as far as an earlier occurrence agrees (the first answer to a
    /// schema writes `",\n  "` after every string value; its values differ).
    fn own_layout(&mut self, limit: usize) -> Option<Vec<i32>> {
        let (&last, before) = self.history.split_last()?;
        let mut seen = (0..before.len()).rev().filter(|&i| before[i] == last);
        let newest = seen.next()?;
        let continuation = &self.history[newest + 1..];
        let agreed = seen.map(|i| common_prefix(continuation, &self.history[i + 1..])).max()?;
        let layout = self.layout_only(&continuation[..agreed.min(limit)]);
        let draft = self.usable(continuation[..layout].to_vec());
        (!draft.is_empty()).then_some(draft)
    }

    /// What to feed after the choice's token this step: what the grammar forces, then what is
    /// expected to follow it, then what the grammar forces after that, and so on, up to `limit`
    /// tokens of which at most `lookup_limit` are lookup drafts (forced tokens pay at any load,
    /// lookups only while few streams decode). One step can then carry a JSON key, the `": "`
    /// every earlier answer wrote after it, and the value's first token, where one kind of
    /// draft alone would stop at the first token the other one knows. Each lookup run records
    /// the match it continues and its source.
    pub(crate) fn chain(&mut self, limit: usize, lookup_limit: usize, shared: &SharedDrafts) -> Chain {
        let mut chain = Chain::default();
        let base = self.history.len();
        let mut lookups = 0;
        while chain.tokens.len() < limit {
            let forced = self.forced(limit - chain.tokens.len());
            self.advance(&forced);
            chain.push_forced(&forced);
            let room = (limit - chain.tokens.len()).min(lookup_limit - lookups);
            let lookup = self.propose(room, shared);
            if lookup.is_empty() {
                break;
            }
            self.advance(&lookup);
            lookups += lookup.len();
            chain.push_lookup(&lookup, self.matched, self.source);
            // Without a grammar nothing is forced after a lookup, and another lookup would
            // only continue the same match.
            if self.grammar.as_ref().is_none_or(Matcher::is_stopped) {
                break;
            }
        }
        self.retreat(base, chain.tokens.len());
        chain
    }

    /// Takes `tokens` as if produced, to draft further after them (`retreat` undoes it).
    fn advance(&mut self, tokens: &[i32]) {
        if tokens.is_empty() {
            return;
        }
        if self.max > 0 {
            self.history.extend_from_slice(tokens);
        }
        if let Some(g) = self.grammar.as_mut() {
            let ids: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
            // Drafts were checked against the grammar: a failure means its state is unknown
            // (the sampler keeps its own copy), so this choice drafts without it from now on.
            if g.consume_tokens(&ids).is_err() {
                self.grammar = None;
            }
        }
    }

    /// Undoes `advance`s of `n` tokens in all, leaving the history at `len` tokens.
    fn retreat(&mut self, len: usize, n: usize) {
        self.history.truncate(len);
        if let Some(g) = self.grammar.as_mut() {
            if n > 0 && g.rollback(n).is_err() {
                self.grammar = None;
            }
        }
    }

    /// `draft` up to what can be fed: never an image position, never past what the grammar
    /// allows.
    fn usable(&mut self, mut draft: Vec<i32>) -> Vec<i32> {
        // An image's positions stand in the prompt as negative ids (see `vision`): never tokens.
        if let Some(image) = draft.iter().position(|&t| t < 0) {
            draft.truncate(image);
        }
        if let Some(g) = self.grammar.as_mut() {
            let ids: Vec<u32> = draft.iter().map(|&t| t as u32).collect();
            draft.truncate(g.validate_tokens(&ids).unwrap_or(0));
        }
        draft
    }

    /// Length of the earlier match the last proposal continues.
    #[cfg(test)]
    pub(crate) fn matched(&self) -> usize {
        self.matched
    }

    /// Where the last proposal was copied from.
    #[cfg(test)]
    pub(crate) fn source(&self) -> DraftSource {
        self.source
    }

    /// What this choice leaves for other requests to draft from (`SharedDrafts::record`): its
    /// output, after the last few prompt tokens (the template's opening of an answer).
    pub(crate) fn answer(&self) -> &[i32] {
        &self.history[self.prompt_len.saturating_sub(ANSWER_CONTEXT).min(self.history.len())..]
    }
}

/// The drafts of one step (`Drafter::chain`), each forced by the grammar (the sampler can pick
/// nothing else there) or part of a lookup.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Chain {
    pub tokens: Vec<i32>,
    pub forced: Vec<bool>,
    /// The lookup drafts' runs, in order.
    pub lookups: Vec<Lookup>,
}

/// One run of lookup drafts in a chain: where it starts, how long it is, the length of the
/// match it continues and where it was copied from (which acceptance estimate it uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lookup {
    pub start: usize,
    pub len: usize,
    pub matched: usize,
    pub source: DraftSource,
}

impl Chain {
    fn push_forced(&mut self, tokens: &[i32]) {
        self.tokens.extend_from_slice(tokens);
        self.forced.extend(std::iter::repeat_n(true, tokens.len()));
    }

    fn push_lookup(&mut self, tokens: &[i32], matched: usize, source: DraftSource) {
        self.lookups.push(Lookup { start: self.tokens.len(), len: tokens.len(), matched, source });
        self.tokens.extend_from_slice(tokens);
        self.forced.extend(std::iter::repeat_n(false, tokens.len()));
    }

    /// Leading tokens that are forced: they are fed whatever lookups are worth.
    pub(crate) fn forced_prefix(&self) -> usize {
        self.forced.iter().take_while(|&&f| f).count()
    }

    /// Tokens a choice is expected to produce from its token plus the first `k` drafts, when
    /// each token of a lookup run is accepted with the run's `chance` and forced ones always
    /// are (acceptance ends at the first miss).
    pub(crate) fn expected_tokens(&self, k: usize, chance: impl Fn(&Lookup) -> f64) -> f64 {
        let mut run = 1.0;
        let mut total = 1.0;
        let mut lookups = self.lookups.iter().peekable();
        for i in 0..k {
            if !self.forced[i] {
                while lookups.peek().is_some_and(|l| l.start + l.len <= i) {
                    lookups.next();
                }
                run *= lookups.peek().map_or(0.0, |l| chance(l));
            }
            total += run;
        }
        total
    }

    /// Of the first `k` drafts, how many were forced.
    pub(crate) fn forced_within(&self, k: usize) -> usize {
        self.forced[..k].iter().filter(|&&f| f).count()
    }

    pub(crate) fn truncate(&mut self, k: usize) {
        self.tokens.truncate(k);
        self.forced.truncate(k);
        self.lookups.retain(|l| l.start < k);
        if let Some(last) = self.lookups.last_mut() {
            last.len = last.len.min(k - last.start);
        }
    }
}

/// How likely lookup draft tokens are to be accepted, by the length of the match they continue,
/// learned from every verification (decayed counts per class): each draft token is taken as
/// accepted with probability accepted / (accepted + rejected), the estimate for a run of
/// independent trials that ends at the first miss.
#[derive(Debug, Clone)]
pub(crate) struct Acceptance {
    accepted: [f64; MATCH_CLASSES.len()],
    rejected: [f64; MATCH_CLASSES.len()],
    /// Each class's chance before anything was verified.
    prior: [f64; MATCH_CLASSES.len()],
}

impl Default for Acceptance {
    fn default() -> Self {
        Self {
            accepted: [0.0; MATCH_CLASSES.len()],
            rejected: [0.0; MATCH_CLASSES.len()],
            prior: MATCH_CLASSES.map(|(_, prior)| prior),
        }
    }
}

impl Acceptance {
    /// For drafts that several earlier answers agree on (`Candidate::agreed`): under a grammar
    /// that is a schema's layout, right nearly every time however short the match. With the
    /// short-match prior of free text (a coin flip) they would never be fed, so never learned.
    pub(crate) fn agreed() -> Self {
        Self { prior: [AGREED_PRIOR; MATCH_CLASSES.len()], ..Self::default() }
    }

    /// For runs a constrained answer copies from its own prompt (`DraftSource::Quoted`): a JSON
    /// value filled from the given text (`"john.haddad@example.com"`, `"WEB-48565"`, `255.93`)
    /// goes on as the text does once it matches (from its first token, `Drafter::quote_start`),
    /// where a short match in free text is a coin flip. Under the free-text prior they were
    /// declined, one decode step per token.
    pub(crate) fn quoted() -> Self {
        Self { prior: [QUOTED_PRIOR; MATCH_CLASSES.len()], ..Self::default() }
    }
}

impl Acceptance {
    fn class(matched: usize) -> usize {
        MATCH_CLASSES.iter().position(|&(upto, _)| matched <= upto).unwrap_or(MATCH_CLASSES.len() - 1)
    }

    /// Chance that one draft token continuing a `matched`-token match is accepted.
    pub(crate) fn chance(&self, matched: usize) -> f64 {
        let c = Self::class(matched);
        let prior = self.prior[c];
        (self.accepted[c] + PRIOR_WEIGHT * prior) / (self.accepted[c] + self.rejected[c] + PRIOR_WEIGHT)
    }

    /// Tokens a choice is expected to produce in one step from its token plus `k` drafts that
    /// continue a `matched`-token match.
    #[cfg(test)]
    pub(crate) fn expected_tokens(&self, matched: usize, k: usize) -> f64 {
        let p = self.chance(matched);
        (0..=k).map(|j| p.powi(i32::try_from(j).unwrap_or(i32::MAX))).sum()
    }

    /// A draft of `drafted` tokens continuing a `matched`-token match had `accepted` taken.
    pub(crate) fn verified(&mut self, matched: usize, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let c = Self::class(matched);
        self.accepted[c] = self.accepted[c] * ACCEPTANCE_MEMORY + accepted as f64;
        self.rejected[c] = self.rejected[c] * ACCEPTANCE_MEMORY + if accepted < drafted { 1.0 } else { 0.0 };
    }

    /// A draft continuing a `matched`-token match was not worth feeding.
    pub(crate) fn declined(&mut self, matched: usize) {
        let c = Self::class(matched);
        self.accepted[c] *= DECLINED_MEMORY;
        self.rejected[c] *= DECLINED_MEMORY;
    }
}

/// Where the continuation of `history`'s tail starts, and how many tokens match: the index just
/// after the earlier occurrence that matches the most tokens before the end (at least
/// `MIN_MATCH`), the most recent one among equals.
/// `same(j, t)`: the token at `j` counts as `t`.
fn longest_match(history: &[i32], same: impl Fn(usize, i32) -> bool) -> Option<(usize, usize)> {
    let n = history.len();
    if n < MIN_MATCH + 1 {
        return None;
    }
    let last = history[n - 1];
    let mut best: Option<(usize, usize)> = None;
    // `i` is a candidate end of an earlier occurrence; it must leave a token to propose.
    for i in (0..n - 1).rev() {
        if !same(i, last) {
            continue;
        }
        let len = (1..=MAX_MATCH.min(i + 1)).take_while(|&d| same(i + 1 - d, history[n - d])).count();
        if len >= MIN_MATCH && best.is_none_or(|(_, l)| len > l) {
            best = Some((i + 1, len));
            if len == MAX_MATCH {
                break;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none() -> SharedDrafts {
        SharedDrafts::default()
    }

    fn auto(max: u32) -> SpeculationConfig {
        SpeculationConfig { mode: Speculate::Auto, draft_max: max }
    }

    #[test]
    fn under_auto_only_seeded_sampling_decodes_one_token_at_a_time() {
        let sampling = |temperature, seed| SamplingParams { temperature, seed, ..SamplingParams::default() };
        let mode = |config: SpeculationConfig, s| config.for_request(&s).mode;
        assert_eq!(mode(auto(8), sampling(0.8, Some(1))), Speculate::Off);
        assert_eq!(mode(auto(8), sampling(0.8, None)), Speculate::Auto);
        assert_eq!(mode(auto(8), sampling(0.0, Some(1))), Speculate::Auto, "greedy ignores the seed");
        let always = SpeculationConfig { mode: Speculate::Always, draft_max: 8 };
        assert_eq!(mode(always, sampling(0.8, Some(1))), Speculate::Always);
    }

    #[test]
    fn proposes_what_followed_the_longest_earlier_match() {
        // "7 8 9" occurred once, followed by 1 2 3; "9" alone also occurred later (followed by 5).
        let mut d = Drafter::new(&[7, 8, 9, 1, 2, 3, 4, 9, 5, 6, 7, 8], auto(8));
        d.push(9);
        assert_eq!(d.propose(3, &none()), [1, 2, 3]);
        assert_eq!(d.propose(1, &none()), [1]);
    }

    #[test]
    fn an_earlier_answer_is_copied_where_it_matches_more_than_the_own_context() {
        let mut shared = SharedDrafts::default();
        shared.record(&[40, 41, 7, 8, 9, 50, 51, 52]);
        // Own context: "8 9" followed by 1 2 (a 2-token match); the earlier answer follows
        // "7 8 9" (3 tokens).
        let mut d = Drafter::new(&[8, 9, 1, 2, 7, 8], auto(8));
        d.push(9);
        assert_eq!(d.propose(8, &shared), [50, 51, 52]);
        assert_eq!((d.matched(), d.source()), (3, DraftSource::Shared));
        // Where the own context matches at least as much, it wins.
        let mut d = Drafter::new(&[7, 8, 9, 1, 2, 7, 8], auto(8));
        d.push(9);
        assert_eq!(d.propose(8, &shared), [1, 2, 7, 8, 9]);
        assert_eq!((d.matched(), d.source()), (3, DraftSource::Own));
        // Its answer, with the last prompt tokens before it, is what the choice leaves behind.
        let mut d = Drafter::new(&[1, 2, 3, 4, 5, 6], auto(8));
        d.push(60);
        d.push(61);
        assert_eq!(d.answer(), [3, 4, 5, 6, 60, 61]);
    }

    #[test]
    fn a_constrained_answer_quotes_its_prompt_from_a_values_first_token() {
        // The prompt writes ` john` (21) after `to` (10); the value opens with `"` (2) and the
        // unspaced `john` (31), so no two tokens match yet.
        let prompt = [5, 10, 21, 22, 23, 11];
        let quoting = |prompt: &[i32]| {
            let mut d = Drafter::new(prompt, auto(8));
            d.quote_unspaced(prompt.iter().map(|&t| if t == 21 { 31 } else { t }).collect());
            d
        };
        let mut d = quoting(&prompt);
        d.push(2);
        d.push(31);
        assert_eq!(d.propose(8, &none()), [22, 23, 11]);
        assert_eq!((d.matched(), d.source()), (1, DraftSource::Quoted));
        // Further on, an ordinary match in the prompt is a quote too.
        d.push(22);
        assert_eq!(d.propose(8, &none()), [23, 11]);
        assert_eq!((d.matched(), d.source()), (2, DraftSource::Quoted));
        // Ambiguous where the prompt writes the word twice, or also unspaced.
        let mut d = quoting(&[21, 22, 10, 21, 23]);
        d.push(31);
        assert!(d.propose(8, &none()).is_empty());
        let mut d = quoting(&[21, 22, 31, 23]);
        d.push(31);
        assert!(d.propose(8, &none()).is_empty());
        // Free text never trusts one token, and a match in its own output is no quote.
        let mut d = Drafter::new(&prompt, auto(8));
        d.push(2);
        d.push(31);
        assert!(d.propose(8, &none()).is_empty());
        let mut d = quoting(&prompt);
        for t in [40, 41, 42, 40, 41] {
            d.push(t);
        }
        assert_eq!(d.propose(8, &none()), [42, 40, 41]);
        assert_eq!(d.source(), DraftSource::Own);
    }

    #[test]
    fn a_quoted_string_ends_where_its_phrase_does_and_closes_as_the_last_one_did() {
        const VOCAB: &[&str] = &[
            "{", "\"", "city", "\":", " \"", "Osaka", " Osaka", ".", " On", "\",\n", " in", " John", "John", " Had",
            "dad", "name",
        ];
        let marks = JsonMarks::new(VOCAB.len(), |t| VOCAB[t as usize].as_bytes().to_vec());
        // "John Haddad. ... in Osaka. On"
        let prompt = [11, 13, 14, 7, 10, 6, 7, 8];
        let unspaced: Vec<i32> = prompt
            .iter()
            .map(|&t| match t {
                11 => 12,
                6 => 5,
                t => t,
            })
            .collect();
        let drafter = |json: bool| {
            let mut d = Drafter::new(&prompt, auto(8));
            d.quote_unspaced(unspaced.clone());
            if json {
                d.draft_json_layout(marks.clone());
            }
            d
        };
        // `{"name": "John`: the quote stops before the full stop; no value closed yet to copy.
        let mut d = drafter(true);
        for t in [0, 1, 15, 3, 4, 12] {
            d.push(t);
        }
        assert_eq!(d.propose(8, &none()), [13, 14]);
        assert_eq!(d.source(), DraftSource::Quoted);
        // `Haddad",\n"city": "Osaka`: the value is whole, so the draft is its close.
        for t in [13, 14, 9, 1, 2, 3, 4, 5] {
            d.push(t);
        }
        assert_eq!(d.propose(8, &none()), [9]);
        // Outside JSON the quote goes on as the prompt does.
        let mut d = drafter(false);
        for t in [0, 1, 15, 3, 4, 12] {
            d.push(t);
        }
        assert_eq!(d.propose(8, &none()), [13, 14, 7, 10, 6, 7, 8]);
    }

    #[test]
    fn a_quoted_value_is_not_taken_over_by_an_earlier_answers_value() {
        // An earlier answer went on `31 40 41` (another customer's john); this prompt goes on 22 23.
        let mut shared = SharedDrafts::default();
        shared.record(&[7, 8, 2, 31, 40, 41]);
        let mut d = Drafter::new(&[5, 10, 21, 22, 23, 11], auto(8));
        d.quote_unspaced(vec![5, 10, 31, 22, 23, 11]);
        for t in [7, 8, 2, 31] {
            d.push(t);
        }
        assert_eq!(d.propose(8, &shared), [22, 23, 11]);
        assert_eq!(d.source(), DraftSource::Quoted);
    }

    #[test]
    fn without_a_grammar_a_chain_is_one_lookup() {
        let mut d = Drafter::new(&[7, 8, 9, 1, 2, 3, 4, 7, 8], auto(8));
        d.push(9);
        let chain = d.chain(8, 8, &none());
        assert_eq!(chain.tokens, [1, 2, 3, 4, 7, 8, 9]);
        assert_eq!(chain.lookups, [Lookup { start: 0, len: 7, matched: 3, source: DraftSource::Own }]);
        assert_eq!(chain.forced_prefix(), 0);
        // Drafting leaves the history as it was: the same chain again.
        assert_eq!(d.chain(8, 8, &none()), chain);
        assert!(d.chain(8, 0, &none()).tokens.is_empty(), "no lookups allowed, nothing forced");
    }

    #[test]
    fn a_chains_expected_tokens_count_forced_drafts_as_certain() {
        let mut chain = Chain::default();
        chain.push_forced(&[1, 2]);
        chain.push_lookup(&[3, 4], 5, DraftSource::Shared);
        chain.push_forced(&[5]);
        chain.push_lookup(&[6], 2, DraftSource::Own);
        let chance = |l: &Lookup| {
            if l.source == DraftSource::Shared {
                0.5
            } else {
                0.1
            }
        };
        assert!((chain.expected_tokens(2, chance) - 3.0).abs() < 1e-9);
        // 1 + 1 + 1 + .5 + .25 + .25 (the forced token after them) + .025
        assert!((chain.expected_tokens(6, chance) - 4.025).abs() < 1e-9);
        assert_eq!((chain.forced_prefix(), chain.forced_within(6)), (2, 3));
        chain.truncate(3);
        assert_eq!(chain.tokens, [1, 2, 3]);
        assert_eq!(chain.lookups, [Lookup { start: 2, len: 1, matched: 5, source: DraftSource::Shared }]);
    }

    #[test]
    fn an_answer_that_repeats_its_layout_drafts_only_the_repeated_part() {
        // `",\n` (9) after each value, then the indent (1) and a quote (2), then a key.
        let mut d = Drafter::new(&[100, 101], auto(8));
        for t in [50, 9, 1, 2, 60, 51, 52, 9, 1, 2, 61, 53, 9] {
            d.push(t);
        }
        assert_eq!(d.own_layout(8), Some(vec![1, 2]), "the keys after it differ");
        // What an earlier answer drafts is agreed on as far as the own output also went on so.
        assert_eq!(d.own_agreement(&[1, 2, 70]), 2);
        assert_eq!(d.own_agreement(&[3]), 0);
        let mut d = Drafter::new(&[100, 101], auto(8));
        d.push(9);
        assert_eq!(d.own_layout(8), None, "written once: nothing to agree with");
    }

    #[test]
    fn a_single_token_match_is_not_enough() {
        let mut d = Drafter::new(&[1, 2, 3, 4, 5], auto(8));
        d.push(3);
        assert!(d.propose(4, &none()).is_empty());
    }

    #[test]
    fn among_equal_matches_the_most_recent_wins_and_drafts_stop_at_the_end() {
        let mut d = Drafter::new(&[1, 2, 3, 1, 2, 4, 1], auto(8));
        d.push(2);
        // Both "1 2" occurrences match two tokens; the later one is followed by 4, 1, 2.
        assert_eq!(d.propose(8, &none()), [4, 1, 2]);
    }

    #[test]
    fn off_never_drafts() {
        let mut d = Drafter::new(&[1, 2, 1], SpeculationConfig { mode: Speculate::Off, draft_max: 8 });
        d.push(2);
        assert!(d.propose(8, &none()).is_empty());
    }

    #[test]
    fn acceptance_is_learned_per_match_length_and_drifts_back() {
        let mut a = Acceptance::default();
        assert!(a.chance(32) > a.chance(2), "longer matches start out likelier");
        assert!((a.expected_tokens(2, 1) - 1.5).abs() < 1e-9, "short matches: a coin flip");
        for _ in 0..50 {
            a.verified(3, 4, 4);
        }
        assert!(a.expected_tokens(3, 4) > 4.5, "{}", a.expected_tokens(3, 4));
        assert!((a.chance(2) - 0.5).abs() < 1e-9, "other classes are untouched");
        for _ in 0..200 {
            a.verified(3, 4, 0);
        }
        assert!(a.expected_tokens(3, 4) < 1.5, "{}", a.expected_tokens(3, 4));
        for _ in 0..3000 {
            a.declined(3);
        }
        assert!((a.chance(3) - 0.6).abs() < 0.01, "back to the prior: {}", a.chance(3));
    }

    #[test]
    fn proposals_remember_the_match_they_continue() {
        let mut d = Drafter::new(&[7, 8, 9, 1, 2, 3, 4, 7, 8], auto(8));
        d.push(9);
        assert_eq!(d.propose(2, &none()), [1, 2]);
        assert_eq!(d.matched(), 3);
    }

    #[test]
    fn proposals_stop_at_draft_max() {
        let history = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 5, 6];
        let mut d = Drafter::new(&history, auto(3));
        assert_eq!(d.propose(8, &none()), [7, 8, 9]);
    }
}
