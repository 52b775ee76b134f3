//! Fetching `image_url` parts that point at http(s) URLs.
//!
//! A chat request is untrusted input that makes the server open connections, so every fetch is
//! guarded against server-side request forgery: the host is resolved once, every address must be
//! publicly routable, the connection is pinned to the checked address (no DNS rebinding between
//! check and connect), redirects are followed by hand and checked again, and the body is capped
//! in time and size.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use futures_util::StreamExt;
use gantry_api::{sniff_image_mime, ApiError, ImageRef};
use reqwest::Url;

const MAX_REDIRECTS: usize = 3;

#[derive(Clone, Debug)]
pub struct ImageFetcher {
    pub timeout: Duration,
    pub max_bytes: usize,
}

impl Default for ImageFetcher {
    fn default() -> Self {
        Self { timeout: Duration::from_secs(10), max_bytes: 20 * 1024 * 1024 }
    }
}

/// A decoded image, whichever way it arrived.
#[derive(Debug)]
pub struct FetchedImage {
    pub mime: &'static str,
    pub bytes: Vec<u8>,
}

impl ImageFetcher {
    /// Resolves every image of a request into bytes, checking that each really is an image.
    pub async fn load_all(&self, images: &[ImageRef]) -> Result<Vec<FetchedImage>, ApiError> {
        let mut out = Vec::with_capacity(images.len());
        for image in images {
            out.push(match image {
                ImageRef::Data { bytes, .. } => FetchedImage {
                    mime: sniff_image_mime(bytes).unwrap_or("application/octet-stream"),
                    bytes: bytes.clone(),
                },
                ImageRef::Remote { url, param } => self.fetch(url, param).await?,
            });
        }
        Ok(out)
    }

    async fn fetch(&self, url: &str, param: &str) -> Result<FetchedImage, ApiError> {
        let bad = |why: String| ApiError::invalid_value(param, format!("Invalid '{param}': {why}"));
        let mut url = Url::parse(url).map_err(|e| bad(format!("malformed URL ({e}).")))?;
        let deadline = tokio::time::Instant::now() + self.timeout;
        for _ in 0..=MAX_REDIRECTS {
            let addr = tokio::time::timeout_at(deadline, resolve_public(&url))
                .await
                .map_err(|_| bad("timed out resolving the image URL's host.".into()))?
                .map_err(bad)?;
            let host = url.host_str().unwrap_or_default().to_string();
            let client = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .resolve(&host, addr)
                .timeout(self.timeout)
                .build()
                .map_err(|e| ApiError::internal(format!("image client: {e}")))?;
            let response = tokio::time::timeout_at(deadline, client.get(url.clone()).send())
                .await
                .map_err(|_| bad("timed out fetching the image.".into()))?
                .map_err(|e| bad(format!("could not fetch the image ({}).", without_url(e))))?;
            if response.status().is_redirection() {
                let location = response
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .ok_or_else(|| bad("the image URL redirected without a location.".into()))?;
                url = url.join(location).map_err(|e| bad(format!("bad redirect location ({e}).")))?;
                continue;
            }
            if !response.status().is_success() {
                return Err(bad(format!("fetching the image returned HTTP {}.", response.status().as_u16())));
            }
            if response.content_length().is_some_and(|n| n as usize > self.max_bytes) {
                return Err(bad(format!("the image is larger than {} bytes.", self.max_bytes)));
            }
            let mut bytes = Vec::new();
            let mut body = response.bytes_stream();
            loop {
                let chunk = tokio::time::timeout_at(deadline, body.next())
                    .await
                    .map_err(|_| bad("timed out fetching the image.".into()))?;
                let Some(chunk) = chunk else { break };
                let chunk = chunk.map_err(|e| bad(format!("could not read the image ({}).", without_url(e))))?;
                if bytes.len() + chunk.len() > self.max_bytes {
                    return Err(bad(format!("the image is larger than {} bytes.", self.max_bytes)));
                }
                bytes.extend_from_slice(&chunk);
            }
            let mime = sniff_image_mime(&bytes).ok_or_else(|| {
                bad("the URL does not point to a valid PNG, JPEG, GIF, WEBP or BMP image.".into())
            })?;
            return Ok(FetchedImage { mime, bytes });
        }
        Err(bad(format!("the image URL redirected more than {MAX_REDIRECTS} times.")))
    }
}

/// reqwest's message without the URL, which the client already knows and logs need not repeat.
fn without_url(e: reqwest::Error) -> String {
    e.without_url().to_string()
}

/// Resolves the URL's host and returns one address, refusing hosts with any non-public address.
async fn resolve_public(url: &Url) -> Result<SocketAddr, String> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("only http and https image URLs are allowed, not `{}`.", url.scheme()));
    }
    let host = url.host_str().ok_or("the image URL has no host.")?;
    let port = url.port_or_known_default().unwrap_or(80);
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<SocketAddr> = match bare.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::net::lookup_host((bare, port))
            .await
            .map_err(|_| format!("could not resolve the image host `{host}`."))?
            .collect(),
    };
    if addrs.is_empty() {
        return Err(format!("could not resolve the image host `{host}`."));
    }
    if addrs.iter().any(|a| !is_public(a.ip())) {
        return Err("image URLs must point to a public internet address, not a loopback, private or link-local one."
            .into());
    }
    Ok(addrs[0])
}

/// Whether an address is globally routable (the parts of `IpAddr::is_global` that matter here).
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public_v4(v4);
            }
            let first = v6.segments()[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00 // unique local
                || (first & 0xffc0) == 0xfe80 // link local
                || (first == 0x2001 && v6.segments()[1] == 0x0db8) // documentation
                || v6 == Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0)
                || (first == 0x0064 && v6.segments()[1] == 0xff9b)) // NAT64 may reach private v4
        }
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_unspecified()
        || ip.is_multicast()
        || a == 0
        || (a == 100 && (64..128).contains(&b)) // carrier-grade NAT
        || (a == 192 && b == 0 && c == 0)
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || a >= 240)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_and_special_addresses_are_refused() {
        for ip in [
            "127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "0.0.0.0", "100.64.0.1",
            "255.255.255.255", "224.0.0.1", "::1", "::", "fd00::1", "fe80::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1",
        ] {
            assert!(!is_public(ip.parse().unwrap()), "{ip} must not be public");
        }
        for ip in ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"] {
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
}
