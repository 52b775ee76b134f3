//! One choice's drafter: finds the longest earlier occurrence of the output's tail (in its own
//! prompt and output, or in other requests' answers) and proposes what followed it, after what a
//! grammar forces.

use llguidance::Matcher;

use crate::speculation::json_layout::{JsonMarks, Value};
use crate::speculation::shared_drafts::{common_prefix, SharedDrafts};

use super::chain::{Chain, DraftSource};
use super::config::{Speculate, SpeculationConfig};

/// Shortest match (in tokens) of the output's tail that is trusted to predict what follows.
const MIN_MATCH: usize = 2;
/// Matches are compared back at most this far; longer ones are all equally convincing.
pub(super) const MAX_MATCH: usize = 32;
/// Prompt tokens recorded before an answer for other requests to draft from.
const ANSWER_CONTEXT: usize = 4;
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

    /// Forgets the last `n` tokens the choice produced (an output dropped to be sampled again).
    pub(crate) fn rewind(&mut self, n: usize) {
        let keep = self.history.len().saturating_sub(n).max(self.prompt_len.min(self.history.len()));
        self.history.truncate(keep);
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
    pub(super) fn own_agreement(&self, tokens: &[i32]) -> usize {
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
    pub(super) fn own_layout(&mut self, limit: usize) -> Option<Vec<i32>> {
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
