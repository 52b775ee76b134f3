//! The issues' targets: Gantry ÷ llama-server ratios a benchmark must reach, checked against
//! the measured cells (issue #13 on the CPU, issue #18 on the GPU), each against the stronger of
//! the two references in its cell (issue #53).

use crate::references::stronger;
use crate::runs::{pass_ratio, table, ServerRun};
use crate::stats::LevelResult;
use crate::traffic_report::goodput_ratio;

/// One target: Gantry ÷ llama-server of `metric` for a workload cell.
pub(crate) struct Target {
    pub workload: &'static str,
    pub concurrency: usize,
    pub metric: &'static str,
    /// `true`: the ratio must be at least `bound` (throughput); `false`: at most (latency).
    pub at_least: bool,
    pub bound: f64,
}

/// Issue #13: both servers native for the CPU; the sampled ones from issue #34.
pub(crate) const CPU_TARGETS: [Target; 9] = [
    Target { workload: "chat", concurrency: 1, metric: "tok/s", at_least: true, bound: 1.05 },
    Target { workload: "chat", concurrency: 8, metric: "tok/s", at_least: true, bound: 1.1 },
    Target { workload: "chat", concurrency: 16, metric: "tok/s", at_least: true, bound: 1.0 },
    Target { workload: "shared-prefix", concurrency: 8, metric: "TTFT p50", at_least: false, bound: 0.5 },
    Target { workload: "code-edit", concurrency: 1, metric: "tok/s", at_least: true, bound: 1.5 },
    Target { workload: "extract", concurrency: 1, metric: "tok/s", at_least: true, bound: 1.3 },
    Target { workload: "prose", concurrency: 1, metric: "tok/s", at_least: true, bound: 0.97 },
    Target { workload: "chat-sampled", concurrency: 1, metric: "tok/s", at_least: true, bound: 1.05 },
    Target { workload: "chat-sampled", concurrency: 8, metric: "tok/s", at_least: true, bound: 1.1 },
];

/// Issue #18: both servers on the GPU with every layer offloaded. A lone stream must not be
/// slower, and batching 32 streams must pay off. Issue #34: sampled chat (temperature 0.8) must
/// beat llama-server by more, alone and at 64 streams.
pub(crate) const GPU_TARGETS: [Target; 4] = [
    Target { workload: "chat", concurrency: 1, metric: "tok/s", at_least: true, bound: 1.0 },
    Target { workload: "chat", concurrency: 32, metric: "tok/s", at_least: true, bound: 1.1 },
    Target { workload: "chat-sampled", concurrency: 1, metric: "tok/s", at_least: true, bound: 1.2 },
    Target { workload: "chat-sampled", concurrency: 64, metric: "tok/s", at_least: true, bound: 2.0 },
];

/// Issue #53's targets for one model of `make bench-matrix`, on both of its workloads.
pub(crate) struct ModelTargets {
    /// The model as the report names it.
    pub model: &'static str,
    /// Lowercase pieces the GGUF's file name must all contain (`make bench-matrix` names the
    /// requantized files `qwen2.5-coder-1.5b-instruct-q8_0.gguf` and so on).
    pub file_name_has: &'static [&'static str],
    pub targets: &'static [Target],
}

/// `chat` and `chat-sampled` tok/s at 1 and 4 streams, the levels `make bench-matrix` runs.
const fn matrix(one: f64, four: f64) -> [Target; 4] {
    const fn tok_s(workload: &'static str, concurrency: usize, bound: f64) -> Target {
        Target { workload, concurrency, metric: "tok/s", at_least: true, bound }
    }
    [tok_s("chat", 1, one), tok_s("chat", 4, four), tok_s("chat-sampled", 1, one), tok_s("chat-sampled", 4, four)]
}

/// `traffic`'s closed loop (real conversations, greedy) at `streams` streams, tok/s.
const fn traffic(streams: usize, bound: f64) -> Target {
    Target { workload: "traffic", concurrency: streams, metric: "tok/s", at_least: true, bound }
}

const QWEN_1_5B_Q4_K_M: [Target; 7] = {
    let [a, b, c, d] = matrix(1.15, 1.5);
    [a, b, c, d, traffic(1, 1.15), traffic(4, 1.5), traffic(8, 1.6)]
};
/// The 0.5B's real-traffic ratios when issue #53 was filed (1.30 at one stream, 1.54 greedy at
/// 8), not to fall, and its goodput at 8 slots.
const QWEN_0_5B: [Target; 3] = [
    traffic(1, 1.3),
    traffic(8, 1.54),
    Target { workload: "traffic", concurrency: 0, metric: "goodput", at_least: true, bound: 1.5 },
];
const QWEN_1_5B_LEGACY: [Target; 4] = matrix(1.2, 1.3);
const GEMMA_3_270M: [Target; 4] = matrix(1.0, 1.0);

/// Issue #53: the 1.5B at Q4_K_M must gain most from batching; requantized to Q8_0 and Q4_0
/// (kernels Gantry has its own of) it must beat llama-server at both levels; Gemma 3 270M (a
/// model with sliding-window layers) must at least match it; on real traffic the 1.5B must gain
/// with streams, and the 0.5B (`make bench`'s model) keep its lead.
pub(crate) const MODEL_TARGETS: [ModelTargets; 5] = [
    ModelTargets {
        model: "Qwen2.5-Coder 1.5B Q4_K_M",
        file_name_has: &["qwen2.5-coder-1.5b", "q4_k_m"],
        targets: &QWEN_1_5B_Q4_K_M,
    },
    ModelTargets {
        model: "Qwen2.5-Coder 1.5B Q8_0",
        file_name_has: &["qwen2.5-coder-1.5b", "q8_0"],
        targets: &QWEN_1_5B_LEGACY,
    },
    ModelTargets {
        model: "Qwen2.5-Coder 1.5B Q4_0",
        file_name_has: &["qwen2.5-coder-1.5b", "q4_0"],
        targets: &QWEN_1_5B_LEGACY,
    },
    ModelTargets { model: "Gemma 3 270M", file_name_has: &["gemma", "270m"], targets: &GEMMA_3_270M },
    ModelTargets {
        model: "Qwen2.5-Coder 0.5B Q4_K_M",
        file_name_has: &["qwen2.5-coder-0.5b", "q4_k_m"],
        targets: &QWEN_0_5B,
    },
];

/// The per-model targets for the GGUF at `model`, by its file name; `None` for other models.
pub(crate) fn model_targets(model: &std::path::Path) -> Option<&'static ModelTargets> {
    let name = model.file_name()?.to_string_lossy().to_lowercase();
    MODEL_TARGETS.iter().find(|m| m.file_name_has.iter().all(|piece| name.contains(piece)))
}

/// One target as measured: its name, the reference it was judged against, Gantry's ratio, the
/// spread over passes, and whether it was met.
pub(crate) struct Verdict {
    pub name: String,
    pub against: &'static str,
    pub ratio: f64,
    pub spread: String,
    pub met: bool,
}

/// `targets` against the measured ratios (cells not measured are left out).
pub(crate) fn verdicts(runs: &[ServerRun], targets: &[Target]) -> Vec<Verdict> {
    let mut out = Vec::new();
    for t in targets {
        let bound = format!("{} {}", if t.at_least { "≥" } else { "≤" }, t.bound);
        let (name, against, ratio, spread) = if t.metric == "goodput" {
            let Some(g) = goodput_ratio(runs) else { continue };
            let spread = if g.lower_bound { "more than (no reference met the SLOs)" } else { "one sweep" };
            (format!("{} goodput {bound}", t.workload), g.against, g.ratio, spread.to_string())
        } else {
            let key = (t.workload.to_string(), t.concurrency);
            let metric: fn(&LevelResult) -> Option<f64> =
                if t.metric == "tok/s" { |l| Some(l.tokens_per_s) } else { |l| l.ttft_p50_ms };
            let Some(reference) = stronger(runs, &key, metric, t.at_least) else { continue };
            let Some((x, lo, hi)) = pass_ratio(runs, reference, &key, metric) else { continue };
            (
                format!("{} c={} {} {bound}", t.workload, t.concurrency, t.metric),
                reference,
                x,
                format!("{lo:.2}–{hi:.2}"),
            )
        };
        let met = if t.at_least { ratio >= t.bound } else { ratio <= t.bound };
        out.push(Verdict { name, against, ratio, spread, met });
    }
    out
}

/// [`verdicts`] as a table.
pub(crate) fn targets_table(runs: &[ServerRun], targets: &[Target]) -> String {
    let rows: Vec<Vec<String>> = verdicts(runs, targets)
        .into_iter()
        .map(|v| vec![v.name, v.against.to_string(), format!("{:.2}", v.ratio), v.spread, met_cell(v.met)])
        .collect();
    if rows.is_empty() {
        return "(no targets measured)\n".into();
    }
    table(&["target", "against", "ratio", "spread", "met"], &rows)
}

fn met_cell(met: bool) -> String {
    if met { "yes" } else { "NO" }.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runs::testing::{level, run};
    use crate::runs::{GANTRY, REFERENCE, TUNED};

    #[test]
    fn targets_say_met_or_not() {
        let runs = vec![
            run(GANTRY, vec![level("chat", 1, 0, 21.0, 0.2), level("shared-prefix", 8, 0, 5.0, 2.0)]),
            run(REFERENCE, vec![level("chat", 1, 0, 20.0, 0.2), level("shared-prefix", 8, 0, 5.0, 8.0)]),
        ];
        let t = targets_table(&runs, &CPU_TARGETS);
        let chat = t.lines().find(|l| l.contains("chat c=1")).unwrap();
        assert!(chat.contains("1.05") && chat.contains("| yes"), "{t}");
        let shared = t.lines().find(|l| l.contains("shared-prefix")).unwrap();
        assert!(shared.contains("0.25") && shared.contains("| yes"), "{t}");
        assert!(!t.contains("code-edit"), "unmeasured targets are left out: {t}");
        let slow = vec![
            run(GANTRY, vec![level("chat", 1, 0, 19.0, 0.2)]),
            run(REFERENCE, vec![level("chat", 1, 0, 20.0, 0.2)]),
        ];
        assert!(targets_table(&slow, &CPU_TARGETS).contains("| NO"));
    }

    #[test]
    fn each_target_is_judged_against_the_stronger_reference_of_its_cell() {
        // chat c=1: 21 ÷ the tuned 20 = 1.05, met (÷ the plain 15 would be 1.40); chat c=8:
        // 110 ÷ the plain 100 = 1.10, met; shared-prefix TTFT: 2 ÷ the tuned 4 = 0.5, met, though
        // the plain one, slower there, had the higher throughput.
        let runs = vec![
            run(
                GANTRY,
                vec![
                    level("chat", 1, 0, 21.0, 0.2),
                    level("chat", 8, 0, 110.0, 0.2),
                    level("shared-prefix", 8, 0, 5.0, 2.0),
                ],
            ),
            run(
                REFERENCE,
                vec![
                    level("chat", 1, 0, 15.0, 0.2),
                    level("chat", 8, 0, 100.0, 0.2),
                    level("shared-prefix", 8, 0, 6.0, 8.0),
                ],
            ),
            run(
                TUNED,
                vec![
                    level("chat", 1, 0, 20.0, 0.2),
                    level("chat", 8, 0, 90.0, 0.2),
                    level("shared-prefix", 8, 0, 5.0, 4.0),
                ],
            ),
        ];
        let t = targets_table(&runs, &CPU_TARGETS);
        let line = |needle: &str| t.lines().find(|l| l.contains(needle)).unwrap_or_else(|| panic!("{needle}: {t}"));
        assert!(
            line("chat c=1 ").contains("| llama-server tuned | 1.05") && line("chat c=1 ").contains("| yes"),
            "{t}"
        );
        assert!(line("chat c=8 ").contains("| llama-server       | 1.10"), "{t}");
        assert!(
            line("shared-prefix").contains("| llama-server tuned | 0.50") && line("shared-prefix").contains("| yes"),
            "{t}"
        );
    }

    #[test]
    fn matrix_models_get_issue_53s_targets_by_file_name() {
        let of = |f: &str| model_targets(std::path::Path::new(f)).map(|m| m.model);
        let dir = "/root/.cache/gantry/models/";
        assert_eq!(of(&format!("{dir}qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")), Some("Qwen2.5-Coder 1.5B Q4_K_M"));
        assert_eq!(of(&format!("{dir}qwen2.5-coder-1.5b-instruct-q8_0.gguf")), Some("Qwen2.5-Coder 1.5B Q8_0"));
        assert_eq!(of(&format!("{dir}qwen2.5-coder-1.5b-instruct-q4_0.gguf")), Some("Qwen2.5-Coder 1.5B Q4_0"));
        assert_eq!(of(&format!("{dir}gemma-3-270m-q4_k_m.gguf")), Some("Gemma 3 270M"));
        assert_eq!(of(&format!("{dir}qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")), Some("Qwen2.5-Coder 0.5B Q4_K_M"));
        assert_eq!(of(&format!("{dir}SmolLM2-135M-Instruct.Q4_1.gguf")), None);
        assert_eq!(of(&format!("{dir}DeepSeek-R1-Distill-Qwen-1.5B-Q4_K_M.gguf")), None, "another 1.5B");
        let bounds = |f: &str| {
            let m = model_targets(std::path::Path::new(f)).unwrap();
            m.targets.iter().map(|t| (t.workload, t.concurrency, t.bound)).collect::<Vec<_>>()
        };
        assert_eq!(
            bounds("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
            [
                ("chat", 1, 1.15),
                ("chat", 4, 1.5),
                ("chat-sampled", 1, 1.15),
                ("chat-sampled", 4, 1.5),
                ("traffic", 1, 1.15),
                ("traffic", 4, 1.5),
                ("traffic", 8, 1.6)
            ]
        );
        assert_eq!(bounds("qwen2.5-coder-1.5b-instruct-q4_0.gguf")[..2], [("chat", 1, 1.2), ("chat", 4, 1.3)]);
        assert!(bounds("gemma-3-270m-q4_k_m.gguf").iter().all(|t| t.2 == 1.0));
        // Judged like every target: against the stronger reference of the cell.
        let runs = vec![
            run(GANTRY, vec![level("chat", 4, 0, 150.0, 0.2)]),
            run(REFERENCE, vec![level("chat", 4, 0, 100.0, 0.2)]),
            run(TUNED, vec![level("chat", 4, 0, 90.0, 0.2)]),
        ];
        let t = targets_table(&runs, &QWEN_1_5B_Q4_K_M);
        assert!(t.contains("chat c=4 tok/s ≥ 1.5 | llama-server | 1.50") && t.contains("| yes"), "{t}");
    }

    #[test]
    fn real_traffic_targets_judge_closed_levels_and_goodput_against_the_stronger_reference() {
        use crate::stats::{summarize, RequestSample};
        // An open-loop level at `rate` whose requests met both SLOs or not.
        let open = |rate: f64, meets: bool| {
            let ttft = if meets { 0.5 } else { 5.0 };
            let s = RequestSample { ttft: Some(ttft), itl: vec![0.05; 4], completion_tokens: 5, ..Default::default() };
            LevelResult { offered_rate: Some(rate), ..summarize(&format!("traffic@{rate}/s"), 0, &[s], 10.0) }
        };
        let runs = vec![
            run(GANTRY, vec![level("traffic", 1, 0, 27.0, 0.2), level("traffic", 8, 0, 150.0, 0.2), open(1.0, true)]),
            run(
                REFERENCE,
                vec![level("traffic", 1, 0, 18.0, 0.2), level("traffic", 8, 0, 100.0, 0.2), open(0.5, true)],
            ),
            run(TUNED, vec![level("traffic", 1, 0, 20.0, 0.2), level("traffic", 8, 0, 90.0, 0.2), open(1.0, false)]),
        ];
        let t = targets_table(&runs, &QWEN_0_5B);
        let line = |needle: &str| t.lines().find(|l| l.contains(needle)).unwrap_or_else(|| panic!("{needle}: {t}"));
        assert!(line("traffic c=1 ").contains("| llama-server tuned | 1.35") && line("traffic c=1 ").contains("| yes"));
        assert!(line("traffic c=8 ").contains("| llama-server       | 1.50") && line("traffic c=8 ").contains("| NO"));
        assert!(line("traffic goodput ≥ 1.5").contains("| 2.00") && line("goodput").contains("| yes"), "{t}");
        let no_sweep = &runs[..1];
        assert!(!targets_table(no_sweep, &QWEN_0_5B).contains("goodput"), "unmeasured goodput is left out");
        // Neither reference met the SLOs at any rate: theirs lies below the lowest rate swept (0.5),
        // so Gantry's 1 req/s is more than 2× theirs, met; from 0.5 req/s it would be more than
        // 1×, which cannot show the target met.
        let unmet = |gantry_rate: f64| {
            vec![
                run(GANTRY, vec![open(gantry_rate, true)]),
                run(REFERENCE, vec![open(0.5, false), open(1.0, false)]),
                run(TUNED, vec![open(1.0, false)]),
            ]
        };
        let t = targets_table(&unmet(1.0), &QWEN_0_5B);
        let line = t.lines().find(|l| l.contains("goodput")).unwrap_or_else(|| panic!("{t}"));
        assert!(line.contains("every reference") && line.contains("| 2.00") && line.contains("more than"), "{t}");
        assert!(line.contains("| yes"), "{t}");
        let t = targets_table(&unmet(0.5), &QWEN_0_5B);
        assert!(t.lines().any(|l| l.contains("goodput") && l.contains("| 1.00") && l.contains("| NO")), "{t}");
    }

    #[test]
    fn sampled_chat_has_its_own_targets_beside_every_greedy_one() {
        // c=1: 1.06 meets the CPU's 1.05, misses the GPU's 1.2; c=8: 1.09 misses 1.1; c=64: 2.1 meets 2.0.
        let runs = vec![
            run(
                GANTRY,
                vec![
                    level("chat-sampled", 1, 0, 106.0, 0.2),
                    level("chat-sampled", 8, 0, 109.0, 0.2),
                    level("chat-sampled", 64, 0, 210.0, 0.2),
                ],
            ),
            run(
                REFERENCE,
                vec![
                    level("chat-sampled", 1, 0, 100.0, 0.2),
                    level("chat-sampled", 8, 0, 100.0, 0.2),
                    level("chat-sampled", 64, 0, 100.0, 0.2),
                ],
            ),
        ];
        let cpu = targets_table(&runs, &CPU_TARGETS);
        let line = |t: &str, needle: &str| {
            t.lines().find(|l| l.contains(needle)).unwrap_or_else(|| panic!("{needle}: {t}")).to_string()
        };
        assert!(line(&cpu, "chat-sampled c=1 tok/s ≥ 1.05").contains("| yes"), "{cpu}");
        assert!(line(&cpu, "chat-sampled c=8 tok/s ≥ 1.1").contains("| NO"), "{cpu}");
        assert!(!cpu.contains("c=64"), "{cpu}");
        let gpu = targets_table(&runs, &GPU_TARGETS);
        assert!(line(&gpu, "chat-sampled c=1 tok/s ≥ 1.2").contains("| NO"), "{gpu}");
        assert!(
            line(&gpu, "chat-sampled c=64 tok/s ≥ 2").contains("2.10") && line(&gpu, "c=64").contains("| yes"),
            "{gpu}"
        );
        for greedy in
            [("chat", 1, 1.05), ("chat", 8, 1.1), ("chat", 16, 1.0), ("code-edit", 1, 1.5), ("extract", 1, 1.3)]
        {
            assert!(CPU_TARGETS.iter().any(|t| (t.workload, t.concurrency, t.bound) == greedy), "{greedy:?} kept");
        }
    }

    #[test]
    fn gpu_targets_are_single_stream_parity_and_batching_at_32() {
        // c=1: 1.02 ≥ 1.0 met (it would miss the CPU's 1.05); c=32: 1.05 < 1.1 missed.
        let runs = vec![
            run(
                GANTRY,
                vec![
                    level("chat", 1, 0, 102.0, 0.2),
                    level("chat", 32, 0, 1050.0, 0.2),
                    level("chat", 8, 0, 10.0, 0.2),
                ],
            ),
            run(
                REFERENCE,
                vec![
                    level("chat", 1, 0, 100.0, 0.2),
                    level("chat", 32, 0, 1000.0, 0.2),
                    level("chat", 8, 0, 10.0, 0.2),
                ],
            ),
        ];
        let t = targets_table(&runs, &GPU_TARGETS);
        let single = t.lines().find(|l| l.contains("chat c=1 ")).unwrap();
        assert!(single.contains("≥ 1 ") && single.contains("1.02") && single.contains("| yes"), "{t}");
        let batched = t.lines().find(|l| l.contains("chat c=32")).unwrap();
        assert!(batched.contains("≥ 1.1") && batched.contains("1.05") && batched.contains("| NO"), "{t}");
        assert!(!t.contains("c=8"), "c=8 is no GPU target: {t}");
        assert!(targets_table(&runs, &CPU_TARGETS).lines().find(|l| l.contains("chat c=1 ")).unwrap().contains("| NO"));
    }
}
