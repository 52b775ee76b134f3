//! The raw text of JSON values inside a call, so arguments come back as the model wrote them
//! (only whitespace outside strings removed), identical whether streamed token by token or read
//! whole.

use serde::de::IgnoredAny;

/// Length of the JSON value at the start of `s` (which holds one complete value there).
fn value_len(s: &str) -> Option<usize> {
    let mut it = serde_json::Deserializer::from_str(s).into_iter::<IgnoredAny>();
    it.next()?.ok()?;
    Some(it.byte_offset())
}

fn skip_ws(s: &str, pos: usize) -> usize {
    pos + s[pos..].len() - s[pos..].trim_start_matches([' ', '\t', '\n', '\r']).len()
}

/// The raw text of member `key` of the JSON object `raw` (a complete, valid object).
pub(super) fn member<'a>(raw: &'a str, key: &str) -> Option<&'a str> {
    let mut pos = skip_ws(raw, raw.strip_prefix('{').map(|_| 1)?);
    while !raw[pos..].starts_with('}') {
        let mut keys = serde_json::Deserializer::from_str(&raw[pos..]).into_iter::<String>();
        let name = keys.next()?.ok()?;
        pos = skip_ws(raw, pos + keys.byte_offset());
        pos = skip_ws(raw, pos + raw[pos..].strip_prefix(':').map(|_| 1)?);
        let len = value_len(&raw[pos..])?;
        if name == key {
            return Some(&raw[pos..pos + len]);
        }
        pos = skip_ws(raw, pos + len);
        if let Some(rest) = raw[pos..].strip_prefix(',') {
            pos = skip_ws(raw, raw.len() - rest.len());
        }
    }
    None
}

/// The raw texts of the elements of the JSON array `raw` (a complete, valid array).
pub(super) fn elements(raw: &str) -> Option<Vec<&str>> {
    let mut pos = skip_ws(raw, raw.strip_prefix('[').map(|_| 1)?);
    let mut out = Vec::new();
    while !raw[pos..].starts_with(']') {
        let len = value_len(&raw[pos..])?;
        out.push(&raw[pos..pos + len]);
        pos = skip_ws(raw, pos + len);
        if let Some(rest) = raw[pos..].strip_prefix(',') {
            pos = skip_ws(raw, raw.len() - rest.len());
        }
    }
    Some(out)
}

/// Removes whitespace outside strings, incrementally: feed text in any split, the output
/// concatenates to the same.
#[derive(Debug, Clone, Default)]
pub(super) struct Minifier {
    in_string: bool,
    escaped: bool,
    /// Open `{`/`[` minus closed ones.
    pub depth: usize,
}

impl Minifier {
    /// Minifies `c` into `out`; returns whether it closed the outermost value.
    pub(super) fn push(&mut self, c: char, out: &mut String) -> bool {
        if self.in_string {
            out.push(c);
            if self.escaped {
                self.escaped = false;
            } else if c == '\\' {
                self.escaped = true;
            } else if c == '"' {
                self.in_string = false;
            }
            return false;
        }
        match c {
            ' ' | '\t' | '\n' | '\r' => return false,
            '"' => self.in_string = true,
            '{' | '[' => self.depth += 1,
            '}' | ']' => {
                self.depth = self.depth.saturating_sub(1);
                out.push(c);
                return self.depth == 0;
            }
            _ => {}
        }
        out.push(c);
        false
    }
}

/// `raw` without whitespace outside strings.
pub(super) fn minify(raw: &str) -> String {
    let mut m = Minifier::default();
    let mut out = String::with_capacity(raw.len());
    raw.chars().for_each(|c| {
        m.push(c, &mut out);
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_and_elements_are_found_verbatim() {
        let raw = "{ \"name\" : \"f\" ,\n \"arguments\": {\"x\": [1, 2.50], \"s\": \"a }\\\" b\"} }";
        assert_eq!(member(raw, "name"), Some("\"f\""));
        assert_eq!(member(raw, "arguments"), Some("{\"x\": [1, 2.50], \"s\": \"a }\\\" b\"}"));
        assert_eq!(member(raw, "other"), None);
        assert_eq!(elements("[ {\"a\": 1} , 2,\"x\"]"), Some(vec!["{\"a\": 1}", "2", "\"x\""]));
        assert_eq!(minify("{\"x\": [1, 2.50], \"s\": \"a }\\\" b\"}"), "{\"x\":[1,2.50],\"s\":\"a }\\\" b\"}");
    }
}
