//! The batch runner: one task per server that claims batches' lines (at most
//! `--batch-concurrency` at once) and sends each through the same routes an interactive request
//! takes, as the batch's key, marked as a batch's line (`BatchLine`). Every second, and when
//! no line waits to start (a batch's last lines may just have ended), it also takes back the
//! lines of servers that died and finishes the batches whose lines all ended (`output.rs`).
//!
//! A line the server could not run now (draining, queue full, its ledger reservation still held
//! by a dead server) goes back to pending and is tried again; any other answer, an error
//! included, is the line's answer, as OpenAI reports it in the error file.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use gantry_accounts::ClaimedLine;
use gantry_api::ApiError;
use tower::ServiceExt;

use super::endpoint::Endpoint;
use super::BatchLine;
use crate::clock::now_secs;
use crate::request_id::{ClientRequestId, RequestId};
use crate::state::AppState;

/// How often the runner looks for lines when none was waiting, and for batches to finish.
const POLL: Duration = Duration::from_secs(1);
/// The least time between two sweeps when lines end one after another.
const SWEEP_AT_MOST: Duration = Duration::from_millis(50);
/// How long a line that could not run now waits before it is pending again.
const RETRY_AFTER: Duration = Duration::from_secs(2);
/// The largest answer a line keeps (a chat answer with logprobs of every token stays far below).
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// Starts this server's runner, unless `--batch-concurrency 0`.
pub(crate) fn start_runner(state: AppState) {
    if state.batches.concurrency == 0 {
        return;
    }
    tokio::spawn(run(state));
}

/// The routes a line may name, as the key-authenticated router serves them (the key is the
/// batch's, put in the request by [`answer`]).
fn line_routes(state: AppState) -> Router {
    Endpoint::ALL
        .into_iter()
        .fold(Router::new(), |routes, endpoint| routes.route(endpoint.path(), endpoint.handler()))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(|_| {
            axum::response::IntoResponse::into_response(crate::errors::internal_error())
        }))
        .with_state(state)
}

async fn run(state: AppState) {
    let owner = state.meter.owner().to_string();
    match state.accounts.release_lines_of(&owner).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(lines = n, "batches: took back the lines this instance held when it last stopped"),
        Err(e) => tracing::warn!(error = %e, "batches: could not take back this instance's earlier lines"),
    }
    let routes = line_routes(state.clone());
    let slots = Arc::new(tokio::sync::Semaphore::new(state.batches.concurrency));
    let mut swept = tokio::time::Instant::now() - POLL;
    loop {
        if state.draining.is_draining() {
            return;
        }
        if swept.elapsed() >= POLL {
            sweep(&state).await;
            swept = tokio::time::Instant::now();
        }
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => permit.expect("the runner's semaphore is never closed"),
            () = tokio::time::sleep(POLL) => continue,
        };
        match state.accounts.claim_batch_line(&owner, now_secs() as i64).await {
            Ok(Some(line)) => {
                let (state, routes, owner) = (state.clone(), routes.clone(), owner.clone());
                tokio::spawn(async move {
                    run_line(&state, routes, &owner, line).await;
                    drop(permit);
                });
            }
            Ok(None) => {
                drop(permit);
                // No line to start: a batch whose last line just ended is finished now.
                if swept.elapsed() >= SWEEP_AT_MOST {
                    sweep(&state).await;
                    swept = tokio::time::Instant::now();
                }
                tokio::select! {
                    () = state.batches.wake.notified() => {}
                    () = tokio::time::sleep(POLL) => {}
                }
            }
            Err(e) => {
                drop(permit);
                tracing::warn!(error = %e, "batches: could not claim a line");
                tokio::time::sleep(POLL).await;
            }
        }
    }
}

/// Takes back dead servers' lines and finishes every batch that may be finished.
async fn sweep(state: &AppState) {
    let cutoff = state.meter.now_ms() - state.batches.claim_timeout.as_millis() as i64;
    match state.accounts.reclaim_dead_lines(cutoff).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(lines = n, "batches: took back the lines of servers that stopped"),
        Err(e) => tracing::warn!(error = %e, "batches: could not take back dead servers' lines"),
    }
    let now = now_secs() as i64;
    if let Err(e) = state.accounts.close_expired_batches(now).await {
        tracing::warn!(error = %e, "batches: could not close expired batches");
    }
    let finishable = match state.accounts.finishable_batches(now).await {
        Ok(batches) => batches,
        Err(e) => return tracing::warn!(error = %e, "batches: could not look for batches to finish"),
    };
    for batch in finishable {
        if let Err(e) = super::output::finish(state, &batch).await {
            tracing::warn!(error = %e, batch = %batch.id, "batches: could not finish a batch");
        }
    }
}

/// What a line's run came to.
enum Answer {
    /// Its status and body, kept as its answer.
    Done(StatusCode, String),
    /// Not run now; pending again after a while.
    Retry,
}

async fn run_line(state: &AppState, routes: Router, owner: &str, line: ClaimedLine) {
    match answer(state, routes, &line).await {
        Answer::Done(status, body) => {
            match state.accounts.finish_batch_line(&line, owner, status.as_u16(), &body).await {
                // The runner looks again: its batch may be finished now.
                Ok(true) => state.batches.wake.notify_one(),
                Ok(false) => {
                    tracing::warn!(batch = %line.batch_id, line = line.line, "batches: a line's claim was lost; its answer is dropped")
                }
                Err(e) => {
                    tracing::warn!(error = %e, batch = %line.batch_id, line = line.line, "batches: could not keep a line's answer")
                }
            }
        }
        Answer::Retry => {
            tokio::time::sleep(RETRY_AFTER).await;
            if let Err(e) = state.accounts.release_batch_line(&line, owner).await {
                tracing::warn!(error = %e, batch = %line.batch_id, "batches: could not give a line back");
            }
        }
    }
}

async fn answer(state: &AppState, routes: Router, line: &ClaimedLine) -> Answer {
    // The key as it is now: one revoked since the batch was made runs nothing more.
    let key = match state.accounts.find_key(&line.key_id.to_string()).await {
        Ok(key) if key.is_active() => key,
        Ok(_) => return done(ApiError::invalid_api_key("The API key that made this batch was revoked.")),
        Err(e) => {
            tracing::warn!(error = %e, "batches: could not read a batch's key");
            return Answer::Retry;
        }
    };
    let request = Request::post(line.endpoint.as_str())
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(line.body.clone()));
    let Ok(mut request) = request else { return done(ApiError::internal("a batch line's request could not be built")) };
    let extensions = request.extensions_mut();
    extensions.insert(key);
    extensions.insert(RequestId(line.request_id.clone()));
    extensions.insert(ClientRequestId(None));
    extensions.insert(BatchLine { batch_id: line.batch_id.clone() });
    let Ok(response) = routes.oneshot(request).await;
    let status = response.status();
    // Not run: the server drains, the engine's queue is full, the database failed, the disk is
    // low, interactive work took its sequence. Another try (here or on another server) may run it.
    let preempted =
        response.extensions().get::<ApiError>().is_some_and(|e| e.code.as_deref() == Some("resource_unavailable"));
    if preempted || matches!(status, StatusCode::SERVICE_UNAVAILABLE | StatusCode::INSUFFICIENT_STORAGE) {
        return Answer::Retry;
    }
    match axum::body::to_bytes(response.into_body(), MAX_ANSWER_BYTES).await {
        Ok(body) => Answer::Done(status, String::from_utf8_lossy(&body).into_owned()),
        Err(_) => done(ApiError::internal("The answer to this line was larger than a batch keeps.")),
    }
}

fn done(error: ApiError) -> Answer {
    Answer::Done(error.status, error.to_json().to_string())
}
