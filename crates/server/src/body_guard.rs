//! Request bodies are read only by the handler that needs them, after authentication, and
//! within a deadline.
//!
//! Nothing reads a body before routing: a request refused by authentication (or sent to an
//! unknown route) is answered without reading any of it, so a client cannot make the server
//! buffer megabytes without a valid key. Such an answer carries `Connection: close`: hyper
//! does not keep a connection whose request body was left unread, and a client that is not
//! told would reuse it and see its next request fail ("server disconnected").
//!
//! A body being read must arrive whole within the body read timeout (counted from the request
//! head); a client trickling it gets 408 and the connection is closed.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use gantry_api::ApiError;
use http_body::Frame;
use tokio::time::Sleep;

#[derive(Default)]
struct BodyProgress {
    finished: AtomicBool,
    timed_out: AtomicBool,
}

/// The request body with its deadline; notes whether it was read to the end.
struct GuardedBody {
    inner: Body,
    deadline: Pin<Box<Sleep>>,
    progress: Arc<BodyProgress>,
}

impl HttpBody for GuardedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(None) => {
                this.progress.finished.store(true, Ordering::Relaxed);
                Poll::Ready(None)
            }
            Poll::Ready(Some(frame)) => {
                if this.inner.is_end_stream() {
                    this.progress.finished.store(true, Ordering::Relaxed);
                }
                Poll::Ready(Some(frame))
            }
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.progress.timed_out.store(true, Ordering::Relaxed);
                    Poll::Ready(Some(Err(axum::Error::new("the request body did not arrive in time"))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Wraps every request body (see the module comment); `timeout` is the body read timeout.
pub async fn guard_body(State(timeout): State<Duration>, req: Request, next: Next) -> Response {
    let has_body = !req.body().is_end_stream()
        && (req.headers().contains_key(header::TRANSFER_ENCODING)
            || req
                .headers()
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .is_some_and(|n| n > 0));
    if !has_body {
        return next.run(req).await;
    }
    let progress = Arc::new(BodyProgress::default());
    let (parts, body) = req.into_parts();
    let guarded = GuardedBody { inner: body, deadline: Box::pin(tokio::time::sleep(timeout)), progress: progress.clone() };
    let mut response = next.run(Request::from_parts(parts, Body::new(guarded))).await;
    if progress.timed_out.load(Ordering::Relaxed) {
        response = ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!("The request body did not arrive within {} seconds.", timeout.as_secs_f64()),
            None,
            Some("request_timeout"),
        )
        .into_response();
    }
    if !progress.finished.load(Ordering::Relaxed) {
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}
