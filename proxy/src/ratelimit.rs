//! Local rate limits: each proxy replica keeps its own buckets, one per key (client address,
//! a header's value, or the whole route), as nginx's `limit_req` with `nodelay` and
//! `limit_conn` do.
//!
//! The rate is a GCRA (generic cell rate algorithm): per key one number, the time at which the
//! bucket is empty again ("theoretical arrival time"). A request is let through when that time
//! is at most `burst` intervals ahead of now, and pushes it one interval further. So a bucket
//! holds `burst + 1` requests and refills at the steady rate, with no timer and no refill loop.
//!
//! Buckets live in a [`Registry`] that outlives routing tables: a snapshot swap keeps every
//! client's bucket (as long as the limit's settings stay the same), so pushing a route change
//! never hands out a fresh burst. Memory is bounded: a shard forgets buckets that are full
//! again (they are the same as no bucket) and, when every bucket it holds is still in use,
//! puts new keys in one shared bucket rather than growing.

pub mod global;

use crate::addresses::AddressSet;
use coxswain_api::snapshot as snap;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

const SHARDS: usize = 16;
/// Buckets one shard keeps: 65,536 keys per limit in all.
const SHARD_KEYS: usize = 4096;

/// What a limit counts and how fast it refills. Two routes with equal settings and id share
/// one [`Limiter`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    interval_ns: u64,
    tolerance_ns: u64,
    key: Key,
    max_in_flight: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    ClientAddress,
    /// A lower-case header name.
    Header(Box<str>),
    Route,
}

impl Settings {
    /// None for a limit that limits nothing (no rate and no in-progress bound); a 0 period
    /// is no rate, never "refuse everything".
    fn new(r: &snap::RateLimit) -> Option<Self> {
        let rated = r.requests > 0 && r.period_ms > 0;
        if !rated && r.max_in_flight == 0 {
            return None;
        }
        // 0: no rate.
        let interval_ns = if rated {
            (r.period_ms.saturating_mul(1_000_000) / u64::from(r.requests)).max(1)
        } else {
            0
        };
        let key = match snap::rate_limit::Key::try_from(r.key) {
            Ok(snap::rate_limit::Key::Header) if !r.header.is_empty() => {
                Key::Header(r.header.to_ascii_lowercase().into())
            }
            Ok(snap::rate_limit::Key::Route) => Key::Route,
            _ => Key::ClientAddress,
        };
        Some(Self {
            interval_ns,
            tolerance_ns: interval_ns.saturating_mul(u64::from(r.burst)),
            key,
            max_in_flight: r.max_in_flight,
        })
    }
}

/// Limits by id, shared by every table built while the limit exists.
#[derive(Debug, Default)]
pub struct Registry {
    limiters: Mutex<Limiters>,
}

#[derive(Debug, Default)]
struct Limiters {
    by_id: HashMap<Box<str>, Weak<Limiter>>,
    /// Entries after the last sweep of limits no table uses: the next sweep waits until the
    /// map has doubled, so building a table with many limits stays linear.
    swept_at: usize,
}

impl Registry {
    /// The limiter for a route's limit: the one already in use when its settings are the same,
    /// else a new one (new settings start with full buckets).
    pub fn limiter(&self, r: &snap::RateLimit) -> Option<Arc<Limiter>> {
        let settings = Settings::new(r)?;
        let exempt = AddressSet::new(&snap::ClientAllowlist {
            cidrs: r.exempt.clone(),
        });
        let mut limiters = self.limiters.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(existing) = limiters.by_id.get(r.id.as_str()).and_then(Weak::upgrade)
            && existing.settings == settings
            && existing.exempt == exempt
        {
            return Some(existing);
        }
        if limiters.by_id.len() >= 2 * limiters.swept_at.max(32) {
            // Limits no table uses any more.
            limiters.by_id.retain(|_, l| l.strong_count() > 0);
            limiters.swept_at = limiters.by_id.len();
        }
        let limiter = Arc::new(Limiter::new(settings, exempt));
        limiters
            .by_id
            .insert(r.id.as_str().into(), Arc::downgrade(&limiter));
        Some(limiter)
    }
}

/// One limit's buckets.
#[derive(Debug)]
pub struct Limiter {
    settings: Settings,
    exempt: AddressSet,
    epoch: Instant,
    hasher: RandomState,
    shards: Box<[Mutex<Shard>]>,
}

#[derive(Debug, Default)]
struct Shard {
    /// Key hash -> when its bucket is full again, in ns since the limiter's epoch.
    full_at: HashMap<u64, u64>,
    /// The bucket of keys that found the shard full of buckets in use.
    overflow: u64,
    in_flight: HashMap<u64, u32>,
}

/// Why a request is answered 429.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    /// When a request of the same key may pass again (at least 1 s: Retry-After counts seconds).
    pub retry_after: Duration,
}

impl Limited {
    pub fn retry_after_secs(&self) -> u64 {
        self.retry_after.as_secs_f64().ceil().max(1.0) as u64
    }
}

impl Limiter {
    fn new(settings: Settings, exempt: AddressSet) -> Self {
        Self {
            settings,
            exempt,
            epoch: Instant::now(),
            hasher: RandomState::new(),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }

    /// The header this limit is keyed by, if any.
    pub fn header(&self) -> Option<&str> {
        match &self.settings.key {
            Key::Header(h) => Some(h),
            _ => None,
        }
    }

    /// Counts a request of `client` (its `header` value when keyed by one). Ok with a slot to
    /// hold while the request is in progress (limits on requests in progress only), or why it
    /// is refused. An exempt client is never counted.
    ///
    /// The shard's lock is held for a hash probe and a few compares: nothing waits under it.
    pub fn admit(
        self: &Arc<Self>,
        client: Option<IpAddr>,
        header: Option<&[u8]>,
    ) -> Result<Option<Slot>, Limited> {
        if client.is_some_and(|ip| !self.exempt.is_empty() && self.exempt.allows(ip)) {
            return Ok(None);
        }
        let key = {
            let mut h = self.hasher.build_hasher();
            match &self.settings.key {
                Key::ClientAddress => client.hash(&mut h),
                Key::Header(_) => header.hash(&mut h),
                Key::Route => {}
            }
            h.finish()
        };
        let now = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let s = &self.settings;
        let mut shard = self.shards[(key as usize) % SHARDS]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if s.max_in_flight > 0 && shard.in_flight.get(&key).copied().unwrap_or(0) >= s.max_in_flight
        {
            return Err(Limited {
                retry_after: Duration::from_secs(1),
            });
        }
        if s.interval_ns == 0 {
            return Ok(Some(self.hold(&mut shard, key)));
        }
        if !shard.full_at.contains_key(&key) && shard.full_at.len() >= SHARD_KEYS {
            shard.full_at.retain(|_, full_at| *full_at > now);
        }
        let tracked = shard.full_at.contains_key(&key) || shard.full_at.len() < SHARD_KEYS;
        let full_at = if tracked {
            shard.full_at.get(&key).copied()
        } else {
            Some(shard.overflow)
        }
        .unwrap_or(now)
        .max(now);
        if full_at - now > s.tolerance_ns {
            return Err(Limited {
                retry_after: Duration::from_nanos(full_at - now - s.tolerance_ns),
            });
        }
        let next = full_at.saturating_add(s.interval_ns);
        if tracked {
            shard.full_at.insert(key, next);
        } else {
            shard.overflow = next;
        }
        if s.max_in_flight == 0 {
            return Ok(None);
        }
        Ok(Some(self.hold(&mut shard, key)))
    }

    fn hold(self: &Arc<Self>, shard: &mut Shard, key: u64) -> Slot {
        *shard.in_flight.entry(key).or_default() += 1;
        Slot {
            limiter: self.clone(),
            key,
        }
    }
}

#[cfg(test)]
impl Limiter {
    /// Buckets held, over every shard.
    fn tracked(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().map_or(0, |s| s.full_at.len()))
            .sum()
    }
}

/// A request in progress, counted against its key's limit until dropped.
#[derive(Debug)]
pub struct Slot {
    limiter: Arc<Limiter>,
    key: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut shard = self.limiter.shards[(self.key as usize) % SHARDS]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = shard.in_flight.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                shard.in_flight.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests;
