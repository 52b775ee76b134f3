//! A request of several prompts (`/v1/completions` with `prompt` an array) runs as one engine
//! job per prompt, each with its own `n` choices; `join` makes their handles one, as the
//! pipeline takes a single job's: choice `c` of prompt `p` becomes choice `p * n + c` (OpenAI's
//! numbering), one `Done` carries the summed usage, and the usage report is the sum, so the
//! request settles once, as one ledger row. Dropping the joined receiver cancels every job.

use gantry_engine::{Event, GenerationHandle, Outcome, Usage};
use tokio::sync::{mpsc, oneshot};

/// One handle for the jobs of one request, in prompt order.
pub(crate) fn join(mut handles: Vec<GenerationHandle>, n: u32) -> GenerationHandle {
    if handles.len() == 1 {
        return handles.remove(0);
    }
    let jobs = handles.len();
    let (usage_tx, usage) = oneshot::channel();
    let reports: Vec<_> = handles.iter_mut().map(|h| std::mem::replace(&mut h.usage, oneshot::channel().1)).collect();
    tokio::spawn(async move {
        let mut total: Option<Usage> = None;
        for report in reports {
            // A lost report (the engine died) settles as an error with what the others reported.
            let usage = report.await.unwrap_or(Usage { outcome: Outcome::Error, ..Usage::default() });
            total = Some(total.map_or(usage, |t| sum(t, usage)));
        }
        let _ = usage_tx.send(total.unwrap_or_default());
    });

    let (tagged_tx, mut tagged) = mpsc::unbounded_channel::<(u32, Event)>();
    for (job, handle) in handles.into_iter().enumerate() {
        let (tx, mut events) = (tagged_tx.clone(), handle.events);
        tokio::spawn(async move {
            loop {
                let event = tokio::select! {
                    event = events.recv() => event,
                    () = tx.closed() => return,
                };
                let Some(event) = event else { return };
                if tx.send((job as u32, event)).is_err() {
                    return;
                }
            }
        });
    }
    drop(tagged_tx);
    let (tx, events) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let (mut done, mut total): (usize, Option<Usage>) = (0, None);
        loop {
            let next = tokio::select! {
                next = tagged.recv() => next,
                () = tx.closed() => return,
            };
            // Every job's events ended without a Done: the engine died; the reader says so.
            let Some((job, event)) = next else { return };
            let event = match event {
                Event::Delta { choice, text, logprobs } => Event::Delta { choice: job * n + choice, text, logprobs },
                Event::Reasoning { choice, text } => Event::Reasoning { choice: job * n + choice, text },
                Event::StopSequence { choice, index } => Event::StopSequence { choice: job * n + choice, index },
                Event::Finished { choice, reason } => Event::Finished { choice: job * n + choice, reason },
                Event::Done(usage) => {
                    done += 1;
                    total = Some(total.map_or(usage, |t| sum(t, usage)));
                    if done < jobs {
                        continue;
                    }
                    Event::Done(total.unwrap_or_default())
                }
                // Said once per request elsewhere; the usage at the end has the sum.
                Event::Cached { .. } => continue,
                error @ Event::Error(_) => error,
            };
            let last = matches!(event, Event::Done(_) | Event::Error(_));
            if tx.send(event).is_err() || last {
                return;
            }
        }
    });
    GenerationHandle { events, usage }
}

/// Two jobs' usage as one request's: counts added, the worse outcome kept.
fn sum(a: Usage, b: Usage) -> Usage {
    let rank = |o: Outcome| match o {
        Outcome::Completed => 0,
        Outcome::Length => 1,
        Outcome::Cancelled => 2,
        Outcome::Error => 3,
        // One job preempted: the whole request runs again.
        Outcome::Preempted => 4,
    };
    Usage {
        prompt_tokens: a.prompt_tokens + b.prompt_tokens,
        cached_tokens: a.cached_tokens + b.cached_tokens,
        completion_tokens: a.completion_tokens + b.completion_tokens,
        reasoning_tokens: a.reasoning_tokens + b.reasoning_tokens,
        outcome: if rank(b.outcome) > rank(a.outcome) { b.outcome } else { a.outcome },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_engine::FinishReason;

    fn job(choices: u32, usage: Usage) -> (GenerationHandle, Vec<Event>) {
        let (tx, events) = mpsc::unbounded_channel();
        let (usage_tx, usage_rx) = oneshot::channel();
        let mut sent = Vec::new();
        for choice in 0..choices {
            sent.push(Event::Delta { choice, text: format!("c{choice}"), logprobs: Vec::new() });
            sent.push(Event::Finished { choice, reason: FinishReason::Stop });
        }
        sent.push(Event::Done(usage));
        for e in &sent {
            tx.send(e.clone()).unwrap();
        }
        usage_tx.send(usage).unwrap();
        (GenerationHandle { events, usage: usage_rx }, sent)
    }

    #[tokio::test]
    async fn choices_are_numbered_per_prompt_and_usage_is_summed() {
        let a = Usage { prompt_tokens: 3, cached_tokens: 1, completion_tokens: 4, ..Usage::default() };
        let b = Usage { prompt_tokens: 5, completion_tokens: 2, outcome: Outcome::Length, ..Usage::default() };
        let (ha, _) = job(2, a);
        let (hb, _) = job(2, b);
        let GenerationHandle { mut events, usage } = join(vec![ha, hb], 2);
        let mut got = Vec::new();
        while let Some(e) = events.recv().await {
            got.push(e);
        }
        let mut indices: Vec<u32> = got
            .iter()
            .filter_map(|e| if let Event::Finished { choice, .. } = e { Some(*choice) } else { None })
            .collect();
        indices.sort_unstable();
        assert_eq!(indices, vec![0, 1, 2, 3]);
        assert!(got.iter().any(|e| matches!(e, Event::Delta { choice: 3, text, .. } if text == "c1")));
        let total = Usage {
            prompt_tokens: 8,
            cached_tokens: 1,
            completion_tokens: 6,
            reasoning_tokens: 0,
            outcome: Outcome::Length,
        };
        // One Done, the last event, with the sum; the usage report agrees.
        assert_eq!(got.iter().filter(|e| matches!(e, Event::Done(_))).count(), 1);
        assert_eq!(got.last(), Some(&Event::Done(total)));
        assert_eq!(usage.await.unwrap(), total);
    }
}
