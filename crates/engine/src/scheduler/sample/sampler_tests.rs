//! The sampler's draws against the distribution OpenAI's parameters define, computed in f64 from
//! the same logits: chi-square goodness of fit over many draws with fixed seeds (deterministic,
//! so they cannot flake), and the edge cases of top-p.
#![allow(unsafe_code, reason = "clock_gettime(2) for this thread's CPU time through libc")]

use std::collections::HashMap;

use super::*;
use crate::scheduler::sample::draw::{self, exp_neg, nucleus_len, Adjusted, Cut, Scratch};

/// Logits shaped like a language model's: a broad low mass and a few strong candidates.
pub(crate) fn synthetic_logits(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut unit = move || (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    let mut logits: Vec<f32> = (0..n).map(|_| (3.0 * ((0..4).map(|_| unit()).sum::<f64>() - 2.0)) as f32).collect();
    for (k, &t) in [17, 1023, 1024, 1500, 2047, 2200].iter().enumerate() {
        if t < n {
            logits[t] = 5.0 + k as f32 * 0.6;
        }
    }
    logits
}

/// `softmax(adjusted / temperature)`, cut to its top-`top_p` nucleus (most probable first,
/// equal ones by lower token, up to and with the token whose cumulative probability reaches
/// `top_p`) and renormalised, in f64.
pub(crate) fn reference(adjusted: &[f64], temperature: f64, top_p: f64) -> Vec<f64> {
    let max = adjusted.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = adjusted.iter().map(|&l| ((l - max) / temperature).exp()).collect();
    let total: f64 = e.iter().sum();
    let mut p: Vec<f64> = e.iter().map(|&x| x / total).collect();
    if top_p < 1.0 {
        let mut order: Vec<usize> = (0..p.len()).collect();
        order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
        let mut cum = 0.0;
        let mut keep = order.len();
        for (k, &t) in order.iter().enumerate() {
            cum += p[t];
            if cum >= top_p {
                keep = k + 1;
                break;
            }
        }
        let kept: f64 = order[..keep].iter().map(|&t| p[t]).sum();
        for (k, &t) in order.iter().enumerate() {
            p[t] = if k < keep { p[t] / kept } else { 0.0 };
        }
    }
    p
}

/// The chi-square statistic of `counts` against `probs` and its critical value at p ≈ 3e-7
/// (Wilson–Hilferty, z = 5). Tokens expected fewer than 5 times share one bin. A token of
/// probability 0 that was drawn fails at once.
pub(crate) fn chi_square(counts: &[u64], probs: &[f64]) -> (f64, f64) {
    let n: u64 = counts.iter().sum();
    let (mut stat, mut bins) = (0.0, 0);
    let (mut pooled_obs, mut pooled_exp) = (0.0, 0.0);
    for (t, (&c, &p)) in counts.iter().zip(probs).enumerate() {
        assert!(p > 0.0 || c == 0, "token {t} has probability 0 but was drawn {c} times");
        let expected = p * n as f64;
        if expected >= 5.0 {
            stat += (c as f64 - expected).powi(2) / expected;
            bins += 1;
        } else {
            pooled_obs += c as f64;
            pooled_exp += expected;
        }
    }
    if pooled_exp > 0.0 {
        stat += (pooled_obs - pooled_exp).powi(2) / pooled_exp;
        bins += 1;
    }
    let df = f64::from(bins - 1);
    let a = 2.0 / (9.0 * df);
    (stat, df * (1.0 - a + 5.0 * a.sqrt()).powi(3))
}

fn assert_fits(counts: &[u64], probs: &[f64], what: &str) {
    let (stat, critical) = chi_square(counts, probs);
    assert!(stat < critical, "{what}: chi-square {stat:.1} above {critical:.1}");
}

/// The same draws against a distribution they do not come from: the test can tell.
fn assert_misfits(counts: &[u64], probs: &[f64], what: &str) {
    let (stat, critical) = chi_square(counts, probs);
    assert!(stat > critical, "{what}: chi-square {stat:.1} should exceed {critical:.1}");
}

fn params(temperature: f32, top_p: f32, seed: u64) -> SamplingParams {
    SamplingParams { temperature, top_p, seed: Some(seed), ..SamplingParams::default() }
}

fn counts_of(sampler: &mut Sampler, logits: &[f32], draws: usize) -> Vec<u64> {
    let mut counts = vec![0; logits.len()];
    for _ in 0..draws {
        counts[sampler.pick(logits, true) as usize] += 1;
    }
    counts
}

fn widened(logits: &[f32]) -> Vec<f64> {
    logits.iter().map(|&l| f64::from(l)).collect()
}

#[test]
fn temperature_alone_draws_the_tempered_softmax() {
    let logits = synthetic_logits(3000, 1);
    let counts = counts_of(&mut build_sampler(&params(0.7, 1.0, 11), 0, 64, None), &logits, 200_000);
    assert_fits(&counts, &reference(&widened(&logits), 0.7, 1.0), "T 0.7");
    assert_misfits(&counts, &reference(&widened(&logits), 0.75, 1.0), "T 0.7 against T 0.75");
}

#[test]
fn top_p_keeps_the_nucleus_of_the_tempered_distribution() {
    let logits = synthetic_logits(3000, 2);
    let counts = counts_of(&mut build_sampler(&params(1.3, 0.9, 12), 0, 64, None), &logits, 200_000);
    let expected = reference(&widened(&logits), 1.3, 0.9);
    assert_fits(&counts, &expected, "T 1.3, top-p 0.9");
    // The nucleus taken before the temperature (not OpenAI's order) is another distribution.
    let untempered_nucleus = reference(&widened(&logits), 1.0, 0.9);
    let mut wrong: Vec<f64> = widened(&logits)
        .iter()
        .zip(&untempered_nucleus)
        .map(|(&l, &p)| if p > 0.0 { (l / 1.3).exp() } else { 0.0 })
        .collect();
    let total: f64 = wrong.iter().sum();
    wrong.iter_mut().for_each(|p| *p /= total);
    let (stat, critical) = chi_square(&counts, &wrong.iter().map(|&p| p.max(1e-300)).collect::<Vec<_>>());
    assert!(stat > critical, "the nucleus before the temperature fits too: {stat:.1} <= {critical:.1}");
}

fn cut(temperature: f32, top_p: f32, top_k: u32) -> Cut {
    Cut { temperature, top_p, top_k }
}

/// The logits with all but the `k` highest (ties: lower token first) set to -inf.
fn top_k_only(logits: &[f64], k: usize) -> Vec<f64> {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let mut out = vec![f64::NEG_INFINITY; logits.len()];
    for &t in &order[..k] {
        out[t] = logits[t];
    }
    out
}

#[test]
fn top_k_keeps_the_highest_logits_then_top_p_its_tempered_nucleus() {
    let logits = synthetic_logits(3000, 9);
    for (temperature, top_p, top_k, seed) in [(0.9, 1.0, 40, 21), (1.2, 0.8, 300, 22), (0.7, 1.0, 2000, 23)] {
        let p = SamplingParams { top_k, ..params(temperature, top_p, seed) };
        let counts = counts_of(&mut build_sampler(&p, 0, 64, None), &logits, 200_000);
        let expected =
            reference(&top_k_only(&widened(&logits), top_k as usize), f64::from(temperature), f64::from(top_p));
        assert_fits(&counts, &expected, &format!("T {temperature}, top-p {top_p}, top-k {top_k}"));
        if top_k < 1000 {
            assert_misfits(
                &counts,
                &reference(&widened(&logits), f64::from(temperature), f64::from(top_p)),
                "no top-k",
            );
        }
    }
    // top-k 1 is the first highest logit; a top-k past the vocabulary limits nothing.
    let flat = vec![0.5f32; 64];
    for u in uniforms().take(50) {
        let adjusted = Adjusted { raw: &flat, deltas: &[], allowed: None };
        assert_eq!(draw::draw(&adjusted, cut(1.0, 1.0, 1), u, &mut Scratch::default()), Some(0));
    }
    let counts = counts_of(
        &mut build_sampler(&SamplingParams { top_k: 5000, ..params(0.8, 1.0, 24) }, 0, 64, None),
        &logits,
        100_000,
    );
    assert_fits(&counts, &reference(&widened(&logits), 0.8, 1.0), "top-k above the vocabulary");
}

#[test]
fn penalties_and_bias_shift_the_logits_before_temperature_and_top_p() {
    let logits = synthetic_logits(3000, 3);
    let top = draw::first_argmax(&logits);
    let mut p = params(0.9, 0.95, 13);
    (p.presence_penalty, p.frequency_penalty) = (0.6, 0.4);
    p.logit_bias = vec![(top as i32, -100.0), (11, 2.5), (2999, 4.0), (1500, 1.0)];
    let mut sampler = build_sampler(&p, 0, 64, None);
    let history = [5u32, 5, 7, 1500, 2047, 2047, 2047, 11];
    for &t in &history {
        sampler.accept(t);
    }
    let counts = counts_of(&mut sampler, &logits, 200_000);
    let mut seen: HashMap<u32, f64> = HashMap::new();
    for &t in &history {
        *seen.entry(t).or_default() += 1.0;
    }
    let mut adjusted = widened(&logits);
    for &(t, b) in &p.logit_bias {
        adjusted[t as usize] += f64::from(b);
    }
    for (&t, &n) in &seen {
        adjusted[t as usize] -= n * 0.4 + 0.6;
    }
    assert_fits(&counts, &reference(&adjusted, 0.9, 0.95), "penalties and bias");
    let mut unpenalised = widened(&logits);
    for &(t, b) in &p.logit_bias {
        unpenalised[t as usize] += f64::from(b);
    }
    let unpenalised: Vec<f64> = reference(&unpenalised, 0.9, 0.95).iter().map(|&p| p.max(1e-300)).collect();
    assert_misfits(&counts, &unpenalised, "penalties left out");
}

/// One likely token and a long flat tail whose mass the nucleus needs: the first candidates
/// (within e^-9.2 of the top) do not hold it, so the set grows; the tail's equal tokens enter
/// by lower token first.
#[test]
fn candidates_grow_until_they_hold_the_nucleus() {
    let mut logits = vec![-9.5f32; 5000];
    logits[4321] = 0.0;
    let counts = counts_of(&mut build_sampler(&params(1.0, 0.9, 14), 0, 64, None), &logits, 40_000);
    let expected = reference(&widened(&logits), 1.0, 0.9);
    let kept = expected.iter().filter(|&&p| p > 0.0).count();
    assert!(kept > 1000 && kept < 4999, "the nucleus holds part of the tail: {kept}");
    assert_fits(&counts, &expected, "grown candidates");
}

#[test]
fn a_grammar_mask_forbids_tokens_and_the_rest_keep_their_odds() {
    let logits = synthetic_logits(2500, 4);
    let top = draw::first_argmax(&logits);
    let allowed_token = |t: usize| t.is_multiple_of(3) && t != top;
    let mut bits = vec![0u32; 2500usize.div_ceil(32)];
    for t in (0..2500).filter(|&t| allowed_token(t)) {
        bits[t / 32] |= 1 << (t % 32);
    }
    let adjusted = Adjusted { raw: &logits, deltas: &[], allowed: Some(&bits) };
    let mut scratch = Scratch::default();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(15);
    let mut counts = vec![0u64; logits.len()];
    for _ in 0..150_000 {
        let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        counts[draw::draw(&adjusted, cut(0.8, 0.97, 0), u, &mut scratch).unwrap() as usize] += 1;
    }
    let masked =
        logits.iter().enumerate().map(|(t, &l)| if allowed_token(t) { f64::from(l) } else { f64::NEG_INFINITY });
    let masked: Vec<f64> = masked.collect();
    assert_fits(&counts, &reference(&masked, 0.8, 0.97), "masked");
}

fn draw_once(logits: &[f32], temperature: f32, top_p: f32, u: f64) -> Option<u32> {
    draw::draw(
        &Adjusted { raw: logits, deltas: &[], allowed: None },
        cut(temperature, top_p, 0),
        u,
        &mut Scratch::default(),
    )
}

fn uniforms() -> impl Iterator<Item = f64> {
    (0..1000).map(|k| (k as f64 + 0.5) / 1000.0).chain([0.0, 1.0 - f64::EPSILON])
}

#[test]
fn a_tiny_top_p_keeps_only_the_first_highest_token() {
    let logits = [1.0, 3.0, 3.0, 0.0, 2.9];
    for u in uniforms() {
        assert_eq!(draw_once(&logits, 1.0, 1e-6, u), Some(1));
        assert_eq!(draw_once(&logits, 0.5, 0.0, u), Some(1));
    }
}

#[test]
fn equal_tokens_enter_the_nucleus_lower_token_first() {
    let logits = [0.0f32; 4];
    let drawn: Vec<u32> = uniforms().map(|u| draw_once(&logits, 1.0, 0.5, u).unwrap()).collect();
    assert!(drawn.iter().all(|&t| t < 2), "only tokens 0 and 1 hold half the mass");
    assert!(drawn.contains(&0) && drawn.contains(&1));
}

#[test]
fn minus_infinity_logits_are_never_drawn() {
    let mut logits = vec![f32::NEG_INFINITY; 3000];
    (logits[5], logits[1100], logits[2999]) = (0.0, 1.0, -2.0);
    for top_p in [1.0, 0.99, 0.5] {
        for u in uniforms() {
            let t = draw_once(&logits, 0.8, top_p, u).unwrap();
            assert!([5, 1100, 2999].contains(&t), "top-p {top_p}: drew {t}");
        }
    }
    assert_eq!(draw_once(&[f32::NEG_INFINITY; 40], 1.0, 1.0, 0.3), None, "nothing to draw");
}

#[test]
fn all_the_mass_in_one_token_draws_it_every_time() {
    let mut logits = vec![0.0f32; 2000];
    logits[1999] = 200.0;
    for top_p in [1.0, 0.5] {
        for u in uniforms() {
            assert_eq!(draw_once(&logits, 1.0, top_p, u), Some(1999));
        }
    }
}

#[test]
fn greedy_takes_the_first_highest_logit_after_bias_and_penalties() {
    let logits = [0.0, 5.0, 1.0, 4.0, 4.5];
    let mut p = params(0.0, 1.0, 1);
    p.presence_penalty = 1.0;
    p.logit_bias = vec![(2, 3.5)];
    let mut sampler = build_sampler(&p, 0, 16, None);
    // Token 1 leads, then token 2 (1 + 3.5) and 4 tie, then token 1 is penalised out of the lead.
    assert_eq!(sampler.sample(&logits), 1);
    assert_eq!(sampler.sample(&logits), 2);
    assert_eq!(sampler.sample(&logits), 4);
}

#[test]
fn penalties_count_only_the_last_window_tokens() {
    let mut p = params(0.0, 1.0, 1);
    p.frequency_penalty = 1.0;
    let mut sampler = build_sampler(&p, 0, 2, None);
    for t in [3, 3, 4] {
        sampler.accept(t);
    }
    sampler.merge_deltas();
    assert_eq!(sampler.deltas, vec![(3, -1.0), (4, -1.0)]);
}

#[test]
fn a_seeded_sampler_repeats_itself_and_each_choice_has_its_own_stream() {
    let logits = synthetic_logits(3000, 5);
    let run = |choice| {
        let mut s = build_sampler(&params(1.0, 0.95, 77), choice, 64, None);
        (0..200).map(|_| s.sample(&logits)).collect::<Vec<_>>()
    };
    assert_eq!(run(0), run(0));
    assert_ne!(run(0), run(1));
}

#[test]
fn exp_is_exact_to_f32_rounding() {
    for k in 0..=870_000 {
        let x = -(k as f32) / 10_000.0;
        let exact = f64::from(x).exp();
        let got = f64::from(exp_neg(x));
        assert!((got - exact).abs() <= 4e-7 * exact, "e^{x}: {got} vs {exact}");
    }
    assert_eq!(exp_neg(0.0), 1.0);
    assert_eq!(exp_neg(-88.0), 0.0);
    assert_eq!(exp_neg(f32::NEG_INFINITY), 0.0);
}

#[test]
fn the_weighted_quickselect_finds_what_a_full_sort_finds() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(3);
    for n in [1usize, 2, 15, 16, 17, 100, 1000, 5000] {
        for round in 0..20 {
            // Few distinct values, so ties are common.
            let c: Vec<(f32, u32)> = (0..n).map(|t| ((rng.next_u64() % 50) as f32 / 7.0, t as u32)).collect();
            let total: f64 = c.iter().map(|&(e, _)| f64::from(e)).sum();
            let need = total * (round as f64 / 19.0);
            let mut sorted = c.clone();
            sorted.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            let mut cum = 0.0;
            let want = sorted.iter().position(|&(e, _)| {
                cum += f64::from(e);
                cum >= need
            });
            let want = want.map_or(n, |k| k + 1);
            let mut got = c.clone();
            let k = nucleus_len(&mut got, need);
            let mut got_ids: Vec<u32> = got[..k].iter().map(|&(_, t)| t).collect();
            got_ids.sort_unstable();
            let mut want_ids: Vec<u32> = sorted[..want].iter().map(|&(_, t)| t).collect();
            want_ids.sort_unstable();
            assert_eq!(got_ids, want_ids, "n {n}, need {need}");
        }
    }
}

/// This thread's CPU time: the machine is shared, wall time would measure the neighbours.
fn thread_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec to write to.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Per-token sampling CPU time of one choice over a vocabulary of Qwen's size, the old chain
/// (llama.cpp's samplers over a copied candidate array) against this one. A measurement, not a
/// test: `cargo test --workspace --lib sampling_speed -- --ignored --nocapture`.
#[test]
#[ignore]
fn sampling_speed() {
    use llama_cpp_2::sampling::LlamaSampler;
    use llama_cpp_2::token::data::LlamaTokenData;
    use llama_cpp_2::token::data_array::LlamaTokenDataArray;
    use llama_cpp_2::token::LlamaToken;

    // Peaked like a chat model's: a broad low mass and a few strong tokens.
    let mut logits: Vec<f32> = synthetic_logits(151_936, 9).iter().map(|l| l * 2.5).collect();
    for (k, t) in [100usize, 5000, 70000, 150000].into_iter().enumerate() {
        logits[t] = 18.0 + k as f32;
    }
    for (temperature, top_p) in [(0.8, 1.0), (0.7, 0.95)] {
        let mut chain = vec![LlamaSampler::temp(temperature)];
        if top_p < 1.0 {
            chain.push(LlamaSampler::top_p(top_p, 1));
        }
        chain.push(LlamaSampler::dist(1));
        let mut chain = LlamaSampler::chain_simple(chain);
        let n = 200;
        let started = thread_cpu_time();
        for _ in 0..n {
            // What `llama_sampler_sample` does: every logit into a candidate array, then the chain.
            let candidates = logits.iter().enumerate().map(|(t, &l)| LlamaTokenData::new(LlamaToken(t as i32), l, 0.0));
            let mut candidates = LlamaTokenDataArray::from_iter(candidates, false);
            candidates.apply_sampler(&mut chain);
            std::hint::black_box(candidates.selected_token());
        }
        let before = (thread_cpu_time() - started) / n;
        let mut sampler = build_sampler(&params(temperature, top_p, 1), 0, 64, None);
        let n = 2000;
        let started = thread_cpu_time();
        for _ in 0..n {
            std::hint::black_box(sampler.pick(&logits, true));
        }
        let after = (thread_cpu_time() - started) / n;
        eprintln!("T {temperature} top-p {top_p}: llama.cpp chain {before:?}, this sampler {after:?} per token");
    }
}

/// The run-wise argmax finds what a plain scan finds: the first of equal maxima, across runs
/// and within one, NaN never winning, and lengths that leave a partial run.
#[test]
fn first_argmax_is_the_first_maximum_a_plain_scan_finds() {
    fn scan(values: &[f32]) -> usize {
        let mut best = 0;
        for (i, &v) in values.iter().enumerate().skip(1) {
            if v > values[best] {
                best = i;
            }
        }
        best
    }
    let mut cases = vec![vec![], vec![f32::NAN; 70], vec![f32::NEG_INFINITY; 130], vec![1.0, f32::NAN, 2.0]];
    for (n, seed) in [(1, 1), (63, 2), (64, 3), (65, 4), (1000, 5), (151_936, 6)] {
        let mut v = synthetic_logits(n, seed);
        cases.push(v.clone());
        // The maximum twice, in different runs and in one run; a NaN before it.
        let top = v.iter().copied().fold(f32::NEG_INFINITY, f32::max) + 1.0;
        for i in [n / 3, n / 3 + 1, n - 1].into_iter().filter(|&i| i < n) {
            v[i] = top;
        }
        if n > 2 {
            v[1] = f32::NAN;
        }
        cases.push(v);
    }
    cases.push(vec![-0.0, 0.0, 0.0]);
    for values in cases {
        assert_eq!(draw::first_argmax(&values), scan(&values), "{} values", values.len());
    }
}
