//! The SSRF guard, the bounds on images per request, and what a fetch refuses.

use super::*;

#[test]
fn private_and_special_addresses_are_refused() {
    for ip in [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "0.0.0.0",
        "100.64.0.1",
        "255.255.255.255",
        "224.0.0.1",
        "::1",
        "::",
        "fd00::1",
        "fe80::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
    ] {
        assert!(!is_public(ip.parse().unwrap()), "{ip} must not be public");
    }
    for ip in ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"] {
        assert!(is_public(ip.parse().unwrap()), "{ip} is public");
    }
}

#[test]
fn ipv6_forms_embedding_a_private_ipv4_address_are_refused() {
    for ip in [
        "::127.0.0.1",                          // IPv4-compatible loopback
        "::10.0.0.1",                           // IPv4-compatible private
        "::169.254.169.254",                    // IPv4-compatible link-local (cloud metadata)
        "::ffff:192.168.0.1",                   // IPv4-mapped private
        "2002:7f00:1::",                        // 6to4 of 127.0.0.1
        "2002:a00:1::1",                        // 6to4 of 10.0.0.1
        "2002:a9fe:a9fe::",                     // 6to4 of 169.254.169.254
        "2001:0:4136:e378:8000:63bf:3fff:fdd2", // Teredo
        "2001::1",                              // Teredo prefix
        "64:ff9b::7f00:1",                      // NAT64 of 127.0.0.1
        "64:ff9b::a00:1",                       // NAT64 of 10.0.0.1
        "64:ff9b:1::a00:1",                     // local-use NAT64
        "fec0::1",                              // site-local
        "100::1",                               // discard-only
    ] {
        assert!(!is_public(ip.parse().unwrap()), "{ip} must not be public");
    }
    // The same forms around a public IPv4 address stay reachable (DNS64 networks need NAT64).
    for ip in ["::8.8.8.8", "2002:808:808::1", "64:ff9b::808:808"] {
        assert!(is_public(ip.parse().unwrap()), "{ip} is public");
    }
}

fn remote(url: &str) -> ImageRef {
    ImageRef::Remote { url: url.into(), param: "messages[0].content[0].image_url".into() }
}

#[tokio::test]
async fn loopback_urls_are_refused_before_any_connection() {
    let fetcher = ImageFetcher::default();
    for url in ["http://127.0.0.1:9/cat.png", "http://localhost/cat.png", "http://[::1]/x.png", "ftp://example.com/a"] {
        let err = fetcher.load_all(&[remote(url)]).await.unwrap_err();
        let body = err.to_json();
        assert_eq!(body["error"]["param"], "messages[0].content[0].image_url", "{url}");
        assert_eq!(body["error"]["type"], "invalid_request_error");
    }
}

fn png(len: usize) -> ImageRef {
    let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
    bytes.resize(len, 0);
    ImageRef::Data { mime: "image/png".into(), bytes }
}

#[tokio::test]
async fn more_images_than_allowed_are_refused_before_any_fetch() {
    let fetcher = ImageFetcher { max_images: 2, ..ImageFetcher::default() };
    assert_eq!(fetcher.load_all(&[png(16), png(16)]).await.unwrap().len(), 2);
    // The remote one would fail on its address if it were fetched; the count comes first.
    let err = fetcher.load_all(&[png(16), png(16), remote("http://127.0.0.1:9/x.png")]).await.unwrap_err();
    assert_eq!(err.status.as_u16(), 400);
    assert_eq!(err.param.as_deref(), Some("messages"));
    assert!(err.message.contains("3 images in one request; this server accepts at most 2"), "{}", err.message);
}

#[tokio::test]
async fn image_bytes_are_capped_per_request() {
    let fetcher = ImageFetcher { max_total_bytes: 100, ..ImageFetcher::default() };
    assert_eq!(fetcher.load_all(&[png(50), png(50)]).await.unwrap().len(), 2);
    let err = fetcher.load_all(&[png(50), png(51)]).await.unwrap_err();
    assert_eq!((err.status.as_u16(), err.error_type), (400, "invalid_request_error"));
    assert!(err.message.contains("larger than 100 bytes together"), "{}", err.message);
}

/// A proxy named in the environment must never make the connection: it would reach
/// wherever the URL leads, past the address check. The fetch runs in a child process (the
/// variables are process-wide) against a public address; the "proxy" here only counts
/// connections.
#[test]
fn image_fetches_ignore_proxy_environment_variables() {
    let proxy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy_url = format!("http://{}", proxy.local_addr().unwrap());
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "openai::images::tests::fetch_with_proxy_variables_set", "--ignored", "--test-threads", "1"])
        .env("http_proxy", &proxy_url)
        .env("HTTP_PROXY", &proxy_url)
        .env("https_proxy", &proxy_url)
        .env("ALL_PROXY", &proxy_url)
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && log.contains("1 passed"), "{log}");
    proxy.set_nonblocking(true).unwrap();
    assert!(proxy.accept().is_err(), "the image fetch connected through the proxy");
}

#[tokio::test]
#[ignore = "run in a child process by image_fetches_ignore_proxy_environment_variables"]
async fn fetch_with_proxy_variables_set() {
    assert!(std::env::var("http_proxy").is_ok(), "only meaningful with a proxy set");
    let fetcher = ImageFetcher { timeout: Duration::from_secs(2), ..ImageFetcher::default() };
    // A public address (nothing needs to answer): a direct attempt fails or times out.
    let err = fetcher.load_all(&[remote("http://1.1.1.1:9/cat.png")]).await.unwrap_err();
    assert_eq!(err.status.as_u16(), 400);
}

#[tokio::test]
async fn an_allowed_private_host_is_fetched_and_others_stay_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let png = b"\x89PNG\r\n\x1a\n0000".to_vec();
    let body = png.clone();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let mut request = [0u8; 2048];
            let _ = sock.read(&mut request).await;
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = sock.write_all(head.as_bytes()).await;
            let _ = sock.write_all(&body).await;
        }
    });
    let url = format!("http://127.0.0.1:{port}/a.png");
    let trusting = ImageFetcher { allowed_private_hosts: vec!["127.0.0.1".into()], ..ImageFetcher::default() };
    let out = trusting.load_all(&[remote(&url)]).await.unwrap();
    assert_eq!(out[0].bytes, png);
    let err = ImageFetcher::default().load_all(&[remote(&url)]).await.unwrap_err();
    assert!(err.message.contains("public internet address"), "{}", err.message);
}

#[test]
fn an_image_bomb_is_refused_from_its_header_naming_its_part() {
    let bomb = blank_png(16_384);
    assert!(bomb.len() < 1 << 20, "{} bytes", bomb.len());
    let small = blank_png(64);
    let fetched = |bytes: &Vec<u8>| FetchedImage { mime: "image/png", bytes: bytes.clone() };
    let fetcher = ImageFetcher::default();
    let params = ["messages[0].content[1].image_url", "messages[2].content[0].image_url"];
    fetcher.check_dimensions(&[fetched(&small), fetched(&small)], params).unwrap();
    let err = fetcher.check_dimensions(&[fetched(&small), fetched(&bomb)], params).unwrap_err();
    assert_eq!((err.status.as_u16(), err.param.as_deref()), (400, Some("messages[2].content[0].image_url")));
    assert!(err.message.contains("16384x16384"), "{}", err.message);
    // The bound is the operator's: a 64 × 64 image passes at 4096 pixels, not at 4095.
    let tight = ImageFetcher { max_pixels: 4095, ..ImageFetcher::default() };
    assert!(tight.check_dimensions(&[fetched(&small)], params).is_err());
    let exact = ImageFetcher { max_pixels: 4096, ..ImageFetcher::default() };
    assert!(exact.check_dimensions(&[fetched(&small)], params).is_ok());
}

#[tokio::test]
async fn data_images_pass_through() {
    let png = b"\x89PNG\r\n\x1a\n0000".to_vec();
    let out = ImageFetcher::default()
        .load_all(&[ImageRef::Data { mime: "image/png".into(), bytes: png.clone() }])
        .await
        .unwrap();
    assert_eq!(out[0].mime, "image/png");
    assert_eq!(out[0].bytes, png);
}
