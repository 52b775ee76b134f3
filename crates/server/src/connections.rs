//! The accept loop: what `axum::serve` does, plus the limits it lacks. A client gets
//! `--header-read-timeout` seconds to send a request head (slowloris), at most
//! `--max-connections` connections are open at once (the rest wait in the listen backlog until
//! one closes), and every connection carries its peer address for the per-address limits.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, Request};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
pub const DEFAULT_HEADER_READ_TIMEOUT_SECS: u64 = 10;
pub const DEFAULT_BODY_READ_TIMEOUT_SECS: u64 = 30;

#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
}

/// Serves `app` on `listener` until `shutdown` completes; then stops accepting, lets open
/// connections finish their requests (idle keep-alive ones close at once) and returns when
/// all are closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (closing_tx, closing_rx) = watch::channel(false);
    let connections = TaskTracker::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.expect("the connection semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: the next accept may succeed once a
                    // connection closes; spinning on the error would not help.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = app.clone().map_request(move |mut req: Request<Incoming>| {
            req.extensions_mut().insert(ConnectInfo(peer));
            req
        });
        let connection = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
        let mut closing = closing_rx.clone();
        connections.spawn(async move {
            let _slot = slot;
            let mut connection = std::pin::pin!(connection);
            let closing = async move {
                let _ = closing.wait_for(|closing| *closing).await;
            };
            tokio::select! {
                result = connection.as_mut() => log_connection_end(result, peer),
                () = closing => {
                    connection.as_mut().graceful_shutdown();
                    log_connection_end(connection.await, peer);
                }
            }
        });
    }
    drop(listener);
    let _ = closing_tx.send(true);
    connections.close();
    connections.wait().await;
    Ok(())
}

fn log_connection_end(result: Result<(), hyper::Error>, peer: SocketAddr) {
    if let Err(e) = result {
        // Timeouts, resets and malformed requests: the client's doing, not worth more.
        tracing::debug!(error = %e, %peer, "connection ended with an error");
    }
}
