//! The type the KV cache stores its entries in (`--kv-type`): f16 as llama.cpp does by default,
//! or quantized to q8_0 (about half the bytes) or q4_0 (about a quarter), so the same memory holds
//! more sequences or longer contexts. A quantized V is read only through flash attention, which
//! llama.cpp then turns on by itself (its default policy, `auto`, which Gantry keeps); a model
//! whose head size is not a multiple of the block (32 values) fails to load with that type.
//!
//! K and V take the same type: llama.cpp also allows mixing them (`-ctk`/`-ctv`), but one knob is
//! what the quality measurement ([`super::quality`]) and the memory budget are stated for.

use std::fmt;
use std::str::FromStr;

use llama_cpp_2::context::params::KvCacheType;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvType {
    #[default]
    F16,
    Q8_0,
    Q4_0,
}

impl KvType {
    pub const ALL: [KvType; 3] = [KvType::F16, KvType::Q8_0, KvType::Q4_0];

    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }

    pub(crate) fn llama(self) -> KvCacheType {
        match self {
            KvType::F16 => KvCacheType::F16,
            KvType::Q8_0 => KvCacheType::Q8_0,
            KvType::Q4_0 => KvCacheType::Q4_0,
        }
    }

    /// Bytes of `values` K or V elements: q8_0 and q4_0 store blocks of 32 values with one f16
    /// scale each (34 and 18 bytes a block). Every KV row of a real model is a multiple of 32.
    pub fn bytes(self, values: u64) -> u64 {
        match self {
            KvType::F16 => values * 2,
            KvType::Q8_0 => values.div_ceil(32) * 34,
            KvType::Q4_0 => values.div_ceil(32) * 18,
        }
    }

    pub fn is_quantized(self) -> bool {
        self != KvType::F16
    }
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().to_ascii_lowercase();
        KvType::ALL.into_iter().find(|t| t.name() == wanted).ok_or_else(|| {
            let names: Vec<&str> = KvType::ALL.iter().map(|t| t.name()).collect();
            format!("unknown KV type {s:?}: one of {}", names.join(", "))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_ones_are_refused() {
        for t in KvType::ALL {
            assert_eq!(t.name().parse::<KvType>(), Ok(t));
            assert_eq!(t.name().to_uppercase().parse::<KvType>(), Ok(t));
        }
        let err = "q5_1".parse::<KvType>().unwrap_err();
        assert!(err.contains("f16, q8_0, q4_0"), "{err}");
    }

    #[test]
    fn quantized_types_take_their_block_bytes() {
        // A Qwen2.5-0.5B KV row: 2 KV heads of 64.
        assert_eq!(KvType::F16.bytes(128), 256);
        assert_eq!(KvType::Q8_0.bytes(128), 4 * 34);
        assert_eq!(KvType::Q4_0.bytes(128), 4 * 18);
        assert!(!KvType::F16.is_quantized() && KvType::Q8_0.is_quantized() && KvType::Q4_0.is_quantized());
    }
}
