//! The drafts a choice feeds in one step, and where each run of them came from.

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
    pub(crate) fn push_forced(&mut self, tokens: &[i32]) {
        self.tokens.extend_from_slice(tokens);
        self.forced.extend(std::iter::repeat_n(true, tokens.len()));
    }

    pub(crate) fn push_lookup(&mut self, tokens: &[i32], matched: usize, source: DraftSource) {
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

    /// Cuts the chain to its longest prefix of at most `room` drafts of which at most
    /// `lookup_room` were looked up (what a step's budget leaves this choice).
    pub(crate) fn fit(&mut self, room: usize, lookup_room: usize) {
        let mut looked_up = 0;
        let mut k = 0;
        for &forced in self.forced.iter().take(room) {
            if !forced {
                if looked_up == lookup_room {
                    break;
                }
                looked_up += 1;
            }
            k += 1;
        }
        self.truncate(k);
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
