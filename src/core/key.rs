//! The compact key type.
//!
//! vLLM's connector names every KV block by a 32-character lowercase hex MD5
//! digest. We store such keys as the 16 bytes they encode ([`Key::Hex`]): half
//! the memory of the text, one 128-bit compare instead of a string compare, and
//! a hash of two words. Any other string (uppercase hex, other lengths, other
//! clients) still works, stored as text ([`Key::Text`]), so that a key always
//! round-trips to exactly the string the client sent.
//!
//! The all-zero digest is stored as text too: the page table uses 0 in a
//! back-reference to mean "this page's key is text, look it up on the side"
//! (see [`super::pages`]).

use std::fmt;
use std::hash::{Hash, Hasher};

/// A stored key: owned, compact.
#[derive(Clone, PartialEq, Eq)]
pub enum Key {
    /// A 32-character lowercase hex string, as the 16 bytes it encodes (never
    /// all zero). Bytes rather than a `u128` keep the enum 8-byte aligned: 24
    /// bytes instead of 32.
    Hex([u8; 16]),
    /// Any other string, verbatim.
    Text(Box<str>),
}

/// A borrowed key, parsed from a request without allocating.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum KeyRef<'a> {
    /// See [`Key::Hex`]; the digest as one big-endian number.
    Hex(u128),
    /// See [`Key::Text`].
    Text(&'a str),
}

/// Maps each ASCII byte to its hex value, or 0xFF for anything that is not a
/// lowercase hex digit (uppercase is deliberately refused: it would not
/// round-trip).
const HEX: [u8; 256] = {
    let mut t = [0xFFu8; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

/// Decodes a 32-character lowercase hex string, or `None`.
#[inline]
fn decode_hex32(s: &[u8]) -> Option<u128> {
    if s.len() != 32 {
        return None;
    }
    let mut v: u128 = 0;
    let mut bad = 0u8;
    for &b in s {
        let d = HEX[b as usize];
        // Accumulate the "invalid" bit instead of branching per byte.
        bad |= d & 0x80;
        v = (v << 4) | u128::from(d & 0x0F);
    }
    (bad == 0).then_some(v)
}

impl<'a> KeyRef<'a> {
    /// Classifies a key string: compact when it is a nonzero 32-character
    /// lowercase hex digest, text otherwise.
    #[inline]
    pub fn parse(s: &'a str) -> Self {
        match decode_hex32(s.as_bytes()) {
            Some(v) if v != 0 => KeyRef::Hex(v),
            _ => KeyRef::Text(s),
        }
    }

    /// An owned copy (allocates only for text keys).
    pub fn to_key(self) -> Key {
        match self {
            KeyRef::Hex(v) => Key::Hex(v.to_be_bytes()),
            KeyRef::Text(s) => Key::Text(s.into()),
        }
    }
}

impl Key {
    /// Borrows this key.
    #[inline]
    pub fn as_ref(&self) -> KeyRef<'_> {
        match self {
            Key::Hex(b) => KeyRef::Hex(u128::from_be_bytes(*b)),
            Key::Text(s) => KeyRef::Text(s),
        }
    }
}

// Key and KeyRef must hash identically (scc looks up a `Key` map with a
// `KeyRef`). The hex value is written as one u128, text as its bytes followed by
// a terminator, so the two variants never collide structurally.
impl Hash for KeyRef<'_> {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        match *self {
            KeyRef::Hex(v) => state.write_u128(v),
            KeyRef::Text(s) => {
                state.write(s.as_bytes());
                state.write_u8(0xFF);
            }
        }
    }
}

impl Hash for Key {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_ref().hash(state)
    }
}

impl scc::Equivalent<Key> for KeyRef<'_> {
    #[inline]
    fn equivalent(&self, key: &Key) -> bool {
        *self == key.as_ref()
    }
}

impl fmt::Display for KeyRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyRef::Hex(v) => write!(f, "{v:032x}"),
            KeyRef::Text(s) => f.write_str(s),
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_ref().fmt(f)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

impl fmt::Debug for KeyRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    const MD5: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn lowercase_digest_is_compact_and_round_trips() {
        let k = KeyRef::parse(MD5);
        assert_eq!(k, KeyRef::Hex(0x0123456789abcdef0123456789abcdef));
        assert_eq!(k.to_string(), MD5);
        assert_eq!(k.to_key().to_string(), MD5);
    }

    #[test]
    fn everything_else_is_text() {
        for s in [
            "0123456789ABCDEF0123456789abcdef", // uppercase would not round-trip
            "0123456789abcdef0123456789abcde",  // 31 chars
            "0123456789abcdef0123456789abcdef0",
            "0123456789abcdeg0123456789abcdef",
            "00000000000000000000000000000000", // zero is reserved
            "",
            "hello",
            "ключ",
        ] {
            assert_eq!(KeyRef::parse(s), KeyRef::Text(s), "{s}");
            assert_eq!(KeyRef::parse(s).to_key().to_string(), s);
        }
    }

    #[test]
    fn key_and_keyref_hash_alike() {
        let h = foldhash::fast::FixedState::with_seed(7);
        for s in [MD5, "text key"] {
            let r = KeyRef::parse(s);
            assert_eq!(h.hash_one(r), h.hash_one(r.to_key()));
        }
    }

    #[test]
    fn key_is_compact() {
        assert_eq!(std::mem::size_of::<Key>(), 24);
    }

    #[test]
    fn all_ascii_bytes_classified() {
        for b in 0u8..=127 {
            let s = format!("{}{}", &MD5[..31], b as char);
            let expect_hex = b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
            assert_eq!(matches!(KeyRef::parse(&s), KeyRef::Hex(_)), expect_hex, "{b}");
        }
    }
}
