//! Fetching `image_url` parts that point at http(s) URLs.
//!
//! A chat request is untrusted input that makes the server open connections, so every fetch is
//! guarded against server-side request forgery: the host is resolved once, every address must be
//! publicly routable, the connection is pinned to the checked address (no DNS rebinding between
//! check and connect), redirects are followed by hand and checked again, and the body is capped
//! in time and size.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use futures_util::StreamExt;
use gantry_api::{sniff_image_mime, ApiError, ImageRef};
use reqwest::Url;

const MAX_REDIRECTS: usize = 3;

#[derive(Clone, Debug)]
pub struct ImageFetcher {
    pub timeout: Duration,
    /// Most images one request may carry (`--max-images`).
    pub max_images: usize,
    /// Most image bytes one request may carry, inline and fetched together (`--max-image-bytes`).
    pub max_total_bytes: usize,
    /// Hosts (as written in URLs) the operator trusts even at private addresses
    /// (`--allow-image-host`): an intranet image store, a test server.
    pub allowed_private_hosts: Vec<String>,
    /// Largest image, width × height, accepted for decoding (`--max-image-pixels`).
    pub max_pixels: u64,
}

pub(crate) const DEFAULT_MAX_IMAGES: usize = 8;
pub(crate) const DEFAULT_MAX_IMAGE_BYTES: usize = 20 * 1024 * 1024;
/// 4096 × 4096: a 12-megapixel phone photo passes; projectors see far fewer pixels anyway
/// (they scale or tile to a few hundred thousand), and one decoded image stays under 64 MiB.
pub(crate) const DEFAULT_MAX_IMAGE_PIXELS: u64 = 4096 * 4096;

impl Default for ImageFetcher {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(10),
            max_images: DEFAULT_MAX_IMAGES,
            max_total_bytes: DEFAULT_MAX_IMAGE_BYTES,
            allowed_private_hosts: Vec::new(),
            max_pixels: DEFAULT_MAX_IMAGE_PIXELS,
        }
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
    /// Refuses a request with more than `max_images` images before fetching any, and stops as
    /// soon as the images' bytes together pass `max_total_bytes`.
    pub async fn load_all<'a>(
        &self,
        images: impl IntoIterator<Item = &'a ImageRef>,
    ) -> Result<Vec<FetchedImage>, ApiError> {
        let images: Vec<&ImageRef> = images.into_iter().collect();
        if images.len() > self.max_images {
            return Err(ApiError::invalid_value(
                "messages",
                format!(
                    "Invalid 'messages': {} images in one request; this server accepts at most {}.",
                    images.len(),
                    self.max_images
                ),
            ));
        }
        let mut out = Vec::with_capacity(images.len());
        let mut total = 0usize;
        for image in images {
            let left = self.max_total_bytes.saturating_sub(total);
            let fetched = match image {
                ImageRef::Data { bytes, .. } => {
                    if bytes.len() > left {
                        return Err(self.too_many_bytes(None));
                    }
                    FetchedImage {
                        mime: sniff_image_mime(bytes).unwrap_or("application/octet-stream"),
                        bytes: bytes.clone(),
                    }
                }
                ImageRef::Remote { url, param } => self.fetch(url, param, left).await?,
            };
            total += fetched.bytes.len();
            out.push(fetched);
        }
        Ok(out)
    }

    /// Refuses an image whose header declares more than `max_pixels` pixels, before anything
    /// decodes it: a PNG of one colour compresses a 16384 × 16384 canvas (768 MiB as RGB) into
    /// a few hundred kilobytes. Images whose header cannot be read are left to the decoder,
    /// which refuses them with its own reason.
    pub fn check_dimensions<'a>(
        &self,
        images: &[FetchedImage],
        params: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), ApiError> {
        for (image, param) in images.iter().zip(params) {
            let Some((width, height)) = header_dimensions(&image.bytes) else { continue };
            let pixels = u64::from(width) * u64::from(height);
            if pixels > self.max_pixels {
                return Err(ApiError::invalid_value(
                    param,
                    format!(
                        "Invalid '{param}': the image is {width}x{height} ({pixels} pixels); this server accepts at most {} pixels per image.",
                        self.max_pixels
                    ),
                ));
            }
        }
        Ok(())
    }

    fn too_many_bytes(&self, param: Option<&str>) -> ApiError {
        let message = format!(
            "The request's images are larger than {} bytes together, the most this server accepts.",
            self.max_total_bytes
        );
        match param {
            Some(param) => ApiError::invalid_value(param, format!("Invalid '{param}': {message}")),
            None => ApiError::invalid_value("messages", message),
        }
    }

    /// Fetches one image of at most `max_bytes` bytes.
    async fn fetch(&self, url: &str, param: &str, max_bytes: usize) -> Result<FetchedImage, ApiError> {
        let bad = |why: String| ApiError::invalid_value(param, format!("Invalid '{param}': {why}"));
        let mut url = Url::parse(url).map_err(|e| bad(format!("malformed URL ({e}).")))?;
        let deadline = tokio::time::Instant::now() + self.timeout;
        for _ in 0..=MAX_REDIRECTS {
            let addr = tokio::time::timeout_at(deadline, resolve_public(&url, &self.allowed_private_hosts))
                .await
                .map_err(|_| bad("timed out resolving the image URL's host.".into()))?
                .map_err(bad)?;
            let host = url.host_str().unwrap_or_default().to_string();
            let client = reqwest::Client::builder()
                // A proxy from the environment would make the connection itself, to wherever
                // the checked URL leads, bypassing the pinned address.
                .no_proxy()
                .redirect(reqwest::redirect::Policy::none())
                .resolve(&host, addr)
                .timeout(self.timeout)
                .build()
                .map_err(crate::errors::image_client_failed)?;
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
            if response.content_length().is_some_and(|n| n > max_bytes as u64) {
                return Err(self.too_many_bytes(Some(param)));
            }
            let mut bytes = Vec::new();
            let mut body = response.bytes_stream();
            loop {
                let chunk = tokio::time::timeout_at(deadline, body.next())
                    .await
                    .map_err(|_| bad("timed out fetching the image.".into()))?;
                let Some(chunk) = chunk else { break };
                let chunk = chunk.map_err(|e| bad(format!("could not read the image ({}).", without_url(e))))?;
                if bytes.len() + chunk.len() > max_bytes {
                    return Err(self.too_many_bytes(Some(param)));
                }
                bytes.extend_from_slice(&chunk);
            }
            let mime = sniff_image_mime(&bytes)
                .ok_or_else(|| bad("the URL does not point to a valid PNG, JPEG, GIF, WEBP or BMP image.".into()))?;
            return Ok(FetchedImage { mime, bytes });
        }
        Err(bad(format!("the image URL redirected more than {MAX_REDIRECTS} times.")))
    }
}

/// Width and height as the image's header states them; nothing is decoded. Without limits:
/// the decoders' own would refuse a huge header here, and this check is what reports it.
fn header_dimensions(bytes: &[u8]) -> Option<(u32, u32)> {
    let mut reader = image::ImageReader::new(std::io::Cursor::new(bytes)).with_guessed_format().ok()?;
    reader.no_limits();
    reader.into_dimensions().ok()
}

/// reqwest's message without the URL, which the client already knows and logs need not repeat.
fn without_url(e: reqwest::Error) -> String {
    e.without_url().to_string()
}

/// Resolves the URL's host and returns one address, refusing hosts with any non-public address.
async fn resolve_public(url: &Url, allowed_private_hosts: &[String]) -> Result<SocketAddr, String> {
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
    let trusted = allowed_private_hosts.iter().any(|h| h.eq_ignore_ascii_case(host) || h.eq_ignore_ascii_case(bare));
    if !trusted && addrs.iter().any(|a| !is_public(a.ip())) {
        return Err(
            "image URLs must point to a public internet address, not a loopback, private or link-local one.".into()
        );
    }
    Ok(addrs[0])
}

/// Whether an address is globally routable (the parts of `IpAddr::is_global` that matter here).
/// IPv6 forms that carry an IPv4 address (mapped, compatible, 6to4, NAT64) are judged by the
/// IPv4 address they reach, so `::127.0.0.1` or `2002:7f00:1::` cannot smuggle a loopback or
/// private target past the guard; Teredo tunnels are refused outright.
pub(crate) fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => {
            let s = v6.segments();
            let embedded = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
            if v6.is_loopback() || v6.is_unspecified() {
                return false;
            }
            // ::ffff:a.b.c.d (mapped) and ::a.b.c.d (the deprecated "compatible" form).
            if let Some(v4) = v6.to_ipv4() {
                return is_public_v4(v4);
            }
            // 6to4 (2002::/16): the next 32 bits are the IPv4 address it tunnels to.
            if s[0] == 0x2002 {
                return is_public_v4(embedded(s[1], s[2]));
            }
            // NAT64, well-known prefix 64:ff9b::/96: the last 32 bits are the IPv4 target.
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                return is_public_v4(embedded(s[6], s[7]));
            }
            !(v6.is_multicast()
                || (s[0] == 0x2001 && s[1] == 0x0000) // Teredo: reaches an obfuscated IPv4 host
                || (s[0] == 0x0064 && s[1] == 0xff9b) // local-use NAT64 (64:ff9b:1::/48) and the rest
                || (s[0] & 0xfe00) == 0xfc00 // unique local
                || (s[0] & 0xffc0) == 0xfe80 // link local
                || (s[0] & 0xffc0) == 0xfec0 // site local (deprecated)
                || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
                || (s[0] == 0x0100 && s[1..4] == [0, 0, 0])) // discard-only
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

/// A one-colour PNG of `side` × `side`, written row by row (never a whole bitmap in memory).
#[cfg(test)]
pub(crate) fn blank_png(side: u32) -> Vec<u8> {
    #[derive(Clone, Default)]
    struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let out = Shared::default();
    let mut encoder = png::Encoder::new(out.clone(), side, side);
    encoder.set_color(png::ColorType::Grayscale);
    encoder.set_depth(png::BitDepth::One);
    let mut writer = encoder.write_header().unwrap().into_stream_writer().unwrap();
    let row = vec![0u8; side.div_ceil(8) as usize];
    for _ in 0..side {
        std::io::Write::write_all(&mut writer, &row).unwrap();
    }
    writer.finish().unwrap();
    let bytes = out.0.lock().unwrap().clone();
    bytes
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod turn_tests;
