//! The machine's memory read bandwidth, measured once per run, and the cap it puts on one
//! stream: decoding one token reads every weight once, so one stream cannot pass bandwidth ÷
//! bytes of weights per token. Each server's one-stream tok/s as a share of that cap says how
//! much is left to win at one stream, which a ratio between two servers cannot.

use std::sync::Barrier;
use std::time::Instant;

use crate::gguf_weights::WeightsPerToken;
use crate::runs::{cells, find, table, ServerRun};

/// Far past any L3 here (260 MiB on the machine this was written on), so reads come from DRAM.
pub(crate) const BUFFER_BYTES: usize = 2 << 30;
/// The best of a few: other work on the host only ever lowers a repeat.
pub(crate) const REPEATS: usize = 5;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Bandwidth {
    /// Bytes read per second, the best repeat.
    pub bytes_per_s: f64,
    pub threads: usize,
}

impl Bandwidth {
    pub(crate) fn describe(&self) -> String {
        format!(
            "Memory read bandwidth: {:.1} GB/s (best of {REPEATS} reads of a {} MiB buffer by {} threads, the servers' count)",
            self.bytes_per_s / 1e9,
            BUFFER_BYTES >> 20,
            self.threads
        )
    }
}

/// Reads a `bytes` buffer with `threads` threads `repeats` times; the fastest read wins. Each
/// thread first writes its own share (a buffer never written reads the kernel's one zero page,
/// from cache; and a thread that wrote a page has it near itself), then all start together and
/// the read ends when the slowest thread does.
pub(crate) fn measure(threads: usize, bytes: usize, repeats: usize) -> Bandwidth {
    let threads = threads.max(1);
    let mut buf = vec![0u64; bytes / 8];
    let share = buf.len().div_ceil(threads).max(8);
    std::thread::scope(|s| {
        for (t, chunk) in buf.chunks_mut(share).enumerate() {
            s.spawn(move || chunk.iter_mut().enumerate().for_each(|(i, x)| *x = (i + t) as u64));
        }
    });
    let mut best = 0.0f64;
    for _ in 0..repeats.max(1) {
        let chunks: Vec<&[u64]> = buf.chunks(share).collect();
        let barrier = Barrier::new(chunks.len());
        let slowest = std::thread::scope(|s| {
            let handles: Vec<_> = chunks
                .iter()
                .map(|chunk| {
                    let barrier = &barrier;
                    s.spawn(move || {
                        barrier.wait();
                        let start = Instant::now();
                        std::hint::black_box(sum(chunk));
                        start.elapsed().as_secs_f64()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or(f64::INFINITY)).fold(0.0, f64::max)
        });
        if slowest > 0.0 {
            best = best.max((buf.len() * 8) as f64 / slowest);
        }
    }
    Bandwidth { bytes_per_s: best, threads }
}

/// The words' wrapping sum, as one plain fold: the compiler makes it a few independent vector
/// sums. Eight sums over `chunks_exact(8)` were compiled for AVX-512 (`-C target-cpu=native`,
/// Zen 5) into gather instructions that read 9-11 GB/s where this reads 63-72 (2 threads, 2 GiB).
fn sum(data: &[u64]) -> u64 {
    data.iter().fold(0u64, |s, x| s.wrapping_add(*x))
}

/// Tokens per second one stream could reach if reading the weights were all it did.
pub(crate) fn cap(bandwidth: &Bandwidth, weights: &WeightsPerToken) -> Option<f64> {
    (weights.bytes > 0 && bandwidth.bytes_per_s > 0.0).then(|| bandwidth.bytes_per_s / weights.bytes as f64)
}

/// Every server's one-stream cells (`c=1`, cache-scopes aside) against the cap.
pub(crate) fn cap_table(runs: &[ServerRun], bandwidth: &Bandwidth, weights: &WeightsPerToken) -> String {
    let Some(cap) = cap(bandwidth, weights) else { return "(no cap: bandwidth or model size unknown)\n".into() };
    let mut rows = Vec::new();
    for key in cells(runs).into_iter().filter(|k| k.1 == 1 && !k.0.starts_with("cache-scopes")) {
        for run in runs {
            let Some(l) = find(runs, &run.name, &key) else { continue };
            rows.push(vec![
                key.0.clone(),
                run.name.clone(),
                format!("{:.1}", l.tokens_per_s),
                format!("{:.0}%", 100.0 * l.tokens_per_s / cap),
            ]);
        }
    }
    if rows.is_empty() {
        return "(no one-stream level measured)\n".into();
    }
    table(&["workload (1 stream)", "server", "tok/s", "share of the cap"], &rows)
}

/// The bandwidth, the cap and the table: the console's and the report's section.
pub(crate) fn section(runs: &[ServerRun], bandwidth: &Bandwidth, weights: &WeightsPerToken) -> String {
    let cap = cap(bandwidth, weights).map(|c| format!("{c:.1} tok/s")).unwrap_or_else(|| "unknown".into());
    format!(
        "{}.\nWeights read per token ≈ {:.1} MB: {}.\nOne-stream cap = bandwidth ÷ weights per token = {cap} \
         (KV cache and activations left out, so no server reaches it).\n\n{}",
        bandwidth.describe(),
        weights.bytes as f64 / 1e6,
        weights.how,
        cap_table(runs, bandwidth, weights)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runs::testing::{level, run};
    use crate::runs::{GANTRY, REFERENCE, TUNED};

    #[test]
    fn a_small_read_measures_some_bandwidth_and_sums_every_word() {
        let b = measure(2, 8 << 20, 2);
        assert!(b.bytes_per_s > 1e8, "{b:?}");
        assert_eq!(b.threads, 2);
        assert_eq!(sum(&(1..=19).collect::<Vec<u64>>()), 190);
        assert_eq!(measure(0, 64, 0).threads, 1, "at least one thread, one repeat");
    }

    #[test]
    fn one_stream_cells_are_shown_as_shares_of_the_cap() {
        // 10 GB/s over 100 MB per token: 100 tok/s.
        let bw = Bandwidth { bytes_per_s: 10e9, threads: 2 };
        let weights = WeightsPerToken { bytes: 100_000_000, how: "test".into() };
        assert_eq!(cap(&bw, &weights), Some(100.0));
        let runs = vec![
            run(GANTRY, vec![level("chat", 1, 0, 60.0, 0.2), level("chat", 4, 0, 150.0, 0.2)]),
            run(REFERENCE, vec![level("chat", 1, 0, 40.0, 0.2)]),
            run(TUNED, vec![level("chat", 1, 0, 46.0, 0.2)]),
        ];
        let s = section(&runs, &bw, &weights);
        for needle in ["10.0 GB/s", "by 2 threads", "≈ 100.0 MB: test", "= 100.0 tok/s", "| 60%", "| 40%", "| 46%"] {
            assert!(s.contains(needle), "{needle}: {s}");
        }
        assert!(!s.contains("150"), "only one-stream levels: {s}");
        let none = WeightsPerToken { bytes: 0, how: "?".into() };
        assert!(cap_table(&runs, &bw, &none).contains("no cap"));
    }
}
