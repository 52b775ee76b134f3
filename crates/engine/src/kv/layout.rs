//! How the sequences' KV entries lie in llama.cpp's cache, and what each layout asks of the
//! scheduler.
//!
//! **Per sequence** (the default): one KV stream per sequence (`kv_unified = false`, as
//! llama-server runs with `-np N`), so a token attends over its own sequence's cells only. In one
//! unified buffer every token walks every live cell of every sequence, masked: ggml's tiled flash
//! attention (64+ query rows: prompt chunks) converts and checks the mask of each 64-cell tile,
//! for every 64 query rows and every head, before skipping it. Measured on the default model (AMD
//! EPYC Zen 4, 2 threads, 8 sequences of 300 tokens): a step of 7 decoding rows and a 155-token
//! prompt chunk took ~975 ms in a unified cache and ~760 ms with streams.
//!
//! What streams cost, and how the scheduler pays it:
//! - A prefix shared between sequences is copied (`state_seq_get`/`state_seq_set`, ~12 KB per
//!   token for the 0.5B) instead of tagging cells with one more sequence id. A prompt with several
//!   choices (`n`) is therefore computed in its first sequence and copied to the others once read
//!   (in a unified cache too: one path, and no token of a batch belongs to two streams).
//! - llama.cpp cuts a batch into one ubatch per run of consecutive sequence ids
//!   (`split_equal(sequential)`); each ubatch is one more pass over the weights. So rows go into
//!   the batch ordered by sequence ([`batch_order_into`]) and a request takes the lowest free sequence
//!   (`KvSlots::pick_free`), which keeps the running ones together.
//!
//! **Unified** (`--kv-unified`): one buffer; sharing a prefix only tags cells. Rows keep the order
//! that suits the tiled kernel there: prompt chunks first, decoding rows last (`batch::write`).

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvLayout {
    /// One KV stream per sequence.
    #[default]
    PerSequence,
    /// One buffer shared by all sequences.
    Unified,
}

impl KvLayout {
    pub fn is_unified(self) -> bool {
        self == KvLayout::Unified
    }
}

/// Where each row of a batch goes, given the rows' sequences in the order they were planned
/// (prompt chunks, then decoding rows): `order[i]` is row `i`'s index in the batch. Per sequence,
/// rows are grouped by sequence id, ascending (stable, so a sequence's rows keep their order and
/// its drafts stay right after its token); unified, the planned order stands.
#[cfg(test)]
pub(crate) fn batch_order(layout: KvLayout, seqs: &[i32]) -> Vec<usize> {
    let mut order = Vec::new();
    batch_order_into(layout, seqs, &mut Vec::new(), &mut order);
    order
}

/// [`batch_order`] into `order`, with `by_seq` for its work: both are emptied first, so the
/// step's vectors serve every step (`StepBuffers`).
pub(crate) fn batch_order_into(layout: KvLayout, seqs: &[i32], by_seq: &mut Vec<usize>, order: &mut Vec<usize>) {
    by_seq.clear();
    by_seq.extend(0..seqs.len());
    if layout == KvLayout::PerSequence {
        // Stable: a sequence's rows keep their order.
        by_seq.sort_by_key(|&i| seqs[i]);
    }
    order.clear();
    order.resize(seqs.len(), 0);
    for (k, &i) in by_seq.iter().enumerate() {
        order[i] = k;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_sequence_rows_are_grouped_by_ascending_sequence_keeping_their_order() {
        // A prompt chunk of sequence 3 (3 rows), then decoding rows of 2, 0, and 1 with a draft.
        let seqs = [3, 3, 3, 2, 0, 1, 1];
        let order = batch_order(KvLayout::PerSequence, &seqs);
        assert_eq!(order, vec![4, 5, 6, 3, 0, 1, 2]);
        let mut placed = vec![-1; seqs.len()];
        for (i, &k) in order.iter().enumerate() {
            placed[k] = seqs[i];
        }
        assert_eq!(placed, vec![0, 1, 1, 2, 3, 3, 3]);
    }

    #[test]
    fn unified_rows_keep_the_planned_order() {
        assert_eq!(batch_order(KvLayout::Unified, &[3, 3, 2, 0]), vec![0, 1, 2, 3]);
        assert!(batch_order(KvLayout::PerSequence, &[]).is_empty());
    }
}
