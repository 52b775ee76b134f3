//! The first token of every choice a step computed logits for, sampled in parallel: llama.cpp's
//! threads are idle between two decodes, and with many streams sampling them one after another
//! on the scheduler thread was a large share of the step.
//!
//! Only the first position of a choice is sampled here. Draft tokens fed after it are verified in
//! order by the scheduler, since whether the next position is sampled at all, and under which
//! grammar, depends on what producing this one did (stop strings, a tool call that starts).

use std::panic::AssertUnwindSafe;

use llama_cpp_2::context::LlamaContext;
use rayon::prelude::*;

use crate::faults::{Fault, FaultPoint};
use crate::sampling::Sampler;
use crate::sequence::ActiveRequest;

/// Per running request (same order as `active`): the token sampled for each of its choices that
/// had logits this step, or why its sampling panicked.
pub(crate) type FirstTokens = Vec<Result<Vec<Option<i32>>, String>>;

struct Work<'a> {
    request: usize,
    choice: usize,
    sampler: &'a mut Sampler,
    logits: &'a [f32],
    fault: &'a Fault,
    produced: u32,
    token: Option<Result<i32, String>>,
}

impl Work<'_> {
    fn run(&mut self) {
        // A panic in a sampler or its grammar ends that request alone (see `end_panicked`).
        let sampled = std::panic::catch_unwind(AssertUnwindSafe(|| {
            self.fault.check(FaultPoint::Sampling, self.produced);
            self.sampler.sample(self.logits)
        }));
        self.token = Some(sampled.map_err(|payload| crate::panic_message(payload.as_ref())));
    }
}

/// Samples the first position of every choice with a `batch_idx`, on rayon's pool.
pub(crate) fn sample_first_tokens(active: &mut [ActiveRequest], ctx: &LlamaContext<'_>) -> FirstTokens {
    let mut out: FirstTokens = active.iter().map(|req| Ok(vec![None; req.choices.len()])).collect();
    let mut work = Vec::new();
    for (r, req) in active.iter_mut().enumerate() {
        let ActiveRequest { choices, fault, usage, .. } = req;
        let produced = usage.completion_tokens;
        let gathered = std::panic::catch_unwind(AssertUnwindSafe(move || {
            let (choices, mut mine) = (choices, Vec::new());
            for (i, c) in choices.iter_mut().enumerate() {
                if let Some(idx) = c.batch_idx {
                    let logits = ctx.get_logits_ith(idx);
                    let sampler = &mut c.sampler;
                    mine.push(Work { request: r, choice: i, sampler, logits, fault, produced, token: None });
                }
            }
            mine
        }));
        match gathered {
            Ok(mine) => work.extend(mine),
            Err(payload) => out[r] = Err(crate::panic_message(payload.as_ref())),
        }
    }
    // One choice is sampled right here: handing it to the pool would only add a wake-up.
    if work.len() > 1 {
        work.par_iter_mut().for_each(Work::run);
    } else {
        work.iter_mut().for_each(Work::run);
    }
    for w in work {
        match (w.token.expect("every choice was sampled"), &mut out[w.request]) {
            (Ok(token), Ok(tokens)) => tokens[w.choice] = Some(token),
            (Err(why), slot @ Ok(_)) => *slot = Err(why),
            (_, Err(_)) => {}
        }
    }
    out
}
