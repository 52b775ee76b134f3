//! The `traffic` workload's section of the report: per level (closed loop at 1 and 8 streams,
//! open loop at each Poisson rate) requests/s, output tok/s, TTFT and TPOT p50/p99 per server,
//! Gantry ÷ the stronger reference of each level, and goodput: the highest rate of the sweep at which TTFT p99 and TPOT
//! p99 both meet their SLOs (2 s and 100 ms, for a small CPU) with no request failed.

use crate::references::{stronger, REFERENCES};
use crate::runs::{cells, f, find, table, ServerRun, GANTRY};
use crate::stats::{ratio, LevelResult};

/// TTFT p99 bound of goodput, milliseconds.
pub(crate) const TTFT_SLO_MS: f64 = 2000.0;
/// TPOT p99 bound of goodput, milliseconds.
pub(crate) const TPOT_SLO_MS: f64 = 100.0;

/// Whether a results label is one of `traffic`'s levels (closed `traffic`, open `traffic@R/s`).
pub(crate) fn is_traffic(label: &str) -> bool {
    label == "traffic" || label.starts_with("traffic@")
}

/// Whether a level met both SLOs with every request answered.
pub(crate) fn meets_slo(l: &LevelResult) -> bool {
    let within = |v: Option<f64>, bound: f64| v.is_some_and(|v| v <= bound);
    l.failed == 0 && l.requests > 0 && within(l.ttft_p99_ms, TTFT_SLO_MS) && within(l.tpot_p99_ms, TPOT_SLO_MS)
}

/// The highest offered rate among the open-loop `levels` that met both SLOs; `None` when none did.
pub(crate) fn goodput(levels: &[LevelResult]) -> Option<f64> {
    levels
        .iter()
        .filter(|l| meets_slo(l))
        .filter_map(|l| l.offered_rate)
        .fold(None, |m, r| Some(m.map_or(r, |m: f64| m.max(r))))
}

/// The open-loop levels of `server`, passes merged.
fn open_levels(runs: &[ServerRun], server: &str) -> Vec<LevelResult> {
    merged(runs, server).into_iter().filter(|l| l.offered_rate.is_some()).collect()
}

/// Gantry's goodput against the references'.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct GoodputRatio {
    /// Gantry's goodput ÷ the higher of the references' goodputs.
    pub ratio: f64,
    /// That reference, or `every reference` where none met the SLOs.
    pub against: &'static str,
    /// Where no reference met the SLOs at any rate of the sweep, their goodput lies below its
    /// lowest rate, and `ratio` (Gantry's ÷ that rate) is only a lower bound of the true ratio.
    pub lower_bound: bool,
}

/// Gantry's goodput against the references' that ran the sweep; `None` where Gantry met the SLOs
/// at no rate, or no reference ran the sweep.
pub(crate) fn goodput_ratio(runs: &[ServerRun]) -> Option<GoodputRatio> {
    let gantry = goodput(&open_levels(runs, GANTRY))?;
    let swept: Vec<(&'static str, Vec<LevelResult>)> =
        REFERENCES.into_iter().map(|r| (r, open_levels(runs, r))).filter(|(_, levels)| !levels.is_empty()).collect();
    let best =
        swept
            .iter()
            .filter_map(|(r, levels)| Some((*r, goodput(levels)?)))
            .reduce(|a, b| if b.1 > a.1 { b } else { a });
    if let Some((against, best)) = best {
        return Some(GoodputRatio { ratio: ratio(Some(gantry), Some(best))?, against, lower_bound: false });
    }
    let lowest = swept.iter().flat_map(|(_, levels)| levels.iter().filter_map(|l| l.offered_rate)).reduce(f64::min)?;
    let against = if swept.len() == 1 { swept[0].0 } else { "every reference" };
    Some(GoodputRatio { ratio: ratio(Some(gantry), Some(lowest))?, against, lower_bound: true })
}

/// Each server's traffic levels, passes merged, in measured order.
fn merged(runs: &[ServerRun], server: &str) -> Vec<LevelResult> {
    cells(runs).into_iter().filter(|k| is_traffic(&k.0)).filter_map(|k| find(runs, server, &k)).collect()
}

fn level_name(l: &LevelResult) -> String {
    match l.offered_rate {
        Some(r) => format!("Poisson {r} req/s"),
        None => format!("{} stream{}", l.concurrency, if l.concurrency == 1 { "" } else { "s" }),
    }
}

fn goodput_cell(g: Option<f64>) -> String {
    g.map(|r| format!("{r} req/s")).unwrap_or_else(|| "none in the sweep".into())
}

/// The section's tables; `None` when no traffic level ran.
pub(crate) fn traffic_section(runs: &[ServerRun]) -> Option<String> {
    let servers: Vec<&ServerRun> = runs.iter().filter(|r| !merged(runs, &r.name).is_empty()).collect();
    if servers.is_empty() {
        return None;
    }
    let mut rows = Vec::new();
    let mut ratios = Vec::new();
    let gantry = merged(runs, GANTRY);
    for run in &servers {
        for l in merged(runs, &run.name) {
            rows.push(vec![
                level_name(&l),
                run.name.clone(),
                format!("{:.2}", l.requests_per_s),
                format!("{:.1}", l.tokens_per_s),
                f(l.ttft_p50_ms, 0),
                f(l.ttft_p99_ms, 0),
                f(l.tpot_p50_ms, 1),
                f(l.tpot_p99_ms, 1),
                format!("{}/{}", l.requests - l.failed, l.requests),
                f(l.mean_prompt_tokens, 0),
                f((l.requests > l.failed).then(|| l.completion_tokens as f64 / (l.requests - l.failed) as f64), 0),
                if l.offered_rate.is_some() { (if meets_slo(&l) { "yes" } else { "no" }).into() } else { "".into() },
            ]);
        }
    }
    for g in &gantry {
        let key = (g.workload.clone(), g.concurrency);
        let Some(against) = stronger(runs, &key, |l| Some(l.tokens_per_s), true) else { continue };
        let Some(r) = find(runs, against, &key) else { continue };
        ratios.push(vec![
            level_name(g),
            against.to_string(),
            f(ratio(Some(g.requests_per_s), Some(r.requests_per_s)), 2),
            f(ratio(Some(g.tokens_per_s), Some(r.tokens_per_s)), 2),
            f(ratio(g.ttft_p99_ms, r.ttft_p99_ms), 2),
            f(ratio(g.tpot_p99_ms, r.tpot_p99_ms), 2),
        ]);
    }
    let mut out = table(
        &[
            "level",
            "server",
            "req/s",
            "out tok/s",
            "TTFT p50 ms",
            "TTFT p99 ms",
            "TPOT p50 ms",
            "TPOT p99 ms",
            "ok/total",
            "prompt tok",
            "tok/req",
            "SLOs met",
        ],
        &rows,
    );
    // Goodput only where the open-loop sweep ran (`--traffic-rates 0` leaves it out).
    let swept = servers.iter().any(|r| !open_levels(runs, &r.name).is_empty());
    if swept {
        let goodputs: Vec<Vec<String>> =
            servers.iter().map(|r| vec![r.name.clone(), goodput_cell(goodput(&open_levels(runs, &r.name)))]).collect();
        out += &format!(
            "\nGoodput (the highest Poisson rate of the sweep with TTFT p99 ≤ {TTFT_SLO_MS:.0} ms and TPOT p99 ≤ \
             {TPOT_SLO_MS:.0} ms, no request failed):\n\n{}",
            table(&["server", "goodput"], &goodputs)
        );
    }
    if !ratios.is_empty() {
        let goodput = match goodput_ratio(runs) {
            Some(GoodputRatio { ratio, against, lower_bound: false }) => {
                format!("; goodput Gantry ÷ the reference with the higher goodput ({against}): {ratio:.2}")
            }
            Some(GoodputRatio { ratio, .. }) => format!(
                "; goodput Gantry ÷ the references: more than {ratio:.2} (none met the SLOs at the sweep's lowest \
                 rate, so theirs lies below it)"
            ),
            None if swept => "; goodput: no ratio (Gantry met the SLOs at no rate of the sweep)".into(),
            None => String::new(),
        };
        out += &format!(
            "\nGantry ÷ the stronger reference of each level by out tok/s (above 1 is better for req/s and \
             tok/s, below 1 for latencies){goodput}\n\n{}",
            table(&["level", "against", "req/s ×", "out tok/s ×", "TTFT p99 ×", "TPOT p99 ×"], &ratios)
        );
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runs::testing::run;
    use crate::runs::{REFERENCE, TUNED};
    use crate::stats::{summarize, RequestSample};

    /// An open-loop level whose requests all took `ttft` s to the first of 11 tokens, `tpot` s apart.
    fn open(rate: f64, ttft: f64, tpot: f64) -> LevelResult {
        let s = RequestSample { ttft: Some(ttft), itl: vec![tpot; 10], completion_tokens: 11, ..Default::default() };
        LevelResult { offered_rate: Some(rate), ..summarize(&format!("traffic@{rate}/s"), 0, &[s.clone(), s], 10.0) }
    }

    #[test]
    fn goodput_is_the_highest_rate_meeting_both_slos() {
        let sweep = [open(0.25, 0.3, 0.05), open(0.5, 1.2, 0.09), open(1.0, 2.5, 0.09), open(2.0, 0.4, 0.2)];
        assert_eq!(goodput(&sweep), Some(0.5), "1/s misses TTFT, 2/s misses TPOT");
        assert_eq!(goodput(&[open(1.0, 3.0, 0.05), open(2.0, 1.0, 0.15)]), None, "none meets both");
        assert_eq!(goodput(&[]), None);
        let noisy = [open(0.25, 3.0, 0.05), open(0.5, 1.0, 0.05)];
        assert_eq!(goodput(&noisy), Some(0.5), "the highest that meets them, not the first that misses");
        let mut failed = open(0.5, 0.1, 0.01);
        failed.failed = 1;
        assert_eq!(goodput(&[failed]), None, "a level with failed requests does not count");
        let edge = open(1.0, TTFT_SLO_MS / 1000.0, TPOT_SLO_MS / 1000.0);
        assert!(meets_slo(&edge), "the bounds are inclusive: {:?} {:?}", edge.ttft_p99_ms, edge.tpot_p99_ms);
        assert!(is_traffic("traffic") && is_traffic("traffic@0.5/s") && !is_traffic("chat"));
    }

    #[test]
    fn section_has_each_level_goodput_and_ratios() {
        let closed = |tps: f64| {
            let s = RequestSample { ttft: Some(0.2), itl: vec![0.05; 9], completion_tokens: 10, ..Default::default() };
            summarize("traffic", 1, &[s], 10.0 / tps)
        };
        let g = run(GANTRY, vec![closed(20.0), open(0.5, 0.5, 0.05), open(1.0, 1.0, 0.08)]);
        let r = run(REFERENCE, vec![closed(10.0), open(0.5, 0.6, 0.06), open(1.0, 2.4, 0.12)]);
        let t = run(TUNED, vec![closed(16.0), open(0.5, 0.4, 0.05), open(1.0, 2.1, 0.09)]);
        let other = run(GANTRY, vec![summarize("chat", 1, &[], 1.0)]);
        assert!(traffic_section(&[other]).is_none());
        let s = traffic_section(&[g.clone(), r.clone(), t]).unwrap();
        for needle in ["| 1 stream ", "| Poisson 0.5 req/s", "| Poisson 1 req/s", "| Gantry             | 1 req/s "] {
            assert!(s.contains(needle), "{needle}:\n{s}");
        }
        assert!(s.contains("| llama-server       | 0.5 req/s"), "{s}");
        assert!(s.contains("| llama-server tuned | 0.5 req/s"), "{s}");
        assert!(s.contains("(llama-server): 2.00"), "a tie in goodput goes to the plain reference:\n{s}");
        let slow = run(REFERENCE, vec![closed(10.0), open(0.5, 0.6, 0.2), open(1.0, 2.4, 0.12)]);
        let s2 = traffic_section(&[g.clone(), slow]).unwrap();
        assert!(s2.contains("| llama-server | none in the sweep"), "{s2}");
        assert!(s2.contains("the references: more than 2.00 (none met the SLOs"), "1 req/s ÷ below 0.5:\n{s2}");
        assert!(
            s.contains("| 1 stream          | llama-server tuned | 1.25     | 1.25 "),
            "the closed level is judged against the faster (tuned) reference:\n{s}"
        );
        let closed_only =
            traffic_section(&[run(GANTRY, vec![closed(20.0)]), run(REFERENCE, vec![closed(10.0)])]).unwrap();
        assert!(!closed_only.contains("oodput"), "no sweep, no goodput:\n{closed_only}");
        assert!(closed_only.contains("| 1 stream | llama-server | 2.00 "), "{closed_only}");
        let faster_tuned = run(TUNED, vec![closed(16.0), open(0.5, 0.4, 0.05), open(1.0, 1.5, 0.09)]);
        assert_eq!(
            goodput_ratio(&[g.clone(), r, faster_tuned]),
            Some(GoodputRatio { ratio: 1.0, against: TUNED, lower_bound: false })
        );
        let below_the_sweep = GoodputRatio { ratio: 2.0, against: REFERENCE, lower_bound: true };
        assert_eq!(goodput_ratio(&[g.clone(), run(REFERENCE, vec![open(0.5, 3.0, 0.5)])]), Some(below_the_sweep));
        assert_eq!(goodput_ratio(&[g, run(REFERENCE, vec![closed(10.0)])]), None, "no reference swept");
        let missed = run(GANTRY, vec![open(0.5, 3.0, 0.5)]);
        assert_eq!(goodput_ratio(&[missed, run(REFERENCE, vec![open(0.5, 0.4, 0.05)])]), None, "Gantry met none");
    }
}
