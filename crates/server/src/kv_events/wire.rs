//! KV-cache events on the wire as vLLM sends them and llm-d's KV-cache indexer reads them: a ZMQ
//! message of three frames, `[topic, sequence (8 bytes, big-endian), payload]`, the payload a
//! msgpack array `[ts, [event, ...], data_parallel_rank]` whose events are tagged arrays:
//!
//! - `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
//!   lora_name, extra_keys]`
//! - `["BlockRemoved", block_hashes, medium]`
//! - `["AllBlocksCleared"]`
//!
//! The indexer recomputes its own keys from the token ids, the topic's model and each block's
//! `extra_keys`, in which a bare string taints the block's key (it reads it as a multimodal
//! item's id). A block of a scoped cache (`tenant` or `key`) carries its scope as such a string,
//! [`scope_tag`], so it never matches a request whose key lacks that scope: a router that knows
//! nothing of scopes routes only on `shared` blocks, which go plain.

use gantry_engine::{CacheScope, KvBlockEvent, Medium, KV_EVENT_BLOCK_TOKENS};
use serde::Serialize;

/// Where blocks live, in vLLM's names: "GPU" the engine's KV cache (llama.cpp's cells, on a GPU
/// or in host memory as the build has it), "CPU" the host cache of idle sequences
/// (`--cache-ram`), vLLM's offloading tier, which a request gets back by a copy.
pub(crate) fn medium(medium: Medium) -> &'static str {
    match medium {
        Medium::Gpu => "GPU",
        Medium::Cpu => "CPU",
    }
}

/// The `extra_keys` string of the blocks of a scoped cache; the shared scope has none.
pub(crate) fn scope_tag(scope: CacheScope) -> Option<String> {
    (scope.0 != gantry_accounts::SHARED_CACHE_SCOPE).then(|| format!("gantry-cache-scope:{:016x}", scope.0))
}

/// `kv@<pod>@<model>`, the topic llm-d splits into the pod and the model its keys hash.
pub(crate) fn topic(pod: &str, model: &str) -> String {
    format!("kv@{pod}@{model}")
}

/// One event as an array; untagged, so each variant is its fields alone.
#[derive(Serialize)]
#[serde(untagged)]
enum WireEvent<'a> {
    Stored(
        &'static str,
        &'a [u64],
        Option<u64>,
        &'a [i32],
        usize,
        Option<u32>,
        &'static str,
        Option<&'a str>,
        Option<Vec<Vec<String>>>,
    ),
    Removed(&'static str, &'a [u64], &'static str),
    Cleared((&'static str,)),
}

impl<'a> WireEvent<'a> {
    fn of(event: &'a KvBlockEvent) -> Self {
        match event {
            KvBlockEvent::Stored { hashes, parent, tokens, scope, medium: m } => {
                let extra_keys = scope_tag(*scope).map(|tag| vec![vec![tag]; hashes.len()]);
                let (block, m) = (KV_EVENT_BLOCK_TOKENS, medium(*m));
                WireEvent::Stored("BlockStored", hashes, *parent, tokens, block, None, m, None, extra_keys)
            }
            KvBlockEvent::Removed { hashes, medium: m } => WireEvent::Removed("BlockRemoved", hashes, medium(*m)),
            KvBlockEvent::AllCleared => WireEvent::Cleared(("AllBlocksCleared",)),
        }
    }
}

/// The msgpack payload of `events`, stamped `ts` (seconds since the epoch).
pub(crate) fn payload(ts: f64, events: &[&KvBlockEvent]) -> Vec<u8> {
    let events: Vec<WireEvent<'_>> = events.iter().map(|e| WireEvent::of(e)).collect();
    // Data-parallel rank 0: one engine per model, as vLLM without data parallelism.
    rmp_serde::to_vec(&(ts, events, 0u32)).expect("msgpack of plain values cannot fail")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmpv::Value;

    fn decoded(bytes: &[u8]) -> Value {
        rmpv::decode::read_value(&mut &bytes[..]).unwrap()
    }

    fn ints(values: &[i64]) -> Value {
        Value::Array(values.iter().map(|&v| Value::from(v)).collect())
    }

    #[test]
    fn a_batch_is_the_array_vllm_sends() {
        let tokens: Vec<i32> = (0..64).collect();
        let stored = KvBlockEvent::Stored {
            hashes: vec![7],
            parent: Some(5),
            tokens,
            scope: CacheScope(0),
            medium: Medium::Gpu,
        };
        let removed = KvBlockEvent::Removed { hashes: vec![u64::MAX, 3], medium: Medium::Cpu };
        let bytes = payload(1.5, &[&stored, &removed, &KvBlockEvent::AllCleared]);
        let expected = Value::Array(vec![
            Value::F64(1.5),
            Value::Array(vec![
                Value::Array(vec![
                    "BlockStored".into(),
                    ints(&[7]),
                    5.into(),
                    ints(&(0..64).collect::<Vec<_>>()),
                    64.into(),
                    Value::Nil,
                    "GPU".into(),
                    Value::Nil,
                    Value::Nil,
                ]),
                Value::Array(vec!["BlockRemoved".into(), Value::Array(vec![u64::MAX.into(), 3.into()]), "CPU".into()]),
                Value::Array(vec!["AllBlocksCleared".into()]),
            ]),
            0.into(),
        ]);
        assert_eq!(decoded(&bytes), expected);
    }

    #[test]
    fn scoped_blocks_carry_their_scope_in_each_blocks_extra_keys() {
        let (tokens, scope, medium) = (vec![0; 128], CacheScope(0xab), Medium::Cpu);
        let stored = KvBlockEvent::Stored { hashes: vec![1, 2], parent: None, tokens, scope, medium };
        let Value::Array(batch) = decoded(&payload(0.0, &[&stored])) else { panic!() };
        let Value::Array(events) = &batch[1] else { panic!() };
        let Value::Array(fields) = &events[0] else { panic!() };
        let tag = Value::from("gantry-cache-scope:00000000000000ab");
        assert_eq!((&fields[2], &fields[6]), (&Value::Nil, &Value::from("CPU")), "no parent, in host memory");
        assert_eq!(fields[8], Value::Array(vec![Value::Array(vec![tag.clone()]), Value::Array(vec![tag])]));
        assert_eq!(scope_tag(CacheScope(0)), None);
    }

    #[test]
    fn the_topic_names_the_pod_and_the_model() {
        assert_eq!(topic("10.1.2.3", "qwen"), "kv@10.1.2.3@qwen");
    }
}
