//! The step's rules alone: budgets, draft limits, prompt chunking, row order per KV layout.

use super::*;

fn id(index: usize) -> SeqId {
    SeqId::new(index)
}

#[test]
fn every_decoding_choice_comes_before_any_draft() {
    // 16 rows, 3 choices decoding, no isolated chunk: 13 rows for drafts.
    let mut b = Budget::new(16, 3, 0, false);
    assert_eq!(b.draft_room(100), (13, 0), "three streams decode: no lookup drafts, forced ones may");
    for _ in 0..3 {
        b.take_token();
    }
    assert_eq!(b.left(), 13);
    let b = Budget::new(16, 2, 0, true);
    assert_eq!(b.draft_room(100), (14, 14));
    assert_eq!(b.draft_room(5), (5, 5), "a choice's own limit (tokens left, context) caps both");
}

#[test]
fn drafts_use_up_the_budget_and_forced_ones_spare_the_lookup_share() {
    let mut b = Budget::new(16, 2, 0, true);
    b.take_token();
    b.take_drafts(6, 4); // 4 forced, 2 looked up
    assert_eq!(b.draft_room(100), (8, 12));
    assert_eq!(b.left(), 9);
    b.take_token();
    b.take_drafts(8, 0);
    assert_eq!(b.draft_room(100), (0, 4));
    assert_eq!(b.left(), 0);
}

#[test]
fn rows_held_for_isolated_prompt_chunks_are_kept_from_drafts() {
    let b = Budget::new(32, 1, 20, true);
    assert_eq!(b.draft_room(100), (11, 11));
    let b = Budget::new(8, 4, 20, true);
    assert_eq!(b.draft_room(100), (0, 0), "never below nothing");
}

#[test]
fn a_prompt_is_read_as_far_as_the_budget_and_its_text_go() {
    let p = |prefilled, text_end| PendingPrompt { prefilled, text_end, isolated: false };
    assert_eq!(prompt_chunk_end(p(0, 100), 30, 16), Some(30));
    assert_eq!(prompt_chunk_end(p(90, 100), 30, 16), Some(100));
    assert_eq!(prompt_chunk_end(p(40, 40), 30, 16), None, "an image comes next: evaluate_image reads it");
    assert_eq!(prompt_chunk_end(p(0, 100), 0, 16), None);
}

#[test]
fn an_isolated_prompt_takes_a_whole_fixed_chunk_or_none() {
    let p = |prefilled, text_end| PendingPrompt { prefilled, text_end, isolated: true };
    assert_eq!(prompt_chunk_end(p(0, 100), 30, 16), Some(16));
    assert_eq!(prompt_chunk_end(p(16, 100), 15, 16), None, "15 rows free: the chunk would be cut");
    assert_eq!(prompt_chunk_end(p(20, 100), 12, 16), Some(32), "a chunk started elsewhere ends on the grid");
    assert_eq!(prompt_chunk_end(p(96, 100), 4, 16), Some(100), "the last chunk ends with the text");
}

fn plan() -> StepPlan {
    let mut plan = StepPlan::default();
    // Sequence 3 decodes a token and a draft, sequence 1 a token; sequence 2's prompt ends.
    assert_eq!(plan.push_decode(50, 9, id(3), RowKind::Token), 0);
    assert_eq!(plan.push_decode(51, 10, id(3), RowKind::Draft), 1);
    assert_eq!(plan.push_decode(60, 4, id(1), RowKind::Token), 2);
    plan.push_prompt(7, 0, id(2), false);
    plan.push_prompt(8, 1, id(2), true);
    plan
}

#[test]
fn with_a_stream_per_sequence_rows_go_by_ascending_sequence() {
    let (rows, at) = plan().ordered(KvLayout::PerSequence, &[]);
    let seqs: Vec<i32> = rows.iter().map(|r| r.seq.raw()).collect();
    assert_eq!(seqs, [1, 2, 2, 3, 3]);
    assert_eq!(rows[3], Row { token: 50, pos: 9, seq: id(3), logits: true, kind: RowKind::Token });
    assert_eq!(rows[4].kind, RowKind::Draft, "a draft stays right after its token");
    assert_eq!(rows[2], Row { token: 8, pos: 1, seq: id(2), logits: true, kind: RowKind::Prompt });
    assert!(!rows[1].logits, "only a prompt's last row wants logits");
    // Planned prompt rows first, then decoding rows: each found where `at` says.
    let planned = plan();
    for (i, row) in planned.prompt.iter().chain(&planned.decode).enumerate() {
        assert_eq!(&rows[at[i]], row);
    }
}

#[test]
fn in_a_unified_cache_prompt_chunks_come_first() {
    let (rows, at) = plan().ordered(KvLayout::Unified, &[]);
    let kinds: Vec<RowKind> = rows.iter().map(|r| r.kind).collect();
    assert_eq!(kinds, [RowKind::Prompt, RowKind::Prompt, RowKind::Token, RowKind::Draft, RowKind::Token]);
    assert_eq!(at, [0, 1, 2, 3, 4]);
}

#[test]
fn an_isolated_sequence_forms_a_run_of_its_own() {
    // Sequences 1, 2, 3 would share one ubatch; isolating 2 splits its rows from both others.
    let (rows, _) = plan().ordered(KvLayout::PerSequence, &[id(2)]);
    let seqs: Vec<i32> = rows.iter().map(|r| r.seq.raw()).collect();
    // Groups by descending first id (llama.cpp starts a ubatch at the first row not yet taken
    // and adds the sequences whose ids follow on): 3 alone, 2 alone, 1 alone.
    assert_eq!(seqs, [3, 3, 2, 2, 1]);
    assert_ne!(seqs, [1, 2, 2, 3, 3], "the plain order would join 1, 2 and 3");
}
