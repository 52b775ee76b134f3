//! llama.cpp's `POST /infill`, the answer end: the same job a `/v1/completions` request with a
//! `suffix` runs (`openai::completions::prepare`), answered in llama-server's shape
//! (`content`, `stop`, `tokens_predicted`, `tokens_evaluated`, `stop_type`, `timings`,
//! `generation_settings.n_ctx`, …), which llama.vim and other llama.cpp IDE clients read;
//! streamed as llama-server streams it: `data:` lines of partial objects, no `[DONE]`. With
//! `n_probs`, each token's probabilities as llama-server gives them (`completion_probabilities`:
//! `id`, `token`, `bytes`, `logprob`, `top_logprobs`), in the answer or in each partial object.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use gantry_api::ApiError;
use gantry_engine::{Event, FinishReason, TokenLogprob, Usage};
use serde_json::{json, Value};

use crate::errors::IntoApiError;
use crate::openai::completions::AnswerPlan;
use crate::openai::deltas::next_event;

/// What the answer repeats about the request and the model.
pub(crate) struct InfillAnswer {
    pub model: String,
    pub n_ctx: u32,
    pub n_predict: Option<u32>,
    pub temperature: f32,
    pub stream: bool,
    pub plan: AnswerPlan,
    /// `n_probs` asked for: the answer reports `completion_probabilities`.
    pub probabilities: bool,
}

/// One token's entry of `completion_probabilities`, as llama-server writes it.
fn probability(t: &TokenLogprob) -> Value {
    let top: Vec<Value> =
        t.top.iter().map(|a| json!({"id": a.id, "token": a.token, "bytes": a.bytes, "logprob": a.logprob})).collect();
    json!({"id": t.id, "token": t.token, "bytes": t.bytes, "logprob": t.logprob, "top_logprobs": top})
}

/// The shared path's errors with `/infill`'s field names.
pub(crate) fn in_infill_terms(e: ApiError) -> ApiError {
    e.with_fields_renamed(&[("suffix", "input_suffix"), ("prompt", "input_prefix"), ("max_tokens", "n_predict")])
}

/// How the answer ended, in llama.cpp's words.
#[derive(Default)]
struct Ending {
    content: String,
    stop_type: &'static str,
    stopping_word: String,
    /// A stop string ended it: the model's own end does not name the stop.
    ended_by_stop: bool,
}

impl Ending {
    /// Stop string `index` (of the job's `stop`) ended it; returns what the content gets back.
    fn stopped(&mut self, plan: &AnswerPlan, stop: &[String], index: u32) -> String {
        self.ended_by_stop = true;
        let word = stop.get(index as usize).map_or("", String::as_str);
        let tail = if plan.indent_limited(index) {
            // llama.cpp's indentation limit: `limit`, no word.
            self.stop_type = "limit";
            word.get(..word.len().saturating_sub(1)).unwrap_or_default()
        } else {
            self.stop_type = "word";
            self.stopping_word = word.to_string();
            plan.tail(index)
        };
        self.content.push_str(tail);
        tail.to_string()
    }

    /// The choice finished: the model's end (`eos`) or its length, unless a stop string ended it.
    fn finished(&mut self, reason: FinishReason) {
        if !self.ended_by_stop {
            self.stop_type = if reason == FinishReason::Stop { "eos" } else { "limit" };
        }
    }
}

pub(crate) async fn respond(
    answer: InfillAnswer,
    stop: Vec<String>,
    events: tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> Result<Response, ApiError> {
    let clock = Clock { start: Instant::now(), first: None };
    if answer.stream {
        return Ok(stream_response(answer, stop, clock, events).into_response());
    }
    let mut events = events;
    let mut clock = clock;
    let mut ending = Ending { stop_type: "limit", ..Ending::default() };
    let mut probabilities = Vec::new();
    let usage = loop {
        match next_event(&mut events).await {
            Event::Delta { text, logprobs, .. } => {
                clock.first.get_or_insert_with(Instant::now);
                ending.content.push_str(&text);
                probabilities.extend(logprobs.iter().map(probability));
            }
            Event::StopSequence { index, .. } => {
                ending.stopped(&answer.plan, &stop, index);
            }
            Event::Finished { reason, .. } => ending.finished(reason),
            Event::Done(usage) => break usage,
            Event::Error(error) => return Err(error.into_api_error()),
            _ => {}
        }
    };
    let mut last = final_object(&answer, &ending, usage, &clock, true);
    if answer.probabilities {
        last["completion_probabilities"] = Value::Array(probabilities);
    }
    Ok(Json(last).into_response())
}

struct Clock {
    start: Instant,
    first: Option<Instant>,
}

/// The last object: the whole `content` (or, streamed, none), the counts and timings.
fn final_object(answer: &InfillAnswer, ending: &Ending, usage: Usage, clock: &Clock, whole: bool) -> Value {
    let now = Instant::now();
    let first = clock.first.unwrap_or(now);
    let prompt_ms = first.duration_since(clock.start).as_secs_f64() * 1e3;
    let predicted_ms = now.duration_since(first).as_secs_f64() * 1e3;
    let per_second = |n: u32, ms: f64| if ms > 0.0 { f64::from(n) * 1e3 / ms } else { 0.0 };
    let per_token = |n: u32, ms: f64| if n > 0 { ms / f64::from(n) } else { 0.0 };
    let (prompt_n, predicted_n) = (usage.prompt_tokens - usage.cached_tokens, usage.completion_tokens);
    json!({
        "index": 0,
        "content": if whole { ending.content.as_str() } else { "" },
        "tokens": [],
        "id_slot": -1,
        "stop": true,
        "model": answer.model,
        "tokens_predicted": usage.completion_tokens,
        "tokens_evaluated": usage.prompt_tokens,
        // llama-server's `n_past`: what the sequence holds at the end (llama.vim shows it
        // against `n_ctx`).
        "tokens_cached": usage.prompt_tokens + usage.completion_tokens,
        "generation_settings": {
            "n_ctx": answer.n_ctx,
            "n_predict": answer.n_predict.map_or(-1, i64::from),
            "temperature": answer.temperature,
            "model": answer.model,
        },
        "has_new_line": ending.content.contains('\n'),
        "truncated": false,
        "stop_type": ending.stop_type,
        "stopping_word": ending.stopping_word,
        "timings": {
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": per_token(prompt_n, prompt_ms),
            "prompt_per_second": per_second(prompt_n, prompt_ms),
            "predicted_n": predicted_n,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": per_token(predicted_n, predicted_ms),
            "predicted_per_second": per_second(predicted_n, predicted_ms),
        },
        // Gantry's: the ledger's numbers, in OpenAI's words.
        "usage": crate::openai::convert::to_api_usage(usage),
    })
}

fn stream_response(
    answer: InfillAnswer,
    stop: Vec<String>,
    clock: Clock,
    events: tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let ending = Ending { stop_type: "limit", ..Ending::default() };
    let state = Some((events, answer, stop, clock, ending, 0u32));
    let body = stream::unfold(state, |state| async move {
        let (mut events, answer, stop, mut clock, mut ending, mut predicted) = state?;
        let frame = match next_event(&mut events).await {
            Event::Delta { text, logprobs, .. } => {
                clock.first.get_or_insert_with(Instant::now);
                predicted += 1;
                ending.content.push_str(&text);
                let shown = !text.is_empty() || (answer.probabilities && !logprobs.is_empty());
                shown.then(|| {
                    let mut partial = json!({"index": 0, "content": text, "tokens": [], "stop": false, "id_slot": -1, "tokens_predicted": predicted});
                    if answer.probabilities {
                        partial["completion_probabilities"] = logprobs.iter().map(probability).collect();
                    }
                    partial
                })
            }
            Event::StopSequence { index, .. } => {
                let tail = ending.stopped(&answer.plan, &stop, index);
                (!tail.is_empty()).then(|| json!({"index": 0, "content": tail, "tokens": [], "stop": false, "id_slot": -1}))
            }
            Event::Finished { reason, .. } => {
                ending.finished(reason);
                None
            }
            Event::Done(usage) => {
                let last = final_object(&answer, &ending, usage, &clock, false);
                return Some((Some(last), None));
            }
            Event::Error(error) => return Some((Some(error.into_api_error().to_json()), None)),
            Event::Cached { .. } | Event::Reasoning { .. } => None,
        };
        Some((frame, Some((events, answer, stop, clock, ending, predicted))))
    })
    .filter_map(|frame| async move { frame })
    .map(|frame| Ok(SseEvent::default().data(frame.to_string())));
    Sse::new(body).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}
