//! The pipeline's settlement: what the ledger books from the engine's usage report.

use super::*;

#[tokio::test]
async fn an_engine_that_died_still_settles_its_requests() {
    // The engine thread dropped its usage sender without reporting.
    let (tx, rx) = tokio::sync::oneshot::channel::<Usage>();
    drop(tx);
    let settled = settlement_of(rx.await).unwrap();
    assert_eq!(
        settled,
        Settlement {
            prompt_tokens: 0,
            cached_tokens: 0,
            completion_tokens: 0,
            reasoning_tokens: 0,
            outcome: Settled::Error
        }
    );
    // A report is booked as reported.
    let (tx, rx) = tokio::sync::oneshot::channel::<Usage>();
    tx.send(Usage {
        prompt_tokens: 5,
        cached_tokens: 2,
        completion_tokens: 7,
        reasoning_tokens: 3,
        outcome: Outcome::Cancelled,
    })
    .unwrap();
    assert_eq!(
        settlement_of(rx.await).unwrap(),
        Settlement {
            prompt_tokens: 5,
            cached_tokens: 2,
            completion_tokens: 7,
            reasoning_tokens: 3,
            outcome: Settled::Cancelled
        }
    );
    // A preempted batch line books nothing: it runs again.
    let (tx, rx) = tokio::sync::oneshot::channel::<Usage>();
    tx.send(Usage { prompt_tokens: 5, completion_tokens: 2, outcome: Outcome::Preempted, ..Usage::default() }).unwrap();
    assert_eq!(settlement_of(rx.await), None);
}
