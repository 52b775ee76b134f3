//! The planner alone: budgets, draft limits, lookups by load, drafts weighed by the step cost,
//! prompt chunking, isolated chunks, row order per KV layout. No llama.cpp.

use std::time::Duration;

use super::*;
use crate::kv::layout::KvLayout;
use crate::scheduler::step::prompt_turns::PromptDeficits;
use crate::speculation::DraftSource;

fn id(index: usize) -> SeqId {
    SeqId::new(index)
}

fn forced(tokens: &[i32]) -> Chain {
    let mut chain = Chain::default();
    chain.push_forced(tokens);
    chain
}

fn choice(seq: usize, token: i32, pos: i32, offered: Chain) -> DecodingChoice {
    DecodingChoice { token, pos, seq: id(seq), limit: 100, offered, constrained: false }
}

fn inputs<'a>(batch_size: usize, decoding: Vec<DecodingChoice>, prompts: Vec<PromptToRead<'a>>) -> StepInputs<'a> {
    StepInputs {
        batch_size,
        chunk: 8,
        reserved: 0,
        weigh_drafts: false,
        prompt_rows_while_decoding: None,
        decoding,
        prompts,
        deficits: Box::leak(Box::default()),
    }
}

fn prompt(seq: usize, tokens: &[i32], prefilled: usize, isolated: bool) -> PromptToRead<'_> {
    PromptToRead {
        seq: id(seq),
        prompt: tokens,
        pending: PendingPrompt { prefilled, text_end: tokens.len(), isolated },
        owner: Owner::default(),
        waited: 0,
    }
}

fn plan(inputs: StepInputs<'_>) -> StepDecision {
    plan_step(inputs, &StepCost::default(), &mut AcceptanceByKind::default(), StepDecision::default())
}

/// `(token, pos, seq, kind)` of each row.
fn rows(rows: &[Row]) -> Vec<(i32, i32, usize, RowKind)> {
    rows.iter().map(|r| (r.token, r.pos, r.seq.index(), r.kind)).collect()
}

use super::rows::Row;

#[test]
fn each_token_then_its_drafts_then_prompt_chunks_in_what_is_left() {
    let text: Vec<i32> = (100..120).collect();
    let d = plan(inputs(
        8,
        vec![choice(0, 10, 5, forced(&[11, 12])), choice(2, 20, 7, Chain::default())],
        vec![prompt(1, &text, 4, false)],
    ));
    assert_eq!(
        rows(&d.plan.decode),
        vec![
            (10, 5, 0, RowKind::Token),
            (11, 6, 0, RowKind::Draft),
            (12, 7, 0, RowKind::Draft),
            (20, 7, 2, RowKind::Token),
        ]
    );
    assert_eq!(d.token_rows, vec![0, 3]);
    assert_eq!(d.drafts.iter().map(|c| c.tokens.clone()).collect::<Vec<_>>(), vec![vec![11, 12], vec![]]);
    // 8 rows, 4 decoding: the prompt reads 4 more, from where it stood.
    assert_eq!(d.prompt_ends, vec![Some(8)]);
    assert_eq!(rows(&d.plan.prompt), (4..8).map(|p| (100 + p, p, 1, RowKind::Prompt)).collect::<Vec<_>>());
    assert!(d.plan.prompt.iter().all(|r| !r.logits), "only a prompt's last token wants logits");
    assert!(d.plan.decode.iter().all(|r| r.logits));
}

#[test]
fn a_decision_planned_into_the_last_steps_keeps_nothing_of_it() {
    let text: Vec<i32> = (100..120).collect();
    let step_one = || {
        inputs(
            8,
            vec![choice(0, 10, 5, forced(&[11, 12])), choice(2, 20, 7, Chain::default())],
            vec![prompt(1, &text, 4, false)],
        )
    };
    let step_two = || inputs(4, vec![choice(3, 30, 9, Chain::default())], vec![]);
    let (cost, mut acceptance) = (StepCost::default(), AcceptanceByKind::default());
    let last = plan_step(step_one(), &cost, &mut acceptance, StepDecision::default());
    let room = last.plan.decode.capacity();
    let reused = plan_step(step_two(), &cost, &mut acceptance, last);
    let fresh = plan(step_two());
    assert_eq!(rows(&reused.plan.decode), rows(&fresh.plan.decode));
    assert_eq!(rows(&reused.plan.prompt), rows(&fresh.plan.prompt));
    assert_eq!((&reused.token_rows, &reused.prompt_ends), (&fresh.token_rows, &fresh.prompt_ends));
    assert_eq!(reused.drafts.len(), 1);
    assert!(reused.spent_inputs.is_empty() && reused.spent_inputs.capacity() >= 1, "the inputs' room comes back");
    assert_eq!(reused.plan.decode.capacity(), room, "the rows' room is the last step's");
}

#[test]
fn a_prompt_read_to_its_end_wants_logits_at_its_last_row_and_later_prompts_wait() {
    let (a, b): (Vec<i32>, Vec<i32>) = ((0..6).collect(), (50..60).collect());
    let d = plan(inputs(
        8,
        vec![choice(0, 1, 3, Chain::default())],
        vec![prompt(1, &a, 2, false), prompt(2, &b, 0, false)],
    ));
    assert_eq!(d.prompt_ends, vec![Some(6), Some(3)], "the first prompt ends; the next takes the rest");
    let last = d.plan.prompt.iter().position(|r| r.logits);
    assert_eq!(last, Some(3), "position 5 of the first prompt");
    let d = plan(inputs(1, vec![choice(0, 1, 3, Chain::default())], vec![prompt(1, &a, 0, false)]));
    assert_eq!(d.prompt_ends, vec![None], "a full batch reads no prompt");
}

#[test]
fn a_short_prompt_is_read_at_once_beside_a_long_one_that_came_first() {
    let (long, short): (Vec<i32>, Vec<i32>) = ((0..100).collect(), (500..503).collect());
    let d = plan(inputs(
        16,
        vec![choice(0, 1, 3, Chain::default())],
        vec![prompt(1, &long, 40, false), prompt(2, &short, 0, false)],
    ));
    assert_eq!(d.prompt_ends, vec![Some(52), Some(3)], "the short one whole, the long one the rest");
    assert_eq!(d.plan.prompt.iter().filter(|r| r.logits).count(), 1, "only the short prompt ended");
    // Rows stay in request order: each prompt's rows where `commit` looks for them.
    let seqs: Vec<usize> = d.plan.prompt.iter().map(|r| r.seq.index()).collect();
    assert_eq!(seqs, [vec![1; 12], vec![2; 3]].concat());
    assert!(d.plan.prompt.last().unwrap().logits);
    // Isolated chunks keep their rows first, whatever their length.
    let d = plan(inputs(16, vec![], vec![prompt(1, &short, 0, false), prompt(2, &long, 0, true)]));
    assert_eq!(d.prompt_ends, vec![Some(3), Some(8)]);
}

#[test]
fn while_choices_decode_prompts_read_at_most_their_cap() {
    let (long, short): (Vec<i32>, Vec<i32>) = ((0..100).collect(), (500..503).collect());
    let capped = |decoding| StepInputs {
        prompt_rows_while_decoding: Some(10),
        ..inputs(64, decoding, vec![prompt(1, &long, 0, false), prompt(2, &short, 0, false), prompt(3, &long, 0, true)])
    };
    let d = plan(capped(vec![choice(0, 1, 3, Chain::default())]));
    assert_eq!(d.prompt_ends, vec![Some(7), Some(3), Some(8)], "10 rows for the two, the isolated chunk apart");
    let d = plan(capped(vec![]));
    assert_eq!(d.prompt_ends, vec![Some(53), Some(3), Some(8)], "nothing decodes: the whole budget");
    // A prompt whose rest fits in two caps is read whole, in one step rather than two.
    let medium: Vec<i32> = (0..20).collect();
    let d = plan(StepInputs {
        prompt_rows_while_decoding: Some(10),
        ..inputs(
            64,
            vec![choice(0, 1, 3, Chain::default())],
            vec![prompt(1, &long, 0, false), prompt(2, &medium, 0, false)],
        )
    });
    assert_eq!(d.prompt_ends, vec![None, Some(20)], "the medium one whole; the long one waits its turn");
}

/// Key 1 streams and sends fresh short prompts every step; key 2's long prompt, capped while the
/// stream decodes, used to get only what the short ones left: nothing, for as long as they came.
/// In deficit round-robin it reads its cap from the second step on, every step; key 1, which
/// read more than it was owed, has its short ones read whole past the cap once its account
/// recovers (every fourth step here), and key 1 alone has them read whole every step.
#[test]
fn a_long_prompt_reads_every_step_beside_another_keys_stream_of_short_ones() {
    let (long, short): (Vec<i32>, Vec<i32>) = ((0..1000).collect(), (500..520).collect());
    let mut deficits = PromptDeficits::default();
    let mut prefilled = 0;
    let (mut reads, mut shorts_whole) = (Vec::new(), 0);
    for _ in 0..12 {
        let mut shorts = vec![prompt(1, &short, 0, false), prompt(2, &short, 0, false)];
        shorts.iter_mut().for_each(|p| p.owner = Owner::key(1));
        let mut waiting = prompt(3, &long, prefilled, false);
        (waiting.owner, waiting.waited) = (Owner::key(2), 0);
        let d = plan(StepInputs {
            prompt_rows_while_decoding: Some(10),
            deficits: &deficits,
            ..inputs(64, vec![choice(0, 1, 3, Chain::default())], [shorts, vec![waiting]].concat())
        });
        let short_reads: Vec<usize> = d.prompt_ends[..2].iter().map(|e| e.unwrap_or(0)).collect();
        shorts_whole += usize::from(short_reads == [20, 20]);
        let read = d.prompt_ends[2].map_or(0, |end| end - prefilled);
        prefilled += read;
        reads.push(read);
        deficits.settle(&[(Owner::key(1), short_reads[0]), (Owner::key(1), short_reads[1]), (Owner::key(2), read)], 10);
    }
    assert_eq!(reads[0], 0, "the first step, as before: key 1's prompts came first");
    assert!(reads[1..].iter().all(|&r| r == 10), "its cap every step after: {reads:?}");
    assert_eq!(shorts_whole, 3, "steps 0, 4 and 8");
    // Key 1 alone: its account says nothing; short prompts are read whole every step.
    let mut alone = PromptDeficits::default();
    for _ in 0..6 {
        let mut shorts = vec![prompt(1, &short, 0, false), prompt(2, &short, 0, false)];
        shorts.iter_mut().for_each(|p| p.owner = Owner::key(1));
        let d = plan(StepInputs {
            prompt_rows_while_decoding: Some(10),
            deficits: &alone,
            ..inputs(64, vec![choice(0, 1, 3, Chain::default())], shorts)
        });
        assert_eq!(d.prompt_ends, [Some(20), Some(20)]);
        alone.settle(&[(Owner::key(1), 20), (Owner::key(1), 20)], 10);
    }
}

/// Within one key's prompts (or keys owed alike), one that waited `AGED_AFTER_STEPS` steps goes
/// before shorter ones.
#[test]
fn a_prompt_that_waited_long_goes_before_shorter_ones() {
    let (long, medium): (Vec<i32>, Vec<i32>) = ((0..100).collect(), (0..20).collect());
    let capped = |waited| {
        let mut old = prompt(1, &long, 0, false);
        old.waited = waited;
        plan(StepInputs {
            prompt_rows_while_decoding: Some(10),
            ..inputs(64, vec![choice(0, 1, 3, Chain::default())], vec![old, prompt(2, &medium, 0, false)])
        })
    };
    assert_eq!(capped(AGED_AFTER_STEPS - 1).prompt_ends, vec![None, Some(20)]);
    assert_eq!(capped(AGED_AFTER_STEPS).prompt_ends, vec![Some(10), Some(20)], "its cap first, then the rest");
}

#[test]
fn drafts_stop_at_the_budget_and_at_each_choices_limit() {
    let mut short = choice(1, 20, 0, forced(&[21, 22, 23, 24]));
    short.limit = 2;
    let d = plan(inputs(
        8,
        vec![choice(0, 10, 0, forced(&[11, 12, 13, 14])), short, choice(2, 30, 0, forced(&[31, 32]))],
        vec![],
    ));
    // 8 rows, 3 tokens: 5 for drafts, the first choice takes 4, the second the 1 left.
    assert_eq!(d.drafts.iter().map(|c| c.tokens.len()).collect::<Vec<_>>(), vec![4, 1, 0]);
    assert_eq!(d.plan.decode.len(), 8);
    let d = plan(inputs(64, vec![choice(0, 10, 0, forced(&[11, 12, 13, 14]))], vec![]));
    assert_eq!(d.drafts[0].tokens.len(), 4);
    let mut limited = choice(0, 10, 0, forced(&[11, 12, 13, 14]));
    limited.limit = 2;
    let d = plan(inputs(64, vec![limited], vec![]));
    assert_eq!(d.drafts[0].tokens, vec![11, 12], "tokens left to produce and context cap the drafts");
}

#[test]
fn lookups_are_fed_only_while_few_streams_decode_and_forced_drafts_always() {
    let mixed = || {
        let mut chain = forced(&[11]);
        chain.push_lookup(&[12, 13], 5, DraftSource::Own);
        chain
    };
    let two: Vec<DecodingChoice> = (0..2).map(|s| choice(s, 10, 0, mixed())).collect();
    let d = plan(inputs(64, two, vec![]));
    assert!(d.drafts.iter().all(|c| c.tokens == vec![11, 12, 13]), "two streams: lookups fed");
    let three: Vec<DecodingChoice> = (0..3).map(|s| choice(s, 10, 0, mixed())).collect();
    let d = plan(inputs(64, three, vec![]));
    assert!(d.drafts.iter().all(|c| c.tokens == vec![11] && c.lookups.is_empty()), "three: forced drafts only");
}

#[test]
fn a_lookup_is_fed_only_where_the_measured_step_cost_says_it_pays() {
    let step = |ms: f64| Duration::from_secs_f64(ms / 1000.0);
    let weighed = |cost: &StepCost| {
        let mut chain = forced(&[11, 12]);
        chain.push_lookup(&[13, 14, 15], 8, DraftSource::Own);
        let mut i = inputs(64, vec![choice(0, 10, 0, chain)], vec![]);
        i.weigh_drafts = true;
        plan_step(i, cost, &mut AcceptanceByKind::default(), StepDecision::default()).drafts.remove(0)
    };
    // Every size as cheap as one position: the whole lookup pays.
    let mut flat = StepCost::default();
    for n in 1..=8 {
        flat.observe(n, step(40.0), false);
    }
    assert_eq!(weighed(&flat).tokens, vec![11, 12, 13, 14, 15]);
    // Each position costs as much as a whole step: no lookup pays, the forced drafts stay.
    let mut linear = StepCost::default();
    for n in 1..=8 {
        linear.observe(n, step(40.0 * n as f64), false);
    }
    let chain = weighed(&linear);
    assert_eq!(chain.tokens, vec![11, 12]);
    assert!(chain.lookups.is_empty());
    // Nothing measured yet: forced drafts only, until a step has been timed.
    assert_eq!(weighed(&StepCost::default()).tokens, vec![11, 12]);
}

#[test]
fn rows_held_for_an_isolated_chunk_are_kept_from_drafts() {
    let text: Vec<i32> = (0..20).collect();
    let mut i =
        inputs(16, vec![choice(0, 1, 0, forced(&(2..12).collect::<Vec<_>>()))], vec![prompt(1, &text, 0, true)]);
    i.reserved = 8;
    let d = plan(i);
    assert_eq!(d.drafts[0].tokens.len(), 7, "16 rows: 1 token, 8 held for the chunk");
    assert_eq!(d.prompt_ends, vec![Some(8)], "the whole fixed chunk");
    let mut i =
        inputs(16, vec![choice(0, 1, 0, forced(&(2..12).collect::<Vec<_>>()))], vec![prompt(1, &text, 0, true)]);
    i.reserved = 0;
    let d = plan(i);
    assert_eq!(d.drafts[0].tokens.len(), 10);
    assert_eq!(d.prompt_ends, vec![None], "5 rows left: an isolated chunk is read whole or not at all");
}

#[test]
fn the_planned_rows_go_into_the_batch_grouped_by_sequence_per_sequence_layout() {
    let text: Vec<i32> = (0..3).collect();
    let d = plan(inputs(
        16,
        vec![choice(3, 30, 9, forced(&[31])), choice(0, 1, 4, Chain::default())],
        vec![prompt(2, &text, 0, false)],
    ));
    let (per_sequence, _) = d.plan.ordered(KvLayout::PerSequence, &[]);
    let seqs = |rows: &[Row]| rows.iter().map(|r| r.seq.index()).collect::<Vec<_>>();
    assert_eq!(seqs(&per_sequence), vec![0, 2, 2, 2, 3, 3]);
    let (unified, _) = d.plan.ordered(KvLayout::Unified, &[]);
    assert_eq!(seqs(&unified), vec![2, 2, 2, 3, 3, 0], "prompt chunks first, then decoding rows");
}
