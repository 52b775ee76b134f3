//! Which requests keep waiting to copy a prefix another request's prompt is computing. A wait
//! must end: a request waits only while the chain of waits it starts reaches a request that
//! reads its own prompt this step. A chain that comes back on itself (two requests each
//! waiting on the other's sequence, which slot reuse can make) would never move, so everyone
//! on it takes what its source holds now and reads the rest itself. Pure, unit-tested.

/// Per request: `Some(j)` when it waits on request `j`'s prompt (its source sequence is `j`'s
/// and holds less than it wants), `None` when it reads its own prompt (or is not prefilling).
/// Returns per request whether it keeps waiting this step.
pub(crate) fn waits_that_end(waiting_on: &[Option<usize>]) -> Vec<bool> {
    (0..waiting_on.len())
        .map(|start| {
            let Some(mut at) = waiting_on[start] else { return false };
            // A chain without a cycle visits each request at most once.
            for _ in 0..waiting_on.len() {
                match waiting_on[at] {
                    None => return true,
                    Some(next) => at = next,
                }
            }
            false
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_on_a_reader_or_a_chain_ending_in_one_goes_on() {
        // 1 waits on 0 (reading); 2 on 1; 3 reads.
        assert_eq!(waits_that_end(&[None, Some(0), Some(1), None]), [false, true, true, false]);
    }

    #[test]
    fn requests_waiting_on_each_other_stop_waiting() {
        assert_eq!(waits_that_end(&[Some(1), Some(0)]), [false, false], "two on each other");
        assert_eq!(waits_that_end(&[Some(1), Some(2), Some(0), None]), [false, false, false, false], "a ring");
        assert_eq!(waits_that_end(&[Some(0)]), [false], "on itself");
        // One waiting into a ring does not wait either: the ring's requests read from now on,
        // but what they hold is not yet what it wants.
        assert_eq!(waits_that_end(&[Some(1), Some(2), Some(1), None, Some(3)]), [false, false, false, false, true]);
    }
}
