//! Key generation for the load generator. Keys look like the connector's block
//! hashes: 32 lowercase hex characters. Two kinds:
//! - `random_key`: fresh MD5-like keys from a fast PRNG (allocate/confirm/cycle).
//! - `stored_key(i)`: a deterministic sequence used for the pre-populated pool,
//!   so that other tools (perf/http/wrk/*.lua) can compute exactly the same keys.
//!   Definition (also implemented in Lua): s = i mod 2147483646 + 1; four times
//!   s = s * 48271 mod 2147483647 (MINSTD), each s printed as "%08x".
//!   All products stay below 2^53, so Lua's doubles reproduce it exactly.

use rand::Rng;

const HEX: &[u8; 16] = b"0123456789abcdef";

/// A vLLM key: 32 hex digits.
pub type HexKey = [u8; 32];

fn hex_into(out: &mut [u8], mut v: u128, digits: usize) {
    for i in (0..digits).rev() {
        out[i] = HEX[(v & 0xf) as usize];
        v >>= 4;
    }
}

/// A fresh random 32-hex-character key.
pub fn random_key<R: Rng>(rng: &mut R) -> HexKey {
    let mut k = [0u8; 32];
    hex_into(&mut k, rng.r#gen::<u128>(), 32);
    k
}

/// The i-th key of the deterministic pre-populated pool (see module docs).
pub fn stored_key(i: u64) -> HexKey {
    let mut k = [0u8; 32];
    let mut s = i % 2_147_483_646 + 1;
    for j in 0..4 {
        s = s * 48_271 % 2_147_483_647;
        hex_into(&mut k[j * 8..j * 8 + 8], s as u128, 8);
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_keys_are_hex_and_distinct() {
        let a = stored_key(0);
        let b = stored_key(1);
        assert_ne!(a, b);
        assert!(a.iter().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        // First word of key 0: 48271 = 0xbc8f.
        assert_eq!(&a[..8], b"0000bc8f");
        // Cross-checked against perf/http/wrk/common.lua and an independent script.
        assert_eq!(&b, b"0001791e15c4afc419f23e8d6440a2fb");
        assert_eq!(&stored_key(9999), b"1cc591f02988ef724355b5dd0e6f45a4");
    }
}
