//! Evaluating a request's images into its KV sequence, one per step.

use std::time::Instant;

use llama_cpp_2::context::LlamaContext;

use crate::error::EngineError;
use crate::scheduler::request::{ActiveRequest, Phase};
use crate::scheduler::Scheduler;
use crate::telemetry;

impl Scheduler {
    /// Evaluates the next image of one prefilling request: the vision encoder runs, then its
    /// embeddings are decoded into the request's first sequence (the others get the whole
    /// prompt once it is read: `spread_prompts`).
    /// One image per step, so running streams wait for at most one encode. A failure is the
    /// step's to end: that request alone.
    pub(in crate::scheduler) fn evaluate_image(&mut self, ctx: &mut LlamaContext<'_>) -> ImageStep {
        let Some(vision) = self.model.vision.as_ref() else { return ImageStep::None };
        let at_image = |r: &ActiveRequest| match r.phase {
            Phase::Prefilling { read } => r.image_at(read).is_some(),
            _ => false,
        };
        let Some(i) = self.active.iter().position(at_image) else {
            return ImageStep::None;
        };
        let req = &mut self.active[i];
        let image = req.image_at(req.read()).expect("found above").clone();
        let seq = req.choices[0].seq_id;
        let (start, end) = (image.start, image.start + image.len);
        let started = Instant::now();
        let turn = self.cfg.decode_turns.as_ref().map(|t| t.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        let evaluated = vision.evaluate(ctx, &image, seq.raw(), self.cfg.batch_size as i32);
        drop(turn);
        match evaluated {
            Ok(()) => {
                telemetry::image_evaluated(image.len, started.elapsed());
                for pos in start..end {
                    self.kv.record(seq, pos, req.prompt[pos]);
                }
                req.set_read(end);
                ImageStep::Evaluated
            }
            Err(e) => {
                tracing::error!(error = %e, "an image could not be evaluated");
                ImageStep::Failed(i, EngineError::Decode(format!("the image could not be encoded: {e}")))
            }
        }
    }
}

/// What the image stage did this step.
pub(crate) enum ImageStep {
    /// No request was at an image.
    None,
    /// One image went into its request's sequence: progress, even if the batch is empty.
    Evaluated,
    /// The request at this index in `active` could not have its image encoded.
    Failed(usize, EngineError),
}
