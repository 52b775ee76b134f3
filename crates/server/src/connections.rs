//! The accept loop: what `axum::serve` does, plus the limits it lacks. A client gets
//! `--header-read-timeout` seconds to send a request head (slowloris), at most
//! `--max-connections` connections are open at once (the rest wait in the listen backlog until
//! one closes), at most `--max-connections-per-address` of them from one client address (an
//! IPv6 /64; `--trusted-proxy` addresses are exempt), a write that makes no progress for
//! `--write-timeout` seconds ends its connection (a client that never reads its answers), and a
//! connection older than `--max-connection-age` takes no new request: the one running, a stream
//! included, finishes first. Every request carries its peer address, and the client address a
//! trusted proxy names, for the per-address limits.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{ConnectInfo, Request};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use crate::client_addr::{address_group, ClientAddr, TrustedProxies};
use crate::write_deadline::WriteDeadline;

pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 256;
pub const DEFAULT_HEADER_READ_TIMEOUT_SECS: u64 = 10;
pub const DEFAULT_BODY_READ_TIMEOUT_SECS: u64 = 30;
pub const DEFAULT_WRITE_TIMEOUT_SECS: u64 = 30;
pub const DEFAULT_MAX_CONNECTION_AGE_SECS: u64 = 600;

#[derive(Clone, Debug)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    /// Connections one client address (an IPv6 /64) may hold open; 0 for no limit.
    pub max_per_address: usize,
    /// Addresses exempt from `max_per_address`, whose `X-Forwarded-For` names the client.
    pub trusted_proxies: TrustedProxies,
    pub header_read_timeout: Duration,
    /// How long a write may make no progress before its connection is closed.
    pub write_timeout: Duration,
    /// After this long a connection takes no new request; the running one finishes.
    pub max_age: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            trusted_proxies: TrustedProxies::default(),
            header_read_timeout: Duration::from_secs(DEFAULT_HEADER_READ_TIMEOUT_SECS),
            write_timeout: Duration::from_secs(DEFAULT_WRITE_TIMEOUT_SECS),
            max_age: Duration::from_secs(DEFAULT_MAX_CONNECTION_AGE_SECS),
        }
    }
}

/// Open connections per client address; a [`PerAddressSlot`] gives its place back on drop.
#[derive(Clone, Default)]
struct OpenPerAddress(Arc<Mutex<HashMap<IpAddr, usize>>>);

struct PerAddressSlot {
    table: OpenPerAddress,
    group: IpAddr,
}

impl OpenPerAddress {
    /// A place for one more connection from `peer`, unless its address already holds `max`.
    fn take(&self, peer: IpAddr, max: usize) -> Option<PerAddressSlot> {
        let group = address_group(peer);
        let mut open = self.0.lock().expect("per-address table lock");
        let count = open.entry(group).or_insert(0);
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(PerAddressSlot { table: self.clone(), group })
    }
}

impl Drop for PerAddressSlot {
    fn drop(&mut self) {
        let mut open = self.table.0.lock().expect("per-address table lock");
        if let Some(count) = open.get_mut(&self.group) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.group);
            }
        }
    }
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
    let per_address = OpenPerAddress::default();
    let lingering = Arc::new(Semaphore::new(MAX_LINGERING_REFUSALS));
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
        let trusted = limits.trusted_proxies.contains(peer.ip());
        let address_slot = match (trusted, limits.max_per_address) {
            (true, _) | (false, 0) => None,
            (false, max) => match per_address.take(peer.ip(), max) {
                Some(place) => Some(place),
                None => {
                    refuse_over_cap(stream, peer, &lingering);
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let proxies = limits.trusted_proxies.clone();
        let service = app.clone().map_request(move |mut req: Request<Incoming>| {
            let client = if trusted { proxies.client(peer.ip(), req.headers()) } else { peer.ip() };
            req.extensions_mut().insert(ConnectInfo(peer));
            req.extensions_mut().insert(ClientAddr(client));
            req
        });
        let io = TokioIo::new(WriteDeadline::new(stream, limits.write_timeout));
        let connection = builder.serve_connection(io, TowerToHyperService::new(service));
        let mut closing = closing_rx.clone();
        let max_age = limits.max_age;
        connections.spawn(async move {
            let _slots = (slot, address_slot);
            let mut connection = std::pin::pin!(connection);
            let closing = async move {
                let _ = closing.wait_for(|closing| *closing).await;
            };
            // Past its age (or at shutdown) a connection finishes the request it runs, a stream
            // included, and then closes; an idle one closes at once.
            tokio::select! {
                result = connection.as_mut() => log_connection_end(result, peer),
                () = closing => {
                    connection.as_mut().graceful_shutdown();
                    log_connection_end(connection.await, peer);
                }
                () = tokio::time::sleep(max_age) => {
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

/// Refused connections whose closing may wait for the client's request (below) at once, and how
/// long each may wait; beyond that many, a refused connection is dropped at once.
const MAX_LINGERING_REFUSALS: usize = 64;
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// Tells a connection over its address's cap so (a 429 in OpenAI's error shape) and closes it:
/// it holds no slot, and the accept loop never waits for it. Closing a socket with an unread
/// request in it resets the connection, and a reset can lose the 429 on its way, so the request
/// is read and thrown away first (at most 64 KiB, for at most a second, a bounded number of
/// them at once).
fn refuse_over_cap(stream: TcpStream, peer: SocketAddr, lingering: &Arc<Semaphore>) {
    tracing::debug!(%peer, "too many connections from one address: refused");
    let body = serde_json::json!({"error": {
        "message": "Too many open connections from your address; close some and retry.",
        "type": "requests",
        "param": null,
        "code": "rate_limit_exceeded",
    }})
    .to_string();
    let response = format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nconnection: close\r\n\
         retry-after: 1\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.try_write(response.as_bytes());
    let Ok(permit) = lingering.clone().try_acquire_owned() else { return };
    tokio::spawn(async move {
        let _permit = permit;
        let mut stream = stream;
        let _ = stream.shutdown().await;
        let mut sink = [0u8; 4096];
        let _ = tokio::time::timeout(REFUSAL_LINGER, async {
            let mut read = 0;
            while read < 64 * 1024 {
                match stream.read(&mut sink).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => read += n,
                }
            }
        })
        .await;
    });
}

fn log_connection_end(result: Result<(), hyper::Error>, peer: SocketAddr) {
    if let Err(e) = result {
        // Timeouts, resets and malformed requests: the client's doing, not worth more.
        tracing::debug!(error = %e, %peer, "connection ended with an error");
    }
}
