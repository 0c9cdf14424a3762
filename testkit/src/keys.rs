//! The tests' keys. Each generator is a pure function of its number, so a
//! test names the same key twice by the same number, and two numbers never
//! give the same key.

/// A 32-character lowercase hex key, like the connector's block hashes:
/// its digits spread by a multiplier, so neighbouring numbers share no
/// prefix.
pub fn hexkey(i: u64) -> String {
    format!("{:016x}{:016x}", 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i + 1), i + 1)
}

/// A 64-character lowercase hex key, like SGLang's SHA-256 chain digests.
pub fn sha(i: u64) -> String {
    format!("{:016x}{:016x}{:016x}{:016x}", i + 1, 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i + 1), i, !i)
}

/// Key `i` as 32 hex digits, zero-padded: keys in the order of their numbers.
pub fn key(i: u64) -> String {
    format!("{i:032x}")
}

/// [`key`]s `from..from + n`.
pub fn keys(from: u64, n: u64) -> Vec<String> {
    (from..from + n).map(key).collect()
}

/// [`sha`]s `from..from + n`.
pub fn shas(from: u64, n: u64) -> Vec<String> {
    (from..from + n).map(sha).collect()
}

/// The keys as `&str`, as the store's calls take them.
pub fn refs(keys: &[String]) -> Vec<&str> {
    keys.iter().map(String::as_str).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generators_give_distinct_keys_of_their_length() {
        for (gen, len) in [(hexkey as fn(u64) -> String, 32), (sha, 64), (key, 32)] {
            let all: std::collections::HashSet<String> = (0..1000).map(gen).collect();
            assert_eq!(all.len(), 1000);
            assert!(all.iter().all(|k| k.len() == len && k.bytes().all(|b| b.is_ascii_hexdigit())), "{all:?}");
        }
        assert_eq!(keys(3, 2), [key(3), key(4)]);
        assert_eq!(shas(3, 2), [sha(3), sha(4)]);
    }
}
