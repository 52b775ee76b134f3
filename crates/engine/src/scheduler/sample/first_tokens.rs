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
use crate::scheduler::request::ActiveRequest;
use crate::scheduler::sample::sampler::Sampler;
use crate::scheduler::step::batch::ChoiceRows;

/// Per running request (same order as `Scheduler::active`): the token sampled for each of its choices that
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
        self.token = Some(sampled.map_err(|payload| crate::error::panic_message(payload.as_ref())));
    }
}

/// The token the device sampled at batch row `idx` for a choice sampled there (see
/// `sample::device`). A row without one is a bug in how rows were given out; it panics, which
/// ends that request alone.
pub(crate) fn device_token(ctx: &LlamaContext<'_>, idx: i32) -> i32 {
    match ctx.sampled_token_ith(idx) {
        Some(token) => token.0,
        None => panic!("no token sampled on the device at batch row {idx}"),
    }
}

/// Samples the first position of every choice with rows in the batch, on rayon's pool; choices
/// sampled on the device only read their token.
pub(crate) fn sample_first_tokens(
    active: &mut [ActiveRequest],
    rows: &[Option<ChoiceRows>],
    ctx: &LlamaContext<'_>,
) -> FirstTokens {
    let mut out: FirstTokens = active.iter().map(|req| Ok(vec![None; req.choices.len()])).collect();
    let mut work = Vec::new();
    for (r, req) in active.iter_mut().enumerate() {
        let ActiveRequest { choices, fault, usage, .. } = req;
        let produced = usage.completion_tokens;
        let gathered = std::panic::catch_unwind(AssertUnwindSafe(move || {
            let (choices, mut mine, mut on_device) = (choices, Vec::new(), Vec::new());
            for (i, c) in choices.iter_mut().enumerate() {
                match rows[c.seq_id.index()].as_ref().map(|rows| rows.row) {
                    Some(idx) if c.on_device => {
                        fault.check(FaultPoint::Sampling, produced);
                        on_device.push((i, device_token(ctx, idx)));
                    }
                    Some(idx) => {
                        let logits = ctx.get_logits_ith(idx);
                        let sampler = &mut c.sampler;
                        mine.push(Work { request: r, choice: i, sampler, logits, fault, produced, token: None });
                    }
                    None => {}
                }
            }
            (mine, on_device)
        }));
        match (gathered, &mut out[r]) {
            (Ok((mine, on_device)), Ok(tokens)) => {
                work.extend(mine);
                for (i, token) in on_device {
                    tokens[i] = Some(token);
                }
            }
            (Ok(_), Err(_)) => {}
            (Err(payload), slot) => *slot = Err(crate::error::panic_message(payload.as_ref())),
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
