//! Trace and span ids: random, never all zero, and cheap enough to make per request. Each
//! thread runs its own generator (SplitMix64), seeded once from the operating system, so
//! making an id takes no lock and no system call.

use std::cell::Cell;

thread_local! {
    static STATE: Cell<u64> = Cell::new(seed());
}

fn seed() -> u64 {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 8];
    if ring::rand::SystemRandom::new().fill(&mut bytes).is_ok() {
        return u64::from_le_bytes(bytes);
    }
    // No system randomness: the clock and the thread still keep threads and runs apart.
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

fn next() -> u64 {
    STATE.with(|s| {
        let x = s.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
        s.set(x);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    })
}

fn nonzero() -> u64 {
    loop {
        let v = next();
        if v != 0 {
            return v;
        }
    }
}

pub(super) fn span_id() -> [u8; 8] {
    nonzero().to_be_bytes()
}

pub(super) fn trace_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&next().to_be_bytes());
    id[8..].copy_from_slice(&nonzero().to_be_bytes());
    id
}
