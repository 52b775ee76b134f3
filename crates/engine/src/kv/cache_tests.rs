//! `KvCache` on the tiny model, in both layouts: after every method, llama.cpp's cells and the
//! mirror agree (`check_mirror`), and what a method promises the scheduler holds.

use std::num::NonZeroU32;

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;

use super::{KvCache, StreamCopies};
use crate::kv::layout::KvLayout;
use crate::kv::seq_id::SeqId;
use crate::model::backend::llama_backend;
use crate::model::LoadedModel;
use crate::request::CacheScope;
use crate::tests::engine::tiny_model;
use crate::Offload;

const SEQS: i32 = 4;

fn s(index: usize) -> SeqId {
    SeqId::new(index)
}
const A: CacheScope = CacheScope(1);
const B: CacheScope = CacheScope(2);

/// Decodes `tokens` into `seq` from position `from`, as a step does: rows recorded as planned.
fn decode(kv: &mut KvCache, ctx: &mut LlamaContext<'_>, seq: usize, from: usize, tokens: &[i32]) {
    let mut batch = LlamaBatch::new(64, 1);
    for (i, &t) in tokens.iter().enumerate() {
        kv.record(s(seq), from + i, t);
        batch.add(LlamaToken(t), (from + i) as i32, &[s(seq).raw()], i + 1 == tokens.len()).unwrap();
    }
    ctx.decode(&mut batch).unwrap();
    kv.decoded();
}

fn agree(kv: &KvCache, ctx: &LlamaContext<'_>, after: &str) {
    if let Err(e) = kv.check_mirror(ctx, SEQS as usize) {
        panic!("after {after}: {e}");
    }
}

/// A context of `SEQS` sequences of 64 positions on the tiny model.
fn context(model: &LoadedModel, layout: KvLayout) -> LlamaContext<'_> {
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(64 * SEQS as u32))
        .with_n_batch(64)
        .with_n_ubatch(64)
        .with_n_seq_max(SEQS as u32)
        .with_kv_unified(layout.is_unified())
        .with_n_threads(1)
        .with_n_threads_batch(1);
    model.llama.new_context(llama_backend(), params).unwrap()
}

fn every_method_keeps_the_mirror(layout: KvLayout, copies: StreamCopies) {
    let model = LoadedModel::load(tiny_model(), None, 1, &Offload::default()).unwrap();
    let mut ctx = context(&model, layout);
    let mut kv = KvCache::new(SEQS as usize, layout, 64 << 20).with_copies(copies);
    let prompt: Vec<i32> = (1..=12).collect();

    kv.take(&mut ctx, s(0), A, 0);
    decode(&mut kv, &mut ctx, 0, 0, &prompt);
    agree(&kv, &ctx, "a prompt");
    assert_eq!(kv.slots().tokens(s(0)), prompt);

    // A prefix shared with two other sequences (a unified cache tags cells, streams copy them).
    kv.share(&mut ctx, s(0), &[s(1), s(2)], 8).unwrap();
    agree(&kv, &ctx, "share");
    assert_eq!(kv.slots().tokens(s(1)), &prompt[..8]);
    assert_eq!(kv.slots().scope(s(2)), A);
    decode(&mut kv, &mut ctx, 1, 8, &[40, 41]);
    agree(&kv, &ctx, "decoding after the shared prefix");

    // Drafts rejected: the cells past what was accepted go.
    decode(&mut kv, &mut ctx, 0, 12, &[20, 21, 22]);
    kv.cut(&mut ctx, s(0), 13);
    agree(&kv, &ctx, "cut");
    assert_eq!(kv.slots().tokens(s(0)).len(), 13);

    // Idle: moved to host memory, then restored into another sequence, cut to the shared part.
    kv.offload(&mut ctx, s(0));
    agree(&kv, &ctx, "offload");
    assert!(kv.slots().tokens(s(0)).is_empty());
    assert_eq!(kv.host_usage().1, 1, "the host holds the sequence");
    let next: Vec<i32> = prompt[..10].iter().copied().chain([99]).collect();
    assert_eq!(kv.restore(&mut ctx, s(3), B, &next, 0), None, "another scope finds nothing");
    kv.take(&mut ctx, s(3), A, 0);
    assert_eq!(kv.restore(&mut ctx, s(3), A, &next, 0), Some(10));
    agree(&kv, &ctx, "restore");
    assert_eq!(kv.slots().tokens(s(3)), &prompt[..10]);
    decode(&mut kv, &mut ctx, 3, 10, &[99]);
    agree(&kv, &ctx, "decoding after a restore");

    // A new request takes sequence 1 keeping 4 entries; the rest goes to host memory first.
    let entries = kv.host_usage().1;
    kv.take(&mut ctx, s(1), A, 4);
    agree(&kv, &ctx, "take");
    assert_eq!(kv.slots().tokens(s(1)), &prompt[..4]);
    assert_eq!(kv.host_usage().1, entries + 1, "what it held beyond 4 was saved");

    // Sequence 3 moves down into the empty sequence 0, and goes on decoding there.
    let moving = kv.slots().tokens(s(3)).to_vec();
    kv.relocate(&mut ctx, s(3), s(0)).unwrap();
    agree(&kv, &ctx, "relocate");
    assert_eq!(kv.slots().tokens(s(0)), moving);
    assert!(kv.slots().tokens(s(3)).is_empty());
    decode(&mut kv, &mut ctx, 0, moving.len(), &[7]);
    agree(&kv, &ctx, "decoding after a relocate");

    // A failed share leaves its destinations empty; sharing nothing empties them too.
    kv.share(&mut ctx, s(1), &[s(2)], 0).unwrap();
    agree(&kv, &ctx, "an empty share");
    assert!(kv.slots().tokens(s(2)).is_empty());

    kv.clear_all(&mut ctx);
    agree(&kv, &ctx, "clear_all");
    assert_eq!(kv.slots().total_tokens(), 0);
}

#[test]
fn every_method_keeps_the_mirror_with_a_stream_per_sequence() {
    every_method_keeps_the_mirror(KvLayout::PerSequence, StreamCopies::ThroughHost);
}

#[test]
fn every_method_keeps_the_mirror_copying_on_the_device() {
    every_method_keeps_the_mirror(KvLayout::PerSequence, StreamCopies::OnDevice);
}

#[test]
fn every_method_keeps_the_mirror_in_a_unified_cache() {
    every_method_keeps_the_mirror(KvLayout::Unified, StreamCopies::ThroughHost);
}

/// A copy on the device waits in llama.cpp for the next decode: until one has run, the state API
/// neither reads a sequence the copy fills (its entries are not there yet) nor writes one it
/// reads or fills: a restore there is refused (the prompt is computed instead), a save of one
/// skipped.
#[test]
fn a_copy_on_the_device_keeps_the_state_api_off_its_sequences_until_a_decode() {
    let model = LoadedModel::load(tiny_model(), None, 1, &Offload::default()).unwrap();
    let mut ctx = context(&model, KvLayout::PerSequence);
    let mut kv = KvCache::new(SEQS as usize, KvLayout::PerSequence, 64 << 20).with_copies(StreamCopies::OnDevice);
    let prompt: Vec<i32> = (1..=12).collect();
    kv.take(&mut ctx, s(0), A, 0);
    decode(&mut kv, &mut ctx, 0, 0, &prompt);
    kv.offload(&mut ctx, s(0));
    kv.take(&mut ctx, s(0), A, 0);
    assert_eq!(kv.restore(&mut ctx, s(0), A, &prompt, 0), Some(12), "no copy pending: restored");

    kv.share(&mut ctx, s(0), &[s(1)], 8).unwrap();
    agree(&kv, &ctx, "a copy on the device");
    assert_eq!(kv.slots().tokens(s(1)), &prompt[..8], "the mirror has it at once");
    assert_eq!(kv.restore(&mut ctx, s(1), A, &prompt, 0), None, "into the sequence being filled");
    assert_eq!(kv.restore(&mut ctx, s(0), A, &prompt, 0), None, "into the sequence being read");
    let entries = kv.host_usage().1;
    kv.take(&mut ctx, s(1), B, 0);
    assert_eq!(kv.host_usage().1, entries, "the sequence being filled was not saved");
    kv.share(&mut ctx, s(0), &[s(1)], 8).unwrap();

    // Once a decode has run the copies, sequence 1 holds what sequence 0 computed.
    decode(&mut kv, &mut ctx, 1, 8, &[40]);
    agree(&kv, &ctx, "decoding after the copy");
    assert_eq!(kv.restore(&mut ctx, s(2), A, &prompt, 0), Some(12), "the state API is free again");
}

#[test]
fn the_check_sees_a_mirror_that_drifted() {
    let model = LoadedModel::load(tiny_model(), None, 1, &Offload::default()).unwrap();
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(64 * SEQS as u32))
        .with_n_batch(64)
        .with_n_seq_max(SEQS as u32)
        .with_n_threads(1)
        .with_n_threads_batch(1);
    let mut ctx = model.llama.new_context(llama_backend(), params).unwrap();
    let mut kv = KvCache::new(SEQS as usize, KvLayout::PerSequence, 0);
    decode(&mut kv, &mut ctx, 2, 0, &[5, 6, 7]);
    agree(&kv, &ctx, "a prompt");
    // Cells cleared behind the cache's back: the check tells.
    let _ = ctx.clear_kv_cache_seq(Some(2), Some(1), None);
    let err = kv.check_mirror(&ctx, SEQS as usize).unwrap_err();
    assert!(err.contains("seq 2"), "{err}");
}
