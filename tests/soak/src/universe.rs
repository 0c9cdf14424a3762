//! The key universe the soak draws from, and the small hashing helpers its
//! model uses.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use rand::Rng;

use hf3fs_perf::keys::HexKey;

/// Positions of a prefix chain.
pub(crate) const CHAIN_LEN: u32 = 192;
/// The most keys one save batch names (the connector's limit).
pub(crate) const MAX_BATCH: usize = 128;

/// A fast hasher for the model's maps (keys are random hex, pages small ints).
#[derive(Default, Clone, Copy)]
pub(crate) struct FastHasher(u64);

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.mix(u64::from_le_bytes(w));
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.mix(u64::from(v));
    }
    fn write_usize(&mut self, v: usize) {
        self.mix(v as u64);
    }
    fn finish(&self) -> u64 {
        mix64(self.0)
    }
}

impl FastHasher {
    fn mix(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;
pub(crate) type FastSet<K> = HashSet<K, BuildHasherDefault<FastHasher>>;

/// splitmix64's finalizer: a well-mixed 64-bit value from any input.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The 32-hex-character key spelling the 128-bit value `hi:lo`.
pub(crate) fn hex_key(hi: u64, lo: u64) -> HexKey {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut k = [0u8; 32];
    let v = (u128::from(hi) << 64) | u128::from(lo);
    for (i, c) in k.iter_mut().enumerate() {
        *c = HEX[((v >> (4 * (31 - i))) & 0xf) as usize];
    }
    k
}

/// A key as text, for messages and the model file.
pub(crate) fn key_str(k: &HexKey) -> &str {
    std::str::from_utf8(k).unwrap_or("?")
}

/// The key universe: prefix chains like the connector's block hashes. Chain
/// (root, branch) has CHAIN_LEN positions; positions below `split(root)` are
/// shared by every branch of the root, so batches of different branches
/// reuse each other's stored prefix.
#[derive(Clone, Copy)]
pub(crate) struct Universe {
    pub(crate) seed: u64,
    pub(crate) roots: u32,
    pub(crate) branches: u32,
    pub(crate) hot_roots: u32,
    pub(crate) hot_prob: f64,
}

impl Universe {
    /// The first position at which the branches of `root` differ.
    pub(crate) fn split(&self, root: u32) -> u32 {
        (mix64(self.seed ^ 0x5b1d_0000 ^ u64::from(root)) % u64::from(CHAIN_LEN + 1)) as u32
    }

    pub(crate) fn key(&self, root: u32, branch: u32, pos: u32) -> HexKey {
        let b = if pos < self.split(root) { u32::MAX } else { branch };
        let a = mix64(self.seed ^ mix64((u64::from(root) << 32) | u64::from(b)));
        hex_key(mix64(a ^ u64::from(pos)), mix64(a.rotate_left(17) ^ u64::from(pos).wrapping_mul(0x0100_0000_01b3)))
    }

    /// A save batch: 1–128 consecutive keys of one chain, from its start half
    /// of the time (prompt prefix), else from a random offset.
    pub(crate) fn batch<R: Rng>(&self, rng: &mut R) -> Vec<HexKey> {
        let hot = self.hot_roots.min(self.roots);
        let root =
            if hot > 0 && rng.gen_bool(self.hot_prob) { rng.gen_range(0..hot) } else { rng.gen_range(0..self.roots) };
        let branch = rng.gen_range(0..self.branches);
        let n = rng.gen_range(1..=MAX_BATCH as u32);
        let start = if rng.gen_bool(0.5) { 0 } else { rng.gen_range(0..=CHAIN_LEN - n) };
        (start..start + n).map(|p| self.key(root, branch, p)).collect()
    }

    /// Every key of the universe, each once.
    pub(crate) fn all_keys(&self) -> Vec<HexKey> {
        let mut keys: Vec<HexKey> = (0..self.roots)
            .flat_map(|r| (0..self.branches).flat_map(move |b| (0..CHAIN_LEN).map(move |p| self.key(r, b, p))))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    pub(crate) fn any_key<R: Rng>(&self, rng: &mut R) -> HexKey {
        self.key(rng.gen_range(0..self.roots), rng.gen_range(0..self.branches), rng.gen_range(0..CHAIN_LEN))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn universe_chains_share_prefixes() {
        let u = Universe { seed: 7, roots: 4, branches: 3, hot_roots: 0, hot_prob: 0.0 };
        let root = (0..4).find(|&r| u.split(r) > 1 && u.split(r) < CHAIN_LEN).unwrap();
        let s = u.split(root);
        assert_eq!(u.key(root, 0, 0), u.key(root, 2, 0));
        assert_eq!(u.key(root, 0, s - 1), u.key(root, 1, s - 1));
        assert_ne!(u.key(root, 0, s), u.key(root, 1, s));
        assert_ne!(u.key(root, 0, 0), u.key(root, 0, 1));
        let all = u.all_keys();
        assert!(all.len() < 4 * 3 * CHAIN_LEN as usize && all.len() > 4 * CHAIN_LEN as usize);
        assert!(all.binary_search(&u.key(root, 1, s)).is_ok());
        let k = u.key(root, 0, 5);
        assert!(k.iter().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    }
}
