//! Keeping the running sequences' ids together. With a KV stream per sequence, llama.cpp makes one
//! pass over the weights per run of consecutive sequence ids (`kv::ubatches`). A request takes the
//! lowest free sequence, but answers end out of order: with 64 streams, once some had ended the
//! other 50 ran in 10 passes a step. So each step, while a running sequence sits above a free
//! one, the highest is moved down into the lowest (`KvCache::relocate`: a copy of its entries,
//! once, against a pass a step for the rest of its answer), up to `MOVES_PER_STEP` times: when
//! many answers end in one step, one move a step would leave gaps open for as many steps.

use llama_cpp_2::context::LlamaContext;

use crate::kv::layout::KvLayout;
use crate::kv::seq_id::SeqId;

use crate::scheduler::Scheduler;

/// Most moves in one step. Each copies a sequence's entries through host memory (~12 KB a token
/// on the 0.5B model, a millisecond or so for a few hundred tokens), so a step that would move
/// many spreads them over the next few.
const MOVES_PER_STEP: usize = 4;

/// Tests only: each step's moves, `(from, to)` by sequence index.
#[cfg(test)]
pub(crate) type MovesLog = std::sync::Arc<std::sync::Mutex<Vec<Vec<(usize, usize)>>>>;

impl Scheduler {
    /// Moves running sequences down into gaps below them, a few a step (see the module).
    pub(in crate::scheduler) fn compact(&mut self, ctx: &mut LlamaContext<'_>) {
        // Isolated requests are kept in ubatches of their own by where their ids fall
        // (`deterministic`): with one running, nothing moves.
        if self.cfg.layout != KvLayout::PerSequence || self.active.iter().any(|r| r.isolated) {
            return;
        }
        let mut moved = Vec::new();
        while moved.len() < MOVES_PER_STEP {
            let Some(m) = self.move_one_down(ctx) else { break };
            moved.push(m);
        }
        #[cfg(test)]
        if let Some(log) = self.cfg.moves_log.as_ref().filter(|_| !moved.is_empty()) {
            log.lock().unwrap().push(moved.iter().map(|(s, d)| (s.index(), d.index())).collect());
        }
    }

    /// Moves the highest running sequence into the lowest gap below it; `None` when none is, or
    /// when the move failed.
    fn move_one_down(&mut self, ctx: &mut LlamaContext<'_>) -> Option<(SeqId, SeqId)> {
        // Only decoding choices move: a prompt being read, an awaited prefix and a chain on
        // the device are tied to their sequence.
        let awaited = |s: SeqId| self.active.iter().any(|r| r.awaited_prefix().is_some_and(|(src, _)| src == s));
        let movable = self
            .active
            .iter()
            .filter(|r| !r.is_prefilling())
            .flat_map(|r| &r.choices)
            .filter(|c| c.ready().is_some() && !c.on_device && !awaited(c.seq_id))
            .map(|c| c.seq_id);
        // Idle sequences are empty once offloaded (`offload_idle`). Without host memory they keep
        // their entries, and a gap holding one is taken all the same, dropping them: a prefix
        // that a later prompt might reuse is worth less than a pass over the weights every step.
        let free = self.free_seqs.iter().copied().filter(|&s| !awaited(s));
        let (src, dst) = gap_move(movable, free)?;
        self.kv.cut(ctx, dst, 0);
        if let Err(e) = self.kv.relocate(ctx, src, dst) {
            tracing::warn!(error = %e, src = src.raw(), dst = dst.raw(), "could not move a sequence down");
            return None;
        }
        // A free sequence keeps the device chain of the request that last ran there
        // (`sample::device`); the choice moving in samples on the host, so it must go, or
        // llama.cpp would sample the choice itself and refuse its drafts.
        if let Some(device) = self.device.as_mut() {
            device.assign(dst, None);
        }
        self.free_seqs.retain(|&s| s != dst);
        self.free_seqs.push(src);
        for c in self.active.iter_mut().flat_map(|r| &mut r.choices).filter(|c| c.seq_id == src) {
            c.seq_id = dst;
        }
        Some((src, dst))
    }
}

/// The highest of the `movable` sequences and the lowest empty `free` one, when the free one is
/// below it: moving there closes the lowest gap and never opens another above it.
pub(crate) fn gap_move(
    movable: impl Iterator<Item = SeqId>,
    free: impl Iterator<Item = SeqId>,
) -> Option<(SeqId, SeqId)> {
    let highest = movable.max_by_key(|s| s.index())?;
    let lowest = free.min_by_key(|s| s.index())?;
    (lowest.index() < highest.index()).then_some((highest, lowest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[usize]) -> Vec<SeqId> {
        v.iter().map(|&i| SeqId::new(i)).collect()
    }

    #[test]
    fn the_highest_running_sequence_moves_into_the_lowest_gap() {
        let m = gap_move(ids(&[0, 1, 4, 7]).into_iter(), ids(&[6, 2, 3, 5]).into_iter());
        assert_eq!(m, Some((SeqId::new(7), SeqId::new(2))));
    }

    #[test]
    fn nothing_moves_when_the_running_sequences_are_together() {
        assert_eq!(gap_move(ids(&[0, 1, 2]).into_iter(), ids(&[3, 4]).into_iter()), None);
        assert_eq!(gap_move(ids(&[]).into_iter(), ids(&[0]).into_iter()), None, "nothing running");
        assert_eq!(gap_move(ids(&[3]).into_iter(), ids(&[]).into_iter()), None, "nothing free");
    }

    #[test]
    fn moves_repeated_leave_one_run_from_zero() {
        let (mut running, mut free) = (ids(&[1, 5, 9, 12]), ids(&[0, 2, 3, 4, 6, 7, 8, 10, 11, 13]));
        while let Some((src, dst)) = gap_move(running.iter().copied(), free.iter().copied()) {
            running.retain(|&s| s != src);
            running.push(dst);
            free.retain(|&s| s != dst);
            free.push(src);
        }
        let mut seqs: Vec<usize> = running.iter().map(|s| s.index()).collect();
        seqs.sort_unstable();
        assert_eq!(seqs, [0, 1, 2, 3]);
    }
}
