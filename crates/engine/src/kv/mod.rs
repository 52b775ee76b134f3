//! The KV cache: [`cache`] is its one owner, which every change to llama.cpp's cells goes
//! through; [`slots`] mirrors which tokens each sequence's cells hold (what prefix reuse reads),
//! [`host_cache`] keeps idle sequences in host memory, [`layout`] says how the KV streams lie,
//! [`kv_type`] what type their entries are stored in (and [`quality`] what a quantized one costs),
//! [`scope`] within which cached entries may be shared, and [`blocks`] the virtual blocks
//! announced to a prefix-aware router.

pub(crate) mod blocks;
pub(crate) mod cache;
pub(crate) mod host_cache;
pub(crate) mod kv_type;
pub(crate) mod layout;
pub(crate) mod quality;
pub(crate) mod scope;
pub(crate) mod seq_id;
pub(crate) mod slots;
pub(crate) mod ubatches;
