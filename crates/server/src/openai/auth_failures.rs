//! Per-address budget of failed authentications. The memory of unknown keys in the accounts
//! layer catches one fake key repeated; a spray of distinct fake keys would still cost a
//! database query each, so an address that keeps presenting unknown keys is refused (429)
//! without a lookup until its budget refills.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Addresses tracked at once; beyond that the ones with a full budget are forgotten first.
const MAX_TRACKED: usize = 65_536;

#[derive(Clone, Debug)]
pub(crate) struct AuthFailures {
    /// Failures an address may have in a burst, refilled at this many per minute; 0 disables.
    per_minute: u32,
    buckets: Arc<Mutex<HashMap<IpAddr, Bucket>>>,
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
        Self { per_minute, buckets: Arc::default() }
    }

    /// Seconds until `ip` may try again, if it has used up its failures.
    pub(crate) fn blocked_for(&self, ip: IpAddr) -> Option<u64> {
        if self.per_minute == 0 {
            return None;
        }
        let mut buckets = self.buckets.lock().expect("auth failures lock");
        let bucket = buckets.get_mut(&bucket_key(ip))?;
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
        if buckets.len() >= MAX_TRACKED {
            let full = f64::from(self.per_minute);
            buckets.retain(|_, b| b.tokens + b.at.elapsed().as_secs_f64() * full / 60.0 < full);
            if buckets.len() >= MAX_TRACKED {
                buckets.clear();
            }
        }
        let full = f64::from(self.per_minute);
        let bucket = buckets.entry(bucket_key(ip)).or_insert(Bucket { tokens: full, at: Instant::now() });
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

/// IPv6 clients usually hold a whole /64, so one is one client.
fn bucket_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
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
}
