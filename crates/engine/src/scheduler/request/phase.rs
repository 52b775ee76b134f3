//! Where a running request is, as one value: reading its prompt, waiting to copy part of it
//! from another sequence, decoding, finished ([`Phase`]); and where each of its choices is:
//! waiting, with a token to feed, finished ([`ChoiceState`]). What depends on either is a
//! `match`, not a mix of flags.

use crate::kv::seq_id::SeqId;
use crate::scheduler::request::{ActiveRequest, Choice};
use crate::FinishReason;

/// Where a running request is. Its choices' own states live in each `Choice` ([`ChoiceState`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Reading its prompt: the first `read` tokens are in its first sequence's cache.
    Prefilling { read: usize },
    /// Waiting to copy the first `len` tokens of its prompt from sequence `from`, which holds or
    /// is computing them (`copy_awaited_prefixes`); `read` of its own are in the cache meanwhile.
    AwaitingPrefix { from: SeqId, len: usize, read: usize },
    /// Its prompt is read: each choice decodes until it finishes.
    Decoding,
    /// Every choice finished: it ends at the step's end (`retire_finished`).
    Finished,
}

impl ActiveRequest {
    /// Prompt tokens in its first sequence's cache: a reused prefix, images and chunks read so
    /// far; the whole prompt once it decodes.
    pub(crate) fn read(&self) -> usize {
        match self.phase {
            Phase::Prefilling { read } | Phase::AwaitingPrefix { read, .. } => read,
            Phase::Decoding | Phase::Finished => self.prompt.len(),
        }
    }

    /// The prompt is in the cache up to `read`: it goes on reading, or decodes once all is read.
    pub(crate) fn set_read(&mut self, read: usize) {
        self.phase = if read < self.prompt.len() { Phase::Prefilling { read } } else { Phase::Decoding };
    }

    /// Waits to copy the first `len` prompt tokens from `from`, which holds or computes them.
    pub(crate) fn await_prefix(&mut self, from: SeqId, len: usize) {
        self.phase = Phase::AwaitingPrefix { from, len, read: self.read() };
    }

    /// The sequence and length of the prefix it waits to copy, if it waits for one.
    pub(crate) fn awaited_prefix(&self) -> Option<(SeqId, usize)> {
        match self.phase {
            Phase::AwaitingPrefix { from, len, .. } => Some((from, len)),
            _ => None,
        }
    }

    /// Reading its prompt, or waiting for part of it from another sequence.
    pub(crate) fn is_prefilling(&self) -> bool {
        matches!(self.phase, Phase::Prefilling { .. } | Phase::AwaitingPrefix { .. })
    }

    /// Every choice finished (`finish_choice` moves it there).
    pub(crate) fn all_finished(&self) -> bool {
        self.phase == Phase::Finished
    }
}

/// Where one choice is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChoiceState {
    /// Nothing to feed: the prompt is still being read, or the token it fed is in the batch
    /// decoding now (its logits are sampled after the decode).
    Waiting,
    /// This token is fed at the next step.
    Ready(i32),
    /// It ended, for this reason.
    Finished(FinishReason),
}

impl Choice {
    /// The token the next step feeds, if it has one.
    pub(crate) fn ready(&self) -> Option<i32> {
        match self.state {
            ChoiceState::Ready(token) => Some(token),
            ChoiceState::Waiting | ChoiceState::Finished(_) => None,
        }
    }

    /// `token` is fed at the next step (a finished choice feeds nothing more).
    pub(crate) fn feed(&mut self, token: i32) {
        if !matches!(self.state, ChoiceState::Finished(_)) {
            self.state = ChoiceState::Ready(token);
        }
    }

    /// Its token goes into the batch now: it waits for the decode.
    pub(crate) fn take_ready(&mut self) -> Option<i32> {
        let token = self.ready()?;
        self.state = ChoiceState::Waiting;
        Some(token)
    }

    /// Why it ended, once it has.
    pub(crate) fn finished(&self) -> Option<FinishReason> {
        match self.state {
            ChoiceState::Finished(reason) => Some(reason),
            ChoiceState::Waiting | ChoiceState::Ready(_) => None,
        }
    }
}
