//! What a decode step costs on this machine, learned from the steps the scheduler runs, so that
//! speculation drafts only where verifying the drafts costs less than the steps they save.
//!
//! The cost of a step that computes logits for `n` positions (each decoding choice's token plus
//! any drafts) is neither flat nor linear in `n`, and its shape differs by CPU and model. On
//! these 2-core machines a Q4_K model's weights are repacked for a kernel that multiplies four
//! rows at a time and falls back to one matrix-vector product per leftover row: measured on a
//! 2-core EPYC, 1 position 45 ms, 2 positions 90-105 ms, 4 positions 118 ms, 5 positions 160 ms,
//! 9 positions 264 ms. So a draft of 3 can cost less than a draft of 1, and which draft lengths
//! pay depends on how many other positions the step already holds. The scheduler therefore keeps
//! the measured time of every step size it has run (a moving average per size) and judges a
//! draft by the measured time of the step it would make. A size never measured is guessed
//! cheap, so the scheduler tries it once and from then on knows.

use std::time::Duration;

/// Weight of the latest measurement in a size's moving average.
const LATEST_WEIGHT: f64 = 0.2;
/// A size never measured is guessed to cost this share of the nearest smaller measured size's
/// time more per extra position: cheap, so that it gets tried and measured.
const GUESSED_SLOPE: f64 = 0.05;
/// A draft must beat not drafting by this share before it is fed.
const MARGIN: f64 = 0.03;
/// A size last measured this many steps ago counts as never measured. What a step of a given
/// size costs depends on how many cells its sequences attend over: sizes measured while 16
/// streams ran hold the cost of that load, and a lone stream that no longer dares such a step
/// would never measure it again. So old measurements lapse, and the size gets tried anew.
const STALE_STEPS: u64 = 500;

#[derive(Debug, Default, Clone)]
pub(crate) struct StepCost {
    /// Seconds of a step with `n` positions at index `n`; 0 where never measured.
    seconds: Vec<f64>,
    /// The step count at which each size was last measured.
    measured_at: Vec<u64>,
    steps: u64,
}

impl StepCost {
    /// A step that computed logits at all of its `positions` took `took`.
    pub(crate) fn observe(&mut self, positions: usize, took: Duration) {
        if positions == 0 {
            return;
        }
        if self.seconds.len() <= positions {
            self.seconds.resize(positions + 1, 0.0);
            self.measured_at.resize(positions + 1, 0);
        }
        self.steps += 1;
        let t = took.as_secs_f64().max(1e-9);
        let fresh = self.is_measured(positions);
        let slot = &mut self.seconds[positions];
        *slot = if fresh { (1.0 - LATEST_WEIGHT) * *slot + LATEST_WEIGHT * t } else { t };
        self.measured_at[positions] = self.steps;
    }

    /// Whether a step of `positions` was measured, recently enough to go by.
    fn is_measured(&self, positions: usize) -> bool {
        self.seconds.get(positions).is_some_and(|&t| t > 0.0) && self.steps - self.measured_at[positions] <= STALE_STEPS
    }

    /// Measured (or, never measured, guessed) seconds of a step with `positions` positions;
    /// `None` before any measurement.
    pub(crate) fn predict(&self, positions: usize) -> Option<f64> {
        if self.is_measured(positions) {
            return Some(self.seconds[positions]);
        }
        let nearest_below = (1..positions.min(self.seconds.len())).rev().find(|&m| self.is_measured(m));
        match nearest_below {
            Some(m) => Some(self.seconds[m] * (1.0 + GUESSED_SLOPE * (positions - m) as f64)),
            // Only larger sizes measured: a smaller step is guessed to cost the smallest of them.
            None => (0..self.seconds.len()).find(|&m| self.is_measured(m)).map(|m| self.seconds[m]),
        }
    }

    /// How many of `available` draft tokens to feed for one choice, in a step that already
    /// computes `positions` positions (this choice's own token included): the count that gives
    /// the step the most produced tokens per second, where `expected(k)` is how many tokens the
    /// choice produces from its token plus `k` drafts; `at_least` (drafts fed regardless, such as
    /// tokens a grammar forces) when no longer draft beats that.
    pub(crate) fn best_draft(
        &self,
        positions: usize,
        at_least: usize,
        available: usize,
        expected: impl Fn(usize) -> f64,
    ) -> usize {
        let rate = |k: usize| Some((positions as f64 - 1.0 + expected(k)) / self.predict(positions + k)?);
        let Some(base) = rate(at_least) else {
            return at_least;
        };
        let base = base * (1.0 + MARGIN);
        (at_least + 1..=available)
            .filter_map(|k| Some((k, rate(k)?)))
            .filter(|&(_, rate)| rate > base)
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map_or(at_least, |(k, _)| k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: f64) -> Duration {
        Duration::from_secs_f64(v / 1000.0)
    }

    /// Expected tokens from a draft of `k` whose tokens are each accepted with probability `p`.
    fn geometric(p: f64) -> impl Fn(usize) -> f64 {
        move |k| (0..=k).map(|j| p.powi(i32::try_from(j).unwrap_or(i32::MAX))).sum()
    }

    /// The EPYC shape: four rows at a time, leftover rows one by one.
    fn repacked(n: usize) -> Duration {
        ms(5.0 + 110.0 * (n / 4) as f64 + 40.0 * (n % 4) as f64)
    }

    #[test]
    fn measured_sizes_are_averaged_and_unmeasured_ones_guessed_cheap() {
        let mut cost = StepCost::default();
        assert_eq!(cost.predict(1), None);
        assert_eq!(cost.best_draft(1, 0, 8, geometric(0.99)), 0, "nothing measured yet");
        cost.observe(2, ms(100.0));
        assert!((cost.predict(1).unwrap() - 0.1).abs() < 1e-9, "below the smallest measured size");
        cost.observe(1, ms(40.0));
        cost.observe(1, ms(50.0));
        assert!((cost.predict(1).unwrap() - 0.042).abs() < 1e-9, "0.8 * 40 + 0.2 * 50 ms");
        assert!((cost.predict(5).unwrap() - 0.1 * (1.0 + 3.0 * GUESSED_SLOPE)).abs() < 1e-9);
        // Cheap-looking, so a likely draft is fed in full and gets measured.
        assert_eq!(cost.best_draft(1, 0, 6, geometric(0.9)), 6);
    }

    #[test]
    fn old_measurements_lapse_so_the_size_gets_tried_again() {
        let mut cost = StepCost::default();
        // Measured under load: steps of 2-4 positions were slow then.
        for n in 2..=4 {
            cost.observe(n, ms(100.0 * n as f64));
        }
        cost.observe(1, ms(40.0));
        assert_eq!(cost.best_draft(1, 0, 3, geometric(0.9)), 0, "4 positions cost 10 steps of 1");
        // A lone stream runs steps of 1 for a while: the old figure for 4 lapses and 4 is
        // guessed cheap again, to be measured anew.
        for _ in 0..STALE_STEPS {
            cost.observe(1, ms(40.0));
        }
        assert!((cost.predict(4).unwrap() - 0.04 * (1.0 + 3.0 * GUESSED_SLOPE)).abs() < 1e-9);
        assert_eq!(cost.best_draft(1, 0, 3, geometric(0.9)), 3);
        cost.observe(4, ms(60.0));
        assert!((cost.predict(4).unwrap() - 0.06).abs() < 1e-9, "a new measurement starts afresh");
    }

    #[test]
    fn drafts_fill_the_step_to_a_size_that_is_cheap_per_position() {
        let mut cost = StepCost::default();
        for n in 1..=9 {
            cost.observe(n, repacked(n));
        }
        // 1 position 45 ms; 4 positions 115 ms. At 85% a draft of 3 pays, a draft of 1 or 2
        // (2 or 3 leftover rows) costs more than it brings.
        assert_eq!(cost.best_draft(1, 0, 3, geometric(0.85)), 3);
        assert_eq!(cost.best_draft(1, 0, 2, geometric(0.85)), 0);
        assert_eq!(cost.best_draft(1, 0, 8, geometric(0.3)), 0, "unlikely drafts never pay here");
        // A step that already holds 2 positions takes 2 more drafts to reach 4.
        assert_eq!(cost.best_draft(2, 0, 2, geometric(0.8)), 2);
        // Forced drafts are fed anyway; lookups after them only where they pay from there.
        let forced_then = |forced: usize, p: f64| {
            move |k: usize| {
                1.0 + (0..k)
                    .map(|j| if j < forced { 1.0 } else { p.powi(i32::try_from(j + 1 - forced).unwrap_or(i32::MAX)) })
                    .sum::<f64>()
            }
        };
        // 2 forced (3 positions, 125 ms): one likely lookup fills the step to 4 (115 ms).
        assert_eq!(cost.best_draft(1, 2, 6, forced_then(2, 0.85)), 3);
        // 3 forced (4 positions): a fifth position costs 40 ms more, an unlikely lookup is left off.
        assert_eq!(cost.best_draft(1, 3, 6, forced_then(3, 0.1)), 3);
    }
}
