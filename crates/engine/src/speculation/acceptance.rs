//! How likely drafts are to be accepted, learned per kind of draft and length of match, and how
//! many tokens a step is expected to produce from them.

use super::chain::DraftSource;
use super::drafter::MAX_MATCH;

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

/// Which acceptance estimate a lookup draft uses. A draft from another request's answer that a
/// grammar picked among several (the answer with the next key of the schema) is right far more
/// often than one copied after the same few tokens of free text, so answers to chat requests
/// must not teach the scheduler to decline drafts of JSON keys, nor the other way round. Drafts
/// a choice's own output agrees on under a grammar (`DraftSource::Agreed`) share the estimate of
/// the agreed drafts from earlier answers: both are a schema's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcceptanceKind {
    /// Copied from the choice's own prompt or output, in free text.
    OwnText,
    /// Copied from the choice's own prompt or output, under a grammar.
    OwnConstrained,
    /// Copied from another request's answer, in free text.
    SharedText,
    /// A schema's layout: another answer's drafts under a grammar, or the choice's own output
    /// where it agrees with itself.
    Agreed,
    /// Quoted from the choice's own prompt under a grammar.
    Quoted,
}

impl AcceptanceKind {
    pub(crate) fn of(source: DraftSource, constrained: bool) -> Self {
        match (source, constrained) {
            (DraftSource::Own, false) => Self::OwnText,
            (DraftSource::Own, true) => Self::OwnConstrained,
            (DraftSource::Shared, false) => Self::SharedText,
            (DraftSource::Shared, true) | (DraftSource::Agreed, _) => Self::Agreed,
            (DraftSource::Quoted, _) => Self::Quoted,
        }
    }
}

/// One acceptance estimate per [`AcceptanceKind`], each starting from its own prior.
#[derive(Debug, Clone)]
pub(crate) struct AcceptanceByKind {
    own_text: Acceptance,
    own_constrained: Acceptance,
    shared_text: Acceptance,
    agreed: Acceptance,
    quoted: Acceptance,
}

impl Default for AcceptanceByKind {
    fn default() -> Self {
        Self {
            own_text: Acceptance::default(),
            own_constrained: Acceptance::default(),
            shared_text: Acceptance::default(),
            agreed: Acceptance::agreed(),
            quoted: Acceptance::quoted(),
        }
    }
}

impl std::ops::Index<AcceptanceKind> for AcceptanceByKind {
    type Output = Acceptance;

    fn index(&self, kind: AcceptanceKind) -> &Acceptance {
        match kind {
            AcceptanceKind::OwnText => &self.own_text,
            AcceptanceKind::OwnConstrained => &self.own_constrained,
            AcceptanceKind::SharedText => &self.shared_text,
            AcceptanceKind::Agreed => &self.agreed,
            AcceptanceKind::Quoted => &self.quoted,
        }
    }
}

impl std::ops::IndexMut<AcceptanceKind> for AcceptanceByKind {
    fn index_mut(&mut self, kind: AcceptanceKind) -> &mut Acceptance {
        match kind {
            AcceptanceKind::OwnText => &mut self.own_text,
            AcceptanceKind::OwnConstrained => &mut self.own_constrained,
            AcceptanceKind::SharedText => &mut self.shared_text,
            AcceptanceKind::Agreed => &mut self.agreed,
            AcceptanceKind::Quoted => &mut self.quoted,
        }
    }
}
