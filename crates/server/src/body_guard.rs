//! Request bodies are read only by the handler that needs them, after authentication, and
//! within a deadline.
//!
//! Nothing reads a body before routing: a request refused by authentication (or sent to an
//! unknown route) is answered without reading any of it, so a client cannot make the server
//! buffer megabytes without a valid key. Such an answer carries `Connection: close`: hyper
//! does not keep a connection whose request body was left unread, and a client that is not
//! told would reuse it and see its next request fail ("server disconnected"). A small unread
//! body (at most [`MAX_DRAINED_BODY`], the size of an ordinary refused chat request) is read
//! and discarded instead, never buffered, so the client keeps its connection; at most
//! [`MAX_DRAINING`] such bodies are drained at once, the rest are answered with a close.
//!
//! A body being read must arrive whole within the body read timeout (counted from the request
//! head); a client trickling it gets 408 and the connection is closed.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body::Frame;
use http_body_util::BodyExt;
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};

/// Largest unread body drained (read and discarded) so its connection can be kept.
pub(crate) const MAX_DRAINED_BODY: u64 = 64 * 1024;
/// Most unread bodies drained at once; beyond that, refusals close their connection.
pub(crate) const MAX_DRAINING: usize = 64;

#[derive(Default)]
struct BodyProgress {
    finished: AtomicBool,
    timed_out: AtomicBool,
    /// What was left of the body when whoever held it dropped it unfinished.
    unread: Mutex<Option<Body>>,
}

/// The request body with its deadline; notes whether it was read to the end.
struct GuardedBody {
    inner: Body,
    deadline: Pin<Box<Sleep>>,
    progress: Arc<BodyProgress>,
}

impl Drop for GuardedBody {
    fn drop(&mut self) {
        if !self.progress.finished.load(Ordering::Relaxed) && !self.progress.timed_out.load(Ordering::Relaxed) {
            *self.progress.unread.lock().expect("unread body lock") = Some(std::mem::take(&mut self.inner));
        }
    }
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

/// The body read timeout and the drains under way, shared by every request.
#[derive(Clone)]
pub(crate) struct BodyGuard {
    timeout: Duration,
    draining: Arc<Semaphore>,
}

impl BodyGuard {
    pub(crate) fn new(timeout: Duration) -> Self {
        Self { timeout, draining: Arc::new(Semaphore::new(MAX_DRAINING)) }
    }
}

/// Wraps every request body (see the module comment).
pub(crate) async fn guard_body(State(guard): State<BodyGuard>, req: Request, next: Next) -> Response {
    let timeout = guard.timeout;
    let deadline = Instant::now() + timeout;
    let length = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let has_body = !req.body().is_end_stream()
        && (req.headers().contains_key(header::TRANSFER_ENCODING) || length.is_some_and(|n| n > 0));
    if !has_body {
        return next.run(req).await;
    }
    let progress = Arc::new(BodyProgress::default());
    let (parts, body) = req.into_parts();
    let guarded =
        GuardedBody { inner: body, deadline: Box::pin(tokio::time::sleep_until(deadline)), progress: progress.clone() };
    let mut response = next.run(Request::from_parts(parts, Body::new(guarded))).await;
    if progress.timed_out.load(Ordering::Relaxed) {
        response = crate::errors::body_timed_out(timeout).into_response();
    }
    if !progress.finished.load(Ordering::Relaxed) {
        let unread = progress.unread.lock().expect("unread body lock").take();
        let drained = match unread {
            Some(body) if length.is_some_and(|n| n <= MAX_DRAINED_BODY) => match guard.draining.try_acquire() {
                Ok(_draining) => drain(body, deadline).await,
                Err(_) => false,
            },
            _ => false,
        };
        if !drained {
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
    }
    response
}

/// Reads a small body to its end by the deadline, keeping none of it.
async fn drain(mut body: Body, deadline: Instant) -> bool {
    let read_all = async {
        let mut total = 0u64;
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { return false };
            total += frame.data_ref().map_or(0, |d| d.len() as u64);
            if total > MAX_DRAINED_BODY {
                return false;
            }
        }
        true
    };
    tokio::time::timeout_at(deadline, read_all).await.unwrap_or(false)
}
