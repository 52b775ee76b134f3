//! Per-address budget of failed authentications. The memory of unknown keys in the accounts
//! layer catches one fake key repeated; a spray of distinct fake keys would still cost a
//! database query each, so an address that keeps presenting unknown keys is refused (429)
//! without a lookup until its budget refills.
//!
//! The table is bounded: past [`MAX_TRACKED`] addresses, the one whose failure is the oldest is
//! forgotten. Its bucket has refilled whole once a minute passed without a failure, so nothing
//! is lost unless that many addresses failed within the last minute; then the oldest of them
//! starts afresh, while every more recent address stays blocked.

use std::net::IpAddr;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lru::LruCache;

use crate::client_addr::address_group;

/// Addresses tracked at once; beyond that the least recently failed one is forgotten.
const MAX_TRACKED: usize = 65_536;

#[derive(Clone, Debug)]
pub(crate) struct AuthFailures {
    /// Failures an address may have in a burst, refilled at this many per minute; 0 disables.
    per_minute: u32,
    buckets: Arc<Mutex<LruCache<IpAddr, Bucket>>>,
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Default for AuthFailures {
    fn default() -> Self {
        Self::new(DEFAULT_AUTH_FAILURES_PER_MINUTE)
    }
}

pub(crate) const DEFAULT_AUTH_FAILURES_PER_MINUTE: u32 = 60;

impl AuthFailures {
    pub(crate) fn new(per_minute: u32) -> Self {
        let capacity = NonZeroUsize::new(MAX_TRACKED).expect("MAX_TRACKED is not 0");
        Self { per_minute, buckets: Arc::new(Mutex::new(LruCache::new(capacity))) }
    }

    /// Seconds until `ip` may try again, if it has used up its failures.
    pub(crate) fn blocked_for(&self, ip: IpAddr) -> Option<u64> {
        if self.per_minute == 0 {
            return None;
        }
        let mut buckets = self.buckets.lock().expect("auth failures lock");
        // A look that does not count as a failure leaves the address's place in the order.
        let bucket = buckets.peek_mut(&address_group(ip))?;
        self.refill(bucket);
        (bucket.tokens < 1.0)
            .then(|| ((1.0 - bucket.tokens) * 60.0 / f64::from(self.per_minute)).ceil().max(1.0) as u64)
    }

    /// Counts one failed authentication from `ip`.
    pub(crate) fn record(&self, ip: IpAddr) {
        if self.per_minute == 0 {
            return;
        }
        let mut buckets = self.buckets.lock().expect("auth failures lock");
        let full = f64::from(self.per_minute);
        // A full table forgets its least recently failed address (see the module's header).
        let bucket = buckets.get_or_insert_mut(address_group(ip), || Bucket { tokens: full, at: Instant::now() });
        self.refill(bucket);
        bucket.tokens = (bucket.tokens - 1.0).max(0.0);
    }

    fn refill(&self, bucket: &mut Bucket) {
        let full = f64::from(self.per_minute);
        let now = Instant::now();
        let gained = now.duration_since(bucket.at).as_secs_f64() * full / Duration::from_secs(60).as_secs_f64();
        bucket.tokens = (bucket.tokens + gained).min(full);
        bucket.at = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_blocked_after_its_burst_and_others_are_not() {
        let failures = AuthFailures::new(3);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        for _ in 0..3 {
            assert_eq!(failures.blocked_for(a), None);
            failures.record(a);
        }
        let wait = failures.blocked_for(a).expect("blocked after 3 failures");
        assert!((1..=20).contains(&wait), "{wait}");
        assert_eq!(failures.blocked_for(b), None);
        assert_eq!(AuthFailures::new(0).blocked_for(a), None);
    }

    #[test]
    fn ipv6_addresses_of_one_slash_64_share_a_budget() {
        let failures = AuthFailures::new(1);
        failures.record("2001:db8:1:2::1".parse().unwrap());
        assert!(failures.blocked_for("2001:db8:1:2::ffff".parse().unwrap()).is_some());
        assert!(failures.blocked_for("2001:db8:1:3::1".parse().unwrap()).is_none());
    }

    fn nth_address(i: usize) -> IpAddr {
        IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i as u32))
    }

    #[test]
    fn a_full_table_forgets_only_its_oldest_address() {
        let failures = AuthFailures::new(1);
        for i in 0..=MAX_TRACKED {
            failures.record(nth_address(i));
        }
        // One address too many: the first is forgotten, every later one is still blocked.
        assert_eq!(failures.blocked_for(nth_address(0)), None);
        for i in [1, 2, MAX_TRACKED / 2, MAX_TRACKED] {
            assert!(failures.blocked_for(nth_address(i)).is_some(), "address {i} was forgotten");
        }
    }
}
