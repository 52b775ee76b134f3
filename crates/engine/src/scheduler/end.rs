//! The one way a request ends. Whatever ends it (its choices finished, its client left, a failure
//! of its own, a stall, a decode error, shutdown, the scheduler's own panic), [`Scheduler::end`]
//! gives back what it held (its place in the queue, or its sequences), sends its last event and
//! its usage report, and counts it in `gantry_requests_total`. The list of ways, with where each
//! is decided, is in `docs/architecture.md` ("Every way a request ends").

use llama_cpp_2::context::LlamaContext;
use tokio::sync::{mpsc, oneshot};

use crate::error::EngineError;
use crate::request::{Event, FinishReason, Outcome, Usage};
use crate::scheduler::request::ActiveRequest;
use crate::scheduler::{Job, Scheduler};

/// A request as it ends.
pub(crate) enum Leaving {
    /// It never reached a sequence: nothing was computed, nothing is billed.
    Unstarted(Unstarted),
    /// It ran: what it computed is billed.
    Running(Box<ActiveRequest>),
}

/// What a request that never started holds: its owner's place among the queued requests
/// (`QueueShares`) and the channels back to it.
pub(crate) struct Unstarted {
    pub owner: crate::request::Owner,
    pub events: mpsc::UnboundedSender<Event>,
    pub usage: oneshot::Sender<Usage>,
}

impl From<ActiveRequest> for Leaving {
    fn from(req: ActiveRequest) -> Self {
        Leaving::Running(Box::new(req))
    }
}

impl From<Job> for Leaving {
    fn from(job: Job) -> Self {
        Leaving::Unstarted(Unstarted { owner: job.request.owner, events: job.events, usage: job.usage })
    }
}

/// Why a request ends.
pub(crate) enum Ending {
    /// It ran its course: every choice finished (a stop, its length, or its client left); or,
    /// not started, its client left. Its sequences keep their entries for the next prompt with
    /// the same prefix (`KvSlots`).
    Finished,
    /// It cannot go on, and its owner gets `error`. Its sequences are emptied: a failure may have
    /// left them half-updated.
    Failed(EngineError),
    /// A batch's line or an unstreamed `flex` request gives its sequences to interactive work
    /// waiting for them
    /// (`Scheduler::preempt`): it ends `preempted`, its owner told to run it again; its
    /// sequences keep their entries, as a finished request's do.
    Preempted,
    /// The scheduler thread panicked: the request ends with `error` and its usage, and nothing
    /// else is touched (not the llama.cpp context, the cache's mirror nor the free sequences),
    /// since the panic may have left them half-updated.
    Crashed(EngineError),
}

impl Scheduler {
    /// Ends `leaving`: the one exit every request takes (see the module's header).
    pub(in crate::scheduler) fn end(&mut self, ctx: &mut LlamaContext<'_>, leaving: Leaving, ending: Ending) {
        #[cfg(test)]
        let record = (matches!(leaving, Leaving::Running(_)), ending.name());
        let usage = match leaving {
            Leaving::Unstarted(job) => {
                self.queued.leave(job.owner);
                let outcome = match ending {
                    Ending::Finished => Outcome::Cancelled,
                    Ending::Preempted => {
                        let _ = job.events.send(Event::Error(EngineError::Preempted));
                        Outcome::Preempted
                    }
                    Ending::Failed(error) | Ending::Crashed(error) => {
                        let _ = job.events.send(Event::Error(error));
                        Outcome::Error
                    }
                };
                let usage = Usage { outcome, ..Usage::default() };
                let _ = job.usage.send(usage);
                usage
            }
            Leaving::Running(req) => match ending {
                Ending::Finished => {
                    self.release(&req);
                    req.complete(None)
                }
                Ending::Preempted => {
                    self.release(&req);
                    req.complete(Some(EngineError::Preempted))
                }
                Ending::Failed(error) => {
                    for seq in req.seq_ids() {
                        self.kv.cut(ctx, seq, 0);
                    }
                    self.release(&req);
                    req.complete(Some(error))
                }
                Ending::Crashed(error) => req.complete(Some(error)),
            },
        };
        self.totals.request_done(&usage);
        #[cfg(test)]
        if let Some(log) = &self.cfg.endings_log {
            log.lock().unwrap().push(EndingRecord { started: record.0, ending: record.1, outcome: usage.outcome });
        }
    }

    /// Returns the request's sequences to the idle pool and its key's running count to the
    /// fair queue. Their KV entries stay (emptied before, for a failure): the next prompt with
    /// the same prefix reuses them (see `KvSlots`).
    fn release(&mut self, req: &ActiveRequest) {
        self.waiting.finished(req.owner, req.tier, req.choices.len());
        for c in &req.choices {
            self.kv.touch(c.seq_id);
            self.free_seqs.push(c.seq_id);
            // Whole answers only: one cut short says little about how answers go on.
            if matches!(c.finished(), Some(FinishReason::Stop | FinishReason::Length)) {
                self.shared.record(c.drafter.family(), c.drafter.answer());
            }
        }
    }
}

/// One request's end as the tests see it (`SchedulerConfig::endings_log`).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EndingRecord {
    /// Whether it had reached a sequence.
    pub started: bool,
    pub ending: &'static str,
    pub outcome: Outcome,
}

#[cfg(test)]
impl Ending {
    fn name(&self) -> &'static str {
        match self {
            Ending::Finished => "finished",
            Ending::Preempted => "preempted",
            Ending::Failed(_) => "failed",
            Ending::Crashed(_) => "crashed",
        }
    }
}
