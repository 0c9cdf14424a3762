//! The JSON both dialects share, written and read without a JSON library:
//! keys written as JSON strings straight into a byte buffer, and a scanner
//! for the few answer shapes the tools read (`{"results": [[key, page],
//! ...]}`, `{"exists": [bool, ...]}`, `[int|null, ...]` lists, SGLang's
//! `[[bool, page], ...]`). A general JSON parser would cost a load generator
//! CPU that the server under test needs on a 2-core machine, so these read
//! only what they need. Whitespace between tokens is tolerated; strings with
//! escapes are refused (None), as keys are plain text.

use std::fmt::{Display, Write as _};

/// `fmt::Write` into a byte vector, for `write!` of numbers into a body.
pub struct Wr<'a>(pub &'a mut Vec<u8>);

impl std::fmt::Write for Wr<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// Appends `s` as a JSON string: copied as is when nothing needs escaping
/// (hex keys, the common case), escaped otherwise.
pub fn push_str(b: &mut Vec<u8>, s: &[u8]) {
    b.push(b'"');
    if is_plain(s) {
        b.extend_from_slice(s);
    } else {
        for &c in s {
            match c {
                b'"' => b.extend_from_slice(b"\\\""),
                b'\\' => b.extend_from_slice(b"\\\\"),
                0x00..=0x1f => {
                    let _ = write!(Wr(b), "\\u{:04x}", c);
                }
                _ => b.push(c),
            }
        }
    }
    b.push(b'"');
}

/// Whether `s` holds no byte a JSON string must escape (a control
/// character, `"` or `\\`). One fold without an early exit, which the
/// compiler vectorizes: on the hot path (128 keys a body) the byte-by-byte
/// check with an early exit cost ~9 instructions a byte, this under 3 (a
/// word-at-a-time check and 16-byte blocks both measured worse).
fn is_plain(s: &[u8]) -> bool {
    !s.iter().fold(false, |bad, &c| bad | (c < 0x20) | (c == b'"') | (c == b'\\'))
}

/// Appends `[k, k, ...]`.
pub fn push_keys<K: AsRef<[u8]>>(b: &mut Vec<u8>, keys: impl IntoIterator<Item = K>) {
    b.push(b'[');
    for (i, k) in keys.into_iter().enumerate() {
        if i > 0 {
            b.push(b',');
        }
        push_str(b, k.as_ref());
    }
    b.push(b']');
}

/// Appends `[[k,""], ...]`: the pairs of a key and its (ignored) prefix key.
pub fn push_key_pairs<K: AsRef<[u8]>>(b: &mut Vec<u8>, keys: impl IntoIterator<Item = K>) {
    b.push(b'[');
    for (i, k) in keys.into_iter().enumerate() {
        if i > 0 {
            b.push(b',');
        }
        b.push(b'[');
        push_str(b, k.as_ref());
        b.extend_from_slice(b",\"\"]");
    }
    b.push(b']');
}

/// Appends `[["k",p],...],"pages_to_release":[p,...]}`: the tail both
/// dialects' confirm bodies share.
pub fn push_pairs_and_releases<K: AsRef<[u8]>, P: Display, Q: Display>(
    b: &mut Vec<u8>,
    pairs: impl IntoIterator<Item = (K, P)>,
    releases: impl IntoIterator<Item = Q>,
) {
    b.push(b'[');
    for (i, (k, p)) in pairs.into_iter().enumerate() {
        if i > 0 {
            b.push(b',');
        }
        b.push(b'[');
        push_str(b, k.as_ref());
        let _ = write!(Wr(b), ",{p}]");
    }
    b.extend_from_slice(b"],\"pages_to_release\":[");
    for (i, p) in releases.into_iter().enumerate() {
        let _ = write!(Wr(b), "{}{p}", if i > 0 { "," } else { "" });
    }
    b.extend_from_slice(b"]}");
}

struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Scanner<'a> {
    fn ws(&mut self) {
        while self.i < self.b.len() && matches!(self.b[self.i], b' ' | b'\n' | b'\r' | b'\t') {
            self.i += 1;
        }
    }
    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        if self.b.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.b.get(self.i).copied()
    }
    fn lit(&mut self, s: &[u8]) -> bool {
        self.ws();
        if self.b[self.i..].starts_with(s) {
            self.i += s.len();
            true
        } else {
            false
        }
    }
    fn string(&mut self) -> Option<&'a [u8]> {
        if !self.eat(b'"') {
            return None;
        }
        let start = self.i;
        while self.i < self.b.len() {
            match self.b[self.i] {
                b'"' => {
                    self.i += 1;
                    return Some(&self.b[start..self.i - 1]);
                }
                b'\\' => return None,
                _ => self.i += 1,
            }
        }
        None
    }
    fn int(&mut self) -> Option<i64> {
        self.ws();
        let neg = self.b.get(self.i) == Some(&b'-');
        if neg {
            self.i += 1;
        }
        let start = self.i;
        let mut v: i64 = 0;
        while let Some(&c) = self.b.get(self.i) {
            if !c.is_ascii_digit() {
                break;
            }
            v = v.checked_mul(10)?.checked_add((c - b'0') as i64)?;
            self.i += 1;
        }
        if self.i == start {
            return None;
        }
        Some(if neg { -v } else { v })
    }
    /// Positions the scanner just after `"field":`.
    fn field(b: &'a [u8], name: &str) -> Option<Self> {
        let pat = format!("\"{name}\"");
        let pos = b.windows(pat.len()).position(|w| w == pat.as_bytes())?;
        let mut s = Scanner { b, i: pos + pat.len() };
        if s.eat(b':') {
            Some(s)
        } else {
            None
        }
    }
    /// Parses `[ item, item, ... ]` calling `f` per item.
    fn array(&mut self, mut f: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        if !self.eat(b'[') {
            return None;
        }
        if self.eat(b']') {
            return Some(());
        }
        loop {
            f(self)?;
            if self.eat(b',') {
                continue;
            }
            return if self.eat(b']') { Some(()) } else { None };
        }
    }
}

/// Parses the `results` array of a batch_allocate answer into `out`
/// as (key, page) pairs. Returns None on a malformed body.
pub fn alloc_results<'a>(body: &'a [u8], out: &mut Vec<(&'a [u8], i64)>) -> Option<()> {
    out.clear();
    let mut s = Scanner::field(body, "results")?;
    s.array(|s| {
        if !s.eat(b'[') {
            return None;
        }
        let k = s.string()?;
        if !s.eat(b',') {
            return None;
        }
        let p = s.int()?;
        if !s.eat(b']') {
            return None;
        }
        out.push((k, p));
        Some(())
    })
}

/// Parses the `exists` array of a batch_exists answer.
pub fn exists(body: &[u8], out: &mut Vec<bool>) -> Option<()> {
    out.clear();
    let mut s = Scanner::field(body, "exists")?;
    s.array(|s| {
        if s.lit(b"true") {
            out.push(true)
        } else if s.lit(b"false") {
            out.push(false)
        } else {
            return None;
        }
        Some(())
    })
}

/// Parses the `locations` array of a get_locations answer.
pub fn locations(body: &[u8], out: &mut Vec<Option<i64>>) -> Option<()> {
    pages_or_null(body, "locations", out)
}

/// Parses the `indices` array of SGLang's get_page_indices answer.
pub fn page_indices(body: &[u8], out: &mut Vec<Option<i64>>) -> Option<()> {
    pages_or_null(body, "indices", out)
}

/// Parses the `indices` array of SGLang's reserve_and_allocate_page_indices
/// answer: `[[is_written, page], ...]`.
pub fn reserved_indices(body: &[u8], out: &mut Vec<(bool, i64)>) -> Option<()> {
    out.clear();
    let mut s = Scanner::field(body, "indices")?;
    s.array(|s| {
        if !s.eat(b'[') {
            return None;
        }
        let written = if s.lit(b"true") {
            true
        } else if s.lit(b"false") {
            false
        } else {
            return None;
        };
        if !s.eat(b',') {
            return None;
        }
        let p = s.int()?;
        if !s.eat(b']') {
            return None;
        }
        out.push((written, p));
        Some(())
    })
}

/// An array field of pages or nulls.
fn pages_or_null(body: &[u8], field: &str, out: &mut Vec<Option<i64>>) -> Option<()> {
    out.clear();
    let mut s = Scanner::field(body, field)?;
    s.array(|s| {
        if s.peek() == Some(b'n') {
            if !s.lit(b"null") {
                return None;
            }
            out.push(None);
        } else {
            out.push(Some(s.int()?));
        }
        Some(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn the_word_check_agrees_with_the_byte_check(s in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40)) {
            proptest::prop_assert_eq!(is_plain(&s), s.iter().all(|&c| c >= 0x20 && c != b'"' && c != b'\\'));
        }
    }

    #[test]
    fn a_special_byte_anywhere_in_a_word_is_seen() {
        for special in [b'"', b'\\', 0x00, 0x1f] {
            for at in 0..20 {
                let mut s = vec![b'a'; 20];
                s[at] = special;
                assert!(!is_plain(&s), "{special} at {at}");
            }
        }
        assert!(is_plain(b"0123456789abcdef0123456789abcdef \x7f\xff"));
    }

    #[test]
    fn parses_shapes() {
        let mut r = Vec::new();
        alloc_results(br#"{"rank": 0, "results": [["ab", 3], ["cd",-1]]}"#, &mut r).unwrap();
        assert_eq!(r, vec![(&b"ab"[..], 3), (&b"cd"[..], -1)]);
        alloc_results(br#"{"rank":0,"results":[]}"#, &mut r).unwrap();
        assert!(r.is_empty());
        assert!(alloc_results(br#"{"ok":true}"#, &mut r).is_none());
        let mut e = Vec::new();
        exists(br#"{"exists":[true, false,true]}"#, &mut e).unwrap();
        assert_eq!(e, vec![true, false, true]);
        let mut l = Vec::new();
        locations(br#"{"locations":[1,null, 7]}"#, &mut l).unwrap();
        assert_eq!(l, vec![Some(1), None, Some(7)]);
        assert!(locations(br#"{"locations":[1,nul]}"#, &mut l).is_none());
        page_indices(br#"{"indices":[null,4]}"#, &mut l).unwrap();
        assert_eq!(l, vec![None, Some(4)]);
        let mut ri = Vec::new();
        reserved_indices(br#"{"indices": [[true, 3], [false,-1]]}"#, &mut ri).unwrap();
        assert_eq!(ri, vec![(true, 3), (false, -1)]);
        assert!(reserved_indices(br#"{"indices":[[1,3]]}"#, &mut ri).is_none());
    }
}
