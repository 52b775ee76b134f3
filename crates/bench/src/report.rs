//! The console/markdown tables and the report (docs/benchmarks.md, docs/benchmarks-gpu.md).
//! The targets are in `targets.rs`, the chart in `chart.rs`.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::bandwidth::{self, Bandwidth};
use crate::gguf_weights::WeightsPerToken;
use crate::mode::Mode;
use crate::references::REFERENCES;
use crate::runs::{cells, f, find, merge, pass_ratio, passes, table, ServerRun, TUNED};
use crate::scopes::{cache_scope_table, Tenancy};
use crate::server_args::TUNED_REFERENCE_ARGS;
use crate::targets::{targets_table, ModelTargets};
use crate::traffic_report::{is_traffic, traffic_section};

fn ratio_cells(v: Option<(f64, f64, f64)>) -> [String; 2] {
    match v {
        Some((x, lo, hi)) => [format!("{x:.2}"), format!("{lo:.2}–{hi:.2}")],
        None => ["n/a".into(), "n/a".into()],
    }
}

/// The runs with each cell's passes merged (for the chart).
pub(crate) fn merged_runs(runs: &[ServerRun]) -> Vec<ServerRun> {
    runs.iter()
        .map(|r| ServerRun { levels: cells(runs).iter().filter_map(|k| find(runs, &r.name, k)).collect(), ..r.clone() })
        .collect()
}

pub(crate) fn results_table(runs: &[ServerRun]) -> String {
    let headers = [
        "workload",
        "conc",
        "server",
        "tok/s",
        "tok/s per pass",
        "TTFT p50 ms",
        "TTFT p95 ms",
        "ITL p50 ms",
        "ITL p95 ms",
        "ok/total",
        "prompt tok",
        "tok/req",
    ];
    let mut rows = Vec::new();
    // Gantry-only cells and traffic's have their own tables (`scopes.rs`, `traffic_report.rs`).
    for key in cells(runs).into_iter().filter(|k| Tenancy::parse_label(&k.0).is_none() && !is_traffic(&k.0)) {
        for run in runs {
            let all = passes(runs, &run.name, &key);
            let Some(l) = merge(&all) else { continue };
            let per_pass: Vec<String> = all.iter().map(|p| format!("{:.1}", p.tokens_per_s)).collect();
            rows.push(vec![
                key.0.clone(),
                key.1.to_string(),
                run.name.clone(),
                format!("{:.1}", l.tokens_per_s),
                per_pass.join(" / "),
                f(l.ttft_p50_ms, 0),
                f(l.ttft_p95_ms, 0),
                f(l.itl_p50_ms, 1),
                f(l.itl_p95_ms, 1),
                format!("{}/{}", l.requests - l.failed, l.requests),
                f(l.mean_prompt_tokens, 0),
                // Completion tokens per answer: equal across servers when none stops before max_tokens.
                f((l.requests > l.failed).then(|| l.completion_tokens as f64 / (l.requests - l.failed) as f64), 0),
            ]);
        }
    }
    table(&headers, &rows)
}

/// Gantry ÷ each reference, one row per cell and reference: above 1 is better for throughput,
/// below 1 for latency. Each ratio is of the means over passes; the spread is the lowest–highest
/// ratio of a single pass.
pub(crate) fn ratio_table(runs: &[ServerRun]) -> String {
    let headers = ["workload", "conc", "vs", "tok/s ×", "spread", "TTFT p50 ×", "spread", "ITL p50 ×", "spread"];
    let mut rows = Vec::new();
    for key in cells(runs).into_iter().filter(|k| !is_traffic(&k.0)) {
        for reference in REFERENCES {
            let Some(tps) = pass_ratio(runs, reference, &key, |l| Some(l.tokens_per_s)) else { continue };
            let mut row = vec![key.0.clone(), key.1.to_string(), reference.to_string()];
            row.extend(ratio_cells(Some(tps)));
            row.extend(ratio_cells(pass_ratio(runs, reference, &key, |l| l.ttft_p50_ms)));
            row.extend(ratio_cells(pass_ratio(runs, reference, &key, |l| l.itl_p50_ms)));
            rows.push(row);
        }
    }
    if rows.is_empty() {
        return "(no ratios: only one server was measured)\n".into();
    }
    table(&headers, &rows)
}

/// One side-by-side comparison (its own pair of binaries), e.g. both native, or both AVX2.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Comparison {
    pub title: String,
    /// How the two binaries were built.
    pub kernels: String,
    pub runs: Vec<ServerRun>,
}

/// Everything docs/benchmarks.md needs besides the results.
pub(crate) struct Context {
    pub mode: Mode,
    pub date: String,
    pub machine: String,
    pub bench_command: String,
    pub settings: String,
    pub chart_file: String,
    /// How each reference was built (its BUILD_INFO), by comparison title.
    pub reference_builds: Vec<(String, String)>,
    /// Levels that started on a busy host.
    pub quiet_warnings: Vec<String>,
    /// On the CPU: the memory read bandwidth and the weights a token reads (`bandwidth.rs`).
    pub one_stream_cap: Option<(Bandwidth, WeightsPerToken)>,
    /// Issue #53's targets when the model is one of `make bench-matrix`'s.
    pub model_targets: Option<&'static ModelTargets>,
    /// The embeddings comparison's section (`embeddings.rs`), when it ran.
    pub embeddings: Option<String>,
    /// Batches beside interactive traffic (`interference.rs`), when it ran.
    pub interference: Option<String>,
    /// Weighted sharing between tenants (`sharing.rs`), when it ran.
    pub sharing: Option<String>,
    /// The `traffic` workload's dataset and levels (`plan::describe_traffic`), when it ran.
    pub traffic: Option<String>,
}

pub(crate) fn markdown(comparisons: &[Comparison], ctx: &Context) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# {}\n", ctx.mode.title());
    let gpu_note = match ctx.mode {
        Mode::Gpu => " Both ran on the GPU with every layer and the KV cache offloaded.",
        Mode::Cpu => "",
    };
    let tuned = comparisons.iter().flat_map(|c| &c.runs).any(|r| r.name == TUNED);
    let tuned_note = if tuned {
        format!(
            " `{TUNED}` is the same llama-server binary run as an expert would, with n-gram speculation and \
             flash attention (`{}`); targets are judged against the stronger of the two references in each cell.",
            TUNED_REFERENCE_ARGS.join(" ")
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        md,
        "Generated by `{}` (crate `crates/bench`) on {}. Every server ran the same GGUF with the same \
         threads, parallel slots and per-sequence context.{gpu_note}{tuned_note} All are started once per comparison and stay up; every \
         workload level is measured on one server after the other, and the order flips each pass (Gantry, \
         llama-server, llama-server tuned, then back: A-B-B-A), so slow drift on the host weighs on all alike. Every pass \
         sends new prompts, so no pass finds a cache the previous one filled. Every request streams (`stream: true`, \
         `stream_options.include_usage`); completion tokens come from the final usage chunk. Throughput is aggregate \
         completion tokens per second of wall time for the whole level; TTFT is send → first content delta; ITL is \
         the gap between consecutive content deltas. Ratios are of the means over passes; the spread is the \
         lowest–highest ratio of a single pass.\n",
        ctx.mode.make_command(),
        ctx.date
    );
    let _ = writeln!(md, "## Machine\n\n```\n{}\n```\n", ctx.machine.trim_end());
    if let Some(first) = comparisons.first() {
        let _ = writeln!(md, "## Targets ({}, {})\n", ctx.mode.issue(), first.title);
        md += &targets_table(&first.runs, ctx.mode.targets());
        let _ = writeln!(md);
        if let Some(m) = ctx.model_targets {
            let _ = writeln!(md, "## Targets for {} (issue #53, {})\n", m.model, first.title);
            md += &targets_table(&first.runs, m.targets);
            let _ = writeln!(md);
        }
    }
    if let Some(section) = &ctx.embeddings {
        md += section;
    }
    for section in [&ctx.interference, &ctx.sharing].into_iter().flatten() {
        md += section;
        md.push('\n');
    }
    let _ = writeln!(md, "![tokens/s and TTFT p50 against concurrency]({})\n", ctx.chart_file);
    for c in comparisons {
        let _ = writeln!(md, "## {}\n\n{}\n", c.title, c.kernels);
        let _ = writeln!(
            md,
            "Gantry / each llama-server: above 1 is better for tok/s; below 1 is better for TTFT and ITL.\n"
        );
        md += &ratio_table(&c.runs);
        let _ = writeln!(md, "\nResults (means over passes):\n");
        md += &results_table(&c.runs);
        if let Some((bw, weights)) = &ctx.one_stream_cap {
            let _ = writeln!(
                md,
                "\nOne stream against the memory-bandwidth cap:\n\n{}",
                bandwidth::section(&c.runs, bw, weights).replace(".\n", ".  \n")
            );
        }
        let errors: Vec<String> = c
            .runs
            .iter()
            .flat_map(|r| r.levels.iter().map(move |l| (r, l)))
            .filter_map(|(r, l)| {
                l.first_error
                    .as_ref()
                    .map(|e| format!("- {} {} c={} pass {}: {e}", r.name, l.workload, l.concurrency, l.pass))
            })
            .collect();
        if !errors.is_empty() {
            let _ = writeln!(md, "\nFailed requests (first error per level):\n\n{}", errors.join("\n"));
        }
        let _ = writeln!(md);
        for r in &c.runs {
            let _ = writeln!(md, "Load average (1/5/15 min) before {} started: {}  ", r.name, r.load_before);
        }
        let _ = writeln!(md);
        for r in &c.runs {
            let gpu = r.gpu_offload.as_ref().map(|g| format!(", GPU offload `{g}`")).unwrap_or_default();
            let _ = writeln!(
                md,
                "{} ({}), CPU kernels `{}`{gpu}:\n\n```\n{}\n```\n",
                r.name, r.version, r.cpu_features, r.command
            );
        }
    }
    if let Some(t) = comparisons.first().and_then(|c| cache_scope_table(&c.runs)) {
        let _ = writeln!(
            md,
            "## Cost of per-tenant cache scopes\n\nGantry alone (llama-server has no tenants), workload `cache-scopes`: \
             every request shares one system prompt, and goes to the keys of 1 or 4 tenants in turn, all with \
             `cache_scope` `shared` or all `tenant` (docs/security.md, \"Prompt cache scopes\"). Hit rate is Σ \
             `usage.prompt_tokens_details.cached_tokens` ÷ Σ `usage.prompt_tokens` over every pass; TTFT mean and p50 \
             are means over passes. With `tenant`, each tenant computes the system prompt once for itself.\n\n{t}"
        );
    }
    if let Some(t) = comparisons.first().and_then(|c| traffic_section(&c.runs)) {
        let about = ctx.traffic.as_deref().unwrap_or("Workload `traffic`.");
        let _ = writeln!(md, "## Real traffic ({})\n\n{about}\n\n{t}", comparisons[0].title);
    }
    let _ = writeln!(md, "## Settings\n\n{}\n", ctx.settings);
    if !ctx.quiet_warnings.is_empty() {
        let _ = writeln!(
            md,
            "The host was not quiet for every level (load average above half the threads before it started):\n\n{}\n",
            ctx.quiet_warnings.iter().map(|w| format!("- {w}")).collect::<Vec<_>>().join("\n")
        );
    }
    for (name, info) in &ctx.reference_builds {
        let _ = writeln!(md, "## Reference build ({name})\n\nBuilt from source by `scripts/build-reference-llama-server.sh`:\n\n```\n{}\n```\n", info.trim_end());
    }
    let _ = writeln!(md, "## Command\n\n```\n{}\n```\n", ctx.bench_command);
    md
}

/// `YYYY-MM-DD HH:MM UTC` from the system clock (Howard Hinnant's civil-from-days).
pub(crate) fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02} UTC", rem / 3600, rem % 3600 / 60)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::runs::testing::{level, run};
    use crate::runs::{GANTRY, REFERENCE, TUNED};

    #[test]
    fn ratios_and_svg() {
        let runs = vec![
            run(GANTRY, vec![level("chat", 1, 0, 30.0, 0.2), level("chat", 4, 0, 30.0, 0.2)]),
            run(REFERENCE, vec![level("chat", 1, 0, 20.0, 0.2), level("chat", 4, 0, 20.0, 0.2)]),
        ];
        let t = ratio_table(&runs);
        assert!(t.contains("| llama-server | 1.50"), "{t}");
        assert!(!t.contains("tuned"), "no row for a reference not measured: {t}");
        let svg = crate::chart::svg(&merged_runs(&runs), "chat");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 4);
        assert!(results_table(&runs).contains("llama-server"));
    }

    #[test]
    fn both_reference_columns_get_their_ratios_and_the_report_names_the_tuned_flags() {
        let runs = vec![
            run(GANTRY, vec![level("chat", 1, 0, 30.0, 0.2)]),
            run(REFERENCE, vec![level("chat", 1, 0, 20.0, 0.2)]),
            run(TUNED, vec![level("chat", 1, 0, 25.0, 0.2)]),
        ];
        let t = ratio_table(&runs);
        assert!(t.contains("| chat     | 1    | llama-server       | 1.50"), "{t}");
        assert!(t.contains("| chat     | 1    | llama-server tuned | 1.20"), "{t}");
        let r = results_table(&runs);
        assert_eq!(r.lines().filter(|l| l.contains("| llama-server")).count(), 2, "{r}");
        let c = Comparison { title: "Both native".into(), kernels: "k".into(), runs };
        let md = markdown(&[c], &context(Mode::Cpu, "CPU"));
        assert!(md.contains("--spec-type ngram-mod") && md.contains("stronger of the two references"), "{md}");
        assert!(md.contains("| chat c=1 tok/s ≥ 1.05 | llama-server tuned | 1.20"), "{md}");
    }

    #[test]
    fn ratios_are_of_means_over_passes_with_the_spread_of_single_passes() {
        // Pass 0: 30/20 = 1.5; pass 1: 10/20 = 0.5; means 20/20 = 1.0.
        let runs = vec![
            run(GANTRY, vec![level("chat", 8, 0, 30.0, 0.1), level("chat", 8, 1, 10.0, 0.3)]),
            run(REFERENCE, vec![level("chat", 8, 1, 20.0, 0.4), level("chat", 8, 0, 20.0, 0.4)]),
        ];
        let key = ("chat".to_string(), 8);
        let (x, lo, hi) = pass_ratio(&runs, REFERENCE, &key, |l| Some(l.tokens_per_s)).unwrap();
        assert!((x - 1.0).abs() < 1e-9 && (lo - 0.5).abs() < 1e-9 && (hi - 1.5).abs() < 1e-9, "{x} {lo} {hi}");
        let t = ratio_table(&runs);
        assert!(t.contains("| 1.00") && t.contains("0.50–1.50"), "{t}");
        let r = results_table(&runs);
        assert!(r.contains("30.0 / 10.0") && r.contains("| 20.0"), "{r}");
        let merged = merged_runs(&runs);
        assert_eq!(merged[0].levels.len(), 1);
        assert_eq!(merged[0].levels[0].requests, 2);
    }

    fn context(mode: Mode, machine: &str) -> Context {
        Context {
            mode,
            date: "d".into(),
            machine: machine.into(),
            bench_command: "b".into(),
            settings: "s".into(),
            chart_file: "c.svg".into(),
            reference_builds: vec![],
            quiet_warnings: vec!["busy".into()],
            one_stream_cap: (mode == Mode::Cpu).then(|| {
                let weights = WeightsPerToken { bytes: 100_000_000, how: "the test's".into() };
                (Bandwidth { bytes_per_s: 10e9, threads: 2 }, weights)
            }),
            model_targets: (mode == Mode::Cpu).then(|| &crate::targets::MODEL_TARGETS[3]),
            embeddings: None,
            interference: None,
            sharing: None,
            traffic: None,
        }
    }

    #[test]
    fn markdown_has_every_comparison_and_the_machine() {
        let runs = vec![
            run(GANTRY, vec![level("chat", 1, 0, 30.0, 0.2)]),
            run(REFERENCE, vec![level("chat", 1, 0, 20.0, 0.2)]),
        ];
        let c = |t: &str| Comparison { title: t.into(), kernels: "k".into(), runs: runs.clone() };
        let md = markdown(&[c("Both native"), c("Both portable AVX2")], &context(Mode::Cpu, "CPU: Test CPU"));
        for needle in [
            "# Benchmarks: Gantry vs llama.cpp `llama-server`\n",
            "Generated by `make bench` (",
            "## Both native",
            "## Both portable AVX2",
            "CPU: Test CPU",
            "## Targets (issue #13",
            "chat c=1 tok/s ≥ 1.05",
            "- busy",
            "CPU kernels `AVX2`:",
            "Memory read bandwidth: 10.0 GB/s",
            "| chat                | Gantry       | 30.0  | 30%",
            "## Targets for Gemma 3 270M (issue #53, Both native",
            "| chat c=1 tok/s ≥ 1 ",
        ] {
            assert!(md.contains(needle), "{needle}: {md}");
        }
        assert!(!md.contains("GPU offload") && !md.contains("offloaded"), "{md}");
        assert!(!md.contains("cache scopes"), "no cache-scopes table without its workload: {md}");
    }

    #[test]
    fn traffic_has_its_own_section_not_rows_of_the_comparison() {
        let runs = vec![
            run(GANTRY, vec![level("chat", 1, 0, 30.0, 0.2), level("traffic", 8, 0, 90.0, 0.3)]),
            run("llama-server", vec![level("chat", 1, 0, 20.0, 0.2), level("traffic", 8, 0, 45.0, 0.5)]),
        ];
        assert!(!results_table(&runs).contains("traffic") && !ratio_table(&runs).contains("traffic"));
        let c = Comparison { title: "Both native".into(), kernels: "k".into(), runs };
        let mut ctx = context(Mode::Cpu, "CPU");
        ctx.traffic = Some("Workload `traffic` from d.json.".into());
        let md = markdown(&[c], &ctx);
        let at = |needle: &str| md.find(needle).unwrap_or_else(|| panic!("{needle}: {md}"));
        assert!(
            at("## Both native") < at("## Real traffic (Both native)") && at("## Real traffic") < at("## Settings")
        );
        assert!(md.contains("Workload `traffic` from d.json.") && md.contains("| 8 streams | Gantry "), "{md}");
    }

    #[test]
    fn gantry_only_sections_follow_the_targets_when_they_ran() {
        let runs = vec![run(GANTRY, vec![level("chat", 1, 0, 30.0, 0.2)])];
        let c = Comparison { title: "Both native".into(), kernels: "k".into(), runs };
        let mut ctx = context(Mode::Cpu, "CPU");
        assert!(!markdown(std::slice::from_ref(&c), &ctx).contains("## Weighted sharing"));
        ctx.interference = Some("## Batches beside interactive traffic (Gantry only)\n".into());
        ctx.sharing = Some("## Weighted sharing between tenants (Gantry only)\n".into());
        let md = markdown(&[c], &ctx);
        let at = |needle: &str| md.find(needle).unwrap_or_else(|| panic!("{needle}: {md}"));
        assert!(at("## Targets (") < at("## Batches beside") && at("## Batches beside") < at("## Weighted sharing"));
        assert!(at("## Weighted sharing") < at("## Both native"), "{md}");
    }

    #[test]
    fn cache_scopes_get_their_own_section_not_rows_of_the_comparison() {
        let scoped = level("cache-scopes/4/tenant", 2, 0, 64.0, 1.5);
        let g = run(GANTRY, vec![level("chat-sampled", 8, 0, 110.0, 0.2), scoped]);
        let r = run(REFERENCE, vec![level("chat-sampled", 8, 0, 100.0, 0.2)]);
        let c = Comparison { title: "Both native".into(), kernels: "k".into(), runs: vec![g, r] };
        let results = results_table(&c.runs);
        assert!(results.contains("chat-sampled") && !results.contains("cache-scopes"), "{results}");
        assert!(results.lines().next().unwrap().contains("tok/req"));
        assert!(results.lines().any(|l| l.contains("| Gantry ") && l.trim_end().ends_with("| 110     |")), "{results}");
        assert!(!ratio_table(&c.runs).contains("cache-scopes"));
        let md = markdown(&[c], &context(Mode::Cpu, "CPU: Test CPU"));
        let section =
            md.split("## Cost of per-tenant cache scopes").nth(1).expect("the section").split("\n## ").next().unwrap();
        assert!(section.contains("| 4       | tenant") && section.contains("| 1500 "), "{section}");
        assert!(md.contains("chat-sampled c=8 tok/s ≥ 1.1"), "{md}");
    }

    #[test]
    fn gpu_markdown_names_the_gpu_its_targets_and_each_servers_offload() {
        let mut g = run(GANTRY, vec![level("chat", 1, 0, 100.0, 0.02), level("chat", 32, 0, 2400.0, 0.05)]);
        g.gpu_offload = Some("NVIDIA H100 80GB HBM3 (CUDA0)".into());
        let mut r = run(REFERENCE, vec![level("chat", 1, 0, 100.0, 0.02), level("chat", 32, 0, 2000.0, 0.05)]);
        r.gpu_offload = Some("offloaded 25/25 layers to GPU".into());
        let c = Comparison { title: "Both CUDA on the GPU".into(), kernels: "k".into(), runs: vec![g, r] };
        let machine = "CPU: Test CPU\nGPU 0: NVIDIA H100 80GB HBM3, 81559 MiB, driver 580.159.04";
        let md = markdown(&[c], &context(Mode::Gpu, machine));
        for needle in [
            "# GPU benchmarks: Gantry vs llama.cpp `llama-server`, both on CUDA\n",
            "Generated by `make bench BENCH_GPU=1`",
            "every layer and the KV cache offloaded",
            "GPU 0: NVIDIA H100 80GB HBM3, 81559 MiB",
            "## Targets (issue #18, Both CUDA on the GPU)",
            "GPU offload `NVIDIA H100 80GB HBM3 (CUDA0)`",
            "GPU offload `offloaded 25/25 layers to GPU`",
        ] {
            assert!(md.contains(needle), "{needle}: {md}");
        }
        let targets = md.split("## Targets").nth(1).unwrap().split("\n## ").next().unwrap();
        let line = |needle: &str| {
            targets.lines().find(|l| l.contains(needle)).unwrap_or_else(|| panic!("{needle}: {targets}"))
        };
        assert!(line("chat c=1 tok/s ≥ 1 ").contains("| yes"), "{targets}");
        assert!(line("chat c=32 tok/s ≥ 1.1").contains("1.20") && line("chat c=32").contains("| yes"), "{targets}");
        assert!(!targets.contains("code-edit") && !targets.contains("c=16"), "only issue #18's targets: {targets}");
    }

    #[test]
    fn date_format() {
        let d = utc_now();
        assert_eq!(d.len(), "2026-01-01 00:00 UTC".len());
        assert!(d.starts_with("20"));
    }
}
