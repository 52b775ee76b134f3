//! The two reference columns (llama-server as `make bench` always started it, and tuned) and
//! which of them a target is judged against: the stronger in that cell, so that a target is met
//! only by beating the best llama-server we know how to run, not merely its defaults.

use crate::runs::{mean, passes, ServerRun, REFERENCE, TUNED};
use crate::stats::LevelResult;

/// The references in the order their columns are shown.
pub(crate) const REFERENCES: [&str; 2] = [REFERENCE, TUNED];

/// The reference that did best in `key` by `metric`'s mean over passes: the higher one when
/// `higher_is_better` (throughput), else the lower (latency). Per metric rather than once per
/// cell by tok/s, so that a latency target is judged against the lower latency even where the
/// other reference had the higher throughput. A tie goes to the plain reference; a cell only one
/// reference measured gets that one; `None` when neither did.
pub(crate) fn stronger(
    runs: &[ServerRun],
    key: &(String, usize),
    metric: fn(&LevelResult) -> Option<f64>,
    higher_is_better: bool,
) -> Option<&'static str> {
    let scored: Vec<(&'static str, f64)> = REFERENCES
        .into_iter()
        .filter_map(|r| Some((r, mean(passes(runs, r, key).iter().filter_map(|l| metric(l)))?)))
        .collect();
    let better = |a: f64, b: f64| if higher_is_better { a > b } else { a < b };
    scored.into_iter().reduce(|best, next| if better(next.1, best.1) { next } else { best }).map(|(name, _)| name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runs::testing::{level, run};
    use crate::runs::GANTRY;

    fn key(w: &str, c: usize) -> (String, usize) {
        (w.to_string(), c)
    }

    #[test]
    fn the_stronger_reference_is_chosen_per_cell_and_per_metric() {
        // chat c=1: the tuned one is faster (speculation pays alone); chat c=4: the plain one is;
        // shared-prefix: the tuned one is faster but the plain one has the lower TTFT.
        let runs = vec![
            run(GANTRY, vec![level("chat", 1, 0, 50.0, 0.2)]),
            run(
                REFERENCE,
                vec![
                    level("chat", 1, 0, 20.0, 0.2),
                    level("chat", 4, 0, 80.0, 0.2),
                    level("shared-prefix", 8, 0, 10.0, 1.0),
                ],
            ),
            run(
                TUNED,
                vec![
                    level("chat", 1, 0, 30.0, 0.2),
                    level("chat", 1, 1, 28.0, 0.2),
                    level("chat", 4, 0, 70.0, 0.2),
                    level("shared-prefix", 8, 0, 12.0, 2.0),
                ],
            ),
        ];
        let tps: fn(&LevelResult) -> Option<f64> = |l| Some(l.tokens_per_s);
        let ttft: fn(&LevelResult) -> Option<f64> = |l| l.ttft_p50_ms;
        assert_eq!(stronger(&runs, &key("chat", 1), tps, true), Some(TUNED));
        assert_eq!(stronger(&runs, &key("chat", 4), tps, true), Some(REFERENCE));
        assert_eq!(stronger(&runs, &key("shared-prefix", 8), tps, true), Some(TUNED));
        assert_eq!(stronger(&runs, &key("shared-prefix", 8), ttft, false), Some(REFERENCE), "lower latency wins");
        assert_eq!(stronger(&runs, &key("prose", 1), tps, true), None);
    }

    #[test]
    fn one_reference_alone_or_a_tie_goes_to_the_plain_one() {
        let alone = vec![run(GANTRY, vec![]), run(TUNED, vec![level("chat", 1, 0, 30.0, 0.2)])];
        let tps: fn(&LevelResult) -> Option<f64> = |l| Some(l.tokens_per_s);
        assert_eq!(stronger(&alone, &key("chat", 1), tps, true), Some(TUNED));
        let tie = vec![
            run(REFERENCE, vec![level("chat", 1, 0, 30.0, 0.2)]),
            run(TUNED, vec![level("chat", 1, 0, 30.0, 0.2)]),
        ];
        assert_eq!(stronger(&tie, &key("chat", 1), tps, true), Some(REFERENCE));
    }
}
