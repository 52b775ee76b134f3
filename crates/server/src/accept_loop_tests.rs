//! The accept loop's limits against real sockets on loopback: the per-address connection cap
//! and trusted proxies, the client address they name, the write deadline and the connection age.
//! Connections from 127.0.0.2 are another client (Linux routes all of 127/8 to loopback).

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::routing::get;
use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::client_addr::TrustedProxies;
use crate::connections::{serve, ConnectionLimits};

/// Longer than any wait here; reaching it means the server never answered or never closed.
const STUCK: Duration = Duration::from_secs(20);

fn app() -> Router {
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/client", get(|req: Request| async move { crate::client_addr::of(&req).unwrap().to_string() }))
        .route(
            "/stream",
            get(|| async {
                let chunks = futures_util::stream::unfold(0, |i| async move {
                    (i < 10).then_some(())?;
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    Some((Ok::<_, std::io::Error>(Bytes::from(format!("chunk {i}\n"))), i + 1))
                });
                Body::from_stream(chunks)
            }),
        )
}

struct Server {
    addr: SocketAddr,
    stop: CancellationToken,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn start(limits: ConnectionLimits) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(serve(listener, app(), limits, stop.clone().cancelled_owned()));
    Server { addr, stop }
}

async fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    socket.connect(to).await.unwrap()
}

/// One request on `stream`; the response head and body as text (up to a whole response or EOF).
async fn request(stream: &mut TcpStream, path: &str, extra: &str) -> String {
    let head = format!("GET {path} HTTP/1.1\r\nhost: test\r\n{extra}\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(STUCK, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
            let text = String::from_utf8_lossy(&got);
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head.lines().find_map(|l| l.strip_prefix("content-length: ")).and_then(|n| n.parse().ok());
                if length.is_some_and(|n: usize| body.len() >= n) {
                    break;
                }
            }
        }
    })
    .await
    .expect("an answer");
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test]
async fn one_address_holds_at_most_its_cap_and_other_addresses_are_served() {
    let server = start(ConnectionLimits { max_per_address: 2, ..ConnectionLimits::default() }).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = connect_from("127.0.0.1", server.addr).await;
        assert!(request(&mut stream, "/health", "").await.starts_with("HTTP/1.1 200"));
        held.push(stream);
    }
    let mut third = connect_from("127.0.0.1", server.addr).await;
    let refused = request(&mut third, "/health", "").await;
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    assert!(refused.contains(r#""code":"rate_limit_exceeded""#), "{refused}");

    let mut other = connect_from("127.0.0.2", server.addr).await;
    assert!(request(&mut other, "/health", "").await.starts_with("HTTP/1.1 200"));

    // A closed connection gives its address's place back.
    drop(held.pop());
    let mut again = None;
    for _ in 0..100 {
        let mut stream = connect_from("127.0.0.1", server.addr).await;
        if request(&mut stream, "/health", "").await.starts_with("HTTP/1.1 200") {
            again = Some(stream);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(again.is_some(), "the closed connection's place was never given back");
}

#[tokio::test]
async fn a_trusted_proxy_is_not_capped_and_names_the_client() {
    let limits = ConnectionLimits {
        max_per_address: 1,
        trusted_proxies: TrustedProxies::parse("127.0.0.1/32").unwrap(),
        ..ConnectionLimits::default()
    };
    let server = start(limits).await;
    let mut proxied = Vec::new();
    for i in 0..3 {
        let mut stream = connect_from("127.0.0.1", server.addr).await;
        let answer = request(&mut stream, "/client", &format!("x-forwarded-for: 6.6.6.6, 203.0.113.{i}\r\n")).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with(&format!("203.0.113.{i}")), "the client the proxy names: {answer}");
        proxied.push(stream);
    }
    // Anyone else's X-Forwarded-For is ignored: the client is the TCP peer.
    let mut stranger = connect_from("127.0.0.2", server.addr).await;
    let answer = request(&mut stranger, "/client", "x-forwarded-for: 203.0.113.99\r\n").await;
    assert!(answer.ends_with("127.0.0.2"), "{answer}");
}

#[tokio::test]
async fn a_client_that_pipelines_and_never_reads_loses_its_connection() {
    let limits = ConnectionLimits {
        max_per_address: 1,
        write_timeout: Duration::from_millis(500),
        ..ConnectionLimits::default()
    };
    let server = start(limits).await;
    let mut greedy = connect_from("127.0.0.1", server.addr).await;
    let pipelined = "GET /health HTTP/1.1\r\nhost: test\r\n\r\n".repeat(1000);
    // Until the server stops taking requests: its answers fill both sockets' buffers.
    let mut sent = 0;
    while let Ok(Ok(())) = tokio::time::timeout(Duration::from_secs(1), greedy.write_all(pipelined.as_bytes())).await {
        sent += 1;
        assert!(sent < 100_000, "the server kept reading requests without writing");
    }
    // Its connection is cut after the write deadline, which gives the address's one place back.
    let served = tokio::time::timeout(STUCK, async {
        loop {
            let mut stream = connect_from("127.0.0.1", server.addr).await;
            if request(&mut stream, "/health", "").await.starts_with("HTTP/1.1 200") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(served.is_ok(), "the connection that never reads still holds its place");
    drop(greedy);
}

#[tokio::test]
async fn an_old_connection_finishes_its_stream_then_closes() {
    let limits = ConnectionLimits { max_age: Duration::from_millis(300), ..ConnectionLimits::default() };
    let server = start(limits).await;
    // A stream that runs past the age is delivered whole, then the connection closes.
    let mut stream = connect_from("127.0.0.1", server.addr).await;
    stream.write_all(b"GET /stream HTTP/1.1\r\nhost: test\r\n\r\n").await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(STUCK, stream.read_to_end(&mut got)).await.expect("closed after the stream").unwrap();
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200") && text.contains("chunk 9\n"), "{text}");

    // An idle keep-alive connection closes at its age, well before the header read timeout.
    let mut idle = connect_from("127.0.0.1", server.addr).await;
    assert!(request(&mut idle, "/health", "").await.starts_with("HTTP/1.1 200"));
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), idle.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "an idle connection outlived its age");
}
