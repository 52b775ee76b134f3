//! The weighted-sharing measurement's pure parts: window clipping, shares, ratios, the section.

use super::*;

/// A request of `tenant` streaming one token a second from `first_token` to `end`.
fn finished(tenant: Tenant, first_token: f64, end: f64) -> Finished {
    let delta_times: Vec<f64> = (0..).map(|i| first_token + i as f64).take_while(|&t| t < end).collect();
    Finished { completion_tokens: delta_times.len() as u64, tenant, delta_times, end }
}

#[test]
fn the_window_clips_sequence_time_and_holds_only_its_own_times() {
    let w = Window { start: 5.0, end: 65.0 };
    assert_eq!(w.overlap(1.0, 4.0), 0.0, "before the window");
    assert_eq!(w.overlap(3.0, 7.0), 2.0, "across its start");
    assert_eq!(w.overlap(10.0, 12.5), 2.5, "inside");
    assert_eq!(w.overlap(64.0, 70.0), 1.0, "across its end");
    assert_eq!(w.overlap(0.0, 100.0), 60.0, "over all of it");
    assert_eq!(w.overlap(66.0, 67.0), 0.0, "after it");
    assert!(w.holds(5.0) && w.holds(64.9) && !w.holds(65.0) && !w.holds(4.9));
}

#[test]
fn tokens_count_by_when_their_deltas_arrived_at_usages_worth() {
    let w = Window { start: 5.0, end: 65.0 };
    // Deltas at 3, 4, 5, 6: half inside.
    let mut across = finished(Tenant::Heavy, 3.0, 6.5);
    assert_eq!(across.tokens_in(w), 2.0);
    // Usage says 8 tokens came in those 4 deltas: each inside is worth 2.
    across.completion_tokens = 8;
    assert_eq!(across.tokens_in(w), 4.0);
    assert_eq!(finished(Tenant::Light, 70.0, 80.0).tokens_in(w), 0.0);
}

#[test]
fn shares_add_tokens_and_clipped_time_per_tenant() {
    let w = Window { start: 5.0, end: 65.0 };
    let done = [
        finished(Tenant::Heavy, 3.0, 7.0),   // 2 s and 2 tokens (at 5, 6) inside
        finished(Tenant::Heavy, 10.0, 12.0), // 2 s, 2 tokens
        finished(Tenant::Heavy, 64.0, 66.0), // 1 s, 1 token (at 64)
        finished(Tenant::Light, 1.0, 4.0),   // warm-up: nothing, and not a request of the window
        finished(Tenant::Light, 20.0, 24.0), // 4 s, 4 tokens
    ];
    let [heavy, light] = shares(&done, w);
    assert_eq!(heavy, Share { requests: 3, tokens: 5.0, sequence_s: 5.0 });
    assert_eq!(light, Share { requests: 1, tokens: 4.0, sequence_s: 4.0 });
}

#[test]
fn ratios_are_judged_within_ten_percent_of_three() {
    assert_eq!(TARGET_RATIO, 3.0);
    assert_eq!(ratio(96.0, 32.0), Some(3.0));
    assert_eq!(ratio(96.0, 0.0), None, "L starved: no ratio");
    for (r, ok) in [(2.69, false), (2.71, true), (3.0, true), (3.29, true), (3.31, false), (1.0, false)] {
        assert_eq!(within_target(Some(r)), ok, "{r}");
    }
    assert!(!within_target(None), "a starved L is not a met target");
}

#[test]
fn the_section_shows_both_measures_and_judges_each() {
    let heavy = Share { requests: 56, tokens: 1792.0, sequence_s: 170.0 };
    let light = Share { requests: 20, tokens: 640.0, sequence_s: 50.0 };
    let s = section(&[heavy, light], 4, 8, 60);
    let line = |needle: &str| s.lines().find(|l| l.starts_with(needle)).unwrap_or_else(|| panic!("{needle}: {s}"));
    assert_eq!(line("| sequence-seconds"), "| sequence-seconds | 170.0 | 50.0 | 3.40 | 2.70–3.30 | not met |");
    assert_eq!(
        line("| completion tokens"),
        "| completion tokens | 1792 (56 requests) | 640 (20 requests) | 2.80 | 2.70–3.30 | met |"
    );
    assert!(s.contains("each keep 8 streamed chat requests") && s.contains("on 4 sequences, for 60 s"), "{s}");
    let starved = section(&[Share { requests: 9, tokens: 288.0, sequence_s: 9.0 }, Share::default()], 4, 8, 60);
    assert!(starved.contains("| n/a | 2.70–3.30 | not met |"), "{starved}");
}
