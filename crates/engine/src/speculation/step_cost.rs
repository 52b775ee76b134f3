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
//!
//! A step also costs more when llama.cpp cannot reuse the previous step's compute graph: a step
//! of another size builds (and, on CUDA, captures) a new one. On a 2-core CPU that is ~1.5 ms of
//! a ~25 ms token; on an H200 it is about as long as a whole reused step (1.4 ms), so there a
//! draft pays only if it is worth two builds: its own step's and the next one's, back at the
//! size before it. The table holds what a step of each size costs reusing its graph, and the
//! build is learned apart (`rebuild`), from steps of a size whose reused cost is known.

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
    /// Seconds of a step with `n` positions at index `n`, reusing its graph; 0 where never
    /// measured.
    seconds: Vec<f64>,
    /// Whether each size's figure comes from steps that reused their graph (else from steps that
    /// built one, less `rebuild`).
    reused: Vec<bool>,
    /// The step count at which each size was last measured.
    measured_at: Vec<u64>,
    steps: u64,
    /// Seconds a step costs more when it builds its graph; 0 until measured.
    rebuild: f64,
    /// Rows of the last step run: a step of another size builds its graph anew.
    last_rows: usize,
}

impl StepCost {
    /// A step that computed logits at all of its `positions` took `took`; `built`: llama.cpp
    /// built its graph rather than reusing the last one.
    pub(crate) fn observe(&mut self, positions: usize, took: Duration, built: bool) {
        if positions == 0 {
            return;
        }
        if self.seconds.len() <= positions {
            self.seconds.resize(positions + 1, 0.0);
            self.reused.resize(positions + 1, false);
            self.measured_at.resize(positions + 1, 0);
        }
        self.steps += 1;
        let mut t = took.as_secs_f64().max(1e-9);
        let fresh = self.is_measured(positions);
        if built {
            if fresh && self.reused[positions] {
                // The same size measured reusing its graph: the difference is the build.
                let extra = (t - self.seconds[positions]).max(0.0);
                self.rebuild = if self.rebuild > 0.0 {
                    (1.0 - LATEST_WEIGHT) * self.rebuild + LATEST_WEIGHT * extra
                } else {
                    extra
                };
                return;
            }
            t = (t - self.rebuild).max(1e-9);
        }
        let slot = &mut self.seconds[positions];
        *slot = if fresh { (1.0 - LATEST_WEIGHT) * *slot + LATEST_WEIGHT * t } else { t };
        // A built step of a size known reused returned above: what is left is reused if not built.
        self.reused[positions] = !built;
        self.measured_at[positions] = self.steps;
    }

    /// Every step, with or without prompt rows: the next step builds its graph unless it has
    /// as many rows.
    pub(crate) fn ran(&mut self, rows: usize) {
        self.last_rows = rows;
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
        // A step of another size than the last builds its graph; a draft beyond `at_least` also
        // makes the step after it, back at this size, build one.
        let seconds = |k: usize| {
            let rows = positions + k;
            let built = usize::from(rows != self.last_rows) + usize::from(k != at_least);
            Some(self.predict(rows)? + self.rebuild * built as f64)
        };
        let rate = |k: usize| Some((positions as f64 - 1.0 + expected(k)) / seconds(k)?);
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
        cost.observe(2, ms(100.0), false);
        assert!((cost.predict(1).unwrap() - 0.1).abs() < 1e-9, "below the smallest measured size");
        cost.observe(1, ms(40.0), false);
        cost.observe(1, ms(50.0), false);
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
            cost.observe(n, ms(100.0 * n as f64), false);
        }
        cost.observe(1, ms(40.0), false);
        assert_eq!(cost.best_draft(1, 0, 3, geometric(0.9)), 0, "4 positions cost 10 steps of 1");
        // A lone stream runs steps of 1 for a while: the old figure for 4 lapses and 4 is
        // guessed cheap again, to be measured anew.
        for _ in 0..STALE_STEPS {
            cost.observe(1, ms(40.0), false);
        }
        assert!((cost.predict(4).unwrap() - 0.04 * (1.0 + 3.0 * GUESSED_SLOPE)).abs() < 1e-9);
        assert_eq!(cost.best_draft(1, 0, 3, geometric(0.9)), 3);
        cost.observe(4, ms(60.0), false);
        assert!((cost.predict(4).unwrap() - 0.06).abs() < 1e-9, "a new measurement starts afresh");
    }

    #[test]
    fn drafts_fill_the_step_to_a_size_that_is_cheap_per_position() {
        let mut cost = StepCost::default();
        for n in 1..=9 {
            cost.observe(n, repacked(n), false);
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

    #[test]
    fn where_building_a_graph_costs_a_step_a_draft_must_pay_for_two() {
        // The H200's shape: a step reusing its graph takes 1.4 ms whatever its size, and one
        // that builds its graph as much again.
        let steady = || {
            let mut cost = StepCost::default();
            for n in 1..=5 {
                cost.observe(n, ms(1.4), false);
            }
            cost.ran(1);
            cost
        };
        let blind = steady();
        let mut cost = steady();
        // A one-position step after a draft step: its build is measured, not taken as its cost.
        cost.observe(1, ms(2.8), true);
        assert!((cost.predict(1).unwrap() - 0.0014).abs() < 1e-9);
        // A size only ever seen building its graph is taken as its time less a build.
        cost.observe(7, ms(3.0), true);
        assert!((cost.predict(7).unwrap() - 0.0016).abs() < 1e-9);
        // Right 60% of the time, four drafts bring 2.3 tokens for three steps' time: not worth
        // it here, though they were while the builds went unseen.
        assert_eq!(blind.best_draft(1, 0, 4, geometric(0.6)), 4);
        assert_eq!(cost.best_draft(1, 0, 4, geometric(0.6)), 0);
        assert_eq!(cost.best_draft(1, 0, 4, geometric(0.95)), 4, "4.5 tokens still pay");
        // Already at the draft's size (the last step drafted as much): no build on that side.
        cost.ran(5);
        assert_eq!(cost.best_draft(1, 0, 4, geometric(0.6)), 4);
        // On the CPU a build is ~1.5 ms of a 45 ms step: the drafts that paid still pay.
        let mut cpu = StepCost::default();
        for n in 1..=9 {
            cpu.observe(n, repacked(n), false);
        }
        cpu.observe(1, repacked(1) + ms(1.5), true);
        cpu.ran(1);
        assert_eq!(cpu.best_draft(1, 0, 3, geometric(0.85)), 3);
        assert_eq!(cpu.best_draft(1, 0, 2, geometric(0.85)), 0);
    }
}
