//! Identities in the prefix cache that clients cannot compute: SipHash under a key drawn once per
//! process. With an unkeyed hash, anyone can hash candidate inputs offline and craft one that
//! collides with another client's cached entry (an image standing in for another tenant's
//! image); with a secret key a collision is a 2^-64 accident.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash};
use std::sync::OnceLock;

/// `value` hashed under this process's secret key: equal values give equal hashes in this
/// process only.
pub(crate) fn keyed_hash(value: impl Hash) -> u64 {
    static KEY: OnceLock<RandomState> = OnceLock::new();
    KEY.get_or_init(RandomState::new).hash_one(value)
}

#[cfg(test)]
mod tests {
    use std::hash::{DefaultHasher, Hash, Hasher};

    use super::*;

    #[test]
    fn equal_values_match_and_the_hash_is_not_the_public_unkeyed_one() {
        let value = (3u32, 4u32, vec![1u8, 2, 3]);
        assert_eq!(keyed_hash(&value), keyed_hash(&value));
        assert_ne!(keyed_hash(&value), keyed_hash((3u32, 4u32, vec![1u8, 2, 4])));
        // `DefaultHasher::new()` is SipHash under the fixed zero key: anyone can compute it.
        let mut unkeyed = DefaultHasher::new();
        value.hash(&mut unkeyed);
        assert_ne!(keyed_hash(&value), unkeyed.finish());
    }
}
