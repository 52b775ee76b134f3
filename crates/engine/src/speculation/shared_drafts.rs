//! Drafting across requests: the outputs of recent requests, indexed by token, so a choice can
//! copy what followed the same tokens in an earlier answer (see `speculation`).
//!
//! Requests to one model repeat one another: the same JSON schema gives the same keys, layout
//! and punctuation in every answer; a tool gives the same call skeleton; greedy answers to
//! similar prompts open the same way. A choice's own prompt and output do not hold those runs
//! the first time it needs them; earlier answers do. Drafts from here are verified like every
//! other draft, so they change how many decode steps an answer takes, never the answer.
//!
//! What is kept: the last few prompt tokens (the chat template's opening of the answer) and the
//! output of every choice that ended normally, newest first, up to `MAX_TOKENS` in all. The
//! index keeps, for every token, its most recent `PER_TOKEN` occurrences.

use std::collections::{HashMap, VecDeque};

use crate::request::CacheScope;

/// Tokens kept across all recorded answers (about 256 KiB of ids).
const MAX_TOKENS: usize = 65_536;
/// Occurrences of one token the index keeps, newest last.
const PER_TOKEN: usize = 32;
/// Longest answer kept: its last tokens.
const MAX_ANSWER: usize = 4_096;
/// Matches are compared back at most this far.
const MAX_MATCH: usize = 32;
/// Distinct continuations one lookup returns at most.
const MAX_CANDIDATES: usize = 16;
/// Tokens compared to tell two continuations apart.
const DISTINCT_PREFIX: usize = 8;

/// Schemas (and sets of tools) whose answers are kept apart, the least recently answered
/// forgotten first.
const MAX_FAMILIES: usize = 16;

/// Recent answers kept apart by what shaped them (`DraftFamilies::family`): answers under one
/// schema share its layout, while another schema's answers, free text or a 1,000-line code edit
/// only offer wrong drafts under it (inside a JSON string almost any token is allowed), and
/// their common tokens (`,\n`, ` "`) would push the schema's answers out of the per-token index.
#[derive(Debug, Default)]
pub(crate) struct DraftFamilies {
    /// Family → its answers, with the step it last recorded one.
    families: HashMap<u64, (SharedDrafts, u64)>,
    clock: u64,
}

impl DraftFamilies {
    /// The family of answers to requests of cache scope `scope` under `constraint`, with `tools`
    /// for the model to call (each as its `Debug` form). Answers are drafts for later requests
    /// of their own scope only: another tenant's answers must not shape (or time) this one's.
    pub(crate) fn family(
        scope: CacheScope,
        constraint: Option<&impl std::fmt::Debug>,
        tools: Option<&impl std::fmt::Debug>,
    ) -> u64 {
        let shape = (constraint.is_some() || tools.is_some()).then(|| format!("{constraint:?}{tools:?}"));
        crate::keyed_hash::keyed_hash((scope, shape))
    }

    /// The answers of `family` (none yet: an empty store).
    pub(crate) fn of(&self, family: u64) -> &SharedDrafts {
        static EMPTY: std::sync::OnceLock<SharedDrafts> = std::sync::OnceLock::new();
        self.families.get(&family).map_or_else(|| EMPTY.get_or_init(SharedDrafts::default), |(d, _)| d)
    }

    /// Keeps an answer of `family` (`SharedDrafts::record`).
    pub(crate) fn record(&mut self, family: u64, tokens: &[i32]) {
        self.clock += 1;
        if !self.families.contains_key(&family) && self.families.len() >= MAX_FAMILIES {
            if let Some(oldest) = self.families.iter().min_by_key(|(_, (_, at))| *at).map(|(&f, _)| f) {
                self.families.remove(&oldest);
            }
        }
        let (drafts, at) = self.families.entry(family).or_default();
        drafts.record(tokens);
        *at = self.clock;
    }
}

/// One earlier continuation of the history's tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Candidate<'a> {
    /// How many of the history's last tokens it follows.
    pub matched: usize,
    /// The tokens that followed them.
    pub tokens: &'a [i32],
    /// How many of `tokens` another earlier answer that follows the same tail also continues
    /// with. Where answers agree, the run is the answers' common form (a schema's layout after
    /// a key); where they part, it is each answer's own content (the value), which the next
    /// answer will not repeat.
    pub agreed: usize,
}

#[derive(Debug, Default)]
pub(crate) struct SharedDrafts {
    /// Recorded answers, oldest first, with consecutive ids starting at `first_id`.
    answers: VecDeque<Vec<i32>>,
    first_id: u64,
    tokens: usize,
    /// token → (answer id, position) of its most recent occurrences, oldest first.
    index: HashMap<i32, VecDeque<(u64, u32)>>,
}

impl SharedDrafts {
    /// Keeps `tokens` (an answer with a few tokens of its prompt before it) to draft from.
    pub(crate) fn record(&mut self, tokens: &[i32]) {
        let tokens = &tokens[tokens.len().saturating_sub(MAX_ANSWER)..];
        if tokens.len() < 2 {
            return;
        }
        let id = self.first_id + self.answers.len() as u64;
        // The last token has nothing after it to propose.
        for (pos, &t) in tokens[..tokens.len() - 1].iter().enumerate() {
            // Image positions are negative ids (see `vision`), never tokens to match.
            if t < 0 {
                continue;
            }
            let seen = self.index.entry(t).or_default();
            seen.push_back((id, crate::units::count_u32(pos)));
            if seen.len() > PER_TOKEN {
                seen.pop_front();
            }
        }
        self.tokens += tokens.len();
        self.answers.push_back(tokens.to_vec());
        while self.tokens > MAX_TOKENS {
            self.forget_oldest();
        }
    }

    fn forget_oldest(&mut self) {
        let Some(old) = self.answers.pop_front() else { return };
        let id = self.first_id;
        self.first_id += 1;
        self.tokens -= old.len();
        for t in old {
            if let Some(seen) = self.index.get_mut(&t) {
                // Occurrences are in id order: the forgotten answer's are at the front.
                while seen.front().is_some_and(|&(a, _)| a <= id) {
                    seen.pop_front();
                }
                if seen.is_empty() {
                    self.index.remove(&t);
                }
            }
        }
    }

    /// Earlier continuations of `history`'s last tokens that follow at least `min_match` of
    /// them, longest match first (the most recent among equals), one per distinct
    /// continuation.
    pub(crate) fn candidates(&self, history: &[i32], min_match: usize) -> Vec<Candidate<'_>> {
        let Some(&last) = history.last() else { return Vec::new() };
        let Some(seen) = self.index.get(&last) else { return Vec::new() };
        let n = history.len();
        let mut occurrences: Vec<(usize, &[i32])> = Vec::new();
        for &(id, pos) in seen.iter().rev() {
            let Some(answer) = self
                .answers
                .get(usize::try_from(id - self.first_id).expect("answer ids are within this process's count"))
            else {
                continue;
            };
            let pos = pos as usize;
            let matched =
                (1..=MAX_MATCH.min(pos + 1).min(n)).take_while(|&d| answer[pos + 1 - d] == history[n - d]).count();
            if matched >= min_match {
                occurrences.push((matched, &answer[pos + 1..]));
            }
        }
        let mut found: Vec<Candidate<'_>> = Vec::new();
        for (i, &(matched, tokens)) in occurrences.iter().enumerate() {
            let head = &tokens[..tokens.len().min(DISTINCT_PREFIX)];
            if found.iter().any(|c| &c.tokens[..c.tokens.len().min(DISTINCT_PREFIX)] == head) {
                continue;
            }
            let agreed = occurrences
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .map(|(_, &(_, other))| common_prefix(tokens, other))
                .max()
                .unwrap_or(0);
            found.push(Candidate { matched, tokens, agreed });
        }
        // Stable: among equal matches the most recent stays first.
        found.sort_by_key(|c| std::cmp::Reverse(c.matched));
        found.truncate(MAX_CANDIDATES);
        found
    }

    #[cfg(test)]
    fn kept(&self) -> usize {
        self.tokens
    }
}

/// How many tokens `a` and `b` share from their start.
pub(crate) fn common_prefix(a: &[i32], b: &[i32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_match_wins_and_the_newest_among_equals() {
        let mut shared = SharedDrafts::default();
        shared.record(&[1, 2, 3, 10, 11]);
        shared.record(&[9, 2, 3, 20, 21]);
        shared.record(&[7, 2, 3, 30, 31]);
        let c = shared.candidates(&[5, 1, 2, 3], 2);
        assert_eq!(c[0], Candidate { matched: 3, tokens: &[10, 11], agreed: 0 });
        assert_eq!(c[1], Candidate { matched: 2, tokens: &[30, 31], agreed: 0 }, "newest of the 2-token matches");
        assert_eq!(c[2], Candidate { matched: 2, tokens: &[20, 21], agreed: 0 });
        assert_eq!(c.len(), 3);
        assert!(shared.candidates(&[5, 1, 2, 3], 4).is_empty(), "nothing matches 4 tokens");
        assert!(shared.candidates(&[4, 8], 1).is_empty(), "8 was never seen");
    }

    #[test]
    fn candidates_know_how_far_other_answers_agree_with_them() {
        let mut shared = SharedDrafts::default();
        // Three answers after the same key: the layout (1, 2) agrees, the values (7.., 8..) part.
        shared.record(&[5, 1, 2, 70, 71, 3]);
        shared.record(&[5, 1, 2, 80, 81, 3]);
        shared.record(&[5, 1, 2, 80, 82, 3]);
        let c = shared.candidates(&[5], 1);
        assert_eq!(
            (c[0].tokens[..4].to_vec(), c[0].agreed),
            (vec![1, 2, 80, 82], 3),
            "the newest; another answer shares 1 2 80"
        );
        let first = c.iter().find(|c| c.tokens[2] == 70).unwrap();
        assert_eq!(first.agreed, 2, "only the layout");
        // A continuation nobody else followed agrees on nothing.
        let mut shared = SharedDrafts::default();
        shared.record(&[5, 1, 2]);
        assert_eq!(shared.candidates(&[5], 1)[0].agreed, 0);
    }

    #[test]
    fn one_candidate_per_continuation() {
        let mut shared = SharedDrafts::default();
        for _ in 0..3 {
            shared.record(&[1, 2, 3, 4]);
        }
        shared.record(&[1, 2, 5, 6]);
        let c = shared.candidates(&[2], 1);
        assert_eq!(c.iter().map(|c| c.tokens).collect::<Vec<_>>(), vec![&[5, 6][..], &[3, 4][..]]);
    }

    #[test]
    fn old_answers_are_forgotten_and_their_index_entries_with_them() {
        let mut shared = SharedDrafts::default();
        shared.record(&[1, 2, 3]);
        let filler: Vec<i32> = (100..100 + MAX_ANSWER as i32).collect();
        for _ in 0..MAX_TOKENS / MAX_ANSWER {
            shared.record(&filler);
        }
        assert!(shared.kept() <= MAX_TOKENS);
        assert!(shared.candidates(&[1], 1).is_empty(), "the first answer was forgotten");
        assert!(!shared.index.contains_key(&1), "so were its index entries");
        assert_eq!(shared.candidates(&[100], 1)[0].tokens[0], 101);
        // An answer longer than the cap keeps its end.
        let long: Vec<i32> = (0..MAX_ANSWER as i32 + 10).collect();
        shared.record(&long);
        assert!(shared.candidates(&[5], 1).is_empty());
        assert_eq!(shared.candidates(&[20], 1)[0].tokens[0], 21);
    }

    #[test]
    fn each_token_keeps_its_most_recent_occurrences() {
        let mut shared = SharedDrafts::default();
        for i in 0..(PER_TOKEN as i32 + 5) {
            shared.record(&[7, 1000 + i]);
        }
        let c = shared.candidates(&[7], 1);
        assert_eq!(c.len(), MAX_CANDIDATES);
        assert_eq!(c[0].tokens, &[1000 + PER_TOKEN as i32 + 4]);
        assert!(shared.index[&7].len() <= PER_TOKEN);
    }

    #[test]
    fn families_keep_their_answers_apart_and_the_least_recent_family_goes() {
        let mut families = DraftFamilies::default();
        families.record(1, &[5, 1, 2]);
        families.record(0, &[5, 9, 9]);
        assert_eq!(families.of(1).candidates(&[5], 1)[0].tokens, &[1, 2]);
        assert_eq!(families.of(0).candidates(&[5], 1)[0].tokens, &[9, 9]);
        assert!(families.of(7).candidates(&[5], 1).is_empty(), "a family never answered");
        for f in 2..=MAX_FAMILIES as u64 {
            families.record(f, &[5, 3]);
        }
        assert!(families.of(1).candidates(&[5], 1).is_empty(), "family 1 answered least recently");
        assert_eq!(families.of(0).candidates(&[5], 1)[0].tokens, &[9, 9]);
        let free = |scope: u64| DraftFamilies::family(CacheScope(scope), None::<&()>, None::<&()>);
        let schema = |s: &'static str| DraftFamilies::family(CacheScope(0), Some(&s), None::<&()>);
        assert_eq!(schema("a"), schema("a"));
        assert_ne!(schema("a"), schema("b"));
        assert_ne!(schema("a"), free(0));
        assert_eq!(free(1), free(1));
    }

    #[test]
    fn another_scopes_answers_are_never_offered_as_drafts() {
        let family = |scope: u64, schema: Option<&&str>| DraftFamilies::family(CacheScope(scope), schema, None::<&()>);
        assert_ne!(family(1, None), family(2, None), "free text");
        assert_ne!(family(1, Some(&"s")), family(2, Some(&"s")), "the same schema");
        let mut families = DraftFamilies::default();
        families.record(family(1, Some(&"s")), &[5, 1, 2]);
        assert!(families.of(family(2, Some(&"s"))).candidates(&[5], 1).is_empty());
        assert_eq!(families.of(family(1, Some(&"s"))).candidates(&[5], 1)[0].tokens, &[1, 2]);
    }

    #[test]
    fn image_positions_are_not_indexed() {
        let mut shared = SharedDrafts::default();
        shared.record(&[-1, -1, 4, 5]);
        assert!(shared.candidates(&[-1], 1).is_empty());
        assert_eq!(shared.candidates(&[4], 1)[0].tokens, &[5]);
    }
}
