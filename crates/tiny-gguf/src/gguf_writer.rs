//! GGUF v3 encoding: metadata, F32 tensors, alignment. Shared by the model and projector writers,
//! and public for the server's model pull, which writes converted Hugging Face models with it
//! (`gantry-server`'s `models/pull/sentence_transformer/`).

/// GGUF metadata value types (subset used here).
pub const GGUF_TYPE_UINT32: u32 = 4;
pub const GGUF_TYPE_INT32: u32 = 5;
pub const GGUF_TYPE_FLOAT32: u32 = 6;
pub const GGUF_TYPE_BOOL: u32 = 7;
pub const GGUF_TYPE_STRING: u32 = 8;
pub const GGUF_TYPE_ARRAY: u32 = 9;

/// ggml tensor type F32.
pub const GGML_TYPE_F32: u32 = 0;

/// Tensor data alignment (`general.alignment`).
pub const ALIGNMENT: usize = 32;

/// The whole file: header, metadata, tensor infos, aligned tensor data.
pub fn assemble(kv: &KvWriter, tensors: &[Tensor]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(b"GGUF");
    put_u32(&mut out, 3);
    put_u64(&mut out, tensors.len() as u64);
    put_u64(&mut out, kv.count);
    out.extend_from_slice(&kv.buf);

    let mut offset = 0usize;
    for t in tensors {
        put_str(&mut out, &t.name);
        put_u32(&mut out, t.shape.len() as u32);
        for &d in &t.shape {
            put_u64(&mut out, d);
        }
        put_u32(&mut out, GGML_TYPE_F32);
        put_u64(&mut out, offset as u64);
        offset = pad_to(offset + t.data.len() * 4);
    }
    out.resize(pad_to(out.len()), 0);
    let data_start = out.len();
    for t in tensors {
        out.reserve(t.data.len() * 4);
        for v in &t.data {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.resize(data_start + pad_to(out.len() - data_start), 0);
    }
    out
}

fn pad_to(n: usize) -> usize {
    n.div_ceil(ALIGNMENT) * ALIGNMENT
}

// ---------------------------------------------------------------------------
// Tensors and PRNG
// ---------------------------------------------------------------------------

pub struct Tensor {
    pub name: String,
    /// GGUF order: `shape[0]` is the fastest-varying (row length) dimension.
    pub shape: Vec<u64>,
    pub data: Vec<f32>,
}

impl Tensor {
    pub(crate) fn random(name: &str, shape: &[u64], scale: f32, rng: &mut SplitMix64) -> Self {
        let n: u64 = shape.iter().product();
        let data = (0..n).map(|_| rng.next_symmetric() * scale).collect();
        Tensor { name: name.to_string(), shape: shape.to_vec(), data }
    }

    pub(crate) fn zeros(name: &str, shape: &[u64]) -> Self {
        let n: u64 = shape.iter().product();
        Tensor { name: name.to_string(), shape: shape.to_vec(), data: vec![0.0; n as usize] }
    }

    pub(crate) fn ones(name: &str, shape: &[u64]) -> Self {
        let n: u64 = shape.iter().product();
        Tensor { name: name.to_string(), shape: shape.to_vec(), data: vec![1.0; n as usize] }
    }
}

pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub(crate) fn next_symmetric(&mut self) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        unit * 2.0 - 1.0
    }
}

// ---------------------------------------------------------------------------
// GGUF encoding helpers
// ---------------------------------------------------------------------------

#[derive(Default)]
pub struct KvWriter {
    buf: Vec<u8>,
    count: u64,
}

impl KvWriter {
    fn key(&mut self, key: &str, ty: u32) {
        put_str(&mut self.buf, key);
        put_u32(&mut self.buf, ty);
        self.count += 1;
    }

    pub fn u32(&mut self, key: &str, v: u32) {
        self.key(key, GGUF_TYPE_UINT32);
        put_u32(&mut self.buf, v);
    }

    pub fn f32(&mut self, key: &str, v: f32) {
        self.key(key, GGUF_TYPE_FLOAT32);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn bool(&mut self, key: &str, v: bool) {
        self.key(key, GGUF_TYPE_BOOL);
        self.buf.push(u8::from(v));
    }

    pub fn string(&mut self, key: &str, v: &str) {
        self.key(key, GGUF_TYPE_STRING);
        put_str(&mut self.buf, v);
    }

    pub fn string_array(&mut self, key: &str, vs: &[String]) {
        self.key(key, GGUF_TYPE_ARRAY);
        put_u32(&mut self.buf, GGUF_TYPE_STRING);
        put_u64(&mut self.buf, vs.len() as u64);
        for v in vs {
            put_str(&mut self.buf, v);
        }
    }

    pub fn f32_array(&mut self, key: &str, vs: &[f32]) {
        self.key(key, GGUF_TYPE_ARRAY);
        put_u32(&mut self.buf, GGUF_TYPE_FLOAT32);
        put_u64(&mut self.buf, vs.len() as u64);
        for v in vs {
            self.buf.extend_from_slice(&v.to_le_bytes());
        }
    }

    pub fn i32_array(&mut self, key: &str, vs: &[i32]) {
        self.key(key, GGUF_TYPE_ARRAY);
        put_u32(&mut self.buf, GGUF_TYPE_INT32);
        put_u64(&mut self.buf, vs.len() as u64);
        for v in vs {
            self.buf.extend_from_slice(&v.to_le_bytes());
        }
    }
}

pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u64(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}
