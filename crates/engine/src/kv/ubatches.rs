//! How many ubatches llama.cpp cuts a batch into. Each ubatch is one more pass over the model's
//! weights (and, on a GPU, one more round of kernel launches), so a step's shape matters as much
//! as its size; `gantry_decode_ubatches_total` counts them and the planner's row order keeps them
//! few (see `layout`).
//!
//! This mirrors `llama_batch_allocr` in the llama.cpp that `llama-cpp-sys-2` vendors:
//! - With a KV stream per sequence, `split_equal` with sequential ids: a ubatch takes, from the
//!   first row not yet used, a run of sequences whose ids follow on by one, and the same number
//!   of rows from each (while every one of them has a row left and the ubatch stays within
//!   `n_ubatch`). A sequence with more rows than its neighbours (drafts, a prompt chunk) leaves
//!   its extra rows to further ubatches, and a gap in the ids starts a new one.
//! - In one unified buffer, `split_simple`: `n_ubatch` rows at a time, in order.

use super::layout::KvLayout;

/// Ubatches of a batch whose rows belong to `seqs` (in batch order), at most `n_ubatch` rows each.
#[cfg(test)]
pub(crate) fn ubatches(layout: KvLayout, seqs: &[i32], n_ubatch: usize) -> usize {
    ubatches_with(layout, seqs, n_ubatch, &mut UbatchScratch::default())
}

/// The vectors [`ubatches_with`] works in, kept between steps (`StepBuffers`).
#[derive(Debug, Default)]
pub(crate) struct UbatchScratch {
    used: Vec<bool>,
    run: Vec<i32>,
    next: Vec<usize>,
    rows: Vec<usize>,
}

/// How many ubatches llama.cpp cuts a batch whose rows belong to `seqs` (in batch order) into, at
/// most `n_ubatch` rows each, working in `scratch`.
pub(crate) fn ubatches_with(layout: KvLayout, seqs: &[i32], n_ubatch: usize, scratch: &mut UbatchScratch) -> usize {
    let n_ubatch = n_ubatch.max(1);
    if layout == KvLayout::Unified {
        return seqs.len().div_ceil(n_ubatch);
    }
    let UbatchScratch { used, run, next, rows } = scratch;
    used.clear();
    used.resize(seqs.len(), false);
    let mut count = 0;
    loop {
        // The run of sequences: from the first unused row, ids that follow on by one.
        run.clear();
        for (i, &seq) in seqs.iter().enumerate() {
            if used[i] || run.contains(&seq) {
                continue;
            }
            if run.last().is_none_or(|&last| seq == last + 1) {
                run.push(seq);
                if run.len() > n_ubatch {
                    break;
                }
            }
        }
        if run.is_empty() {
            return count;
        }
        count += 1;
        // The next unused row of each sequence in the run, taken one per sequence at a time.
        next.clear();
        next.resize(run.len(), 0);
        let mut per_seq = 0;
        loop {
            rows.clear();
            for (&seq, &from) in run.iter().zip(next.iter()) {
                match (from..seqs.len()).find(|&i| !used[i] && seqs[i] == seq) {
                    Some(i) => rows.push(i),
                    None => break,
                }
            }
            if rows.len() < run.len() {
                break;
            }
            for (k, &i) in rows.iter().enumerate() {
                used[i] = true;
                next[k] = i + 1;
            }
            per_seq += 1;
            if (per_seq + 1) * run.len() > n_ubatch {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PER_SEQ: KvLayout = KvLayout::PerSequence;

    #[test]
    fn consecutive_sequences_with_one_row_each_are_one_ubatch() {
        assert_eq!(ubatches(PER_SEQ, &[0, 1, 2, 3], 512), 1);
        assert_eq!(ubatches(PER_SEQ, &[], 512), 0);
        assert_eq!(ubatches(PER_SEQ, &[5, 5, 5, 6, 6, 6], 512), 1, "the same rows each, ids following on");
    }

    #[test]
    fn a_gap_in_the_ids_starts_another_ubatch() {
        assert_eq!(ubatches(PER_SEQ, &[0, 1, 3, 4], 512), 2);
        assert_eq!(ubatches(PER_SEQ, &[0, 2, 4, 6], 512), 4);
    }

    #[test]
    fn rows_beyond_the_neighbours_go_to_further_ubatches() {
        // Sequence 1 feeds three drafts after its token: its token goes with the others, its
        // drafts alone after them.
        assert_eq!(ubatches(PER_SEQ, &[0, 1, 1, 1, 1, 2, 3], 512), 2);
        // Drafts on two sequences that are not neighbours: a ubatch each.
        assert_eq!(ubatches(PER_SEQ, &[0, 1, 1, 2, 3, 3], 512), 3);
        // A prompt chunk beside decoding rows.
        let mut seqs = vec![0, 1, 2];
        seqs.extend(std::iter::repeat_n(3, 100));
        assert_eq!(ubatches(PER_SEQ, &seqs, 512), 2);
    }

    #[test]
    fn each_ubatch_stays_within_n_ubatch_rows() {
        assert_eq!(ubatches(PER_SEQ, &[0; 10], 4), 3, "one sequence's 10 rows, 4 at a time");
        assert_eq!(ubatches(PER_SEQ, &[0, 0, 1, 1], 2), 2);
        assert_eq!(ubatches(KvLayout::Unified, &[0, 1, 1, 3, 0], 2), 3, "unified: n_ubatch rows at a time");
        assert_eq!(ubatches(KvLayout::Unified, &[0, 1, 1, 3, 0], 512), 1);
    }
}
