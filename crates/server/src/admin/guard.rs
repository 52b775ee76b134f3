//! What stands between a network attacker and the admin API: a token strong enough that guessing
//! it is hopeless, compared without leaking how much of a guess was right, and a per-address
//! limit on wrong guesses so nobody can try many at all.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Shortest admin token accepted: 32 random hex characters are 128 bits.
pub(crate) const MIN_TOKEN_CHARS: usize = 32;

/// Fewest different characters a token must use; placeholders made by repeating a word or a
/// character (`adminadmin…`, `xxxx…`) have far fewer.
const MIN_DISTINCT_CHARS: usize = 10;

/// Fragments of the placeholders people paste from examples (this repository's included),
/// compared lowercase with everything but letters and digits removed.
const PLACEHOLDER_MARKERS: &[&str] = &[
    "changeme",
    "placeholder",
    "replaceme",
    "replacethis",
    "yourtoken",
    "youradmintoken",
    "yoursecret",
    "example",
    "insertyour",
    "putyour",
    "qwerty",
    "letmein",
    "password",
];

/// Why `gantry serve` refuses an admin token; the message names the flag and how to make a good
/// token, never the token itself (it would end up in logs).
pub(crate) fn check_token_strength(token: &str) -> Result<(), String> {
    let why = weakness(token);
    match why {
        None => Ok(()),
        Some(why) => Err(format!(
            "--admin-token (GANTRY_ADMIN_TOKEN) is too weak: {why}. Use at least {MIN_TOKEN_CHARS} random characters, \
             for example: --admin-token \"$(openssl rand -hex 32)\""
        )),
    }
}

fn weakness(token: &str) -> Option<String> {
    let chars: Vec<char> = token.chars().collect();
    if chars.len() < MIN_TOKEN_CHARS {
        return Some(format!("it has {} characters, fewer than {MIN_TOKEN_CHARS}", chars.len()));
    }
    let normalized: String =
        token.chars().filter(char::is_ascii_alphanumeric).map(|c| c.to_ascii_lowercase()).collect();
    if let Some(marker) = PLACEHOLDER_MARKERS.iter().find(|m| normalized.contains(*m)) {
        return Some(format!("it contains the placeholder word {marker:?}"));
    }
    let mut distinct = chars.clone();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() < MIN_DISTINCT_CHARS {
        return Some(format!("it uses only {} different characters (a repeated word or character)", distinct.len()));
    }
    // Runs like `0123456789…`, `abcdef…` or `aaaa…`: a random token rarely has one character
    // followed by the same or the next one (about 2 in 16 for hex), a sequence almost always.
    let steps = chars.windows(2).filter(|w| w[1] as u32 == w[0] as u32 || w[1] as u32 == w[0] as u32 + 1).count();
    if steps * 2 > chars.len() {
        return Some("it is mostly a run of consecutive or repeated characters".into());
    }
    None
}

/// Compares a presented token with the configured one in time that depends on neither: both are
/// hashed first, so even their lengths do not show in how long the comparison takes.
pub(crate) fn token_matches(presented: &str, configured: &str) -> bool {
    let (a, b) = (Sha256::digest(presented.as_bytes()), Sha256::digest(configured.as_bytes()));
    a.ct_eq(&b).into()
}

/// Wrong admin tokens one client address may present within [`FAILURE_WINDOW`] before it is
/// locked out.
pub(crate) const MAX_FAILURES: u32 = 5;
/// How far back failures count towards [`MAX_FAILURES`].
pub(crate) const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// How long a locked-out address gets 429 on every admin request, right token or not.
pub(crate) const LOCKOUT: Duration = Duration::from_secs(300);
/// Addresses remembered at once; beyond that the one whose last failure is oldest is forgotten,
/// so an attacker with many addresses cannot grow this table without bound.
const MAX_TRACKED: usize = 4096;

#[derive(Clone, Copy)]
struct Failures {
    count: u32,
    window_start: Instant,
    last: Instant,
    locked_until: Option<Instant>,
}

/// Failed admin authentications by client address (IPv6 by /64, what one host usually holds).
/// Times are passed in, so tests can step a clock of their own.
#[derive(Default)]
pub(crate) struct FailureThrottle {
    by_addr: Mutex<HashMap<IpAddr, Failures>>,
}

impl FailureThrottle {
    /// `Some(wait)` while `addr` is locked out.
    pub(crate) fn locked_for(&self, addr: IpAddr, now: Instant) -> Option<Duration> {
        let table = self.by_addr.lock().unwrap();
        let until = table.get(&bucket(addr))?.locked_until?;
        (until > now).then(|| until - now)
    }

    /// Counts a wrong token; returns the lockout it started, if this one was one too many.
    pub(crate) fn failed(&self, addr: IpAddr, now: Instant) -> Option<Duration> {
        let mut table = self.by_addr.lock().unwrap();
        let key = bucket(addr);
        if !table.contains_key(&key) && table.len() >= MAX_TRACKED {
            make_room(&mut table, now);
        }
        let fresh = Failures { count: 0, window_start: now, last: now, locked_until: None };
        let entry = table.entry(key).or_insert(fresh);
        if now.duration_since(entry.window_start) > FAILURE_WINDOW {
            *entry = fresh;
        }
        entry.count += 1;
        entry.last = now;
        if entry.count >= MAX_FAILURES {
            entry.count = 0;
            entry.window_start = now;
            entry.locked_until = Some(now + LOCKOUT);
            return Some(LOCKOUT);
        }
        None
    }

    /// A right token clears the address's failures.
    pub(crate) fn succeeded(&self, addr: IpAddr) {
        self.by_addr.lock().unwrap().remove(&bucket(addr));
    }
}

/// Drops what no longer matters (no lockout running, window over); if that frees nothing, the
/// address whose last failure is oldest.
fn make_room(table: &mut HashMap<IpAddr, Failures>, now: Instant) {
    table.retain(|_, f| {
        f.locked_until.is_some_and(|until| until > now) || now.duration_since(f.window_start) <= FAILURE_WINDOW
    });
    if table.len() >= MAX_TRACKED {
        if let Some(oldest) = table.iter().min_by_key(|(_, f)| f.last).map(|(addr, _)| *addr) {
            table.remove(&oldest);
        }
    }
}

fn bucket(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_placeholder_tokens_are_refused() {
        for weak in [
            "",
            "changeme",
            "admin",
            "password",
            "secret",
            "change-me-admin-token",
            "PLACEHOLDER-ADMIN-TOKEN",
            "TOKEN",
            "admin-secret-0123456789",
            "change-me-admin-token-but-long-enough-now",
            "PLACEHOLDER-ADMIN-TOKEN-1234567890abcdef",
            "my-super-Password-that-is-long-enough-1",
            "adminadminadminadminadminadminadmin",
            "secretsecretsecretsecretsecretsecret",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            "0000000000000000000000000000000000000001",
            "0123456789012345678901234567890123456789",
            "abcdefghijklmnopqrstuvwxyzabcdefghijklmn",
        ] {
            let err = check_token_strength(weak).expect_err(weak);
            assert!(err.starts_with("--admin-token (GANTRY_ADMIN_TOKEN) is too weak"), "{err}");
            assert!(weak.len() < 8 || !err.contains(weak), "the message must not repeat the token: {err}");
        }
    }

    #[test]
    fn random_tokens_are_accepted() {
        for strong in [
            "3f9c1e7a5b2d4086a9e7c3f1b2d5e8a06c4b1f9e2d7a5c3b8e1f4a6d9c2b7e05", // openssl rand -hex 32
            "q7V2mX9pL4sN8kR1wT6yB3cZ5hJ0dF2g",                                 // 32 base62 characters
            "gantry-test-admin-7c1e94b2f05a3d68e9b1c47a",
        ] {
            assert_eq!(check_token_strength(strong), Ok(()), "{strong}");
        }
    }

    #[test]
    fn tokens_match_only_when_equal() {
        let token = "3f9c1e7a5b2d4086a9e7c3f1b2d5e8a0";
        assert!(token_matches(token, token));
        assert!(!token_matches("3f9c1e7a5b2d4086a9e7c3f1b2d5e8a1", token));
        assert!(!token_matches("3f9c1e7a", token), "a prefix is not the token");
        assert!(!token_matches("", token));
    }

    #[test]
    fn an_address_is_locked_out_after_too_many_failures_and_only_it() {
        let throttle = FailureThrottle::default();
        let (attacker, other): (IpAddr, IpAddr) = ("203.0.113.7".parse().unwrap(), "198.51.100.2".parse().unwrap());
        let t0 = Instant::now();
        for i in 1..MAX_FAILURES {
            assert_eq!(throttle.failed(attacker, t0), None, "failure {i} is still allowed");
            assert_eq!(throttle.locked_for(attacker, t0), None);
        }
        assert_eq!(throttle.failed(attacker, t0), Some(LOCKOUT));
        assert_eq!(throttle.locked_for(attacker, t0), Some(LOCKOUT));
        assert_eq!(throttle.locked_for(other, t0), None);
        let later = t0 + LOCKOUT - Duration::from_secs(1);
        assert_eq!(throttle.locked_for(attacker, later), Some(Duration::from_secs(1)));
        assert_eq!(throttle.locked_for(attacker, t0 + LOCKOUT), None, "the lockout ends");
    }

    #[test]
    fn failures_spread_beyond_the_window_do_not_lock_out() {
        let throttle = FailureThrottle::default();
        let addr: IpAddr = "203.0.113.7".parse().unwrap();
        let mut now = Instant::now();
        for _ in 0..3 * MAX_FAILURES {
            assert_eq!(throttle.failed(addr, now), None);
            now += FAILURE_WINDOW / (MAX_FAILURES - 1) + Duration::from_secs(1);
        }
    }

    #[test]
    fn a_right_token_clears_the_failures() {
        let throttle = FailureThrottle::default();
        let addr: IpAddr = "203.0.113.7".parse().unwrap();
        let now = Instant::now();
        for _ in 1..MAX_FAILURES {
            throttle.failed(addr, now);
        }
        throttle.succeeded(addr);
        assert_eq!(throttle.failed(addr, now), None);
    }

    #[test]
    fn one_ipv6_host_is_one_address_and_the_table_stays_bounded() {
        let throttle = FailureThrottle::default();
        let now = Instant::now();
        for i in 0..MAX_FAILURES {
            throttle.failed(format!("2001:db8:1:2::{i:x}").parse().unwrap(), now);
        }
        assert!(throttle.locked_for("2001:db8:1:2:ffff::1".parse().unwrap(), now).is_some());
        assert!(throttle.locked_for("2001:db8:1:3::1".parse().unwrap(), now).is_none());
        for i in 0..(MAX_TRACKED as u32 + 100) {
            throttle.failed(IpAddr::V4(i.into()), now);
        }
        assert!(throttle.by_addr.lock().unwrap().len() <= MAX_TRACKED);
    }
}
