//! How many bytes of weights one decoded token reads, from the GGUF's header: the tensor data
//! less the token embeddings, of which a token reads one row, unless the model ties them to its
//! output layer (no `output.weight`), which reads them whole. Only the header is read (the
//! metadata is skipped over), so it costs milliseconds even for a large model.

use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::path::Path;

use anyhow::{bail, Context as _, Result};

/// The estimate and how it was made, for the report.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct WeightsPerToken {
    pub bytes: u64,
    pub how: String,
}

const EMBEDDINGS: &str = "token_embd.weight";
const OUTPUT: &str = "output.weight";

/// The estimate for `model`; the file's size, said so, when its header cannot be read.
pub(crate) fn weights_per_token(model: &Path) -> WeightsPerToken {
    let file_bytes = std::fs::metadata(model).map(|m| m.len()).unwrap_or(0);
    match read_tensors(model, file_bytes) {
        Ok(t) => estimate(&t, file_bytes),
        Err(e) => WeightsPerToken {
            bytes: file_bytes,
            how: format!("the GGUF file's size ({}; its header could not be read: {e:#})", mb(file_bytes)),
        },
    }
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// Tensors by name with their sizes in the file, and where their data starts.
#[derive(Debug, Default)]
struct Tensors {
    data_start: u64,
    sizes: Vec<(String, u64)>,
}

fn estimate(t: &Tensors, file_bytes: u64) -> WeightsPerToken {
    let data = file_bytes.saturating_sub(t.data_start);
    let size = |name: &str| t.sizes.iter().find(|(n, _)| n == name).map(|(_, s)| *s);
    match (size(EMBEDDINGS), size(OUTPUT)) {
        (Some(embd), Some(_)) => WeightsPerToken {
            bytes: data - embd.min(data),
            how: format!(
                "the GGUF's tensor data ({}) less the token embeddings ({}), of which a token reads one row",
                mb(data),
                mb(embd)
            ),
        },
        (Some(_), None) => WeightsPerToken {
            bytes: data,
            how: format!(
                "the GGUF's tensor data ({}), token embeddings included: the model ties them to its output \
                 layer, which reads them whole every token",
                mb(data)
            ),
        },
        _ => WeightsPerToken {
            bytes: data,
            how: format!("the GGUF's tensor data ({}; no `{EMBEDDINGS}` tensor found)", mb(data)),
        },
    }
}

fn u32_of(r: &mut impl Read) -> Result<u32> {
    let mut b = [0; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn u64_of(r: &mut impl Read) -> Result<u64> {
    let mut b = [0; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn string_of(r: &mut impl Read) -> Result<String> {
    let len = u64_of(r)?;
    if len > 1 << 20 {
        bail!("a string of {len} bytes");
    }
    let mut b = vec![0; len as usize];
    r.read_exact(&mut b)?;
    Ok(String::from_utf8_lossy(&b).into_owned())
}

/// Skips one metadata value of GGUF type `ty`, returning it when it is an integer (for
/// `general.alignment`).
fn skip_value(r: &mut BufReader<File>, ty: u32) -> Result<Option<u64>> {
    let fixed = match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        8 => {
            let len = u64_of(r)?;
            r.seek_relative(i64::try_from(len)?)?;
            return Ok(None);
        }
        9 => {
            let (item, count) = (u32_of(r)?, u64_of(r)?);
            for _ in 0..count {
                skip_value(r, item)?;
            }
            return Ok(None);
        }
        other => bail!("unknown GGUF value type {other}"),
    };
    let mut b = [0; 8];
    r.read_exact(&mut b[..fixed])?;
    Ok(matches!(ty, 4 | 5 | 10 | 11).then(|| u64::from_le_bytes(b)))
}

fn read_tensors(model: &Path, file_bytes: u64) -> Result<Tensors> {
    let mut r = BufReader::with_capacity(1 << 16, File::open(model).context("opening")?);
    if u32_of(&mut r)? != u32::from_le_bytes(*b"GGUF") {
        bail!("not a GGUF file");
    }
    let version = u32_of(&mut r)?;
    if version < 2 {
        bail!("GGUF version {version}");
    }
    let (n_tensors, n_kv) = (u64_of(&mut r)?, u64_of(&mut r)?);
    let mut alignment = 32;
    for _ in 0..n_kv {
        let key = string_of(&mut r)?;
        let ty = u32_of(&mut r)?;
        let value = skip_value(&mut r, ty)?;
        if key == "general.alignment" {
            alignment = value.filter(|a| *a > 0).unwrap_or(alignment);
        }
    }
    let mut offsets = Vec::new();
    for _ in 0..n_tensors {
        let name = string_of(&mut r)?;
        let dims = u32_of(&mut r)?;
        for _ in 0..dims {
            u64_of(&mut r)?;
        }
        let _ty = u32_of(&mut r)?;
        offsets.push((name, u64_of(&mut r)?));
    }
    let data_start = r.stream_position()?.div_ceil(alignment) * alignment;
    // Each tensor runs to the next one's offset (its alignment padding included), the last to
    // the end of the file: no table of ggml's block sizes needed.
    let mut by_offset: Vec<usize> = (0..offsets.len()).collect();
    by_offset.sort_by_key(|&i| offsets[i].1);
    let data = file_bytes.saturating_sub(data_start);
    let mut sizes = vec![0; offsets.len()];
    for (k, &i) in by_offset.iter().enumerate() {
        let end = by_offset.get(k + 1).map_or(data, |&j| offsets[j].1);
        sizes[i] = end.saturating_sub(offsets[i].1);
    }
    Ok(Tensors { data_start, sizes: offsets.into_iter().map(|(n, _)| n).zip(sizes).collect() })
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    /// A GGUF v3 with a string, an array of strings and `general.alignment` in its metadata, and
    /// the tensors `(name, bytes)` one after the other.
    fn gguf(tensors: &[(&str, u64)]) -> tempfile::NamedTempFile {
        let mut h = b"GGUF".to_vec();
        h.extend(3u32.to_le_bytes());
        h.extend((tensors.len() as u64).to_le_bytes());
        h.extend(3u64.to_le_bytes());
        string(&mut h, "general.name");
        h.extend(8u32.to_le_bytes());
        string(&mut h, "tiny");
        string(&mut h, "tokenizer.ggml.tokens");
        h.extend(9u32.to_le_bytes());
        h.extend(8u32.to_le_bytes());
        h.extend(3u64.to_le_bytes());
        for t in ["a", "bb", "ccc"] {
            string(&mut h, t);
        }
        string(&mut h, "general.alignment");
        h.extend(4u32.to_le_bytes());
        h.extend(64u32.to_le_bytes());
        let mut offset = 0u64;
        for (name, bytes) in tensors {
            string(&mut h, name);
            h.extend(2u32.to_le_bytes());
            h.extend([4u64.to_le_bytes(), 8u64.to_le_bytes()].concat());
            h.extend(8u32.to_le_bytes());
            h.extend(offset.to_le_bytes());
            offset += bytes;
        }
        h.resize(h.len().div_ceil(64) * 64, 0);
        h.resize(h.len() + offset as usize, 7);
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&h).unwrap();
        f
    }

    #[test]
    fn a_separate_output_layer_leaves_the_embeddings_out() {
        let f = gguf(&[("token_embd.weight", 3000), ("blk.0.ffn_up.weight", 5000), ("output.weight", 2000)]);
        let w = weights_per_token(f.path());
        assert_eq!(w.bytes, 7000, "{w:?}");
        assert!(w.how.contains("less the token embeddings (0.0 MB)"), "{w:?}");
    }

    #[test]
    fn tied_embeddings_are_read_whole_as_the_output_layer() {
        let f = gguf(&[("blk.0.ffn_up.weight", 5000), ("token_embd.weight", 3000)]);
        let w = weights_per_token(f.path());
        assert_eq!(w.bytes, 8000, "{w:?}");
        assert!(w.how.contains("ties them to its output layer"), "{w:?}");
    }

    #[test]
    fn an_unreadable_header_falls_back_to_the_file_size_and_says_so() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(b"not a model at all").unwrap();
        let w = weights_per_token(f.path());
        assert_eq!(w.bytes, 18);
        assert!(w.how.starts_with("the GGUF file's size") && w.how.contains("not a GGUF file"), "{w:?}");
    }
}
