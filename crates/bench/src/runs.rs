//! Each server's run (its levels, per workload and concurrency) and the reading of its cells that
//! every table of the report shares: passes merged, ratios of means, markdown tables.

use serde::{Deserialize, Serialize};

use crate::stats::{ratio, LevelResult};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ServerRun {
    pub name: String,
    pub version: String,
    pub command: String,
    /// The CPU features its llama.cpp was built with (Gantry's /metrics, llama-server's log).
    pub cpu_features: String,
    /// GPU mode: where the server put the model, as it says itself (Gantry's `gantry_gpu_info`,
    /// llama-server's "offloaded N/N layers to GPU"). `None` on the CPU.
    pub gpu_offload: Option<String>,
    /// /proc/loadavg just before the server started: other work on the machine skews results.
    pub load_before: String,
    pub levels: Vec<LevelResult>,
}

pub(crate) const GANTRY: &str = "Gantry";
pub(crate) const REFERENCE: &str = "llama-server";
/// llama-server with n-gram speculation and flash attention (`server_args::TUNED_REFERENCE_ARGS`).
pub(crate) const TUNED: &str = "llama-server tuned";

pub(crate) fn f(v: Option<f64>, digits: usize) -> String {
    v.map(|x| format!("{x:.digits$}")).unwrap_or_else(|| "n/a".into())
}

/// A pipe table, padded so it also reads well in a terminal.
pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut w: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells.iter().enumerate().map(|(i, c)| format!("{c:<width$}", width = w[i])).collect();
        format!("| {} |\n", padded.join(" | "))
    };
    let mut out = line(headers.iter().map(|h| h.to_string()).collect());
    out += &line(w.iter().map(|n| "-".repeat(*n)).collect());
    for r in rows {
        out += &line(r.clone());
    }
    out
}

/// (workload, concurrency) pairs in first-seen order.
pub(crate) fn cells(runs: &[ServerRun]) -> Vec<(String, usize)> {
    let mut keys: Vec<(String, usize)> = Vec::new();
    for l in runs.iter().flat_map(|r| &r.levels) {
        let k = (l.workload.clone(), l.concurrency);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys
}

/// Every pass's result of `server` for `key`, in pass order.
pub(crate) fn passes<'a>(runs: &'a [ServerRun], server: &str, key: &(String, usize)) -> Vec<&'a LevelResult> {
    let Some(run) = runs.iter().find(|r| r.name == server) else { return Vec::new() };
    let mut v: Vec<&LevelResult> =
        run.levels.iter().filter(|l| l.workload == key.0 && l.concurrency == key.1).collect();
    v.sort_by_key(|l| l.pass);
    v
}

pub(crate) fn mean(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// The passes of one cell folded into one result: rates and latencies are means over passes,
/// counts are sums.
pub(crate) fn merge(levels: &[&LevelResult]) -> Option<LevelResult> {
    let first = levels.first()?;
    let m = |f: fn(&LevelResult) -> Option<f64>| mean(levels.iter().filter_map(|l| f(l)));
    Some(LevelResult {
        workload: first.workload.clone(),
        concurrency: first.concurrency,
        pass: 0,
        requests: levels.iter().map(|l| l.requests).sum(),
        failed: levels.iter().map(|l| l.failed).sum(),
        wall_s: levels.iter().map(|l| l.wall_s).sum(),
        completion_tokens: levels.iter().map(|l| l.completion_tokens).sum(),
        mean_prompt_tokens: m(|l| l.mean_prompt_tokens),
        prompt_tokens: levels.iter().map(|l| l.prompt_tokens).sum(),
        cached_tokens: levels.iter().map(|l| l.cached_tokens).sum(),
        tokens_per_s: m(|l| Some(l.tokens_per_s)).unwrap_or(0.0),
        requests_per_s: m(|l| Some(l.requests_per_s)).unwrap_or(0.0),
        ttft_mean_ms: m(|l| l.ttft_mean_ms),
        ttft_p50_ms: m(|l| l.ttft_p50_ms),
        ttft_p95_ms: m(|l| l.ttft_p95_ms),
        ttft_p99_ms: m(|l| l.ttft_p99_ms),
        itl_p50_ms: m(|l| l.itl_p50_ms),
        itl_p95_ms: m(|l| l.itl_p95_ms),
        tpot_p50_ms: m(|l| l.tpot_p50_ms),
        tpot_p99_ms: m(|l| l.tpot_p99_ms),
        offered_rate: first.offered_rate,
        first_error: levels.iter().find_map(|l| l.first_error.clone()),
    })
}

pub(crate) fn find(runs: &[ServerRun], server: &str, key: &(String, usize)) -> Option<LevelResult> {
    merge(&passes(runs, server, key))
}

/// Gantry ÷ `reference` of `metric` for `key`: the ratio of the means over passes, and the
/// lowest and highest ratio of a single pass (Gantry's pass p against the reference's pass p).
pub(crate) fn pass_ratio(
    runs: &[ServerRun],
    reference: &str,
    key: &(String, usize),
    metric: fn(&LevelResult) -> Option<f64>,
) -> Option<(f64, f64, f64)> {
    let (g, r) = (passes(runs, GANTRY, key), passes(runs, reference, key));
    let overall = ratio(mean(g.iter().filter_map(|l| metric(l))), mean(r.iter().filter_map(|l| metric(l))))?;
    let per_pass: Vec<f64> = g
        .iter()
        .filter_map(|gl| {
            let rl = r.iter().find(|rl| rl.pass == gl.pass)?;
            ratio(metric(gl), metric(rl))
        })
        .collect();
    let lo = per_pass.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = per_pass.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some(if per_pass.is_empty() { (overall, overall, overall) } else { (overall, lo, hi) })
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use crate::stats::{summarize, RequestSample};

    pub(crate) fn level(workload: &str, c: usize, pass: usize, tps: f64, ttft: f64) -> LevelResult {
        let s =
            RequestSample { ttft: Some(ttft), itl: vec![0.05], completion_tokens: tps as u64, ..Default::default() };
        LevelResult { pass, ..summarize(workload, c, std::slice::from_ref(&s), 1.0) }
    }

    pub(crate) fn run(name: &str, levels: Vec<LevelResult>) -> ServerRun {
        ServerRun {
            name: name.into(),
            version: "v".into(),
            command: "cmd".into(),
            cpu_features: "AVX2".into(),
            gpu_offload: None,
            load_before: "0.00".into(),
            levels,
        }
    }
}
