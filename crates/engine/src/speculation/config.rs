//! How speculation is configured (`--speculate`, `--draft-max`) and what it has done since start.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::telemetry;

use crate::request::SamplingParams;

use super::chain::DraftSource;

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
        telemetry::counter("gantry_forced_tokens_total", None).increment(drafted as u64);
        telemetry::counter("gantry_forced_tokens_accepted_total", None).increment(accepted as u64);
    }

    pub(crate) fn record(&self, drafted: usize, accepted: usize, source: DraftSource) {
        self.drafted.fetch_add(drafted as u64, Ordering::Relaxed);
        self.accepted.fetch_add(accepted as u64, Ordering::Relaxed);
        telemetry::counter("gantry_draft_tokens_total", None).increment(drafted as u64);
        telemetry::counter("gantry_draft_tokens_accepted_total", None).increment(accepted as u64);
        if source == DraftSource::Shared {
            self.shared.fetch_add(drafted as u64, Ordering::Relaxed);
            self.shared_accepted.fetch_add(accepted as u64, Ordering::Relaxed);
            telemetry::counter("gantry_draft_tokens_shared_total", None).increment(drafted as u64);
            telemetry::counter("gantry_draft_tokens_shared_accepted_total", None).increment(accepted as u64);
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
