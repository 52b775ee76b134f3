//! Speculative decoding without a draft model: prompt lookup, and jump-forward under a grammar.
//!
//! Code edits, quotes and structured answers repeat long runs of tokens that are already in the
//! prompt or earlier in the output. For each decoding choice the drafter looks for the longest
//! earlier occurrence of the output's last tokens and proposes the tokens that followed it. The
//! scheduler feeds the choice's token plus the draft at consecutive positions of the same batch as
//! every other sequence, then walks them: at each position it samples with the choice's own
//! sampler and keeps the draft token only if the sampled token is the same one. Every produced
//! token is therefore sampled from exactly the distribution (and with the same single random
//! draw) that decoding one token at a time would use: at temperature 0, and with a fixed seed at
//! any temperature, the output does not change; only the number of decode steps does.
//!
//! Verifying k draft tokens is not free on a CPU (a batch of k+1 tokens costs more than one), so
//! drafting adapts: a choice drafts only while its drafts are being accepted, backs off when they
//! are not, and nobody drafts once enough sequences are decoding that the batch is compute-bound.
//!
//! Under a grammar (a JSON schema, a tool call) the drafter first asks what the grammar forces
//! next: keys, punctuation and enum tails allow one tokenization only, so the sampler could pick
//! nothing else and those drafts are always accepted, at any load (jump-forward, verified the
//! same way, so constrained output is also unchanged).

use std::sync::atomic::{AtomicU64, Ordering};

use llguidance::Matcher;
use metrics::counter;

/// Whether the engine drafts tokens; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speculate {
    /// Draft where it pays: per choice while its drafts are accepted, not under load.
    Auto,
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

/// With more choices decoding than this, nobody drafts: the batch already keeps the CPU's
/// arithmetic busy, and verified-then-rejected tokens would slow every stream.
pub(crate) const MAX_DRAFTING_STREAMS: usize = 2;

/// Shortest match (in tokens) of the output's tail that is trusted to predict what follows.
const MIN_MATCH: usize = 2;
/// Matches are compared back at most this far; longer ones are all equally convincing.
const MAX_MATCH: usize = 32;
/// Below this share of accepted draft tokens (moving average) a choice stops drafting a while.
const PAUSE_BELOW: f32 = 0.25;
const FIRST_PAUSE_STEPS: u32 = 8;
const LONGEST_PAUSE_STEPS: u32 = 256;
/// Weight of the latest verification in the moving average.
const EMA_WEIGHT: f32 = 0.3;

/// Draft tokens proposed and accepted since start; shared with the engine handle.
#[derive(Debug, Default)]
pub struct SpeculationStats {
    drafted: AtomicU64,
    accepted: AtomicU64,
    forced: AtomicU64,
    forced_accepted: AtomicU64,
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

    pub(crate) fn record_forced(&self, drafted: usize, accepted: usize) {
        self.forced.fetch_add(drafted as u64, Ordering::Relaxed);
        self.forced_accepted.fetch_add(accepted as u64, Ordering::Relaxed);
        counter!("gantry_forced_tokens_total").increment(drafted as u64);
        counter!("gantry_forced_tokens_accepted_total").increment(accepted as u64);
    }

    pub(crate) fn record(&self, drafted: usize, accepted: usize) {
        self.drafted.fetch_add(drafted as u64, Ordering::Relaxed);
        self.accepted.fetch_add(accepted as u64, Ordering::Relaxed);
        counter!("gantry_draft_tokens_total").increment(drafted as u64);
        counter!("gantry_draft_tokens_accepted_total").increment(accepted as u64);
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
        "gantry_forced_tokens_total",
        Unit::Count,
        "Tokens a grammar forces (JSON keys and punctuation), fed ahead in the same batch (jump-forward)."
    );
    describe_counter!(
        "gantry_forced_tokens_accepted_total",
        Unit::Count,
        "Forced tokens that were produced, each saving a decode step."
    );
}

/// One choice's drafter: the tokens it may copy from (prompt and output so far) and how well
/// its drafts have been doing.
pub(crate) struct Drafter {
    history: Vec<i32>,
    /// A copy of the choice's grammar state (its sampler holds the other one), fed the same
    /// tokens, asked what the grammar forces next.
    grammar: Option<Matcher>,
    /// Draft length to propose next; grows while drafts are accepted in full.
    k: usize,
    max: usize,
    acceptance: f32,
    paused_for: u32,
    next_pause: u32,
}

impl Drafter {
    pub fn new(prompt: &[i32], config: SpeculationConfig) -> Self {
        let max = match config.mode {
            Speculate::Auto => config.draft_max as usize,
            Speculate::Off => 0,
        };
        Self {
            // Only a drafter that may draft needs the tokens to copy from.
            history: if max > 0 { prompt.to_vec() } else { Vec::new() },
            grammar: None,
            k: max.min(4),
            max,
            acceptance: 0.5,
            paused_for: 0,
            next_pause: FIRST_PAUSE_STEPS,
        }
    }

    /// The choice is sampled under `matcher`'s grammar from now on (its state already holds the
    /// output so far); returns the matcher for the sampler, keeping a copy to draft from.
    pub fn follow_grammar(&mut self, matcher: Matcher) -> Matcher {
        self.grammar = (self.max > 0).then(|| matcher.deep_clone());
        matcher
    }

    /// A token the choice produced.
    pub fn push(&mut self, token: i32) {
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
    pub fn forced(&mut self, limit: usize) -> Vec<i32> {
        let Some(g) = self.grammar.as_mut() else { return Vec::new() };
        if limit == 0 || g.is_stopped() {
            return Vec::new();
        }
        let mut tokens: Vec<i32> = g.compute_ff_tokens().into_iter().map(|t| t as i32).collect();
        tokens.truncate(limit);
        tokens
    }

    /// Up to `limit` tokens expected to follow the output so far; empty when there is no
    /// convincing match or this choice's drafts have not been paying.
    pub fn propose(&mut self, limit: usize) -> &[i32] {
        if self.max == 0 || limit == 0 {
            return &[];
        }
        if self.paused_for > 0 {
            self.paused_for -= 1;
            return &[];
        }
        let want = self.k.min(limit);
        match longest_match(&self.history) {
            Some(start) => {
                let end = (start + want).min(self.history.len());
                &self.history[start..end]
            }
            None => &[],
        }
    }

    /// The outcome of verifying a draft of `drafted` tokens, `accepted` of them taken.
    pub fn verified(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let rate = accepted as f32 / drafted as f32;
        self.acceptance = (1.0 - EMA_WEIGHT) * self.acceptance + EMA_WEIGHT * rate;
        self.k = if accepted == drafted { (self.k + 2).min(self.max) } else { (accepted + 1).min(self.max) };
        if rate >= 0.5 {
            self.next_pause = FIRST_PAUSE_STEPS;
        }
        if self.acceptance < PAUSE_BELOW {
            // Probe again later: text that stopped repeating its context may start again.
            self.paused_for = self.next_pause;
            self.next_pause = (self.next_pause * 2).min(LONGEST_PAUSE_STEPS);
            self.acceptance = 2.0 * PAUSE_BELOW;
            self.k = 1.max(self.max.min(2));
        }
    }
}

/// Where the continuation of `history`'s tail starts: the index just after the earlier
/// occurrence that matches the most tokens before the end (at least `MIN_MATCH`), the most recent
/// one among equals.
fn longest_match(history: &[i32]) -> Option<usize> {
    let n = history.len();
    if n < MIN_MATCH + 1 {
        return None;
    }
    let last = history[n - 1];
    let mut best: Option<(usize, usize)> = None;
    // `i` is a candidate end of an earlier occurrence; it must leave a token to propose.
    for i in (0..n - 1).rev() {
        if history[i] != last {
            continue;
        }
        let len = (1..=MAX_MATCH.min(i + 1)).take_while(|&d| history[i + 1 - d] == history[n - d]).count();
        if len >= MIN_MATCH && best.is_none_or(|(_, l)| len > l) {
            best = Some((i + 1, len));
            if len == MAX_MATCH {
                break;
            }
        }
    }
    best.map(|(start, _)| start)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auto(max: u32) -> SpeculationConfig {
        SpeculationConfig { mode: Speculate::Auto, draft_max: max }
    }

    #[test]
    fn proposes_what_followed_the_longest_earlier_match() {
        // "7 8 9" occurred once, followed by 1 2 3; "9" alone also occurred later (followed by 5).
        let mut d = Drafter::new(&[7, 8, 9, 1, 2, 3, 4, 9, 5, 6, 7, 8], auto(8));
        d.push(9);
        assert_eq!(d.propose(3), &[1, 2, 3]);
        assert_eq!(d.propose(1), &[1]);
    }

    #[test]
    fn a_single_token_match_is_not_enough() {
        let mut d = Drafter::new(&[1, 2, 3, 4, 5], auto(8));
        d.push(3);
        assert!(d.propose(4).is_empty());
    }

    #[test]
    fn among_equal_matches_the_most_recent_wins_and_drafts_stop_at_the_end() {
        let mut d = Drafter::new(&[1, 2, 3, 1, 2, 4, 1], auto(8));
        d.push(2);
        // Both "1 2" occurrences match two tokens; the later one is followed by 4, 1, 2.
        assert_eq!(d.propose(8), &[4, 1, 2]);
    }

    #[test]
    fn off_never_drafts() {
        let mut d = Drafter::new(&[1, 2, 1], SpeculationConfig { mode: Speculate::Off, draft_max: 8 });
        d.push(2);
        assert!(d.propose(8).is_empty());
    }

    #[test]
    fn rejected_drafts_shrink_the_draft_and_then_pause_it() {
        let history = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 5, 6];
        let mut d = Drafter::new(&history, auto(8));
        assert_eq!(d.propose(8).len(), 4, "first drafts are 4 long");
        d.verified(4, 4);
        assert_eq!(d.propose(8).len(), 6, "a fully accepted draft grows it");
        d.verified(6, 1);
        assert_eq!(d.propose(8).len(), 2, "a rejection shrinks it to what was accepted, plus one");
        d.verified(2, 0);
        d.verified(1, 0);
        // The average fell below the threshold: the next FIRST_PAUSE_STEPS proposals are empty.
        for _ in 0..FIRST_PAUSE_STEPS {
            assert!(d.propose(8).is_empty());
        }
        assert!(!d.propose(8).is_empty(), "then it probes again");
    }
}
