//! The KV cache: which tokens each sequence's cells hold ([`slots`], the mirror of llama.cpp's
//! cells that prefix reuse reads), idle sequences kept in host memory ([`host_cache`]), the layout
//! of the KV streams ([`layout`]) and the scope within which cached entries may be shared
//! ([`scope`]).

pub(crate) mod host_cache;
pub(crate) mod layout;
pub(crate) mod scope;
pub(crate) mod slots;
