//! Exact draws from a tempered softmax over a whole vocabulary without sorting it (see
//! docs/sampling.md). The logits are read in blocks of `BLOCK`: one pass finds each block's
//! maximum, one computes each block's mass `Σ exp((l - max) / T)`, and a draw picks a block by
//! those masses, then a token inside it. Top-p selects the nucleus from a candidate set that is
//! checked to hold it, by a weighted quickselect, never a sort of the vocabulary.

use std::cmp::Ordering;

/// Tokens per block: 4 KiB of logits, which stay in L1 between a block's two passes.
pub(crate) const BLOCK: usize = 1024;

/// The logits one choice samples from: the model's, plus sparse additive adjustments (logit
/// bias, penalties), and the grammar's mask, where a forbidden token's logit is -inf.
pub(crate) struct Adjusted<'a> {
    pub raw: &'a [f32],
    /// `(token, delta)` sorted by token, each token once.
    pub deltas: &'a [(u32, f32)],
    /// Bit `t % 32` of word `t / 32` set: token `t` allowed.
    pub allowed: Option<&'a [u32]>,
}

impl Adjusted<'_> {
    fn n_blocks(&self) -> usize {
        self.raw.len().div_ceil(BLOCK)
    }

    /// Block `b`'s logits: the model's own when nothing adjusts them, else adjusted in `buf`.
    fn block<'b>(&'b self, b: usize, buf: &'b mut [f32]) -> &'b [f32] {
        let start = b * BLOCK;
        let raw = &self.raw[start..(start + BLOCK).min(self.raw.len())];
        let end = start + raw.len();
        let from = self.deltas.partition_point(|&(t, _)| (t as usize) < start);
        let to = self.deltas.partition_point(|&(t, _)| (t as usize) < end);
        if from == to && self.allowed.is_none() {
            return raw;
        }
        let out = &mut buf[..raw.len()];
        out.copy_from_slice(raw);
        for &(t, d) in &self.deltas[from..to] {
            out[t as usize - start] += d;
        }
        if let Some(bits) = self.allowed {
            for (k, v) in out.iter_mut().enumerate() {
                let t = start + k;
                let word = bits.get(t / 32).copied().unwrap_or(0);
                if (word >> (t % 32)) & 1 == 0 {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
        out
    }
}

/// Reused buffers of one choice's sampler.
#[derive(Default)]
pub(crate) struct Scratch {
    buf: Vec<f32>,
    block_max: Vec<f32>,
    block_mass: Vec<f64>,
    candidates: Vec<(f32, u32)>,
    /// Top-k: the finite block maxima, selected in place.
    maxima: Vec<f32>,
}

impl Scratch {
    fn prepare(&mut self, n_blocks: usize) {
        self.buf.resize(BLOCK, 0.0);
        self.block_max.clear();
        self.block_mass.clear();
        self.block_max.reserve(n_blocks);
        self.block_mass.reserve(n_blocks);
    }
}

/// Index of the first maximum (llama.cpp's greedy sampler keeps the first of equal logits); 0
/// when no value beats another (all NaN, say).
///
/// A greedy step reads every row of logits once (600 KB a row for a 152k vocabulary): the maximum
/// of each 64 values is taken in 16 lanes the compiler vectorizes, and only a run whose maximum
/// beats the best so far is searched for its first index. The scalar loop, whose every compare
/// waits on the last, ran at half the speed.
pub(crate) fn first_argmax(values: &[f32]) -> usize {
    const RUN: usize = 64;
    const LANES: usize = 16;
    let (mut best, mut best_value) = (0, values.first().copied().unwrap_or(f32::NEG_INFINITY));
    for (r, run) in values.chunks(RUN).enumerate() {
        let mut lanes = [f32::NEG_INFINITY; LANES];
        let mut exact = run.chunks_exact(LANES);
        for part in &mut exact {
            for (m, &v) in lanes.iter_mut().zip(part) {
                *m = if v > *m { v } else { *m };
            }
        }
        let mut run_max = lanes.iter().fold(f32::NEG_INFINITY, |a, &m| if m > a { m } else { a });
        for &v in exact.remainder() {
            run_max = if v > run_max { v } else { run_max };
        }
        if run_max > best_value {
            // The max is one of the run's values, so `position` finds it.
            best = r * RUN + run.iter().position(|&v| v == run_max).unwrap_or(0);
            best_value = run_max;
        }
    }
    best
}

/// The first highest adjusted logit (token 0 when every token is forbidden).
pub(crate) fn greedy(logits: &Adjusted<'_>, scratch: &mut Scratch) -> u32 {
    scratch.prepare(logits.n_blocks());
    let (mut best, mut best_value) = (0, f32::NEG_INFINITY);
    for b in 0..logits.n_blocks() {
        let values = logits.block(b, &mut scratch.buf);
        let i = first_argmax(values);
        if values[i] > best_value {
            (best, best_value) = (b * BLOCK + i, values[i]);
        }
    }
    crate::units::count_u32(best)
}

/// Which part of the distribution a draw is made from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cut {
    pub temperature: f32,
    /// The nucleus of the tempered distribution; 1: all of it.
    pub top_p: f32,
    /// The highest logits only; 0: no limit.
    pub top_k: u32,
}

/// Draws a token from `softmax(logits / temperature)`, restricted to the `top_k` highest logits
/// and then to the top-`top_p` nucleus, with `u` uniform in [0, 1). `None` when every token is
/// forbidden.
pub(crate) fn draw(logits: &Adjusted<'_>, cut: Cut, u: f64, scratch: &mut Scratch) -> Option<u32> {
    let Cut { temperature, top_p, top_k } = cut;
    let n_blocks = logits.n_blocks();
    scratch.prepare(n_blocks);
    for b in 0..n_blocks {
        let max = max_of(logits.block(b, &mut scratch.buf));
        scratch.block_max.push(max);
    }
    let max = max_of(&scratch.block_max);
    if max == f32::NEG_INFINITY || max.is_nan() {
        return None;
    }
    if top_k > 0 && (top_k as usize) < logits.raw.len() {
        return Some(draw_top_k(logits, cut, max, u, scratch));
    }
    let inv_t = 1.0 / temperature;
    let mut total = 0.0;
    for b in 0..n_blocks {
        let mass = if scratch.block_max[b] == f32::NEG_INFINITY {
            0.0
        } else {
            f64::from(exp_sum(logits.block(b, &mut scratch.buf), max, inv_t))
        };
        scratch.block_mass.push(mass);
        total += mass;
    }
    if top_p < 1.0 {
        return Some(draw_nucleus(logits, temperature, f64::from(top_p) * total, max, u, scratch));
    }
    // The block holding the draw, then the token inside it.
    let target = u * total;
    let mut before = 0.0;
    let mut last_with_mass = None;
    for b in 0..n_blocks {
        let mass = scratch.block_mass[b];
        if mass > 0.0 {
            last_with_mass = Some(b);
        }
        if before + mass > target {
            return Some(draw_in_block(logits, b, target - before, max, inv_t, &mut scratch.buf));
        }
        before += mass;
    }
    // `u * total` rounded up to the total: the last token with any mass.
    let b = last_with_mass?;
    Some(draw_in_block(logits, b, f64::INFINITY, max, inv_t, &mut scratch.buf))
}

/// The token of block `b` where the running mass first exceeds `target` (the last token with
/// mass when rounding kept it below).
fn draw_in_block(logits: &Adjusted<'_>, b: usize, target: f64, max: f32, inv_t: f32, buf: &mut [f32]) -> u32 {
    let values = logits.block(b, buf);
    let mut cum = 0.0;
    let mut last = 0;
    for (k, &v) in values.iter().enumerate() {
        let e = exp_neg((v - max) * inv_t);
        if e > 0.0 {
            cum += f64::from(e);
            last = k;
            if cum > target {
                break;
            }
        }
    }
    crate::units::count_u32(b * BLOCK + last)
}

/// Gaps below the maximum, in tempered units, within which candidates for the nucleus are first
/// looked for: e^-9.2 ≈ 1e-4 and e^-23 ≈ 1e-10 of the top token's probability, then everything.
const CANDIDATE_GAPS: [f32; 3] = [9.2, 23.0, f32::INFINITY];

/// Top-p: the smallest set of most probable tokens whose mass reaches `need` (ties: lower token
/// first), then a draw inside it. The candidates are every token within a gap of the maximum;
/// their exact mass is checked to reach `need`, so they hold the whole nucleus (any token left
/// out is less probable than all of them); a larger gap is tried when it does not.
fn draw_nucleus(logits: &Adjusted<'_>, temperature: f32, need: f64, max: f32, u: f64, scratch: &mut Scratch) -> u32 {
    let inv_t = 1.0 / temperature;
    let Scratch { buf, block_max, candidates, .. } = scratch;
    for gap in CANDIDATE_GAPS {
        candidates.clear();
        let threshold = max - gap * temperature;
        let mut mass = 0.0;
        for (b, &block_max) in block_max.iter().enumerate().take(logits.n_blocks()) {
            if block_max < threshold || block_max == f32::NEG_INFINITY {
                continue;
            }
            for (k, &v) in logits.block(b, buf).iter().enumerate() {
                if v >= threshold {
                    let e = exp_neg((v - max) * inv_t);
                    if e > 0.0 {
                        candidates.push((e, crate::units::count_u32(b * BLOCK + k)));
                        mass += f64::from(e);
                    }
                }
            }
        }
        if mass >= need {
            break;
        }
    }
    let n = nucleus_len(candidates, need);
    draw_among(&candidates[..n], u)
}

/// The token of `chosen` (`(mass, token)`, at least one) where the running mass first exceeds
/// `u` times their total.
fn draw_among(chosen: &[(f32, u32)], u: f64) -> u32 {
    let target = u * chosen.iter().map(|&(e, _)| f64::from(e)).sum::<f64>();
    let mut cum = 0.0;
    for &(e, t) in chosen {
        cum += f64::from(e);
        if cum > target {
            return t;
        }
    }
    chosen[chosen.len() - 1].1
}

/// Top-k (then top-p inside it): the `top_k` highest logits, ties by lower token. Only tokens
/// at or above the `top_k`-th highest block maximum are looked at: each of those blocks holds a
/// token that high, so at least `top_k` tokens pass and every one of the top `top_k` does.
fn draw_top_k(logits: &Adjusted<'_>, cut: Cut, max: f32, u: f64, scratch: &mut Scratch) -> u32 {
    let k = cut.top_k as usize;
    let Scratch { buf, block_max, candidates, maxima, .. } = scratch;
    maxima.clear();
    maxima.extend(block_max.iter().copied().filter(|m| *m > f32::NEG_INFINITY));
    let threshold = if k <= maxima.len() {
        let (_, kth, _) = maxima.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
        *kth
    } else {
        f32::MIN
    };
    candidates.clear();
    for (b, &m) in block_max.iter().enumerate() {
        if m < threshold || m == f32::NEG_INFINITY {
            continue;
        }
        for (j, &v) in logits.block(b, buf).iter().enumerate() {
            if v >= threshold && v > f32::NEG_INFINITY {
                candidates.push((v, crate::units::count_u32(b * BLOCK + j)));
            }
        }
    }
    if candidates.len() > k {
        candidates.select_nth_unstable_by(k - 1, more_probable);
        candidates.truncate(k);
    }
    let inv_t = 1.0 / cut.temperature;
    for c in candidates.iter_mut() {
        c.0 = exp_neg((c.0 - max) * inv_t);
    }
    let total: f64 = candidates.iter().map(|&(e, _)| f64::from(e)).sum();
    let n = if cut.top_p < 1.0 { nucleus_len(candidates, f64::from(cut.top_p) * total) } else { candidates.len() };
    draw_among(&candidates[..n], u)
}

/// More probable first; equal probabilities by lower token.
fn more_probable(a: &(f32, u32), b: &(f32, u32)) -> Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

/// Reorders `c` so that `c[..k]` are its `k` most probable entries for the smallest `k ≥ 1` whose
/// mass reaches `need`, and returns `k` (all of `c` when its mass falls short). A quickselect
/// weighted by mass: linear on average, no full sort.
pub(crate) fn nucleus_len(c: &mut [(f32, u32)], need: f64) -> usize {
    let (mut lo, mut hi, mut need) = (0, c.len(), need);
    loop {
        if hi - lo <= 16 {
            c[lo..hi].sort_unstable_by(more_probable);
            let mut cum = 0.0;
            for (k, &(e, _)) in c[lo..hi].iter().enumerate() {
                cum += f64::from(e);
                if cum >= need {
                    return lo + k + 1;
                }
            }
            return hi;
        }
        // Invariant: c[..lo] are the lo most probable entries, `need` what they leave to reach.
        let mid = lo + (hi - lo) / 2;
        c[lo..hi].select_nth_unstable_by(mid - lo, more_probable);
        let upper: f64 = c[lo..mid].iter().map(|&(e, _)| f64::from(e)).sum();
        let with_pivot = upper + f64::from(c[mid].0);
        if upper >= need {
            hi = mid;
        } else if with_pivot >= need {
            return mid + 1;
        } else {
            need -= with_pivot;
            lo = mid + 1;
        }
    }
}

fn max_of(values: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 8];
    let chunks = values.chunks_exact(8);
    let rest = chunks.remainder();
    for chunk in chunks {
        for k in 0..8 {
            acc[k] = if chunk[k] > acc[k] { chunk[k] } else { acc[k] };
        }
    }
    let mut max = f32::NEG_INFINITY;
    for &v in acc.iter().chain(rest) {
        if v > max {
            max = v;
        }
    }
    max
}

/// `Σ exp((v - max) * inv_t)` over at most `BLOCK` values: the exponentials in one loop the
/// compiler vectorises (no reduction in it), then their sum in eight lanes.
fn exp_sum(values: &[f32], max: f32, inv_t: f32) -> f32 {
    let mut e = [0.0f32; BLOCK];
    let e = &mut e[..values.len()];
    for (o, &v) in e.iter_mut().zip(values) {
        *o = exp_neg((v - max) * inv_t);
    }
    let mut acc = [0.0f32; 8];
    let chunks = e.chunks_exact(8);
    let rest = chunks.remainder();
    for chunk in chunks {
        for k in 0..8 {
            acc[k] += chunk[k];
        }
    }
    acc.iter().sum::<f32>() + rest.iter().sum::<f32>()
}

/// `e^x` for `x ≤ 0` (or -inf) to about one f32 ulp: Cephes' `expf` (x = n·ln2 + f, with ln 2
/// split in two so `f` is exact, and a degree-6 polynomial for e^f on |f| ≤ ln2/2). Below -87
/// (where e^x is no longer a normal f32) it is 0, so -inf logits get exactly no mass. Written
/// without branches or calls so the loops above vectorise.
#[inline(always)]
pub(crate) fn exp_neg(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5·2^23: adding it rounds to an integer, kept in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let xc = if x < -87.0 { -87.0 } else { x };
    let shifted = xc * LOG2E + ROUND;
    let n = shifted - ROUND;
    let f = xc - n * LN2_HI - n * LN2_LO;
    let p = ((((1.987_569_1e-4 * f + 1.398_199_9e-3) * f + 8.333_452e-3) * f + 4.166_579_6e-2) * f + 1.666_666_5e-1)
        * f
        + 5e-1;
    let e_f = p * f * f + f + 1.0;
    // 2^n from n's bits: n sits in the low mantissa bits of `shifted`.
    let n_int = (shifted.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let scale = f32::from_bits(((n_int + 127) << 23) as u32);
    if x < -87.0 {
        0.0
    } else {
        e_f * scale
    }
}
