//! Deterministic hashing for the scheduler: rendezvous (highest-random-weight) scores, a
//! small PRNG for weighted randomness, and a bounded top-k collector.
//!
//! # Key Components
//! - [`key_hash`] / [`id_hash`] / [`hrw_key`]: rendezvous hashing with fixed constants, so
//!   every worker and every instance maps a session key to the same account without
//!   sharing state (no `RandomState`).
//! - [`Rng`]: splitmix64, seeded per pick; never used for anything secret.
//! - [`TopK`]: keeps the `k` smallest `(key, index)` pairs of a stream in O(n + k log k)
//!   expected time, so a pick over 10k accounts never sorts all of them.

/// splitmix64's finalizer: a fast bijective 64-bit mixer.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Stable 64-bit hash of a session key (FNV-1a, then mixed).
pub(crate) fn key_hash(key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix64(h)
}

/// Stable per-account hash input for rendezvous hashing (from the storage id, which every
/// instance sharing the database agrees on).
pub(crate) fn id_hash(id: i64) -> u64 {
    mix64((id as u64) ^ 0x5ced_a7e5_0c0d_e6a7)
}

/// Stable rendezvous input of bucket `b` of a large pool (two-level rendezvous).
pub(crate) fn bucket_hash(b: u64) -> u64 {
    mix64(b ^ 0x6275_636b_6574_2d31)
}

/// The rendezvous hash of (session, account).
#[inline]
pub(crate) fn hrw_hash(key_hash: u64, id_hash: u64) -> u64 {
    mix64(key_hash ^ id_hash)
}

/// A hash as a uniform number in (0, 1]: never 0, so `ln` is finite.
#[inline]
pub(crate) fn unit_of(h: u64) -> f64 {
    ((h >> 11) as f64 + 1.0) * (1.0 / (1u64 << 53) as f64)
}

/// Rendezvous key of (session, account): **lower is better**. With uniform weights this is
/// the inverted hash; with weights (passed as `1 / w`) it is `-ln(u) / w` (the weighted HRW
/// of Schindelhauer and Schomaker), as the bits of a non-negative `f64` (which order like
/// the values). Since `-ln(u) >= 1 - u`, `(1 - u) / w` is a cheap lower bound of the key.
#[inline]
pub(crate) fn hrw_key(key_hash: u64, id_hash: u64, inv_weight: Option<f64>) -> u64 {
    let h = hrw_hash(key_hash, id_hash);
    match inv_weight {
        None => !h,
        Some(iw) => (-unit_of(h).ln() * iw).to_bits(),
    }
}

/// A random key from the hash `h`, lower is better: an exponential clock `-ln(u)/w` when
/// weighted (`inv_weight` is `1/w`, so the chance to come first among equals is proportional
/// to the weight), else `h` itself.
#[inline]
pub(crate) fn random_of(inv_weight: Option<f64>, h: u64) -> u64 {
    match inv_weight {
        None => h,
        Some(iw) => (-unit_of(h).ln() * iw).to_bits(),
    }
}

/// splitmix64 PRNG.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

// === impl Rng ===

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.0)
    }
}

/// Large primes for strided walks: one of them never divides a pool size below their
/// product, so the stride is coprime with `n` and the walk visits every index once.
const STRIDES: [u64; 8] = [
    7_919,
    104_729,
    1_299_709,
    15_485_863,
    179_424_673,
    2_147_483_647,
    32_452_843,
    49_979_687,
];

/// A stride coprime with `n` (for `n >= 2`), chosen by `r`.
pub(crate) fn coprime_stride(n: usize, r: u64) -> usize {
    let n64 = n as u64;
    let start = (r % STRIDES.len() as u64) as usize;
    for i in 0..STRIDES.len() {
        let p = STRIDES[(start + i) % STRIDES.len()];
        // A prime that does not divide n is coprime with it (kept as `%` for the 1.85 MSRV).
        let rem = n64 % p;
        if rem > 0 {
            return (p % n64) as usize;
        }
    }
    1
}

/// Collects the `k` smallest `(key, index)` pairs of a stream, sorted ascending.
#[derive(Debug, Default)]
pub(crate) struct TopK {
    k: usize,
    items: Vec<(u128, u32)>,
}

// === impl TopK ===

impl TopK {
    /// Clears and sets the capacity (`k >= 1`).
    pub(crate) fn reset(&mut self, k: usize) {
        self.k = k.max(1);
        self.items.clear();
        self.items.reserve(self.k);
    }

    /// The key a newcomer must beat once the set is full.
    #[inline]
    pub(crate) fn worst(&self) -> Option<u128> {
        if self.items.len() < self.k {
            None
        } else {
            self.items.last().map(|l| l.0)
        }
    }

    /// True when `key` would enter the set.
    #[inline]
    pub(crate) fn admits(&self, key: u128) -> bool {
        self.items.len() < self.k || self.items.last().is_some_and(|l| key < l.0)
    }

    #[inline]
    pub(crate) fn push(&mut self, key: u128, idx: u32) {
        if !self.admits(key) {
            return;
        }
        if self.items.len() == self.k {
            self.items.pop();
        }
        let pos = self.items.partition_point(|e| e.0 <= key);
        self.items.insert(pos, (key, idx));
    }

    pub(crate) fn items(&self) -> &[(u128, u32)] {
        &self.items
    }
}
