//! Unit tests of the drafter, its chains and acceptance estimates.

use super::acceptance::*;
use super::chain::*;
use super::config::*;
use super::drafter::*;
use crate::request::SamplingParams;
use crate::speculation::json_layout::JsonMarks;
use crate::speculation::shared_drafts::SharedDrafts;

fn none() -> SharedDrafts {
    SharedDrafts::default()
}

fn auto(max: u32) -> SpeculationConfig {
    SpeculationConfig { mode: Speculate::Auto, draft_max: max }
}

#[test]
fn under_auto_only_seeded_sampling_decodes_one_token_at_a_time() {
    let sampling = |temperature, seed| SamplingParams { temperature, seed, ..SamplingParams::default() };
    let mode = |config: SpeculationConfig, s| config.for_request(&s).mode;
    assert_eq!(mode(auto(8), sampling(0.8, Some(1))), Speculate::Off);
    assert_eq!(mode(auto(8), sampling(0.8, None)), Speculate::Auto);
    assert_eq!(mode(auto(8), sampling(0.0, Some(1))), Speculate::Auto, "greedy ignores the seed");
    let always = SpeculationConfig { mode: Speculate::Always, draft_max: 8 };
    assert_eq!(mode(always, sampling(0.8, Some(1))), Speculate::Always);
}

#[test]
fn proposes_what_followed_the_longest_earlier_match() {
    // "7 8 9" occurred once, followed by 1 2 3; "9" alone also occurred later (followed by 5).
    let mut d = Drafter::new(&[7, 8, 9, 1, 2, 3, 4, 9, 5, 6, 7, 8], auto(8));
    d.push(9);
    assert_eq!(d.propose(3, &none()), [1, 2, 3]);
    assert_eq!(d.propose(1, &none()), [1]);
}

#[test]
fn an_earlier_answer_is_copied_where_it_matches_more_than_the_own_context() {
    let mut shared = SharedDrafts::default();
    shared.record(&[40, 41, 7, 8, 9, 50, 51, 52]);
    // Own context: "8 9" followed by 1 2 (a 2-token match); the earlier answer follows
    // "7 8 9" (3 tokens).
    let mut d = Drafter::new(&[8, 9, 1, 2, 7, 8], auto(8));
    d.push(9);
    assert_eq!(d.propose(8, &shared), [50, 51, 52]);
    assert_eq!((d.matched(), d.source()), (3, DraftSource::Shared));
    // Where the own context matches at least as much, it wins.
    let mut d = Drafter::new(&[7, 8, 9, 1, 2, 7, 8], auto(8));
    d.push(9);
    assert_eq!(d.propose(8, &shared), [1, 2, 7, 8, 9]);
    assert_eq!((d.matched(), d.source()), (3, DraftSource::Own));
    // Its answer, with the last prompt tokens before it, is what the choice leaves behind.
    let mut d = Drafter::new(&[1, 2, 3, 4, 5, 6], auto(8));
    d.push(60);
    d.push(61);
    assert_eq!(d.answer(), [3, 4, 5, 6, 60, 61]);
}

#[test]
fn a_constrained_answer_quotes_its_prompt_from_a_values_first_token() {
    // The prompt writes ` john` (21) after `to` (10); the value opens with `"` (2) and the
    // unspaced `john` (31), so no two tokens match yet.
    let prompt = [5, 10, 21, 22, 23, 11];
    let quoting = |prompt: &[i32]| {
        let mut d = Drafter::new(prompt, auto(8));
        d.quote_unspaced(prompt.iter().map(|&t| if t == 21 { 31 } else { t }).collect());
        d
    };
    let mut d = quoting(&prompt);
    d.push(2);
    d.push(31);
    assert_eq!(d.propose(8, &none()), [22, 23, 11]);
    assert_eq!((d.matched(), d.source()), (1, DraftSource::Quoted));
    // Further on, an ordinary match in the prompt is a quote too.
    d.push(22);
    assert_eq!(d.propose(8, &none()), [23, 11]);
    assert_eq!((d.matched(), d.source()), (2, DraftSource::Quoted));
    // Ambiguous where the prompt writes the word twice, or also unspaced.
    let mut d = quoting(&[21, 22, 10, 21, 23]);
    d.push(31);
    assert!(d.propose(8, &none()).is_empty());
    let mut d = quoting(&[21, 22, 31, 23]);
    d.push(31);
    assert!(d.propose(8, &none()).is_empty());
    // Free text never trusts one token, and a match in its own output is no quote.
    let mut d = Drafter::new(&prompt, auto(8));
    d.push(2);
    d.push(31);
    assert!(d.propose(8, &none()).is_empty());
    let mut d = quoting(&prompt);
    for t in [40, 41, 42, 40, 41] {
        d.push(t);
    }
    assert_eq!(d.propose(8, &none()), [42, 40, 41]);
    assert_eq!(d.source(), DraftSource::Own);
}

#[test]
fn a_quoted_string_ends_where_its_phrase_does_and_closes_as_the_last_one_did() {
    const VOCAB: &[&str] = &[
        "{", "\"", "city", "\":", " \"", "Osaka", " Osaka", ".", " On", "\",\n", " in", " John", "John", " Had", "dad",
        "name",
    ];
    let marks = JsonMarks::new(VOCAB.len(), |t| VOCAB[t as usize].as_bytes().to_vec());
    // "John Haddad. ... in Osaka. On"
    let prompt = [11, 13, 14, 7, 10, 6, 7, 8];
    let unspaced: Vec<i32> = prompt
        .iter()
        .map(|&t| match t {
            11 => 12,
            6 => 5,
            t => t,
        })
        .collect();
    let drafter = |json: bool| {
        let mut d = Drafter::new(&prompt, auto(8));
        d.quote_unspaced(unspaced.clone());
        if json {
            d.draft_json_layout(marks.clone());
        }
        d
    };
    // `{"name": "John`: the quote stops before the full stop; no value closed yet to copy.
    let mut d = drafter(true);
    for t in [0, 1, 15, 3, 4, 12] {
        d.push(t);
    }
    assert_eq!(d.propose(8, &none()), [13, 14]);
    assert_eq!(d.source(), DraftSource::Quoted);
    // `Haddad",\n"city": "Osaka`: the value is whole, so the draft is its close.
    for t in [13, 14, 9, 1, 2, 3, 4, 5] {
        d.push(t);
    }
    assert_eq!(d.propose(8, &none()), [9]);
    // Outside JSON the quote goes on as the prompt does.
    let mut d = drafter(false);
    for t in [0, 1, 15, 3, 4, 12] {
        d.push(t);
    }
    assert_eq!(d.propose(8, &none()), [13, 14, 7, 10, 6, 7, 8]);
}

#[test]
fn a_quoted_value_is_not_taken_over_by_an_earlier_answers_value() {
    // An earlier answer went on `31 40 41` (another customer's john); this prompt goes on 22 23.
    let mut shared = SharedDrafts::default();
    shared.record(&[7, 8, 2, 31, 40, 41]);
    let mut d = Drafter::new(&[5, 10, 21, 22, 23, 11], auto(8));
    d.quote_unspaced(vec![5, 10, 31, 22, 23, 11]);
    for t in [7, 8, 2, 31] {
        d.push(t);
    }
    assert_eq!(d.propose(8, &shared), [22, 23, 11]);
    assert_eq!(d.source(), DraftSource::Quoted);
}

#[test]
fn without_a_grammar_a_chain_is_one_lookup() {
    let mut d = Drafter::new(&[7, 8, 9, 1, 2, 3, 4, 7, 8], auto(8));
    d.push(9);
    let chain = d.chain(8, 8, &none());
    assert_eq!(chain.tokens, [1, 2, 3, 4, 7, 8, 9]);
    assert_eq!(chain.lookups, [Lookup { start: 0, len: 7, matched: 3, source: DraftSource::Own }]);
    assert_eq!(chain.forced_prefix(), 0);
    // Drafting leaves the history as it was: the same chain again.
    assert_eq!(d.chain(8, 8, &none()), chain);
    assert!(d.chain(8, 0, &none()).tokens.is_empty(), "no lookups allowed, nothing forced");
}

#[test]
fn a_chains_expected_tokens_count_forced_drafts_as_certain() {
    let mut chain = Chain::default();
    chain.push_forced(&[1, 2]);
    chain.push_lookup(&[3, 4], 5, DraftSource::Shared);
    chain.push_forced(&[5]);
    chain.push_lookup(&[6], 2, DraftSource::Own);
    let chance = |l: &Lookup| {
        if l.source == DraftSource::Shared {
            0.5
        } else {
            0.1
        }
    };
    assert!((chain.expected_tokens(2, chance) - 3.0).abs() < 1e-9);
    // 1 + 1 + 1 + .5 + .25 + .25 (the forced token after them) + .025
    assert!((chain.expected_tokens(6, chance) - 4.025).abs() < 1e-9);
    assert_eq!((chain.forced_prefix(), chain.forced_within(6)), (2, 3));
    chain.truncate(3);
    assert_eq!(chain.tokens, [1, 2, 3]);
    assert_eq!(chain.lookups, [Lookup { start: 2, len: 1, matched: 5, source: DraftSource::Shared }]);
}

#[test]
fn an_answer_that_repeats_its_layout_drafts_only_the_repeated_part() {
    // `",\n` (9) after each value, then the indent (1) and a quote (2), then a key.
    let mut d = Drafter::new(&[100, 101], auto(8));
    for t in [50, 9, 1, 2, 60, 51, 52, 9, 1, 2, 61, 53, 9] {
        d.push(t);
    }
    assert_eq!(d.own_layout(8), Some(vec![1, 2]), "the keys after it differ");
    // What an earlier answer drafts is agreed on as far as the own output also went on so.
    assert_eq!(d.own_agreement(&[1, 2, 70]), 2);
    assert_eq!(d.own_agreement(&[3]), 0);
    let mut d = Drafter::new(&[100, 101], auto(8));
    d.push(9);
    assert_eq!(d.own_layout(8), None, "written once: nothing to agree with");
}

#[test]
fn a_single_token_match_is_not_enough() {
    let mut d = Drafter::new(&[1, 2, 3, 4, 5], auto(8));
    d.push(3);
    assert!(d.propose(4, &none()).is_empty());
}

#[test]
fn among_equal_matches_the_most_recent_wins_and_drafts_stop_at_the_end() {
    let mut d = Drafter::new(&[1, 2, 3, 1, 2, 4, 1], auto(8));
    d.push(2);
    // Both "1 2" occurrences match two tokens; the later one is followed by 4, 1, 2.
    assert_eq!(d.propose(8, &none()), [4, 1, 2]);
}

#[test]
fn off_never_drafts() {
    let mut d = Drafter::new(&[1, 2, 1], SpeculationConfig { mode: Speculate::Off, draft_max: 8 });
    d.push(2);
    assert!(d.propose(8, &none()).is_empty());
}

#[test]
fn acceptance_is_learned_per_match_length_and_drifts_back() {
    let mut a = Acceptance::default();
    assert!(a.chance(32) > a.chance(2), "longer matches start out likelier");
    assert!((a.expected_tokens(2, 1) - 1.5).abs() < 1e-9, "short matches: a coin flip");
    for _ in 0..50 {
        a.verified(3, 4, 4);
    }
    assert!(a.expected_tokens(3, 4) > 4.5, "{}", a.expected_tokens(3, 4));
    assert!((a.chance(2) - 0.5).abs() < 1e-9, "other classes are untouched");
    for _ in 0..200 {
        a.verified(3, 4, 0);
    }
    assert!(a.expected_tokens(3, 4) < 1.5, "{}", a.expected_tokens(3, 4));
    for _ in 0..3000 {
        a.declined(3);
    }
    assert!((a.chance(3) - 0.6).abs() < 0.01, "back to the prior: {}", a.chance(3));
}

#[test]
fn proposals_remember_the_match_they_continue() {
    let mut d = Drafter::new(&[7, 8, 9, 1, 2, 3, 4, 7, 8], auto(8));
    d.push(9);
    assert_eq!(d.propose(2, &none()), [1, 2]);
    assert_eq!(d.matched(), 3);
}

#[test]
fn proposals_stop_at_draft_max() {
    let history = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 5, 6];
    let mut d = Drafter::new(&history, auto(3));
    assert_eq!(d.propose(8, &none()), [7, 8, 9]);
}

#[test]
fn a_chain_fits_a_budget_of_drafts_and_of_lookups() {
    let chain = || {
        let mut chain = Chain::default();
        chain.push_forced(&[1, 2]);
        chain.push_lookup(&[3, 4], 5, DraftSource::Own);
        chain.push_forced(&[5]);
        chain
    };
    let fitted = |room, lookup_room| {
        let mut c = chain();
        c.fit(room, lookup_room);
        c
    };
    assert_eq!(fitted(10, 10), chain(), "room for all of it");
    assert_eq!(fitted(4, 10).tokens, [1, 2, 3, 4]);
    let no_lookups = fitted(10, 0);
    assert_eq!((no_lookups.tokens.as_slice(), no_lookups.lookups.len()), (&[1, 2][..], 0), "forced ones only");
    let one_lookup = fitted(10, 1);
    assert_eq!(one_lookup.tokens, [1, 2, 3]);
    assert_eq!(one_lookup.lookups[0].len, 1, "the run is cut with the chain");
    assert!(fitted(0, 10).tokens.is_empty());
}
