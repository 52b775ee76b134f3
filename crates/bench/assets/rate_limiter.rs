//! A token-bucket rate limiter keyed by client id, with a sliding report of refusals.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// One client's bucket: up to `capacity` tokens, refilled at `rate` tokens per second.
#[derive(Debug, Clone)]
pub struct Bucket {
    capacity: f64,
    rate: f64,
    tokens: f64,
    updated: Instant,
}

impl Bucket {
    pub fn new(capacity: f64, rate: f64, now: Instant) -> Self {
        Bucket { capacity, rate, tokens: capacity, updated: now }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.capacity);
        self.updated = now;
    }

    /// Takes `cost` tokens if they are there; otherwise says how long until they will be.
    pub fn take(&mut self, cost: f64, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        if self.tokens >= cost {
            self.tokens -= cost;
            Ok(())
        } else {
            let missing = cost - self.tokens;
            Err(Duration::from_secs_f64(missing / self.rate))
        }
    }
}

/// Buckets per client, created on first use with the default settings.
pub struct Limiter {
    capacity: f64,
    rate: f64,
    buckets: HashMap<String, Bucket>,
    refused: Vec<(String, Instant)>,
}

impl Limiter {
    pub fn new(capacity: f64, rate: f64) -> Self {
        Limiter { capacity, rate, buckets: HashMap::new(), refused: Vec::new() }
    }

    pub fn check(&mut self, client: &str, cost: f64, now: Instant) -> Result<(), Duration> {
        let (capacity, rate) = (self.capacity, self.rate);
        let bucket = self
            .buckets
            .entry(client.to_string())
            .or_insert_with(|| Bucket::new(capacity, rate, now));
        let result = bucket.take(cost, now);
        if result.is_err() {
            self.refused.push((client.to_string(), now));
        }
        result
    }

    /// Refusals per client within `window` before `now`, busiest first.
    pub fn refusals(&self, window: Duration, now: Instant) -> Vec<(String, usize)> {
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for (client, at) in &self.refused {
            if now.saturating_duration_since(*at) <= window {
                *counts.entry(client.as_str()).or_default() += 1;
            }
        }
        let mut out: Vec<(String, usize)> = counts.into_iter().map(|(c, n)| (c.to_string(), n)).collect();
        out.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        out
    }

    /// Drops buckets that are full again: they behave exactly like new ones.
    pub fn prune(&mut self, now: Instant) {
        self.buckets.retain(|_, bucket| {
            bucket.refill(now);
            bucket.tokens < bucket.capacity
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_when_empty_and_refills() {
        let start = Instant::now();
        let mut limiter = Limiter::new(2.0, 1.0);
        assert!(limiter.check("a", 2.0, start).is_ok());
        assert!(limiter.check("a", 1.0, start).is_err());
        assert!(limiter.check("a", 1.0, start + Duration::from_secs(1)).is_ok());
        assert_eq!(limiter.refusals(Duration::from_secs(5), start), vec![("a".to_string(), 1)]);
    }
}
