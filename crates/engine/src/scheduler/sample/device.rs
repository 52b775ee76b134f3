//! Sampling on the device that computed the logits (llama.cpp's backend sampling). On a GPU the
//! logits of a sampled sequence then never leave it: llama.cpp appends temperature → draw to the
//! decode's graph for that sequence and copies back one token, where the host path
//! copies 151,936 floats per row and samples them on the CPU.
//!
//! Only choices whose whole sampler is a temperature run there: no top-p, no logit bias, no
//! penalties, no grammar, no logprobs, no seed (seeded requests keep the host's exact,
//! reproducible sampler), one choice per request, no images, no tools that may start a grammar
//! mid-way. Everything else samples on the host as before (`sampler`), in the same batch.
//!
//! A chain stays attached to its sequence after its request ends: llama.cpp rebuilds its
//! scheduler (`sched_reserve`) whenever a sequence's sampler changes, so the next request on
//! that sequence with the same temperature keeps it and costs nothing. A request that
//! needs the host takes it off before its prompt is decoded, since a sequence with a device
//! sampler gets no logits.
//!
//! Thread rule: every method runs on the scheduler thread, which owns the context.
#![allow(unsafe_code, reason = "llama.cpp's backend-sampling API has no safe wrapper in llama-cpp-2")]

use std::collections::HashMap;
use std::ptr::NonNull;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_sys_2 as sys;

use crate::kv::seq_id::SeqId;
use crate::request::SamplingParams;

/// Where choices are sampled: `Auto` samples on the device when the model's layers are on a GPU
/// and few sequences run (`AUTO_MAX_STREAMS`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DeviceSampling {
    #[default]
    Auto,
    On,
    Off,
}

/// Under `Auto`, the most busy sequences (the new request's included) for a request to sample on
/// the device. Measured on an H200 (0.5B, temperature 0.8, docs/sampling.md#on-the-device): one
/// stream drew ~1.2x faster on the device, but 64 ran ~1.5-2x faster on the host. A sequence
/// with a device sampler breaks llama.cpp's graph reuse whenever the set of sampled rows
/// changes (0-3% of ubatches reused, against ~90% on the host) and is not moved down into gaps
/// (`compact`), so its cost grows with the streams around it. Between 1 and 64 it is not
/// measured; 4 keeps single and near-single streams on the device.
pub(crate) const AUTO_MAX_STREAMS: usize = 4;

/// What a device chain computes: the temperature, as bits (a chain is reused only for the very
/// same value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChainKey {
    temperature: u32,
}

impl ChainKey {
    /// The chain a request's choices can be sampled by on the device, if they can.
    pub(crate) fn for_request(sampling: &SamplingParams, host_only: bool) -> Option<Self> {
        // Top-p stays on the host: llama.cpp's device top-p sorts the whole vocabulary of every
        // row, slower than the host's candidate selection (docs/sampling.md#on-the-device).
        let device = !host_only
            && sampling.temperature > 0.0
            && sampling.top_p >= 1.0
            && sampling.top_k == 0
            && sampling.seed.is_none()
            && sampling.logit_bias.is_empty()
            && sampling.presence_penalty == 0.0
            && sampling.frequency_penalty == 0.0;
        device.then(|| Self { temperature: sampling.temperature.to_bits() })
    }
}

struct Attached {
    key: ChainKey,
    chain: NonNull<sys::llama_sampler>,
}

/// The device chains attached to the context's sequences.
pub(crate) struct DeviceSamplers {
    ctx: NonNull<sys::llama_context>,
    attached: HashMap<SeqId, Attached>,
}

impl DeviceSamplers {
    /// `None` when the context's handle cannot be had (see `raw_context`).
    pub(crate) fn new(ctx: &LlamaContext<'_>) -> Option<Self> {
        let raw = raw_context(ctx);
        if raw.is_none() {
            tracing::warn!("device sampling unavailable: llama-cpp-2 did not expose the context; sampling on the host");
        }
        raw.map(|ctx| Self { ctx, attached: HashMap::new() })
    }

    /// Makes `seq` sample by `key` on the device, or on the host when `key` is `None`. Returns
    /// whether its tokens now come from the device (llama.cpp refuses a chain its backend cannot
    /// run, and the host samples then).
    pub(crate) fn assign(&mut self, seq: SeqId, key: Option<ChainKey>) -> bool {
        match (self.attached.get(&seq), key) {
            (Some(a), Some(key)) if a.key == key => return true,
            (None, None) => return false,
            _ => {}
        }
        self.detach(seq);
        let Some(key) = key else { return false };
        let chain = new_chain(key);
        // SAFETY: the context outlives `self` (see `Drop`), the chain is ours until detached.
        let taken = unsafe { sys::llama_set_sampler(self.ctx.as_ptr(), seq.raw(), chain.as_ptr()) };
        if taken {
            self.attached.insert(seq, Attached { key, chain });
        } else {
            // SAFETY: llama.cpp did not keep it.
            unsafe { sys::llama_sampler_free(chain.as_ptr()) };
        }
        taken
    }

    fn detach(&mut self, seq: SeqId) {
        if let Some(a) = self.attached.remove(&seq) {
            // SAFETY: as in `assign`; once detached the context no longer refers to the chain.
            unsafe {
                sys::llama_set_sampler(self.ctx.as_ptr(), seq.raw(), std::ptr::null_mut());
                sys::llama_sampler_free(a.chain.as_ptr());
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn attached(&self) -> usize {
        self.attached.len()
    }
}

/// The scheduler holding this is dropped before the context it was made from (both live in the
/// scheduler thread's closure, the context declared first), so the chains are taken off a live
/// context before they are freed.
impl Drop for DeviceSamplers {
    fn drop(&mut self) {
        let seqs: Vec<SeqId> = self.attached.keys().copied().collect();
        for seq in seqs {
            self.detach(seq);
        }
    }
}

fn new_chain(key: ChainKey) -> NonNull<sys::llama_sampler> {
    // SAFETY: plain constructors; the chain owns what is added to it.
    unsafe {
        let chain = sys::llama_sampler_chain_init(sys::llama_sampler_chain_default_params());
        sys::llama_sampler_chain_add(chain, sys::llama_sampler_init_temp(f32::from_bits(key.temperature)));
        // LLAMA_DEFAULT_SEED: a random seed per chain (unseeded requests only come here).
        sys::llama_sampler_chain_add(chain, sys::llama_sampler_init_dist(u32::MAX));
        NonNull::new(chain).expect("llama_sampler_chain_init returned null")
    }
}

/// The `llama_context` behind `ctx`. llama-cpp-2 0.1.160 wraps backend sampling only at context
/// creation, for samplers fixed for the context's life, and keeps the handle private; its
/// `Debug` prints it. Where that output has no handle, device sampling is off; the handle found
/// is checked against the context's own sizes before use. `device_tests` pins this for
/// the locked version, so an upgrade that changes it fails there, not in production.
pub(crate) fn raw_context(ctx: &LlamaContext<'_>) -> Option<NonNull<sys::llama_context>> {
    let shown = format!("{ctx:?}");
    let hex = shown.split("context: 0x").nth(1)?;
    let digits: String = hex.chars().take_while(char::is_ascii_hexdigit).collect();
    let addr = usize::from_str_radix(&digits, 16).ok()?;
    let raw = NonNull::new(addr as *mut sys::llama_context)?;
    // SAFETY: the address is the one this live context's `Debug` printed for its handle.
    let same = unsafe {
        sys::llama_n_ctx(raw.as_ptr()) == ctx.n_ctx()
            && sys::llama_n_batch(raw.as_ptr()) == ctx.n_batch()
            && sys::llama_n_ubatch(raw.as_ptr()) == ctx.n_ubatch()
    };
    same.then_some(raw)
}

#[cfg(test)]
#[path = "device_tests.rs"]
mod tests;
