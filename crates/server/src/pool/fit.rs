//! Fitting a model into the memory budget by giving it fewer decode slots and a smaller batch,
//! as Ollama sizes its parallel slots by the memory it has: an operator who sets `--max-memory`
//! asked for the model to fit in it, and the default 4 slots × 512-token batches are a speed
//! choice, not a requirement. The context per sequence is never lowered: it bounds what a client
//! may send, and a request that fitted yesterday must fit today.

use gantry_engine::{EngineConfig, LoadError};

/// The smallest settings fitting goes down to.
const MIN_BATCH: u32 = 32;
/// The batch is halved down to this before any slot is given up: below it prompt processing
/// slows down markedly, while each slot given up only limits concurrency.
const SOFT_MIN_BATCH: u32 = 128;

/// Which of a model's settings fitting may lower: the ones the operator left at their defaults
/// (a `--parallel` given is also the largest `n` a request may ask for, so it is kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shrinkable {
    pub parallel: bool,
    pub batch: bool,
}

impl Shrinkable {
    pub const ALL: Self = Self { parallel: true, batch: true };
}

/// What fitting changed: `(parallel, batch_size)` before and after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refit {
    pub before: (u32, u32),
    pub after: (u32, u32),
    /// The estimate at the new settings, in bytes.
    pub need: u64,
}

/// Lowers `batch_size` (halving, down to 128), then `parallel` (halving, down to 1), then
/// `batch_size` again (down to 32) until the model's estimate fits `budget`, each only where
/// `shrinkable` allows. A model with a projector keeps its batch: a projector that reads an image
/// both ways needs the whole image in one batch. Returns what changed, or `None` when it already
/// fitted or cannot fit (then the settings are the smallest tried, and the budget check refuses
/// the model with its need).
pub fn fit_to_budget(
    config: &mut EngineConfig,
    shrinkable: Shrinkable,
    budget: u64,
) -> Result<Option<Refit>, LoadError> {
    let before = (config.parallel, config.batch_size);
    let mut need = config.estimate_memory()?.total();
    let keep_batch = config.mmproj_path.is_some() || !shrinkable.batch;
    while need > budget {
        if !keep_batch && config.batch_size > SOFT_MIN_BATCH {
            config.batch_size = (config.batch_size / 2).max(SOFT_MIN_BATCH);
        } else if shrinkable.parallel && config.parallel > 1 {
            config.parallel = (config.parallel / 2).max(1);
        } else if !keep_batch && config.batch_size > MIN_BATCH {
            config.batch_size = (config.batch_size / 2).max(MIN_BATCH);
        } else {
            return Ok(None);
        }
        need = config.estimate_memory()?.total();
    }
    let after = (config.parallel, config.batch_size);
    Ok((after != before).then_some(Refit { before, after, need }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny_config(dir: &std::path::Path) -> EngineConfig {
        let path = dir.join("tiny.gguf");
        tiny_gguf::write_tiny_model(&path, &tiny_gguf::TinyModelSpec::default()).unwrap();
        let mut config = EngineConfig::new(&path);
        (config.ctx_size, config.parallel, config.batch_size) = (4096, 4, 512);
        config
    }

    fn need_at(config: &EngineConfig, parallel: u32, batch: u32) -> u64 {
        let mut c = config.clone();
        (c.parallel, c.batch_size) = (parallel, batch);
        c.estimate_memory().unwrap().total()
    }

    #[test]
    fn a_model_that_fits_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = tiny_config(dir.path());
        let need = need_at(&config, 4, 512);
        assert_eq!(fit_to_budget(&mut config, Shrinkable::ALL, need).unwrap(), None);
        assert_eq!((config.parallel, config.batch_size, config.ctx_size), (4, 512, 4096));
    }

    #[test]
    fn the_batch_shrinks_first_then_the_slots_and_never_the_context() {
        let dir = tempfile::tempdir().unwrap();
        let config = tiny_config(dir.path());
        for (parallel, batch) in [(4, 256), (4, 128), (2, 128), (1, 128), (1, 64), (1, 32)] {
            let mut c = config.clone();
            let budget = need_at(&config, parallel, batch);
            let refit = fit_to_budget(&mut c, Shrinkable::ALL, budget).unwrap().expect("refitted");
            assert_eq!(refit, Refit { before: (4, 512), after: (parallel, batch), need: budget }, "budget {budget}");
            assert_eq!(c.ctx_size, 4096);
        }
    }

    #[test]
    fn a_model_that_cannot_fit_is_left_at_the_smallest_settings_for_the_budget_check_to_refuse() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = tiny_config(dir.path());
        let smallest = need_at(&config, 1, 32);
        assert_eq!(fit_to_budget(&mut config, Shrinkable::ALL, smallest - 1).unwrap(), None);
        assert_eq!((config.parallel, config.batch_size), (1, 32));
        assert_eq!(config.estimate_memory().unwrap().total(), smallest);
    }

    #[test]
    fn a_model_with_a_projector_keeps_its_batch() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = tiny_config(dir.path());
        let projector = dir.path().join("mmproj.gguf");
        std::fs::write(&projector, vec![0u8; 1 << 16]).unwrap();
        config.mmproj_path = Some(projector);
        let budget = config.estimate_memory().unwrap().total() - 1;
        let refit = fit_to_budget(&mut config, Shrinkable::ALL, budget).unwrap().expect("refitted");
        assert_eq!((refit.after.1, config.batch_size), (512, 512));
        assert!(refit.after.0 < 4);
    }
}

#[cfg(test)]
mod given_settings {
    use super::*;

    #[test]
    fn settings_the_operator_gave_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        tiny_gguf::write_tiny_model(&path, &tiny_gguf::TinyModelSpec::default()).unwrap();
        let mut config = EngineConfig::new(&path);
        (config.ctx_size, config.parallel, config.batch_size) = (4096, 4, 512);
        let mut at_32 = config.clone();
        at_32.batch_size = 32;
        let budget = at_32.estimate_memory().unwrap().total();
        // --parallel given: only the batch may shrink, and that is enough here.
        let mut c = config.clone();
        let refit =
            fit_to_budget(&mut c, Shrinkable { parallel: false, batch: true }, budget).unwrap().expect("refitted");
        assert_eq!(refit.after, (4, 32));
        // Both given: nothing changes, and the budget check refuses the model.
        let mut c = config;
        assert_eq!(fit_to_budget(&mut c, Shrinkable { parallel: false, batch: false }, budget - 1).unwrap(), None);
        assert_eq!((c.parallel, c.batch_size), (4, 512));
    }
}
