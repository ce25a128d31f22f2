//! Per-source token buckets for the bootstrap listener. Bootstrap answers unauthenticated
//! callers and each call costs a TokenReview on the API server, so every source address gets a
//! small budget. Memory is bounded: at most `max_sources` buckets are kept; a full bucket is
//! the same as a fresh one and goes first, then the least recently used.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Instant;

/// How many bootstrap calls a source may make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Calls a source may make at once.
    pub burst: u32,
    /// Calls a source regains per minute, up to `burst`.
    pub per_minute: u32,
    /// Sources tracked at once.
    pub max_sources: usize,
}

impl Default for RateLimit {
    /// A proxy bootstraps at start, at half its SVID's life and after repeated stream failures:
    /// a few calls an hour. Ten at once and one a second more leave room for restarts and
    /// retries, and keep one source to a trickle of TokenReviews.
    fn default() -> Self {
        Self {
            burst: 10,
            per_minute: 60,
            max_sources: 4096,
        }
    }
}

/// What a limit is keyed by. IPv6 clients usually control a whole /64, so that is one source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    V4([u8; 4]),
    V6Prefix([u8; 8]),
    /// No peer address (not over TCP): one shared bucket.
    Unknown,
}

impl From<Option<IpAddr>> for Source {
    fn from(ip: Option<IpAddr>) -> Self {
        match ip.map(|ip| ip.to_canonical()) {
            Some(IpAddr::V4(v4)) => Self::V4(v4.octets()),
            Some(IpAddr::V6(v6)) => {
                let mut prefix = [0u8; 8];
                prefix.copy_from_slice(&v6.octets()[..8]);
                Self::V6Prefix(prefix)
            }
            None => Self::Unknown,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

#[derive(Debug)]
pub struct RateLimiter {
    limit: RateLimit,
    buckets: Mutex<HashMap<Source, Bucket>>,
}

impl RateLimiter {
    pub fn new(limit: RateLimit) -> Self {
        Self {
            limit,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    fn refilled(&self, b: &Bucket, now: Instant) -> f64 {
        let gained = now.saturating_duration_since(b.at).as_secs_f64()
            * f64::from(self.limit.per_minute)
            / 60.0;
        (b.tokens + gained).min(f64::from(self.limit.burst))
    }

    /// Takes one call from `source`'s budget; false when it has none left.
    pub fn allow(&self, source: Source, now: Instant) -> bool {
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if !buckets.contains_key(&source) && buckets.len() >= self.limit.max_sources.max(1) {
            let burst = f64::from(self.limit.burst);
            buckets.retain(|_, b| self.refilled(b, now) < burst);
            if buckets.len() >= self.limit.max_sources.max(1)
                && let Some(oldest) = buckets.iter().min_by_key(|(_, b)| b.at).map(|(s, _)| *s)
            {
                buckets.remove(&oldest);
            }
        }
        let bucket = buckets.entry(source).or_insert(Bucket {
            tokens: f64::from(self.limit.burst),
            at: now,
        });
        let tokens = self.refilled(bucket, now);
        bucket.at = now;
        if tokens >= 1.0 {
            bucket.tokens = tokens - 1.0;
            true
        } else {
            bucket.tokens = tokens;
            false
        }
    }

    /// Sources tracked now.
    pub fn tracked(&self) -> usize {
        self.buckets.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn v4(last: u8) -> Source {
        Source::from(Some(IpAddr::from([10, 0, 0, last])))
    }

    #[test]
    fn a_source_gets_its_burst_then_refills_over_time() {
        let limiter = RateLimiter::new(RateLimit {
            burst: 3,
            per_minute: 60,
            max_sources: 16,
        });
        let t0 = Instant::now();
        let allowed = (0..5).filter(|_| limiter.allow(v4(1), t0)).count();
        assert_eq!(allowed, 3);
        assert!(
            limiter.allow(v4(2), t0),
            "another source has its own budget"
        );
        assert!(!limiter.allow(v4(1), t0 + Duration::from_millis(500)));
        assert!(limiter.allow(v4(1), t0 + Duration::from_millis(1600)));
        assert!(!limiter.allow(v4(1), t0 + Duration::from_millis(1700)));
        // Refill stops at the burst.
        let later = t0 + Duration::from_secs(3600);
        assert_eq!((0..10).filter(|_| limiter.allow(v4(1), later)).count(), 3);
    }

    #[test]
    fn memory_is_bounded_full_buckets_go_first_then_the_least_recently_used() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let limiter = RateLimiter::new(RateLimit {
            burst: 2,
            per_minute: 60,
            max_sources: 2,
        });
        assert!(limiter.allow(v4(1), at(0)) && limiter.allow(v4(1), at(0)));
        assert!(limiter.allow(v4(2), at(0)));
        // At 1.5 s source 2 is full again (as good as untracked), source 1 is not.
        assert!(limiter.allow(v4(3), at(1500)));
        assert_eq!(limiter.tracked(), 2);
        assert!(limiter.allow(v4(1), at(1500)));
        assert!(
            !limiter.allow(v4(1), at(1500)),
            "source 1 kept its spent bucket"
        );

        let limiter = RateLimiter::new(RateLimit {
            burst: 1,
            per_minute: 0,
            max_sources: 2,
        });
        assert!(limiter.allow(v4(1), at(0)));
        assert!(limiter.allow(v4(2), at(2000)));
        assert!(
            limiter.allow(v4(3), at(3000)),
            "a new source always gets a bucket"
        );
        assert_eq!(limiter.tracked(), 2);
        assert!(
            !limiter.allow(v4(2), at(3500)),
            "source 2 was used more recently than source 1, so it is still tracked"
        );
        for s in 4..=200 {
            limiter.allow(v4(s), at(4000 + u64::from(s)));
        }
        assert_eq!(limiter.tracked(), 2);
    }

    #[test]
    fn ipv6_sources_are_their_64_prefix_and_mapped_ipv4_is_ipv4() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap_or_else(|e| panic!("{e}"));
        let b: IpAddr = "2001:db8:1:2:ffff::9"
            .parse()
            .unwrap_or_else(|e| panic!("{e}"));
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(Source::from(Some(a)), Source::from(Some(b)));
        assert_ne!(Source::from(Some(a)), Source::from(Some(c)));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(Source::from(Some(mapped)), v4(1));
    }
}
