//! Twins: a model's weights rewritten once into types the CPU multiplies faster, and loaded in
//! place of the file.
//!
//! llama.cpp loads a model only from a file, so a twin is written once into a cache folder and
//! reused while the source file keeps its size and modification time. Each conversion says which
//! tensors it takes and how one tensor's bytes become the twin's:
//! - [`q5_as_q8`]: Q5_0 matrices as Q8_0, the same values (chat and every other model);
//! - [`f32_as_bf16`]: an embedding model's F32 matrices as BF16, where the CPU has BF16 dot
//!   products.
//!
//! A twin that cannot be written is logged and the file is served as it is, only slower.

pub(crate) mod f32_as_bf16;
pub(crate) mod q5_as_q8;

use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use llama_cpp_sys_2::ggml_type;

use crate::model::gguf_header::Header;

/// One way of rewriting tensors.
pub(crate) struct Conversion {
    /// Names the twin's file (with the conversion's version, bumped whenever the written file
    /// would differ, so stale twins are not reused) and the log lines.
    pub tag: &'static str,
    pub to: ggml_type,
    /// The tensors of a model it rewrites.
    pub plan: fn(&Path) -> Option<Plan>,
    /// One tensor's bytes as the twin's type; `None` when they are not whole blocks.
    pub convert: fn(&[u8]) -> Option<Vec<u8>>,
}

/// The tensors a model's twin rewrites.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub tensors: Vec<i64>,
    /// The rewritten tensors' bytes in the source and in the twin (before alignment padding).
    pub source_bytes: u64,
    pub twin_bytes: u64,
}

impl Plan {
    /// The twin's size less the source's: what serving it costs (or saves) in memory.
    pub(crate) fn growth(&self) -> i64 {
        self.twin_bytes as i64 - self.source_bytes as i64
    }
}

/// The file to load for `model`: its twin in `dir` under `conversion` (written now if it is not
/// there yet), or `model` itself when there is nothing to convert or the twin cannot be written.
pub(crate) fn weights_to_load(model: &Path, dir: &Path, conversion: &Conversion) -> PathBuf {
    let Some(plan) = (conversion.plan)(model).filter(|p| !p.tensors.is_empty()) else { return model.to_path_buf() };
    let tag = conversion.tag;
    let twin = match twin_path(model, dir, tag) {
        Ok(twin) => twin,
        Err(e) => {
            tracing::warn!(model = %model.display(), error = %e, tag, "cannot name the twin; serving the file as it is");
            return model.to_path_buf();
        }
    };
    if twin.is_file() {
        tracing::info!(twin = %twin.display(), tensors = plan.tensors.len(), tag, "weights served from their twin (converted earlier)");
        return twin;
    }
    let started = Instant::now();
    match write_twin(model, &twin, &plan, conversion) {
        Ok(()) => {
            tracing::info!(
                twin = %twin.display(),
                tensors = plan.tensors.len(),
                growth_mib = plan.growth() >> 20,
                seconds = format!("{:.1}", started.elapsed().as_secs_f64()),
                tag,
                "weights served from their twin"
            );
            twin
        }
        Err(e) => {
            tracing::warn!(model = %model.display(), twin = %twin.display(), error = %e, tag, "could not write the twin; serving the file as it is");
            model.to_path_buf()
        }
    }
}

/// Where `model`'s twin lives in `dir`: named after the file, its size and modification time.
fn twin_path(model: &Path, dir: &Path, tag: &str) -> std::io::Result<PathBuf> {
    let meta = std::fs::metadata(model)?;
    let mtime = meta.modified()?.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let stem = model.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    Ok(dir.join(format!("{stem}.{:x}-{mtime:x}.{tag}.gguf", meta.len())))
}

/// Writes the twin under a temporary name first and renames it into place, so a half-written
/// file (disk full, killed) is never taken for a twin; two servers converting at once each
/// write their own and the last rename wins.
fn write_twin(model: &Path, twin: &Path, plan: &Plan, conversion: &Conversion) -> std::io::Result<()> {
    let dir = twin.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp =
        dir.join(format!(".{}.{}.partial", twin.file_name().unwrap_or_default().to_string_lossy(), std::process::id()));
    let result = convert(model, &tmp, plan, conversion).and_then(|()| std::fs::rename(&tmp, twin));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Writes `model`'s twin to `out`: the header with the planned tensors' types changed, then
/// every tensor's data, converted or copied, where the new header puts it.
fn convert(model: &Path, out: &Path, plan: &Plan, conversion: &Conversion) -> std::io::Result<()> {
    let invalid =
        |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {what}", model.display()));
    let mut header = Header::open(model).ok_or_else(|| invalid("not a readable GGUF file"))?;
    let n = header.n_tensors();
    // The source spans before the types change (ggml then moves the later offsets).
    let sources: Vec<(u64, u64)> = (0..n).map(|id| header.tensor_span(id)).collect();
    for &id in &plan.tensors {
        header.set_tensor_type(id, conversion.to);
    }
    let meta = header.meta_bytes();
    let mut src = File::open(model)?;
    let mut dst = BufWriter::with_capacity(1 << 20, File::create(out)?);
    dst.write_all(&meta)?;
    let mut written = meta.len() as u64;
    let mut buf = Vec::new();
    for id in 0..n {
        let (start, len) = sources[usize::try_from(id).expect("tensor ids count from 0")];
        let (offset, target_len) = header.tensor_in_data(id);
        let target = meta.len() as u64 + offset;
        if target < written {
            return Err(invalid("tensor data out of order"));
        }
        std::io::copy(&mut std::io::repeat(0).take(target - written), &mut dst)?;
        src.seek(SeekFrom::Start(start))?;
        buf.resize(usize::try_from(len).expect("a tensor fits in memory"), 0);
        src.read_exact(&mut buf)?;
        if plan.tensors.contains(&id) {
            let converted = (conversion.convert)(&buf)
                .filter(|c| c.len() as u64 == target_len)
                .ok_or_else(|| invalid(&format!("tensor {} has an unexpected length", header.tensor_name(id))))?;
            dst.write_all(&converted)?;
        } else {
            dst.write_all(&buf)?;
        }
        written = target + target_len;
    }
    dst.into_inner().map_err(|e| e.into_error())?.sync_all()
}
