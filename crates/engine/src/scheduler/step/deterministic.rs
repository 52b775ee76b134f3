//! `--deterministic-greedy`: a greedy request's output depends on the request alone, not on the
//! prefix cache, the drafts, or the other sequences decoded beside it.
//!
//! ggml's CPU kernels pick their algorithm by the number of rows a matrix product or attention
//! computes at once: one row goes through `vec_dot`, two or more through llamafile's tinyBLAS,
//! eight or more K-quant rows through the tiled kernel, repacked weights through a 4-row GEMM
//! plus one GEMV per leftover row, 64+ query rows through tiled flash attention, and one lone
//! query over 512+ cells through split-KV attention. Each sums in its own order, so a row's
//! logits differ in their last bits with the batch it was computed in, and a near tie between
//! the two best tokens then flips ("apples, oranges, and bananas" / "apples, bananas, and
//! oranges"). vLLM's batch-invariant mode and SGLang's deterministic inference replace the
//! kernels with ones that sum in a fixed order whatever the batch; llama.cpp's CPU backend has
//! that only as its reference mode (`ggml_backend_cpu_set_use_ref`), which llama.cpp's API does
//! not reach. So a greedy request is made to compute every row in a batch of the same shape,
//! whatever else runs:
//!
//! - its sequence gets a ubatch of its own each step (llama.cpp's per-stream split puts one run
//!   of consecutive sequence ids in a ubatch: [`batch_order`] orders the rows so that no other
//!   sequence joins it): one row per decode step, as when it runs alone;
//! - its prompt is computed in chunks of a fixed size from position 0 ([`chunk_end`]), each in
//!   one step, never cut by what else the step holds;
//! - it reuses no cached prefix (cached entries were computed in other shapes: a prompt read in
//!   one piece, or by a sampled request beside others) and verifies no drafts.
//!
//! What it costs: a step runs one more pass over the weights per greedy sequence, and greedy
//! prompts are recomputed; see docs/determinism.md for the measurements.

use crate::kv::layout::KvLayout;

/// Largest prompt chunk a deterministic request computes in one step, before the step budget.
const MAX_CHUNK: usize = 256;

/// The fixed prompt chunk of a server with this batch size and these slots: a step always has
/// room for it beside one decoding row per slot.
pub(crate) fn chunk_size(batch_size: u32, parallel: u32) -> usize {
    (batch_size.saturating_sub(parallel) as usize).clamp(1, MAX_CHUNK)
}

/// Where the chunk that starts at `prefilled` ends: chunks start at multiples of `chunk`, and a
/// chunk never reaches past `text_end` (the prompt's end, or the next image).
pub(crate) fn chunk_end(prefilled: usize, chunk: usize, text_end: usize) -> usize {
    (prefilled / chunk * chunk + chunk).min(text_end)
}

/// [`crate::kv::layout::batch_order`] with some sequences isolated: `order[i]` is row `i`'s
/// index in the batch, given the rows' sequences in planned order.
///
/// llama.cpp builds a per-stream ubatch from the first row no ubatch has taken yet, adding the
/// sequences whose ids follow on by one, wherever their rows are in the batch. So the rows go in
/// groups: each isolated sequence alone, and each run of consecutive non-isolated sequences
/// together, groups by descending first id (the id after a group's last belongs to a group put
/// before it, taken already), rows by ascending sequence within a group, keeping their order.
/// In a unified cache every row goes into one ubatch anyway: the planned order stands.
pub(crate) fn batch_order(layout: KvLayout, seqs: &[i32], isolated: impl Fn(i32) -> bool) -> Vec<usize> {
    if layout == KvLayout::Unified {
        return (0..seqs.len()).collect();
    }
    let mut present: Vec<i32> = seqs.to_vec();
    present.sort_unstable();
    present.dedup();
    // The first id of each present sequence's group.
    let mut group_start = std::collections::HashMap::with_capacity(present.len());
    let mut start = None;
    let mut prev = None;
    for &s in &present {
        let joins = !isolated(s) && prev.is_some_and(|p: i32| p + 1 == s && !isolated(p));
        if !joins {
            start = Some(s);
        }
        group_start.insert(s, start.expect("set above"));
        prev = Some(s);
    }
    let mut placed: Vec<usize> = (0..seqs.len()).collect();
    placed.sort_by_key(|&i| (std::cmp::Reverse(group_start[&seqs[i]]), seqs[i]));
    let mut order = vec![0; seqs.len()];
    for (k, &i) in placed.iter().enumerate() {
        order[i] = k;
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ubatches llama.cpp's sequential equal split makes of a batch whose rows belong to
    /// `seqs` (in batch order), one row per sequence and ubatch being enough here: each is the
    /// set of sequences it holds.
    fn ubatches(seqs: &[i32]) -> Vec<Vec<i32>> {
        let mut used = vec![false; seqs.len()];
        let mut out = Vec::new();
        while let Some(first) = used.iter().position(|u| !u) {
            let mut set = vec![seqs[first]];
            for i in first..seqs.len() {
                if !used[i] && seqs[i] == set.last().unwrap() + 1 {
                    set.push(seqs[i]);
                }
            }
            for (i, u) in used.iter_mut().enumerate() {
                if set.contains(&seqs[i]) {
                    *u = true;
                }
            }
            out.push(set);
        }
        out
    }

    fn arranged(seqs: &[i32], isolated: &[i32]) -> Vec<i32> {
        let order = batch_order(KvLayout::PerSequence, seqs, |s| isolated.contains(&s));
        let mut placed = vec![-1; seqs.len()];
        for (i, &k) in order.iter().enumerate() {
            placed[k] = seqs[i];
        }
        placed
    }

    #[test]
    fn an_isolated_sequence_gets_a_ubatch_of_its_own() {
        // Sequences 0..8 decode; 3 and 4 are greedy under `--deterministic-greedy`.
        let seqs = [5, 3, 0, 1, 2, 4, 6, 7];
        let placed = arranged(&seqs, &[3, 4]);
        assert_eq!(placed, vec![5, 6, 7, 4, 3, 0, 1, 2]);
        assert_eq!(ubatches(&placed), vec![vec![5, 6, 7], vec![4], vec![3], vec![0, 1, 2]]);
        // Nothing isolated: ascending, one ubatch, as `kv::layout::batch_order` places them.
        let plain = arranged(&seqs, &[]);
        assert_eq!(plain, vec![0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(ubatches(&plain).len(), 1);
    }

    #[test]
    fn a_sequence_keeps_its_rows_in_order_and_together() {
        // A prompt chunk of isolated 1 (three rows), decoding rows of 0 and 2.
        let seqs = [1, 1, 1, 2, 0];
        let order = batch_order(KvLayout::PerSequence, &seqs, |s| s == 1);
        assert_eq!(order, vec![1, 2, 3, 0, 4]);
        assert_eq!(ubatches(&arranged(&seqs, &[1])), vec![vec![2], vec![1], vec![0]]);
        assert_eq!(batch_order(KvLayout::Unified, &seqs, |s| s == 1), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn chunks_start_at_fixed_positions() {
        assert_eq!(chunk_size(512, 8), 256);
        assert_eq!(chunk_size(40, 8), 32);
        assert_eq!(chunk_end(0, 32, 100), 32);
        assert_eq!(chunk_end(32, 32, 100), 64);
        assert_eq!(chunk_end(96, 32, 100), 100);
        // An image at 40 ends the text chunk there; the next chunk ends where 32-aligned ones do.
        assert_eq!(chunk_end(32, 32, 40), 40);
        assert_eq!(chunk_end(45, 32, 100), 64);
    }
}
