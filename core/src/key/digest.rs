//! SGLang's keys, stored without a heap allocation: a 64-character lowercase
//! hex SHA-256 digest as its 32 bytes, plus a small suffix tag.
//!
//! SGLang HiCache names every page by a SHA-256 chain digest (64 lowercase
//! hex characters). Its MHA zero-copy layouts split a page into `<digest>-k`
//! and `<digest>-v`, and its extra pools use `<digest>_<pool>`. A [`Digest`]
//! holds the 32 bytes and a [`Suffix`] tag: none, `-k`, `-v`, or a pool name
//! interned in a small process-wide table ([`intern_pool`]). A pool that does
//! not fit the table (more than [`MAX_POOLS`] names, or a name longer than
//! [`MAX_POOL_LEN`] bytes) leaves its keys as text: they still work, only
//! less compactly.
//!
//! # Why interning on every parse is consistent
//!
//! A key must classify the same way every time it is parsed, or a key stored
//! as text could not be found as a digest later. A pool name is interned at
//! the first parse of any key that carries it, whatever the operation (a
//! lookup included), as long as the table has room. The table only grows, so
//! a name either was interned at its first parse and stays interned, or met
//! a full table at its first parse and meets a full table forever after.
//!
//! # Memory ordering
//!
//! The table is a fixed array of `OnceLock` slots and a length. A writer,
//! under a mutex, fills slot `n` and then stores `len = n + 1` with
//! `Release`; a reader loads `len` with `Acquire` and only then reads slots
//! below it, which are therefore initialized. The atomics here are std's,
//! taken through `crate::sync::statics` (the shim's one named exception):
//! the table is a `static`, which loom's atomics cannot be, and no loom
//! model involves it (models use 32-hex keys only).

use crate::sync::statics::{AtomicUsize, Mutex, Ordering};
use crate::sync::{OnceLock, PoisonError};
use std::fmt;
use std::hash::{Hash, Hasher};

/// Pool names the process interns; further names leave their keys as text.
pub const MAX_POOLS: usize = 250;
/// The longest pool name interned, in bytes.
pub const MAX_POOL_LEN: usize = 48;

/// The suffix of a [`Digest`] key: `0` none, `1` `-k`, `2` `-v`, `3 + i`
/// `_` followed by pool name `i` of the table.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Suffix(u16);

impl Suffix {
    /// No suffix: a bare digest.
    pub const NONE: Suffix = Suffix(0);
    /// `-k`.
    pub const K: Suffix = Suffix(1);
    /// `-v`.
    pub const V: Suffix = Suffix(2);
    const FIRST_POOL: u16 = 3;

    /// The suffix's number, for a store of the key in atomic words.
    pub(crate) fn raw(self) -> u16 {
        self.0
    }

    /// The suffix [`Self::raw`] gave.
    pub(crate) fn from_raw(n: u16) -> Self {
        Suffix(n)
    }

    /// The suffix's text as the client wrote it, without the `_` of a pool.
    fn write_to(self, f: &mut impl fmt::Write) -> fmt::Result {
        match self.0 {
            0 => Ok(()),
            1 => f.write_str("-k"),
            2 => f.write_str("-v"),
            n => {
                f.write_char('_')?;
                f.write_str(pool_name(usize::from(n - Self::FIRST_POOL)))
            }
        }
    }
}

/// A 64-hex digest key: its 32 bytes and its suffix. 34 bytes, no pointer.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Digest {
    /// The digest, in the order the hex digits spell it.
    pub bytes: [u8; 32],
    /// What followed the digest.
    pub suffix: Suffix,
}

impl Digest {
    /// Classifies `s` as a digest key: 64 lowercase hex digits, then nothing,
    /// `-k`, `-v`, or `_` and a pool name the table holds or can take.
    #[inline]
    pub fn parse(s: &str) -> Option<Digest> {
        Self::parse_bytes(s.as_bytes())
    }

    /// [`Digest::parse`] of a key's bytes (a pool name that is not UTF-8
    /// leaves the key as text). Always inlined: out of line, a 64-hex key
    /// cost its lookup 25 instructions more (`KeyRef::compact`).
    #[inline(always)]
    pub fn parse_bytes(b: &[u8]) -> Option<Digest> {
        let (hex, rest) = b.split_at_checked(64)?;
        // The digest first, so that only digest keys ever intern a pool.
        let bytes = super::decode_hex64(hex)?;
        let suffix = match rest {
            [] => Suffix::NONE,
            b"-k" => Suffix::K,
            b"-v" => Suffix::V,
            [b'_', name @ ..] => Suffix(Suffix::FIRST_POOL + intern_pool(std::str::from_utf8(name).ok()?)? as u16),
            _ => return None,
        };
        Some(Digest { bytes, suffix })
    }
}

impl Hash for Digest {
    /// Four words and the tag: cheaper than hashing 32 bytes as a slice.
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        for w in self.bytes.chunks_exact(8) {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            state.write_u64(u64::from_le_bytes(b));
        }
        state.write_u16(self.suffix.0);
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

impl fmt::Debug for Suffix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::new();
        let _ = self.write_to(&mut s);
        write!(f, "{s:?}")
    }
}

impl Digest {
    /// Writes the key's text (what [`fmt::Display`] shows) into `w` without
    /// the formatter's machinery: the reservation tag hashes it on every
    /// reserve and confirm, where a `{:02x}` a byte cost about 7,000
    /// instructions a key.
    pub(super) fn write_text(&self, w: &mut impl fmt::Write) -> fmt::Result {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut hex = [0u8; 64];
        for (i, b) in self.bytes.iter().enumerate() {
            hex[2 * i] = HEX[usize::from(b >> 4)];
            hex[2 * i + 1] = HEX[usize::from(b & 15)];
        }
        // The digits are ASCII by construction.
        w.write_str(std::str::from_utf8(&hex).map_err(|_| fmt::Error)?)?;
        self.suffix.write_to(w)
    }
}

impl Digest {
    /// Writes the text after the 64 digits (`-k`, `-v`, `_<pool>`, or
    /// nothing) into `w`.
    pub(super) fn suffix_text(&self, w: &mut impl fmt::Write) -> fmt::Result {
        self.suffix.write_to(w)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_text(f)
    }
}

/// The interned pool names: slots `0..LEN` are set.
static POOLS: [OnceLock<Box<str>>; MAX_POOLS] = [const { OnceLock::new() }; MAX_POOLS];
/// How many slots of [`POOLS`] are set.
static LEN: AtomicUsize = AtomicUsize::new(0);
/// Serializes writers of the table (never taken once it is full, nor for a
/// name it already holds).
static WRITER: Mutex<()> = Mutex::new(());

/// Finds `name` among the first `len` slots.
#[inline]
fn find(name: &str, len: usize) -> Option<usize> {
    POOLS[..len].iter().position(|slot| slot.get().is_some_and(|n| **n == *name))
}

/// The id of pool `name`, interning it when the table has room; `None` when
/// it is empty, too long, or the table is full.
fn intern_pool(name: &str) -> Option<usize> {
    if name.is_empty() || name.len() > MAX_POOL_LEN {
        return None;
    }
    // Acquire: pairs with the Release below; the slots below `len` are set.
    let len = LEN.load(Ordering::Acquire);
    if let Some(i) = find(name, len) {
        return Some(i);
    }
    if len == MAX_POOLS {
        return None;
    }
    let _w = WRITER.lock().unwrap_or_else(PoisonError::into_inner);
    // Relaxed: writers are serialized by the mutex.
    let len = LEN.load(Ordering::Relaxed);
    if let Some(i) = find(name, len) {
        return Some(i);
    }
    if len == MAX_POOLS {
        return None;
    }
    let _ = POOLS[len].set(name.into());
    LEN.store(len + 1, Ordering::Release);
    Some(len)
}

/// The name of interned pool `i`.
fn pool_name(i: usize) -> &'static str {
    POOLS.get(i).and_then(OnceLock::get).map_or("", |n| n)
}

/// Pool names interned so far (for `/stats`).
pub fn pools_interned() -> usize {
    LEN.load(Ordering::Acquire)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "0123456789abcdef0123456789abcdef00112233445566778899aabbccddeeff";

    #[test]
    fn digests_and_suffixes_round_trip() {
        for s in [
            SHA.to_string(),
            format!("{SHA}-k"),
            format!("{SHA}-v"),
            format!("{SHA}_mamba"),
            format!("{SHA}_deepseek_v4_c4_indexer_state"),
            format!("{SHA}_ключ"),
        ] {
            let d = Digest::parse(&s).unwrap_or_else(|| panic!("{s} is a digest key"));
            assert_eq!(d.to_string(), s);
        }
        assert_eq!(Digest::parse(&format!("{SHA}_mamba")), Digest::parse(&format!("{SHA}_mamba")));
        assert_ne!(Digest::parse(&format!("{SHA}_mamba")), Digest::parse(&format!("{SHA}_swa")));
        assert_ne!(Digest::parse(&format!("{SHA}-k")), Digest::parse(&format!("{SHA}-v")));
    }

    #[test]
    fn everything_else_is_not_a_digest() {
        let long = "x".repeat(MAX_POOL_LEN + 1);
        for s in [
            &SHA[..63],
            &format!("{SHA}0"),
            &format!("{SHA}-"),
            &format!("{SHA}-x"),
            &format!("{SHA}-kv"),
            &format!("{SHA}_"),
            &format!("{SHA}_{long}"),
            &SHA.to_uppercase(),
            &format!("{}g", &SHA[..63]),
        ] {
            assert_eq!(Digest::parse(s), None, "{s}");
        }
    }
}
