//! The model matrix in one table (`make bench-matrix`, issue #53): per model, Gantry ÷ the
//! stronger reference of each cell it measured, and its targets met. Read from the JSON reports
//! `scripts/bench-matrix.sh` leaves beside the markdown ones, one per model, named by the GGUF's
//! file stem (which is how [`model_targets`] knows the model).

use std::path::Path;

use anyhow::{Context as _, Result};

use crate::references::stronger;
use crate::report::Comparison;
use crate::runs::{pass_ratio, table, ServerRun};
use crate::targets::{model_targets, verdicts};

/// The cells the matrix shows: (heading, workload, streams).
const CELLS: [(&str, &str, usize); 7] = [
    ("chat c=1", "chat", 1),
    ("chat c=4", "chat", 4),
    ("sampled c=1", "chat-sampled", 1),
    ("sampled c=4", "chat-sampled", 4),
    ("traffic c=1", "traffic", 1),
    ("traffic c=4", "traffic", 4),
    ("traffic c=8", "traffic", 8),
];

/// Gantry ÷ the stronger reference in tok/s for `workload` at `streams`, if measured.
fn cell(runs: &[ServerRun], workload: &str, streams: usize) -> Option<f64> {
    let key = (workload.to_string(), streams);
    let tok_s = |l: &crate::stats::LevelResult| Some(l.tokens_per_s);
    let reference = stronger(runs, &key, tok_s, true)?;
    pass_ratio(runs, reference, &key, tok_s).map(|(x, _, _)| x)
}

/// One model's row: its file stem, each cell, and its targets (`met/total`, the missed named).
fn row(stem: &str, runs: &[ServerRun]) -> Vec<String> {
    let mut out = vec![stem.to_string()];
    out.extend(CELLS.iter().map(|(_, w, c)| cell(runs, w, *c).map_or("-".into(), |x| format!("{x:.2}"))));
    let targets = model_targets(Path::new(&format!("{stem}.gguf")));
    out.push(match targets.map(|m| verdicts(runs, m.targets)) {
        None => "none".into(),
        Some(v) if v.is_empty() => "none measured".into(),
        Some(v) => {
            let missed: Vec<String> =
                v.iter().filter(|v| !v.met).map(|v| format!("{} ({:.2})", v.name, v.ratio)).collect();
            let met = v.len() - missed.len();
            if missed.is_empty() {
                format!("{met}/{} met", v.len())
            } else {
                format!("{met}/{} met; missed: {}", v.len(), missed.join(", "))
            }
        }
    });
    out
}

/// The matrix of the runs given as (file stem, the native comparison's runs).
pub(crate) fn table_of(models: &[(String, Vec<ServerRun>)]) -> String {
    let mut headers = vec!["model"];
    headers.extend(CELLS.iter().map(|(h, _, _)| *h));
    headers.push("issue #53's targets");
    let rows: Vec<Vec<String>> = models.iter().map(|(stem, runs)| row(stem, runs)).collect();
    table(&headers, &rows)
}

/// Reads every `*.json` report in `dir` (sorted by name), prints the matrix, and writes it to
/// `dir/README.md`.
pub(crate) fn summarize(dir: &Path) -> Result<()> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    let mut models = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let comparisons: Vec<Comparison> =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        // The first comparison is the native pair's, as in every report.
        let Some(first) = comparisons.into_iter().next() else { continue };
        let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        models.push((stem, first.runs));
    }
    anyhow::ensure!(!models.is_empty(), "no JSON reports in {} (scripts/bench-matrix.sh writes them)", dir.display());
    let matrix = table_of(&models);
    println!("Model matrix: Gantry ÷ the stronger llama-server of each cell, tok/s\n\n{matrix}");
    let md = format!(
        "# Model matrix (issue #53)\n\nWritten by `make bench-matrix` (`gantry-bench --matrix-summary`) from the \
         per-model JSON reports here. Each cell is Gantry ÷ the stronger of llama-server as started by default \
         and tuned (n-gram speculation, flash attention) in output tok/s, means over passes; `-` is not \
         measured. `sampled` is `chat-sampled` (temperature 0.8); `traffic` is real ShareGPT conversations, \
         greedy, closed loop. Each model's own report (`<model>.md`) has the absolute figures and the \
         spreads.\n\n{matrix}"
    );
    let out = dir.join("README.md");
    std::fs::write(&out, md).with_context(|| format!("writing {}", out.display()))?;
    eprintln!("[bench] wrote {}", out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runs::testing::{level, run};
    use crate::runs::{GANTRY, REFERENCE, TUNED};

    #[test]
    fn each_cell_is_against_the_stronger_reference_and_targets_are_counted() {
        let runs = vec![
            run(GANTRY, vec![level("chat", 1, 0, 30.0, 0.2), level("chat", 4, 0, 60.0, 0.2)]),
            run(REFERENCE, vec![level("chat", 1, 0, 20.0, 0.2), level("chat", 4, 0, 30.0, 0.2)]),
            run(TUNED, vec![level("chat", 1, 0, 25.0, 0.2), level("chat", 4, 0, 50.0, 0.2)]),
        ];
        let models = vec![
            ("qwen2.5-coder-1.5b-instruct-q4_k_m".to_string(), runs.clone()),
            ("SmolLM2-135M-Instruct.Q4_1".to_string(), runs),
        ];
        let t = table_of(&models);
        let line = |needle: &str| t.lines().find(|l| l.contains(needle)).unwrap_or_else(|| panic!("{needle}: {t}"));
        let qwen = line("q4_k_m");
        // 30 ÷ the tuned 25 = 1.20; 60 ÷ the tuned 50 = 1.20, which misses 1.5.
        assert!(qwen.contains("| 1.20     | 1.20     | -"), "{t}");
        assert!(qwen.contains("1/2 met; missed: chat c=4 tok/s ≥ 1.5 (1.20)"), "{t}");
        assert!(line("SmolLM2").split('|').map(str::trim).any(|c| c == "none"), "no targets for SmolLM2: {t}");
    }

    #[test]
    fn reports_written_as_json_read_back_into_the_matrix() {
        let dir = std::env::temp_dir().join(format!("gantry-matrix-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let runs = vec![
            run(GANTRY, vec![level("chat", 1, 0, 30.0, 0.2)]),
            run(REFERENCE, vec![level("chat", 1, 0, 20.0, 0.2)]),
        ];
        let comparisons = vec![Comparison { title: "native".into(), kernels: String::new(), runs }];
        let json = serde_json::to_string(&comparisons).unwrap();
        std::fs::write(dir.join("gemma-3-270m-q4_k_m.json"), json).unwrap();
        std::fs::write(dir.join("gemma-3-270m-q4_k_m.md"), "not read").unwrap();
        summarize(&dir).unwrap();
        let md = std::fs::read_to_string(dir.join("README.md")).unwrap();
        assert!(md.contains("| gemma-3-270m-q4_k_m | 1.50"), "{md}");
        assert!(md.contains("1/1 met"), "Gemma's chat c=1 ≥ 1.0: {md}");
        std::fs::remove_dir_all(&dir).unwrap();
        let empty = std::env::temp_dir().join(format!("gantry-matrix-empty-{}", std::process::id()));
        std::fs::create_dir_all(&empty).unwrap();
        assert!(summarize(&empty).is_err(), "no reports is an error, not an empty matrix");
        std::fs::remove_dir_all(&empty).unwrap();
    }
}
