//! Response encoding: every JSON body the server sends, written straight into
//! a caller-owned `Vec<u8>`.
//!
//! The answers of this API have a handful of fixed shapes, so building a
//! value tree or going through a generic serializer would only add
//! allocations and indirection on the hot path. Each function here appends
//! one complete document to `out` (it never clears it). A handler sizes a
//! fresh buffer for its answer and hands it to hyper as the response body,
//! which takes ownership of it: nothing is copied after encoding.
//!
//! The output is compact JSON with no spaces. The Python reference server
//! (`FastAPI`'s `JSONResponse`) puts a space after `:` and `,`; JSON clients,
//! including vLLM's `requests`-based one, do not see the difference, so this
//! is not a parity concern. Non-ASCII text is written as raw UTF-8 rather than
//! `\uXXXX` escapes, which is equally valid JSON. Integers go through `itoa`.

#![forbid(unsafe_code)]

use crate::core::key::encode_hex32;
use crate::core::{SpaceLabel, SpaceReport};

/// Whether `b` cannot appear raw inside a JSON string literal.
fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// Whether any byte of `s` needs escaping, 8 bytes per step (SWAR): a byte
/// below 0x20, `"` or `\\`. The common case, a 32-hex key, is 4 steps.
fn any_needs_escape(s: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // High bit of each byte of the result: that byte of `v` is zero.
    let zero_bytes = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    let mut chunks = s.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        let v = u64::from_le_bytes(w);
        // Bytes below 0x20: v - 0x20 per byte borrows into the high bit
        // (only meaningful for bytes below 0x80, hence `& !v`).
        let control = v.wrapping_sub(0x20 * ONES) & !v & HIGH;
        if control | zero_bytes(v ^ (u64::from(b'"') * ONES)) | zero_bytes(v ^ (u64::from(b'\\') * ONES)) != 0 {
            return true;
        }
    }
    chunks.remainder().iter().any(|&b| needs_escape(b))
}

/// The letter of the two-character escape for `b` (`n` for `\n`, ...), or
/// `None` when `b` has no short form and needs `\u00XX`.
fn short_escape(b: u8) -> Option<u8> {
    match b {
        b'"' => Some(b'"'),
        b'\\' => Some(b'\\'),
        0x08 => Some(b'b'),
        0x09 => Some(b't'),
        0x0a => Some(b'n'),
        0x0c => Some(b'f'),
        0x0d => Some(b'r'),
        _ => None,
    }
}

/// The lowercase hexadecimal digit for a value below 16.
fn hex_digit(n: u8) -> u8 {
    if n < 10 {
        b'0' + n
    } else {
        b'a' + (n - 10)
    }
}

/// Appends `s` as a JSON string literal, quotes included.
///
/// `"` and `\` are backslash-escaped; control characters use the short forms
/// `\b \t \n \f \r` where JSON has one and `\u00XX` otherwise. Everything
/// else, multi-byte UTF-8 included, is copied unchanged, so a string that
/// needs no escaping (every real key: 32 hex digits) is a single copy.
pub fn json_str(out: &mut Vec<u8>, s: &str) {
    out.reserve(s.len() + 2);
    out.push(b'"');
    if !any_needs_escape(s.as_bytes()) {
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
        return;
    }
    let mut rest = s.as_bytes();
    loop {
        let Some(pos) = rest.iter().position(|&b| needs_escape(b)) else {
            out.extend_from_slice(rest);
            break;
        };
        let Some((run, tail)) = rest.split_at_checked(pos) else {
            // Unreachable: `pos` comes from `position` over `rest`.
            out.extend_from_slice(rest);
            break;
        };
        out.extend_from_slice(run);
        let Some((&b, after)) = tail.split_first() else {
            break;
        };
        match short_escape(b) {
            Some(letter) => out.extend_from_slice(&[b'\\', letter]),
            None => out.extend_from_slice(&[b'\\', b'u', b'0', b'0', hex_digit(b >> 4), hex_digit(b & 0x0f)]),
        }
        rest = after;
    }
    out.push(b'"');
}

/// Appends the decimal form of `n`.
fn int(out: &mut Vec<u8>, n: i64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Appends `{"detail":"<msg>"}`, the body of every plain FastAPI-style error.
pub fn detail(out: &mut Vec<u8>, msg: &str) {
    out.extend_from_slice(br#"{"detail":"#);
    json_str(out, msg);
    out.push(b'}');
}

/// Appends `{"message":"<msg>"}`, the body of a successful initialize.
pub fn message(out: &mut Vec<u8>, msg: &str) {
    out.extend_from_slice(br#"{"message":"#);
    json_str(out, msg);
    out.push(b'}');
}

/// Whether no JSON string literal in `json` can need an escape once
/// decoded: it has no backslash and no byte below 0x20. A string literal
/// without a backslash decodes to its own bytes, which then hold no `"`
/// (it would have ended the literal), no `\\` and no control character,
/// so the decoded strings can be written back as they are.
pub fn escape_free(json: &[u8]) -> bool {
    // 64 bytes per step without early exits inside, so that the compiler
    // vectorizes the step: a request body of 128 keys is about 90 steps.
    let flag = |acc: u8, &b: &u8| acc | u8::from(b < 0x20) | u8::from(b == b'\\');
    let mut chunks = json.chunks_exact(64);
    chunks.all(|c| c.iter().fold(0, flag) == 0) && chunks.remainder().iter().fold(0, flag) == 0
}

/// What [`allocate`]'s caller knows of its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keys {
    /// Any strings: each is checked and escaped where needed.
    Any,
    /// Strings that need no escape (decoded from a body that
    /// [`escape_free`] passed): copied as they are.
    Plain,
}

/// Appends a batch-allocate answer, `{"rank":R,"results":[["key",page],...]}`,
/// with one pair per item of `results`, in the order given.
pub fn allocate<'k>(out: &mut Vec<u8>, rank: i64, keys: Keys, results: impl IntoIterator<Item = (&'k str, i64)>) {
    let results = results.into_iter();
    // 32-hex-digit key, quotes, brackets, comma and a page of up to 9 digits.
    out.reserve(32 + results.size_hint().0 * 48);
    out.extend_from_slice(br#"{"rank":"#);
    int(out, rank);
    out.extend_from_slice(br#","results":["#);
    let mut digits = itoa::Buffer::new();
    // Each item ends with a comma; the last one's becomes the list's end.
    let mut any = false;
    for (key, page) in results {
        any = true;
        if let (Keys::Plain, Ok(k)) = (keys, <&[u8; 32]>::try_from(key.as_bytes())) {
            debug_assert!(!any_needs_escape(k), "a plain key needs an escape: {key:?}");
            // A 32-hex key's item, `["<key>",<page>],`, made on the stack
            // and appended as one fixed-size copy, then cut to its length:
            // a push a byte costs a capacity check each, a copy of the
            // item's own length a call to memcpy.
            let page = digits.format(page).as_bytes();
            let mut item = [0u8; ITEM];
            item[..2].copy_from_slice(b"[\"");
            item[2..34].copy_from_slice(k);
            item[34..36].copy_from_slice(b"\",");
            item[36..36 + page.len()].copy_from_slice(page);
            item[36 + page.len()..38 + page.len()].copy_from_slice(b"],");
            out.extend_from_slice(&item);
            out.truncate(out.len() - (ITEM - (38 + page.len())));
            continue;
        }
        out.push(b'[');
        match keys {
            Keys::Plain => {
                debug_assert!(!any_needs_escape(key.as_bytes()), "a plain key needs an escape: {key:?}");
                out.push(b'"');
                out.extend_from_slice(key.as_bytes());
                out.push(b'"');
            }
            Keys::Any => json_str(out, key),
        }
        out.push(b',');
        int(out, page);
        out.extend_from_slice(b"],");
    }
    if any {
        out.pop();
    }
    out.extend_from_slice(b"]}");
}

/// [`allocate`] of 32-hex keys given as their digests (the text each
/// spells, [`encode_hex32`]), every key plain: the same bytes, written in
/// place into room made at once for the longest items, each page as
/// [`page_list`] writes its pages.
pub fn allocate_hex(out: &mut Vec<u8>, rank: i64, results: impl ExactSizeIterator<Item = (u128, i64)>) {
    out.reserve(32 + results.len() * ITEM);
    out.extend_from_slice(br#"{"rank":"#);
    int(out, rank);
    out.extend_from_slice(br#","results":["#);
    let mut any = false;
    for (key, page) in results {
        any = true;
        // The item made on the stack, appended as one fixed-size copy and
        // cut to its length (as `allocate` does): a buffer resized for the
        // longest items first cost a memset of them all.
        let mut item = [0u8; ITEM];
        item[..2].copy_from_slice(b"[\"");
        item[2..34].copy_from_slice(&encode_hex32(key));
        item[34..36].copy_from_slice(b"\",");
        let at = match u32::try_from(page) {
            Ok(page) => put_page(&mut item, 36, page),
            Err(_) => put(&mut item, 36, itoa::Buffer::new().format(page).as_bytes()),
        };
        let end = put(&mut item, at, b"],");
        out.extend_from_slice(&item);
        out.truncate(out.len() - (ITEM - end));
    }
    if any {
        out.pop();
    }
    out.extend_from_slice(b"]}");
}

/// The longest item of [`allocate`] with a 32-hex key: brackets, quotes,
/// the key, two commas and a page of up to 20 characters.
const ITEM: usize = 2 + 32 + 2 + 20 + 2;

/// Appends a batch-exists answer, `{"exists":[true,false,...]}`.
///
/// Each answer is one fixed 8-byte store of a precomputed fragment (`true,`
/// or `false,` and padding the next one overwrites) into room made at once:
/// about a third of the instructions of appending word and comma apart
/// (perf/history/2026-12-01-instructions-per-request.md).
pub fn exists(out: &mut Vec<u8>, exists: &[bool]) {
    const TRUE: (&[u8; 8], usize) = (b"true,   ", 5);
    const FALSE: (&[u8; 8], usize) = (b"false,  ", 6);
    out.reserve(16 + exists.len() * 6);
    out.extend_from_slice(br#"{"exists":["#);
    let mut at = out.len();
    // Room for every answer at its longest, and for the last store's padding.
    out.resize(at + exists.len() * 6 + 8, b' ');
    for &e in exists {
        let (fragment, len) = if e { TRUE } else { FALSE };
        if let Some(dst) = out.get_mut(at..at + 8) {
            dst.copy_from_slice(fragment);
        }
        at += len;
    }
    // The last answer's comma goes.
    out.truncate(at - usize::from(!exists.is_empty()));
    out.extend_from_slice(b"]}");
}

/// Appends a longest-prefix answer, `{"length":n,"blocks":b,"ranks":[...]}`
/// (docs/api.md, "Longest prefix").
pub fn longest_prefix(out: &mut Vec<u8>, length: u32, blocks: usize, ranks: &[u32]) {
    out.reserve(40 + ranks.len() * 4);
    out.extend_from_slice(br#"{"length":"#);
    int(out, i64::from(length));
    out.extend_from_slice(br#","blocks":"#);
    int(out, blocks as i64);
    out.extend_from_slice(br#","ranks":["#);
    for (i, &r) in ranks.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        int(out, i64::from(r));
    }
    out.extend_from_slice(b"]}");
}

/// Appends a get-locations answer, `{"locations":[5,null,...]}`, where `None`
/// (the key is not complete) is written as `null`.
pub fn locations(out: &mut Vec<u8>, locs: &[Option<u32>]) {
    page_list(out, br#"{"locations":["#, locs);
}

/// Appends SGLang's get_page_indices answer, `{"indices":[5,null,...]}`.
pub fn indices(out: &mut Vec<u8>, locs: &[Option<u32>]) {
    page_list(out, br#"{"indices":["#, locs);
}

/// Appends SGLang's reserve_and_allocate_page_indices answer,
/// `{"indices":[[true,5],[false,-1],...]}`: per key, whether it was already
/// written and its page.
///
/// Each answer is made in a 32-byte buffer (`[false,`, a page, `],`; a page
/// two digits at a time or eight at once, as [`page_list`] writes its
/// pages) and appended whole, the length then cut to its own: an answer's
/// `itoa` and pushes cost a key about 60 instructions, room zeroed at once
/// for the longest answers about 29.
pub fn reserved_indices(out: &mut Vec<u8>, slots: impl ExactSizeIterator<Item = (bool, i64)>) {
    const ROOM: usize = 32;
    out.reserve(16 + slots.len() * ROOM);
    out.extend_from_slice(br#"{"indices":["#);
    let n = slots.len();
    for (written, page) in slots {
        let mut buf = [0u8; ROOM];
        let mut at = put(&mut buf, 0, if written { b"[true," } else { b"[false," });
        at = match u32::try_from(page) {
            // At most 7 + 8 bytes for its whole-word store: within the 32.
            Ok(page) => put_page(&mut buf, at, page),
            // -1: no page for the key (an `i64` is at most 20 characters).
            Err(_) => put(&mut buf, at, itoa::Buffer::new().format(page).as_bytes()),
        };
        at = put(&mut buf, at, b"],");
        let len = out.len();
        out.extend_from_slice(&buf);
        out.truncate(len + at);
    }
    // The last answer's comma goes.
    if n > 0 {
        out.pop();
    }
    out.extend_from_slice(b"]}");
}

/// Appends `head`, the pages of `locs` (`null` for `None`) and `]}`.
///
/// Written in place into room made at once (ten digits and a comma a page
/// at most), each page two digits at a time ([`put_page`]): fewer
/// instructions than a formatted string copied in and a comma pushed per
/// page (perf/history/2026-12-01-instructions-per-request.md).
fn page_list(out: &mut Vec<u8>, head: &[u8], locs: &[Option<u32>]) {
    out.extend_from_slice(head);
    let mut at = out.len();
    out.resize(at + locs.len() * 11, 0);
    for loc in locs {
        at = match loc {
            Some(page) => put_page(out, at, *page),
            None => put(out, at, b"null"),
        };
        at = put(out, at, b",");
    }
    // The last page's comma goes.
    out.truncate(at - usize::from(!locs.is_empty()));
    out.extend_from_slice(b"]}");
}

/// Copies `bytes` into `out` at `at` (inside its length), returning the
/// position after them.
#[inline]
fn put(out: &mut [u8], at: usize, bytes: &[u8]) -> usize {
    let end = at + bytes.len();
    if let Some(dst) = out.get_mut(at..end) {
        dst.copy_from_slice(bytes);
    }
    end
}

/// The two digits of each number below 100, in order.
const DIGIT_PAIRS: [u8; 200] = {
    let mut t = [0u8; 200];
    let mut i = 0;
    while i < 100 {
        t[2 * i] = b'0' + (i / 10) as u8;
        t[2 * i + 1] = b'0' + (i % 10) as u8;
        i += 1;
    }
    t
};

/// Writes `page` in decimal into `out` at `at` (inside its length, room for
/// ten digits), returning the position after it: a page of 5 to 8 digits
/// as eight digits made at once in one `u64` ([`eight_digits`]) and stored
/// whole, its leading zeros shifted out (what follows overwrites the rest);
/// a shorter or longer one two digits at a time ([`put_page_by_pairs`]),
/// which costs about as much below 10^4 and more above.
#[inline]
fn put_page(out: &mut [u8], at: usize, page: u32) -> usize {
    if !(10_000..100_000_000).contains(&page) {
        return put_page_by_pairs(out, at, page);
    }
    let digits = eight_digits(page);
    // Leading zero digits are the low zero bytes (the first digit is the
    // lowest byte); a page of 0 keeps its last.
    let zeros = (digits.trailing_zeros() / 8).min(7);
    if let Some(dst) = out.get_mut(at..at + 8) {
        dst.copy_from_slice(&((digits | 0x3030_3030_3030_3030) >> (8 * zeros)).to_le_bytes());
    }
    at + 8 - zeros as usize
}

/// The 8 decimal digits of `v` (below 10^8), one a byte, the first digit
/// in the lowest byte: split into two halves of 4 digits, each into two of
/// 2, each into two of 1, every split of all lanes by one multiply (`q =
/// x * m >> s`, exact for these ranges; no lane carries into the next).
#[inline]
fn eight_digits(v: u32) -> u64 {
    debug_assert!(v < 100_000_000);
    let v = u64::from(v);
    let x = (v / 10_000) | ((v % 10_000) << 32);
    let q = ((x * 5243) >> 19) & 0x0000_007F_0000_007F;
    let x = q | ((x - q * 100) << 16);
    let q = ((x * 103) >> 10) & 0x000F_000F_000F_000F;
    q | ((x - q * 10) << 8)
}

/// [`put_page`] two digits at a time.
#[inline]
fn put_page_by_pairs(out: &mut [u8], at: usize, page: u32) -> usize {
    let end = at + page.checked_ilog10().unwrap_or(0) as usize + 1;
    let (mut v, mut i) = (page, end);
    while v >= 100 {
        let pair = (v % 100) as usize * 2;
        v /= 100;
        i -= 2;
        put(out, i, &DIGIT_PAIRS[pair..pair + 2]);
    }
    if v >= 10 {
        put(out, i - 2, &DIGIT_PAIRS[v as usize * 2..v as usize * 2 + 2]);
    } else {
        put(out, i - 1, &[b'0' + v as u8]);
    }
    end
}

/// Appends a typed error: the `FastAPI` `detail` text plus a machine-readable
/// object, `{"detail":"...","error":{"code":"...","rank":R,"page":P,"key":"..."}}`.
/// `page` and `key` are left out when `None`.
pub fn typed_error(out: &mut Vec<u8>, detail: &str, code: &str, rank: i64, page: Option<i64>, key: Option<&str>) {
    out.extend_from_slice(br#"{"detail":"#);
    json_str(out, detail);
    out.extend_from_slice(br#","error":{"code":"#);
    json_str(out, code);
    out.extend_from_slice(br#","rank":"#);
    int(out, rank);
    if let Some(page) = page {
        out.extend_from_slice(br#","page":"#);
        int(out, page);
    }
    if let Some(key) = key {
        out.extend_from_slice(br#","key":"#);
        json_str(out, key);
    }
    out.extend_from_slice(b"}}");
}

/// Appends a tenant refusal, `{"detail":detail,"error":{"code":code}}`,
/// the tenant named in `error` when known.
pub fn tenant_error(out: &mut Vec<u8>, detail: &str, code: &str, tenant: Option<&str>) {
    out.extend_from_slice(br#"{"detail":"#);
    json_str(out, detail);
    out.extend_from_slice(br#","error":{"code":"#);
    json_str(out, code);
    if let Some(t) = tenant {
        out.extend_from_slice(br#","tenant":"#);
        json_str(out, t);
    }
    out.extend_from_slice(b"}}");
}

/// Appends a `FastAPI` request-validation error (the body of its 422 answers)
/// holding one error:
/// `{"detail":[{"type":typ,"loc":["path","rank"],"msg":msg,"input":input}]}`.
/// `loc` is written as a list of strings, in order.
pub fn validation_error(out: &mut Vec<u8>, loc: &[&str], msg: &str, typ: &str, input: &str) {
    out.extend_from_slice(br#"{"detail":[{"type":"#);
    json_str(out, typ);
    out.extend_from_slice(br#","loc":["#);
    for (i, part) in loc.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        json_str(out, part);
    }
    out.extend_from_slice(br#"],"msg":"#);
    json_str(out, msg);
    out.extend_from_slice(br#","input":"#);
    json_str(out, input);
    out.extend_from_slice(b"}]}");
}

/// What `/stats` says of the server itself, beside its page spaces.
#[derive(Debug, Clone)]
pub struct ServerStats {
    /// The server's release.
    pub version: &'static str,
    /// The git commit it was built from.
    pub commit: &'static str,
    /// Seconds since start.
    pub uptime_seconds: f64,
    /// `--world-size`, if set.
    pub world_size: Option<u32>,
    /// `--reservation-ttl`.
    pub reservation_ttl_seconds: u64,
    /// `--eviction`: `clock` or `none`.
    pub eviction: &'static str,
    /// `--read-lease`.
    pub read_lease_seconds: u64,
    /// Client connections open now.
    pub open_connections: i64,
    /// Whether `--data-dir` is set.
    pub durable: bool,
    /// `--max-spaces`.
    pub max_spaces: u32,
}

/// Appends the `/stats` document (docs/api.md, "GET /stats"): vLLM's page
/// space at the top level and in `ranks`, SGLang's spaces in `spaces`, each
/// page count as [`RankPages`](crate::core::RankPages) has it (the same numbers as `/metrics`).
pub fn stats(out: &mut Vec<u8>, server: &ServerStats, spaces: &[SpaceReport]) {
    use std::io::Write as _;
    let vllm = spaces.iter().find(|s| s.label == SpaceLabel::Vllm);
    let v = |f: fn(&SpaceReport) -> u64| vllm.map_or(0, f);
    let ws = server.world_size.map_or("null".to_string(), |w| w.to_string());
    let _ = write!(
        out,
        r#"{{"version":"{}","commit":"{}","uptime_seconds":{:.3},"world_size":{ws},"keys":{},"complete_keys":{},"leased_keys":{},"index_slots":{},"reservations_expired":{},"reservation_ttl_seconds":{},"eviction":"{}","read_lease_seconds":{},"evicted_keys":{},"evicted_pages":{},"open_connections":{},"durable":{},"ranks":["#,
        server.version,
        server.commit,
        server.uptime_seconds,
        v(|s| s.keys),
        v(|s| s.complete_keys),
        v(|s| s.leased_keys),
        v(|s| s.footprint.index_slots),
        v(|s| s.expired),
        server.reservation_ttl_seconds,
        server.eviction,
        server.read_lease_seconds,
        v(SpaceReport::evicted_keys),
        v(|s| s.evict.pages),
        server.open_connections,
        server.durable,
    );
    for (i, p) in vllm.map_or(&[][..], |s| &s.ranks).iter().enumerate() {
        let _ = write!(
            out,
            r#"{}{{"rank":{},"num_pages":{},"free":{},"reserved":{},"bound":{},"leased":{},"evictable":{},"quarantined":{}}}"#,
            if i > 0 { "," } else { "" },
            p.rank,
            p.num_pages,
            p.free,
            p.reserved,
            p.bound,
            p.leased,
            p.evictable,
            p.quarantined,
        );
    }
    let _ = write!(out, r#"],"max_spaces":{},"spaces":["#, server.max_spaces);
    let sglang = spaces.iter().filter_map(|s| match &s.label {
        SpaceLabel::Sglang(name) => Some((name, s, s.ranks.first()?)),
        SpaceLabel::Vllm => None,
    });
    for (i, (name, s, p)) in sglang.enumerate() {
        let _ = write!(out, r#"{}{{"rank":{},"namespace":"#, if i > 0 { "," } else { "" }, name.rank);
        json_str(out, &name.namespace);
        let _ = write!(
            out,
            r#","num_pages":{},"free":{},"reserved":{},"bound":{},"keys":{},"leased_keys":{},"leased":{},"evictable":{},"quarantined":{},"evicted_keys":{},"reservations_expired":{}}}"#,
            p.num_pages,
            p.free,
            p.reserved,
            p.bound,
            s.keys,
            s.leased_keys,
            p.leased,
            p.evictable,
            p.quarantined,
            s.evicted_keys(),
            s.expired,
        );
    }
    out.extend_from_slice(b"]}");
}

#[cfg(test)]
mod swar_tests {
    use super::*;

    #[test]
    fn swar_escape_check_matches_the_bytewise_one() {
        for len in 0..20 {
            for pos in 0..len {
                for b in 0..=255u8 {
                    let mut s = vec![b'a'; len];
                    s[pos] = b;
                    assert_eq!(any_needs_escape(&s), s.iter().any(|&c| needs_escape(c)), "{b:#x} at {pos}/{len}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
