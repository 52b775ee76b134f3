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

/// The token sampled at each choice's first position this step, by sequence (`SeqId::index`),
/// and the requests (index in `Scheduler::active`) whose sampling panicked, with why.
#[derive(Debug, Default)]
pub(crate) struct FirstTokens {
    pub by_seq: Vec<Option<i32>>,
    pub panicked: Vec<(usize, String)>,
}

struct Work<'a> {
    request: usize,
    seq: usize,
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
/// sampled on the device only read their token. `into` is the last step's, emptied here.
pub(crate) fn sample_first_tokens(
    active: &mut [ActiveRequest],
    rows: &[Option<ChoiceRows>],
    ctx: &LlamaContext<'_>,
    mut into: FirstTokens,
) -> FirstTokens {
    into.by_seq.clear();
    into.by_seq.resize(rows.len(), None);
    into.panicked.clear();
    let FirstTokens { by_seq, panicked } = &mut into;
    let mut work = Vec::new();
    for (r, req) in active.iter_mut().enumerate() {
        let ActiveRequest { choices, fault, usage, .. } = req;
        let produced = usage.completion_tokens;
        let before = work.len();
        let (gathering, tokens) = (&mut work, &mut *by_seq);
        let gathered = std::panic::catch_unwind(AssertUnwindSafe(move || {
            for c in choices {
                match rows[c.seq_id.index()].as_ref().map(|rows| rows.row) {
                    Some(idx) if c.on_device => {
                        fault.check(FaultPoint::Sampling, produced);
                        tokens[c.seq_id.index()] = Some(device_token(ctx, idx));
                    }
                    Some(idx) => {
                        let logits = ctx.get_logits_ith(idx);
                        let (seq, sampler) = (c.seq_id.index(), &mut c.sampler);
                        gathering.push(Work { request: r, seq, sampler, logits, fault, produced, token: None });
                    }
                    None => {}
                }
            }
        }));
        if let Err(payload) = gathered {
            // None of its choices is sampled.
            work.truncate(before);
            panicked.push((r, crate::error::panic_message(payload.as_ref())));
        }
    }
    // One choice is sampled right here: handing it to the pool would only add a wake-up.
    if work.len() > 1 {
        work.par_iter_mut().for_each(Work::run);
    } else {
        work.iter_mut().for_each(Work::run);
    }
    for w in work {
        match w.token.expect("every choice was sampled") {
            Ok(token) => by_seq[w.seq] = Some(token),
            Err(why) if !panicked.iter().any(|&(r, _)| r == w.request) => panicked.push((w.request, why)),
            Err(_) => {}
        }
    }
    into
}
