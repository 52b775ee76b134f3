//! Image references found in `image_url` content parts.

use base64::Engine as _;

use crate::ApiError;

/// An image a message refers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageRef {
    /// A `data:` URL, decoded and checked by magic bytes. `mime` is the sniffed type.
    Data { mime: String, bytes: Vec<u8> },
    /// An `http(s)://` URL; the server fetches it later. `param` names it in errors.
    Remote { url: String, param: String },
}

/// The MIME type of an image judged by its first bytes, if it is PNG/JPEG/GIF/WEBP/BMP.
pub fn sniff_image_mime(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some("image/jpeg")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else if bytes.len() >= 14 && bytes.starts_with(b"BM") {
        Some("image/bmp")
    } else {
        None
    }
}

/// Parses an `image_url.url`. `param` names it in errors
/// (e.g. `messages[0].content[1].image_url`).
pub fn parse_image_url(url: &str, param: &str) -> Result<ImageRef, ApiError> {
    let url = url.trim();
    if url.is_empty() {
        return Err(ApiError::invalid_value(param, format!("Invalid '{param}': empty image URL.")));
    }
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        let rest = url.split_once("://").map_or("", |(_, r)| r);
        if rest.is_empty() || rest.starts_with('/') || rest.chars().any(char::is_whitespace) {
            return Err(ApiError::invalid_value(param, format!("Invalid '{param}': malformed URL.")));
        }
        return Ok(ImageRef::Remote { url: url.to_string(), param: param.to_string() });
    }
    if lower.starts_with("data:") {
        return parse_data_url(url, param);
    }
    Err(ApiError::invalid_value(
        param,
        format!("Invalid '{param}': expected an http(s) URL or a base64 data URL (data:image/...;base64,...)."),
    ))
}

fn parse_data_url(url: &str, param: &str) -> Result<ImageRef, ApiError> {
    let bad = |what: &str| ApiError::invalid_value(param, format!("Invalid '{param}': {what}"));
    let (header, payload) = url[5..].split_once(',').ok_or_else(|| bad("malformed data URL."))?;
    let mut parts = header.split(';');
    let declared = parts.next().unwrap_or("").trim().to_ascii_lowercase();
    if !parts.any(|p| p.trim().eq_ignore_ascii_case("base64")) {
        return Err(bad("data URLs must be base64-encoded (data:image/...;base64,...)."));
    }
    if !declared.is_empty() && !declared.starts_with("image/") {
        return Err(bad("the data URL is not an image (expected a data:image/... URL)."));
    }
    let cleaned: String = payload.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(cleaned.as_bytes())
        .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(cleaned.as_bytes()))
        .or_else(|_| base64::engine::general_purpose::URL_SAFE.decode(cleaned.as_bytes()))
        .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(cleaned.as_bytes()))
        .map_err(|_| bad("the data URL's base64 payload could not be decoded."))?;
    let mime = sniff_image_mime(&bytes).ok_or_else(|| {
        ApiError::invalid_value(
            param,
            "You uploaded an unsupported image or not a valid image. Please make sure your image is a valid PNG, JPEG, GIF, WEBP or BMP.",
        )
    })?;
    Ok(ImageRef::Data { mime: mime.to_string(), bytes })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use base64::engine::general_purpose::STANDARD;

    pub(crate) const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";

    pub(crate) fn data_url(mime: &str, bytes: &[u8]) -> String {
        format!("data:{mime};base64,{}", STANDARD.encode(bytes))
    }

    #[test]
    fn sniffs_formats() {
        let cases: &[(&[u8], Option<&str>)] = &[
            (PNG, Some("image/png")),
            (&[0xFF, 0xD8, 0xFF, 0xE0, 0, 0], Some("image/jpeg")),
            (b"GIF89a....", Some("image/gif")),
            (b"RIFF\0\0\0\0WEBPVP8 ", Some("image/webp")),
            (b"BM\0\0\0\0\0\0\0\0\0\0\0\0\0\0", Some("image/bmp")),
            (b"hello world", None),
            (b"", None),
        ];
        for (bytes, want) in cases {
            assert_eq!(sniff_image_mime(bytes), *want, "{bytes:?}");
        }
    }

    #[test]
    fn parses_urls() {
        let p = "messages[0].content[0].image_url";
        assert_eq!(
            parse_image_url(&data_url("image/png", PNG), p).unwrap(),
            ImageRef::Data { mime: "image/png".into(), bytes: PNG.to_vec() }
        );
        // Declared type is not trusted: the sniffed one wins.
        assert!(matches!(
            parse_image_url(&data_url("image/jpeg", PNG), p).unwrap(),
            ImageRef::Data { mime, .. } if mime == "image/png"
        ));
        assert_eq!(
            parse_image_url("https://example.com/cat.png", p).unwrap(),
            ImageRef::Remote { url: "https://example.com/cat.png".into(), param: p.into() }
        );
        for bad in [
            "",
            "   ",
            "ftp://example.com/a.png",
            "file:///etc/passwd",
            "https://",
            "data:image/png;base64,@@@not base64@@@",
            "data:image/png,rawbytes",
            "data:image/png;base64",
            "data:text/plain;base64,aGVsbG8=",
        ] {
            let e = parse_image_url(bad, p).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(p), "{bad}");
            assert_eq!(e.status.as_u16(), 400, "{bad}");
        }
        let e = parse_image_url(&data_url("image/png", b"definitely not an image"), p).unwrap_err();
        assert!(e.message.contains("not a valid image"), "{}", e.message);
    }
}
