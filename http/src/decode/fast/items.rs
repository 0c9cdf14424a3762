//! The fast path's item scanners: one key, one pair, one confirmation, one
//! integer, each from the bytes at its opening quote or digit, and the loop
//! over a list of keys of one fixed shape.

use super::Cursor;
#[cfg(doc)]
use super::Value;
use crate::core::key::Digest;
use crate::core::KeyRef;
use crate::decode::{plain, Limits};

/// Where the closing quote of a key opened at `start` would be if the key
/// had a compact shape: 32 or 64 digits, or 64 and `-k`/`-v` (a `_<pool>`
/// suffix is left to [`KeyRef::parse`]), within `max_key_len`.
#[inline(always)]
pub(super) fn compact_end(b: &[u8], start: usize, limits: Limits) -> Option<usize> {
    let end = match (b.get(start + 32), b.get(start + 64), b.get(start + 66)) {
        (Some(b'"'), _, _) => start + 32,
        (_, Some(b'"'), _) => start + 64,
        (_, _, Some(b'"')) if b.get(start + 64) == Some(&b'-') => start + 66,
        _ => return None,
    };
    (end - start <= limits.max_key_len).then_some(end)
}

/// Scans a list of keys of one fixed shape ([`Value::Hex`],
/// [`Value::Digests`]) into `out`, at most `max_keys` of them, each decoded
/// by `key` from the bytes at its opening quote (its value and the bytes it
/// took, quotes included, or `None`). Anything else is `None`, never an
/// error: the route scans the body again as a general lookup list. One loop
/// of its own rather than [`Cursor::list`] over a closure, its position in
/// a local: a 32-hex key costs the scan about 45 instructions less.
#[inline(never)]
pub(super) fn fixed_list<T>(
    c: &mut Cursor<'_>,
    out: &mut Vec<T>,
    limits: Limits,
    key: impl Fn(&[u8], Limits) -> Option<(T, usize)>,
) -> Option<()> {
    if c.next()? != b'[' {
        return None;
    }
    if c.peek()? == b']' {
        c.at += 1;
        return Some(());
    }
    let b = c.b;
    // Room for as many keys as the rest of the body could hold.
    out.reserve(((b.len() - c.at) / 35 + 1).min(limits.max_keys));
    let mut at = c.at;
    let end = loop {
        while b.get(at).is_some_and(|&x| is_ws(x)) {
            at += 1;
        }
        if out.len() >= limits.max_keys {
            return None;
        }
        let (k, len) = key(b.get(at..)?, limits)?;
        out.push(k);
        at += len;
        while b.get(at).is_some_and(|&x| is_ws(x)) {
            at += 1;
        }
        match b.get(at) {
            Some(b',') => at += 1,
            Some(b']') => break at + 1,
            _ => return None,
        }
    };
    c.at = end;
    Some(())
}

/// A [`Value::Hex`] key at the start of `b` (its opening quote): 32 digits
/// checked and decoded in one step ([`KeyRef::hex_of`]) between quotes.
#[inline(always)]
pub(super) fn hex_key(b: &[u8], limits: Limits) -> Option<(u128, usize)> {
    let key: &[u8; 34] = b.get(..34)?.try_into().ok()?;
    if key[0] != b'"' || key[33] != b'"' || limits.max_key_len < 32 {
        return None;
    }
    Some((KeyRef::hex_of(&key[1..33])?, 34))
}

/// An item of [`Value::HexPairs`] at the start of `b`: a key (`key`:
/// [`hex_key`]), or `[` a key, `,`
/// and a plain string or `null` (the prefix key, read past as
/// [`Value::KeyPairs`] reads it) `]`, with whitespace between.
#[inline(always)]
pub(super) fn pair_item<T>(
    b: &[u8],
    limits: Limits,
    key: impl Fn(&[u8], Limits) -> Option<(T, usize)>,
) -> Option<(T, usize)> {
    if b.first() == Some(&b'"') {
        return key(b, limits);
    }
    let (k, at) = pair_head(b, limits, key)?;
    let at = match b.get(at)? {
        // The empty prefix vLLM's connector sends, then any plain string.
        b'"' if b.get(at + 1) == Some(&b'"') => at + 2,
        b'"' => {
            let end = at + 1 + plain::run(b.get(at + 1..)?);
            if b.get(end) != Some(&b'"') {
                return None;
            }
            end + 1
        }
        b'n' if b.get(at..at + 4)? == b"null" => at + 4,
        _ => return None,
    };
    let at = skip_ws(b, at);
    (b.get(at) == Some(&b']')).then_some((k, at + 1))
}

/// A [`Value::HexPairs`] item ([`pair_item`] of a [`hex_key`]).
#[inline(always)]
pub(super) fn hex_pair(b: &[u8], limits: Limits) -> Option<(u128, usize)> {
    pair_item(b, limits, hex_key)
}

/// A [`Value::Digests`] key at the start of `b`: 64 digits, bare or with
/// `-k`/`-v`, between quotes ([`Digest::parse_bytes`], which sees no `_`
/// suffix here, so never interns a pool).
#[inline(always)]
pub(super) fn digest_key(b: &[u8], limits: Limits) -> Option<(Digest, usize)> {
    let len = match (b.first(), b.get(65), b.get(67)) {
        (Some(b'"'), Some(b'"'), _) => 64,
        (Some(b'"'), Some(b'-'), Some(b'"')) => 66,
        _ => return None,
    };
    if len > limits.max_key_len {
        return None;
    }
    Some((Digest::parse_bytes(b.get(1..1 + len)?)?, len + 2))
}

/// A [`Value::DigestPairs`] item ([`pair_item`] of a [`digest_key`]).
#[inline(always)]
pub(super) fn digest_pair(b: &[u8], limits: Limits) -> Option<(Digest, usize)> {
    pair_item(b, limits, digest_key)
}

/// The head of a two-element item at the start of `b`: `[`, a key (`key`,
/// giving its value and the bytes it took) and `,`, with whitespace
/// between; the key and where the second element starts (its whitespace
/// skipped).
#[inline(always)]
fn pair_head<T>(b: &[u8], limits: Limits, key: impl Fn(&[u8], Limits) -> Option<(T, usize)>) -> Option<(T, usize)> {
    if b.first() != Some(&b'[') {
        return None;
    }
    let at = skip_ws(b, 1);
    let (k, len) = key(b.get(at..)?, limits)?;
    let at = skip_ws(b, at + len);
    if b.get(at) != Some(&b',') {
        return None;
    }
    Some((k, skip_ws(b, at + 1)))
}

/// The first position from `at` that is not JSON whitespace.
#[inline(always)]
fn skip_ws(b: &[u8], mut at: usize) -> usize {
    while b.get(at).is_some_and(|&x| is_ws(x)) {
        at += 1;
    }
    at
}

/// A confirmation item at the start of `b`: `[`, a key (`key`, giving its
/// value and the bytes it took), `,`, an integer ([`int_at`]) and `]`, with
/// whitespace between; the pair and the bytes it took.
#[inline(always)]
pub(super) fn confirmation_item<T>(
    b: &[u8],
    limits: Limits,
    key: impl Fn(&[u8], Limits) -> Option<(T, usize)>,
) -> Option<((T, i64), usize)> {
    let (k, at) = pair_head(b, limits, key)?;
    let (page, at) = int_at(b, at)?;
    let at = skip_ws(b, at);
    (b.get(at) == Some(&b']')).then_some(((k, page), at + 1))
}

/// A confirmation of a 32-hex key ([`confirmation_item`] of a [`hex_key`]).
#[inline(always)]
pub(super) fn hex_confirmation(b: &[u8], limits: Limits) -> Option<((u128, i64), usize)> {
    confirmation_item(b, limits, hex_key)
}

/// A confirmation of an SGLang digest key ([`confirmation_item`] of a
/// [`digest_key`]).
#[inline(always)]
pub(super) fn digest_confirmation(b: &[u8], limits: Limits) -> Option<((Digest, i64), usize)> {
    confirmation_item(b, limits, digest_key)
}

/// The integer at `b[at..]` as [`Cursor::int`] takes it (no whitespace
/// before it): its value and where it ends. Digit by digit: a conversion of
/// up to 8 digits in one word (SWAR) cost a 5-digit page 8 instructions
/// more, its checks and shifts outweighing the 5 multiply-adds.
#[inline(always)]
pub(in crate::decode) fn int_at(b: &[u8], at: usize) -> Option<(i64, usize)> {
    let negative = b.get(at) == Some(&b'-');
    let first = at + usize::from(negative);
    let mut i = first;
    let mut value: i64 = 0;
    while let Some(&c) = b.get(i).filter(|c| c.is_ascii_digit()) {
        if i - first == 18 {
            return None;
        }
        value = value * 10 + i64::from(c - b'0');
        i += 1;
    }
    let digits = i - first;
    let leading_zero = digits > 1 && b.get(first) == Some(&b'0');
    if digits == 0 || leading_zero || (negative && value == 0) {
        return None;
    }
    Some((if negative { -value } else { value }, i))
}

/// Whether `x` is JSON whitespace, one comparison for the bytes that usually
/// follow it (any above the space).
#[inline(always)]
pub(super) fn is_ws(x: u8) -> bool {
    x <= b' ' && matches!(x, b' ' | b'\n' | b'\r' | b'\t')
}
