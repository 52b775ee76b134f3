//! Per-request samples and the per-level summary (throughput and latency percentiles).

use serde::{Deserialize, Serialize};

/// What one streamed request measured. Times are seconds.
#[derive(Debug, Clone, Default)]
pub(crate) struct RequestSample {
    /// Send to first non-empty content delta.
    pub ttft: Option<f64>,
    /// Gaps between consecutive content deltas.
    pub itl: Vec<f64>,
    pub completion_tokens: u64,
    pub prompt_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens`: prompt tokens served from the prompt cache.
    pub cached_tokens: Option<u64>,
    pub error: Option<String>,
}

/// One (server, workload, concurrency) cell of the results. Latencies are milliseconds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct LevelResult {
    pub workload: String,
    pub concurrency: usize,
    /// Which pass of the A-B-B-A alternation measured it (0-based).
    pub pass: usize,
    pub requests: usize,
    pub failed: usize,
    pub wall_s: f64,
    pub completion_tokens: u64,
    pub mean_prompt_tokens: Option<f64>,
    /// Sums over the successful requests' usage: the prompt cache's hit rate is their quotient.
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub tokens_per_s: f64,
    pub requests_per_s: f64,
    pub ttft_mean_ms: Option<f64>,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p95_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
    pub itl_p50_ms: Option<f64>,
    pub itl_p95_ms: Option<f64>,
    /// Time per output token of each request, as vLLM: (last − first token) ÷ (tokens − 1).
    pub tpot_p50_ms: Option<f64>,
    pub tpot_p99_ms: Option<f64>,
    /// Open-loop levels (`traffic`): the Poisson arrival rate sent, requests/s.
    pub offered_rate: Option<f64>,
    pub first_error: Option<String>,
}

/// Linear-interpolated percentile (`p` in 0..=100) of unsorted data; `None` when empty.
pub(crate) fn percentile(data: &[f64], p: f64) -> Option<f64> {
    let mut v: Vec<f64> = data.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let rank = (p.clamp(0.0, 100.0) / 100.0) * (v.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    Some(v[lo] + (v[hi] - v[lo]) * (rank - lo as f64))
}

/// A request's time per output token after the first: `None` for answers of one token.
pub(crate) fn tpot(s: &RequestSample) -> Option<f64> {
    (s.ttft.is_some() && s.completion_tokens > 1).then(|| s.itl.iter().sum::<f64>() / (s.completion_tokens - 1) as f64)
}

/// Aggregates the samples of one level that took `wall_s` seconds end to end.
pub(crate) fn summarize(workload: &str, concurrency: usize, samples: &[RequestSample], wall_s: f64) -> LevelResult {
    let ok: Vec<&RequestSample> = samples.iter().filter(|s| s.error.is_none()).collect();
    let completion_tokens: u64 = ok.iter().map(|s| s.completion_tokens).sum();
    let ttft: Vec<f64> = ok.iter().filter_map(|s| s.ttft).collect();
    let itl: Vec<f64> = ok.iter().flat_map(|s| s.itl.iter().copied()).collect();
    let tpots: Vec<f64> = ok.iter().filter_map(|s| tpot(s)).collect();
    let prompts: Vec<f64> = ok.iter().filter_map(|s| s.prompt_tokens.map(|p| p as f64)).collect();
    let ms = |x: Option<f64>| x.map(|v| v * 1000.0);
    let per_s = |n: f64| if wall_s > 0.0 { n / wall_s } else { 0.0 };
    LevelResult {
        workload: workload.to_string(),
        concurrency,
        pass: 0,
        requests: samples.len(),
        failed: samples.len() - ok.len(),
        wall_s,
        completion_tokens,
        mean_prompt_tokens: (!prompts.is_empty()).then(|| prompts.iter().sum::<f64>() / prompts.len() as f64),
        prompt_tokens: ok.iter().filter_map(|s| s.prompt_tokens).sum(),
        cached_tokens: ok.iter().filter_map(|s| s.cached_tokens).sum(),
        tokens_per_s: per_s(completion_tokens as f64),
        requests_per_s: per_s(ok.len() as f64),
        ttft_mean_ms: ms((!ttft.is_empty()).then(|| ttft.iter().sum::<f64>() / ttft.len() as f64)),
        ttft_p50_ms: ms(percentile(&ttft, 50.0)),
        ttft_p95_ms: ms(percentile(&ttft, 95.0)),
        ttft_p99_ms: ms(percentile(&ttft, 99.0)),
        itl_p50_ms: ms(percentile(&itl, 50.0)),
        itl_p95_ms: ms(percentile(&itl, 95.0)),
        tpot_p50_ms: ms(percentile(&tpots, 50.0)),
        tpot_p99_ms: ms(percentile(&tpots, 99.0)),
        offered_rate: None,
        first_error: samples.iter().find_map(|s| s.error.clone()),
    }
}

/// `a / b` when both are present and `b` is non-zero.
pub(crate) fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b != 0.0 => Some(a / b),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_interpolates() {
        let d = [4.0, 1.0, 3.0, 2.0, 5.0];
        assert_eq!(percentile(&d, 0.0), Some(1.0));
        assert_eq!(percentile(&d, 50.0), Some(3.0));
        assert_eq!(percentile(&d, 100.0), Some(5.0));
        assert_eq!(percentile(&d, 25.0), Some(2.0));
        let p95 = percentile(&d, 95.0).unwrap();
        assert!((p95 - 4.8).abs() < 1e-9, "{p95}");
        assert!((percentile(&[1.0, 2.0], 50.0).unwrap() - 1.5).abs() < 1e-12);
    }

    #[test]
    fn percentile_edge_cases() {
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[7.0], 95.0), Some(7.0));
        assert_eq!(percentile(&[f64::NAN, 2.0], 50.0), Some(2.0));
        assert_eq!(percentile(&[1.0, 2.0, 3.0], 150.0), Some(3.0));
    }

    #[test]
    fn summarize_counts_only_successes() {
        let ok = |ttft: f64, toks: u64| RequestSample {
            ttft: Some(ttft),
            itl: vec![0.01, 0.03],
            completion_tokens: toks,
            prompt_tokens: Some(100),
            cached_tokens: Some(toks),
            error: None,
        };
        let bad = RequestSample { error: Some("HTTP 503".into()), ..Default::default() };
        let r = summarize("chat", 2, &[ok(0.1, 10), ok(0.3, 30), bad], 2.0);
        assert_eq!(r.requests, 3);
        assert_eq!(r.failed, 1);
        assert_eq!(r.completion_tokens, 40);
        assert!((r.tokens_per_s - 20.0).abs() < 1e-9);
        assert!((r.requests_per_s - 1.0).abs() < 1e-9);
        assert!((r.ttft_p50_ms.unwrap() - 200.0).abs() < 1e-9);
        assert!((r.itl_p50_ms.unwrap() - 20.0).abs() < 1e-9);
        assert_eq!(r.mean_prompt_tokens, Some(100.0));
        assert_eq!((r.prompt_tokens, r.cached_tokens), (200, 40), "the failed request's usage is left out");
        assert!((r.ttft_mean_ms.unwrap() - 200.0).abs() < 1e-9);
        let skewed = summarize("chat", 1, &[ok(0.1, 1), ok(0.1, 1), ok(1.0, 1)], 1.0);
        assert!(
            (skewed.ttft_mean_ms.unwrap() - 400.0).abs() < 1e-9 && (skewed.ttft_p50_ms.unwrap() - 100.0).abs() < 1e-9
        );
        assert_eq!(summarize("chat", 1, &[], 1.0).ttft_mean_ms, None);
        assert_eq!(r.first_error.as_deref(), Some("HTTP 503"));
        // TPOT: the 0.04 s after the first token over 9 and 29 further tokens.
        assert!((r.tpot_p50_ms.unwrap() - (40.0 / 9.0 + 40.0 / 29.0) / 2.0).abs() < 1e-9);
        assert!((r.ttft_p99_ms.unwrap() - 298.0).abs() < 1e-9);
        assert_eq!(tpot(&ok(0.1, 1)), None, "one token has no time per output token");
    }

    #[test]
    fn ratio_handles_missing() {
        assert_eq!(ratio(Some(3.0), Some(2.0)), Some(1.5));
        assert_eq!(ratio(None, Some(2.0)), None);
        assert_eq!(ratio(Some(1.0), Some(0.0)), None);
    }
}
