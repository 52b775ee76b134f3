//! The `gantry-embedder` thread: it takes every job waiting, decodes one batch of their inputs,
//! reads each sequence's pooled vector, and answers each job once all its inputs are done.
//!
//! A batch is filled one input at a time from each tenant in turn, and within a tenant from each
//! of its API keys in turn (a key's oldest job first), so that one key's thousand inputs hold
//! another key's single input back by at most one batch, and a tenant's many keys together take
//! one tenant's turns, as the scheduler's fair queue does for generation. Jobs that arrive while a batch decodes
//! join the next one: many requests share one decode.

use std::sync::{mpsc, Arc, Mutex};

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;
use tokio::sync::oneshot;

use super::{normalised, EmbedError, Embeddings, DECODE_TOKENS, MAX_SEQUENCES};
use crate::request::Owner;
use crate::scheduler::queue::shares::QueueShares;

/// One request's inputs, as the thread takes them.
pub(super) struct Job {
    /// Whose: batches are filled fairly between tenants, then a tenant's keys.
    pub(super) owner: Owner,
    pub(super) inputs: Vec<Vec<LlamaToken>>,
    pub(super) reply: oneshot::Sender<Result<Embeddings, EmbedError>>,
}

/// A job being embedded: its vectors so far, and how many of its inputs a batch has taken.
struct Pending {
    job: Job,
    vectors: Embeddings,
    taken: usize,
    failed: Option<EmbedError>,
}

/// One input in a batch: which pending job, which of its inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Slot {
    pub(super) job: usize,
    pub(super) input: usize,
}

/// What [`next_batch`] sees of a pending job.
pub(super) struct Waiting<'a> {
    pub(super) owner: Owner,
    /// Its inputs' lengths, in tokens.
    pub(super) lengths: &'a [usize],
    /// Inputs taken by earlier batches: the next is this one.
    pub(super) taken: usize,
}

/// The thread's loop; it ends when the [`super::Embedder`] handle is dropped and no job is left.
pub(super) fn run(
    mut ctx: LlamaContext<'_>,
    queue: &mpsc::Receiver<Job>,
    turns: Option<&Arc<Mutex<()>>>,
    normalise: bool,
    queued: &QueueShares,
) {
    let mut pending: Vec<Pending> = Vec::new();
    loop {
        if pending.is_empty() {
            let Ok(job) = queue.recv() else { return };
            pending.push(Pending::new(job));
        }
        pending.extend(queue.try_iter().map(Pending::new));
        // Nobody waits for these any more (the server stopped waiting for the request).
        pending.retain(|p| {
            let open = !p.job.reply.is_closed();
            if !open {
                queued.leave(p.job.owner);
            }
            open
        });
        let lengths: Vec<Vec<usize>> = pending.iter().map(|p| p.job.inputs.iter().map(Vec::len).collect()).collect();
        let waiting: Vec<Waiting<'_>> = pending
            .iter()
            .zip(&lengths)
            .map(|(p, lengths)| Waiting { owner: p.job.owner, lengths, taken: p.taken })
            .collect();
        let batch = next_batch(&waiting);
        if batch.is_empty() {
            // Every job left was dropped; `submit_inputs` answers a job of no inputs itself.
            continue;
        }
        let inputs = batch.iter().map(|s| pending[s.job].job.inputs[s.input].as_slice());
        let decoded = {
            // Engines of other models take turns with this one on the cores.
            let _turn = turns.map(|t| t.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
            embed_batch(&mut ctx, inputs, normalise)
        };
        match decoded {
            Ok(vectors) => {
                for (slot, vector) in batch.iter().zip(vectors) {
                    pending[slot.job].vectors[slot.input] = vector;
                }
            }
            Err(e) => batch.iter().for_each(|s| pending[s.job].failed = Some(e.clone())),
        }
        for slot in &batch {
            pending[slot.job].taken = pending[slot.job].taken.max(slot.input + 1);
        }
        let (done, left): (Vec<Pending>, Vec<Pending>) =
            pending.into_iter().partition(|p| p.failed.is_some() || p.taken == p.job.inputs.len());
        pending = left;
        for p in done {
            queued.leave(p.job.owner);
            let _ = p.job.reply.send(p.failed.map_or(Ok(p.vectors), Err));
        }
    }
}

impl Pending {
    fn new(job: Job) -> Self {
        let vectors = vec![Vec::new(); job.inputs.len()];
        Self { job, vectors, taken: 0, failed: None }
    }
}

/// The inputs the next decode takes: one from each tenant in turn, taken from its keys in turn,
/// a key's jobs in the order they came and each job's inputs in order, until the batch holds
/// `DECODE_TOKENS` tokens or `MAX_SEQUENCES` sequences. A key whose next input does not fit is
/// done for this batch, so its inputs stay in order. The first input always fits: `submit`
/// bounds every input's length.
pub(super) fn next_batch(waiting: &[Waiting<'_>]) -> Vec<Slot> {
    // Each tenant's keys, in the order they came, each with its jobs in order and its cursor
    // (job, input) moving through them; and which key has the tenant's next turn.
    let mut tenants: Vec<(u64, Vec<KeyCursor>, usize)> = Vec::new();
    for (i, w) in waiting.iter().enumerate() {
        let t = match tenants.iter().position(|(t, ..)| *t == w.owner.tenant) {
            Some(t) => t,
            None => {
                tenants.push((w.owner.tenant, Vec::new(), 0));
                tenants.len() - 1
            }
        };
        let keys = &mut tenants[t].1;
        match keys.iter_mut().find(|k| k.key == w.owner.key) {
            Some(k) => k.jobs.push(i),
            None => keys.push(KeyCursor { key: w.owner.key, jobs: vec![i], at: None }),
        }
    }
    for k in tenants.iter_mut().flat_map(|(_, keys, _)| keys) {
        k.at = next_input(waiting, &k.jobs, k.jobs[0], waiting[k.jobs[0]].taken);
    }
    let (mut batch, mut tokens) = (Vec::new(), 0);
    while batch.len() < MAX_SEQUENCES as usize {
        let mut took = false;
        for (_, keys, turn) in &mut tenants {
            // The tenant's turn goes to its next key with an input that fits.
            let count = keys.len();
            for _ in 0..count {
                let k = &mut keys[*turn];
                *turn = (*turn + 1) % count;
                let Some((job, input)) = k.at else { continue };
                let n = waiting[job].lengths[input];
                if batch.len() == MAX_SEQUENCES as usize || (!batch.is_empty() && tokens + n > DECODE_TOKENS) {
                    k.at = None;
                    continue;
                }
                batch.push(Slot { job, input });
                tokens += n;
                took = true;
                k.at = next_input(waiting, &k.jobs, job, input + 1);
                break;
            }
        }
        if !took {
            break;
        }
    }
    batch
}

/// One key's jobs waiting, and its next input among them.
struct KeyCursor {
    key: u64,
    jobs: Vec<usize>,
    at: Option<(usize, usize)>,
}

/// The first input not yet taken at or after `input` of `job`, or of the key's later jobs.
fn next_input(waiting: &[Waiting<'_>], jobs: &[usize], job: usize, input: usize) -> Option<(usize, usize)> {
    if input < waiting[job].lengths.len() {
        return Some((job, input));
    }
    let later = jobs.iter().skip_while(|&&j| j != job).skip(1);
    later.map(|&j| (j, waiting[j].taken)).find(|&(j, i)| i < waiting[j].lengths.len())
}

/// One decode of `inputs`, sequence `i` for the `i`th; their pooled vectors (L2-normalised with
/// `normalise`; a reranker's scores are left as they are).
fn embed_batch<'a>(
    ctx: &mut LlamaContext<'_>,
    inputs: impl Iterator<Item = &'a [LlamaToken]> + Clone,
    normalise: bool,
) -> Result<Embeddings, EmbedError> {
    let failed = |e: &dyn std::fmt::Display| EmbedError::Decode(e.to_string());
    let total: usize = inputs.clone().map(<[LlamaToken]>::len).sum();
    let count = inputs.clone().count();
    let mut batch = LlamaBatch::new(total, i32::try_from(count).map_err(|e| failed(&e))?);
    for (seq, input) in inputs.enumerate() {
        let seq = i32::try_from(seq).map_err(|e| failed(&e))?;
        batch.add_sequence(input, seq, true).map_err(|e| failed(&e))?;
    }
    // A decoder model's cells hold the previous batch; an encoder has none to clear.
    ctx.clear_kv_cache();
    ctx.decode(&mut batch).map_err(|e| failed(&e))?;
    (0..count)
        .map(|seq| {
            let seq = i32::try_from(seq).map_err(|e| failed(&e))?;
            let pooled = ctx.embeddings_seq_ith(seq).map_err(|e| failed(&e))?;
            Ok(if normalise { normalised(pooled) } else { pooled.to_vec() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots(batch: &[Slot]) -> Vec<(usize, usize)> {
        batch.iter().map(|s| (s.job, s.input)).collect()
    }

    #[test]
    fn a_batch_takes_one_input_per_key_in_turn() {
        let big = [1; 200];
        let small = [1; 2];
        let waiting = [
            Waiting { owner: Owner::key(1), lengths: &big, taken: 0 },
            Waiting { owner: Owner::key(2), lengths: &small, taken: 0 },
            Waiting { owner: Owner::key(1), lengths: &small, taken: 0 },
        ];
        let batch = next_batch(&waiting);
        assert_eq!(batch.len(), MAX_SEQUENCES as usize);
        // Key 2's two inputs go in the first two rounds; key 1's big job goes first among its.
        assert_eq!(slots(&batch[..4]), [(0, 0), (1, 0), (0, 1), (1, 1)]);
        assert!(batch[4..].iter().all(|s| s.job == 0), "key 1's later job waits behind its first");
    }

    #[test]
    fn a_tenants_many_keys_together_take_one_tenants_turns() {
        let one = [1; 1];
        let of = |tenant, key| Owner { tenant, ..Owner::key(key) };
        // Tenant 1's ten keys and tenant 2's one key, one input per job.
        let mut waiting: Vec<Waiting<'_>> =
            (0..10).map(|k| Waiting { owner: of(1, k), lengths: &one, taken: 0 }).collect();
        let three = [1; 3];
        waiting.push(Waiting { owner: of(2, 99), lengths: &three, taken: 0 });
        let batch = next_batch(&waiting);
        // Turns alternate between the tenants: tenant 2's three inputs are among the first six.
        let firsts: Vec<usize> = batch[..6].iter().map(|s| s.job).collect();
        assert_eq!(firsts, [0, 10, 1, 10, 2, 10]);
        assert_eq!(batch.len(), 13, "then tenant 1's other keys, each in turn");
        assert_eq!(batch[6..].iter().map(|s| s.job).collect::<Vec<_>>(), [3, 4, 5, 6, 7, 8, 9]);
    }

    #[test]
    fn a_key_resumes_where_the_last_batch_stopped_and_moves_to_its_next_job() {
        let two = [1; 2];
        let waiting = [
            Waiting { owner: Owner::key(7), lengths: &two, taken: 1 },
            Waiting { owner: Owner::key(7), lengths: &two, taken: 0 },
        ];
        assert_eq!(slots(&next_batch(&waiting)), [(0, 1), (1, 0), (1, 1)]);
    }

    #[test]
    fn the_token_bound_cuts_the_batch_but_the_first_input_always_goes() {
        let whole = [crate::embedder::BATCH_TOKENS as usize];
        let half = [DECODE_TOKENS / 2 + 1, 1];
        let waiting = [
            Waiting { owner: Owner::key(1), lengths: &whole, taken: 0 },
            Waiting { owner: Owner::key(2), lengths: &half, taken: 0 },
        ];
        assert_eq!(slots(&next_batch(&waiting)), [(0, 0)]);
        // Once key 1's input does not fit, key 1 is done for this batch; key 2 goes on.
        let waiting = [
            Waiting { owner: Owner::key(2), lengths: &half, taken: 0 },
            Waiting { owner: Owner::key(1), lengths: &half, taken: 0 },
        ];
        assert_eq!(slots(&next_batch(&waiting)), [(0, 0), (0, 1)]);
    }
}
