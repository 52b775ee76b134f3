//! Sentence embeddings: an embedding model (a GGUF that declares a pooling type: BERT
//! sentence-transformers, decoder embedding models) on a thread of its own, `gantry-embedder`,
//! the only owner of its `LlamaContext` (embeddings on, the model's own pooling).
//!
//! It is not the scheduler: an embedding is one forward pass with no sampling, no decode loop and
//! no KV reuse between inputs, so its loop is short. It takes every job waiting, packs their
//! inputs into batches (one sequence each, `BATCH_TOKENS` tokens and `MAX_SEQUENCES` sequences at
//! most), decodes each batch once, reads each sequence's pooled vector and L2-normalises it (as
//! sentence-transformers' `Normalize` module does), then answers each job. So many inputs and
//! many requests share one decode.
//!
//! A model whose GGUF declares no pooling type (a chat model) is refused at [`Embedder::start`]:
//! its per-token states pooled by nothing would be vectors without meaning.

use std::num::NonZeroU32;
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;
use tokio::sync::oneshot;

use crate::model::{backend, devices::Offload, LoadedModel};
use crate::LoadError;

/// Tokens decoded at once: one ubatch (non-causal attention needs each sequence whole in one).
const BATCH_TOKENS: u32 = 8192;
/// Sequences (inputs) in one decode.
const MAX_SEQUENCES: u32 = 64;

/// Why inputs could not be embedded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EmbedError {
    #[error("model {model} is not an embedding model: its GGUF declares no pooling type ({key})")]
    NotEmbeddingModel { model: String, key: String },
    #[error("input {index} has {tokens} tokens; this model embeds at most {limit}")]
    TooLong { index: usize, tokens: usize, limit: usize },
    #[error("input {index} is empty")]
    Empty { index: usize },
    #[error("llama.cpp failed to embed: {0}")]
    Decode(String),
    #[error("the embedder has stopped")]
    Stopped,
}

/// Unit vectors, one per input, in input order.
pub type Embeddings = Vec<Vec<f32>>;

struct Job {
    inputs: Vec<Vec<LlamaToken>>,
    reply: oneshot::Sender<Result<Embeddings, EmbedError>>,
}

/// The handle to an embedding model's thread; dropping it stops the thread once its jobs end.
pub struct Embedder {
    model: Arc<LoadedModel>,
    jobs: mpsc::Sender<Job>,
    dimensions: usize,
    /// The most tokens one input may have: the model's training context.
    max_input_tokens: usize,
}

impl Embedder {
    /// Loads the model at `path` and starts its thread; refuses a model without pooling.
    pub fn start(path: &Path, threads: i32, offload: &Offload) -> Result<Self, LoadError> {
        let model = LoadedModel::load(path, None, threads, offload)?;
        let arch = model.llama.meta_val_str("general.architecture").unwrap_or_default();
        let key = format!("{arch}.pooling_type");
        // llama.cpp's `llama_pooling_type`: 0 none, 1 mean, 2 CLS, 3 last, 4 rank (a reranker).
        let pooling = model.llama.meta_val_str(&key).ok().and_then(|v| v.parse::<u32>().ok());
        if !matches!(pooling, Some(1..=3)) {
            let model = path.display().to_string();
            return Err(LoadError::NotEmbedding(EmbedError::NotEmbeddingModel { model, key }.to_string()));
        }
        let dimensions = usize::try_from(model.llama.n_embd_out()).unwrap_or(0);
        let max_input_tokens = (model.info().n_ctx_train as usize).min(BATCH_TOKENS as usize);
        let (jobs, queue) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread_model = Arc::clone(&model);
        std::thread::Builder::new()
            .name("gantry-embedder".into())
            .spawn(move || match new_context(&thread_model, threads) {
                Ok(ctx) => {
                    let _ = ready_tx.send(Ok(()));
                    run(ctx, &queue);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            })
            .map_err(|e| LoadError::Context(e.to_string()))?;
        ready_rx
            .recv()
            .map_err(|_| LoadError::Context("the embedder thread ended".into()))?
            .map_err(LoadError::Context)?;
        Ok(Self { model, jobs, dimensions, max_input_tokens })
    }

    /// The length of every vector.
    pub fn dimensions(&self) -> usize {
        self.dimensions
    }

    pub fn model(&self) -> &Arc<LoadedModel> {
        &self.model
    }

    /// `text` as the model reads it for an embedding: with its special tokens (BERT's
    /// `[CLS] … [SEP]`, a decoder's BOS).
    pub fn tokenize(&self, text: &str) -> Vec<i32> {
        self.model.llama.vocab().tokenize(text.as_bytes(), true, false).into_iter().map(|t| t.0).collect()
    }

    /// Embeds `inputs` (token ids, special tokens included); the receiver gets one unit vector
    /// per input. Inputs out of the model's bounds fail the whole job before it is queued.
    pub fn submit(&self, inputs: Vec<Vec<i32>>) -> oneshot::Receiver<Result<Embeddings, EmbedError>> {
        let (reply, answer) = oneshot::channel();
        let n_vocab = self.model.info().n_vocab;
        for (index, input) in inputs.iter().enumerate() {
            let refusal = if input.is_empty() {
                Some(EmbedError::Empty { index })
            } else if input.len() > self.max_input_tokens {
                Some(EmbedError::TooLong { index, tokens: input.len(), limit: self.max_input_tokens })
            } else if input.iter().any(|&t| t < 0 || t >= n_vocab) {
                Some(EmbedError::Decode(format!("input {index} has a token id outside the vocabulary")))
            } else {
                None
            };
            if let Some(e) = refusal {
                let _ = reply.send(Err(e));
                return answer;
            }
        }
        let inputs = inputs.into_iter().map(|i| i.into_iter().map(LlamaToken).collect()).collect();
        if let Err(mpsc::SendError(job)) = self.jobs.send(Job { inputs, reply }) {
            let _ = job.reply.send(Err(EmbedError::Stopped));
        }
        answer
    }

    /// [`Self::submit`], waited for on this thread (not inside an async task).
    pub fn embed_blocking(&self, inputs: Vec<Vec<i32>>) -> Result<Embeddings, EmbedError> {
        self.submit(inputs).blocking_recv().unwrap_or(Err(EmbedError::Stopped))
    }
}

fn new_context(model: &LoadedModel, threads: i32) -> Result<LlamaContext<'_>, String> {
    let params = LlamaContextParams::default()
        .with_embeddings(true)
        .with_n_ctx(NonZeroU32::new(BATCH_TOKENS))
        .with_n_batch(BATCH_TOKENS)
        .with_n_ubatch(BATCH_TOKENS)
        .with_n_seq_max(MAX_SEQUENCES)
        // A decoder embedding model's sequences share the cells: any input may take all of them.
        .with_kv_unified(true)
        .with_n_threads(threads)
        .with_n_threads_batch(threads);
    model.llama.new_context(backend::llama_backend(), params).map_err(|e| e.to_string())
}

/// One input of a waiting job: which job, which of its inputs.
struct Slot {
    job: usize,
    input: usize,
}

/// The thread's loop: wait for a job, take every other one waiting, embed them all, answer.
fn run(mut ctx: LlamaContext<'_>, queue: &mpsc::Receiver<Job>) {
    while let Ok(first) = queue.recv() {
        let mut jobs = vec![first];
        jobs.extend(queue.try_iter());
        let mut results: Vec<Result<Embeddings, EmbedError>> =
            jobs.iter().map(|j| Ok(vec![Vec::new(); j.inputs.len()])).collect();
        let slots: Vec<Slot> = jobs
            .iter()
            .enumerate()
            .flat_map(|(job, j)| (0..j.inputs.len()).map(move |input| Slot { job, input }))
            .collect();
        for batch in pack(&slots, |s| jobs[s.job].inputs[s.input].len()) {
            match embed_batch(&mut ctx, batch.iter().map(|s| jobs[s.job].inputs[s.input].as_slice())) {
                Ok(vectors) => {
                    for (slot, vector) in batch.iter().zip(vectors) {
                        if let Ok(out) = &mut results[slot.job] {
                            out[slot.input] = vector;
                        }
                    }
                }
                Err(e) => batch.iter().for_each(|s| results[s.job] = Err(e.clone())),
            }
        }
        for (job, result) in jobs.into_iter().zip(results) {
            let _ = job.reply.send(result);
        }
    }
}

/// `slots` cut into consecutive batches of at most `BATCH_TOKENS` tokens and `MAX_SEQUENCES`
/// sequences (every input fits one: `submit` bounds its length).
fn pack(slots: &[Slot], tokens: impl Fn(&Slot) -> usize) -> Vec<&[Slot]> {
    let mut batches = Vec::new();
    let (mut start, mut used) = (0, 0);
    for (i, slot) in slots.iter().enumerate() {
        let n = tokens(slot);
        if i > start && (used + n > BATCH_TOKENS as usize || i - start == MAX_SEQUENCES as usize) {
            batches.push(&slots[start..i]);
            (start, used) = (i, 0);
        }
        used += n;
    }
    if start < slots.len() {
        batches.push(&slots[start..]);
    }
    batches
}

/// One decode of `inputs`, sequence `i` for the `i`th; their pooled vectors, L2-normalised.
fn embed_batch<'a>(
    ctx: &mut LlamaContext<'_>,
    inputs: impl Iterator<Item = &'a [LlamaToken]> + Clone,
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
            Ok(normalised(pooled))
        })
        .collect()
}

/// `v / max(‖v‖, 1e-12)`, as `torch.nn.functional.normalize` (sentence-transformers) divides;
/// the norm summed in f64 so that long vectors lose nothing to rounding.
pub(crate) fn normalised(v: &[f32]) -> Vec<f32> {
    let norm = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt().max(1e-12);
    // A unit vector's components lie in [-1, 1]: the cast to f32 only rounds.
    #[allow(clippy::cast_possible_truncation)]
    v.iter().map(|&x| (f64::from(x) / norm) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalised_vectors_have_unit_length_and_zero_stays_zero() {
        let v = normalised(&[3.0, 4.0]);
        assert_eq!(v, vec![0.6, 0.8]);
        assert_eq!(normalised(&[0.0, 0.0]), vec![0.0, 0.0]);
    }

    #[test]
    fn pack_cuts_at_the_token_and_sequence_bounds() {
        let slots: Vec<Slot> = (0..130).map(|input| Slot { job: 0, input }).collect();
        let sizes: Vec<usize> = pack(&slots, |_| 1).iter().map(|b| b.len()).collect();
        assert_eq!(sizes, [64, 64, 2]);
        let big = BATCH_TOKENS as usize / 2 + 1;
        let sizes: Vec<usize> = pack(&slots[..3], |_| big).iter().map(|b| b.len()).collect();
        assert_eq!(sizes, [1, 1, 1]);
    }
}
