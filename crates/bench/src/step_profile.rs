//! Where Gantry's scheduler spent a level's steps, from its `/metrics` before and after the level
//! (`gantry_decode_steps_total`, `gantry_step_phase_microseconds_total{phase}`,
//! `gantry_step_part_microseconds_total{part}`, `gantry_decode_ubatches_total`,
//! `gantry_decode_graphs_reused_total`): how much of a step is the
//! host planning, launching and sampling, how much is waiting for the device, how many passes over
//! the weights a step made, and how many of those reused llama.cpp's previous graph.

/// The phases the engine reports, in step order.
const PHASES: [&str; 5] = ["plan", "decode", "sync", "sample", "finish"];

/// The parts of the plan phase, then of the sample phase.
const PARTS: [&str; 5] = ["admit", "cache", "batch", "pick", "produce"];

/// Totals since Gantry started, summed over its models.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StepProfile {
    steps: u64,
    micros: [u64; 5],
    parts: [u64; 5],
    ubatches: u64,
    graphs_reused: u64,
}

impl StepProfile {
    /// The totals in a Prometheus text exposition; `None` when it has no step counter (a
    /// Gantry from before the counters, or llama-server).
    pub(crate) fn parse(metrics: &str) -> Option<Self> {
        let mut profile = Self::default();
        let mut seen = false;
        for line in metrics.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else { continue };
            let Ok(value) = value.parse::<f64>() else { continue };
            let value = value as u64;
            if series.starts_with("gantry_decode_steps_total") {
                profile.steps += value;
                seen = true;
            } else if series.starts_with("gantry_decode_ubatches_total") {
                profile.ubatches += value;
            } else if series.starts_with("gantry_decode_graphs_reused_total") {
                profile.graphs_reused += value;
            } else if series.starts_with("gantry_step_phase_microseconds_total{") {
                let phase = PHASES.iter().position(|p| series.contains(&format!("phase=\"{p}\"")));
                if let Some(i) = phase {
                    profile.micros[i] += value;
                }
            } else if series.starts_with("gantry_step_part_microseconds_total{") {
                let part = PARTS.iter().position(|p| series.contains(&format!("part=\"{p}\"")));
                if let Some(i) = part {
                    profile.parts[i] += value;
                }
            }
        }
        seen.then_some(profile)
    }

    /// What happened between `before` and `self`.
    pub(crate) fn since(&self, before: &Self) -> Self {
        let micros = std::array::from_fn(|i| self.micros[i].saturating_sub(before.micros[i]));
        let parts = std::array::from_fn(|i| self.parts[i].saturating_sub(before.parts[i]));
        Self {
            steps: self.steps.saturating_sub(before.steps),
            micros,
            parts,
            ubatches: self.ubatches.saturating_sub(before.ubatches),
            graphs_reused: self.graphs_reused.saturating_sub(before.graphs_reused),
        }
    }

    /// One line: steps, milliseconds per step, each phase's share and microseconds a step, and
    /// the parts of plan and sample in microseconds a step.
    pub(crate) fn describe(&self) -> String {
        if self.steps == 0 {
            return "no decoding steps".into();
        }
        let total: u64 = self.micros.iter().sum();
        let per_step = total as f64 / self.steps as f64 / 1000.0;
        let a_step = |m: u64| m as f64 / self.steps as f64;
        let shares: Vec<String> = PHASES
            .iter()
            .zip(self.micros)
            .map(|(p, m)| format!("{p} {:.0}% {:.0} µs", 100.0 * m as f64 / total.max(1) as f64, a_step(m)))
            .collect();
        let parts: Vec<String> = PARTS.iter().zip(self.parts).map(|(p, m)| format!("{p} {:.0}", a_step(m))).collect();
        let ubatches = self.ubatches as f64 / self.steps as f64;
        let reused = 100.0 * self.graphs_reused as f64 / self.ubatches.max(1) as f64;
        format!(
            "{} steps, {per_step:.2} ms a step, {ubatches:.2} ubatches a step ({reused:.0}% reused a graph): {}; parts, µs a step: {}",
            self.steps,
            shares.join(", "),
            parts.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "# TYPE gantry_decode_steps_total counter\n\
        gantry_decode_steps_total{model=\"a\"} 10\n\
        gantry_decode_ubatches_total{model=\"a\"} 12\n\
        gantry_step_phase_microseconds_total{model=\"a\",phase=\"plan\"} 100\n\
        gantry_step_phase_microseconds_total{model=\"a\",phase=\"sync\"} 1000\n\
        gantry_batch_tokens_count{model=\"a\"} 99\n";
    const AFTER: &str = "gantry_decode_steps_total{model=\"a\"} 20\n\
        gantry_decode_ubatches_total{model=\"a\"} 27\n\
        gantry_decode_graphs_reused_total{model=\"a\"} 6\n\
        gantry_step_phase_microseconds_total{model=\"a\",phase=\"plan\"} 1100\n\
        gantry_step_phase_microseconds_total{model=\"a\",phase=\"decode\"} 2000\n\
        gantry_step_phase_microseconds_total{model=\"a\",phase=\"sync\"} 5000\n\
        gantry_step_phase_microseconds_total{model=\"a\",phase=\"sample\"} 2000\n\
        gantry_step_phase_microseconds_total{model=\"a\",phase=\"finish\"} 0\n\
        gantry_step_part_microseconds_total{model=\"a\",part=\"admit\"} 400\n\
        gantry_step_part_microseconds_total{model=\"a\",part=\"batch\"} 600\n\
        gantry_step_part_microseconds_total{model=\"a\",part=\"produce\"} 1500\n";

    #[test]
    fn a_levels_steps_are_the_difference_of_two_scrapes() {
        let level = StepProfile::parse(AFTER).unwrap().since(&StepProfile::parse(BEFORE).unwrap());
        assert_eq!(
            level,
            StepProfile {
                steps: 10,
                micros: [1000, 2000, 4000, 2000, 0],
                parts: [400, 0, 600, 0, 1500],
                ubatches: 15,
                graphs_reused: 6
            }
        );
        assert_eq!(
            level.describe(),
            "10 steps, 0.90 ms a step, 1.50 ubatches a step (40% reused a graph): plan 11% 100 µs, decode 22% 200 µs, \
             sync 44% 400 µs, sample 22% 200 µs, finish 0% 0 µs; parts, µs a step: admit 40, cache 0, batch 60, pick 0, \
             produce 150"
        );
    }

    #[test]
    fn a_server_without_the_counters_has_no_profile() {
        assert_eq!(StepProfile::parse("llamacpp:tokens_predicted_total 5\n"), None);
        assert_eq!(StepProfile::default().describe(), "no decoding steps");
    }
}
